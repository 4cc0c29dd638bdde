// The cuda backend against the cpu reference: every op on fresh random data at shapes that
// are not powers of two, outputs NaN-poisoned first (an element the kernel forgets fails),
// NaN never passing; dropout masks bit for bit (and against DropoutSpec::keep on the host);
// the whole layer in the five configurations; activation bytes against meta and Table 2;
// the allocator's reserved bytes against what the device says it lost.
// Without a device every test skips with one line.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "dropout_specs.hpp"
#include "kernels/backend_comm.hpp"
#include "kernels/cuda/philox_groups.hpp"
#include "layer_harness.hpp"
#include "layers/theory_dims.hpp"
#include "runners/experiment.hpp"
#include "runners/presets.hpp"
#include "runtime/error.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Tol {
  double atol, rtol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::fp32: return {1e-5, 1e-5};
    case DType::fp16: return {2e-3, 2e-3};
    default: return {1e-2, 1e-2};
  }
}

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      gpu_ = make_backend("cuda");
    } catch (const InvalidArgument&) {
      GTEST_SKIP() << "no CUDA device: GPU test skipped";
    }
    cpu_ = make_backend("cpu");
  }

  // The same tensor on both backends.
  struct Both {
    Tensor g, c;
  };
  Both with_values(const Shape& shape, DType dt, const std::vector<float>& host) {
    Both t{gpu_->empty(shape, dt), cpu_->empty(shape, dt)};
    gpu_->upload(host.data(), t.g);
    cpu_->upload(host.data(), t.c);
    return t;
  }
  Both random(const Shape& shape, DType dt, float lo = -1.f, float hi = 1.f) {
    return with_values(shape, dt, random_values(static_cast<size_t>(shape_numel(shape)), next_seed_++, lo, hi));
  }
  // Output buffers: NaN everywhere (u8: 171, neither 0 nor 1).
  Both poisoned(const Shape& shape, DType dt) {
    const float poison = dt == DType::u8 ? 171.f : kNaN;
    return with_values(shape, dt, std::vector<float>(static_cast<size_t>(shape_numel(shape)), poison));
  }
  std::vector<float> get(Backend& be, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be.download(t, v.data());
    return v;
  }

  // gpu vs cpu: |g - c| <= atol + rtol |c| everywhere; NaN anywhere fails.
  void expect_close(const Both& t, Tol tol, const std::string& what) {
    const std::vector<float> g = get(*gpu_, t.g), c = get(*cpu_, t.c);
    ASSERT_EQ(g.size(), c.size()) << what;
    size_t bad = g.size(), nan_ref = 0;
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::isnan(c[i])) ++nan_ref;
      // equal values are exact, infinities included (lse -inf of a row that sees no key)
      const double err = g[i] == c[i] ? 0.0 : std::fabs(static_cast<double>(g[i]) - c[i]);
      const double bound = tol.atol + tol.rtol * std::fabs(static_cast<double>(c[i]));
      const double ratio = std::isnan(err) ? INFINITY : (err == 0 ? 0 : (bound > 0 ? err / bound : INFINITY));
      if (ratio > worst) {
        worst = ratio;
        bad = i;
      }
    }
    EXPECT_EQ(nan_ref, 0u) << what << ": the cpu reference holds NaN (an element it did not write?)";
    EXPECT_LE(worst, 1.0) << what << ": worst element " << bad << ": gpu " << (bad < g.size() ? g[bad] : 0.f)
                          << " cpu " << (bad < c.size() ? c[bad] : 0.f) << " (atol " << tol.atol << ", rtol "
                          << tol.rtol << ")";
  }

  // The tiny layer in `config`, bf16, no warm-up, one iteration.
  static ExperimentSpec tiny_bf16_spec(const char* config, Attention attention) {
    ExperimentSpec spec;
    spec.dims = find_preset("tiny").dims;
    spec.policy = parse_config(config);
    spec.policy.attention = attention;
    spec.dtype = DType::bf16;
    spec.warmup = 0;
    spec.iters = 1;
    return spec;
  }
  // The same experiment as rank 0 of t on the GPU and on meta: {gpu, meta}.
  std::pair<ExperimentResult, ExperimentResult> run_on_gpu_and_meta(const ExperimentSpec& spec, int t) {
    auto meta = make_backend("meta");
    auto gcomm = t == 1 ? make_backend_local_communicator(*gpu_) : make_backend_emulated_communicator(*gpu_, t);
    auto mcomm = t == 1 ? make_local_communicator() : make_emulated_communicator(t);
    return {run_experiment(*gpu_, *gcomm, spec), run_experiment(*meta, *mcomm, spec)};
  }

  // Fused attention [B, S, D] on both backends from the same inputs: out and lse of the
  // forward, then dq, dk, dv of the backward, both fed the cpu's out and lse.
  // v_dim: v's (and the output's) head size, 0 for q's (multi-latent attention's is narrower).
  void check_fused_attention(DType dt, const Shape& shape, float scale, const DropoutSpec& spec, Tol tol,
                             const std::string& what, int64_t v_dim = 0) {
    const Shape rows = {shape[0], shape[1]}, vshape = {shape[0], shape[1], v_dim ? v_dim : shape[2]};
    Both q = random(shape, dt, -2.f, 2.f), k = random(shape, dt, -2.f, 2.f), v = random(vshape, dt);
    Both out = poisoned(vshape, dt), lse = poisoned(rows, DType::fp32);
    gpu_->attention_fwd(q.g, k.g, v.g, scale, spec, out.g, lse.g);
    cpu_->attention_fwd(q.c, k.c, v.c, scale, spec, out.c, lse.c);
    expect_close(out, tol, "attention_fwd out " + what);
    expect_close(lse, {1e-4, 1e-5}, "attention_fwd lse " + what);
    Both out_ref = with_values(vshape, dt, get(*cpu_, out.c));
    Both lse_ref = with_values(rows, DType::fp32, get(*cpu_, lse.c));
    Both dout = random(vshape, dt);
    Both dq = poisoned(shape, dt), dk = poisoned(shape, dt), dv = poisoned(vshape, dt);
    gpu_->attention_bwd(q.g, k.g, v.g, out_ref.g, dout.g, lse_ref.g, scale, spec, dq.g, dk.g, dv.g);
    cpu_->attention_bwd(q.c, k.c, v.c, out_ref.c, dout.c, lse_ref.c, scale, spec, dq.c, dk.c, dv.c);
    expect_close(dq, tol, "attention_bwd dq " + what);
    expect_close(dk, tol, "attention_bwd dk " + what);
    expect_close(dv, tol, "attention_bwd dv " + what);
  }
  void expect_equal(const Both& t, const std::string& what) { expect_close(t, {0, 0}, what); }

  std::unique_ptr<Backend> gpu_, cpu_;
  uint32_t next_seed_ = 1;
};

const DType kFloatTypes[] = {DType::fp32, DType::bf16, DType::fp16};

// ---- data movement ---------------------------------------------------------------------

TEST_F(GpuOps, UploadDownloadRoundTripUsesTheCpuRounding) {
  for (DType dt : kFloatTypes) {
    std::vector<float> host = random_values(1237, 7, -3.f, 3.f);
    host[5] = kNaN;
    host[6] = 1e30f;  // inf in fp16
    Both t = with_values({1237}, dt, host);
    const std::vector<float> g = get(*gpu_, t.g), c = get(*cpu_, t.c);
    for (size_t i = 0; i < host.size(); ++i) {
      if (std::isnan(c[i])) {
        EXPECT_TRUE(std::isnan(g[i])) << dtype_name(dt) << " " << i;
      } else {
        EXPECT_EQ(g[i], c[i]) << dtype_name(dt) << " element " << i;
      }
    }
  }
  Both m = with_values({7}, DType::u8, {0, 1, 2, 3, 200, 255, 1});
  expect_equal(m, "u8 round trip");
}

TEST_F(GpuOps, CopyFillZeroAddInplace) {
  for (DType dt : kFloatTypes) {
    const Shape shape = {37, 19};
    Both src = random(shape, dt), dst = poisoned(shape, dt);
    gpu_->copy(src.g, dst.g);
    cpu_->copy(src.c, dst.c);
    expect_equal(dst, std::string("copy ") + dtype_name(dt));

    Both z = poisoned(shape, dt);
    gpu_->fill_zero(z.g);
    cpu_->fill_zero(z.c);
    expect_equal(z, std::string("fill_zero ") + dtype_name(dt));

    Both acc = random(shape, dt), add = random(shape, dt);
    gpu_->add_inplace(acc.g, add.g);
    cpu_->add_inplace(acc.c, add.c);
    expect_close(acc, tol_for(dt), std::string("add_inplace ") + dtype_name(dt));
  }
}

// ---- GEMM --------------------------------------------------------------------------------

TEST_F(GpuOps, GemmAllTransposesBatchesAndDtypes) {
  struct Types {
    DType ab, c;
  };
  const Types types[] = {{DType::fp32, DType::fp32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::fp32},
                         {DType::fp16, DType::fp16}, {DType::fp16, DType::fp32}};
  const int64_t m = 37, n = 29, k = 53;
  for (const Types& ty : types)
    for (int64_t batch : {1, 3})
      for (int trans = 0; trans < 4; ++trans)
        for (float beta : {0.f, 0.5f}) {
          GemmArgs g;
          g.trans_a = trans & 1;
          g.trans_b = trans & 2;
          g.m = m;
          g.n = n;
          g.k = k;
          g.batch = batch;
          g.alpha = 0.7f;
          g.beta = beta;
          Both a = random(g.trans_a ? Shape{batch, k, m} : Shape{batch, m, k}, ty.ab);
          Both b = random(g.trans_b ? Shape{batch, n, k} : Shape{batch, k, n}, ty.ab);
          // beta == 0: C is not read, so NaN in it must not survive; else C is an input.
          Both c = beta == 0.f ? poisoned({batch, m, n}, ty.c) : random({batch, m, n}, ty.c);
          gpu_->gemm(g, a.g, b.g, c.g);
          cpu_->gemm(g, a.c, b.c, c.c);
          const Tol tol = ty.c == DType::fp32 ? Tol{1e-4, 1e-4} : tol_for(ty.c);
          expect_close(c, tol,
                       std::string("gemm ") + dtype_name(ty.ab) + "->" + dtype_name(ty.c) + " batch " +
                           std::to_string(batch) + " ta " + std::to_string(g.trans_a) + " tb " +
                           std::to_string(g.trans_b) + " beta " + std::to_string(beta));
        }
}

TEST_F(GpuOps, GemmAtLayerLikeShapeAndUnsupportedDtypesThrow) {
  // [rows, h] x [3h, h]^T: the QKV GEMM of the test layers, fp32 (no TF32: 1e-4 holds).
  GemmArgs g;
  g.trans_b = true;
  g.m = 150;
  g.n = 90;
  g.k = 30;
  Both a = random({150, 30}, DType::fp32), b = random({90, 30}, DType::fp32), c = poisoned({150, 90}, DType::fp32);
  gpu_->gemm(g, a.g, b.g, c.g);
  cpu_->gemm(g, a.c, b.c, c.c);
  expect_close(c, {1e-4, 1e-4}, "gemm qkv-like fp32");

  Tensor a16 = gpu_->empty({150, 30}, DType::bf16);
  EXPECT_THROW(gpu_->gemm(g, a16, b.g, c.g), InvalidArgument) << "bf16 A with fp32 B";
  Tensor c16 = gpu_->empty({150, 90}, DType::bf16);
  EXPECT_THROW(gpu_->gemm(g, a.g, b.g, c16), InvalidArgument) << "fp32 A, B with bf16 C";
  Tensor on_host = cpu_->empty({150, 30}, DType::fp32);
  EXPECT_THROW(gpu_->gemm(g, on_host, b.g, c.g), InvalidArgument) << "a host tensor given to the cuda backend";
}

// ---- bias ----------------------------------------------------------------------------------

TEST_F(GpuOps, AddBiasAndBiasGrad) {
  for (DType dt : kFloatTypes)
    for (int64_t rows : {1, 111, 1537})  // 1537 rows: several chunks of the two-stage reduction
      for (int64_t cols : {45, 1000}) {
        const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
        Both y = random({rows, cols}, dt), bias = random({cols}, dt);
        gpu_->add_bias(y.g, bias.g);
        cpu_->add_bias(y.c, bias.c);
        expect_close(y, tol_for(dt), "add_bias " + what);

        Both dy = random({rows, cols}, dt), db = poisoned({cols}, dt);
        gpu_->bias_grad(dy.g, db.g);
        cpu_->bias_grad(dy.c, db.c);
        Tol t = tol_for(dt);
        if (dt == DType::fp32) t = {1e-4, 1e-5};  // sums of up to 1537 terms in a different order
        expect_close(db, t, "bias_grad " + what);
      }
}

// ---- LayerNorm -----------------------------------------------------------------------------

TEST_F(GpuOps, LayerNormForwardBackward) {
  // 45 columns: the scalar path; 1000 (and 6144) columns: the 16-byte vector path.
  const std::pair<int64_t, int64_t> shapes[] = {{185, 45}, {37, 1000}, {11, 6144}, {1290, 72}};
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : shapes) {
      const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      Both x = random({rows, cols}, dt, -2.f, 3.f), w = random({cols}, dt, 0.5f, 1.5f), b = random({cols}, dt);
      Both y = poisoned({rows, cols}, dt), mean = poisoned({rows}, DType::fp32), rstd = poisoned({rows}, DType::fp32);
      gpu_->layernorm_fwd(x.g, w.g, b.g, 1e-5f, y.g, mean.g, rstd.g);
      cpu_->layernorm_fwd(x.c, w.c, b.c, 1e-5f, y.c, mean.c, rstd.c);
      expect_close(y, tol_for(dt), "layernorm_fwd y " + what);
      expect_close(mean, {1e-5, 1e-5}, "layernorm_fwd mean " + what);
      expect_close(rstd, {1e-5, 1e-5}, "layernorm_fwd rstd " + what);

      Both dy = random({rows, cols}, dt);
      Both dx = poisoned({rows, cols}, dt), dw = poisoned({cols}, dt), db = poisoned({cols}, dt);
      // Both backends read the same statistics (the cpu's), so only the backward is compared.
      Both mean_ref = with_values({rows}, DType::fp32, get(*cpu_, mean.c));
      Both rstd_ref = with_values({rows}, DType::fp32, get(*cpu_, rstd.c));
      gpu_->layernorm_bwd(dy.g, x.g, w.g, mean_ref.g, rstd_ref.g, dx.g, dw.g, db.g);
      cpu_->layernorm_bwd(dy.c, x.c, w.c, mean_ref.c, rstd_ref.c, dx.c, dw.c, db.c);
      Tol t = tol_for(dt);
      if (dt == DType::fp32) t = {1e-4, 1e-5};  // dx cancels terms of size rstd * |g|; dw/db sum many rows
      expect_close(dx, t, "layernorm_bwd dx " + what);
      expect_close(dw, t, "layernorm_bwd dweight " + what);
      expect_close(db, t, "layernorm_bwd dbias " + what);
    }
}

// ---- norms over a head (--qk-layernorm) ------------------------------------------------------

// q and k normalized per head: [b * heads * s, D] with D the head size (also odd sizes like
// 24, 40, 72) and thousands of rows, which the weight and bias gradients sum.
// 5000 rows: more than 64 per chunk of the column reduction.
const std::pair<int64_t, int64_t> kHeadNormShapes[] = {{5000, 8},  {1344, 16}, {2999, 24}, {1344, 32}, {777, 40},
                                                       {2048, 64}, {1344, 72}, {1000, 80}, {1001, 96}, {1200, 128}};

// Tolerance of a sum over `rows` rows: fp32 partial sums in another order than the cpu's double
// ones; 16-bit: one rounding of the result on both sides.
Tol column_sum_tol(DType dt, int64_t rows) {
  return dt == DType::fp32 ? Tol{2e-6 * std::sqrt(static_cast<double>(rows)), 1e-5} : tol_for(dt);
}

TEST_F(GpuOps, LayerNormOverAHeadWithManyRows) {
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kHeadNormShapes) {
      const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      Both x = random({rows, cols}, dt, -2.f, 3.f), w = random({cols}, dt, 0.5f, 1.5f), b = random({cols}, dt);
      Both y = poisoned({rows, cols}, dt), mean = poisoned({rows}, DType::fp32), rstd = poisoned({rows}, DType::fp32);
      gpu_->layernorm_fwd(x.g, w.g, b.g, 1e-6f, y.g, mean.g, rstd.g);
      cpu_->layernorm_fwd(x.c, w.c, b.c, 1e-6f, y.c, mean.c, rstd.c);
      expect_close(y, tol_for(dt), "layernorm_fwd y " + what);
      expect_close(mean, {1e-5, 1e-5}, "layernorm_fwd mean " + what);
      expect_close(rstd, {1e-5, 1e-5}, "layernorm_fwd rstd " + what);
      Both dy = random({rows, cols}, dt);
      Both dx = poisoned({rows, cols}, dt), dw = poisoned({cols}, dt), db = poisoned({cols}, dt);
      Both mean_ref = with_values({rows}, DType::fp32, get(*cpu_, mean.c));
      Both rstd_ref = with_values({rows}, DType::fp32, get(*cpu_, rstd.c));
      gpu_->layernorm_bwd(dy.g, x.g, w.g, mean_ref.g, rstd_ref.g, dx.g, dw.g, db.g);
      cpu_->layernorm_bwd(dy.c, x.c, w.c, mean_ref.c, rstd_ref.c, dx.c, dw.c, db.c);
      expect_close(dx, dt == DType::fp32 ? Tol{1e-4, 1e-5} : tol_for(dt), "layernorm_bwd dx " + what);
      expect_close(dw, column_sum_tol(dt, rows), "layernorm_bwd dweight " + what);
      expect_close(db, column_sum_tol(dt, rows), "layernorm_bwd dbias " + what);
    }
}

TEST_F(GpuOps, RmsNormOverAHeadWithManyRows) {
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kHeadNormShapes) {
      const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      Both x = random({rows, cols}, dt, -2.f, 3.f), w = random({cols}, dt, 0.5f, 1.5f), dy = random({rows, cols}, dt);
      Both y = poisoned({rows, cols}, dt), rstd = poisoned({rows}, DType::fp32);
      gpu_->rmsnorm_fwd(x.g, w.g, 1e-6f, y.g, rstd.g);
      cpu_->rmsnorm_fwd(x.c, w.c, 1e-6f, y.c, rstd.c);
      expect_close(y, tol_for(dt), "rmsnorm_fwd y " + what);
      expect_close(rstd, {1e-5, 1e-5}, "rmsnorm_fwd rstd " + what);
      Both rstd_ref = with_values({rows}, DType::fp32, get(*cpu_, rstd.c));
      Both dx = poisoned({rows, cols}, dt), dw = poisoned({cols}, dt);
      gpu_->rmsnorm_bwd(dy.g, x.g, w.g, rstd_ref.g, dx.g, dw.g);
      cpu_->rmsnorm_bwd(dy.c, x.c, w.c, rstd_ref.c, dx.c, dw.c);
      expect_close(dx, dt == DType::fp32 ? Tol{1e-4, 1e-5} : tol_for(dt), "rmsnorm_bwd dx " + what);
      expect_close(dw, column_sum_tol(dt, rows), "rmsnorm_bwd dweight " + what);
    }
}

// ---- causal softmax ------------------------------------------------------------------------

TEST_F(GpuOps, CausalSoftmaxForwardBackward) {
  // Row lengths for every register-cached size (<= 256, 512, ..., 8192) and the long path.
  const std::pair<int64_t, int64_t> shapes[] = {{3, 37}, {2, 300}, {1, 1000}, {1, 2050}, {1, 8193}};
  for (DType dt : kFloatTypes)
    for (auto [batch, s] : shapes) {
      if (dt != DType::fp32 && s > 2050) continue;  // the big rows once, in fp32
      const std::string what = std::string(dtype_name(dt)) + " [" + std::to_string(batch) + ", " + std::to_string(s) +
                               ", " + std::to_string(s) + "]";
      Both scores = random({batch, s, s}, dt, -4.f, 4.f), probs = poisoned({batch, s, s}, dt);
      gpu_->softmax_causal_fwd(scores.g, probs.g);
      cpu_->softmax_causal_fwd(scores.c, probs.c);
      expect_close(probs, tol_for(dt), "softmax fwd " + what);
      // Above the diagonal: exact zeros, not small numbers.
      const std::vector<float> p = get(*gpu_, probs.g);
      for (int64_t r = 0; r < batch * s; ++r)
        for (int64_t j = r % s + 1; j < s; ++j)
          ASSERT_EQ(p[static_cast<size_t>(r * s + j)], 0.f) << what << " row " << r << " col " << j;

      // The backward of both reads the same probabilities (the cpu's).
      Both probs_ref = with_values({batch, s, s}, dt, get(*cpu_, probs.c));
      Both dprobs = random({batch, s, s}, dt), dscores = poisoned({batch, s, s}, dt);
      gpu_->softmax_causal_bwd(dprobs.g, probs_ref.g, dscores.g);
      cpu_->softmax_causal_bwd(dprobs.c, probs_ref.c, dscores.c);
      expect_close(dscores, tol_for(dt), "softmax bwd " + what);
    }
}

TEST_F(GpuOps, CausalSoftmaxRowOf16400) {
  // B = 1, S = 16400: 269M elements per tensor (1 GiB in fp32) on each backend.
  const int64_t s = 16400;
  // The simulator runs a thread per fiber: minutes here (its own tests cover the long-row path at S = 8193).
  if (gpu_->simulated()) GTEST_SKIP() << "1 GiB tensors: too slow on the simulator";
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < (size_t{8} << 30)) GTEST_SKIP() << "needs 8 GiB of free device memory";
  Both scores = random({1, s, s}, DType::fp32, -4.f, 4.f), probs = poisoned({1, s, s}, DType::fp32);
  gpu_->softmax_causal_fwd(scores.g, probs.g);
  cpu_->softmax_causal_fwd(scores.c, probs.c);
  scores = Both{};
  expect_close(probs, tol_for(DType::fp32), "softmax fwd S=16400");
  Both dprobs = random({1, s, s}, DType::fp32), dscores = poisoned({1, s, s}, DType::fp32);
  gpu_->softmax_causal_bwd(dprobs.g, probs.g, dscores.g);
  cpu_->softmax_causal_bwd(dprobs.c, probs.c, dscores.c);
  expect_close(dscores, tol_for(DType::fp32), "softmax bwd S=16400");
}

TEST_F(GpuOps, CausalSoftmaxWithMinusInfinityScores) {
  // -inf scores below the diagonal (where an additive mask puts them). In the long-row path
  // (S > 8192) a thread whose first column held -inf folded exp(-inf - (-inf)) = NaN into its
  // running sum and the whole row came out NaN; S = 300 is the register-cached path.
  for (DType dt : {DType::fp32, DType::bf16})
    for (int64_t s : {int64_t{300}, int64_t{8193}}) {
      const std::string what = std::string(dtype_name(dt)) + " S=" + std::to_string(s);
      std::vector<float> host = random_values(static_cast<size_t>(s * s), 99, -4.f, 4.f);
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < i; ++j)
          if (j % 5 == 1 || j % 7 == 3) host[static_cast<size_t>(i * s + j)] = -INFINITY;
      Both scores = with_values({1, s, s}, dt, host), probs = poisoned({1, s, s}, dt);
      host = {};
      gpu_->softmax_causal_fwd(scores.g, probs.g);
      cpu_->softmax_causal_fwd(scores.c, probs.c);
      scores = Both{};
      expect_close(probs, tol_for(dt), "softmax fwd with -inf " + what);
      Both probs_ref = with_values({1, s, s}, dt, get(*cpu_, probs.c));
      probs = Both{};
      Both dprobs = random({1, s, s}, dt), dscores = poisoned({1, s, s}, dt);
      gpu_->softmax_causal_bwd(dprobs.g, probs_ref.g, dscores.g);
      cpu_->softmax_causal_bwd(dprobs.c, probs_ref.c, dscores.c);
      expect_close(dscores, tol_for(dt), "softmax bwd with -inf " + what);
    }
}

// ---- dropout -------------------------------------------------------------------------------


TEST_F(GpuOps, PhiloxGroupsOfFourAreThePerElementWords) {
  for (uint64_t block : {0ull, 1ull, 77ull, (1ull << 32) + 5, 0xFFFFFFFFFFull}) {
    const Philox4 w = philox_words4(42, 7, kSiteAttnProbs, block);
    for (uint32_t k = 0; k < 4; ++k) EXPECT_EQ(w.v[k], philox_word(42, 7, kSiteAttnProbs, 4 * block + k)) << block;
  }
}

TEST_F(GpuOps, DropoutMasksBitwiseEqualToCpuAndToSpecKeep) {
  // inner 37: one Philox call per element; inner 36: groups of four.
  for (DType dt : kFloatTypes)
    for (int64_t inner : {37, 36})
      for (float p : {0.f, 0.1f, 0.5f}) {
        const DropoutSpec spec = make_spec(p, 3, 5, 11, 4, inner, kSiteAttnProbs);
        const Shape shape = {3, 5, inner};
        const std::string what = std::string(dtype_name(dt)) + " inner " + std::to_string(inner) + " p " + std::to_string(p);
        Both x = random(shape, dt), y = poisoned(shape, dt), mask = poisoned(shape, DType::u8);
        gpu_->dropout_fwd(x.g, spec, y.g, mask.g);
        cpu_->dropout_fwd(x.c, spec, y.c, mask.c);
        expect_equal(mask, "dropout mask " + what);
        const std::vector<float> m = get(*gpu_, mask.g);
        for (int64_t i = 0; i < spec.numel(); ++i)
          ASSERT_EQ(m[static_cast<size_t>(i)], spec.keep(i) ? 1.f : 0.f) << what << " element " << i;
        expect_close(y, tol_for(dt), "dropout y " + what);

        Both dy = random(shape, dt), dx = poisoned(shape, dt);
        gpu_->dropout_bwd(dy.g, mask.g, p, dx.g);
        cpu_->dropout_bwd(dy.c, mask.c, p, dx.c);
        expect_close(dx, tol_for(dt), "dropout_bwd " + what);
      }
}

TEST_F(GpuOps, DropoutMaskOfALargeTensorMatchesSpecKeep) {
  // Several grid-stride rounds and 64-bit canonical indices beyond 2^32 / 4 blocks.
  const DropoutSpec spec = make_spec(0.1f, 2, 3, 40000, 30000, 700000, kSiteMlpOut);
  Tensor x = gpu_->zeros({2, 3, 700000}, DType::bf16), y = gpu_->empty({2, 3, 700000}, DType::bf16);
  Tensor mask = gpu_->empty({2, 3, 700000}, DType::u8);
  gpu_->dropout_fwd(x, spec, y, mask);
  std::vector<float> m(static_cast<size_t>(spec.numel()));
  gpu_->download(mask, m.data());
  int64_t kept = 0;
  for (int64_t i = 0; i < spec.numel(); ++i) {
    ASSERT_EQ(m[static_cast<size_t>(i)], spec.keep(i) ? 1.f : 0.f) << "element " << i;
    kept += m[static_cast<size_t>(i)] != 0.f;
  }
  EXPECT_NEAR(static_cast<double>(kept) / spec.numel(), 0.9, 0.01);
}

// ---- GeLU ----------------------------------------------------------------------------------

TEST_F(GpuOps, GeluForwardBackward) {
  for (DType dt : kFloatTypes) {
    const Shape shape = {37, 123};
    Both x = random(shape, dt, -5.f, 5.f), y = poisoned(shape, dt);
    gpu_->gelu_fwd(x.g, y.g);
    cpu_->gelu_fwd(x.c, y.c);
    expect_close(y, tol_for(dt), std::string("gelu_fwd ") + dtype_name(dt));
    Both dy = random(shape, dt), dx = poisoned(shape, dt);
    gpu_->gelu_bwd(dy.g, x.g, dx.g);
    cpu_->gelu_bwd(dy.c, x.c, dx.c);
    expect_close(dx, tol_for(dt), std::string("gelu_bwd ") + dtype_name(dt));
  }
}

// ---- squared ReLU --------------------------------------------------------------------------

TEST_F(GpuOps, SquaredReluForwardBackward) {
  // One fp32 product per output (2 * relu is exact), rounded once: the cpu's bits.
  for (DType dt : kFloatTypes) {
    const Shape shape = {37, 123};
    Both x = random(shape, dt, -5.f, 5.f), y = poisoned(shape, dt);
    gpu_->squared_relu_fwd(x.g, y.g);
    cpu_->squared_relu_fwd(x.c, y.c);
    expect_equal(y, std::string("squared_relu_fwd ") + dtype_name(dt));
    Both dy = random(shape, dt), dx = poisoned(shape, dt);
    gpu_->squared_relu_bwd(dy.g, x.g, dx.g);
    cpu_->squared_relu_bwd(dy.c, x.c, dx.c);
    expect_equal(dx, std::string("squared_relu_bwd ") + dtype_name(dt));
  }
  // A NaN stays NaN; -inf, -0 and 0 give 0.
  Both x = with_values({5}, DType::fp32, {kNaN, -INFINITY, -0.f, 0.f, 3.f}), y = poisoned({5}, DType::fp32);
  Both ones = with_values({5}, DType::fp32, std::vector<float>(5, 1.f)), dx = poisoned({5}, DType::fp32);
  gpu_->squared_relu_fwd(x.g, y.g);
  gpu_->squared_relu_bwd(ones.g, x.g, dx.g);
  const std::vector<float> yg = get(*gpu_, y.g), dxg = get(*gpu_, dx.g);
  EXPECT_TRUE(std::isnan(yg[0]) && std::isnan(dxg[0]));
  EXPECT_EQ(std::vector<float>(yg.begin() + 1, yg.end()), (std::vector<float>{0.f, 0.f, 0.f, 9.f}));
  EXPECT_EQ(std::vector<float>(dxg.begin() + 1, dxg.end()), (std::vector<float>{0.f, 0.f, 0.f, 6.f}));
}

// ---- rotary embedding on the first dims of each head --------------------------------------------

TEST_F(GpuOps, RopeOnTheFirstDimsOfEachHead) {
  struct Case {
    int64_t D, R;
  };
  const double theta = 10000.0;
  for (const Case c : {Case{16, 8}, Case{80, 20}, Case{24, 12}, Case{5, 4}, Case{14, 14}})
    for (DType dt : kFloatTypes) {
      const std::string what = std::string(dtype_name(dt)) + " D=" + std::to_string(c.D) + " R=" + std::to_string(c.R);
      const Shape shape = {2, 3, 37, c.D};
      Both x = random(shape, dt, -2.f, 2.f), y = poisoned(shape, dt);
      gpu_->rope_fwd(x.g, theta, c.R, y.g);
      cpu_->rope_fwd(x.c, theta, c.R, y.c);
      expect_close(y, tol_for(dt), "rope_fwd " + what);
      const std::vector<float> xs = get(*gpu_, x.g), ys = get(*gpu_, y.g);
      for (size_t i = 0; i < xs.size(); ++i) {  // the dims past R: the input's bits
        if (static_cast<int64_t>(i) % c.D < c.R) continue;
        ASSERT_EQ(ys[i], xs[i]) << what << " element " << i;
      }
      gpu_->rope_bwd(y.g, theta, c.R, y.g);  // in place, as the backward runs it
      cpu_->rope_bwd(y.c, theta, c.R, y.c);
      expect_close(y, tol_for(dt), "rope_bwd in place " + what);
    }
}

TEST_F(GpuOps, RopeOnTheFirstDimsIsTheFullRotationOfThoseDims) {
  // The first R dims of a head of D rotate exactly as a head of R would, bit for bit.
  const int64_t rows = 2 * 2 * 29, D = 12, R = 8;
  const std::vector<float> x = random_values(static_cast<size_t>(rows * D), 99, -2.f, 2.f);
  std::vector<float> head(static_cast<size_t>(rows * R));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < R; ++i) head[r * R + i] = x[r * D + i];
  for (DType dt : kFloatTypes) {
    Both X = with_values({2, 2, 29, D}, dt, x), Y = poisoned({2, 2, 29, D}, dt);
    Both H = with_values({2, 2, 29, R}, dt, head), HY = poisoned({2, 2, 29, R}, dt);
    gpu_->rope_fwd(X.g, 500.0, R, Y.g);
    gpu_->rope_fwd(H.g, 500.0, R, HY.g);
    const std::vector<float> y = get(*gpu_, Y.g), hy = get(*gpu_, HY.g);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < R; ++i)
        ASSERT_EQ(y[r * D + i], hy[r * R + i]) << dtype_name(dt) << " row " << r << " dim " << i;
  }
}

// ---- bias + dropout + residual --------------------------------------------------------------

TEST_F(GpuOps, BiasDropoutResidual) {
  for (DType dt : kFloatTypes)
    for (int64_t cols : {45, 44})
      for (float p : {0.f, 0.1f}) {
        // [s_local, b, h] rows 2*7..3*7 of a canonical [s*b, h] (sequence-parallel rank 2 of 3)
        const int64_t rows = 7 * 2;
        const DropoutSpec spec = make_spec(p, 1, rows, 3 * rows, 2 * rows, cols, kSiteAttnOut);
        const std::string what = std::string(dtype_name(dt)) + " cols " + std::to_string(cols) + " p " + std::to_string(p);
        Both x = random({rows, cols}, dt), bias = random({cols}, dt), res = random({rows, cols}, dt);
        Both out = poisoned({rows, cols}, dt), mask = poisoned({rows, cols}, DType::u8);
        gpu_->bias_dropout_residual_fwd(x.g, bias.g, res.g, spec, out.g, mask.g);
        cpu_->bias_dropout_residual_fwd(x.c, bias.c, res.c, spec, out.c, mask.c);
        expect_equal(mask, "bias_dropout_residual mask " + what);
        const std::vector<float> m = get(*gpu_, mask.g);
        for (int64_t i = 0; i < spec.numel(); ++i)
          ASSERT_EQ(m[static_cast<size_t>(i)], spec.keep(i) ? 1.f : 0.f) << what << " element " << i;
        expect_close(out, tol_for(dt), "bias_dropout_residual out " + what);
      }
}

TEST_F(GpuOps, DropoutResidualWithoutBias) {
  // An undefined bias (--disable-bias-linear): out = residual + dropout(x), the same mask.
  for (DType dt : kFloatTypes)
    for (int64_t cols : {45, 44})  // 44: the groups-of-4 Philox path
      for (float p : {0.f, 0.1f}) {
        const int64_t rows = 7 * 2;
        const DropoutSpec spec = make_spec(p, 1, rows, 3 * rows, 2 * rows, cols, kSiteMlpOut);
        const std::string what = std::string(dtype_name(dt)) + " cols " + std::to_string(cols) + " p " + std::to_string(p);
        Both x = random({rows, cols}, dt), res = random({rows, cols}, dt);
        Both out = poisoned({rows, cols}, dt), mask = poisoned({rows, cols}, DType::u8);
        gpu_->bias_dropout_residual_fwd(x.g, Tensor(), res.g, spec, out.g, mask.g);
        cpu_->bias_dropout_residual_fwd(x.c, Tensor(), res.c, spec, out.c, mask.c);
        expect_equal(mask, "dropout_residual mask " + what);
        const std::vector<float> m = get(*gpu_, mask.g);
        for (int64_t i = 0; i < spec.numel(); ++i)
          ASSERT_EQ(m[static_cast<size_t>(i)], spec.keep(i) ? 1.f : 0.f) << what << " element " << i;
        expect_close(out, tol_for(dt), "dropout_residual out " + what);
      }
}

TEST_F(GpuOps, DropoutRejectsWhatTheCpuRejects) {
  // p outside [0, 1) (dropout_threshold of a negative or NaN p is undefined behaviour) and a
  // shard that does not fit mid_global: InvalidArgument on both backends.
  const DropoutSpec bad_shard = make_spec(0.1f, 1, 4, 4, 1, 8, kSiteMlpOut);
  for (float p : {-0.1f, 1.f, 1.5f, kNaN}) {
    const DropoutSpec spec = make_spec(p, 1, 4, 4, 0, 8, kSiteMlpOut);
    for (Backend* be : {gpu_.get(), cpu_.get()}) {
      const std::string what = std::string(be->name()) + " p " + std::to_string(p);
      Tensor x = be->zeros({4, 8}, DType::fp32), y = be->empty({4, 8}, DType::fp32);
      Tensor bias = be->zeros({8}, DType::fp32), mask = be->zeros({4, 8}, DType::u8);
      EXPECT_THROW(be->dropout_fwd(x, spec, y, mask), InvalidArgument) << what;
      EXPECT_THROW(be->dropout_bwd(x, mask, p, y), InvalidArgument) << what;
      EXPECT_THROW(be->bias_dropout_residual_fwd(x, bias, x, spec, y, mask), InvalidArgument) << what;
      EXPECT_THROW(be->dropout_fwd(x, bad_shard, y, mask), InvalidArgument) << be->name() << " shard";
    }
  }
}

// ---- views at odd offsets and empty tensors --------------------------------------------------

TEST_F(GpuOps, LayerNormAndGemmOnViewsOneElementIntoTheirStorage) {
  // A view starting one element into its storage: 16-bit rows are only 2-byte aligned and fp32
  // rows 4-byte aligned although cols % (16 / element size) == 0, so layernorm must take its
  // scalar path and cuBLASLt be asked for kernels of that alignment (or the cuBLAS fallback).
  auto offset_view = [&](const Shape& shape, DType dt, const std::vector<float>& values) {
    const int64_t n = shape_numel(shape);
    Both base{gpu_->empty({n + 1}, dt), cpu_->empty({n + 1}, dt)};
    Both v{base.g.rows(1, n + 1).view(shape), base.c.rows(1, n + 1).view(shape)};
    gpu_->upload(values.data(), v.g);
    cpu_->upload(values.data(), v.c);
    return v;
  };
  auto offset_random = [&](const Shape& shape, DType dt) {
    return offset_view(shape, dt, random_values(static_cast<size_t>(shape_numel(shape)), next_seed_++));
  };
  auto offset_poisoned = [&](const Shape& shape, DType dt) {
    return offset_view(shape, dt, std::vector<float>(static_cast<size_t>(shape_numel(shape)), kNaN));
  };
  for (DType dt : kFloatTypes) {
    const int64_t rows = 37, cols = 1000;
    const std::string what = std::string(dtype_name(dt)) + " offset 1";
    Both x = offset_random({rows, cols}, dt), y = offset_poisoned({rows, cols}, dt);
    Both w = random({cols}, dt, 0.5f, 1.5f), b = random({cols}, dt);
    Both mean = poisoned({rows}, DType::fp32), rstd = poisoned({rows}, DType::fp32);
    ASSERT_NE(reinterpret_cast<uintptr_t>(x.g.data()) % 16, 0u);
    gpu_->layernorm_fwd(x.g, w.g, b.g, 1e-5f, y.g, mean.g, rstd.g);
    cpu_->layernorm_fwd(x.c, w.c, b.c, 1e-5f, y.c, mean.c, rstd.c);
    expect_close(y, tol_for(dt), "layernorm_fwd y " + what);
    Both dy = offset_random({rows, cols}, dt), dx = offset_poisoned({rows, cols}, dt);
    Both dw = poisoned({cols}, dt), db = poisoned({cols}, dt);
    Both mean_ref = with_values({rows}, DType::fp32, get(*cpu_, mean.c));
    Both rstd_ref = with_values({rows}, DType::fp32, get(*cpu_, rstd.c));
    gpu_->layernorm_bwd(dy.g, x.g, w.g, mean_ref.g, rstd_ref.g, dx.g, dw.g, db.g);
    cpu_->layernorm_bwd(dy.c, x.c, w.c, mean_ref.c, rstd_ref.c, dx.c, dw.c, db.c);
    const Tol t = dt == DType::fp32 ? Tol{1e-4, 1e-5} : tol_for(dt);
    expect_close(dx, t, "layernorm_bwd dx " + what);
    expect_close(dw, t, "layernorm_bwd dweight " + what);

    for (int64_t batch : {1, 3})
      for (int trans = 0; trans < 4; ++trans) {
        GemmArgs g;
        g.trans_a = trans & 1;
        g.trans_b = trans & 2;
        g.m = 64;
        g.n = 48;
        g.k = 40;
        g.batch = batch;
        Both a = offset_random(g.trans_a ? Shape{batch, g.k, g.m} : Shape{batch, g.m, g.k}, dt);
        Both bm = offset_random(g.trans_b ? Shape{batch, g.n, g.k} : Shape{batch, g.k, g.n}, dt);
        Both c = offset_poisoned({batch, g.m, g.n}, dt);
        gpu_->gemm(g, a.g, bm.g, c.g);
        cpu_->gemm(g, a.c, bm.c, c.c);
        expect_close(c, dt == DType::fp32 ? Tol{1e-4, 1e-4} : tol_for(dt),
                     "gemm " + what + " batch " + std::to_string(batch) + " trans " + std::to_string(trans));
      }
  }
}

TEST_F(GpuOps, EmptyTensorsLaunchNothingAndSumsOverNoRowsAreZero) {
  for (DType dt : kFloatTypes) {
    const std::string what = dtype_name(dt);
    const int64_t cols = 45;
    // rows = 0: no row kernel runs, but dweight, dbias and db are sums over no rows: zeros.
    Both x = random({0, cols}, dt), w = random({cols}, dt), b = random({cols}, dt);
    Both y = poisoned({0, cols}, dt), mean = poisoned({0}, DType::fp32), rstd = poisoned({0}, DType::fp32);
    gpu_->layernorm_fwd(x.g, w.g, b.g, 1e-5f, y.g, mean.g, rstd.g);
    Both dx = poisoned({0, cols}, dt), dw = poisoned({cols}, dt), db = poisoned({cols}, dt);
    gpu_->layernorm_bwd(x.g, x.g, w.g, mean.g, rstd.g, dx.g, dw.g, db.g);
    cpu_->layernorm_bwd(x.c, x.c, w.c, mean.c, rstd.c, dx.c, dw.c, db.c);
    expect_equal(dw, "layernorm_bwd dweight of no rows " + what);
    expect_equal(db, "layernorm_bwd dbias of no rows " + what);
    Both db2 = poisoned({cols}, dt);
    gpu_->bias_grad(x.g, db2.g);
    cpu_->bias_grad(x.c, db2.c);
    expect_equal(db2, "bias_grad of no rows " + what);

    // n = 0 everywhere else: nothing is launched (a zero-block grid would be a launch error).
    Tensor e = gpu_->empty({0, cols}, dt), bias = gpu_->zeros({cols}, dt), m8 = gpu_->empty({0, cols}, DType::u8);
    gpu_->add_bias(e, bias);
    gpu_->add_inplace(e, e);
    gpu_->gelu_fwd(e, e);
    gpu_->gelu_bwd(e, e, e);
    const DropoutSpec none = make_spec(0.1f, 0, 1, 1, 0, cols, kSiteMlpOut);
    gpu_->dropout_fwd(e, none, e, m8);
    gpu_->dropout_bwd(e, m8, 0.1f, e);
    gpu_->bias_dropout_residual_fwd(e, bias, e, none, e, m8);
    Tensor sq = gpu_->empty({0, 7, 7}, dt);
    gpu_->softmax_causal_fwd(sq, sq);
    gpu_->softmax_causal_bwd(sq, sq, sq);
    Tensor q0 = gpu_->empty({0, 5, 8}, dt), lse0 = gpu_->empty({0, 5}, DType::fp32);
    gpu_->attention_fwd(q0, q0, q0, 1.f, make_spec(0.1f, 1, 0, 7, 2, 25, kSiteAttnProbs), q0, lse0);
    gpu_->attention_bwd(q0, q0, q0, q0, q0, lse0, 1.f, make_spec(0.1f, 1, 0, 7, 2, 25, kSiteAttnProbs), q0, q0, q0);
    Tensor s0 = gpu_->empty({3, 0, 8}, dt), lse_s0 = gpu_->empty({3, 0}, DType::fp32);
    gpu_->attention_fwd(s0, s0, s0, 1.f, make_spec(0.1f, 1, 3, 7, 2, 0, kSiteAttnProbs), s0, lse_s0);
    gpu_->attention_bwd(s0, s0, s0, s0, s0, lse_s0, 1.f, make_spec(0.1f, 1, 3, 7, 2, 0, kSiteAttnProbs), s0, s0, s0);
    Tensor sbw = gpu_->empty({0, 2, 12}, dt), heads = gpu_->empty({2, 3, 0, 4}, dt);
    gpu_->split_heads(sbw, 0, heads);
    gpu_->merge_heads(heads, 0, sbw);

    // GEMMs with m = 0 do nothing; with k = 0 they are C = beta C (beta = 0: zeros over NaN).
    GemmArgs g;
    g.m = 0;
    g.n = 4;
    g.k = 3;
    gpu_->gemm(g, gpu_->empty({0, 3}, dt), gpu_->empty({3, 4}, dt), gpu_->empty({0, 4}, dt));
    g.m = 3;
    g.k = 0;
    for (float beta : {0.f, 0.5f}) {
      g.beta = beta;
      Both c = beta == 0.f ? poisoned({3, 4}, dt) : random({3, 4}, dt);
      gpu_->gemm(g, gpu_->empty({3, 0}, dt), gpu_->empty({0, 4}, dt), c.g);
      cpu_->gemm(g, cpu_->empty({3, 0}, dt), cpu_->empty({0, 4}, dt), c.c);
      expect_close(c, tol_for(dt), "gemm k = 0 beta " + std::to_string(beta) + " " + what);
    }
    gpu_->synchronize();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << what;
  }
}

// ---- head layout -----------------------------------------------------------------------------

TEST_F(GpuOps, SplitAndMergeHeads) {
  for (DType dt : kFloatTypes) {
    const int64_t S = 7, B = 3, NH = 5, D = 6, W = 3 * NH * D + 4;
    Both sbw = random({S, B, W}, dt);
    for (int64_t off : {int64_t{0}, NH * D, 2 * NH * D + 4}) {
      const std::string what = std::string(dtype_name(dt)) + " offset " + std::to_string(off);
      Both heads = poisoned({B, NH, S, D}, dt);
      gpu_->split_heads(sbw.g, off, heads.g);
      cpu_->split_heads(sbw.c, off, heads.c);
      expect_equal(heads, "split_heads " + what);
      // merge into a destination with other data in it: columns outside the window are kept.
      Both back = random({S, B, W}, dt), src = random({B, NH, S, D}, dt);
      gpu_->merge_heads(src.g, off, back.g);
      cpu_->merge_heads(src.c, off, back.c);
      expect_equal(back, "merge_heads " + what);
    }
  }
}

// ---- timing and provenance -------------------------------------------------------------------

TEST_F(GpuOps, MarksTimeTheStreamAndVersionsAreReported) {
  Both a = random({512, 512}, DType::bf16), c = poisoned({512, 512}, DType::bf16);
  GemmArgs g;
  g.m = g.n = g.k = 512;
  const Backend::Mark t0 = gpu_->mark();
  for (int i = 0; i < 10; ++i) gpu_->gemm(g, a.g, a.g, c.g);
  const Backend::Mark t1 = gpu_->mark();
  const double ms = gpu_->ms_between(t0, t1);
  EXPECT_TRUE(std::isfinite(ms));
  EXPECT_GT(ms, 0.0);
  EXPECT_LT(ms, 10000.0);
  const Backend::Versions v = gpu_->versions();
  EXPECT_FALSE(v.driver.empty());
  EXPECT_FALSE(v.cuda_runtime.empty());
  EXPECT_FALSE(v.cublas.empty());
  EXPECT_STREQ(gpu_->name(), "cuda");
  EXPECT_FALSE(gpu_->device_name().empty());
  EXPECT_EQ(gpu_->allocator().device(), Device::cuda);
}

// ---- the whole layer ---------------------------------------------------------------------------

std::unique_ptr<Communicator> device_local(Backend& be) { return make_backend_local_communicator(be); }

TEST_F(GpuOps, WholeLayerMatchesCpuInEveryConfigurationFp32WithDropout) {
  // LayerDims {s, b, h, a}: head sizes 6 and 14, nothing a power of two.
  for (const LayerDims& dims : {LayerDims{12, 3, 30, 5}, LayerDims{33, 2, 56, 4}})
    for (const char* config : {"baseline", "sp", "full", "selective", "selective+sp"}) {
      const ExperimentSpec spec = small_spec(config, DType::fp32, 0.1f, dims);
      auto gcomm = device_local(*gpu_);
      auto ccomm = make_local_communicator();
      const auto got = run_layer_canonical(*gpu_, *gcomm, spec);
      const auto ref = run_layer_canonical(*cpu_, *ccomm, spec);
      expect_same_tensors(got, ref, 1e-4, 1e-4,
                          std::string("layer ") + config + " s=" + std::to_string(dims.s) + " h=" + std::to_string(dims.h));
    }
}

// ---- memory --------------------------------------------------------------------------------

TEST_F(GpuOps, ActivationBytesOnGpuEqualMetaAndTable2) {
  const LayerDims d = find_preset("tiny").dims;
  for (int t : {1, 2, 4})
    for (const char* config : {"baseline", "sp", "full", "selective", "selective+sp"}) {
      const ExperimentSpec spec = tiny_bf16_spec(config, Attention::unfused);
      const auto [g, m] = run_on_gpu_and_meta(spec, t);
      const std::string what = std::string(config) + " t=" + std::to_string(t);
      ASSERT_EQ(g.status, "ok") << what << ": " << g.message;
      EXPECT_EQ(g.act_bytes, m.act_bytes) << what;
      EXPECT_EQ(g.act_extra_bytes, m.act_extra_bytes) << what;
      EXPECT_EQ(g.fwd_retained_bytes, m.fwd_retained_bytes) << what;
      EXPECT_EQ(g.act_by_category, m.act_by_category) << what;
      EXPECT_EQ(static_cast<double>(g.act_bytes), theory::activation_bytes(theory_dims(d, t), spec.policy)) << what;
      EXPECT_EQ(g.fwd_retained_bytes, g.act_bytes + g.act_extra_bytes) << what;
      EXPECT_GT(g.total_ms.median, 0.0) << what;
    }
}

TEST_F(GpuOps, ReservedBytesAgreeWithDeviceMemoryInUse) {
  ExperimentSpec spec;
  spec.dims = {256, 2, 512, 8};  // {s, b, h, a}
  spec.policy = parse_config("baseline");
  spec.dtype = DType::bf16;
  spec.warmup = 0;
  spec.iters = 1;
  auto comm = device_local(*gpu_);
  // A first run loads every kernel and cuBLASLt plan, which takes device memory of its own.
  ASSERT_EQ(run_experiment(*gpu_, *comm, spec).status, "ok");
  CachingAllocator& alloc = gpu_->allocator();
  gpu_->synchronize();
  alloc.empty_cache();
  size_t free0 = 0, free1 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  const int64_t reserved0 = alloc.stats().reserved_bytes.current, segments0 = alloc.stats().segments.current;
  // The same run again: every segment it needs is new (the cache was emptied), every kernel
  // and plan already loaded.
  ASSERT_EQ(run_experiment(*gpu_, *comm, spec).status, "ok");
  gpu_->synchronize();
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  const int64_t reserved_delta = alloc.stats().reserved_bytes.current - reserved0;
  const int64_t new_segments = alloc.stats().segments.current - segments0;
  const int64_t used_delta = static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
  EXPECT_GT(reserved_delta, 0);
  EXPECT_NEAR(static_cast<double>(used_delta), static_cast<double>(reserved_delta),
              static_cast<double>((2 << 20) * (new_segments > 0 ? new_segments : 1)))
      << "segments " << new_segments;
}

}  // namespace

// ---- fused attention ---------------------------------------------------------------------------

namespace {

// The probabilities [B, S, S] of heads 2 .. 2+B of 7 (one tensor-parallel rank's heads), as the
// layer describes them: the Philox counter is the canonical index, not the local one.
DropoutSpec attention_spec(float p, int64_t B, int64_t S) { return make_spec(p, 1, B, 7, 2, S * S, kSiteAttnProbs); }

Tol attention_tol(DType dt) { return dt == DType::fp32 ? Tol{1e-4, 1e-4} : Tol{2e-2, 2e-2}; }

TEST_F(GpuOps, FusedAttentionForwardBackwardMatchCpu) {
  // S = 1, one ragged tile, several ragged tiles, many; D below, at and at the top of the
  // padded head dims the kernels are instantiated for.
  const int64_t B = 3;
  for (DType dt : {DType::fp32, DType::bf16})
    for (int64_t S : {1, 37, 200, 1030})
      for (int64_t D : {8, 64, 128})
        for (float p : {0.f, 0.1f}) {
          const std::string what = std::string(dtype_name(dt)) + " B=" + std::to_string(B) + " S=" + std::to_string(S) +
                                   " D=" + std::to_string(D) + " p=" + std::to_string(p);
          const Shape shape = {B, S, D};
          const float scale = 1.0f / std::sqrt(static_cast<float>(D));
          const DropoutSpec spec = attention_spec(p, B, S);
          check_fused_attention(dt, shape, scale, spec, attention_tol(dt), what);
        }
}

TEST_F(GpuOps, FusedAttentionFp16AndAnyDropoutLayout) {
  // fp16 storage; and a spec whose canonical offset changes inside one head's [S, S] block
  // (rows of S elements, every other one canonical), which takes the kernels' general path.
  const int64_t B = 2, S = 45, D = 20;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const DropoutSpec specs[] = {attention_spec(0.2f, B, S), make_spec(0.2f, B * S, 1, 2, 1, S, kSiteAttnProbs)};
  for (DType dt : {DType::fp16, DType::fp32})
    for (const DropoutSpec& spec : specs) {
      const std::string what = std::string(dtype_name(dt)) + " inner " + std::to_string(spec.inner);
      const Shape shape = {B, S, D};
      const Tol tol = dt == DType::fp32 ? attention_tol(dt) : Tol{5e-3, 5e-3};
      check_fused_attention(dt, shape, scale, spec, tol, what);
    }
}

TEST_F(GpuOps, FusedAttentionHeadDims16And96) {
  // D = 16 fills the smallest instantiation exactly (one column per lane); D = 96 runs in the
  // 128 one with 32 zero columns. S = 65 and 130: ragged query tiles of 64 and key tiles of 32.
  const int64_t B = 2;
  for (DType dt : {DType::fp32, DType::bf16})
    for (int64_t S : {65, 130})
      for (int64_t D : {16, 96})
        for (float p : {0.f, 0.1f}) {
          const std::string what = std::string(dtype_name(dt)) + " S=" + std::to_string(S) + " D=" + std::to_string(D) +
                                   " p=" + std::to_string(p);
          const Shape shape = {B, S, D};
          const float scale = 1.0f / std::sqrt(static_cast<float>(D));
          const DropoutSpec spec = attention_spec(p, B, S);
          check_fused_attention(dt, shape, scale, spec, attention_tol(dt), what);
        }
}

TEST_F(GpuOps, FusedAttentionHeadDim192AndANarrowerV) {
  // D = 192 (DeepSeek-V3's q·k head, 128 + 64 RoPE dims) and 129 run in the 192 instantiation;
  // multi-latent attention's v narrower than q and k (128 of 192, 16 of the functional tests'
  // 24) runs padded to q's head size. S = 70: ragged query tiles of 64 and key tiles of 16.
  const int64_t B = 2, S = 70;
  const std::pair<int64_t, int64_t> heads[] = {{192, 0}, {129, 0}, {192, 128}, {24, 16}};
  for (DType dt : {DType::fp32, DType::bf16})
    for (const auto& [D, v_dim] : heads)
      for (float p : {0.f, 0.1f}) {
        const std::string what = std::string(dtype_name(dt)) + " D=" + std::to_string(D) +
                                 " v=" + std::to_string(v_dim ? v_dim : D) + " p=" + std::to_string(p);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        check_fused_attention(dt, {B, S, D}, scale, attention_spec(p, B, S), attention_tol(dt), what, v_dim);
      }
}

// Context parallelism's ring (C = 2 ranks, chunks of c = 37 rows, T = 148): each rank's queries
// against every rank's keys, the partial results merged, then the backward of each key block
// from the merged out and lse; GQA group 2, dropout indexed in [T, T]. gpu and cpu run the same
// steps and are compared after each.
TEST_F(GpuOps, FusedAttentionContextParallelRingMatchesCpu) {
  const int64_t B = 4, group = 2, c = 37, C = 2, T = 2 * C * c, S = 2 * c, D = 64;
  const float scale = 0.125f;
  const Shape shape = {B, S, D}, kv_shape = {B / group, S, D}, row_shape = {B, S};
  auto rank = [&](int64_t i) { return SeqPositions::chunks(c, i * c, (2 * C - 1 - i) * c); };
  for (DType dt : {DType::fp32, DType::bf16}) {
    const Tol tol = attention_tol(dt);
    const DropoutSpec spec = attention_spec(0.1f, B, T);
    std::vector<Both> k, v;
    for (int64_t j = 0; j < C; ++j) {
      k.push_back(random(kv_shape, dt, -2.f, 2.f));
      v.push_back(random(kv_shape, dt));
    }
    for (int64_t i = 0; i < C; ++i) {
      const std::string what = std::string(dtype_name(dt)) + " rank " + std::to_string(i);
      Both q = random(shape, dt, -2.f, 2.f), dout = random(shape, dt);
      Both out = poisoned(shape, dt), lse = poisoned(row_shape, DType::fp32);
      for (int64_t step = 0; step < C; ++step) {  // the ring: own keys first
        const int64_t owner = (i - step + C) % C;
        const AttentionRows rows{rank(i), rank(owner), T};
        Both part = poisoned(shape, dt), part_lse = poisoned(row_shape, DType::fp32);
        const Both& o = step == 0 ? out : part;
        const Both& l = step == 0 ? lse : part_lse;
        gpu_->attention_fwd(q.g, k[owner].g, v[owner].g, scale, spec, o.g, l.g, rows);
        cpu_->attention_fwd(q.c, k[owner].c, v[owner].c, scale, spec, o.c, l.c, rows);
        expect_close(o, tol, "attention_fwd out " + what + " keys of rank " + std::to_string(owner));
        expect_close(l, {1e-4, 1e-5}, "attention_fwd lse " + what + " keys of rank " + std::to_string(owner));
        if (step == 0) continue;
        gpu_->attention_merge(out.g, lse.g, part.g, part_lse.g);
        cpu_->attention_merge(out.c, lse.c, part.c, part_lse.c);
        expect_close(out, tol, "attention_merge out " + what);
        expect_close(lse, {1e-4, 1e-5}, "attention_merge lse " + what);
      }
      // The backward of each key block reads the whole attention's out and lse (the cpu's).
      Both out_ref = with_values(shape, dt, get(*cpu_, out.c));
      Both lse_ref = with_values(row_shape, DType::fp32, get(*cpu_, lse.c));
      for (int64_t owner = 0; owner < C; ++owner) {
        const AttentionRows rows{rank(i), rank(owner), T};
        Both dq = poisoned(shape, dt), dk = poisoned(kv_shape, dt), dv = poisoned(kv_shape, dt);
        gpu_->attention_bwd(q.g, k[owner].g, v[owner].g, out_ref.g, dout.g, lse_ref.g, scale, spec, dq.g, dk.g, dv.g,
                            rows);
        cpu_->attention_bwd(q.c, k[owner].c, v[owner].c, out_ref.c, dout.c, lse_ref.c, scale, spec, dq.c, dk.c, dv.c,
                            rows);
        const std::string block = what + " keys of rank " + std::to_string(owner);
        expect_close(dq, tol, "attention_bwd dq " + block);
        expect_close(dk, tol, "attention_bwd dk " + block);
        expect_close(dv, tol, "attention_bwd dv " + block);
      }
    }
  }
}

// The unfused ops of a context-parallel rank (rows 2c of T = 4c placed as chunks 1 and 2):
// the causal softmax of its score rows, the dropout of its probabilities (inner elements
// placed in each head's [T, T]), RoPE at its positions, and copy_rows between its order and
// the whole sequence's.
TEST_F(GpuOps, ContextParallelPlacedRowsMatchCpu) {
  const int64_t c = 6, C = 2, T = 2 * C * c, R = 2 * c, heads = 3;
  const SeqPositions rows = SeqPositions::chunks(c, c, 2 * c);
  for (DType dt : kFloatTypes) {
    const std::string what = dtype_name(dt);
    const Shape scores_shape = {heads, R, T};
    Both scores = random(scores_shape, dt, -4.f, 4.f), probs = poisoned(scores_shape, dt);
    gpu_->softmax_causal_fwd(scores.g, probs.g, rows);
    cpu_->softmax_causal_fwd(scores.c, probs.c, rows);
    expect_close(probs, tol_for(dt), "softmax fwd " + what);
    Both probs_ref = with_values(scores_shape, dt, get(*cpu_, probs.c));
    Both dprobs = random(scores_shape, dt), dscores = poisoned(scores_shape, dt);
    gpu_->softmax_causal_bwd(dprobs.g, probs_ref.g, dscores.g, rows);
    cpu_->softmax_causal_bwd(dprobs.c, probs_ref.c, dscores.c, rows);
    expect_close(dscores, tol_for(dt), "softmax bwd " + what);

    DropoutSpec spec = make_spec(0.3f, 1, heads, heads, 0, R * T, kSiteAttnProbs);
    spec.inner_global = T * T;
    spec.inner_positions = SeqPositions::chunks(c * T, c * T, 2 * c * T);
    Both dropped = poisoned(scores_shape, dt), mask = poisoned(scores_shape, DType::u8);
    gpu_->dropout_fwd(probs_ref.g, spec, dropped.g, mask.g);
    cpu_->dropout_fwd(probs_ref.c, spec, dropped.c, mask.c);
    expect_equal(mask, "dropout mask " + what);
    expect_close(dropped, tol_for(dt), "dropout y " + what);

    const Shape heads_shape = {2, heads, R, 16};
    Both x = random(heads_shape, dt, -2.f, 2.f), y = poisoned(heads_shape, dt);
    gpu_->rope_fwd(x.g, 10000.0, 16, y.g, rows);
    cpu_->rope_fwd(x.c, 10000.0, 16, y.c, rows);
    expect_close(y, tol_for(dt), "rope_fwd " + what);
    gpu_->rope_bwd(y.g, 10000.0, 16, y.g, rows);
    cpu_->rope_bwd(y.c, 10000.0, 16, y.c, rows);
    expect_close(y, tol_for(dt), "rope_bwd in place " + what);

    for (DType d : {dt, DType::u8}) {  // the rank's second chunk (rows c..) to rows 2c.. of the sequence
      Both local = random({heads, R, 5}, d, 0.f, 200.f), whole = random({heads, T, 5}, d, 0.f, 200.f);
      gpu_->copy_rows(local.g, c, whole.g, 2 * c, c);
      cpu_->copy_rows(local.c, c, whole.c, 2 * c, c);
      expect_equal(whole, std::string("copy_rows ") + dtype_name(d));  // the other rows kept
    }
  }
}

TEST_F(GpuOps, FusedAttentionRejectsWhatItCannotRun) {
  const int64_t B = 2, S = 5;
  const DropoutSpec spec = attention_spec(0.f, B, S);
  Tensor big = gpu_->empty({B, S, 193}, DType::fp32), big_out = gpu_->empty({B, S, 193}, DType::fp32);
  Tensor lse = gpu_->empty({B, S}, DType::fp32);
  EXPECT_THROW(gpu_->attention_fwd(big, big, big, 1.f, spec, big_out, lse), InvalidArgument) << "D = 193";
  EXPECT_THROW(gpu_->attention_bwd(big, big, big, big, big, lse, 1.f, spec, big_out, big_out, big_out), InvalidArgument)
      << "D = 193";
  Tensor narrow = gpu_->empty({B, S, 8}, DType::fp32), wide = gpu_->empty({B, S, 16}, DType::fp32);
  EXPECT_THROW(gpu_->attention_fwd(narrow, narrow, wide, 1.f, spec, wide, lse), InvalidArgument) << "v wider than q";
  Tensor q = gpu_->empty({B, S, 8}, DType::fp32), out = gpu_->empty({B, S, 8}, DType::fp32);
  Tensor lse16 = gpu_->empty({B, S}, DType::bf16), q16 = gpu_->empty({B, S, 8}, DType::bf16);
  Tensor host = cpu_->empty({B, S, 8}, DType::fp32), other = gpu_->empty({B, S + 1, 8}, DType::fp32);
  EXPECT_THROW(gpu_->attention_fwd(q, q, q, 1.f, spec, out, lse16), InvalidArgument) << "bf16 lse";
  EXPECT_THROW(gpu_->attention_fwd(q, q16, q, 1.f, spec, out, lse), InvalidArgument) << "mixed dtypes";
  EXPECT_THROW(gpu_->attention_fwd(q, host, q, 1.f, spec, out, lse), InvalidArgument) << "a host tensor";
  EXPECT_THROW(gpu_->attention_fwd(q, other, q, 1.f, spec, out, lse), InvalidArgument) << "k of another shape";
  EXPECT_THROW(gpu_->attention_fwd(q, q, q, 1.f, attention_spec(0.f, B, S + 1), out, lse), InvalidArgument)
      << "a spec of another size";
  EXPECT_THROW(gpu_->attention_bwd(q, q, q, q, q, lse, 1.f, spec, out, other, out), InvalidArgument)
      << "dk of another shape";
}

TEST_F(GpuOps, WholeLayerWithFusedAttentionMatchesCpu) {
  // Head sizes 6, 14 and 64 (S = 70: two query tiles, a ragged second one).
  for (const LayerDims& dims : {LayerDims{12, 3, 30, 5}, LayerDims{33, 2, 56, 4}, LayerDims{70, 2, 128, 2}})
    for (const char* config : {"baseline", "sp", "full", "selective", "selective+sp", "full+sp"}) {
      ExperimentSpec spec = small_spec(config, DType::fp32, 0.1f, dims);
      spec.policy.attention = Attention::fused;
      auto gcomm = device_local(*gpu_);
      auto ccomm = make_local_communicator();
      const auto got = run_layer_canonical(*gpu_, *gcomm, spec);
      const auto ref = run_layer_canonical(*cpu_, *ccomm, spec);
      expect_same_tensors(got, ref, 1e-4, 1e-4,
                          std::string("fused layer ") + config + " s=" + std::to_string(dims.s) +
                              " h=" + std::to_string(dims.h));
    }
}

TEST_F(GpuOps, FusedAttentionActivationBytesOnGpuEqualMeta) {
  for (int t : {1, 2})
    for (const char* config : {"baseline", "sp", "full", "selective", "selective+sp"}) {
      const auto [g, m] = run_on_gpu_and_meta(tiny_bf16_spec(config, Attention::fused), t);
      const std::string what = std::string("fused ") + config + " t=" + std::to_string(t);
      ASSERT_EQ(g.status, "ok") << what << ": " << g.message;
      EXPECT_EQ(g.act_bytes, m.act_bytes) << what;
      EXPECT_EQ(g.act_extra_bytes, m.act_extra_bytes) << what;
      EXPECT_EQ(g.fwd_retained_bytes, m.fwd_retained_bytes) << what;
      EXPECT_EQ(g.fwd_retained_bytes, g.act_bytes + g.act_extra_bytes) << what;
    }
}

}  // namespace
