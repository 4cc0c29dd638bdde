"""The mixture-of-experts block in float64 NumPy, written from docs/moe.md: routing (softmax or
sigmoid scores, score bias for the choice only, device-limited groups, top-k with ties to the
lower expert, normalisation and scaling of the weights, the aux loss), the dispatch plan
(dropless, or each expert keeping its first pairs in token order up to the capacity), permute,
grouped GEMMs with SwiGLU experts, the weighted combine, and the backward of all of it by hand.

The reference for the cpu backend's MoE ops (tests/test_moe_reference.py runs them through
tests/moe_ops_dump and compares) and for the composed layer's MoE block (tools/numpy_layer.py). `spec` is a dict: experts, top_k, score ("softmax" or
"sigmoid"), normalize, scaling, num_groups, group_top_k, capacity_factor (None: dropless).
"""
import math

import numpy as np

NORM_EPSILON = 1e-20  # the guard of the top-k weights' sum (Megatron-Core's)


def _best(ids, count, key):
    """The `count` best of `ids` by key, highest first, ties to the lower id."""
    return sorted(ids, key=lambda i: (-key[i], i))[:count]


def scores_of(logits, score):
    if score == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def choose(scores, bias, spec):
    """topk_index [T, k]: each token's experts, from scores + bias within the best groups."""
    T, E = scores.shape
    G, size = spec["num_groups"], E // spec["num_groups"]
    index = np.zeros((T, spec["top_k"]), dtype=np.int64)
    for t in range(T):
        key = scores[t] + (bias if bias is not None else 0.0)
        allowed = list(range(E))
        if G > 1:
            group_key = [sum(key[e] for e in _best(range(g * size, (g + 1) * size), min(2, size), key))
                         for g in range(G)]
            groups = sorted(_best(range(G), spec["group_top_k"], group_key))
            allowed = [g * size + e for g in groups for e in range(size)]
        index[t] = _best(allowed, spec["top_k"], key)
    return index


def weights_of(scores, index, spec):
    g = np.take_along_axis(scores, index, axis=1)
    if spec["normalize"]:
        g = g / (g.sum(axis=1, keepdims=True) + NORM_EPSILON)
    return g * spec["scaling"]


def aux_loss(scores, index, E):
    """E * sum_e f_e P_e: f_e the share of the T k choices that picked e, P_e the mean over
    tokens of the scores, each row divided by its sum."""
    T, k = index.shape
    f = np.bincount(index.ravel(), minlength=E) / (T * k)
    P = (scores / (scores.sum(axis=1, keepdims=True) + NORM_EPSILON)).mean(axis=0)
    return E * float(np.sum(f * P))


def route(logits, bias, spec):
    scores = scores_of(logits, spec["score"])
    index = choose(scores, bias, spec)
    return scores, index, weights_of(scores, index, spec), aux_loss(scores, index, logits.shape[1])


def route_bwd(d_weight, scores, index, spec):
    """d logits from d topk_weight (the choice is fixed; the bias has no gradient)."""
    g = np.take_along_axis(scores, index, axis=1)
    dg = d_weight * spec["scaling"]
    if spec["normalize"]:
        S = g.sum(axis=1, keepdims=True) + NORM_EPSILON
        dg = (dg - (dg * g).sum(axis=1, keepdims=True) / S) / S
    d_scores = np.zeros_like(scores)
    np.put_along_axis(d_scores, index, dg, axis=1)
    if spec["score"] == "sigmoid":
        return d_scores * scores * (1 - scores)
    return scores * (d_scores - (scores * d_scores).sum(axis=1, keepdims=True))


def capacity(tokens, top_k, experts, capacity_factor):
    return math.ceil((tokens * top_k / experts) * capacity_factor)


def dispatch(index, experts, capacity_factor):
    """(tokens_per_expert [E], row_slot [T k], slot_row [T, k]) as in backend.hpp's MoeDispatch."""
    T, k = index.shape
    limit = capacity(T, k, experts, capacity_factor) if capacity_factor is not None else T * k
    pairs = [[] for _ in range(experts)]  # each expert's pairs in token order
    for p, e in enumerate(index.ravel()):
        pairs[e].append(p)
    kept = [ps[:limit] for ps in pairs]
    row_slot = np.full(T * k, -1, dtype=np.int64)
    order = [p for ps in kept for p in ps]
    row_slot[:len(order)] = order
    slot_row = np.full(T * k, -1, dtype=np.int64)
    slot_row[order] = np.arange(len(order))
    return np.array([len(ps) for ps in kept]), row_slot, slot_row.reshape(T, k)


def grouped_gemm(x, w, counts):
    ends = np.cumsum(counts)
    return np.concatenate([x[end - n:end] @ w[e] for e, (n, end) in enumerate(zip(counts, ends))]
                          + [np.zeros((0, w.shape[2]))])


def grouped_gemm_bwd(dy, x, w, counts):
    ends = np.cumsum(counts)
    dx = np.concatenate([dy[end - n:end] @ w[e].T for e, (n, end) in enumerate(zip(counts, ends))]
                        + [np.zeros((0, w.shape[1]))])
    dw = np.stack([x[end - n:end].T @ dy[end - n:end] for n, end in zip(counts, ends)])
    return dx, dw


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def swiglu(f1):
    gate, up = np.split(f1, 2, axis=1)
    return gate * sigmoid(gate) * up


def swiglu_bwd(d, f1):
    gate, up = np.split(f1, 2, axis=1)
    s = sigmoid(gate)
    return np.concatenate([d * up * s * (1 + gate * (1 - s)), d * gate * s], axis=1)


def block(spec, P, d_out):
    """The block's forward and backward. P: x [T, h], w_router [h, E], bias [E] or None, w1
    [E, h, 2F], w2 [E, F, h]. Returns a dict named as moe_ops_dump's files."""
    x, k = P["x"], spec["top_k"]
    T, E = x.shape[0], spec["experts"]
    logits = x @ P["w_router"]
    scores, index, weight, aux = route(logits, P.get("bias"), spec)
    counts, row_slot, slot_row = dispatch(index, E, spec["capacity_factor"])
    N = int(counts.sum())
    permuted = x[row_slot[:N] // k]
    fc1 = grouped_gemm(permuted, P["w1"], counts)
    act = swiglu(fc1)
    fc2 = grouped_gemm(act, P["w2"], counts)
    kept = slot_row >= 0
    gathered = fc2[np.where(kept, slot_row, 0)] * kept[:, :, None]  # [T, k, h], 0 for dropped pairs
    out = np.einsum("tk,tkh->th", weight, gathered)

    d_gathered = weight[:, :, None] * d_out[:, None, :] * kept[:, :, None]
    d_weight = np.einsum("tkh,th->tk", gathered, d_out)
    d_fc2 = np.zeros_like(fc2)
    d_fc2[slot_row[kept]] = d_gathered[kept]
    d_act, dw2 = grouped_gemm_bwd(d_fc2, act, P["w2"], counts)
    d_permuted, dw1 = grouped_gemm_bwd(swiglu_bwd(d_act, fc1), permuted, P["w1"], counts)
    dx = np.zeros_like(x)
    np.add.at(dx, row_slot[:N] // k, d_permuted)
    d_logits = route_bwd(d_weight, scores, index, spec)
    dx += d_logits @ P["w_router"].T
    return {"logits": logits, "scores": scores, "topk_index": index, "topk_weight": weight,
            "aux_loss": np.array([aux]), "tokens_per_expert": counts, "row_slot": row_slot, "slot_row": slot_row,
            "permuted": permuted, "fc1": fc1, "act": act, "fc2": fc2, "out": out, "d_topk_weight": d_weight,
            "d_logits": d_logits, "dx": dx, "dw_router": x.T @ d_logits, "dw1": dw1, "dw2": dw2}
