// The composed layer (layers/transformer_layer.hpp) against the closed forms piece by piece
// (theory/layer_pieces.hpp): bytes measured on the meta backend equal the formulas to the byte,
// category by category, for a generated grid of specs × every configuration and recompute
// module set × unfused/fused × t ∈ {1, 2, 4, 8}. And on the cpu, the recompute modules' known
// effects: each frees what Megatron-Core's frees, and none changes a single computed value.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "layer_harness.hpp"
#include "layers/theory_dims.hpp"
#include "runners/experiment.hpp"
#include "theory/layer_pieces.hpp"

using namespace actbench;
using namespace actbench::testing;
using theory::Activation;
using theory::LayerSpec;
using theory::Norm;
using theory::PositionEmbedding;

namespace {

// Every non-empty subset of Megatron's selective modules.
std::vector<RecomputeModules> module_sets() {
  std::vector<RecomputeModules> out;
  for (int bits = 1; bits < 8; ++bits) out.push_back({(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0});
  return out;
}

// The policies a spec is measured under: the six configurations and selective with each module set.
std::vector<LayerPolicy> policies() {
  std::vector<LayerPolicy> out;
  for (const std::string& name : config_names()) out.push_back(parse_config(name));
  for (bool sp : {false, true})
    for (RecomputeModules m : module_sets()) out.push_back({Recompute::selective, sp, Attention::unfused, m});
  return out;
}

std::string describe(const LayerSpec& s) {
  return std::string(theory::norm_name(s.normalization)) + (s.qk_layernorm ? "+qk" : "") + " " +
         theory::activation_name(s.activation) + " F=" + std::to_string(s.ffn_hidden) +
         (s.add_bias_linear ? " bias" : (s.add_qkv_bias ? " qkv-bias" : " no-bias")) +
         " g=" + std::to_string(s.kv_heads) + " d=" + std::to_string(s.kv_channels) + " " +
         theory::position_name(s.position) + " " +
         std::to_string(s.rotary_percent) + " drop=" + std::to_string(s.attention_dropout) + "/" +
         std::to_string(s.hidden_dropout);
}

// A spec drawn from every option's values by a fixed generator: the grid covers each value of
// each option many times, in combinations no one picked by hand.
LayerSpec draw_spec(std::mt19937& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  LayerSpec s;
  s.normalization = pick(2) ? Norm::rmsnorm : Norm::layernorm;
  s.qk_layernorm = pick(2) != 0;
  s.activation = static_cast<Activation>(pick(3));
  s.ffn_hidden = pick(2) ? 0 : 96;
  const int bias = pick(3);
  s.add_bias_linear = bias == 0;
  s.add_qkv_bias = bias == 1;
  s.kv_heads = std::vector<double>{0, 16, 8}[pick(3)];
  s.position = pick(3) ? PositionEmbedding::rope : PositionEmbedding::none;
  s.rotary_percent = pick(2) ? 1.0 : 0.5;
  s.attention_dropout = pick(2) ? 0.1 : 0.0;
  s.hidden_dropout = pick(2) ? 0.1 : 0.0;
  s.kv_channels = std::vector<double>{0, 4, 12}[pick(3)];  // h/a = 8, or a·d below or above h
  return s;
}

theory::ByteCategories as_theory(const std::vector<std::pair<std::string, int64_t>>& measured,
                                 bool extras) {
  theory::ByteCategories out;
  for (const auto& [name, bytes] : measured) {
    const bool extra = name.ends_with("_stats");
    if (extra == extras) out.push_back({name, static_cast<double>(bytes)});
  }
  return out;
}

}  // namespace

TEST(ComposedLayerMeta, MeasuredBytesEqualThePiecesForAGeneratedGrid) {
  auto be = make_meta_backend();
  std::mt19937 rng(22);
  int runs = 0;
  for (int i = 0; i < 40; ++i) {
    LayerDims d{16, 2, 128, 16};  // head size 8 (or kv_channels 4, 12): rotary 0.5 rotates 4 (2, 6) dimensions
    d.spec = draw_spec(rng);
    for (int t : {1, 2, 4, 8})
      for (LayerPolicy p : policies())
        for (Attention att : {Attention::unfused, Attention::fused})
          for (DType dtype : {DType::bf16, DType::fp32}) {
            p.attention = att;
            const ExperimentResult r = measure_once(*be, d, t, p, dtype);
            const std::string where = describe(d.spec) + " | " + config_name(p) + " " +
                                      recompute_modules_name(p.modules) + " " + attention_name(att) +
                                      " t=" + std::to_string(t) + " " + dtype_name(dtype);
            ASSERT_EQ(r.status, "ok") << where << ": " << r.message;
            const theory::Dims td = theory_dims(d, t);
            const theory::Precision prec{static_cast<double>(dtype_size(dtype)), 1.0};
            EXPECT_EQ(as_theory(r.act_by_category, false), theory::layer_bytes_by_category(td, d.spec, p, prec))
                << where;
            EXPECT_EQ(as_theory(r.act_by_category, true), theory::layer_extra_bytes_by_category(td, d.spec, p))
                << where;
            EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, d.spec, p, prec)) << where;
            ++runs;
          }
  }
  EXPECT_EQ(runs, 40 * 4 * 20 * 2 * 2);
}

// ------------------------------------------------------------------ known recompute effects

namespace {

LayerDims effect_dims(LayerSpec spec) {
  LayerDims d{32, 2, 64, 8};
  d.spec = spec;
  return d;
}

int64_t bytes_of(const ExperimentResult& r, const std::string& category) {
  for (const auto& [name, bytes] : r.act_by_category)
    if (name == category) return bytes;
  return 0;
}

LayerPolicy selective(RecomputeModules m, Attention att) { return {Recompute::selective, false, att, m}; }

}  // namespace

// Megatron-LM PR #7237: under fused attention core_attn frees only the log-sum-exp; q, k, v are
// the checkpoint's inputs and the projection keeps the attention output.
TEST(ComposedLayerEffects, FusedCoreAttnFreesOnlyTheLogSumExp) {
  auto be = make_meta_backend();
  for (const LayerSpec& spec : {theory::gpt_layer_spec(), theory::llama_layer_spec(4, 0)}) {
    const LayerDims d = effect_dims(spec);
    const LayerPolicy none{Recompute::none, false, Attention::fused, {}};
    const ExperimentResult kept = measure_once(*be, d, 1, none, DType::bf16);
    const ExperimentResult rebuilt =
        measure_once(*be, d, 1, selective({true, false, false}, Attention::fused), DType::bf16);
    EXPECT_EQ(kept.act_bytes - rebuilt.act_bytes, 4 * d.a * d.s * d.b);  // fp32 per row of each head
    EXPECT_EQ(bytes_of(kept, "attn_lse"), 4 * d.a * d.s * d.b);
    EXPECT_EQ(bytes_of(rebuilt, "attn_lse"), 0);
    for (const char* still : {"q", "k", "v", "proj_input"}) EXPECT_GT(bytes_of(rebuilt, still), 0) << still;
  }
}

// The layernorm module frees both norms' outputs (and their statistics); the mlp module the
// activation's input and fc2's input; together with core_attn (unfused) the a·s² tensors too.
TEST(ComposedLayerEffects, EachModuleFreesItsPieces) {
  auto be = make_meta_backend();
  const LayerDims d = effect_dims(theory::gpt_layer_spec());
  const int64_t sbh = d.s * d.b * d.h, e = 2;
  const ExperimentResult none = measure_once(*be, d, 1, {}, DType::bf16);
  const ExperimentResult norms = measure_once(*be, d, 1, selective({false, false, true}, Attention::unfused), DType::bf16);
  EXPECT_EQ(none.act_bytes - norms.act_bytes, 2 * e * sbh);                  // qkv_input, fc1_input
  EXPECT_EQ(none.act_extra_bytes - norms.act_extra_bytes, 2 * 2 * 4 * d.s * d.b);  // mean, rstd of both
  const ExperimentResult mlp = measure_once(*be, d, 1, selective({false, true, false}, Attention::unfused), DType::bf16);
  EXPECT_EQ(none.act_bytes - mlp.act_bytes, 2 * e * 4 * sbh);                // gelu_input, fc2_input (4h wide)
  const ExperimentResult all = measure_once(*be, d, 1, selective({true, true, true}, Attention::unfused), DType::bf16);
  const int64_t scores = d.a * d.s * d.s * d.b;
  EXPECT_EQ(none.act_bytes - all.act_bytes, 2 * e * sbh + 2 * e * 4 * sbh + (2 * e + 1) * scores);
}

// Whatever is rebuilt, backward computes exactly what it computes from kept tensors: every
// output and gradient bit for bit, dropout on, for every module set, fused and unfused, on
// specs with every piece (q/k norms, RoPE on half the head, SwiGLU, GQA, biases, a head size
// apart from h/a).
TEST(ComposedLayerEffects, RecomputeChangesNoValue) {
  auto be = make_cpu_backend();
  auto local = make_local_communicator();
  LayerSpec with_everything = theory::llama_layer_spec(2, 48);
  with_everything.qk_layernorm = true;
  with_everything.rotary_percent = 0.5;
  with_everything.add_qkv_bias = true;
  with_everything.attention_dropout = with_everything.hidden_dropout = 0.1;
  LayerSpec gpt_like = theory::gpt_layer_spec();
  gpt_like.activation = Activation::squared_relu;
  gpt_like.qk_layernorm = true;
  LayerSpec wide_heads = with_everything;
  wide_heads.kv_channels = 12;  // a·d = 48 of h 32; RoPE on 6 of each head's 12
  for (const LayerSpec& spec : {with_everything, gpt_like, wide_heads}) {
    LayerDims d{8, 2, 32, 4};
    d.spec = spec;
    for (Attention att : {Attention::unfused, Attention::fused}) {
      ExperimentSpec ref = small_spec("baseline", DType::fp32, 0.1f, d);
      ref.dims.spec = spec;
      ref.policy.attention = att;
      const auto expected = run_layer_canonical(*be, *local, ref);
      std::vector<LayerPolicy> runs = {{Recompute::full, false, att, {}}};
      for (RecomputeModules m : module_sets()) runs.push_back({Recompute::selective, false, att, m});
      for (const LayerPolicy& p : runs) {
        ExperimentSpec spec_p = ref;
        spec_p.policy = p;
        expect_same_tensors(run_layer_canonical(*be, *local, spec_p), expected, 0, 0,
                            describe(spec) + " " + config_name(p) + " " + recompute_modules_name(p.modules) + " " +
                                attention_name(att));
      }
    }
  }
}
