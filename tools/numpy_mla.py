"""Multi-latent attention (DeepSeek-V2/V3, Megatron-Core's MLASelfAttention) in float64 NumPy:
the attention block of tools/numpy_layer.py when layer.json has "mla". Rows are [s, b, .],
y = x W^T, heads [b, a, s, .]; with L_q = q_lora_rank, L_kv = kv_lora_rank, d_n =
qk_head_dim, d_r = qk_pos_emb_head_dim, d_qk = d_n + d_r, d_v = v_head_dim:

    q    = norm(n1 q_down^T; q_latent_norm) q_up^T   (or n1 q_proj^T when L_q = 0)  [s, b, a*d_qk]
    kvd  = n1 kv_down^T = [kv latent L_kv | k_pe d_r]
    kv   = norm(kv latent; kv_latent_norm) kv_up^T                                 [s, b, a*(d_n + d_v)]
    q_j  = [q_n | rope(q_r)],  k_j = [k_n,j | rope(k_pe)] (one k_pe for every head),  v_j

then causal softmax(q k^T / sqrt(d_qk)) with dropout, the context [s, b, a*d_v]. RoPE is the
rotate-half of numpy_layer on all d_r columns of the RoPE part. The functions take the
norm and RoPE helpers of numpy_layer (and its cos, sin tables for R = d_r) as arguments, so
that the two files share one definition.
"""
import math

import numpy as np


def widths(mla):
    """(L_q, L_kv, d_n, d_r, d_v) of layer.json's "mla" object."""
    return (int(mla["q_lora_rank"]), int(mla["kv_lora_rank"]), int(mla["qk_head_dim"]),
            int(mla["qk_pos_emb_head_dim"]), int(mla["v_head_dim"]))


def param_shapes(mla, hidden, heads, layernorm):
    """MLA's parameters in dump order: (name, shape, present)."""
    Lq, Lkv, dn, dr, dv = widths(mla)
    return [("q_down.weight", (Lq, hidden), Lq > 0), ("q_latent_norm.weight", (Lq,), Lq > 0),
            ("q_latent_norm.bias", (Lq,), Lq > 0 and layernorm), ("q_up.weight", (heads * (dn + dr), Lq), Lq > 0),
            ("q_proj.weight", (heads * (dn + dr), hidden), Lq == 0), ("kv_down.weight", (Lkv + dr, hidden), True),
            ("kv_latent_norm.weight", (Lkv,), True), ("kv_latent_norm.bias", (Lkv,), layernorm),
            ("kv_up.weight", (heads * (dn + dv), Lkv), True)]


def attention_fwd(spec, P, n1, c, drop_probs, norm_fwd, rotate, cos, sin):
    """The context [s, b, a*d_v] from norm 1's output; what attention_bwd reads goes into c."""
    s, b, a = spec.seq, spec.batch, spec.heads
    Lq, Lkv, dn, dr, dv = widths(spec.mla)
    m = c["mla"] = {"n1": n1}
    if Lq:
        m["q_latent"] = n1 @ P["q_down.weight"].T
        m["q_up_in"], m["q_norm"] = norm_fwd(spec, m["q_latent"], P, "q_latent_norm")
        q = m["q_up_in"] @ P["q_up.weight"].T
    else:
        q = n1 @ P["q_proj.weight"].T
    q = q.reshape(s, b, a, dn + dr).transpose(1, 2, 0, 3)
    q = np.concatenate([q[..., :dn], rotate(q[..., dn:], cos, sin)], axis=-1)
    kvd = n1 @ P["kv_down.weight"].T
    m["kv_up_in"], m["kv_norm"] = norm_fwd(spec, kvd[..., :Lkv], P, "kv_latent_norm")
    kv = (m["kv_up_in"] @ P["kv_up.weight"].T).reshape(s, b, a, dn + dv).transpose(1, 2, 0, 3)
    k_pe = rotate(kvd[..., Lkv:].transpose(1, 0, 2)[:, None], cos, sin)  # [b, 1, s, d_r]
    k = np.concatenate([kv[..., :dn], np.broadcast_to(k_pe, (b, a, s, dr))], axis=-1)
    v = kv[..., dn:]
    causal = np.triu(np.ones((s, s), dtype=bool), 1)
    scores = np.where(causal, -np.inf, q @ k.transpose(0, 1, 3, 2) / math.sqrt(dn + dr))
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    m.update(q=q, k=k, v=v, probs=probs / probs.sum(-1, keepdims=True))
    m["dropped"] = m["probs"] * drop_probs
    return (m["dropped"] @ v).transpose(2, 0, 1, 3).reshape(s, b, a * dv)


def attention_bwd(spec, P, d_ctx, c, drop_probs, norm_bwd, rotate, cos, sin, G):
    """d of norm 1's output from d of the context [s, b, a*d_v]; MLA's gradients into G."""
    s, b, a = spec.seq, spec.batch, spec.heads
    Lq, Lkv, dn, dr, dv = widths(spec.mla)
    m = c["mla"]
    d_ctx = d_ctx.reshape(s, b, a, dv).transpose(1, 2, 0, 3)
    d_probs = (d_ctx @ m["v"].transpose(0, 1, 3, 2)) * drop_probs
    dv_heads = m["dropped"].transpose(0, 1, 3, 2) @ d_ctx
    d_scores = m["probs"] * (d_probs - (d_probs * m["probs"]).sum(-1, keepdims=True)) / math.sqrt(dn + dr)
    dq, dk = d_scores @ m["k"], d_scores.transpose(0, 1, 3, 2) @ m["q"]
    dq = np.concatenate([dq[..., :dn], rotate(dq[..., dn:], cos, -sin)], axis=-1)
    d_kpe = rotate(dk[..., dn:].sum(1), cos, -sin)  # [b, s, d_r]: every head read the one RoPE part
    d_kv = np.concatenate([dk[..., :dn], dv_heads], axis=-1).transpose(2, 0, 1, 3).reshape(s, b, a * (dn + dv))
    flat = lambda t: t.reshape(-1, t.shape[-1])
    G["kv_up.weight"] = flat(d_kv).T @ flat(m["kv_up_in"])
    d_latent = norm_bwd(spec, d_kv @ P["kv_up.weight"], P, "kv_latent_norm", m["kv_norm"], G)
    d_kvd = np.concatenate([d_latent, d_kpe.transpose(1, 0, 2)], axis=-1)
    G["kv_down.weight"] = flat(d_kvd).T @ flat(m["n1"])
    dn1 = d_kvd @ P["kv_down.weight"]
    d_q = dq.transpose(2, 0, 1, 3).reshape(s, b, a * (dn + dr))
    if Lq:
        G["q_up.weight"] = flat(d_q).T @ flat(m["q_up_in"])
        d_q_latent = norm_bwd(spec, d_q @ P["q_up.weight"], P, "q_latent_norm", m["q_norm"], G)
        G["q_down.weight"] = flat(d_q_latent).T @ flat(m["n1"])
        dn1 = dn1 + d_q_latent @ P["q_down.weight"]
    else:
        G["q_proj.weight"] = flat(d_q).T @ flat(m["n1"])
        dn1 = dn1 + d_q @ P["q_proj.weight"]
    return dn1
