// The kernel report (cudasim/kernel_report.hpp) of planted kernels (tests/cuda/counters.cu)
// whose counts are known: ideal and excess sectors and the lines causing them, bytes moved
// against the declared minimum, static and dynamic shared memory, occupancy, waves and the
// modeled time on the H100 and the A100, each computed here by hand from the devices' stated
// limits; the CSV and text forms and CUDASIM_KERNEL_REPORT.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cudasim/kernel_report.hpp"
#include "cudasim/sim.hpp"
#include "tests/counting_test.hpp"
#include "tests/cuda/counter_kernels.hpp"

using namespace cudasim_tests;
using cudasim::KernelRow;
using cudasim::LaunchCounts;

namespace {


const cudasim::ModelDevice& h100() { return *cudasim::find_model_device("h100"); }
const cudasim::ModelDevice& a100() { return *cudasim::find_model_device("a100"); }

class KernelReport : public CountingTest {
 protected:
  // The launches `run` makes.
  static std::vector<LaunchCounts> counted(const std::function<void()>& run) {
    cudasim::take_counted_launches();
    run();
    return cudasim::take_counted_launches();
  }
  static KernelRow one_row(const std::function<cudaError_t()>& launch, const cudasim::ModelDevice& dev) {
    const std::vector<LaunchCounts> l = counted([&] { EXPECT_EQ(launch(), cudaSuccess); });
    EXPECT_EQ(l.size(), 1u);
    const std::vector<KernelRow> rows = cudasim::launch_rows(l, dev);
    return rows.empty() ? KernelRow{} : rows.front();
  }
};

// ---- ideal and excess sectors -----------------------------------------------------------------

TEST_F(KernelReport, CoalescedCopyHasNoExcessAndMovesItsMinimum) {
  Dev<float> in(1024, 1.f), out(1024);
  const KernelRow r = one_row(
      [&] {
        cudasim::declare_min_bytes(2 * 4096);  // 1024 floats read once and written once
        return copy_f32(out.p, in.p, 1024, 256);
      },
      h100());
  EXPECT_EQ(r.total.global_ld_ideal_sectors, 128u);  // 32 requests of 128 distinct bytes: 4 each
  EXPECT_EQ(r.total.global_st_ideal_sectors, 128u);
  EXPECT_EQ(r.excess_sectors(), 0u);                 // 4 sectors each, as ideal
  EXPECT_TRUE(r.excess_lines.empty());
  EXPECT_EQ(r.bytes_moved(), 8192u);                 // 256 sectors x 32
  EXPECT_EQ(r.min_bytes, 8192u);
  const std::vector<std::string> head = cudasim::kernel_report_csv_header(h100());
  const std::vector<std::string> f = cudasim::kernel_report_csv_fields(r);
  auto col = [&](const std::string& name) {
    const size_t i = static_cast<size_t>(std::find(head.begin(), head.end(), name) - head.begin());
    return i < f.size() ? f[i] : std::string("(no column)");
  };
  EXPECT_EQ(col("bytes_moved_per_min"), "1");
  EXPECT_EQ(col("global_ld_sectors_per_request"), "4");
  EXPECT_EQ(col("excess_lines"), "");
}

// Block sampling: one block in 5 of a 40-block copy runs (blocks 2, 7, ..., 37: 8 of them), and
// the report scales its counts to the whole grid, equal to the unsampled launch's for a kernel
// whose blocks all do the same work. Blocks that did not run wrote nothing.
TEST_F(KernelReport, SampledLaunchIsScaledToTheWholeGrid) {
  const int n = 40 * 256;
  Dev<float> in(n, 1.f), whole_out(n), sampled_out(n, -1.f);
  const KernelRow whole = one_row([&] { return copy_f32(whole_out.p, in.p, n, 256); }, h100());
  cudasim::set_block_sample(5);
  const std::vector<LaunchCounts> l = counted([&] { EXPECT_EQ(copy_f32(sampled_out.p, in.p, n, 256), cudaSuccess); });
  cudasim::set_block_sample(1);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].blocks_run, 8u);
  EXPECT_EQ(l[0].block_sample, 5u);
  EXPECT_EQ(l[0].total.global_ld_requests, 8u * 8);  // the raw counts: 8 blocks of 8 warps
  std::vector<float> out(n);
  ASSERT_EQ(cudaMemcpy(out.data(), sampled_out.p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out[2 * 256], 1.f);  // block 2 ran
  EXPECT_EQ(out[0], -1.f);       // block 0 did not
  const KernelRow r = cudasim::launch_rows(l, h100()).front();
  EXPECT_EQ(r.block_sample, 5u);
  EXPECT_EQ(r.total.global_ld_requests, whole.total.global_ld_requests);  // 320: scaled by 40 / 8
  EXPECT_EQ(r.total.global_st_sectors, whole.total.global_st_sectors);
  EXPECT_EQ(r.unique_bytes_read, whole.unique_bytes_read);
  EXPECT_EQ(r.model.waves, whole.model.waves);
  EXPECT_DOUBLE_EQ(r.model.total_us, whole.model.total_us);
}

// A library GEMM row: its FLOPs at 70 % of the math peak or its bytes at the DRAM bandwidth,
// whichever is longer, plus one launch overhead per call; no counted column is filled.
TEST_F(KernelReport, GemmRowIsModeledFromItsFlopsAndBytes) {
  const KernelRow g = cudasim::gemm_row("m 4096 n 4096 k 4096", 2, 2e12, 1000000000, true, a100());
  EXPECT_NEAR(g.model.math_us, 2e12 / (312e12 * 0.7) * 1e6, 1e-6);  // 9157.5 us: the bound
  EXPECT_NEAR(g.model.dram_us, 1e9 / 2.039e12 * 1e6, 1e-6);        // 490.4 us
  EXPECT_NEAR(g.model.total_us, 2 * 2.0 + g.model.math_us, 1e-6);
  const KernelRow fp32 = cudasim::gemm_row("fp32", 1, 19.5e12 * 0.7 * 1e-3, 1000, false, a100());
  EXPECT_NEAR(fp32.model.math_us, 1000.0, 1e-6);  // the CUDA cores' 19.5 TFLOPS, 70 % of it, for 1 ms
  const std::vector<std::string> head = cudasim::kernel_report_csv_header(a100());
  const std::vector<std::string> f = cudasim::kernel_report_csv_fields(g);
  auto col = [&](const std::string& name) {
    const size_t i = static_cast<size_t>(std::find(head.begin(), head.end(), name) - head.begin());
    return i < f.size() ? f[i] : std::string("(no column)");
  };
  EXPECT_EQ(col("kernel"), "cublasLtMatmul");
  EXPECT_EQ(col("launches"), "2");
  EXPECT_EQ(col("flops"), "2e+12");
  EXPECT_EQ(col("min_bytes"), "1000000000");
  EXPECT_EQ(col("global_ld_requests"), "");  // not counted: the simulator does not run cuBLASLt
  EXPECT_EQ(col("bytes_moved"), "");
  EXPECT_EQ(col("waves_a100"), "");
  EXPECT_EQ(col("modeled_us_a100"), "9161.51");  // 4 + 9157.51
}

TEST_F(KernelReport, MisalignedLoadHasOneExcessSectorPerRequestOnItsLine) {
  Dev<float> in(1025, 1.f), out(1024);
  const KernelRow r = one_row([&] { return copy_f32_offset1(out.p, in.p, 1024); }, h100());
  EXPECT_EQ(r.total.global_ld_sectors, 160u);        // 32 warps x 5 sectors (shifted by one float)
  EXPECT_EQ(r.total.global_ld_ideal_sectors, 128u);  // 128 distinct bytes each: 4
  EXPECT_EQ(r.excess_sectors(), 32u);
  ASSERT_EQ(r.excess_lines.size(), 1u);  // the load's line; the stores are aligned
  EXPECT_NE(r.excess_lines[0].where.find("tests/cuda/counters.cu:"), std::string::npos) << r.excess_lines[0].where;
  EXPECT_EQ(r.excess_lines[0].sectors, 32u);
  EXPECT_EQ(r.bytes_moved(), (160u + 128u) * 32u);
}

TEST_F(KernelReport, Stride2LoadHasFourExcessSectorsPerRequest) {
  Dev<float> in(2048, 1.f), out(1024);
  const KernelRow r = one_row([&] { return copy_f32_stride2(out.p, in.p, 1024); }, h100());
  EXPECT_EQ(r.total.global_ld_sectors, 256u);        // 8 per request: 256 bytes spanned
  EXPECT_EQ(r.total.global_ld_ideal_sectors, 128u);  // but 128 bytes asked for: 4
  EXPECT_EQ(r.excess_sectors(), 128u);
}

TEST_F(KernelReport, BroadcastAndBankConflicts) {
  Dev<float> in(32, 1.f), out(32);
  const KernelRow b = one_row([&] { return shared_broadcast(out.p, in.p); }, h100());
  EXPECT_EQ(b.total.global_ld_ideal_sectors, 1u);  // thread 0's 4 bytes
  EXPECT_EQ(b.excess_sectors(), 0u);
  EXPECT_EQ(b.static_smem_bytes, 4u);  // __shared__ float s[1]
  const KernelRow c = one_row([&] { return shared_stride(out.p, in.p, 32); }, h100());
  EXPECT_EQ(c.total.shared_ld_wavefronts + c.total.shared_st_wavefronts, 64u);  // 32 each: all in bank 0
  EXPECT_EQ(c.total.shared_ld_bank_conflicts + c.total.shared_st_bank_conflicts, 62u);
  // __shared__ float s[32 * 32]: the declared 4 KiB, though the lanes touch 32 of its words.
  EXPECT_EQ(c.static_smem_bytes, 4096u);
}

// ---- occupancy, waves, modeled time --------------------------------------------------------------

TEST_F(KernelReport, SmallLaunchIsOneWaveOnBothDevices) {
  Dev<float> in(1024, 1.f), out(1024);
  for (const cudasim::ModelDevice* dev : {&h100(), &a100()}) {
    const KernelRow r = one_row([&] { return copy_f32(out.p, in.p, 1024, 256); }, *dev);
    // 256 threads: 2048 / 256 = 8 blocks by threads, below 32 blocks and the shared memory's
    // 228 (h100) or 164 (a100) blocks of the 1 KiB each block reserves.
    EXPECT_EQ(r.model.blocks_per_sm, 8) << dev->name;
    EXPECT_STREQ(r.model.limited_by, "threads");
    EXPECT_EQ(r.model.shared_per_block, 1024u);  // no static or dynamic: the reserved 1 KiB
    EXPECT_EQ(r.model.waves, 1u);  // 4 blocks
    // 8 KiB of unique bytes: 8192 / 3.35e12 s = 0.00245 us (h100), / 2.039e12 = 0.00402 us (a100);
    // the one wave's 1 us minimum dominates: 2 us launch overhead + 1 us.
    EXPECT_NEAR(r.model.dram_us, 8192.0 / dev->dram_bytes_per_s * 1e6, 1e-12);
    EXPECT_DOUBLE_EQ(r.model.total_us, 3.0) << dev->name;
  }
}

TEST_F(KernelReport, SharedMemoryLimitsOccupancyAndSetsTheWaves) {
  constexpr int kBlocks = 1000;
  constexpr size_t kDynamic = 40 * 1024;
  Dev<float> in(32, 1.f), out(32 * kBlocks);
  const std::vector<LaunchCounts> l =
      counted([&] { EXPECT_EQ(dynamic_shared_reverse(out.p, in.p, kBlocks, kDynamic), cudaSuccess); });
  ASSERT_EQ(l.size(), 1u);
  const KernelRow h = cudasim::launch_rows(l, h100()).front(), a = cudasim::launch_rows(l, a100()).front();
  EXPECT_EQ(h.dynamic_smem_bytes, kDynamic);
  EXPECT_EQ(h.static_smem_bytes, 0u);
  EXPECT_EQ(h.model.shared_per_block, 40u * 1024 + 1024);  // + the reserved 1 KiB: 41984 bytes
  // h100: 228 KiB = 233472 bytes / 41984 = 5.56 -> 5 blocks (threads allow 64, blocks 32).
  EXPECT_EQ(h.model.blocks_per_sm, 5);
  EXPECT_STREQ(h.model.limited_by, "shared memory");
  // a100: 164 KiB = 167936 bytes / 41984 = 4 exactly.
  EXPECT_EQ(a.model.blocks_per_sm, 4);
  // Waves: 1000 blocks / (132 x 5 = 660) -> 2 on the h100; / (108 x 4 = 432) -> 3 on the a100.
  EXPECT_EQ(h.model.waves, 2u);
  EXPECT_EQ(a.model.waves, 3u);
  // Counts: per block one 4-sector load, one 4-sector store, one shared store and one shared
  // load of one wavefront each (32 consecutive words).
  EXPECT_EQ(h.total.global_ld_sectors, 4000u);
  EXPECT_EQ(h.total.global_st_sectors, 4000u);
  EXPECT_EQ(h.total.shared_ld_wavefronts + h.total.shared_st_wavefronts, 2000u);
  EXPECT_EQ(h.unique_bytes_read, 128u);               // every block reads the same 32 floats
  EXPECT_EQ(h.unique_bytes_written, 128u * kBlocks);  // and writes its own
  // Unique bytes 128128: 0.0382 us at 3.35 TB/s; 2000 wavefronts / (132 SMs x 1.98 GHz) =
  // 0.00765 us; the waves' 2 x 1 us dominate: 2 + 2 = 4 us (h100), 2 + 3 = 5 us (a100).
  EXPECT_NEAR(h.model.dram_us, 128128.0 / 3.35e12 * 1e6, 1e-12);
  EXPECT_NEAR(h.model.shared_us, 2000.0 / (132 * 1.98e9) * 1e6, 1e-12);
  EXPECT_DOUBLE_EQ(h.model.total_us, 4.0);
  EXPECT_DOUBLE_EQ(a.model.total_us, 5.0);
}

TEST_F(KernelReport, DramOrSharedBoundLaunchesAreModeledByTheirBound) {
  // Counts as a launch of 132 blocks of 256 would give them (one wave on both devices).
  LaunchCounts k;
  k.kernel = k.function = "synthetic";
  k.grid = {132, 1, 1};
  k.block = {256, 1, 1};
  k.unique_global_bytes_read = 33'500'000;  // 10 us at 3.35 TB/s
  const cudasim::LaunchModel dram_h = cudasim::model_launch(k, h100()), dram_a = cudasim::model_launch(k, a100());
  EXPECT_NEAR(dram_h.total_us, 2.0 + 10.0, 1e-9);
  EXPECT_NEAR(dram_a.total_us, 2.0 + 33.5e6 / 2.039e12 * 1e6, 1e-9);  // 16.43 us at 2.039 TB/s
  k.unique_global_bytes_read = 0;
  k.total.shared_ld_wavefronts = 2'613'600;  // 132 SMs x 1.98 GHz x 10 us
  const cudasim::LaunchModel smem_h = cudasim::model_launch(k, h100()), smem_a = cudasim::model_launch(k, a100());
  EXPECT_NEAR(smem_h.total_us, 2.0 + 10.0, 1e-9);
  EXPECT_NEAR(smem_a.total_us, 2.0 + 2'613'600 / (108 * 1.41e9) * 1e6, 1e-9);  // 17.16 us
  // A block the device cannot hold: no time is modeled.
  k.dynamic_smem_bytes = 200 * 1024;  // above the a100's 163 KiB per block, within the h100's 227
  EXPECT_GT(cudasim::model_launch(k, h100()).blocks_per_sm, 0);
  EXPECT_EQ(cudasim::model_launch(k, a100()).blocks_per_sm, 0);
  EXPECT_EQ(cudasim::model_launch(k, a100()).total_us, 0.0);
}

// ---- summing per kernel function ------------------------------------------------------------------

TEST_F(KernelReport, KernelRowsSumTheLaunchesOfOneFunction) {
  Dev<float> in(1025, 1.f), out(1024);
  const std::vector<LaunchCounts> l = counted([&] {
    EXPECT_EQ(copy_f32(out.p, in.p, 1024, 256), cudaSuccess);
    EXPECT_EQ(copy_f32_offset1(out.p, in.p, 1024), cudaSuccess);
    EXPECT_EQ(copy_f32(out.p, in.p, 512, 128), cudaSuccess);  // other grid and block
  });
  const std::vector<KernelRow> rows = cudasim::kernel_rows(l, h100());
  ASSERT_EQ(rows.size(), 2u);  // copy_f32_kernel, then copy_f32_offset1_kernel
  EXPECT_EQ(rows[0].kernel, "copy_f32_kernel");
  EXPECT_EQ(rows[0].launches, 2u);
  ASSERT_EQ(rows[0].launched_at.size(), 1u);  // both from copy_f32's one launch line
  EXPECT_NE(rows[0].launched_at[0].find("tests/cuda/counters.cu:"), std::string::npos) << rows[0].launched_at[0];
  EXPECT_TRUE(rows[0].geometry_varies);
  EXPECT_EQ(rows[0].total.global_ld_requests, 32u + 16u);
  EXPECT_EQ(rows[0].model.waves, 2u);  // one each
  EXPECT_DOUBLE_EQ(rows[0].model.total_us, 6.0);  // 3 us each
  EXPECT_EQ(rows[0].min_bytes, 0u);    // not declared
  EXPECT_EQ(rows[1].launches, 1u);
  EXPECT_FALSE(rows[1].geometry_varies);
  const std::vector<std::string> head = cudasim::kernel_report_csv_header(h100());
  const std::vector<std::string> f = cudasim::kernel_report_csv_fields(rows[0]);
  ASSERT_EQ(f.size(), head.size());
  const size_t grid = static_cast<size_t>(std::find(head.begin(), head.end(), "grid") - head.begin());
  const size_t us = static_cast<size_t>(std::find(head.begin(), head.end(), "modeled_us_h100") - head.begin());
  ASSERT_LT(us, f.size());
  EXPECT_EQ(f[grid], "");  // it varies
  EXPECT_EQ(f[us], "6");
}

// ---- columns, text form, environment ----------------------------------------------------------------

TEST_F(KernelReport, ColumnsAreDeclaredOnceAndModeledOnesSaySo) {
  for (const cudasim::ModelDevice* dev : {&h100(), &a100()}) {
    const std::vector<cudasim::ReportColumn> cols = cudasim::kernel_report_columns(*dev);
    std::vector<std::string> names;
    for (const cudasim::ReportColumn& c : cols) {
      EXPECT_NE(std::string(c.meaning), "") << c.name;
      names.push_back(c.name);
      // A column of the device model is labelled: its name ends in the device, its unit or name says modeled.
      if (c.name.find("us_") != std::string::npos) {
        EXPECT_NE(c.name.find("modeled"), std::string::npos) << c.name;
        EXPECT_NE(std::string(c.unit).find("modeled"), std::string::npos) << c.name;
      }
    }
    EXPECT_EQ(names, cudasim::kernel_report_csv_header(*dev));
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
    EXPECT_NE(std::find(names.begin(), names.end(), std::string("modeled_us_") + dev->name), names.end());
  }
}

TEST_F(KernelReport, TextFormNamesEveryColumn) {
  Dev<float> in(1024, 1.f), out(1024);
  const KernelRow r = one_row([&] { return copy_f32(out.p, in.p, 1024, 256); }, a100());
  const std::string text = cudasim::kernel_report_text({r}, a100());
  EXPECT_NE(text.find("A100 SXM4 80GB"), std::string::npos);
  EXPECT_NE(text.find("modeled_us_a100"), std::string::npos);
  EXPECT_NE(text.find("3 us (modeled)"), std::string::npos) << text;
  for (const cudasim::ReportColumn& c : cudasim::kernel_report_columns(a100()))
    EXPECT_NE(text.find(c.name), std::string::npos) << c.name;
}

std::string self() { return std::filesystem::read_symlink("/proc/self/exe").string(); }
std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

TEST_F(KernelReport, EnvironmentVariableWritesTheReportAtExit) {
  const std::string csv = ::testing::TempDir() + "cudasim_kernel_report_env.csv";
  std::remove(csv.c_str());
  const std::string cmd = "CUDASIM_KERNEL_REPORT='" + csv + "' CUDASIM_REPORT_DEVICE=a100 '" + self() +
                          "' --gtest_filter=KernelReport.SmallLaunchIsOneWaveOnBothDevices > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::vector<std::string> rows = lines_of(csv);
  ASSERT_EQ(rows.size(), 2u);  // the header and copy_f32_kernel (launched twice)
  EXPECT_EQ(rows[0] + "\n", cudasim::kernel_report_csv_line(cudasim::kernel_report_csv_header(a100())));
  EXPECT_EQ(rows[1].rfind("copy_f32_kernel,", 0), 0u) << rows[1];
  EXPECT_NE(rows[1].find(",2,1,4x1x1,256x1x1,"), std::string::npos) << rows[1];  // launches, grid, block
  std::remove(csv.c_str());
}

TEST_F(KernelReport, BadBlockSampleIsOneErrorLine) {
  const std::string err = ::testing::TempDir() + "cudasim_block_sample_err.txt";
  for (const std::string value : {"0", "-3", "2x", "", "99999999999999999999999"}) {
    const std::string cmd = "CUDASIM_BLOCK_SAMPLE='" + value + "' '" + self() +
                            "' --gtest_filter=KernelReport.SmallLaunchIsOneWaveOnBothDevices > /dev/null 2> '" + err + "'";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 2) << value;
    const std::vector<std::string> lines = lines_of(err);
    ASSERT_EQ(lines.size(), 1u) << value;
    EXPECT_NE(lines[0].find("CUDASIM_BLOCK_SAMPLE=" + value + " is not a whole number"), std::string::npos) << lines[0];
  }
  std::remove(err.c_str());
}

TEST_F(KernelReport, UnknownDeviceOrUnwritableFileIsOneErrorLine) {
  const std::string err = ::testing::TempDir() + "cudasim_kernel_report_err.txt";
  for (const std::string env : {"CUDASIM_KERNEL_REPORT=/ ", "CUDASIM_KERNEL_REPORT=x.txt CUDASIM_REPORT_DEVICE=v100 "}) {
    const std::string cmd = env + "'" + self() + "' --gtest_filter=KernelReport.SmallLaunchIsOneWaveOnBothDevices > /dev/null 2> '" + err + "'";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 2) << env;
    const std::vector<std::string> lines = lines_of(err);
    ASSERT_EQ(lines.size(), 1u) << env;
    EXPECT_NE(lines[0].find(env.find("v100") != std::string::npos ? "CUDASIM_REPORT_DEVICE=v100" : "CUDASIM_KERNEL_REPORT=/"),
              std::string::npos)
        << lines[0];
  }
  std::remove(err.c_str());
}

}  // namespace
