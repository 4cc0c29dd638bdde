// send_recv, all_to_all and all_to_all_v on the single-process communicators: local (one rank) and emulated
// (rank 0 of 4), each in runtime/'s flavour (memcpy) and the backend's (Backend::copy, timed
// in the emulated window): values moved, bytes counted per rank, meta tensors counted only,
// and the one-line refusals. The real exchanges are in test_mpi_groups.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/backend_comm.hpp"
#include "runtime/error.hpp"

using namespace actbench;

namespace {

struct Flavour {
  std::string name;
  int size;  // 1: local, else emulated
  std::function<std::unique_ptr<Communicator>(Backend&)> make;
};

void PrintTo(const Flavour& f, std::ostream* os) { *os << f.name; }

std::vector<Flavour> flavours() {
  return {
      {"runtime_local", 1, [](Backend&) { return make_local_communicator(); }},
      {"runtime_emulated", 4, [](Backend&) { return make_emulated_communicator(4); }},
      {"backend_local", 1, [](Backend& be) { return make_backend_local_communicator(be); }},
      {"backend_emulated", 4, [](Backend& be) { return make_backend_emulated_communicator(be, 4); }},
  };
}

std::vector<float> iota(int64_t n, float first) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = first + static_cast<float>(i);
  return v;
}

Tensor filled(Backend& be, const Shape& shape, DType dtype, const std::vector<float>& values) {
  Tensor t = be.empty(shape, dtype);
  be.upload(values.data(), t);
  return t;
}

std::vector<float> values_of(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(t, v.data());
  return v;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

class CommCopies : public ::testing::TestWithParam<Flavour> {};

// A ring step of rank 0: to rank 1, from rank n-1 (from and to itself when alone). Every peer
// holds the same data, so what arrives is what was sent; the bytes sent count, except to itself.
TEST_P(CommCopies, SendRecvMovesTheValuesAndCountsTheBytesSent) {
  const Flavour& f = GetParam();
  auto be = make_cpu_backend();
  auto comm = f.make(*be);
  ASSERT_EQ(comm->size(), f.size);
  for (DType dtype : {DType::bf16, DType::fp32}) {
    comm->reset_stats();
    const std::vector<float> want = iota(6, -2.f);
    Tensor send = filled(*be, {2, 3}, dtype, want);
    Tensor recv = filled(*be, {6}, dtype, std::vector<float>(6, 99.f));  // same numel, any shape
    const int dst = f.size > 1 ? 1 : 0, src = f.size - 1;
    comm->send_recv(send, dst, recv, src);
    EXPECT_EQ(values_of(*be, recv), want);
    EXPECT_EQ(comm->stats().send_recv_calls, 1);
    EXPECT_DOUBLE_EQ(comm->stats().ring_bytes, f.size > 1 ? 6.0 * dtype_size(dtype) : 0.0);
    // A self exchange is a copy and sends nothing.
    Tensor again = be->zeros({3, 2}, dtype);
    comm->send_recv(send, 0, again, 0);
    EXPECT_EQ(values_of(*be, again), want);
    EXPECT_EQ(comm->stats().send_recv_calls, 2);
    EXPECT_DOUBLE_EQ(comm->stats().ring_bytes, f.size > 1 ? 6.0 * dtype_size(dtype) : 0.0);
    EXPECT_EQ(comm->stats().all_reduce_calls + comm->stats().all_gather_calls + comm->stats().all_to_all_calls, 0);
  }
}

// Started, the exchange is the same send_recv (these communicators copy at once): counted
// alike, the values there after wait(), which hands back the receiving tensor; its refusals
// are send_recv's.
TEST_P(CommCopies, AStartedSendRecvIsTheSameExchange) {
  const Flavour& f = GetParam();
  auto be = make_cpu_backend();
  auto comm = f.make(*be);
  const std::vector<float> want = iota(6, 3.f);
  Tensor send = filled(*be, {2, 3}, DType::fp32, want), recv = be->zeros({2, 3}, DType::fp32);
  PendingExchange x = comm->start_send_recv(send, f.size > 1 ? 1 : 0, recv, f.size - 1);
  const Tensor got = x.wait();
  EXPECT_EQ(got.data(), recv.data());
  EXPECT_EQ(values_of(*be, got), want);
  EXPECT_FALSE(x.pending());
  EXPECT_EQ(comm->stats().send_recv_calls, 1);
  EXPECT_DOUBLE_EQ(comm->stats().ring_bytes, f.size > 1 ? 6.0 * 4 : 0.0);
  EXPECT_EQ(message_of([&] { comm->start_send_recv(send, f.size, recv, 0); }),
            "send_recv: dst " + std::to_string(f.size) + " is not a rank of this group of " + std::to_string(f.size));
}

TEST_P(CommCopies, AllToAllMovesTheValuesAndCountsNMinus1OverN) {
  const Flavour& f = GetParam();
  auto be = make_cpu_backend();
  auto comm = f.make(*be);
  for (DType dtype : {DType::bf16, DType::fp32}) {
    comm->reset_stats();
    const int64_t rows = 2 * f.size;
    const std::vector<float> want = iota(rows * 3, 1.f);
    Tensor in = filled(*be, {rows, 3}, dtype, want);
    Tensor out = be->zeros({rows, 3}, dtype);
    comm->all_to_all(in, out);
    EXPECT_EQ(values_of(*be, out), want);
    EXPECT_EQ(comm->stats().all_to_all_calls, 1);
    EXPECT_DOUBLE_EQ(comm->stats().ring_bytes,
                     static_cast<double>(f.size - 1) / f.size * static_cast<double>(rows * 3 * dtype_size(dtype)));
  }
}

// Uneven rows per peer: rank 0's own block (at its send offset) lands in every received block
// as far as each count takes it (a peer holds rank 0's data), rows past the sums stay as they
// are, and the bytes are the rows sent to the other ranks, not a padded all-to-all's.
TEST_P(CommCopies, AllToAllVCopiesTheOwnBlockAndCountsTheRowsSentToOthers) {
  const Flavour& f = GetParam();
  auto be = make_cpu_backend();
  auto comm = f.make(*be);
  const int64_t width = 3;
  // Alone: 3 rows to itself. Rank 0 of 4: 2 to itself, none to rank 1, 3 to rank 2, 1 to rank
  // 3; 2, 1, 0 and 2 rows back (rank 1's count cuts the own block, rank 2 sends nothing).
  const std::vector<int64_t> send = f.size > 1 ? std::vector<int64_t>{2, 0, 3, 1} : std::vector<int64_t>{3};
  const std::vector<int64_t> recv = f.size > 1 ? std::vector<int64_t>{2, 1, 0, 2} : std::vector<int64_t>{3};
  const std::vector<int64_t> want_rows =  // per out row: the in row it holds, -1 untouched
      f.size > 1 ? std::vector<int64_t>{0, 1, 0, 0, 1, -1} : std::vector<int64_t>{0, 1, 2, -1};
  for (DType dtype : {DType::bf16, DType::fp32}) {
    comm->reset_stats();
    const int64_t in_rows = 7;  // one more than the 6 sent: the last is not
    Tensor in = filled(*be, {in_rows, width}, dtype, iota(in_rows * width, 1.f));
    const auto out_rows = static_cast<int64_t>(want_rows.size());
    Tensor out = filled(*be, {out_rows, width}, dtype, std::vector<float>(static_cast<size_t>(out_rows * width), -5.f));
    comm->all_to_all_v(in, send, out, recv);
    std::vector<float> want;
    for (int64_t row : want_rows)
      for (int64_t c = 0; c < width; ++c) want.push_back(row < 0 ? -5.f : 1.f + static_cast<float>(row * width + c));
    EXPECT_EQ(values_of(*be, out), want) << dtype_name(dtype);
    EXPECT_EQ(comm->stats().all_to_all_v_calls, 1);
    EXPECT_EQ(comm->stats().all_to_all_calls, 0);
    const double sent_to_others = f.size > 1 ? 4.0 * width * dtype_size(dtype) : 0.0;  // 0 + 3 + 1 rows
    EXPECT_DOUBLE_EQ(comm->stats().ring_bytes, sent_to_others);
    if (f.size > 1) {  // what an all-to-all padded to the largest block (3 rows) would count
      const double padded = (f.size - 1.0) / f.size * (f.size * 3.0 * width * dtype_size(dtype));
      EXPECT_NE(comm->stats().ring_bytes, padded);
    }
  }
  // A rank that sends nothing moves nothing and counts nothing.
  comm->reset_stats();
  const std::vector<int64_t> none(static_cast<size_t>(f.size), 0);
  Tensor in = be->zeros({0, width}, DType::fp32), out = filled(*be, {2, width}, DType::fp32, iota(2 * width, 0.f));
  std::vector<int64_t> from_peers = none;
  if (f.size > 1) from_peers[1] = 2;
  comm->all_to_all_v(in, none, out, from_peers);
  EXPECT_EQ(values_of(*be, out), iota(2 * width, 0.f));
  EXPECT_EQ(comm->stats().all_to_all_v_calls, 1);
  EXPECT_DOUBLE_EQ(comm->stats().ring_bytes, 0.0);
}

TEST_P(CommCopies, MetaTensorsAreCountedAndMoveNothing) {
  const Flavour& f = GetParam();
  auto be = make_meta_backend();
  auto comm = f.make(*be);
  const int64_t rows = 4 * f.size;
  Tensor a = be->empty({rows, 8}, DType::bf16), b = be->empty({rows, 8}, DType::bf16);
  ASSERT_TRUE(a.is_meta());
  comm->send_recv(a, f.size > 1 ? 1 : 0, b, f.size - 1);
  comm->all_to_all(a, b);
  EXPECT_EQ(comm->stats().send_recv_calls, 1);
  EXPECT_EQ(comm->stats().all_to_all_calls, 1);
  const double bytes = static_cast<double>(rows * 8 * 2);
  EXPECT_DOUBLE_EQ(comm->stats().ring_bytes, f.size > 1 ? bytes + 0.75 * bytes : 0.0);
  std::vector<int64_t> each(static_cast<size_t>(f.size), 3);  // 3 rows to and from every rank
  comm->reset_stats();
  comm->all_to_all_v(a, each, b, each);
  EXPECT_EQ(comm->stats().all_to_all_v_calls, 1);
  EXPECT_DOUBLE_EQ(comm->stats().ring_bytes, (f.size - 1) * 3.0 * 8 * 2);
}

// One line naming the collective and the real problem; nothing counted, nothing moved.
TEST_P(CommCopies, RefusesArgumentsThatDoNotFitTheGroup) {
  const Flavour& f = GetParam();
  const int n = f.size;
  auto be = make_cpu_backend();
  auto comm = f.make(*be);
  Tensor send = filled(*be, {2, 3}, DType::bf16, iota(6, 0.f));
  Tensor recv = be->zeros({6}, DType::bf16);
  const std::string group = " is not a rank of this group of " + std::to_string(n);
  EXPECT_EQ(message_of([&] { comm->send_recv(send, n, recv, 0); }), "send_recv: dst " + std::to_string(n) + group);
  EXPECT_EQ(message_of([&] { comm->send_recv(send, 0, recv, -1); }), "send_recv: src -1" + group);
  Tensor five = be->zeros({5}, DType::bf16), wide = be->zeros({6}, DType::fp32);
  EXPECT_EQ(message_of([&] { comm->send_recv(send, 0, five, 0); }),
            "send_recv: send [2, 3] bf16 and recv [5] bf16 differ in element count or dtype");
  EXPECT_EQ(message_of([&] { comm->send_recv(send, 0, wide, 0); }),
            "send_recv: send [2, 3] bf16 and recv [6] fp32 differ in element count or dtype");
  EXPECT_EQ(message_of([&] { comm->send_recv(send, 0, send, 0); }),
            "send_recv: send and recv share memory (use two buffers)");
  if (n > 1) {
    EXPECT_EQ(message_of([&] { comm->send_recv(send, 0, recv, 1); }),
              "send_recv: rank 0 sends to 0 but receives from 1 (a rank that sends to itself must also receive "
              "from itself)");
  }

  Tensor in = filled(*be, {4 * n, 2}, DType::fp32, iota(8 * n, 0.f));
  Tensor out_shape = be->zeros({2 * n, 4}, DType::fp32), out_type = be->zeros({4 * n, 2}, DType::bf16);
  const std::string in_str = shape_str(in.shape());
  EXPECT_EQ(message_of([&] { comm->all_to_all(in, out_shape); }),
            "all_to_all: in " + in_str + " fp32 and out " + shape_str(out_shape.shape()) +
                " fp32 differ in shape or dtype (or have no dim 0)");
  EXPECT_EQ(message_of([&] { comm->all_to_all(in, out_type); }),
            "all_to_all: in " + in_str + " fp32 and out " + in_str + " bf16 differ in shape or dtype (or have no dim 0)");
  EXPECT_EQ(message_of([&] { comm->all_to_all(in, in); }), "all_to_all: in and out share memory (use two buffers)");
  // Halves of one buffer do not overlap: accepted.
  Tensor both = be->zeros({8 * n, 2}, DType::fp32);
  EXPECT_EQ(message_of([&] { comm->all_to_all(both.rows(0, 4 * n), both.rows(4 * n, 8 * n)); }), "no error");
  if (n > 1) {
    Tensor odd = be->zeros({4 * n + 1, 2}, DType::fp32), odd_out = be->zeros({4 * n + 1, 2}, DType::fp32);
    EXPECT_EQ(message_of([&] { comm->all_to_all(odd, odd_out); }),
              "all_to_all: dim 0 of " + shape_str(odd.shape()) + " is not divisible by the group size " +
                  std::to_string(n));
  }
  EXPECT_EQ(values_of(*be, recv), std::vector<float>(6, 0.f));
  EXPECT_EQ(comm->stats().send_recv_calls, 0);
  EXPECT_EQ(comm->stats().all_to_all_calls, 1);  // the accepted one
}

// all_to_all_v: one line per misfit (counts per rank, row shape, sums, the self block,
// shared memory); nothing counted, nothing moved.
TEST_P(CommCopies, AllToAllVRefusesCountsThatDoNotFit) {
  const Flavour& f = GetParam();
  const int n = f.size;
  auto be = make_cpu_backend();
  auto comm = f.make(*be);
  Tensor in = filled(*be, {6, 2}, DType::fp32, iota(12, 1.f)), out = be->zeros({6, 2}, DType::fp32);
  std::vector<int64_t> ok(static_cast<size_t>(n), 0);
  ok[0] = 2;
  const std::string op = "all_to_all_v: ";
  const std::string group = std::to_string(n) + " receive counts for a group of " + std::to_string(n);
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, {2, 0, 0, 0, 0}, out, ok); }),
            op + "5 send and " + group + " (one per rank)");
  Tensor narrow = be->zeros({6, 1}, DType::fp32), half = be->zeros({6, 2}, DType::bf16);
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, ok, narrow, ok); }),
            op + "in [6, 2] fp32 and out [6, 1] fp32 differ in row shape or dtype (or have no dim 0)");
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, ok, half, ok); }),
            op + "in [6, 2] fp32 and out [6, 2] bf16 differ in row shape or dtype (or have no dim 0)");
  std::vector<int64_t> many = ok, negative = ok;
  many[0] = 7;
  negative[static_cast<size_t>(n - 1)] = -1;
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, many, out, ok); }),
            op + "send rows " + (n > 1 ? "{7, 0, 0, 0}" : "{7}") + " sum to 7, more than in's 6");
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, ok, out.rows(0, 1), ok); }),
            op + "receive rows " + (n > 1 ? "{2, 0, 0, 0}" : "{2}") + " sum to 2, more than out's 1");
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, ok, out, negative); }),
            op + "receive rows " + (n > 1 ? "{2, 0, 0, -1}" : "{-1}") + " include a negative count");
  std::vector<int64_t> self = ok;
  self[0] = 1;
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, ok, out, self); }),
            op + "rank 0 sends itself 2 rows but receives 1 from itself");
  EXPECT_EQ(message_of([&] { comm->all_to_all_v(in, ok, in.rows(1, 6), ok); }),
            op + "in and out share memory (use two buffers)");
  EXPECT_EQ(values_of(*be, out), std::vector<float>(12, 0.f));
  EXPECT_EQ(comm->stats().all_to_all_v_calls, 0);
}

INSTANTIATE_TEST_SUITE_P(Communicators, CommCopies, ::testing::ValuesIn(flavours()),
                         [](const auto& param_info) { return param_info.param.name; });

// The backend's emulated copies are timed in the open window like its other collectives.
TEST(CommCopies, BackendEmulatedTimesItsExchangesInTheOpenWindow) {
  auto be = make_cpu_backend();
  auto comm = make_backend_emulated_communicator(*be, 2);
  Tensor a = be->zeros({4, 2}, DType::fp32), b = be->zeros({4, 2}, DType::fp32);
  comm->send_recv(a, 1, b, 1);  // before any window: not timed
  EXPECT_TRUE(comm->take_emulated_ms().empty());
  comm->open_emulated_window();
  comm->send_recv(a, 1, b, 1);
  comm->open_emulated_window();
  comm->all_to_all(a, b);
  comm->open_emulated_window();
  comm->all_to_all_v(a, {2, 2}, b, {2, 1});
  const std::vector<double> ms = comm->take_emulated_ms();
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_GE(ms[0], 0.0);
  EXPECT_GE(ms[1], 0.0);
  EXPECT_GE(ms[2], 0.0);
}
