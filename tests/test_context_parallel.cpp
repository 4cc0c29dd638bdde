// Context parallelism in one process: the layer's bytes per rank (meta, emulated TP and CP
// groups) equal theory's closed forms for every configuration, CP type and attention, both
// families; per-rank bytes at (s, C) equal those at (s/C, 1) for every tensor the sequence
// split divides (the attention probabilities are the ones it does not: s/C rows of s keys);
// an MoE layer's bytes at each rank's own tokens; and the shapes CP cannot split are refused in
// one line.
#include <gtest/gtest.h>

#include <map>

#include "kernels/backend_comm.hpp"
#include "layer_harness.hpp"
#include "layers/theory_dims.hpp"
#include "theory/layer_pieces.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

LayerDims dims_of(const std::string& arch, int64_t s) {
  LayerDims d{s, 2, 64, 16};  // d = 4; heads divisible by t x C up to 16
  if (arch == "llama") d.spec = theory::llama_layer_spec(16, 96);
  d.spec.attention_dropout = d.spec.hidden_dropout = arch == "gpt" ? 0.1 : 0.0;
  return d;
}

struct MetaRun {
  ExperimentResult result;
  std::map<std::string, int64_t> by_category;
};

MetaRun run_meta(const LayerDims& d, int t, int C, LayerPolicy p) {
  auto be = make_meta_backend();
  auto tp = t == 1 ? make_backend_local_communicator(*be) : make_backend_emulated_communicator(*be, t);
  auto cp = make_backend_emulated_communicator(*be, C);
  ExperimentSpec spec;
  spec.dims = d;
  spec.policy = p;
  spec.warmup = 0;
  spec.iters = 1;
  spec.cp_group = C > 1 ? cp.get() : nullptr;
  MetaRun run{run_experiment(*be, *tp, spec), {}};
  for (const auto& [name, bytes] : run.result.act_by_category) run.by_category[name] = bytes;
  return run;
}

bool valid(const LayerDims& d, int t, int C, LayerPolicy p) {
  try {
    validate_layer(d, t, p, C);
    return true;
  } catch (const InvalidArgument&) {
    return false;
  }
}

const CpCommType kTypes[] = {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a};

}  // namespace

TEST(ContextParallelMemory, MetaBytesEqualTheClosedFormsPerRank) {
  int checked = 0;
  for (const std::string arch : {"gpt", "llama"})
    for (int C : {1, 2, 4, 8})
      for (int t : {1, 2})
        for (const std::string& config : config_names())
          for (Attention attention : {Attention::unfused, Attention::fused})
            for (CpCommType type : kTypes) {
              const LayerDims d = dims_of(arch, 64);
              LayerPolicy p = parse_config(config);
              p.attention = attention;
              p.cp_comm = type;
              if (!valid(d, t, C, p)) continue;
              const MetaRun run = run_meta(d, t, C, p);
              ASSERT_EQ(run.result.status, "ok");
              theory::Dims td = theory_dims(d, t);
              td.cp = C;
              const std::string what = arch + " C=" + std::to_string(C) + " t=" + std::to_string(t) + " " + config +
                                       " " + attention_name(attention) + " " + cp_comm_type_name(type);
              EXPECT_EQ(static_cast<double>(run.result.act_bytes), theory::layer_bytes(td, d.spec, p)) << what;
              EXPECT_EQ(static_cast<double>(run.result.act_extra_bytes), theory::layer_extra_bytes(td, d.spec, p))
                  << what;
              EXPECT_EQ(run.result.fwd_retained_bytes, run.result.act_bytes + run.result.act_extra_bytes) << what;
              if (C > 1) {
                EXPECT_GT(run.result.comm_bytes_cp, 0.0) << what;
              }
              ++checked;
            }
  EXPECT_GT(checked, 300);
}

// An MoE layer under CP (meta, emulated TP and CP groups): each rank routes its s·b/(tC) tokens,
// balanced (dropless, and capped by a capacity), and keeps the closed forms' bytes at that T;
// expert parallelism with CP is refused in one line.
TEST(ContextParallelMemory, MoeMetaBytesEqualTheClosedFormsPerRank) {
  int checked = 0;
  for (double capacity : {0.0, 0.5})
    for (int C : {2, 4})
      for (int t : {1, 2})
        for (const std::string& config : config_names()) {
          LayerDims d = dims_of("llama", 64);
          d.spec.moe.num_experts = 8;
          d.spec.moe.top_k = 2;
          d.spec.moe.ffn_hidden = 24;
          d.spec.moe.shared_ffn_hidden = 16;
          d.spec.moe.capacity_factor = capacity;
          d.spec.hidden_dropout = 0.1;
          LayerPolicy p = parse_config(config);
          p.attention = Attention::fused;
          p.cp_comm = CpCommType::p2p;
          if (p.recompute == Recompute::selective) p.modules.moe_act = p.modules.shared_experts = true;
          if (!valid(d, t, C, p)) continue;  // t = 2 without SP
          const MetaRun run = run_meta(d, t, C, p);
          const std::string what = "moe C=" + std::to_string(C) + " t=" + std::to_string(t) + " " + config +
                                   " capacity " + std::to_string(capacity);
          ASSERT_EQ(run.result.status, "ok") << what << ": " << run.result.message;
          theory::Dims td = theory_dims(d, t);
          td.cp = C;
          // 64·2/(tC) tokens, two choices each, over 8 experts; the capacity ceil(pairs/8 · 0.5).
          int64_t routed = 0;
          for (int64_t rows : run.result.moe.tokens_per_expert) routed += rows;
          const int64_t pairs = 64 * 2 / (t * C) * 2;
          EXPECT_EQ(routed, capacity > 0 ? 8 * ((pairs / 8 + 1) / 2) : pairs) << what;
          EXPECT_EQ(static_cast<double>(run.result.act_bytes), theory::layer_bytes(td, d.spec, p)) << what;
          EXPECT_EQ(static_cast<double>(run.result.act_extra_bytes), theory::layer_extra_bytes(td, d.spec, p)) << what;
          ++checked;
        }
  EXPECT_EQ(checked, 36);
  LayerDims d = dims_of("llama", 64);
  d.spec.moe.num_experts = 8;
  d.spec.moe.top_k = 2;
  d.spec.add_bias_linear = false;
  LayerPolicy p = parse_config("baseline");
  p.cp_comm = CpCommType::all_gather;
  EXPECT_NO_THROW(validate_layer(d, 1, p, 2, 2));  // EP over the CP group
  try {
    validate_layer(d, 1, p, 4, 2);  // EP over half of it
    FAIL() << "expert parallelism over part of the CP group was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("a multiple of tp x cp = 4"), std::string::npos) << e.what();
  }
}

// A rank at (s, C) keeps what a rank at (s/C, 1) keeps, tensor by tensor, except the attention
// probabilities (unfused): s/C query rows of all s keys, C times those of (s/C, 1).
TEST(ContextParallelMemory, PerRankBytesEqualThoseOfTheShorterSequence) {
  for (const std::string arch : {"gpt", "llama"})
    for (int C : {2, 4})
      for (CpCommType type : kTypes)
        for (Attention attention : {Attention::unfused, Attention::fused}) {
          LayerPolicy p = parse_config("selective+sp");
          p.recompute = Recompute::none;  // keep the probabilities too
          p.attention = attention;
          p.cp_comm = type;
          const LayerDims whole = dims_of(arch, 64), shorter = dims_of(arch, 64 / C);
          if (!valid(whole, 2, C, p)) continue;
          const MetaRun at_c = run_meta(whole, 2, C, p), at_1 = run_meta(shorter, 2, 1, p);
          const std::string what = arch + " C=" + std::to_string(C) + " " + cp_comm_type_name(type) + " " +
                                   attention_name(attention);
          ASSERT_EQ(at_c.by_category.size(), at_1.by_category.size()) << what;
          for (const auto& [name, bytes] : at_1.by_category) {
            const bool probabilities =
                name == "softmax_out" || name == "attn_dropout_mask" || name == "attn_dropout_out";
            EXPECT_EQ(at_c.by_category.at(name), probabilities ? C * bytes : bytes) << what << " " << name;
          }
        }
}

TEST(ContextParallelShapes, WhatCannotBeSplitIsRefusedInOneLine) {
  const LayerDims d = dims_of("gpt", 64);
  LayerPolicy p = parse_config("baseline");
  p.cp_comm = CpCommType::p2p;
  EXPECT_THROW(validate_layer(d, 1, p, 2), InvalidArgument);  // p2p needs fused
  p.attention = Attention::fused;
  EXPECT_NO_THROW(validate_layer(d, 1, p, 2));
  EXPECT_THROW(validate_layer(dims_of("gpt", 60), 1, p, 4), InvalidArgument);  // 60 is not 8 chunks
  p.cp_comm = CpCommType::a2a;
  EXPECT_THROW(validate_layer(d, 2, p, 16), InvalidArgument);  // 16 heads over 2 x 16
  p = parse_config("sp");
  p.cp_comm = CpCommType::all_gather;
  EXPECT_THROW(validate_layer(dims_of("gpt", 24), 8, p, 2), InvalidArgument);  // 24/2 rows over tp 8
  try {
    validate_layer(dims_of("gpt", 60), 1, p, 4);
    FAIL() << "no refusal";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("2 x cp"), std::string::npos) << e.what();
  }
}
