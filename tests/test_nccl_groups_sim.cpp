// The NCCL communicator (kernels/cuda/comm_nccl.cpp, unchanged) on the CPU simulator's CUDA
// runtime and the NCCL stand-in, under mpirun -np 2 and 4: split_nccl_communicator's groups in
// Megatron-Core's rank order for every split t x c of the world, and send_recv / all_to_all /
// all_to_all_v / all_reduce on device tensors moving exactly the group's data (grouped
// ncclSend/ncclRecv; a self send_recv is a device copy). make_parallel_groups calls the same
// split for cuda.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/comm_nccl.hpp"
#include "runtime/allocator.hpp"
#include "runtime/communicator.hpp"
#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

using namespace actbench;

namespace {

Communicator* g_world = nullptr;  // the NCCL world
int g_rank = 0, g_size = 1;

class SimDeviceSource final : public RawMemorySource {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  }
  void release(void* ptr, size_t) override { cudaFree(ptr); }
  Device device() const override { return Device::cuda; }
};

// Made and released in main (a static one would outlive the simulator's runtime).
CachingAllocator* g_device_memory = nullptr;
CachingAllocator& device_memory() { return *g_device_memory; }

Tensor device_tensor(const std::vector<float>& values, Shape shape, DType dtype) {
  Tensor t(device_memory(), std::move(shape), dtype);
  std::vector<char> host(t.bytes());
  for (size_t i = 0; i < values.size(); ++i) store_from_float(host.data(), dtype, i, values[i]);
  EXPECT_EQ(cudaMemcpy(t.data(), host.data(), t.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  std::vector<char> host(t.bytes());
  EXPECT_EQ(cudaMemcpy(host.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(host.data(), t.dtype(), i);
  return v;
}

// A value that names its world rank, row and column, exact in bf16 (integers below 256).
float tag(int world_rank, int64_t row, int64_t col) { return static_cast<float>(world_rank * 32 + row * 4 + col); }

Tensor tagged(int64_t rows, DType dtype) {
  std::vector<float> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 4; ++c) v.push_back(tag(g_rank, r, c));
  return device_tensor(v, {rows, 4}, dtype);
}

struct Groups {
  std::unique_ptr<Communicator> tp, cp;
};
// Megatron-Core's order, as make_parallel_groups splits: tp_rank = r % t, cp_rank = r / t.
Groups split(int t) {
  return {split_nccl_communicator(*g_world, g_rank / t, g_rank % t),
          split_nccl_communicator(*g_world, g_rank % t, g_rank / t)};
}

std::vector<int> tps() {
  std::vector<int> all;
  for (int t = 1; t <= g_size; ++t)
    if (g_size % t == 0) all.push_back(t);
  return all;
}

}  // namespace

TEST(NcclGroupsOnSim, MembersFollowMegatronRankOrder) {
  for (int t : tps()) {
    const int c = g_size / t;
    Groups g = split(t);
    const std::string what = "t=" + std::to_string(t);
    EXPECT_EQ(g.tp->mode(), CommMode::nccl);
    ASSERT_EQ(g.tp->size(), t) << what;
    ASSERT_EQ(g.cp->size(), c) << what;
    EXPECT_EQ(g.tp->rank(), g_rank % t) << what;
    EXPECT_EQ(g.cp->rank(), g_rank / t) << what;
    std::vector<float> tp_members, cp_members;
    for (int i = 0; i < t; ++i) tp_members.push_back(static_cast<float>(g_rank / t * t + i));
    for (int j = 0; j < c; ++j) cp_members.push_back(static_cast<float>(g_rank % t + j * t));
    EXPECT_EQ(g.tp->gather_host({static_cast<float>(g_rank)}), tp_members) << what;
    EXPECT_EQ(g.cp->gather_host({static_cast<float>(g_rank)}), cp_members) << what;
    std::vector<double> highest = {static_cast<double>(g_rank)};
    g.cp->max_inplace(highest);
    EXPECT_EQ(highest[0], g_rank % t + (c - 1) * t) << what;
    Tensor sum = device_tensor({static_cast<float>(g_rank)}, {1}, DType::fp32);
    g.tp->all_reduce(sum);
    EXPECT_EQ(values_of(sum)[0], static_cast<float>(g_rank / t * t * t + t * (t - 1) / 2)) << what;
    g.tp->barrier();
    g.cp->barrier();
  }
}

TEST(NcclGroupsOnSim, RingSendRecvAndAllToAllMoveTheGroupsData) {
  for (int t : tps()) {
    const int c = g_size / t;
    Groups g = split(t);
    for (DType dtype : {DType::bf16, DType::fp32}) {
      const std::string what = "t=" + std::to_string(t) + " " + dtype_name(dtype);
      // Ring around the CP group (c == 1: a self exchange, copied on the device).
      Tensor send = tagged(3, dtype), recv = device_tensor(std::vector<float>(12, -1.f), {3, 4}, dtype);
      const int me = g.cp->rank(), prev = (me + c - 1) % c;
      g.cp->send_recv(send, (me + 1) % c, recv, prev);
      std::vector<float> want;
      for (int64_t row = 0; row < 3; ++row)
        for (int64_t col = 0; col < 4; ++col) want.push_back(tag(g_rank % t + prev * t, row, col));
      EXPECT_EQ(values_of(recv), want) << what;
      EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, c > 1 ? static_cast<double>(send.bytes()) : 0.0) << what;
      // All-to-all in the CP group: block i of the output from CP rank i, its rows [me*2, me*2+2).
      Tensor in = tagged(2 * c, dtype), out = device_tensor(std::vector<float>(8 * c, -1.f), {2 * c, 4}, dtype);
      g.cp->all_to_all(in, out);
      want.clear();
      for (int i = 0; i < c; ++i)
        for (int64_t row = 0; row < 2; ++row)
          for (int64_t col = 0; col < 4; ++col) want.push_back(tag(g_rank % t + i * t, me * 2 + row, col));
      EXPECT_EQ(values_of(out), want) << what;
      EXPECT_EQ(g.cp->stats().send_recv_calls, 1) << what;
      EXPECT_EQ(g.cp->stats().all_to_all_calls, 1) << what;
      g.cp->reset_stats();
    }
  }
}

// Uneven rows per CP peer as grouped ncclSend/ncclRecv (none for a zero count): rank i's rows
// for rank j, after its rows for the ranks before j, land in rank order at the front of j's
// output; the row past the sums stays; the bytes are the rows sent to the other ranks. The
// counts are test_mpi_groups.cpp's: uneven, some zero, the last rank (of more) sends nothing.
TEST(NcclGroupsOnSim, AllToAllVMovesUnevenRowsExactly) {
  auto rows_between = [](int c, int i, int j) -> int64_t { return c > 1 && i == c - 1 ? 0 : (i + 2 * j + 2) % 3; };
  for (int t : tps()) {
    const int c = g_size / t;
    Groups g = split(t);
    const int me = g.cp->rank();
    std::vector<int64_t> send, recv;
    int64_t sent = 0, received = 0, sent_to_others = 0;
    for (int j = 0; j < c; ++j) {
      send.push_back(rows_between(c, me, j));
      recv.push_back(rows_between(c, j, me));
      sent += send.back();
      received += recv.back();
      if (j != me) sent_to_others += send.back();
    }
    for (DType dtype : {DType::bf16, DType::fp32}) {
      const std::string what = "t=" + std::to_string(t) + " " + dtype_name(dtype);
      Tensor in = tagged(sent + 1, dtype);
      const std::vector<float> minus(static_cast<size_t>(4 * (received + 1)), -1.f);
      Tensor out = device_tensor(minus, {received + 1, 4}, dtype);
      g.cp->all_to_all_v(in, send, out, recv);
      std::vector<float> want;
      for (int i = 0; i < c; ++i) {
        int64_t offset = 0;
        for (int j = 0; j < me; ++j) offset += rows_between(c, i, j);
        for (int64_t row = 0; row < recv[static_cast<size_t>(i)]; ++row)
          for (int64_t col = 0; col < 4; ++col) want.push_back(tag(g_rank % t + i * t, offset + row, col));
      }
      want.insert(want.end(), 4, -1.f);
      EXPECT_EQ(values_of(out), want) << what;
      EXPECT_EQ(g.cp->stats().all_to_all_v_calls, 1) << what;
      EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, static_cast<double>(sent_to_others * 4) * dtype_size(dtype)) << what;
      g.cp->reset_stats();
    }
    g.cp->barrier();
  }
}

// Exchanges started together (as the ring starts K and V), on the communicator's own stream,
// arrive for the work after each wait, counted as send_recv.
TEST(NcclGroupsOnSim, StartedRingExchangesArriveAtTheirWait) {
  for (int t : tps()) {
    const int c = g_size / t;
    Groups g = split(t);
    const std::string what = "t=" + std::to_string(t);
    const int me = g.cp->rank(), prev = (me + c - 1) % c;
    Tensor a = tagged(3, DType::fp32), b = tagged(5, DType::bf16);
    PendingExchange first = g.cp->start_send_recv(
        a, (me + 1) % c, device_tensor(std::vector<float>(12, -1.f), {3, 4}, DType::fp32), prev);
    PendingExchange second = g.cp->start_send_recv(
        b, (me + 1) % c, device_tensor(std::vector<float>(20, -1.f), {5, 4}, DType::bf16), prev);
    const Tensor got_a = first.wait(), got_b = second.wait();
    for (const auto& [got, rows] : {std::pair{got_a, 3}, std::pair{got_b, 5}}) {
      std::vector<float> want;
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t col = 0; col < 4; ++col) want.push_back(tag(g_rank % t + prev * t, row, col));
      EXPECT_EQ(values_of(got), want) << what << " rows " << rows;
    }
    EXPECT_EQ(g.cp->stats().send_recv_calls, 2) << what;
    EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, c > 1 ? static_cast<double>(a.bytes() + b.bytes()) : 0.0) << what;
    g.cp->barrier();
  }
}

TEST(NcclGroupsOnSim, SplittingANonNcclCommunicatorIsRefused) {
  auto local = make_local_communicator();
  try {
    split_nccl_communicator(*local, 0, 0);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "split_nccl_communicator: the world communicator is not an NCCL one");
  }
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto memory = std::make_unique<CachingAllocator>(std::make_unique<SimDeviceSource>());
  g_device_memory = memory.get();
  auto world = make_nccl_communicator(nullptr);  // initialises MPI
  g_world = world.get();
  g_rank = world->rank();
  g_size = world->size();
  if (g_rank != 0) {  // one report, from rank 0; every rank still asserts
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0 && any && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  world.reset();
  memory.reset();
  mpi_finalize_if_initialized();
  return any;
}
