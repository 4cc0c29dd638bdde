// Fused (FlashAttention-style) attention: the tiled online-softmax op equals the unfused
// composition of GEMM, causal softmax, dropout and GEMM (same Philox masks); the layer with
// --attention fused computes the same outputs and gradients as the paper's layer in every
// configuration; and what it stores is Q, K, V, the output and an fp32 log-sum-exp per row.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/cpu_attention.hpp"
#include "layer_harness.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// The unfused path in float64 with explicit probabilities, for B heads of [S, D].
struct Unfused {
  std::vector<double> out, dq, dk, dv;
};
Unfused unfused_reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                          const std::vector<float>& dout, int64_t B, int64_t S, int64_t D, double scale,
                          const DropoutSpec& spec) {
  Unfused r;
  r.out.assign(B * S * D, 0);
  r.dq.assign(B * S * D, 0);
  r.dk.assign(B * S * D, 0);
  r.dv.assign(B * S * D, 0);
  for (int64_t bh = 0; bh < B; ++bh) {
    const int64_t o = bh * S * D;
    std::vector<double> P(S * S, 0), M(S * S, 0);
    for (int64_t i = 0; i < S; ++i) {
      double mx = -1e300;
      std::vector<double> sc(i + 1);
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[o + i * D + d]) * k[o + j * D + d];
        sc[j] = dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(sc[j] - mx);
      for (int64_t j = 0; j <= i; ++j) {
        P[i * S + j] = std::exp(sc[j] - mx) / sum;
        M[i * S + j] = spec.p > 0 ? (spec.keep((bh * S + i) * S + j) ? 1.0 / (1.0 - spec.p) : 0.0) : 1.0;
      }
    }
    for (int64_t i = 0; i < S; ++i) {
      // out = (P*M) V ; dPd = dO V^T ; dV = (P*M)^T dO ; dS = P (dPd*M - rowsum(P*dPd*M)) ; dQ = s dS K ; dK = s dS^T Q
      std::vector<double> dp(S, 0);
      double rowdot = 0;
      for (int64_t j = 0; j <= i; ++j) {
        const double pd = P[i * S + j] * M[i * S + j];
        double dpd = 0;
        for (int64_t d = 0; d < D; ++d) {
          r.out[o + i * D + d] += pd * v[o + j * D + d];
          r.dv[o + j * D + d] += pd * dout[o + i * D + d];
          dpd += static_cast<double>(dout[o + i * D + d]) * v[o + j * D + d];
        }
        dp[j] = dpd * M[i * S + j];
        rowdot += P[i * S + j] * dp[j];
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = P[i * S + j] * (dp[j] - rowdot);
        for (int64_t d = 0; d < D; ++d) {
          r.dq[o + i * D + d] += scale * ds * k[o + j * D + d];
          r.dk[o + j * D + d] += scale * ds * q[o + i * D + d];
        }
      }
    }
  }
  return r;
}

double worst(const std::vector<float>& got, const std::vector<double>& ref, double atol, double rtol) {
  double w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]);
    if (std::isnan(e)) return INFINITY;
    w = std::max(w, e / (atol + rtol * std::fabs(ref[i])));
  }
  return w;
}

TEST(FusedAttentionCpu, MatchesExplicitSoftmaxWithDropoutAcrossTiles) {
  // S = 37 spans three key tiles of 16 with a ragged end; D = 5; B = 3 heads.
  const int64_t B = 3, S = 37, D = 5;
  for (float p : {0.0f, 0.2f}) {
    DropoutSpec spec;
    spec.p = p;
    spec.seed = 99;
    spec.site = kSiteAttnProbs;
    spec.outer = 1;
    spec.mid_local = spec.mid_global = B;
    spec.inner = S * S;
    const auto q = random_vector(B * S * D, 1, 2.f), k = random_vector(B * S * D, 2, 2.f),
               v = random_vector(B * S * D, 3), dout = random_vector(B * S * D, 4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<float> out(B * S * D, NAN), lse(B * S, NAN), dq(B * S * D, NAN), dk(B * S * D, NAN), dv(B * S * D, NAN);
    cpu::attention_fwd(q.data(), k.data(), v.data(), B, S, D, static_cast<float>(scale), spec, out.data(), lse.data());
    cpu::attention_bwd(q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), B, S, D,
                       static_cast<float>(scale), spec, dq.data(), dk.data(), dv.data());
    const Unfused ref = unfused_reference(q, k, v, dout, B, S, D, scale, spec);
    EXPECT_LE(worst(out, ref.out, 1e-6, 1e-5), 1.0) << "p=" << p;
    EXPECT_LE(worst(dq, ref.dq, 1e-6, 1e-5), 1.0) << "p=" << p;
    EXPECT_LE(worst(dk, ref.dk, 1e-6, 1e-5), 1.0) << "p=" << p;
    EXPECT_LE(worst(dv, ref.dv, 1e-6, 1e-5), 1.0) << "p=" << p;
    // lse is the log of the causal row sum of exp(scores).
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
    EXPECT_NEAR(lse[0], dot * scale, 1e-5);  // row 0 sees only column 0
  }
}

const LayerDims kDims = {12, 3, 30, 5};

std::vector<CanonicalTensor> run_layer(const std::string& config, Attention attention) {
  auto be = make_cpu_backend();
  auto comm = make_local_communicator();
  ExperimentSpec spec = small_spec(config, DType::fp32, 0.1f, kDims);
  spec.policy.attention = attention;
  return run_layer_canonical(*be, *comm, spec);
}

TEST(FusedAttentionLayer, SameOutputsAndGradientsAsThePapersLayer) {
  const auto ref = run_layer("baseline", Attention::unfused);
  for (const char* config : {"baseline", "selective", "full", "sp", "selective+sp", "full+sp"})
    expect_same_tensors(run_layer(config, Attention::fused), ref, 1e-5, 1e-5, std::string("fused ") + config);
}

// Bytes stored with fused attention, written out here from first principles (16-bit
// activations, 1-byte masks): the selective row of Table 2, sbh(10 + 24/t) without SP and
// 34 sbh / t with SP, plus an fp32 log-sum-exp for each of the a/t heads' s rows of each
// sequence (4 a s b / t) where core attention is not recomputed: selective recompute re-runs
// the fused forward, which makes the log-sum-exp again, so it keeps none. Full recompute
// stores only the input.
double fused_bytes(double s, double b, double h, double a, double t, const std::string& config) {
  const double sbh = s * b * h, lse = 4 * a * s * b / t;
  if (config == "full") return 2 * sbh;
  if (config == "full+sp") return 2 * sbh / t;
  const bool sp = config == "sp" || config == "selective+sp";
  const bool recomputes_core_attention = config == "selective" || config == "selective+sp";
  return (sp ? 34 * sbh / t : sbh * (10 + 24 / t)) + (recomputes_core_attention ? 0 : lse);
}

TEST(FusedAttentionMemory, MetaBytesAreSelectivePlusTheLogSumExpsKept) {
  for (int t : {1, 2, 4, 8}) {
    for (const std::string config : {"baseline", "sp", "selective", "selective+sp", "full", "full+sp"}) {
      for (LayerDims d : {LayerDims{2048, 4, 6144, 64}, LayerDims{24, 3, 40, 8}}) {
        auto be = make_meta_backend();
        auto comm = make_emulated_communicator(t);
        ExperimentSpec spec;
        spec.dims = d;
        spec.policy = parse_config(config);
        spec.policy.attention = Attention::fused;
        spec.iters = 1;
        spec.warmup = 0;
        const ExperimentResult r = run_experiment(*be, *comm, spec);
        ASSERT_EQ(r.status, "ok") << r.message;
        const double expect = fused_bytes(d.s, d.b, d.h, d.a, t, config);
        EXPECT_EQ(static_cast<double>(r.act_bytes), expect) << config << " t=" << t << " s=" << d.s;
        EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << config << " t=" << t;
      }
    }
  }
}

}  // namespace

// An empty batch (B = 0, and so empty k and v) is no work, not an error, on every backend
// that checks shapes; k with no batch for a non-empty q stays an error.
TEST(FusedAttentionShapes, EmptyBatchIsNoWorkOnCpuAndMeta) {
  for (const char* name : {"cpu", "meta"}) {
    auto be = make_backend(name);
    Tensor q0 = be->empty({0, 5, 8}, DType::fp32), lse0 = be->empty({0}, DType::fp32);
    DropoutSpec spec;
    spec.outer = 1;
    spec.mid_local = spec.mid_global = 0;
    spec.inner = 25;
    spec.p = 0.1f;
    EXPECT_NO_THROW(be->attention_fwd(q0, q0, q0, 1.f, spec, q0, lse0)) << name;
    EXPECT_NO_THROW(be->attention_bwd(q0, q0, q0, q0, q0, lse0, 1.f, spec, q0, q0, q0)) << name;
    Tensor q = be->empty({2, 5, 8}, DType::fp32), lse = be->empty({2 * 5}, DType::fp32);
    spec.mid_local = spec.mid_global = 2;
    EXPECT_THROW(be->attention_fwd(q, q0, q0, 1.f, spec, q, lse), InvalidArgument) << name;
  }
}
