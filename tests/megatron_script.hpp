#pragma once
// The launch-script tests' one way to read a script's words as theory memory reads them
// (runners/megatron_args.hpp, not strict: the launcher's own words are skipped).
#include <string>

#include "runners/megatron_args.hpp"

namespace actbench::testing {

inline MegatronFlags flags_of(const std::string& script) {
  MegatronFlags f;
  apply_megatron_words(shell_words(script, "test"), false, "test", f);
  return f;
}

}  // namespace actbench::testing
