// Runtime pieces: Philox, 16-bit conversions, CSV appends, .npy, communicators, shard maps.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "kernels/backend.hpp"
#include "layers/params.hpp"
#include "runtime/communicator.hpp"
#include "runtime/csv.hpp"
#include "runtime/dtype.hpp"
#include "runtime/error.hpp"
#include "runtime/npy.hpp"
#include "runtime/philox.hpp"
#include "runtime/user_file.hpp"

using namespace actbench;

namespace {
std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/actbench_" + std::to_string(::getpid()) + "_" + name;
}
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  return lines;
}
}  // namespace

// Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32_10).
TEST(Philox, KnownAnswers) {
  Philox4 z = philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
  Philox4 f = philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(f.v[0], 0x408f276du);
  EXPECT_EQ(f.v[1], 0x41c83b0eu);
  EXPECT_EQ(f.v[2], 0xa20bc7c6u);
  EXPECT_EQ(f.v[3], 0x6d5451fdu);
  Philox4 pi = philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdcceBu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Philox, WordsOfOneBlockAndDistinctStreams) {
  // Four consecutive indices share a counter block; the words are that block's outputs.
  Philox4 blk = philox4x32_10({{5, 0, 3, kSiteMlpOut}}, 42, 0);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(philox_word(42, 3, kSiteMlpOut, 20 + i), blk.v[i]);
  EXPECT_NE(philox_word(42, 3, kSiteMlpOut, 0), philox_word(42, 3, kSiteAttnOut, 0));
  EXPECT_NE(philox_word(42, 3, kSiteMlpOut, 0), philox_word(42, 4, kSiteMlpOut, 0));
  EXPECT_NE(philox_word(42, 3, kSiteMlpOut, 0), philox_word(43, 3, kSiteMlpOut, 0));
  EXPECT_EQ(dropout_threshold(0.f), 0u);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += philox_uniform_pm1(7, 0, 1, i);
  EXPECT_NEAR(sum / 100000, 0.0, 0.01);  // uniform on [-1, 1): sd of the mean ~ 0.0018
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_THROW(parse_dtype("int8"), InvalidArgument);
}

TEST(DType, Fp16RoundTripAndSpecials) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f /*min normal*/, 5.96046448e-08f /*min subnormal*/})
    EXPECT_EQ(fp16_to_float(float_to_fp16(v)), v) << v;
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(70000.f), 0x7c00);                    // overflow to inf
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
  // every finite half survives half -> float -> half
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    ASSERT_EQ(float_to_fp16(fp16_to_float(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Csv, EscapesAndWritesHeaderOnce) {
  EXPECT_EQ(csv_escape("plain"), "plain");
  EXPECT_EQ(csv_escape("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_escape("say \"x\""), "\"say \"\"x\"\"\"");
  std::string path = temp_path("once.csv");
  std::remove(path.c_str());
  CsvAppender csv(path, {"a", "b_ms"});
  csv.check();
  csv.append({"1", "2.5"});
  csv.append({"x,y", "3"});
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "a,b_ms");
  EXPECT_EQ(lines[2], "\"x,y\",3");
  EXPECT_THROW(csv.append({"only one"}), RuntimeFailure);
  CsvAppender other(path, {"a", "c"});
  EXPECT_THROW(other.check(), InvalidArgument);
  EXPECT_THROW(other.append({"1", "2"}), InvalidArgument);
  EXPECT_EQ(read_lines(path).size(), 3u);
  EXPECT_THROW(CsvAppender("/nonexistent-dir/x.csv", {"a"}).check(), InvalidArgument);
}

TEST(Csv, RowStartsOnAFreshLineAfterAFragment) {
  std::string path = temp_path("fragment.csv");
  std::remove(path.c_str());
  CsvAppender csv(path, {"a", "b_ms"});
  {
    std::ofstream f(path);
    f << "a,b_ms";  // a header written without its newline
  }
  csv.check();
  csv.append({"1", "2"});
  EXPECT_EQ(read_lines(path), (std::vector<std::string>{"a,b_ms", "1,2"}));
  {
    std::ofstream f(path, std::ios::app);
    f << "3,";  // a writer killed mid-row
  }
  csv.append({"4", "5"});
  csv.append({"6", "7"});
  EXPECT_EQ(read_lines(path), (std::vector<std::string>{"a,b_ms", "1,2", "3,", "4,5", "6,7"}));
}

TEST(Csv, ParseReadsWhatCsvLineWrites) {
  const std::vector<std::vector<std::string>> rows = {
      {"a", "b_ms", "note"}, {"1", "", "x,y"}, {"say \"hi\"", "2", "two\nlines"}, {"", "", ""}};
  std::string text;
  for (const auto& r : rows) text += csv_line(r);
  EXPECT_EQ(csv_parse(text), rows);
  // \r\n and \r end rows too, blank lines are skipped, the last row needs no newline.
  EXPECT_EQ(csv_parse("a,b\r\n\r\n1,2\r3,4"),
            (std::vector<std::vector<std::string>>{{"a", "b"}, {"1", "2"}, {"3", "4"}}));
  EXPECT_TRUE(csv_parse("").empty());
}

TEST(Csv, WriteFileAtomicReplacesTheFileWhole) {
  const std::string path = temp_path("atomic.csv");
  write_file_atomic(path, "a,b\n1,2\n");
  write_file_atomic(path, "a\n");
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), "a\n");
  EXPECT_THROW(write_file_atomic("/nonexistent-dir/x.csv", "a\n"), InvalidArgument);
}

TEST(Csv, ConcurrentWritersNeverInterleave) {
  std::string path = temp_path("concurrent.csv");
  std::remove(path.c_str());
  const std::vector<std::string> header = {"writer", "row", "payload"};
  const int writers = 6, rows = 150;
  std::vector<pid_t> pids;
  for (int w = 0; w < writers; ++w) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      CsvAppender csv(path, header);
      for (int r = 0; r < rows; ++r) csv.append({std::to_string(w), std::to_string(r), std::string(300 + w, 'a' + w)});
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u + writers * rows);
  EXPECT_EQ(lines[0], "writer,row,payload");
  std::set<std::string> seen;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::stringstream ss(lines[i]);
    std::string w, r, payload;
    std::getline(ss, w, ',');
    std::getline(ss, r, ',');
    std::getline(ss, payload);
    int wi = std::stoi(w);
    ASSERT_EQ(payload, std::string(300 + wi, 'a' + wi)) << "line " << i;
    seen.insert(w + "/" + r);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(writers * rows));
}

// A user-named path that is not a regular file is refused at once (a FIFO never blocks).
TEST(UserFile, ReadsRegularFilesAndRefusesEverythingElse) {
  const std::string dir = "/tmp/actbench_user_file_" + std::to_string(::getpid());
  ASSERT_EQ(::system(("rm -rf " + dir + " && mkdir -p " + dir + " && mkfifo " + dir + "/fifo").c_str()), 0);
  { std::ofstream(dir + "/a.json") << "{}"; }
  EXPECT_EQ(actbench::read_user_file("--x", dir + "/a.json"), "{}");
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const actbench::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { actbench::read_user_file("--x", dir + "/fifo"); }), "--x: is a FIFO (named pipe), not a file");
  EXPECT_EQ(message([&] { actbench::read_user_file("--x", dir); }), "--x: is a folder, not a file");
  EXPECT_EQ(message([&] { actbench::read_user_file("--x", ""); }), "--x: an empty file name");
  EXPECT_NE(message([&] { actbench::read_user_file("--x", dir + "/missing"); }).find("No such file"), std::string::npos);
  EXPECT_NE(message([&] { actbench::read_user_file("--x", dir + "/a.json", 1); }).find("more than the 1 bytes"),
            std::string::npos);
  EXPECT_EQ(message([&] { actbench::check_user_file("--x", dir + "/missing", false); }), "no error");
  EXPECT_EQ(message([&] { actbench::check_user_file("--x", dir + "/fifo", false); }), "--x: is a FIFO (named pipe), not a file");
  ASSERT_EQ(::system(("rm -rf " + dir).c_str()), 0);
}

TEST(Npy, RoundTrip) {
  std::string path = temp_path("t.npy");
  std::vector<float> data = {1.f, -2.f, 3.5f, 0.f, 7.f, 8.f};
  write_npy_f32(path, {2, 3}, data);
  std::vector<int64_t> shape;
  EXPECT_EQ(read_npy_f32(path, &shape), data);
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 3}));
  std::ifstream f(path, std::ios::binary);
  std::string head(10, '\0');
  f.read(head.data(), 10);
  size_t header_len = static_cast<unsigned char>(head[8]) | (static_cast<unsigned char>(head[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);  // data aligned as the format asks
}

TEST(Communicator, LocalAndEmulatedSemanticsAndRingBytes) {
  auto be = make_meta_backend();
  auto host = make_host_source();
  CachingAllocator alloc(make_host_source());
  Tensor in(alloc, {2, 3}, DType::fp32), out(alloc, {8, 3}, DType::fp32), part(alloc, {2, 3}, DType::fp32);
  for (int i = 0; i < 6; ++i) in.data_as<float>()[i] = static_cast<float>(i);
  auto emu = make_emulated_communicator(4);
  emu->all_gather(in, out);
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out.data_as<float>()[r * 6 + i], static_cast<float>(i));
  emu->reduce_scatter(out, part);
  emu->all_reduce(part);
  // ring: all-gather 3/4 * 96 B, reduce-scatter 3/4 * 96 B, all-reduce 2 * 3/4 * 24 B
  EXPECT_DOUBLE_EQ(emu->stats().ring_bytes, 72.0 + 72.0 + 36.0);
  EXPECT_EQ(emu->stats().all_gather_calls, 1);
  EXPECT_EQ(emu->mode(), CommMode::modeled);
  Tensor wrong(alloc, {7, 3}, DType::fp32);
  EXPECT_THROW(emu->all_gather(in, wrong), InvalidArgument);
  auto local = make_local_communicator();
  Tensor same(alloc, {2, 3}, DType::fp32);
  local->all_gather(in, same);
  EXPECT_EQ(same.data_as<float>()[5], 5.f);
  local->all_reduce(same);
  EXPECT_DOUBLE_EQ(local->stats().ring_bytes, 0.0);
}

// runtime/'s communicators copy with memcpy: a tensor on a CUDA device is refused (its data
// pointer is a device address), not dereferenced. Here a source that says "cuda" stands in.
TEST(Communicator, HostCommunicatorsRefuseDeviceTensors) {
  struct FakeDeviceSource final : RawMemorySource {
    std::unique_ptr<RawMemorySource> host = make_host_source();
    void* allocate(size_t bytes) override { return host->allocate(bytes); }
    void release(void* p, size_t bytes) override { host->release(p, bytes); }
    Device device() const override { return Device::cuda; }
  };
  CachingAllocator dev(std::make_unique<FakeDeviceSource>());
  CachingAllocator host(make_host_source());
  Tensor in(dev, {2, 3}, DType::fp32), out(dev, {4, 3}, DType::fp32), same(dev, {2, 3}, DType::fp32);
  Tensor host_out(host, {4, 3}, DType::fp32);
  auto emu = make_emulated_communicator(2);
  EXPECT_THROW(emu->all_gather(in, out), InvalidArgument);
  EXPECT_THROW(emu->reduce_scatter(out, same), InvalidArgument);
  auto local = make_local_communicator();
  EXPECT_THROW(local->all_gather(in, same), InvalidArgument);
  Tensor host_in(host, {2, 3}, DType::fp32);
  EXPECT_THROW(emu->all_gather(host_in, out), InvalidArgument);  // either side on the device
  EXPECT_NO_THROW(emu->all_gather(host_in, host_out));
}

// Every shard map is a bijection from (rank, local index) onto the canonical tensor.
TEST(ShardSpec, ShardsTileTheCanonicalTensor) {
  const int64_t h = 12;
  for (int t : {1, 2, 3, 4}) {
    for (const ParamInfo& p : layer_param_table(h)) {
      ShardSpec s0 = param_shard(p, t, 0);
      std::vector<int> hits(static_cast<size_t>(s0.rows * s0.cols), 0);
      for (int r = 0; r < t; ++r) {
        ShardSpec s = param_shard(p, t, r);
        for (int64_t i = 0; i < s.local_numel(); ++i) hits.at(static_cast<size_t>(s.canonical_index(i)))++;
      }
      const int expected = p.kind == ShardKind::replicated ? t : 1;
      for (int hcount : hits) ASSERT_EQ(hcount, expected) << p.name << " t=" << t;
    }
  }
  // qkv: rank 1 of 2, h = 12 (6 rows of each of Q, K, V per rank): its first K row is canonical row 12 + 6
  ParamInfo qkv = layer_param_table(h)[2];
  ShardSpec s = param_shard(qkv, 2, 1);
  EXPECT_EQ(s.canonical_index(6 * h), (12 + 6) * h);
}

