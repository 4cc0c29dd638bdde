#!/usr/bin/env python3
"""Float64 NumPy reference of the actbench layer, checked against a `layer_run --dump` folder.

    python3 tools/numpy_layer.py DUMP_DIR [--rtol 1e-4]

Recomputes y, dx and every parameter gradient from the dumped x, dy and parameters and
compares. The layer is the one layer.json describes, any combination of its options: pre-norm
(LayerNorm or RMSNorm), optional QK-norm, grouped-query causal attention of any head size
(kv_channels) with optional rotate-half RoPE, GeLU (tanh) / SwiGLU / squared-ReLU MLP,
optional biases, and dropout on the attention probabilities and on both block outputs with
the masks of runtime/philox.hpp reproduced here; or, when layer.json has "moe", the MoE block
of tools/numpy_moe.py in place of the MLP (router, routing, dispatch, the experts, the
weighted combine, shared experts), whose routing decision is compared too; when it has "mla",
multi-latent attention (tools/numpy_mla.py: latents, their norms, up projections, decoupled
RoPE) in place of the QKV projection and the QK-norm. Exit status 0 when every tensor matches,
1 otherwise (one line per tensor either way); 2 with one error line when the folder or --rtol
is unusable.

Functions for tests: spec_from_json, param_shapes, dropout_scales, forward, layer, check,
philox4x32_10, philox_words, dropout_threshold.
"""
import argparse
import io
import json
import math
import os
import sys
from collections import namedtuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runners"))
from user_files import UserFileError, read_bytes, read_text  # noqa: E402

try:
    import numpy as np
except ImportError:  # the first python3 on PATH may not be Debian's
    sys.exit("numpy_layer.py: error: numpy is missing; run it with /usr/bin/python3 (python3-numpy)")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_mla  # noqa: E402
import numpy_moe  # noqa: E402


# ---- the layer's description (layer.json) ---------------------------------------------------

def _natural(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _real(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _choice(*names):
    return lambda v: v in names


# Every key layer.json must hold, with the test its value must pass (what the layer computes
# reads only these; "arch" of older dumps and anything else is ignored).
LAYER_KEYS = {
    "seq": _natural, "batch": _natural, "hidden": _natural, "heads": _natural, "tp": _natural,
    "config": lambda v: isinstance(v, str), "attention": _choice("unfused", "fused"),
    "dtype": lambda v: isinstance(v, str),
    "seed": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 64,
    "recompute_modules": lambda v: isinstance(v, str),
    "normalization": _choice("LayerNorm", "RMSNorm"), "norm_epsilon": lambda v: _real(v) and v > 0,
    "qk_layernorm": lambda v: isinstance(v, bool), "activation": _choice("gelu", "swiglu", "squared_relu"),
    "ffn_hidden": _natural, "add_bias_linear": lambda v: isinstance(v, bool),
    "add_qkv_bias": lambda v: isinstance(v, bool), "kv_heads": _natural,
    "position_embedding": _choice("rope", "none"), "rotary_percent": lambda v: _real(v) and 0 < v <= 1,
    "rotary_base": lambda v: _real(v) and v > 0,
    "attention_dropout": lambda v: _real(v) and 0 <= v < 1, "hidden_dropout": lambda v: _real(v) and 0 <= v < 1,
}

# Keys a dump made before them lacks, with their meaning then: kv_channels (d, each head's size)
# was hidden / heads.
OPTIONAL_KEYS = {"kv_channels": _natural, "moe": lambda v: v is None or isinstance(v, dict),
                 "mla": lambda v: v is None or isinstance(v, dict)}
MLA_KEYS = ["q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"]
MOE_KEYS = ["num_experts", "top_k", "ffn_hidden", "shared_ffn_hidden", "score", "normalize", "scaling",
            "num_groups", "group_top_k", "expert_bias", "capacity_factor"]

LayerSpec = namedtuple("LayerSpec", list(LAYER_KEYS) + list(OPTIONAL_KEYS))


def spec_from_json(meta, where="layer.json"):
    """A LayerSpec from layer.json's object; ValueError naming the first missing or bad key."""
    if not isinstance(meta, dict):
        raise ValueError("%s: not a JSON object" % where)
    for key, valid in LAYER_KEYS.items():
        if key not in meta:
            raise ValueError("%s: missing key %r" % (where, key))
        if not valid(meta[key]):
            raise ValueError("%s: %r has the unusable value %s" % (where, key, json.dumps(meta[key])))
    mla = meta.get("mla")
    ignored = {"kv_channels"} if isinstance(mla, dict) else set()  # MLA's head sizes are its own
    for key, valid in OPTIONAL_KEYS.items():
        if key in meta and key not in ignored and not valid(meta[key]):
            raise ValueError("%s: %r has the unusable value %s" % (where, key, json.dumps(meta[key])))
    if "kv_channels" not in meta and not ignored and meta["hidden"] % meta["heads"]:
        raise ValueError("%s: hidden %d is not a multiple of heads %d" % (where, meta["hidden"], meta["heads"]))
    moe = meta.get("moe")
    if moe is not None:
        missing = [key for key in MOE_KEYS if key not in moe]
        if missing:
            raise ValueError("%s: 'moe' lacks %r" % (where, missing[0]))
    if mla is not None:
        check_mla(meta, mla, where)
    d = None if ignored else meta.get("kv_channels", meta["hidden"] // meta["heads"])
    spec = LayerSpec(**{key: meta[key] for key in LAYER_KEYS}, kv_channels=d, moe=moe, mla=mla)
    d = head_dim(spec)
    if spec.heads % spec.kv_heads:
        raise ValueError("%s: heads %d is not a multiple of kv_heads %d" % (where, spec.heads, spec.kv_heads))
    if spec.position_embedding == "rope" and not spec.mla and rotary_dims(spec) % 2:
        raise ValueError("%s: rotary_percent %g of head size %d gives an odd number of rotary dims"
                         % (where, spec.rotary_percent, d))
    return spec


def check_mla(meta, mla, where):
    """layer.json's "mla" as the layer builds it: every width a whole number (L_q may be 0, d_r
    even), RoPE on, every head its own k and v, no q/k norm and no biases; ValueError otherwise."""
    for key in MLA_KEYS:
        if key not in mla:
            raise ValueError("%s: 'mla' lacks %r" % (where, key))
        low = 0 if key == "q_lora_rank" else 1
        if not (isinstance(mla[key], int) and not isinstance(mla[key], bool) and mla[key] >= low):
            raise ValueError("%s: 'mla' %r has the unusable value %s" % (where, key, json.dumps(mla[key])))
    if mla["qk_pos_emb_head_dim"] % 2:
        raise ValueError("%s: 'mla' qk_pos_emb_head_dim %d is odd (RoPE turns pairs)" % (where, mla["qk_pos_emb_head_dim"]))
    rules = {"position_embedding": "rope", "kv_heads": meta["heads"], "qk_layernorm": False, "add_bias_linear": False,
             "add_qkv_bias": False}
    for key, value in rules.items():
        if meta[key] != value:
            raise ValueError("%s: %r must be %s with 'mla', got %s" % (where, key, json.dumps(value), json.dumps(meta[key])))


def head_dim(spec):
    """d, each head's size: QKV has (a + 2g)·d outputs, the projection a·d inputs (a·d need not be h);
    None with MLA, whose widths are its own."""
    return spec.kv_channels


def rotary_dims(spec):
    """R, the leading dims of each head that RoPE rotates (0 without RoPE); with MLA all d_r dims
    of the RoPE part (numpy_mla puts them first when it rotates)."""
    if spec.mla:
        return int(spec.mla["qk_pos_emb_head_dim"])
    return int(head_dim(spec) * spec.rotary_percent) if spec.position_embedding == "rope" else 0


def param_shapes(spec):
    """The canonical parameters this layer has, in dump order: name -> shape."""
    h, a, g, d, F = spec.hidden, spec.heads, spec.kv_heads, head_dim(spec), spec.ffn_hidden
    layernorm = spec.normalization == "LayerNorm"
    fc1_rows = 2 * F if spec.activation == "swiglu" else F
    shapes = [("ln1.weight", (h,), True), ("ln1.bias", (h,), layernorm)]
    if spec.mla:
        shapes += numpy_mla.param_shapes(spec.mla, h, a, layernorm)
        d_out = int(spec.mla["v_head_dim"])  # each head's width into the projection
    else:
        shapes += [("qkv.weight", ((a + 2 * g) * d, h), True),
                   ("qkv.bias", ((a + 2 * g) * d,), spec.add_bias_linear or spec.add_qkv_bias)]
        for norm in ["q_norm", "k_norm"]:
            shapes += [(norm + ".weight", (d,), spec.qk_layernorm),
                       (norm + ".bias", (d,), spec.qk_layernorm and layernorm)]
        d_out = d
    shapes += [("proj.weight", (h, a * d_out), True), ("proj.bias", (h,), spec.add_bias_linear),
               ("ln2.weight", (h,), True), ("ln2.bias", (h,), layernorm)]
    if spec.moe:
        m, gated = spec.moe, 2 if spec.activation == "swiglu" else 1
        E, Fe, Fs = int(m["num_experts"]), int(m["ffn_hidden"]), int(m["shared_ffn_hidden"])
        shapes += [("router.weight", (E, h), True), ("router.bias", (E,), m["expert_bias"]),
                   ("experts.fc1.weight", (E, h, gated * Fe), True), ("experts.fc2.weight", (E, Fe, h), True),
                   ("shared.fc1.weight", (gated * Fs, h), Fs > 0), ("shared.fc2.weight", (h, Fs), Fs > 0)]
    else:
        shapes += [("fc1.weight", (fc1_rows, h), True), ("fc1.bias", (fc1_rows,), spec.add_bias_linear),
                   ("fc2.weight", (h, F), True), ("fc2.bias", (h,), spec.add_bias_linear)]
    return {name: shape for name, shape, present in shapes if present}


# ---- dropout masks: Philox4x32-10 (Salmon et al., SC'11) as runtime/philox.hpp keys it ----

MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57    # round multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85    # key schedule (Weyl) increments
SITE_ATTN_PROBS, SITE_ATTN_OUT, SITE_MLP_OUT = 0, 1, 2  # stream ids of the three dropout sites
LAYER_INDEX = 0  # a dump holds one layer, the stack's first


def philox4x32_10(counter, key):
    """Ten Philox rounds on counters given as four arrays of 32-bit words (any integer dtype) under
    key (k0, k1); returns the four output words as uint32 arrays. Products of two 32-bit words fit
    a uint64 exactly, so hi and lo halves come from a shift and a mask."""
    c0, c1, c2, c3 = (np.asarray(w).astype(np.uint64) for w in counter)
    k0, k1 = key
    for _ in range(10):
        p0, p1 = np.uint64(PHILOX_M0) * c0, np.uint64(PHILOX_M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & np.uint64(MASK32),
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & np.uint64(MASK32))
        k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def philox_words(seed, layer, stream, index):
    """The random word of each element `index` (a uint64 array) of stream (seed, layer, stream):
    word index % 4 of the Philox output at counter {lo32(index/4), hi32(index/4), layer, stream}
    under key {lo32(seed), hi32(seed)}, as runtime/philox.hpp's philox_word."""
    index = np.asarray(index, dtype=np.uint64)
    block = index >> np.uint64(2)
    counter = (block & np.uint64(MASK32), block >> np.uint64(32),
               np.full_like(block, layer), np.full_like(block, stream))
    out = np.stack(philox4x32_10(counter, (seed & MASK32, seed >> 32)), axis=-1)
    return np.take_along_axis(out, (index & np.uint64(3)).astype(np.intp)[..., None], axis=-1)[..., 0]


def dropout_threshold(p):
    """An element is kept iff its word >= this: float32(p) * 2^32 in double, truncated."""
    t = float(np.float32(p)) * 4294967296.0
    return MASK32 if t >= float(MASK32) else int(t)


def dropout_scale(p, seed, stream, shape):
    """keep / (1 - p) over the canonical tensor of `shape` (flat index = element index), or 1.0 for p = 0."""
    if p == 0:
        return 1.0
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    keep = philox_words(seed, LAYER_INDEX, stream, index) >= dropout_threshold(p)
    return keep.reshape(shape) / (1.0 - float(np.float32(p)))


Dropout = namedtuple("Dropout", "attn_probs attn_out mlp_out")


def dropout_scales(spec):
    """The three masks (already scaled) the layer of `spec` applies; fixed by the seed."""
    s, b, h, a = spec.seq, spec.batch, spec.hidden, spec.heads
    return Dropout(dropout_scale(spec.attention_dropout, spec.seed, SITE_ATTN_PROBS, (b, a, s, s)),
                   dropout_scale(spec.hidden_dropout, spec.seed, SITE_ATTN_OUT, (s, b, h)),
                   dropout_scale(spec.hidden_dropout, spec.seed, SITE_MLP_OUT, (s, b, h)))


# ---- pieces: each forward returns what its backward needs ------------------------------------

def linear(x, P, name):
    y = x @ P[name + ".weight"].T
    return y + P[name + ".bias"] if name + ".bias" in P else y


def linear_bwd(dy, x, P, name, G):
    """dx; writes the weight's (and bias's) gradient into G."""
    flat = lambda t: t.reshape(-1, t.shape[-1])
    G[name + ".weight"] = flat(dy).T @ flat(x)
    if name + ".bias" in P:
        G[name + ".bias"] = flat(dy).sum(0)
    return dy @ P[name + ".weight"]


def norm_fwd(spec, x, P, name):
    """LayerNorm or RMSNorm over the last axis with weight (and bias) `name`; (out, (xhat, rstd))."""
    if spec.normalization == "LayerNorm":
        x = x - x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + spec.norm_epsilon)
    xhat = x * rstd
    out = xhat * P[name + ".weight"]
    return (out + P[name + ".bias"] if name + ".bias" in P else out), (xhat, rstd)


def norm_bwd(spec, dy, P, name, cache, G):
    xhat, rstd = cache
    w = P[name + ".weight"]
    g = dy * w
    dx = g - xhat * (g * xhat).mean(-1, keepdims=True)
    if spec.normalization == "LayerNorm":
        dx -= g.mean(-1, keepdims=True)
    G[name + ".weight"] = (dy * xhat).reshape(-1, w.size).sum(0)
    if name + ".bias" in P:
        G[name + ".bias"] = dy.reshape(-1, w.size).sum(0)
    return rstd * dx


def rope_tables(spec):
    """cos, sin [s, R/2]: angle = position * rotary_base^(-2i/R), positions 0..s-1."""
    R = rotary_dims(spec)
    inv_freq = float(spec.rotary_base) ** (-2.0 * np.arange(R // 2) / R) if R else np.zeros(0)
    angle = np.arange(spec.seq)[:, None] * inv_freq[None, :]
    return np.cos(angle), np.sin(angle)


def rotate(t, cos, sin):
    """Rotate-half on the first R = 2·cos.shape[-1] dims of t [..., s, d]: pairs (i, i + R/2)
    turned by their position's angle; dims >= R unchanged. With -sin, the inverse (backward)."""
    half = cos.shape[-1]
    lo, hi, rest = t[..., :half], t[..., half:2 * half], t[..., 2 * half:]
    return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin, rest], axis=-1)


C = math.sqrt(2.0 / math.pi)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def activation_fwd(spec, f1):
    if spec.activation == "gelu":  # tanh approximation
        return 0.5 * f1 * (1.0 + np.tanh(C * (f1 + 0.044715 * f1 ** 3)))
    if spec.activation == "squared_relu":
        return np.maximum(f1, 0.0) ** 2
    gate, up = np.split(f1, 2, axis=-1)  # swiglu: fc1 is gate; up
    return gate * sigmoid(gate) * up


def activation_bwd(spec, dact, f1):
    if spec.activation == "gelu":
        t = np.tanh(C * (f1 + 0.044715 * f1 ** 3))
        return dact * (0.5 * (1.0 + t) + 0.5 * f1 * (1.0 - t * t) * C * (1.0 + 3 * 0.044715 * f1 * f1))
    if spec.activation == "squared_relu":
        return dact * 2.0 * np.maximum(f1, 0.0)
    gate, up = np.split(f1, 2, axis=-1)
    sg = sigmoid(gate)
    return np.concatenate([dact * up * sg * (1.0 + gate * (1.0 - sg)), dact * gate * sg], axis=-1)


# ---- the layer --------------------------------------------------------------------------------

def _shapes(spec):
    """Reshapes between [s, b, n·d] and heads [b, n, s, d], and GQA's head expansion and its sum."""
    s, b, a, g, d = spec.seq, spec.batch, spec.heads, spec.kv_heads, head_dim(spec)
    r = a // g  # query heads per key/value head: query head j reads kv head j // r
    heads = lambda t, n: t.reshape(s, b, n, d).transpose(1, 2, 0, 3)
    merge = lambda t: t.transpose(2, 0, 1, 3).reshape(s, b, -1)
    expand = lambda t: np.repeat(t, r, axis=1)
    fold = lambda t: t.reshape(b, g, r, s, d).sum(2)
    return heads, merge, expand, fold


def layer_fwd(spec, P, x, drop):
    """y and the intermediates layer_bwd reads (a dict)."""
    a, g, d = spec.heads, spec.kv_heads, head_dim(spec)
    heads, merge, expand, _ = _shapes(spec)
    cos, sin = rope_tables(spec)
    c = {}
    c["n1"], c["ln1"] = norm_fwd(spec, x, P, "ln1")
    if spec.mla:
        c["ctx"] = numpy_mla.attention_fwd(spec, P, c["n1"], c, drop.attn_probs, norm_fwd, rotate, cos, sin)
        return mlp_fwd(spec, P, x + linear(c["ctx"], P, "proj") * drop.attn_out, drop, c)
    qkv = linear(c["n1"], P, "qkv")
    q, k, v = heads(qkv[..., :a * d], a), heads(qkv[..., a * d:(a + g) * d], g), heads(qkv[..., (a + g) * d:], g)
    if spec.qk_layernorm:  # per head, before RoPE
        q, c["q_norm"] = norm_fwd(spec, q, P, "q_norm")
        k, c["k_norm"] = norm_fwd(spec, k, P, "k_norm")
    c["q"], c["k"], c["v"] = rotate(q, cos, sin), expand(rotate(k, cos, sin)), expand(v)
    causal = np.triu(np.ones((spec.seq, spec.seq), dtype=bool), 1)
    scores = np.where(causal, -np.inf, c["q"] @ c["k"].transpose(0, 1, 3, 2) / math.sqrt(d))
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    c["probs"] = probs / probs.sum(-1, keepdims=True)
    c["dropped"] = c["probs"] * drop.attn_probs
    c["ctx"] = merge(c["dropped"] @ c["v"])
    return mlp_fwd(spec, P, x + linear(c["ctx"], P, "proj") * drop.attn_out, drop, c)


def mlp_fwd(spec, P, x1, drop, c):
    """y from the attention block's output x1: norm 2 and the MLP (or the MoE block)."""
    c["n2"], c["ln2"] = norm_fwd(spec, x1, P, "ln2")
    if spec.moe:
        return x1 + moe_fwd(spec, P, c["n2"], c) * drop.mlp_out, c
    c["f1"] = linear(c["n2"], P, "fc1")
    c["act"] = activation_fwd(spec, c["f1"])
    return x1 + linear(c["act"], P, "fc2") * drop.mlp_out, c


# ---- the MoE block in place of the MLP (docs/moe.md) -------------------------------------------

def routing_spec(spec):
    """layer.json's "moe" as tools/numpy_moe.py's functions take it."""
    m = spec.moe
    return {"experts": int(m["num_experts"]), "top_k": int(m["top_k"]), "score": m["score"],
            "normalize": m["normalize"], "scaling": m["scaling"], "num_groups": max(1, int(m["num_groups"])),
            "group_top_k": int(m["group_top_k"]), "capacity_factor": m["capacity_factor"] or None}


def moe_fwd(spec, P, n2, c):
    """The routed experts plus the shared experts on norm 2's output [s, b, h]; the routing and
    what moe_bwd reads go into c."""
    R = routing_spec(spec)
    X = n2.reshape(-1, spec.hidden)
    scores, index, weight, aux = numpy_moe.route(X @ P["router.weight"].T, P.get("router.bias"), R)
    counts, row_slot, slot_row = numpy_moe.dispatch(index, R["experts"], R["capacity_factor"])
    N = int(counts.sum())
    permuted = X[row_slot[:N] // R["top_k"]]
    f1 = numpy_moe.grouped_gemm(permuted, P["experts.fc1.weight"], counts)
    act = activation_fwd(spec, f1)
    f2 = numpy_moe.grouped_gemm(act, P["experts.fc2.weight"], counts)
    kept = slot_row >= 0
    gathered = f2[np.where(kept, slot_row, 0)] * kept[:, :, None]  # [T, k, h], 0 for dropped pairs
    out = np.einsum("tk,tkh->th", weight, gathered)
    c["moe"] = dict(X=X, scores=scores, index=index, weight=weight, aux=aux, counts=counts, row_slot=row_slot,
                    slot_row=slot_row, kept=kept, permuted=permuted, f1=f1, act=act, gathered=gathered)
    if "shared.fc1.weight" in P:
        c["moe"]["shared_f1"] = X @ P["shared.fc1.weight"].T
        c["moe"]["shared_act"] = activation_fwd(spec, c["moe"]["shared_f1"])
        out = out + c["moe"]["shared_act"] @ P["shared.fc2.weight"].T
    return out.reshape(n2.shape)


def moe_bwd(spec, P, d_out, c, G):
    """d of norm 2's output from d of the block's output [s, b, h]; the parameters' gradients into G."""
    R, m = routing_spec(spec), c["moe"]
    D = d_out.reshape(-1, spec.hidden)
    kept, slot_row, counts, k = m["kept"], m["slot_row"], m["counts"], R["top_k"]
    d_gathered = m["weight"][:, :, None] * D[:, None, :] * kept[:, :, None]
    d_weight = np.einsum("tkh,th->tk", m["gathered"], D)
    d_f2 = np.zeros((int(counts.sum()), spec.hidden))
    d_f2[slot_row[kept]] = d_gathered[kept]
    d_act, G["experts.fc2.weight"] = numpy_moe.grouped_gemm_bwd(d_f2, m["act"], P["experts.fc2.weight"], counts)
    d_f1 = activation_bwd(spec, d_act, m["f1"])
    d_perm, G["experts.fc1.weight"] = numpy_moe.grouped_gemm_bwd(d_f1, m["permuted"], P["experts.fc1.weight"], counts)
    dX = np.zeros_like(m["X"])
    np.add.at(dX, m["row_slot"][:len(d_perm)] // k, d_perm)
    d_logits = numpy_moe.route_bwd(d_weight, m["scores"], m["index"], R)
    dX += d_logits @ P["router.weight"]
    G["router.weight"] = d_logits.T @ m["X"]
    if "router.bias" in P:
        G["router.bias"] = np.zeros_like(P["router.bias"])  # a buffer: it only changes the choice
    if "shared.fc1.weight" in P:
        G["shared.fc2.weight"] = D.T @ m["shared_act"]
        d_sf1 = activation_bwd(spec, D @ P["shared.fc2.weight"], m["shared_f1"])
        G["shared.fc1.weight"] = d_sf1.T @ m["X"]
        dX += d_sf1 @ P["shared.fc1.weight"]
    return dX.reshape(d_out.shape)


def routing_of(c):
    """The routing decision layer_fwd made, named as a dump names it (moe.*)."""
    m = c["moe"]
    return {"moe.tokens_per_expert": m["counts"].astype(np.float64), "moe.aux_loss": np.array([m["aux"]]),
            "moe.topk_index": m["index"].astype(np.float64), "moe.topk_weight": m["weight"]}


def layer_bwd(spec, P, dy, drop, c):
    """dx and the gradient of every parameter (a dict) from layer_fwd's intermediates."""
    heads, merge, _, fold = _shapes(spec)
    cos, sin = rope_tables(spec)
    G = {}
    if spec.moe:
        dn2 = moe_bwd(spec, P, dy * drop.mlp_out, c, G)
    else:
        dact = linear_bwd(dy * drop.mlp_out, c["act"], P, "fc2", G)
        dn2 = linear_bwd(activation_bwd(spec, dact, c["f1"]), c["n2"], P, "fc1", G)
    dx1 = dy + norm_bwd(spec, dn2, P, "ln2", c["ln2"], G)
    if spec.mla:
        d_ctx = linear_bwd(dx1 * drop.attn_out, c["ctx"], P, "proj", G)
        dn1 = numpy_mla.attention_bwd(spec, P, d_ctx, c, drop.attn_probs, norm_bwd, rotate, cos, sin, G)
        return dx1 + norm_bwd(spec, dn1, P, "ln1", c["ln1"], G), G
    dctx = heads(linear_bwd(dx1 * drop.attn_out, c["ctx"], P, "proj", G), spec.heads)
    dprobs = (dctx @ c["v"].transpose(0, 1, 3, 2)) * drop.attn_probs
    dv = fold(c["dropped"].transpose(0, 1, 3, 2) @ dctx)
    dscores = c["probs"] * (dprobs - (dprobs * c["probs"]).sum(-1, keepdims=True)) / math.sqrt(head_dim(spec))
    dq = rotate(dscores @ c["k"], cos, -sin)
    dk = rotate(fold(dscores.transpose(0, 1, 3, 2) @ c["q"]), cos, -sin)
    if spec.qk_layernorm:
        dq = norm_bwd(spec, dq, P, "q_norm", c["q_norm"], G)
        dk = norm_bwd(spec, dk, P, "k_norm", c["k_norm"], G)
    dn1 = linear_bwd(np.concatenate([merge(dq), merge(dk), merge(dv)], axis=-1), c["n1"], P, "qkv", G)
    return dx1 + norm_bwd(spec, dn1, P, "ln1", c["ln1"], G), G


def forward(spec, P, x, drop=None):
    """y [s, b, h] of the layer `spec` with parameters P (name -> float64 array) on x [s, b, h]."""
    return layer_fwd(spec, P, x, drop or dropout_scales(spec))[0]


def layer(spec, P, x, dy, drop=None):
    """Forward and backward in float64: (y, dx, G), G maps each parameter name to its gradient."""
    drop = drop or dropout_scales(spec)
    y, cache = layer_fwd(spec, P, x, drop)
    dx, G = layer_bwd(spec, P, dy, drop, cache)
    return y, dx, G


# ---- checking a dump ---------------------------------------------------------------------------

def _load(dump, name, shape):
    path = os.path.join(dump, name + ".npy")
    data = read_bytes(name + ".npy", path)
    try:
        t = np.load(io.BytesIO(data), allow_pickle=False).astype(np.float64)
    except (ValueError, TypeError, EOFError, OSError) as e:
        raise ValueError("%s: not a NumPy array of numbers (%s)" % (path, e))
    if t.shape != tuple(shape):
        raise ValueError("%s: shape %s, but layer.json gives %s" % (path, t.shape, tuple(shape)))
    return t


def check(dump, rtol=1e-4):
    """Returns a list of (name, max_abs_err, scale, ok) for y, dx and grad.<param> of every param."""
    where = os.path.join(dump, "layer.json")
    try:
        meta = json.loads(read_text("layer.json", where))
    except json.JSONDecodeError as e:
        raise ValueError("%s: not JSON (%s)" % (where, e))
    spec = spec_from_json(meta, where)
    shapes = param_shapes(spec)
    act = (spec.seq, spec.batch, spec.hidden)
    P = {name: _load(dump, name, shape) for name, shape in shapes.items()}
    drop = dropout_scales(spec)
    y, cache = layer_fwd(spec, P, _load(dump, "x", act), drop)
    dx, G = layer_bwd(spec, P, _load(dump, "dy", act), drop, cache)
    compared = [("y", y), ("dx", dx)] + [("grad." + n, G[n]) for n in shapes]
    exact = set()
    if spec.moe:  # the routing decision: counts and indices equal or wrong; the rest within rtol
        routing = routing_of(cache)
        exact = {"moe.tokens_per_expert", "moe.topk_index"}
        compared += [(n, routing[n]) for n in ["moe.tokens_per_expert"]]
        # the dump's aux loss (one rank: the layer's; each rank's own under TP is not written)
        # and top-k (forward keeps them unless the moe module or full recompute drops them)
        compared += [(n, routing[n]) for n in ["moe.aux_loss", "moe.topk_index", "moe.topk_weight"]
                     if os.path.exists(os.path.join(dump, n + ".npy"))]
    results = []
    for name, ref in compared:
        got = _load(dump, name, ref.shape)
        err = float(np.max(np.abs(got - ref))) if ref.size else 0.0
        scale = (float(np.max(np.abs(ref))) if ref.size else 0.0) or 1.0
        results.append((name, err, scale, err == 0 if name in exact else err <= rtol * scale + 1e-6))
    return results


def _tolerance(text):
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError("must be a finite number >= 0, got %r" % text)
    return v


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2 (argparse would print the usage too)."""
    def error(self, message):
        self.exit(2, "numpy_layer.py: error: %s\n" % message)


def main():
    ap = OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump")
    ap.add_argument("--rtol", type=_tolerance, default=1e-4, help="tolerance relative to the tensor's largest value")
    args = ap.parse_args()
    try:
        results = check(args.dump, args.rtol)
    except (UserFileError, ValueError) as e:
        print("numpy_layer.py: error: %s" % e, file=sys.stderr)
        return 2
    bad = 0
    for name, err, scale, ok in results:
        print("%-20s max|err| %.3e  max|ref| %.3e  %s" % (name, err, scale, "ok" if ok else "WRONG"))
        bad += not ok
    print("%d passed, %d failed" % (len(results) - bad, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
