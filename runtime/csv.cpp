#include "runtime/csv.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/error.hpp"

namespace fs = std::filesystem;

namespace actbench {

void check_csv_field(const std::string& what, const std::string& value) {
  if (value.size() > kMaxCsvFieldBytes)
    throw InvalidArgument(what + " is " + std::to_string(value.size()) + " bytes long; a CSV field holds at most " +
                          std::to_string(kMaxCsvFieldBytes));
  if (value.find_first_of("\n\r") != std::string::npos)
    throw InvalidArgument(what + " holds a line break; a CSV row is one line");
}

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

size_t csv_whole_rows_end(const std::string& text) {
  const size_t last = text.rfind('\n');
  return last == std::string::npos ? 0 : last + 1;
}

void write_file_atomic(const std::string& path, const std::string& data) {
  const fs::path target(path);
  std::string name = ".";  // hidden, beside the target: same file system, so rename is atomic
  name += target.filename().string();
  name += ".tmp." + std::to_string(::getpid());
  const fs::path tmp = target.parent_path() / name;
  auto fail = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InvalidArgument("cannot " + what + " " + tmp.string() + ": " + why);
  };
  // The name is ours: whatever a killed run (or anyone) left there is replaced, never opened,
  // so a FIFO or a link at that name cannot block the write or redirect it.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT && errno != EISDIR) fail("replace");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail("write");
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;  // no progress and no reason given
      ::close(fd);
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail("write");
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
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;

  // The file's first line, its "\n" included, or its first `limit` bytes when they hold none.
  std::string first_line(size_t limit) const {
    std::string head(limit, '\0');
    size_t got = 0;
    while (got < limit) {
      const ssize_t n = read_at(head.data() + got, limit - got, static_cast<off_t>(got));
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    head.resize(got);
    const size_t end = head.find('\n');
    return end == std::string::npos ? head : head.substr(0, end + 1);
  }
  // Just after the file's last "\n" (0 without one): the end of its whole rows.
  off_t whole_rows_end() const {
    char buf[65536];
    for (off_t end = size(); end > 0;) {
      const off_t start = end > off_t{sizeof buf} ? end - off_t{sizeof buf} : 0;
      const ssize_t n = read_at(buf, end - start, start);
      for (ssize_t i = n - 1; i >= 0; --i)
        if (buf[i] == '\n') return start + i + 1;
      end = start;
    }
    return 0;
  }
  off_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw RuntimeFailure("cannot stat CSV '" + path_ + "': " + std::strerror(errno));
    return st.st_size;
  }
  void truncate(off_t length) const {
    if (::ftruncate(fd_, length) != 0)
      throw RuntimeFailure("cannot truncate CSV '" + path_ + "': " + std::strerror(errno));
  }
  // Appends all of `data` (the fd is O_APPEND) and syncs it. A write that fails part-way (a
  // full disk, a file size limit) is taken back, so the file ends where it ended before.
  void append_all(const std::string& data) const {
    const off_t before = size();
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_append(before, n < 0 ? errno : EIO);
      done += static_cast<size_t>(n);
    }
    if (::fsync(fd_) != 0) fail_append(before, errno);
  }

 private:
  ssize_t read_at(char* buf, size_t n, off_t off) const {
    const ssize_t got = ::pread(fd_, buf, n, off);
    if (got < 0) throw RuntimeFailure("cannot read CSV '" + path_ + "': " + std::strerror(errno));
    return got;
  }
  [[noreturn]] void fail_append(off_t before, int error) const {
    const bool restored = ::ftruncate(fd_, before) == 0;
    throw RuntimeFailure("cannot append to CSV '" + path_ + "': " + std::strerror(error) +
                         (restored ? " (the file is left as it was)" : " (and it cannot be cut back: check its end)"));
  }

  std::string path_;
  int fd_ = -1;
};

// Whether a file whose first line is `first` ("\n" included when it has one; at most one byte
// longer than ours is read) can take rows under `header_line` (with its "\n"): the same line,
// byte for byte, or a header line its writer was killed in the middle of (no "\n" yet, a
// prefix of ours: it is written again).
void check_header_line(const std::string& path, const std::string& first, const std::string& header_line) {
  if (first.empty() || first == header_line) return;
  if (first.back() != '\n' && header_line.compare(0, first.size(), first) == 0) return;
  std::string without_cr = first;
  if (first.size() >= 2 && first.compare(first.size() - 2, 2, "\r\n") == 0) without_cr.erase(first.size() - 2, 1);
  if (without_cr == header_line)
    throw InvalidArgument("CSV '" + path + "' has this header, but its line ends differ (\\r\\n where rows end in "
                          "\\n); use a new file");
  throw InvalidArgument("CSV '" + path + "' has a different header (written by another version?); use a new file");
}

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
  const std::string header_line = csv_line(header_);
  check_header_line(path_, f.first_line(header_line.size() + 1), header_line);
}

void CsvAppender::append(const std::vector<std::string>& row) const {
  if (row.size() != header_.size())
    throw RuntimeFailure("CSV row has " + std::to_string(row.size()) + " fields, header " + std::to_string(header_.size()));
  for (size_t i = 0; i < row.size(); ++i) check_csv_field("CSV field '" + header_[i] + "'", row[i]);
  LockedFile f(path_, O_RDWR | O_APPEND | O_CREAT);
  const std::string header_line = csv_line(header_);
  check_header_line(path_, f.first_line(header_line.size() + 1), header_line);
  // Under the lock no writer is mid-row: what follows the last "\n" was left by a killed one.
  const off_t whole = f.whole_rows_end(), size = f.size();
  if (whole < size) {
    std::fprintf(stderr, "actbench: warning: CSV '%s': removed an unfinished last row (%lld bytes; its writer "
                         "stopped mid-row)\n", path_.c_str(), static_cast<long long>(size - whole));
    f.truncate(whole);
  }
  f.append_all((whole == 0 ? header_line : std::string()) + csv_line(row));
}

}  // namespace actbench
