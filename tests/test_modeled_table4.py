"""runners/modeled_table4.py: the modeled Table 4 from the kernel report (docs/kernel_efficiency.md).

ACTBENCH_SIM_COUNTERS_BUILD names the counting simulator build (ACTBENCH_CUDA_SIM=ON,
ACTBENCH_CUDA_SIM_COUNTERS=ON) whose layer_run the tool runs; without it only the refusals are
tested. The whole 22B layer takes minutes; here the tiny layer, every block run.
"""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOL = os.path.join(ROOT, "runners", "modeled_table4.py")
BUILD = os.environ.get("ACTBENCH_SIM_COUNTERS_BUILD", "")
CONFIGS = ["baseline", "sp", "full", "selective", "selective+sp"]
sys.path.insert(0, os.path.join(ROOT, "runners"))
import modeled_table4  # noqa: E402


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


class ModeledTable4Test(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_test_modeled_table4_")

    def assert_refused(self, r, words):
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(words, lines[0])
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "modeled_table4.csv")))

    def test_refusals_are_one_line_and_write_nothing(self):
        self.assert_refused(run_tool("--build", os.path.join(self.tmp, "none"), "--out", self.tmp),
                            "no runners/layer_run there")
        self.assert_refused(run_tool("--block-sample", "0", "--out", self.tmp), "--block-sample must be >= 1")
        self.assert_refused(run_tool("--block-sample", "x", "--out", self.tmp), "invalid int value")
        self.assert_refused(run_tool("--device", "v100", "--out", self.tmp), "invalid choice")
        self.assert_refused(run_tool("--out", os.path.join(self.tmp, "missing")), "not a folder")

    @unittest.skipUnless(BUILD, "needs the counting simulator build (ACTBENCH_SIM_COUNTERS_BUILD)")
    def test_tiny_layer_on_both_devices(self):
        r = run_tool("--build", BUILD, "--model", "tiny", "--block-sample", "1", "--out", self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.tmp, "modeled_table4.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(list(rows[0]), modeled_table4.HEADER)
        self.assertEqual([(r["device"], r["config"]) for r in rows],
                         [(d, c) for d in ["a100", "h100"] for c in CONFIGS])
        for device in ["a100", "h100"]:
            mine = {r["config"]: r for r in rows if r["device"] == device}
            t = {c: float(mine[c]["total_ms_modeled"]) for c in CONFIGS}
            for c, r in mine.items():
                f = lambda name: float(r[name])  # noqa: E731
                self.assertAlmostEqual(t[c], f("fwd_ms_modeled") + f("bwd_ms_modeled") + f("comm_ms_modeled"), delta=2e-3)
                self.assertAlmostEqual(f("fwd_ms_modeled") + f("bwd_ms_modeled"),
                                       f("gemm_ms_modeled") + f("kernels_ms_modeled"), delta=2e-3)
                self.assertGreater(f("gemm_ms_modeled"), 0)
                self.assertGreater(f("kernels_ms_modeled"), 0)
                self.assertEqual(r["paper_total_ms"], "")  # the paper's layer is the 22b one
                self.assertIn("ACTBENCH_STANDIN_GEMM=skip", r["command"])
            # Recompute costs: none for the baseline, the attention core for selective, the
            # whole forward for full.
            self.assertEqual(float(mine["baseline"]["recompute_ms_modeled"]), 0.0)
            self.assertGreater(float(mine["selective"]["recompute_ms_modeled"]), 0.0)
            self.assertAlmostEqual(float(mine["full"]["recompute_ms_modeled"]),
                                   float(mine["full"]["fwd_ms_modeled"]), delta=2e-3)
            self.assertLess(t["baseline"], t["selective"])
            self.assertLess(t["selective"], t["full"])
            self.assertEqual(mine["baseline"]["overhead_percent_modeled"], "")
            # The CSV's times carry 3 decimals and the overhead 1: allow for their rounding.
            rounding = 100 * 0.0005 * (1 / t["baseline"] + t["full"] / t["baseline"] ** 2) + 0.05
            self.assertAlmostEqual(float(mine["full"]["overhead_percent_modeled"]),
                                   100 * (t["full"] / t["baseline"] - 1), delta=rounding)
        # The faster device is modeled faster.
        a100 = sum(float(r["total_ms_modeled"]) for r in rows if r["device"] == "a100")
        h100 = sum(float(r["total_ms_modeled"]) for r in rows if r["device"] == "h100")
        self.assertLess(h100, a100)
        with open(os.path.join(self.tmp, "modeled_table4.md")) as f:
            md = f.read()
        self.assertIn("a model, not a measurement", md)
        for name, _, _ in modeled_table4.COLUMNS:
            self.assertIn(f"| `{name}` |", md)


if __name__ == "__main__":
    unittest.main()
