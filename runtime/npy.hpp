#pragma once
// Minimal .npy (format 1.0) writer for float32 arrays, written atomically (write_file_atomic:
// a reader sees the old file or the whole new one; whatever sat at the name is replaced).
#include <cstdint>
#include <string>
#include <vector>

namespace actbench {

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);
// Reads back a float32 .npy written by write_npy_f32 (for tests).
std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape);

}  // namespace actbench
