// The layer under real MPI ranks (run by ctest as mpirun -np 2 and -np 4): tensor- and
// sequence-parallel collectives over Open MPI, activation bytes per rank against Table 2,
// and every tensor against the single-rank layer.
#include <gtest/gtest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>

#include "kernels/backend_comm.hpp"
#include "layer_harness.hpp"
#include "layers/theory_dims.hpp"
#include "theory/layer_pieces.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

Communicator* g_comm = nullptr;
const LayerDims kDims = {24, 2, 48, 4};  // s and a divisible by 2 and 4; h/a = 12

// A configuration as a test name: "selective+sp" -> "selective_sp".
std::string config_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name)
    if (c == '+') c = '_';
  return name;
}

}  // namespace

class MpiLayer : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiLayer, ActivationBytesPerRankEqualTable2) {
  auto be = make_cpu_backend();
  ExperimentSpec spec = small_spec(GetParam(), DType::bf16, 0.1f, kDims);
  spec.warmup = 0;
  spec.iters = 1;
  ExperimentResult r = run_experiment(*be, *g_comm, spec);
  ASSERT_EQ(r.status, "ok");
  const theory::Dims td = theory_dims(kDims, g_comm->size());
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::activation_bytes(td, spec.policy));
  EXPECT_EQ(static_cast<double>(r.act_extra_bytes), theory::layernorm_stats_bytes(td, spec.policy));
  EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes);
  EXPECT_GT(r.comm_bytes, 0.0);
}

TEST_P(MpiLayer, EveryTensorEqualsTheSingleRankLayer) {
  const ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.1f, kDims);
  auto be = make_cpu_backend();
  const auto got = run_layer_canonical(*be, *g_comm, spec);
  auto local = make_local_communicator();
  const auto ref = run_layer_canonical(*be, *local, small_spec("baseline", DType::fp32, 0.1f, kDims));
  // Only the order of summation differs (partial sums over ranks): fp32 rounding.
  expect_same_tensors(got, ref, 1e-5, 1e-4, GetParam() + " t=" + std::to_string(g_comm->size()));
}

// Fused attention under real ranks: the heads split over ranks, SP on the rest, the same
// layer as the single-rank paper's layer; bytes are Table 2's selective row + fp32 lse.
TEST_P(MpiLayer, FusedAttentionEqualsTheSingleRankPapersLayer) {
  ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.1f, kDims);
  spec.policy.attention = Attention::fused;
  auto be = make_cpu_backend();
  const auto got = run_layer_canonical(*be, *g_comm, spec);
  auto local = make_local_communicator();
  const auto ref = run_layer_canonical(*be, *local, small_spec("baseline", DType::fp32, 0.1f, kDims));
  expect_same_tensors(got, ref, 1e-5, 1e-4, "fused " + GetParam() + " t=" + std::to_string(g_comm->size()));
  spec.dtype = DType::bf16;
  spec.warmup = 0;
  spec.iters = 1;
  const ExperimentResult r = run_experiment(*be, *g_comm, spec);
  ASSERT_EQ(r.status, "ok");
  const theory::Dims td = theory_dims(kDims, g_comm->size());
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::activation_bytes(td, spec.policy));
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiLayer,
                         ::testing::Values("baseline", "sp", "full", "selective", "selective+sp", "full+sp"),
                         config_param_name);

// The llama family under real ranks: GQA with 8 query heads in 4 key/value groups (so t = 2
// and t = 4 both split whole groups), RoPE, SwiGLU; every tensor equals the single-rank layer
// and the bytes per rank equal the closed forms, unfused and fused.
class MpiLlama : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiLlama, EveryTensorAndBytesEqualTheSingleRankLayer) {
  LayerDims d{24, 2, 96, 8};
  d.spec = theory::llama_layer_spec(4, 80);
  auto be = make_cpu_backend();
  auto local = make_local_communicator();
  const auto ref = run_layer_canonical(*be, *local, small_spec("baseline", DType::fp32, 0.f, d));
  for (Attention att : {Attention::unfused, Attention::fused}) {
    const std::string what = GetParam() + " " + attention_name(att) + " t=" + std::to_string(g_comm->size());
    ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.f, d);
    spec.policy.attention = att;
    expect_same_tensors(run_layer_canonical(*be, *g_comm, spec), ref, 1e-5, 1e-4, what);
    spec.dtype = DType::bf16;
    spec.warmup = 0;
    spec.iters = 1;
    const ExperimentResult r = run_experiment(*be, *g_comm, spec);
    ASSERT_EQ(r.status, "ok") << what;
    const theory::LlamaDims td = theory_llama_dims(d, g_comm->size());
    EXPECT_EQ(static_cast<double>(r.act_bytes), theory::llama_closed_form(td, spec.policy)) << what;
    EXPECT_EQ(static_cast<double>(r.act_extra_bytes), theory::llama_norm_stats_bytes(td, spec.policy)) << what;
    EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiLlama,
                         ::testing::Values("baseline", "sp", "full", "selective", "selective+sp", "full+sp"),
                         config_param_name);

// An MoE layer under TP + SP (expert tensor parallelism 1, as Megatron-Core's DeepSeek and Qwen
// recipes): each rank routes its own rows to whole experts, the shared experts split like the
// MLP. Every tensor (the routing decision too) equals the single-rank layer's, and the bytes per
// rank equal the pieces given the routed rows that rank measured.
class MpiMoe : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiMoe, EveryTensorAndBytesEqualTheSingleRankLayer) {
  LayerDims d = kDims;
  d.spec = theory::llama_layer_spec(4, 24);  // g = 4: whole groups on 4 ranks
  d.spec.hidden_dropout = 0.1;
  d.spec.moe.num_experts = 4;
  d.spec.moe.top_k = 2;
  d.spec.moe.ffn_hidden = 12;
  d.spec.moe.shared_ffn_hidden = 8;
  ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.1f, d);
  spec.dims.spec.attention_dropout = 0;  // llama's attention
  if (GetParam() == "selective+sp") spec.policy.modules.moe_act = spec.policy.modules.shared_experts = true;
  auto be = make_cpu_backend();
  const auto got = run_layer_canonical(*be, *g_comm, spec);
  auto local = make_local_communicator();
  ExperimentSpec single = spec;
  single.policy = parse_config("baseline");
  auto ref = run_layer_canonical(*be, *local, single);
  std::erase_if(ref, [](const CanonicalTensor& t) { return t.name == "moe.aux_loss"; });  // one rank's only
  if (spec.policy.recompute == Recompute::full)
    std::erase_if(ref, [](const CanonicalTensor& t) { return t.name.starts_with("moe.topk"); });
  const std::string what = "moe " + GetParam() + " t=" + std::to_string(g_comm->size());
  expect_same_tensors(got, ref, 1e-5, 1e-4, what);
  spec.dtype = DType::bf16;
  spec.warmup = 0;
  spec.iters = 1;
  const ExperimentResult r = run_experiment(*be, *g_comm, spec);
  ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
  theory::Dims td = theory_dims(d, g_comm->size());
  for (int64_t rows : r.moe.tokens_per_expert) td.moe_routed_rows += static_cast<double>(rows);
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec.dims.spec, spec.policy)) << what;
  EXPECT_EQ(static_cast<double>(r.act_extra_bytes), theory::layer_extra_bytes(td, spec.dims.spec, spec.policy))
      << what;
  EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what;
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiMoe, ::testing::Values("sp", "selective+sp", "full+sp"), config_param_name);

// Multi-latent attention under TP, with and without SP: the down projections and latent norms
// on every rank (their gradients summed over the group under SP), the up projections
// column-parallel, k's RoPE part gathered and its gradient summed back. Every tensor equals the
// single-rank layer's; the bytes per rank equal the pieces.
class MpiMla : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiMla, EveryTensorAndBytesEqualTheSingleRankLayer) {
  LayerDims d = kDims;
  d.spec = theory::gpt_layer_spec();
  d.spec.add_bias_linear = false;
  d.spec.position = theory::PositionEmbedding::rope;
  d.spec.mla = {true, 6, 5, 4, 2, 3};  // q latent 6, kv latent 5, heads of 4 + 2 and v of 3
  ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.1f, d);
  if (spec.policy.recompute == Recompute::selective)
    spec.policy.modules.mla_up_proj = spec.policy.modules.layernorm = true;
  auto be = make_cpu_backend();
  auto local = make_local_communicator();
  const std::string what = "mla " + GetParam() + " t=" + std::to_string(g_comm->size());
  expect_same_tensors(run_layer_canonical(*be, *g_comm, spec),
                      run_layer_canonical(*be, *local, small_spec("baseline", DType::fp32, 0.1f, d)), 1e-5, 1e-4, what);
  spec.dims.spec.mla.q_lora_rank = 0;  // and q projected from h directly
  expect_same_tensors(run_layer_canonical(*be, *g_comm, spec),
                      run_layer_canonical(*be, *local, small_spec("baseline", DType::fp32, 0.1f, spec.dims)), 1e-5,
                      1e-4, what + " q projected");
  spec.dtype = DType::bf16;
  spec.warmup = 0;
  spec.iters = 1;
  const ExperimentResult r = run_experiment(*be, *g_comm, spec);
  ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
  const theory::Dims td = theory_dims(spec.dims, g_comm->size());
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec.dims.spec, spec.policy)) << what;
  EXPECT_EQ(static_cast<double>(r.act_extra_bytes), theory::layer_extra_bytes(td, spec.dims.spec, spec.policy))
      << what;
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiMla,
                         ::testing::Values("baseline", "sp", "selective", "selective+sp", "full+sp"),
                         config_param_name);

// Expert parallelism (--expert-model-parallel-size = the world, t = 1): each rank holds E/ep
// experts and its own micro-batch, the tokens travel to their experts and back by all-to-all.
// The ranks together are the single-rank layer on the concatenated batch, tensor for tensor;
// each rank keeps the pieces for the rows it routed and the rows its experts received.
namespace {

// A llama-family layer with 8 experts of width 12 (top 2), shared experts of width `shared`.
LayerDims moe_layer(LayerDims d, double kv_heads, double shared) {
  d.spec = theory::llama_layer_spec(kv_heads, 24);
  d.spec.moe.num_experts = 8;
  d.spec.moe.top_k = 2;
  d.spec.moe.ffn_hidden = 12;
  d.spec.moe.shared_ffn_hidden = shared;
  return d;
}

// The expert-parallel ranks (g_comm, each its own micro-batch) against the single-rank layer on
// their concatenated batch, tensor for tensor (the aux loss is each rank's own; full recompute
// dumps no routing). Returns the single-rank layer's tensors.
std::vector<CanonicalTensor> expect_ranks_equal_the_whole_batch(ExperimentSpec spec, const std::string& what) {
  auto local = make_local_communicator();
  spec.ep_group = spec.dp_group = g_comm;
  auto be = make_cpu_backend();
  const auto got = run_layer_canonical(*be, *local, spec);
  ExperimentSpec single = spec;
  single.ep_group = single.dp_group = nullptr;
  single.dims.b = spec.dims.b * g_comm->size();
  single.policy = parse_config("baseline");
  single.policy.attention = spec.policy.attention;
  auto ref = run_layer_canonical(*be, *local, single);
  std::erase_if(ref, [&](const CanonicalTensor& t) {
    return t.name == "moe.aux_loss" || (spec.policy.recompute == Recompute::full && t.name.starts_with("moe.topk"));
  });
  expect_same_tensors(got, ref, 1e-5, 1e-4, what);
  return ref;
}

}  // namespace

class MpiExpertParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiExpertParallel, EveryTensorAndBytesEqualTheSingleRankLayer) {
  const int ep = g_comm->size();
  // no dropout (hidden dropout: the test below)
  const LayerDims d = moe_layer({12, 2, 48, 4}, 2, GetParam() == "baseline" ? 0 : 8);
  ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.f, d);
  if (GetParam() == "selective") spec.policy.modules.moe_act = true;
  const std::string what = "ep=" + std::to_string(ep) + " " + GetParam();
  expect_ranks_equal_the_whole_batch(spec, what);
  auto local = make_local_communicator();
  spec.ep_group = spec.dp_group = g_comm;
  auto be = make_cpu_backend();
  spec.dtype = DType::bf16;
  spec.warmup = 0;
  spec.iters = 1;
  const ExperimentResult r = run_experiment(*be, *local, spec);
  ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
  theory::Dims td = theory_dims(d, 1);
  td.ep = ep;
  for (int64_t rows : r.moe.tokens_per_expert) td.moe_routed_rows += static_cast<double>(rows);
  td.moe_expert_rows = static_cast<double>(r.moe.expert_rows);
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec.dims.spec, spec.policy)) << what;
  EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what;
  // The tokens travel unpadded: each exchange counts the rows this rank sends to the other
  // ranks (to_experts: its routed rows for their experts; from_experts: their rows its experts
  // processed), in forward, backward and full recompute's second forward alike.
  const std::vector<float> every = g_comm->gather_host(std::vector<float>(r.moe.tokens_per_expert.begin(),
                                                                          r.moe.tokens_per_expert.end()));
  const int64_t E = d.spec.moe.num_experts, per_rank = E / ep, me = g_comm->rank();
  double routed_away = 0, served_others = 0, largest_block = 0;
  for (int i = 0; i < ep; ++i)
    for (int j = 0; j < ep; ++j) {
      double block = 0;  // rank i's rows for rank j's experts
      for (int64_t e = j * per_rank; e < (j + 1) * per_rank; ++e) block += every[static_cast<size_t>(i * E + e)];
      largest_block = std::max(largest_block, block);
      if (i == me && j != me) routed_away += block;
      if (j == me && i != me) served_others += block;
    }
  // Beside the rows, each forward sends its rows' routing weights with them and backward
  // returns their gradients (one bf16 each).
  const double forwards = spec.policy.recompute == Recompute::full ? 2 : 1, row_bytes = 2.0 * d.h;  // bf16
  const double weights = 2.0 * (forwards * routed_away + served_others);
  EXPECT_DOUBLE_EQ(r.comm_bytes_ep, (forwards + 1) * (routed_away + served_others) * row_bytes + weights) << what;
  EXPECT_NE(r.comm_bytes_ep, (forwards + 1) * 2 * (ep - 1) * largest_block * row_bytes + weights)
      << what << " (padded)";
  // Each rank's experts received what all ranks routed to them: together, every routed row.
  std::vector<double> totals = {static_cast<double>(r.moe.expert_rows), td.moe_routed_rows};
  std::vector<float> all = g_comm->gather_host({static_cast<float>(totals[0]), static_cast<float>(totals[1])});
  double received = 0, routed = 0;
  for (size_t i = 0; i < all.size(); i += 2) received += all[i], routed += all[i + 1];
  EXPECT_EQ(received, routed) << what;
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiExpertParallel, ::testing::Values("baseline", "selective", "full"));

// Expert parallelism over the tensor-parallel group (--tp N --expert-model-parallel-size N,
// expert tensor parallelism 1, SP): each rank routes its s/t rows, its E/t experts receive every
// rank's rows for them, and their gradients stay whole (no sum over TP). Every tensor equals the
// single-rank layer's, dropout included; each rank's bytes equal the pieces with ep = t and the
// rows it routed and received.
namespace {

// The TP group (g_comm, one micro-batch, SP) against the single-rank layer, tensor for tensor
// (dropout included), and each rank's bytes against the pieces with the rows it routed and its
// experts processed; ep and etp as the spec splits the experts over the group.
void expect_tp_group_equals_the_single_rank_layer(ExperimentSpec spec, const std::string& what, int ep, int etp) {
  const int t = g_comm->size();
  auto be = make_cpu_backend();
  const auto got = run_layer_canonical(*be, *g_comm, spec);
  auto local = make_local_communicator();
  ExperimentSpec single = small_spec("baseline", DType::fp32, spec.dims.spec.hidden_dropout, spec.dims);
  auto ref = run_layer_canonical(*be, *local, single);
  // The routing is dumped from what forward kept: nothing under full recompute or the moe module.
  const bool routing_kept = spec.policy.recompute == Recompute::none ||
                            (spec.policy.recompute == Recompute::selective && !spec.policy.modules.moe);
  std::erase_if(ref, [&](const CanonicalTensor& x) {
    return x.name == "moe.aux_loss" || (!routing_kept && x.name.starts_with("moe.topk"));
  });
  expect_same_tensors(got, ref, 1e-5, 1e-4, what);
  spec.dtype = DType::bf16;
  spec.warmup = 0;
  spec.iters = 1;
  const ExperimentResult r = run_experiment(*be, *g_comm, spec);
  ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
  theory::Dims td = theory_dims(spec.dims, t);
  td.ep = ep;
  td.etp = etp;
  for (int64_t rows : r.moe.tokens_per_expert) td.moe_routed_rows += static_cast<double>(rows);
  td.moe_expert_rows = static_cast<double>(r.moe.expert_rows);
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec.dims.spec, spec.policy)) << what;
  EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what;
}

}  // namespace

class MpiExpertsOverTp : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiExpertsOverTp, EveryTensorAndBytesEqualTheSingleRankLayer) {
  const int t = g_comm->size();
  const LayerDims d = moe_layer(kDims, 4, 8);  // g = 4: whole groups on 4 ranks
  ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.1f, d);  // attention and hidden dropout
  if (spec.policy.recompute == Recompute::selective) spec.policy.modules.moe_act = spec.policy.modules.moe = true;
  spec.experts_over_tp = true;
  expect_tp_group_equals_the_single_rank_layer(spec, "experts over tp, t=ep=" + std::to_string(t) + " " + GetParam(),
                                               t, 1);
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiExpertsOverTp, ::testing::Values("sp", "selective+sp", "full+sp"),
                         config_param_name);

// Expert tensor parallelism over the TP group (--expert-tensor-parallel-size = --tp, SP): each
// rank routes its s/t rows, every rank's rows go to every rank, each rank runs its 1/t slice of
// every expert over all of them, and the partial outputs come back summed (Megatron-Core's
// alltoall dispatcher with ETP = TP). The experts' gradients are whole slices (no sum over TP).
class MpiExpertTensorParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiExpertTensorParallel, EveryTensorAndBytesEqualTheSingleRankLayer) {
  const int t = g_comm->size();
  LayerDims d = moe_layer(kDims, 4, 8);  // experts 12 wide: a slice of 6 or 3
  ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.1f, d);
  if (spec.policy.recompute == Recompute::selective) spec.policy.modules.moe_act = true;
  spec.expert_tensor_parallel = true;
  const std::string what = "etp=t=" + std::to_string(t) + " " + GetParam();
  expect_tp_group_equals_the_single_rank_layer(spec, what + " swiglu", 1, t);
  spec.dims.spec.activation = theory::Activation::gelu;  // fc1 one part, not gate | up
  expect_tp_group_equals_the_single_rank_layer(spec, what + " gelu", 1, t);
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiExpertTensorParallel, ::testing::Values("sp", "selective+sp", "full+sp"),
                         config_param_name);

// Dropout under expert parallelism: each rank draws the masks of its batch slice of the
// canonical [s, ep·b, h] (hidden) and [ep·b, a, s, s] (attention, unfused and fused), so every
// tensor (the masks among them) is the single-rank layer's.
class MpiExpertParallelDropout : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiExpertParallelDropout, MasksAreTheSingleRankLayers) {
  const int ep = g_comm->size();
  const LayerDims d = moe_layer({12, 2, 48, 4}, 2, 0);
  for (const char* config : {"baseline", "full"}) {
    ExperimentSpec spec = small_spec(config, DType::fp32, 0.f, d);
    if (GetParam() == "hidden") spec.dims.spec.hidden_dropout = 0.25;
    else spec.dims.spec.attention_dropout = 0.25;
    spec.policy.attention = GetParam() == "attention_fused" ? Attention::fused : Attention::unfused;
    const std::string what = "ep=" + std::to_string(ep) + " " + config + " " + GetParam();
    const auto ref = expect_ranks_equal_the_whole_batch(spec, what);
    // Not blind: the masks show in y (the same layer without dropout gives another one).
    ExperimentSpec single = small_spec("baseline", DType::fp32, 0.f, d);
    single.dims.b = d.b * ep;
    auto be = make_cpu_backend();
    auto local = make_local_communicator();
    const auto undropped = run_layer_canonical(*be, *local, single);
    auto y_of = [](const std::vector<CanonicalTensor>& all) {
      return std::find_if(all.begin(), all.end(), [](const CanonicalTensor& t) { return t.name == "y"; })->data;
    };
    EXPECT_NE(y_of(ref), y_of(undropped)) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Sites, MpiExpertParallelDropout, ::testing::Values("hidden", "attention", "attention_fused"));

// Expert parallelism over data-parallel replicas of the TP group, Megatron-Core's usual MoE
// layouts (SP; mpirun -np 4, TP 2): world rank r is TP rank r % 2 of replica r / 2, each replica
// its own micro-batch split over its TP ranks by SP, every rank routing its s/t rows.
//  - expert tensor parallelism 1, --expert-model-parallel-size 4: the world is the EP group and
//    the rows go to the E/4 whole experts of whichever rank holds them;
//  - --expert-tensor-parallel-size 2 --expert-model-parallel-size 2: the EP group is each TP
//    rank's two replicas (E/2 experts each), each expert split over the TP group; the rows go by
//    all-to-all over EP, then to every rank of the TP group, and come back summed.
// The world equals the single-rank layer on the replicas' concatenated batch, tensor for tensor,
// dropout included (each rank draws its sequence rows of its replica's batch columns); each
// rank keeps the pieces for the rows it routed and its experts received.
class MpiExpertParallelOverReplicas : public ::testing::TestWithParam<std::string> {
 protected:
  void expect_world_equals_the_single_rank_layer(bool expert_tensor_parallel) {
    const int t = 2, replicas = g_comm->size() / t;
    auto be = make_cpu_backend();
    ParallelGroups groups = make_parallel_groups(*be, t, replicas);  // the replicas in the place of CP's
    const LayerDims d = moe_layer(kDims, 2, 8);
    ExperimentSpec spec = small_spec(GetParam(), DType::fp32, 0.1f, d);  // attention and hidden dropout
    if (spec.policy.recompute == Recompute::selective) spec.policy.modules.moe_act = true;
    spec.expert_tensor_parallel = expert_tensor_parallel;
    spec.ep_group = expert_tensor_parallel ? groups.cp.get() : groups.world.get();
    spec.dp_group = groups.cp.get();
    const int ep = spec.ep();
    const std::string what = "t=2 ep=" + std::to_string(ep) + " etp=" + (expert_tensor_parallel ? "2 " : "1 ") +
                             GetParam();
    const auto got = run_layer_canonical(*be, *groups.tp, spec);
    auto local = make_local_communicator();
    LayerDims whole = d;
    whole.b = d.b * replicas;
    auto ref = run_layer_canonical(*be, *local, small_spec("baseline", DType::fp32, 0.1f, whole));
    std::erase_if(ref, [&](const CanonicalTensor& x) {
      return x.name == "moe.aux_loss" || (spec.policy.recompute == Recompute::full && x.name.starts_with("moe.topk"));
    });
    expect_same_tensors(got, ref, 1e-5, 1e-4, what);

    spec.dtype = DType::bf16;
    spec.warmup = 0;
    spec.iters = 1;
    const ExperimentResult r = run_experiment(*be, *groups.tp, spec);
    ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
    theory::Dims td = theory_dims(spec.dims, t);
    td.ep = ep;
    td.etp = expert_tensor_parallel ? t : 1;
    for (int64_t rows : r.moe.tokens_per_expert) td.moe_routed_rows += static_cast<double>(rows);
    td.moe_expert_rows = static_cast<double>(r.moe.expert_rows);
    EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec.dims.spec, spec.policy)) << what;
    EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what;
    // The experts received what the world routed to them (under expert tensor parallelism every
    // rank of a TP group all of its group's rows for its EP rank's experts): together, every
    // routed row (t times).
    std::vector<float> all = g_comm->gather_host({static_cast<float>(r.moe.expert_rows),
                                                  static_cast<float>(td.moe_routed_rows)});
    double received = 0, routed = 0;
    for (size_t i = 0; i < all.size(); i += 2) received += all[i], routed += all[i + 1];
    EXPECT_EQ(received, routed * td.etp) << what;
    EXPECT_GT(r.comm_bytes_ep, 0.0) << what;
  }
};

TEST_P(MpiExpertParallelOverReplicas, WholeExpertsEqualTheSingleRankLayer) {
  if (g_comm->size() < 4) GTEST_SKIP() << "needs two replicas of a TP group of 2: mpirun -np 4";
  expect_world_equals_the_single_rank_layer(false);
}

TEST_P(MpiExpertParallelOverReplicas, ExpertsSplitOverTpEqualTheSingleRankLayer) {
  if (g_comm->size() < 4) GTEST_SKIP() << "needs two replicas of a TP group of 2: mpirun -np 4";
  expect_world_equals_the_single_rank_layer(true);
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiExpertParallelOverReplicas, ::testing::Values("sp", "selective+sp", "full+sp"),
                         config_param_name);

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = make_mpi_communicator();
  g_comm = comm.get();
  if (comm->rank() != 0) {  // one report, from rank 0; every rank still asserts
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (comm->rank() == 0 && any && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  comm.reset();
  mpi_finalize_if_initialized();
  return any;
}
