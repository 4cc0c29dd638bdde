#pragma once
// Results CSV: the header is written once, every row is appended whole with one write()
// under an exclusive lock, so concurrent writers never interleave and a killed run never
// leaves half a row. Appending to a file whose header differs is an InvalidArgument. A file
// that ends mid-line (a writer killed by something else, a truncated copy, a header without
// its newline) gets a newline first: a row always starts on a line of its own.
#include <string>
#include <vector>

namespace actbench {

std::string csv_escape(const std::string& field);
std::string csv_line(const std::vector<std::string>& fields);

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
