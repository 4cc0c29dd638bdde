// Kernel microbenchmarks at the layer's per-rank shapes.
//   bench_kernels --backend=cuda            22B per rank (t = 8): b 4, s 2048, h 6144, 8 heads of 128
//   bench_kernels --backend=cpu             small shapes (CI smoke)
// Memory-bound kernels report bytes moved and GB/s (pct_peak against the device's HBM
// bandwidth); GEMMs report FLOPs and TFLOP/s (pct_peak against dense bf16). A device copy and
// a large square GEMM are the same run's practical ceilings.
#include <random>
#include <vector>

#include "bench/bench_common.hpp"

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

KernelShapes shapes() {
  if (context().shape == "paper") return {2048 * 4, 6144, 8, 2048, 4, 128, 3072, 768, 8192};
  return {64 * 2, 256, 4, 64, 2, 64, 1024, 256, 512};
}

DType bench_dtype() { return context().backend_name == "cpu" ? DType::fp32 : DType::bf16; }

Tensor random_tensor(Shape shape, DType dtype, float lo = -1.f, float hi = 1.f) {
  Backend& be = *context().backend;
  Tensor t = be.empty(std::move(shape), dtype);
  if (be.computes()) {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(lo, hi);
    for (float& v : host) v = u(rng);
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

DropoutSpec spec_for(const Tensor& t, uint32_t site) {
  DropoutSpec spec;
  spec.p = 0.1f;
  spec.seed = 1234;
  spec.site = site;
  spec.outer = 1;
  spec.mid_local = spec.mid_global = t.numel();
  return spec;
}

void BM_dropout_fwd_attention(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.b * k.heads, k.s, k.s}, bench_dtype());
  Tensor y = be.empty(x.shape(), bench_dtype()), mask = be.empty(x.shape(), DType::u8);
  const DropoutSpec spec = spec_for(x, kSiteAttnProbs);
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
  be.dropout_fwd(x, spec_for(x, kSiteAttnProbs), y, mask);
  loop(state, [&] { be.dropout_bwd(y, mask, 0.1f, dx); });
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

void BM_bias_dropout_residual(benchmark::State& state) {
  if (skip_if_unavailable(state)) return;
  Backend& be = *context().backend;
  const KernelShapes k = shapes();
  Tensor x = random_tensor({k.rows, k.h}, bench_dtype()), r = random_tensor({k.rows, k.h}, bench_dtype());
  Tensor bias = random_tensor({k.h}, bench_dtype());
  Tensor out = be.empty({k.rows, k.h}, bench_dtype()), mask = be.empty({k.rows, k.h}, DType::u8);
  const DropoutSpec spec = spec_for(x, kSiteMlpOut);
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
  GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = kk;
  g.batch = batch;
  g.trans_b = trans_b;
  loop(state, [&] { be.gemm(g, a, b, c); });
  set_flop_counters(state, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kk) *
                               static_cast<double>(batch));
}

void register_kernels() {
  const KernelShapes k = shapes();
  auto reg = [](const std::string& name, auto fn) {
    auto* b = benchmark::RegisterBenchmark((context().backend_name + "/" + name).c_str(), fn);
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
  reg("bias_dropout_residual", BM_bias_dropout_residual);
  // The layer's GEMMs on one rank (y = x W^T), then core attention's batched ones.
  reg("gemm_qkv", [k](benchmark::State& s) { gemm_bench(s, k.rows, 3 * k.h_tp, k.h, 1, true); });
  reg("gemm_proj", [k](benchmark::State& s) { gemm_bench(s, k.rows, k.h, k.h_tp, 1, true); });
  reg("gemm_fc1", [k](benchmark::State& s) { gemm_bench(s, k.rows, k.ffn, k.h, 1, true); });
  reg("gemm_fc2", [k](benchmark::State& s) { gemm_bench(s, k.rows, k.h, k.ffn, 1, true); });
  reg("gemm_qk_t", [k](benchmark::State& s) { gemm_bench(s, k.s, k.s, k.d, k.b * k.heads, true); });
  reg("gemm_probs_v", [k](benchmark::State& s) { gemm_bench(s, k.s, k.d, k.s, k.b * k.heads, false); });
  reg("gemm_square", [k](benchmark::State& s) { gemm_bench(s, k.square, k.square, k.square, 1, true); });
}

}  // namespace
}  // namespace actbench::bench

int main(int argc, char** argv) { return actbench::bench::bench_main(argc, argv, actbench::bench::register_kernels); }
