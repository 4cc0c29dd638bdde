// Context parallelism under real MPI ranks (run by ctest as mpirun -np 2 and -np 4): the world
// split t x C (Megatron's order), every CP type, unfused and fused, gpt (with dropout),
// llama (GQA, RoPE at each rank's positions) and multi-latent attention: every tensor equals
// the single-rank layer's up to the order of summation.
#include <gtest/gtest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>

#include "kernels/backend_comm.hpp"
#include "kernels/cpu/cpu_attention.hpp"
#include "layer_harness.hpp"

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
