#pragma once
// Element types and the fp32 <-> 16-bit conversions used by the CPU reference backend.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace actbench {

// u8: dropout masks; i32: indices (the MoE routing decision and its dispatch plan).
enum class DType : uint8_t { bf16, fp16, fp32, u8, i32 };

// The element types a float op computes on (everything but the integer types).
constexpr bool is_float(DType t) { return t == DType::bf16 || t == DType::fp16 || t == DType::fp32; }

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::bf16: return 2;
    case DType::fp16: return 2;
    case DType::fp32: return 4;
    case DType::u8: return 1;
    case DType::i32: return 4;
  }
  return 0;
}
const char* dtype_name(DType t);
// Parses "bf16|fp16|fp32"; throws InvalidArgument otherwise.
DType parse_dtype(const std::string& s);

// Round-to-nearest-even conversions (NaN stays NaN).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

// Load element i of a buffer of type t as float / store a float rounded to type t.
inline float load_as_float(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::fp32: return static_cast<const float*>(p)[i];
    case DType::u8: return static_cast<float>(static_cast<const uint8_t*>(p)[i]);
    case DType::i32: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
  }
  return 0.f;
}
inline void store_from_float(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::bf16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::fp16: static_cast<uint16_t*>(p)[i] = float_to_fp16(v); break;
    case DType::fp32: static_cast<float*>(p)[i] = v; break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
  }
}

}  // namespace actbench
