#!/usr/bin/env python3
"""Float64 NumPy reference of the actbench layer, checked against a `layer_run --dump` folder.

    python3 tools/numpy_layer.py DUMP_DIR [--rtol 1e-4]

Recomputes y, dx and every parameter gradient from the dumped x, dy and parameters (the
layer of docs/paper.md: pre-LN, causal softmax attention, tanh GeLU, LayerNorm eps 1e-5; or, for a
dump of --arch llama, RMSNorm, grouped-query attention with rotate-half RoPE and SwiGLU, no
biases) and compares. Dropout must be 0 in the dump (masks come from Philox, not reproduced here).
Exit status 0 when every tensor matches, 1 otherwise (one line per tensor either way).
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
except ImportError:  # the first python3 on PATH may not be Debian's
    sys.exit("numpy_layer.py: error: numpy is missing; run it with /usr/bin/python3 (python3-numpy)")


def layernorm_fwd(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    return xhat * w + b, (xhat, rstd)


def layernorm_bwd(dy, w, cache):
    xhat, rstd = cache
    g = dy * w
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).reshape(-1, w.size).sum(0), dy.reshape(-1, w.size).sum(0)


C = np.sqrt(2.0 / np.pi)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(C * (x + 0.044715 * x ** 3)))


def gelu_grad(x):
    u = C * (x + 0.044715 * x ** 3)
    t = np.tanh(u)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C * (1.0 + 3 * 0.044715 * x * x)


def layer(P, x, dy, a, eps):
    """Forward and backward of one layer; P maps parameter names to float64 arrays."""
    s, b, h = x.shape
    d = h // a
    scale = 1.0 / np.sqrt(d)
    heads = lambda t: t.reshape(s, b, a, d).transpose(1, 2, 0, 3)        # [s,b,h] -> [b,a,s,d]
    merge = lambda t: t.transpose(2, 0, 1, 3).reshape(s, b, h)           # [b,a,s,d] -> [s,b,h]
    causal = np.triu(np.ones((s, s), dtype=bool), 1)

    ln1, c1 = layernorm_fwd(x, P["ln1.weight"], P["ln1.bias"], eps)
    qkv = ln1 @ P["qkv.weight"].T + P["qkv.bias"]
    q, k, v = heads(qkv[..., :h]), heads(qkv[..., h:2 * h]), heads(qkv[..., 2 * h:])
    scores = np.where(causal, -np.inf, q @ k.transpose(0, 1, 3, 2) * scale)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = merge(probs @ v)
    x1 = x + ctx @ P["proj.weight"].T + P["proj.bias"]
    ln2, c2 = layernorm_fwd(x1, P["ln2.weight"], P["ln2.bias"], eps)
    f1 = ln2 @ P["fc1.weight"].T + P["fc1.bias"]
    g1 = gelu(f1)
    y = x1 + g1 @ P["fc2.weight"].T + P["fc2.bias"]

    G = {}
    flat = lambda t: t.reshape(-1, t.shape[-1])
    G["fc2.weight"] = flat(dy).T @ flat(g1)
    G["fc2.bias"] = flat(dy).sum(0)
    df1 = (dy @ P["fc2.weight"]) * gelu_grad(f1)
    G["fc1.weight"] = flat(df1).T @ flat(ln2)
    G["fc1.bias"] = flat(df1).sum(0)
    dln2, G["ln2.weight"], G["ln2.bias"] = layernorm_bwd(df1 @ P["fc1.weight"], P["ln2.weight"], c2)
    dx1 = dy + dln2
    G["proj.weight"] = flat(dx1).T @ flat(ctx)
    G["proj.bias"] = flat(dx1).sum(0)
    dctx = heads(dx1 @ P["proj.weight"])
    dprobs = dctx @ v.transpose(0, 1, 3, 2)
    dv = probs.transpose(0, 1, 3, 2) @ dctx
    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))
    dq = dscores @ k * scale
    dk = dscores.transpose(0, 1, 3, 2) @ q * scale
    dqkv = np.concatenate([merge(dq), merge(dk), merge(dv)], axis=-1)
    G["qkv.weight"] = flat(dqkv).T @ flat(ln1)
    G["qkv.bias"] = flat(dqkv).sum(0)
    dln1, G["ln1.weight"], G["ln1.bias"] = layernorm_bwd(dqkv @ P["qkv.weight"], P["ln1.weight"], c1)
    return y, dx1 + dln1, G


def rmsnorm_fwd(x, w, eps):
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * rstd * w, (x * rstd, rstd)


def rmsnorm_bwd(dy, w, cache):
    xhat, rstd = cache
    g = dy * w
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).reshape(-1, w.size).sum(0)


def rope_tables(s, d, theta):
    """cos, sin [s, d/2]: angle = position * theta^(-2i/d), positions 0..s-1."""
    inv_freq = theta ** (-2.0 * np.arange(d // 2) / d)
    angle = np.arange(s)[:, None] * inv_freq[None, :]
    return np.cos(angle), np.sin(angle)


def rope(t, cos, sin):
    """Rotate-half: pairs (i, i + d/2) of t [..., s, d] rotated by the angle of their position."""
    half = t.shape[-1] // 2
    lo, hi = t[..., :half], t[..., half:]
    return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def llama_layer(P, x, dy, a, g, F, eps, theta):
    """The llama family: GQA (a query heads, g key/value heads, head j reads group j // (a/g)),
    RoPE on q and k, SwiGLU; forward and backward in float64."""
    s, b, h = x.shape
    d = h // a
    r = a // g
    scale = 1.0 / np.sqrt(d)
    heads = lambda t, n: t.reshape(s, b, n, d).transpose(1, 2, 0, 3)     # [s,b,n*d] -> [b,n,s,d]
    merge = lambda t: t.transpose(2, 0, 1, 3).reshape(s, b, -1)          # [b,n,s,d] -> [s,b,n*d]
    expand = lambda t: np.repeat(t, r, axis=1)                           # [b,g,s,d] -> [b,a,s,d]
    fold = lambda t: t.reshape(b, g, r, s, d).sum(2)                     # gradient of expand
    causal = np.triu(np.ones((s, s), dtype=bool), 1)
    cos, sin = rope_tables(s, d, theta)

    n1, c1 = rmsnorm_fwd(x, P["ln1.weight"], eps)
    qkv = n1 @ P["qkv.weight"].T
    q_raw, k_raw = heads(qkv[..., :a * d], a), heads(qkv[..., a * d:(a + g) * d], g)
    v = heads(qkv[..., (a + g) * d:], g)
    q, k = rope(q_raw, cos, sin), rope(k_raw, cos, sin)
    ke, ve = expand(k), expand(v)
    scores = np.where(causal, -np.inf, q @ ke.transpose(0, 1, 3, 2) * scale)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = merge(probs @ ve)
    x1 = x + ctx @ P["proj.weight"].T
    n2, c2 = rmsnorm_fwd(x1, P["ln2.weight"], eps)
    f1 = n2 @ P["fc1.weight"].T
    gate, up = f1[..., :F], f1[..., F:]
    act = gate * sigmoid(gate) * up
    y = x1 + act @ P["fc2.weight"].T

    G = {}
    flat = lambda t: t.reshape(-1, t.shape[-1])
    G["fc2.weight"] = flat(dy).T @ flat(act)
    dact = dy @ P["fc2.weight"]
    sg = sigmoid(gate)
    df1 = np.concatenate([dact * up * sg * (1 + gate * (1 - sg)), dact * gate * sg], axis=-1)
    G["fc1.weight"] = flat(df1).T @ flat(n2)
    dn2, G["ln2.weight"] = rmsnorm_bwd(df1 @ P["fc1.weight"], P["ln2.weight"], c2)
    dx1 = dy + dn2
    G["proj.weight"] = flat(dx1).T @ flat(ctx)
    dctx = heads(dx1 @ P["proj.weight"], a)
    dprobs = dctx @ ve.transpose(0, 1, 3, 2)
    dv = fold(probs.transpose(0, 1, 3, 2) @ dctx)
    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))
    dq = dscores @ ke * scale
    dk = fold(dscores.transpose(0, 1, 3, 2) @ q * scale)
    dq, dk = rope(dq, cos, -sin), rope(dk, cos, -sin)                   # the inverse rotation
    dqkv = np.concatenate([merge(dq), merge(dk), merge(dv)], axis=-1)
    G["qkv.weight"] = flat(dqkv).T @ flat(n1)
    dn1, G["ln1.weight"] = rmsnorm_bwd(dqkv @ P["qkv.weight"], P["ln1.weight"], c1)
    return y, dx1 + dn1, G


LLAMA_PARAMS = ["ln1.weight", "qkv.weight", "proj.weight", "ln2.weight", "fc1.weight", "fc2.weight"]


PARAMS = ["ln1.weight", "ln1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
          "ln2.weight", "ln2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def check(dump, rtol=1e-4):
    """Returns a list of (name, max_abs_err, scale, ok)."""
    with open(os.path.join(dump, "layer.json")) as f:
        meta = json.load(f)
    if meta["dropout"] != 0:
        raise ValueError("the dump has dropout %g; the NumPy reference needs --dropout 0" % meta["dropout"])
    load = lambda n: np.load(os.path.join(dump, n + ".npy")).astype(np.float64)
    if meta.get("arch", "gpt") == "llama":
        names = LLAMA_PARAMS
        P = {n: load(n) for n in names}
        y, dx, G = llama_layer(P, load("x"), load("dy"), meta["heads"], meta["kv_heads"], meta["ffn_hidden"],
                               meta["norm_eps"], meta["rope_theta"])
    else:
        names = PARAMS
        P = {n: load(n) for n in names}
        y, dx, G = layer(P, load("x"), load("dy"), meta["heads"], meta["ln_eps"])
    results = []
    for name, ref in [("y", y), ("dx", dx)] + [("grad." + n, G[n]) for n in names]:
        got = load(name)
        err = float(np.max(np.abs(got - ref))) if got.shape == ref.shape else float("inf")
        scale = float(np.max(np.abs(ref))) or 1.0
        results.append((name, err, scale, err <= rtol * scale + 1e-6))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump")
    ap.add_argument("--rtol", type=float, default=1e-4, help="tolerance relative to the tensor's largest value")
    args = ap.parse_args()
    try:
        results = check(args.dump, args.rtol)
    except (OSError, ValueError, KeyError) as e:
        sys.exit("numpy_layer.py: error: %s" % e)
    bad = 0
    for name, err, scale, ok in results:
        print("%-18s max|err| %.3e  max|ref| %.3e  %s" % (name, err, scale, "ok" if ok else "WRONG"))
        bad += not ok
    print("%d passed, %d failed" % (len(results) - bad, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
