#pragma once
// Every file a user names on a command line or in a plan is opened here. A path that is not a
// regular file (a folder, a FIFO, a device, a socket) is refused before anything reads from
// it, so no entry point can block forever on a FIFO nobody writes or read a folder as text.
#include <cstdint>
#include <string>

namespace actbench {

// Larger than any config, plan or results file actbench reads; a bigger file is a mistake
// (a wrong path), not input, and reading it would only exhaust memory.
constexpr uint64_t kMaxUserFileBytes = uint64_t{1} << 30;

// The whole content of the regular file `path`. InvalidArgument, one line starting with
// `what` (e.g. "--hf-config config.json"), when it is missing, unreadable, not a regular
// file or larger than max_bytes.
std::string read_user_file(const std::string& what, const std::string& path, uint64_t max_bytes = kMaxUserFileBytes);

// InvalidArgument naming `what` when `path` exists and is not a regular file, or is missing
// and must_exist. Used before a path is handed to a library that opens it itself.
void check_user_file(const std::string& what, const std::string& path, bool must_exist = true);

}  // namespace actbench
