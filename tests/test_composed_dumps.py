"""The composed layer's `layer_run --dump` against the float64 NumPy layer (tools/numpy_layer.py)
over combinations of Megatron-Core's options, each option on and off at least once, every
recompute module set, unfused and fused attention, dropout off and on: one rank, and under
`mpirun -np 2 --tp 2` with sequence parallelism. Recompute must change no value. The check
itself is shown not to be blind: a perturbed gradient or a wrong option in layer.json fails it.

Run by ctest with ACTBENCH_LAYER_RUN pointing at the binary (and ACTBENCH_MPIEXEC at mpirun),
with Debian's python3 (numpy).
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_harness import MPIEXEC, DumpTestCase, np, numpy_layer, tensors  # noqa: E402

# A small layer (h 64, a 4, d 16) that runs in a fraction of a second; the flags below edit it.
# (tests/test_cuda_sim.py runs some of these combinations on the cuda backend of the simulator.)
SHAPE = ["--dtype", "fp32", "--seq", "16", "--hidden", "64", "--heads", "4", "--batch", "2", "--warmup", "0",
         "--iters", "1"]
NO_DROPOUT = ["--dropout", "0"]
RTOL = 1e-4


class Combo:
    """One spec: its layer_run flags, the recompute modules of its selective configurations, and
    what layer.json must then say (so a flag that is silently dropped cannot pass)."""

    def __init__(self, name, flags, modules, **expect):
        self.name, self.flags, self.modules, self.expect = name, flags, modules, expect


# Each option on and off at least once: LayerNorm/RMSNorm, qk-layernorm, gelu/swiglu/squared-relu,
# ffn width, biases (all, none, QKV alone), G = 1 < G = 2 < G = a, head size d below, at and above
# h/a, rope/none, partial rope, rope base, norm epsilon, each module set, unfused/fused, dropout
# off/on (attention != hidden).
COMBOS = [
    Combo("gpt_default", NO_DROPOUT, "core_attn",
          normalization="LayerNorm", qk_layernorm=False, activation="gelu", ffn_hidden=256, add_bias_linear=True,
          add_qkv_bias=False, kv_heads=4, kv_channels=16, position_embedding="none", attention="unfused",
          norm_epsilon=1e-5),
    Combo("rmsnorm_qk_swiglu_rope", NO_DROPOUT + ["--normalization", "RMSNorm", "--qk-layernorm", "--swiglu",
                                                  "--ffn-hidden-size", "96", "--disable-bias-linear",
                                                  "--position-embedding-type", "rope"], "mlp",
          normalization="RMSNorm", qk_layernorm=True, activation="swiglu", ffn_hidden=96, add_bias_linear=False,
          add_qkv_bias=False, position_embedding="rope", rotary_percent=1.0, rotary_base=10000.0),
    Combo("layernorm_qk_squared_relu_fused", NO_DROPOUT + ["--qk-layernorm", "--squared-relu", "--attention", "fused"],
          "layernorm",
          normalization="LayerNorm", qk_layernorm=True, activation="squared_relu", add_bias_linear=True,
          attention="fused"),
    Combo("gqa2_half_rope", NO_DROPOUT + ["--group-query-attention", "--num-query-groups", "2",
                                          "--position-embedding-type", "rope", "--rotary-percent", "0.5",
                                          "--rotary-base", "500"], "core_attn,mlp,layernorm",
          kv_heads=2, position_embedding="rope", rotary_percent=0.5, rotary_base=500.0, activation="gelu"),
    Combo("gqa_equal_heads_fused", NO_DROPOUT + ["--group-query-attention", "--num-query-groups", "4",
                                                 "--normalization", "RMSNorm", "--swiglu", "--attention", "fused"],
          "core_attn",
          kv_heads=4, normalization="RMSNorm", activation="swiglu", attention="fused", add_bias_linear=True),
    Combo("qkv_bias_only_partial_rope", NO_DROPOUT + ["--normalization", "RMSNorm", "--swiglu", "--ffn-hidden-size",
                                                      "80", "--disable-bias-linear", "--add-qkv-bias",
                                                      "--position-embedding-type", "rope", "--rotary-percent", "0.5",
                                                      "--norm-epsilon", "1e-3"], "mlp",
          add_bias_linear=False, add_qkv_bias=True, ffn_hidden=80, rotary_percent=0.5, norm_epsilon=1e-3),
    Combo("dropout_unfused_rope", ["--attention-dropout", "0.1", "--hidden-dropout", "0.2",
                                   "--position-embedding-type", "rope"], "core_attn,mlp,layernorm",
          attention_dropout=0.1, hidden_dropout=0.2, attention="unfused", normalization="LayerNorm",
          activation="gelu", position_embedding="rope"),
    Combo("dropout_fused_gqa_qk_squared_relu", ["--attention-dropout", "0.15", "--hidden-dropout", "0.05",
                                                "--normalization", "RMSNorm", "--qk-layernorm", "--squared-relu",
                                                "--group-query-attention", "--num-query-groups", "2",
                                                "--attention", "fused"], "layernorm",
          attention_dropout=0.15, hidden_dropout=0.05, normalization="RMSNorm", qk_layernorm=True,
          activation="squared_relu", kv_heads=2, attention="fused"),
    Combo("gqa1_narrow_ffn", NO_DROPOUT + ["--group-query-attention", "--ffn-hidden-size", "128",
                                           "--norm-epsilon", "1e-6"], "layernorm",
          kv_heads=1, ffn_hidden=128, norm_epsilon=1e-6, normalization="LayerNorm", activation="gelu"),
    Combo("rmsnorm_gelu_no_bias_rope_base", NO_DROPOUT + ["--normalization", "RMSNorm", "--disable-bias-linear",
                                                          "--position-embedding-type", "rope", "--rotary-base",
                                                          "1000000", "--attention", "fused"], "core_attn,mlp",
          normalization="RMSNorm", activation="gelu", add_bias_linear=False, add_qkv_bias=False,
          rotary_base=1e6, attention="fused"),
    Combo("squared_relu_qkv_bias_no_rope", NO_DROPOUT + ["--squared-relu", "--disable-bias-linear", "--add-qkv-bias",
                                                         "--position-embedding-type", "none", "--norm-epsilon",
                                                         "1e-2"], "core_attn",
          activation="squared_relu", add_bias_linear=False, add_qkv_bias=True, position_embedding="none",
          norm_epsilon=1e-2),
    Combo("layernorm_swiglu_biases_fused_rope", NO_DROPOUT + ["--swiglu", "--add-qkv-bias", "--position-embedding-type",
                                                              "rope", "--attention", "fused"], "mlp",
          normalization="LayerNorm", activation="swiglu", add_bias_linear=True, add_qkv_bias=True,
          position_embedding="rope", attention="fused"),
    Combo("everything_on", ["--attention-dropout", "0.1", "--hidden-dropout", "0.05", "--normalization", "RMSNorm",
                            "--qk-layernorm", "--swiglu", "--ffn-hidden-size", "48", "--disable-bias-linear",
                            "--add-qkv-bias", "--group-query-attention", "--num-query-groups", "2",
                            "--position-embedding-type", "rope", "--rotary-percent", "0.5", "--rotary-base", "100",
                            "--norm-epsilon", "1e-4"], "core_attn,mlp,layernorm",
          attention_dropout=0.1, hidden_dropout=0.05, normalization="RMSNorm", qk_layernorm=True,
          activation="swiglu", ffn_hidden=48, add_bias_linear=False, add_qkv_bias=True, kv_heads=2,
          rotary_percent=0.5, rotary_base=100.0, norm_epsilon=1e-4),
    Combo("llama_preset_with_layernorm", ["--arch", "llama", "--normalization", "LayerNorm", "--kv-heads", "2",
                                          "--ffn-hidden", "64"], "core_attn",
          normalization="LayerNorm", activation="swiglu", kv_heads=2, add_bias_linear=False,
          position_embedding="rope", attention_dropout=0.0, hidden_dropout=0.0),
    # --kv-channels: heads wider than h/a = 16 (a·d = 96 > h, as Qwen3's) and narrower (a·d = 32 < h)
    Combo("wide_heads_gqa_qk_half_rope_fused", NO_DROPOUT + ["--kv-channels", "24", "--normalization", "RMSNorm",
                                                             "--qk-layernorm", "--swiglu", "--disable-bias-linear",
                                                             "--group-query-attention", "--num-query-groups", "2",
                                                             "--position-embedding-type", "rope",
                                                             "--rotary-percent", "0.5", "--attention", "fused"],
          "core_attn,mlp,layernorm",
          kv_channels=24, normalization="RMSNorm", qk_layernorm=True, activation="swiglu", add_bias_linear=False,
          kv_heads=2, position_embedding="rope", rotary_percent=0.5, attention="fused"),
    Combo("narrow_heads_gelu_biases_dropout", ["--kv-channels", "8", "--attention-dropout", "0.1",
                                               "--hidden-dropout", "0.05"], "core_attn",
          kv_channels=8, normalization="LayerNorm", activation="gelu", add_bias_linear=True, kv_heads=4,
          position_embedding="none", attention="unfused", attention_dropout=0.1, hidden_dropout=0.05),
]
# Under mpirun -np 2 --tp 2 with sequence parallelism (t divides G).
MPI_COMBOS = ["gqa2_half_rope", "layernorm_qk_squared_relu_fused", "squared_relu_qkv_bias_no_rope",
              "qkv_bias_only_partial_rope", "dropout_unfused_rope", "everything_on",
              "wide_heads_gqa_qk_half_rope_fused", "narrow_heads_gelu_biases_dropout"]
COMBO = {c.name: c for c in COMBOS}


def expected_layer_json(combo, config, tp):
    """What layer.json of `combo` run as `config` on `tp` ranks must hold."""
    expect = dict(combo.expect, config=config, tp=tp)
    if config.startswith("selective"):
        expect["recompute_modules"] = combo.modules
    return expect


@unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
class ComposedDumpTest(DumpTestCase):
    def assert_layer_json(self, folder, combo, config, tp):
        with open(os.path.join(folder, "layer.json")) as f:
            layer = json.load(f)
        for key, value in expected_layer_json(combo, config, tp).items():
            self.assertEqual(layer[key], value, "%s of %s/%s" % (key, combo.name, config))

    def assert_matches_numpy(self, folder):
        results = numpy_layer.check(folder, rtol=RTOL)
        names = [r[0] for r in results]
        self.assertEqual(names[:2], ["y", "dx"])
        self.assertIn("grad.qkv.weight", names)
        self.assertIn("grad.fc2.weight", names)
        for name, err, scale, ok in results:
            self.assertTrue(ok, "%s: max|err| %.3e vs max|ref| %.3e (rtol %g)" % (name, err, scale, RTOL))

    def assert_same_tensors(self, folder, reference):
        """Every dumped tensor (inputs, parameters, outputs, gradients) bit for bit."""
        self.assertEqual(tensors(folder), tensors(reference))
        for name in tensors(folder):
            a, b = np.load(os.path.join(folder, name)), np.load(os.path.join(reference, name))
            self.assertEqual(a.dtype, b.dtype, name)
            self.assertTrue(np.array_equal(a, b), "%s differs from %s: max|diff| %.3e" % (
                name, reference, float(np.abs(a.astype(np.float64) - b).max())))

    def run_and_check(self, combo, configs, np_ranks=None, tp=1):
        parallel = ["--tp", str(tp)] if tp > 1 else []
        dump, rows = self.layer_run(combo.name, SHAPE + combo.flags + parallel + [
            "--config", ",".join(configs), "--recompute-modules", combo.modules], np_ranks)
        self.assertEqual([r["config"] for r in rows], configs)
        for r in rows:
            self.assertEqual(r["status"], "ok", r["message"])
        for config in configs:
            with self.subTest(combo=combo.name, config=config, tp=tp):
                folder = os.path.join(dump, config)
                self.assert_layer_json(folder, combo, config, tp)
                self.assert_matches_numpy(folder)
                # Recompute changes no value: the same tensors as the first (keep-everything) config.
                self.assert_same_tensors(folder, os.path.join(dump, configs[0]))
        return dump

    def test_options_are_each_on_and_off(self):
        # The combinations above are what this file claims: each option seen both ways.
        seen = {}
        for c in COMBOS:
            for key, value in c.expect.items():
                seen.setdefault(key, set()).add(value)
        for key in ["normalization", "qk_layernorm", "add_bias_linear", "add_qkv_bias", "attention"]:
            self.assertEqual(len(seen[key]), 2, key)
        self.assertEqual(seen["activation"], {"gelu", "swiglu", "squared_relu"})
        self.assertEqual(seen["position_embedding"], {"rope", "none"})
        self.assertTrue({1, 2, 4} <= seen["kv_heads"])
        self.assertTrue({8, 16, 24} <= seen["kv_channels"])  # d below, at and above h/a
        for key in ["ffn_hidden", "rotary_percent", "rotary_base", "norm_epsilon"]:
            self.assertGreaterEqual(len(seen[key]), 2, key)
        self.assertTrue({"core_attn", "mlp", "layernorm", "core_attn,mlp,layernorm"} <= {c.modules for c in COMBOS})
        dropped = [c for c in COMBOS if c.expect.get("attention_dropout", 0) > 0]
        self.assertGreaterEqual(len(dropped), 2)
        self.assertTrue(all(c.expect["attention_dropout"] != c.expect["hidden_dropout"] for c in dropped))
        self.assertGreaterEqual(len(COMBOS), 12)

    def test_one_rank_matches_numpy_and_recompute_changes_no_value(self):
        for combo in COMBOS:
            self.run_and_check(combo, ["baseline", "selective", "full"])

    def test_every_module_set_changes_no_value_with_dropout(self):
        combo = COMBO["everything_on"]
        for attention in ["unfused", "fused"]:
            reference = None
            for modules in ["core_attn", "mlp", "layernorm", "core_attn,mlp", "core_attn,mlp,layernorm"]:
                with self.subTest(attention=attention, modules=modules):
                    name = "modules_%s_%s" % (attention, modules.replace(",", "_"))
                    dump, _ = self.layer_run(name, SHAPE + combo.flags + [
                        "--attention", attention, "--config", "selective", "--recompute-modules", modules])
                    folder = dump  # one configuration: its tensors in the folder itself
                    self.assert_matches_numpy(folder)
                    reference = reference or folder
                    self.assert_same_tensors(folder, reference)

    @unittest.skipUnless(MPIEXEC, "no mpirun")
    def test_two_ranks_tensor_and_sequence_parallel_match_numpy(self):
        for name in MPI_COMBOS:
            # sp first: the recompute configurations run the same collectives, so their tensors equal its.
            self.run_and_check(COMBO[name], ["sp", "selective+sp", "full+sp"], np_ranks=2, tp=2)

    @unittest.skipUnless(MPIEXEC, "no mpirun")
    def test_two_ranks_without_sequence_parallel_match_numpy(self):
        combo = COMBO["everything_on"]
        dump, _ = self.layer_run("tp2", SHAPE + combo.flags + ["--tp", "2", "--config", "baseline,selective",
                                                               "--recompute-modules", combo.modules], np_ranks=2)
        for config in ["baseline", "selective"]:
            with self.subTest(config=config):
                self.assert_layer_json(os.path.join(dump, config), combo, config, 2)
                self.assert_matches_numpy(os.path.join(dump, config))

    def test_the_check_is_not_blind(self):
        combo = COMBO["everything_on"]
        folder, _ = self.layer_run("blind", SHAPE + combo.flags + ["--config", "baseline"])
        self.assert_matches_numpy(folder)

        def failing():
            return [r[0] for r in numpy_layer.check(folder, rtol=RTOL) if not r[3]]

        def edit_layer_json(**changes):
            path = os.path.join(folder, "layer.json")
            with open(path) as f:
                layer = json.load(f)
            original = {k: layer[k] for k in changes}
            layer.update(changes)
            with open(path, "w") as f:
                json.dump(layer, f)
            return original

        # one element of one gradient: that gradient alone fails
        path = os.path.join(folder, "grad.k_norm.weight.npy")
        g = np.load(path)
        original = g.copy()
        g[3] += 1e-2 * np.abs(g).max()
        np.save(path, g)
        self.assertEqual(failing(), ["grad.k_norm.weight"])
        np.save(path, original)
        self.assertEqual(failing(), [])
        # each option the run used, changed in layer.json, breaks the output
        for changes in [{"attention_dropout": 0.0}, {"hidden_dropout": 0.1}, {"rotary_percent": 1.0},
                        {"rotary_base": 10000.0}, {"seed": 1235}, {"norm_epsilon": 1e-2}]:
            with self.subTest(changes=changes):
                restore = edit_layer_json(**changes)
                self.assertIn("y", failing())
                edit_layer_json(**restore)
        self.assertEqual(failing(), [])
        # a different G or d changes the parameters' shapes: refused, naming the file
        for changes in [{"kv_heads": 4}, {"kv_channels": 8}]:
            with self.subTest(changes=changes):
                restore = edit_layer_json(**changes)
                with self.assertRaisesRegex(ValueError, "qkv.weight.npy: shape"):
                    numpy_layer.check(folder, rtol=RTOL)
                edit_layer_json(**restore)
        # qk_layernorm off: the q/k norms are skipped and their weights not read, so y is wrong
        edit_layer_json(qk_layernorm=False)
        self.assertIn("y", failing())


if __name__ == "__main__":
    unittest.main()
