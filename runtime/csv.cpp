#include "runtime/csv.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/error.hpp"

namespace fs = std::filesystem;

namespace actbench {

std::string csv_escape(const std::string& field) {
  if (field.find_first_of(",\"\n\r") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ',';
    line += csv_escape(fields[i]);
  }
  return line + "\n";
}

std::vector<std::vector<std::string>> csv_parse(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;  // any: the row has begun (a comma or a quote counts)
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else field += c;
      continue;
    }
    if (c == '"') quoted = true, any = true;
    else if (c == ',') row.push_back(field), field.clear(), any = true;
    else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) row.push_back(field), rows.push_back(row);
      row.clear(), field.clear(), any = false;
    } else field += c, any = true;
  }
  if (any || !field.empty()) row.push_back(field), rows.push_back(row);
  return rows;
}

void write_file_atomic(const std::string& path, const std::string& data) {
  const fs::path target(path);
  std::string name = ".";  // hidden, beside the target: same file system, so rename is atomic
  name += target.filename().string();
  name += ".tmp." + std::to_string(::getpid());
  const fs::path tmp = target.parent_path() / name;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw InvalidArgument("cannot write " + tmp.string());
    f << data;
    f.flush();
    if (!f) throw InvalidArgument("cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw InvalidArgument("cannot rename " + tmp.string() + " to " + path + ": " + ec.message());
  }
}

namespace {

// Holds an fd with an exclusive flock for its lifetime.
class LockedFile {
 public:
  LockedFile(const std::string& path, int flags) : path_(path) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) throw InvalidArgument("cannot open CSV '" + path + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      throw RuntimeFailure("cannot lock CSV '" + path + "': " + std::strerror(errno));
    }
  }
  ~LockedFile() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  int fd() const { return fd_; }

  // The first line of the file (without newline); empty for an empty file.
  std::string first_line() const {
    std::string line;
    char buf[4096];
    off_t off = 0;
    for (;;) {
      ssize_t n = ::pread(fd_, buf, sizeof buf, off);
      if (n <= 0) break;
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] == '\n') return line;
        line += buf[i];
      }
      off += n;
    }
    return line;
  }
  // Whether the file ends inside a line (a killed writer, a truncated copy, a header
  // written without its newline): the next row must then start on a fresh line.
  bool ends_mid_line() const {
    const off_t n = size();
    if (n == 0) return false;
    char last = '\n';
    if (::pread(fd_, &last, 1, n - 1) != 1) throw RuntimeFailure("cannot read CSV '" + path_ + "': " + std::strerror(errno));
    return last != '\n';
  }
  off_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw RuntimeFailure("cannot stat CSV '" + path_ + "'");
    return st.st_size;
  }
  void write_all(const std::string& data) const {
    // One write() with O_APPEND: the row lands whole at the end or not at all.
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n != static_cast<ssize_t>(data.size()))
      throw RuntimeFailure("short write to CSV '" + path_ + "': " + std::strerror(errno));
    ::fsync(fd_);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

CsvAppender::CsvAppender(std::string path, std::vector<std::string> header)
    : path_(std::move(path)), header_(std::move(header)) {}

void CsvAppender::check() const {
  if (path_.empty()) throw InvalidArgument("--csv needs a file name");
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    // Not there yet: the directory must exist and be writable.
    std::string dir = ".";
    if (const size_t slash = path_.rfind('/'); slash != std::string::npos) dir = slash == 0 ? "/" : path_.substr(0, slash);
    struct stat dst {};
    if (::stat(dir.c_str(), &dst) != 0 || !S_ISDIR(dst.st_mode) || ::access(dir.c_str(), W_OK | X_OK) != 0)
      throw InvalidArgument("cannot write CSV '" + path_ + "': '" + dir + "' is not a writable directory");
    return;
  }
  if (!S_ISREG(st.st_mode)) throw InvalidArgument("CSV '" + path_ + "' is not a regular file");
  if (::access(path_.c_str(), W_OK) != 0) throw InvalidArgument("CSV '" + path_ + "' is not writable");
  LockedFile f(path_, O_RDONLY);
  std::string first = f.first_line();
  std::string expected = csv_line(header_);
  expected.pop_back();
  if (f.size() > 0 && first != expected)
    throw InvalidArgument("CSV '" + path_ + "' has a different header (written by another version?); use a new file");
}

void CsvAppender::append(const std::vector<std::string>& row) const {
  if (row.size() != header_.size())
    throw RuntimeFailure("CSV row has " + std::to_string(row.size()) + " fields, header " + std::to_string(header_.size()));
  LockedFile f(path_, O_RDWR | O_APPEND | O_CREAT);
  std::string data;
  std::string expected = csv_line(header_);
  if (f.size() == 0) {
    data = expected;
  } else if (f.first_line() + "\n" != expected) {
    throw InvalidArgument("CSV '" + path_ + "' has a different header (written by another version?); use a new file");
  } else if (f.ends_mid_line()) {
    data = "\n";  // never glue the row onto a fragment; readers report the fragment
  }
  data += csv_line(row);
  f.write_all(data);
}

}  // namespace actbench
