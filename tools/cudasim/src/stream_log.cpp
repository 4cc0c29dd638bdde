// The stream log (stream_log.hpp). One line per write(2) on a file opened for appending, so
// that the NCCL stand-in's lines, written the same way, interleave in issue order.
#include "stream_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cudasim/device.hpp"

namespace cudasim {
namespace {

int log_fd() {
  static const int fd = [] {
    const char* path = std::getenv("CUDASIM_STREAM_LOG");
    if (!path || !*path) return -1;
    const std::string file = std::string(path) + "." + std::to_string(getpid());
    const int f = open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f < 0) std::fprintf(stderr, "cudasim: cannot open the stream log %s\n", file.c_str());
    return f;
  }();
  return fd;
}

std::string hex(const void* p) {
  char b[24];
  std::snprintf(b, sizeof b, "%#llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return b[0] == '0' && b[1] == '\0' ? "0x0" : b;
}

void emit(const std::string& words) {
  const std::string line = words + "\n";
  if (write(log_fd(), line.data(), line.size()) < 0) std::perror("cudasim: stream log");
}

struct Param {
  const void* p;
  bool writable;
};
thread_local std::vector<Param> t_params;  // of the launch being made

}  // namespace

namespace detail {
void launch_pointer(const void* p, bool writable) {
  if (log_fd() >= 0) t_params.push_back({p, writable});
}
}  // namespace detail

namespace stream_log {

bool enabled() { return log_fd() >= 0; }

void call_done(cudaStream_t stream, const char* kernel_name) {
  if (!enabled()) return;
  if (kernel_name) {
    std::string reads, writes;
    for (const Param& q : t_params) {
      std::string& to = q.writable ? writes : reads;
      to += (to.empty() ? "" : ",") + hex(q.p);
    }
    std::string name = kernel_name;  // one word: template arguments lose their spaces
    name.erase(std::remove(name.begin(), name.end(), ' '), name.end());
    emit("what=kernel stream=" + hex(stream) + " name=" + name + " reads=" + reads + " writes=" + writes);
  }
  t_params.clear();
}

void copy(cudaStream_t stream, const void* dst, const void* src, size_t bytes, bool host_sync) {
  if (!enabled()) return;
  const std::string n = "+" + std::to_string(bytes);
  emit("what=copy stream=" + hex(stream) + " reads=" + hex(src) + n + " writes=" + hex(dst) + n +
       (host_sync ? " host_sync=1" : ""));
}
void set(cudaStream_t stream, const void* dst, size_t bytes) {
  if (enabled()) emit("what=set stream=" + hex(stream) + " writes=" + hex(dst) + "+" + std::to_string(bytes));
}
void record(cudaStream_t stream, cudaEvent_t event) {
  if (enabled()) emit("what=record stream=" + hex(stream) + " event=" + hex(event));
}
void wait(cudaStream_t stream, cudaEvent_t event) {
  if (enabled()) emit("what=wait stream=" + hex(stream) + " event=" + hex(event));
}
void sync_stream(cudaStream_t stream) {
  if (enabled()) emit("what=sync_stream stream=" + hex(stream));
}
void sync_device() {
  if (enabled()) emit("what=sync_device");
}
void sync_event(cudaEvent_t event) {
  if (enabled()) emit("what=sync_event event=" + hex(event));
}
void stream_created(cudaStream_t stream, unsigned flags) {
  if (enabled()) emit("what=stream stream=" + hex(stream) + " flags=" + std::to_string(flags));
}

}  // namespace stream_log
}  // namespace cudasim
