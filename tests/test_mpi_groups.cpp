// Tensor- and context-parallel groups under real MPI ranks (run by ctest as mpirun -np 2 and
// -np 4): for every split t x c of the world, make_parallel_groups gives Megatron-Core's
// members, and send_recv / all_to_all / all_to_all_v / all_reduce move exactly the data of the group's ranks;
// a split that does not fit the world is refused on every rank alike.
#include <gtest/gtest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/backend_comm.hpp"
#include "runtime/error.hpp"

using namespace actbench;

namespace {

Communicator* g_world = nullptr;

// Every (t, c) with t * c the world size.
std::vector<std::pair<int, int>> splits() {
  std::vector<std::pair<int, int>> all;
  for (int t = 1; t <= g_world->size(); ++t)
    if (g_world->size() % t == 0) all.emplace_back(t, g_world->size() / t);
  return all;
}

std::string name(int t, int c) { return "t=" + std::to_string(t) + " c=" + std::to_string(c); }

// The world ranks of a group's members, in group-rank order.
std::vector<float> members(Communicator& group) { return group.gather_host({static_cast<float>(g_world->rank())}); }

// A value that names its world rank, row and column, exact in bf16 (integers below 256).
float tag(int world_rank, int64_t row, int64_t col) { return static_cast<float>(world_rank * 32 + row * 4 + col); }

Tensor tagged(Backend& be, int64_t rows, DType dtype) {
  std::vector<float> v(static_cast<size_t>(rows * 4));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 4; ++c) v[static_cast<size_t>(r * 4 + c)] = tag(g_world->rank(), r, c);
  Tensor t = be.empty({rows, 4}, dtype);
  be.upload(v.data(), t);
  return t;
}

std::vector<float> values_of(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(t, v.data());
  return v;
}

}  // namespace

TEST(MpiGroups, MembersFollowMegatronRankOrder) {
  auto be = make_cpu_backend();
  const int r = g_world->rank();
  for (const auto& [t, c] : splits()) {
    ParallelGroups g = make_parallel_groups(*be, t, c);
    const std::string what = name(t, c);
    EXPECT_EQ(g.world->rank(), r) << what;
    EXPECT_EQ(g.world->size(), t * c) << what;
    EXPECT_EQ(g.world->mode(), CommMode::mpi) << what;
    ASSERT_EQ(g.tp->size(), t) << what;
    ASSERT_EQ(g.cp->size(), c) << what;
    EXPECT_EQ(g.tp->rank(), r % t) << what;
    EXPECT_EQ(g.cp->rank(), r / t) << what;
    std::vector<float> tp_members, cp_members;
    for (int i = 0; i < t; ++i) tp_members.push_back(static_cast<float>(r / t * t + i));
    for (int j = 0; j < c; ++j) cp_members.push_back(static_cast<float>(r % t + j * t));
    EXPECT_EQ(members(*g.tp), tp_members) << what;
    EXPECT_EQ(members(*g.cp), cp_members) << what;
    // The host helpers and the reductions stay inside the group.
    std::vector<double> highest = {static_cast<double>(r)};
    g.cp->max_inplace(highest);
    EXPECT_EQ(highest[0], r % t + (c - 1) * t) << what;
    Tensor sum = be->empty({1}, DType::fp32);
    const float mine = static_cast<float>(r);
    be->upload(&mine, sum);
    g.tp->all_reduce(sum);
    EXPECT_EQ(values_of(*be, sum)[0], static_cast<float>(r / t * t * t + t * (t - 1) / 2)) << what;
    g.tp->barrier();
    g.cp->barrier();
  }
}

// A ring step around the CP group (and the TP group): each rank's own values reach the next.
TEST(MpiGroups, RingSendRecvMovesEachRanksValuesToTheNext) {
  auto be = make_cpu_backend();
  const int r = g_world->rank();
  for (const auto& [t, c] : splits()) {
    ParallelGroups g = make_parallel_groups(*be, t, c);
    for (DType dtype : {DType::bf16, DType::fp32}) {
      const std::string what = name(t, c) + " " + dtype_name(dtype);
      Tensor send = tagged(*be, 3, dtype), recv = be->zeros({3, 4}, dtype);
      const int me = g.cp->rank(), next = (me + 1) % c, prev = (me + c - 1) % c;
      g.cp->send_recv(send, next, recv, prev);
      const int prev_world = r % t + prev * t;
      std::vector<float> want;
      for (int64_t row = 0; row < 3; ++row)
        for (int64_t col = 0; col < 4; ++col) want.push_back(tag(prev_world, row, col));
      EXPECT_EQ(values_of(*be, recv), want) << what;
      EXPECT_EQ(g.cp->stats().send_recv_calls, 1) << what;
      EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, c > 1 ? static_cast<double>(send.bytes()) : 0.0) << what;
      g.cp->reset_stats();
      // The other way round in the TP group: values from the next rank.
      const int tme = g.tp->rank(), tnext = (tme + 1) % t;
      g.tp->send_recv(send, (tme + t - 1) % t, recv, tnext);
      want.clear();
      for (int64_t row = 0; row < 3; ++row)
        for (int64_t col = 0; col < 4; ++col) want.push_back(tag(r / t * t + tnext, row, col));
      EXPECT_EQ(values_of(*be, recv), want) << what;
    }
  }
}

// Exchanges started together (as the ring starts K and V) arrive once each is waited for,
// counted as send_recv: each rank's values reach the next CP rank.
TEST(MpiGroups, StartedRingExchangesArriveAtTheirWait) {
  auto be = make_cpu_backend();
  const int r = g_world->rank();
  for (const auto& [t, c] : splits()) {
    ParallelGroups g = make_parallel_groups(*be, t, c);
    const std::string what = name(t, c);
    const int me = g.cp->rank(), next = (me + 1) % c, prev = (me + c - 1) % c;
    Tensor a = tagged(*be, 3, DType::fp32), b = tagged(*be, 5, DType::bf16);
    PendingExchange first = g.cp->start_send_recv(a, next, be->zeros({3, 4}, DType::fp32), prev);
    PendingExchange second = g.cp->start_send_recv(b, next, be->zeros({5, 4}, DType::bf16), prev);
    EXPECT_TRUE(first.pending() || c == 1) << what;
    const Tensor got_b = second.wait(), got_a = first.wait();
    EXPECT_FALSE(first.pending()) << what;
    const int prev_world = r % t + prev * t;
    for (const auto& [got, rows] : {std::pair{got_a, 3}, std::pair{got_b, 5}}) {
      std::vector<float> want;
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t col = 0; col < 4; ++col) want.push_back(tag(prev_world, row, col));
      EXPECT_EQ(values_of(*be, got), want) << what << " rows " << rows;
    }
    EXPECT_EQ(g.cp->stats().send_recv_calls, 2) << what;
    EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, c > 1 ? static_cast<double>(a.bytes() + b.bytes()) : 0.0) << what;
  }
}

// Rows [j*n, (j+1)*n) of rank i's input land at rows [i*n, (i+1)*n) of rank j's output.
TEST(MpiGroups, AllToAllPermutesRowsExactly) {
  auto be = make_cpu_backend();
  const int r = g_world->rank();
  for (const auto& [t, c] : splits()) {
    ParallelGroups g = make_parallel_groups(*be, t, c);
    for (DType dtype : {DType::bf16, DType::fp32}) {
      const std::string what = name(t, c) + " " + dtype_name(dtype);
      const int64_t n = 2;
      Tensor in = tagged(*be, c * n, dtype), out = be->zeros({c * n, 4}, dtype);
      g.cp->all_to_all(in, out);
      const int me = g.cp->rank();
      std::vector<float> want;
      for (int i = 0; i < c; ++i)  // block i comes from CP rank i, its rows [me*n, (me+1)*n)
        for (int64_t row = 0; row < n; ++row)
          for (int64_t col = 0; col < 4; ++col) want.push_back(tag(r % t + i * t, me * n + row, col));
      EXPECT_EQ(values_of(*be, out), want) << what;
      EXPECT_EQ(g.cp->stats().all_to_all_calls, 1) << what;
      EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, static_cast<double>(c - 1) / c * static_cast<double>(in.bytes()))
          << what;
      g.cp->reset_stats();
    }
  }
}

// The rows CP rank i sends CP rank j in the all-to-all-v test: uneven, some zero, and the last
// rank (of more than one) sends nothing at all.
int64_t rows_between(int c, int i, int j) { return c > 1 && i == c - 1 ? 0 : (i + 2 * j + 2) % 3; }

// Rank i's rows [offset_ij, offset_ij + rows_ij) land, in rank order, at the front of rank j's
// output; one row past the sums is neither sent nor written. Bytes: the rows sent to the
// other ranks, which a padded all-to-all would not count.
TEST(MpiGroups, AllToAllVMovesUnevenRowsExactly) {
  auto be = make_cpu_backend();
  const int r = g_world->rank();
  for (const auto& [t, c] : splits()) {
    ParallelGroups g = make_parallel_groups(*be, t, c);
    const int me = g.cp->rank();
    std::vector<int64_t> send, recv;
    for (int j = 0; j < c; ++j) {
      send.push_back(rows_between(c, me, j));
      recv.push_back(rows_between(c, j, me));
    }
    int64_t sent = 0, received = 0, sent_to_others = 0, largest = 0;
    for (int j = 0; j < c; ++j) {
      sent += send[j];
      received += recv[j];
      if (j != me) sent_to_others += send[j];
      for (int i = 0; i < c; ++i) largest = std::max(largest, rows_between(c, i, j));
    }
    for (DType dtype : {DType::bf16, DType::fp32}) {
      const std::string what = name(t, c) + " " + dtype_name(dtype);
      Tensor in = tagged(*be, sent + 1, dtype), out = be->empty({received + 1, 4}, dtype);
      const std::vector<float> minus(static_cast<size_t>(out.numel()), -1.f);
      be->upload(minus.data(), out);
      g.cp->all_to_all_v(in, send, out, recv);
      std::vector<float> want;
      for (int i = 0; i < c; ++i) {  // from CP rank i: its block for me, after its blocks for ranks < me
        int64_t offset = 0;
        for (int j = 0; j < me; ++j) offset += rows_between(c, i, j);
        for (int64_t row = 0; row < recv[i]; ++row)
          for (int64_t col = 0; col < 4; ++col) want.push_back(tag(r % t + i * t, offset + row, col));
      }
      want.insert(want.end(), 4, -1.f);
      EXPECT_EQ(values_of(*be, out), want) << what;
      EXPECT_EQ(g.cp->stats().all_to_all_v_calls, 1) << what;
      const double bytes = static_cast<double>(sent_to_others * 4 * static_cast<int64_t>(dtype_size(dtype)));
      EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, bytes) << what;
      if (c > 1) {  // every block padded to the largest: (c-1)/c of c such blocks
        EXPECT_NE(bytes, static_cast<double>((c - 1) * largest * 4 * static_cast<int64_t>(dtype_size(dtype)))) << what;
      }
      g.cp->reset_stats();
    }
  }
}

// On the meta backend the groups count what would move and move nothing.
TEST(MpiGroups, MetaTensorsAreCountedOnly) {
  auto be = make_meta_backend();
  for (const auto& [t, c] : splits()) {
    ParallelGroups g = make_parallel_groups(*be, t, c);
    Tensor a = be->empty({4 * c, 8}, DType::bf16), b = be->empty({4 * c, 8}, DType::bf16);
    g.cp->send_recv(a, (g.cp->rank() + 1) % c, b, (g.cp->rank() + c - 1) % c);
    g.cp->all_to_all(a, b);
    const double bytes = static_cast<double>(a.bytes());
    EXPECT_DOUBLE_EQ(g.cp->stats().ring_bytes, c > 1 ? bytes + (c - 1.0) / c * bytes : 0.0) << name(t, c);
  }
}

// Every rank sees the same world size, so every rank refuses alike (nobody waits for a peer).
TEST(MpiGroups, ASplitThatDoesNotFitTheWorldIsRefused) {
  auto be = make_cpu_backend();
  const int n = g_world->size();
  auto message = [&](int t, int c) {
    try {
      make_parallel_groups(*be, t, c);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(n, 2), "parallel groups: tensor-parallel size " + std::to_string(n) + " x context-parallel size 2 is " +
                               std::to_string(2 * n) + " ranks, but the MPI world has " + std::to_string(n));
  EXPECT_EQ(message(0, n), "parallel groups: the tensor-parallel size (0) and the context-parallel size (" +
                               std::to_string(n) + ") must be >= 1");
  EXPECT_EQ(message(1, -1), "parallel groups: the tensor-parallel size (1) and the context-parallel size (-1) must be >= 1");
  g_world->barrier();  // all ranks are still in step
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = make_mpi_communicator();
  g_world = world.get();
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
