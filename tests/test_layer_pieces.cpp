// The composed layer's bytes (theory/layer_pieces.hpp): the two presets against the formulas
// written before it (Table 2, the llama family), category by category over a grid; each
// recompute module's and each option's effect against a number worked out by hand here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.hpp"
#include "theory/activation_memory.hpp"
#include "theory/layer_pieces.hpp"
#include "theory/layer_spec.hpp"
#include "theory/llama_memory.hpp"
#include "theory/model_table.hpp"

using namespace actbench;
using namespace actbench::theory;

namespace {

const std::vector<Dims> kShapes = {
    {2048, 1, 12288, 96, 1}, {512, 4, 1024, 16, 1}, {1024, 2, 2560, 32, 1}, {128, 3, 768, 16, 1}};
const std::vector<Precision> kPrecisions = {{2, 1}, {4, 1}, {2, 2}};

LayerPolicy policy(Recompute r, bool sp, Attention a, RecomputeModules m = {}) { return {r, sp, a, m}; }
LayerPolicy selective(RecomputeModules m, Attention a = Attention::unfused, bool sp = false) {
  return {Recompute::selective, sp, a, m};
}
const RecomputeModules kCoreAttn{true, false, false}, kMlp{false, true, false}, kNorms{false, false, true};

std::vector<std::string> names(const ByteCategories& categories) {
  std::vector<std::string> out;
  for (const auto& [name, bytes] : categories) out.push_back(name);
  return out;
}

ByteCategories without(ByteCategories categories, const std::string& name) {
  std::erase_if(categories, [&](const auto& entry) { return entry.first == name; });
  return categories;
}

double bytes_of(const ByteCategories& categories, const std::string& name) {
  for (const auto& [n, bytes] : categories)
    if (n == name) return bytes;
  return 0;
}

// The shape of the hand-worked tests: s 1024, b 2, h 2048, a 16, t 2.
// s·b·h = 4194304, s·b = 2048, a·s²·b = 33554432, a·s·b = 32768; 16-bit, 1-byte masks.
const Dims kHand{1024, 2, 2048, 16, 2};

}  // namespace

// ---------------------------------------------------------------- the presets

// Table 2 (and the llama family's closed forms) take selective as Megatron's core_attn
// checkpoint, which under fused attention frees the log-sum-exp too.
TEST(LayerPiecesTheory, GptPresetIsTable2CategoryByCategory) {
  for (Dims d : kShapes)
    for (double t : {1, 2, 4, 8})
      for (const std::string& name : config_names())
        for (Attention attention : {Attention::unfused, Attention::fused})
          for (Precision p : kPrecisions) {
            d.t = t;
            LayerPolicy c = parse_config(name);
            c.attention = attention;
            const ByteCategories table2 = activation_bytes_by_category(d, c, p);
            const ByteCategories composed = layer_bytes_by_category(d, gpt_layer_spec(), c, p);
            const std::string where = name + " " + attention_name(attention) + " t=" + std::to_string(t);
            EXPECT_EQ(composed, table2) << where;
            EXPECT_EQ(layer_extra_bytes(d, gpt_layer_spec(), c), layernorm_stats_bytes(d, c)) << where;
          }
}

TEST(LayerPiecesTheory, LlamaPresetIsTheLlamaFamilyCategoryByCategory) {
  for (const Dims& shape : kShapes)
    for (double g : {shape.a, 8.0, 2.0})
      for (double f : {0.0, 3 * shape.h, 11008.0})
        for (double t : {1, 2, 4, 8})
          for (const std::string& name : config_names())
            for (Attention attention : {Attention::unfused, Attention::fused})
              for (Precision p : kPrecisions) {
                const LlamaDims ld{shape.s, shape.b, shape.h, shape.a, g, f, t};
                const Dims d{shape.s, shape.b, shape.h, shape.a, t};
                LayerPolicy c = parse_config(name);
                c.attention = attention;
                const ByteCategories family = llama_activation_bytes_by_category(ld, c, p);
                const ByteCategories composed = layer_bytes_by_category(d, llama_layer_spec(g, f), c, p);
                const std::string where = name + " " + attention_name(attention) + " g=" + std::to_string(g) +
                                          " F=" + std::to_string(f) + " t=" + std::to_string(t);
                EXPECT_EQ(composed, family) << where;
                EXPECT_EQ(layer_extra_bytes(d, llama_layer_spec(g, f), c), llama_norm_stats_bytes(ld, c)) << where;
              }
}

// ---------------------------------------------------------------- recompute modules

TEST(LayerPiecesTheory, FusedCoreAttnFreesOnlyTheLogSumExp) {
  for (const LayerSpec& spec : {gpt_layer_spec(), llama_layer_spec(4, 0)}) {
    const LayerPolicy none = policy(Recompute::none, false, Attention::fused);
    const ByteCategories kept = layer_bytes_by_category(kHand, spec, none);
    const ByteCategories rebuilt = layer_bytes_by_category(kHand, spec, selective(kCoreAttn, Attention::fused));
    EXPECT_EQ(rebuilt, without(kept, "attn_lse"));                 // q, k, v and proj_input stay
    EXPECT_EQ(layer_bytes(kHand, spec, none) - layer_bytes(kHand, spec, selective(kCoreAttn, Attention::fused)),
              65536.0);                                             // 4 bytes · a·s·b/t = 4 · 16384
  }
}

TEST(LayerPiecesTheory, UnfusedCoreAttnFreesTheScoreTensors) {
  const LayerPolicy none = policy(Recompute::none, false, Attention::unfused);
  // With attention dropout: softmax, mask, dropped probabilities, (2 + 1 + 2)·a·s²·b/t.
  EXPECT_EQ(layer_bytes(kHand, gpt_layer_spec(), none) - layer_bytes(kHand, gpt_layer_spec(), selective(kCoreAttn)),
            5 * 16777216.0);
  // Without: the probabilities alone, 2·a·s²·b/t.
  const LayerSpec llama = llama_layer_spec(4, 0);
  EXPECT_EQ(layer_bytes(kHand, llama, none) - layer_bytes(kHand, llama, selective(kCoreAttn)), 2 * 16777216.0);
}

TEST(LayerPiecesTheory, LayernormModuleFreesBothNormOutputsAndTheirStatistics) {
  for (bool sp : {false, true}) {
    const double region = sp ? 2097152.0 : 4194304.0;  // s·b·h/r
    const LayerPolicy none = policy(Recompute::none, sp, Attention::unfused);
    const LayerPolicy norms = selective(kNorms, Attention::unfused, sp);
    const ByteCategories kept = layer_bytes_by_category(kHand, gpt_layer_spec(), none);
    const ByteCategories rebuilt = layer_bytes_by_category(kHand, gpt_layer_spec(), norms);
    EXPECT_EQ(rebuilt, without(without(kept, "qkv_input"), "fc1_input"));
    EXPECT_EQ(layer_bytes(kHand, gpt_layer_spec(), none) - layer_bytes(kHand, gpt_layer_spec(), norms), 2 * 2 * region);
    // LayerNorm's mean and rstd: 2 norms · 2 · 4 bytes per row before, none after.
    EXPECT_EQ(layer_extra_bytes(kHand, gpt_layer_spec(), none), 16 * (sp ? 1024.0 : 2048.0));  // · s·b/r
    EXPECT_EQ(layer_extra_bytes(kHand, gpt_layer_spec(), selective(kNorms, Attention::unfused, sp)), 0.0);
  }
  // The q/k norms are not block norms: the module keeps their inputs and statistics.
  LayerSpec qk = llama_layer_spec(4, 0);
  qk.qk_layernorm = true;
  const ByteCategories extras = layer_extra_bytes_by_category(kHand, qk, selective(kNorms));
  EXPECT_EQ(names(extras), (std::vector<std::string>{"q_norm_stats", "k_norm_stats"}));
  EXPECT_EQ(layer_extra_bytes(kHand, qk, selective(kNorms)), 4 * (16384.0 + 4096.0));  // rstd per head row
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kHand, qk, selective(kNorms)), "q_norm_input"), 4194304.0);
}

TEST(LayerPiecesTheory, MlpModuleKeepsOnlyTheMlpInput) {
  const LayerPolicy none = policy(Recompute::none, false, Attention::unfused);
  const ByteCategories rebuilt = layer_bytes_by_category(kHand, gpt_layer_spec(), selective(kMlp));
  EXPECT_EQ(names(rebuilt), (std::vector<std::string>{"ln1_input", "qkv_input", "q", "k", "softmax_out",
                                                      "attn_dropout_mask", "attn_dropout_out", "v", "proj_input",
                                                      "attn_residual_mask", "ln2_input", "fc1_input",
                                                      "mlp_residual_mask"}));
  // GeLU: its input and fc2's, 2 · 2 bytes · s·b·4h/t = 4 · 8388608.
  EXPECT_EQ(layer_bytes(kHand, gpt_layer_spec(), none) - layer_bytes(kHand, gpt_layer_spec(), selective(kMlp)),
            4 * 8388608.0);
  // SwiGLU of F = 5632: gate | up and fc2's input, 3 · 2 bytes · s·b·F/t = 6 · 5767168.
  const LayerSpec llama = llama_layer_spec(4, 5632);
  EXPECT_EQ(layer_bytes(kHand, llama, none) - layer_bytes(kHand, llama, selective(kMlp)), 6 * 5767168.0);
  // With layernorm too, the checkpoint's input is discarded as well: the MLP keeps nothing.
  const ByteCategories both = layer_bytes_by_category(kHand, llama, selective({false, true, true}));
  EXPECT_EQ(names(both).back(), "ln2_input");
}

TEST(LayerPiecesTheory, AllModulesAndFullAgainstTheirSums) {
  // gpt, unfused, t 2, no SP, every module: ln1 2 + q, k, v, proj 4 · 1 + masks 2 · 1 + ln2 2
  // = 10 · s·b·h bytes.
  EXPECT_EQ(layer_bytes(kHand, gpt_layer_spec(), selective({true, true, true})), 10 * 4194304.0);
  // No module at all rebuilds nothing.
  EXPECT_EQ(layer_bytes(kHand, gpt_layer_spec(), selective({false, false, false})),
            layer_bytes(kHand, gpt_layer_spec(), LayerPolicy{}));
  // Full: the layer input, 2·s·b·h/r, whatever the spec and the modules.
  LayerSpec any = llama_layer_spec(4, 5632);
  any.qk_layernorm = true;
  EXPECT_EQ(layer_bytes_by_category(kHand, any, policy(Recompute::full, true, Attention::fused, {true, true, true})),
            (ByteCategories{{"layer_input", 4194304.0}}));
  EXPECT_EQ(layer_extra_bytes(kHand, any, policy(Recompute::full, false, Attention::unfused)), 0.0);
}

// ---------------------------------------------------------------- each option's piece

TEST(LayerPiecesTheory, QkLayernormAddsExactlyItsInputs) {
  LayerSpec spec = gpt_layer_spec();
  spec.kv_heads = 4;
  LayerSpec with = spec;
  with.qk_layernorm = true;
  for (Attention attention : {Attention::unfused, Attention::fused})
    for (const LayerPolicy& c : {policy(Recompute::none, false, attention), selective({true, true, true}, attention)}) {
      // q: 2 bytes · s·b·h/t = 4194304; k: a quarter of it (g/a = 4/16).
      EXPECT_EQ(layer_bytes(kHand, with, c) - layer_bytes(kHand, spec, c), 4194304.0 + 1048576.0);
      const ByteCategories kept = layer_bytes_by_category(kHand, with, c);
      EXPECT_EQ(bytes_of(kept, "q_norm_input"), 4194304.0);
      EXPECT_EQ(bytes_of(kept, "k_norm_input"), 1048576.0);
    }
  // LayerNorm statistics: 8 bytes per row of each head, a·s·b/t + g·s·b/t rows.
  EXPECT_EQ(layer_extra_bytes(kHand, with, LayerPolicy{}) - layer_extra_bytes(kHand, spec, LayerPolicy{}),
            8 * (16384.0 + 4096.0));
}

TEST(LayerPiecesTheory, BiasesAndRotaryKeepNothing) {
  for (const LayerSpec& base : {gpt_layer_spec(), llama_layer_spec(4, 5632)})
    for (const std::string& name : config_names())
      for (Attention attention : {Attention::unfused, Attention::fused}) {
        LayerPolicy c = parse_config(name);
        c.attention = attention;
        for (int variant = 0; variant < 4; ++variant) {
          LayerSpec changed = base;
          if (variant == 0) changed.add_bias_linear = !base.add_bias_linear;
          if (variant == 1) changed.add_qkv_bias = !base.add_qkv_bias;
          if (variant == 2) changed.position = base.position == PositionEmbedding::rope ? PositionEmbedding::none
                                                                                          : PositionEmbedding::rope;
          if (variant == 3) changed.rotary_percent = 0.5;
          EXPECT_EQ(layer_bytes_by_category(kHand, changed, c), layer_bytes_by_category(kHand, base, c))
              << name << " variant " << variant;
        }
      }
}

TEST(LayerPiecesTheory, DropoutsEachAddTheirMasks) {
  LayerSpec spec = llama_layer_spec(16, 0);  // no dropout
  LayerSpec attention = spec;
  attention.attention_dropout = 0.1;
  // Unfused, nothing recomputed: a 1-byte mask and the dropped probabilities, 3 · a·s²·b/t.
  const LayerPolicy none = policy(Recompute::none, false, Attention::unfused);
  EXPECT_EQ(layer_bytes(kHand, attention, none) - layer_bytes(kHand, spec, none), 3 * 16777216.0);
  // Fused regenerates the mask; core_attn rebuilds both.
  EXPECT_EQ(layer_bytes(kHand, attention, policy(Recompute::none, false, Attention::fused)),
            layer_bytes(kHand, spec, policy(Recompute::none, false, Attention::fused)));
  EXPECT_EQ(layer_bytes(kHand, attention, selective(kCoreAttn)), layer_bytes(kHand, spec, selective(kCoreAttn)));
  // Hidden dropout: two 1-byte masks of s·b·h/r, under any recompute but full.
  LayerSpec hidden = spec;
  hidden.hidden_dropout = 0.1;
  for (bool sp : {false, true})
    for (const LayerPolicy& c :
         {policy(Recompute::none, sp, Attention::fused), selective({true, true, true}, Attention::fused, sp)})
      EXPECT_EQ(layer_bytes(kHand, hidden, c) - layer_bytes(kHand, spec, c), 2 * (sp ? 2097152.0 : 4194304.0));
}

TEST(LayerPiecesTheory, GroupedQueryAttentionShrinksKAndV) {
  LayerSpec gqa = gpt_layer_spec();
  gqa.kv_heads = 4;
  for (Attention attention : {Attention::unfused, Attention::fused}) {
    const LayerPolicy c = policy(Recompute::none, false, attention);
    // k and v: 2 · 2 bytes · s·b·h/t · (1 − 4/16) = 4 · 2097152 · 0.75.
    EXPECT_EQ(layer_bytes(kHand, gpt_layer_spec(), c) - layer_bytes(kHand, gqa, c), 6291456.0);
  }
}

// --kv-channels: each head's size d apart from h/a (Qwen3-0.6B: h 1024, a 16, d 128). q, k, v,
// the q/k norms' inputs and the attention output scale with d; the a·s² tensors, the
// log-sum-exp and every statistic count heads and rows only.
TEST(LayerPiecesTheory, HeadSizeScalesTheHeadTensorsOnly) {
  LayerSpec base = gpt_layer_spec();
  base.kv_heads = 4;
  base.qk_layernorm = true;
  const std::vector<std::string> head_tensors = {"q_norm_input", "k_norm_input", "q", "k", "v", "proj_input"};
  for (const auto& [kv_channels, scale] : std::vector<std::pair<double, double>>{{64, 0.5}, {256, 2}, {128, 1}})
    for (Attention attention : {Attention::unfused, Attention::fused})
      for (const LayerPolicy& c : {policy(Recompute::none, false, attention), policy(Recompute::none, true, attention),
                                   selective(kCoreAttn, attention), selective({true, true, true}, attention, true)}) {
        LayerSpec sized = base;
        sized.kv_channels = kv_channels;  // kHand's h/a is 128
        ByteCategories expected = layer_bytes_by_category(kHand, base, c);
        for (auto& [name, bytes] : expected)
          if (std::find(head_tensors.begin(), head_tensors.end(), name) != head_tensors.end()) bytes *= scale;
        EXPECT_EQ(layer_bytes_by_category(kHand, sized, c), expected) << kv_channels << " " << config_name(c);
        EXPECT_EQ(layer_extra_bytes(kHand, sized, c), layer_extra_bytes(kHand, base, c));
      }
  // By hand at d = 256: q is 2 bytes · s·b·a·d/t = 2 · 2048 · 4096 / 2, k a quarter of it (g 4 of a 16).
  LayerSpec wide = base;
  wide.kv_channels = 256;
  const ByteCategories kept = layer_bytes_by_category(kHand, wide, LayerPolicy{});
  EXPECT_EQ(bytes_of(kept, "q"), 8388608.0);
  EXPECT_EQ(bytes_of(kept, "k"), 2097152.0);
  EXPECT_EQ(bytes_of(kept, "softmax_out"), 2 * 16777216.0);
}

TEST(LayerPiecesTheory, ActivationsAndNorms) {
  const LayerPolicy none = policy(Recompute::none, false, Attention::unfused);
  LayerSpec swiglu = gpt_layer_spec(), squared = gpt_layer_spec(), rms = gpt_layer_spec();
  swiglu.activation = Activation::swiglu;
  squared.activation = Activation::squared_relu;
  rms.normalization = Norm::rmsnorm;
  // SwiGLU keeps the up half besides GeLU's one tensor: 2 bytes · s·b·4h/t = 16777216.
  EXPECT_EQ(layer_bytes(kHand, swiglu, none) - layer_bytes(kHand, gpt_layer_spec(), none), 16777216.0);
  // Squared ReLU keeps one tensor of the MLP's width, as GeLU does.
  EXPECT_EQ(layer_bytes(kHand, squared, none), layer_bytes(kHand, gpt_layer_spec(), none));
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kHand, squared, none), "squared_relu_input"), 16777216.0);
  // RMSNorm keeps what LayerNorm keeps; its statistics are half: rstd alone, 2 norms · 4 bytes · s·b.
  EXPECT_EQ(layer_bytes_by_category(kHand, rms, none), layer_bytes_by_category(kHand, gpt_layer_spec(), none));
  EXPECT_EQ(layer_extra_bytes(kHand, rms, none), 8 * 2048.0);
}

// A Qwen3-like layer: RMSNorm with QK-norm, GQA g 8 of a 32 with RoPE, SwiGLU F 12288, no bias,
// no dropout, s 4096, b 1, h 4096, t 4 with SP, fused attention, core_attn + layernorm.
// s·b·h = 16777216, e/r = e/t = 1/2: ln1 + ln2 2 · ½ sbh, q-norm + q + proj 3 · ½ sbh,
// k-norm + k + v 3 · ½ · ¼ sbh, gate|up + fc2's input 3 · 2 · s·b·F/4 = 75497472.
TEST(LayerPiecesTheory, AQwenThreeLikeCombinationByHand) {
  LayerSpec spec = llama_layer_spec(8, 12288, 1000000, 1e-6);
  spec.qk_layernorm = true;
  const Dims d{4096, 1, 4096, 32, 4};
  const LayerPolicy c = selective({true, false, true}, Attention::fused, true);
  const ByteCategories kept = layer_bytes_by_category(d, spec, c);
  EXPECT_EQ(names(kept), (std::vector<std::string>{"ln1_input", "q_norm_input", "k_norm_input", "q", "k", "v",
                                                   "proj_input", "ln2_input", "swiglu_input", "fc2_input"}));
  EXPECT_EQ(layer_bytes(d, spec, c), 16777216.0 + 3 * 8388608.0 + 3 * 2097152.0 + 75497472.0);
}

// ---------------------------------------------------------------- multi-latent attention

namespace {

// The attention side of a layer's categories: everything before norm 2.
ByteCategories attention_part(const ByteCategories& categories) {
  ByteCategories out;
  for (const auto& entry : categories) {
    if (entry.first == "ln2_input") break;
    out.push_back(entry);
  }
  return out;
}

RecomputeModules only_mla_up_proj() {
  RecomputeModules m{false, false, false};
  m.mla_up_proj = true;
  return m;
}

// A small MLA layer: the paper's (LayerNorm, dropout 0.1 on both) with L_q 24, L_kv 16,
// d_qk 8 + d_r 4 = 12 per head of q and k, d_v 6; s 16, b 2, h 64, a 4, t 2. s·b = 32,
// a/t·s·b = 64 head rows, a·s²·b/t = 1024.
LayerSpec small_mla(double q_lora_rank = 24) {
  LayerSpec spec = gpt_layer_spec();
  spec.mla = {.enabled = true, .q_lora_rank = q_lora_rank, .kv_lora_rank = 16, .qk_head_dim = 8,
              .qk_pos_emb_head_dim = 4, .v_head_dim = 6};
  return spec;
}
const Dims kSmall{16, 2, 64, 4, 2};

// DeepSeek-V3's attention: h 7168, a 128, L_q 1536, L_kv 512, d_qk 128 + d_r 64 = 192, d_v 128,
// RMSNorm, no dropout (a dense MLP stands in for its MoE: only the attention side is checked).
LayerSpec deepseek_v3_mla() {
  LayerSpec spec = llama_layer_spec(0, 18432);
  spec.mla = {.enabled = true, .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_head_dim = 128,
              .qk_pos_emb_head_dim = 64, .v_head_dim = 128};
  return spec;
}

}  // namespace

TEST(MlaPiecesTheory, SmallShapeByHand) {
  // No SP (r = 1), unfused, no recompute, 16-bit, 1-byte masks.
  const ByteCategories none = layer_bytes_by_category(kSmall, small_mla(), LayerPolicy{});
  EXPECT_EQ(attention_part(none), (ByteCategories{
                                      {"ln1_input", 4096},          // 2 · 32 · 64
                                      {"qkv_input", 4096},          // the same tensor size, norm 1's output
                                      {"q_latent", 1536},           // 2 · 32 · 24
                                      {"q_up_input", 1536},         // the q norm's output
                                      {"kv_latent", 1024},          // 2 · 32 · 16
                                      {"kv_up_input", 1024},        // the kv norm's output
                                      {"q", 1536},                  // 2 · 64 · 12
                                      {"k", 1536},                  // k's RoPE part copied into each head
                                      {"softmax_out", 2048},        // 2 · 1024
                                      {"attn_dropout_mask", 1024},  // 1 · 1024
                                      {"attn_dropout_out", 2048},
                                      {"v", 768},                   // 2 · 64 · 6
                                      {"proj_input", 768},
                                      {"attn_residual_mask", 2048}}));  // 1 · 32 · 64
  // The MLP side is the dense layer's, untouched by MLA.
  const ByteCategories dense = layer_bytes_by_category(kSmall, gpt_layer_spec(), LayerPolicy{});
  EXPECT_EQ(ByteCategories(none.begin() + 14, none.end()), ByteCategories(dense.begin() + 10, dense.end()));
  // SP (r = 2) halves the region rows and the latents (the down projections run on s·b/t rows);
  // the heads are split over t either way.
  const ByteCategories sp = layer_bytes_by_category(kSmall, small_mla(), policy(Recompute::none, true, Attention::unfused));
  for (const char* name : {"ln1_input", "qkv_input", "q_latent", "q_up_input", "kv_latent", "kv_up_input",
                           "attn_residual_mask"})
    EXPECT_EQ(bytes_of(sp, name), bytes_of(none, name) / 2) << name;
  for (const char* name : {"q", "k", "softmax_out", "attn_dropout_mask", "attn_dropout_out", "v", "proj_input"})
    EXPECT_EQ(bytes_of(sp, name), bytes_of(none, name)) << name;
  // The statistics: LayerNorm's 8 bytes a row, 32 rows (16 under SP), norm 1, the two latent norms, norm 2.
  EXPECT_EQ(layer_extra_bytes_by_category(kSmall, small_mla(), LayerPolicy{}),
            (ByteCategories{{"ln1_stats", 256}, {"q_latent_norm_stats", 256}, {"kv_latent_norm_stats", 256},
                            {"ln2_stats", 256}}));
  EXPECT_EQ(layer_extra_bytes(kSmall, small_mla(), policy(Recompute::none, true, Attention::unfused)), 4 * 128.0);
}

TEST(MlaPiecesTheory, FusedKeepsTheLogSumExpInPlaceOfTheScores) {
  const ByteCategories unfused = layer_bytes_by_category(kSmall, small_mla(), LayerPolicy{});
  const ByteCategories fused = layer_bytes_by_category(kSmall, small_mla(), policy(Recompute::none, false, Attention::fused));
  ByteCategories expected = without(without(without(unfused, "softmax_out"), "attn_dropout_mask"), "attn_dropout_out");
  expected.insert(expected.begin() + 8, {"attn_lse", 256});  // 4 bytes · a·s·b/t = 4 · 64, after k
  EXPECT_EQ(fused, expected);
}

TEST(MlaPiecesTheory, EachRecomputeModule) {
  const LayerSpec spec = small_mla();
  for (Attention a : {Attention::unfused, Attention::fused}) {
    for (bool sp : {false, true}) {
      const ByteCategories kept = layer_bytes_by_category(kSmall, spec, policy(Recompute::none, sp, a));
      // core_attn: the score tensors (unfused, 2048 + 1024 + 2048) or the lse (fused, 256).
      ByteCategories no_scores = kept;
      for (const char* name : {"softmax_out", "attn_dropout_mask", "attn_dropout_out", "attn_lse"})
        no_scores = without(no_scores, name);
      EXPECT_EQ(layer_bytes_by_category(kSmall, spec, selective(kCoreAttn, a, sp)), no_scores);
      // layernorm: norm 1's output (and norm 2's), not the latent norms'.
      EXPECT_EQ(layer_bytes_by_category(kSmall, spec, selective(kNorms, a, sp)),
                without(without(kept, "qkv_input"), "fc1_input"));
      EXPECT_EQ(names(layer_extra_bytes_by_category(kSmall, spec, selective(kNorms, a, sp))),
                (std::vector<std::string>{"q_latent_norm_stats", "kv_latent_norm_stats"}));
      // mla_up_proj: the norms' outputs and q, k, v go; k's RoPE part before rotation comes,
      // 2 · s·b · d_r = 2 · 32 · 4 = 256 under SP too (whole rows: gathered before the checkpoint).
      ByteCategories up = kept;
      for (const char* name : {"q_up_input", "kv_up_input", "q", "k", "v"}) up = without(up, name);
      up.insert(up.begin() + 4, {"k_pos_emb", 256});  // after kv_latent
      EXPECT_EQ(layer_bytes_by_category(kSmall, spec, selective(only_mla_up_proj(), a, sp)), up);
      EXPECT_EQ(names(layer_extra_bytes_by_category(kSmall, spec, selective(only_mla_up_proj(), a, sp))),
                (std::vector<std::string>{"ln1_stats", "ln2_stats"}));
    }
  }
  // All three attention modules together, unfused, no SP: ln1 4096 + latents 1536 + 1024 +
  // k_pos_emb 256 + proj_input 768 + the residual mask 2048.
  RecomputeModules all{true, false, true};
  all.mla_up_proj = true;
  EXPECT_EQ(attention_part(layer_bytes_by_category(kSmall, spec, selective(all))),
            (ByteCategories{{"ln1_input", 4096}, {"q_latent", 1536}, {"kv_latent", 1024}, {"k_pos_emb", 256},
                            {"proj_input", 768}, {"attn_residual_mask", 2048}}));
  // On a dense layer mla_up_proj frees nothing; full keeps the layer input alone.
  EXPECT_EQ(layer_bytes(kHand, gpt_layer_spec(), selective(only_mla_up_proj())),
            layer_bytes(kHand, gpt_layer_spec(), selective({false, false, false})));
  EXPECT_EQ(layer_bytes_by_category(kSmall, spec, policy(Recompute::full, false, Attention::unfused)),
            (ByteCategories{{"layer_input", 4096}}));
}

TEST(MlaPiecesTheory, QDirectDropsTheQLatent) {
  // q_lora_rank 0: q projected from norm 1's output (qkv_input, already kept): no q latent,
  // no q norm output, no q norm statistics; q itself is unchanged.
  for (RecomputeModules m : {RecomputeModules{false, false, false}, only_mla_up_proj()}) {
    const LayerPolicy c = selective(m);
    const ByteCategories with_latent = layer_bytes_by_category(kSmall, small_mla(), c);
    const ByteCategories direct = layer_bytes_by_category(kSmall, small_mla(0), c);
    EXPECT_EQ(direct, without(without(with_latent, "q_latent"), "q_up_input"));
    EXPECT_EQ(layer_extra_bytes_by_category(kSmall, small_mla(0), c),
              without(layer_extra_bytes_by_category(kSmall, small_mla(), c), "q_latent_norm_stats"));
  }
}

TEST(MlaPiecesTheory, ContextParallelismHalvesEveryPiece) {
  const Dims cp2{16, 2, 64, 4, 2, 2};
  for (Attention a : {Attention::unfused, Attention::fused})
    for (RecomputeModules m : {RecomputeModules{false, false, false}, only_mla_up_proj()}) {
      const LayerPolicy c = selective(m, a, true);
      ByteCategories halved = layer_bytes_by_category(kSmall, small_mla(), c);
      for (auto& entry : halved) entry.second /= 2;
      EXPECT_EQ(layer_bytes_by_category(cp2, small_mla(), c), halved);
    }
}

// DeepSeek-V3 at s 4096, b 1: s·b·h = 29360128, s·b·a = 524288, a·s²·b = 2147483648; 16-bit.
TEST(MlaPiecesTheory, DeepSeekV3AttentionByHand) {
  const Dims t1{4096, 1, 7168, 128, 1};
  EXPECT_EQ(attention_part(layer_bytes_by_category(t1, deepseek_v3_mla(), LayerPolicy{})),
            (ByteCategories{{"ln1_input", 58720256},     // 2 · 4096 · 7168
                            {"qkv_input", 58720256},
                            {"q_latent", 12582912},      // 2 · 4096 · 1536
                            {"q_up_input", 12582912},
                            {"kv_latent", 4194304},      // 2 · 4096 · 512
                            {"kv_up_input", 4194304},
                            {"q", 201326592},            // 2 · 524288 · 192
                            {"k", 201326592},
                            {"softmax_out", 4294967296},  // 2 · 2147483648
                            {"v", 134217728},            // 2 · 524288 · 128
                            {"proj_input", 134217728}}));
  // Fused: the fp32 lse, 4 · 524288, in place of the probabilities.
  EXPECT_EQ(bytes_of(layer_bytes_by_category(t1, deepseek_v3_mla(), policy(Recompute::none, false, Attention::fused)),
                     "attn_lse"),
            2097152.0);
  // t 8 + SP, fused: every piece / 8 (region and latents by SP, heads by TP).
  const Dims t8{4096, 1, 7168, 128, 8};
  EXPECT_EQ(attention_part(layer_bytes_by_category(t8, deepseek_v3_mla(), policy(Recompute::none, true, Attention::fused))),
            (ByteCategories{{"ln1_input", 7340032},    // 58720256 / 8
                            {"qkv_input", 7340032},
                            {"q_latent", 1572864},     // 12582912 / 8
                            {"q_up_input", 1572864},
                            {"kv_latent", 524288},     // 4194304 / 8
                            {"kv_up_input", 524288},
                            {"q", 25165824},           // 201326592 / 8
                            {"k", 25165824},
                            {"attn_lse", 262144},      // 2097152 / 8
                            {"v", 16777216},           // 134217728 / 8
                            {"proj_input", 16777216}}));
  // With mla_up_proj (and core_attn): 7340032 · 2 + 1572864 + 524288 + k_pos_emb 2 · 4096 · 64
  // (whole rows on every rank) + proj_input 16777216.
  RecomputeModules m = only_mla_up_proj();
  m.core_attn = true;
  const ByteCategories up = attention_part(layer_bytes_by_category(t8, deepseek_v3_mla(), selective(m, Attention::fused, true)));
  EXPECT_EQ(bytes_of(up, "k_pos_emb"), 524288.0);
  double sum = 0;
  for (const auto& [name, bytes] : up) sum += bytes;
  EXPECT_EQ(sum, 2 * 7340032.0 + 1572864 + 524288 + 524288 + 16777216);
  // RMSNorm rstd, 4 bytes a row on s·b/t = 512 rows: norm 1, both latent norms, norm 2.
  EXPECT_EQ(layer_extra_bytes(t8, deepseek_v3_mla(), policy(Recompute::none, true, Attention::fused)), 4 * 4 * 512.0);
}

TEST(MlaPiecesTheory, CheckRefusesBadMlaOptions) {
  const Dims d{1024, 1, 7168, 128, 8};
  EXPECT_NO_THROW(check_layer_spec(d, deepseek_v3_mla()));
  LayerSpec direct = deepseek_v3_mla();
  direct.mla.q_lora_rank = 0;
  EXPECT_NO_THROW(check_layer_spec(d, direct));
  auto refusal = [&](void (*change)(MlaSpec&)) {
    LayerSpec spec = deepseek_v3_mla();
    change(spec.mla);
    try {
      check_layer_spec(d, spec);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refusal([](MlaSpec& m) { m.q_lora_rank = -1; }),
            "q-lora-rank -1 must be a whole number >= 0 (0: q projected directly)");
  EXPECT_EQ(refusal([](MlaSpec& m) { m.q_lora_rank = 1.5; }).rfind("q-lora-rank 1.5 ", 0), 0u);
  EXPECT_EQ(refusal([](MlaSpec& m) { m.kv_lora_rank = 0; }), "kv-lora-rank 0 must be a whole number above 0");
  EXPECT_EQ(refusal([](MlaSpec& m) { m.qk_head_dim = 0; }), "qk-head-dim 0 must be a whole number above 0");
  EXPECT_EQ(refusal([](MlaSpec& m) { m.qk_pos_emb_head_dim = std::nan(""); }).rfind("qk-pos-emb-head-dim ", 0), 0u);
  EXPECT_EQ(refusal([](MlaSpec& m) { m.v_head_dim = 64.5; }), "v-head-dim 64.5 must be a whole number above 0");
  LayerSpec qk = deepseek_v3_mla();
  qk.qk_layernorm = true;
  EXPECT_THROW(check_layer_spec(d, qk), InvalidArgument);
  EXPECT_THROW(check_layer_spec({1024, 1, 7168, 128, 3}, deepseek_v3_mla()), InvalidArgument);  // t 3 does not divide a 128
  LayerSpec off = deepseek_v3_mla();  // the MLA options are read only when MLA is on
  off.mla.enabled = false;
  off.mla.kv_lora_rank = 0;
  EXPECT_NO_THROW(check_layer_spec(d, off));
}

// ---------------------------------------------------------------- spec and names

TEST(LayerSpecTheory, PresetsAndNames) {
  const LayerSpec gpt = gpt_layer_spec();
  EXPECT_EQ(gpt.normalization, Norm::layernorm);
  EXPECT_EQ(gpt.activation, Activation::gelu);
  EXPECT_TRUE(gpt.add_bias_linear && gpt.qkv_bias());
  EXPECT_EQ(gpt.attention_dropout, 0.1);
  EXPECT_EQ(gpt.hidden_dropout, 0.1);
  EXPECT_EQ(gpt.position, PositionEmbedding::none);
  const LayerSpec llama = llama_layer_spec(8, 14336, 500000);
  EXPECT_EQ(llama.normalization, Norm::rmsnorm);
  EXPECT_EQ(llama.activation, Activation::swiglu);
  EXPECT_FALSE(llama.qkv_bias());
  EXPECT_EQ(llama.position, PositionEmbedding::rope);
  EXPECT_EQ(llama.rotary_base, 500000);
  EXPECT_EQ(llama.groups({1, 1, 4096, 32, 1}), 8);
  EXPECT_EQ(gpt.ffn({1, 1, 4096, 32, 1}), 16384);
  EXPECT_EQ(parse_norm("RMSNorm"), Norm::rmsnorm);
  EXPECT_EQ(std::string(norm_name(Norm::layernorm)), "LayerNorm");
  EXPECT_EQ(parse_position("learned_absolute"), PositionEmbedding::none);
  EXPECT_THROW(parse_norm("rmsnorm"), InvalidArgument);
  EXPECT_THROW(parse_position("alibi"), InvalidArgument);
}

// Each preset row's layer: the llama rows carry their g, F and RoPE base, the others are the paper's.
TEST(LayerSpecTheory, EachPresetRowsLayer) {
  for (const ModelRow& row : model_table()) {
    const LayerSpec spec = preset_layer_spec(row);
    if (row.arch == "llama")
      EXPECT_EQ(spec, llama_layer_spec(double(row.kv_heads), double(row.ffn_hidden), row.rope_theta)) << row.name;
    else if (row.arch == "moe")  // each against its published config: tests/test_hf_config.cpp
      EXPECT_EQ(spec.moe.num_experts, double(row.moe.experts)) << row.name;
    else
      EXPECT_EQ(spec, gpt_layer_spec()) << row.name;
  }
  ModelRow unset_theta{"x", "llama"};
  EXPECT_EQ(preset_layer_spec(unset_theta).rotary_base, 10000);
}

TEST(LayerSpecTheory, RecomputeModulesParseAndName) {
  EXPECT_EQ(parse_recompute_modules("core_attn"), RecomputeModules{});
  EXPECT_EQ(parse_recompute_modules("layernorm,core_attn,mlp"), (RecomputeModules{true, true, true}));
  EXPECT_EQ(recompute_modules_name(parse_recompute_modules("mlp,layernorm")), "mlp,layernorm");
  EXPECT_EQ(recompute_modules_name(RecomputeModules{}), "core_attn");
  RecomputeModules moe{false, false, false};
  moe.moe_act = moe.shared_experts = true;
  EXPECT_EQ(parse_recompute_modules("shared_experts,moe_act"), moe);
  EXPECT_EQ(recompute_modules_name(parse_recompute_modules("moe,layernorm,moe_act")), "layernorm,moe_act,moe");
  RecomputeModules mla{true, false, false};
  mla.mla_up_proj = true;
  EXPECT_EQ(parse_recompute_modules("mla_up_proj,core_attn"), mla);
  EXPECT_EQ(recompute_modules_name(mla), "core_attn,mla_up_proj");
  try {
    parse_recompute_modules("mla_up_proj,mla_up_proj");
    ADD_FAILURE() << "mla_up_proj twice accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "recompute module 'mla_up_proj' named twice (expected a comma-separated subset of core_attn, mlp, "
              "layernorm, moe_act, moe, shared_experts, mla_up_proj)");
  }
  for (const char* bad : {"", "mlp,", "core_attn,core_attn", "moe_experts", "MLP", "moe,moe"})
    EXPECT_THROW(parse_recompute_modules(bad), InvalidArgument) << bad;
  // The paper's names leave the modules at Megatron's default.
  EXPECT_EQ(parse_config("selective").modules, RecomputeModules{});
}

TEST(LayerSpecTheory, CheckRefusesWhatCannotBeBuilt) {
  const Dims d{1024, 1, 4096, 32, 4};
  EXPECT_NO_THROW(check_layer_spec(d, llama_layer_spec(8, 0)));
  EXPECT_THROW(check_layer_spec(d, llama_layer_spec(12, 0)), InvalidArgument);  // 12 does not divide 32
  EXPECT_THROW(check_layer_spec(d, llama_layer_spec(2, 0)), InvalidArgument);   // t 4 does not divide g 2
  LayerSpec bad = gpt_layer_spec();
  bad.rotary_percent = 0;
  EXPECT_THROW(check_layer_spec(d, bad), InvalidArgument);
  bad = gpt_layer_spec();
  bad.hidden_dropout = 1;
  EXPECT_THROW(check_layer_spec(d, bad), InvalidArgument);
  bad = gpt_layer_spec();
  bad.norm_epsilon = 0;
  EXPECT_THROW(check_layer_spec(d, bad), InvalidArgument);
  for (double kv_channels : {-128.0, 2.5, std::numeric_limits<double>::infinity(), std::nan("")}) {
    bad = gpt_layer_spec();
    bad.kv_channels = kv_channels;
    try {
      check_layer_spec(d, bad);
      ADD_FAILURE() << "kv_channels " << kv_channels << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("kv-channels ", 0), 0u) << e.what();
    }
  }
  bad = gpt_layer_spec();
  bad.kv_channels = 96;  // any whole size, not only h/a
  EXPECT_NO_THROW(check_layer_spec(d, bad));
  try {
    check_layer_spec(d, llama_layer_spec(12, 0));
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "num-query-groups 12 must divide the heads (32)");
  }
}

// ---------------------------------------------------------------- Megatron-Core's routing

namespace {

// 8 tokens of width 16 (s 8, b 1, t 1), 4 experts, top-2, experts 8 wide, 16-bit.
const Dims kRouting{8, 1, 16, 2, 1};

LayerSpec routing_spec(MoeScore score, bool bias, double groups, MegatronRouting megatron) {
  LayerSpec spec = gpt_layer_spec();
  spec.activation = Activation::swiglu;
  spec.moe.num_experts = 4;
  spec.moe.top_k = 2;
  spec.moe.ffn_hidden = 8;
  spec.moe.score = score;
  spec.moe.expert_bias = bias;
  spec.moe.num_groups = groups;
  spec.moe.group_top_k = groups > 0 ? 1 : 0;
  spec.moe.megatron = megatron;
  return spec;
}

// The categories only the routing bookkeeping differs in.
ByteCategories routing_part(const ByteCategories& all) {
  ByteCategories out;
  for (const auto& entry : all)
    if (entry.first.rfind("router_", 0) == 0 || entry.first == "moe_dispatch_plan" || entry.first == "moe_permute_map" ||
        entry.first == "moe_permuted_probs")
      out.push_back(entry);
  return out;
}
ByteCategories the_rest(ByteCategories all) {
  const ByteCategories routing = routing_part(all);
  std::erase_if(all, [&](const auto& entry) { return std::find(routing.begin(), routing.end(), entry) != routing.end(); });
  return all;
}

}  // namespace

TEST(MegatronRoutingTheory, DeepSeekStyleSigmoidByHand) {
  // Sigmoid with the expert bias and groups, an fp32 router, aux loss and z-loss, unfused
  // permutation: T = 8, N = N_e = 16, r = 4.
  const LayerSpec spec = routing_spec(MoeScore::sigmoid, true, 2, {.router_bytes = 4, .aux_loss = true, .z_loss = true});
  const ByteCategories megatron = layer_bytes_by_category(kRouting, spec, LayerPolicy{}, {}, Bookkeeping::megatron);
  EXPECT_EQ(routing_part(megatron), (ByteCategories{
                                        {"router_scores", 128},       // fp32 sigmoid [8, 4]; the fp32 cast is itself
                                        {"router_topk_index", 128},   // int64 [8, 2]
                                        {"router_topk_weight", 96},   // fp32 [8, 2] and [8, 1]
                                        {"router_aux_scores", 160},   // fp32 [8, 4] and the row sums [8]
                                        {"router_z_loss", 160},       // fp32 logits [8, 4] and logsumexp [8]
                                        {"moe_permute_map", 288},     // int64 [16]; fp32 and bool [4, 8]
                                        {"moe_permuted_probs", 64}}));  // fp32 [16]
  // Everything else is the measured layer's, piece for piece.
  const ByteCategories actbench = layer_bytes_by_category(kRouting, spec, LayerPolicy{});
  EXPECT_EQ(the_rest(megatron), the_rest(actbench));
  EXPECT_EQ(routing_part(actbench), (ByteCategories{{"router_scores", 64},
                                                    {"router_topk_index", 64},
                                                    {"router_topk_weight", 32},
                                                    {"moe_dispatch_plan", 4 * (4 + 2 * 16)},
                                                    {"moe_permuted_probs", 32}}));
  // A 16-bit router: gather keeps the scores' 16-bit cast too, the weights and logits are 16-bit.
  const LayerSpec half = routing_spec(MoeScore::sigmoid, true, 2, {.aux_loss = true, .z_loss = true});
  const ByteCategories h = layer_bytes_by_category(kRouting, half, LayerPolicy{}, {}, Bookkeeping::megatron);
  EXPECT_EQ(bytes_of(h, "router_scores"), 128 + 64);
  EXPECT_EQ(bytes_of(h, "router_topk_weight"), 48);
  EXPECT_EQ(bytes_of(h, "router_z_loss"), 80);
  EXPECT_EQ(bytes_of(h, "router_aux_scores"), 160);  // fp32 whatever the router's type
  EXPECT_EQ(bytes_of(h, "moe_permute_map"), 128 + 3 * 32);
  EXPECT_EQ(bytes_of(h, "moe_permuted_probs"), 32);
}

TEST(MegatronRoutingTheory, SinkhornKeepsTheActivatedLogitsAndTheRoutingMask) {
  // Sinkhorn chooses without gradient: no top-k index, no group mask, no aux loss. k = 2:
  // the fp32 softmax over all 4 experts [8, 4], times the routing map (bool [8, 4]).
  LayerSpec spec = routing_spec(MoeScore::softmax, false, 2, {.sinkhorn = true});
  const ByteCategories two = layer_bytes_by_category(kRouting, spec, LayerPolicy{}, {}, Bookkeeping::megatron);
  EXPECT_EQ(routing_part(two), (ByteCategories{{"router_scores", 128},
                                               {"router_routing_mask", 32},
                                               {"moe_permute_map", 8 * 16 + 3 * 32},
                                               {"moe_permuted_probs", 32}}));
  // k = 1: the sigmoid of the logits in the router's type (16-bit here: [8, 4] x 2 bytes).
  spec.moe.top_k = 1;
  const ByteCategories one = layer_bytes_by_category(kRouting, spec, LayerPolicy{}, {}, Bookkeeping::megatron);
  EXPECT_EQ(bytes_of(one, "router_scores"), 64);
  EXPECT_EQ(bytes_of(one, "router_routing_mask"), 32);
  EXPECT_EQ(bytes_of(one, "router_topk_index"), 0);
}

TEST(MegatronRoutingTheory, AnUnfusedWeightedActivationKeepsItsOutput) {
  // act(fc1)·weight unfused: the product keeps act(fc1), N_e = 16 rows of 8 (SwiGLU: silu of
  // the gate and the GLU product, 2 x 8 wide), 16-bit; moe_act frees it.
  const LayerSpec spec = routing_spec(MoeScore::softmax, false, 0, {.unfused_weighted_activation = true});
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kRouting, spec, LayerPolicy{}, {}, Bookkeeping::megatron), "moe_act_output"),
            2 * 2 * 16 * 8);
  const LayerPolicy moe_act{Recompute::selective, false, Attention::unfused, {.moe_act = true}};
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kRouting, spec, moe_act, {}, Bookkeeping::megatron), "moe_act_output"), 0);
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kRouting, spec, LayerPolicy{}), "moe_act_output"), 0);
}

TEST(MegatronRoutingTheory, TheSharedExpertGateKeepsTheSharedOutputAndItsScore) {
  // 8 rows of width 16, shared experts 8 wide: the product keeps their [8, 16] output and the
  // [8, 1] sigmoid score, 16-bit; the shared_experts module frees both with the rest.
  LayerSpec spec = routing_spec(MoeScore::softmax, false, 0, {.shared_expert_gate = true});
  spec.moe.shared_ffn_hidden = 8;
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kRouting, spec, LayerPolicy{}, {}, Bookkeeping::megatron), "shared_gate"),
            2 * 8 * (16 + 1));
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kRouting, spec, LayerPolicy{}), "shared_gate"), 0);  // the measured layer's
  const LayerPolicy shared{Recompute::selective, false, Attention::unfused, {.shared_experts = true}};
  EXPECT_EQ(bytes_of(layer_bytes_by_category(kRouting, spec, shared, {}, Bookkeeping::megatron), "shared_gate"), 0);
}

TEST(MegatronRoutingTheory, SoftmaxGroupsCapacityAndTheFusedPermutation) {
  // Softmax over the chosen logits (4·T·k fp32), groups without a bias keep their mask, no
  // losses; Transformer Engine's row map [8, 9] int32, and under EP 2 (2 experts a rank) the
  // chunk sort's two int32 maps of the 16 received rows.
  LayerSpec spec = routing_spec(MoeScore::softmax, false, 2, {.permute_fusion = true});
  Dims d = kRouting;
  d.ep = 2;
  const ByteCategories fused = layer_bytes_by_category(d, spec, LayerPolicy{}, {}, Bookkeeping::megatron);
  EXPECT_EQ(routing_part(fused), (ByteCategories{{"router_scores", 64},
                                                 {"router_topk_index", 128},
                                                 {"router_group_mask", 32},
                                                 {"moe_permute_map", 288 + 128},
                                                 {"moe_permuted_probs", 32}}));
  d.ep = 4;  // one expert a rank: nothing to sort
  EXPECT_EQ(bytes_of(layer_bytes_by_category(d, spec, LayerPolicy{}, {}, Bookkeeping::megatron), "moe_permute_map"), 288);
  // --moe-router-pre-softmax: the fp32 softmax over all E; a capacity factor keeps the drop mask.
  spec.moe.pre_softmax = true;
  spec.moe.capacity_factor = 1;
  const ByteCategories pre = layer_bytes_by_category(kRouting, spec, LayerPolicy{}, {}, Bookkeeping::megatron);
  EXPECT_EQ(bytes_of(pre, "router_scores"), 128);
  EXPECT_EQ(bytes_of(pre, "router_capacity_mask"), 32);
  // The moe module frees all of it; under full recompute there is only the layer's input.
  const LayerPolicy moe_module{Recompute::selective, false, Attention::unfused, {.moe = true}};
  EXPECT_EQ(routing_part(layer_bytes_by_category(kRouting, spec, moe_module, {}, Bookkeeping::megatron)),
            ByteCategories{});
}
