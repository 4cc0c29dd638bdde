// Fused causal attention, FlashAttention-2 style, on CUDA cores in fp32 (storage bf16, fp16
// or fp32, rounded once on store). q, out [B, S, D], k, v [B / group, Sk, D], D <= 192 (the
// kernels are instantiated for D padded to 16, 32, 64, 128 or 192; the padding columns are zeros in
// shared memory and never stored). Scores exist only a tile at a time in shared memory; the
// reference is kernels/cpu/cpu_attention.cpp.
//
// Rows are placed in a sequence of T positions (AttentionRows; the square case is the
// identity with T = S = Sk): query row i at position qpos(i), key row j at kpos(j), and j is
// visible from i when kpos(j) <= qpos(i). A tile pair with no visible key is skipped whole
// (attention_tiles.hpp), so a block's work is what its rows see; in the square case the
// tiles visited are those up to the diagonal. A row that sees no key gets out 0, lse -inf.
//
//   forward   fp32 only (bf16 and fp16 run on tensor cores, attention_tc.cu): one block per
//             (64 query rows, head): the visible key tiles of 64, online softmax (running
//             max and sum per row, fp32), writes out and lse = m + log(l).
//   backward  fp32 only (bf16 and fp16: attention_tc.cu, which recomputes S once and adds
//             dQ with atomics). delta_i = rowsum(dO o O) (one warp per row); dK, dV: one
//             block per (64 keys, head) looping over the query tiles of 32 that see them,
//             accumulating in registers; dQ: a separate pass, one block per (64 query rows,
//             head) looping over the visible key tiles of 32. No atomics: results are
//             deterministic. A row whose lse is -inf saw nothing and contributes nothing.
//
// Dropout: element (i, j) of head b is kept iff philox_word at the canonical index of the
// local element (b*T + qpos(i))*T + kpos(j) is >= the threshold (DropoutSpec::keep),
// regenerated here in every pass; the softmax normaliser counts every probability, dropped or
// not.
//
// Thread layout (256 threads): thread t owns rows 4*(t/16) .. +3 of its tile and the columns
// t%16 + 16c; the 16 threads of a row group are one half-warp, so row reductions are
// shuffles within it. Shared rows are padded to an odd stride (D + 1, tile + 1): the column
// reads of the 16 lanes fall in 16 different banks.
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/packs.cuh"

namespace actbench::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kLanes = 16;        // threads per row group (a half-warp)
constexpr int kRowsPerThread = 4;  // rows of a tile per row group
static_assert(kThreads / kLanes * kRowsPerThread == 64, "row groups cover 64 rows");

using attention_tiles::kFwdRows, attention_tiles::kFwdKeys, attention_tiles::kDqRows, attention_tiles::kDqKeys,
    attention_tiles::kDkvKeys, attention_tiles::kDkvRows;

using attention_detail::AttnDropout, attention_detail::AttnPlace, attention_detail::allow_smem,
    attention_detail::make_dropout, attention_detail::make_place, attention_detail::min64;

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
                         T* __restrict__ out, float* __restrict__ lse, int64_t B, AttnPlace pl, int D, float scale,
                         AttnDropout dr, int64_t group) {
  constexpr int kLD = kD + 1, kPLD = kFwdKeys + 1, kDC = kD / kLanes, kKC = kFwdKeys / kLanes;
  extern __shared__ float smem[];
  float* sQ = smem;                   // [kFwdRows][kLD]
  float* sK = sQ + kFwdRows * kLD;    // [kFwdKeys][kLD]
  float* sV = sK + kFwdKeys * kLD;    // [kFwdKeys][kLD]
  float* sP = sV + kFwdKeys * kLD;    // [kFwdRows][kPLD]: probabilities after dropout
  const int tid = threadIdx.x, rg = tid / kLanes, lane = tid % kLanes;
  const int64_t S = pl.S, Sk = pl.Sk;
  const int64_t n_qb = (S + kFwdRows - 1) / kFwdRows;
  const int64_t q0 = (n_qb - 1 - blockIdx.x) * kFwdRows;  // the longest rows first
  const int64_t row_end = min64(q0 + kFwdRows, S);
  const int64_t q_last = attention_tiles::last_position(pl.queries, q0, row_end);
  const int64_t n_kb = (attention_tiles::visible_keys_end(pl.keys, Sk, q_last) + kFwdKeys - 1) / kFwdKeys;
  int64_t qpos[kRowsPerThread];  // this thread's rows' positions (-1: a padding row)
#pragma unroll
  for (int rr = 0; rr < kRowsPerThread; ++rr) qpos[rr] = pl.query(q0 + rg * kRowsPerThread + rr);

  for (int64_t bh = blockIdx.y; bh < B; bh += gridDim.y) {
    const int64_t base = bh * S * D, kv_base = (bh / group) * Sk * D;  // GQA: the group's keys and values
    const int64_t drop_offset = dr.head_offset(bh, pl.T);
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
      // A tile no row of this block sees (a gap between the key runs): skipped by every thread.
      if (!attention_tiles::tile_visible(pl.queries, q0, row_end, pl.keys, j0, min64(j0 + kFwdKeys, Sk))) continue;
      __syncthreads();  // sK, sV, sP of the previous tile are no longer read
      load_tile<kFwdKeys, kD>(k + kv_base, j0, Sk, D, sK);
      load_tile<kFwdKeys, kD>(v + kv_base, j0, Sk, D, sV);
      __syncthreads();

      float s[kRowsPerThread][kKC];
      tile_dot<kD>(sQ, sK, rg, lane, s);  // scores q_i · k_j
      int64_t kpos[kKC];
#pragma unroll
      for (int cc = 0; cc < kKC; ++cc) kpos[cc] = pl.key(j0 + lane + kLanes * cc);

#pragma unroll
      for (int rr = 0; rr < kRowsPerThread; ++rr) {
        const int r = rg * kRowsPerThread + rr;
        bool valid[kKC];
        float tile_max = -INFINITY;
#pragma unroll
        for (int cc = 0; cc < kKC; ++cc) {
          valid[cc] = kpos[cc] <= qpos[rr];  // padding rows and keys see nothing and are not stored
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
          const float p = valid[cc] ? expf(s[rr][cc] - m_ref) : 0.f;
          tile_sum += p;  // the normaliser counts every probability, dropped or not
          const float w = valid[cc] ? p * dr.mult(bh, qpos[rr], kpos[cc], pl.T, drop_offset) : 0.f;
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

    // l >= 1 once a row has seen a key (its maximum adds exp(0)); a row that saw none is empty.
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      const int64_t i = q0 + rg * kRowsPerThread + rr;
      if (i >= S) continue;
      const bool seen = l[rr] > 0.f;
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) {
        const int d = lane + kLanes * dc;
        if (d < D) out[base + i * D + d] = from_float<T>(seen ? acc[rr][dc] / l[rr] : 0.f);
      }
      if (lane == 0) lse[bh * S + i] = seen ? m[rr] + logf(l[rr]) : -INFINITY;
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
                        T* __restrict__ dq, int64_t B, AttnPlace pl, int D, float scale, AttnDropout dr,
                        int64_t group) {
  constexpr int kLD = kD + 1, kSLD = kDqKeys + 1, kDC = kD / kLanes, kKC = kDqKeys / kLanes;
  extern __shared__ float smem[];
  float* sQ = smem;                    // [kDqRows][kLD]
  float* sdO = sQ + kDqRows * kLD;     // [kDqRows][kLD]
  float* sK = sdO + kDqRows * kLD;     // [kDqKeys][kLD]
  float* sV = sK + kDqKeys * kLD;      // [kDqKeys][kLD]
  float* sdS = sV + kDqKeys * kLD;     // [kDqRows][kSLD]
  const int tid = threadIdx.x, rg = tid / kLanes, lane = tid % kLanes;
  const int64_t S = pl.S, Sk = pl.Sk;
  const int64_t n_qb = (S + kDqRows - 1) / kDqRows;
  const int64_t q0 = (n_qb - 1 - blockIdx.x) * kDqRows;
  const int64_t row_end = min64(q0 + kDqRows, S);
  const int64_t q_last = attention_tiles::last_position(pl.queries, q0, row_end);
  const int64_t n_kb = (attention_tiles::visible_keys_end(pl.keys, Sk, q_last) + kDqKeys - 1) / kDqKeys;

  for (int64_t bh = blockIdx.y; bh < B; bh += gridDim.y) {
    const int64_t base = bh * S * D, kv_base = (bh / group) * Sk * D;
    const int64_t drop_offset = dr.head_offset(bh, pl.T);
    __syncthreads();
    load_tile<kDqRows, kD>(q + base, q0, S, D, sQ);
    load_tile<kDqRows, kD>(dout + base, q0, S, D, sdO);
    float row_lse[kRowsPerThread], row_delta[kRowsPerThread], acc[kRowsPerThread][kDC];
    int64_t qpos[kRowsPerThread];  // -1: a padding row, or a row that saw no key (lse -inf)
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      const int64_t i = q0 + rg * kRowsPerThread + rr;
      row_lse[rr] = i < S ? lse[bh * S + i] : 0.f;
      row_delta[rr] = i < S ? delta[bh * S + i] : 0.f;
      qpos[rr] = row_lse[rr] == -INFINITY ? -1 : pl.query(i);
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) acc[rr][dc] = 0.f;
    }

    for (int64_t kb = 0; kb < n_kb; ++kb) {
      const int64_t j0 = kb * kDqKeys;
      if (!attention_tiles::tile_visible(pl.queries, q0, row_end, pl.keys, j0, min64(j0 + kDqKeys, Sk))) continue;
      __syncthreads();
      load_tile<kDqKeys, kD>(k + kv_base, j0, Sk, D, sK);
      load_tile<kDqKeys, kD>(v + kv_base, j0, Sk, D, sV);
      __syncthreads();

      float s[kRowsPerThread][kKC], dp[kRowsPerThread][kKC];
      tile_dot<kD>(sQ, sK, rg, lane, s);    // scores q_i · k_j
      tile_dot<kD>(sdO, sV, rg, lane, dp);  // dP = dO_i · v_j
      int64_t kpos[kKC];
#pragma unroll
      for (int cc = 0; cc < kKC; ++cc) kpos[cc] = pl.key(j0 + lane + kLanes * cc);

#pragma unroll
      for (int rr = 0; rr < kRowsPerThread; ++rr) {
        const int r = rg * kRowsPerThread + rr;
#pragma unroll
        for (int cc = 0; cc < kKC; ++cc) {
          float ds = 0.f;
          if (kpos[cc] <= qpos[rr]) {
            const float p = expf(s[rr][cc] * scale - row_lse[rr]);  // the recomputed probability
            const float mult = dr.mult(bh, qpos[rr], kpos[cc], pl.T, drop_offset);
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
                          T* __restrict__ dk, T* __restrict__ dv, int64_t B, AttnPlace pl, int D, float scale,
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
  const int64_t S = pl.S, Sk = pl.Sk;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kDkvKeys;  // the first key tiles have the most rows
  const int64_t key_end = min64(j0 + kDkvKeys, Sk);
  // The query tiles that see these keys: from the one holding the first query that sees the
  // first of them (the diagonal's in the square case); gaps are skipped tile by tile.
  const int64_t k_first = attention_tiles::first_position(pl.keys, j0, key_end);
  const int64_t qt0 = attention_tiles::first_seeing_query(pl.queries, S, k_first) / kDkvRows;
  const int64_t n_qt = (S + kDkvRows - 1) / kDkvRows;
  int64_t kpos[kRowsPerThread];  // this thread's keys' positions (INT64_MAX: a padding key)
#pragma unroll
  for (int rr = 0; rr < kRowsPerThread; ++rr) kpos[rr] = pl.key(j0 + rg * kRowsPerThread + rr);

  // One key/value head per y: its gradients sum over the `group` query heads that read it (GQA).
  for (int64_t kvh = blockIdx.y; kvh < B / group; kvh += gridDim.y) {
    const int64_t kv_base = kvh * Sk * D;
    __syncthreads();
    load_tile<kDkvKeys, kD>(k + kv_base, j0, Sk, D, sK);
    load_tile<kDkvKeys, kD>(v + kv_base, j0, Sk, D, sV);
    float acc_k[kRowsPerThread][kDC], acc_v[kRowsPerThread][kDC];
#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr)
#pragma unroll
      for (int dc = 0; dc < kDC; ++dc) acc_k[rr][dc] = acc_v[rr][dc] = 0.f;

    // Every query tile that sees the keys, of each query head of the group in turn.
    for (int64_t bh = kvh * group; bh < (kvh + 1) * group; ++bh) {
      const int64_t base = bh * S * D;
      const int64_t drop_offset = dr.head_offset(bh, pl.T);
      for (int64_t qt = qt0; qt < n_qt; ++qt) {
        const int64_t i0 = qt * kDkvRows;
        if (!attention_tiles::tile_visible(pl.queries, i0, min64(i0 + kDkvRows, S), pl.keys, j0, key_end)) continue;
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
        int64_t qpos[kQC];  // -1: a padding row, or a row that saw no key (lse -inf)
#pragma unroll
        for (int cc = 0; cc < kQC; ++cc) {
          const int r = lane + kLanes * cc;
          qpos[cc] = sLse[r] == -INFINITY ? -1 : pl.query(i0 + r);
        }

#pragma unroll
        for (int rr = 0; rr < kRowsPerThread; ++rr) {
          const int c = rg * kRowsPerThread + rr;
#pragma unroll
          for (int cc = 0; cc < kQC; ++cc) {
            const int r = lane + kLanes * cc;
            float pd = 0.f, ds = 0.f;
            if (kpos[rr] <= qpos[cc]) {
              const float p = expf(s[rr][cc] * scale - sLse[r]);
              const float mult = dr.mult(bh, qpos[cc], kpos[rr], pl.T, drop_offset);
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
    }

#pragma unroll
    for (int rr = 0; rr < kRowsPerThread; ++rr) {
      const int64_t j = j0 + rg * kRowsPerThread + rr;
      if (j >= Sk) continue;
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

// ---- attention_merge: two partial attentions of the same queries over disjoint keys --------
// A block takes kMergeRows rows at a time: first one thread per row turns the two lse into the
// merged lse (written back) and the weights of both parts (shared memory), then the block
// (x: packs of a row, y: rows) rescales the rows' packs, whole rows per warp where they fit.
// A row whose part saw no key (lse_part -inf) is left as it is; where out saw none (lse -inf)
// the part is copied, whatever out holds. At least kMergeRows threads per block.
constexpr int kMergeRows = 64;
constexpr float kMergeSkip = -1.f;  // the weight of an empty part: the row is left as it is

template <class T, int VEC>
__global__ void attention_merge_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ part,
                                       const float* __restrict__ lse_part, int64_t rows, int64_t D) {
  __shared__ float s_w[kMergeRows], s_wp[kMergeRows];  // the weights of out and of part
  const int tid = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  const int64_t packs = D / VEC;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMergeRows; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.x) * kMergeRows) {
    const int count = rows - r0 < kMergeRows ? static_cast<int>(rows - r0) : kMergeRows;
    __syncthreads();  // the previous rows' weights are no longer read
    if (tid < count) {
      const float a = lse[r0 + tid], b = lse_part[r0 + tid];
      float wa = 1.f, wb = kMergeSkip;
      if (b != -INFINITY) {
        const float m = fmaxf(a, b);
        const float merged = m + logf(expf(a - m) + expf(b - m));  // exp(-inf) = 0
        wa = expf(a - merged);
        wb = expf(b - merged);
        lse[r0 + tid] = merged;
      }
      s_w[tid] = wa;
      s_wp[tid] = wb;
    }
    __syncthreads();
    for (int rr = static_cast<int>(threadIdx.y); rr < count; rr += static_cast<int>(blockDim.y)) {
      const float wa = s_w[rr], wb = s_wp[rr];
      if (wb == kMergeSkip) continue;
      T* o = out + (r0 + rr) * D;
      const T* pp = part + (r0 + rr) * D;
      for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
        float acc[VEC], add[VEC];
        pack::load<T, VEC>(o + p * VEC, acc);
        pack::load<T, VEC>(pp + p * VEC, add);
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = (wa > 0.f ? wa * acc[e] : 0.f) + wb * add[e];
        pack::store<T, VEC>(o + p * VEC, acc);
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

// Calls f(std::integral_constant<int, kD>) with kD the head dim padded to 16, 32, 64, 128 or 192.
template <class F>
void with_head_dim(int64_t D, const char* op, F&& f) {
  check_head_dim(D, op);
  switch (attention_tiles::padded_head_dim(D)) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 192>{}); break;
  }
}

// Grids: x = tiles along the sequence, y = heads (looped over inside past 65535).
dim3 attention_grid(int64_t tiles, int64_t B) {
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(B < 65535 ? B : 65535));
}

template <class T>
void fwd(const T* q, const T* k, const T* v, float scale, const DropoutSpec& spec, T* out, float* lse,
         const AttentionShape& shape, cudaStream_t stream) {
  const AttnPlace pl = make_place(shape);
  const AttnDropout dr = make_dropout(spec, pl.T);
  const int64_t B = shape.B, S = shape.S;
  with_head_dim(shape.D, "attention_fwd", [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    constexpr size_t smem = fwd_smem_bytes<kD>();
    allow_smem(attention_fwd_kernel<T, kD>, smem);
    attention_fwd_kernel<T, kD><<<attention_grid((S + kFwdRows - 1) / kFwdRows, B), kThreads, smem, stream>>>(
        q, k, v, out, lse, B, pl, static_cast<int>(shape.D), scale, dr, shape.group);
    CUDA_CHECK_LAUNCH();
  });
}

template <class T>
void bwd(const T* q, const T* k, const T* v, const T* out, const T* dout, const float* lse, float scale,
         const DropoutSpec& spec, T* dq, T* dk, T* dv, float* delta, const AttentionShape& shape, cudaStream_t stream) {
  const AttnPlace pl = make_place(shape);
  const AttnDropout dr = make_dropout(spec, pl.T);
  const int64_t B = shape.B, S = shape.S, Sk = shape.Sk, group = shape.group;
  const int D = static_cast<int>(shape.D);
  with_head_dim(shape.D, "attention_bwd", [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    attention_delta_kernel<T><<<elementwise_blocks(B * S * 32), kElementwiseThreads, 0, stream>>>(out, dout, delta,
                                                                                                  B * S, D);
    CUDA_CHECK_LAUNCH();

    constexpr size_t dq_smem = dq_smem_bytes<kD>();
    allow_smem(attention_dq_kernel<T, kD>, dq_smem);
    attention_dq_kernel<T, kD><<<attention_grid((S + kDqRows - 1) / kDqRows, B), kThreads, dq_smem, stream>>>(
        q, k, v, dout, lse, delta, dq, B, pl, D, scale, dr, group);
    CUDA_CHECK_LAUNCH();

    if (Sk == 0) return;  // no keys: dk and dv hold nothing
    constexpr size_t dkdv_smem = dkdv_smem_bytes<kD>();
    allow_smem(attention_dkdv_kernel<T, kD>, dkdv_smem);
    attention_dkdv_kernel<T, kD><<<attention_grid((Sk + kDkvKeys - 1) / kDkvKeys, B / group), kThreads, dkdv_smem,
                                   stream>>>(q, k, v, dout, lse, delta, dk, dv, B, pl, D, scale, dr, group);
    CUDA_CHECK_LAUNCH();
  });
}

void check_shape(const AttentionShape& shape, const char* op) {
  check_head_dim(shape.D, op);
  if (shape.group < 1 || shape.B % shape.group != 0)
    throw InvalidArgument(std::string(op) + ": group must divide the query batches");
}

template <class T>
void merge(T* out, float* lse, const T* part, const float* lse_part, int64_t rows, int64_t D, cudaStream_t stream) {
  constexpr int kVec = kPack<T>;
  const bool wide = D % kVec == 0 && pack::aligned16(out) && pack::aligned16(part);
  const int64_t per_row = wide ? D / kVec : D;
  const unsigned x = static_cast<unsigned>(per_row < 1 ? 1 : per_row < kThreads ? per_row : kThreads);
  const dim3 block(x, kThreads / x);
  const unsigned grid = row_blocks((rows + kMergeRows - 1) / kMergeRows);
  if (wide)
    attention_merge_kernel<T, kVec><<<grid, block, 0, stream>>>(out, lse, part, lse_part, rows, D);
  else
    attention_merge_kernel<T, 1><<<grid, block, 0, stream>>>(out, lse, part, lse_part, rows, D);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_merge(DType dt, void* out, float* lse, const void* out_part, const float* lse_part, int64_t rows,
                     int64_t D, cudaStream_t stream) {
  if (rows == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "attention_merge", T,
                          merge<T>(static_cast<T*>(out), lse, static_cast<const T*>(out_part), lse_part, rows, D,
                                   stream));
}

void attention_fwd(DType dt, const void* q, const void* k, const void* v, float scale, const DropoutSpec& spec,
                   void* out, float* lse, const AttentionShape& shape, cudaStream_t stream) {
  check_shape(shape, "attention_fwd");
  if (shape.B == 0 || shape.S == 0) return;
  if (dt == DType::fp32) {
    fwd<float>(static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v), scale, spec,
               static_cast<float*>(out), lse, shape, stream);
    return;
  }
  // bf16 and fp16: tensor cores (attention_tc.cu); it refuses any other dtype.
  attention_fwd_tensor_core(dt, q, k, v, scale, spec, out, lse, shape, stream);
}

int64_t attention_bwd_workspace_floats(DType dt, const AttentionShape& shape) {
  const int64_t rows = shape.B * shape.S;  // delta; bf16 and fp16 add the fp32 dQ accumulator
  return dt == DType::fp32 ? rows : rows + rows * shape.D;
}

void attention_bwd(DType dt, const void* q, const void* k, const void* v, const void* out, const void* dout,
                   const float* lse, float scale, const DropoutSpec& spec, void* dq, void* dk, void* dv,
                   float* workspace, const AttentionShape& shape, cudaStream_t stream) {
  check_shape(shape, "attention_bwd");
  if (shape.B == 0 || shape.S == 0) return;
  if (dt == DType::fp32) {
    bwd<float>(static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
               static_cast<const float*>(out), static_cast<const float*>(dout), lse, scale, spec,
               static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv), workspace, shape, stream);
    return;
  }
  // bf16 and fp16: tensor cores (attention_tc.cu); it refuses any other dtype.
  attention_bwd_tensor_core(dt, q, k, v, out, dout, lse, scale, spec, dq, dk, dv, workspace, shape, stream);
}

}  // namespace actbench::cuda
