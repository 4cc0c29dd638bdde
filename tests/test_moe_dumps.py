"""The MoE layer's `layer_run --dump` against the float64 NumPy layer (tools/numpy_layer.py with
tools/numpy_moe.py), routing decision included: softmax and sigmoid routers, shared experts,
dropless and capacity dropping, every recompute module an MoE layer reads; one rank, under
`mpirun -np 2 --tp 2` with sequence parallelism, with expert parallelism 2, with the experts
over the tensor-parallel group (--tp 2 --expert-model-parallel-size 2), with expert
parallelism over two replicas of it (mpirun -np 4 --tp 2 --expert-model-parallel-size 4, and
--expert-model-parallel-size 2 with each expert split over TP), with
each expert split over it (--expert-tensor-parallel-size 2), and with context
parallelism 2 (alone, with the experts over TP 2, and with the experts over two replicas of it:
mpirun -np 4). Recompute must
change no value, and meta given the cpu's histogram keeps the cpu's bytes.

Run by ctest with ACTBENCH_LAYER_RUN pointing at the binary (and ACTBENCH_MPIEXEC at mpirun),
with Debian's python3 (numpy).
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_harness import MPIEXEC, DumpTestCase, np, numpy_layer  # noqa: E402

# A small llama-family layer (h 32, a 4, g 2) with 8 experts of width 12: a fraction of a second.
SHAPE = ["--dtype", "fp32", "--seq", "8", "--hidden", "32", "--heads", "4", "--batch", "2", "--warmup", "0",
         "--iters", "1", "--arch", "llama", "--kv-heads", "2", "--ffn-hidden-size", "24"]
MOE = ["--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "12"]
RTOL = 1e-4
# name: (flags, what the combination turns on)
COMBOS = {
    "softmax": MOE,
    "pre_softmax_shared_dropout": MOE + ["--moe-router-pre-softmax", "--moe-shared-expert-intermediate-size", "16",
                                         "--hidden-dropout", "0.1"],
    "sigmoid_groups_bias": MOE + ["--moe-router-score-function", "sigmoid", "--moe-router-num-groups", "4",
                                  "--moe-router-group-topk", "2", "--moe-router-enable-expert-bias",
                                  "--moe-router-topk-scaling-factor", "2.5", "--moe-shared-expert-intermediate-size",
                                  "8"],
    "capacity": MOE + ["--moe-expert-capacity-factor", "0.5"],
}
CONFIGS = ["baseline", "selective", "full"]
MODULES = ["core_attn", "core_attn,moe_act", "moe", "layernorm,shared_experts", "moe_act,moe,shared_experts"]


@unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
class MoeDumpTest(DumpTestCase):
    def assert_matches_numpy(self, folder, routing=True):
        results = numpy_layer.check(folder, rtol=RTOL)
        names = [r[0] for r in results]
        for name in ["y", "dx", "grad.router.weight", "grad.experts.fc1.weight", "moe.tokens_per_expert"]:
            self.assertIn(name, names)
        if routing:
            self.assertIn("moe.topk_index", names)
        for name, err, scale, ok in results:
            self.assertTrue(ok, "%s: %s max|err| %.3e vs max|ref| %.3e" % (folder, name, err, scale))

    def assert_rows_ran(self, rows, **columns):
        """Every row ok with these column values (text, as the CSV holds them), its bytes its formula's."""
        for r in rows:
            self.assertEqual({k: r[k] for k in ("status", *columns)}, dict(status="ok", **columns), r["message"])
            self.assertEqual(r["act_bytes"], r["act_bytes_formula"], r["config"])

    def run_layout_with_dropout(self, name, layout, np_ranks, **columns):
        """A parallel layout of the layer with hidden and attention dropout, sp and selective+sp
        (moe_act, moe) against NumPy, its rows checked (assert_rows_ran); returns the dump."""
        flags = SHAPE + COMBOS["pre_softmax_shared_dropout"] + ["--attention-dropout", "0.1"]
        dump, rows = self.layer_run(name, flags + layout + ["--config", "sp,selective+sp",
                                                            "--recompute-modules", "moe_act,moe"],
                                    np_ranks=np_ranks)
        self.assert_rows_ran(rows, **columns)
        self.assert_matches_numpy(os.path.join(dump, "sp"))
        self.assert_matches_numpy(os.path.join(dump, "selective+sp"), routing=False)
        return dump

    def test_one_rank_matches_numpy_and_recompute_changes_no_value(self):
        for combo, flags in COMBOS.items():
            for modules in MODULES:
                name = combo + "_" + modules.replace(",", "_")
                dump, rows = self.layer_run(name, SHAPE + flags + ["--config", ",".join(CONFIGS),
                                                                   "--recompute-modules", modules])
                self.assertEqual([r["status"] for r in rows], ["ok"] * len(CONFIGS))
                for r in rows:
                    self.assertEqual(r["num_experts"], "8")
                    self.assertEqual(r["moe_routing"], "measured")
                    self.assertEqual(r["act_bytes"], r["act_bytes_formula"], (name, r["config"]))
                    if combo == "capacity":  # ceil(16·2/8 · 0.5) = 2 rows per expert of 32 pairs
                        self.assertEqual(int(r["dropped_tokens"]), 32 - int(r["moe_routed_rows"]))
                        self.assertLessEqual(int(r["tokens_per_expert_max"]), 2)
                for config in CONFIGS:
                    with self.subTest(combo=combo, modules=modules, config=config):
                        folder = os.path.join(dump, config)
                        kept = config == "baseline" or (config == "selective" and "moe" not in modules.split(","))
                        self.assert_matches_numpy(folder, routing=kept)
                        self.assert_same_tensors(folder, os.path.join(dump, CONFIGS[0]))

    def test_meta_given_the_cpu_histogram_keeps_the_cpu_bytes(self):
        for combo, flags in COMBOS.items():
            args = SHAPE + flags + ["--config", "selective", "--recompute-modules", "moe_act"]
            dump, cpu = self.layer_run("cpu_" + combo, args)
            counts = np.load(os.path.join(dump, "moe.tokens_per_expert.npy"))  # one configuration: the folder
            given = ",".join(str(int(c)) for c in counts)
            _, meta = self.layer_run("meta_" + combo, args + ["--moe-tokens-per-expert", given], dump=False,
                                     backend="meta")
            for column in ["act_bytes", "act_extra_bytes", "moe_routed_rows", "tokens_per_expert_max",
                           "dropped_tokens"]:
                self.assertEqual(meta[0][column], cpu[0][column], (combo, column))
            self.assertEqual((cpu[0]["moe_routing"], meta[0]["moe_routing"]), ("measured", "given"))

    @unittest.skipUnless(MPIEXEC, "mpirun missing")
    def test_two_ranks_tensor_and_sequence_parallel_match_numpy(self):
        for combo in ["softmax", "pre_softmax_shared_dropout"]:
            dump, rows = self.layer_run("tp2_" + combo, SHAPE + COMBOS[combo] + [
                "--tp", "2", "--config", "sp,selective+sp", "--recompute-modules", "moe_act,shared_experts"],
                np_ranks=2)
            self.assertEqual([r["status"] for r in rows], ["ok", "ok"])
            for config in ["sp", "selective+sp"]:
                with self.subTest(combo=combo, config=config):
                    folder = os.path.join(dump, config)
                    with open(os.path.join(folder, "layer.json")) as f:
                        self.assertEqual(json.load(f)["tp"], 2)
                    self.assert_matches_numpy(folder)

    @unittest.skipUnless(MPIEXEC, "mpirun missing")
    def test_expert_parallel_ranks_match_numpy_on_the_whole_batch(self):
        # pre_softmax_shared_dropout: hidden and attention dropout, each rank's masks at its batch slice
        for combo in ["softmax", "sigmoid_groups_bias", "pre_softmax_shared_dropout"]:
            dropout = ["--attention-dropout", "0.1"] if "dropout" in combo else []
            dump, rows = self.layer_run("ep2_" + combo, SHAPE + COMBOS[combo] + dropout + [
                "--expert-model-parallel-size", "2", "--config", "baseline,selective",
                "--recompute-modules", "moe"], np_ranks=2)
            self.assert_rows_ran(rows, ep="2")
            with open(os.path.join(dump, "baseline", "layer.json")) as f:
                self.assertEqual(json.load(f)["batch"], 4)  # the two ranks' micro-batches
            self.assert_matches_numpy(os.path.join(dump, "baseline"))
            self.assert_matches_numpy(os.path.join(dump, "selective"), routing=False)

    @unittest.skipUnless(MPIEXEC, "mpirun missing")
    def test_experts_over_the_tensor_parallel_group_match_numpy(self):
        # --tp 2 --expert-model-parallel-size 2: each rank routes its s/2 rows, its 4 experts
        # receive both ranks' rows for them (expert tensor parallelism 1), dropout on.
        self.run_layout_with_dropout("ep_over_tp", ["--tp", "2", "--expert-model-parallel-size", "2"], 2,
                                     tp="2", ep="2")

    @unittest.skipUnless(MPIEXEC, "mpirun missing")
    def test_expert_parallel_over_replicas_of_the_tensor_parallel_group_match_numpy(self):
        # mpirun -np 4 --tp 2 --expert-model-parallel-size 4: two replicas of a TP group of 2,
        # each its own micro-batch (SP within), every rank's s/2 rows to the 2 experts of
        # whichever rank holds them; dropout on.
        dump = self.run_layout_with_dropout("ep4_over_tp2", ["--tp", "2", "--expert-model-parallel-size", "4"], 4,
                                            tp="2", ep="4", etp="1")
        with open(os.path.join(dump, "sp", "layer.json")) as f:
            self.assertEqual(json.load(f)["batch"], 4)  # the two replicas' micro-batches
        flags = SHAPE + COMBOS["pre_softmax_shared_dropout"] + ["--attention-dropout", "0.1"]
        # --expert-tensor-parallel-size 2 --expert-model-parallel-size 2: each TP rank's two
        # replicas hold 4 experts each, every expert split over the TP group; the rows go by
        # all-to-all over EP, then to both ranks of the TP group, and come back summed.
        dump, rows = self.layer_run("ep2_etp2", flags + [
            "--tp", "2", "--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2",
            "--config", "sp,selective+sp,full+sp", "--recompute-modules", "moe_act"], np_ranks=4)
        self.assert_rows_ran(rows, tp="2", ep="2", etp="2")
        for config in ["sp", "selective+sp", "full+sp"]:
            with self.subTest(config=config):
                self.assert_matches_numpy(os.path.join(dump, config), routing=config != "full+sp")

    @unittest.skipUnless(MPIEXEC, "mpirun missing")
    def test_experts_split_over_the_tensor_parallel_group_match_numpy(self):
        # --tp 2 --expert-tensor-parallel-size 2: each rank routes its s/2 rows, every rank runs
        # half of every expert's width over both ranks' rows, the partial outputs are summed.
        for combo in ["softmax", "pre_softmax_shared_dropout"]:
            dump, rows = self.layer_run("etp_" + combo, SHAPE + COMBOS[combo] + [
                "--tp", "2", "--expert-tensor-parallel-size", "2", "--config", "sp,selective+sp,full+sp",
                "--recompute-modules", "moe_act"], np_ranks=2)
            self.assert_rows_ran(rows, tp="2", ep="1", etp="2")
            for config in ["sp", "selective+sp", "full+sp"]:
                with self.subTest(combo=combo, config=config):
                    self.assert_matches_numpy(os.path.join(dump, config), routing=config != "full+sp")

    @unittest.skipUnless(MPIEXEC, "mpirun missing")
    def test_context_parallel_ranks_match_numpy(self):
        # --cp 2: each rank routes the rows of its two chunks (0 and 3, 1 and 2 of the 4); the
        # dump puts the routing back in sequence order and sums the histogram over the ranks.
        flags = SHAPE + COMBOS["pre_softmax_shared_dropout"] + ["--cp", "2", "--cp-comm-type", "all_gather"]
        dump, rows = self.layer_run("cp2", flags + ["--config", "baseline,selective",
                                                    "--recompute-modules", "moe_act,shared_experts"], np_ranks=2)
        self.assert_rows_ran(rows, cp="2")
        for config in ["baseline", "selective"]:
            with self.subTest(config=config):
                folder = os.path.join(dump, config)
                with open(os.path.join(folder, "layer.json")) as f:
                    self.assertEqual(json.load(f)["cp"], 2)
                self.assertFalse(os.path.exists(os.path.join(folder, "moe.aux_loss.npy")))  # each rank's own
                self.assert_matches_numpy(folder)
        # and t x C = 2 x 2 with the experts over the tensor-parallel group (each TP group
        # exchanging its rows for its experts; the gradients summed over CP)
        dump, rows = self.layer_run("cp2_ep_over_tp2", flags + [
            "--tp", "2", "--expert-model-parallel-size", "2", "--config", "sp"], np_ranks=4)
        self.assert_rows_ran(rows, tp="2", ep="2", cp="2")
        self.assert_matches_numpy(dump)  # one configuration: the folder
        # and the experts over the whole world of 4: two data-parallel replicas of C = 2, each
        # rank routing its chunks' rows to whichever rank holds their 2 experts
        dump, rows = self.layer_run("cp2_ep4", flags + ["--expert-model-parallel-size", "4", "--config", "baseline"],
                                    np_ranks=4)
        self.assert_rows_ran(rows, tp="1", ep="4", cp="2")
        with open(os.path.join(dump, "layer.json")) as f:
            self.assertEqual(json.load(f)["batch"], 4)  # the two replicas' micro-batches
        self.assert_matches_numpy(dump)
        # and each expert split over TP 2, the experts over each TP rank's two CP peers
        dump, rows = self.layer_run("cp2_tp2_etp2_ep2", flags + [
            "--tp", "2", "--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2",
            "--config", "sp"], np_ranks=4)
        self.assert_rows_ran(rows, tp="2", ep="2", etp="2", cp="2")
        self.assert_matches_numpy(dump)

    def test_the_check_is_not_blind(self):
        dump, _ = self.layer_run("blind", SHAPE + COMBOS["softmax"] + ["--config", "baseline"])
        # another routing decision than the layer's: the exact comparison of the indices fails
        index = np.load(os.path.join(dump, "moe.topk_index.npy"))
        np.save(os.path.join(dump, "moe.topk_index.npy"), index[::-1].copy())
        failed = [r[0] for r in numpy_layer.check(dump, rtol=RTOL) if not r[3]]
        self.assertEqual(failed, ["moe.topk_index"])
        # one expert's weight gradient off by a little
        grad = np.load(os.path.join(dump, "grad.experts.fc2.weight.npy"))
        grad[3] *= 1.01
        np.save(os.path.join(dump, "grad.experts.fc2.weight.npy"), grad)
        self.assertIn("grad.experts.fc2.weight", [r[0] for r in numpy_layer.check(dump, rtol=RTOL) if not r[3]])


if __name__ == "__main__":
    unittest.main()
