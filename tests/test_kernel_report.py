"""`layer_run --kernel-report FILE` (docs/layer_run.md): the simulator's memory-access counts of
every kernel per configuration and phase, with a modeled time.

ACTBENCH_KERNEL_REPORT_BUILD says what the layer_run under test (ACTBENCH_LAYER_RUN) is:
  counting  the simulator build with counters (ACTBENCH_CUDA_SIM=ON, ACTBENCH_CUDA_SIM_COUNTERS=ON):
            the report of a tiny layer names every kernel file the layer launches from, selective
            recompute's recompute.core_attn phase re-runs the softmax and the attention dropout,
            and every row is whole;
  sim       the simulator build without counters;  none: any other build.
In every build the option's refusals are one line, exit 2, and no row is written.
"""
import csv
import os
import re
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN", os.path.join(HERE, "..", "build-sim", "runners", "layer_run"))
BUILD = os.environ.get("ACTBENCH_KERNEL_REPORT_BUILD", "counting")
COUNTING = BUILD == "counting"
# The kernel files the gpt layer with unfused attention launches from, and those of the fused
# attention and the llama family's layer.
GPT_FILES = {"layernorm.cu", "softmax.cu", "dropout.cu", "activation.cu", "residual.cu", "layout.cu"}
FUSED_LLAMA_FILES = {"attention_tc.cu", "llama.cu"}  # bf16: forward and backward on tensor cores
LEAD = ["config", "phase"]
GEMM = "cublasLtMatmul"  # the rows of the cuBLASLt stand-in's calls
COUNTS = ["launches", "global_ld_requests", "global_ld_sectors", "global_ld_ideal_sectors", "global_st_requests",
          "global_st_sectors", "global_st_ideal_sectors", "excess_sectors", "shared_wavefronts",
          "shared_bank_conflicts", "unique_bytes_read", "unique_bytes_written", "bytes_moved"]


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class KernelReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_kernel_report_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_layer(self, *args):
        return subprocess.run([LAYER_RUN, *args], capture_output=True, text=True, timeout=600)

    def report(self, name, *args, device=None):
        """Runs the cuda backend with --kernel-report; returns the report's rows."""
        out = os.path.join(self.tmp, name + ".csv")
        extra = ["--kernel-report-device", device] if device else []
        r = self.run_layer("--backend", "cuda", *args, "--csv", os.path.join(self.tmp, name + "_rows.csv"),
                           "--kernel-report", out, *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        return read_rows(out)

    def assert_well_formed(self, rows, device):
        self.assertTrue(rows)
        for row in [r for r in rows if r["kernel"] == GEMM]:
            self.assert_gemm_row(row, device)
        for row in [r for r in rows if r["kernel"] != GEMM]:
            self.assertNotIn(None, row.values(), row)  # as many fields as the header
            self.assertRegex(row["phase"], r"^(fwd|bwd|recompute)\.\w+$")
            for name in COUNTS:
                self.assertRegex(row[name], r"^\d+$", (name, row))
            self.assertGreater(int(row["launches"]), 0)
            self.assertEqual(int(row["bytes_moved"]),
                             32 * (int(row["global_ld_sectors"]) + int(row["global_st_sectors"])))
            excess = int(row["global_ld_sectors"]) - int(row["global_ld_ideal_sectors"]) + \
                int(row["global_st_sectors"]) - int(row["global_st_ideal_sectors"])
            self.assertEqual(int(row["excess_sectors"]), excess, row)
            self.assertEqual(row["excess_lines"] == "", excess == 0, row)
            # Every launch of the small layer fits the device: the modeled time is at least
            # the launch overhead plus one wave.
            # blocks_per_sm is empty where the summed launches differ in geometry.
            if row["grid"]:
                self.assertGreater(int(row["blocks_per_sm_" + device]), 0, row)
            else:
                self.assertEqual(row["blocks_per_sm_" + device], "", row)
            self.assertGreaterEqual(float(row["modeled_us_" + device]), 3.0, row)
            self.assertTrue(row["launched_at"].startswith("kernels/cuda/"), row)

    def assert_gemm_row(self, row, device):
        """A cuBLASLt call: its FLOPs (2 m n k per batch), bytes and modeled time; no counts."""
        self.assertRegex(row["phase"], r"^(fwd|bwd|recompute)\.\w+$")
        m, n, k, batch = (int(x) for x in re.match(r"^m (\d+) n (\d+) k (\d+) batch (\d+), ", row["function"]).groups())
        calls = int(row["launches"])
        self.assertAlmostEqual(float(row["flops"]), 2 * m * n * k * batch * calls, delta=1e-5 * float(row["flops"]))
        self.assertGreater(int(row["min_bytes"]), 0)
        for name in COUNTS[1:] + ["grid", "block", "launched_at", "waves_" + device]:
            self.assertEqual(row[name], "", (name, row))
        self.assertGreaterEqual(float(row["modeled_us_" + device]), 2.0 * calls, row)

    def files(self, rows):
        """The .cu files the rows' kernels are launched from (column_reduce.cuh's launches are
        its includers')."""
        names = {at.split(":")[0].split("/")[-1] for r in rows if r["kernel"] != GEMM
                 for at in r["launched_at"].split("; ")}
        return {n for n in names if n.endswith(".cu")}

    @unittest.skipUnless(COUNTING, "needs the simulator build with counters")
    def test_baseline_and_selective_report_every_kernel_file_per_phase(self):
        rows = self.report("gpt", "--model", "tiny", "--config", "baseline,selective")
        self.assertEqual(list(rows[0])[:2], LEAD)
        self.assert_well_formed(rows, "h100")
        self.assertEqual({r["config"] for r in rows}, {"baseline", "selective"})
        for config in ["baseline", "selective"]:
            mine = [r for r in rows if r["config"] == config]
            self.assertEqual(self.files(mine), GPT_FILES, config)
            phases = {r["phase"] for r in mine}
            for block in ["ln1", "qkv", "core_attn", "attn_residual", "ln2", "fc1", "gelu", "mlp_residual"]:
                self.assertIn("fwd." + block, phases)
        self.assertFalse([r for r in rows if r["config"] == "baseline" and r["phase"].startswith("recompute.")])
        # Selective recompute re-runs the softmax and the attention dropout, nothing else.
        recompute = [r for r in rows if r["config"] == "selective" and r["phase"].startswith("recompute.")]
        self.assertEqual({r["phase"] for r in recompute}, {"recompute.core_attn"})
        self.assertEqual({r["kernel"].split("<")[0] for r in recompute if r["kernel"] != GEMM},
                         {"softmax_fwd_cached", "dropout_fwd_kernel"})
        # and the two batched GEMMs around them (QKᵀ, and ·V which backward needs again)
        self.assertTrue([r for r in recompute if r["kernel"] == GEMM])
        # Each re-runs with the forward's counts.
        for r in recompute:
            fwd = [f for f in rows if f["config"] == "selective" and f["phase"] == "fwd.core_attn" and
                   f["function"] == r["function"]]
            self.assertEqual(len(fwd), 1, r["function"])
            self.assertEqual([fwd[0][c] for c in COUNTS], [r[c] for c in COUNTS], r["function"])

    @unittest.skipUnless(COUNTING, "needs the simulator build with counters")
    def test_fused_llama_layer_on_the_a100(self):
        rows = self.report("llama", "--arch", "llama", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                           "--ffn-hidden", "96", "--seq", "24", "--batch", "1", "--attention", "fused", "--config",
                           "full", "--dtype", "bf16", device="a100")
        self.assert_well_formed(rows, "a100")
        self.assertTrue(FUSED_LLAMA_FILES <= self.files(rows), self.files(rows))
        self.assertNotIn("modeled_us_h100", rows[0])
        # Full recompute re-runs every forward phase.
        fwd = {r["phase"][4:] for r in rows if r["phase"].startswith("fwd.")}
        self.assertEqual({r["phase"][10:] for r in rows if r["phase"].startswith("recompute.")}, fwd)

    def assert_refused(self, args, needle):
        report = os.path.join(self.tmp, "refused_report.csv")
        out = os.path.join(self.tmp, "refused.csv")
        r = self.run_layer(*args, "--csv", out, *(["--kernel-report", report] if "--kernel-report" not in args else []))
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(needle, lines[0])
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(report))

    def test_refusals_are_one_line(self):
        tiny = ["--model", "tiny", "--config", "baseline"]
        if not COUNTING:
            needle = "-DACTBENCH_CUDA_SIM_COUNTERS=OFF" if BUILD == "sim" else "it needs the simulator build"
            for backend in ["cpu", "meta", "cuda"]:
                self.assert_refused(["--backend", backend, *tiny], needle)
            return
        self.assert_refused(["--backend", "cpu", *tiny], "needs --backend cuda")
        self.assert_refused(["--backend", "cuda", *tiny, "--kernel-report-device", "v100"],
                            "--kernel-report-device must be h100 | a100, got 'v100'")
        same = os.path.join(self.tmp, "refused.csv")
        self.assert_refused(["--backend", "cuda", *tiny, "--kernel-report", same], "is the --csv file")

    def test_device_without_report_is_refused(self):
        out = os.path.join(self.tmp, "alone.csv")
        r = self.run_layer("--model", "tiny", "--kernel-report-device", "a100", "--csv", out)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.strip().splitlines(), ["layer_run: error: --kernel-report-device needs --kernel-report"])


if __name__ == "__main__":
    unittest.main()
