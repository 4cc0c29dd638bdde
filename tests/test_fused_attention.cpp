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

// Context parallelism's pieces: rank i of C holds chunks i and 2C-1-i of the sequence (each c
// rows). The rows of chunks i and 2C-1-i of x [B, T, D], as a [B, 2c, D] block.
template <typename Value>
std::vector<Value> rank_rows(const std::vector<Value>& x, int64_t B, int64_t T, int64_t D, int64_t c, int64_t C, int64_t i) {
  std::vector<Value> out;
  for (int64_t bh = 0; bh < B; ++bh)
    for (int64_t chunk : {i, 2 * C - 1 - i})
      out.insert(out.end(), x.begin() + (bh * T + chunk * c) * D, x.begin() + (bh * T + (chunk + 1) * c) * D);
  return out;
}
SeqPositions rank_positions(int64_t c, int64_t C, int64_t i) { return SeqPositions::chunks(c, i * c, (2 * C - 1 - i) * c); }

Tensor upload(Backend& be, const std::vector<float>& host, Shape shape) {
  Tensor t = be.empty(std::move(shape), DType::fp32);
  be.upload(host.data(), t);
  return t;
}
std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  be.download(t, host.data());
  return host;
}

TEST(FusedAttentionCpu, ContextParallelRingBlocksEqualTheWholeAttention) {
  // T = 2C c rows with a ragged key tile (c = 5 is not a multiple of the 16-key tiles), D = 4,
  // B = 2 heads; every rank runs its queries against each rank's keys (the ring), merges the
  // partial results, and its backward gives dq and each owner's dk, dv.
  const int64_t B = 2, D = 4, c = 5;
  for (int64_t C : {2, 3})
    for (float p : {0.0f, 0.2f}) {
      const int64_t T = 2 * C * c;
      DropoutSpec spec;
      spec.p = p;
      spec.seed = 7;
      spec.site = kSiteAttnProbs;
      spec.mid_local = spec.mid_global = B;
      spec.inner = T * T;
      const auto q = random_vector(B * T * D, 11, 2.f), k = random_vector(B * T * D, 12, 2.f),
                 v = random_vector(B * T * D, 13), dout = random_vector(B * T * D, 14);
      const double scale = 0.5;
      const Unfused ref = unfused_reference(q, k, v, dout, B, T, D, scale, spec);
      auto be = make_cpu_backend();
      const Shape local = {B, 2 * c, D};
      std::vector<std::vector<double>> dk(C, std::vector<double>(B * 2 * c * D)), dv = dk;
      for (int64_t i = 0; i < C; ++i) {
        const Tensor qi = upload(*be, rank_rows(q, B, T, D, c, C, i), local);
        const Tensor doi = upload(*be, rank_rows(dout, B, T, D, c, C, i), local);
        const Tensor out = be->empty(local, DType::fp32), lse = be->empty({B, 2 * c}, DType::fp32);
        const Tensor part = be->empty(local, DType::fp32), part_lse = be->empty({B, 2 * c}, DType::fp32);
        auto rows_for = [&](int64_t j) { return AttentionRows{rank_positions(c, C, i), rank_positions(c, C, j), T}; };
        for (int64_t j = 0; j < C; ++j) {  // rank j's keys: i's own first, as the ring has them
          const int64_t owner = (i - j + C) % C;
          const Tensor kj = upload(*be, rank_rows(k, B, T, D, c, C, owner), local);
          const Tensor vj = upload(*be, rank_rows(v, B, T, D, c, C, owner), local);
          if (j == 0) {
            be->attention_fwd(qi, kj, vj, static_cast<float>(scale), spec, out, lse, rows_for(owner));
          } else {
            be->attention_fwd(qi, kj, vj, static_cast<float>(scale), spec, part, part_lse, rows_for(owner));
            be->attention_merge(out, lse, part, part_lse);
          }
        }
        const std::string what = "C=" + std::to_string(C) + " rank " + std::to_string(i) + " p=" + std::to_string(p);
        EXPECT_LE(worst(download(*be, out), rank_rows(ref.out, B, T, D, c, C, i), 1e-6, 1e-5), 1.0) << what;
        std::vector<double> dq(B * 2 * c * D, 0.0);
        const Tensor dq_part = be->empty(local, DType::fp32), dk_part = be->empty(local, DType::fp32),
                     dv_part = be->empty(local, DType::fp32);
        for (int64_t owner = 0; owner < C; ++owner) {
          const Tensor kj = upload(*be, rank_rows(k, B, T, D, c, C, owner), local);
          const Tensor vj = upload(*be, rank_rows(v, B, T, D, c, C, owner), local);
          be->attention_bwd(qi, kj, vj, out, doi, lse, static_cast<float>(scale), spec, dq_part, dk_part, dv_part,
                            rows_for(owner));
          const auto dqp = download(*be, dq_part), dkp = download(*be, dk_part), dvp = download(*be, dv_part);
          for (size_t e = 0; e < dq.size(); ++e) {
            dq[e] += dqp[e];
            dk[owner][e] += dkp[e];
            dv[owner][e] += dvp[e];
          }
        }
        const auto ref_dq = rank_rows(ref.dq, B, T, D, c, C, i);
        for (size_t e = 0; e < dq.size(); ++e) EXPECT_NEAR(dq[e], ref_dq[e], 1e-5 + 1e-4 * std::fabs(ref_dq[e])) << what;
      }
      for (int64_t j = 0; j < C; ++j) {
        const auto ref_dk = rank_rows(ref.dk, B, T, D, c, C, j), ref_dv = rank_rows(ref.dv, B, T, D, c, C, j);
        for (size_t e = 0; e < ref_dk.size(); ++e) {
          EXPECT_NEAR(dk[j][e], ref_dk[e], 1e-5 + 1e-4 * std::fabs(ref_dk[e])) << "dk C=" << C << " rank " << j;
          EXPECT_NEAR(dv[j][e], ref_dv[e], 1e-5 + 1e-4 * std::fabs(ref_dv[e])) << "dv C=" << C << " rank " << j;
        }
      }
    }
}

// The all-gather form: a rank's query chunks against every key, in the whole sequence's
// order; and the unfused ops (softmax with placed rows, dropout with placed inner elements)
// give the same probabilities as the whole causal softmax's rows.
TEST(FusedAttentionCpu, ContextParallelQueriesAgainstAllKeysEqualTheWholeAttention) {
  const int64_t B = 2, D = 4, c = 3, C = 2, T = 2 * C * c;
  DropoutSpec spec;
  spec.p = 0.25f;
  spec.seed = 5;
  spec.site = kSiteAttnProbs;
  spec.mid_local = spec.mid_global = B;
  spec.inner = T * T;
  const auto q = random_vector(B * T * D, 21, 2.f), k = random_vector(B * T * D, 22, 2.f),
             v = random_vector(B * T * D, 23), dout = random_vector(B * T * D, 24);
  const Unfused ref = unfused_reference(q, k, v, dout, B, T, D, 0.5, spec);
  auto be = make_cpu_backend();
  const Tensor kt = upload(*be, k, {B, T, D}), vt = upload(*be, v, {B, T, D});
  const Tensor scores_all = be->empty({B, T, T}, DType::fp32), probs_all = be->empty({B, T, T}, DType::fp32);
  be->gemm(gemm_args(false, true, T, T, D, B, 0.5f), upload(*be, q, {B, T, D}), kt, scores_all);
  be->softmax_causal_fwd(scores_all, probs_all);
  const Tensor dropped_all = be->empty({B, T, T}, DType::fp32), mask_all = be->empty({B, T, T}, DType::u8);
  be->dropout_fwd(probs_all, spec, dropped_all, mask_all);
  const auto whole = download(*be, dropped_all);
  for (int64_t i = 0; i < C; ++i) {
    const SeqPositions pos = rank_positions(c, C, i);
    const Tensor qi = upload(*be, rank_rows(q, B, T, D, c, C, i), {B, 2 * c, D});
    const Tensor out = be->empty({B, 2 * c, D}, DType::fp32), lse = be->empty({B, 2 * c}, DType::fp32);
    be->attention_fwd(qi, kt, vt, 0.5f, spec, out, lse, AttentionRows{pos, SeqPositions{}, T});
    EXPECT_LE(worst(download(*be, out), rank_rows(ref.out, B, T, D, c, C, i), 1e-6, 1e-5), 1.0) << "rank " << i;
    // unfused: scores of the rank's rows against all keys, softmax with the rows placed
    const Tensor scores = be->empty({B, 2 * c, T}, DType::fp32), probs = be->empty({B, 2 * c, T}, DType::fp32);
    be->gemm(gemm_args(false, true, 2 * c, T, D, B, 0.5f), qi, kt, scores);
    be->softmax_causal_fwd(scores, probs, pos);
    DropoutSpec local = spec;
    local.inner = 2 * c * T;
    local.inner_global = T * T;
    local.inner_positions = SeqPositions::chunks(c * T, i * c * T, (2 * C - 1 - i) * c * T);
    const Tensor dropped = be->empty({B, 2 * c, T}, DType::fp32), mask = be->empty({B, 2 * c, T}, DType::u8);
    be->dropout_fwd(probs, local, dropped, mask);
    const auto got = download(*be, dropped);
    const auto want = rank_rows(whole, B, T, T, c, C, i);
    for (size_t e = 0; e < got.size(); ++e) EXPECT_NEAR(got[e], want[e], 1e-6) << "rank " << i << " element " << e;
  }
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
    const cpu::AttentionShape shape{B, S, S, D, 1, {}};
    cpu::attention_fwd(q.data(), k.data(), v.data(), shape, static_cast<float>(scale), spec, out.data(), lse.data());
    cpu::attention_bwd(q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), shape,
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
