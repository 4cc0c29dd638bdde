"""bench/peers/attention_sdpa.py (PyTorch SDPA at the attention shape), attention_table.py, and
bench_kernels' attention benchmarks on the cpu (issue 7).

Runs everywhere: attention_sdpa.py's bad-input and no-torch paths, its CSV rows, and its whole
run (memory pass, timing, unsupported and out-of-memory points) against a stand-in torch
(tests/fixtures/fake_torch); attention_table.py on generated JSON and CSV. Where torch is
importable (this python or ACTBENCH_TORCH_PYTHON): the math backend on the cpu for real. Where
ACTBENCH_BENCH_KERNELS names a bench_kernels binary (ctest sets it): its attention benchmarks at
two sequence lengths into the table, the batch halving when the unfused path does not fit, and
its flag errors.
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "..", "bench", "peers")
SDPA = os.path.join(PEERS, "attention_sdpa.py")
TABLE = os.path.join(PEERS, "attention_table.py")
GOAL = os.path.join(PEERS, "attention_goal.py")
FAKE_TORCH = os.path.join(HERE, "fixtures", "fake_torch")
sys.path.insert(0, PEERS)

import attention_sdpa  # noqa: E402  (imports no torch)
import torch_layer  # noqa: E402

BENCH = os.environ.get("ACTBENCH_BENCH_KERNELS", "")  # ctest sets it (a stale build/ binary could lack the benchmarks)
PEER_PYTHON = os.environ.get("ACTBENCH_TORCH_PYTHON", sys.executable)
ENV = dict(os.environ, ACTBENCH_GIT_SHA="test")
for key in [k for k in ENV if k.startswith("FAKE_TORCH")]:
    del ENV[key]


def _probe(code):
    try:
        return subprocess.run([PEER_PYTHON, "-c", code], capture_output=True, timeout=120, env=ENV).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


HAVE_TORCH = _probe("import torch, torch.nn.attention")
HAVE_BENCH = bool(BENCH) and os.access(BENCH, os.X_OK)


def run(script, *args, python=None, env=None, timeout=300):
    return subprocess.run([python or sys.executable, script, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or ENV)


def fake_env(**extra):
    env = dict(ENV, PYTHONPATH=FAKE_TORCH + os.pathsep + ENV.get("PYTHONPATH", ""))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class TmpDir(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_attn_")
        self.csv = os.path.join(self.tmp, "sdpa.csv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class SdpaCliTest(TmpDir):
    def test_bad_inputs_exit_2_with_one_line_and_no_row(self):
        cases = {
            "seq not a number": (["--seq", "2048,abc"], "--seq: 'abc' is not an integer"),
            "seq zero": (["--seq", "0"], "--seq: 0 must be >= 1"),
            "seq empty": (["--seq", ","], "--seq needs at least one sequence length"),
            "batch": (["--batch", "0"], "--batch must be >= 1"),
            "head dim": (["--head-dim", "0"], "--head-dim must be >= 1"),
            "dtype": (["--dtype", "fp8"], "unknown dtype 'fp8'"),
            "backend": (["--backend", "xformers"], "unknown backend 'xformers' (expected flash, efficient, math, cudnn)"),
            "device": (["--device", "tpu"], "unknown device 'tpu'"),
            "dropout": (["--dropout", "1"], "--dropout must be in [0, 1)"),
            "dropout nan": (["--dropout", "nan"], "--dropout must be in [0, 1)"),
            "warmup": (["--warmup", "-1"], "--warmup must be >= 0"),
            "iters": (["--iters", "0"], "--iters must be >= 1"),
            "not an int": (["--batch", "two"], "invalid int value"),
            "unknown option": (["--bogus"], "unrecognized arguments: --bogus"),
            "csv dir missing": (["--csv", os.path.join("/nonexistent", "x.csv")], "is not writable or missing"),
        }
        for name, (args, message) in cases.items():
            with self.subTest(name):
                argv = args if "--csv" in args else args + ["--csv", self.csv]
                r = run(SDPA, *argv)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertTrue(r.stderr.startswith("attention_sdpa.py: error: "), r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertFalse(os.path.exists(self.csv))

    def test_missing_csv_and_foreign_csv_are_bad_input(self):
        r = run(SDPA)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--csv FILE is required", r.stderr)
        with open(self.csv, "w") as f:
            f.write("peer,device\nx,y\n")
        r = run(SDPA, "--csv", self.csv)
        self.assertEqual(r.returncode, 2)
        self.assertIn("has a different header", r.stderr)
        with open(self.csv) as f:
            self.assertEqual(f.read(), "peer,device\nx,y\n")

    def test_no_torch_exits_2_with_one_line(self):
        fake = os.path.join(self.tmp, "notorch")
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError(\"No module named 'torch'\")\n")
        env = dict(ENV, PYTHONPATH=fake + os.pathsep + ENV.get("PYTHONPATH", ""))
        for device in ("cuda", "cpu"):
            with self.subTest(device):
                r = run(SDPA, "--csv", self.csv, "--device", device, env=env)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("PyTorch is not installed", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertFalse(os.path.exists(self.csv))

    def test_print_csv_header_needs_no_torch(self):
        r = run(SDPA, "--print-csv-header", env=fake_env(FAKE_TORCH_CUDA=0))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip().split(","), attention_sdpa.CSV_HEADER)
        for col in ["sdpa_backend", "device", "seq", "batch", "heads", "head_dim", "dtype", "dropout", "fwd_ms",
                    "bwd_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms_min", "bwd_ms_max", "fwd_tflops", "bwd_tflops",
                    "saved_bytes", "fwd_peak_bytes", "status", "reason", "git_sha", "torch_version", "cuda_version",
                    "hostname", "timestamp", "command"]:
            self.assertIn(col, attention_sdpa.CSV_HEADER)

    def test_pure_helpers(self):
        self.assertEqual(attention_sdpa.parse_seq_list("2048, 8192,2048,32768"), [2048, 8192, 32768])
        fwd, bwd = attention_sdpa.causal_flops(4, 8, 2048, 96)
        self.assertEqual(fwd, 25769803776)  # results/PERF_NOTES.md §4
        self.assertEqual(bwd, 64424509440)
        self.assertEqual(attention_sdpa.causal_flops(4, 8, 32768, 96)[0], 6597069766656)
        self.assertEqual(attention_sdpa.tflops(25769803776, "0.1"), "257.698")
        self.assertEqual(attention_sdpa.tflops(1, ""), "")
        self.assertEqual(attention_sdpa.one_line("a\n  b\tc"), "a b c")

    def test_csv_rows_round_trip_with_header_once(self):
        for seq in (2048, 8192):
            torch_layer.append_csv_row(self.csv, {"peer": "sdpa", "seq": seq, "reason": 'x "y", z\nw'},
                                       attention_sdpa.CSV_HEADER)
        with open(self.csv) as f:
            text = f.read()
        self.assertEqual(text.count("peer,sdpa_backend"), 1)
        rows = read_rows(self.csv)
        self.assertEqual([r["seq"] for r in rows], ["2048", "8192"])
        self.assertEqual(rows[0]["reason"], 'x "y", z\nw')
        with self.assertRaises(ValueError):
            torch_layer.append_csv_row(self.csv, {"no_such_column": 1}, attention_sdpa.CSV_HEADER)


class SdpaFakeTorchTest(TmpDir):
    """The whole run against tests/fixtures/fake_torch: what a GPU run writes, without a GPU."""

    def test_cuda_run_writes_ok_unsupported_and_oom_rows(self):
        r = run(SDPA, "--csv", self.csv, "--iters", "3", "--warmup", "1",
                env=fake_env(FAKE_TORCH_UNSUPPORTED=8192, FAKE_TORCH_OOM=32768))
        self.assertEqual(r.returncode, 3, r.stderr)  # a point ran out of memory: its row is written
        rows = read_rows(self.csv)
        self.assertEqual([(x["seq"], x["status"]) for x in rows],
                         [("2048", "ok"), ("8192", "unsupported"), ("32768", "oom")])
        ok, unsup, oom = rows
        self.assertEqual((ok["sdpa_backend"], ok["device"], ok["dtype"], ok["batch"], ok["heads"], ok["head_dim"]),
                         ("flash", "Fake GPU 80GB", "bf16", "4", "8", "96"))
        self.assertEqual((ok["iters"], ok["warmup"], ok["dropout"], ok["causal"]), ("3", "1", "0.1", "1"))
        for col in ("fwd_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms", "bwd_ms_min", "bwd_ms_max", "total_ms",
                    "fwd_tflops", "bwd_tflops"):
            self.assertGreaterEqual(float(ok[col]), 0.0, col)
        self.assertLessEqual(float(ok["fwd_ms_min"]), float(ok["fwd_ms"]))
        self.assertLessEqual(float(ok["fwd_ms"]), float(ok["fwd_ms_max"]))
        self.assertEqual(int(ok["fwd_flops"]), 25769803776)
        b, h, s, d = 4, 8, 2048, 96
        qkv, out, lse = 3 * b * h * s * d * 2, b * h * s * d * 2, b * h * s * 4
        self.assertEqual(int(ok["saved_bytes"]), qkv + out + lse)  # the fused path's bytes (PERF_NOTES §4)
        self.assertEqual(int(ok["fwd_delta_bytes"]), out + lse)
        self.assertEqual(ok["mem_source"], "requested")
        self.assertIn("No available kernel", unsup["reason"])
        self.assertIn("Flash attention requires", unsup["reason"])
        self.assertEqual(unsup["fwd_ms"], "")
        self.assertIn("out of memory", oom["reason"])
        for row in rows:
            self.assertEqual((row["git_sha"], row["torch_version"], row["cuda_version"]),
                             ("test", "0.0-fake", "12.0-fake"))
            self.assertTrue(row["timestamp"].endswith("Z"))
            self.assertIn("--iters 3", row["command"])
            self.assertTrue(row["hostname"])
        self.assertEqual(len(r.stdout.strip().splitlines()), 3, r.stdout)

    def test_unsupported_only_exits_0(self):
        r = run(SDPA, "--csv", self.csv, "--seq", "128,256", "--iters", "1", env=fake_env(FAKE_TORCH_UNSUPPORTED=256))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([x["status"] for x in read_rows(self.csv)], ["ok", "unsupported"])

    def test_no_gpu_and_old_torch_are_bad_input(self):
        r = run(SDPA, "--csv", self.csv, env=fake_env(FAKE_TORCH_CUDA=0))
        self.assertEqual(r.returncode, 2)
        self.assertIn("torch sees no CUDA device", r.stderr)
        r = run(SDPA, "--csv", self.csv, env=fake_env(FAKE_TORCH_NO_ATTENTION=1))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no torch.nn.attention.sdpa_kernel", r.stderr)
        self.assertFalse(os.path.exists(self.csv))

    def test_cpu_run_uses_the_host_clock_and_saved_tensors(self):
        r = run(SDPA, "--csv", self.csv, "--device", "cpu", "--backend", "math", "--seq", "64", "--iters", "2",
                env=fake_env(FAKE_TORCH_CUDA=0))
        self.assertEqual(r.returncode, 0, r.stderr)
        (row,) = read_rows(self.csv)
        self.assertEqual((row["device"], row["sdpa_backend"], row["status"], row["mem_source"]),
                         ("cpu", "math", "ok", "saved_tensors"))
        self.assertEqual(row["fwd_peak_bytes"], "")


@unittest.skipUnless(HAVE_TORCH, "torch (with torch.nn.attention) not importable by %s" % PEER_PYTHON)
class SdpaTorchTest(TmpDir):
    def test_math_backend_on_cpu(self):
        r = run(SDPA, "--csv", self.csv, "--device", "cpu", "--backend", "math", "--seq", "16,32", "--batch", "1",
                "--heads", "2", "--head-dim", "8", "--dtype", "fp32", "--iters", "2", "--warmup", "1",
                python=PEER_PYTHON)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = read_rows(self.csv)
        self.assertEqual([(x["seq"], x["status"]) for x in rows], [("16", "ok"), ("32", "ok")])
        for row in rows:
            s = int(row["seq"])
            self.assertGreater(float(row["fwd_ms"]), 0)
            self.assertGreater(float(row["bwd_ms"]), 0)
            self.assertGreaterEqual(int(row["saved_bytes"]), 3 * 2 * s * 8 * 4)  # at least q, k, v
            self.assertEqual(row["device"], "cpu")

    def test_flash_on_cpu_runs_or_says_why_not(self):
        r = run(SDPA, "--csv", self.csv, "--device", "cpu", "--seq", "16", "--batch", "1", "--heads", "2",
                "--head-dim", "8", "--dtype", "fp32", "--iters", "1", "--warmup", "0", python=PEER_PYTHON)
        self.assertEqual(r.returncode, 0, r.stderr)
        (row,) = read_rows(self.csv)
        self.assertIn(row["status"], ("ok", "unsupported"))
        if row["status"] == "unsupported":
            self.assertTrue(row["reason"])


def bench_json(path, seq, batch, cells, device="NVIDIA H100 80GB HBM3", backend="cuda"):
    """A bench_kernels --benchmark_out JSON: cells = {name: (ms, batch) | "error message"}."""
    benchmarks = [{"name": "%s/dropout_fwd_attention/manual_time" % backend, "run_type": "iteration",
                   "real_time": 0.2, "time_unit": "ms"}]
    for name, value in cells.items():
        b = {"name": "%s/%s/manual_time" % (backend, name), "run_type": "iteration", "iterations": 5,
             "time_unit": "ms"}
        if isinstance(value, str):
            b.update(error_occurred=True, error_message=value, real_time=0.0)
        else:
            ms, b_ran = value
            b.update(real_time=ms * 1.01, ms_median=ms, seq=float(seq), batch=float(b_ran), heads=8.0,
                     head_dim=96.0, saved_bytes=float(1000 * b_ran))
            if b_ran != batch:
                b["label"] = "b=%d: b=%d out of memory" % (b_ran, batch)
        benchmarks.append(b)
    doc = {"context": {"actbench_backend": backend, "actbench_device": device, "actbench_seq": str(seq),
                       "actbench_attn_batch": str(batch)}, "benchmarks": benchmarks}
    with open(path, "w") as f:
        json.dump(doc, f)


class TableTest(TmpDir):
    def write_fixtures(self):
        self.j1, self.j2 = os.path.join(self.tmp, "s2048.json"), os.path.join(self.tmp, "s32768.json")
        bench_json(self.j1, 2048, 4, {"attention_fused_fwd": (2.0, 4), "attention_fused_bwd": (6.0, 4),
                                      "attention_unfused_fwd": (1.0, 4), "attention_unfused_bwd": (1.5, 4),
                                      "attention_unfused_selective_bwd": (3.0, 4)})
        bench_json(self.j2, 32768, 4, {"attention_fused_fwd": (400.0, 4), "attention_fused_bwd": (1200.0, 4),
                                       "attention_unfused_fwd": (50.0, 1),
                                       "attention_unfused_bwd": "out of memory at b=1 s=32768",
                                       "attention_unfused_selective_bwd": (150.0, 1)})
        for seq, fwd, bwd, status in ((2048, 0.1, 0.3, "ok"), (2048, 0.2, 0.6, "ok"), (8192, 1, 3, "ok"),
                                      (32768, "", "", "unsupported")):
            torch_layer.append_csv_row(self.csv, {"peer": "sdpa", "sdpa_backend": "flash", "device": "H100", "seq": seq,
                                                  "batch": 4, "fwd_ms": fwd, "bwd_ms": bwd, "status": status,
                                                  "saved_bytes": 4000, "torch_version": "2.11",
                                                  "reason": "no kernel (test)" if status != "ok" else ""},
                                       attention_sdpa.CSV_HEADER)
        torch_layer.append_csv_row(self.csv, {"sdpa_backend": "math", "seq": 2048, "batch": 4, "fwd_ms": 9,
                                              "bwd_ms": 9, "status": "ok"}, attention_sdpa.CSV_HEADER)

    def table_rows(self, out):
        rows = {}
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0].isdigit() and len(parts) >= 14 and parts[1].isdigit():
                rows.setdefault(parts[0], parts)
        return rows

    def test_side_by_side_ratios(self):
        self.write_fixtures()
        r = run(TABLE, self.j1, self.j2, self.csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = self.table_rows(r.stdout)
        self.assertEqual(sorted(rows, key=int), ["2048", "8192", "32768"])
        s2k = rows["2048"]
        # s b fused_fwd fused_bwd unf_fwd unf_bwd sel_bwd sdpa_fwd sdpa_bwd | fused/sdpa fwd bwd total | sel | unf
        self.assertEqual(s2k[:9], ["2048", "4", "2.000", "6.000", "1.000", "1.500", "3.000", "0.200", "0.600"])
        self.assertEqual(s2k[9:], ["10.000", "10.000", "10.000", "2.000", "3.200"])  # the newest SDPA row
        s8k = rows["8192"]
        self.assertEqual(s8k[2:7], ["-"] * 5)
        self.assertEqual(s8k[7:9], ["1.000", "3.000"])
        self.assertIn("unsup", rows["32768"])
        self.assertIn("oom", rows["32768"])
        self.assertIn("[b=1]", r.stdout)
        # fused/selective per sample: (400 + 1200) / 4 over (50 + 150) / 1 = 2.0
        self.assertIn("2.000*", rows["32768"])
        self.assertIn("per sample", r.stdout)
        self.assertIn("NVIDIA H100 80GB HBM3", r.stdout)
        self.assertIn("s=32768 unfused_bwd: out of memory", r.stdout)
        self.assertIn("s=32768 sdpa: no kernel (test)", r.stdout)
        self.assertIn("saved for backward", r.stdout)

    def test_other_sdpa_backend_and_no_csv(self):
        self.write_fixtures()
        r = run(TABLE, self.j1, self.csv, "--sdpa-backend", "math")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.table_rows(r.stdout)["2048"][7:10], ["9.000", "9.000", "0.222"])
        r = run(TABLE, self.j1)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.table_rows(r.stdout)["2048"][7:10], ["-", "-", "-"])

    def test_unreadable_json_beside_good_ones_is_skipped_with_one_note(self):
        self.write_fixtures()
        cut = os.path.join(self.tmp, "s8192.json")  # a bench_kernels run cut at its timeout
        with open(cut, "w") as f:
            f.write('{"context": {}, "benchmarks": [{"name": "cuda/attention_fused_fwd/manual_time"}')
        r = run(TABLE, self.j1, cut, self.csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.table_rows(r.stdout)["2048"][2], "2.000")
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("attention_table.py: note: skipped '%s': not valid JSON" % cut, r.stderr)

    def test_bad_input_exit_2(self):
        self.write_fixtures()
        notjson = os.path.join(self.tmp, "x.json")
        with open(notjson, "w") as f:
            f.write("{not json")
        nobench = os.path.join(self.tmp, "y.json")
        with open(nobench, "w") as f:
            json.dump({"context": {}}, f)
        noattn = os.path.join(self.tmp, "z.json")
        bench_json(noattn, 2048, 4, {})
        foreign = os.path.join(self.tmp, "f.csv")
        with open(foreign, "w") as f:
            f.write("a,b\n1,2\n")
        cases = {
            "nothing": ([], "usage"),
            "missing file": ([os.path.join(self.tmp, "nope.json")], "no such file"),
            "not json": ([notjson], "cannot read bench_kernels JSON"),
            "no benchmarks": ([nobench], "no 'benchmarks' list"),
            "no attention": ([noattn], "no attention_* benchmarks"),
            "foreign csv": ([self.j1, foreign], "is not an attention_sdpa.py CSV"),
            "two csvs": ([self.j1, self.csv, foreign], "at most one SDPA CSV"),
            "odd file": ([self.j1, "x.txt"], "neither .json"),
            "unknown option": ([self.j1, "--wide"], "unknown option"),
        }
        for name, (args, message) in cases.items():
            with self.subTest(name):
                r = run(TABLE, *args)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(message, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


def goal_json(path, dropout, fwd, bwd, seq=8192, head_dim=128, dtype="bf16"):
    """A bench_kernels JSON of attention_fused_fwd / _bwd: (ms, flops) each."""
    benchmarks = [{"name": "cuda/attention_fused_" + p, "run_type": "iteration", "seq": seq, "head_dim": head_dim,
                   "dropout": dropout, "ms_median": ms, "flops": flops}
                  for p, (ms, flops) in (("fwd", fwd), ("bwd", bwd))]
    with open(path, "w") as f:
        json.dump({"context": {"actbench_backend": "cuda", "actbench_device": "NVIDIA H100 80GB HBM3",
                               "actbench_dtype": dtype}, "benchmarks": benchmarks}, f)


class GoalTest(TmpDir):
    """attention_goal.py: ours over cuDNN's TFLOP/s per pass against 0.6 (no dropout) and 0.5."""

    def sdpa_row(self, backend, dropout, fwd, bwd, **extra):
        row = {"sdpa_backend": backend, "seq": 8192, "head_dim": 128, "dtype": "bf16", "dropout": dropout,
               "causal": 1, "fwd_tflops": fwd, "bwd_tflops": bwd, "status": "ok"}
        row.update(extra)
        torch_layer.append_csv_row(self.csv, row, attention_sdpa.CSV_HEADER)

    def lines(self, out):
        """{(dropout, pass): [dropout, pass, ours, cudnn, flash, ratio, goal, verdict]}"""
        rows = (l.split(None, 7) for l in out.splitlines())
        return {(p[0], p[1]): p for p in rows if len(p) == 8 and p[1] in ("fwd", "bwd")}

    def test_ratios_and_verdicts_per_pass_and_dropout(self):
        j0, j1 = os.path.join(self.tmp, "p0.json"), os.path.join(self.tmp, "p1.json")
        # 1e12 FLOPs in 2 ms is 500 TFLOP/s; in 5 ms 200
        goal_json(j0, 0.0, (2.0, 1e12), (5.0, 1e12))
        goal_json(j1, 0.1, (4.0, 1e12), (10.0, 1e12))
        self.sdpa_row("cudnn", 0.0, 600, 400)   # fwd 500/600 = 0.833 met; bwd 200/400 = 0.5 < 0.6 not met
        self.sdpa_row("flash", 0.0, 450, 300)
        self.sdpa_row("cudnn", 0.1, 400, 200)   # fwd 250/400 = 0.625; bwd 100/200 = 0.5: both >= 0.5
        self.sdpa_row("cudnn", 0.1, 1, 1, status="oom")  # not ok: ignored
        self.sdpa_row("cudnn", 0.0, 1, 1, head_dim=96)   # another shape: ignored
        r = run(GOAL, j0, j1, self.csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = self.lines(r.stdout)
        self.assertEqual(rows[("0", "fwd")][2:], ["500.0", "600.0", "450.0", "0.833", ">=0.6", "met"])
        self.assertEqual(rows[("0", "bwd")][2:], ["200.0", "400.0", "300.0", "0.500", ">=0.6", "not met"])
        self.assertEqual(rows[("0.1", "fwd")][6:], [">=0.5", "met"])
        self.assertEqual(rows[("0.1", "fwd")][5], "0.625")
        self.assertEqual(rows[("0.1", "bwd")][5], "0.500")
        self.assertEqual(rows[("0.1", "bwd")][4], "-")  # no flash row with dropout
        self.assertIn("goal: not met (4 of 4 passes measured on both sides)", r.stdout)
        self.assertIn("NVIDIA H100", r.stdout)

    def test_all_met_and_nothing_to_compare(self):
        j0 = os.path.join(self.tmp, "p0.json")
        goal_json(j0, 0.0, (2.0, 1e12), (5.0, 1e12))
        self.sdpa_row("cudnn", 0.0, 500, 250)
        r = run(GOAL, j0, self.csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("goal: met (2 of 2", r.stdout)
        r = run(GOAL, j0)  # no SDPA side
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("goal: not measured", r.stdout)
        goal_json(j0, 0.0, (2.0, 1e12), (5.0, 1e12), dtype="fp32")  # fp32 rows are not the goal's
        r = run(GOAL, j0, self.csv)
        self.assertIn("no rows at this shape", r.stdout)

    def test_bad_input_exit_2(self):
        j0 = os.path.join(self.tmp, "p0.json")
        goal_json(j0, 0.0, (2.0, 1e12), (5.0, 1e12))
        bad_json = os.path.join(self.tmp, "bad.json")
        with open(bad_json, "w") as f:
            f.write("{")
        foreign = os.path.join(self.tmp, "foreign.csv")
        with open(foreign, "w") as f:
            f.write("a,b\n1,2\n")
        for args, message in (([], "no bench_kernels JSON"), ([j0, "x.txt"], "neither a .json"),
                              ([bad_json], "cannot read bench_kernels JSON"), ([j0, foreign], "not an attention_sdpa.py CSV"),
                              ([j0, "--seq", "0"], "--seq must be >= 1"), ([j0, "--head-dim"], "needs a value"),
                              ([j0, "--bogus"], "unknown option")):
            with self.subTest(args=args):
                r = run(GOAL, *args)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(message, r.stderr)


@unittest.skipUnless(HAVE_BENCH, "ACTBENCH_BENCH_KERNELS does not name a bench_kernels binary (%r)" % BENCH)
class BenchKernelsAttentionTest(TmpDir):
    NAMES = ["attention_fused_fwd", "attention_fused_bwd", "attention_unfused_fwd", "attention_unfused_bwd",
             "attention_unfused_selective_bwd"]

    def bench(self, *args, out=None):
        argv = [BENCH, "--backend=cpu", "--benchmark_min_time=0.01"] + list(args)
        if out:
            argv += ["--benchmark_out=" + out, "--benchmark_out_format=json"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)

    def load(self, path):
        with open(path) as f:
            doc = json.load(f)
        return doc, {b["name"].split("/")[1]: b for b in doc["benchmarks"]}

    def test_attention_benchmarks_at_two_lengths_into_the_table(self):
        outs = []
        for seq in (64, 96):
            out = os.path.join(self.tmp, "ours_%d.json" % seq)
            r = self.bench("--benchmark_filter=attention", "--seq=%d" % seq, out=out)
            self.assertEqual(r.returncode, 0, r.stderr)
            doc, by = self.load(out)
            self.assertEqual(doc["context"]["actbench_seq"], str(seq))
            self.assertEqual(doc["context"]["actbench_attn_batch"], "2")
            B, s, d = 2 * 4, seq, 64  # the small shape: b 2, 4 heads of 64, fp32
            for name in self.NAMES:
                b = by[name]
                self.assertFalse(b.get("error_occurred"), b.get("error_message"))
                self.assertEqual((b["seq"], b["batch"], b["heads"], b["head_dim"]), (s, 2, 4, 64))
                fwd = 4.0 * B * s * s * d / 2
                self.assertAlmostEqual(b["flops"], fwd if name.endswith("fwd") else 2.5 * fwd, delta=1)
                self.assertLessEqual(b["ms_min"], b["ms_median"])
                self.assertLessEqual(b["ms_median"], b["ms_max"])
                self.assertGreater(b["TFLOP/s"], 0)
            qkv, out_b, lse, n = 3 * B * s * d * 4, B * s * d * 4, B * s * 4, B * s * s
            self.assertEqual(by["attention_fused_fwd"]["saved_bytes"], qkv + out_b + lse)
            self.assertEqual(by["attention_fused_bwd"]["saved_bytes"], qkv + out_b + lse)
            self.assertEqual(by["attention_unfused_fwd"]["saved_bytes"], qkv + out_b + n * (4 + 4 + 1))
            self.assertEqual(by["attention_unfused_selective_bwd"]["saved_bytes"], qkv + out_b)
            self.assertEqual(by["attention_fused_fwd"]["flops_executed"], 2 * 2.0 * B * d * s * (s + 1) / 2)
            self.assertEqual(by["attention_unfused_bwd"]["flops_executed"], 8.0 * B * s * s * d)
            self.assertEqual(by["attention_unfused_selective_bwd"]["flops_executed"], 10.0 * B * s * s * d)
            outs.append(out)
        for seq in (64, 96):
            torch_layer.append_csv_row(self.csv, {"sdpa_backend": "flash", "seq": seq, "batch": 2, "fwd_ms": 0.5,
                                                  "bwd_ms": 1.0, "status": "ok"}, attention_sdpa.CSV_HEADER)
        r = run(TABLE, *outs, self.csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("cpu on host-cpu", r.stdout)
        lines = [l.split() for l in r.stdout.splitlines() if l.split() and l.split()[0] in ("64", "96")]
        self.assertEqual(len(lines), 4)  # the times and the bytes
        self.assertNotIn("-", lines[0][2:14])

    def test_multi_latent_attention_heads_count_their_narrower_v(self):
        out = os.path.join(self.tmp, "mla.json")
        r = self.bench("--benchmark_filter=attention_fused_mla", "--seq=64", out=out)
        self.assertEqual(r.returncode, 0, r.stderr)
        _, by = self.load(out)
        B, s, d, dv = 2 * 4, 64, 192, 128  # the small shape's b and heads, DeepSeek-V3's head widths, fp32
        for name in ("attention_fused_mla_fwd", "attention_fused_mla_bwd"):
            b = by[name]
            self.assertFalse(b.get("error_occurred"), b.get("error_message"))
            self.assertEqual((b["head_dim"], b["head_dim_v"]), (d, dv))
            # q, k and v, the output at v's width, the fp32 row statistics
            self.assertEqual(b["saved_bytes"], 4 * B * s * (2 * d + dv) + 4 * B * s * dv + 4 * B * s)
        self.assertEqual(by["attention_fused_mla_fwd"]["flops"], B * s * s * (d + dv))
        self.assertEqual(by["attention_fused_mla_bwd"]["flops"], B * s * s * (3 * d + 2 * dv))
        self.assertEqual(by["attention_fused_mla_fwd"]["flops_executed"], 2.0 * B * s * (s + 1) / 2 * (d + dv))

    def test_unfused_halves_the_batch_when_it_does_not_fit(self):
        out = os.path.join(self.tmp, "oom.json")
        r = self.bench("--benchmark_filter=attention_unfused_fwd|attention_fused_fwd", "--seq=1024",
                       "--memory-limit=70MiB", out=out)
        self.assertEqual(r.returncode, 0, r.stderr)
        _, by = self.load(out)
        unf = by["attention_unfused_fwd"]
        self.assertFalse(unf.get("error_occurred"), unf.get("error_message"))
        self.assertEqual(unf["batch"], 1)
        self.assertEqual(unf["label"], "b=1: b=2 out of memory")
        self.assertEqual(by["attention_fused_fwd"]["batch"], 2)
        # --attn-batch fixes b: no halving, a skip that says what to try
        r = self.bench("--benchmark_filter=attention_unfused_fwd", "--seq=1024", "--memory-limit=70MiB",
                       "--attn-batch=2", out=out)
        self.assertEqual(r.returncode, 0, r.stderr)
        _, by = self.load(out)
        unf = by["attention_unfused_fwd"]
        self.assertTrue(unf.get("error_occurred"))
        self.assertIn("out of memory at b=2 s=1024", unf["error_message"])
        self.assertIn("try --attn-batch=1", unf["error_message"])
        # every other benchmark past the memory skips with the reason instead of failing the run
        r = self.bench("--benchmark_filter=softmax_causal_fwd", "--seq=2048", "--memory-limit=64MiB", out=out)
        self.assertEqual(r.returncode, 0, r.stderr)
        _, by = self.load(out)
        self.assertIn("out of memory", by["softmax_causal_fwd"]["error_message"])

    def test_head_dim_and_dropout_flags_set_the_attention_shape(self):
        out = os.path.join(self.tmp, "d32.json")
        r = self.bench("--benchmark_filter=attention_fused", "--seq=64", "--head-dim=32", "--attn-dropout=0",
                       out=out)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc, by = self.load(out)
        self.assertEqual((doc["context"]["actbench_head_dim"], doc["context"]["actbench_attn_dropout"]), ("32", "0"))
        self.assertEqual(doc["context"]["actbench_dtype"], "fp32")
        B, s, d = 2 * 4, 64, 32
        for name in ("attention_fused_fwd", "attention_fused_bwd"):
            self.assertEqual((by[name]["head_dim"], by[name]["dropout"]), (d, 0))
        self.assertEqual(by["attention_fused_fwd"]["flops"], 4.0 * B * s * s * d / 2)
        self.assertEqual(by["attention_fused_mla_fwd"]["head_dim"], 192)  # MLA keeps DeepSeek-V3's heads
        # the default: the paper's dropout, the shape's head size
        r = self.bench("--benchmark_filter=attention_fused_fwd", "--seq=64", out=out)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc, by = self.load(out)
        self.assertEqual((doc["context"]["actbench_head_dim"], doc["context"]["actbench_attn_dropout"]), ("64", "0.1"))
        self.assertAlmostEqual(by["attention_fused_fwd"]["dropout"], 0.1, places=6)

    def test_flag_errors_exit_2(self):
        for flag, message in (("--seq=0", "--seq must be an integer >= 1"), ("--seq=", "--seq must be"),
                              ("--attn-batch=x", "--attn-batch must be an integer >= 1"),
                              ("--head-dim=0", "--head-dim must be an integer >= 1"),
                              ("--attn-dropout=1", "--attn-dropout must be a probability"),
                              ("--attn-dropout=x", "--attn-dropout must be a probability"),
                              ("--memory-limit=12XB", "unknown unit")):
            with self.subTest(flag):
                r = self.bench(flag)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)


if __name__ == "__main__":
    unittest.main()
