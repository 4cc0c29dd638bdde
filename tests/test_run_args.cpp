// layer_run's strict arguments (runners/run_args.hpp): a given value is used or refused,
// counts that overflow 64 bits are named, outputs are checked before anything runs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "runners/run_args.hpp"
#include "runtime/error.hpp"

using namespace actbench;

namespace {

// The InvalidArgument's message, or "" when nothing was thrown.
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(RunArgs, IntegersAreTheWholeTextInRange) {
  EXPECT_EQ(parse_int_option("--seq", "2048", 1, INT64_MAX), 2048);
  EXPECT_EQ(parse_int_option("--seq", "9223372036854775807", 1, INT64_MAX), INT64_MAX);
  EXPECT_EQ(parse_int_option("--warmup", "0", 0, 10), 0);
  for (const char* bad : {"", "0", "-1", " 5", "5 ", "+5", "5x", "3.0", "1e3", "0x10", "9223372036854775808"}) {
    const std::string why = refusal([&] { parse_int_option("--seq", bad, 1, INT64_MAX); });
    EXPECT_NE(why.find("--seq"), std::string::npos) << "'" << bad << "' accepted or unnamed: " << why;
  }
  EXPECT_EQ(refusal([] { parse_int_option("--layers", "1025", 1, kMaxLayers); }), "--layers must be in 1..1024, got 1025");
  // Past 64 bits the problem is the size, not the sign.
  EXPECT_EQ(refusal([] { parse_int_option("--seq", "99999999999999999999999", 1, INT64_MAX); }),
            "--seq must be at most 9223372036854775807, got 99999999999999999999999");
  EXPECT_EQ(refusal([] { parse_int_option("--seq", "-99999999999999999999999", 1, INT64_MAX); }),
            "--seq must be >= 1, got -99999999999999999999999");
  // A value with a line break is quoted on one line.
  EXPECT_EQ(refusal([] { parse_int_option("--seq", "8\n", 1, INT64_MAX); }), "--seq expects a whole number, got '8\\n'");
}

TEST(RunArgs, SeedTakesTheWholeUnsignedRangeAndNoMore) {
  EXPECT_EQ(parse_uint64_option("--seed", "0"), 0u);
  EXPECT_EQ(parse_uint64_option("--seed", "18446744073709551615"), std::numeric_limits<uint64_t>::max());
  for (const char* bad : {"", "-1", "18446744073709551616", "1e3", "+1", " 1"})
    EXPECT_NE(refusal([&] { parse_uint64_option("--seed", bad); }), "") << bad;
}

TEST(RunArgs, RealsAreFinite) {
  EXPECT_EQ(parse_real_option("--dropout", "0.10"), 0.1);
  for (const char* bad : {"", "nan", "inf", "-inf", "0.1x", " 0.1", "1e999"})
    EXPECT_NE(refusal([&] { parse_real_option("--dropout", bad); }), "") << bad;
}

TEST(RunArgs, MemorySizesAreOneByteTo2To63) {
  EXPECT_EQ(parse_memory_size("--memory-limit", "80GiB"), 80ull << 30);
  EXPECT_EQ(parse_memory_size("--memory-limit", "1.5GB"), 1500000000ull);
  EXPECT_EQ(parse_memory_size("--memory-limit", "1"), 1u);
  EXPECT_EQ(parse_memory_size("--memory-limit", "8EiB"), 1ull << 63);
  EXPECT_EQ(parse_memory_size("--memory-limit", "9223372036854775808"), 1ull << 63);
  for (const char* bad : {"", "0", "0.5", "1e-12GiB", "inf", "nan", "1e30", "-1GiB", "1 GiB", "1XB", "GiB", "9EiB"})
    EXPECT_NE(refusal([&] { parse_memory_size("--memory-limit", bad); }).find("--memory-limit"), std::string::npos)
        << bad;  // A size that may be zero (theory's --headroom).
  EXPECT_EQ(parse_memory_size("--headroom", "0", 0), 0u);
  EXPECT_EQ(refusal([] { parse_memory_size("--headroom", "-1GiB", 0); }),
            "--headroom must be between 0 bytes and 8EiB (2^63 bytes), got '-1GiB'");
}

TEST(RunArgs, ConfigListsHaveNoEmptyOrRepeatedEntries) {
  EXPECT_EQ(parse_config_list("--config", "sp,baseline"), (std::vector<std::string>{"sp", "baseline"}));
  for (const char* bad : {"", ",", "baseline,", ",sp", "baseline,,sp", "sp,sp", "sp,full,sp", "bogus"})
    EXPECT_NE(refusal([&] { parse_config_list("--config", bad); }), "") << bad;
}

TEST(RunArgs, EveryOverflowingCountIsNamed) {
  EXPECT_EQ(refusal([] { check_layer_extent({2048, 1, 25600, 160}, 128); }), "");  // 1T, a whole pipeline stage
  const struct {
    LayerDims dims;
    int64_t layers;
    const char* quantity;
  } cases[] = {
      {{1ll << 32, 1ll << 32, 64, 4}, 1, "tokens (seq x batch)"},
      {{32, INT64_MAX, 64, 4}, 1, "tokens (seq x batch)"},
      {{1ll << 30, 1ll << 30, 64, 4}, 1, "activation elements"},
      {{1ll << 20, 1ll << 20, 1 << 20, 4}, 1, "MLP activation bytes"},
      {{1ll << 31, 2, 64, 4}, 1, "attention scores"},
      {{32, 2, 1ll << 32, 4}, 1, "parameter elements"},
      {{32, 2, 1ll << 29, 4}, 1, "bytes of one layer"},
      {{2048, 1, 1ll << 24, 4}, 1024, "bytes of the stack"},
  };
  for (const auto& c : cases) {
    const std::string why = refusal([&] { check_layer_extent(c.dims, c.layers); });
    EXPECT_EQ(why.rfind(c.quantity, 0), 0u) << c.quantity << ": " << why;
    EXPECT_NE(why.find("overflows 64 bits"), std::string::npos) << why;
  }
}

TEST(RunArgs, OutputDirectoriesAreCheckedWithoutCreatingThem) {
  const std::string root = ::testing::TempDir() + "/actbench_run_args_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/dump");
  std::ofstream(root + "/dump/full") << "a file\n";
  EXPECT_EQ(refusal([&] { check_output_dir("--dump", root + "/dump"); }), "");
  EXPECT_EQ(refusal([&] { check_output_dir("--dump", root + "/dump/baseline"); }), "");
  EXPECT_EQ(refusal([&] { check_output_dir("--dump", root + "/new/deeper/still/"); }), "");
  EXPECT_FALSE(std::filesystem::exists(root + "/new"));
  EXPECT_NE(refusal([&] { check_output_dir("--dump", root + "/dump/full"); }).find("is not a directory"), std::string::npos);
  EXPECT_NE(refusal([&] { check_output_dir("--dump", root + "/dump/full/x"); }).find("is not a directory"),
            std::string::npos);
  EXPECT_NE(refusal([&] { check_output_dir("--dump", ""); }), "");
  EXPECT_EQ(refusal([&] { check_output_dir("--dump", "relative_dir_not_there"); }), "");
  std::filesystem::remove_all(root);
}

TEST(RunArgs, ArgumentHashesTellValuesApart) {
  EXPECT_EQ(argument_hash("0x1.99999ap-4"), argument_hash("0x1.99999ap-4"));
  EXPECT_NE(argument_hash("baseline,sp"), argument_hash("sp,baseline"));
  EXPECT_GE(argument_hash("x"), 0);
  EXPECT_LT(argument_hash("x"), int64_t{1} << 62);
}
