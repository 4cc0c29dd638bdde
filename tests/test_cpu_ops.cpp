// Every CPU op, forward and backward, against float64 references written here: analytic
// formulas for forwards, central finite differences of those references for backwards.
// Shapes are not powers of two; outputs are NaN-poisoned first so an unwritten element fails.
// Tolerance per element: |got - ref| <= atol + rtol * |ref| (llm.c style).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "kernels/backend.hpp"
#include "runtime/error.hpp"

namespace actbench {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();

  // A tensor holding v rounded to dtype; the reference must then use rounded() values.
  Tensor make(const Vec& v, Shape shape, DType dtype = DType::fp32) {
    Tensor t = be->empty(std::move(shape), dtype);
    std::vector<float> f(v.begin(), v.end());
    be->upload(f.data(), t);
    return t;
  }
  Tensor poisoned(Shape shape, DType dtype = DType::fp32) {
    Tensor t = be->empty(std::move(shape), dtype);
    std::vector<float> nan(static_cast<size_t>(t.numel()), NAN);
    be->upload(nan.data(), t);
    return t;
  }
  Vec read(const Tensor& t) {
    std::vector<float> f(static_cast<size_t>(t.numel()));
    be->download(t, f.data());
    return Vec(f.begin(), f.end());
  }
  Vec rounded(const Tensor& t) { return read(t); }
};

// Max over elements of |got - ref| / (atol + rtol |ref|); NaN is infinitely wrong.
double worst(const Vec& got, const Vec& ref, double atol, double rtol) {
  if (got.size() != ref.size()) return INFINITY;
  double w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]);
    if (std::isnan(e)) return INFINITY;
    w = std::max(w, e / (atol + rtol * std::fabs(ref[i])));
  }
  return w;
}

// d/dx_i of sum(f(x) * g) by central differences, for every i.
Vec finite_difference(const std::function<Vec(const Vec&)>& f, const Vec& x, const Vec& g, double h = 1e-5) {
  Vec grad(x.size());
  Vec xp = x;
  for (size_t i = 0; i < x.size(); ++i) {
    xp[i] = x[i] + h;
    const Vec fp = f(xp);
    xp[i] = x[i] - h;
    const Vec fm = f(xp);
    xp[i] = x[i];
    double d = 0;
    for (size_t j = 0; j < g.size(); ++j) d += (fp[j] - fm[j]) * g[j];
    grad[i] = d / (2 * h);
  }
  return grad;
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
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 0.5f}) {
        GemmArgs g;
        g.trans_a = ta;
        g.trans_b = tb;
        g.m = 5;
        g.n = 11;
        g.k = 13;
        g.batch = 3;
        g.alpha = 0.7f;
        g.beta = beta;
        const Vec a = random_vec(3 * 5 * 13, 1), b = random_vec(3 * 13 * 11, 2), c0 = random_vec(3 * 5 * 11, 3);
        Tensor A = make(a, {3, ta ? 13 : 5, ta ? 5 : 13}), B = make(b, {3, tb ? 11 : 13, tb ? 13 : 11});
        // beta = 0 must not read C: poison it.
        Tensor C = beta == 0.f ? poisoned({3, 5, 11}) : make(c0, {3, 5, 11});
        be->gemm(g, A, B, C);
        EXPECT_LE(worst(read(C), gemm_ref(g, rounded(A), rounded(B), c0), 1e-5, 1e-5), 1.0)
            << "ta=" << ta << " tb=" << tb << " beta=" << beta;
      }
}

TEST_F(CpuOps, GemmOnBf16StorageRoundsOnlyTheOutput) {
  GemmArgs g;
  g.m = 7;
  g.n = 9;
  g.k = 33;
  g.trans_b = true;
  Tensor A = make(random_vec(7 * 33, 4), {7, 33}, DType::bf16), B = make(random_vec(9 * 33, 5), {9, 33}, DType::bf16);
  Tensor C = poisoned({7, 9}, DType::bf16);
  be->gemm(g, A, B, C);
  // fp32 accumulation of the bf16 inputs, then one rounding to bf16 (relative 2^-8).
  EXPECT_LE(worst(read(C), gemm_ref(g, rounded(A), rounded(B), {}), 1e-6, 1.0 / 256), 1.0);
}

TEST_F(CpuOps, GemmShapeMismatchThrows) {
  GemmArgs g;
  g.m = 4;
  g.n = 4;
  g.k = 4;
  Tensor A = be->empty({4, 4}, DType::fp32), B = be->empty({4, 5}, DType::fp32), C = be->empty({4, 4}, DType::fp32);
  EXPECT_THROW(be->gemm(g, A, B, C), InvalidArgument);
}

// ---- bias ---------------------------------------------------------------------------

TEST_F(CpuOps, AddBiasAndBiasGrad) {
  const int64_t M = 7, N = 13;
  const Vec y = random_vec(M * N, 6), bias = random_vec(N, 7), dy = random_vec(M * N, 8);
  Tensor Y = make(y, {M, N});
  be->add_bias(Y, make(bias, {N}));
  Vec ref(y);
  for (int64_t i = 0; i < M * N; ++i) ref[i] += bias[i % N];
  EXPECT_LE(worst(read(Y), ref, 1e-6, 1e-6), 1.0);
  Tensor DB = poisoned({N});
  be->bias_grad(make(dy, {M, N}), DB);
  Vec db(N, 0);
  for (int64_t i = 0; i < M * N; ++i) db[i % N] += dy[i];
  EXPECT_LE(worst(read(DB), db, 1e-6, 1e-6), 1.0);
}

// ---- LayerNorm ------------------------------------------------------------------------

Vec layernorm_ref(const Vec& x, const Vec& w, const Vec& b, int64_t M, int64_t H, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < M; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < H; ++j) mu += x[r * H + j];
    mu /= H;
    for (int64_t j = 0; j < H; ++j) var += (x[r * H + j] - mu) * (x[r * H + j] - mu);
    var /= H;
    for (int64_t j = 0; j < H; ++j) y[r * H + j] = (x[r * H + j] - mu) / std::sqrt(var + eps) * w[j] + b[j];
  }
  return y;
}

TEST_F(CpuOps, LayerNormForwardAndBackwardAgainstFiniteDifferences) {
  const int64_t M = 7, H = 37;
  const double eps = 1e-5;
  const Vec x = random_vec(M * H, 9, -2, 3), w = random_vec(H, 10, 0.5, 1.5), b = random_vec(H, 11), g = random_vec(M * H, 12);
  Tensor X = make(x, {M, H}), W = make(w, {H}), B = make(b, {H});
  Tensor Y = poisoned({M, H}), mean = poisoned({M}), rstd = poisoned({M});
  be->layernorm_fwd(X, W, B, static_cast<float>(eps), Y, mean, rstd);
  EXPECT_LE(worst(read(Y), layernorm_ref(x, w, b, M, H, eps), 1e-5, 1e-5), 1.0);
  Tensor DX = poisoned({M, H}), DW = poisoned({H}), DB = poisoned({H});
  be->layernorm_bwd(make(g, {M, H}), X, W, mean, rstd, DX, DW, DB);
  const Vec dx_ref = finite_difference([&](const Vec& xx) { return layernorm_ref(xx, w, b, M, H, eps); }, x, g);
  const Vec dw_ref = finite_difference([&](const Vec& ww) { return layernorm_ref(x, ww, b, M, H, eps); }, w, g);
  const Vec db_ref = finite_difference([&](const Vec& bb) { return layernorm_ref(x, w, bb, M, H, eps); }, b, g);
  EXPECT_LE(worst(read(DX), dx_ref, 1e-5, 1e-4), 1.0);
  EXPECT_LE(worst(read(DW), dw_ref, 1e-5, 1e-4), 1.0);
  EXPECT_LE(worst(read(DB), db_ref, 1e-5, 1e-4), 1.0);
}

TEST_F(CpuOps, LayerNormOnBf16Storage) {
  const int64_t M = 5, H = 29;
  Tensor X = make(random_vec(M * H, 13, -2, 2), {M, H}, DType::bf16), W = make(random_vec(H, 14, 0.5, 1.5), {H}, DType::bf16),
         B = make(random_vec(H, 15), {H}, DType::bf16);
  Tensor Y = poisoned({M, H}, DType::bf16), mean = poisoned({M}), rstd = poisoned({M});
  be->layernorm_fwd(X, W, B, 1e-5f, Y, mean, rstd);
  EXPECT_LE(worst(read(Y), layernorm_ref(rounded(X), rounded(W), rounded(B), M, H, 1e-5), 1e-2, 1.0 / 128), 1.0);
}

// ---- causal softmax -------------------------------------------------------------------

Vec softmax_ref(const Vec& s, int64_t B, int64_t S) {
  Vec p(s.size(), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      const double* row = s.data() + (b * S + i) * S;
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(row[j] - mx);
      for (int64_t j = 0; j <= i; ++j) p[(b * S + i) * S + j] = std::exp(row[j] - mx) / sum;
    }
  return p;
}

TEST_F(CpuOps, CausalSoftmaxForwardBackward) {
  const int64_t B = 3, S = 13;
  const Vec s = random_vec(B * S * S, 16, -4, 4), g = random_vec(B * S * S, 17);
  Tensor Sc = make(s, {B, S, S}), P = poisoned({B, S, S});
  be->softmax_causal_fwd(Sc, P);
  const Vec p = read(P);
  EXPECT_LE(worst(p, softmax_ref(s, B, S), 1e-7, 1e-5), 1.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = i + 1; j < S; ++j) ASSERT_EQ(p[(b * S + i) * S + j], 0.0) << "above the diagonal must be exactly 0";
  Tensor DS = poisoned({B, S, S});
  be->softmax_causal_bwd(make(g, {B, S, S}), P, DS);
  Vec ds_ref = finite_difference([&](const Vec& ss) { return softmax_ref(ss, B, S); }, s, g);
  EXPECT_LE(worst(read(DS), ds_ref, 1e-5, 1e-4), 1.0);
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
  const float p = 0.1f;
  const Vec x = random_vec(n, 18);
  Tensor X = make(x, {n}), Y1 = poisoned({n}), Y2 = poisoned({n});
  Tensor M1 = be->empty({n}, DType::u8), M2 = be->empty({n}, DType::u8);
  be->dropout_fwd(X, flat_spec(n, p), Y1, M1);
  be->dropout_fwd(X, flat_spec(n, p), Y2, M2);
  const Vec y = read(Y1), m = read(M1);
  EXPECT_EQ(y, read(Y2));
  EXPECT_EQ(m, read(M2));
  double kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += m[i];
    ASSERT_NEAR(y[i], m[i] ? x[i] / (1 - p) : 0.0, 1e-6 * (1 + std::fabs(x[i])));
  }
  const double sigma = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(kept, n * (1 - p), 4 * sigma);
  // Another site gives another mask.
  Tensor M3 = be->empty({n}, DType::u8), Y3 = poisoned({n});
  be->dropout_fwd(X, flat_spec(n, p, kSiteMlpOut), Y3, M3);
  EXPECT_NE(read(M3), m);
  // Backward: dx = mask * dy / (1 - p).
  const Vec g = random_vec(n, 19);
  Tensor DX = poisoned({n});
  be->dropout_bwd(make(g, {n}), M1, p, DX);
  Vec ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = m[i] ? g[i] / (1 - p) : 0.0;
  EXPECT_LE(worst(read(DX), ref, 1e-7, 1e-6), 1.0);
}

TEST_F(CpuOps, DropoutShardIsTheSubBlockOfTheCanonicalMask) {
  // Canonical [outer 3, mid 8, inner 5]; the shard holds mid rows [4, 6) of every outer.
  const int64_t outer = 3, mid = 8, inner = 5, off = 4, ml = 2;
  DropoutSpec full = flat_spec(0, 0.3f);
  full.outer = outer;
  full.mid_local = full.mid_global = mid;
  full.inner = inner;
  DropoutSpec shard = full;
  shard.mid_local = ml;
  shard.mid_offset = off;
  Tensor Xf = make(Vec(outer * mid * inner, 1.0), {outer * mid * inner}), Yf = poisoned({outer * mid * inner});
  Tensor Mf = be->empty({outer * mid * inner}, DType::u8);
  be->dropout_fwd(Xf, full, Yf, Mf);
  Tensor Xs = make(Vec(outer * ml * inner, 1.0), {outer * ml * inner}), Ys = poisoned({outer * ml * inner});
  Tensor Ms = be->empty({outer * ml * inner}, DType::u8);
  be->dropout_fwd(Xs, shard, Ys, Ms);
  const Vec mf = read(Mf), ms = read(Ms);
  int dropped = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t m = 0; m < ml; ++m)
      for (int64_t i = 0; i < inner; ++i) {
        ASSERT_EQ(ms[(o * ml + m) * inner + i], mf[(o * mid + off + m) * inner + i]);
        dropped += ms[(o * ml + m) * inner + i] == 0;
      }
  EXPECT_GT(dropped, 0);  // the comparison is not between two all-ones masks
}

// ---- GeLU and the fused residual --------------------------------------------------------

Vec gelu_ref(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

TEST_F(CpuOps, GeluForwardBackward) {
  const int64_t n = 211;
  const Vec x = random_vec(n, 20, -4, 4), g = random_vec(n, 21);
  Tensor X = make(x, {n}), Y = poisoned({n}), DX = poisoned({n});
  be->gelu_fwd(X, Y);
  EXPECT_LE(worst(read(Y), gelu_ref(x), 1e-6, 1e-5), 1.0);
  be->gelu_bwd(make(g, {n}), X, DX);
  EXPECT_LE(worst(read(DX), finite_difference(gelu_ref, x, g), 1e-5, 1e-4), 1.0);
}

TEST_F(CpuOps, BiasDropoutResidualUsesTheDropoutMask) {
  const int64_t M = 9, N = 17;
  const float p = 0.25f;
  const Vec x = random_vec(M * N, 22), bias = random_vec(N, 23), r = random_vec(M * N, 24);
  Tensor OUT = poisoned({M, N}), MASK = be->empty({M, N}, DType::u8);
  be->bias_dropout_residual_fwd(make(x, {M, N}), make(bias, {N}), make(r, {M, N}), flat_spec(M * N, p, kSiteAttnOut), OUT,
                                MASK);
  // Same mask as plain dropout with the same spec.
  Tensor Y = poisoned({M, N}), M2 = be->empty({M, N}, DType::u8);
  be->dropout_fwd(make(x, {M, N}), flat_spec(M * N, p, kSiteAttnOut), Y, M2);
  const Vec mask = read(MASK);
  EXPECT_EQ(mask, read(M2));
  Vec ref(M * N);
  for (int64_t i = 0; i < M * N; ++i) ref[i] = r[i] + (mask[i] ? (x[i] + bias[i % N]) / (1 - p) : 0.0);
  EXPECT_LE(worst(read(OUT), ref, 1e-6, 1e-5), 1.0);
}

// ---- layout and data movement -----------------------------------------------------------

TEST_F(CpuOps, SplitAndMergeHeadsRoundTrip) {
  const int64_t S = 7, B = 3, NH = 5, D = 4, W = 3 * NH * D + 2;
  const Vec src = random_vec(S * B * W, 25);
  Tensor Src = make(src, {S, B, W});
  Tensor Dst = poisoned({B, NH, S, D});
  const int64_t off = NH * D + 1;
  be->split_heads(Src, off, Dst);
  const Vec d = read(Dst);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t e = 0; e < D; ++e)
          ASSERT_DOUBLE_EQ(d[((b * NH + h) * S + s) * D + e], rounded(Src)[(s * B + b) * W + off + h * D + e]);
  Tensor Back = make(Vec(S * B * W, 0.0), {S, B, W});
  be->merge_heads(Dst, off, Back);
  const Vec back = read(Back), orig = read(Src);
  for (int64_t i = 0; i < S * B * W; ++i) {
    const int64_t col = i % W;
    ASSERT_DOUBLE_EQ(back[i], col >= off && col < off + NH * D ? orig[i] : 0.0);
  }
  EXPECT_THROW(be->split_heads(Src, W - 3, Dst), InvalidArgument);
}

TEST_F(CpuOps, CopyAddInplaceUploadDownload) {
  const Vec a = random_vec(23, 26), b = random_vec(23, 27);
  Tensor A = make(a, {23}), B = make(b, {23}), C = poisoned({23});
  be->copy(A, C);
  EXPECT_EQ(read(C), read(A));
  be->add_inplace(C, B);
  Vec sum(23);
  for (int i = 0; i < 23; ++i) sum[i] = static_cast<float>(a[i]) + static_cast<float>(b[i]);
  EXPECT_LE(worst(read(C), sum, 1e-7, 1e-6), 1.0);
  Tensor H = make(a, {23}, DType::bf16);
  for (int i = 0; i < 23; ++i) EXPECT_EQ(read(H)[i], bf16_to_float(float_to_bf16(static_cast<float>(a[i]))));
  EXPECT_THROW(be->copy(A, be->empty({22}, DType::fp32)), InvalidArgument);
  be->fill_zero(C);
  EXPECT_EQ(read(C), Vec(23, 0.0));
}

}  // namespace
}  // namespace actbench
