"""runners/sweep.py --launcher slurm: the batch script and the refusals anywhere; on a real
one-node Slurm started here (tests/slurm_cluster.py), a cpu sweep of 12 points with two
array tasks at once and 2-rank points under srun, a task cancelled midway and the sweep
killed and run again, ends with every point in the CSV once, holding what a local sweep
writes. Needs ACTBENCH_BUILD (the build folder) for layer_run; the cluster's tests skip (one
line) where Slurm cannot run.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNERS = os.path.join(HERE, "..", "runners")
sys.path.insert(0, RUNNERS)
import results_csv  # noqa: E402
import sweep  # noqa: E402
from slurm_cluster import SlurmCluster, SlurmUnavailable  # noqa: E402

SWEEP = os.path.join(RUNNERS, "sweep.py")
# Columns that differ between two runs of one point: times, where and when, the command line.
UNSTABLE = {"fwd_ms", "bwd_ms", "total_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms_min", "bwd_ms_max",
            "comm_ms_emulated", "hostname", "timestamp", "command"}
# 12 points: 6 of one rank, 6 of two (srun --ntasks=2).
PLAN = {"fixed": {"model": "tiny"}, "grid": {"seq": [8, 16, 24], "config": ["baseline", "full"], "tp": [1, 2]}}
POINT_ARGS = ["--backend", "cpu", "--dtype", "fp32", "--warmup", "0"]
ITERS = "300"  # a point of 1..3 s here: long enough to be cancelled, or found running by a rerun


def rows_by_key(path):
    header, rows, problems = results_csv.read(path)
    keys = [tuple(row[header.index(c)] for c in sweep.KEY_COLUMNS) for _, row in rows]
    return header, {k: dict(zip(header, row)) for k, (_, row) in zip(keys, rows)}, keys, problems


def submitted(stderr):
    """How many points the sweep's output says it submitted."""
    return sum(int(n) for n in re.findall(r"submitted (\d+) points as job", stderr))


class Options(unittest.TestCase):
    """No cluster needed: what --launcher slurm refuses, and the script --dry-run prints."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.csv = os.path.join(self.tmp, "r.csv")
        self.no_slurm = os.path.join(self.tmp, "bin")  # a PATH without sbatch
        os.mkdir(self.no_slurm)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def sweep(self, *args, path=None):
        env = dict(os.environ, PATH=path or self.no_slurm)
        return subprocess.run([sys.executable, SWEEP, *args], capture_output=True, text=True, env=env, timeout=120)

    def test_dry_run_prints_one_array_per_world_size(self):
        plan = os.path.join(self.tmp, "p.json")
        with open(plan, "w") as f:
            json.dump(PLAN, f)
        r = self.sweep(plan, "--csv", self.csv, "--launcher", "slurm", "--dry-run", "--max-concurrent", "2",
                       "--partition", "gpu", "--time", "00:30:00", "--gpus-per-node", "8",
                       "--sbatch-arg=--qos=high", *POINT_ARGS)
        self.assertEqual(r.returncode, 0, r.stderr)
        scripts = r.stdout.split("#!/bin/bash\n")[1:]
        self.assertEqual(len(scripts), 2, r.stdout)
        for ranks, script in zip((1, 2), scripts):
            self.assertIn("--array=0-5%2 ", script)
            self.assertIn(f"--ntasks={ranks} --nodes=1 --ntasks-per-node={ranks} --gpus-per-node={ranks} "
                          f"--partition=gpu --time=00:30:00 --qos=high SCRIPT", script)
            self.assertEqual(len(re.findall(rf"run=\(srun .*--ntasks={ranks} .*layer_run .*--tp {ranks} ", script)),
                             6)
        self.assertFalse(os.path.exists(self.csv))
        self.assertFalse(os.path.exists(self.csv + ".slurm"))
        self.assertIn("12 to submit", r.stderr)

    def test_error_line_is_not_sruns(self):
        failed = ("layer_run: error: hidden 64 is not divisible by heads 5\n"
                  "srun: error: node1: task 0: Exited with exit code 2\n")
        self.assertEqual(sweep.error_line(failed, 2), "layer_run: error: hidden 64 is not divisible by heads 5")
        self.assertEqual(sweep.error_line("srun: error: Unable to create step for job 7: Invalid generic resource\n",
                                          1), "srun: error: Unable to create step for job 7: Invalid generic resource")

    def test_how_a_task_slurm_ended_is_recorded(self):
        # Resubmitted while attempts are left, except for ends that would come again; then a
        # failed row with the state Slurm last showed (no sacct here: the answer is squeue's).
        import argparse
        import sweep_slurm
        header = sweep.read_header(sweep.find_layer_run(None))
        p = sweep.expand({"name": "t", "fixed": {"model": "tiny", "seq": 8, "config": "baseline"}}, {})[0]
        key = sweep.point_key(p, "cpu", False)
        cases = [("CANCELLED", 1, "again"), ("NODE_FAIL", 3, "again"), ("CANCELLED", 4, "failed"),
                 ("TIMEOUT", 1, "failed"), ("OUT_OF_MEMORY", 1, "failed"), (None, 1, "again"), (None, 4, "failed")]
        for state, attempts, expected in cases:
            with self.subTest(state=state, attempts=attempts):
                csv_path = os.path.join(self.tmp, f"{state}{attempts}.csv")
                args = argparse.Namespace(csv=csv_path, resubmit=3, collect=False)
                slurm = sweep_slurm.Slurm(args, header, set(), None)
                point = {"key": list(key), "label": "tiny", "ranks": 1, "command": ["srun", "layer_run"],
                         "attempts": attempts, "job": {"name": "actbench-x-1", "index": 0, "id": "5"}}
                slurm.points = {"d": point}
                tasks = {"actbench-x-1": {0: ("5_0", state, "None")}} if state else {}
                with unittest.mock.patch.object(sweep_slurm, "accounting", return_value=None):
                    settled = slurm._settle("d", point, tasks)
                self.assertEqual(settled, "again" if expected == "again" else "done")
                if expected == "failed":
                    _, got, keys, _ = rows_by_key(csv_path)
                    self.assertEqual(keys, [key])
                    self.assertEqual(got[key]["status"], "failed")
                    self.assertIn(f"slurm task 5_0: {state}" if state else "no longer known to Slurm",
                                  got[key]["message"])

    def test_bad_options_are_one_line_and_exit_2(self):
        cases = [
            (["smoke", "--launcher", "slurm"], "sbatch is not on PATH"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--time", "1h"], "--time '1h' is not a Slurm time"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--time", "0:00"], "--time '0:00'"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--time", "１0"], "--time"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--max-concurrent", "0"], "--max-concurrent must be"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--gpus-per-node", "x"], "--gpus-per-node must be"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--poll", "-1"], "--poll must be"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--partition", "a b"], "--partition 'a b'"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--sbatch-arg=--array=1-3"], "the sweep sets --array"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--sbatch-arg=--job=x"], "the sweep sets --job-name"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--sbatch-arg=-n4"], "the sweep sets -n"),
            (["smoke", "--launcher", "slurm", "--dry-run", "--sbatch-arg=qos"], "is not one sbatch option"),
            (["smoke", "--partition", "gpu"], "--partition needs --launcher slurm"),
            (["smoke", "--resubmit", "1"], "--resubmit needs --launcher slurm"),
            (["--collect", "--launcher", "mpi"], "--collect is for sweeps of --launcher slurm"),
            (["smoke", "--collect"], "--collect takes no PLAN"),
            ([], "a PLAN is needed"),
        ]
        for args, said in cases:
            with self.subTest(args=args):
                r = self.sweep(*args, "--csv", self.csv)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(said, r.stderr)
                self.assertFalse(os.path.exists(self.csv))


class OnSlurm(unittest.TestCase):
    """Sweeps through a one-node Slurm cluster of 2 CPUs started for these tests."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = SlurmCluster(cpus=2)
        try:
            cls.cluster.__enter__()
        except SlurmUnavailable as e:
            raise unittest.SkipTest(f"no Slurm cluster here: {e}")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.csv = os.path.join(self.tmp, "slurm.csv")
        # Open MPI's transport inside one node, as tests/CMakeLists.txt sets it for mpirun.
        self.env = dict(self.cluster.env, OMPI_MCA_btl="self,vader", OMPI_MCA_pml="ob1",
                        OMPI_MCA_btl_vader_single_copy_mechanism="none")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.log.close()
        subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True, timeout=60)
        shutil.rmtree(self.tmp)

    def plan(self, plan):
        path = os.path.join(self.tmp, f"plan{len(os.listdir(self.tmp))}.json")
        with open(path, "w") as f:
            json.dump(plan, f)
        return path

    def slurm_args(self, plan, *more, csv_path=None):
        return [sys.executable, SWEEP, plan, "--csv", csv_path or self.csv, "--launcher", "slurm", "--poll", "0.3",
                *POINT_ARGS, *more]

    def start(self, args):
        log = open(os.path.join(self.tmp, f"sweep{len(self.procs)}.err"), "w+")
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=self.env, text=True)
        proc.log = log
        self.procs.append(proc)
        return proc

    def said(self, proc):
        proc.log.seek(0)
        return proc.log.read()

    def queue(self):
        """[(task id, state)] of every array task Slurm knows."""
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i %T"], env=self.env, capture_output=True,
                             text=True, timeout=60).stdout
        return [tuple(line.split()) for line in out.splitlines() if line.strip()]

    def running(self):
        return [t for t, state in self.queue() if state == "RUNNING"]

    def wait_until(self, what, check, timeout=120, proc=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            if proc is not None and proc.poll() is not None:
                self.fail(f"the sweep ended before {what}: {self.said(proc)}")
            time.sleep(0.1)
        self.fail(f"no {what} within {timeout} s" + (f": {self.said(proc)}" if proc else ""))

    def cancel_a_running_task(self, sweep_proc):
        """Cancels one of two tasks of an array running at once, and waits until the sweep submits it
        again. A task may finish between squeue seeing it run and scancel (a loaded machine): then
        its point is done, and the next running task is cancelled instead."""
        for _ in range(5):
            running = self.wait_until("two array tasks running at once", lambda: self.running()[:2]
                                      if len(self.running()) >= 2 else None, proc=sweep_proc)
            self.assertEqual(running[0].split("_")[0], running[1].split("_")[0], running)
            subprocess.run(["scancel", running[0]], env=self.env, timeout=60)
            finished = f": ok (task {running[0]})"
            outcome = self.wait_until("resubmission of the cancelled task, or its result",
                                      lambda: "resubmitted" if submitted(self.said(sweep_proc)) == 13
                                      else "finished" if finished in self.said(sweep_proc) else None,
                                      proc=sweep_proc)
            if outcome == "resubmitted":
                return
        self.fail("every task cancelled finished first: make points slower")

    def test_cancelled_task_and_killed_sweep_still_give_each_point_once_as_locally(self):
        plan = self.plan(PLAN)
        local_csv = os.path.join(self.tmp, "local.csv")
        r = subprocess.run([sys.executable, SWEEP, plan, "--csv", local_csv, "--launcher", "mpi", "--iters", "2",
                            *POINT_ARGS], capture_output=True, text=True, env=self.env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)

        first = self.start(self.slurm_args(plan, "--iters", ITERS, "--max-concurrent", "2"))
        self.cancel_a_running_task(first)
        first.kill()  # the sweep alone: its tasks go on
        first.wait()
        self.assertIn("tasks ended without a result: 1; submitting them again", self.said(first))
        live = [t for t, state in self.queue() if state in ("PENDING", "RUNNING")]
        self.assertTrue(live, "every task ended before the sweep was killed: make points slower")

        rerun = subprocess.run(self.slurm_args(plan, "--iters", ITERS, "--max-concurrent", "2"), capture_output=True,
                               text=True, env=self.env, timeout=300)
        self.assertEqual(rerun.returncode, 0, self.said(first) + rerun.stderr)
        self.assertRegex(rerun.stderr, r"[1-9]\d* already submitted, 0 to submit")
        self.assertEqual(submitted(rerun.stderr), 0, rerun.stderr)  # the queued ones were found, not resubmitted
        self.assertEqual(os.listdir(os.path.join(self.csv + ".slurm", "points")), [])

        header, got, keys, problems = rows_by_key(self.csv)
        self.assertEqual(problems, [])
        self.assertEqual(len(keys), 12)
        self.assertEqual(len(set(keys)), 12)
        local_header, expected, _, _ = rows_by_key(local_csv)
        self.assertEqual(header, local_header)
        self.assertEqual(set(got), set(expected))
        for key, row in got.items():
            self.assertEqual(row["status"], "ok", row)
            if row["tp"] == "2":
                self.assertEqual(row["emulated"], "0")
            self.assertEqual({c: v for c, v in row.items() if c not in UNSTABLE | {"iters"}},
                             {c: v for c, v in expected[key].items() if c not in UNSTABLE | {"iters"}})

    def test_no_wait_then_collect_and_failed_points(self):
        # heads 5 does not divide h = 64: layer_run refuses it, in its task as on one machine.
        plan = self.plan({"fixed": {"model": "tiny", "seq": 8, "config": "baseline"}, "grid": {"heads": [4, 5]}})
        r = subprocess.run(self.slurm_args(plan, "--iters", "2", "--no-wait"), capture_output=True, text=True,
                           env=self.env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(submitted(r.stderr), 2)
        self.assertIn("--collect", r.stderr)

        self.wait_until("the tasks' end", lambda: not any(state in ("PENDING", "RUNNING", "COMPLETING")
                                                          for _, state in self.queue()))
        c = subprocess.run([sys.executable, SWEEP, "--collect", "--csv", self.csv], capture_output=True, text=True,
                           env=self.env, timeout=120)
        self.assertIn("0 pending, 0 running, 1 done, 1 failed", c.stderr)
        self.assertEqual(c.returncode, 1, c.stderr)  # a failed point
        _, got, keys, problems = rows_by_key(self.csv)
        self.assertEqual((len(keys), problems), (2, []))
        by_heads = {row["heads"]: row for row in got.values()}
        self.assertEqual(by_heads["4"]["status"], "ok")
        self.assertEqual(by_heads["5"]["status"], "failed")
        self.assertIn("divisible", by_heads["5"]["message"])
        # Run again: both points are in the CSV, nothing is submitted.
        r = subprocess.run(self.slurm_args(plan, "--iters", "2"), capture_output=True, text=True, env=self.env,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 already in", r.stderr)
        self.assertEqual(submitted(r.stderr), 0)

    def test_a_task_cancelled_past_the_resubmit_limit_is_a_failed_row_with_slurms_reason(self):
        plan = self.plan({"fixed": {"model": "tiny", "seq": 8, "config": "baseline"}})
        proc = self.start(self.slurm_args(plan, "--iters", "1000000", "--resubmit", "0"))
        task = self.wait_until("a running task", lambda: (self.running() or [None])[0], proc=proc)
        subprocess.run(["scancel", task], env=self.env, check=True, timeout=60)
        self.assertEqual(proc.wait(timeout=120), 1, self.said(proc))
        _, got, keys, _ = rows_by_key(self.csv)
        self.assertEqual(len(keys), 1)
        row = next(iter(got.values()))
        self.assertEqual(row["status"], "failed")
        self.assertIn(f"slurm task {task}: CANCELLED", row["message"])


if __name__ == "__main__":
    unittest.main()
