"""A backend's MoE ops against the float64 NumPy reference (tools/numpy_moe.py): a
block of router GEMM, routing, dispatch, permute, SwiGLU experts as grouped GEMMs and the
weighted combine, forward and backward, run by tests/moe_ops_dump over softmax and sigmoid
routers, score bias, groups, normalisation, scaling, dropless and capacity dropping. The
reference's own backward is checked against finite differences first, and the comparison is
shown not to be blind.

Run by ctest with ACTBENCH_MOE_OPS_DUMP pointing at the driver, with Debian's python3 (numpy);
ACTBENCH_MOE_OPS_BACKEND=cuda runs the driver's block on the cuda backend (the simulator build's
ctest cuda_sim_moe_reference), cpu otherwise.
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import numpy_moe as ref  # noqa: E402

DRIVER = os.environ.get("ACTBENCH_MOE_OPS_DUMP", os.path.join(HERE, "..", "build", "tests", "moe_ops_dump"))
BACKEND = os.environ.get("ACTBENCH_MOE_OPS_BACKEND", "cpu")
RTOL = 1e-4
INPUTS = ["x", "w_router", "bias", "w1", "w2", "d_out"]
EXACT = ["topk_index", "tokens_per_expert", "row_slot", "slot_row"]  # integers: equal or wrong


def spec_of(experts=4, top_k=2, score="softmax", normalize=False, scaling=1.0, num_groups=1, group_top_k=1,
            capacity_factor=None):
    return dict(experts=experts, top_k=top_k, score=score, normalize=normalize, scaling=scaling,
                num_groups=num_groups, group_top_k=group_top_k, capacity_factor=capacity_factor)


# (name, spec, tokens, bias): each routing option on and off, dropless and dropping.
CASES = [
    ("softmax_top1", spec_of(top_k=1), 12, False),
    ("softmax_top2_normalised", spec_of(normalize=True), 12, False),
    ("softmax_top2_unnormalised_dropping", spec_of(capacity_factor=0.5), 16, False),
    ("sigmoid_bias_normalised_scaled", spec_of(experts=8, top_k=3, score="sigmoid", normalize=True, scaling=2.5), 12,
     True),
    ("sigmoid_groups_dropping", spec_of(experts=8, top_k=2, score="sigmoid", normalize=True, num_groups=4,
                                        group_top_k=2, capacity_factor=1.0), 16, True),
    ("softmax_bias_capacity_1_25", spec_of(experts=4, top_k=2, capacity_factor=1.25), 13, True),
]


def driver_args(spec, tokens, bias, out):
    args = [DRIVER, "--out", out, "--backend", BACKEND, "--tokens", str(tokens), "--hidden", "16", "--experts", str(spec["experts"]),
            "--top-k", str(spec["top_k"]), "--ffn", "8", "--score", spec["score"], "--scaling", repr(spec["scaling"]),
            "--groups", str(spec["num_groups"]), "--group-top-k", str(spec["group_top_k"])]
    if spec["normalize"]:
        args.append("--normalize")
    if bias:
        args.append("--bias")
    if spec["capacity_factor"] is not None:
        args += ["--capacity-factor", repr(spec["capacity_factor"])]
    return args


def compare(spec, dump):
    """[(name, error, scale, ok)] of every result of the block against the reference, which
    runs on the float32 inputs the driver wrote."""
    P = {n: np.load(os.path.join(dump, n + ".npy")).astype(np.float64)
         for n in INPUTS if os.path.exists(os.path.join(dump, n + ".npy"))}
    want = ref.block(spec, P, P.pop("d_out"))
    results = []
    for name, r in want.items():
        got = np.load(os.path.join(dump, name + ".npy")).astype(np.float64)
        if got.shape != r.shape:
            results.append((name, float("inf"), 0.0, False))
            continue
        err = float(np.max(np.abs(got - r), initial=0.0))
        scale = float(np.max(np.abs(r), initial=0.0)) or 1.0
        results.append((name, err, scale, err == 0 if name in EXACT else err <= RTOL * scale + 1e-6))
    return results


class ReferenceBackward(unittest.TestCase):
    """The reference's hand-written backward against central differences of its forward."""

    def check(self, spec, bias):
        rng = np.random.default_rng(3)
        T, h, E, F = 6, 5, spec["experts"], 3
        P = {"x": rng.uniform(-1, 1, (T, h)), "w_router": rng.uniform(-1, 1, (h, E)),
             "w1": rng.uniform(-0.5, 0.5, (E, h, 2 * F)), "w2": rng.uniform(-0.5, 0.5, (E, F, h))}
        if bias:
            P["bias"] = rng.uniform(-0.1, 0.1, E)
        d_out = rng.uniform(-1, 1, (T, h))
        got = ref.block(spec, P, d_out)
        for name, grad in [("x", "dx"), ("w_router", "dw_router"), ("w1", "dw1"), ("w2", "dw2")]:
            fd = np.zeros_like(P[name])
            for i in np.ndindex(P[name].shape):
                saved = P[name][i]
                P[name][i] = saved + 1e-6
                plus = np.sum(ref.block(spec, P, d_out)["out"] * d_out)
                P[name][i] = saved - 1e-6
                minus = np.sum(ref.block(spec, P, d_out)["out"] * d_out)
                P[name][i] = saved
                fd[i] = (plus - minus) / 2e-6
            np.testing.assert_allclose(got[grad], fd, rtol=1e-5, atol=1e-7, err_msg=name)

    def test_softmax_dropping(self):
        self.check(spec_of(capacity_factor=0.5), bias=False)

    def test_sigmoid_normalised_scaled_groups(self):
        self.check(spec_of(experts=8, top_k=3, score="sigmoid", normalize=True, scaling=2.5, num_groups=4,
                           group_top_k=2), bias=True)

    def test_plan_drops_the_later_tokens(self):
        index = np.array([[0, 1], [0, 2], [0, 1], [3, 0], [1, 0]])
        counts, row_slot, slot_row = ref.dispatch(index, 4, 0.5)  # capacity ceil(10 / 4 * 0.5) = 2
        self.assertEqual(counts.tolist(), [2, 2, 1, 1])
        self.assertEqual(slot_row.ravel().tolist(), [0, 2, 1, 4, -1, 3, 5, -1, -1, -1])
        self.assertEqual(row_slot.tolist(), [0, 2, 1, 5, 3, 6, -1, -1, -1, -1])


@unittest.skipUnless(os.path.exists(DRIVER), "no moe_ops_dump at " + DRIVER)
class CpuOpsAgainstReference(unittest.TestCase):
    def dump(self, spec, tokens, bias, where):
        run = subprocess.run(driver_args(spec, tokens, bias, where), capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)

    def test_every_case(self):
        for name, spec, tokens, bias in CASES:
            with self.subTest(name), tempfile.TemporaryDirectory() as tmp:
                self.dump(spec, tokens, bias, tmp)
                bad = [r for r in compare(spec, tmp) if not r[3]]
                self.assertEqual(bad, [], "results off the float64 reference (name, error, scale, ok)")
                kept = np.load(os.path.join(tmp, "tokens_per_expert.npy")).sum()
                if spec["capacity_factor"] is not None and spec["capacity_factor"] < 1:
                    self.assertLess(kept, tokens * spec["top_k"], "a dropping case that drops nothing")

    def test_the_comparison_is_not_blind(self):
        spec = CASES[2][1]
        with tempfile.TemporaryDirectory() as tmp:
            self.dump(spec, 16, False, tmp)
            for name, delta in [("dw1", 1e-2), ("topk_index", 0)]:
                path = os.path.join(tmp, name + ".npy")
                saved = np.load(path)
                bent = saved.copy()
                if name == "topk_index":
                    bent[0] = bent[0][::-1]  # the same experts in the other order
                else:
                    bent.flat[0] += delta
                np.save(path, bent)
                failed = {r[0] for r in compare(spec, tmp) if not r[3]}
                self.assertIn(name, failed)
                np.save(path, saved)
            self.assertEqual([r for r in compare(spec, tmp) if not r[3]], [])

    def test_driver_refuses_bad_routing_in_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = subprocess.run(driver_args(spec_of(top_k=5), 4, False, tmp), capture_output=True, text=True,
                                 timeout=60)
        self.assertEqual(run.returncode, 2)
        self.assertEqual(run.stderr.strip().count("\n"), 0, run.stderr)
        self.assertIn("moe_route: top_k must be in [1, E = 4], got 5", run.stderr)


if __name__ == "__main__":
    unittest.main()
