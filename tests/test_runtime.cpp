// Runtime pieces: Philox, 16-bit conversions, CSV appends, .npy, communicators, shard maps.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
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

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void spit(const std::string& path, const std::string& data) { std::ofstream(path, std::ios::binary | std::ios::trunc) << data; }
// The rows a reader takes from an appended-to CSV: its whole rows, never the unfinished last one.
std::vector<std::vector<std::string>> whole_rows(const std::string& text) {
  return csv_parse(text.substr(0, csv_whole_rows_end(text)));
}
// An appended row as layer_run writes it: long, with fields that need quotes (commas, quotes).
std::vector<std::string> long_row(size_t command_bytes) {
  std::string command = "layer_run --config \"baseline,sp\"";
  while (command.size() < command_bytes) command += " --seed 0000000000000000000000000001234,\"x\"";
  return {"22b", "oom, rank 0: \"cuda\" out of memory", command, "2048"};
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

// A writer killed at any byte of its row (one write() cut short) leaves its whole rows readable
// and the unfinished row unread; the next append cuts that row away, says so once, and the
// file is then exactly the whole rows and the new one.
TEST(Csv, AKillAtAnyByteCostsOnlyTheRowBeingWritten) {
  // Thousands of appends, each synced: in memory where there is a tmpfs.
  const std::string path = (::access("/dev/shm", W_OK) == 0 ? "/dev/shm/actbench_" + std::to_string(::getpid())
                                                             : temp_path("")) + "killed.csv";
  const std::vector<std::string> header = {"model", "message", "command", "seq"};
  const std::vector<std::string> first = {"tiny", "", "layer_run --model tiny", "32"}, next = {"1t", "", "c", "1"};
  const std::vector<std::string> killed = long_row(5000);  // crosses a 4 KiB page
  CsvAppender csv(path, header);
  auto append_next = [&] {
    ::testing::internal::CaptureStderr();
    csv.append(next);
    return ::testing::internal::GetCapturedStderr();
  };
  const std::string head = csv_line(header) + csv_line(first), row = csv_line(killed);
  for (size_t cut = 0; cut <= row.size(); ++cut) {
    const bool whole = cut == row.size();
    spit(path, head + row.substr(0, cut));
    std::vector<std::vector<std::string>> expected = {header, first};
    if (whole) expected.push_back(killed);
    ASSERT_EQ(whole_rows(slurp(path)), expected) << "cut at byte " << cut;
    const std::string said = append_next();
    ASSERT_EQ(slurp(path), head + (whole ? row : "") + csv_line(next)) << "cut at byte " << cut;
    ASSERT_EQ(said.find("removed an unfinished last row") != std::string::npos, cut > 0 && !whole) << said;
  }
  // The first write of a file (its header and first row together) cut anywhere: the header
  // is written again, not taken for a different one.
  const std::string header_line = csv_line(header);
  for (size_t cut = 0; cut < head.size(); ++cut) {
    spit(path, head.substr(0, cut));
    ASSERT_EQ(whole_rows(slurp(path)).size(), cut < header_line.size() ? 0u : 1u) << "cut at byte " << cut;
    csv.check();
    append_next();
    ASSERT_EQ(slurp(path), header_line + csv_line(next)) << "cut at byte " << cut;
  }
  std::remove(path.c_str());
}

// A SIGKILL while a process writes ~1 MB rows, sent when the file's size shows a row half
// written: whatever it cut, the rows on disk are whole and the next append continues the file
// with a whole row.
TEST(Csv, SigkillDuringAMegabyteRowLeavesOnlyWholeRows) {
  const std::string path = temp_path("sigkill.csv");
  std::vector<std::string> header, row;
  for (int i = 0; i < 9; ++i) {
    header.push_back(std::string("c").append(std::to_string(i)));
    row.push_back(std::string(kMaxCsvFieldBytes - 9, static_cast<char>('a' + i)) + ",\"quoted\"");
  }
  const CsvAppender csv(path, header);
  const off_t head = static_cast<off_t>(csv_line(header).size()), row_bytes = static_cast<off_t>(csv_line(row).size());
  auto size_of = [&] {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_size : off_t{0};
  };
  int cut_rows = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::remove(path.c_str());
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        for (int i = 0; i < 20; ++i) csv.append(row);
      } catch (...) {
      }
      ::_exit(0);
    }
    for (int polls = 0; polls < 200000; ++polls) {
      const off_t size = size_of();
      if (size > head + row_bytes * attempt && (size - head) % row_bytes != 0) break;
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    const std::string text = slurp(path);
    cut_rows += csv_whole_rows_end(text) < text.size();
    const auto rows = whole_rows(text);
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], i == 0 ? header : row) << "row " << i;
    ::testing::internal::CaptureStderr();
    csv.append(row);
    ::testing::internal::GetCapturedStderr();
    const std::string after = slurp(path);
    ASSERT_EQ(csv_whole_rows_end(after), after.size());
    ASSERT_EQ(whole_rows(after).size(), std::max<size_t>(rows.size(), 1) + 1);
  }
  std::remove(path.c_str());
  std::printf("SIGKILL left an unfinished row in %d of 3 attempts\n", cut_rows);
}

// A write that fails part-way (here the file size limit: EFBIG, as a full disk gives ENOSPC)
// leaves the file as it was and names the cause.
TEST(Csv, AFailedWriteLeavesTheFileAsItWasAndSaysWhy) {
  const std::string path = temp_path("short.csv");
  std::remove(path.c_str());
  const CsvAppender csv(path, {"a", "b"});
  csv.append({"1", "2"});
  const std::string before = slurp(path);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit limit {static_cast<rlim_t>(before.size() + 100), RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    const std::string message = error_of([&] { csv.append({"3", std::string(5000, 'x')}); });
    (void)!::write(pipe_fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  char buf[512];
  const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
  ::close(pipe_fds[0]);
  ::waitpid(pid, nullptr, 0);
  const std::string message(buf, n > 0 ? static_cast<size_t>(n) : 0);
  EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
  EXPECT_EQ(message.find("Success"), std::string::npos) << message;
  EXPECT_EQ(slurp(path), before);
}

// One limit for writers and readers: a field of kMaxCsvFieldBytes is written, a longer one or
// one with a line break is refused before anything is written.
TEST(Csv, FieldsAreBoundedAndHoldNoLineBreak) {
  const std::string path = temp_path("limit.csv");
  std::remove(path.c_str());
  const CsvAppender csv(path, {"a", "command"});
  csv.append({"1", std::string(kMaxCsvFieldBytes, 'y')});
  const std::string before = slurp(path);
  EXPECT_EQ(whole_rows(before).at(1).at(1).size(), kMaxCsvFieldBytes);
  for (const std::string& bad : {std::string(kMaxCsvFieldBytes + 1, 'y'), std::string("two\nlines"),
                                 std::string("a\rb")}) {
    const std::string message = error_of([&] { csv.append({"2", bad}); });
    EXPECT_NE(message.find("CSV field 'command'"), std::string::npos) << message;
    EXPECT_THROW(csv.append({"2", bad}), InvalidArgument);
  }
  EXPECT_EQ(slurp(path), before);
}

// Rows end in \n: a file whose header line ends in \r\n is refused, with that reason, by
// check() and append() alike (runners/results_csv.py check_appendable says the same).
TEST(Csv, AHeaderLineEndingInCrLfIsRefused) {
  const std::string path = temp_path("crlf.csv");
  spit(path, "a,b\r\n1,2\r\n");
  const CsvAppender csv(path, {"a", "b"});
  EXPECT_NE(error_of([&] { csv.check(); }).find("line ends differ"), std::string::npos);
  EXPECT_NE(error_of([&] { csv.append({"3", "4"}); }).find("line ends differ"), std::string::npos);
  EXPECT_EQ(slurp(path), "a,b\r\n1,2\r\n");
  spit(path, "a,c\n");
  EXPECT_NE(error_of([&] { csv.check(); }).find("different header"), std::string::npos);
  spit(path, "a,");  // an unfinished header line is ours, cut short
  csv.check();
  spit(path, "x");  // but not any text without a line end
  EXPECT_THROW(csv.check(), InvalidArgument);
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
  EXPECT_EQ(csv_whole_rows_end("a,b\n1,2\n3,"), 8u);
  EXPECT_EQ(csv_whole_rows_end("a,b\n"), 4u);
  EXPECT_EQ(csv_whole_rows_end("a,b"), 0u);
}

// The temporary name beside the target is ours: a FIFO or a link left there is replaced, not
// opened (opening a FIFO for writing would wait for a reader forever).
TEST(Csv, WriteFileAtomicReplacesWhateverHoldsItsTemporaryName) {
  const std::string dir = "/tmp/actbench_atomic_" + std::to_string(::getpid());
  const std::string tmp = dir + "/.t.txt.tmp." + std::to_string(::getpid());
  ASSERT_EQ(::system(("rm -rf " + dir + " && mkdir -p " + dir + " && mkfifo " + tmp).c_str()), 0);
  actbench::write_file_atomic(dir + "/t.txt", "whole\n");
  std::ifstream in(dir + "/t.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "whole\n");
  ASSERT_EQ(::system(("ln -s /etc/hostname " + tmp + " && rm -f " + dir + "/t.txt").c_str()), 0);
  actbench::write_file_atomic(dir + "/t.txt", "again\n");
  std::ifstream again(dir + "/t.txt");
  std::string text2((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text2, "again\n");
  ASSERT_EQ(::system(("rm -rf " + dir).c_str()), 0);
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
    for (const ParamInfo& p : layer_param_table(LayerDims{1, 1, h, 3})) {
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
  ParamInfo qkv = layer_param_table(LayerDims{1, 1, h, 3})[2];
  ShardSpec s = param_shard(qkv, 2, 1);
  EXPECT_EQ(s.canonical_index(6 * h), (12 + 6) * h);
}

