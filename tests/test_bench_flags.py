"""Google Benchmark's standard output flags on our binaries (issue: the custom reporter used
to print the console table whatever --benchmark_format said). ctest sets ACTBENCH_BENCH_KERNELS."""
import csv
import io
import json
import os
import shutil
import subprocess
import tempfile
import unittest

BENCH = os.environ.get("ACTBENCH_BENCH_KERNELS", "")
ARGS = ["--backend=cpu", "--benchmark_filter=^cpu/(copy|gemm_square)/", "--benchmark_min_time=0.01"]


@unittest.skipUnless(BENCH and os.path.exists(BENCH), "bench_kernels not built")
class BenchFlagsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_bench_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def bench(self, *extra):
        r = subprocess.run([BENCH, *ARGS, *extra], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_benchmark_out_that_is_not_a_file_is_refused_at_once(self):
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        for what, path in [("a FIFO", fifo), ("a folder", self.tmp)]:
            with self.subTest(what):
                try:
                    r = subprocess.run([BENCH, *ARGS, "--benchmark_out=" + path], capture_output=True, text=True,
                                       timeout=60)
                except subprocess.TimeoutExpired:
                    self.fail("bench_kernels blocked on --benchmark_out " + what)
                self.assertEqual(r.returncode, 2, r.stderr)
                lines = [l for l in r.stderr.splitlines() if l.strip()]
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn("error: --benchmark_out " + path, lines[0])

    def test_json_on_stdout(self):
        doc = json.loads(self.bench("--benchmark_format=json"))
        self.assertEqual(doc["context"]["actbench_backend"], "cpu")
        names = [b["name"] for b in doc["benchmarks"]]
        self.assertIn("cpu/copy/manual_time", names)
        gemm = next(b for b in doc["benchmarks"] if b["name"].startswith("cpu/gemm_square"))
        self.assertGreater(gemm["TFLOP/s"], 0)

    def test_csv_on_stdout(self):
        out = self.bench("--benchmark_format=csv")
        rows = {r["name"]: r for r in csv.DictReader(io.StringIO(out[out.index("name,"):]))}
        # benchmarks with different counters in one CSV (the library alone aborts on that):
        # each row has every column, empty of meaning (nan) where it has no such counter
        copy, gemm = rows["cpu/copy/manual_time"], rows["cpu/gemm_square/manual_time"]
        self.assertGreater(float(copy["GB/s"]), 0)
        self.assertGreater(float(gemm["TFLOP/s"]), 0)
        self.assertEqual(copy["TFLOP/s"].lower(), "nan")

    def test_benchmark_out_writes_json_file_and_console_stays(self):
        path = os.path.join(self.tmp, "b.json")
        out = self.bench(f"--benchmark_out={path}", "--benchmark_out_format=json")
        self.assertIn("cpu/copy/manual_time", out)
        self.assertFalse(out.lstrip().startswith("{"), "the display stays the console table")
        with open(path) as f:
            doc = json.load(f)
        self.assertTrue(any(b["name"] == "cpu/copy/manual_time" for b in doc["benchmarks"]))

    def test_benchmark_out_csv(self):
        path = os.path.join(self.tmp, "b.csv")
        self.bench(f"--benchmark_out={path}", "--benchmark_out_format=csv", "--benchmark_format=json")
        with open(path) as f:
            text = f.read()
        self.assertIn("name,iterations", text)


if __name__ == "__main__":
    unittest.main()
