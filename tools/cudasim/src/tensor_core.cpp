// The tensor-core collectives' data movement and arithmetic (kernels/cuda/mma.cuh), with the
// fragment layouts of the PTX ISA: "Matrix Fragments for mma.m16n8k16 with floating point
// type" and "Warp-level matrix load instruction: ldmatrix". In both, a lane's groupID is
// lane / 4 and its threadID_in_group lane % 4; a 32-bit register holds two 16-bit elements,
// the lower-numbered one in its low half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "internal.hpp"

namespace cudasim::internal {
namespace {

uint16_t half_of(uint32_t reg, int i) { return static_cast<uint16_t>(i ? reg >> 16 : reg & 0xffffu); }

// A bf16 or fp16 element as fp32 (exact: both are subsets of fp32), by NVIDIA's conversions.
float element(detail::MmaInput in, uint16_t bits) {
  if (in == detail::MmaInput::bf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

}  // namespace

// m16n8k16: A is 16x16 (row-major fragment), B 16x8 (column-major fragment), C and D 16x8.
//   A: register r of lane (g, t) holds row g + 8 * (r % 2), columns 2t + 8 * (r / 2) + {0, 1}
//      (a0,a1 | a2,a3 | a4,a5 | a6,a7 of the ISA's table)
//   B: register r holds rows (k) 2t + 8r + {0, 1}, column (n) g
//   C, D: element i holds row g + 8 * (i / 2), column 2t + i % 2
// Each D element is C's plus the 16 products in k order 0..15, one fused multiply-add each
// (fmaf: the product of two bf16 or fp16 values is exact in fp32, so each step rounds once).
// The GPU's order and rounding inside the tensor core are unspecified; this order is ours.
void mma_m16n8k16_warp(detail::MmaInput in, MmaLane* const (&lanes)[32]) {
  float a[16][16], b[16][8], d[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const MmaLane& l = *lanes[lane];
    const int g = lane / 4, t = lane % 4;
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 2; ++i) a[g + 8 * (r % 2)][2 * t + 8 * (r / 2) + i] = element(in, half_of(l.a[r], i));
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 2; ++i) b[2 * t + 8 * r + i][g] = element(in, half_of(l.b[r], i));
    for (int i = 0; i < 4; ++i) d[g + 8 * (i / 2)][2 * t + i % 2] = l.c[i];
  }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n)
      for (int k = 0; k < 16; ++k) d[m][n] = std::fmaf(a[m][k], b[k][n], d[m][n]);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) lanes[lane]->d[i] = d[g + 8 * (i / 2)][2 * t + i % 2];
  }
}

// ldmatrix .m8n8 .b16: matrix m's row j is the 16 bytes at the address lane 8m + j supplied.
// Register m of lane (g, t) holds row g, columns 2t + {0, 1} of matrix m; with .trans, of
// its transpose: rows 2t + {0, 1}, column g.
void ldmatrix_warp(int matrices, bool trans, LdmatrixLane* const (&lanes)[32]) {
  const auto at = [&](int m, int row, int col) { return half_of(lanes[8 * m + row]->row[col / 2], col % 2); };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int m = 0; m < matrices; ++m) {
      const uint32_t lo = trans ? at(m, 2 * t, g) : at(m, g, 2 * t);
      const uint32_t hi = trans ? at(m, 2 * t + 1, g) : at(m, g, 2 * t + 1);
      lanes[lane]->r[m] = lo | hi << 16;
    }
  }
}

}  // namespace cudasim::internal
