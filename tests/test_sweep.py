"""runners/sweep.py: plans expand as documented, a killed sweep resumes without losing or
duplicating rows, failures and OOMs are recorded and the sweep goes on, concurrent sweeps
never interleave rows. Needs ACTBENCH_BUILD (the build folder) for layer_run.
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNERS = os.path.join(HERE, "..", "runners")
sys.path.insert(0, RUNNERS)
import sweep  # noqa: E402

SWEEP = os.path.join(RUNNERS, "sweep.py")


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


class PlanExpansion(unittest.TestCase):
    def points(self, name):
        return sweep.expand(sweep.load_plan(name), {"dtype": "bf16", "layers": 1})

    def test_builtin_plans(self):
        t4 = self.points("table4")
        self.assertEqual([p["config"] for p in t4], sweep.PAPER_CONFIGS)
        self.assertTrue(all(p["model"] == "22b" and p["tp"] == 8 and p["batch"] == 4 and p["seq"] == 2048 for p in t4))
        seq = self.points("seqlen")
        self.assertEqual(len(seq), 7 * 5)
        self.assertEqual(sorted({p["seq"] for p in seq}), [512, 1024, 2048, 4096, 8192, 16384, 32768])
        self.assertTrue(all(p["hidden"] == 6144 and p["batch"] == 1 for p in seq))
        tp = self.points("tp")
        self.assertEqual(sorted({p["tp"] for p in tp}), [1, 2, 4, 8])
        models = self.points("models")
        self.assertEqual(len(models), 20)
        self.assertEqual({(p["model"], p["hidden"], p["heads"]) for p in models},
                         {("22b", 6144, 64), ("175b", 12288, 96), ("530b", 20480, 128), ("1t", 25600, 160)})

    def test_plan_file_and_bad_fields(self):
        tmp = tempfile.mkdtemp()
        try:
            path = os.path.join(tmp, "p.json")
            with open(path, "w") as f:
                json.dump({"fixed": {"model": "tiny"}, "grid": {"seq": [8, 16, 24], "batch": [1, 3]}}, f)
            pts = sweep.expand(sweep.load_plan(path), {"dtype": "fp32", "layers": 2})
            self.assertEqual(len(pts), 6 * 5)  # no config: the paper's five, one point each
            self.assertEqual({(p["seq"], p["batch"], p["config"]) for p in pts},
                             {(s, b, c) for s in (8, 16, 24) for b in (1, 3) for c in sweep.PAPER_CONFIGS})
            self.assertTrue(all(p["layers"] == 2 and p["dtype"] == "fp32" and p["hidden"] == 64 for p in pts))
            with open(path, "w") as f:
                json.dump({"grid": {"sequence": [1]}}, f)
            with self.assertRaises(sweep.SweepError):
                sweep.expand(sweep.load_plan(path), {})
            with self.assertRaises(sweep.SweepError):
                sweep.load_plan("no_such_plan")
        finally:
            shutil.rmtree(tmp)


class SweepRuns(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_sweep_")
        self.csv = os.path.join(self.tmp, "sweep.csv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def plan(self, grid, fixed=None):
        path = os.path.join(self.tmp, f"plan{len(os.listdir(self.tmp))}.json")
        with open(path, "w") as f:
            json.dump({"fixed": fixed or {"model": "tiny"}, "grid": grid}, f)
        return path

    def sweep(self, *args, csv_path=None):
        return subprocess.run([sys.executable, SWEEP, *args, "--csv", csv_path or self.csv],
                              capture_output=True, text=True, timeout=600)

    def test_bad_plan_is_one_line_and_exit_2(self):
        r = self.sweep("nonsense")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown plan", r.stderr)
        self.assertFalse(os.path.exists(self.csv))

    def test_dry_run_runs_nothing(self):
        r = self.sweep("table4", "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len([l for l in r.stdout.splitlines() if l.startswith("run ")]), 5)
        self.assertIn("--emulate-tp", r.stdout)  # meta emulates t = 8
        self.assertFalse(os.path.exists(self.csv))

    def test_meta_models_then_resume_skips_everything(self):
        r = self.sweep("models", "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(self.csv)
        self.assertEqual(len(rows), 20)
        self.assertTrue(all(row[header.index("status")] == "ok" for row in rows))
        r = self.sweep("models", "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("20 already in", r.stderr)
        self.assertEqual(len(read_rows(self.csv)[1]), 20)

    def test_failed_and_oom_points_are_recorded_and_the_sweep_goes_on(self):
        # heads 5 do not divide h = 64: layer_run refuses the point; the others run.
        plan = self.plan({"heads": [4, 5], "config": ["baseline", "full"]}, fixed={"model": "tiny", "tp": 2})
        r = self.sweep(plan, "--backend", "meta")
        self.assertEqual(r.returncode, 1)
        header, rows = read_rows(self.csv)
        status = [(row[header.index("heads")], row[header.index("status")]) for row in rows]
        self.assertEqual(sorted(status), [("4", "ok"), ("4", "ok"), ("5", "failed"), ("5", "failed")])
        failed = [row for row in rows if row[header.index("status")] == "failed"]
        self.assertTrue(all("divisible" in row[header.index("message")] for row in failed), failed)
        # A resume skips recorded failures; --retry-failed runs them again.
        self.assertIn("4 already in", self.sweep(plan, "--backend", "meta").stderr)
        self.assertIn("2 already in", self.sweep(plan, "--backend", "meta", "--retry-failed").stderr)
        # Out of memory: rows with status oom, exit 0 (an oom is a result, not a failure).
        oom_csv = os.path.join(self.tmp, "oom.csv")
        r = self.sweep("table4", "--backend", "meta", "--memory-limit", "1GiB", csv_path=oom_csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(oom_csv)
        self.assertEqual([row[header.index("status")] for row in rows], ["oom"] * 5)

    def test_killed_sweep_resumes_without_loss_or_duplicates(self):
        plan = self.plan({"seq": [8, 16, 24, 32], "config": sweep.PAPER_CONFIGS},
                         fixed={"model": "tiny", "tp": 2})
        args = [sys.executable, SWEEP, plan, "--backend", "cpu", "--launcher", "emulate", "--dtype", "fp32",
                "--iters", "300", "--warmup", "0", "--csv", self.csv]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:  # kill the whole process group once two rows are in
            if os.path.exists(self.csv) and len(read_rows(self.csv)[1]) >= 2:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        header, before = read_rows(self.csv)
        self.assertGreaterEqual(len(before), 2)
        self.assertLess(len(before), 20, "the sweep finished before it could be killed: make points slower")
        self.assertTrue(all(len(row) == len(header) for row in before))
        r = subprocess.run(args, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, after = read_rows(self.csv)
        self.assertEqual(after[:len(before)], before)  # finished rows untouched
        keys = [tuple(row[header.index(c)] for c in sweep.KEY_COLUMNS) for row in after]
        self.assertEqual(len(keys), 20)
        self.assertEqual(len(set(keys)), 20)

    def test_concurrent_sweeps_never_interleave_rows(self):
        plans = [self.plan({"seq": [8, 16, 24, 32], "config": sweep.PAPER_CONFIGS}, fixed={"model": "tiny", "batch": b})
                 for b in (1, 2, 3)]
        procs = [subprocess.Popen([sys.executable, SWEEP, p, "--backend", "meta", "--csv", self.csv],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in plans]
        for p in procs:
            self.assertEqual(p.wait(timeout=600), 0)
        with open(self.csv) as f:
            lines = f.read().splitlines()
        header = lines[0]
        self.assertEqual(sum(1 for l in lines if l == header), 1)  # header once
        header_cols, rows = read_rows(self.csv)
        self.assertEqual(len(rows), 60)
        self.assertTrue(all(len(row) == len(header_cols) for row in rows))


if __name__ == "__main__":
    unittest.main()
