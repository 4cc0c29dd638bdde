#include "runtime/user_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.hpp"

namespace actbench {
namespace {

// What `mode` is, in the words of an error line.
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& what, const std::string& why) { throw InvalidArgument(what + ": " + why); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

void check_user_file(const std::string& what, const std::string& path, bool must_exist) {
  if (path.empty()) refuse(what, "an empty file name");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT && !must_exist) return;
    refuse(what, std::string("cannot read (") + std::strerror(errno) + ")");
  }
  if (!S_ISREG(st.st_mode)) refuse(what, "is " + kind_of(st.st_mode) + ", not a file");
}

std::string read_user_file(const std::string& what, const std::string& path, uint64_t max_bytes) {
  if (path.empty()) refuse(what, "an empty file name");
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one;
  // fstat then names it. Regular files ignore the flag.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) refuse(what, std::string("cannot read (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) refuse(what, std::string("cannot read (") + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) refuse(what, "is " + kind_of(st.st_mode) + ", not a file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    refuse(what, "is " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
                     " bytes such a file can sensibly hold");
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse(what, std::string("cannot read (") + std::strerror(errno) + ")");
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > max_bytes) refuse(what, "grew past " + std::to_string(max_bytes) + " bytes while being read");
  }
  return data;
}

}  // namespace actbench
