// The composed layer with an MoE block in place of its MLP (layers/moe_block.cpp):
// - the bytes it keeps equal theory/layer_pieces.hpp's MoE rows to the byte, category by
//   category, given the routed rows the cpu measured, for every option x configuration x
//   recompute module set (the MoE modules among them); meta, given the cpu's histogram, keeps
//   the same bytes; and what forward keeps is exactly what the allocator retained;
// - every recompute module changes no computed value;
// - the routing statistics and the refusals.
// The values themselves are checked against the float64 NumPy layer (tests/test_composed_dumps.py).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "layer_harness.hpp"
#include "layers/theory_dims.hpp"
#include "runners/experiment.hpp"
#include "runtime/error.hpp"
#include "theory/layer_pieces.hpp"

using namespace actbench;
using namespace actbench::testing;
using theory::Activation;
using theory::LayerSpec;
using theory::MoeScore;

namespace {

struct MoeCase {
  std::string name;
  LayerSpec spec;
};

LayerSpec moe_spec(Activation act, double experts, double top_k) {
  LayerSpec s = theory::llama_layer_spec(2, 24);
  s.activation = act;
  s.moe.num_experts = experts;
  s.moe.top_k = top_k;
  s.moe.ffn_hidden = 12;
  return s;
}

// Each MoE option on and off at least once.
std::vector<MoeCase> moe_cases() {
  std::vector<MoeCase> out;
  out.push_back({"softmax top2 swiglu", moe_spec(Activation::swiglu, 4, 2)});
  LayerSpec s = moe_spec(Activation::gelu, 8, 3);
  s.moe.shared_ffn_hidden = 20;
  s.moe.pre_softmax = true;
  s.attention_dropout = s.hidden_dropout = 0.1;
  out.push_back({"pre-softmax top3 gelu shared dropout", s});
  s = moe_spec(Activation::swiglu, 8, 2);
  s.moe.score = MoeScore::sigmoid;
  s.moe.scaling = 2.5;
  s.moe.num_groups = 4;
  s.moe.group_top_k = 2;
  s.moe.expert_bias = true;
  s.moe.shared_ffn_hidden = 16;
  out.push_back({"sigmoid groups bias shared (DeepSeek-V3)", s});
  s = moe_spec(Activation::squared_relu, 4, 2);
  s.moe.capacity_factor = 0.75;
  out.push_back({"capacity 0.75 squared relu", s});
  s = moe_spec(Activation::swiglu, 4, 1);
  s.moe.capacity_factor = 1.5;
  s.moe.shared_ffn_hidden = 8;
  out.push_back({"capacity 1.5 top1 shared", s});
  return out;
}

// Every configuration, and selective with each subset of the modules an MoE layer reads; under
// TP only those with SP (Megatron-Core's MoE needs it).
std::vector<LayerPolicy> policies(int t = 1) {
  std::vector<LayerPolicy> out;
  for (const std::string& name : config_names())
    if (t == 1 || parse_config(name).sequence_parallel) out.push_back(parse_config(name));
  for (int bits = 1; bits < 32; ++bits) {
    RecomputeModules m{(bits & 1) != 0, false, (bits & 2) != 0};
    m.moe_act = (bits & 4) != 0;
    m.moe = (bits & 8) != 0;
    m.shared_experts = (bits & 16) != 0;
    out.push_back({Recompute::selective, t > 1, Attention::unfused, m});
  }
  return out;
}

LayerDims moe_dims(const LayerSpec& spec) {
  LayerDims d{8, 3, 32, 4};
  d.spec = spec;
  return d;
}

// One forward and backward of the spec's layer in configuration `config`, no warmup.
ExperimentSpec one_step(const LayerSpec& spec, const char* config) {
  ExperimentSpec run;
  run.dims = moe_dims(spec);
  run.policy = parse_config(config);
  run.warmup = 0;
  run.iters = 1;
  return run;
}

theory::ByteCategories as_theory(const std::vector<std::pair<std::string, int64_t>>& measured, bool extras) {
  theory::ByteCategories out;
  for (const auto& [name, bytes] : measured)
    if (name.ends_with("_stats") == extras) out.push_back({name, static_cast<double>(bytes)});
  return out;
}

// One iteration on rank 0 of t (emulated when t > 1).
ExperimentResult measure(Backend& be, const LayerDims& d, LayerPolicy p, DType dtype,
                         std::vector<int64_t> histogram = {}, int t = 1) {
  auto comm = t == 1 ? make_local_communicator() : make_emulated_communicator(t);
  ExperimentSpec spec;
  spec.dims = d;
  spec.policy = p;
  spec.dtype = dtype;
  spec.warmup = 0;
  spec.iters = 1;
  spec.moe_tokens_per_expert = std::move(histogram);
  return run_experiment(be, *comm, spec);
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

TEST(MoeLayer, KeptBytesEqualThePiecesGivenTheMeasuredRouting) {
  auto cpu = make_cpu_backend();
  auto meta = make_meta_backend();
  int runs = 0;
  for (int t : {1, 2})
  for (const MoeCase& c : moe_cases())
    for (LayerPolicy p : policies(t))
      for (Attention att : {Attention::unfused, Attention::fused})
        for (DType dtype : {DType::bf16, DType::fp32}) {
          p.attention = att;
          const LayerDims d = moe_dims(c.spec);
          const std::string where = c.name + " | " + config_name(p) + " " + recompute_modules_name(p.modules) +
                                    " " + attention_name(att) + " " + dtype_name(dtype) + " t=" + std::to_string(t);
          const ExperimentResult got = measure(*cpu, d, p, dtype, {}, t);
          ASSERT_EQ(got.status, "ok") << where << ": " << got.message;
          ASSERT_TRUE(got.moe.measured) << where;
          theory::Dims td = theory_dims(d, t);
          td.moe_routed_rows = static_cast<double>(sum(got.moe.tokens_per_expert));
          ASSERT_GT(td.moe_routed_rows, 0) << where;
          const theory::Precision prec{static_cast<double>(dtype_size(dtype)), 1.0};
          EXPECT_EQ(as_theory(got.act_by_category, false), theory::layer_bytes_by_category(td, d.spec, p, prec))
              << where;
          EXPECT_EQ(as_theory(got.act_by_category, true), theory::layer_extra_bytes_by_category(td, d.spec, p))
              << where;
          EXPECT_EQ(got.fwd_retained_bytes, got.act_bytes + got.act_extra_bytes) << where;
          // meta, told the cpu's histogram, keeps the same bytes in every category.
          const ExperimentResult shape = measure(*meta, d, p, dtype, got.moe.tokens_per_expert, t);
          ASSERT_EQ(shape.status, "ok") << where << ": " << shape.message;
          EXPECT_EQ(shape.act_by_category, got.act_by_category) << where;
          EXPECT_EQ(shape.fwd_retained_bytes, got.fwd_retained_bytes) << where;
          EXPECT_EQ(shape.moe.tokens_per_expert, got.moe.tokens_per_expert) << where;
          EXPECT_FALSE(shape.moe.measured) << where;
          ++runs;
        }
  EXPECT_EQ(runs, 5 * (6 + 31) * 2 * 2 + 5 * (3 + 31) * 2 * 2);
}

TEST(MoeLayer, MetaWithoutAHistogramRoutesBalancedAsTheFormulaAssumes) {
  auto meta = make_meta_backend();
  for (const MoeCase& c : moe_cases()) {
    const LayerDims d = moe_dims(c.spec);
    for (const std::string& config : {"baseline", "selective"}) {
      const LayerPolicy p = parse_config(config);
      const ExperimentResult r = measure(*meta, d, p, DType::bf16);
      ASSERT_EQ(r.status, "ok") << c.name << ": " << r.message;
      // T = 24 tokens; balanced: every expert T·k/E rows (capped by the capacity).
      EXPECT_EQ(static_cast<double>(sum(r.moe.tokens_per_expert)), theory::moe_routed_rows(theory_dims(d, 1), d.spec))
          << c.name;
      EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(theory_dims(d, 1), d.spec, p)) << c.name;
    }
  }
}

TEST(MoeLayer, RecomputeModulesChangeNoComputedValue) {
  auto cpu = make_cpu_backend();
  auto comm = make_local_communicator();
  for (const MoeCase& c : moe_cases()) {
    ExperimentSpec spec;
    spec.dims = moe_dims(c.spec);
    spec.dtype = DType::fp32;
    spec.policy = parse_config("baseline");
    const std::vector<CanonicalTensor> kept_all = run_layer_canonical(*cpu, *comm, spec);
    for (LayerPolicy p : policies()) {
      spec.policy = p;
      std::vector<CanonicalTensor> got = run_layer_canonical(*cpu, *comm, spec);
      // The routing decision is dumped only where forward kept it; every other tensor is the same.
      std::erase_if(got, [](const CanonicalTensor& t) { return t.name.starts_with("moe.topk"); });
      std::vector<CanonicalTensor> ref = kept_all;
      std::erase_if(ref, [](const CanonicalTensor& t) { return t.name.starts_with("moe.topk"); });
      expect_same_tensors(got, ref, 0.0, 0.0, c.name + " | " + config_name(p) + " " + recompute_modules_name(p.modules));
    }
  }
}

TEST(MoeLayer, EmulatedExpertParallelRankKeepsTheBalancedPieces) {
  // One process as rank 0 of ep (layer_run --emulate-ep): every rank routes as it does, so with
  // balanced routing its experts receive T·k rows, and it keeps the pieces at td.ep = ep.
  auto meta = make_meta_backend();
  LayerSpec spec = moe_cases()[2].spec;  // 8 experts, shared
  spec.attention_dropout = spec.hidden_dropout = 0;
  for (int ep : {2, 4, 8}) {
    auto tp = make_local_communicator();
    auto group = make_emulated_communicator(ep);
    ExperimentSpec run = one_step(spec, "selective");
    run.ep_group = run.dp_group = group.get();
    const ExperimentResult r = run_experiment(*meta, *tp, run);
    ASSERT_EQ(r.status, "ok") << r.message;
    theory::Dims td = theory_dims(run.dims, 1);
    td.ep = ep;
    EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec, run.policy)) << ep;
    EXPECT_EQ(r.moe.expert_rows, 48) << ep;  // T·k = 24·2, from the ep ranks together
    EXPECT_GT(r.comm_bytes_ep, 0.0) << ep;
  }
}

TEST(MoeLayer, EmulatedExpertParallelOverReplicasRankKeepsTheBalancedPieces) {
  // Rank 0 of ep ranks, ep/2 replicas of an emulated TP group of 2 (layer_run --emulate-ep
  // --tp 2): it routes its s/2 rows (SP), and with balanced routing its experts receive as many,
  // from all ep ranks together; it keeps the pieces at t = 2 and td.ep = ep.
  auto meta = make_meta_backend();
  LayerSpec spec = moe_cases()[2].spec;  // 8 experts, shared
  spec.attention_dropout = spec.hidden_dropout = 0;
  spec.kv_heads = 4;
  for (int ep : {4, 8}) {
    auto tp = make_emulated_communicator(2);
    auto group = make_emulated_communicator(ep), replicas = make_emulated_communicator(ep / 2);
    ExperimentSpec run = one_step(spec, "selective+sp");
    run.ep_group = group.get();
    run.dp_group = replicas.get();
    const ExperimentResult r = run_experiment(*meta, *tp, run);
    ASSERT_EQ(r.status, "ok") << r.message;
    theory::Dims td = theory_dims(run.dims, 2);
    td.ep = ep;
    EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec, run.policy)) << ep;
    EXPECT_EQ(r.moe.expert_rows, 8 / 2 * 3 * 2) << ep;  // s/t rows x b, 2 choices each
    EXPECT_GT(r.comm_bytes_ep, 0.0) << ep;
    // Each expert split over the TP group too (--expert-tensor-parallel-size 2, the EP group
    // ep replicas of this TP rank): its experts run both TP ranks' rows, half as wide.
    run.ep_group = run.dp_group = group.get();
    run.expert_tensor_parallel = true;
    const ExperimentResult split = run_experiment(*meta, *tp, run);
    ASSERT_EQ(split.status, "ok") << split.message;
    td.etp = 2;
    EXPECT_EQ(static_cast<double>(split.act_bytes), theory::layer_bytes(td, spec, run.policy)) << ep;
    EXPECT_EQ(split.moe.expert_rows, 2 * r.moe.expert_rows) << ep;
  }
  // Under context parallelism 2 too (--emulate-ep --tp 2 --cp 2 --ep 8): two replicas of the
  // 2 x 2 grid, each rank routing its chunks' s/(t·C) rows; the pieces at t, C and ep with the
  // rows its experts received (balanced routing leaves rank 0 the remainder).
  auto tp = make_emulated_communicator(2), cp = make_emulated_communicator(2);
  auto group = make_emulated_communicator(8), replicas = make_emulated_communicator(2);
  spec.attention_dropout = 0;
  ExperimentSpec run = one_step(spec, "selective+sp");
  run.policy.attention = Attention::fused;
  run.cp_group = cp.get();
  run.ep_group = group.get();
  run.dp_group = replicas.get();
  const ExperimentResult r = run_experiment(*meta, *tp, run);
  ASSERT_EQ(r.status, "ok") << r.message;
  theory::Dims td = theory_dims(run.dims, 2);
  td.cp = 2;
  td.ep = 8;
  td.moe_expert_rows = static_cast<double>(r.moe.expert_rows);
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec, run.policy));
  EXPECT_EQ(r.moe.expert_rows, 8 * r.moe.tokens_per_expert[0]);  // expert 0's rows from each of the 8 ranks
}

TEST(MoeLayer, EmulatedExpertTensorParallelRankGathersEveryRowAtASliceOfTheWidth) {
  // One process as rank 0 of t (--emulate-tp) with each expert split over the TP group: its
  // experts run every rank's routed rows (t times its own) at F_e/t wide. Against the same rank
  // with whole experts: fc1's input and the rows' routing weights t times as many bytes, fc1's
  // output and fc2's input the same (t times the rows, 1/t the width); and the total equals
  // the pieces at td.etp = t.
  auto meta = make_meta_backend();
  LayerSpec spec = moe_cases()[2].spec;  // 8 experts, shared
  spec.attention_dropout = spec.hidden_dropout = 0;
  spec.kv_heads = 4;  // whole key/value heads on 4 ranks
  for (int t : {2, 4}) {
    auto tp = make_emulated_communicator(t);
    ExperimentSpec run = one_step(spec, "sp");
    const ExperimentResult whole = run_experiment(*meta, *tp, run);
    run.expert_tensor_parallel = true;
    const ExperimentResult split = run_experiment(*meta, *tp, run);
    ASSERT_EQ(split.status, "ok") << split.message;
    const double own = 8.0 / t * 3 * 2;  // s/t rows x b, 2 choices each
    EXPECT_EQ(whole.moe.expert_rows, own) << t;
    EXPECT_EQ(split.moe.expert_rows, t * own) << t;
    auto bytes = [](const ExperimentResult& r, const std::string& name) {
      for (const auto& [n, b] : r.act_by_category)
        if (n == name) return b;
      return int64_t{-1};
    };
    for (const char* gathered : {"moe_permuted", "moe_permuted_probs"})
      EXPECT_EQ(bytes(split, gathered), t * bytes(whole, gathered)) << t << " " << gathered;
    for (const char* same : {"moe_act_input", "moe_fc2_input", "router_scores"})
      EXPECT_EQ(bytes(split, same), bytes(whole, same)) << t << " " << same;
    theory::Dims td = theory_dims(run.dims, t);
    td.etp = t;
    EXPECT_EQ(static_cast<double>(split.act_bytes), theory::layer_bytes(td, spec, run.policy)) << t;
  }
}

TEST(MoeLayer, ExpertTensorParallelRefusals) {
  LayerDims d = moe_dims(moe_cases()[0].spec);  // experts 12 wide
  d.spec.kv_heads = 4;
  auto refused = [&](int t, int ep, int etp, const std::string& words) {
    try {
      validate_layer(d, t, parse_config("sp"), 1, ep, etp);
      ADD_FAILURE() << "accepted t=" << t << " ep=" << ep << " etp=" << etp;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(4, 1, 2, "must be --tp (4) or 1");
  refused(2, 3, 1, "must be a multiple of --tp 2");
  EXPECT_NO_THROW(validate_layer(d, 2, parse_config("sp"), 1, 2, 2));  // EP over two replicas, each expert over TP
  LayerPolicy ring = parse_config("sp");
  ring.attention = Attention::fused;
  EXPECT_NO_THROW(validate_layer(d, 2, ring, 2, 4, 1));  // EP over the t x C grid
  EXPECT_NO_THROW(validate_layer(d, 2, ring, 2, 2, 2));  // each expert over TP, EP over the CP peers
  try {  // each expert over TP, EP over half of the CP peers
    validate_layer(d, 2, ring, 4, 2, 2);
    ADD_FAILURE() << "accepted ep 2 with etp 2 over half of cp 4";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("it must be a multiple of cp (4)"), std::string::npos) << e.what();
  }
  try {  // EP over part of the t x C grid
    ring.sequence_parallel = false;
    validate_layer(d, 1, ring, 4, 2, 1);
    ADD_FAILURE() << "accepted ep 2 over half of cp 4";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a multiple of tp x cp = 4"), std::string::npos) << e.what();
  }
  d.spec.moe.ffn_hidden = 10;
  refused(4, 1, 4, "moe-ffn-hidden-size 10 is not divisible by --expert-tensor-parallel-size 4");
  EXPECT_NO_THROW(validate_layer(d, 2, parse_config("sp"), 1, 1, 2));
}

TEST(MoeLayer, ModulesFreeWhatMegatronCoresFree) {
  auto meta = make_meta_backend();
  LayerSpec spec = moe_cases()[2].spec;  // shared experts
  const LayerDims d = moe_dims(spec);
  auto names = [&](RecomputeModules m) {
    std::vector<std::string> out;
    const ExperimentResult r = measure(*meta, d, {Recompute::selective, false, Attention::fused, m}, DType::bf16);
    for (const auto& [name, bytes] : r.act_by_category) out.push_back(name);
    return out;
  };
  RecomputeModules core;
  const std::vector<std::string> all = names(core);
  for (const char* n : {"moe_input", "router_scores", "router_topk_index", "router_topk_weight", "moe_dispatch_plan",
                        "moe_permuted", "moe_act_input", "moe_permuted_probs", "moe_fc2_input", "shared_act_input",
                        "shared_fc2_input"})
    EXPECT_NE(std::find(all.begin(), all.end(), n), all.end()) << n;
  auto without = [&](std::vector<std::string> gone) {
    std::vector<std::string> out;
    for (const std::string& n : all)
      if (std::find(gone.begin(), gone.end(), n) == gone.end()) out.push_back(n);
    return out;
  };
  RecomputeModules m = core;
  m.moe_act = true;
  EXPECT_EQ(names(m), without({"moe_fc2_input"}));
  m = core;
  m.shared_experts = true;
  EXPECT_EQ(names(m), without({"shared_act_input", "shared_fc2_input"}));
  m = core;
  m.moe = true;
  EXPECT_EQ(names(m), without({"router_scores", "router_topk_index", "router_topk_weight", "moe_dispatch_plan",
                               "moe_permuted", "moe_act_input", "moe_permuted_probs", "moe_fc2_input",
                               "shared_act_input", "shared_fc2_input"}));
  m = core;
  m.mlp = true;  // a dense module: nothing on an MoE layer
  EXPECT_EQ(names(m), all);
  m = core;
  m.layernorm = true;
  EXPECT_EQ(names(m), without({"qkv_input", "moe_input", "ln1_stats", "ln2_stats"}));
}

TEST(MoeLayer, RoutingStatisticsCountTheDroppedPairs) {
  auto cpu = make_cpu_backend();
  LayerSpec spec = moe_cases()[3].spec;  // capacity 0.75: ceil(24·2/4 · 0.75) = 9 rows per expert
  const ExperimentResult r = measure(*cpu, moe_dims(spec), parse_config("baseline"), DType::fp32);
  ASSERT_EQ(r.status, "ok") << r.message;
  ASSERT_EQ(r.moe.tokens_per_expert.size(), 4u);
  for (int64_t rows : r.moe.tokens_per_expert) EXPECT_LE(rows, 9);
  EXPECT_EQ(r.moe.dropped, 48 - sum(r.moe.tokens_per_expert));
  EXPECT_GE(r.moe.dropped, 48 - 36);
  EXPECT_GT(r.moe.aux_loss, 0.0);
  const ExperimentResult dropless = measure(*cpu, moe_dims(moe_cases()[0].spec), parse_config("baseline"), DType::fp32);
  EXPECT_EQ(dropless.moe.dropped, 0);
  EXPECT_EQ(sum(dropless.moe.tokens_per_expert), 48);
}

TEST(MoeLayer, RefusesWhatItCannotBuildInOneLine) {
  auto meta = make_meta_backend();
  LayerDims d = moe_dims(moe_cases()[0].spec);
  auto message = [&](const LayerDims& dims, int t, std::vector<int64_t> histogram = {}) {
    auto comm = t == 1 ? make_local_communicator() : make_emulated_communicator(t);
    ExperimentSpec spec;
    spec.dims = dims;
    spec.warmup = 0;
    spec.iters = 1;
    spec.moe_tokens_per_expert = std::move(histogram);
    try {
      (void)run_experiment(*meta, *comm, spec);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(d, 2).find("needs sequence parallelism"), std::string::npos);
  LayerDims odd_shared = moe_dims(moe_cases()[4].spec);  // shared width 8
  odd_shared.spec.moe.shared_ffn_hidden = 9;
  try {
    validate_layer(odd_shared, 2, parse_config("sp"));
    ADD_FAILURE() << "a shared width of 9 split over 2 ranks was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by tp 2"), std::string::npos) << e.what();
  }
  LayerDims biased = d;
  biased.spec.add_bias_linear = true;
  EXPECT_NE(message(biased, 1).find("--disable-bias-linear"), std::string::npos);
  EXPECT_NE(message(d, 1, {12, 12, 12}).find("3 counts given for 4 experts"), std::string::npos);
  EXPECT_NE(message(d, 1, {12, 12, 12, 11}).find("sum to 47"), std::string::npos);
  EXPECT_EQ(message(d, 1, {48, 0, 0, 0}), "");  // all on one expert is a routing a run can make
  LayerDims capped = moe_dims(moe_cases()[3].spec);
  EXPECT_NE(message(capped, 1, {10, 9, 9, 9}).find("outside [0, the capacity 9]"), std::string::npos);
  // Under expert parallelism both dropouts are built (each rank's masks at its batch slice;
  // tests/test_mpi_layer.cpp MpiExpertParallelDropout).
  LayerDims dropped = d;
  dropped.spec.attention_dropout = dropped.spec.hidden_dropout = 0.1;
  EXPECT_NO_THROW(validate_layer(dropped, 1, parse_config("baseline"), 1, 2));
}
