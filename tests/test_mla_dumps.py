"""The multi-latent attention layer's `layer_run --dump` against the float64 NumPy layer
(tools/numpy_layer.py with tools/numpy_mla.py): q through its latent or projected directly,
LayerNorm and RMSNorm, dropout, v narrower than k, the MoE block after it; unfused and fused;
every recompute module MLA reads (mla_up_proj among them); one rank and `mpirun -np 2 --tp 2`
with and without sequence parallelism. Recompute must change no value, and the check must not
be blind.

Run by ctest with ACTBENCH_LAYER_RUN pointing at the binary (and ACTBENCH_MPIEXEC at mpirun),
with Debian's python3 (numpy).
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_harness import MPIEXEC, DumpTestCase, np, numpy_layer  # noqa: E402

SHAPE = ["--dtype", "fp32", "--seq", "8", "--hidden", "32", "--heads", "4", "--batch", "2", "--warmup", "0",
         "--iters", "1"]
MLA = ["--multi-latent-attention", "--kv-lora-rank", "5", "--qk-head-dim", "4", "--qk-pos-emb-head-dim", "2"]
RTOL = 1e-4
# name: (flags, what the combination turns on)
COMBOS = {
    "q_latent_rmsnorm": ["--arch", "llama", "--ffn-hidden-size", "24", "--q-lora-rank", "6", "--v-head-dim", "3"] + MLA,
    "q_projected_layernorm_dropout": ["--arch", "gpt", "--disable-bias-linear", "--position-embedding-type", "rope",
                                      "--dropout", "0.1", "--ffn-hidden-size", "24", "--v-head-dim", "6"] + MLA,
    "q_latent_moe": ["--arch", "llama", "--ffn-hidden-size", "24", "--q-lora-rank", "6", "--num-experts", "4",
                     "--moe-router-topk", "2", "--moe-ffn-hidden-size", "12", "--v-head-dim", "3"] + MLA,
}
CONFIGS = ["baseline", "selective", "full"]
MODULES = ["core_attn", "mla_up_proj", "core_attn,layernorm,mla_up_proj"]


@unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
class MlaDumpTest(DumpTestCase):
    def assert_matches_numpy(self, folder):
        results = numpy_layer.check(folder, rtol=RTOL)
        names = [r[0] for r in results]
        for name in ["y", "dx", "grad.kv_down.weight", "grad.kv_up.weight", "grad.kv_latent_norm.weight",
                     "grad.proj.weight"]:
            self.assertIn(name, names)
        for name, err, scale, ok in results:
            self.assertTrue(ok, "%s: %s max|err| %.3e vs max|ref| %.3e" % (folder, name, err, scale))

    def test_one_rank_matches_numpy_and_recompute_changes_no_value(self):
        for combo, flags in COMBOS.items():
            for attention in ["unfused", "fused"]:
                for modules in MODULES:
                    name = "_".join([combo, attention, modules.replace(",", "_")])
                    dump, rows = self.layer_run(name, SHAPE + flags + [
                        "--attention", attention, "--config", ",".join(CONFIGS), "--recompute-modules", modules])
                    self.assertEqual([r["status"] for r in rows], ["ok"] * len(CONFIGS))
                    for r in rows:
                        self.assertEqual((r["kv_lora_rank"], r["qk_pos_emb_head_dim"]), ("5", "2"))
                        self.assertEqual(r["act_bytes"], r["act_bytes_formula"], (name, r["config"]))
                    for config in CONFIGS:
                        with self.subTest(combo=combo, attention=attention, modules=modules, config=config):
                            folder = os.path.join(dump, config)
                            with open(os.path.join(folder, "layer.json")) as f:
                                self.assertEqual(json.load(f)["mla"]["kv_lora_rank"], 5)
                            self.assert_matches_numpy(folder)
                            self.assert_same_tensors(folder, os.path.join(dump, CONFIGS[0]), skip=["moe.topk"])

    @unittest.skipUnless(MPIEXEC, "mpirun missing")
    def test_two_ranks_with_and_without_sequence_parallelism_match_numpy(self):
        for combo in ["q_latent_rmsnorm", "q_projected_layernorm_dropout"]:
            dump, rows = self.layer_run("tp2_" + combo, SHAPE + COMBOS[combo] + [
                "--tp", "2", "--config", "baseline,sp,selective+sp", "--recompute-modules", "mla_up_proj,layernorm"],
                np_ranks=2)
            self.assertEqual([r["status"] for r in rows], ["ok"] * 3)
            for r in rows:
                self.assertEqual(r["act_bytes"], r["act_bytes_formula"], (combo, r["config"]))
            for config in ["baseline", "sp", "selective+sp"]:
                with self.subTest(combo=combo, config=config):
                    folder = os.path.join(dump, config)
                    with open(os.path.join(folder, "layer.json")) as f:
                        self.assertEqual(json.load(f)["tp"], 2)
                    self.assert_matches_numpy(folder)

    def test_the_check_is_not_blind(self):
        dump, _ = self.layer_run("blind", SHAPE + COMBOS["q_latent_rmsnorm"] + ["--config", "baseline"])
        # k's RoPE rows of the kv down projection's gradient off by a little (the head sum)
        grad = np.load(os.path.join(dump, "grad.kv_down.weight.npy"))
        grad[-1] *= 1.01
        np.save(os.path.join(dump, "grad.kv_down.weight.npy"), grad)
        self.assertEqual([r[0] for r in numpy_layer.check(dump, rtol=RTOL) if not r[3]], ["grad.kv_down.weight"])
        # the up projection's heads in another order: every output changes
        up = np.load(os.path.join(dump, "kv_up.weight.npy"))
        np.save(os.path.join(dump, "kv_up.weight.npy"), np.roll(up, 7, axis=0))
        self.assertIn("y", [r[0] for r in numpy_layer.check(dump, rtol=RTOL) if not r[3]])


if __name__ == "__main__":
    unittest.main()
