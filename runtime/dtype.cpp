#include "runtime/dtype.hpp"

#include "runtime/error.hpp"

namespace actbench {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp32: return "fp32";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "fp16") return DType::fp16;
  if (s == "fp32") return DType::fp32;
  throw InvalidArgument("unknown dtype '" + s + "' (expected bf16, fp16 or fp32)");
}

// IEEE half: 1 sign, 5 exponent, 10 mantissa bits. Round to nearest even, with subnormals.
uint16_t float_to_fp16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {                                              // subnormal or zero in half
    // value = abs_float; half subnormal unit = 2^-24
    float af = std::bit_cast<float>(abs);
    float scaled = af * 16777216.0f;  // / 2^-24, exact (power of two)
    // round half to even
    float fl = static_cast<float>(static_cast<uint32_t>(scaled));
    float rem = scaled - fl;
    uint32_t m = static_cast<uint32_t>(fl);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = ((abs >> 23) - 127 + 15);
  uint32_t mant = abs & 0x7fffffu;
  uint32_t half = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | half);
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

}  // namespace actbench
