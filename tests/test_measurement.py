"""What a GPU measurement rests on, checked on the cpu and meta backends: the phase ranges
layer_run emits through NVTX (recorded by tests/nvtx_recorder.c, loaded by NVTX through
NVTX_INJECTION64_PATH as nsys's own library would be), peaks that do not depend on what ran
before, and emulated collectives timed apart from the layer.

ctest sets ACTBENCH_LAYER_RUN, ACTBENCH_NVTX_RECORDER (empty when the build has no NVTX
headers: the NVTX tests skip) and ACTBENCH_MPIEXEC.
"""
import csv
import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN", os.path.join(HERE, "..", "build", "runners", "layer_run"))
RECORDER = os.environ.get("ACTBENCH_NVTX_RECORDER", "")
MPIEXEC = os.environ.get("ACTBENCH_MPIEXEC") or shutil.which("mpirun")

FWD = ["ln1", "qkv", "core_attn", "proj", "attn_residual", "ln2", "fc1", "gelu", "fc2", "mlp_residual"]
TINY = ["--backend", "cpu", "--model", "tiny", "--dtype", "fp32"]


def read_ranges(path):
    """The log as (name, depth) per push, checking that pushes and pops balance."""
    pushes, depth, stack = [], 0, []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("push "):
                pushes.append((line[5:], depth))
                stack.append(line[5:])
                depth += 1
            elif line == "pop":
                if not stack:
                    raise AssertionError(f"{path}: pop without a push")
                stack.pop()
                depth -= 1
            else:
                raise AssertionError(f"{path}: unexpected line {line!r}")
    if stack:
        raise AssertionError(f"{path}: {len(stack)} range(s) never popped: {stack[-3:]}")
    return pushes


def iterations(names):
    """Splits the top-level push sequence into layer iterations (each starts at fwd.ln1)."""
    its, cur = [], None
    for n in names:
        if n == "fwd.ln1":
            cur = []
            its.append(cur)
        if cur is not None:
            cur.append(n)
    return its


@unittest.skipUnless(RECORDER and os.path.exists(RECORDER), "this build has no NVTX headers")
class NvtxRangesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_nvtx_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_recorded(self, config, *extra, np=None):
        log = os.path.join(self.tmp, f"nvtx_{config}.log")
        env = dict(os.environ, NVTX_INJECTION64_PATH=RECORDER, ACTBENCH_NVTX_LOG=log)
        cmd = [LAYER_RUN, *TINY, "--config", config, "--warmup", "0", "--iters", "2",
               "--csv", os.path.join(self.tmp, "out.csv"), *extra]
        if np:
            cmd = [MPIEXEC, "-np", str(np), *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return [log + f".rank{k}" for k in range(np)] if np else [log]

    def top_level(self, log):
        pushes = read_ranges(log)
        self.assertGreater(len(pushes), 0, "no range was recorded: NVTX is compiled out or not injected")
        return [n for n, d in pushes if d == 0]

    def test_baseline_has_every_forward_and_backward_phase_in_order(self):
        names = self.top_level(self.run_recorded("baseline")[0])
        its = iterations(names)
        self.assertEqual(len(its), 2)  # the two timed iterations; nothing is recorded twice
        for it in its:
            fwd = [n for n in it if n.startswith("fwd.")]
            bwd = [n for n in it if n.startswith("bwd.")]
            self.assertEqual(fwd, [f"fwd.{p}" for p in FWD])
            self.assertEqual(bwd, [f"bwd.{p}" for p in reversed(FWD)])
            self.assertLess(it.index("fwd.mlp_residual"), it.index("bwd.mlp_residual"))
            self.assertFalse([n for n in it if n.startswith("recompute.")])

    def test_selective_recomputes_core_attention_inside_backward(self):
        for it in iterations(self.top_level(self.run_recorded("selective")[0])):
            rec = [n for n in it if n.startswith("recompute.")]
            self.assertEqual(rec, ["recompute.core_attn"])
            i = it.index("recompute.core_attn")
            # after the backward of the MLP and projection, right before bwd.core_attn
            self.assertLess(it.index("bwd.proj"), i)
            self.assertEqual(it[i + 1], "bwd.core_attn")

    def test_full_recomputes_the_whole_forward_before_backward(self):
        for it in iterations(self.top_level(self.run_recorded("full")[0])):
            rec = [n for n in it if n.startswith("recompute.")]
            self.assertEqual(rec, [f"recompute.{p}" for p in FWD])
            first_bwd = it.index("bwd.mlp_residual")
            self.assertTrue(all(it.index(n) < first_bwd for n in rec))
            self.assertLess(it.index("fwd.mlp_residual"), it.index("recompute.ln1"))

    @unittest.skipUnless(MPIEXEC, "no mpirun")
    def test_sequence_parallel_communication_ranges_on_two_ranks(self):
        logs = self.run_recorded("sp", "--tp", "2", np=2)
        for log in logs:
            names = self.top_level(log)
            comm = {n for n in names if n.startswith("comm.")}
            for prefix in ("comm.fwd.all_gather.", "comm.fwd.reduce_scatter.", "comm.bwd.all_gather.",
                           "comm.bwd.reduce_scatter."):
                self.assertTrue(any(n.startswith(prefix) for n in comm), f"{log}: no {prefix}* in {sorted(comm)}")
            self.assertFalse([n for n in comm if ".all_reduce." in n and n.startswith("comm.fwd.")],
                             "sequence parallelism has no forward all-reduce")
            for it in iterations(names):
                self.assertEqual([n for n in it if n.startswith("fwd.")], [f"fwd.{p}" for p in FWD])


class MeasurementTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_meas_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_rows(self, *args):
        path = os.path.join(self.tmp, f"out{len(os.listdir(self.tmp))}.csv")
        r = subprocess.run([LAYER_RUN, *args, "--csv", path], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(path, newline="") as f:
            return {row["config"]: row for row in csv.DictReader(f)}

    def test_peaks_of_a_configuration_do_not_depend_on_what_ran_before(self):
        meta = ["--backend", "meta", "--model", "22b", "--tp", "8", "--emulate-tp"]
        alone = self.run_rows(*meta, "--config", "selective+sp")["selective+sp"]
        after = self.run_rows(*meta, "--config", "baseline,full,selective+sp")["selective+sp"]
        for col in ("peak_reserved_bytes", "peak_allocated_bytes", "act_bytes"):
            self.assertEqual(alone[col], after[col], col)
        # and the configurations differ, so the equality above is not a constant
        rows = self.run_rows(*meta, "--config", "baseline,selective+sp")
        self.assertGreater(int(rows["baseline"]["peak_reserved_bytes"]), int(rows["selective+sp"]["peak_reserved_bytes"]))

    def test_peaks_on_cpu_alone_and_after_others(self):
        alone = self.run_rows(*TINY, "--config", "sp", "--tp", "2", "--emulate-tp", "--iters", "1", "--warmup", "0")
        after = self.run_rows(*TINY, "--config", "baseline,sp", "--tp", "2", "--emulate-tp", "--iters", "1",
                              "--warmup", "0")
        self.assertEqual(alone["sp"]["peak_reserved_bytes"], after["sp"]["peak_reserved_bytes"])

    def test_emulated_collectives_are_timed_in_their_own_column(self):
        shape = ["--hidden", "256", "--heads", "4", "--seq", "128", "--batch", "2"]
        rows = self.run_rows(*TINY, *shape, "--config", "baseline,sp", "--tp", "2", "--emulate-tp",
                             "--warmup", "1", "--iters", "3")
        # sp's all-gathers and reduce-scatters are local copies here: measured, and apart.
        self.assertGreater(float(rows["sp"]["comm_ms_emulated"]), 0.0)
        # baseline's all-reduce is a no-op when emulated: nothing to take out.
        self.assertEqual(float(rows["baseline"]["comm_ms_emulated"]), 0.0)
        for row in rows.values():
            self.assertGreater(float(row["fwd_ms"]), 0.0)
            self.assertGreater(float(row["bwd_ms"]), 0.0)
        # real groups have nothing emulated: the column is empty
        local = self.run_rows(*TINY, "--config", "sp", "--iters", "1", "--warmup", "0")
        self.assertEqual(local["sp"]["comm_ms_emulated"], "")

    def test_gpu_state_columns_are_empty_off_a_gpu(self):
        row = self.run_rows(*TINY, "--config", "baseline", "--iters", "1", "--warmup", "0")["baseline"]
        for col in ("sm_clock_mhz_start", "sm_clock_mhz_end", "mem_clock_mhz_start", "mem_clock_mhz_end",
                    "power_limit_w", "throttle_reasons_start", "throttle_reasons_end"):
            self.assertIn(col, row)
            self.assertEqual(row[col], "", col)


if __name__ == "__main__":
    unittest.main()
