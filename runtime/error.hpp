#pragma once
// Error types shared by every layer of actbench. Bad user input and out-of-memory are
// distinct so that runners can map them to exit status 2 and 3 (docs/layer_run.md, "Contracts").
#include <stdexcept>
#include <string>

namespace actbench {

// Invalid configuration or arguments: one clear line, exit status 2.
struct InvalidArgument : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An allocation that the memory source (or the configured capacity) cannot satisfy.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failed library call (MPI, CUDA, NCCL, file I/O): message carries file and line.
struct RuntimeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_failure(const char* file, int line, const std::string& what);

}  // namespace actbench

#define ACTBENCH_CHECK(cond, msg)                                              \
  do {                                                                         \
    if (!(cond)) ::actbench::throw_failure(__FILE__, __LINE__, std::string(msg)); \
  } while (0)
