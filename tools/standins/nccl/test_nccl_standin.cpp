// The NCCL stand-in under mpirun (-np 2 and 4): every collective against expected values
// computed here from each rank's known inputs, in place and out of place, plus the argument
// checks. Every rank runs every test in the same order (the collectives must match up), so
// checks use EXPECT, never an early return before a collective.
#include <gtest/gtest.h>
#include <nccl.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tools/standins/common/half_bits.hpp"

namespace {

using namespace actbench::standin;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A communicator over the world; `reversed` gives world rank w the NCCL rank n-1-w, so tests
// see that NCCL ranks, not MPI ranks, order the data.
ncclComm_t make_comm(bool reversed = false) {
  ncclUniqueId id{};
  if (world_rank() == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  const int rank = reversed ? world_size() - 1 - world_rank() : world_rank();
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, world_size(), id, rank), ncclSuccess);
  return comm;
}

// Results must be bit-identical on every rank.
void expect_same_on_all_ranks(const void* data, size_t bytes) {
  std::vector<uint8_t> all(bytes * static_cast<size_t>(world_size()));
  MPI_Allgather(data, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD);
  for (int r = 1; r < world_size(); ++r)
    EXPECT_EQ(std::memcmp(all.data(), all.data() + r * bytes, bytes), 0) << "rank " << r << " differs from rank 0";
}

TEST(NcclStandin, InitQueriesAndVersion) {
  ncclComm_t comm = make_comm(true);
  int count = 0, rank = -1, version = 0;
  EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
  EXPECT_EQ(count, world_size());
  EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
  EXPECT_EQ(rank, world_size() - 1 - world_rank());
  EXPECT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclStandin, AllReduceSumFp32OutOfPlaceAndInPlace) {
  ncclComm_t comm = make_comm();
  const int n = world_size(), r = world_rank();
  const size_t count = 1001;
  std::vector<float> send(count), recv(count, -1.f);
  for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>((r + 1) * static_cast<int>(i % 13)) - 0.25f * i;
  EXPECT_EQ(ncclAllReduce(send.data(), recv.data(), count, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  for (size_t i = 0; i < count; ++i) {
    // Sum over ranks q of (q+1)*(i%13) - i/4: exact in fp32 at these magnitudes.
    const float want = static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 13)) - 0.25f * i * n;
    EXPECT_EQ(recv[i], want) << i;
  }
  std::vector<float> buf = send;
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), count, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(buf, recv);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclStandin, AllReduce16BitExactAndRandomWithinRounding) {
  ncclComm_t comm = make_comm();
  const int n = world_size(), r = world_rank();
  const size_t count = 257;
  for (ncclDataType_t t : {ncclBfloat16, ncclFloat16}) {
    auto enc = [t](float v) { return t == ncclBfloat16 ? float_to_bf16(v) : float_to_fp16(v); };
    auto dec = [t](uint16_t h) { return t == ncclBfloat16 ? bf16_to_float(h) : fp16_to_float(h); };
    // Small integers: every partial sum is exact, so the result is too.
    std::vector<uint16_t> send(count), recv(count);
    for (size_t i = 0; i < count; ++i) send[i] = enc(static_cast<float>((r + 1) * static_cast<int>(i % 5)));
    EXPECT_EQ(ncclAllReduce(send.data(), recv.data(), count, t, ncclSum, comm, nullptr), ncclSuccess);
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(dec(recv[i]), static_cast<float>(n * (n + 1) / 2 * (i % 5))) << i;
    // Non-representable sums: within one rounding per step of the float64 sum of the inputs.
    std::vector<uint16_t> inputs_all(count * static_cast<size_t>(n));
    for (size_t i = 0; i < count; ++i) send[i] = enc(std::sin(0.37f * i + 1.3f * r) * 3.f);
    MPI_Allgather(send.data(), static_cast<int>(count * 2), MPI_BYTE, inputs_all.data(), static_cast<int>(count * 2),
                  MPI_BYTE, MPI_COMM_WORLD);
    EXPECT_EQ(ncclAllReduce(send.data(), send.data(), count, t, ncclSum, comm, nullptr), ncclSuccess);  // in place
    const double eps = t == ncclBfloat16 ? 1.0 / 256 : 1.0 / 2048;
    for (size_t i = 0; i < count; ++i) {
      double ref = 0, mag = 0;
      for (int q = 0; q < n; ++q) {
        ref += dec(inputs_all[q * count + i]);
        mag += std::fabs(dec(inputs_all[q * count + i]));
      }
      EXPECT_NEAR(dec(send[i]), ref, 1e-6 + n * mag * eps) << i;
    }
    expect_same_on_all_ranks(send.data(), count * 2);
  }
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclStandin, AllReduceOtherOps) {
  ncclComm_t comm = make_comm();
  const int n = world_size(), r = world_rank();
  std::vector<int32_t> ints = {r + 1, -(r + 1), 2};
  std::vector<int32_t> out(3);
  EXPECT_EQ(ncclAllReduce(ints.data(), out.data(), 3, ncclInt32, ncclMax, comm, nullptr), ncclSuccess);
  EXPECT_EQ(out, (std::vector<int32_t>{n, -1, 2}));
  EXPECT_EQ(ncclAllReduce(ints.data(), out.data(), 3, ncclInt32, ncclMin, comm, nullptr), ncclSuccess);
  EXPECT_EQ(out, (std::vector<int32_t>{1, -n, 2}));
  EXPECT_EQ(ncclAllReduce(ints.data(), out.data(), 3, ncclInt32, ncclProd, comm, nullptr), ncclSuccess);
  EXPECT_EQ(out[2], 1 << n);
  std::vector<float> f = {static_cast<float>(r)}, favg(1);
  EXPECT_EQ(ncclAllReduce(f.data(), favg.data(), 1, ncclFloat32, ncclAvg, comm, nullptr), ncclSuccess);
  EXPECT_FLOAT_EQ(favg[0], (n - 1) / 2.f);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclStandin, AllGatherOrdersByNcclRankAndWorksInPlace) {
  ncclComm_t comm = make_comm(true);
  const int n = world_size(), nccl_rank = n - 1 - world_rank();
  const size_t count = 37;
  std::vector<float> send(count), recv(count * n, -1.f);
  for (size_t i = 0; i < count; ++i) send[i] = nccl_rank * 100.f + i;
  EXPECT_EQ(ncclAllGather(send.data(), recv.data(), count, ncclFloat32, comm, nullptr), ncclSuccess);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(recv[q * count + i], q * 100.f + i) << q << "," << i;
  // In place: the input is this rank's slot of the output buffer (bytes as ncclUint8).
  std::vector<uint8_t> buf(count * n, 0xee);
  for (size_t i = 0; i < count; ++i) buf[nccl_rank * count + i] = static_cast<uint8_t>(nccl_rank * 50 + i);
  EXPECT_EQ(ncclAllGather(buf.data() + nccl_rank * count, buf.data(), count, ncclUint8, comm, nullptr), ncclSuccess);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(buf[q * count + i], static_cast<uint8_t>(q * 50 + i));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclStandin, ReduceScatterOutOfPlaceAndInPlace) {
  ncclComm_t comm = make_comm(true);
  const int n = world_size(), nccl_rank = n - 1 - world_rank();
  const size_t recvcount = 19;
  // NCCL rank q contributes q * 1000 + j at element j of the full [n * recvcount] input.
  std::vector<float> send(recvcount * n), recv(recvcount, -1.f);
  for (size_t j = 0; j < send.size(); ++j) send[j] = nccl_rank * 1000.f + j;
  auto want = [&](size_t i) {  // block nccl_rank, element i, summed over ranks
    return n * (n - 1) / 2 * 1000.f + n * static_cast<float>(nccl_rank * recvcount + i);
  };
  EXPECT_EQ(ncclReduceScatter(send.data(), recv.data(), recvcount, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  for (size_t i = 0; i < recvcount; ++i) EXPECT_EQ(recv[i], want(i)) << i;
  // In place: the output is this rank's block of the input buffer; other blocks stay inputs.
  std::vector<float> buf = send;
  EXPECT_EQ(ncclReduceScatter(buf.data(), buf.data() + nccl_rank * recvcount, recvcount, ncclFloat32, ncclSum, comm,
                              nullptr),
            ncclSuccess);
  for (size_t i = 0; i < recvcount; ++i) EXPECT_EQ(buf[nccl_rank * recvcount + i], want(i)) << i;
  // bf16 with small integers (exact): rank q holds q + 1 everywhere.
  std::vector<uint16_t> hs(recvcount * n, float_to_bf16(nccl_rank + 1.f)), hr(recvcount);
  EXPECT_EQ(ncclReduceScatter(hs.data(), hr.data(), recvcount, ncclBfloat16, ncclSum, comm, nullptr), ncclSuccess);
  for (uint16_t h : hr) EXPECT_EQ(bf16_to_float(h), n * (n + 1) / 2.f);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclStandin, GroupCallsNestAndCountZeroIsANoOp) {
  ncclComm_t comm = make_comm();
  std::vector<float> a(4, 1.f), b(4, 2.f);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(a.data(), a.data(), 4, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(b.data(), b.data(), 4, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(a[3], static_cast<float>(world_size()));
  EXPECT_EQ(b[0], 2.f * world_size());
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // unbalanced
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// A ring step as context parallelism uses it: every rank sends to the next and receives from
// the previous inside one group (posted together, so nobody waits for a peer's receive).
TEST(NcclStandin, SendRecvRingInAGroupOrdersByNcclRank) {
  ncclComm_t comm = make_comm(true);
  const int n = world_size(), me = n - 1 - world_rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const size_t count = 41;
  std::vector<float> send(count), recv(count, -1.f);
  for (size_t i = 0; i < count; ++i) send[i] = me * 1000.f + i;
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(send.data(), count, ncclFloat32, next, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclRecv(recv.data(), count, ncclFloat32, prev, comm, nullptr), ncclSuccess);
  EXPECT_EQ(recv[0], -1.f);  // nothing moves before the group ends
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  for (size_t i = 0; i < count; ++i) EXPECT_EQ(recv[i], prev * 1000.f + i) << i;
  // bf16 the other way round, and a send to itself in the same group.
  std::vector<uint16_t> hs(count), hr(count), self_in(3, float_to_bf16(me + 0.5f)), self_out(3);
  for (size_t i = 0; i < count; ++i) hs[i] = float_to_bf16(static_cast<float>(me * 64 + static_cast<int>(i % 64)));
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclRecv(hr.data(), count, ncclBfloat16, next, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclSend(self_in.data(), 3, ncclBfloat16, me, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclSend(hs.data(), count, ncclBfloat16, prev, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclRecv(self_out.data(), 3, ncclBfloat16, me, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  for (size_t i = 0; i < count; ++i) EXPECT_EQ(bf16_to_float(hr[i]), static_cast<float>(next * 64 + static_cast<int>(i % 64)));
  EXPECT_EQ(self_out, self_in);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// All-to-all as grouped sends and receives, one pair per peer: block j of rank q's input
// lands in block q of rank j's output.
TEST(NcclStandin, AllToAllAsGroupedSendRecv) {
  ncclComm_t comm = make_comm(true);
  const int n = world_size(), me = n - 1 - world_rank();
  const size_t block = 5;
  std::vector<float> in(block * n), out(block * n, -1.f);
  for (size_t k = 0; k < in.size(); ++k) in[k] = me * 100.f + k;
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(ncclSend(in.data() + j * block, block, ncclFloat32, j, comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclRecv(out.data() + j * block, block, ncclFloat32, j, comm, nullptr), ncclSuccess);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < block; ++i) EXPECT_EQ(out[q * block + i], q * 100.f + me * block + i) << q << "," << i;
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Outside a group a lone send or receive runs at once: to itself it completes alone.
TEST(NcclStandin, LoneSendRecvAndZeroCount) {
  ncclComm_t comm = make_comm();
  const int me = world_rank(), n = world_size();
  // Pairs (0,1), (2,3): the even rank sends first, the odd one receives first (as NCCL allows).
  std::vector<int32_t> a = {me, me * 2}, b(2, -1);
  if (n % 2 == 0) {
    const int peer = me ^ 1;
    if (me % 2 == 0) {
      EXPECT_EQ(ncclSend(a.data(), 2, ncclInt32, peer, comm, nullptr), ncclSuccess);
      EXPECT_EQ(ncclRecv(b.data(), 2, ncclInt32, peer, comm, nullptr), ncclSuccess);
    } else {
      EXPECT_EQ(ncclRecv(b.data(), 2, ncclInt32, peer, comm, nullptr), ncclSuccess);
      EXPECT_EQ(ncclSend(a.data(), 2, ncclInt32, peer, comm, nullptr), ncclSuccess);
    }
    EXPECT_EQ(b, (std::vector<int32_t>{peer, peer * 2}));
  }
  EXPECT_EQ(ncclSend(nullptr, 0, ncclFloat32, 0, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclRecv(nullptr, 0, ncclFloat32, 0, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Megatron's rank order on 4 ranks (t = 2): tensor-parallel groups {0,1},{2,3} (color r / 2),
// context-parallel groups {0,2},{1,3} (color r % 2); a key reverses the order inside a group.
TEST(NcclStandin, CommSplitMakesGroupsOrderedByKey) {
  ncclComm_t world = make_comm();
  const int n = world_size(), me = world_rank();
  ncclComm_t odd_even = nullptr;
  EXPECT_EQ(ncclCommSplit(world, me % 2, -me, &odd_even, nullptr), ncclSuccess);
  ASSERT_NE(odd_even, nullptr);
  int count = 0, rank = -1;
  EXPECT_EQ(ncclCommCount(odd_even, &count), ncclSuccess);
  EXPECT_EQ(ncclCommUserRank(odd_even, &rank), ncclSuccess);
  const int members = (n - me % 2 + 1) / 2;  // ranks with my parity
  EXPECT_EQ(count, members);
  EXPECT_EQ(rank, members - 1 - me / 2);  // reversed by the key
  // A collective inside the group sums its members only; an all-gather orders by group rank.
  int32_t sum = me, gathered[4] = {-1, -1, -1, -1};
  EXPECT_EQ(ncclAllReduce(&sum, &sum, 1, ncclInt32, ncclSum, odd_even, nullptr), ncclSuccess);
  int32_t want = 0;
  for (int q = me % 2; q < n; q += 2) want += q;
  EXPECT_EQ(sum, want);
  EXPECT_EQ(ncclAllGather(&me, gathered, 1, ncclInt32, odd_even, nullptr), ncclSuccess);
  for (int g = 0; g < members; ++g) EXPECT_EQ(gathered[g], me % 2 + 2 * (members - 1 - g)) << g;
  // A ring inside the group, by group rank.
  float mine = static_cast<float>(me), got = -1.f;
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(&mine, 1, ncclFloat32, (rank + 1) % count, odd_even, nullptr), ncclSuccess);
  EXPECT_EQ(ncclRecv(&got, 1, ncclFloat32, (rank + count - 1) % count, odd_even, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  const int prev_group_rank = (rank + count - 1) % count;
  EXPECT_EQ(got, static_cast<float>(me % 2 + 2 * (members - 1 - prev_group_rank)));
  // NCCL_SPLIT_NOCOLOR: rank 0 stays out and gets no communicator.
  ncclComm_t rest = reinterpret_cast<ncclComm_t>(&sum);
  EXPECT_EQ(ncclCommSplit(world, me == 0 ? NCCL_SPLIT_NOCOLOR : 0, 0, &rest, nullptr), ncclSuccess);
  if (me == 0) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_NE(rest, nullptr);
    EXPECT_EQ(ncclCommCount(rest, &count), ncclSuccess);
    EXPECT_EQ(count, n - 1);
    EXPECT_EQ(ncclCommDestroy(rest), ncclSuccess);
  }
  ncclComm_t bad = nullptr;
  EXPECT_EQ(ncclCommSplit(world, -5, 0, &bad, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommSplit(nullptr, 0, 0, &bad, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(odd_even), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(world), ncclSuccess);
}

TEST(NcclStandin, SendRecvRejectsBadPeersAndShortMessages) {
  ncclComm_t comm = make_comm();
  const int n = world_size(), me = world_rank();
  float x[4] = {1.f, 2.f, 3.f, 4.f}, y[4] = {};
  EXPECT_EQ(ncclSend(x, 1, ncclFloat32, n, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclRecv(y, 1, ncclFloat32, -1, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(nullptr, 1, ncclFloat32, 0, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclRecv(y, 1, ncclNumTypes, 0, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("ncclRecv"), std::string::npos);
  // Every rank sends 2 floats around the ring but expects 4: reported, not a hang.
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(x, 2, ncclFloat32, (me + 1) % n, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclRecv(y, 4, ncclFloat32, (me + n - 1) % n, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("expected 16 bytes"), std::string::npos);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclStandin, RejectsBadArguments) {
  ncclComm_t comm = make_comm();
  float x = 1.f, y = 0.f;
  EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclNumTypes, ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclNumOps, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, &y, 1, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllGather(&x, nullptr, 1, ncclFloat32, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclReduceScatter(&x, &y, 1, ncclFloat8e4m3, ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommGetAsyncError(nullptr, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("ncclReduceScatter"), std::string::npos);
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidUsage), "invalid usage");
  EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidUsage);  // finalized
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);

  ncclUniqueId id{};
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t bad = nullptr;
  EXPECT_EQ(ncclCommInitRank(&bad, world_size(), id, world_size()), ncclInvalidArgument);  // rank out of range
  EXPECT_EQ(ncclCommInitRank(&bad, world_size() + 1, id, 0), ncclInvalidUsage);           // not the world size
  ncclUniqueId forged{};
  EXPECT_EQ(ncclCommInitRank(&bad, world_size(), forged, world_rank()), ncclInvalidArgument);
  // Each rank's own id (not broadcast): all ranks fail together instead of hanging.
  EXPECT_EQ(ncclCommInitRank(&bad, world_size(), id, world_rank()), world_size() > 1 ? ncclInvalidUsage : ncclSuccess);
  if (world_size() == 1) ncclCommDestroy(bad);
  // Two ranks claiming the same rank.
  ncclUniqueId shared{};
  if (world_rank() == 0) ncclGetUniqueId(&shared);
  MPI_Bcast(&shared, sizeof shared, MPI_BYTE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(ncclCommInitRank(&bad, world_size(), shared, 0), world_size() > 1 ? ncclInvalidUsage : ncclSuccess);
  if (world_size() == 1) ncclCommDestroy(bad);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Only rank 0 prints the gtest log; every rank's failures still fail the run.
  if (world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "rank %d: tests failed\n", world_rank());
  MPI_Finalize();
  return any;
}
