#include "runtime/npy.hpp"

#include <fstream>
#include <sstream>

#include "runtime/csv.hpp"
#include "runtime/error.hpp"

namespace actbench {

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  dict << "), }";
  std::string header = dict.str();
  // magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, '\n' last.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint16_t len = static_cast<uint16_t>(header.size());
  std::string file("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(len & 0xff);
  file += static_cast<char>(len >> 8);
  file += header;
  file.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  write_file_atomic(path, file);
}

std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InvalidArgument("cannot read '" + path + "'");
  char magic[10];
  f.read(magic, 10);
  uint16_t len = static_cast<uint16_t>(static_cast<unsigned char>(magic[8]) | (static_cast<unsigned char>(magic[9]) << 8));
  std::string header(len, '\0');
  f.read(header.data(), len);
  if (header.find("'<f4'") == std::string::npos) throw InvalidArgument("'" + path + "' is not float32");
  auto open = header.find('('), close = header.find(')');
  std::vector<int64_t> dims;
  std::stringstream ss(header.substr(open + 1, close - open - 1));
  std::string tok;
  int64_t n = 1;
  while (std::getline(ss, tok, ','))
    if (tok.find_first_not_of(' ') != std::string::npos) {
      dims.push_back(std::stoll(tok));
      n *= dims.back();
    }
  if (shape) *shape = dims;
  std::vector<float> data(static_cast<size_t>(n));
  f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(n * sizeof(float)));
  if (!f) throw InvalidArgument("'" + path + "' is truncated");
  return data;
}

}  // namespace actbench
