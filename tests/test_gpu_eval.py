"""runners/gpu_eval.py (run by scripts/gpu_eval.sh) and scripts/portable_bundle.sh --check, on a
machine without a GPU.

gpu_eval runs the whole GPU evaluation on a GPU node; here it must exit 0, never hang, and leave
a steps.csv in which every step says what happened and why: skipped without a GPU or binaries,
failed with the binary's own message, timeout when a step hangs, cut by the time budget (and the
steps after it skipped, saying so), kept when a second run resumes. --unpack merges the archive's
CSVs into results/: a header that differs is refused before anything is written, a row already
there is not added again. portable_bundle.sh --check is the bundle's library rule (no MPI; every
non-CUDA library from the bundle's lib/, found by the RUNPATH alone), checked on tiny programs
built here. ACTBENCH_BUILD (set by ctest) is a real build folder. Time limits here are bounds
against hangs, generous for a loaded 2-core machine.
"""
import contextlib
import csv
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WRAPPER = os.path.join(ROOT, "scripts", "gpu_eval.sh")
RUNNER = os.path.join(ROOT, "runners", "gpu_eval.py")
BUNDLE = os.path.join(ROOT, "scripts", "portable_bundle.sh")
BUILD = os.environ.get("ACTBENCH_BUILD", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(ROOT, "runners"))
import gpu_eval  # noqa: E402

ALL_STEPS = ["tests", "table4", "table4_cupti", "table4_fused", "bench_kernels", "bench_layer", "peer",
             "attention_s2048", "attention_s8192", "attention_s32768", "attention_sdpa", "attention_goal",
             "attention_goal_sdpa", "sweep_seqlen",
             "sweep_seqlen_fused", "sweep_longcontext", "sweep_moe", "cputests", "sanitize_memcheck",
             "sanitize_racecheck"]
# No torch probe (it takes seconds): the python the peer steps would use is one that cannot run.
NO_TORCH = ["--python", "/nonexistent/python3"]


def have_gpu():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.startswith("GPU ") for line in out.splitlines())


HAVE_GPU = have_gpu()


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def read(path):
    with open(path) as f:
        return f.read()


def archived(out):
    with tarfile.open(os.path.join(out, "results.tar.gz")) as t:
        return {m.name: (t.extractfile(m).read().decode() if m.isfile() else None) for m in t.getmembers()}


# A hung GPU test that ignores SIGTERM (only SIGKILL ends it), one that SIGTERM ends, one that passes
# and writes its XML; a layer_run that fails at once, and one that writes a row to its --csv.
HANGS_IGNORING_TERM = "#!/bin/sh\ntrap '' TERM\nsleep 300\n"
HANGS = "#!/bin/sh\nsleep 300\n"
PASSES = """#!/bin/sh
for a; do case "$a" in --gtest_output=xml:*) echo '<testsuites/>' >"${a#--gtest_output=xml:}";; esac; done
echo '[  PASSED  ] 3 tests.'
"""
FAILS = "#!/bin/sh\necho 'layer_run: error: fake failure' >&2\nexit 2\n"
WRITES_ROW = """#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = --csv ]; then [ -s "$2" ] || echo 'config,fwd_ms' >"$2"; echo "baseline,$$" >>"$2"; fi
  shift
done
echo ok-run
"""


# A Google Benchmark binary cut at its timeout: its --benchmark_out JSON has the runs so far, but
# not the closing brackets that the library writes last.
PARTIAL_JSON = '{\n  "context": {},\n  "benchmarks": [\n    {"name": "cuda/gemm/manual_time", "real_time": 1.0}'
BENCH_CUT_MIDWAY = f"""#!/bin/sh
for a; do case "$a" in --benchmark_out=*) printf '%s' '{PARTIAL_JSON}' >"${{a#--benchmark_out=}}";; esac; done
echo 'cuda/gemm/manual_time 1.00 ms'
sleep 300
"""

# A bench_kernels that writes the goal shape's fused fwd/bwd rows at its --attn-dropout: 1e12 FLOPs
# in 2 ms forward, 5 ms backward.
BENCH_GOAL = """#!/bin/sh
p=0; out=
for a; do case "$a" in --attn-dropout=*) p="${a#--attn-dropout=}";; --benchmark_out=*) out="${a#--benchmark_out=}";; esac; done
row() { printf '{"name":"cuda/attention_fused_%s","run_type":"iteration","seq":8192,"head_dim":128,"dropout":%s,"ms_median":%s,"flops":1e12}' "$1" "$p" "$2"; }
printf '{"context":{"actbench_dtype":"bf16","actbench_backend":"cuda","actbench_device":"fake"},"benchmarks":[%s,%s]}' "$(row fwd 2)" "$(row bwd 5)" >"$out"
echo 'cuda/attention_fused_fwd/manual_time 2.00 ms'
"""


class Session(unittest.TestCase):
    """Runs of the runner as users run it (a process), on fake bundles."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpu_eval_test_")
        self.out = os.path.join(self.tmp, "out")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def session(self, *args, limit=150, keep=False, program=(sys.executable, RUNNER)):
        if not keep:
            shutil.rmtree(self.out, ignore_errors=True)
        t0 = time.time()
        proc = subprocess.run([*program, self.out, *args], capture_output=True, text=True, timeout=limit + 30)
        elapsed = time.time() - t0
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        self.assertLess(elapsed, limit, "the session took too long")
        return self.check_outdir()

    def check_outdir(self):
        with open(os.path.join(self.out, "steps.csv"), newline="") as f:
            rows = {r["step"]: r for r in csv.DictReader(f)}
        self.assertEqual(list(rows), ["env"] + ALL_STEPS)
        for r in rows.values():
            self.assertIn(r["status"], ("ok", "failed", "timeout", "skipped"), r)
            self.assertTrue(r["detail"].strip(), f"step {r['step']} gives no reason")
        self.assertEqual(sorted(os.listdir(self.out)), ["log.txt", "results.tar.gz", "steps.csv", "summary.txt"])
        names = archived(self.out)
        self.assertIn("raw/run.txt", names)
        self.assertIn("raw/versions.txt", names)
        return rows, names

    def fake_bundle(self, test_gpu_ops=HANGS_IGNORING_TERM, layer_run=FAILS):
        b = os.path.join(self.tmp, "bundle")
        os.makedirs(os.path.join(b, "bin"), exist_ok=True)
        write_exe(os.path.join(b, "bin", "test_gpu_ops"), test_gpu_ops)
        write_exe(os.path.join(b, "bin", "layer_run"), layer_run)
        return b

    @unittest.skipIf(HAVE_GPU, "a GPU is present: the steps would run")
    def test_no_gpu_empty_bundle(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        rows, _ = self.session("--bin-dir", empty, program=("bash", WRAPPER))  # as the README says to run it
        self.assertEqual(rows["env"]["status"], "failed")
        self.assertIn("no layer_run", rows["env"]["detail"])
        for step in ALL_STEPS:
            self.assertEqual(rows[step]["status"], "skipped", rows[step])
        self.assertIn("layer_run not in", rows["table4"]["detail"])
        self.assertIn("no GPU", rows["attention_sdpa"]["detail"])
        self.assertIn("not selected", rows["cputests"]["detail"])
        self.assertIn("not selected", rows["sanitize_memcheck"]["detail"])  # not in the default

    def test_named_bin_dir_missing(self):
        proc = subprocess.run([sys.executable, RUNNER, self.out, "--bin-dir", os.path.join(self.tmp, "nothing-here")],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(proc.stderr, f"gpu_eval: error: no folder of binaries at {self.tmp}/nothing-here\n")

    @unittest.skipIf(HAVE_GPU, "a GPU is present: the steps would run")
    def test_real_build_without_gpu(self):
        if not os.access(os.path.join(BUILD, "runners", "layer_run"), os.X_OK):
            self.skipTest(f"no build at {BUILD}")
        rows, _ = self.session("--bin-dir", BUILD, "--steps", "tests,table4,bench,sweep", "--quick", *NO_TORCH)
        have_gpu_tests = os.access(os.path.join(BUILD, "tests", "test_gpu_ops"), os.X_OK)
        for step in ("tests", "table4", "bench_kernels", "sweep_seqlen"):
            self.assertEqual(rows[step]["status"], "skipped", rows[step])
            if step == "tests" and not have_gpu_tests:  # a CPU-only build has no GPU tests to run
                self.assertIn("test_gpu_ops not in", rows[step]["detail"])
            else:
                self.assertIn("no GPU", rows[step]["detail"])
        # --force runs them anyway: the GPU tests skip inside (ok), layer_run fails saying why
        rows, names = self.session("--bin-dir", BUILD, "--steps", "tests,table4_fused,bench_layer", "--quick",
                                   "--force", "--max-step", "40", *NO_TORCH, limit=240)
        if have_gpu_tests:
            self.assertEqual(rows["tests"]["status"], "ok", rows["tests"])
            self.assertIn("failed 0", rows["tests"]["detail"])
            self.assertIn("raw/test_gpu_ops.xml", names)
            self.assertEqual(rows["table4_fused"]["status"], "failed", rows["table4_fused"])
            self.assertIn("no CUDA device", rows["table4_fused"]["detail"])
        self.assertIn(rows["bench_layer"]["status"], ("ok", "skipped"), rows["bench_layer"])

    def test_time_budget_below_the_reserve(self):
        b = self.fake_bundle()
        # a budget below the packing reserve: nothing can start, however fast or slow this machine
        rows, _ = self.session("--bin-dir", b, "--force", "--steps", "table4,sweep", "--budget", "5", *NO_TORCH)
        for step in ("table4", "sweep_seqlen"):
            self.assertEqual(rows[step]["status"], "skipped", rows[step])
            self.assertIn("time budget", rows[step]["detail"])
        text = read(os.path.join(self.out, "summary.txt"))
        self.assertIn("--steps table4,table4_cupti,table4_fused,sweep_seqlen,sweep_seqlen_fused,sweep_longcontext,"
                      "sweep_moe", text)
        self.assertIn("resumes", text)

    def test_second_run_resumes_and_the_archive_holds_both(self):
        # the table4 steps finish (each writes a row); the GPU test hangs and is cut
        b = self.fake_bundle(test_gpu_ops=HANGS, layer_run=WRITES_ROW)
        rows, first = self.session("--bin-dir", b, "--force", "--steps", "tests,table4", "--max-step", "1", *NO_TORCH)
        self.assertEqual(rows["table4"]["status"], "ok", rows["table4"])
        self.assertEqual(rows["tests"]["status"], "timeout", rows["tests"])
        table4 = [n for n in first if n.startswith("results/table4_") and n.endswith(".csv")]
        self.assertEqual(len(table4), 2, first)  # table4_<dev>.csv, table4_fused_<dev>.csv
        # the second run keeps what finished and runs again what did not
        write_exe(os.path.join(b, "bin", "test_gpu_ops"), PASSES)
        write_exe(os.path.join(b, "bin", "layer_run"), "#!/bin/sh\necho 'must not run again' >&2\nexit 1\n")
        rows, second = self.session("--bin-dir", b, "--force", "--steps", "tests,table4", *NO_TORCH, keep=True)
        self.assertEqual(rows["tests"]["status"], "ok", rows["tests"])
        self.assertIn("passed 3, skipped 0, failed 0", rows["tests"]["detail"])
        for step in ("table4", "table4_cupti", "table4_fused"):
            self.assertEqual(rows[step]["status"], "ok", rows[step])
            self.assertIn("earlier run", rows[step]["detail"])
        # the archive holds the first run's results and the second's, the rows unchanged
        self.assertIn("raw/test_gpu_ops.xml", second)
        for name in table4:
            self.assertEqual(second[name], first[name])
            self.assertEqual(len(second[name].splitlines()), 2, second[name])
        self.assertIn("resuming", read(os.path.join(self.out, "log.txt")))
        self.assertNotIn("must not run again", read(os.path.join(self.out, "log.txt")))
        # a third run still knows table4 was done (its "ok" of the second run counts)
        rows, _ = self.session("--bin-dir", b, "--force", "--steps", "table4", *NO_TORCH, keep=True)
        self.assertIn("earlier run", rows["table4"]["detail"])
        # --unpack merges the archive's rows into results/
        results = os.path.join(self.tmp, "results")
        proc = subprocess.run([sys.executable, RUNNER, "--unpack", self.out, results], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for name in table4:
            self.assertEqual(read(os.path.join(results, os.path.basename(name))), second[name])
        # --fresh forgets it
        rows, _ = self.session("--bin-dir", b, "--force", "--steps", "table4", "--fresh", *NO_TORCH, keep=True)
        self.assertEqual(rows["table4"]["status"], "failed", rows["table4"])

    def test_bad_usage(self):
        for args in (["--steps", "nope"], ["--budget", "x"], ["--max-step"], ["--frobnicate"], ["a", "b"], []):
            with contextlib.redirect_stderr(io.StringIO()) as err:
                code = gpu_eval.main([*([self.out] if args else []), *args])
            self.assertEqual(code, 2, args)
            self.assertEqual(len(err.getvalue().splitlines()), 1, err.getvalue())
            self.assertTrue(err.getvalue().startswith("gpu_eval: error: "), err.getvalue())
        self.assertFalse(os.path.exists(self.out))

    def test_list_steps_and_help(self):
        out = subprocess.run([sys.executable, RUNNER, "--list-steps"], capture_output=True, text=True, timeout=30).stdout
        self.assertIn("table4: table4 table4_cupti table4_fused\n", out)
        self.assertTrue(out.endswith("default: " + " ".join(ALL_STEPS[:-3]) + "\n"), out)  # all but cputests, sanitize
        out = subprocess.run(["bash", WRAPPER, "--help"], capture_output=True, text=True, timeout=30).stdout
        self.assertIn("--unpack OUTDIR_OR_TARBALL", out)


class InProcess(unittest.TestCase):
    """Time boxes and the budget with their times under the test's control: the runner in this
    process, each run a few seconds."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpu_eval_test_")
        self.out = os.path.join(self.tmp, "out")
        self.handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def tearDown(self):
        for s, h in self.handlers.items():
            signal.signal(s, h)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def fake_bundle(self, test_gpu_ops, layer_run):
        b = os.path.join(self.tmp, "bundle")
        os.makedirs(os.path.join(b, "bin"))
        write_exe(os.path.join(b, "bin", "test_gpu_ops"), test_gpu_ops)
        write_exe(os.path.join(b, "bin", "layer_run"), layer_run)
        return b

    def evaluate(self, *args):
        """steps.csv's rows by step (the run printed nothing the test needs)."""
        with mock.patch.dict(os.environ), contextlib.redirect_stdout(io.StringIO()) as printed:
            code = gpu_eval.main([self.out, *args, *NO_TORCH])
        self.assertEqual(code, 0, printed.getvalue())
        with open(os.path.join(self.out, "steps.csv"), newline="") as f:
            return {r["step"]: r for r in csv.DictReader(f)}

    def test_hanging_step_is_cut_and_failures_go_on(self):
        # a GPU test that ignores SIGTERM: SIGKILL ends it (1 s here, 10 s in use) after its time box
        b = self.fake_bundle(HANGS_IGNORING_TERM, FAILS)
        with mock.patch.object(gpu_eval.sweep, "GRACE_S", 1):
            rows = self.evaluate("--bin-dir", b, "--force", "--steps", "tests,table4", "--max-step", "2")
        self.assertEqual(rows["tests"]["status"], "timeout", rows["tests"])
        self.assertIn("killed after 2s", rows["tests"]["detail"])
        self.assertLess(float(rows["tests"]["seconds"]), 60)  # 2 s, then SIGKILL 1 s later
        for step in ("table4", "table4_cupti", "table4_fused"):
            self.assertEqual(rows[step]["status"], "failed", rows[step])
            self.assertIn("exit 2: layer_run: error: fake failure", rows[step]["detail"])
        self.assertEqual(rows["bench_kernels"]["status"], "skipped")
        self.assertIn("did not pass", read(os.path.join(self.out, "summary.txt")))  # the GPU tests' failure is flagged

    def test_goal_steps_run_each_dropout_and_write_the_verdict(self):
        b = self.fake_bundle(PASSES, FAILS)
        write_exe(os.path.join(b, "bin", "bench_kernels"), BENCH_GOAL)
        rows = self.evaluate("--bin-dir", b, "--force", "--steps", "attention_goal,attention_goal_sdpa")
        self.assertEqual(rows["attention_goal"]["status"], "ok", rows["attention_goal"])
        self.assertEqual(rows["attention_goal_sdpa"]["status"], "skipped")  # no torch for the peer
        names = archived(self.out)
        self.assertIn("results/attention_goal_nogpu_p0.json", names)
        self.assertIn("results/attention_goal_nogpu_p0.1.json", names)
        verdict = names["raw/attention_goal.txt"]
        self.assertIn("s = 8192, d = 128, bf16", verdict)
        self.assertIn("500.0", verdict)  # ours: 1e12 FLOPs in 2 ms
        self.assertIn("goal: not measured", verdict)  # no SDPA side
        self.assertIn("attention_goal.txt", "".join(names))
        self.assertIn("goal: not measured", read(os.path.join(self.out, "summary.txt")))

    def test_cut_step_leaves_its_partial_json_out_of_the_results(self):
        b = self.fake_bundle(PASSES, FAILS)
        write_exe(os.path.join(b, "bin", "bench_kernels"), BENCH_CUT_MIDWAY)
        with mock.patch.object(gpu_eval.sweep, "GRACE_S", 1):
            rows = self.evaluate("--bin-dir", b, "--force", "--steps", "bench_kernels", "--max-step", "2")
        self.assertEqual(rows["bench_kernels"]["status"], "timeout", rows["bench_kernels"])
        self.assertIn("not valid JSON, set aside as raw/bench_kernels_nogpu.json.partial",
                      rows["bench_kernels"]["detail"])
        names = archived(self.out)
        self.assertNotIn("results/bench_kernels_nogpu.json", names)
        self.assertEqual(names["raw/bench_kernels_nogpu.json.partial"], PARTIAL_JSON)  # nothing lost

    def test_budget_cuts_a_step_and_later_steps_say_why(self):
        b = self.fake_bundle(HANGS, WRITES_ROW)
        prepare = gpu_eval.Evaluation.prepare

        def prepare_then_start_the_clock(ev):  # 4 s for the steps, however long the preparation took
            prepare(ev)
            ev.deadline = time.monotonic() + 4
        with mock.patch.object(gpu_eval.Evaluation, "prepare", prepare_then_start_the_clock), \
                mock.patch.object(gpu_eval, "RESERVE_S", 0), mock.patch.dict(gpu_eval.MIN, {s: 1 for s in gpu_eval.MIN}):
            rows = self.evaluate("--bin-dir", b, "--force", "--steps", "tests,table4")
        out = self.out
        # the hung GPU test gets what is left of the budget (not its 150 s cap), and is cut there
        self.assertEqual(rows["tests"]["status"], "timeout", rows["tests"])
        self.assertRegex(rows["tests"]["detail"], r"; killed after [1-4]s; ")
        self.assertLess(float(rows["tests"]["seconds"]), 60)
        for step in ("table4", "table4_cupti", "table4_fused"):
            self.assertEqual(rows[step]["status"], "skipped", rows[step])
            self.assertRegex(rows[step]["detail"], r"^time budget: -?\d+s left, needs 1s$")
        summary = read(os.path.join(out, "summary.txt"))
        self.assertIn("not run for lack of time: table4,table4_cupti,table4_fused", summary)
        self.assertIn(f"bash scripts/gpu_eval.sh {out} --budget SEC", summary)

    def test_step_counts(self):
        self.assertEqual(gpu_eval.step_counts("tests", "[  PASSED  ] 1 test.\n[  PASSED  ] 7 tests.\n"),
                         "passed 7, skipped 0, failed 0")
        self.assertEqual(gpu_eval.step_counts("cputests", "[  PASSED  ] 2 tests.\n[  SKIPPED ] 1 test\n"
                                                          "[  PASSED  ] 3 tests.\n[  FAILED  ] 1 test, listed below:\n"),
                         "passed 5, skipped 1, failed 1")
        out = "attention/manual_time 1 ms\nx/real_time ERROR OCCURRED: 'no GPU'\n"
        self.assertEqual(gpu_eval.step_counts("attention_s2048", out), "2 benchmarks, 1 with errors or skipped")
        self.assertEqual(gpu_eval.step_counts("attention_sdpa", out), "")  # not a Google Benchmark binary


class Unpack(unittest.TestCase):
    """--unpack: the archive's CSV rows into results/, the rest under results/device/."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpu_eval_unpack_test_")
        self.results = os.path.join(self.tmp, "results")
        os.makedirs(self.results)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def archive(self, files, start="2026-01-02T03:04:05Z"):
        """OUTDIR-like folder with results.tar.gz of files {"results/NAME": text} and raw/run.txt."""
        src = tempfile.mkdtemp(dir=self.tmp)
        files = dict(files, **{"raw/run.txt": f"dev: h100\nstart_utc: {start}\n"})
        for name, text in files.items():
            write(os.path.join(src, "pack", name), text)
        fetched = os.path.join(src, "out")
        os.makedirs(fetched)
        with tarfile.open(os.path.join(fetched, "results.tar.gz"), "w:gz") as t:
            t.add(os.path.join(src, "pack", "results"), "results")
            t.add(os.path.join(src, "pack", "raw"), "raw")
        return fetched

    def unpack(self, src):
        return subprocess.run([sys.executable, RUNNER, "--unpack", src, self.results], capture_output=True, text=True,
                              timeout=60)

    def test_appends_once(self):
        fetched = self.archive({"results/table4_h100.csv": "a,b\n1,2\n3,4\n", "results/bench_kernels_h100.json": "{}\n"})
        write(os.path.join(self.results, "table4_h100.csv"), "a,b\n0,0\n")
        proc = self.unpack(fetched)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(read(os.path.join(self.results, "table4_h100.csv")), "a,b\n0,0\n1,2\n3,4\n")
        kept = os.path.join(self.results, "device", "h100-20260102T030405Z")
        self.assertTrue(os.path.exists(os.path.join(kept, "bench_kernels_h100.json")))
        self.assertTrue(os.path.exists(os.path.join(kept, "raw", "run.txt")))
        again = self.unpack(fetched)
        self.assertEqual(again.returncode, 2)
        self.assertIn("already unpacked", again.stderr)
        self.assertEqual(read(os.path.join(self.results, "table4_h100.csv")), "a,b\n0,0\n1,2\n3,4\n")

    def test_new_csv_and_quoted_fields(self):
        text = 'a,command\n1,"x, ""y"""\n2,"two\nlines"\n'
        proc = self.unpack(self.archive({"results/seqlen_cuda_h100.csv": text}))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(read(os.path.join(self.results, "seqlen_cuda_h100.csv")), text)
        self.assertIn("new, 2 rows", proc.stdout)

    def test_header_mismatch_is_refused_and_nothing_is_written(self):
        before = {"table4_h100.csv": "a,b\n0,0\n", "peer_torch_h100.csv": "x,y\n5,6\n"}
        for name, text in before.items():
            write(os.path.join(self.results, name), text)
        # table4 (first in order) would merge; peer_torch's columns differ: the whole unpack is refused
        fetched = self.archive({"results/table4_h100.csv": "a,b\n1,2\n",
                                "results/peer_torch_h100.csv": "x,y,z\n7,8,9\n"})
        proc = self.unpack(fetched)
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(len(proc.stderr.splitlines()), 1, proc.stderr)
        self.assertIn("peer_torch_h100.csv", proc.stderr)
        self.assertIn("adds z", proc.stderr)
        self.assertIn("nothing unpacked", proc.stderr)
        for name, text in before.items():
            self.assertEqual(read(os.path.join(self.results, name)), text)
        self.assertFalse(os.path.exists(os.path.join(self.results, "device")))
        # the same header spelled with quotes is the same header
        write(os.path.join(self.results, "peer_torch_h100.csv"), '"x","y","z"\n5,6,7\n')
        proc = self.unpack(fetched)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(read(os.path.join(self.results, "peer_torch_h100.csv")), '"x","y","z"\n5,6,7\n7,8,9\n')

    def test_rows_already_there_are_not_added_again(self):
        write(os.path.join(self.results, "table4_h100.csv"), "a,b\n1,2\n")
        # a second archive of the same rows and one more (another run, or the same copied twice)
        proc = self.unpack(self.archive({"results/table4_h100.csv": "a,b\n1,2\n3,4\n"}, "2026-02-03T00:00:00Z"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("1 rows appended, 1 already there", proc.stdout)
        self.assertEqual(read(os.path.join(self.results, "table4_h100.csv")), "a,b\n1,2\n3,4\n")

    def test_csv_without_a_header_is_kept_not_merged(self):
        proc = self.unpack(self.archive({"results/attention_sdpa_h100.csv": ""}))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.results, "attention_sdpa_h100.csv")))
        self.assertTrue(os.path.exists(os.path.join(self.results, "device", "h100-20260102T030405Z",
                                                    "attention_sdpa_h100.csv")))

    def test_half_written_line_is_left_out_and_named(self):
        fetched = self.archive({"results/table4_h100.csv": "a,b\n1,2\n3\n"})
        proc = self.unpack(fetched)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(read(os.path.join(self.results, "table4_h100.csv")), "a,b\n1,2\n")
        self.assertIn("table4_h100.csv:3: 1 fields where the header has 2", proc.stderr)
        kept = os.path.join(self.results, "device", "h100-20260102T030405Z", "table4_h100.csv")
        self.assertEqual(read(kept), "a,b\n1,2\n3\n")  # the file whole, nothing lost


    def test_partial_json_is_kept_as_raw_not_as_a_result(self):
        fetched = self.archive({"results/bench_kernels_h100.json": PARTIAL_JSON,
                                "results/bench_layer_h100.json": '{"benchmarks": []}\n'})
        proc = self.unpack(fetched)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        kept = os.path.join(self.results, "device", "h100-20260102T030405Z")
        self.assertTrue(os.path.exists(os.path.join(kept, "bench_layer_h100.json")))
        self.assertFalse(os.path.exists(os.path.join(kept, "bench_kernels_h100.json")))
        self.assertEqual(read(os.path.join(kept, "raw", "bench_kernels_h100.json.partial")), PARTIAL_JSON)
        self.assertEqual(len(proc.stderr.splitlines()), 1, proc.stderr)
        self.assertIn("bench_kernels_h100.json: not valid JSON", proc.stderr)
        self.assertIn("raw/bench_kernels_h100.json.partial", proc.stderr)

@unittest.skipUnless(shutil.which("cc") and os.path.exists("/lib64/ld-linux-x86-64.so.2"), "needs cc and x86-64 ld.so")
class BundleCheck(unittest.TestCase):
    """portable_bundle.sh --check: the library rule, on programs built here in a second."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="bundle_check_test_")
        src = os.path.join(self.tmp, "foo.c")
        with open(src, "w") as f:
            f.write("int foo(void) { return 7; }\n")
        with open(os.path.join(self.tmp, "main.c"), "w") as f:
            f.write("int foo(void);\nint main(void) { return foo() == 7 ? 0 : 1; }\n")
        self.outside = os.path.join(self.tmp, "outside")
        os.makedirs(self.outside)
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libfoo.so", "-o",
                        os.path.join(self.outside, "libfoo.so"), src], check=True)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def bundle(self, name, lib_inside, rpath):
        b = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(b, "bin"))
        os.makedirs(os.path.join(b, "lib"))
        if lib_inside:
            shutil.copy(os.path.join(self.outside, "libfoo.so"), os.path.join(b, "lib"))
        subprocess.run(["cc", "-o", os.path.join(b, "bin", "prog"), os.path.join(self.tmp, "main.c"),
                        "-L" + self.outside, "-lfoo", "-Wl,--enable-new-dtags,-rpath," + rpath], check=True)
        return b

    def check(self, b):
        return subprocess.run(["bash", BUNDLE, "--check", b], capture_output=True, text=True, timeout=60)

    def test_library_in_the_bundle_passes(self):
        b = self.bundle("good", True, "$ORIGIN/../lib")
        proc = self.check(b)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(subprocess.run([os.path.join(b, "bin", "prog")], env={}).returncode, 0)

    def test_library_outside_the_bundle_fails(self):
        b = self.bundle("bad", False, self.outside)
        proc = self.check(b)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("libfoo.so", proc.stdout)
        self.assertIn("no $ORIGIN/../lib RUNPATH", proc.stdout)

    def test_mpi_linked_binary_fails(self):
        lr = os.path.join(BUILD, "runners", "layer_run")
        if not os.access(lr, os.X_OK):
            self.skipTest(f"no build at {BUILD}")
        if "libmpi" not in subprocess.run(["ldd", lr], capture_output=True, text=True).stdout:
            self.skipTest("this build does not link MPI")
        b = os.path.join(self.tmp, "mpi")
        os.makedirs(os.path.join(b, "bin"))
        shutil.copy(lr, os.path.join(b, "bin"))
        proc = self.check(b)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("links MPI", proc.stdout)

    def test_staged_bundle_if_present(self):
        staged = os.path.join(ROOT, ".portable-bundle")
        if not os.path.isdir(os.path.join(staged, "bin")):
            self.skipTest("no .portable-bundle staged (bash scripts/portable_bundle.sh)")
        proc = self.check(staged)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


if __name__ == "__main__":
    unittest.main()
