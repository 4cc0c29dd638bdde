#pragma once
// What the fused attention kernels share (attention.cu: fp32 CUDA cores and the backward;
// attention_tc.cu: the tensor-core forward for bf16 and fp16): where the rows sit, the dropout
// of the probabilities, launch helpers. Only included by .cu files.
#include <cstdint>
#include <string>

#include "kernels/cuda/attention_tiles.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/philox_groups.hpp"

namespace actbench::cuda::attention_detail {

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Where the rows of one call sit: S query rows, Sk key rows in a sequence of T positions.
// Padding rows of a tile (i >= S, j >= Sk) get positions that see nothing: -1 for a query,
// INT64_MAX for a key, so visibility is one compare, kpos <= qpos.
struct AttnPlace {
  SeqPositions queries, keys;
  int64_t S = 0, Sk = 0, T = 0;

  __device__ __forceinline__ int64_t query(int64_t i) const { return i < S ? queries.at(i) : -1; }
  __device__ __forceinline__ int64_t key(int64_t j) const { return j < Sk ? keys.at(j) : INT64_MAX; }
};

// The dropout of the probabilities: spec.keep of the local [B, T, T] index, as a multiplier.
struct AttnDropout {
  DropoutSpec spec;
  uint32_t threshold = 0;
  float scale = 1.f;     // 1 / (1 - p), the same float as spec.scale()
  bool on = false;       // p > 0 (as the CPU reference decides)
  bool uniform = false;  // each head's T*T block is contiguous in canonical order

  // canonical_index(l) = l + offset(o) where o = l / (mid_local * inner); when uniform, o is
  // constant over one head's T*T elements, so the offset is computed once per head.
  __device__ __forceinline__ int64_t head_offset(int64_t bh, int64_t T) const {
    if (!on || !uniform) return 0;
    const int64_t local = bh * T * T;
    return spec.canonical_index(local) - local;
  }
  // The canonical index of the probability of the query at qpos and the key at kpos of head bh.
  __device__ __forceinline__ int64_t canonical(int64_t bh, int64_t qpos, int64_t kpos, int64_t T,
                                               int64_t offset) const {
    const int64_t local = (bh * T + qpos) * T + kpos;
    return uniform ? local + offset : spec.canonical_index(local);
  }
  // keep ? 1/(1-p) : 0 for that probability, or 1 without dropout.
  __device__ __forceinline__ float mult(int64_t bh, int64_t qpos, int64_t kpos, int64_t T, int64_t offset) const {
    if (!on) return 1.f;
    const int64_t c = canonical(bh, qpos, kpos, T, offset);
    return philox_word(spec.seed, spec.layer, spec.site, static_cast<uint64_t>(c)) >= threshold ? scale : 0.f;
  }
  // Whether the probabilities at canonical indices a and b are kept: one Philox call when both
  // fall in one group of four words (two neighbouring keys of a run usually do), bit for bit
  // the words philox_word gives.
  __device__ __forceinline__ void keep_pair(int64_t a, int64_t b, bool& keep_a, bool& keep_b) const {
    const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
    const Philox4 wa = philox_words4(spec.seed, spec.layer, spec.site, ua >> 2);
    keep_a = philox_lane(wa, static_cast<uint32_t>(ua & 3u)) >= threshold;
    if ((ua >> 2) == (ub >> 2)) {
      keep_b = philox_lane(wa, static_cast<uint32_t>(ub & 3u)) >= threshold;
    } else {
      keep_b = philox_word(spec.seed, spec.layer, spec.site, ub) >= threshold;
    }
  }
};

// The canonical index is the local one plus a per-head offset when each head's [T, T] block
// lies inside one outer block of the spec and its inner elements are in canonical order.
inline AttnDropout make_dropout(const DropoutSpec& spec, int64_t T) {
  AttnDropout dr;
  dr.spec = spec;
  dr.threshold = dropout_threshold(spec.p);
  dr.scale = spec.scale();
  dr.on = spec.p > 0.f;
  dr.uniform = (spec.mid_local * spec.inner) % (T * T) == 0 && spec.inner_canonical() == spec.inner &&
               spec.inner_positions.is_identity(spec.inner);
  return dr;
}

inline AttnPlace make_place(const AttentionShape& shape) {
  AttnPlace pl;
  pl.queries = shape.rows.queries;
  pl.keys = shape.rows.keys;
  pl.S = shape.S;
  pl.Sk = shape.Sk;
  pl.T = shape.rows.total > 0 ? shape.rows.total : shape.S;
  return pl;
}

// Kernels with more than the default 48 KiB of dynamic shared memory must say so first.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace actbench::cuda::attention_detail

namespace actbench::cuda {

// attention_tc.cu: the tensor-core forward and backward of bf16 and fp16 (attention_fwd's and
// attention_bwd's contracts, cuda_ops.hpp); shape already checked.
void attention_fwd_tensor_core(DType dt, const void* q, const void* k, const void* v, float scale,
                               const DropoutSpec& spec, void* out, float* lse, const AttentionShape& shape,
                               cudaStream_t stream);
void attention_bwd_tensor_core(DType dt, const void* q, const void* k, const void* v, const void* out,
                               const void* dout, const float* lse, float scale, const DropoutSpec& spec, void* dq,
                               void* dk, void* dv, float* workspace, const AttentionShape& shape,
                               cudaStream_t stream);

}  // namespace actbench::cuda
