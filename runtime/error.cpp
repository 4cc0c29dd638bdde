#include "runtime/error.hpp"

namespace actbench {

void throw_failure(const char* file, int line, const std::string& what) {
  throw RuntimeFailure(std::string(file) + ":" + std::to_string(line) + ": " + what);
}

}  // namespace actbench
