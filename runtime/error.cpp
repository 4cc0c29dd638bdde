#include "runtime/error.hpp"

namespace actbench {

void throw_failure(const char* file, int line, const std::string& what) {
  // Appended piecewise: GCC 12 warns (falsely, -Wrestrict) on a chain of operator+.
  std::string msg(file);
  msg += ':';
  msg += std::to_string(line);
  msg += ": ";
  msg += what;
  throw RuntimeFailure(msg);
}

}  // namespace actbench
