"""actbench_facts as a developer runs it (--out FILE, --check FILE): a path that is not a regular
file is refused at once with one line and exit 2, never opened (a FIFO would block).
ctest sets ACTBENCH_FACTS to the binary."""
import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FACTS = os.environ.get("ACTBENCH_FACTS", os.path.join(HERE, "..", "build", "runners", "actbench_facts"))
COMMITTED = os.path.join(HERE, "..", "runners", "facts.json")


@unittest.skipUnless(os.path.exists(FACTS), "actbench_facts not built")
class FactsCliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_facts_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def facts(self, *args):
        try:
            return subprocess.run([FACTS, *args], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            self.fail("actbench_facts blocked: " + " ".join(args))

    def test_paths_that_are_not_files_are_refused_at_once(self):
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        for option in ["--check", "--out"]:
            for what, path in [("a FIFO", fifo), ("a folder", self.tmp)]:
                with self.subTest(option=option, what=what):
                    r = self.facts(option, path)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    lines = [l for l in r.stderr.splitlines() if l.strip()]
                    self.assertEqual(len(lines), 1, r.stderr)
                    self.assertTrue(lines[0].startswith("actbench_facts: error: " + option + " " + path), lines[0])
        self.assertTrue(os.path.exists(fifo) and not os.path.isfile(fifo), "--out replaced the FIFO")

    def test_out_then_check(self):
        path = os.path.join(self.tmp, "facts.json")
        self.assertEqual(self.facts("--out", path).returncode, 0)
        with open(path) as f, open(COMMITTED) as g:
            self.assertEqual(f.read(), g.read())
        self.assertEqual(self.facts("--check", path).returncode, 0)
        with open(path, "a") as f:
            f.write("\n")
        r = self.facts("--check", path)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is stale", r.stderr)
        r = self.facts("--check", os.path.join(self.tmp, "missing.json"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot be read; generate it", r.stderr)


if __name__ == "__main__":
    unittest.main()
