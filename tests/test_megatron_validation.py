"""runners/megatron_validation.py against the peaks Megatron-LM measured in its functional
tests (tests/fixtures/megatron_functional): every case gets a row, the columns are the ones
the script declares, the cases theory models stay within the documented agreement, and bad
input is one line and exit 2.

Run by ctest with ACTBENCH_THEORY pointing at the binary. Standard library only.
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
ROOT = os.path.dirname(HERE)
THEORY = os.environ.get("ACTBENCH_THEORY", os.path.join(ROOT, "build", "runners", "theory"))
SCRIPT = os.path.join(ROOT, "runners", "megatron_validation.py")
CASES = os.path.join(HERE, "fixtures", "megatron_functional")
# docs/step_memory.md, "Against Megatron-LM's measurements": the modelled cases' peaks agree
# within this fraction.
AGREEMENT = 0.08

sys.path.insert(0, os.path.join(ROOT, "runners"))
import megatron_validation  # noqa: E402  (its COLUMNS)


def validate(*args, timeout=900):
    return subprocess.run([sys.executable, SCRIPT, "--theory", THEORY, *args], capture_output=True, text=True,
                          timeout=timeout)


class MegatronValidation(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.csv = os.path.join(cls.tmp, "validation.csv")
        cls.result = validate("--csv", cls.csv, "--check", str(AGREEMENT))
        with open(cls.csv, newline="") as f:
            reader = csv.DictReader(f)
            cls.header, cls.rows = reader.fieldnames, list(reader)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_the_modelled_cases_agree_with_what_megatron_measured(self):
        self.assertEqual(self.result.returncode, 0, self.result.stdout + self.result.stderr)
        modelled = [r for r in self.rows if r["status"] == "modelled"]
        # a change that turns cases into refusals or warnings must not pass unnoticed
        self.assertGreaterEqual(len(modelled), 148)
        for r in modelled:
            with self.subTest(r["case"]):
                self.assertLessEqual(abs(float(r["peak_ratio"]) - 1), AGREEMENT)
                measured = json.load(open(os.path.join(CASES, r["suite"], r["case"], "measured.json")))
                self.assertEqual(int(r["measured_peak_bytes"]), measured["mem-max-allocated-bytes"])

    def test_every_case_has_a_row_with_the_declared_columns(self):
        self.assertEqual(self.header, [name for name, _, _ in megatron_validation.COLUMNS])
        folders = sorted(f"{s}/{c}" for s in os.listdir(CASES) for c in os.listdir(os.path.join(CASES, s)))
        self.assertEqual(sorted(f"{r['suite']}/{r['case']}" for r in self.rows), folders)
        for r in self.rows:
            with self.subTest(r["case"]):
                self.assertIn(r["status"], ("modelled", "unmodelled", "refused"))
                self.assertEqual(r["status"] == "refused", r["modelled_peak_bytes"] == "")
                self.assertEqual(r["status"] == "modelled", r["note"] == "")

    def test_bad_input_is_one_line(self):
        missing = validate("--cases", os.path.join(self.tmp, "nowhere"), "--csv", os.path.join(self.tmp, "x.csv"))
        self.assertEqual(missing.returncode, 2)
        self.assertEqual(len(missing.stderr.strip().splitlines()), 1, missing.stderr)
        broken = os.path.join(self.tmp, "broken", "gpt", "case")
        os.makedirs(broken)
        shutil.copy(os.path.join(CASES, "gpt", "gpt3_mcore_tp1_pp2", "model_config.yaml"), broken)
        with open(os.path.join(broken, "measured.json"), "w") as f:
            f.write('{"gpus": 8}')
        out = os.path.join(self.tmp, "broken.csv")
        r = validate("--cases", os.path.join(self.tmp, "broken"), "--csv", out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("mem-max-allocated-bytes", r.stderr)
        self.assertFalse(os.path.exists(out))  # nothing half-written


if __name__ == "__main__":
    unittest.main()
