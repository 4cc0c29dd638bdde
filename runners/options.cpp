#include "runners/options.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "runtime/error.hpp"
#include "runtime/user_file.hpp"

namespace actbench {
namespace {

[[noreturn]] void refuse(const std::string& what) { throw InvalidArgument(what); }

void require_text(const std::string& option, const std::string& text) {
  if (text.empty()) refuse(option + " needs a value (got an empty string)");
}

std::string quoted(const std::string& text) {
  std::string out = "'";
  out += printable(text);
  out += '\'';
  return out;
}

}  // namespace

std::string float32_text(float v) {
  char buf[32] = "";
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    double back = 0;
    std::from_chars(buf, buf + std::strlen(buf), back);
    if (static_cast<float>(back) == v) break;
  }
  return buf;
}

std::string printable(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else out += c;
  }
  return out;
}

int64_t parse_int_option(const std::string& option, const std::string& text, int64_t min, int64_t max) {
  require_text(option, text);
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const std::string range = max == std::numeric_limits<int64_t>::max()
                                ? ">= " + std::to_string(min)
                                : "in " + std::to_string(min) + ".." + std::to_string(max);
  if (ec == std::errc::result_out_of_range && ptr == end) {
    // Past 64 bits: above an option's own maximum, or above the largest 64-bit integer.
    const bool unbounded_above = max == std::numeric_limits<int64_t>::max() && text[0] != '-';
    refuse(option + " must be " + (unbounded_above ? "at most " + std::to_string(max) : range) + ", got " + text);
  }
  if (ec != std::errc() || ptr != end) refuse(option + " expects a whole number, got " + quoted(text));
  if (v < min || v > max) refuse(option + " must be " + range + ", got " + text);
  return v;
}

uint64_t parse_uint64_option(const std::string& option, const std::string& text) {
  require_text(option, text);
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end)
    refuse(option + " expects a whole number in 0.." + std::to_string(std::numeric_limits<uint64_t>::max()) +
           ", got " + quoted(text));
  return v;
}

double parse_real_option(const std::string& option, const std::string& text) {
  require_text(option, text);
  double v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || !std::isfinite(v))
    refuse(option + " expects a finite number, got " + quoted(text));
  return v;
}

uint64_t parse_memory_size(const std::string& option, const std::string& text, uint64_t min_bytes) {
  require_text(option, text);
  double v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if ((ec != std::errc() && ec != std::errc::result_out_of_range) || ptr == text.data())
    refuse(option + " expects a size such as 80GiB, got " + quoted(text));
  const std::string unit(ptr, end);
  static const std::pair<const char*, long double> kUnits[] = {
      {"", 1.0L},          {"B", 1.0L},          {"KiB", 0x1p10L},   {"MiB", 0x1p20L}, {"GiB", 0x1p30L},
      {"TiB", 0x1p40L},    {"PiB", 0x1p50L},     {"EiB", 0x1p60L},   {"KB", 1e3L},     {"MB", 1e6L},
      {"GB", 1e9L},        {"TB", 1e12L},        {"PB", 1e15L},      {"EB", 1e18L}};
  long double mult = 0;
  for (const auto& [name, m] : kUnits)
    if (unit == name) mult = m;
  if (mult == 0)
    refuse(option + " has an unknown unit in " + quoted(text) + " (use B, KiB, MiB, GiB, TiB, PiB, EiB, KB, MB, GB, TB, PB, EB)");
  const long double bytes = static_cast<long double>(v) * mult;
  // inf, nan, 0.5 bytes and 1e30 bytes alike: a size is a whole count of bytes in min..2^63.
  if (ec != std::errc() || !std::isfinite(v) || !(bytes >= static_cast<long double>(min_bytes)) || bytes > 0x1p63L)
    refuse(option + " must be between " + std::to_string(min_bytes) + (min_bytes == 1 ? " byte" : " bytes") +
           " and 8EiB (2^63 bytes), got " + quoted(text));
  return static_cast<uint64_t>(std::floor(bytes));
}

void check_output_dir(const std::string& option, const std::string& dir) {
  require_text(option, dir);
  auto writable_dir = [&](const std::string& path, const struct stat& st) {
    if (!S_ISDIR(st.st_mode))
      refuse(option + " " + quoted(dir) + ": " + quoted(path) + " exists and is not a directory");
    if (::access(path.c_str(), W_OK | X_OK) != 0) refuse(option + " " + quoted(dir) + ": " + quoted(path) + " is not writable");
  };
  // From the path up to its nearest existing ancestor, which must be a writable directory.
  std::string path = dir;
  for (;;) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) return writable_dir(path, st);
    if ((errno != ENOENT && errno != ENOTDIR) || path == "." || path == "/")
      refuse(option + " " + quoted(dir) + ": cannot inspect " + quoted(path) + ": " + std::strerror(errno));
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) path = std::string(".");
    else path.resize(slash == 0 ? 1 : slash);  // the parent ("/" for "/x")
  }
}

void check_output_file(const std::string& option, const std::string& path) {
  require_text(option, path);
  check_user_file(option + " " + quoted(path), path, /*must_exist=*/false);
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    refuse(option + " " + quoted(path) + ": its folder " + quoted(dir) + " does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    refuse(option + " " + quoted(path) + ": its folder " + quoted(dir) + " is not writable");
}

}  // namespace actbench
