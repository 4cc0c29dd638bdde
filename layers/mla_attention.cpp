// Multi-latent attention (DeepSeek-V2/V3, Megatron-Core's MLASelfAttention) in place of the QKV
// projection; docs/theory.md "Multi-latent attention" derives what it keeps, and
// theory/layer_pieces.hpp's MLA rows are the formulas the layer is held to.
//
//   latents   q_l = n1 W_dq^T [L_q],  [kv_l | k_pe] = n1 W_dkv^T [L_kv + d_r]   (every rank, norm region rows)
//   up        q = norm(q_l) W_uq^T (or n1 W_q^T),  [k_n | v] = norm(kv_l) W_ukv^T   (column-parallel: a/t heads)
//   heads     q_j = [q_n | rope(q_r)],  k_j = [k_n,j | rope(k_pe)],  v_j            (d_qk = d_n + d_r, d_v)
//
// then core attention (unfused; scale 1/sqrt(d_qk)) and the output projection from a·d_v/t.
// Under SP the down projections run on each rank's s/t rows, the up projections gather their
// normed latents (g) as the QKV GEMM gathers its input, and k's RoPE part is gathered before
// RoPE; without SP they enter the region through f. The mla_up_proj module keeps the latents
// and the gathered k_pe, and drops the norms' outputs and statistics and q, k, v once core
// attention has run; backward rebuilds them before core attention's backward.
#include <utility>

#include "layers/transformer_layer.hpp"

namespace actbench {

// What one latent's norm and up projection are called, keep and read.
struct MlaLatentSlots {
  const char *up_op, *up_input_region, *norm_op;
  Tensor SavedActivations::*latent;
  Tensor SavedActivations::*up_input;
  Tensor SavedActivations::*norm_mean;
  Tensor SavedActivations::*norm_rstd;
  Tensor LayerParams::*up_weight;
  Tensor LayerParams::*norm_weight;
  Tensor LayerParams::*norm_bias;
};

namespace {

int64_t whole(double v) { return static_cast<int64_t>(v); }

using S = SavedActivations;
using P = LayerParams;
const MlaLatentSlots kQLatent{"q_up_proj",          "q_up_input",           "q_latent_norm",
                              &S::q_latent,         &S::q_up_input,         &S::q_latent_norm_mean,
                              &S::q_latent_norm_rstd, &P::q_up_weight,      &P::q_latent_norm_weight,
                              &P::q_latent_norm_bias};
const MlaLatentSlots kKvLatent{"kv_up_proj",          "kv_up_input",          "kv_latent_norm",
                               &S::kv_latent,         &S::kv_up_input,        &S::kv_latent_norm_mean,
                               &S::kv_latent_norm_rstd, &P::kv_up_weight,     &P::kv_latent_norm_weight,
                               &P::kv_latent_norm_bias};

}  // namespace

Tensor TransformerLayer::mla_attention_block_fwd(const CommContext& comm, const Tensor& x, SavedActivations& save,
                                                 Keep keep) {
  const char* stage = comm.stage.c_str();
  Tensor normed = norm1_fwd(stage, x, save, keep);
  if (keep.any && keep.norm_outputs) save.qkv_input = normed;  // both down projections' input (q's at L_q = 0)
  MlaLatents latents = mla_down_fwd(comm, normed);
  // The latents are the norms' inputs and mla_up_proj's checkpoint: kept either way. The
  // checkpoint keeps its third input too, k's RoPE part as gathered.
  if (keep.any) {
    save.q_latent = latents.q;
    save.kv_latent = latents.kv;
  }
  const bool keep_up = keep.any && keep.mla_up_proj;
  if (keep.any && !keep.mla_up_proj) save.k_pos_emb = latents.k_pos_emb;
  QkvHeads qkv = mla_up_fwd(comm, latents, normed, keep_up ? &save : nullptr);
  latents = MlaLatents{};
  normed = Tensor();
  Tensor context = core_attention_fwd(stage, std::move(qkv), save, keep);
  if (!keep_up) save.q = save.k = save.v = Tensor();  // mla_up_proj rebuilds them in backward
  Tensor out = row_parallel_linear_fwd(comm, "proj", std::move(context), params_.proj_weight);  // f̄ | ḡ
  return residual_fwd(stage, "attn_residual", std::move(out), params_.proj_bias, x, kSiteAttnOut,
                      keep.any ? &save.attn_residual_mask : nullptr);
}

TransformerLayer::MlaLatents TransformerLayer::mla_down_fwd(const CommContext& comm, const Tensor& normed) {
  const theory::MlaSpec& mla = opt_.dims.spec.mla;
  const int64_t rows = normed.dim(0), b = opt_.dims.b, h = opt_.dims.h, n = rows * b;
  const int64_t q_rank = whole(mla.q_lora_rank), kv_rank = whole(mla.kv_lora_rank);
  const int64_t rope = whole(mla.qk_pos_emb_head_dim);
  const Tensor x = as_matrix(normed);
  MlaLatents out;
  if (q_rank > 0) {
    PhaseRange phase(phase_name(comm.stage.c_str(), "q_down_proj"), phase_log_);
    out.q = be_.empty({rows, b, q_rank}, opt_.dtype);
    be_.gemm(gemm_args(false, true, n, q_rank, h), x, params_.q_down_weight, as_matrix(out.q));
  }
  Tensor k_pos_emb = be_.empty({rows, b, rope}, opt_.dtype);
  {
    // Two GEMMs on the weight's two row blocks rather than one and a split: the latent comes
    // out contiguous, as its norm reads it and the checkpoint keeps it.
    PhaseRange phase(phase_name(comm.stage.c_str(), "kv_down_proj"), phase_log_);
    const Tensor& w = params_.kv_down_weight;
    out.kv = be_.empty({rows, b, kv_rank}, opt_.dtype);
    be_.gemm(gemm_args(false, true, n, kv_rank, h), x, w.rows(0, kv_rank), as_matrix(out.kv));
    be_.gemm(gemm_args(false, true, n, rope, h), x, w.rows(kv_rank, kv_rank + rope), as_matrix(k_pos_emb));
  }
  out.k_pos_emb = region_entry_fwd(comm, k_pos_emb, "k_pos_emb");  // f | g: all s rows for every head
  return out;
}

LayerBase::QkvHeads TransformerLayer::mla_up_fwd(const CommContext& comm, const MlaLatents& latents,
                                                 const Tensor& normed, SavedActivations* keep) {
  const char* stage = comm.stage.c_str();
  Tensor q_out = latents.q.defined()
                     ? latent_up_fwd(comm, kQLatent, latents.q, keep)
                     : column_parallel_linear_fwd(comm, "q_proj", "qkv_input", normed, params_.q_proj_weight, nullptr,
                                                  nullptr);  // f | g
  Tensor kv_out = latent_up_fwd(comm, kKvLatent, latents.kv, keep);
  PhaseRange phase(phase_name(stage, "mla_rope"), phase_log_);
  QkvHeads heads;
  heads.q = mla_q_heads(q_out);
  q_out = Tensor();
  const int64_t rope = whole(opt_.dims.spec.mla.qk_pos_emb_head_dim);
  Tensor k_rope = be_.empty({opt_.dims.b, 1, seq_, rope}, opt_.dtype);
  be_.split_heads(latents.k_pos_emb, 0, k_rope);
  be_.rope_fwd(k_rope, opt_.dims.spec.rotary_base, rope, k_rope, seq_positions_);
  mla_kv_heads(kv_out, k_rope, heads);
  return heads;
}

Tensor TransformerLayer::mla_q_heads(const Tensor& q_out) {
  Tensor q = be_.empty({opt_.dims.b, heads_per_rank_, seq_, head_dim_}, opt_.dtype);
  be_.split_heads(q_out, 0, q);  // each head's columns are [nope | rope] already
  mla_rope_columns(q, false);
  return q;
}

void TransformerLayer::mla_rope_columns(const Tensor& x, bool inverse) {
  // x as one row per (batch, head, position): its RoPE columns out, rotated, and back in place.
  const int64_t rope = whole(opt_.dims.spec.mla.qk_pos_emb_head_dim), first = head_dim_ - rope;
  const int64_t rows = x.numel() / head_dim_;
  const Tensor x_rows = x.view({rows, 1, head_dim_});
  Tensor part = be_.empty({x.dim(0), x.dim(1), x.dim(2), rope}, opt_.dtype);
  be_.split_heads(x_rows, first, part.view({1, 1, rows, rope}));
  if (inverse)
    be_.rope_bwd(part, opt_.dims.spec.rotary_base, rope, part, seq_positions_);
  else
    be_.rope_fwd(part, opt_.dims.spec.rotary_base, rope, part, seq_positions_);
  be_.merge_heads(part.view({1, 1, rows, rope}), first, x_rows);
}

void TransformerLayer::mla_kv_heads(const Tensor& kv_out, const Tensor& k_rope, QkvHeads& heads) {
  const int64_t b = opt_.dims.b, H = heads_per_rank_, s = seq_, v_dim = v_head_dim_;
  const int64_t rope = k_rope.dim(3), nope = head_dim_ - rope;
  const Tensor kv_rows = kv_out.view({s, b * H, nope + v_dim});  // one row of nope + v_dim per (token, head)
  heads.v = be_.empty({b, H, s, v_dim}, opt_.dtype);
  be_.split_heads(kv_rows, nope, heads.v.view({b * H, 1, s, v_dim}));
  // k in the [s, b, ·] layout first (head j at j·d_qk): its nope columns from the up projection,
  // the one rotated RoPE part into every head, then split into heads like q.
  Tensor k_nope = be_.empty({b * H, 1, s, nope}, opt_.dtype);
  be_.split_heads(kv_rows, 0, k_nope);
  Tensor k_rows = be_.empty({s, b, H * head_dim_}, opt_.dtype);
  be_.merge_heads(k_nope, 0, k_rows.view({s, b * H, head_dim_}));
  k_nope = Tensor();
  for (int64_t j = 0; j < H; ++j) be_.merge_heads(k_rope, j * head_dim_ + nope, k_rows);
  heads.k = be_.empty({b, H, s, head_dim_}, opt_.dtype);
  be_.split_heads(k_rows, 0, heads.k);
}

void TransformerLayer::recompute_mla_up(SavedActivations& saved) {
  if (saved.q.defined()) return;  // kept: the module is off
  const CommContext comm = comm_context("recompute");
  const MlaLatents latents{saved.q_latent, saved.kv_latent, saved.k_pos_emb};
  QkvHeads qkv = mla_up_fwd(comm, latents, saved.qkv_input, &saved);
  saved.k_pos_emb = Tensor();
  saved.q = std::move(qkv.q);
  saved.k = std::move(qkv.k);
  saved.v = std::move(qkv.v);
}

Tensor TransformerLayer::mla_attention_block_bwd(const CommContext& comm, const Tensor& dx1, SavedActivations& saved) {
  Tensor d_out = residual_bwd("attn_residual", dx1, saved.attn_residual_mask, grads_.proj_bias);
  // Megatron's checkpoints rebuild when backward reaches their outputs: norm 1's (the layernorm
  // module) at the attention's output, the up projections' (mla_up_proj) at core attention's.
  recompute_norm("ln1", saved.ln1_input, params_.ln1_weight, params_.ln1_bias, saved.qkv_input, saved.ln1_mean,
                 saved.ln1_rstd);
  Tensor d_context = row_parallel_linear_bwd(comm, "proj", std::move(d_out), saved.proj_input, params_.proj_weight,
                                             grads_.proj_weight);  // f̄ | ḡ
  recompute_mla_up(saved);
  QkvHeads d_heads;
  core_attention_bwd(saved, std::move(d_context), d_heads);
  const MlaLatents d_latents = mla_up_bwd(comm, saved, d_heads);
  return norm1_bwd(mla_down_bwd(saved, d_latents), dx1, saved);
}

Tensor TransformerLayer::mla_q_heads_bwd(Tensor dq) {
  mla_rope_columns(dq, true);
  Tensor d_q_out = be_.empty({seq_, opt_.dims.b, heads_per_rank_ * head_dim_}, opt_.dtype);
  be_.merge_heads(dq, 0, d_q_out);
  return d_q_out;
}

void TransformerLayer::mla_kv_heads_bwd(QkvHeads& d_heads, Tensor& d_kv_out, Tensor& d_k_pos_emb) {
  const int64_t b = opt_.dims.b, H = heads_per_rank_, s = seq_, v_dim = v_head_dim_;
  const int64_t rope = whole(opt_.dims.spec.mla.qk_pos_emb_head_dim), nope = head_dim_ - rope;
  Tensor dk_rows = be_.empty({s, b, H * head_dim_}, opt_.dtype);
  be_.merge_heads(d_heads.k, 0, dk_rows);
  d_heads.k = Tensor();
  d_kv_out = be_.empty({s, b, H * (nope + v_dim)}, opt_.dtype);
  const Tensor d_kv_rows = d_kv_out.view({s, b * H, nope + v_dim});
  be_.merge_heads(d_heads.v.view({b * H, 1, s, v_dim}), nope, d_kv_rows);
  d_heads.v = Tensor();
  {
    Tensor d_nope = be_.empty({b * H, 1, s, nope}, opt_.dtype);
    be_.split_heads(dk_rows.view({s, b * H, head_dim_}), 0, d_nope);
    be_.merge_heads(d_nope, 0, d_kv_rows);
  }
  // Every head read the one RoPE part: its gradient is the sum of theirs, then RoPE's inverse.
  Tensor d_rope = be_.empty({b, 1, s, rope}, opt_.dtype);
  be_.split_heads(dk_rows, nope, d_rope);
  if (H > 1) {
    Tensor part = be_.empty(d_rope.shape(), opt_.dtype);
    for (int64_t j = 1; j < H; ++j) {
      be_.split_heads(dk_rows, j * head_dim_ + nope, part);
      be_.add_inplace(d_rope, part);
    }
  }
  be_.rope_bwd(d_rope, opt_.dims.spec.rotary_base, rope, d_rope, seq_positions_);
  d_k_pos_emb = be_.empty({s, b, rope}, opt_.dtype);
  be_.merge_heads(d_rope, 0, d_k_pos_emb);
}

TransformerLayer::MlaLatents TransformerLayer::mla_up_bwd(const CommContext& comm, SavedActivations& saved,
                                                          QkvHeads& d_heads) {
  Tensor d_q_out, d_kv_out, d_k_pos_emb;
  {
    PhaseRange phase("bwd.mla_rope", phase_log_);
    d_q_out = mla_q_heads_bwd(std::move(d_heads.q));
    mla_kv_heads_bwd(d_heads, d_kv_out, d_k_pos_emb);
  }
  MlaLatents d;
  d.k_pos_emb = region_entry_bwd(comm, std::move(d_k_pos_emb), "k_pos_emb");  // f | g: summed over the group
  d.kv = latent_up_bwd(comm, kKvLatent, std::move(d_kv_out), saved);
  if (saved.q_latent.defined()) {
    d.q = latent_up_bwd(comm, kQLatent, std::move(d_q_out), saved);
  } else {
    d.q = column_parallel_linear_bwd(comm, "q_proj", "qkv_input", saved.qkv_input, std::move(d_q_out),
                                     params_.q_proj_weight, grads_.q_proj_weight);  // f | g
  }
  return d;
}

Tensor TransformerLayer::latent_up_fwd(const CommContext& comm, const MlaLatentSlots& l, const Tensor& latent,
                                       SavedActivations* keep) {
  Tensor normed = block_norm_fwd(comm.stage.c_str(), l.norm_op, latent, params_.*l.norm_weight, params_.*l.norm_bias,
                                 keep ? &(keep->*l.norm_mean) : nullptr, keep ? &(keep->*l.norm_rstd) : nullptr);
  return column_parallel_linear_fwd(comm, l.up_op, l.up_input_region, std::move(normed), params_.*l.up_weight, nullptr,
                                    keep ? &(keep->*l.up_input) : nullptr);  // f | g
}

Tensor TransformerLayer::latent_up_bwd(const CommContext& comm, const MlaLatentSlots& l, Tensor d_out,
                                       SavedActivations& saved) {
  Tensor d_normed = column_parallel_linear_bwd(comm, l.up_op, l.up_input_region, std::move(saved.*l.up_input),
                                               std::move(d_out), params_.*l.up_weight, grads_.*l.up_weight);  // f | g
  const Tensor& latent = saved.*l.latent;
  Tensor d_latent = be_.empty(latent.shape(), opt_.dtype);
  {
    PhaseRange phase(phase_name("bwd", l.norm_op), phase_log_);
    norm_bwd(d_normed, latent, params_.*l.norm_weight, saved.*l.norm_mean, saved.*l.norm_rstd, d_latent,
             grads_.*l.norm_weight, grads_.*l.norm_bias);
  }
  saved.*l.norm_mean = saved.*l.norm_rstd = Tensor();
  return d_latent;
}

Tensor TransformerLayer::mla_down_bwd(SavedActivations& saved, const MlaLatents& d) {
  const theory::MlaSpec& mla = opt_.dims.spec.mla;
  const int64_t h = opt_.dims.h, kv_rank = whole(mla.kv_lora_rank), rope = whole(mla.qk_pos_emb_head_dim);
  const Tensor x = as_matrix(saved.qkv_input);
  const int64_t n = x.dim(0);
  Tensor d_normed = be_.empty(saved.qkv_input.shape(), opt_.dtype);
  const Tensor dx = as_matrix(d_normed);
  {
    PhaseRange phase("bwd.kv_down_proj", phase_log_);
    const Tensor &w = params_.kv_down_weight, &dw = grads_.kv_down_weight;
    const Tensor d_latent = as_matrix(d.kv), d_rope = as_matrix(d.k_pos_emb);
    be_.gemm(gemm_args(false, false, n, h, kv_rank), d_latent, w.rows(0, kv_rank), dx);
    be_.gemm(gemm_args(false, false, n, h, rope, 1, 1.f, 1.f), d_rope, w.rows(kv_rank, kv_rank + rope), dx);
    be_.gemm(gemm_args(true, false, kv_rank, h, n), d_latent, x, dw.rows(0, kv_rank));
    be_.gemm(gemm_args(true, false, rope, h, n), d_rope, x, dw.rows(kv_rank, kv_rank + rope));
    if (!saved.q_latent.defined()) be_.add_inplace(d_normed, d.q);  // q's projection's share, from its backward
  }
  if (saved.q_latent.defined()) {
    PhaseRange phase("bwd.q_down_proj", phase_log_);
    const int64_t q_rank = whole(mla.q_lora_rank);
    be_.gemm(gemm_args(false, false, n, h, q_rank, 1, 1.f, 1.f), as_matrix(d.q), params_.q_down_weight, dx);
    be_.gemm(gemm_args(true, false, q_rank, h, n), as_matrix(d.q), x, grads_.q_down_weight);
  }
  saved.q_latent = saved.kv_latent = saved.qkv_input = Tensor();
  return d_normed;
}

}  // namespace actbench
