"""tools/numpy_layer.py on its own: Philox against published and runtime/philox.hpp words, the
reference's backward against central finite differences of its forward for combinations that
turn every option on and off (dropout included), its forward pieces against their definitions,
and the checker's CLI on dumps written here (matches, mismatches, bad input).

Needs NumPy (Debian's /usr/bin/python3); run by ctest from tests/.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "numpy_layer.py")
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

try:
    import numpy as np
    import numpy_layer as nl
except ImportError:
    np = nl = None


def layer_json(**options):
    """A complete layer.json object: a small GPT layer unless `options` say otherwise."""
    meta = {"seq": 5, "batch": 2, "hidden": 8, "heads": 2, "tp": 1, "config": "baseline", "attention": "unfused",
            "dtype": "fp32", "seed": 1234, "recompute_modules": "", "normalization": "LayerNorm",
            "norm_epsilon": 1e-5, "qk_layernorm": False, "activation": "gelu", "ffn_hidden": 12,
            "add_bias_linear": True, "add_qkv_bias": False, "kv_heads": 2, "position_embedding": "none",
            "rotary_percent": 1.0, "rotary_base": 10000.0, "attention_dropout": 0.0, "hidden_dropout": 0.0}
    meta.update(options)
    return meta


# Each option on and off at least once, in tiny shapes (s 4..6, b 2, h 8..16, a 2..4, g 1..a).
RMS_NO_BIAS = dict(normalization="RMSNorm", add_bias_linear=False)
COMBINATIONS = {
    "gpt": {},
    "gpt_dropout": dict(attention_dropout=0.25, hidden_dropout=0.25, seed=99),
    "llama_mqa": dict(RMS_NO_BIAS, activation="swiglu", heads=4, kv_heads=1, position_embedding="rope", seq=6),
    "llama_gqa": dict(RMS_NO_BIAS, activation="swiglu", hidden=16, heads=4, kv_heads=2, ffn_hidden=10,
                      position_embedding="rope", rotary_base=100.0),
    "qwen3": dict(RMS_NO_BIAS, activation="swiglu", hidden=16, heads=4, kv_heads=2, qk_layernorm=True,
                  position_embedding="rope", norm_epsilon=1e-6),
    "qwen2": dict(RMS_NO_BIAS, activation="swiglu", hidden=12, heads=2, kv_heads=1, add_qkv_bias=True,
                  position_embedding="rope", seq=4),
    "layernorm_qk_partial_rope": dict(qk_layernorm=True, position_embedding="rope", rotary_percent=0.5, heads=2),
    "layernorm_swiglu_attn_dropout": dict(activation="swiglu", hidden=12, heads=3, kv_heads=1, attention_dropout=0.2),
    "squared_relu_hidden_dropout": dict(RMS_NO_BIAS, activation="squared_relu", hidden=16, heads=2,
                                        position_embedding="rope", rotary_percent=0.5, hidden_dropout=0.3),
    "squared_relu_qk_mqa_dropout": dict(activation="squared_relu", add_qkv_bias=True, qk_layernorm=True, heads=4,
                                        kv_heads=1, attention_dropout=0.1, hidden_dropout=0.1, seed=2 ** 64 - 1),
    "rms_gelu_both_biases": dict(normalization="RMSNorm", add_qkv_bias=True, seq=6, ffn_hidden=8),
    "everything": dict(normalization="RMSNorm", qk_layernorm=True, activation="swiglu", add_qkv_bias=True,
                       hidden=16, heads=4, kv_heads=2, position_embedding="rope", rotary_percent=0.5,
                       rotary_base=500.0, attention_dropout=0.3, hidden_dropout=0.2, seed=7, seq=6),
    # --kv-channels: heads wider than h/a (Qwen3: a·d = 2h) and narrower (a·d < h)
    "qwen3_wide_heads": dict(RMS_NO_BIAS, activation="swiglu", hidden=8, heads=4, kv_heads=2, kv_channels=4,
                             qk_layernorm=True, position_embedding="rope", rotary_percent=0.5, seq=4),
    "gelu_biases_narrow_heads": dict(hidden=8, heads=2, kv_channels=3, attention_dropout=0.2, seed=5),
    # an MoE block in place of the MLP (tools/numpy_moe.py): each routing option on and off
    "moe_softmax_top2": dict(RMS_NO_BIAS, activation="swiglu", moe=dict(num_experts=4, top_k=2, ffn_hidden=6)),
    "moe_pre_softmax_shared_dropout": dict(RMS_NO_BIAS, hidden_dropout=0.2, heads=2, seq=6,
                                           moe=dict(num_experts=3, top_k=2, ffn_hidden=5, shared_ffn_hidden=7,
                                                    normalize=False)),
    "moe_sigmoid_groups_bias_capacity": dict(RMS_NO_BIAS, activation="swiglu", hidden=12, heads=2,
                                             moe=dict(num_experts=6, top_k=2, ffn_hidden=4, score="sigmoid",
                                                      scaling=2.5, num_groups=3, group_top_k=2, expert_bias=True,
                                                      capacity_factor=0.75, shared_ffn_hidden=3)),
    # multi-latent attention (tools/numpy_mla.py) in place of QKV: q's latent or not, v narrower and wider
    "mla_q_latent_layernorm_dropout": dict(add_bias_linear=False, position_embedding="rope", heads=2,
                                           attention_dropout=0.2, hidden_dropout=0.1,
                                           mla=dict(q_lora_rank=5, kv_lora_rank=4, qk_head_dim=3,
                                                    qk_pos_emb_head_dim=2, v_head_dim=2)),
    "mla_q_projected_rms_one_head": dict(RMS_NO_BIAS, activation="swiglu", heads=1, kv_heads=1,
                                         position_embedding="rope",
                                         mla=dict(q_lora_rank=0, kv_lora_rank=3, qk_head_dim=2,
                                                  qk_pos_emb_head_dim=4, v_head_dim=5)),
    "mla_three_heads_moe": dict(RMS_NO_BIAS, activation="swiglu", hidden=12, heads=3, kv_heads=3,
                                position_embedding="rope", seq=4,
                                mla=dict(q_lora_rank=4, kv_lora_rank=3, qk_head_dim=2, qk_pos_emb_head_dim=2,
                                         v_head_dim=3),
                                moe=dict(num_experts=3, top_k=2, ffn_hidden=4)),
}


MLA_WIDTHS = dict(q_lora_rank=0, kv_lora_rank=4, qk_head_dim=2, qk_pos_emb_head_dim=2, v_head_dim=2)
MLA_OK = dict(add_bias_linear=False, position_embedding="rope", mla=MLA_WIDTHS)  # a layer.json MLA is built for


def moe_options(num_experts, top_k, ffn_hidden, **given):
    """A complete layer.json "moe" object (tools/numpy_layer.py's MOE_KEYS)."""
    moe = {"num_experts": num_experts, "top_k": top_k, "ffn_hidden": ffn_hidden, "shared_ffn_hidden": 0,
           "score": "softmax", "normalize": True, "scaling": 1.0, "num_groups": 0, "group_top_k": 0,
           "expert_bias": False, "capacity_factor": 0}
    moe.update(given)
    return moe


for _options in COMBINATIONS.values():
    if "moe" in _options:
        _options["moe"] = moe_options(**_options["moe"])


def random_problem(spec, seed=0):
    """Parameters (norm weights near 1), x and dy for `spec`, in float64."""
    rng = np.random.default_rng(seed)
    P = {}
    for name, shape in nl.param_shapes(spec).items():
        norm_weight = name.endswith(".weight") and len(shape) == 1
        P[name] = (1.0 if norm_weight else 0.0) + rng.normal(0, 0.3 if norm_weight or len(shape) == 1 else 0.5, shape)
    act = (spec.seq, spec.batch, spec.hidden)
    return P, rng.normal(0, 1, act), rng.normal(0, 1, act)


def finite_difference(f, t, step=1e-6):
    """d f / d t by central differences, element by element (t is changed and restored in place)."""
    grad = np.zeros_like(t)
    flat, out = t.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + step
        up = f()
        flat[i] = keep - step
        down = f()
        flat[i] = keep
        out[i] = (up - down) / (2 * step)
    return grad


def mla_head_by_definition(spec, P, n1, j, t):
    """Head j's q [d_n + d_r], k [d_n + d_r] and v [d_v] at position t from norm 1's output n1 [h],
    element by element as docs/layer_run.md writes MLA."""
    Lq, Lkv, dn, dr, dv = [spec.mla[k] for k in nl.MLA_KEYS]

    def norm(v, name):
        if spec.normalization == "LayerNorm":
            v = v - v.mean()
        out = v / np.sqrt(np.mean(v * v) + spec.norm_epsilon) * P[name + ".weight"]
        return out + P[name + ".bias"] if name + ".bias" in P else out

    def rope(v):  # all d_r dims, pairs (i, i + d_r/2)
        out = v.copy()
        for i in range(dr // 2):
            angle = t * spec.rotary_base ** (-2.0 * i / dr)
            out[i] = v[i] * np.cos(angle) - v[i + dr // 2] * np.sin(angle)
            out[i + dr // 2] = v[i + dr // 2] * np.cos(angle) + v[i] * np.sin(angle)
        return out

    rows = slice(j * (dn + dr), (j + 1) * (dn + dr))
    q = (P["q_up.weight"][rows] @ norm(P["q_down.weight"] @ n1, "q_latent_norm") if Lq
         else P["q_proj.weight"][rows] @ n1)
    kvd = P["kv_down.weight"] @ n1
    kv = P["kv_up.weight"][j * (dn + dv):(j + 1) * (dn + dv)] @ norm(kvd[:Lkv], "kv_latent_norm")
    return (np.concatenate([q[:dn], rope(q[dn:])]), np.concatenate([kv[:dn], rope(kvd[Lkv:])]), kv[dn:])


@unittest.skipUnless(nl, "numpy missing: run with /usr/bin/python3")
class PhiloxTest(unittest.TestCase):
    def test_random123_known_answers(self):
        # The published Philox4x32-10 known-answer vectors (Random123's kat_vectors); runtime/philox.hpp's
        # philox4x32_10 gives the same three (checked by compiling it once).
        cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
                 ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
                 ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                  (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
        for counter, key, expected in cases:
            got = nl.philox4x32_10([np.array([w], dtype=np.uint32) for w in counter], key)
            self.assertEqual(tuple(int(w[0]) for w in got), expected)

    def test_words_are_runtime_philox_words(self):
        # Produced by compiling a few lines that print actbench::philox_word(seed, layer, stream, index)
        # from runtime/philox.hpp: all four lanes, a later block, and a block past 2^32 (its high word).
        index = np.array([0, 1, 2, 3, 4, 5, 6, 7, 1000003, (5 << 34) + 6], dtype=np.uint64)
        expected = {(0x1234567890ABCDEF, 3, 2): [0xEF6FBB60, 0x189042D2, 0x3DF82CC8, 0x04016FF8, 0x753A96DC,
                                                 0x09A60CDD, 0x74E6E5E1, 0x2395DF5D, 0x22F4433C, 0xA356C2BC],
                    (1234, 0, 0): [0x2090B348, 0xDA7CF0AB, 0x4401906F, 0xCBCA470E, 0x9EEEDE35,
                                   0x1CBE137C, 0xFA277093, 0x147EDD50, 0x3EA354C1, 0x1B52FC7D]}
        for (seed, layer, stream), words in expected.items():
            self.assertEqual(nl.philox_words(seed, layer, stream, index).tolist(), words)

    def test_threshold_is_runtime_dropout_threshold(self):
        # actbench::dropout_threshold(float p) for these p (the same program as above)
        for p, threshold in [(0.1, 429496736), (0.5, 2147483648), (0.25, 1073741824), (0.999, 4290672384),
                             (1e-7, 429), (0.0, 0)]:
            self.assertEqual(nl.dropout_threshold(p), threshold, p)

    def test_masks_drop_about_p_and_scale_the_kept(self):
        spec = nl.spec_from_json(layer_json(seq=64, batch=4, hidden=64, heads=4, kv_heads=4, attention_dropout=0.1,
                                            hidden_dropout=0.3))
        drop = nl.dropout_scales(spec)
        for scale, p in [(drop.attn_probs, 0.1), (drop.attn_out, 0.3), (drop.mlp_out, 0.3)]:
            self.assertEqual(set(np.unique(scale).tolist()), {0.0, 1.0 / (1.0 - float(np.float32(p)))})
            self.assertAlmostEqual(float((scale == 0).mean()), p, delta=0.02)
        self.assertFalse(np.array_equal(drop.attn_out, drop.mlp_out))  # two sites, two streams
        self.assertEqual(nl.dropout_scales(nl.spec_from_json(layer_json())), (1.0, 1.0, 1.0))


@unittest.skipUnless(nl, "numpy missing: run with /usr/bin/python3")
class GradientTest(unittest.TestCase):
    """layer's backward is the derivative of forward: L = sum(y · dy) by central differences."""

    def test_every_combination_against_finite_differences(self):
        for name, options in COMBINATIONS.items():
            with self.subTest(name):
                self.check_combination(nl.spec_from_json(layer_json(**options)))

    def check_combination(self, spec):
        P, x, dy = random_problem(spec)
        drop = nl.dropout_scales(spec)  # fixed by the seed: the same masks in every forward below
        y, dx, G = nl.layer(spec, P, x, dy, drop)
        self.assertEqual(sorted(G), sorted(P))
        loss = lambda: float(np.sum(nl.forward(spec, P, x, drop) * dy))
        for label, analytic, t in [("dx", dx, x)] + [("grad." + n, G[n], P[n]) for n in P]:
            numeric = finite_difference(loss, t)
            scale = max(1.0, float(np.max(np.abs(numeric))))
            self.assertLess(float(np.max(np.abs(analytic - numeric))), 1e-6 * scale, label)

    def test_combinations_turn_every_option_on_and_off(self):
        specs = [nl.spec_from_json(layer_json(**o)) for o in COMBINATIONS.values()]
        seen = lambda field: {getattr(s, field) for s in specs}
        self.assertEqual(seen("normalization"), {"LayerNorm", "RMSNorm"})
        self.assertEqual(seen("activation"), {"gelu", "swiglu", "squared_relu"})
        self.assertEqual(seen("position_embedding"), {"rope", "none"})
        for flag in ["qk_layernorm", "add_bias_linear", "add_qkv_bias"]:
            self.assertEqual(seen(flag), {True, False}, flag)
        self.assertTrue({0.0} < seen("attention_dropout") and {0.0} < seen("hidden_dropout"))
        self.assertTrue({1.0} < seen("rotary_percent"))
        groups = {(s.kv_heads == s.heads, s.kv_heads == 1) for s in specs if not s.mla}
        self.assertEqual({s.mla["q_lora_rank"] > 0 for s in specs if s.mla}, {True, False})  # q's latent or not
        self.assertEqual({(s.heads * s.kv_channels > s.hidden) - (s.heads * s.kv_channels < s.hidden)
                          for s in specs if not s.mla}, {-1, 0, 1})  # a·d below, at and above h
        self.assertEqual(groups, {(True, False), (False, True), (False, False)})  # MHA, MQA, GQA


@unittest.skipUnless(nl, "numpy missing: run with /usr/bin/python3")
class ForwardPiecesTest(unittest.TestCase):
    """What finite differences cannot see: that the forward is the layer the contract defines."""

    def test_q_and_k_are_norm_then_rope_of_each_head(self):
        # head size d = 8, RoPE on its first R = 4 dims; element by element as the contract writes it
        d, a, g, R, base = 8, 4, 2, 4, 500.0
        for shape in [dict(hidden=a * d), dict(hidden=12, kv_channels=d)]:  # d = h/a, or given apart from h
            with self.subTest(**shape):
                options = dict(COMBINATIONS["everything"], rotary_base=base, **shape)
                self.check_norm_then_rope(options, d, a, g, R, base)

    def check_norm_then_rope(self, options, d, a, g, R, base):
        spec = nl.spec_from_json(layer_json(**options))
        P, x, _ = random_problem(spec)
        _, cache = nl.layer_fwd(spec, P, x, nl.dropout_scales(spec))
        for t, bi, j in [(0, 0, 0), (3, 1, 2), (5, 0, 3)]:
            for first_row, norm, got in [(j * d, "q_norm", cache["q"][bi, j, t]),
                                         ((a + j // (a // g)) * d, "k_norm", cache["k"][bi, j, t])]:
                rows = slice(first_row, first_row + d)  # query head j reads key head j // (a/g)
                v = P["qkv.weight"][rows] @ cache["n1"][t, bi] + P["qkv.bias"][rows]
                v = v / np.sqrt(np.mean(v * v) + spec.norm_epsilon) * P[norm + ".weight"]  # RMSNorm of the head
                want = v.copy()  # dims >= R unchanged
                for i in range(R // 2):
                    angle = t * base ** (-2.0 * i / R)
                    want[i] = v[i] * np.cos(angle) - v[i + R // 2] * np.sin(angle)
                    want[i + R // 2] = v[i + R // 2] * np.cos(angle) + v[i] * np.sin(angle)
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    def test_grouped_heads_equal_mha_with_repeated_key_value_heads(self):
        gqa = nl.spec_from_json(layer_json(**COMBINATIONS["llama_gqa"]))
        mha = gqa._replace(kv_heads=gqa.heads)
        P, x, _ = random_problem(gqa)
        d, a, g = 4, 4, 2
        w = P["qkv.weight"].reshape(a + 2 * g, d, -1)
        kv_of_head = [j // (a // g) for j in range(a)]
        Pm = dict(P, **{"qkv.weight": np.concatenate([w[:a], w[a:a + g][kv_of_head], w[a + g:][kv_of_head]])
                        .reshape(-1, gqa.hidden)})
        np.testing.assert_allclose(nl.forward(gqa, P, x), nl.forward(mha, Pm, x), rtol=1e-12, atol=1e-12)

    def test_activations(self):
        for activation, f1, want in [
                ("gelu", np.array([1.0, -2.0]), [0.8411919906082768, -0.04540230591222708]),
                ("squared_relu", np.array([3.0, -2.0]), [9.0, 0.0]),
                ("swiglu", np.array([2.0, 3.0]), [3.0 * 2.0 / (1.0 + np.exp(-2.0))])]:
            spec = nl.spec_from_json(layer_json(activation=activation))
            np.testing.assert_allclose(nl.activation_fwd(spec, f1), want, rtol=1e-12)

    def test_mla_parameters_are_the_contracts_in_its_order(self):
        # docs/layer_run.md's list, numbers written out: h 8, a 2, L_q 5, L_kv 4, d_n 3, d_r 2, d_v 2
        latent = nl.spec_from_json(layer_json(**COMBINATIONS["mla_q_latent_layernorm_dropout"]))
        self.assertEqual(list(nl.param_shapes(latent).items()), [
            ("ln1.weight", (8,)), ("ln1.bias", (8,)), ("q_down.weight", (5, 8)), ("q_latent_norm.weight", (5,)),
            ("q_latent_norm.bias", (5,)), ("q_up.weight", (10, 5)), ("kv_down.weight", (6, 8)),
            ("kv_latent_norm.weight", (4,)), ("kv_latent_norm.bias", (4,)), ("kv_up.weight", (10, 4)),
            ("proj.weight", (8, 4)), ("ln2.weight", (8,)), ("ln2.bias", (8,)), ("fc1.weight", (12, 8)),
            ("fc2.weight", (8, 12))])
        # RMSNorm, L_q 0: h 8, a 1, L_kv 3, d_n 2, d_r 4, d_v 5, SwiGLU F 12
        projected = nl.spec_from_json(layer_json(**COMBINATIONS["mla_q_projected_rms_one_head"]))
        self.assertEqual(list(nl.param_shapes(projected).items()), [
            ("ln1.weight", (8,)), ("q_proj.weight", (6, 8)), ("kv_down.weight", (7, 8)),
            ("kv_latent_norm.weight", (3,)), ("kv_up.weight", (7, 3)), ("proj.weight", (8, 5)),
            ("ln2.weight", (8,)), ("fc1.weight", (24, 8)), ("fc2.weight", (8, 12))])

    def test_mla_kv_channels_is_irrelevant(self):
        base = layer_json(**dict(COMBINATIONS["mla_q_projected_rms_one_head"], hidden=10, heads=3, kv_heads=3))
        shapes = nl.param_shapes(nl.spec_from_json(base))  # h 10 is no multiple of a 3: no d = h/a needed
        for kv_channels in [0, 7]:  # layer_run writes h // a, 0 when h < a
            spec = nl.spec_from_json(dict(base, kv_channels=kv_channels))
            self.assertEqual(nl.param_shapes(spec), shapes)

    def test_mla_q_k_v_and_context_are_the_contracts(self):
        # each head's q, k, v row by row from the parameters, then scores as nope · nope + rope · rope
        for name, options in [("mla_q_latent_layernorm_dropout", dict(rotary_percent=0.5, rotary_base=100.0)),
                              ("mla_q_projected_rms_one_head", {}), ("mla_three_heads_moe", {})]:
            with self.subTest(name):
                spec = nl.spec_from_json(layer_json(**dict(COMBINATIONS[name], **options)))
                P, x, _ = random_problem(spec)
                drop = nl.dropout_scales(spec)
                _, cache = nl.layer_fwd(spec, P, x, drop)
                self.check_mla_heads(spec, P, cache, drop)

    def check_mla_heads(self, spec, P, cache, drop):
        m, (Lq, Lkv, dn, dr, dv) = cache["mla"], [spec.mla[k] for k in nl.MLA_KEYS]
        np.testing.assert_array_equal(m["k"][..., dn:], np.repeat(m["k"][:, :1, :, dn:], spec.heads, 1))
        for bi in range(spec.batch):
            for j in range(spec.heads):
                q, k, v = (np.array(t) for t in zip(*[mla_head_by_definition(spec, P, cache["n1"][t, bi], j, t)
                                                      for t in range(spec.seq)]))
                for got, want in [(m["q"][bi, j], q), (m["k"][bi, j], k), (m["v"][bi, j], v)]:
                    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
                scores = (q[:, :dn] @ k[:, :dn].T + q[:, dn:] @ k[:, dn:].T) / np.sqrt(dn + dr)
                scores[np.triu_indices(spec.seq, 1)] = -np.inf
                probs = np.exp(scores - scores.max(1, keepdims=True))
                probs /= probs.sum(1, keepdims=True)
                mask = drop.attn_probs[bi, j] if spec.attention_dropout else 1.0
                np.testing.assert_allclose(cache["ctx"][:, bi, j * dv:(j + 1) * dv], (probs * mask) @ v,
                                           rtol=1e-12, atol=1e-12)

    def test_attention_is_causal_and_dropout_reaches_the_output(self):
        spec = nl.spec_from_json(layer_json(**COMBINATIONS["gpt_dropout"]))
        P, x, _ = random_problem(spec)
        _, cache = nl.layer_fwd(spec, P, x, nl.dropout_scales(spec))
        self.assertEqual(float(np.abs(np.triu(cache["probs"], 1)).max()), 0.0)
        np.testing.assert_allclose(cache["probs"].sum(-1), 1.0, rtol=1e-12)
        self.assertFalse(np.allclose(nl.forward(spec, P, x), nl.forward(spec._replace(hidden_dropout=0.0), P, x)))
        self.assertFalse(np.allclose(nl.forward(spec, P, x), nl.forward(spec._replace(attention_dropout=0.0), P, x)))


@unittest.skipUnless(nl, "numpy missing: run with /usr/bin/python3")
class CheckerTest(unittest.TestCase):
    """check() and the CLI on dumps written here from the reference itself (float32 files)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="numpy_layer_")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write_dump(self, options, name="dump"):
        dump = os.path.join(self.tmp, name)
        os.makedirs(dump)
        meta = layer_json(**options)
        spec = nl.spec_from_json(meta)
        P, x, dy = random_problem(spec, seed=5)
        y, dx, G = nl.layer(spec, P, x, dy)
        tensors = dict(P, x=x, y=y, dy=dy, dx=dx, **{"grad." + n: g for n, g in G.items()})
        if spec.moe:  # the routing decision the dump holds too
            tensors.update(nl.routing_of(nl.layer_fwd(spec, P, x, nl.dropout_scales(spec))[1]))
        for n, t in tensors.items():
            np.save(os.path.join(dump, n + ".npy"), t.astype(np.float32))
        self.write_json(dump, meta)
        return dump

    def write_json(self, dump, meta):
        with open(os.path.join(dump, "layer.json"), "w") as f:
            json.dump(meta, f)

    def run_tool(self, *args):
        return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=120)

    def assert_one_error(self, r, *words):
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("numpy_layer.py: error: "), lines[0])
        for w in words:
            self.assertIn(w, lines[0])

    def test_a_matching_dump_passes_and_a_perturbed_gradient_fails(self):
        dump = self.write_dump(COMBINATIONS["everything"])
        names = [r[0] for r in nl.check(dump)]
        self.assertEqual(names, ["y", "dx"] + ["grad." + n for n in nl.param_shapes(nl.spec_from_json(
            layer_json(**COMBINATIONS["everything"])))])
        r = self.run_tool(dump)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len(r.stdout.splitlines()), len(names) + 1)
        self.assertIn("%d passed, 0 failed" % len(names), r.stdout)
        g = np.load(os.path.join(dump, "grad.k_norm.weight.npy"))
        g[1] += 1e-2 * np.abs(g).max()
        np.save(os.path.join(dump, "grad.k_norm.weight.npy"), g)
        self.assertEqual([r[0] for r in nl.check(dump) if not r[3]], ["grad.k_norm.weight"])
        r = self.run_tool(dump)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("grad.k_norm.weight", [l.split()[0] for l in r.stdout.splitlines() if l.endswith("WRONG")])

    def test_an_mla_dump_is_checked_tensor_by_tensor(self):
        for name, wrong in [("mla_q_latent_layernorm_dropout", "grad.q_latent_norm.bias"),
                            ("mla_three_heads_moe", "grad.kv_down.weight")]:
            with self.subTest(name):
                dump = self.write_dump(COMBINATIONS[name], name)
                results = nl.check(dump)
                grads = ["grad." + n for n in nl.param_shapes(nl.spec_from_json(layer_json(**COMBINATIONS[name])))]
                self.assertEqual([r[0] for r in results][:2 + len(grads)], ["y", "dx"] + grads)
                self.assertTrue(all(r[3] for r in results), results)
                g = np.load(os.path.join(dump, wrong + ".npy"))
                g[-1] += 1e-2 * np.abs(g).max()
                np.save(os.path.join(dump, wrong + ".npy"), g)
                self.assertEqual([r[0] for r in nl.check(dump) if not r[3]], [wrong])
                self.assertEqual(self.run_tool(dump).returncode, 1)

    def test_dropout_options_change_the_verdict(self):
        dump = self.write_dump(COMBINATIONS["gpt_dropout"])
        self.assertTrue(all(r[3] for r in nl.check(dump)))
        for key, value in [("hidden_dropout", 0.0), ("attention_dropout", 0.0), ("seed", 100)]:
            with self.subTest(key):
                self.write_json(dump, layer_json(**dict(COMBINATIONS["gpt_dropout"], **{key: value})))
                self.assertIn("y", [r[0] for r in nl.check(dump) if not r[3]])

    def test_every_missing_key_is_one_line_naming_it(self):
        dump = self.write_dump({})
        for key in layer_json():
            with self.subTest(key):
                meta = layer_json()
                del meta[key]
                self.write_json(dump, meta)
                self.assert_one_error(self.run_tool(dump), "missing key '%s'" % key, "layer.json")

    def test_an_old_dump_is_refused_with_one_line(self):
        dump = self.write_dump({})
        self.write_json(dump, {"seq": 5, "batch": 2, "hidden": 8, "heads": 2, "tp": 1, "config": "baseline",
                               "attention": "unfused", "dtype": "fp32", "dropout": 0.0, "seed": 1234, "arch": "gpt",
                               "ln_eps": 1e-05, "gelu": "tanh"})
        self.assert_one_error(self.run_tool(dump), "missing key 'recompute_modules'")

    def test_bad_values_are_one_line(self):
        dump = self.write_dump({})
        for options, words in [({"normalization": "layernorm"}, ["'normalization'", '"layernorm"']),
                               ({"qk_layernorm": 1}, ["'qk_layernorm'"]),
                               ({"seq": 0}, ["'seq'"]), ({"hidden_dropout": 1.0}, ["'hidden_dropout'"]),
                               ({"kv_heads": 3}, ["heads 2 is not a multiple of kv_heads 3"]),
                               ({"hidden": 9}, ["hidden 9 is not a multiple of heads 2"]),
                               ({"kv_channels": 0}, ["'kv_channels'"]), ({"kv_channels": 2.5}, ["'kv_channels'"]),
                               ({"hidden": 12, "heads": 2, "position_embedding": "rope", "rotary_percent": 0.5},
                                ["odd number of rotary dims"]),
                               ({"ffn_hidden": 13}, ["fc1.weight.npy", "shape (12, 8)", "(13, 8)"]),
                               # multi-latent attention: its widths, and what the layer builds it with
                               (dict(MLA_OK, mla=dict(MLA_WIDTHS, kv_lora_rank=0)), ["'kv_lora_rank'"]),
                               (dict(MLA_OK, mla={"q_lora_rank": 0}), ["'mla' lacks"]),
                               (dict(MLA_OK, mla=dict(MLA_WIDTHS, qk_pos_emb_head_dim=3)), ["odd"]),
                               (dict(MLA_OK, kv_heads=1), ["'kv_heads' must be 2 with 'mla'"]),
                               (dict(MLA_OK, qk_layernorm=True), ["'qk_layernorm'"]),
                               (dict(MLA_OK, add_bias_linear=True), ["'add_bias_linear'"]),
                               (dict(MLA_OK, add_qkv_bias=True), ["'add_qkv_bias' must be false with 'mla'"]),
                               (dict(MLA_OK, mla=3), ["'mla' has the unusable value 3"]),
                               (dict(MLA_OK, position_embedding="none"), ["'position_embedding'"])]:
            with self.subTest(options):
                self.write_json(dump, layer_json(**options))
                self.assert_one_error(self.run_tool(dump), *words)
        with open(os.path.join(dump, "layer.json"), "w") as f:
            f.write("{not json")
        self.assert_one_error(self.run_tool(dump), "layer.json", "not JSON")

    def test_unusable_files_and_options_are_one_line(self):
        dump = self.write_dump({})
        self.assert_one_error(self.run_tool(os.path.join(self.tmp, "absent")), "layer.json")
        self.assert_one_error(self.run_tool(dump, "--rtol", "nan"), "--rtol")
        os.remove(os.path.join(dump, "dy.npy"))
        os.makedirs(os.path.join(dump, "dy.npy"))  # a folder where a tensor goes
        self.assert_one_error(self.run_tool(dump), "dy.npy", "folder")
        shutil.rmtree(os.path.join(dump, "dy.npy"))
        with open(os.path.join(dump, "dy.npy"), "wb") as f:
            f.write(b"\x93NUMPY truncated")
        self.assert_one_error(self.run_tool(dump), "dy.npy")


if __name__ == "__main__":
    unittest.main()
