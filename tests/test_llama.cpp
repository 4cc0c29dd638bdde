// The llama family (--arch llama): its cpu ops against float64 references written here from
// the definitions (RMSNorm, rotate-half RoPE, SwiGLU, grouped-query causal attention), its
// measured activation bytes (meta and cpu) against the closed forms in every configuration,
// the recompute modes and fused attention against the baseline, bad shapes, and --hf-config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.hpp"
#include "layer_harness.hpp"
#include "runners/hf_config.hpp"
#include "runners/presets.hpp"
#include "runtime/error.hpp"
#include "layers/theory_dims.hpp"
#include "reference_math.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

using actbench::testing::random_vec, actbench::testing::Vec;

::testing::AssertionResult close(const Vec& got, const Vec& ref, double atol, double rtol) {
  return actbench::testing::close(got, ref, {atol, rtol});
}

struct Cpu {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Tensor put(const Vec& v, Shape shape, DType dt = DType::fp32) {
    Tensor t = be->empty(std::move(shape), dt);
    std::vector<float> f(v.begin(), v.end());
    be->upload(f.data(), t);
    return t;
  }
  // NaN-poisoned: an element the op forgets to write fails the comparison.
  Tensor out(Shape shape, DType dt = DType::fp32) {
    Tensor t = be->empty(std::move(shape), dt);
    std::vector<float> f(static_cast<size_t>(t.numel()), NAN);
    be->upload(f.data(), t);
    return t;
  }
  Vec get(const Tensor& t) {
    std::vector<float> f(static_cast<size_t>(t.numel()));
    be->download(t, f.data());
    return Vec(f.begin(), f.end());
  }
};

// ---- float64 references, from the definitions ----

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// RoPE: rows of x [rows, D], row r at position r % S, rotated by sign * angle.
Vec rope_ref(const Vec& x, int64_t S, int64_t D, double theta, double sign) {
  Vec y(x.size());
  const int64_t half = D / 2;
  for (size_t r = 0; r < x.size() / D; ++r) {
    const double p = static_cast<double>(r % S);
    for (int64_t i = 0; i < half; ++i) {
      const double ang = sign * p * std::pow(theta, -2.0 * i / D);
      const double lo = x[r * D + i], hi = x[r * D + half + i];
      y[r * D + i] = lo * std::cos(ang) - hi * std::sin(ang);
      y[r * D + half + i] = hi * std::cos(ang) + lo * std::sin(ang);
    }
  }
  return y;
}

// Causal grouped-query attention: q, out [B, S, D], k, v [B/r, S, D]; P = softmax(scale q k^T).
struct AttnRef {
  Vec out, lse, dq, dk, dv;
};
AttnRef attention_ref(const Vec& q, const Vec& k, const Vec& v, const Vec& dout, int64_t B, int64_t S, int64_t D,
                      int64_t r, double scale) {
  AttnRef a{Vec(q.size()), Vec(B * S), Vec(q.size(), 0.0), Vec(k.size(), 0.0), Vec(v.size(), 0.0)};
  for (int64_t bh = 0; bh < B; ++bh) {
    const int64_t kb = bh / r;
    for (int64_t i = 0; i < S; ++i) {
      Vec p(static_cast<size_t>(i + 1));
      double mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[(bh * S + i) * D + d] * k[(kb * S + j) * D + d];
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (double& x : p) x /= sum;
      a.lse[bh * S + i] = mx + std::log(sum);
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j) o += p[j] * v[(kb * S + j) * D + d];
        a.out[(bh * S + i) * D + d] = o;
      }
      // backward: dP = dO V^T, dS = P (dP - sum P dP), dq = scale dS K, dk += scale dS^T q, dv += P^T dO
      Vec dp(static_cast<size_t>(i + 1));
      double pdp = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double x = 0;
        for (int64_t d = 0; d < D; ++d) x += dout[(bh * S + i) * D + d] * v[(kb * S + j) * D + d];
        dp[j] = x;
        pdp += p[j] * x;
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = p[j] * (dp[j] - pdp);
        for (int64_t d = 0; d < D; ++d) {
          a.dq[(bh * S + i) * D + d] += scale * ds * k[(kb * S + j) * D + d];
          a.dk[(kb * S + j) * D + d] += scale * ds * q[(bh * S + i) * D + d];
          a.dv[(kb * S + j) * D + d] += p[j] * dout[(bh * S + i) * D + d];
        }
      }
    }
  }
  return a;
}

}  // namespace

// ---- ops ----

TEST(LlamaOps, RmsNormForwardAndBackwardMatchFloat64) {
  const int64_t M = 7, H = 37;
  const double eps = 1e-5;
  const Vec x = random_vec(M * H, 1, -2, 2), w = random_vec(H, 2, 0.5, 1.5), dy = random_vec(M * H, 3);
  Vec y(M * H), rstd(M), dx(M * H), dw(H, 0.0);
  for (int64_t r = 0; r < M; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < H; ++j) ms += x[r * H + j] * x[r * H + j] / H;
    rstd[r] = 1.0 / std::sqrt(ms + eps);
    // dx_j = rstd (g_j - xhat_j mean(g xhat)), g = dy w, xhat = x rstd
    double m = 0;
    for (int64_t j = 0; j < H; ++j) m += dy[r * H + j] * w[j] * x[r * H + j] * rstd[r] / H;
    for (int64_t j = 0; j < H; ++j) {
      y[r * H + j] = x[r * H + j] * rstd[r] * w[j];
      dx[r * H + j] = rstd[r] * (dy[r * H + j] * w[j] - x[r * H + j] * rstd[r] * m);
      dw[j] += dy[r * H + j] * x[r * H + j] * rstd[r];
    }
  }
  Cpu c;
  Tensor tx = c.put(x, {M, H}), tw = c.put(w, {H}), ty = c.out({M, H}), tr = c.out({M}), tdy = c.put(dy, {M, H});
  c.be->rmsnorm_fwd(tx, tw, static_cast<float>(eps), ty, tr);
  EXPECT_TRUE(close(c.get(ty), y, 1e-5, 1e-5));
  EXPECT_TRUE(close(c.get(tr), rstd, 0, 1e-6));
  Tensor tdx = c.out({M, H}), tdw = c.out({H});
  c.be->rmsnorm_bwd(tdy, tx, tw, tr, tdx, tdw);
  EXPECT_TRUE(close(c.get(tdx), dx, 1e-5, 1e-4));
  EXPECT_TRUE(close(c.get(tdw), dw, 1e-5, 1e-4));
  // bf16 storage: one rounding of the output
  Tensor bx = c.put(x, {M, H}, DType::bf16), bw = c.put(w, {H}, DType::bf16), by = c.out({M, H}, DType::bf16);
  c.be->rmsnorm_fwd(bx, bw, static_cast<float>(eps), by, tr);
  EXPECT_TRUE(close(c.get(by), y, 2e-2, 2e-2));
}

TEST(LlamaOps, RopeRotatesHalvesByPositionAndBackwardInverts) {
  const int64_t B = 2, NH = 3, S = 11, D = 10;
  const double theta = 10000.0;
  const Vec x = random_vec(B * NH * S * D, 4);
  Cpu c;
  Tensor tx = c.put(x, {B, NH, S, D}), ty = c.out({B, NH, S, D});
  c.be->rope_fwd(tx, theta, D, ty);
  EXPECT_TRUE(close(c.get(ty), rope_ref(x, S, D, theta, 1.0), 1e-6, 1e-5));
  c.be->rope_fwd(tx, theta, D, tx);  // in place
  EXPECT_TRUE(close(c.get(tx), rope_ref(x, S, D, theta, 1.0), 1e-6, 1e-5));
  Tensor tdx = c.out({B, NH, S, D});
  c.be->rope_bwd(ty, theta, D, tdx);  // R^T R = 1
  EXPECT_TRUE(close(c.get(tdx), x, 1e-6, 1e-5));
  // Position 0 is the identity; a shorter theta rotates differently (the argument is used).
  Tensor t50 = c.out({B, NH, S, D});
  c.be->rope_fwd(c.put(x, {B, NH, S, D}), 50.0, D, t50);
  const Vec y50 = c.get(t50);
  EXPECT_TRUE(close(y50, rope_ref(x, S, D, 50.0, 1.0), 1e-6, 1e-5));
  EXPECT_FALSE(close(y50, c.get(ty), 1e-3, 0));
  for (int64_t i = 0; i < D; ++i) EXPECT_NEAR(y50[i], x[i], 1e-7);
  EXPECT_THROW(c.be->rope_fwd(c.out({1, 1, 2, 3}), theta, 3, c.out({1, 1, 2, 3})), InvalidArgument);  // odd D
}

TEST(LlamaOps, SwigluForwardAndBackwardMatchFloat64) {
  const int64_t M = 5, N = 13;
  const Vec x = random_vec(M * 2 * N, 5, -4, 4), dy = random_vec(M * N, 6);
  Vec y(M * N), dx(M * 2 * N);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < N; ++j) {
      const double g = x[r * 2 * N + j], u = x[r * 2 * N + N + j], s = sigmoid(g);
      y[r * N + j] = g * s * u;
      dx[r * 2 * N + j] = dy[r * N + j] * u * (s + g * s * (1 - s));
      dx[r * 2 * N + N + j] = dy[r * N + j] * g * s;
    }
  Cpu c;
  Tensor tx = c.put(x, {M, 2 * N}), ty = c.out({M, N}), tdx = c.out({M, 2 * N});
  c.be->swiglu_fwd(tx, ty);
  EXPECT_TRUE(close(c.get(ty), y, 1e-5, 1e-5));
  c.be->swiglu_bwd(c.put(dy, {M, N}), tx, tdx);
  EXPECT_TRUE(close(c.get(tdx), dx, 1e-5, 1e-5));
  EXPECT_THROW(c.be->swiglu_fwd(tx, c.out({M, N + 1})), InvalidArgument);
}

TEST(LlamaOps, FusedGroupedQueryAttentionMatchesFloat64) {
  const int64_t S = 37, D = 6;  // S crosses several 16-key tiles
  for (int64_t r : {1, 2, 4}) {
    const int64_t B = 8, Bkv = B / r;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const Vec q = random_vec(B * S * D, 7, -2, 2), k = random_vec(Bkv * S * D, 8, -2, 2),
              v = random_vec(Bkv * S * D, 9), dout = random_vec(B * S * D, 10);
    const AttnRef ref = attention_ref(q, k, v, dout, B, S, D, r, scale);
    Cpu c;
    DropoutSpec none;
    none.outer = B;
    none.inner = S * S;
    Tensor tq = c.put(q, {B, S, D}), tk = c.put(k, {Bkv, S, D}), tv = c.put(v, {Bkv, S, D});
    Tensor out = c.out({B, S, D}), lse = c.out({B, S});
    c.be->attention_fwd(tq, tk, tv, static_cast<float>(scale), none, out, lse);
    EXPECT_TRUE(close(c.get(out), ref.out, 1e-5, 1e-5)) << "r=" << r;
    EXPECT_TRUE(close(c.get(lse), ref.lse, 1e-5, 1e-5)) << "r=" << r;
    Tensor dq = c.out({B, S, D}), dk = c.out({Bkv, S, D}), dv = c.out({Bkv, S, D});
    c.be->attention_bwd(tq, tk, tv, out, c.put(dout, {B, S, D}), lse, static_cast<float>(scale), none, dq, dk, dv);
    EXPECT_TRUE(close(c.get(dq), ref.dq, 1e-5, 1e-4)) << "r=" << r;
    EXPECT_TRUE(close(c.get(dk), ref.dk, 1e-5, 1e-4)) << "r=" << r;
    EXPECT_TRUE(close(c.get(dv), ref.dv, 1e-5, 1e-4)) << "r=" << r;
  }
  Cpu c;
  DropoutSpec none;
  none.outer = 3;
  none.inner = 4;
  EXPECT_THROW(c.be->attention_fwd(c.out({3, 2, 2}), c.out({2, 2, 2}), c.out({2, 2, 2}), 1.f, none, c.out({3, 2, 2}),
                                   c.out({3, 2})),
               InvalidArgument);  // 2 key/value batches do not divide 3 query batches
}

// ---- the layer ----

namespace {

LayerDims llama(int64_t s, int64_t b, int64_t h, int64_t a, int64_t g, int64_t f) {
  LayerDims d{s, b, h, a};
  d.spec = theory::llama_layer_spec(double(g), double(f));
  return d;
}

ExperimentResult measure(const std::string& backend, const LayerDims& d, int t, LayerPolicy p, DType dtype) {
  auto be = make_backend(backend);
  return measure_once(*be, d, t, p, dtype);
}

void expect_bytes_match_theory(const ExperimentResult& r, const LayerDims& d, int t, LayerPolicy p, DType dtype,
                               const std::string& what) {
  ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
  const theory::LlamaDims td = theory_llama_dims(d, t);
  const theory::Precision prec{static_cast<double>(dtype_size(dtype)), 1.0};
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::llama_activation_bytes(td, p, prec)) << what;
  if (dtype_size(dtype) == 2) {
    EXPECT_EQ(static_cast<double>(r.act_bytes), theory::llama_closed_form(td, p)) << what;
  }
  EXPECT_EQ(static_cast<double>(r.act_extra_bytes), theory::llama_norm_stats_bytes(td, p)) << what;
  EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what << ": nothing else survives forward";
  std::map<std::string, int64_t> measured;
  for (const auto& [name, bytes] : r.act_by_category)
    if (name != "ln1_stats" && name != "ln2_stats") measured[name] = bytes;
  const auto cats = theory::llama_activation_bytes_by_category(td, p, prec);
  EXPECT_EQ(measured.size(), cats.size()) << what;
  for (const auto& [name, bytes] : cats) EXPECT_EQ(static_cast<double>(measured[name]), bytes) << what << " " << name;
}

// GQA (r = 2), MQA (g = 1) and MHA (g = a); s not a multiple of 16, F not a multiple of h.
const std::vector<LayerDims> kShapes = {llama(24, 3, 48, 4, 2, 40), llama(20, 2, 64, 8, 1, 72),
                                        llama(16, 1, 32, 4, 4, 56)};

}  // namespace

class LlamaBytes : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(LlamaBytes, MeasuredEqualsClosedFormsForEveryShapeAndTp) {
  const auto& [backend, attention, config] = GetParam();
  LayerPolicy p = parse_config(config);
  p.attention = parse_attention(attention);
  for (const LayerDims& d : kShapes)
    for (int t : {1, 2, 4}) {
      if (d.groups() % t != 0) continue;
      const std::string what = backend + " " + attention + " " + config + " t=" + std::to_string(t) +
                               " h=" + std::to_string(d.h) + " g=" + std::to_string(d.groups());
      expect_bytes_match_theory(measure(backend, d, t, p, DType::bf16), d, t, p, DType::bf16, what);
    }
}

INSTANTIATE_TEST_SUITE_P(AllConfigs, LlamaBytes,
                         ::testing::Combine(::testing::Values("meta", "cpu"), ::testing::Values("unfused", "fused"),
                                            ::testing::Values("baseline", "sp", "full", "selective", "selective+sp",
                                                              "full+sp")),
                         [](const auto& param_info) {
                           std::string c = std::get<2>(param_info.param);
                           for (char& ch : c)
                             if (ch == '+') ch = '_';
                           return std::get<0>(param_info.param) + "_" + std::get<1>(param_info.param) + "_" + c;
                         });

TEST(LlamaBytes, PresetsOnMetaEqualClosedForms) {
  for (const char* name : {"llama3-8b", "llama3-70b", "llama3-405b"}) {
    const ModelPreset& m = find_preset(name);
    ASSERT_EQ(spec_family(m.dims.spec), "llama");
    for (const std::string& config : config_names())
      for (Attention att : {Attention::unfused, Attention::fused}) {
        LayerPolicy p = parse_config(config);
        p.attention = att;
        expect_bytes_match_theory(measure("meta", m.dims, m.tp, p, DType::bf16), m.dims, m.tp, p, DType::bf16,
                                  std::string(name) + " " + config + " " + attention_name(att));
      }
  }
}

// A hand count at one shape, independent of both the layer and the category table:
// s=24 b=3 h=48 a=4 g=2 F=40, bf16, t=1, baseline unfused.
TEST(LlamaBytes, HandCountAtOneShape) {
  const LayerDims d = kShapes[0];
  const ExperimentResult r = measure("meta", d, 1, parse_config("baseline"), DType::bf16);
  ASSERT_EQ(r.status, "ok");
  const int64_t sbh = 24 * 3 * 48;
  const int64_t expected = 2 * (4 * sbh          // ln1, qkv, ln2, fc1 inputs
                                + sbh + sbh / 2 + sbh / 2  // q; k and v with 2 of 4 heads
                                + sbh                      // proj input
                                + 4 * 24 * 24 * 3          // softmax output [b, a, s, s]
                                + 24 * 3 * 80 + 24 * 3 * 40);  // swiglu input (2F), fc2 input (F)
  EXPECT_EQ(r.act_bytes, expected);
  EXPECT_EQ(r.act_extra_bytes, 2 * 4 * 24 * 3);  // two fp32 rstd per row
}

TEST(LlamaLayer, RecomputeModesAndFusedAttentionAgreeWithBaseline) {
  auto be = make_cpu_backend();
  auto comm = make_local_communicator();
  for (const LayerDims& d : {kShapes[0], kShapes[1]}) {
    const auto base = run_layer_canonical(*be, *comm, small_spec("baseline", DType::fp32, 0.f, d));
    ASSERT_EQ(base.size(), 4u + 2 * 6);  // x y dy dx, six parameters and their gradients
    for (const auto& t : base) EXPECT_GT(max_abs(t.data), 0.0) << t.name << " must be live";
    for (const std::string& config : config_names()) {
      for (Attention att : {Attention::unfused, Attention::fused}) {
        ExperimentSpec spec = small_spec(config, DType::fp32, 0.f, d);
        spec.policy.attention = att;
        const auto got = run_layer_canonical(*be, *comm, spec);
        const double tol = att == Attention::fused ? 1e-5 : 1e-6;
        expect_same_tensors(got, base, tol, tol, config + " " + attention_name(att));
      }
    }
  }
}

TEST(LlamaLayer, CanonicalLayoutFollowsTheDumpContract) {
  // qkv.weight [(a+2g)·d, h], fc1.weight [2F, h]: the --dump contract of the issue.
  auto be = make_cpu_backend();
  auto comm = make_local_communicator();
  LayerDims gqa = llama(16, 1, 32, 4, 2, 40), mha = llama(16, 1, 32, 4, 4, 40);
  const auto a = run_layer_canonical(*be, *comm, small_spec("baseline", DType::fp32, 0.f, gqa));
  const auto b = run_layer_canonical(*be, *comm, small_spec("baseline", DType::fp32, 0.f, mha));
  EXPECT_EQ(a[4].name, "ln1.weight");
  EXPECT_EQ(a[6].name, "qkv.weight");
  EXPECT_EQ(a[6].shape, (Shape{(4 + 2 * 2) * 8, 32}));
  EXPECT_EQ(b[6].shape, (Shape{(4 + 2 * 4) * 8, 32}));
  EXPECT_EQ(a[12].name, "fc1.weight");
  EXPECT_EQ(a[12].shape, (Shape{80, 32}));
}

TEST(LlamaLayer, BadShapesAreInvalidArguments) {
  auto shape_fails = [](LayerDims d, int t) {
    EXPECT_THROW(validate_layer(d, t, parse_config("baseline")), InvalidArgument)
        << "g=" << d.groups() << " t=" << t;
  };
  shape_fails(llama(16, 1, 32, 4, 3, 40), 1);  // g does not divide a
  shape_fails(llama(16, 1, 32, 4, 8, 40), 1);  // g > a
  shape_fails(llama(16, 1, 32, 4, 2, 40), 4);  // g % t != 0
  shape_fails(llama(16, 1, 36, 4, 2, 40), 1);  // odd head size: no RoPE pairs
  shape_fails(llama(16, 1, 32, 4, 2, 42), 4);  // F % t != 0
  validate_layer(llama(16, 1, 32, 4, 2, 40), 2, parse_config("sp"));
  auto be = make_cpu_backend();
  auto comm = make_local_communicator();
  // A LLaMA-shaped layer takes dropout like any composed layer (Megatron's defaults for it are 0).
  const LayerDims d = llama(16, 1, 32, 4, 2, 40);
  const auto dropped = run_layer_canonical(*be, *comm, small_spec("baseline", DType::fp32, 0.1f, d));
  const auto plain = run_layer_canonical(*be, *comm, small_spec("baseline", DType::fp32, 0.f, d));
  EXPECT_EQ(dropped[1].name, "y");
  EXPECT_GT(worst_ratio(dropped[1].data, plain[1].data, 1e-6, 1e-6), 1.0) << "dropout changed nothing";
}

// ---- --hf-config ----

namespace {
std::string write_config(const std::string& name, const std::string& body) {
  const auto dir = std::filesystem::temp_directory_path() / ("actbench_hf_" + std::to_string(::getpid())) / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << body;
  return (dir / "config.json").string();
}
const char* kLlama3_70b = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "hidden_act": "silu", "hidden_size": 8192, "intermediate_size": 28672, "max_position_embeddings": 8192,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "vocab_size": 128256,
  "torch_dtype": "bfloat16", "tie_word_embeddings": false})";

// The config `name` with `body` is refused with a message holding `words`.
void refuses(const std::string& name, const std::string& body, const std::string& words) {
  try {
    read_hf_config(write_config(name, body));
    ADD_FAILURE() << name << " was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

// Llama 3 70B's config with its first `from` replaced by `to`.
std::string with(const std::string& from, const std::string& to) {
  std::string s = kLlama3_70b;
  s.replace(s.find(from), from.size(), to);
  return s;
}
}  // namespace

TEST(HfConfig, ReadsALlama3Config) {
  const theory::TransformerModel m = read_hf_config(write_config("llama3-70b", kLlama3_70b)).model;
  EXPECT_EQ(m.name, "llama:llama3-70b");
  EXPECT_EQ(m.h, 8192);
  EXPECT_EQ(m.a, 64);
  EXPECT_EQ(m.layer.kv_heads, 8);
  EXPECT_EQ(m.layer.ffn_hidden, 28672);
  EXPECT_EQ(m.L, 80);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.seq, 8192);
  EXPECT_DOUBLE_EQ(m.layer.rotary_base, 500000.0);
  EXPECT_DOUBLE_EQ(m.layer.norm_epsilon, 1e-5);
  const LayerDims& preset = find_preset("llama3-70b").dims;
  EXPECT_EQ(preset.h, m.h);
  EXPECT_EQ(preset.groups(), m.layer.kv_heads);
  EXPECT_EQ(preset.ffn(), m.layer.ffn_hidden);
  // the preset's layer, at the file's epsilon
  EXPECT_EQ(m.layer, theory::llama_layer_spec(8, 28672, 500000.0, 1e-5));
}

TEST(HfConfig, RefusesWhatTheFamilyCannotExpress) {
  refuses("gelu", with("\"silu\"", "\"gelu\""), "hidden_act");
  refuses("bias", with("\"attention_bias\": false", "\"attention_bias\": true"), "attention_bias");
  refuses("mlpbias", with("\"mlp_bias\": false", "\"mlp_bias\": true"), "mlp_bias");
  refuses("moe", with("\"vocab_size\"", "\"num_local_experts\": 8, \"vocab_size\""), "num_local_experts");
  refuses("nohidden", with("\"hidden_size\": 8192,", ""), "hidden_size");
  refuses("kv", with("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 7"), "num_key_value_heads");
  refuses("json", "{ not json", "JSON");
  EXPECT_THROW(read_hf_config("/nonexistent/config.json"), InvalidArgument);
}

TEST(HfConfig, EveryKeyHasItsTypeAndBounds) {
  refuses("act", with("\"silu\"", "5"), "\"hidden_act\" must be a string");
  refuses("eps", with("1e-05", "1e300"), "\"rms_norm_eps\" must be in");
  refuses("theta", with("500000.0", "\"500000\""), "\"rope_theta\" must be a number");
  refuses("layers", with("\"num_hidden_layers\": 80", "\"num_hidden_layers\": 1000000000000"),
          "\"num_hidden_layers\" must be in 1..1024");
  refuses("hidden", with("\"hidden_size\": 8192", "\"hidden_size\": 4611686018427387904"), "\"hidden_size\" must be in");
  refuses("float", with("\"hidden_size\": 8192", "\"hidden_size\": 8192.0"), "\"hidden_size\" must be an integer");
  refuses("bias", with("\"mlp_bias\": false", "\"mlp_bias\": 0"), "\"mlp_bias\" must be true or false");
  // null is the key's default, as in Hugging Face
  EXPECT_EQ(read_hf_config(write_config("null", with("\"num_key_value_heads\": 8", "\"num_key_value_heads\": null")))
                .model.layer.kv_heads,
            64);
}

TEST(HfConfig, TheBoundsHoldEveryPreset) {
  for (const char* name : {"llama3-8b", "llama3-70b", "llama3-405b"}) {
    const ModelPreset& p = find_preset(name);
    EXPECT_LE(p.dims.h, kMaxModelWidth);
    EXPECT_LE(p.dims.ffn(), kMaxModelWidth);
    EXPECT_LE(p.layers, kMaxModelLayers);
    EXPECT_LE(p.vocab, kMaxVocab);
    EXPECT_LE(p.dims.s, kMaxPositions);
    EXPECT_GE(p.dims.spec.rotary_base, kMinRopeTheta);
    EXPECT_LE(p.dims.spec.rotary_base, kMaxRopeTheta);
    EXPECT_GE(p.dims.spec.norm_epsilon, kMinNormEps);
    EXPECT_LE(p.dims.spec.norm_epsilon, kMaxNormEps);
  }
}

TEST(HfConfig, AFolderOrAFifoIsRefusedAtOnce) {
  const auto dir = std::filesystem::temp_directory_path() / ("actbench_hf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "folder.json");
  const std::string fifo = (dir / "fifo.json").string();
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW(read_hf_config((dir / "folder.json").string()), InvalidArgument);
  EXPECT_THROW(read_hf_config(fifo), InvalidArgument);  // at once: nobody writes to it
}
