// Memory-traffic bounds of the kernels that selective and full recompute re-run, and of their
// backward twins, judged by the simulator's counters (cudasim/counters.hpp) at the per-rank
// launch geometry of the paper's 22B model (s = 2048, b = 4, h = 6144, a = 64, t = 8: head size
// 96, 8 heads and an MLP width of 3072 per rank) and of llama3-8b (h = 4096, head size 128,
// MLP width 14336 / 8) for the llama kernels, in bf16.
//
// "Geometry" means what decides a warp's addresses: the row length, the head layout, the block
// size and the work per thread. The row count is cut (a few hundred rows, one head's 2048 score
// rows) so that one op runs in about a second on the simulator; every row of a kernel moves the
// same bytes at any row count, so the ratios below are those of the full shape. Each op must:
//   - move at most kMaxBytesRatio x its minimum bytes: bytes moved = global sectors x 32
//     (loads + stores; what the L1 is asked for, no cache assumed), minimum = every input
//     element the op needs read once and every output element written once;
//   - waste no sector bandwidth: per kernel and direction, sectors x 32 <= kMaxSectorWaste x
//     the bytes its lanes asked for (the ideal sectors per request: 4 for a warp's 128
//     contiguous bytes, 16 for 512);
//   - use wide accesses: at least kMinBytesPerRequest bytes per global request on average, so
//     that the request count does not bound the kernel (16-byte lanes where rows allow).
// A failure prints each launch's counts per source line. ACTBENCH_BOUNDS_TABLE=FILE appends one
// row per op to FILE (the table of docs/kernel_efficiency.md).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cudasim/counters.hpp"
#include "cudasim/sim.hpp"
#include "dropout_specs.hpp"
#include "tests/counting_test.hpp"
#include "kernels/backend.hpp"
#include "kernels/cuda/cuda_ops.hpp"

using namespace actbench;
using namespace actbench::testing;
using cudasim::LaunchCounts;

namespace {

constexpr double kMaxBytesRatio = 1.05;
constexpr double kMaxSectorWaste = 1.05;
constexpr double kMinBytesPerRequest = 256;

// The 22B model's per-rank shape (theory/model_table.cpp), t = 8.
constexpr int64_t kSeq = 2048, kBatch = 4, kHidden = 6144, kHeads = 64, kTp = 8;
constexpr int64_t kHeadDim = kHidden / kHeads;          // 96
constexpr int64_t kHeadsPerRank = kHeads / kTp;         // 8
constexpr int64_t kFfnPerRank = 4 * kHidden / kTp;      // 3072
// llama3-8b per rank (t = 8): h = 4096, head size 128, SwiGLU width 14336.
constexpr int64_t kLlamaHidden = 4096, kLlamaHeadDim = 128, kLlamaFfnPerRank = 14336 / kTp;
// Rows of the row kernels in these tests (of s*b = 8192 without SP, 1024 with it).
constexpr int64_t kRows = 256;
constexpr size_t kBf16 = 2;

// A zero-filled device buffer (inputs of zero are valid for every op; addresses do not depend
// on values, except dropout's, which depend on the Philox mask only).
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T = void>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct Direction {
  uint64_t requests = 0, sectors = 0, bytes = 0;
};

std::string describe(const std::vector<LaunchCounts>& launches) {
  std::ostringstream o;
  for (const LaunchCounts& l : launches) {
    o << "  " << (l.function.empty() ? l.kernel : l.function) << " grid " << l.grid.x << "x" << l.grid.y << "x"
      << l.grid.z << " block " << l.block.x << "\n";
    for (const auto& line : l.lines) {
      const auto& c = line.counts;
      o << "    " << line.file << ":" << line.line << "  ld " << c.global_ld_requests << " req " << c.global_ld_sectors
        << " sect " << c.global_ld_bytes << " B   st " << c.global_st_requests << " req " << c.global_st_sectors
        << " sect " << c.global_st_bytes << " B   shared wavefronts " << c.shared_ld_wavefronts + c.shared_st_wavefronts
        << " (conflicts " << c.shared_ld_bank_conflicts + c.shared_st_bank_conflicts << ")\n";
    }
  }
  return o.str();
}

void append_table_row(const std::string& op, const std::vector<LaunchCounts>& launches, uint64_t min_bytes,
                      uint64_t moved, const Direction& ld, const Direction& st) {
  const char* path = std::getenv("ACTBENCH_BOUNDS_TABLE");
  if (!path || !*path) return;
  FILE* f = std::fopen(path, "a");
  if (!f) return;
  std::string kernels;
  for (const LaunchCounts& l : launches) kernels += (kernels.empty() ? "" : " + ") + l.kernel;
  auto per_req = [](const Direction& d) { return d.requests ? double(d.sectors) / double(d.requests) : 0.0; };
  auto bytes_per_req = [](const Direction& d) { return d.requests ? double(d.bytes) / double(d.requests) : 0.0; };
  std::fprintf(f, "| %s | `%s` | %.2f (%.0f B) | %.2f (%.0f B) | %llu | %llu | %.3f |\n", op.c_str(), kernels.c_str(),
               per_req(ld), bytes_per_req(ld), per_req(st), bytes_per_req(st),
               static_cast<unsigned long long>(min_bytes), static_cast<unsigned long long>(moved),
               double(moved) / double(min_bytes));
  std::fclose(f);
}

class KernelBounds : public cudasim_tests::CountingTest {
 protected:

  // Runs `op` (one or more launches), then checks the bounds of the header against
  // `min_bytes`, the least the op must move.
  void expect_bounded(const std::string& op, uint64_t min_bytes, const std::function<void()>& run) {
    cudasim::take_counted_launches();
    run();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudasim::reports_text();
    const std::vector<LaunchCounts> launches = cudasim::take_counted_launches();
    ASSERT_FALSE(launches.empty()) << op << ": no counted launch";
    Direction ld, st;
    for (const LaunchCounts& l : launches) {
      ld.requests += l.total.global_ld_requests;
      ld.sectors += l.total.global_ld_sectors;
      ld.bytes += l.total.global_ld_bytes;
      st.requests += l.total.global_st_requests;
      st.sectors += l.total.global_st_sectors;
      st.bytes += l.total.global_st_bytes;
    }
    const uint64_t moved = (ld.sectors + st.sectors) * 32;
    append_table_row(op, launches, min_bytes, moved, ld, st);
    const std::string detail = describe(launches);
    EXPECT_LE(double(moved), kMaxBytesRatio * double(min_bytes))
        << op << ": moves " << moved << " bytes, " << double(moved) / double(min_bytes) << "x its minimum "
        << min_bytes << "\n" << detail;
    for (const LaunchCounts& l : launches) {
      const auto& c = l.total;
      const std::string name = l.function.empty() ? l.kernel : l.function;
      EXPECT_LE(double(c.global_ld_sectors) * 32, kMaxSectorWaste * double(c.global_ld_bytes))
          << op << ": " << name << " loads " << c.global_ld_bytes << " bytes in " << c.global_ld_sectors
          << " sectors\n" << detail;
      EXPECT_LE(double(c.global_st_sectors) * 32, kMaxSectorWaste * double(c.global_st_bytes))
          << op << ": " << name << " stores " << c.global_st_bytes << " bytes in " << c.global_st_sectors
          << " sectors\n" << detail;
    }
    const Direction all{ld.requests + st.requests, ld.sectors + st.sectors, ld.bytes + st.bytes};
    EXPECT_GE(double(all.bytes), kMinBytesPerRequest * double(all.requests))
        << op << ": " << double(all.bytes) / double(all.requests) << " bytes per global request\n" << detail;
  }
};

// The dropout of the attention probabilities [b, a/t, s, s] (layers/core_attention.cpp) cut to
// one head of one batch: rank 1's first head.
DropoutSpec probs_spec(float p) {
  return make_spec(p, /*outer=*/1, /*mid_local=*/1, /*mid_global=*/kHeads, /*mid_offset=*/kHeadsPerRank,
                   /*inner=*/kSeq * kSeq, /*site=*/2);
}
// The residual dropout of [s*b, h] rows (layers/transformer_layer.cpp), kRows of them.
DropoutSpec residual_spec(float p) {
  return make_spec(p, 1, kRows, kSeq * kBatch, 0, kHidden, 3);
}

// ---- attention: scores, probabilities, heads ---------------------------------------------------

// One head's scores [s, s]: every query position (the diagonal) once.
constexpr int64_t kScoreRows = kSeq, kScoreCols = kSeq;
constexpr uint64_t kLowerTriangle = uint64_t(kSeq) * (kSeq + 1) / 2;

TEST_F(KernelBounds, SoftmaxFwd) {
  Dev scores(kScoreRows * kScoreCols * kBf16), probs(kScoreRows * kScoreCols * kBf16);
  // reads the scores on and below the diagonal, writes every probability (zeros above)
  const uint64_t min = kLowerTriangle * kBf16 + uint64_t(kScoreRows * kScoreCols) * kBf16;
  expect_bounded("softmax fwd", min, [&] {
    cuda::softmax_causal_fwd(DType::bf16, scores.p, probs.p, kScoreRows, kScoreRows, kScoreCols, {}, nullptr);
  });
}

TEST_F(KernelBounds, SoftmaxBwd) {
  Dev dprobs(kScoreRows * kScoreCols * kBf16), probs(kScoreRows * kScoreCols * kBf16),
      dscores(kScoreRows * kScoreCols * kBf16);
  const uint64_t min = 2 * kLowerTriangle * kBf16 + uint64_t(kScoreRows * kScoreCols) * kBf16;
  expect_bounded("softmax bwd", min, [&] {
    cuda::softmax_causal_bwd(DType::bf16, dprobs.p, probs.p, dscores.p, kScoreRows, kScoreRows, kScoreCols, {},
                             nullptr);
  });
}

TEST_F(KernelBounds, DropoutFwdOnProbabilities) {
  const DropoutSpec spec = probs_spec(0.1f);
  const int64_t n = spec.numel();
  Dev x(n * kBf16), y(n * kBf16), mask(n);
  // x read, y and the u8 mask written
  expect_bounded("attention dropout fwd", uint64_t(n) * (2 * kBf16 + 1), [&] {
    cuda::dropout_fwd(DType::bf16, x.p, spec, y.p, mask.as<uint8_t>(), nullptr);
  });
}

TEST_F(KernelBounds, DropoutBwdOnProbabilities) {
  const int64_t n = kSeq * kSeq;
  Dev dy(n * kBf16), mask(n), dx(n * kBf16);
  // every element kept: dy is read in full (a dropped element's dy need not be read)
  ASSERT_EQ(cudaMemset(mask.p, 1, n), cudaSuccess);
  expect_bounded("attention dropout bwd", uint64_t(n) * (2 * kBf16 + 1), [&] {
    cuda::dropout_bwd(DType::bf16, dy.p, mask.as<uint8_t>(), 1.f / 0.9f, dx.p, n, nullptr);
  });
}

// The fused QKV output [s, b, 3h/t] split into q, k and v heads [b, a/t, s, d].
constexpr int64_t kLayoutSeq = 256;
TEST_F(KernelBounds, SplitHeads) {
  const int64_t width = 3 * kHidden / kTp, n = kLayoutSeq * kBatch * kHeadsPerRank * kHeadDim;
  Dev qkv(kLayoutSeq * kBatch * width * kBf16), heads(n * kBf16);
  for (int64_t part = 0; part < 3; ++part)
    expect_bounded("split heads (" + std::string("qkv").substr(part, 1) + ")", uint64_t(n) * 2 * kBf16, [&] {
      cuda::split_heads(DType::bf16, qkv.p, heads.p, kLayoutSeq, kBatch, width, kHeadsPerRank, kHeadDim,
                        part * kHidden / kTp, nullptr);
    });
}

TEST_F(KernelBounds, MergeHeads) {
  const int64_t width = kHidden / kTp, n = kLayoutSeq * kBatch * kHeadsPerRank * kHeadDim;
  Dev heads(n * kBf16), context(kLayoutSeq * kBatch * width * kBf16);
  expect_bounded("merge heads", uint64_t(n) * 2 * kBf16, [&] {
    cuda::merge_heads(DType::bf16, heads.p, context.p, kLayoutSeq, kBatch, width, kHeadsPerRank, kHeadDim, 0,
                      nullptr);
  });
}

// ---- fused attention on tensor cores (attention_tc.cu) -----------------------------------------

// The bf16 forward at the head sizes it is instantiated for (96: the 22B model's; 128:
// llama's), two heads of a 512-token causal attention (the cut keeps a test run short; every
// query tile moves what it would at s = 2048). Its least traffic is that of its tiling: q read
// and out written once, lse written once, and each 64-row query tile reading K and V up to
// its last row (the causal minimum of 64-row tiles: its key tiles of 32 or 64 end there when
// s is a multiple of 64). Its shared-memory accesses (ldmatrix, whose traffic the counters put
// on mma.cuh's lines, the tile stores and the output staging) must have no bank conflict: the
// swizzle's purpose.
TEST_F(KernelBounds, AttentionFwdTensorCores) {
  constexpr int64_t kHeadsCut = 2, kSeqCut = 512, kTile = 64;
  for (int64_t d : {int64_t{64}, kHeadDim, kLlamaHeadDim}) {
    const std::string op = "attention fwd (tensor cores, d = " + std::to_string(d) + ")";
    const uint64_t n = uint64_t(kHeadsCut) * kSeqCut * d;
    uint64_t kv_rows = 0;  // key rows the query tiles of one head read
    for (int64_t q0 = 0; q0 < kSeqCut; q0 += kTile) kv_rows += uint64_t(q0 + kTile);
    const uint64_t min =
        2 * n * kBf16 + uint64_t(kHeadsCut) * kSeqCut * 4 + 2 * uint64_t(kHeadsCut) * kv_rows * d * kBf16;
    Dev q(n * kBf16), k(n * kBf16), v(n * kBf16), out(n * kBf16), lse(kHeadsCut * kSeqCut * 4);
    const DropoutSpec none = probs_spec(0.f);
    const cuda::AttentionShape shape{kHeadsCut, kSeqCut, kSeqCut, d, 1, {}};
    const auto run = [&] {
      cuda::attention_fwd(DType::bf16, q.p, k.p, v.p, 0.1f, none, out.p, lse.as<float>(), shape, nullptr);
    };
    expect_bounded(op, min, run);

    cudasim::take_counted_launches();
    run();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudasim::reports_text();
    const std::vector<LaunchCounts> launches = cudasim::take_counted_launches();
    ASSERT_EQ(launches.size(), 1u) << op;
    const auto& c = launches[0].total;
    EXPECT_GT(c.shared_ld_requests, 0u) << op;
    EXPECT_EQ(c.shared_ld_bank_conflicts + c.shared_st_bank_conflicts, 0u)
        << op << ": shared wavefronts: loads " << c.shared_ld_wavefronts << ", stores " << c.shared_st_wavefronts
        << "\n" << describe(launches);
  }
}

// The bf16 backward's main kernel at the same head sizes, two heads of a 256-token causal
// attention: its shared-memory accesses (ldmatrix of K, V, Q, dO and dSᵀ, plain and
// transposed, the tile stores and the stores of dSᵀ) must have no bank conflict either. Its
// traffic is not bounded here: dQ's atomics are not counted.
TEST_F(KernelBounds, AttentionBwdTensorCores) {
  constexpr int64_t kHeadsCut = 2, kSeqCut = 256;
  for (int64_t d : {int64_t{64}, kHeadDim, kLlamaHeadDim}) {
    const std::string op = "attention bwd (tensor cores, d = " + std::to_string(d) + ")";
    const uint64_t n = uint64_t(kHeadsCut) * kSeqCut * d;
    const cuda::AttentionShape shape{kHeadsCut, kSeqCut, kSeqCut, d, 1, {}};
    Dev q(n * kBf16), k(n * kBf16), v(n * kBf16), out(n * kBf16), dout(n * kBf16), dq(n * kBf16), dk(n * kBf16),
        dv(n * kBf16), lse(kHeadsCut * kSeqCut * 4),
        workspace(static_cast<size_t>(cuda::attention_bwd_workspace_floats(DType::bf16, shape)) * 4);
    cudasim::take_counted_launches();
    cuda::attention_bwd(DType::bf16, q.p, k.p, v.p, out.p, dout.p, lse.as<float>(), 0.1f, probs_spec(0.f), dq.p,
                        dk.p, dv.p, workspace.as<float>(), shape, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudasim::reports_text();
    const std::vector<LaunchCounts> launches = cudasim::take_counted_launches();
    const LaunchCounts* main = nullptr;
    for (const LaunchCounts& l : launches)
      if ((l.function.empty() ? l.kernel : l.function).find("attention_bwd_tc_kernel") != std::string::npos) main = &l;
    ASSERT_NE(main, nullptr) << op << ": no launch of the main kernel\n" << describe(launches);
    const auto& c = main->total;
    EXPECT_GT(c.shared_ld_requests, 0u) << op;
    EXPECT_EQ(c.shared_ld_bank_conflicts + c.shared_st_bank_conflicts, 0u)
        << op << ": shared wavefronts: loads " << c.shared_ld_wavefronts << ", stores " << c.shared_st_wavefronts
        << "\n" << describe(launches);
  }
}

// ---- context parallelism: sequence chunks, merged partial attentions ---------------------------

// One sequence chunk of k heads [b*a/t, c, d] (c = s/4: C = 2 ranks, 2C chunks) moved into
// the whole sequence's [b*a/t, s, d] (the all-gather's reordering).
TEST_F(KernelBounds, CopyRows) {
  const int64_t outer = kBatch * kHeadsPerRank, chunk = kSeq / 4, local = 2 * chunk;
  const uint64_t n = uint64_t(outer) * chunk * kHeadDim;
  Dev src(outer * local * kHeadDim * kBf16), dst(outer * kSeq * kHeadDim * kBf16);
  expect_bounded("copy rows (sequence chunk)", n * 2 * kBf16, [&] {
    cuda::copy_rows(src.p, local, chunk, dst.p, kSeq, 3 * chunk, chunk, outer, kHeadDim * int64_t{kBf16}, nullptr);
  });
}

// A ring step's partial attention merged into the running one: out, out_part [b*a/t, rows, d]
// and their fp32 lse, kRows query rows of each head.
TEST_F(KernelBounds, AttentionMerge) {
  const int64_t rows = kBatch * kHeadsPerRank * kRows;
  const uint64_t n = uint64_t(rows) * kHeadDim;
  Dev out(n * kBf16), part(n * kBf16), lse(rows * 4), lse_part(rows * 4);
  // out, out_part, lse, lse_part read; out, lse written
  expect_bounded("attention merge", 3 * n * kBf16 + 3 * uint64_t(rows) * 4, [&] {
    cuda::attention_merge(DType::bf16, out.p, lse.as<float>(), part.p, lse_part.as<float>(), rows, kHeadDim,
                          nullptr);
  });
}

// ---- the residual path, LayerNorm, GeLU --------------------------------------------------------

TEST_F(KernelBounds, BiasDropoutResidual) {
  const DropoutSpec spec = residual_spec(0.1f);
  const uint64_t n = uint64_t(kRows) * kHidden;
  Dev x(n * kBf16), bias(kHidden * kBf16), residual(n * kBf16), out(n * kBf16), mask(n);
  // x, residual read, out and mask written, the bias read once
  expect_bounded("bias + dropout + residual", n * (3 * kBf16 + 1) + kHidden * kBf16, [&] {
    cuda::bias_dropout_residual_fwd(DType::bf16, x.p, bias.p, residual.p, spec, out.p, mask.as<uint8_t>(), kRows,
                                    kHidden, nullptr);
  });
}

// fp32: 4-element packs, the bias band's share of the traffic (4 bytes per 8 rows against 13 per
// element) the largest of the three dtypes.
TEST_F(KernelBounds, BiasDropoutResidualFp32) {
  const DropoutSpec spec = residual_spec(0.1f);
  const uint64_t n = uint64_t(kRows) * kHidden;
  constexpr size_t kFp32 = 4;
  Dev x(n * kFp32), bias(kHidden * kFp32), residual(n * kFp32), out(n * kFp32), mask(n);
  expect_bounded("bias + dropout + residual (fp32)", n * (3 * kFp32 + 1) + kHidden * kFp32, [&] {
    cuda::bias_dropout_residual_fwd(DType::fp32, x.p, bias.p, residual.p, spec, out.p, mask.as<uint8_t>(), kRows,
                                    kHidden, nullptr);
  });
}

TEST_F(KernelBounds, BiasGrad) {
  const uint64_t n = uint64_t(kRows) * kHidden;
  Dev dy(n * kBf16), db(kHidden * kBf16), ws(cuda::bias_grad_workspace_floats(kRows, kHidden) * sizeof(float));
  expect_bounded("bias grad", n * kBf16 + kHidden * kBf16, [&] {
    cuda::bias_grad(DType::bf16, dy.p, db.p, ws.as<float>(), kRows, kHidden, nullptr);
  });
}

TEST_F(KernelBounds, LayerNormFwd) {
  const uint64_t n = uint64_t(kRows) * kHidden;
  Dev x(n * kBf16), w(kHidden * kBf16), b(kHidden * kBf16), y(n * kBf16), mean(kRows * 4), rstd(kRows * 4);
  // x read, y written, weight and bias read once, fp32 mean and rstd per row written
  expect_bounded("layernorm fwd", 2 * n * kBf16 + 2 * kHidden * kBf16 + 2 * kRows * 4, [&] {
    cuda::layernorm_fwd(DType::bf16, x.p, w.p, b.p, 1e-5f, y.p, mean.as<float>(), rstd.as<float>(), kRows, kHidden,
                        nullptr);
  });
}

TEST_F(KernelBounds, LayerNormBwd) {
  const uint64_t n = uint64_t(kRows) * kHidden;
  Dev dy(n * kBf16), x(n * kBf16), w(kHidden * kBf16), mean(kRows * 4), rstd(kRows * 4), dx(n * kBf16),
      dw(kHidden * kBf16), db(kHidden * kBf16),
      ws(cuda::layernorm_bwd_workspace_floats(kRows, kHidden) * sizeof(float));
  // dy, x read, dx written; weight, mean, rstd read once; dweight, dbias written once
  expect_bounded("layernorm bwd", 3 * n * kBf16 + 3 * kHidden * kBf16 + 2 * kRows * 4, [&] {
    cuda::layernorm_bwd(DType::bf16, dy.p, x.p, w.p, mean.as<float>(), rstd.as<float>(), dx.p, dw.p, db.p,
                        ws.as<float>(), kRows, kHidden, nullptr);
  });
}

TEST_F(KernelBounds, GeluFwd) {
  const int64_t n = kRows * kFfnPerRank;
  Dev x(n * kBf16), y(n * kBf16);
  expect_bounded("gelu fwd", uint64_t(n) * 2 * kBf16, [&] { cuda::gelu_fwd(DType::bf16, x.p, y.p, n, nullptr); });
}

TEST_F(KernelBounds, GeluBwd) {
  const int64_t n = kRows * kFfnPerRank;
  Dev dy(n * kBf16), x(n * kBf16), dx(n * kBf16);
  expect_bounded("gelu bwd", uint64_t(n) * 3 * kBf16,
                 [&] { cuda::gelu_bwd(DType::bf16, dy.p, x.p, dx.p, n, nullptr); });
}

// ---- the llama family ----------------------------------------------------------------------------

TEST_F(KernelBounds, RmsNormFwd) {
  const uint64_t n = uint64_t(kRows) * kLlamaHidden;
  Dev x(n * kBf16), w(kLlamaHidden * kBf16), y(n * kBf16), rstd(kRows * 4);
  expect_bounded("rmsnorm fwd", 2 * n * kBf16 + kLlamaHidden * kBf16 + kRows * 4, [&] {
    cuda::rmsnorm_fwd(DType::bf16, x.p, w.p, 1e-5f, y.p, rstd.as<float>(), kRows, kLlamaHidden, nullptr);
  });
}

TEST_F(KernelBounds, RmsNormBwd) {
  const uint64_t n = uint64_t(kRows) * kLlamaHidden;
  Dev dy(n * kBf16), x(n * kBf16), w(kLlamaHidden * kBf16), rstd(kRows * 4), dx(n * kBf16),
      dw(kLlamaHidden * kBf16), ws(cuda::rmsnorm_bwd_workspace_floats(kRows, kLlamaHidden) * sizeof(float));
  expect_bounded("rmsnorm bwd", 3 * n * kBf16 + 2 * kLlamaHidden * kBf16 + kRows * 4, [&] {
    cuda::rmsnorm_bwd(DType::bf16, dy.p, x.p, w.p, rstd.as<float>(), dx.p, dw.p, ws.as<float>(), kRows,
                      kLlamaHidden, nullptr);
  });
}

TEST_F(KernelBounds, Rope) {
  // q heads of one batch: [a/t * s, d] rows at positions r % s (kRows positions of 4 heads)
  const int64_t rows = 4 * kRows;
  Dev x(rows * kLlamaHeadDim * kBf16), y(rows * kLlamaHeadDim * kBf16);
  for (bool inverse : {false, true})
    expect_bounded(inverse ? "rope inverse" : "rope", uint64_t(rows) * kLlamaHeadDim * 2 * kBf16, [&] {
      cuda::rope(DType::bf16, x.p, y.p, rows, kRows, kLlamaHeadDim, kLlamaHeadDim, 500000.0, inverse, {}, nullptr);
    });
}

TEST_F(KernelBounds, SwiGluFwd) {
  const uint64_t n = uint64_t(kRows) * kLlamaFfnPerRank;
  Dev x(2 * n * kBf16), y(n * kBf16);
  expect_bounded("swiglu fwd", 3 * n * kBf16, [&] {
    cuda::swiglu_fwd(DType::bf16, x.p, y.p, kRows, kLlamaFfnPerRank, nullptr);
  });
}

TEST_F(KernelBounds, SwiGluBwd) {
  const uint64_t n = uint64_t(kRows) * kLlamaFfnPerRank;
  Dev dy(n * kBf16), x(2 * n * kBf16), dx(2 * n * kBf16);
  expect_bounded("swiglu bwd", 5 * n * kBf16, [&] {
    cuda::swiglu_bwd(DType::bf16, dy.p, x.p, dx.p, kRows, kLlamaFfnPerRank, nullptr);
  });
}

}  // namespace
