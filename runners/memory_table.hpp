#pragma once
// theory memory's CSV: one row per pipeline stage of theory::step_memory, every column declared
// once below with its unit and meaning (docs/step_memory.md prints the same list).
#include <string>
#include <vector>

#include "runners/theory_tables.hpp"
#include "theory/step_memory.hpp"

namespace actbench::tables {

struct MemoryColumn {
  const char* name;
  const char* unit;
  const char* meaning;
  std::string (*cell)(const theory::StageMemory& s);
};
const std::vector<MemoryColumn>& memory_columns();

Table memory_table(const std::vector<theory::StageMemory>& stages);

}  // namespace actbench::tables
