#pragma once
// CSV, written and read in one place: csv_line writes a row, csv_parse reads a text,
// write_file_atomic writes a whole file (theory's tables), CsvAppender appends rows (results).
//
// An appended row is one line, and it is whole exactly when its "\n" is in the file: its
// fields hold no line break and at most kMaxCsvFieldBytes bytes, so whatever follows the
// file's last "\n" is an unfinished last row (being written, or its writer was killed) and
// never a row. Readers (csv_whole_rows_end here, runners/results_csv.py) leave it out.
//
// CsvAppender: the header is written once; each row is appended under an exclusive lock, so
// concurrent writers never interleave. Before appending, an unfinished last row left by a
// killed writer is cut away (said once on stderr), so a kill at any byte costs only the row
// being written. A write that fails part-way (a full disk) is taken back: the file is left as
// it was and the error names the cause. Appending to a file whose header line differs, or
// whose lines end in \r\n, is an InvalidArgument.
#include <cstddef>
#include <string>
#include <vector>

namespace actbench {

// The longest field an appended row may hold, in bytes: far more than any column needs (the
// longest is the command line), little enough that a reader holds any row at once. Exported to
// runners/facts.json for the Python readers and writers; layer_run refuses a longer command line.
constexpr size_t kMaxCsvFieldBytes = 131072;

// InvalidArgument, one line naming `what`, when `value` cannot be a field of an appended row:
// longer than kMaxCsvFieldBytes, or holding a line break (\n or \r: a row is one line).
void check_csv_field(const std::string& what, const std::string& value);

std::string csv_escape(const std::string& field);
std::string csv_line(const std::vector<std::string>& fields);

// The rows of a CSV text (RFC 4180: quoted fields may hold commas, doubled quotes and line
// breaks; a row ends at \n, \r\n or \r; empty lines are skipped).
std::vector<std::vector<std::string>> csv_parse(const std::string& text);

// Where the whole rows of an appended-to CSV text end: just after its last "\n" (0 when it has
// none). text.substr(result) is an unfinished last row, not a row.
size_t csv_whole_rows_end(const std::string& text);

// Writes `data` to a temporary name beside `path` and renames it over `path`, so a reader
// sees the old file or the whole new one, never half. Throws InvalidArgument when it cannot.
void write_file_atomic(const std::string& path, const std::string& data);

class CsvAppender {
 public:
  CsvAppender(std::string path, std::vector<std::string> header);
  // Checks that the file (if it exists) is writable and has this header line, byte for byte.
  void check() const;
  // Appends one row (InvalidArgument for a field check_csv_field refuses; RuntimeFailure, the
  // file unchanged, when the write fails).
  void append(const std::vector<std::string>& row) const;
  const std::vector<std::string>& header() const { return header_; }

 private:
  std::string path_;
  std::vector<std::string> header_;
};

}  // namespace actbench
