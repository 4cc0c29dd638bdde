#pragma once
// CSV, written and read in one place: csv_line writes a row, csv_parse reads a text,
// write_file_atomic writes a whole file (theory's tables), CsvAppender appends rows (results).
//
// CsvAppender: the header is written once, every row is appended whole with one write()
// under an exclusive lock, so concurrent writers never interleave and a killed run never
// leaves half a row. Appending to a file whose header differs is an InvalidArgument. A file
// that ends mid-line (a writer killed by something else, a truncated copy, a header without
// its newline) gets a newline first: a row always starts on a line of its own.
#include <string>
#include <vector>

namespace actbench {

std::string csv_escape(const std::string& field);
std::string csv_line(const std::vector<std::string>& fields);

// The rows of a CSV text (RFC 4180: quoted fields may hold commas, doubled quotes and line
// breaks; a row ends at \n, \r\n or \r; empty lines are skipped).
std::vector<std::vector<std::string>> csv_parse(const std::string& text);

// Writes `data` to a temporary name beside `path` and renames it over `path`, so a reader
// sees the old file or the whole new one, never half. Throws InvalidArgument when it cannot.
void write_file_atomic(const std::string& path, const std::string& data);

class CsvAppender {
 public:
  CsvAppender(std::string path, std::vector<std::string> header);
  // Checks that the file (if it exists) is writable and has this header.
  void check() const;
  void append(const std::vector<std::string>& row) const;
  const std::vector<std::string>& header() const { return header_; }

 private:
  std::string path_;
  std::vector<std::string> header_;
};

}  // namespace actbench
