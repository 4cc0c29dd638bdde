#pragma once
// actbench's shared facts as JSON, for the Python scripts (runners/facts.json, written by
// actbench_facts): the model presets with every field, the configurations with their policy
// in the canonical order, the paper's five, the attention modes and the architectures, each
// preset's and architecture's layer spec and the names and bounds of the spec's options.
#include <string>

namespace actbench {

// The whole document, two-space indented, ending in a newline.
std::string facts_json();

}  // namespace actbench
