"""scripts/gpu_eval.sh and scripts/portable_bundle.sh --check, on a machine without a GPU.

gpu_eval.sh runs the whole GPU evaluation on a GPU node; here it must exit 0, never hang, and
leave a steps.csv in which every step says what happened and why: skipped without a GPU or
binaries, failed with the binary's own message, timeout when a step hangs, skipped when the time
budget is spent, kept when a second run resumes. portable_bundle.sh --check is the bundle's
library rule (no MPI; every non-CUDA library from the bundle's lib/, found by the RUNPATH alone),
checked on tiny programs built here. ACTBENCH_BUILD (set by ctest) is a real build folder.
Time limits here are bounds against hangs, generous for a loaded 2-core machine.
"""
import csv
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SESSION = os.path.join(ROOT, "scripts", "gpu_eval.sh")
BUNDLE = os.path.join(ROOT, "scripts", "portable_bundle.sh")
BUILD = os.environ.get("ACTBENCH_BUILD", os.path.join(ROOT, "build"))
ALL_STEPS = ["tests", "table4", "table4_cupti", "table4_fused", "bench_kernels", "bench_layer", "peer",
             "attention_s2048", "attention_s8192", "attention_s32768", "attention_sdpa", "sweep_seqlen",
             "sweep_seqlen_fused", "cputests", "sanitize_memcheck", "sanitize_racecheck"]


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


class GpuSession(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpu_eval_test_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def session(self, *args, limit=150, keep=False):
        out = os.path.join(self.tmp, "out")
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
        t0 = time.time()
        proc = subprocess.run(["bash", SESSION, out, *args], capture_output=True, text=True, timeout=limit + 30)
        elapsed = time.time() - t0
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        self.assertLess(elapsed, limit, "the session took too long")
        with open(os.path.join(out, "steps.csv"), newline="") as f:
            rows = {r["step"]: r for r in csv.DictReader(f)}
        self.assertEqual(list(rows), ["env"] + ALL_STEPS)
        for r in rows.values():
            self.assertIn(r["status"], ("ok", "failed", "timeout", "skipped"), r)
            self.assertTrue(r["detail"].strip(), f"step {r['step']} gives no reason")
        files = sorted(os.listdir(out))
        self.assertEqual(files, ["log.txt", "results.tar.gz", "steps.csv", "summary.txt"])
        with tarfile.open(os.path.join(out, "results.tar.gz")) as t:
            names = t.getnames()
        self.assertIn("raw/run.txt", names)
        self.assertIn("raw/versions.txt", names)
        return rows, out, names

    def fake_bundle(self):
        b = os.path.join(self.tmp, "bundle")
        os.makedirs(os.path.join(b, "bin"))
        # a GPU test that hangs and ignores SIGTERM; a layer_run that fails at once
        write_exe(os.path.join(b, "bin", "test_gpu_ops"), "#!/bin/sh\ntrap '' TERM\nsleep 300\n")
        write_exe(os.path.join(b, "bin", "layer_run"), "#!/bin/sh\necho 'layer_run: error: fake failure' >&2\nexit 2\n")
        return b

    @unittest.skipIf(HAVE_GPU, "a GPU is present: the steps would run")
    def test_no_gpu_empty_bundle(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        rows, out, _ = self.session("--bin-dir", empty)
        self.assertEqual(rows["env"]["status"], "failed")
        self.assertIn("no layer_run", rows["env"]["detail"])
        for step in ALL_STEPS:
            self.assertEqual(rows[step]["status"], "skipped", rows[step])
        self.assertIn("layer_run not in", rows["table4"]["detail"])
        self.assertIn("no GPU", rows["attention_sdpa"]["detail"])
        self.assertIn("not selected", rows["cputests"]["detail"])
        self.assertIn("not selected", rows["sanitize_memcheck"]["detail"])  # not in the default

    def test_named_bin_dir_missing(self):
        proc = subprocess.run(["bash", SESSION, os.path.join(self.tmp, "o"), "--bin-dir",
                               os.path.join(self.tmp, "nothing-here")], capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("no folder of binaries", proc.stderr)

    @unittest.skipIf(HAVE_GPU, "a GPU is present: the steps would run")
    def test_real_build_without_gpu(self):
        if not os.access(os.path.join(BUILD, "runners", "layer_run"), os.X_OK):
            self.skipTest(f"no build at {BUILD}")
        rows, _, _ = self.session("--bin-dir", BUILD, "--steps", "tests,table4,bench,sweep", "--quick")
        have_gpu_tests = os.access(os.path.join(BUILD, "tests", "test_gpu_ops"), os.X_OK)
        for step in ("tests", "table4", "bench_kernels", "sweep_seqlen"):
            self.assertEqual(rows[step]["status"], "skipped", rows[step])
            if step == "tests" and not have_gpu_tests:  # a CPU-only build has no GPU tests to run
                self.assertIn("test_gpu_ops not in", rows[step]["detail"])
            else:
                self.assertIn("no GPU", rows[step]["detail"])
        # --force runs them anyway: the GPU tests skip inside (ok), layer_run fails saying why
        rows, _, names = self.session("--bin-dir", BUILD, "--steps", "tests,table4_fused,bench_layer", "--quick",
                                      "--force", "--max-step", "40", limit=240)
        if os.access(os.path.join(BUILD, "tests", "test_gpu_ops"), os.X_OK):
            self.assertEqual(rows["tests"]["status"], "ok", rows["tests"])
            self.assertIn("failed 0", rows["tests"]["detail"])
            self.assertIn("raw/test_gpu_ops.xml", names)
            self.assertEqual(rows["table4_fused"]["status"], "failed", rows["table4_fused"])
            self.assertIn("no CUDA device", rows["table4_fused"]["detail"])
        self.assertIn(rows["bench_layer"]["status"], ("ok", "skipped"), rows["bench_layer"])

    def test_hanging_step_is_cut_and_failures_go_on(self):
        b = self.fake_bundle()
        rows, out, _ = self.session("--bin-dir", b, "--force", "--steps", "tests,table4", "--max-step", "2")
        self.assertEqual(rows["tests"]["status"], "timeout", rows["tests"])
        self.assertLess(float(rows["tests"]["seconds"]), 60)  # 2 s, then SIGKILL 10 s later at most
        for step in ("table4", "table4_cupti", "table4_fused"):
            self.assertEqual(rows[step]["status"], "failed", rows[step])
            self.assertIn("fake failure", rows[step]["detail"])
        self.assertEqual(rows["bench_kernels"]["status"], "skipped")
        with open(os.path.join(out, "summary.txt")) as f:
            self.assertIn("did not pass", f.read())  # the GPU tests' failure is flagged

    def test_time_budget(self):
        b = self.fake_bundle()
        # a budget below the packing reserve: nothing can start, however fast or slow this machine
        rows, out, _ = self.session("--bin-dir", b, "--force", "--steps", "table4,sweep", "--budget", "5")
        for step in ("table4", "sweep_seqlen"):
            self.assertEqual(rows[step]["status"], "skipped", rows[step])
            self.assertIn("time budget", rows[step]["detail"])
        with open(os.path.join(out, "summary.txt")) as f:
            text = f.read()
        self.assertIn("--steps table4,table4_cupti,table4_fused,sweep_seqlen,sweep_seqlen_fused", text)
        self.assertIn("resumes", text)

    def test_second_run_resumes(self):
        b = self.fake_bundle()
        # a layer_run that works: the table4 steps finish; the GPU test hangs and is cut
        write_exe(os.path.join(b, "bin", "layer_run"), "#!/bin/sh\necho ok-run\n")
        rows, out, _ = self.session("--bin-dir", b, "--force", "--steps", "tests,table4", "--max-step", "2")
        self.assertEqual(rows["table4"]["status"], "ok", rows["table4"])
        self.assertEqual(rows["tests"]["status"], "timeout", rows["tests"])
        with tarfile.open(os.path.join(out, "results.tar.gz")) as t:
            first = set(t.getnames())
        # the second run keeps what finished and runs again what did not
        write_exe(os.path.join(b, "bin", "test_gpu_ops"), "#!/bin/sh\necho '[  PASSED  ] 3 tests.'\n")
        write_exe(os.path.join(b, "bin", "layer_run"), "#!/bin/sh\necho 'must not run again' >&2\nexit 1\n")
        rows, out, _ = self.session("--bin-dir", b, "--force", "--steps", "tests,table4", keep=True)
        self.assertEqual(rows["tests"]["status"], "ok", rows["tests"])
        for step in ("table4", "table4_cupti", "table4_fused"):
            self.assertEqual(rows[step]["status"], "ok", rows[step])
            self.assertIn("earlier run", rows[step]["detail"])
        with tarfile.open(os.path.join(out, "results.tar.gz")) as t:
            self.assertTrue(first <= set(t.getnames()))
        with open(os.path.join(out, "log.txt")) as f:
            self.assertIn("resuming", f.read())
        # --fresh forgets it
        rows, _, _ = self.session("--bin-dir", b, "--force", "--steps", "table4", "--fresh", keep=True)
        self.assertEqual(rows["table4"]["status"], "failed", rows["table4"])

    def test_bad_usage(self):
        for args in (["--steps", "nope"], ["--budget", "x"], []):
            proc = subprocess.run(["bash", SESSION, *([os.path.join(self.tmp, "o")] if args else []), *args],
                                  capture_output=True, text=True, timeout=30)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn("error", proc.stderr)

    def test_unpack_appends_once(self):
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "results"))
        os.makedirs(os.path.join(src, "raw"))
        with open(os.path.join(src, "results", "table4_h100.csv"), "w") as f:
            f.write("a,b\n1,2\n3,4\n")
        with open(os.path.join(src, "results", "bench_kernels_h100.json"), "w") as f:
            f.write("{}\n")
        with open(os.path.join(src, "raw", "run.txt"), "w") as f:
            f.write("dev: h100\nstart_utc: 2026-01-02T03:04:05Z\n")
        fetched = os.path.join(self.tmp, "fetched")
        os.makedirs(fetched)
        with tarfile.open(os.path.join(fetched, "results.tar.gz"), "w:gz") as t:
            t.add(os.path.join(src, "results"), "results")
            t.add(os.path.join(src, "raw"), "raw")
        results = os.path.join(self.tmp, "results")
        os.makedirs(results)
        with open(os.path.join(results, "table4_h100.csv"), "w") as f:
            f.write("a,b\n0,0\n")
        proc = subprocess.run(["bash", SESSION, "--unpack", fetched, results], capture_output=True, text=True,
                              timeout=30)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(results, "table4_h100.csv")) as f:
            self.assertEqual(f.read(), "a,b\n0,0\n1,2\n3,4\n")
        kept = os.path.join(results, "device", "h100-20260102T030405Z")
        self.assertTrue(os.path.exists(os.path.join(kept, "bench_kernels_h100.json")))
        self.assertTrue(os.path.exists(os.path.join(kept, "raw", "run.txt")))
        again = subprocess.run(["bash", SESSION, "--unpack", fetched, results], capture_output=True, text=True,
                               timeout=30)
        self.assertEqual(again.returncode, 2)
        self.assertIn("already unpacked", again.stderr)


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
