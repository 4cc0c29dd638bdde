// The fused attention forward and backward of bf16 and fp16 on tensor cores (mma.sync
// m16n8k16 and ldmatrix, kernels/cuda/mma.cuh), FlashAttention-2's structure; attention.cu
// keeps fp32. The backward is described at its kernels below. The forward's contract is
// attention_fwd's (cuda_ops.hpp): q, out [B, S, D], k, v [B / group, Sk, D], lse [B, S] fp32 =
// m + log(l) in natural log; rows placed in T positions (AttentionRows), key j visible from
// query i when kpos(j) <= qpos(i); a row that sees no key gets out 0 and lse -inf.
//
// Work split. One block of 4 warps per (head, 64 query rows); each warp owns 16 query rows
// end to end (its S, P and O never leave its registers), so the only block-wide traffic is
// the K and V tiles in shared memory. Heads are grid x and query tiles grid y in
// reverse: blocks start x-fastest, so every head's longest (last) tile runs first and the
// short tiles fill the tail of the launch.
//
// Per key tile (a tile no row of the block sees is skipped whole, attention_tiles.hpp):
//   S = Q·Kᵀ         Q's A fragments by ldmatrix from the Q tile, once per query tile (they
//                    stay in registers) or at every k-step where holding them would spill O
//                    (kQInRegisters); K's B fragments by ldmatrix (K rows are the B columns).
//   online softmax   in the log2 domain: S is scaled by scale·log2(e) once, so each
//                    probability is one exp2f; the row max is reduced over the 4 lanes that
//                    share a row (two shuffles); the running sum l stays a per-lane partial
//                    (each lane's correction is the row's), reduced once at the end.
//                    Masking (causal by position, padding keys and rows) only in tiles where
//                    some key is not visible from some row of the warp.
//   dropout          the kept probabilities by the same Philox words as the cpu backend, at
//                    the canonical index of (bh*T + qpos)*T + kpos (two neighbouring keys
//                    from one Philox call where they share a group of four); l sums every
//                    probability, dropped or not; the 1/(1-p) of the kept ones is applied
//                    with 1/l at the end (the same value in exact arithmetic, one rounding
//                    fewer than scaling each probability).
//   O += P·V         P is rounded to T in registers and is directly the A fragment (the C
//                    layout of S's two 8-key blocks is the A layout of one 16-key step); V's B
//                    fragments by ldmatrix.trans. O accumulates in fp32.
// At the end O·(1/l) is rounded to T, staged through the warp's own rows of the Q tile and
// written in 16-byte units; lse = m·ln2 + log(l).
//
// Shared memory: Q [64][kD], K [kKeys][kD], V [kKeys][kD] of 16-bit elements, kKeys = 64
// for kD = 64 and 96, 32 for 128, 16 for 192 (registers, kKeyTile below): 24, 36, 32, 36 KiB, so
// several blocks fit an SM on every sm_80+ part. Head sizes run in the instantiation for 64,
// 96, 128 or 192 (96 has its own: padding it to 128 would waste a quarter of the work); smaller D
// are padded to 64 with zeros, never stored.
// Rows are 16-byte chunks whose order is XOR-swizzled by the row (Swizzle below), so the 8
// rows an ldmatrix matrix reads, and the 8 rows a quarter warp's 16-byte stores write, fall
// in 8 different 16-byte bank groups: no bank conflict in the main loop.
//
// Pipelining with cp.async (async_copy.cuh), as FlashAttention-2: K and V have one tile each in
// shared memory, and each is refilled while the other is in use. V(j)'s copies are issued
// before S = Q·K(j)ᵀ and waited for after it; K(j+1)'s are issued before O += P·V(j) and
// waited for at the next tile's top. So each load's latency hides behind one of the two
// matmuls, and no register holds a tile on its way (the register-staged loads this replaces
// took kKeys·kD / 256 of them per lane, beside O, S and Q's fragments). Rows that are not
// 16-byte chunks (D % 8 != 0, or a misaligned pointer) are staged by plain loads and stores.
#include <climits>
#include <type_traits>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace actbench::cuda {
namespace {

using attention_detail::AttnDropout, attention_detail::AttnPlace, attention_detail::allow_smem,
    attention_detail::make_dropout, attention_detail::make_place, attention_detail::min64;
using attention_tiles::kFwdRows;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;  // query rows per warp: the M of one mma
static_assert(kWarps * kWarpRows == kFwdRows, "the warps cover the query tile");
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The head sizes the kernel is instantiated for: D padded to the next of 64, 96, 128, 192
// (192: multi-latent attention's q·k head).
using attention_tiles::tc_head_dim;

// Keys per tile (attention_tiles::tc_fwd_keys): a warp's O (kD / 2 registers per lane), its Q
// fragments (kD / 4 where held) and its scores (kKeys / 2) share 255 registers. 64 for kD = 64
// and 96; 32 for 128, where 64 keys spilled 76 bytes (sm_80) and 24 (sm_90) even with Q read
// again; 16 for 192, whose O alone is 96 registers (32 keys spilled 708 bytes on sm_90). Before
// the tiles came by cp.async, a register-staged share of K or V (kKeys·kD / 256 more) held 96
// to 32 keys as well (docs/kernel_efficiency.md has the counts).
template <int kD>
constexpr int kKeyTile = attention_tiles::tc_fwd_keys(kD);
// Whether the forward holds the warp's Q fragments in registers for the whole key loop (kD / 4
// of them) or reads them from shared memory again at each k-step (FlashAttention-2's default):
// held wherever ptxas then keeps O and S in registers (up to 96 on sm_80, 128 on sm_90), read
// again where holding them spills (kD = 128 on sm_80; 192). tools/ptxas_usage.py shows the
// counts; which is faster where both fit is a GPU measurement.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kQHeldUpTo = 128;
#else
constexpr int kQHeldUpTo = 96;
#endif
template <int kD>
constexpr bool kQInRegisters = kD <= kQHeldUpTo;

// A [rows][kD] tile of 16-bit elements in shared memory, each row kD / 8 chunks of 16 bytes;
// chunk c of row r is stored at chunk c ^ f(r). Every access of the kernel touches 8
// consecutive rows r0..r0+7 (r0 a multiple of 8) at one logical chunk, per quarter warp; a
// row of 128 or 256 bytes starts at bank group 0, so f(r) = r % 8 spreads them over the 8
// bank groups. Rows of 192 bytes (kD = 96) start at bank group 0 or 4 alternately: chunks
// 0-7 with r % 8 as before; chunks 8-11 XOR (r / 2) % 4, which stays inside 8-11 and gives
// the 8 rows' group 4(r % 2) + (c ^ (r / 2) % 4) % 4, all distinct.
template <int kD>
struct Swizzle {
  static_assert(kD % 32 == 0, "rows of whole chunk groups");
  static constexpr int kChunks = kD / 8;
  __device__ __forceinline__ static int chunk(int r, int c) {
    if constexpr (kChunks % 8 == 0) {
      return c ^ (r & 7);
    } else {
      return c < 8 ? c ^ (r & 7) : c ^ ((r >> 1) & 3);
    }
  }
  // The element offset of chunk c of row r.
  __device__ __forceinline__ static int at(int r, int c) { return r * kD + chunk(r, c) * 8; }
};

// ---- bf16 / fp16 ---------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ uint16_t bits_of(float v);
template <>
__device__ __forceinline__ uint16_t bits_of<__nv_bfloat16>(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <>
__device__ __forceinline__ uint16_t bits_of<__half>(float v) {
  return __half_as_ushort(__float2half_rn(v));
}
// Two values rounded to T, the first in the low half (the fragments' element order).
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  return static_cast<uint32_t>(bits_of<T>(lo)) | static_cast<uint32_t>(bits_of<T>(hi)) << 16;
}

// d += a·b on the tensor cores, in T.
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    mma_m16n8k16_bf16(d, a, b, d);
  } else {
    mma_m16n8k16_fp16(d, a, b, d);
  }
}

// ---- tiles between global and shared memory ------------------------------------------------

// A thread's chunks of a [kRows][kD] tile: kRows·kD / 1024 chunks of 16 bytes. Warp w's i-th
// chunk is of unit i·kWarps + w, a unit being 8 rows × 4 chunks; lane l takes row l % 8,
// chunk l / 8 of it, so a quarter warp (a shared-memory phase) is 8 consecutive rows at one
// chunk, and the warp reads 64 contiguous bytes of each of 8 rows (whole sectors).
template <int kRows, int kD>
struct TileChunks {
  static constexpr int kRowGroups = kRows / 8, kCount = kRows * kD / (8 * kThreads);
  static_assert(kRowGroups * (kD / 32) == kCount * kWarps, "whole units per warp");

  __device__ __forceinline__ static void place(int i, int& row, int& chunk) {
    const int unit = i * kWarps + static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    row = (unit % kRowGroups) * 8 + lane % 8;
    chunk = (unit / kRowGroups) * 4 + lane / 8;
  }
};

// Chunk c (elements 8c .. 8c+7) of row `row` of a [rows, D] matrix whose rows are not 16-byte
// chunks; zeros past its rows or columns.
__device__ __forceinline__ uint4 load_chunk_scalar(const uint16_t* m, int64_t row, int64_t rows, int c, int D) {
  if (row >= rows || c * 8 >= D) return make_uint4(0u, 0u, 0u, 0u);
  const uint16_t* p = m + row * D + c * 8;
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t lo = c * 8 + 2 * e < D ? p[2 * e] : 0u, hi = c * 8 + 2 * e + 1 < D ? p[2 * e + 1] : 0u;
    w[e] = lo | hi << 16;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Rows [row0, row0 + kRows) of a [rows, D] matrix into the swizzled tile, zeros past its rows
// and columns. vec (D % 8 == 0, 16-byte aligned rows): by cp.async, which the caller commits
// and waits for; else by plain loads and stores, visible after the caller's barrier.
template <int kRows, int kD>
__device__ __forceinline__ void stage_tile(uint16_t* tile, const uint16_t* m, int64_t row0, int64_t rows, int D,
                                           bool vec) {
#pragma unroll
  for (int i = 0; i < TileChunks<kRows, kD>::kCount; ++i) {
    int r, c;
    TileChunks<kRows, kD>::place(i, r, c);
    uint16_t* dst = tile + Swizzle<kD>::at(r, c);
    const int64_t row = row0 + r;
    if (vec) {
      const bool inside = row < rows && c * 8 < D;
      cp_async_16(dst, inside ? m + row * D + c * 8 : m, inside);  // outside: 16 zero bytes, m not read
    } else {
      *reinterpret_cast<uint4*>(dst) = load_chunk_scalar(m, row, rows, c, D);
    }
  }
}

// The next key tile of kKeys from kb on that some row of [q0, q1) sees (n_kb: none).
template <int kKeys>
__device__ __forceinline__ int64_t next_visible_tile(const AttnPlace& pl, int64_t q0, int64_t q1, int64_t kb,
                                                     int64_t n_kb) {
  for (; kb < n_kb; ++kb) {
    const int64_t j0 = kb * kKeys;
    if (attention_tiles::tile_visible(pl.queries, q0, q1, pl.keys, j0, min64(j0 + kKeys, pl.Sk))) break;
  }
  return kb;
}

// ---- masks of a lane's scores --------------------------------------------------------------
// Bit nb·4 + i stands for the lane's score s[nb][i] (key j0 + nb·8 + 2t + i % 2, row i / 2);
// a tile of kKeys keys gives each lane kKeys / 2 scores (at most 32: one 32-bit mask). Both
// masks are made in rolled loops, apart from the scores: unrolled, the positions' 64-bit
// arithmetic and an inlined Philox call per pair would crowd out the registers that hold S,
// O and Q.
template <int kKeys>
constexpr int kLaneScores = kKeys / 2;

// Which scores are visible: the key is not after its row's position (padding keys and rows
// never are).
template <int kKeys>
__device__ __forceinline__ uint32_t visible_bits(const AttnPlace& pl, int64_t j0, int t, const int64_t (&qpos)[2]) {
  uint32_t bits = 0;
#pragma unroll 1
  for (int e = 0; e < kLaneScores<kKeys>; ++e) {
    const int64_t j = j0 + (e / 4) * 8 + 2 * t + e % 2;
    if (pl.key(j) <= qpos[e / 2 % 2]) bits |= 1u << e;
  }
  return bits;
}

// Which visible scores dropout keeps (bits of the others are 0), pair by pair: the two keys of
// a pair (scores 2k, 2k + 1, one row) usually share a group of four Philox words.
template <int kKeys>
__device__ __forceinline__ uint32_t kept_bits(const AttnDropout& dr, const AttnPlace& pl, int64_t bh, int64_t j0,
                                              int t, const int64_t (&qpos)[2], uint32_t visible, int64_t offset) {
  uint32_t bits = 0;
#pragma unroll 1
  for (int pair = 0; pair < kLaneScores<kKeys> / 2; ++pair) {
    const uint32_t both = (visible >> (2 * pair)) & 3u;
    if (both == 0) continue;
    const int64_t qp = qpos[pair % 2], ja = j0 + (pair / 2) * 8 + 2 * t;
    // A visible score has a real query and key; its neighbour may be a padding key (no
    // position): position 0 stands in, its bit is cleared below.
    const int64_t ca = dr.canonical(bh, qp, ja < pl.Sk ? pl.key(ja) : 0, pl.T, offset);
    const int64_t cb = dr.canonical(bh, qp, ja + 1 < pl.Sk ? pl.key(ja + 1) : 0, pl.T, offset);
    bool keep_a, keep_b;
    dr.keep_pair(ca, cb, keep_a, keep_b);
    bits |= (((keep_a ? 1u : 0u) | (keep_b ? 2u : 0u)) & both) << (2 * pair);
  }
  return bits;
}

// ---- the kernel ----------------------------------------------------------------------------

template <int kD>
constexpr size_t tc_smem_bytes() {
  return sizeof(uint16_t) * (kFwdRows + 2 * kKeyTile<kD>) * kD;
}

// Per lane (g = lane / 4, t = lane % 4) of warp w: rows w·16 + g ("lo") and + 8 ("hi") of the
// query tile; s[nb][i] is the score of key nb·8 + 2t + i % 2 of the row i / 2 picks (the mma's
// C layout), o[nd][i] the output of dim nd·8 + 2t + i % 2.
template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_fwd_tc_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                            const uint16_t* __restrict__ v, uint16_t* __restrict__ out, float* __restrict__ lse,
                            AttnPlace pl, int D, bool vec, float scale_log2, AttnDropout dr, int64_t group) {
  constexpr int kSteps = kD / 16;          // k-steps of Q·Kᵀ
  constexpr int kDimBlocks = kD / 8;       // 8-column blocks of O
  constexpr int kKeys = kKeyTile<kD>;
  constexpr int kKeyBlocks = kKeys / 8;     // 8-key blocks of S
  static_assert(kKeys % 16 == 0 && kKeys <= 64, "whole k-steps of P·V; a lane's scores fit a 32-bit mask");
  using Sw = Swizzle<kD>;
  extern __shared__ uint4 tc_smem[];
  uint16_t* sQ = reinterpret_cast<uint16_t*>(tc_smem);  // [kFwdRows][kD]; at the end, the output
  uint16_t* sK = sQ + kFwdRows * kD;                     // [kKeys][kD]
  uint16_t* sV = sK + kKeys * kD;                        // [kKeys][kD]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t S = pl.S, Sk = pl.Sk, bh = blockIdx.x;
  const int64_t base = bh * S * D, kv_base = (bh / group) * Sk * D;  // GQA: the group's keys and values
  const int64_t drop_offset = dr.head_offset(bh, pl.T);
  const float out_scale = dr.on ? dr.scale : 1.f;  // the kept probabilities' 1/(1-p)
  const int64_t n_qb = (S + kFwdRows - 1) / kFwdRows;

  for (int64_t qb = blockIdx.y; qb < n_qb; qb += gridDim.y) {
    const int64_t q0 = (n_qb - 1 - qb) * kFwdRows;  // the longest rows first
    const int64_t row_end = min64(q0 + kFwdRows, S);
    const int64_t q_last = attention_tiles::last_position(pl.queries, q0, row_end);
    const int64_t n_kb = (attention_tiles::visible_keys_end(pl.keys, Sk, q_last) + kKeys - 1) / kKeys;
    // This warp's rows: their positions (-1: padding), and whether all 16 are rows whose
    // earliest position is w_first (a key tile wholly at or before it needs no mask).
    const int64_t w0 = q0 + warp * kWarpRows, w1 = min64(w0 + kWarpRows, S);
    const int64_t qpos[2] = {pl.query(w0 + g), pl.query(w0 + g + 8)};
    const bool w_full = w1 - w0 == kWarpRows;
    const int64_t w_first = w_full ? attention_tiles::first_position(pl.queries, w0, w1) : -1;

    __syncthreads();  // the previous query tile is done with shared memory
    stage_tile<kFwdRows, kD>(sQ, q + base, q0, S, D, vec);
    cp_async_commit();
    int64_t kb = next_visible_tile<kKeys>(pl, q0, row_end, 0, n_kb);
    if (kb < n_kb) stage_tile<kKeys, kD>(sK, k + kv_base, kb * kKeys, Sk, D, vec);
    cp_async_commit();
    cp_async_wait<1>();  // Q has landed; K(kb) may still fly (waited for at the loop's top)
    __syncthreads();
    // The warp's 16 rows of Q as A fragments: held for the whole key loop, or read again from
    // sQ at each k-step (kQInRegisters).
    uint32_t qf[kQInRegisters<kD> ? kSteps : 1][4];
    const int q_row = warp * kWarpRows + lane % 16, q_chunk = lane / 16;  // the lane's ldmatrix row of Q
    if constexpr (kQInRegisters<kD>) {
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) ldmatrix(qf[kk], sQ + Sw::at(q_row, 2 * kk + q_chunk));
    }
    // The lane's ldmatrix row addresses in the key loop, as offsets: the rows a lane supplies
    // are 8·n + lane % 8, so the swizzle depends on the lane and the chunk only, and the 8-row
    // blocks (nb, kk2 below) are constant offsets. One offset per K k-step and per V pair of
    // column blocks, instead of one per (k-step, key block) and (key step, column block).
    int k_off[kSteps], v_off[kDimBlocks / 2];
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
      k_off[kk] = ((lane / 16) * 8 + lane % 8) * kD + Sw::chunk(lane % 8, 2 * kk + (lane / 8) % 2) * 8;
#pragma unroll
    for (int c2 = 0; c2 < kDimBlocks / 2; ++c2)
      v_off[c2] = (((lane / 8) % 2) * 8 + lane % 8) * kD + Sw::chunk(lane % 8, 2 * c2 + lane / 16) * 8;

    float o[kDimBlocks][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int nd = 0; nd < kDimBlocks; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;

    while (kb < n_kb) {
      const int64_t j0 = kb * kKeys;
      cp_async_wait<0>();  // K(kb) has landed
      __syncthreads();     // sK holds K(kb) for every warp, and every warp is done with sV
      stage_tile<kKeys, kD>(sV, v + kv_base, j0, Sk, D, vec);  // V(kb), waited for after S
      cp_async_commit();

      // S = Q·Kᵀ. One ldmatrix.x4 gives two key blocks' B fragments: matrices (block nb,
      // chunk 2kk), (nb, 2kk + 1), (nb + 1, 2kk), (nb + 1, 2kk + 1).
      float s[kKeyBlocks][4];
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        const uint32_t(&qa)[4] = qf[kQInRegisters<kD> ? kk : 0];
        if constexpr (!kQInRegisters<kD>) ldmatrix(qf[0], sQ + Sw::at(q_row, 2 * kk + q_chunk));
#pragma unroll
        for (int nb = 0; nb < kKeyBlocks; nb += 2) {
          uint32_t kf[4];
          ldmatrix(kf, sK + nb * 8 * kD + k_off[kk]);  // rows nb·8 + (lane / 16)·8 + lane % 8
          const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
          mma<T>(s[nb], qa, b0);
          mma<T>(s[nb + 1], qa, b1);
        }
      }

      // Scale into the log2 domain; mask where some key of the tile is not visible from some
      // row of the warp (the diagonal, padding keys or rows, a placed run's edge).
      const bool full = w_full && j0 + kKeys <= Sk &&
                        attention_tiles::last_position(pl.keys, j0, j0 + kKeys) <= w_first;
      const uint32_t seen = full ? ~0u : visible_bits<kKeys>(pl, j0, t, qpos);
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nb][i] = (seen >> (nb * 4 + i)) & 1u ? s[nb][i] * scale_log2 : -INFINITY;

      // Online softmax: the rows' new max over the 4 lanes that share each row.
      float ref[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = m[h];
#pragma unroll
        for (int nb = 0; nb < kKeyBlocks; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * h], s[nb][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
        ref[h] = mx == -INFINITY ? 0.f : mx;       // a row with nothing seen yet stays at 0
        const float correction = exp2f(m[h] - ref[h]);  // 0 on the first tile
        m[h] = mx;
        l[h] *= correction;
#pragma unroll
        for (int nd = 0; nd < kDimBlocks; ++nd) {
          o[nd][2 * h] *= correction;
          o[nd][2 * h + 1] *= correction;
        }
      }
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float p = exp2f(s[nb][i] - ref[i / 2]);  // exp2(-inf) = 0: masked keys
          l[i / 2] += p;  // the normaliser counts every probability, dropped or not
          s[nb][i] = p;
        }

      if (dr.on) {
        const uint32_t kept = kept_bits<kKeys>(dr, pl, bh, j0, t, qpos, seen, drop_offset);
#pragma unroll
        for (int nb = 0; nb < kKeyBlocks; ++nb)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (!((kept >> (nb * 4 + i)) & 1u)) s[nb][i] = 0.f;
      }

      cp_async_wait<0>();  // V(kb) has landed
      __syncthreads();     // sV holds V(kb) for every warp, and every warp is done with sK
      const int64_t kb_next = next_visible_tile<kKeys>(pl, q0, row_end, kb + 1, n_kb);
      if (kb_next < n_kb) stage_tile<kKeys, kD>(sK, k + kv_base, kb_next * kKeys, Sk, D, vec);  // during P·V
      cp_async_commit();

      // O += P·V, 16 keys a step: S's blocks 2kk2 and 2kk2 + 1 are the A fragment; V's
      // matrices (keys 0-7, chunk nd), (keys 8-15, nd), (0-7, nd + 1), (8-15, nd + 1).
#pragma unroll
      for (int kk2 = 0; kk2 < kKeys / 16; ++kk2) {
        const uint32_t pf[4] = {pack_pair<T>(s[2 * kk2][0], s[2 * kk2][1]), pack_pair<T>(s[2 * kk2][2], s[2 * kk2][3]),
                                pack_pair<T>(s[2 * kk2 + 1][0], s[2 * kk2 + 1][1]),
                                pack_pair<T>(s[2 * kk2 + 1][2], s[2 * kk2 + 1][3])};
#pragma unroll
        for (int nd = 0; nd < kDimBlocks; nd += 2) {
          uint32_t vf[4];
          ldmatrix_trans(vf, sV + kk2 * 16 * kD + v_off[nd / 2]);  // rows kk2·16 + ((lane / 8) % 2)·8 + lane % 8
          const uint32_t b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
          mma<T>(o[nd], pf, b0);
          mma<T>(o[nd + 1], pf, b1);
        }
      }
      kb = kb_next;
    }

    // l: the row's sum over its 4 lanes; l >= 1 once the row has seen a key (its maximum adds
    // exp2(0)), 0 for a row that saw none (out 0, lse -inf).
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(kFullMask, l[h], 1);
      l[h] += __shfl_xor_sync(kFullMask, l[h], 2);
      inv[h] = l[h] > 0.f ? out_scale / l[h] : 0.f;
    }
    // The output in T through the warp's own 16 rows of sQ (only this warp read them, before
    // its first mma), then out in 16-byte units: 8 rows × 4 chunks per warp instruction.
    __syncwarp();
#pragma unroll
    for (int nd = 0; nd < kDimBlocks; ++nd)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp * kWarpRows + g + 8 * h;
        *reinterpret_cast<uint32_t*>(sQ + Sw::at(r, nd) + 2 * t) =
            pack_pair<T>(o[nd][2 * h] * inv[h], o[nd][2 * h + 1] * inv[h]);
      }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kD / 16; ++u) {
      const int r = warp * kWarpRows + (u % 2) * 8 + lane % 8, c = (u / 2) * 4 + lane / 8;
      const int64_t i = q0 + r;
      if (i >= S || c * 8 >= D) continue;
      const uint4 chunk = *reinterpret_cast<const uint4*>(sQ + Sw::at(r, c));
      uint16_t* dst = out + base + i * D + c * 8;
      if (vec) {
        *reinterpret_cast<uint4*>(dst) = chunk;
      } else {
        const uint32_t w[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (c * 8 + e < D) dst[e] = static_cast<uint16_t>(w[e / 2] >> (16 * (e % 2)));
      }
    }
    if (t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = w0 + g + 8 * h;
        if (i < S) lse[bh * S + i] = l[h] > 0.f ? m[h] * kLn2 + logf(l[h]) : -INFINITY;
      }
    }
  }
}

// ---- host launcher -------------------------------------------------------------------------

template <class T, int kD>
void launch(const void* q, const void* k, const void* v, float scale, const DropoutSpec& spec, void* out, float* lse,
            const AttentionShape& shape, cudaStream_t stream) {
  const AttnPlace pl = make_place(shape);
  const AttnDropout dr = make_dropout(spec, pl.T);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = shape.D % 8 == 0 && aligned(q) && aligned(k) && aligned(v) && aligned(out);
  const int64_t n_qb = (shape.S + kFwdRows - 1) / kFwdRows;
  if (shape.B > INT_MAX)
    throw InvalidArgument("attention_fwd: " + std::to_string(shape.B) + " heads is more than one launch takes");
  // x: heads (every head's longest tile first), y: query tiles, looped over past 65535.
  const dim3 grid(static_cast<unsigned>(shape.B), static_cast<unsigned>(n_qb < 65535 ? n_qb : 65535));
  constexpr size_t smem = tc_smem_bytes<kD>();
  allow_smem(attention_fwd_tc_kernel<T, kD>, smem);
  attention_fwd_tc_kernel<T, kD><<<grid, kThreads, smem, stream>>>(
      static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v),
      static_cast<uint16_t*>(out), lse, pl, static_cast<int>(shape.D), vec, scale * kLog2e, dr, shape.group);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_for_head_dim(const void* q, const void* k, const void* v, float scale, const DropoutSpec& spec, void* out,
                         float* lse, const AttentionShape& shape, cudaStream_t stream) {
  switch (tc_head_dim(shape.D)) {
    case 64: launch<T, 64>(q, k, v, scale, spec, out, lse, shape, stream); break;
    case 96: launch<T, 96>(q, k, v, scale, spec, out, lse, shape, stream); break;
    case 128: launch<T, 128>(q, k, v, scale, spec, out, lse, shape, stream); break;
    default: launch<T, 192>(q, k, v, scale, spec, out, lse, shape, stream); break;
  }
}

// ---- backward --------------------------------------------------------------------------------
// FlashAttention-2's backward: delta = rowsum(dO∘O) and a zeroed fp32 dQ accumulator first
// (attention_bwd_prep_kernel), then one block per (key/value head, kBwdKeys keys) that loads K and V
// once and loops over the query tiles that see them, of each query head of its GQA group:
//   Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·scale·log2(e) − lse·log2(e))   (the one recomputation of S)
//   dPᵀ = V·dOᵀ
//   dV += (P∘keep/(1−p))ᵀ·dO                    dropout by the forward's Philox words
//   dSᵀ = Pᵀ∘(dPᵀ·keep/(1−p) − delta)
//   dK += dSᵀ·Q                                 (scale applied once, at the store)
//   dQ += dS·K                                  fp32 atomicAdd into the accumulator
// and last attention_dq_convert_kernel writes dQ = scale·acc in T. Each warp owns 16 keys end
// to end (their dK and dV accumulate in its registers across the whole loop; at kD = 96 and
// 128, half of their columns, a second warp the other half), as each warp of the forward owns
// 16 query rows: Sᵀ and dPᵀ are in the mma's C layout with keys as rows, so
// Pᵀ and dSᵀ are directly the A fragments of dV's and dK's mma (the forward's P trick), with
// dO's and Q's B fragments by ldmatrix.trans. dQ needs dS summed over the block's keys:
// each key group's first warp stores its dSᵀ (in T) to shared memory, and after a barrier
// every warp computes a slice of the tile's dQ (16 rows × kD / (kWarps / (rows / 16))
// columns) from it by ldmatrix.trans, adding it to the accumulator with one atomic per
// element. The atomics make dQ's fp32 sum order (and so its last bits) depend on the blocks'
// timing.
// Query tiles of 64 rows for kD = 64, 32 for 96 and 128 and 16 for 192: a lane's dK and dV take
// kD fp32 registers at kD = 64 and kD / 2 above, which leaves room for 16 (not 32) of Sᵀ's and
// dPᵀ's columns per lane, and at 192 (96 of dK and dV) for 8.
// Shared memory: K, V [keys][kD] and dSᵀ [keys][64] (rows of 128 bytes, Swizzle<64>) once, and
// two query-tile buffers, each Q, dO [rows][kD] (swizzled as in the forward) and per query row
// lse·log2(e), delta and the position: 58, 41, 53 and 52.5 KiB for kD = 64, 96, 128, 192.
// Pipelining: the next query tile's Q and dO are copied into the other buffer with cp.async
// (async_copy.cuh) while this one is computed, and its rows' lse and delta are loaded into
// registers at the same time and stored at the tile's end, so no load is waited for at a
// barrier but the first tile's of each key tile.

template <int kD>
constexpr int kBwdRows = attention_tiles::tc_bwd_rows(kD);
// Key groups of 16 per block: 4 for kD = 64 (each warp owns its keys' whole dK and dV rows);
// 2 for 96 and 128, where warps w and w + 2 share a group's 16 keys and each owns half of
// their dK and dV columns: kD fp32 accumulators per lane left ptxas spilling up to 1.4 KiB
// (docs/kernel_efficiency.md), kD / 2 leave room. Both warps of a group compute its Sᵀ and dPᵀ.
template <int kD>
constexpr int kBwdKeyGroups = kD <= 64 ? kWarps : kWarps / 2;
template <int kD>
constexpr int kBwdKeys = kBwdKeyGroups<kD> * kWarpRows;  // keys per block
static_assert(kBwdKeys<64> == attention_tiles::tc_bwd_keys(64) && kBwdKeys<96> == attention_tiles::tc_bwd_keys(96) &&
                  kBwdKeys<128> == attention_tiles::tc_bwd_keys(128) && kBwdKeys<192> == attention_tiles::tc_bwd_keys(192),
              "attention_tiles counts the blocks the kernel runs");
constexpr int kDsCols = 64;                             // the dSᵀ tile's row length (queries), for every kD

// Per query-tile buffer (two of them): Q and dO [rows][kD], and per row its position,
// lse·log2(e) and delta.
template <int kD>
__host__ __device__ constexpr size_t tc_bwd_query_buffer_bytes() {
  return sizeof(uint16_t) * 2 * kBwdRows<kD> * kD + (2 * sizeof(float) + sizeof(int64_t)) * kBwdRows<kD>;
}
template <int kD>
constexpr size_t tc_bwd_smem_bytes() {
  return sizeof(uint16_t) * (2 * kBwdKeys<kD> * kD + kBwdKeys<kD> * kDsCols) + 2 * tc_bwd_query_buffer_bytes<kD>();
}

template <class T>
__device__ __forceinline__ float float_of(uint16_t b);
template <>
__device__ __forceinline__ float float_of<__nv_bfloat16>(uint16_t b) {
  return __bfloat162float(__ushort_as_bfloat16(b));
}
template <>
__device__ __forceinline__ float float_of<__half>(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}

// delta_i = rowsum(dO∘O) in fp32, one warp per row; the row's dQ accumulator zeroed.
template <class T>
__global__ void attention_bwd_prep_kernel(const uint16_t* __restrict__ out, const uint16_t* __restrict__ dout,
                                          float* __restrict__ delta, float* __restrict__ dq_acc, int64_t rows,
                                          int D) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = grid_threads() >> 5;
  for (int64_t r = global_thread() >> 5; r < rows; r += warps) {
    float s = 0.f;
    for (int d = lane; d < D; d += 32) {
      s = fmaf(float_of<T>(out[r * D + d]), float_of<T>(dout[r * D + d]), s);
      dq_acc[r * D + d] = 0.f;
    }
    s = warp_sum(s);
    if (lane == 0) delta[r] = s;
  }
}

template <class T>
__global__ void attention_dq_convert_kernel(const float* __restrict__ dq_acc, float scale, uint16_t* __restrict__ dq,
                                            int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dq[i] = bits_of<T>(scale * dq_acc[i]);
}

// The lane's scores of Sᵀ (keys as rows): bit nb·4 + i stands for s[nb][i], key row
// g + 8·(i / 2) of the warp, query column nb·8 + 2t + i % 2 of the tile. kpos: the lane's two
// keys' positions; qpos: the tile's query positions (-1: padding, or a row that saw no key).
template <int kRows>
__device__ __forceinline__ uint32_t visible_bits_t(const int64_t* qpos, int t, int64_t kpos0, int64_t kpos1) {
  uint32_t bits = 0;
#pragma unroll 1
  for (int e = 0; e < kRows / 2; ++e)
    if (((e & 2) ? kpos1 : kpos0) <= qpos[(e / 4) * 8 + 2 * t + e % 2]) bits |= 1u << e;
  return bits;
}

// Which visible scores dropout keeps, pair by pair: a pair is one key and two neighbouring
// queries (T apart in the canonical index, so usually two Philox calls).
template <int kRows>
__device__ __forceinline__ uint32_t kept_bits_t(const AttnDropout& dr, const AttnPlace& pl, int64_t bh, int t,
                                                int64_t kpos0, int64_t kpos1, const int64_t* qpos, uint32_t visible,
                                                int64_t offset) {
  uint32_t bits = 0;
#pragma unroll 1
  for (int pair = 0; pair < kRows / 4; ++pair) {
    const uint32_t both = (visible >> (2 * pair)) & 3u;
    if (both == 0) continue;
    const int64_t kp = pair % 2 ? kpos1 : kpos0;  // a real key: one of the pair is visible
    const int col = (pair / 2) * 8 + 2 * t;
    // A padding neighbour (no position): 0 stands in, its bit is cleared below.
    const int64_t qa = qpos[col] < 0 ? 0 : qpos[col], qb = qpos[col + 1] < 0 ? 0 : qpos[col + 1];
    bool keep_a, keep_b;
    dr.keep_pair(dr.canonical(bh, qa, kp, pl.T, offset), dr.canonical(bh, qb, kp, pl.T, offset), keep_a, keep_b);
    bits |= (((keep_a ? 1u : 0u) | (keep_b ? 2u : 0u)) & both) << (2 * pair);
  }
  return bits;
}

// This lane's fp32 accumulators of 16 key rows (g, g + 8 of the warp's), column blocks from
// nd0, as T: scaled, rows past Sk and columns past D not stored.
template <class T, int kDimBlocks>
__device__ __forceinline__ void store_key_rows(uint16_t* m, int64_t w0, int64_t Sk, int D, bool vec, int g, int t,
                                               int nd0, float mul, const float (&acc)[kDimBlocks][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t j = w0 + g + 8 * h;
    if (j >= Sk) continue;
#pragma unroll
    for (int nd = 0; nd < kDimBlocks; ++nd) {
      const int d = (nd0 + nd) * 8 + 2 * t;
      if (d >= D) continue;
      uint16_t* dst = m + j * D + d;
      if (vec) {
        *reinterpret_cast<uint32_t*>(dst) = pack_pair<T>(mul * acc[nd][2 * h], mul * acc[nd][2 * h + 1]);
      } else {
        dst[0] = bits_of<T>(mul * acc[nd][2 * h]);
        if (d + 1 < D) dst[1] = bits_of<T>(mul * acc[nd][2 * h + 1]);
      }
    }
  }
}

// The query tiles a key tile's block visits, in order: each tile that sees the keys, of each
// query head of the GQA group in turn (whether a tile sees them does not depend on the head).
struct QueryTile {
  int64_t bh, qt;
};
__device__ __forceinline__ bool next_query_tile(const AttnPlace& pl, int rows, int64_t head_end, int64_t qt0,
                                                int64_t j0, int64_t key_end, QueryTile& tile) {
  const int64_t n_qt = (pl.S + rows - 1) / rows;
  for (;;) {
    if (++tile.qt >= n_qt) {
      tile.qt = qt0;
      ++tile.bh;
    }
    if (tile.bh >= head_end || qt0 >= n_qt) return false;
    const int64_t i0 = tile.qt * rows;
    if (attention_tiles::tile_visible(pl.queries, i0, min64(i0 + rows, pl.S), pl.keys, j0, key_end)) return true;
  }
}

// A query row's statistics from the forward, between global and shared memory (thread r of
// the block holds row r of a tile; rows past S, and threads past the tile's rows, hold none).
struct RowStats {
  float lse = -INFINITY, delta = 0.f;
  int64_t pos = -1;  // -1: padding, or a row that saw no key (it sees none)
};
__device__ __forceinline__ RowStats load_row_stats(const AttnPlace& pl, const float* lse, const float* delta,
                                                   int64_t bh, int64_t i0, int rows) {
  RowStats st;
  const int64_t i = i0 + static_cast<int64_t>(threadIdx.x);
  if (static_cast<int>(threadIdx.x) >= rows || i >= pl.S) return st;
  st.lse = lse[bh * pl.S + i];
  st.delta = delta[bh * pl.S + i];
  st.pos = st.lse == -INFINITY ? -1 : pl.query(i);
  return st;
}
__device__ __forceinline__ void store_row_stats(const RowStats& st, int rows, int64_t* qpos, float* lse_log2,
                                                float* delta) {
  const int r = static_cast<int>(threadIdx.x);
  if (r >= rows) return;
  qpos[r] = st.pos;
  lse_log2[r] = st.lse == -INFINITY ? 0.f : st.lse * kLog2e;
  delta[r] = st.delta;
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_tc_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                            const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                            const float* __restrict__ lse, const float* __restrict__ delta, float* __restrict__ dq_acc,
                            uint16_t* __restrict__ dk, uint16_t* __restrict__ dv, AttnPlace pl, int D, bool vec,
                            float scale, float scale_log2, AttnDropout dr, int64_t group) {
  constexpr int kRows = kBwdRows<kD>, kKeys = kBwdKeys<kD>, kGroups = kBwdKeyGroups<kD>;
  constexpr int kSteps = kD / 16, kDimBlocks = kD / 8, kQueryBlocks = kRows / 8;
  // A warp's share of dK's and dV's columns: kOwnBlocks blocks of 8 from nd_own.
  constexpr int kOwnBlocks = kDimBlocks / (kWarps / kGroups);
  static_assert(kGroups * (kWarps / kGroups) == kWarps && kOwnBlocks % 2 == 0, "whole column shares per warp");
  // dQ of a query tile: kRowBlocks blocks of 16 rows × kSplits column slices, one per warp.
  constexpr int kRowBlocks = kRows / 16, kSplits = kWarps / kRowBlocks, kDqBlocks = kDimBlocks / kSplits;
  static_assert(kRowBlocks * kSplits == kWarps && kDqBlocks % 2 == 0, "whole dQ slices per warp");
  static_assert(kRows <= kDsCols && kRows / 2 <= 32, "dSᵀ fits its rows; a lane's scores fit a 32-bit mask");
  using Sw = Swizzle<kD>;
  using SwS = Swizzle<kDsCols>;
  static_assert(kRows <= kThreads, "a thread per row of the tile's statistics");
  extern __shared__ uint4 tc_smem[];
  uint16_t* sK = reinterpret_cast<uint16_t*>(tc_smem);  // [kKeys][kD]
  uint16_t* sV = sK + kKeys * kD;                        // [kKeys][kD]
  uint16_t* sdS = sV + kKeys * kD;                       // [kKeys][kDsCols]: dSᵀ, queries [0, kRows)
  // Query-tile buffer b: Q, dO [kRows][kD], then the rows' positions, lse·log2(e) and delta.
  unsigned char* buffers = reinterpret_cast<unsigned char*>(sdS + kKeys * kDsCols);
  const auto buffer_q = [&](int b) {
    return reinterpret_cast<uint16_t*>(buffers + b * tc_bwd_query_buffer_bytes<kD>());
  };
  const auto buffer_do = [&](int b) { return buffer_q(b) + kRows * kD; };
  const auto buffer_pos = [&](int b) { return reinterpret_cast<int64_t*>(buffer_do(b) + kRows * kD); };
  const auto buffer_lse = [&](int b) { return reinterpret_cast<float*>(buffer_pos(b) + kRows); };
  const auto buffer_delta = [&](int b) { return buffer_lse(b) + kRows; };
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  // The warp's key group (16 keys of the block) and its first own column block of dK and dV.
  const int kg = warp % kGroups, nd_own = (warp / kGroups) * kOwnBlocks;
  const int64_t S = pl.S, Sk = pl.Sk, kvh = blockIdx.x;
  const int64_t kv_base = kvh * Sk * D;
  const int64_t n_kb = (Sk + kKeys - 1) / kKeys;
  const float drop_scale = dr.on ? dr.scale : 1.f;
  // ldmatrix row offsets as in the forward: b_off for B fragments of rows used as columns
  // (Q, dO: non-transposed), t_off for B fragments of [k][n] rows (Q, dO, K: .trans).
  int b_off[kSteps], t_off[kDimBlocks / 2];
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    b_off[kk] = ((lane / 16) * 8 + lane % 8) * kD + Sw::chunk(lane % 8, 2 * kk + (lane / 8) % 2) * 8;
#pragma unroll
  for (int c2 = 0; c2 < kDimBlocks / 2; ++c2)
    t_off[c2] = (((lane / 8) % 2) * 8 + lane % 8) * kD + Sw::chunk(lane % 8, 2 * c2 + lane / 16) * 8;

  for (int64_t kb = blockIdx.y; kb < n_kb; kb += gridDim.y) {  // the first key tiles have the most rows
    const int64_t j0 = kb * kKeys, key_end = min64(j0 + kKeys, Sk);
    const int64_t k_first = attention_tiles::first_position(pl.keys, j0, key_end);
    const int64_t qt0 = attention_tiles::first_seeing_query(pl.queries, S, k_first) / kRows;
    // This warp's 16 keys; w_last: their last position when all 16 are keys (a query tile
    // wholly at or after it needs no mask).
    const int64_t w0 = j0 + kg * kWarpRows, w1 = min64(w0 + kWarpRows, Sk);
    const int64_t kpos0 = pl.key(w0 + g), kpos1 = pl.key(w0 + g + 8);
    const int64_t w_last = w1 - w0 == kWarpRows ? attention_tiles::last_position(pl.keys, w0, w1) : INT64_MAX;

    __syncthreads();  // the previous key tile is done with shared memory
    stage_tile<kKeys, kD>(sK, k + kv_base, j0, Sk, D, vec);
    stage_tile<kKeys, kD>(sV, v + kv_base, j0, Sk, D, vec);
    float dk_acc[kOwnBlocks][4], dv_acc[kOwnBlocks][4];
#pragma unroll
    for (int nd = 0; nd < kOwnBlocks; ++nd)
#pragma unroll
      for (int i = 0; i < 4; ++i) dk_acc[nd][i] = dv_acc[nd][i] = 0.f;

    // Every query tile that sees the keys, of each query head of the group in turn (tile n in
    // buffer n % 2), staged while the tile before it is computed; the first with K and V.
    const int64_t head_end = (kvh + 1) * group;
    QueryTile next{kvh * group, qt0 - 1};
    bool more = next_query_tile(pl, kRows, head_end, qt0, j0, key_end, next);
    const auto stage_query_tile = [&](int b, const QueryTile& tile) {
      stage_tile<kRows, kD>(buffer_q(b), q + tile.bh * S * D, tile.qt * kRows, S, D, vec);
      stage_tile<kRows, kD>(buffer_do(b), dout + tile.bh * S * D, tile.qt * kRows, S, D, vec);
    };
    if (more) {
      stage_query_tile(0, next);
      store_row_stats(load_row_stats(pl, lse, delta, next.bh, next.qt * kRows, kRows), kRows, buffer_pos(0),
                      buffer_lse(0), buffer_delta(0));
    }
    cp_async_commit();
    for (int buf = 0; more; buf ^= 1) {
      const QueryTile tile = next;
      more = next_query_tile(pl, kRows, head_end, qt0, j0, key_end, next);
      // The next tile into the other buffer, whose last reads (the tile before this one) were
      // before that tile's dSᵀ barrier: its copies fly during this tile, its rows' statistics
      // wait in registers until its end.
      RowStats next_rows;
      if (more) {
        stage_query_tile(buf ^ 1, next);
        next_rows = load_row_stats(pl, lse, delta, next.bh, next.qt * kRows, kRows);
      }
      cp_async_commit();
      cp_async_wait<1>();  // this tile's copies (and K's and V's) have landed
      __syncthreads();     // ... for every warp, and every warp is done with sdS (the last tile's dQ)

      const int64_t bh = tile.bh, base = bh * S * D, drop_offset = dr.head_offset(bh, pl.T);
      const int64_t i0 = tile.qt * kRows, i1 = min64(i0 + kRows, S);
      const uint16_t* sQ = buffer_q(buf);
      const uint16_t* sdO = buffer_do(buf);
      const int64_t* sQpos = buffer_pos(buf);
      const float* sLse = buffer_lse(buf);
      const float* sDelta = buffer_delta(buf);

      // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: the warp's 16 keys' K and V rows are the A fragments
      // (ldmatrix), Q's and dO's rows the B columns (as K's in the forward's S = Q·Kᵀ).
      float s[kQueryBlocks][4], dp[kQueryBlocks][4];
#pragma unroll
      for (int nb = 0; nb < kQueryBlocks; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nb][i] = dp[nb][i] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        uint32_t kf[4], vf[4];
        ldmatrix(kf, sK + Sw::at(kg * kWarpRows + lane % 16, 2 * kk + lane / 16));
        ldmatrix(vf, sV + Sw::at(kg * kWarpRows + lane % 16, 2 * kk + lane / 16));
#pragma unroll
        for (int nb = 0; nb < kQueryBlocks; nb += 2) {
          uint32_t qf[4], of[4];
          ldmatrix(qf, sQ + nb * 8 * kD + b_off[kk]);
          ldmatrix(of, sdO + nb * 8 * kD + b_off[kk]);
          const uint32_t q0[2] = {qf[0], qf[1]}, q1[2] = {qf[2], qf[3]}, o0[2] = {of[0], of[1]},
                         o1[2] = {of[2], of[3]};
          mma<T>(s[nb], kf, q0);
          mma<T>(s[nb + 1], kf, q1);
          mma<T>(dp[nb], vf, o0);
          mma<T>(dp[nb + 1], vf, o1);
        }
      }

      // P from the saved lse; masked where some query of the tile does not see some key of
      // the warp (the diagonal, padding, a placed run's edge). s becomes P∘keep/(1−p) (dV's
      // A), dp becomes dS (dK's A and, through shared memory, dQ's).
      const bool full = i1 - i0 == kRows && w_last <= attention_tiles::first_position(pl.queries, i0, i1);
      const uint32_t seen = full ? ~0u : visible_bits_t<kRows>(sQpos, t, kpos0, kpos1);
      const uint32_t kept = dr.on ? kept_bits_t<kRows>(dr, pl, bh, t, kpos0, kpos1, sQpos, seen, drop_offset) : seen;
#pragma unroll
      for (int nb = 0; nb < kQueryBlocks; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = nb * 8 + 2 * t + i % 2, bit = nb * 4 + i;
          const float p = (seen >> bit) & 1u ? exp2f(s[nb][i] * scale_log2 - sLse[col]) : 0.f;
          const float mult = (kept >> bit) & 1u ? drop_scale : 0.f;
          s[nb][i] = p * mult;
          dp[nb][i] = p * (dp[nb][i] * mult - sDelta[col]);
        }

      // dV += (P∘keep/(1−p))ᵀ·dO and dK += dSᵀ·Q in the warp's own columns, 16 queries a
      // step; dSᵀ to shared memory (by the group's first warp).
#pragma unroll
      for (int kk2 = 0; kk2 < kRows / 16; ++kk2) {
        const uint32_t pf[4] = {pack_pair<T>(s[2 * kk2][0], s[2 * kk2][1]), pack_pair<T>(s[2 * kk2][2], s[2 * kk2][3]),
                                pack_pair<T>(s[2 * kk2 + 1][0], s[2 * kk2 + 1][1]),
                                pack_pair<T>(s[2 * kk2 + 1][2], s[2 * kk2 + 1][3])};
        const uint32_t sf[4] = {pack_pair<T>(dp[2 * kk2][0], dp[2 * kk2][1]),
                                pack_pair<T>(dp[2 * kk2][2], dp[2 * kk2][3]),
                                pack_pair<T>(dp[2 * kk2 + 1][0], dp[2 * kk2 + 1][1]),
                                pack_pair<T>(dp[2 * kk2 + 1][2], dp[2 * kk2 + 1][3])};
#pragma unroll
        for (int nd = 0; nd < kOwnBlocks; nd += 2) {
          uint32_t of[4], qf[4];
          ldmatrix_trans(of, sdO + kk2 * 16 * kD + t_off[(nd_own + nd) / 2]);
          ldmatrix_trans(qf, sQ + kk2 * 16 * kD + t_off[(nd_own + nd) / 2]);
          const uint32_t o0[2] = {of[0], of[1]}, o1[2] = {of[2], of[3]}, q0[2] = {qf[0], qf[1]},
                         q1[2] = {qf[2], qf[3]};
          mma<T>(dv_acc[nd], pf, o0);
          mma<T>(dv_acc[nd + 1], pf, o1);
          mma<T>(dk_acc[nd], sf, q0);
          mma<T>(dk_acc[nd + 1], sf, q1);
        }
        // sf[0], sf[1]: rows g, g + 8, queries of block 2kk2; sf[2], sf[3] of block 2kk2 + 1.
        if (warp < kGroups) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int row = kg * kWarpRows + g + 8 * (r % 2);
            *reinterpret_cast<uint32_t*>(sdS + SwS::at(row, 2 * kk2 + r / 2) + 2 * t) = sf[r];
          }
        }
      }
      __syncthreads();  // sdS holds the block's dSᵀ

      // dQ += dS·K: this warp's 16 rows × kDqBlocks column blocks, over the block's keys
      // (16 a step): dS's A fragments by ldmatrix.trans of dSᵀ, K's B fragments by
      // ldmatrix.trans (keys are the k of this product).
      const int rb = warp % kRowBlocks, nd0 = (warp / kRowBlocks) * kDqBlocks;
      float dq[kDqBlocks][4];
#pragma unroll
      for (int n = 0; n < kDqBlocks; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t af[4];
        ldmatrix_trans(af, sdS + SwS::at(kk * 16 + (lane / 16) * 8 + lane % 8, 2 * rb + (lane / 8) % 2));
#pragma unroll
        for (int n = 0; n < kDqBlocks; n += 2) {
          uint32_t kf[4];
          ldmatrix_trans(kf, sK + kk * 16 * kD + t_off[(nd0 + n) / 2]);
          const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
          mma<T>(dq[n], af, b0);
          mma<T>(dq[n + 1], af, b1);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + rb * 16 + g + 8 * h;
        if (i >= S) continue;
#pragma unroll
        for (int n = 0; n < kDqBlocks; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int d = (nd0 + n) * 8 + 2 * t + e;
            if (d < D) atomicAdd(dq_acc + base + i * D + d, dq[n][2 * h + e]);
          }
      }
      if (more) store_row_stats(next_rows, kRows, buffer_pos(buf ^ 1), buffer_lse(buf ^ 1), buffer_delta(buf ^ 1));
    }
    cp_async_wait<0>();  // K and V of a key tile no query sees: nothing may fly past it
    store_key_rows<T>(dk + kv_base, w0, Sk, D, vec, g, t, nd_own, scale, dk_acc);
    store_key_rows<T>(dv + kv_base, w0, Sk, D, vec, g, t, nd_own, 1.f, dv_acc);
  }
}

template <class T, int kD>
void launch_bwd(const void* q, const void* k, const void* v, const void* out, const void* dout, const float* lse,
                float scale, const DropoutSpec& spec, void* dq, void* dk, void* dv, float* workspace,
                const AttentionShape& shape, cudaStream_t stream) {
  const AttnPlace pl = make_place(shape);
  const AttnDropout dr = make_dropout(spec, pl.T);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = shape.D % 8 == 0 && aligned(q) && aligned(k) && aligned(v) && aligned(dout) && aligned(dk) &&
                   aligned(dv);
  const int64_t B = shape.B, S = shape.S, Sk = shape.Sk, rows = B * S;
  const int D = static_cast<int>(shape.D);
  float* delta = workspace;
  float* dq_acc = workspace + rows;  // attention_bwd_workspace_floats
  attention_bwd_prep_kernel<T><<<elementwise_blocks(rows * 32), kElementwiseThreads, 0, stream>>>(
      static_cast<const uint16_t*>(out), static_cast<const uint16_t*>(dout), delta, dq_acc, rows, D);
  CUDA_CHECK_LAUNCH();
  if (Sk > 0) {
    const int64_t kv_heads = B / shape.group, n_kb = (Sk + kBwdKeys<kD> - 1) / kBwdKeys<kD>;
    if (kv_heads > INT_MAX)
      throw InvalidArgument("attention_bwd: " + std::to_string(kv_heads) + " heads is more than one launch takes");
    // x: key/value heads (every head's first, longest key tile first), y: key tiles.
    const dim3 grid(static_cast<unsigned>(kv_heads), static_cast<unsigned>(n_kb < 65535 ? n_kb : 65535));
    constexpr size_t smem = tc_bwd_smem_bytes<kD>();
    allow_smem(attention_bwd_tc_kernel<T, kD>, smem);
    attention_bwd_tc_kernel<T, kD><<<grid, kThreads, smem, stream>>>(
        static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v),
        static_cast<const uint16_t*>(dout), lse, delta, dq_acc, static_cast<uint16_t*>(dk),
        static_cast<uint16_t*>(dv), pl, D, vec, scale, scale * kLog2e, dr, shape.group);
    CUDA_CHECK_LAUNCH();
  }
  attention_dq_convert_kernel<T><<<elementwise_blocks(rows * D), kElementwiseThreads, 0, stream>>>(
      dq_acc, scale, static_cast<uint16_t*>(dq), rows * D);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_bwd_for_head_dim(const void* q, const void* k, const void* v, const void* out, const void* dout,
                             const float* lse, float scale, const DropoutSpec& spec, void* dq, void* dk, void* dv,
                             float* workspace, const AttentionShape& shape, cudaStream_t stream) {
  switch (tc_head_dim(shape.D)) {
    case 64: launch_bwd<T, 64>(q, k, v, out, dout, lse, scale, spec, dq, dk, dv, workspace, shape, stream); break;
    case 96: launch_bwd<T, 96>(q, k, v, out, dout, lse, scale, spec, dq, dk, dv, workspace, shape, stream); break;
    case 128: launch_bwd<T, 128>(q, k, v, out, dout, lse, scale, spec, dq, dk, dv, workspace, shape, stream); break;
    default: launch_bwd<T, 192>(q, k, v, out, dout, lse, scale, spec, dq, dk, dv, workspace, shape, stream); break;
  }
}

}  // namespace

void attention_fwd_tensor_core(DType dt, const void* q, const void* k, const void* v, float scale,
                               const DropoutSpec& spec, void* out, float* lse, const AttentionShape& shape,
                               cudaStream_t stream) {
  if (dt == DType::bf16)
    launch_for_head_dim<__nv_bfloat16>(q, k, v, scale, spec, out, lse, shape, stream);
  else if (dt == DType::fp16)
    launch_for_head_dim<__half>(q, k, v, scale, spec, out, lse, shape, stream);
  else
    throw InvalidArgument(std::string("attention_fwd: the tensor-core kernel takes bf16 or fp16, not ") +
                          dtype_name(dt));
}

}  // namespace actbench::cuda

namespace actbench::cuda {

void attention_bwd_tensor_core(DType dt, const void* q, const void* k, const void* v, const void* out,
                               const void* dout, const float* lse, float scale, const DropoutSpec& spec, void* dq,
                               void* dk, void* dv, float* workspace, const AttentionShape& shape,
                               cudaStream_t stream) {
  if (dt == DType::bf16)
    launch_bwd_for_head_dim<__nv_bfloat16>(q, k, v, out, dout, lse, scale, spec, dq, dk, dv, workspace, shape, stream);
  else if (dt == DType::fp16)
    launch_bwd_for_head_dim<__half>(q, k, v, out, dout, lse, scale, spec, dq, dk, dv, workspace, shape, stream);
  else
    throw InvalidArgument(std::string("attention_bwd: the tensor-core kernel takes bf16 or fp16, not ") +
                          dtype_name(dt));
}

}  // namespace actbench::cuda
