#pragma once
// What one layer's forward and backward do on one tensor-parallel rank, split into the
// three resources that bound them: GEMM FLOPs (tensor cores), bytes of memory-bound
// kernels (LayerNorm, softmax, dropout, GeLU, bias+dropout+residual; HBM) and bytes of
// TP/SP collectives (NVLink). Used to carry measured layer times from one shape to another:
// the GEMM part scales with FLOPs, the rest with bytes, so that a wider model's larger
// share of GEMM time (why MFU grows with size in Table 5) comes out of the model.
#include "theory/activation_memory.hpp"
#include "theory/iteration_model.hpp"
#include "theory/models.hpp"

namespace actbench::theory {

struct PassWork {
  double gemm_flops = 0;          // linear layers + QKᵀ and ·V
  double memory_bytes = 0;        // HBM traffic of the memory-bound kernels (Megatron's fusions)
  double comm_bytes = 0;          // ring bytes one rank sends in the TP/SP collectives
  double exposed_comm_bytes = 0;  // of which not overlapped with compute
};

struct LayerWork {
  PassWork fwd, bwd;  // bwd includes what the configuration recomputes
};

// elem: bytes per activation element (2 for bf16); masks are 1 byte.
LayerWork layer_work(const Dims& d, LayerPolicy c, double elem_bytes = 2);

struct CostRates {
  double memory_bytes_per_s = 0;  // achieved HBM bandwidth of elementwise kernels
  double link_bytes_per_s = 0;    // achieved per-direction bandwidth of the TP collectives
};
// 80% of the GPU's HBM and NVLink bandwidth: what well-tuned elementwise kernels and NCCL
// rings reach on A100/H100.
CostRates cost_rates(const Gpu& g, double efficiency = 0.8);

// Per-pass time split: measured = gemm + memory + exposed comm, with memory and comm from
// the byte counts and the GEMM part the rest (never below 10% of the measured time).
struct PassSplit {
  double gemm_ms = 0, memory_ms = 0, comm_ms = 0;
};
PassSplit split_pass(double measured_ms, const PassWork& w, const CostRates& r);

// Times of configuration c at shape `to` from its times measured at shape `from` on the same
// GPU: GEMM part × FLOP ratio, memory and exposed comm recomputed from bytes at `to`.
// Times at from == to come back unchanged (unless split_pass had to clamp the GEMM part).
// A measurement with comm_ms > 0 (emulated TP) holds no communication in fwd/bwd: its
// comm_ms is scaled by the collective bytes instead.
LayerTimes scale_layer_times_by_work(const LayerTimes& measured, const Dims& from, const Dims& to, LayerPolicy c,
                                     const CostRates& r, double elem_bytes = 2);

}  // namespace actbench::theory
