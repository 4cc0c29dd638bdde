// Context parallelism under real MPI ranks (run by ctest as mpirun -np 2 and -np 4): the world
// split t x C (Megatron's order), every CP type, unfused and fused, gpt (with dropout),
// llama (GQA, RoPE at each rank's positions), multi-latent attention and an MoE block: every
// tensor equals the single-rank layer's up to the order of summation.
#include <gtest/gtest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "kernels/backend_comm.hpp"
#include "kernels/cpu/cpu_attention.hpp"
#include "layer_harness.hpp"
#include "layers/theory_dims.hpp"
#include "theory/layer_pieces.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

int g_world_size = 1;

LayerDims dims_of(const std::string& arch) {
  LayerDims d{24, 2, 48, 4};  // 24 = 2C chunks of 3 for C = 4, of 6 for C = 2; h/a = 12
  if (arch == "llama") d.spec = theory::llama_layer_spec(4, 64);
  if (arch == "mla") {  // DeepSeek's latent attention: k's RoPE part at each rank's positions, v of its own width
    d.spec.add_bias_linear = false;
    d.spec.position = theory::PositionEmbedding::rope;
    d.spec.mla = {true, 6, 5, 4, 2, 3};
  }
  return d;
}

}  // namespace

class MpiContextParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiContextParallel, EveryTensorEqualsTheSingleRankLayer) {
  const std::string config = GetParam();
  for (int C : {2, 4}) {
    if (g_world_size % C != 0) continue;
    const int t = g_world_size / C;
    for (const std::string arch : {"gpt", "llama", "mla"})
      for (CpCommType type : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a})
        for (Attention attention : {Attention::unfused, Attention::fused}) {
          ExperimentSpec spec = small_spec(config, DType::fp32, arch == "gpt" ? 0.1f : 0.f, dims_of(arch));
          spec.policy.attention = attention;
          spec.policy.cp_comm = type;
          try {
            validate_layer(spec.dims, t, spec.policy, C);
          } catch (const InvalidArgument&) {
            continue;  // p2p unfused; a2a without enough heads
          }
          auto be = make_cpu_backend();
          ParallelGroups groups = make_parallel_groups(*be, t, C);
          spec.cp_group = groups.cp.get();
          const auto got = run_layer_canonical(*be, *groups.tp, spec);
          ExperimentSpec single = small_spec("baseline", DType::fp32, arch == "gpt" ? 0.1f : 0.f, dims_of(arch));
          single.policy.attention = attention;
          auto local = make_local_communicator();
          const auto ref = run_layer_canonical(*be, *local, single);
          expect_same_tensors(got, ref, 1e-5, 1e-4,
                              arch + " " + config + " " + attention_name(attention) + " " + cp_comm_type_name(type) +
                                  " t=" + std::to_string(t) + " C=" + std::to_string(C));
        }
  }
}

// Every rank of a CP group does the same attention work: chunks i and 2C-1-i see
// (2C-1)c^2 + c(c+1) query-key pairs whatever i is. Measured: the scores the cpu kernel
// computed on each rank (forward and backward), for the ring and the all-gather.
TEST(MpiContextParallelBalance, EveryRankComputesTheSameAttentionScores) {
  for (int C : {2, 4}) {
    if (g_world_size % C != 0) continue;
    const int t = g_world_size / C;
    for (CpCommType type : {CpCommType::p2p, CpCommType::all_gather}) {
      ExperimentSpec spec = small_spec("selective", DType::fp32, 0.f, dims_of("llama"));
      spec.policy.attention = Attention::fused;
      spec.policy.cp_comm = type;
      spec.warmup = 0;
      spec.iters = 1;
      auto be = make_cpu_backend();
      ParallelGroups groups = make_parallel_groups(*be, t, C);
      spec.cp_group = groups.cp.get();
      const int64_t before = cpu::attention_score_count();
      ASSERT_EQ(run_experiment(*be, *groups.tp, spec).status, "ok");
      const std::vector<float> per_rank =
          groups.world->gather_host({static_cast<float>(cpu::attention_score_count() - before)});
      const auto [least, most] = std::minmax_element(per_rank.begin(), per_rank.end());
      double total = 0;
      for (float n : per_rank) total += n;
      EXPECT_GT(*least, 0.f);
      EXPECT_LT(*most - *least, total / (2.0 * C)) << cp_comm_type_name(type) << " C=" << C;
      // Whole tiles are not the unit here: each rank computed exactly the same pairs.
      EXPECT_EQ(*most, *least) << cp_comm_type_name(type) << " C=" << C;
    }
  }
}

// An MoE layer under CP (and t x C = 4 with SP at -np 4, the experts also split over the TP
// group): each rank routes its own two chunks' rows (under SP its s/(tC) of them) to whole
// experts, the shared experts split over TP, the residual dropout at the rank's positions.
// Every tensor equals the single-rank layer's, the routing decision put back in sequence order
// and the histogram summed over TP and CP among them; each rank's bytes equal the pieces given
// the rows that rank routed (and, experts over TP, received).
namespace {

// How the TP group holds the experts: each rank all of them whole, E/t whole ones each
// (experts over TP, ep = t), or a 1/t slice of every one (expert tensor parallelism, etp = t).
// The routed experts: whole on every rank, over the TP group (ep = t), split over it (etp = t),
// or over the whole world (ep = t x C x replicas: expert parallelism spanning the CP ranks and
// the data-parallel replicas, each replica its own micro-batch), or split over TP and spread over
// each TP rank's CP x replica peers (etp = t, ep = C x replicas).
enum class Experts { whole, over_tp, split_over_tp, over_the_world, split_over_tp_and_peers };

void expect_moe_layer_equals_the_single_rank_layer(int t, int C, const std::string& config, Experts experts,
                                                   int replicas = 1) {
  LayerDims d = dims_of("llama");
  d.spec.moe.num_experts = 4;
  d.spec.moe.top_k = 2;
  d.spec.moe.ffn_hidden = 12;
  d.spec.moe.shared_ffn_hidden = 8;
  ExperimentSpec spec = small_spec(config, DType::fp32, 0.1f, d);
  spec.dims.spec.attention_dropout = 0;  // llama's attention
  spec.policy.attention = Attention::fused;
  spec.policy.cp_comm = CpCommType::p2p;
  if (spec.policy.recompute == Recompute::selective)
    spec.policy.modules.moe_act = spec.policy.modules.shared_experts = true;
  auto be = make_cpu_backend();
  const bool peers = experts == Experts::split_over_tp_and_peers;
  ParallelGroups groups = make_data_parallel_groups(*be, t, C, replicas, peers);
  spec.cp_group = groups.cp.get();
  spec.experts_over_tp = experts == Experts::over_tp;
  spec.expert_tensor_parallel = experts == Experts::split_over_tp || peers;
  if (experts == Experts::over_the_world) spec.ep_group = groups.world.get();
  if (peers) spec.ep_group = groups.tp_peers.get();
  if (replicas > 1) spec.dp_group = groups.dp.get();
  const auto got = run_layer_canonical(*be, *groups.tp, spec);
  ExperimentSpec single = spec;
  single.cp_group = single.ep_group = single.dp_group = nullptr;
  single.dims.b = d.b * replicas;
  single.experts_over_tp = single.expert_tensor_parallel = false;
  single.policy = parse_config("baseline");
  auto local = make_local_communicator();
  auto ref = run_layer_canonical(*be, *local, single);
  std::erase_if(ref, [&](const CanonicalTensor& x) {
    return x.name == "moe.aux_loss" || (spec.policy.recompute == Recompute::full && x.name.starts_with("moe.topk"));
  });
  const std::string what = "moe " + config + " t=" + std::to_string(t) + " C=" + std::to_string(C) +
                           " replicas=" + std::to_string(replicas) +
                           (experts == Experts::over_the_world ? " experts over the world" : "") +
                           (peers ? " experts split over tp, over its peers" : "") +
                           (experts == Experts::over_tp ? " experts over tp" : "") +
                           (experts == Experts::split_over_tp ? " experts split over tp" : "");
  expect_same_tensors(got, ref, 1e-5, 1e-4, what);
  const bool routed = std::any_of(got.begin(), got.end(), [](auto& x) { return x.name == "moe.topk_index"; });
  EXPECT_EQ(routed, spec.policy.recompute != Recompute::full) << what << ": the routing is compared";
  spec.dtype = DType::bf16;
  spec.warmup = 0;
  spec.iters = 1;
  const ExperimentResult r = run_experiment(*be, *groups.tp, spec);
  ASSERT_EQ(r.status, "ok") << what << ": " << r.message;
  theory::Dims td = theory_dims(d, t);
  td.cp = C;
  for (int64_t rows : r.moe.tokens_per_expert) td.moe_routed_rows += static_cast<double>(rows);
  if (experts != Experts::whole) {
    td.ep = experts == Experts::over_tp          ? t
            : experts == Experts::over_the_world ? t * C * replicas
            : peers                              ? C * replicas
                                                 : 1;
    td.etp = spec.expert_tensor_parallel ? t : 1;
    td.moe_expert_rows = static_cast<double>(r.moe.expert_rows);
  }
  EXPECT_EQ(static_cast<double>(r.act_bytes), theory::layer_bytes(td, spec.dims.spec, spec.policy)) << what;
  EXPECT_EQ(static_cast<double>(r.act_extra_bytes), theory::layer_extra_bytes(td, spec.dims.spec, spec.policy))
      << what;
  EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << what;
}

}  // namespace

TEST(MpiContextParallelMoe, EveryTensorAndBytesEqualTheSingleRankLayer) {
  for (int C : {2, 4}) {
    if (g_world_size % C != 0) continue;
    const int t = g_world_size / C;
    const std::vector<std::string> configs = t == 1 ? std::vector<std::string>{"baseline", "selective", "full"}
                                                    : std::vector<std::string>{"sp", "selective+sp", "full+sp"};
    for (const std::string& config : configs) {
      expect_moe_layer_equals_the_single_rank_layer(t, C, config, Experts::whole);
      if (t == 1) continue;
      expect_moe_layer_equals_the_single_rank_layer(t, C, config, Experts::over_tp);
      expect_moe_layer_equals_the_single_rank_layer(t, C, config, Experts::split_over_tp);
    }
  }
}

// Expert parallelism over the whole world under context parallelism (Megatron-Core's expert
// order with ETP 1: the EP group spans the TP, CP and data-parallel ranks): t x C x replicas of
// 1 x 2 x 2, 2 x 2 x 1 and 1 x 4 x 1 at mpirun -np 4, every rank routing its own rows of its
// chunks to whichever rank holds their experts.
TEST(MpiContextParallelMoe, ExpertsOverTheWorldEqualTheSingleRankLayer) {
  struct Grid {
    int t, C, replicas;
  };
  for (const Grid g : {Grid{1, 2, 2}, Grid{2, 2, 1}, Grid{1, 4, 1}, Grid{1, 2, 1}}) {
    if (g.t * g.C * g.replicas != g_world_size) continue;
    for (const std::string& config : g.t == 1 ? std::vector<std::string>{"baseline", "selective", "full"}
                                              : std::vector<std::string>{"sp", "selective+sp", "full+sp"}) {
      expect_moe_layer_equals_the_single_rank_layer(g.t, g.C, config, Experts::over_the_world, g.replicas);
      // each expert split over TP, the experts over the TP rank's C peers
      if (g.t > 1) expect_moe_layer_equals_the_single_rank_layer(g.t, g.C, config, Experts::split_over_tp_and_peers);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MpiContextParallel,
                         ::testing::Values("baseline", "sp", "full", "selective", "selective+sp"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n)
                             if (c == '+') c = '_';
                           return n;
                         });

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = make_mpi_communicator();
  g_world_size = world->size();
  if (world->rank() != 0) {  // one report, from rank 0; every rank still asserts
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world->rank() == 0 && any && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  world.reset();
  mpi_finalize_if_initialized();
  return any;
}
