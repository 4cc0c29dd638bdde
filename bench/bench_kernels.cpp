// Kernel microbenchmarks at the layer's per-rank shapes.
//   bench_kernels --backend=cuda            22B per rank (t = 8): b 4, s 2048, h 6144, 8 heads of 96
//                                           (a = 64 heads of h/a = 96; issue 6's "8 of 128" would
//                                           not tile h/t = 768)
//   bench_kernels --backend=cpu             small shapes (CI smoke)
//   --seq=N                                 sequence length s of every shape (default 2048 at the
//                                           paper shape, 64 at the small one): rows = s * b, scores
//                                           [b * heads, s, s]
//   --attn-batch=N                          microbatch b of the attention_* benchmarks only
//                                           (default the shape's b: 4 paper, 2 small)
//   --head-dim=N                            head size d of the attention_* benchmarks but the
//                                           MLA ones (default the shape's: 96 paper, 64 small)
//   --attn-dropout=P                        dropout on the probabilities of the attention_*
//                                           benchmarks, 0 <= P < 1 (default 0.1, the paper's; 0:
//                                           none)
// Memory-bound kernels report bytes moved and GB/s (pct_peak against the device's HBM
// bandwidth); GEMMs report FLOPs and TFLOP/s (pct_peak against dense bf16). A device copy and
// a large square GEMM are the same run's practical ceilings.
//
// Core attention, forward and backward of each path at the same shape (issue 7):
//   attention_fused_fwd / _bwd        Backend::attention_fwd / attention_bwd (--attention fused)
//   attention_unfused_fwd             QK^T batched GEMM, causal softmax, dropout, .V GEMM: the calls
//                                     the layer makes (TransformerLayer::core_attention_probs and
//                                     forward_impl), keeping probs, mask and dropped probs
//   attention_unfused_bwd             its backward from those stored tensors (recompute none)
//   attention_unfused_selective_bwd   recompute QK^T, softmax, dropout from Q, K, then the same
//                                     backward: what selective recompute's backward costs
//   attention_fused_mla_fwd / _bwd    the fused path with multi-latent attention's heads
//                                     (DeepSeek-V3: q and k 192 wide, v 128)
// Any benchmark that runs out of device memory is skipped with the reason (e.g. softmax at
// s = 32k). The unfused attention paths need b*heads*s^2 score elements (68.7 GB per bf16
// tensor at b 4, s 32k): without --attn-batch they halve b until they fit, say so in their
// label ("b=1: b=4 out of memory") and report the b they ran at in the `batch` counter; with
// --attn-batch they run at exactly that b or skip.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_common.hpp"
#include "kernels/cuda/attention_tiles.hpp"
#include "runners/presets.hpp"

namespace actbench::bench {
namespace {

struct KernelShapes {
  int64_t rows;   // s * b tokens of one rank (no SP)
  int64_t h;      // hidden
  int64_t heads;  // attention heads on this rank
  int64_t s;      // sequence
  int64_t b;      // microbatch
  int64_t d;      // head size
  int64_t ffn;    // 4h / t
  int64_t h_tp;   // h / t
  int64_t square; // the reference GEMM's m = n = k
};

// --seq, --attn-batch and --head-dim (0: the shape's own); --attn-dropout (below).
int64_t g_seq = 0;
int64_t g_attn_batch = 0;
int64_t g_head_dim = 0;

// The tensor-parallel size the shapes are one rank of: the preset's at the paper shape.
int64_t shape_tp() { return context().shape == "paper" ? find_preset(kPaperShapeModel).tp : 1; }

// One rank of the paper-shape preset (the 22B layer at t = 8: 8 heads of 96, h/t = 768).
KernelShapes paper_shapes() {
  const LayerDims& d = find_preset(kPaperShapeModel).dims;
  const int64_t t = shape_tp();
  return {d.s * d.b, d.h, d.a / t, d.s, d.b, d.h / d.a, d.ffn() / t, d.h / t, 8192};
}

KernelShapes shapes() {
  KernelShapes k = context().shape == "paper" ? paper_shapes()
                                              : KernelShapes{64 * 2, 256, 4, 64, 2, 64, 1024, 256, 512};
  if (g_seq > 0) {
    k.s = g_seq;
    k.rows = k.s * k.b;
  }
  return k;
}

DType bench_dtype() { return context().backend_name == "cpu" ? DType::fp32 : DType::bf16; }

// Uniform [lo, hi) from a counter hash (splitmix64): ~1 ns an element, where std::mt19937 took
// ~15 (a [32, 8192, 8192] score tensor is 2.1e9 elements: 30 s of host time with it).
Tensor random_tensor(Shape shape, DType dtype, float lo = -1.f, float hi = 1.f, uint64_t seed = 42) {
  Backend& be = *context().backend;
  Tensor t = be.empty(std::move(shape), dtype);
  if (be.computes()) {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    const double width = static_cast<double>(hi) - static_cast<double>(lo);
    for (size_t i = 0; i < host.size(); ++i) {
      uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      host[i] = static_cast<float>(lo + width * (static_cast<double>(z >> 40) * 0x1.0p-24));
    }
    be.upload(host.data(), t);
  }
  return t;
}

bool skip_if_unavailable(benchmark::State& state) {
  BenchContext& ctx = context();
  if (ctx.skipped) {
    state.SkipWithError(("skipped: " + ctx.skip_reason).c_str());
    return true;
  }
  if (!ctx.backend->computes()) {
    state.SkipWithError("the meta backend does not compute: nothing to time");
    return true;
  }
  return false;
}

// Runs fn as one timed iteration per benchmark iteration (after one untimed warm-up call).
template <class Fn>
void loop(benchmark::State& state, Fn&& fn) {
  fn();
  for (auto _ : state) time_manual(state, fn);
}

void BM_copy(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  const KernelShapes k = shapes();
  Tensor a = random_tensor({k.rows, k.h * 4}, bench_dtype());
  Tensor b = context().backend->empty({k.rows, k.h * 4}, bench_dtype());
  loop(state, [&] { context().backend->copy(a, b); });
  set_bandwidth_counters(state, 2.0 * static_cast<double>(a.bytes()));
}

void BM_layernorm_fwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.h}, bench_dtype());
  Tensor w = random_tensor({k.h}, bench_dtype()), bias = random_tensor({k.h}, bench_dtype());
  Tensor y = be.empty({k.rows, k.h}, bench_dtype());
  Tensor mean = be.empty({k.rows}, DType::fp32), rstd = be.empty({k.rows}, DType::fp32);
  loop(state, [&] { be.layernorm_fwd(x, w, bias, 1e-5f, y, mean, rstd); });
  set_bandwidth_counters(state, 2.0 * static_cast<double>(x.bytes()) + 8.0 * static_cast<double>(k.rows));
}

void BM_layernorm_bwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.h}, bench_dtype()), dy = random_tensor({k.rows, k.h}, bench_dtype());
  Tensor w = random_tensor({k.h}, bench_dtype()), bias = random_tensor({k.h}, bench_dtype());
  Tensor y = be.empty({k.rows, k.h}, bench_dtype()), dx = be.empty({k.rows, k.h}, bench_dtype());
  Tensor mean = be.empty({k.rows}, DType::fp32), rstd = be.empty({k.rows}, DType::fp32);
  Tensor dw = be.empty({k.h}, bench_dtype()), db = be.empty({k.h}, bench_dtype());
  be.layernorm_fwd(x, w, bias, 1e-5f, y, mean, rstd);
  loop(state, [&] { be.layernorm_bwd(dy, x, w, mean, rstd, dx, dw, db); });
  set_bandwidth_counters(state, 3.0 * static_cast<double>(x.bytes()) + 8.0 * static_cast<double>(k.rows));
}

void BM_softmax_fwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor scores = random_tensor({k.b * k.heads, k.s, k.s}, bench_dtype(), -4.f, 4.f);
  Tensor probs = be.empty(scores.shape(), bench_dtype());
  loop(state, [&] { be.softmax_causal_fwd(scores, probs); });
  set_bandwidth_counters(state, 2.0 * static_cast<double>(scores.bytes()));
}

void BM_softmax_bwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor scores = random_tensor({k.b * k.heads, k.s, k.s}, bench_dtype(), -4.f, 4.f);
  Tensor dprobs = random_tensor(scores.shape(), bench_dtype());
  Tensor probs = be.empty(scores.shape(), bench_dtype()), dscores = be.empty(scores.shape(), bench_dtype());
  be.softmax_causal_fwd(scores, probs);
  loop(state, [&] { be.softmax_causal_bwd(dprobs, probs, dscores); });
  set_bandwidth_counters(state, 3.0 * static_cast<double>(scores.bytes()));
}

// Dropout specs laid out as the layer lays them out (layers/transformer_layer.cpp), so the
// kernels take the same paths (Philox words drawn in groups of four along `inner`).
struct AttnShape {
  int64_t b = 0, heads = 0, s = 0, d = 0;
  int64_t dv = 0;  // v's (and the output's) head size; 0: d. Multi-latent attention's is narrower
  int64_t B() const { return b * heads; }  // batched-GEMM count: the [B, S, D] of the kernels
  int64_t value_dim() const { return dv > 0 ? dv : d; }
};

constexpr float kDropout = 0.1f;  // the paper's dropout, on probabilities and residuals
float g_attn_dropout = kDropout;  // --attn-dropout: the attention_* benchmarks' probabilities

// The layer's attn_dropout_spec on rank 0 of t (t = 8 at the paper shape, 1 at the small
// one): probabilities [b, heads, s, s] are heads [0, heads) of the canonical [b, heads*t, s, s].
DropoutSpec attn_dropout_spec(const AttnShape& a, float p = kDropout) {
  DropoutSpec spec;
  spec.p = p;
  spec.seed = 1234;
  spec.site = kSiteAttnProbs;
  spec.outer = a.b;
  spec.mid_local = a.heads;
  spec.mid_global = a.heads * shape_tp();
  spec.inner = a.s * a.s;
  return spec;
}

// Residual-branch rows [s*b, h] (no SP: the local rows are the canonical ones).
DropoutSpec rows_dropout_spec(int64_t rows, int64_t h, uint32_t site) {
  DropoutSpec spec;
  spec.p = kDropout;
  spec.seed = 1234;
  spec.site = site;
  spec.mid_local = spec.mid_global = rows;
  spec.inner = h;
  return spec;
}

void BM_dropout_fwd_attention(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.b * k.heads, k.s, k.s}, bench_dtype());
  Tensor y = be.empty(x.shape(), bench_dtype()), mask = be.empty(x.shape(), DType::u8);
  const DropoutSpec spec = attn_dropout_spec({k.b, k.heads, k.s, k.d});
  loop(state, [&] { be.dropout_fwd(x, spec, y, mask); });
  set_bandwidth_counters(state, 2.0 * static_cast<double>(x.bytes()) + static_cast<double>(x.numel()));
}

void BM_dropout_bwd_attention(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.b * k.heads, k.s, k.s}, bench_dtype());
  Tensor y = be.empty(x.shape(), bench_dtype()), mask = be.empty(x.shape(), DType::u8);
  Tensor dx = be.empty(x.shape(), bench_dtype());
  be.dropout_fwd(x, attn_dropout_spec({k.b, k.heads, k.s, k.d}), y, mask);
  loop(state, [&] { be.dropout_bwd(y, mask, kDropout, dx); });
  set_bandwidth_counters(state, 2.0 * static_cast<double>(x.bytes()) + static_cast<double>(x.numel()));
}

void BM_gelu_fwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.ffn}, bench_dtype()), y = be.empty({k.rows, k.ffn}, bench_dtype());
  loop(state, [&] { be.gelu_fwd(x, y); });
  set_bandwidth_counters(state, 2.0 * static_cast<double>(x.bytes()));
}

void BM_gelu_bwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.ffn}, bench_dtype()), dy = random_tensor({k.rows, k.ffn}, bench_dtype());
  Tensor dx = be.empty({k.rows, k.ffn}, bench_dtype());
  loop(state, [&] { be.gelu_bwd(dy, x, dx); });
  set_bandwidth_counters(state, 3.0 * static_cast<double>(x.bytes()));
}

void BM_squared_relu_fwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.ffn}, bench_dtype()), y = be.empty({k.rows, k.ffn}, bench_dtype());
  loop(state, [&] { be.squared_relu_fwd(x, y); });
  set_bandwidth_counters(state, 2.0 * static_cast<double>(x.bytes()));
}

void BM_squared_relu_bwd(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.ffn}, bench_dtype()), dy = random_tensor({k.rows, k.ffn}, bench_dtype());
  Tensor dx = be.empty({k.rows, k.ffn}, bench_dtype());
  loop(state, [&] { be.squared_relu_bwd(dy, x, dx); });
  set_bandwidth_counters(state, 3.0 * static_cast<double>(x.bytes()));
}

void BM_bias_dropout_residual(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.h}, bench_dtype()), r = random_tensor({k.rows, k.h}, bench_dtype());
  Tensor bias = random_tensor({k.h}, bench_dtype());
  Tensor out = be.empty({k.rows, k.h}, bench_dtype()), mask = be.empty({k.rows, k.h}, DType::u8);
  const DropoutSpec spec = rows_dropout_spec(k.rows, k.h, kSiteMlpOut);
  loop(state, [&] { be.bias_dropout_residual_fwd(x, bias, r, spec, out, mask); });
  set_bandwidth_counters(state, 3.0 * static_cast<double>(x.bytes()) + static_cast<double>(x.numel()));
}

// C[m, n] = A[m, k] * B, with B stored [n, k] (a linear layer's weight, y = x W^T).
void gemm_bench(benchmark::State& state, int64_t m, int64_t n, int64_t kk, int64_t batch, bool trans_b) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  Tensor a = random_tensor({batch, m, kk}, bench_dtype());
  Tensor b = random_tensor(trans_b ? Shape{batch, n, kk} : Shape{batch, kk, n}, bench_dtype());
  Tensor c = be.empty({batch, m, n}, bench_dtype());
  const GemmArgs g = gemm_args(false, trans_b, m, n, kk, batch);
  loop(state, [&] { be.gemm(g, a, b, c); });
  set_flop_counters(state, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kk) *
                               static_cast<double>(batch));
}

// ---- core attention: fused vs the unfused path the layer runs ------------------------------

// DeepSeek-V3's multi-latent attention heads: q and k 128 + 64 (the RoPE part) wide, v 128.
constexpr int64_t kMlaQkHeadDim = 192, kMlaVHeadDim = 128;

AttnShape attn_shape(bool mla = false) {
  const KernelShapes k = shapes();
  const int64_t b = g_attn_batch > 0 ? g_attn_batch : k.b;
  if (mla) return {b, k.heads, k.s, kMlaQkHeadDim, kMlaVHeadDim};
  return {b, k.heads, k.s, g_head_dim > 0 ? g_head_dim : k.d};
}

// ---- FLOPs ---------------------------------------------------------------------------------
// `flops` (and TFLOP/s) follow the FlashAttention papers' convention for every path, so that
// TFLOP/s compares paths (and attention_sdpa.py) by time alone: the forward's useful causal
// work is QK^T and P.V over half the score matrix, 4*B*s^2*d / 2; the backward 2.5x that (five
// s^2*d matmuls: QK^T again, dV, dP, dQ, dK), also for the unfused backward that reads
// stored probabilities and does four. `flops_executed` is what the path computes:
//   unfused (cuBLAS batched GEMMs: the full s x s, masked entries included)
//     fwd 2 GEMMs = 4 B s^2 d, bwd 4 = 8 B s^2 d, selective bwd 5 = 10 B s^2 d
//   fused cuda, fp32 (kernels/cuda/attention.cu): tiles up to the diagonal, head dim padded to
//     kD in {16, 32, 64, 128, 192} (d 96 computes as 128): forward 64x64 tiles, 2 matmuls; dQ
//     pass 64 rows x 32 keys, 3 (S, dP, dQ); dK/dV pass 64 keys x 32 rows, 4 (S, dP, dV, dK)
//   fused cuda, bf16 and fp16 (kernels/cuda/attention_tc.cu, on tensor cores): tiles up to the
//     diagonal, head dim padded to {64, 96, 128, 192}: forward 64 rows x tc_fwd_keys, 2
//     matmuls; backward tc_bwd_keys keys x tc_bwd_rows rows, 5 (S, dP, dV, dK, dQ)
//   fused cpu (kernels/cpu/cpu_attention.cpp): exactly the s(s+1)/2 causal pairs, 2 matmuls
//     forward, 5 backward
// Elementwise work (exp, softmax, dropout) is not counted anywhere.
// With v narrower than q and k (multi-latent attention) the matmuls over d_v count d_v:
// forward QK^T (d) and P.V (d_v), backward QK^T, dQ, dK (d) and dV, dP (d_v).
double causal_fwd_flops(const AttnShape& a) {
  const double half = static_cast<double>(a.B()) * static_cast<double>(a.s) * static_cast<double>(a.s);
  return half * static_cast<double>(a.d + a.value_dim());
}
double causal_bwd_flops(const AttnShape& a) {
  const double half = static_cast<double>(a.B()) * static_cast<double>(a.s) * static_cast<double>(a.s);
  return half * static_cast<double>(3 * a.d + 2 * a.value_dim());
}

namespace tiles = cuda::attention_tiles;  // the cuda kernels' tiles, shared with them

// Query-key pairs one head's row-major pass visits: blocks of `rows` queries, key tiles of
// `keys` up to the block's last row (the forward and the dQ pass).
double visited_by_query_blocks(int64_t S, int64_t rows, int64_t keys) {
  double area = 0;
  for (int64_t q0 = 0; q0 < S; q0 += rows) {
    const int64_t row_end = std::min(q0 + rows, S);
    area += static_cast<double>(rows * keys * ((row_end - 1) / keys + 1));
  }
  return area;
}
// ... and the dK/dV pass: blocks of `keys` keys, query tiles of `rows` from the diagonal down.
double visited_by_key_blocks(int64_t S, int64_t keys, int64_t rows) {
  double area = 0;
  const int64_t n_qt = (S + rows - 1) / rows;
  for (int64_t j0 = 0; j0 < S; j0 += keys) area += static_cast<double>(keys * rows * (n_qt - j0 / rows));
  return area;
}

enum class AttnPath { fused, unfused, selective };
enum class AttnPass { fwd, bwd };

double executed_flops(AttnPath path, AttnPass pass, const AttnShape& a) {
  const double B = static_cast<double>(a.B()), s = static_cast<double>(a.s), d = static_cast<double>(a.d);
  if (path != AttnPath::fused) {
    const double gemms = pass == AttnPass::fwd ? 2 : path == AttnPath::unfused ? 4 : 5;
    return gemms * 2.0 * B * s * s * d;
  }
  if (context().backend_name == "cpu") {
    const double pairs = B * s * (s + 1) / 2.0, dv = static_cast<double>(a.value_dim());
    return 2.0 * pairs * (pass == AttnPass::fwd ? d + dv : 3 * d + 2 * dv);
  }
  // v narrower than q runs padded to q's width (kernels/cuda/cuda_backend.cpp)
  if (bench_dtype() != DType::fp32) {
    const int kd = tiles::tc_head_dim(a.d);
    if (pass == AttnPass::fwd)
      return 2 * 2.0 * B * kd * visited_by_query_blocks(a.s, tiles::kFwdRows, tiles::tc_fwd_keys(kd));
    return 5 * 2.0 * B * kd * visited_by_key_blocks(a.s, tiles::tc_bwd_keys(kd), tiles::tc_bwd_rows(kd));
  }
  const double kd = static_cast<double>(tiles::padded_head_dim(a.d));
  if (pass == AttnPass::fwd) return 2 * 2.0 * B * kd * visited_by_query_blocks(a.s, tiles::kFwdRows, tiles::kFwdKeys);
  return 2.0 * B * kd *
         (3 * visited_by_query_blocks(a.s, tiles::kDqRows, tiles::kDqKeys) +
          4 * visited_by_key_blocks(a.s, tiles::kDkvKeys, tiles::kDkvRows));
}

// ---- the paths, as the layer calls the backend -----------------------------------------------

float attn_scale(const AttnShape& a) { return 1.0f / std::sqrt(static_cast<float>(a.d)); }

// What the unfused forward keeps for its backward (TransformerLayer's softmax_out,
// attn_dropout_mask, attn_dropout_out).
struct UnfusedSaved {
  Tensor probs, mask, dropped;
};

// TransformerLayer::core_attention_probs: scores = q k^T / sqrt(d) (freed once softmax has
// read them), probs = causal softmax, dropped = dropout(probs) with its u8 mask.
void unfused_probs(const AttnShape& a, const Tensor& q, const Tensor& k, UnfusedSaved& out) {
  Backend& be = *context().backend;
  const int64_t s = a.s, B = a.B();
  const Shape shape = {a.b, a.heads, s, s};
  {
    Tensor scores = be.empty(shape, bench_dtype());
    be.gemm(gemm_args(false, true, s, s, a.d, B, attn_scale(a)), q, k, scores);
    out.probs = be.empty(shape, bench_dtype());
    be.softmax_causal_fwd(scores.view({B, s, s}), out.probs.view({B, s, s}));
  }
  out.dropped = be.empty(shape, bench_dtype());
  out.mask = be.empty(shape, DType::u8);
  be.dropout_fwd(out.probs, attn_dropout_spec(a, g_attn_dropout), out.dropped, out.mask);
}

// TransformerLayer::forward_impl, unfused core attention: the probabilities, then ctx = dropped V.
Tensor unfused_fwd(const AttnShape& a, const Tensor& q, const Tensor& k, const Tensor& v, UnfusedSaved& saved) {
  Backend& be = *context().backend;
  unfused_probs(a, q, k, saved);
  Tensor ctx = be.empty({a.B(), a.s, a.d}, bench_dtype());
  be.gemm(gemm_args(false, false, a.s, a.d, a.s, a.B()), saved.dropped, v, ctx);
  return ctx;
}

// TransformerLayer::backward's unfused bwd.core_attn, in its order. With `release` the saved
// tensors are dropped as soon as they are read, as the layer does (selective: they were just
// recomputed); without, they stay for the next timed iteration.
void unfused_bwd(const AttnShape& a, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                 UnfusedSaved& S, bool release) {
  Backend& be = *context().backend;
  const int64_t s = a.s, d = a.d, B = a.B();
  const Shape score_shape = {a.b, a.heads, s, s}, head_shape = {B, s, d};
  Tensor d_dropped = be.empty(score_shape, bench_dtype());
  be.gemm(gemm_args(false, true, s, s, d, B), dout, v, d_dropped);
  Tensor dv = be.empty(head_shape, bench_dtype());
  be.gemm(gemm_args(true, false, s, d, s, B), S.dropped, dout, dv);
  if (release) S.dropped = Tensor();
  dv = Tensor();
  Tensor d_probs = be.empty(score_shape, bench_dtype());
  be.dropout_bwd(d_dropped, S.mask, kDropout, d_probs);
  if (release) S.mask = Tensor();
  d_dropped = Tensor();
  Tensor d_scores = be.empty(score_shape, bench_dtype());
  be.softmax_causal_bwd(d_probs.view({B, s, s}), S.probs.view({B, s, s}), d_scores.view({B, s, s}));
  if (release) S.probs = Tensor();
  d_probs = Tensor();
  Tensor dq = be.empty(head_shape, bench_dtype());
  be.gemm(gemm_args(false, false, s, d, s, B, attn_scale(a)), d_scores, k, dq);
  dq = Tensor();
  Tensor dk = be.empty(head_shape, bench_dtype());
  be.gemm(gemm_args(true, false, s, d, s, B, attn_scale(a)), d_scores, q, dk);
}

void fused_fwd(const AttnShape& a, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse) {
  Backend& be = *context().backend;
  out = be.empty({a.B(), a.s, a.value_dim()}, bench_dtype());
  lse = be.empty({a.B(), a.s}, DType::fp32);
  be.attention_fwd(q, k, v, attn_scale(a), attn_dropout_spec(a, g_attn_dropout), out, lse);
}

void fused_bwd(const AttnShape& a, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               const Tensor& dout, const Tensor& lse) {
  Backend& be = *context().backend;
  const Shape hs = {a.B(), a.s, a.d};
  Tensor dq = be.empty(hs, bench_dtype()), dk = be.empty(hs, bench_dtype());
  Tensor dv = be.empty({a.B(), a.s, a.value_dim()}, bench_dtype());
  be.attention_bwd(q, k, v, out, dout, lse, attn_scale(a), attn_dropout_spec(a, g_attn_dropout), dq, dk, dv);
}

// The caching allocator's requested bytes (exact sizes) across a window of stream-ordered work.
class MemWindow {
 public:
  MemWindow() : alloc_(context().backend->allocator()) {
    context().backend->synchronize();
    alloc_.reset_peak();
    before_ = alloc_.stats().requested_bytes.current;
  }
  double delta() const { return static_cast<double>(alloc_.stats().requested_bytes.current - before_); }
  double peak_delta() const { return static_cast<double>(alloc_.stats().requested_bytes.peak - before_); }

 private:
  CachingAllocator& alloc_;
  int64_t before_ = 0;
};

// One prepared case: inputs, what forward kept, and the call that is timed.
struct AttnCase {
  Tensor q, k, v, dout, out, lse;
  UnfusedSaved saved;
  std::function<void()> timed;
  double saved_bytes = 0;     // q, k, v + what the forward leaves allocated (its output included)
  double fwd_peak_bytes = 0;  // forward's allocator peak above its start (transients included)
  double bwd_peak_bytes = 0;  // backward's peak above its start (saved tensors excluded)
};

// Inputs, an untimed warm-up of the timed call, and the memory of one forward (and backward).
// Throws OutOfMemory where the shape does not fit.
std::unique_ptr<AttnCase> prepare_attention(AttnPath path, AttnPass pass, const AttnShape& a) {
  auto c = std::make_unique<AttnCase>();
  AttnCase& C = *c;
  const Shape hs = {a.B(), a.s, a.d}, vs = {a.B(), a.s, a.value_dim()};
  C.q = random_tensor(hs, bench_dtype(), -1.f, 1.f, 1);
  C.k = random_tensor(hs, bench_dtype(), -1.f, 1.f, 2);
  C.v = random_tensor(vs, bench_dtype(), -1.f, 1.f, 3);
  const double qkv_bytes = static_cast<double>(C.q.bytes() + C.k.bytes() + C.v.bytes());
  if (pass == AttnPass::bwd) C.dout = random_tensor(vs, bench_dtype(), -1.f, 1.f, 4);
  {
    MemWindow w;  // the forward this path's backward starts from, or the one that is timed
    if (path == AttnPath::fused) {
      fused_fwd(a, C.q, C.k, C.v, C.out, C.lse);
    } else {
      C.out = unfused_fwd(a, C.q, C.k, C.v, C.saved);
      if (path == AttnPath::selective) C.saved = UnfusedSaved{};  // selective keeps q, k, v (and ctx)
    }
    C.saved_bytes = qkv_bytes + w.delta();
    C.fwd_peak_bytes = w.peak_delta();
  }
  AttnCase* p = c.get();
  if (pass == AttnPass::fwd) {
    C.out = C.lse = Tensor();
    C.saved = UnfusedSaved{};
    if (path == AttnPath::fused) {
      C.timed = [p, a] {
        Tensor out, lse;
        fused_fwd(a, p->q, p->k, p->v, out, lse);
      };
    } else {
      C.timed = [p, a] {
        UnfusedSaved saved;
        unfused_fwd(a, p->q, p->k, p->v, saved);
      };
    }
  } else if (path == AttnPath::fused) {
    C.timed = [p, a] { fused_bwd(a, p->q, p->k, p->v, p->out, p->dout, p->lse); };
  } else if (path == AttnPath::unfused) {
    C.timed = [p, a] { unfused_bwd(a, p->q, p->k, p->v, p->dout, p->saved, false); };
  } else {
    C.timed = [p, a] {
      UnfusedSaved recomputed;  // recompute.core_attn, then bwd.core_attn
      unfused_probs(a, p->q, p->k, recomputed);
      unfused_bwd(a, p->q, p->k, p->v, p->dout, recomputed, true);
    };
  }
  MemWindow w;  // the warm-up call
  C.timed();
  context().backend->synchronize();
  if (pass == AttnPass::bwd) C.bwd_peak_bytes = w.peak_delta();
  return c;
}

std::string format_decimal_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

void BM_attention(benchmark::State& state, AttnPath path, AttnPass pass, bool mla = false) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const AttnShape want = attn_shape(mla);
  // Only the unfused paths hold s^2 tensors; they halve b to fit unless --attn-batch fixed it.
  const bool may_shrink = path != AttnPath::fused && g_attn_batch == 0;
  AttnShape a = want;
  std::unique_ptr<AttnCase> c;
  while (!c) {
    try {
      c = prepare_attention(path, pass, a);
    } catch (const OutOfMemory& e) {
      if (!may_shrink || a.b == 1) {
        const double scores = static_cast<double>(a.B()) * static_cast<double>(a.s) * static_cast<double>(a.s) *
                              static_cast<double>(dtype_size(bench_dtype()));
        std::string msg = "out of memory at b=" + std::to_string(a.b) + " s=" + std::to_string(a.s);
        if (path != AttnPath::fused) msg += " (one [b*heads, s, s] score tensor is " + format_decimal_bytes(scores) + ")";
        if (path != AttnPath::fused && a.b > 1) msg += "; try --attn-batch=" + std::to_string(a.b / 2);
        state.SkipWithError((msg + ": " + e.what()).c_str());
        be.allocator().empty_cache();
        return;
      }
      a.b /= 2;
    } catch (const InvalidArgument& e) {  // e.g. a head size the backend's kernels do not support
      state.SkipWithError(e.what());
      return;
    }
  }
  if (a.b != want.b)
    state.SetLabel("b=" + std::to_string(a.b) + ": b=" + std::to_string(want.b) + " out of memory");
  std::vector<double> ms;
  try {
    for (auto _ : state) ms.push_back(time_manual(state, c->timed));
  } catch (const OutOfMemory& e) {
    state.SkipWithError((std::string("out of memory while timing: ") + e.what()).c_str());
  }
  const double saved_bytes = c->saved_bytes, fwd_peak = c->fwd_peak_bytes, bwd_peak = c->bwd_peak_bytes;
  c.reset();
  be.allocator().empty_cache();
  if (ms.empty()) return;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  state.counters["ms_median"] = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  state.counters["ms_min"] = ms.front();
  state.counters["ms_max"] = ms.back();
  state.counters["seq"] = static_cast<double>(a.s);
  state.counters["batch"] = static_cast<double>(a.b);
  state.counters["heads"] = static_cast<double>(a.heads);
  state.counters["head_dim"] = static_cast<double>(a.d);
  state.counters["head_dim_v"] = static_cast<double>(a.value_dim());
  state.counters["dropout"] = g_attn_dropout;
  set_flop_counters(state, pass == AttnPass::fwd ? causal_fwd_flops(a) : causal_bwd_flops(a));
  const double exec = executed_flops(path, pass, a);
  state.counters["flops_executed"] = exec;
  state.counters["TFLOP/s_executed"] = benchmark::Counter(exec / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  // Bytes (the allocator's requested bytes, measured): saved_bytes = q, k, v plus what the
  // forward leaves allocated (its output included) -- fused: out + lse; unfused: out + probs
  // + mask + dropped; selective: out. The forward's transient peak above its start; the
  // backward's peak above its start (the saved tensors not counted).
  state.counters["saved_bytes"] = saved_bytes;
  if (pass == AttnPass::fwd)
    state.counters["fwd_peak_bytes"] = fwd_peak;
  else
    state.counters["bwd_peak_bytes"] = bwd_peak;
}

// The attention benchmarks' shape in the output's context (here: the shape is known once the
// backend is, after the flags).
void describe_attention_shape() {
  const KernelShapes k = shapes();
  benchmark::AddCustomContext("actbench_seq", std::to_string(k.s));
  benchmark::AddCustomContext("actbench_attn_batch", std::to_string(g_attn_batch > 0 ? g_attn_batch : k.b));
  benchmark::AddCustomContext("actbench_head_dim", std::to_string(g_head_dim > 0 ? g_head_dim : k.d));
  char p[32];
  std::snprintf(p, sizeof p, "%g", static_cast<double>(g_attn_dropout));
  benchmark::AddCustomContext("actbench_attn_dropout", p);
  benchmark::AddCustomContext("actbench_dtype", dtype_name(bench_dtype()));
}

void register_kernels() {
  describe_attention_shape();
  const KernelShapes k = shapes();
  auto reg = [](const std::string& name, auto fn) {
    // A shape past the device's memory (e.g. s = 32k score tensors) skips with the reason.
    auto guarded = [fn](benchmark::State& state) {
      try {
        fn(state);
      } catch (const OutOfMemory& e) {
        state.SkipWithError((std::string("skipped: ") + e.what()).c_str());
      }
      context().backend->allocator().empty_cache();
    };
    auto* b = benchmark::RegisterBenchmark((context().backend_name + "/" + name).c_str(), guarded);
    b->UseManualTime()->Unit(benchmark::kMillisecond);
    if (context().comm->size() > 1) b->Iterations(20);  // identical iteration counts on every rank
  };
  reg("copy", BM_copy);
  reg("layernorm_fwd", BM_layernorm_fwd);
  reg("layernorm_bwd", BM_layernorm_bwd);
  reg("softmax_causal_fwd", BM_softmax_fwd);
  reg("softmax_causal_bwd", BM_softmax_bwd);
  reg("dropout_fwd_attention", BM_dropout_fwd_attention);
  reg("dropout_bwd_attention", BM_dropout_bwd_attention);
  reg("gelu_fwd", BM_gelu_fwd);
  reg("gelu_bwd", BM_gelu_bwd);
  reg("squared_relu_fwd", BM_squared_relu_fwd);
  reg("squared_relu_bwd", BM_squared_relu_bwd);
  reg("bias_dropout_residual", BM_bias_dropout_residual);
  // The layer's GEMMs on one rank (y = x W^T), then core attention's batched ones.
  reg("gemm_qkv", [k](benchmark::State& s) { gemm_bench(s, k.rows, 3 * k.h_tp, k.h, 1, true); });
  reg("gemm_proj", [k](benchmark::State& s) { gemm_bench(s, k.rows, k.h, k.h_tp, 1, true); });
  reg("gemm_fc1", [k](benchmark::State& s) { gemm_bench(s, k.rows, k.ffn, k.h, 1, true); });
  reg("gemm_fc2", [k](benchmark::State& s) { gemm_bench(s, k.rows, k.h, k.ffn, 1, true); });
  reg("gemm_qk_t", [k](benchmark::State& s) { gemm_bench(s, k.s, k.s, k.d, k.b * k.heads, true); });
  reg("gemm_probs_v", [k](benchmark::State& s) { gemm_bench(s, k.s, k.d, k.s, k.b * k.heads, false); });
  reg("gemm_square", [k](benchmark::State& s) { gemm_bench(s, k.square, k.square, k.square, 1, true); });
  // Core attention per path at [b, heads, s, d] (--seq, --attn-batch).
  const std::pair<const char*, AttnPath> paths[] = {
      {"attention_fused", AttnPath::fused}, {"attention_unfused", AttnPath::unfused}};
  for (const auto& [name, path] : paths) {
    const AttnPath pp = path;
    reg(std::string(name) + "_fwd", [pp](benchmark::State& s) { BM_attention(s, pp, AttnPass::fwd); });
    reg(std::string(name) + "_bwd", [pp](benchmark::State& s) { BM_attention(s, pp, AttnPass::bwd); });
  }
  reg("attention_unfused_selective_bwd",
      [](benchmark::State& s) { BM_attention(s, AttnPath::selective, AttnPass::bwd); });
  // Multi-latent attention's heads (DeepSeek-V3: q, k 192 wide, v 128) at the same b, heads, s.
  reg("attention_fused_mla_fwd", [](benchmark::State& s) { BM_attention(s, AttnPath::fused, AttnPass::fwd, true); });
  reg("attention_fused_mla_bwd", [](benchmark::State& s) { BM_attention(s, AttnPath::fused, AttnPass::bwd, true); });
}

// A dropout probability: 0 <= p < 1.
float parse_probability(const char* name, const std::string& value) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || !(v >= 0.0 && v < 1.0))
    throw InvalidArgument(std::string("--") + name + " must be a probability, 0 <= p < 1 (got '" + value + "')");
  return static_cast<float>(v);
}

void parse_kernel_flags(int& argc, char** argv) {
  const std::string unset = "\n";  // no flag (an empty value is an error)
  const std::string seq = take_flag(argc, argv, "seq", unset);
  const std::string batch = take_flag(argc, argv, "attn-batch", unset);
  const std::string head_dim = take_flag(argc, argv, "head-dim", unset);
  const std::string dropout = take_flag(argc, argv, "attn-dropout", unset);
  if (seq != unset) g_seq = parse_positive("seq", seq);
  if (batch != unset) g_attn_batch = parse_positive("attn-batch", batch);
  if (head_dim != unset) g_head_dim = parse_positive("head-dim", head_dim);
  if (dropout != unset) g_attn_dropout = parse_probability("attn-dropout", dropout);
}

}  // namespace
}  // namespace actbench::bench

int main(int argc, char** argv) {
  return actbench::bench::bench_main(argc, argv, actbench::bench::register_kernels,
                                     actbench::bench::parse_kernel_flags);
}
