// The memory-access counters (cudasim/counters.hpp) on planted kernels (tests/cuda/counters.cu)
// whose counts are known exactly: coalesced, strided and misaligned global accesses of 2, 4, 8
// and 16 bytes, partial warps and divergent lanes, loops and barriers, shared-memory bank
// conflicts and broadcasts, ldmatrix's rows, unique bytes, the declared minimum, the per-line table and the
// CSV. Device buffers come from cudaMalloc (256-byte aligned), so sectors are exact.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cudasim/counters.hpp"
#include "cudasim/sim.hpp"
#include "tests/counting_test.hpp"
#include "tests/cuda/counter_kernels.hpp"
#include "tests/cuda/sim_test_kernels.hpp"

using namespace cudasim_tests;
using cudasim::LaunchCounts;

namespace {


class Counters : public CountingTest {
 protected:
  // The counts of the one launch `launch` makes.
  static LaunchCounts counted(const std::function<cudaError_t()>& launch) {
    cudasim::take_counted_launches();
    EXPECT_EQ(launch(), cudaSuccess) << cudasim::reports_text();
    std::vector<LaunchCounts> l = cudasim::take_counted_launches();
    EXPECT_EQ(l.size(), 1u);
    return l.empty() ? LaunchCounts{} : l.front();
  }
};

// ---- global memory -----------------------------------------------------------------------

TEST_F(Counters, CoalescedFp32CopyIsFourSectorsPerRequest) {
  Dev<float> in(1024, 1.f), out(1024);
  const LaunchCounts k = counted([&] { return copy_f32(out.p, in.p, 1024, 256); });
  const auto& c = k.total;
  EXPECT_EQ(c.global_ld_requests, 32u);    // 1024 threads = 32 warps, one load each
  EXPECT_EQ(c.global_ld_sectors, 128u);    // each warp's 128 contiguous aligned bytes: 4 sectors
  EXPECT_EQ(c.global_ld_bytes, 4096u);     // 1024 floats
  EXPECT_EQ(c.global_st_requests, 32u);    // the same for the stores
  EXPECT_EQ(c.global_st_sectors, 128u);
  EXPECT_DOUBLE_EQ(c.global_ld_sectors_per_request(), 4.0);
  EXPECT_DOUBLE_EQ(c.global_st_sectors_per_request(), 4.0);
  EXPECT_EQ(c.shared_ld_requests + c.shared_st_requests, 0u);  // no shared memory
  EXPECT_EQ(k.unique_global_bytes_read, 4096u);    // every input byte once
  EXPECT_EQ(k.unique_global_bytes_written, 4096u);  // every output byte once
  EXPECT_EQ(k.kernel, "copy_f32_kernel");
  EXPECT_EQ(k.grid.x, 4u);
  EXPECT_EQ(k.block.x, 256u);
  EXPECT_NE(k.launched_at.find("counters.cu:"), std::string::npos) << k.launched_at;
}

TEST_F(Counters, Stride2Fp32LoadIsEightSectorsPerRequest) {
  Dev<float> in(2048, 1.f), out(1024);
  const auto c = counted([&] { return copy_f32_stride2(out.p, in.p, 1024); }).total;
  EXPECT_EQ(c.global_ld_requests, 32u);
  EXPECT_EQ(c.global_ld_sectors, 256u);  // 32 lanes 8 bytes apart span 256 bytes: 8 sectors each
  EXPECT_EQ(c.global_st_sectors, 128u);  // the stores stay coalesced: 4 each
}

TEST_F(Counters, MisalignedByOneElementIsFiveSectors) {
  Dev<float> in(1025, 1.f), out(1024);
  const auto c = counted([&] { return copy_f32_offset1(out.p, in.p, 1024); }).total;
  EXPECT_EQ(c.global_ld_requests, 32u);
  EXPECT_EQ(c.global_ld_sectors, 160u);  // 128 bytes starting 4 bytes into a sector straddle 5 sectors
  EXPECT_EQ(c.global_st_sectors, 128u);  // the aligned stores: 4
}

TEST_F(Counters, Bf16CoalescedLoadIsTwoSectors) {
  Dev<uint16_t> in(1024, 0x3f80);  // bf16 1.0
  Dev<float> out(1024);
  const auto c = counted([&] { return load_bf16(out.p, in.p, 1024); }).total;
  EXPECT_EQ(c.global_ld_requests, 32u);
  EXPECT_EQ(c.global_ld_sectors, 64u);  // 32 lanes x 2 bytes = 64 contiguous bytes: 2 sectors
  EXPECT_EQ(c.global_ld_bytes, 2048u);
  EXPECT_EQ(c.global_st_sectors, 128u);  // fp32 stores: 4
}

TEST_F(Counters, Float4CoalescedAccessIsSixteenSectorsPerRequest) {
  Dev<float> in(256, 1.f), out(256);
  const LaunchCounts k = counted([&] { return copy_float4(out.p, in.p, 64); });
  const auto& c = k.total;
  EXPECT_EQ(c.global_ld_requests, 2u);   // 64 threads = 2 warps, one 16-byte load each
  EXPECT_EQ(c.global_ld_sectors, 32u);   // 32 lanes x 16 bytes = 512 bytes: 16 sectors each
  EXPECT_EQ(c.global_st_requests, 2u);   // one 16-byte store each
  EXPECT_EQ(c.global_st_sectors, 32u);
  EXPECT_EQ(k.unique_global_bytes_read, 1024u);
}

TEST_F(Counters, UnpackedUint4IsOneSixteenByteLoad) {
  Dev<uint16_t> in(256, 0x3f80);
  Dev<float> out(32);
  const auto c = counted([&] { return sum_packs_bf16(out.p, in.p); }).total;
  EXPECT_EQ(c.global_ld_requests, 1u);  // one 16-byte load a lane, not eight 2-byte ones
  EXPECT_EQ(c.global_ld_sectors, 16u);  // 512 contiguous bytes
  EXPECT_EQ(c.global_st_sectors, 4u);
}

TEST_F(Counters, InPlaceUpdateCountsItsLoad) {
  Dev<float> x(32, 1.f);
  const auto c = counted([&] { return scale_in_place(x.p); }).total;
  EXPECT_EQ(c.global_ld_requests, 1u);  // the load before the store of the same address counts
  EXPECT_EQ(c.global_ld_sectors, 4u);
  EXPECT_EQ(c.global_st_requests, 1u);
  EXPECT_EQ(c.global_st_sectors, 4u);
}

TEST_F(Counters, PartialWarpOfABlockOf48) {
  Dev<float> in(48, 1.f), out(48);
  const auto c = counted([&] { return copy_f32(out.p, in.p, 48, 48); }).total;
  EXPECT_EQ(c.global_ld_requests, 2u);  // warps of 32 and 16 threads
  EXPECT_EQ(c.global_ld_sectors, 6u);   // 128 bytes (4 sectors) + 64 bytes (2)
  EXPECT_EQ(c.global_st_sectors, 6u);
}

TEST_F(Counters, DivergentEvenLanesAreOneRequest) {
  Dev<float> in(32, 1.f), out(32);
  const auto c = counted([&] { return copy_f32_even_lanes(out.p, in.p); }).total;
  EXPECT_EQ(c.global_ld_requests, 1u);  // the 16 active lanes share one request
  EXPECT_EQ(c.global_ld_sectors, 4u);   // their floats 8 bytes apart still span 128 bytes
  EXPECT_EQ(c.global_ld_bytes, 64u);    // 16 lanes x 4 bytes
  EXPECT_EQ(c.global_st_requests, 1u);
  EXPECT_EQ(c.global_st_sectors, 4u);
}

TEST_F(Counters, EachLoopIterationIsItsOwnRequest) {
  Dev<float> in(128, 1.f), out(128);
  const auto c = counted([&] { return copy_f32_loop(out.p, in.p, 4); }).total;
  EXPECT_EQ(c.global_ld_requests, 4u);  // the k-th execution of the load by the warp is one request
  EXPECT_EQ(c.global_ld_sectors, 16u);  // 4 sectors each (merged, they would be 1 request of 16)
  EXPECT_EQ(c.global_st_requests, 4u);
  EXPECT_EQ(c.global_st_sectors, 16u);
}

TEST_F(Counters, BarriersEndARequestGroup) {
  Dev<float> in(64, 1.f), out(32);
  for (bool warp_sync : {false, true}) {
    const auto c = counted([&] { return load_across_barrier(out.p, in.p, 2, warp_sync); }).total;
    // Iteration 0: the even lanes read in[0..31] (4 sectors); after the barrier every lane
    // reads in[32..63] (4). Without the barrier's cut, an odd lane's first load (iteration 1)
    // would join the even lanes' first: 8 sectors + 4.
    EXPECT_EQ(c.global_ld_requests, 2u) << warp_sync;
    EXPECT_EQ(c.global_ld_sectors, 8u) << warp_sync;
  }
}

TEST_F(Counters, UniqueBytesCountTheSameKiBOnce) {
  Dev<float> in(256, 1.f), out(256);
  const LaunchCounts k = counted([&] { return sum_read_twice(out.p, in.p); });
  EXPECT_EQ(k.total.global_ld_requests, 16u);  // 8 warps x 2 loads: both count
  EXPECT_EQ(k.total.global_ld_sectors, 64u);   // 4 sectors each
  EXPECT_EQ(k.total.global_ld_bytes, 2048u);   // the lanes ask for 2 KiB
  EXPECT_EQ(k.unique_global_bytes_read, 1024u);    // of which 1 KiB is distinct
  EXPECT_EQ(k.unique_global_bytes_written, 1024u);
}

// ---- shared memory ---------------------------------------------------------------------------

TEST_F(Counters, SharedStride32WordsIsA32WayBankConflict) {
  Dev<float> in(32, 1.f), out(32);
  const auto c = counted([&] { return shared_stride(out.p, in.p, 32); }).total;
  EXPECT_EQ(c.shared_st_requests, 1u);
  EXPECT_EQ(c.shared_st_wavefronts, 32u);      // 32 distinct words, all in bank 0
  EXPECT_EQ(c.shared_st_bank_conflicts, 31u);  // every wavefront after the first
  EXPECT_EQ(c.shared_ld_requests, 1u);
  EXPECT_EQ(c.shared_ld_wavefronts, 32u);
  EXPECT_EQ(c.shared_ld_bank_conflicts, 31u);
}

TEST_F(Counters, SharedStride2WordsIsATwoWayConflict) {
  Dev<float> in(32, 1.f), out(32);
  const auto c = counted([&] { return shared_stride(out.p, in.p, 2); }).total;
  EXPECT_EQ(c.shared_ld_wavefronts, 2u);  // words 0, 2, ..., 62: each even bank holds two
  EXPECT_EQ(c.shared_ld_bank_conflicts, 1u);
  EXPECT_EQ(c.shared_st_wavefronts, 2u);
  EXPECT_EQ(c.shared_st_bank_conflicts, 1u);
}

TEST_F(Counters, SharedStride1IsConflictFree) {
  Dev<float> in(32, 1.f), out(32);
  const auto c = counted([&] { return shared_stride(out.p, in.p, 1); }).total;
  EXPECT_EQ(c.shared_ld_wavefronts, 1u);  // 32 consecutive words: one per bank
  EXPECT_EQ(c.shared_ld_bank_conflicts, 0u);
}

TEST_F(Counters, SharedBroadcastIsOneWavefront) {
  Dev<float> in(1, 1.f), out(32);
  const auto c = counted([&] { return shared_broadcast(out.p, in.p); }).total;
  EXPECT_EQ(c.shared_st_requests, 1u);  // thread 0's write
  EXPECT_EQ(c.shared_st_wavefronts, 1u);
  EXPECT_EQ(c.shared_ld_requests, 1u);
  EXPECT_EQ(c.shared_ld_wavefronts, 1u);  // 32 lanes read one word: broadcast
  EXPECT_EQ(c.shared_ld_bank_conflicts, 0u);
  EXPECT_EQ(c.global_ld_sectors, 1u);  // thread 0 reads 4 bytes
}

TEST_F(Counters, Shared64BitAccessIsTwoHalfWarpWavefronts) {
  Dev<double> in(32, 1.0), out(32);
  const auto c = counted([&] { return shared_f64(out.p, in.p); }).total;
  EXPECT_EQ(c.shared_st_requests, 1u);
  EXPECT_EQ(c.shared_st_wavefronts, 2u);  // two half-warp phases, each 16 x 8 bytes over the 32 banks
  EXPECT_EQ(c.shared_st_bank_conflicts, 0u);
  EXPECT_EQ(c.shared_ld_wavefronts, 2u);
  EXPECT_EQ(c.shared_ld_bank_conflicts, 0u);
  EXPECT_EQ(c.global_ld_sectors, 8u);  // 256 contiguous bytes
}

TEST_F(Counters, Shared128BitAccessIsFourQuarterWarpWavefronts) {
  Dev<float> in(128, 1.f), out(128);
  const auto c = counted([&] { return shared_float4(out.p, in.p); }).total;
  EXPECT_EQ(c.shared_st_requests, 1u);
  EXPECT_EQ(c.shared_st_wavefronts, 4u);  // four quarter-warp phases, each 8 x 16 bytes over the 32 banks
  EXPECT_EQ(c.shared_st_bank_conflicts, 0u);
  EXPECT_EQ(c.shared_ld_requests, 1u);
  EXPECT_EQ(c.shared_ld_wavefronts, 4u);
  EXPECT_EQ(c.shared_ld_bank_conflicts, 0u);
  EXPECT_EQ(c.global_ld_sectors, 16u);  // 512 contiguous bytes
  EXPECT_EQ(c.global_st_sectors, 16u);
}

// ldmatrix (kernels/cuda/mma.cuh): the lanes that supply rows load them, 16 bytes each, so one
// request per instruction in quarter-warp phases of 8 rows, as the hardware reads each 8x8
// matrix; its counts land on mma.cuh's line. The demo GEMM at 16x8x16: one step.
TEST_F(Counters, LdmatrixIsOneRequestOfItsRowsInQuarterWarpPhases) {
  Dev<uint16_t> a(16 * 16, 0x3f80), b(16 * 8, 0x3f80);  // bf16 1.0
  Dev<float> d(16 * 8);
  const LaunchCounts k = counted([&] { return tile_gemm(d.p, a.p, b.p, 16, 8, 16, true); });
  cudasim::AccessCounts c;
  for (const cudasim::LineCounts& l : k.lines)
    if (l.file.size() >= 7 && l.file.compare(l.file.size() - 7, 7, "mma.cuh") == 0) c += l.counts;
  EXPECT_EQ(c.shared_ld_requests, 2u);  // ldmatrix x4 of A (32 lanes), ldmatrix_trans x2 of B (16 lanes)
  // A's rows are 32 bytes apart: in each phase of 8 rows, rows j and j + 4 fall in the same 4
  // banks (2 wavefronts), 4 phases. B's rows are 16 bytes apart: 8 rows cover the 32 banks once,
  // 2 phases.
  EXPECT_EQ(c.shared_ld_wavefronts, 4u * 2 + 2 * 1);
  EXPECT_EQ(c.shared_ld_bank_conflicts, 4u);
  EXPECT_EQ(c.shared_st_requests, 0u);
}

// cp.async (kernels/cuda/async_copy.cuh): its global read is one request of the warp's lanes,
// and its landing in shared memory one store request in quarter-warp phases, as a 16-byte
// store's, both on the kernel's line: 512 contiguous bytes are 16 sectors; rows of 16 bytes
// 32 bytes apart put two of a phase's 8 in each bank group (2 wavefronts), 64 apart four.
TEST_F(Counters, CpAsyncIsAGlobalLoadAndAQuarterWarpStoreOnTheCallersLine) {
  std::vector<uint4> values(32);
  for (uint32_t i = 0; i < 32; ++i) values[i] = uint4{i, i + 1, i + 2, i + 3};
  for (int stride : {1, 2, 4}) {
    SCOPED_TRACE("stride " + std::to_string(stride));
    Dev<uint4> in(values), out(32);
    const LaunchCounts k = counted([&] { return async_copy_stride(out.p, in.p, stride); });
    const auto& c = k.total;
    EXPECT_EQ(c.global_ld_requests, 1u);
    EXPECT_EQ(c.global_ld_sectors, 16u);
    EXPECT_EQ(c.shared_st_requests, 1u);  // the landing
    EXPECT_EQ(c.shared_st_wavefronts, 4u * stride);
    EXPECT_EQ(c.shared_st_bank_conflicts, 4u * (stride - 1));
    EXPECT_EQ(c.shared_ld_wavefronts, 4u * stride);  // the read back, the same phases
    const std::vector<uint4> got = out.get();
    for (int i = 0; i < 32; ++i) EXPECT_EQ(got[i].x, values[i].x) << i;
    bool on_async_line = false;  // the copy's read and landing are counted on the kernel's line
    for (const cudasim::LineCounts& l : k.lines)
      on_async_line |= l.file.find("async_copy.cu") != std::string::npos && l.counts.global_ld_requests == 1 &&
                       l.counts.shared_st_requests == 1;
    EXPECT_TRUE(on_async_line);
  }
}

// ---- per launch, per line, CSV -----------------------------------------------------------------

TEST_F(Counters, PerLineTableSplitsLoadAndStoreLines) {
  Dev<float> in(32, 1.f), out(32);
  const LaunchCounts k = counted([&] { return copy_two_lines(out.p, in.p); });
  const int load = copy_two_lines_load_line();
  const cudasim::LineCounts* ld = k.find_line("tests/cuda/counters.cu:" + std::to_string(load));
  const cudasim::LineCounts* st = k.find_line("tests/cuda/counters.cu:" + std::to_string(load + 1));
  ASSERT_NE(ld, nullptr) << cudasim::counters_csv_rows(k);
  ASSERT_NE(st, nullptr) << cudasim::counters_csv_rows(k);
  EXPECT_EQ(ld->file, "tools/cudasim/tests/cuda/counters.cu");  // relative to the source tree
  EXPECT_EQ(ld->counts.global_ld_requests, 1u);
  EXPECT_EQ(ld->counts.global_st_requests, 0u);
  EXPECT_EQ(st->counts.global_st_requests, 1u);
  EXPECT_EQ(st->counts.global_ld_requests, 0u);
  EXPECT_EQ(k.lines.size(), 2u);
}

TEST_F(Counters, DeclaredMinimumBelongsToTheNextLaunch) {
  Dev<float> in(1024, 1.f), out(1024);
  cudasim::declare_min_bytes(8192);
  EXPECT_EQ(counted([&] { return copy_f32(out.p, in.p, 1024, 256); }).min_bytes, 8192u);  // read 4 KiB, write 4 KiB
  EXPECT_EQ(counted([&] { return copy_f32(out.p, in.p, 1024, 256); }).min_bytes, 0u);  // not declared again
}

TEST_F(Counters, OffCountsNothing) {
  Dev<float> in(32, 1.f), out(32);
  cudasim::set_counters(false);
  ASSERT_EQ(copy_f32(out.p, in.p, 32, 32), cudaSuccess);
  EXPECT_TRUE(cudasim::take_counted_launches().empty());
}

// Counting without the race checker: a planted race (the barrier after a tile load removed)
// goes unreported, and the counts are those of the checked run.
TEST_F(Counters, RaceChecksOffCountTheSameAndReportNothing) {
  const int n = 256;
  Dev<float> in(n, 1.f), out(n);
  cudasim::take_counted_launches();
  EXPECT_EQ(tile_reverse(out.p, in.p, n, 1), cudaErrorLaunchFailure) << "the race checker sees the planted race";
  cudasim::take_reports();
  const std::vector<LaunchCounts> checked_launches = cudasim::take_counted_launches();
  ASSERT_EQ(checked_launches.size(), 1u);
  const LaunchCounts& checked = checked_launches.front();
  ASSERT_FALSE(cudasim::set_race_checks(false));
  const LaunchCounts unchecked = counted([&] { return tile_reverse(out.p, in.p, n, 1); });
  EXPECT_TRUE(cudasim::set_race_checks(true));
  EXPECT_EQ(cudasim::report_count(), 0u) << cudasim::reports_text();
  EXPECT_EQ(unchecked.total.global_ld_sectors, checked.total.global_ld_sectors);
  EXPECT_EQ(unchecked.total.global_st_sectors, checked.total.global_st_sectors);
  EXPECT_EQ(unchecked.total.shared_ld_wavefronts, checked.total.shared_ld_wavefronts);
  EXPECT_EQ(unchecked.total.shared_st_wavefronts, checked.total.shared_st_wavefronts);
  EXPECT_GT(unchecked.total.shared_st_requests, 0u);
}

TEST_F(Counters, EveryColumnIsDeclaredOnceWithUnitAndMeaning) {
  const auto& cols = cudasim::counter_columns();
  std::vector<std::string> names;
  for (const auto& c : cols) {
    EXPECT_NE(std::string(c.meaning), "") << c.name;
    for (const std::string& n : names) EXPECT_NE(n, c.name);
    names.push_back(c.name);
  }
  for (const char* metric :
       {"l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"})
    EXPECT_NE(std::find(names.begin(), names.end(), metric), names.end()) << metric;
}

// The environment variable, in a child run of one test of this binary.
std::string self() { return std::filesystem::read_symlink("/proc/self/exe").string(); }
std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}
// The fields of a CSV row (quoted fields may hold commas and doubled quotes).
std::vector<std::string> fields(const std::string& row) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < row.size(); ++i) {
    const char c = row[i];
    if (quoted && c == '"' && i + 1 < row.size() && row[i + 1] == '"') {
      out.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

TEST_F(Counters, EnvironmentVariableWritesOneRowPerLaunchAndLine) {
  const std::string csv = ::testing::TempDir() + "cudasim_counters_env.csv";
  std::remove(csv.c_str());
  const std::string cmd = "CUDASIM_COUNTERS='" + csv +
                          "' '" + self() + "' --gtest_filter=Counters.PerLineTableSplitsLoadAndStoreLines > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::vector<std::string> rows = lines_of(csv);
  ASSERT_EQ(rows.size(), 3u);  // header, the load's line, the store's line
  EXPECT_EQ(rows[0] + "\n", cudasim::counters_csv_header());
  const std::vector<std::string> head = fields(rows[0]), load = fields(rows[1]);
  ASSERT_EQ(load.size(), head.size()) << rows[1];
  auto col = [&](const std::string& name) {
    const size_t i = static_cast<size_t>(std::find(head.begin(), head.end(), name) - head.begin());
    return i < load.size() ? load[i] : std::string("(no column)");
  };
  EXPECT_EQ(col("kernel"), "copy_two_lines_kernel");
  EXPECT_EQ(col("function"), "cudasim_tests::(anonymous namespace)::copy_two_lines_kernel(float*, float const*)");
  EXPECT_EQ(col("source"), "tools/cudasim/tests/cuda/counters.cu:" + std::to_string(copy_two_lines_load_line()));
  EXPECT_EQ(col("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"), "1");
  EXPECT_EQ(col("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"), "4");
  EXPECT_EQ(col("l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio"), "4");
  EXPECT_EQ(col("cudasim__unique_global_bytes_read"), "128");
  std::remove(csv.c_str());
}

TEST_F(Counters, UnwritableEnvironmentFileIsOneErrorLine) {
  const std::string err = ::testing::TempDir() + "cudasim_counters_err.txt";
  const std::string cmd = "CUDASIM_COUNTERS=/ '" + self() + "' --gtest_filter=Counters.OffCountsNothing > /dev/null 2> '" +
                          err + "'";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::vector<std::string> lines = lines_of(err);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("CUDASIM_COUNTERS=/"), std::string::npos) << lines[0];
  std::remove(err.c_str());
}

}  // namespace
