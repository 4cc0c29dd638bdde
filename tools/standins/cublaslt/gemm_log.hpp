#pragma once
// The cuBLASLt stand-in's record of the GEMMs it was asked for, for the simulator build's
// kernel report (layer_run --kernel-report): the simulator counts its own kernels' memory
// accesses, and the GEMMs, which it does not run as kernels, enter the report as their FLOPs
// and bytes. Off unless set_gemm_log(true); calls that fail their checks are not recorded.
#include <cstdint>
#include <string>
#include <vector>

namespace actbench::standin {

struct GemmCall {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int ab_type = 0, cd_type = 0;  // cudaDataType of A/B and of C/D
  bool reads_c = false;          // beta != 0 (C is read)
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch); }
  // A and B read, C read when beta != 0, D written: the least a GEMM moves.
  uint64_t min_bytes() const;
  bool tensor_cores() const;  // 16-bit operands (bf16, fp16); fp32 runs on the CUDA cores
  // "m 8192 n 2304 k 6144 batch 1, bf16 -> bf16" (", + C" when C is read): one GEMM shape.
  std::string describe() const;
};

void set_gemm_log(bool on);
std::vector<GemmCall> take_gemm_calls();

}  // namespace actbench::standin
