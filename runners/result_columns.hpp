#pragma once
// The columns of layer_run's CSVs, each declared once with its unit and meaning: the header,
// the row builder (by name) and docs/results_schema.md all come from these tables.
#include <optional>
#include <string>
#include <vector>

namespace actbench {

struct Column {
  const char* name;
  const char* unit;     // "" when the value is a name or a flag
  const char* meaning;  // markdown, one line
};

// layer_run --csv FILE: one row per configuration.
const std::vector<Column>& result_columns();
// layer_run --cupti FILE: GPU kernel time per phase, per layer and timed iteration.
const std::vector<Column>& cupti_columns();

std::vector<std::string> column_names(const std::vector<Column>& columns);

// docs/results_schema.md: both tables as markdown (layer_run --print-csv-schema).
std::string results_schema_markdown();

// One row of a column table, filled by column name. A name the table lacks, a column set
// twice or one left unset is a bug in the caller: RuntimeFailure, never a shifted row.
class CsvRow {
 public:
  explicit CsvRow(const std::vector<Column>& columns);
  void set(const std::string& name, std::string value);
  // The values in the table's order.
  std::vector<std::string> fields() const;

 private:
  const std::vector<Column>& columns_;
  std::vector<std::optional<std::string>> values_;
};

}  // namespace actbench
