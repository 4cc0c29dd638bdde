// Fused causal attention, FlashAttention-2 style, on CUDA cores in fp32 (storage bf16, fp16
// or fp32, rounded once on store). q, k, v, out [B, S, D], D <= 128 (the kernels are
// instantiated for D padded to 16, 32, 64 or 128; the padding columns are zeros in shared
// memory and never stored). Scores exist only a tile at a time in shared memory; the
// reference is kernels/cpu/cpu_attention.cpp.
//
//   forward   one block per (64 query rows, head): key tiles of 64 up to the diagonal, online
//             softmax (running max and sum per row, fp32), writes out and lse = m + log(l).
//   backward  delta_i = rowsum(dO o O) (one warp per row); dK, dV: one block per (64 keys,
//             head) looping over query tiles of 32 from the diagonal down, accumulating in
//             registers; dQ: a separate pass, one block per (64 query rows, head) looping over
//             key tiles of 32 up to the diagonal. No atomics: results are deterministic.
//
// Dropout: element (i, j) of head b is kept iff philox_word at the canonical index of the
// local element (b*S + i)*S + j is >= the threshold (DropoutSpec::keep), regenerated here in
// every pass; the softmax normaliser counts every probability, dropped or not.
//
// Thread layout (256 threads): thread t owns rows 4*(t/16) .. +3 of its tile and the columns
// t%16 + 16c; the 16 threads of a row group are one half-warp, so row reductions are
// shuffles within it. Shared rows are padded to an odd stride (D + 1, tile + 1): the column
// reads of the 16 lanes fall in 16 different banks.
#include <type_traits>

#include "kernels/cuda/attention_tiles.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kLanes = 16;        // threads per row group (a half-warp)
constexpr int kRowsPerThread = 4;  // rows of a tile per row group
static_assert(kThreads / kLanes * kRowsPerThread == 64, "row groups cover 64 rows");

using attention_tiles::kFwdRows, attention_tiles::kFwdKeys, attention_tiles::kDqRows, attention_tiles::kDqKeys,
    attention_tiles::kDkvKeys, attention_tiles::kDkvRows;

// The dropout of the probabilities: spec.keep of the local [B, S, S] index, as a multiplier.
struct AttnDropout {
  DropoutSpec spec;
  uint32_t threshold = 0;
  float scale = 1.f;     // 1 / (1 - p), the same float as spec.scale()
  bool on = false;       // p > 0 (as the CPU reference decides)
  bool uniform = false;  // each head's S*S block is contiguous in canonical order

  // canonical_index(l) = l + offset(o) where o = l / (mid_local * inner); when uniform, o is
  // constant over one head's S*S elements, so the offset is computed once per head.
  __device__ __forceinline__ int64_t head_offset(int64_t bh, int64_t S) const {
    if (!on || !uniform) return 0;
    const int64_t local = bh * S * S;
    return spec.canonical_index(local) - local;
  }
  // keep ? 1/(1-p) : 0, or 1 without dropout.
  __device__ __forceinline__ float mult(int64_t local, int64_t offset) const {
    if (!on) return 1.f;
    const int64_t canonical = uniform ? local + offset : spec.canonical_index(local);
    return philox_word(spec.seed, spec.layer, spec.site, static_cast<uint64_t>(canonical)) >= threshold ? scale : 0.f;
  }
};

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Sum / max over the 16 lanes of a half-warp (every lane of the warp takes part).
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Rows [row0, row0 + kRows) of one head's [S, D] matrix into dst [kRows][kD + 1] as fp32;
// rows >= S and columns >= D are zeros.
template <int kRows, int kD, class T>
__device__ __forceinline__ void load_tile(const T* head, int64_t row0, int64_t S, int D, float* dst) {
  for (int e = threadIdx.x; e < kRows * kD; e += blockDim.x) {
    const int r = e / kD, d = e % kD;
    const int64_t row = row0 + r;
    dst[r * (kD + 1) + d] = (row < S && d < D) ? to_float(head[row * D + d]) : 0.f;
  }
}

// acc[rr][cc] = sum over d < kD of a[row rg*kRowsPerThread + rr][d] * b[row lane + kLanes*cc][d]:
// this thread's share of one tile product a·bᵀ, both tiles in shared memory with rows of kD + 1.
template <int kD, int kCols>
__device__ __forceinline__ void tile_dot(const float* __restrict__ a, const float* __restrict__ b, int rg, int lane,
                                         float (&acc)[kRowsPerThread][kCols]) {
  constexpr int kLD = kD + 1;
#pragma unroll
  for (int rr = 0; rr < kRowsPerThread; ++rr)
#pragma unroll
    for (int cc = 0; cc < kCols; ++cc) acc[rr][cc] = 0.f;
#pragma unroll 8
  for (int d = 0; d < kD; ++d) {
    float av[kRowsPerThread], bv[kCols];
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) av[rr] = a[(rg * kRowsPerThread + rr) * kLD + d];
#pragma unroll
    for (int cc = 0; cc < kCols; ++cc) bv[cc] = b[(lane + kLanes * cc) * kLD + d];
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr)
#pragma unroll
      for (int cc = 0; cc < kCols; ++cc) acc[rr][cc] = fmaf(av[rr], bv[cc], acc[rr][cc]);
  }
}

// ---- forward -------------------------------------------------------------------------------

template <int kD>
constexpr size_t fwd_smem_bytes() {
  return sizeof(float) * ((kFwdRows + 2 * kFwdKeys) * (kD + 1) + kFwdRows * (kFwdKeys + 1));
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ out, float* __restrict__ lse, int64_t B, int64_t S, int D, float scale,
                         AttnDropout dr, int64_t group) {
  constexpr int kLD = kD + 1, kPLD = kFwdKeys + 1, kDC = kD / kLanes, kKC = kFwdKeys / kLanes;
  extern __shared__ float smem[];
  float* sQ = smem;                   // [kFwdRows][kLD]
  float* sK = sQ + kFwdRows * kLD;    // [kFwdKeys][kLD]
  float* sV = sK + kFwdKeys * kLD;    // [kFwdKeys][kLD]
  float* sP = sV + kFwdKeys * kLD;    // [kFwdRows][kPLD]: probabilities after dropout
  const int tid = threadIdx.x, rg = tid / kLanes, lane = tid % kLanes;
  const int64_t n_qb = (S + kFwdRows - 1) / kFwdRows;
  const int64_t q0 = (n_qb - 1 - blockIdx.x) * kFwdRows;  // the longest rows first
  const int64_t row_end = min64(q0 + kFwdRows, S);
  const int64_t n_kb = (row_end - 1) / kFwdKeys + 1;        // key tiles up to the diagonal

  for (int64_t bh = blockIdx.y; bh < B; bh += gridDim.y) {
    const int64_t base = bh * S * D, kv_base = (bh / group) * S * D;  // GQA: the group's keys and values
    const int64_t drop_offset = dr.head_offset(bh, S);
    __syncthreads();  // the previous head is done with shared memory
    load_tile<kFwdRows, kD>(q + base, q0, S, D, sQ);

    float m[kRowsPerThread], l[kRowsPerThread], acc[kRowsPerThread][kDC];
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      m[rr] = -INFINITY;
      l[rr] = 0.f;
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) acc[rr][dc] = 0.f;
    }

    for (int64_t kb = 0; kb < n_kb; ++kb) {
      const int64_t j0 = kb * kFwdKeys;
      __syncthreads();  // sK, sV, sP of the previous tile are no longer read
      load_tile<kFwdKeys, kD>(k + kv_base, j0, S, D, sK);
      load_tile<kFwdKeys, kD>(v + kv_base, j0, S, D, sV);
      __syncthreads();

      float s[kRowsPerThread][kKC];
      tile_dot<kD>(sQ, sK, rg, lane, s);  // scores q_i · k_j

#pragma unroll
      for (int rr = 0; rr < kRowsPerThread; ++rr) {
        const int r = rg * kRowsPerThread + rr;
        const int64_t i = q0 + r;
        bool valid[kKC];
        float tile_max = -INFINITY;
#pragma unroll
        for (int cc = 0; cc < kKC; ++cc) {
          const int64_t j = j0 + lane + kLanes * cc;
          valid[cc] = j <= i && i < S;  // padding rows (i >= S) see nothing and are not stored
          s[rr][cc] = valid[cc] ? s[rr][cc] * scale : -INFINITY;
          tile_max = fmaxf(tile_max, s[rr][cc]);
        }
        tile_max = half_warp_max(tile_max);
        const float m_new = fmaxf(m[rr], tile_max);
        const float m_ref = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing seen yet stays at 0
        const float correction = expf(m[rr] - m_ref);         // 0 on the first tile
        float tile_sum = 0.f;
#pragma unroll
        for (int cc = 0; cc < kKC; ++cc) {
          const int64_t j = j0 + lane + kLanes * cc;
          const float p = valid[cc] ? expf(s[rr][cc] - m_ref) : 0.f;
          tile_sum += p;  // the normaliser counts every probability, dropped or not
          const float w = valid[cc] ? p * dr.mult((bh * S + i) * S + j, drop_offset) : 0.f;
          sP[r * kPLD + lane + kLanes * cc] = w;
        }
        tile_sum = half_warp_sum(tile_sum);
        l[rr] = l[rr] * correction + tile_sum;
#pragma unroll
        for (int dc = 0; dc < kDC; ++dc) acc[rr][dc] *= correction;
        m[rr] = m_new;
      }
      __syncthreads();

#pragma unroll 4
      for (int c = 0; c < kFwdKeys; ++c) {
        float vv[kDC];
#pragma unroll
        for (int dc = 0; dc < kDC; ++dc) vv[dc] = sV[c * kLD + lane + kLanes * dc];
#pragma unroll
        for (int rr = 0; rr < kRowsPerThread; ++rr) {
          const float p = sP[(rg * kRowsPerThread + rr) * kPLD + c];
#pragma unroll
          for (int dc = 0; dc < kDC; ++dc) acc[rr][dc] = fmaf(p, vv[dc], acc[rr][dc]);
        }
      }
    }

#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      const int64_t i = q0 + rg * kRowsPerThread + rr;
      if (i >= S) continue;
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) {
        const int d = lane + kLanes * dc;
        if (d < D) out[base + i * D + d] = from_float<T>(acc[rr][dc] / l[rr]);
      }
      if (lane == 0) lse[bh * S + i] = m[rr] + logf(l[rr]);
    }
  }
}

// ---- backward: delta_i = sum_d dO[i, d] * O[i, d], one warp per row ----------------------------

template <class T>
__global__ void attention_delta_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                       float* __restrict__ delta, int64_t rows, int D) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() >> 5;
  for (int64_t r = global_thread() >> 5; r < rows; r += warps) {
    float s = 0.f;
    for (int d = lane; d < D; d += 32) s = fmaf(to_float(out[r * D + d]), to_float(dout[r * D + d]), s);
    s = warp_sum(s);
    if (lane == 0) delta[r] = s;
  }
}

// ---- backward: dQ = scale * dS K, one block per (64 query rows, head) --------------------------

template <int kD>
constexpr size_t dq_smem_bytes() {
  return sizeof(float) * ((2 * kDqRows + 2 * kDqKeys) * (kD + 1) + kDqRows * (kDqKeys + 1));
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                        T* __restrict__ dq, int64_t B, int64_t S, int D, float scale, AttnDropout dr,
                        int64_t group) {
  constexpr int kLD = kD + 1, kSLD = kDqKeys + 1, kDC = kD / kLanes, kKC = kDqKeys / kLanes;
  extern __shared__ float smem[];
  float* sQ = smem;                    // [kDqRows][kLD]
  float* sdO = sQ + kDqRows * kLD;     // [kDqRows][kLD]
  float* sK = sdO + kDqRows * kLD;     // [kDqKeys][kLD]
  float* sV = sK + kDqKeys * kLD;      // [kDqKeys][kLD]
  float* sdS = sV + kDqKeys * kLD;     // [kDqRows][kSLD]
  const int tid = threadIdx.x, rg = tid / kLanes, lane = tid % kLanes;
  const int64_t n_qb = (S + kDqRows - 1) / kDqRows;
  const int64_t q0 = (n_qb - 1 - blockIdx.x) * kDqRows;
  const int64_t row_end = min64(q0 + kDqRows, S);
  const int64_t n_kb = (row_end - 1) / kDqKeys + 1;

  for (int64_t bh = blockIdx.y; bh < B; bh += gridDim.y) {
    const int64_t base = bh * S * D, kv_base = (bh / group) * S * D;
    const int64_t drop_offset = dr.head_offset(bh, S);
    __syncthreads();
    load_tile<kDqRows, kD>(q + base, q0, S, D, sQ);
    load_tile<kDqRows, kD>(dout + base, q0, S, D, sdO);
    float row_lse[kRowsPerThread], row_delta[kRowsPerThread], acc[kRowsPerThread][kDC];
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      const int64_t i = q0 + rg * kRowsPerThread + rr;
      row_lse[rr] = i < S ? lse[bh * S + i] : 0.f;
      row_delta[rr] = i < S ? delta[bh * S + i] : 0.f;
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) acc[rr][dc] = 0.f;
    }

    for (int64_t kb = 0; kb < n_kb; ++kb) {
      const int64_t j0 = kb * kDqKeys;
      __syncthreads();
      load_tile<kDqKeys, kD>(k + kv_base, j0, S, D, sK);
      load_tile<kDqKeys, kD>(v + kv_base, j0, S, D, sV);
      __syncthreads();

      float s[kRowsPerThread][kKC], dp[kRowsPerThread][kKC];
      tile_dot<kD>(sQ, sK, rg, lane, s);    // scores q_i · k_j
      tile_dot<kD>(sdO, sV, rg, lane, dp);  // dP = dO_i · v_j

#pragma unroll
      for (int rr = 0; rr < kRowsPerThread; ++rr) {
        const int r = rg * kRowsPerThread + rr;
        const int64_t i = q0 + r;
#pragma unroll
        for (int cc = 0; cc < kKC; ++cc) {
          const int64_t j = j0 + lane + kLanes * cc;
          float ds = 0.f;
          if (j <= i && i < S) {
            const float p = expf(s[rr][cc] * scale - row_lse[rr]);  // the recomputed probability
            const float mult = dr.mult((bh * S + i) * S + j, drop_offset);
            ds = p * (dp[rr][cc] * mult - row_delta[rr]);
          }
          sdS[r * kSLD + lane + kLanes * cc] = ds;
        }
      }
      __syncthreads();

#pragma unroll 4
      for (int c = 0; c < kDqKeys; ++c) {
        float kv[kDC];
#pragma unroll
        for (int dc = 0; dc < kDC; ++dc) kv[dc] = sK[c * kLD + lane + kLanes * dc];
#pragma unroll
        for (int rr = 0; rr < kRowsPerThread; ++rr) {
          const float ds = sdS[(rg * kRowsPerThread + rr) * kSLD + c];
#pragma unroll
          for (int dc = 0; dc < kDC; ++dc) acc[rr][dc] = fmaf(ds, kv[dc], acc[rr][dc]);
        }
      }
    }

#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      const int64_t i = q0 + rg * kRowsPerThread + rr;
      if (i >= S) continue;
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) {
        const int d = lane + kLanes * dc;
        if (d < D) dq[base + i * D + d] = from_float<T>(scale * acc[rr][dc]);
      }
    }
  }
}

// ---- backward: dK = scale * dS^T Q, dV = (P o keep/(1-p))^T dO, one block per (64 keys, head) --

template <int kD>
constexpr size_t dkdv_smem_bytes() {
  return sizeof(float) *
         ((2 * kDkvKeys + 2 * kDkvRows) * (kD + 1) + 2 * kDkvKeys * (kDkvRows + 1) + 2 * kDkvRows);
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                          T* __restrict__ dk, T* __restrict__ dv, int64_t B, int64_t S, int D, float scale,
                          AttnDropout dr, int64_t group) {
  constexpr int kLD = kD + 1, kSLD = kDkvRows + 1, kDC = kD / kLanes, kQC = kDkvRows / kLanes;
  extern __shared__ float smem[];
  float* sK = smem;                      // [kDkvKeys][kLD]
  float* sV = sK + kDkvKeys * kLD;       // [kDkvKeys][kLD]
  float* sQ = sV + kDkvKeys * kLD;       // [kDkvRows][kLD]
  float* sdO = sQ + kDkvRows * kLD;      // [kDkvRows][kLD]
  float* sP = sdO + kDkvRows * kLD;      // [kDkvKeys][kSLD]: P o keep/(1-p), transposed (key, query)
  float* sdS = sP + kDkvKeys * kSLD;     // [kDkvKeys][kSLD]: dS, transposed
  float* sLse = sdS + kDkvKeys * kSLD;   // [kDkvRows]
  float* sDelta = sLse + kDkvRows;       // [kDkvRows]
  const int tid = threadIdx.x, rg = tid / kLanes, lane = tid % kLanes;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kDkvKeys;  // the first key tiles have the most rows
  const int64_t qt0 = j0 / kDkvRows;                                 // the query tile holding row j0
  const int64_t n_qt = (S + kDkvRows - 1) / kDkvRows;

  // One key/value head per y: its gradients sum over the `group` query heads that read it (GQA).
  for (int64_t kvh = blockIdx.y; kvh < B / group; kvh += gridDim.y) {
    const int64_t kv_base = kvh * S * D;
    __syncthreads();
    load_tile<kDkvKeys, kD>(k + kv_base, j0, S, D, sK);
    load_tile<kDkvKeys, kD>(v + kv_base, j0, S, D, sV);
    float acc_k[kRowsPerThread][kDC], acc_v[kRowsPerThread][kDC];
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr)
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) acc_k[rr][dc] = acc_v[rr][dc] = 0.f;

    // Every query tile at or below the keys, of each query head of the group in turn.
    for (int64_t step = 0; step < group * (n_qt - qt0); ++step) {
      const int64_t bh = kvh * group + step / (n_qt - qt0), qt = qt0 + step % (n_qt - qt0);
      const int64_t base = bh * S * D;
      const int64_t drop_offset = dr.head_offset(bh, S);
      const int64_t i0 = qt * kDkvRows;
      __syncthreads();  // sQ, sdO, sP, sdS of the previous tile are no longer read
      load_tile<kDkvRows, kD>(q + base, i0, S, D, sQ);
      load_tile<kDkvRows, kD>(dout + base, i0, S, D, sdO);
      if (tid < kDkvRows) {
        const int64_t i = i0 + tid;
        sLse[tid] = i < S ? lse[bh * S + i] : 0.f;
        sDelta[tid] = i < S ? delta[bh * S + i] : 0.f;
      }
      __syncthreads();

      float s[kRowsPerThread][kQC], dp[kRowsPerThread][kQC];  // [key][query]
      tile_dot<kD>(sK, sQ, rg, lane, s);    // scores k_j · q_i (fmaf's product commutes exactly)
      tile_dot<kD>(sV, sdO, rg, lane, dp);  // dP = v_j · dO_i

#pragma unroll
      for (int rr = 0; rr < kRowsPerThread; ++rr) {
        const int c = rg * kRowsPerThread + rr;
        const int64_t j = j0 + c;
#pragma unroll
        for (int cc = 0; cc < kQC; ++cc) {
          const int r = lane + kLanes * cc;
          const int64_t i = i0 + r;
          float pd = 0.f, ds = 0.f;
          if (j <= i && i < S) {
            const float p = expf(s[rr][cc] * scale - sLse[r]);
            const float mult = dr.mult((bh * S + i) * S + j, drop_offset);
            pd = p * mult;
            ds = p * (dp[rr][cc] * mult - sDelta[r]);
          }
          sP[c * kSLD + r] = pd;
          sdS[c * kSLD + r] = ds;
        }
      }
      __syncthreads();

#pragma unroll 4
      for (int r = 0; r < kDkvRows; ++r) {
        float qv[kDC], ov[kDC];
#pragma unroll
        for (int dc = 0; dc < kDC; ++dc) {
          qv[dc] = sQ[r * kLD + lane + kLanes * dc];
          ov[dc] = sdO[r * kLD + lane + kLanes * dc];
        }
#pragma unroll
        for (int rr = 0; rr < kRowsPerThread; ++rr) {
          const int c = rg * kRowsPerThread + rr;
          const float pd = sP[c * kSLD + r], ds = sdS[c * kSLD + r];
#pragma unroll
          for (int dc = 0; dc < kDC; ++dc) {
            acc_v[rr][dc] = fmaf(pd, ov[dc], acc_v[rr][dc]);
            acc_k[rr][dc] = fmaf(ds, qv[dc], acc_k[rr][dc]);
          }
        }
      }
    }

#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      const int64_t j = j0 + rg * kRowsPerThread + rr;
      if (j >= S) continue;
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) {
        const int d = lane + kLanes * dc;
        if (d < D) {
          dk[kv_base + j * D + d] = from_float<T>(scale * acc_k[rr][dc]);
          dv[kv_base + j * D + d] = from_float<T>(acc_v[rr][dc]);
        }
      }
    }
  }
}

// ---- host launchers ------------------------------------------------------------------------

void check_head_dim(int64_t D, const char* op) {
  if (D > kAttentionMaxHeadDim)
    throw InvalidArgument(std::string(op) + ": head dim " + std::to_string(D) + " is larger than " +
                          std::to_string(kAttentionMaxHeadDim) + ", the most the cuda kernels support");
}

// Calls f(std::integral_constant<int, kD>) with kD the head dim padded to 16, 32, 64 or 128.
template <class F>
void with_head_dim(int64_t D, const char* op, F&& f) {
  check_head_dim(D, op);
  switch (attention_tiles::padded_head_dim(D)) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    default: f(std::integral_constant<int, 128>{}); break;
  }
}

AttnDropout make_dropout(const DropoutSpec& spec, int64_t S) {
  AttnDropout dr;
  dr.spec = spec;
  dr.threshold = dropout_threshold(spec.p);
  dr.scale = spec.scale();
  dr.on = spec.p > 0.f;
  dr.uniform = (spec.mid_local * spec.inner) % (S * S) == 0;
  return dr;
}

// Grids: x = tiles along the sequence, y = heads (looped over inside past 65535).
dim3 attention_grid(int64_t tiles, int64_t B) {
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(B < 65535 ? B : 65535));
}

// Kernels with more than the default 48 KiB of dynamic shared memory must say so first.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <class T>
void fwd(const T* q, const T* k, const T* v, float scale, const DropoutSpec& spec, T* out, float* lse, int64_t B,
         int64_t S, int64_t D, cudaStream_t stream, int64_t group) {
  const AttnDropout dr = make_dropout(spec, S);
  with_head_dim(D, "attention_fwd", [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    constexpr size_t smem = fwd_smem_bytes<kD>();
    allow_smem(attention_fwd_kernel<T, kD>, smem);
    attention_fwd_kernel<T, kD><<<attention_grid((S + kFwdRows - 1) / kFwdRows, B), kThreads, smem, stream>>>(
        q, k, v, out, lse, B, S, static_cast<int>(D), scale, dr, group);
    CUDA_CHECK_LAUNCH();
  });
}

template <class T>
void bwd(const T* q, const T* k, const T* v, const T* out, const T* dout, const float* lse, float scale,
         const DropoutSpec& spec, T* dq, T* dk, T* dv, float* delta, int64_t B, int64_t S, int64_t D,
         cudaStream_t stream, int64_t group) {
  const AttnDropout dr = make_dropout(spec, S);
  with_head_dim(D, "attention_bwd", [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    attention_delta_kernel<T><<<elementwise_blocks(B * S * 32), kElementwiseThreads, 0, stream>>>(
        out, dout, delta, B * S, static_cast<int>(D));
    CUDA_CHECK_LAUNCH();

    constexpr size_t dq_smem = dq_smem_bytes<kD>();
    allow_smem(attention_dq_kernel<T, kD>, dq_smem);
    attention_dq_kernel<T, kD><<<attention_grid((S + kDqRows - 1) / kDqRows, B), kThreads, dq_smem, stream>>>(
        q, k, v, dout, lse, delta, dq, B, S, static_cast<int>(D), scale, dr, group);
    CUDA_CHECK_LAUNCH();

    constexpr size_t dkdv_smem = dkdv_smem_bytes<kD>();
    allow_smem(attention_dkdv_kernel<T, kD>, dkdv_smem);
    attention_dkdv_kernel<T, kD><<<attention_grid((S + kDkvKeys - 1) / kDkvKeys, B / group), kThreads, dkdv_smem,
                                   stream>>>(q, k, v, dout, lse, delta, dk, dv, B, S, static_cast<int>(D), scale, dr,
                                             group);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void attention_fwd(DType dt, const void* q, const void* k, const void* v, float scale, const DropoutSpec& spec,
                   void* out, float* lse, int64_t B, int64_t S, int64_t D, cudaStream_t stream, int64_t group) {
  check_head_dim(D, "attention_fwd");
  if (group < 1 || B % group != 0) throw InvalidArgument("attention_fwd: group must divide the query batches");
  if (B == 0 || S == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "attention_fwd", T,
                          fwd<T>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), scale,
                                 spec, static_cast<T*>(out), lse, B, S, D, stream, group));
}

void attention_bwd(DType dt, const void* q, const void* k, const void* v, const void* out, const void* dout,
                   const float* lse, float scale, const DropoutSpec& spec, void* dq, void* dk, void* dv, float* delta,
                   int64_t B, int64_t S, int64_t D, cudaStream_t stream, int64_t group) {
  check_head_dim(D, "attention_bwd");
  if (group < 1 || B % group != 0) throw InvalidArgument("attention_bwd: group must divide the query batches");
  if (B == 0 || S == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "attention_bwd", T,
                          bwd<T>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                 static_cast<const T*>(out), static_cast<const T*>(dout), lse, scale, spec,
                                 static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv), delta, B, S, D,
                                 stream, group));
}

}  // namespace actbench::cuda
