// Every CPU op, forward and backward, against float64 references written here: analytic
// formulas for forwards and backwards, plus central finite differences (in double, of the
// double forward reference) for every backward op. Shapes are not powers of two; outputs
// are NaN-poisoned first so an element the op forgot to write fails.
// Tolerance per element, llm.c style: |got - ref| <= atol + rtol * |ref|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "runtime/error.hpp"
#include "reference_math.hpp"

namespace actbench {
namespace {

using testing::close, testing::finite_difference, testing::random_vec, testing::Tol, testing::Vec;

constexpr Tol kFp32{1e-5, 1e-5};
constexpr Tol kFp32Grad{1e-5, 1e-4};  // backward vs finite differences: a few more fp32 roundings
constexpr Tol kBf16{1e-3, 1e-2};      // one bf16 rounding of the output (2^-9 relative), fp32 math inside

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();

  // A tensor holding v rounded to dtype. References use read(tensor): the rounded values.
  Tensor make(const Vec& v, Shape shape, DType dtype = DType::fp32) {
    Tensor t = be->empty(std::move(shape), dtype);
    EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
    const std::vector<float> f(v.begin(), v.end());
    be->upload(f.data(), t);
    return t;
  }
  Tensor poisoned(Shape shape, DType dtype = DType::fp32) {
    Tensor t = be->empty(std::move(shape), dtype);
    const std::vector<float> nan(static_cast<size_t>(t.numel()), NAN);
    be->upload(nan.data(), t);
    return t;
  }
  Tensor mask(Shape shape) {  // u8 cannot hold NaN: poison with 7, neither 0 nor 1
    Tensor t = be->empty(std::move(shape), DType::u8);
    std::memset(t.data(), 7, t.bytes());
    return t;
  }
  Vec read(const Tensor& t) {
    std::vector<float> f(static_cast<size_t>(t.numel()));
    be->download(t, f.data());
    return Vec(f.begin(), f.end());
  }
};

// ---- backend identity ----------------------------------------------------------------

TEST_F(CpuOps, IdentityAndFactory) {
  EXPECT_STREQ(be->name(), "cpu");
  EXPECT_EQ(be->device_name(), "host-cpu");
  EXPECT_TRUE(be->computes());
  EXPECT_STREQ(make_backend("cpu")->name(), "cpu");
  Tensor z = be->zeros({3, 5}, DType::bf16);
  EXPECT_EQ(read(z), Vec(15, 0.0));
  // capacity emulates a device of that size
  auto small = make_cpu_backend(4 << 20);
  EXPECT_THROW(small->empty({8 << 20}, DType::fp32), OutOfMemory);
}

// ---- GEMM ---------------------------------------------------------------------------

Vec gemm_ref(const GemmArgs& g, const Vec& a, const Vec& b, const Vec& c) {
  Vec out(static_cast<size_t>(g.batch * g.m * g.n));
  for (int64_t bi = 0; bi < g.batch; ++bi)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          const double av = g.trans_a ? a[bi * g.m * g.k + p * g.m + i] : a[bi * g.m * g.k + i * g.k + p];
          const double bv = g.trans_b ? b[bi * g.k * g.n + j * g.k + p] : b[bi * g.k * g.n + p * g.n + j];
          acc += av * bv;
        }
        const size_t o = static_cast<size_t>(bi * g.m * g.n + i * g.n + j);
        out[o] = g.alpha * acc + (g.beta != 0 ? g.beta * c[o] : 0.0);
      }
  return out;
}

TEST_F(CpuOps, GemmAllTransposesBatchedAlphaBeta) {
  const int64_t m = 5, n = 11, k = 13, batch = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 0.5f, 1.f}) {
        const GemmArgs g = gemm_args(ta, tb, m, n, k, batch, 0.7f, beta);
        Tensor A = make(random_vec(batch * m * k, 1), {batch, ta ? k : m, ta ? m : k});
        Tensor B = make(random_vec(batch * k * n, 2), {batch, tb ? n : k, tb ? k : n});
        const Vec c0 = random_vec(batch * m * n, 3);
        // beta = 0 must not read C: poison it, a read would give NaN.
        Tensor C = beta == 0.f ? poisoned({batch, m, n}) : make(c0, {batch, m, n});
        const Vec c_in = read(C);
        be->gemm(g, A, B, C);
        EXPECT_TRUE(close(read(C), gemm_ref(g, read(A), read(B), c_in), kFp32))
            << "trans_a=" << ta << " trans_b=" << tb << " beta=" << beta;
      }
}

TEST_F(CpuOps, GemmBackwardFormsMatchFiniteDifferences) {
  // C = A B with A [m, k], B [k, n]; the layer's backward GEMMs are dA = dC B^T and dB = A^T dC.
  const int64_t m = 5, n = 11, k = 13;
  Tensor A = make(random_vec(m * k, 4), {m, k}), B = make(random_vec(k * n, 5), {k, n});
  Tensor DC = make(random_vec(m * n, 6), {m, n});
  const Vec a = read(A), b = read(B), dc = read(DC);
  const GemmArgs fwd = gemm_args(false, false, m, n, k);
  Tensor DA = poisoned({m, k}), DB = poisoned({k, n});
  be->gemm(gemm_args(false, true, m, k, n), DC, B, DA);
  be->gemm(gemm_args(true, false, k, n, m), A, DC, DB);
  EXPECT_TRUE(close(read(DA), finite_difference([&](const Vec& x) { return gemm_ref(fwd, x, b, {}); }, a, dc), kFp32Grad));
  EXPECT_TRUE(close(read(DB), finite_difference([&](const Vec& x) { return gemm_ref(fwd, a, x, {}); }, b, dc), kFp32Grad));
}

TEST_F(CpuOps, GemmOnBf16AndMixedStorage) {
  const int64_t m = 7, n = 9, k = 33;
  for (DType dt : {DType::bf16, DType::fp16}) {
    const GemmArgs g = gemm_args(false, true, m, n, k, 1, 1.f, 0.f);
    Tensor A = make(random_vec(m * k, 7), {m, k}, dt), B = make(random_vec(n * k, 8), {n, k}, dt);
    Tensor C = poisoned({m, n}, dt);
    be->gemm(g, A, B, C);
    // fp32 accumulation of the rounded inputs, then one rounding of the output.
    EXPECT_TRUE(close(read(C), gemm_ref(g, read(A), read(B), {}), kBf16)) << dtype_name(dt);
  }
  // bf16 A, fp32 B, bf16 C accumulated into (beta = 1).
  const GemmArgs g = gemm_args(true, false, m, n, k, 1, 0.5f, 1.f);
  Tensor A = make(random_vec(k * m, 9), {k, m}, DType::bf16), B = make(random_vec(k * n, 10), {k, n});
  Tensor C = make(random_vec(m * n, 11), {m, n}, DType::bf16);
  const Vec c_in = read(C);
  be->gemm(g, A, B, C);
  EXPECT_TRUE(close(read(C), gemm_ref(g, read(A), read(B), c_in), kBf16));
}

TEST_F(CpuOps, GemmOnRowViewsWritesOnlyTheView) {
  const int64_t m = 4, n = 6, k = 5;
  Tensor Abig = make(random_vec((m + 3) * k, 12), {m + 3, k}), B = make(random_vec(k * n, 13), {k, n});
  Tensor Cbig = poisoned({m + 2, n});
  Tensor A = Abig.rows(3, 3 + m), C = Cbig.rows(1, 1 + m);
  const GemmArgs g = gemm_args(false, false, m, n, k);
  be->gemm(g, A, B, C);
  EXPECT_TRUE(close(read(C), gemm_ref(g, read(A), read(B), {}), kFp32));
  const Vec all = read(Cbig);
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_TRUE(std::isnan(all[j])) << "row before the view was written";
    EXPECT_TRUE(std::isnan(all[(m + 1) * n + j])) << "row after the view was written";
  }
}

TEST_F(CpuOps, GemmShapeMismatchThrows) {
  const GemmArgs g = gemm_args(false, false, 4, 4, 4);
  Tensor A = be->empty({4, 4}, DType::fp32), B = be->empty({4, 5}, DType::fp32), C = be->empty({4, 4}, DType::fp32);
  try {
    be->gemm(g, A, B, C);
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: B has 20 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(be->gemm(gemm_args(false, false, 4, 4, 4, 2), A, A, C), InvalidArgument);  // batch 2
  EXPECT_THROW(be->gemm(g, A, A, be->empty({4, 4}, DType::u8)), InvalidArgument);
  EXPECT_THROW(be->gemm(g, A, C, A), InvalidArgument);  // C overlaps A
}

// ---- bias -----------------------------------------------------------------------------

Vec add_bias_ref(const Vec& y, const Vec& bias) {
  Vec out(y);
  for (size_t i = 0; i < y.size(); ++i) out[i] += bias[i % bias.size()];
  return out;
}

TEST_F(CpuOps, AddBiasAndBiasGrad) {
  const int64_t S = 3, B = 7, N = 13;  // a [S, B, N] activation: bias over the last dim
  Tensor Y = make(random_vec(S * B * N, 14), {S, B, N}), Bias = make(random_vec(N, 15), {N});
  const Vec y = read(Y), bias = read(Bias);
  be->add_bias(Y, Bias);
  EXPECT_TRUE(close(read(Y), add_bias_ref(y, bias), kFp32));

  Tensor DY = make(random_vec(S * B * N, 16), {S, B, N}), DB = poisoned({N});  // written, not accumulated
  const Vec dy = read(DY);
  be->bias_grad(DY, DB);
  Vec db(N, 0);
  for (size_t i = 0; i < dy.size(); ++i) db[i % N] += dy[i];
  EXPECT_TRUE(close(read(DB), db, kFp32));
  EXPECT_TRUE(close(read(DB), finite_difference([&](const Vec& b) { return add_bias_ref(y, b); }, bias, dy), kFp32Grad));

  EXPECT_THROW(be->add_bias(Y, be->empty({N + 1}, DType::fp32)), InvalidArgument);
  EXPECT_THROW(be->bias_grad(DY, be->empty({B}, DType::fp32)), InvalidArgument);
}

// ---- LayerNorm ------------------------------------------------------------------------

struct LnRef {
  Vec y, mean, rstd;
};
LnRef layernorm_ref(const Vec& x, const Vec& w, const Vec& b, int64_t M, int64_t H, double eps) {
  LnRef r{Vec(x.size()), Vec(M), Vec(M)};
  for (int64_t i = 0; i < M; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < H; ++j) mu += x[i * H + j];
    mu /= H;
    for (int64_t j = 0; j < H; ++j) var += (x[i * H + j] - mu) * (x[i * H + j] - mu);
    var /= H;  // biased
    r.mean[i] = mu;
    r.rstd[i] = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < H; ++j) r.y[i * H + j] = (x[i * H + j] - mu) * r.rstd[i] * w[j] + b[j];
  }
  return r;
}

// Analytic backward: xhat = (x - mean) rstd, g = dy w,
// dx = rstd (g - mean(g) - xhat mean(g xhat)), dw = sum_rows dy xhat, db = sum_rows dy.
struct LnGrads {
  Vec dx, dw, db;
};
LnGrads layernorm_bwd_ref(const Vec& dy, const Vec& x, const Vec& w, int64_t M, int64_t H, double eps) {
  const LnRef f = layernorm_ref(x, w, Vec(H, 0.0), M, H, eps);
  LnGrads r{Vec(x.size()), Vec(H, 0.0), Vec(H, 0.0)};
  for (int64_t i = 0; i < M; ++i) {
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < H; ++j) {
      const double xhat = (x[i * H + j] - f.mean[i]) * f.rstd[i], g = dy[i * H + j] * w[j];
      mg += g / H;
      mgx += g * xhat / H;
      r.dw[j] += dy[i * H + j] * xhat;
      r.db[j] += dy[i * H + j];
    }
    for (int64_t j = 0; j < H; ++j) {
      const double xhat = (x[i * H + j] - f.mean[i]) * f.rstd[i], g = dy[i * H + j] * w[j];
      r.dx[i * H + j] = f.rstd[i] * (g - mg - xhat * mgx);
    }
  }
  return r;
}

TEST_F(CpuOps, LayerNormForwardBackwardAnalyticAndFiniteDifferences) {
  const int64_t M = 7, H = 37;
  const double eps = 1e-5;
  Tensor X = make(random_vec(M * H, 17, -2, 3), {M, H}), W = make(random_vec(H, 18, 0.5, 1.5), {H}),
         B = make(random_vec(H, 19), {H}), DY = make(random_vec(M * H, 20), {M, H});
  const Vec x = read(X), w = read(W), b = read(B), dy = read(DY);
  Tensor Y = poisoned({M, H}), mean = poisoned({M}), rstd = poisoned({M});
  be->layernorm_fwd(X, W, B, static_cast<float>(eps), Y, mean, rstd);
  const LnRef f = layernorm_ref(x, w, b, M, H, eps);
  EXPECT_TRUE(close(read(Y), f.y, kFp32));
  EXPECT_TRUE(close(read(mean), f.mean, kFp32));
  EXPECT_TRUE(close(read(rstd), f.rstd, kFp32));

  Tensor DX = poisoned({M, H}), DW = poisoned({H}), DB = poisoned({H});
  be->layernorm_bwd(DY, X, W, mean, rstd, DX, DW, DB);
  const LnGrads an = layernorm_bwd_ref(dy, x, w, M, H, eps);
  EXPECT_TRUE(close(read(DX), an.dx, kFp32Grad));
  EXPECT_TRUE(close(read(DW), an.dw, kFp32Grad));
  EXPECT_TRUE(close(read(DB), an.db, kFp32Grad));
  auto y_of = [&](const Vec& xx, const Vec& ww, const Vec& bb) { return layernorm_ref(xx, ww, bb, M, H, eps).y; };
  EXPECT_TRUE(close(read(DX), finite_difference([&](const Vec& v) { return y_of(v, w, b); }, x, dy), kFp32Grad));
  EXPECT_TRUE(close(read(DW), finite_difference([&](const Vec& v) { return y_of(x, v, b); }, w, dy), kFp32Grad));
  EXPECT_TRUE(close(read(DB), finite_difference([&](const Vec& v) { return y_of(x, w, v); }, b, dy), kFp32Grad));
}

TEST_F(CpuOps, LayerNormOnBf16Storage) {
  const int64_t M = 5, H = 29;
  const double eps = 1e-5;
  const DType bf = DType::bf16;
  Tensor X = make(random_vec(M * H, 21, -2, 2), {M, H}, bf), W = make(random_vec(H, 22, 0.5, 1.5), {H}, bf),
         B = make(random_vec(H, 23), {H}, bf), DY = make(random_vec(M * H, 24), {M, H}, bf);
  const Vec x = read(X), w = read(W), b = read(B), dy = read(DY);
  Tensor Y = poisoned({M, H}, bf), mean = poisoned({M}), rstd = poisoned({M});  // statistics stay fp32
  be->layernorm_fwd(X, W, B, static_cast<float>(eps), Y, mean, rstd);
  const LnRef f = layernorm_ref(x, w, b, M, H, eps);
  EXPECT_TRUE(close(read(Y), f.y, kBf16));
  EXPECT_TRUE(close(read(mean), f.mean, kFp32));
  EXPECT_TRUE(close(read(rstd), f.rstd, kFp32));
  Tensor DX = poisoned({M, H}, bf), DW = poisoned({H}, bf), DB = poisoned({H}, bf);
  be->layernorm_bwd(DY, X, W, mean, rstd, DX, DW, DB);
  const LnGrads an = layernorm_bwd_ref(dy, x, w, M, H, eps);
  EXPECT_TRUE(close(read(DX), an.dx, kBf16));
  EXPECT_TRUE(close(read(DW), an.dw, kBf16));
  EXPECT_TRUE(close(read(DB), an.db, kBf16));
}

TEST_F(CpuOps, LayerNormOnRowViews) {
  const int64_t M = 4, H = 11;
  Tensor Xbig = make(random_vec((M + 2) * H, 25), {M + 2, H}), W = make(random_vec(H, 26, 0.5, 1.5), {H}),
         B = make(random_vec(H, 27), {H});
  Tensor Ybig = poisoned({M + 1, H}), mean = poisoned({M}), rstd = poisoned({M});
  Tensor X = Xbig.rows(2, 2 + M), Y = Ybig.rows(1, 1 + M);
  be->layernorm_fwd(X, W, B, 1e-5f, Y, mean, rstd);
  EXPECT_TRUE(close(read(Y), layernorm_ref(read(X), read(W), read(B), M, H, 1e-5).y, kFp32));
  EXPECT_TRUE(std::isnan(read(Ybig)[0]));
}

TEST_F(CpuOps, LayerNormShapeMismatchThrows) {
  Tensor X = be->empty({5, 8}, DType::fp32), W = be->empty({8}, DType::fp32), Y = be->empty({5, 8}, DType::fp32);
  Tensor m = be->empty({5}, DType::fp32), r = be->empty({5}, DType::fp32);
  EXPECT_THROW(be->layernorm_fwd(X, be->empty({7}, DType::fp32), W, 1e-5f, Y, m, r), InvalidArgument);
  EXPECT_THROW(be->layernorm_fwd(X, W, W, 1e-5f, Y, be->empty({4}, DType::fp32), r), InvalidArgument);
  EXPECT_THROW(be->layernorm_fwd(X, W, W, 1e-5f, Y, m, be->empty({5}, DType::bf16)), InvalidArgument);
  EXPECT_THROW(be->layernorm_bwd(X, X, W, m, r, be->empty({5, 7}, DType::fp32), W, W), InvalidArgument);
}

// ---- norms over a head (--qk-layernorm) -------------------------------------------------

// RMSNorm: rstd = 1 / sqrt(mean(x^2) + eps), y = x rstd w; with g = dy w, xhat = x rstd:
// dx = rstd (g - xhat mean(g xhat)), dw = sum_rows dy xhat.
struct RmsRef {
  Vec y, rstd, dx, dw;
};
RmsRef rmsnorm_ref(const Vec& x, const Vec& w, const Vec& dy, int64_t M, int64_t H, double eps) {
  RmsRef r{Vec(x.size()), Vec(M), Vec(x.size()), Vec(H, 0.0)};
  for (int64_t i = 0; i < M; ++i) {
    double ms = 0;
    for (int64_t j = 0; j < H; ++j) ms += x[i * H + j] * x[i * H + j] / H;
    const double rs = r.rstd[i] = 1 / std::sqrt(ms + eps);
    double mgx = 0;
    for (int64_t j = 0; j < H; ++j) mgx += dy[i * H + j] * w[j] * x[i * H + j] * rs / H;
    for (int64_t j = 0; j < H; ++j) {
      const double xhat = x[i * H + j] * rs;
      r.y[i * H + j] = xhat * w[j];
      r.dx[i * H + j] = rs * (dy[i * H + j] * w[j] - xhat * mgx);
      r.dw[j] += dy[i * H + j] * xhat;
    }
  }
  return r;
}

// q and k normalized per head: x viewed as [b * heads * s, D], D the head size (also odd sizes
// like 24, 40, 72), many rows, so the weight and bias gradients sum thousands of rows.
struct HeadNormCase {
  int64_t rows, head;
};
constexpr HeadNormCase kHeadNormCases[] = {{5000, 8}, {1344, 16}, {2999, 24}, {1344, 32}, {777, 40},
                                           {3072, 64}, {1344, 72}, {2048, 80}, {1001, 96}, {2304, 128}};

TEST_F(CpuOps, LayerNormOverAHeadWithManyRowsMatchesFloat64) {
  const double eps = 1e-6;
  for (DType dt : {DType::fp32, DType::bf16})
    for (const auto [M, H] : kHeadNormCases) {
      const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(M) + "x" + std::to_string(H);
      const uint32_t seed = static_cast<uint32_t>(100 + H);
      Tensor X = make(random_vec(M * H, seed, -2, 3), {M, H}, dt), W = make(random_vec(H, seed + 1, 0.5, 1.5), {H}, dt),
             B = make(random_vec(H, seed + 2), {H}, dt), DY = make(random_vec(M * H, seed + 3), {M, H}, dt);
      const Vec x = read(X), w = read(W), b = read(B), dy = read(DY);
      Tensor Y = poisoned({M, H}, dt), mean = poisoned({M}), rstd = poisoned({M});
      be->layernorm_fwd(X, W, B, static_cast<float>(eps), Y, mean, rstd);
      const LnRef f = layernorm_ref(x, w, b, M, H, eps);
      const Tol tol = dt == DType::fp32 ? kFp32 : kBf16, grad_tol = dt == DType::fp32 ? kFp32Grad : kBf16;
      EXPECT_TRUE(close(read(Y), f.y, tol)) << what;
      EXPECT_TRUE(close(read(mean), f.mean, kFp32)) << what;
      EXPECT_TRUE(close(read(rstd), f.rstd, kFp32)) << what;
      Tensor DX = poisoned({M, H}, dt), DW = poisoned({H}, dt), DB = poisoned({H}, dt);
      be->layernorm_bwd(DY, X, W, mean, rstd, DX, DW, DB);
      const LnGrads an = layernorm_bwd_ref(dy, x, w, M, H, eps);
      EXPECT_TRUE(close(read(DX), an.dx, grad_tol)) << what;
      EXPECT_TRUE(close(read(DW), an.dw, grad_tol)) << what;
      EXPECT_TRUE(close(read(DB), an.db, grad_tol)) << what;
    }
}

TEST_F(CpuOps, RmsNormOverAHeadWithManyRowsMatchesFloat64) {
  const double eps = 1e-6;
  for (DType dt : {DType::fp32, DType::bf16})
    for (const auto [M, H] : kHeadNormCases) {
      const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(M) + "x" + std::to_string(H);
      const uint32_t seed = static_cast<uint32_t>(200 + H);
      Tensor X = make(random_vec(M * H, seed, -2, 3), {M, H}, dt), W = make(random_vec(H, seed + 1, 0.5, 1.5), {H}, dt),
             DY = make(random_vec(M * H, seed + 2), {M, H}, dt);
      const Vec x = read(X), w = read(W), dy = read(DY);
      const RmsRef ref = rmsnorm_ref(x, w, dy, M, H, eps);
      Tensor Y = poisoned({M, H}, dt), rstd = poisoned({M});
      be->rmsnorm_fwd(X, W, static_cast<float>(eps), Y, rstd);
      const Tol tol = dt == DType::fp32 ? kFp32 : kBf16, grad_tol = dt == DType::fp32 ? kFp32Grad : kBf16;
      EXPECT_TRUE(close(read(Y), ref.y, tol)) << what;
      EXPECT_TRUE(close(read(rstd), ref.rstd, kFp32)) << what;
      Tensor DX = poisoned({M, H}, dt), DW = poisoned({H}, dt);
      be->rmsnorm_bwd(DY, X, W, rstd, DX, DW);
      EXPECT_TRUE(close(read(DX), ref.dx, grad_tol)) << what;
      EXPECT_TRUE(close(read(DW), ref.dw, grad_tol)) << what;
    }
}

TEST_F(CpuOps, RmsNormBackwardMatchesFiniteDifferences) {
  const int64_t M = 5, H = 24;
  const double eps = 1e-6;
  Tensor X = make(random_vec(M * H, 45, -2, 3), {M, H}), W = make(random_vec(H, 46, 0.5, 1.5), {H}),
         DY = make(random_vec(M * H, 47), {M, H});
  const Vec x = read(X), w = read(W), dy = read(DY);
  Tensor Y = poisoned({M, H}), rstd = poisoned({M}), DX = poisoned({M, H}), DW = poisoned({H});
  be->rmsnorm_fwd(X, W, static_cast<float>(eps), Y, rstd);
  be->rmsnorm_bwd(DY, X, W, rstd, DX, DW);
  auto y_of = [&](const Vec& xx, const Vec& ww) { return rmsnorm_ref(xx, ww, dy, M, H, eps).y; };
  EXPECT_TRUE(close(read(DX), finite_difference([&](const Vec& v) { return y_of(v, w); }, x, dy), kFp32Grad));
  EXPECT_TRUE(close(read(DW), finite_difference([&](const Vec& v) { return y_of(x, v); }, w, dy), kFp32Grad));
}

// ---- causal softmax -------------------------------------------------------------------

Vec softmax_ref(const Vec& s, int64_t B, int64_t S) {
  Vec p(s.size(), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      const double* row = s.data() + (b * S + i) * S;
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(row[j] - mx);
      for (int64_t j = 0; j <= i; ++j) p[(b * S + i) * S + j] = std::exp(row[j] - mx) / sum;
    }
  return p;
}

// ds = p (dp - sum_{j <= i} p dp), zero above the diagonal.
Vec softmax_bwd_ref(const Vec& dp, const Vec& p, int64_t B, int64_t S) {
  Vec ds(p.size(), 0);
  for (int64_t r = 0; r < B * S; ++r) {
    const int64_t i = r % S;
    double dot = 0;
    for (int64_t j = 0; j <= i; ++j) dot += p[r * S + j] * dp[r * S + j];
    for (int64_t j = 0; j <= i; ++j) ds[r * S + j] = p[r * S + j] * (dp[r * S + j] - dot);
  }
  return ds;
}

TEST_F(CpuOps, CausalSoftmaxForwardBackward) {
  const int64_t B = 3, S = 13;
  Tensor Sc = make(random_vec(B * S * S, 28, -4, 4), {B, S, S}), DP = make(random_vec(B * S * S, 29), {B, S, S});
  const Vec s = read(Sc), dp = read(DP);
  Tensor P = poisoned({B, S, S});
  be->softmax_causal_fwd(Sc, P);
  const Vec p = read(P), p_ref = softmax_ref(s, B, S);
  EXPECT_TRUE(close(p, p_ref, kFp32));
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t j = r % S + 1; j < S; ++j) ASSERT_EQ(p[r * S + j], 0.0) << "row " << r << ": above the diagonal must be exactly 0";
  Tensor DS = poisoned({B, S, S});
  be->softmax_causal_bwd(DP, P, DS);
  const Vec ds = read(DS);
  EXPECT_TRUE(close(ds, softmax_bwd_ref(dp, p_ref, B, S), kFp32Grad));
  EXPECT_TRUE(close(ds, finite_difference([&](const Vec& v) { return softmax_ref(v, B, S); }, s, dp), kFp32Grad));
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t j = r % S + 1; j < S; ++j) ASSERT_EQ(ds[r * S + j], 0.0);
}

TEST_F(CpuOps, CausalSoftmaxLeadingDimsLargeScoresAndBf16) {
  // [2, 3, S, S]: B is the product of the leading dims; scores of 1e3 must not overflow.
  const int64_t S = 6, B = 6;
  Vec s = random_vec(B * S * S, 30, -3, 3);
  for (size_t i = 0; i < s.size(); i += 5) s[i] += 1000;
  Tensor Sc = make(s, {2, 3, S, S}), P = poisoned({2, 3, S, S});
  be->softmax_causal_fwd(Sc, P);
  EXPECT_TRUE(close(read(P), softmax_ref(read(Sc), B, S), kFp32));
  Tensor Sb = make(s, {B, S, S}, DType::bf16), Pb = poisoned({B, S, S}, DType::bf16);
  be->softmax_causal_fwd(Sb, Pb);
  EXPECT_TRUE(close(read(Pb), softmax_ref(read(Sb), B, S), kBf16));
  EXPECT_THROW(be->softmax_causal_fwd(be->empty({2, 4, 5}, DType::fp32), be->empty({2, 4, 5}, DType::fp32)),
               InvalidArgument);
  EXPECT_THROW(be->softmax_causal_bwd(be->empty({2, 4, 4}, DType::fp32), P, P), InvalidArgument);
}

// ---- dropout --------------------------------------------------------------------------

DropoutSpec flat_spec(int64_t n, float p, uint32_t site = kSiteAttnProbs) {
  DropoutSpec s;
  s.p = p;
  s.seed = 77;
  s.layer = 3;
  s.site = site;
  s.mid_local = s.mid_global = n;
  return s;
}

TEST_F(CpuOps, DropoutIsDeterministicScaledAndKeepsOneMinusP) {
  const int64_t n = 100003;
  for (float p : {0.1f, 0.5f}) {
    Tensor X = make(random_vec(n, 31), {n});
    const Vec x = read(X);
    Tensor Y1 = poisoned({n}), Y2 = poisoned({n}), M1 = mask({n}), M2 = mask({n});
    const DropoutSpec spec = flat_spec(n, p);
    be->dropout_fwd(X, spec, Y1, M1);
    be->dropout_fwd(X, spec, Y2, M2);
    const Vec y = read(Y1), m = read(M1);
    EXPECT_EQ(y, read(Y2));
    EXPECT_EQ(m, read(M2));
    double kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(m[i], spec.keep(i) ? 1.0 : 0.0) << i;
      kept += m[i];
      ASSERT_EQ(y[i], m[i] ? static_cast<double>(static_cast<float>(x[i]) * spec.scale()) : 0.0) << i;
    }
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(kept, n * (1 - p), 4 * sigma) << "p=" << p;
    EXPECT_FLOAT_EQ(spec.scale(), 1 / (1 - p));
    // Another site, layer or seed gives another mask.
    DropoutSpec other_site = spec, other_layer = spec, other_seed = spec;
    other_site.site = kSiteMlpOut;
    other_layer.layer += 1;
    other_seed.seed += 1;
    for (const DropoutSpec& other : {other_site, other_layer, other_seed}) {
      Tensor M3 = mask({n}), Y3 = poisoned({n});
      be->dropout_fwd(X, other, Y3, M3);
      EXPECT_NE(read(M3), m) << "site " << other.site << " layer " << other.layer << " seed " << other.seed;
    }
  }
}

TEST_F(CpuOps, DropoutBackwardAnalyticAndFiniteDifferences) {
  const int64_t M = 9, N = 23;
  const float p = 0.3f;
  Tensor X = make(random_vec(M * N, 32), {M, N}), DY = make(random_vec(M * N, 33), {M, N});
  Tensor Y = poisoned({M, N}), Mk = mask({M, N}), DX = poisoned({M, N});
  be->dropout_fwd(X, flat_spec(M * N, p), Y, Mk);
  be->dropout_bwd(DY, Mk, p, DX);
  const Vec m = read(Mk), dy = read(DY);
  Vec ref(dy.size());
  for (size_t i = 0; i < dy.size(); ++i) ref[i] = m[i] ? dy[i] / (1 - p) : 0.0;
  EXPECT_TRUE(close(read(DX), ref, kFp32));
  // The forward with its mask fixed, as a function of x.
  auto fwd = [&](const Vec& v) {
    Vec y(v.size());
    for (size_t i = 0; i < v.size(); ++i) y[i] = m[i] ? v[i] / (1 - p) : 0.0;
    return y;
  };
  EXPECT_TRUE(close(read(DX), finite_difference(fwd, read(X), dy), kFp32Grad));
}

TEST_F(CpuOps, DropoutWithPZeroIsIdentity) {
  const int64_t n = 101;
  Tensor X = make(random_vec(n, 34), {n}), Y = poisoned({n}), Mk = mask({n});
  be->dropout_fwd(X, flat_spec(n, 0.f), Y, Mk);
  EXPECT_EQ(read(Y), read(X));
  EXPECT_EQ(read(Mk), Vec(n, 1.0));
  // p == 0: dx = dy whatever the mask holds.
  Tensor Zero = be->zeros({n}, DType::u8), DX = poisoned({n});
  be->dropout_bwd(X, Zero, 0.f, DX);
  EXPECT_EQ(read(DX), read(X));
}

TEST_F(CpuOps, DropoutShardIsTheSubBlockOfTheCanonicalMask) {
  // Canonical [outer 3, mid 8, inner 5], split into 4 shards of 2 mid rows (sequence parallel).
  const int64_t outer = 3, mid = 8, inner = 5, shards = 4, ml = mid / shards;
  DropoutSpec full = flat_spec(0, 0.3f);
  full.outer = outer;
  full.mid_local = full.mid_global = mid;
  full.inner = inner;
  const int64_t nf = outer * mid * inner, ns = outer * ml * inner;
  Tensor Yf = poisoned({nf}), Mf = mask({nf});
  be->dropout_fwd(make(Vec(nf, 1.0), {nf}), full, Yf, Mf);
  const Vec mf = read(Mf);
  int dropped = 0;
  for (int64_t r = 0; r < shards; ++r) {
    DropoutSpec shard = full;
    shard.mid_local = ml;
    shard.mid_offset = r * ml;
    Tensor Ys = poisoned({ns}), Ms = mask({ns});
    be->dropout_fwd(make(Vec(ns, 1.0), {ns}), shard, Ys, Ms);
    const Vec ms = read(Ms);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t m = 0; m < ml; ++m)
        for (int64_t i = 0; i < inner; ++i) {
          ASSERT_EQ(ms[(o * ml + m) * inner + i], mf[(o * mid + r * ml + m) * inner + i])
              << "shard " << r << " (" << o << ", " << m << ", " << i << ")";
          dropped += ms[(o * ml + m) * inner + i] == 0;
        }
  }
  EXPECT_GT(dropped, 0);  // the comparison is not between all-ones masks
}

TEST_F(CpuOps, DropoutShapeMismatchThrows) {
  Tensor X = be->empty({10}, DType::fp32), Y = be->empty({10}, DType::fp32), Mk = be->empty({10}, DType::u8);
  EXPECT_THROW(be->dropout_fwd(X, flat_spec(11, 0.1f), Y, Mk), InvalidArgument);         // spec numel
  EXPECT_THROW(be->dropout_fwd(X, flat_spec(10, 0.1f), Y, Y), InvalidArgument);          // mask not u8
  EXPECT_THROW(be->dropout_fwd(X, flat_spec(10, 0.1f), be->empty({9}, DType::fp32), Mk), InvalidArgument);
  EXPECT_THROW(be->dropout_bwd(X, be->empty({9}, DType::u8), 0.1f, Y), InvalidArgument);
}

// ---- GeLU and the fused residual --------------------------------------------------------

constexpr double kC = 0.044715;
Vec gelu_ref(const Vec& x) {
  const double k = std::sqrt(2 / std::numbers::pi);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = 0.5 * x[i] * (1 + std::tanh(k * (x[i] + kC * x[i] * x[i] * x[i])));
  return y;
}
Vec gelu_bwd_ref(const Vec& dy, const Vec& x) {
  const double k = std::sqrt(2 / std::numbers::pi);
  Vec dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = std::tanh(k * (x[i] + kC * x[i] * x[i] * x[i]));
    dx[i] = dy[i] * (0.5 * (1 + t) + 0.5 * x[i] * (1 - t * t) * k * (1 + 3 * kC * x[i] * x[i]));
  }
  return dx;
}

TEST_F(CpuOps, GeluForwardBackward) {
  const int64_t n = 211;
  Tensor X = make(random_vec(n, 35, -5, 5), {n}), DY = make(random_vec(n, 36), {n});
  const Vec x = read(X), dy = read(DY);
  Tensor Y = poisoned({n}), DX = poisoned({n});
  be->gelu_fwd(X, Y);
  EXPECT_TRUE(close(read(Y), gelu_ref(x), kFp32));
  be->gelu_bwd(DY, X, DX);
  EXPECT_TRUE(close(read(DX), gelu_bwd_ref(dy, x), kFp32Grad));
  EXPECT_TRUE(close(read(DX), finite_difference(gelu_ref, x, dy), kFp32Grad));
  Tensor Xb = make(x, {n}, DType::bf16), Yb = poisoned({n}, DType::bf16);
  be->gelu_fwd(Xb, Yb);
  EXPECT_TRUE(close(read(Yb), gelu_ref(read(Xb)), kBf16));
  EXPECT_THROW(be->gelu_bwd(DY, X, be->empty({n - 1}, DType::fp32)), InvalidArgument);
}

Vec squared_relu_ref(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] > 0 ? x[i] * x[i] : 0.0;
  return y;
}
Vec squared_relu_bwd_ref(const Vec& dy, const Vec& x) {
  Vec dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) dx[i] = x[i] > 0 ? 2 * x[i] * dy[i] : 0.0;
  return dx;
}

TEST_F(CpuOps, SquaredReluForwardBackward) {
  const int64_t n = 211;
  Vec x0 = random_vec(n, 48, -5, 5);
  x0[3] = 0;  // the kink: y = 0 and dx = 0 on both sides
  x0[4] = -0.0;
  Tensor X = make(x0, {n}), DY = make(random_vec(n, 49), {n});
  const Vec x = read(X), dy = read(DY);
  Tensor Y = poisoned({n}), DX = poisoned({n});
  be->squared_relu_fwd(X, Y);
  EXPECT_TRUE(close(read(Y), squared_relu_ref(x), kFp32));
  be->squared_relu_bwd(DY, X, DX);
  EXPECT_TRUE(close(read(DX), squared_relu_bwd_ref(dy, x), kFp32));
  EXPECT_TRUE(close(read(DX), finite_difference(squared_relu_ref, x, dy), kFp32Grad));
  // The backward from relu(x) instead of x (what a layer may keep) is the same.
  Vec relu(n);
  for (int64_t i = 0; i < n; ++i) relu[i] = std::max(x[i], 0.0);
  Tensor Relu = make(relu, {n}), DX2 = poisoned({n});
  be->squared_relu_bwd(DY, Relu, DX2);
  EXPECT_EQ(read(DX2), read(DX));
  // In place (dx = dy), and on 16-bit storage: one rounding of the output.
  be->squared_relu_bwd(DY, X, DY);
  EXPECT_EQ(read(DY), read(DX));
  for (DType dt : {DType::bf16, DType::fp16}) {
    Tensor Xb = make(x, {n}, dt), Yb = poisoned({n}, dt), DYb = make(dy, {n}, dt), DXb = poisoned({n}, dt);
    be->squared_relu_fwd(Xb, Yb);
    be->squared_relu_bwd(DYb, Xb, DXb);
    EXPECT_TRUE(close(read(Yb), squared_relu_ref(read(Xb)), kBf16)) << dtype_name(dt);
    EXPECT_TRUE(close(read(DXb), squared_relu_bwd_ref(read(DYb), read(Xb)), kBf16)) << dtype_name(dt);
  }
  // A NaN stays NaN (it must not come out as a clean 0); -inf is a negative like any other.
  Tensor Special = make({NAN, -INFINITY, 2.0}, {3}), Ys = poisoned({3}), DXs = poisoned({3});
  be->squared_relu_fwd(Special, Ys);
  be->squared_relu_bwd(make({1.0, 1.0, 1.0}, {3}), Special, DXs);
  const Vec ys = read(Ys), dxs = read(DXs);
  EXPECT_TRUE(std::isnan(ys[0]));
  EXPECT_TRUE(std::isnan(dxs[0]));
  EXPECT_EQ(ys[1], 0.0);
  EXPECT_EQ(dxs[1], 0.0);
  EXPECT_EQ(ys[2], 4.0);
  EXPECT_EQ(dxs[2], 4.0);
}

TEST_F(CpuOps, BiasDropoutResidualUsesTheDropoutMask) {
  const int64_t M = 9, N = 17;
  for (float p : {0.25f, 0.f}) {
    Tensor X = make(random_vec(M * N, 37), {M, N}), Bias = make(random_vec(N, 38), {N}), R = make(random_vec(M * N, 39), {M, N});
    const Vec x = read(X), bias = read(Bias), r = read(R);
    const DropoutSpec spec = flat_spec(M * N, p, kSiteAttnOut);
    Tensor OUT = poisoned({M, N}), MASK = mask({M, N});
    be->bias_dropout_residual_fwd(X, Bias, R, spec, OUT, MASK);
    Tensor Y = poisoned({M, N}), M2 = mask({M, N});  // same mask as plain dropout with the same spec
    be->dropout_fwd(X, spec, Y, M2);
    const Vec m = read(MASK);
    EXPECT_EQ(m, read(M2));
    Vec ref(M * N);
    for (int64_t i = 0; i < M * N; ++i) ref[i] = r[i] + (m[i] ? (x[i] + bias[i % N]) / (1 - p) : 0.0);
    EXPECT_TRUE(close(read(OUT), ref, kFp32)) << "p=" << p;
  }
  Tensor A = be->empty({4, 5}, DType::fp32), Mk = be->empty({4, 5}, DType::u8);
  EXPECT_THROW(be->bias_dropout_residual_fwd(A, be->empty({4}, DType::fp32), A, flat_spec(20, 0.1f), A, Mk), InvalidArgument);
  EXPECT_THROW(be->bias_dropout_residual_fwd(A, be->empty({5}, DType::fp32), A, flat_spec(21, 0.1f), A, Mk), InvalidArgument);
}

TEST_F(CpuOps, DropoutResidualWithoutBias) {
  // An undefined bias (--disable-bias-linear): out = residual + dropout(x), the same mask.
  const int64_t M = 9, N = 17;
  for (DType dt : {DType::fp32, DType::bf16})
    for (float p : {0.25f, 0.f}) {
      const std::string what = std::string(dtype_name(dt)) + " p=" + std::to_string(p);
      Tensor X = make(random_vec(M * N, 50), {M, N}, dt), R = make(random_vec(M * N, 51), {M, N}, dt);
      const Vec x = read(X), r = read(R);
      const DropoutSpec spec = flat_spec(M * N, p, kSiteMlpOut);
      Tensor OUT = poisoned({M, N}, dt), MASK = mask({M, N});
      be->bias_dropout_residual_fwd(X, Tensor(), R, spec, OUT, MASK);
      Tensor Y = poisoned({M, N}), M2 = mask({M, N});
      be->dropout_fwd(X, spec, Y, M2);
      const Vec m = read(MASK);
      EXPECT_EQ(m, read(M2)) << what;
      Vec ref(M * N);
      for (int64_t i = 0; i < M * N; ++i) ref[i] = r[i] + (m[i] ? x[i] / (1 - p) : 0.0);
      EXPECT_TRUE(close(read(OUT), ref, dt == DType::fp32 ? kFp32 : kBf16)) << what;
      // A zero bias gives the same bits: without a bias nothing else changes.
      Tensor OUT0 = poisoned({M, N}, dt), MASK0 = mask({M, N});
      be->bias_dropout_residual_fwd(X, be->zeros({N}, dt), R, spec, OUT0, MASK0);
      EXPECT_EQ(read(OUT0), read(OUT)) << what;
    }
}

// ---- rotary embedding ----------------------------------------------------------------------

// Rows of x [rows, D], row r at position r % S: pairs (i, i + R/2) of the first R dims rotated
// by sign * p * theta^(-2i/R); dims R..D-1 unchanged.
Vec rope_ref(const Vec& x, int64_t S, int64_t D, int64_t R, double theta, double sign) {
  Vec y(x);
  const int64_t half = R / 2;
  for (size_t r = 0; r < x.size() / D; ++r) {
    const double p = static_cast<double>(r % S);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = sign * p * std::pow(theta, -2.0 * i / R);
      const double lo = x[r * D + i], hi = x[r * D + half + i];
      y[r * D + i] = lo * std::cos(angle) - hi * std::sin(angle);
      y[r * D + half + i] = hi * std::cos(angle) + lo * std::sin(angle);
    }
  }
  return y;
}

// FNV-1a of a tensor's bytes.
uint64_t bits_hash(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(t.data());
  for (size_t i = 0; i < t.bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

TEST_F(CpuOps, RopeOnAllDimsKeepsTheBitsOfTheFullRotation) {
  // rotary_dim = D is the rotation over the whole head that rope_fwd/bwd computed before they
  // took rotary_dim: the hashes of those results, recorded then, for a fixed input.
  const int64_t B = 1, NH = 2, S = 7, D = 8, n = B * NH * S * D;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 37 % 23) / 8.0 - 1.4);
  const std::pair<DType, std::pair<uint64_t, uint64_t>> recorded[] = {
      {DType::fp32, {0xf99d6931f25547d1ull, 0x4341477860bcad31ull}},
      {DType::bf16, {0x4bf477ee7668681aull, 0xae4d013c233005feull}}};
  for (const auto& [dt, hashes] : recorded) {
    Tensor X = be->empty({B, NH, S, D}, dt), Y = poisoned({B, NH, S, D}, dt), DX = poisoned({B, NH, S, D}, dt);
    be->upload(x.data(), X);
    be->rope_fwd(X, 10000.0, D, Y);
    be->rope_bwd(X, 500.0, D, DX);
    EXPECT_EQ(bits_hash(Y), hashes.first) << dtype_name(dt);
    EXPECT_EQ(bits_hash(DX), hashes.second) << dtype_name(dt);
  }
}

TEST_F(CpuOps, RopeOnTheFirstDimsOfEachHeadMatchesFloat64) {
  // Megatron-Core's --rotary-percent: R = D * percent dims rotate with inv_freq over R.
  struct Case {
    int64_t D, R;
  };
  const int64_t B = 2, NH = 3, S = 11;
  for (const Case c : {Case{10, 4}, Case{16, 8}, Case{80, 20}, Case{24, 12}, Case{5, 4}, Case{12, 2}, Case{10, 10}})
    for (DType dt : {DType::fp32, DType::bf16}) {
      const std::string what = std::string(dtype_name(dt)) + " D=" + std::to_string(c.D) + " R=" + std::to_string(c.R);
      const Shape shape = {B, NH, S, c.D};
      const int64_t n = shape_numel(shape);
      const double theta = 10000.0;
      const Tol tol = dt == DType::fp32 ? Tol{1e-6, 1e-5} : kBf16;
      Tensor X = make(random_vec(n, 52, -2, 2), shape, dt);
      const Vec x = read(X);
      Tensor Y = poisoned(shape, dt);
      be->rope_fwd(X, theta, c.R, Y);
      const Vec y = read(Y);
      EXPECT_TRUE(close(y, rope_ref(x, S, c.D, c.R, theta, 1.0), tol)) << what;
      for (int64_t i = 0; i < n; ++i) {  // the dims past R: the input's bits
        if (i % c.D < c.R) continue;
        ASSERT_EQ(y[i], x[i]) << what << " element " << i;
      }
      Tensor DX = poisoned(shape, dt);
      be->rope_bwd(Y, theta, c.R, DX);  // R^T R = 1
      EXPECT_TRUE(close(read(DX), rope_ref(read(Y), S, c.D, c.R, theta, -1.0), tol)) << what;
      if (dt == DType::fp32) {
        EXPECT_TRUE(close(read(DX), x, tol)) << what;
      }
      be->rope_fwd(X, theta, c.R, X);  // in place
      EXPECT_EQ(read(X), y) << what;
    }
}

TEST_F(CpuOps, RopeOnTheFirstDimsIsTheFullRotationOfThoseDims) {
  // The first R dims of a head of D rotate exactly as a head of R would, bit for bit.
  const int64_t B = 2, NH = 2, S = 9, D = 12, R = 8;
  const Vec x = random_vec(B * NH * S * D, 53, -2, 2);
  Vec head(B * NH * S * R);
  for (int64_t r = 0; r < B * NH * S; ++r)
    for (int64_t i = 0; i < R; ++i) head[r * R + i] = x[r * D + i];
  Tensor X = make(x, {B, NH, S, D}), Y = poisoned({B, NH, S, D});
  Tensor H = make(head, {B, NH, S, R}), HY = poisoned({B, NH, S, R});
  be->rope_fwd(X, 500.0, R, Y);
  be->rope_fwd(H, 500.0, R, HY);
  const Vec y = read(Y), hy = read(HY);
  for (int64_t r = 0; r < B * NH * S; ++r)
    for (int64_t i = 0; i < R; ++i) ASSERT_EQ(y[r * D + i], hy[r * R + i]) << "row " << r << " dim " << i;
}

// ---- layout and data movement -----------------------------------------------------------

TEST_F(CpuOps, SplitAndMergeHeadsRoundTrip) {
  const int64_t S = 7, B = 3, NH = 5, D = 4, W = 3 * NH * D + 2;
  for (DType dt : {DType::fp32, DType::bf16}) {
    Tensor Src = make(random_vec(S * B * W, 40), {S, B, W}, dt);
    const Vec src = read(Src);
    const int64_t off = NH * D + 1;
    Tensor Dst = poisoned({B, NH, S, D}, dt);
    be->split_heads(Src, off, Dst);
    const Vec d = read(Dst);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t e = 0; e < D; ++e)
            ASSERT_EQ(d[((b * NH + h) * S + s) * D + e], src[(s * B + b) * W + off + h * D + e]);
    Tensor Back = poisoned({S, B, W}, dt);
    be->merge_heads(Dst, off, Back);
    const Vec back = read(Back);
    for (int64_t i = 0; i < S * B * W; ++i) {
      const int64_t col = i % W;
      if (col >= off && col < off + NH * D) {
        ASSERT_EQ(back[i], src[i]) << i;
      } else {
        ASSERT_TRUE(std::isnan(back[i])) << "merge_heads wrote column " << col << " outside its range";
      }
    }
    EXPECT_THROW(be->split_heads(Src, W - 3, Dst), InvalidArgument);
    EXPECT_THROW(be->merge_heads(Dst, W - 3, Back), InvalidArgument);
    EXPECT_THROW(be->split_heads(Src, 0, be->empty({B + 1, NH, S, D}, dt)), InvalidArgument);
  }
  EXPECT_THROW(be->split_heads(be->empty({S, B, W}, DType::fp32), 0, be->empty({B, NH, S, D}, DType::bf16)),
               InvalidArgument);
}

TEST_F(CpuOps, CopyAddInplaceUploadDownload) {
  const int64_t n = 23;
  Tensor A = make(random_vec(n, 41), {n}), B = make(random_vec(n, 42), {n}), C = poisoned({n});
  const Vec a = read(A), b = read(B);
  be->copy(A, C);
  EXPECT_EQ(read(C), a);
  be->add_inplace(C, B);
  Vec sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = static_cast<float>(a[i] + b[i]);
  EXPECT_TRUE(close(read(C), sum, kFp32));
  // Mixed dtypes: fp32 += bf16, then bf16 += fp32 (rounded once).
  Tensor Hb = make(random_vec(n, 43), {n}, DType::bf16), F = make(a, {n});
  const Vec hb = read(Hb);
  be->add_inplace(F, Hb);
  Vec ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = a[i] + hb[i];
  EXPECT_TRUE(close(read(F), ref, kFp32));
  be->add_inplace(Hb, A);
  const Vec hb2 = read(Hb);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(hb2[i], bf16_to_float(float_to_bf16(static_cast<float>(hb[i]) + static_cast<float>(a[i]))));
  // Upload rounds to the storage type; download widens exactly.
  const Vec v = random_vec(n, 44);
  const Vec vb = read(make(v, {n}, DType::bf16)), vh = read(make(v, {n}, DType::fp16));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(vb[i], bf16_to_float(float_to_bf16(static_cast<float>(v[i]))));
    EXPECT_EQ(vh[i], fp16_to_float(float_to_fp16(static_cast<float>(v[i]))));
  }
  EXPECT_THROW(be->copy(A, be->empty({n - 1}, DType::fp32)), InvalidArgument);
  EXPECT_THROW(be->copy(A, be->empty({n}, DType::bf16)), InvalidArgument);
  EXPECT_THROW(be->add_inplace(A, be->empty({n + 1}, DType::fp32)), InvalidArgument);
  be->fill_zero(C);
  EXPECT_EQ(read(C), Vec(n, 0.0));
  // Copy into a view (row 1 of 3) leaves the other rows alone.
  Tensor Big = poisoned({3, n});
  be->copy(A, Big.rows(1, 2).view({n}));
  const Vec big = read(Big);
  for (int64_t i = 0; i < 3 * n; ++i) {
    if (i / n == 1) {
      EXPECT_EQ(big[i], a[i - n]);
    } else {
      EXPECT_TRUE(std::isnan(big[i])) << i;
    }
  }
}

}  // namespace
}  // namespace actbench
