"""What the layer_run --dump tests share (test_composed_dumps, test_moe_dumps, test_mla_dumps):
where layer_run and mpirun are, NumPy and tools/numpy_layer.py when Debian's python3 has them,
and a TestCase that runs layer_run with --dump into a folder of its own."""
import csv
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from process_group import run_in_group  # noqa: E402

LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN", os.path.join(HERE, "..", "build", "runners", "layer_run"))
MPIEXEC = os.environ.get("ACTBENCH_MPIEXEC") or shutil.which("mpirun")

try:
    import numpy as np
    import numpy_layer
except ImportError:  # the first python3 on PATH may lack numpy: the tests skip
    np = numpy_layer = None


def tensors(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".npy"))


class DumpTestCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_%s_" % type(self).__name__)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def layer_run(self, name, args, np_ranks=None, dump=True, backend="cpu", timeout=300):
        """Runs layer_run with --csv NAME.csv (and --dump NAME/); returns (dump folder, rows). A hang
        past `timeout` kills the whole process group and fails the test instead of hanging CI."""
        folder, out = os.path.join(self.tmp, name), os.path.join(self.tmp, name + ".csv")
        cmd = [LAYER_RUN, "--backend", backend, *args, "--csv", out] + (["--dump", folder] if dump else [])
        if np_ranks:
            cmd = [MPIEXEC, "-np", str(np_ranks), *cmd]
        p = run_in_group(self, cmd, timeout, "layer_run")
        self.assertEqual(p.returncode, 0, "%s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
        with open(out, newline="") as f:
            return folder, list(csv.DictReader(f))

    def assert_same_tensors(self, folder, reference, skip=()):
        """The tensors both dumps hold (dx among them), bit for bit; names starting with one of
        `skip` are left out."""
        common = sorted(set(tensors(folder)) & set(tensors(reference)))
        self.assertIn("dx.npy", common)
        for name in common:
            if name.startswith(tuple(skip)):
                continue
            a, b = np.load(os.path.join(folder, name)), np.load(os.path.join(reference, name))
            self.assertTrue(np.array_equal(a, b), "%s differs from %s" % (name, reference))
