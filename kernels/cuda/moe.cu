// Mixture-of-experts kernels (docs/moe.md): the router's choice of experts, the dispatch plan,
// permute and the weighted combine. The cpu ops (kernels/cpu/cpu_moe.cpp) are the reference:
// every choice, tie, dropped pair and index is the same here, floats agree to fp32 rounding.
// Nothing uses atomics and every reduction has an order fixed by the launch geometry alone, so
// a run repeats bit for bit. The grouped GEMMs are cuBLASLt calls (cuda_backend.cpp).
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace actbench::cuda {
namespace {

constexpr double kNormEpsilon = 1e-20;  // the top-k weights' guard, as the cpu (Megatron-Core)
constexpr int kRouteWarps = 4;          // tokens per block of the routing kernels
constexpr int kRowThreads = 256;        // threads per row of the permute and combine kernels
// The routing kernel's dynamic shared memory stays within what every device gives without
// opting in: 4 warps of E + 2 G + k words, so E up to about 3000 experts.
constexpr size_t kRouteMaxSharedBytes = 48 * 1024;

// A score for ranking: NaN ranks below everything (the cpu's rank_key).
__device__ __forceinline__ float rank_key(float v) { return v != v ? -INFINITY : v; }
// (ka, ia) before (kb, ib): the higher key, ties to the lower index.
__device__ __forceinline__ bool ranks_before(float ka, int ia, float kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}
// The best (key, index) over the lanes' own bests; every lane gets it. The order of the
// comparisons does not matter: ranks_before is a strict total order on distinct indices.
__device__ __forceinline__ void warp_best(float& key, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    const float k2 = __shfl_xor_sync(0xffffffffu, key, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ranks_before(k2, i2, key, idx)) {
      key = k2;
      idx = i2;
    }
  }
}

// ---- routing: one warp per token ----------------------------------------------------------
// A warp keeps its token's fp32 scores in shared memory (E floats), so selection reads the
// unrounded scores whatever the storage dtype, and picks the top k by k warp-wide argmaxes
// (lexicographic on (key, -index): ties to the lower expert, as the cpu's partial_sort).
struct RouteShape {
  int E, k, groups, group_top_k;
  bool sigmoid, normalize;
  float scaling;
};
// Shared words per warp: scores [E], group keys [G], group chosen flags [G], chosen [k].
__host__ __device__ inline int route_words(const RouteShape& r) { return r.E + 2 * r.groups + r.k; }

// The key an expert is chosen by: its fp32 score plus the bias (widened, as the cpu's).
template <class T>
__device__ __forceinline__ float biased(const float* s, const T* bias, int e) {
  return rank_key(bias ? s[e] + to_float(bias[e]) : s[e]);
}

// Softmax (max subtracted, as the cpu) or sigmoid of one row into s; returns the row's sum.
template <class T>
__device__ float score_row(const T* logits, int E, bool sigmoid, float* s) {
  const int lane = threadIdx.x & 31;
  if (sigmoid) {
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) {
      s[e] = 1.f / (1.f + expf(-to_float(logits[e])));
      sum += s[e];
    }
    return warp_sum(sum);
  }
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, to_float(logits[e]));
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) {
    s[e] = expf(to_float(logits[e]) - mx);
    sum += s[e];
  }
  const float inv = 1.f / warp_sum(sum);
  float total = 0.f;
  for (int e = lane; e < E; e += 32) {
    s[e] *= inv;
    total += s[e];
  }
  return warp_sum(total);
}

// DeepSeek-V3's groups: group g's key is the sum of its two best biased scores (its one score
// when it holds one expert); the group_top_k best groups (ties to the lower group) get
// chosen[g] = 1. One lane per group for the keys, a warp argmax per chosen group.
template <class T>
__device__ void choose_groups(const float* s, const T* bias, const RouteShape& r, float* gkey, int* chosen) {
  const int lane = threadIdx.x & 31, size = r.E / r.groups;
  for (int g = lane; g < r.groups; g += 32) {
    float b1 = -INFINITY, b2 = -INFINITY;  // the two best keys; only their values matter
    for (int e = g * size; e < (g + 1) * size; ++e) {
      const float key = biased(s, bias, e);
      if (key > b1) {
        b2 = b1;
        b1 = key;
      } else if (key > b2) {
        b2 = key;
      }
    }
    gkey[g] = size >= 2 ? b1 + b2 : b1;
    chosen[g] = 0;
  }
  __syncwarp();
  for (int round = 0; round < r.group_top_k; ++round) {
    float key = -INFINITY;
    int idx = INT_MAX;
    for (int g = lane; g < r.groups; g += 32)
      if (!chosen[g] && ranks_before(gkey[g], g, key, idx)) {
        key = gkey[g];
        idx = g;
      }
    warp_best(key, idx);
    __syncwarp();
    if (lane == 0) chosen[idx] = 1;
    __syncwarp();
  }
}

// The top k experts (among those of the chosen groups) into chosen[0..k).
template <class T>
__device__ void choose_experts(const float* s, const T* bias, const RouteShape& r, const int* group_chosen,
                               int* chosen) {
  const int lane = threadIdx.x & 31, size = r.E / r.groups;
  for (int round = 0; round < r.k; ++round) {
    float key = -INFINITY;
    int idx = INT_MAX;
    for (int e = lane; e < r.E; e += 32) {
      if (r.groups > 1 && !group_chosen[e / size]) continue;
      bool taken = false;
      for (int j = 0; j < round; ++j) taken |= chosen[j] == e;
      const float ke = biased(s, bias, e);
      if (!taken && ranks_before(ke, e, key, idx)) {
        key = ke;
        idx = e;
      }
    }
    warp_best(key, idx);
    if (lane == 0) chosen[round] = idx;
    __syncwarp();
  }
}

// scores, topk_index, topk_weight of each token; with aux, p[t, e] = score / row sum for the
// aux loss's second stage. The weights are computed by lane 0 in double, in choice order, as
// the cpu does, so they agree with it to the rounding of the scores.
template <class T>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(const T* __restrict__ logits, const T* __restrict__ bias, RouteShape r, int64_t tokens,
                 T* __restrict__ scores, int32_t* __restrict__ index, T* __restrict__ weight, float* __restrict__ p) {
  extern __shared__ float route_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* s = route_smem + static_cast<int64_t>(warp) * route_words(r);
  float* gkey = s + r.E;
  int* gchosen = reinterpret_cast<int*>(gkey + r.groups);
  int* chosen = gchosen + r.groups;
  // The bias is read from global memory at each comparison (E words, cached), not staged.
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * kRouteWarps) {
    const float row_sum = score_row(logits + t * r.E, r.E, r.sigmoid, s);
    __syncwarp();
    if (r.groups > 1) choose_groups(s, bias, r, gkey, gchosen);
    choose_experts(s, bias, r, gchosen, chosen);
    if (lane == 0) {
      double sum = 0;
      for (int j = 0; j < r.k; ++j) sum += s[chosen[j]];
      const double norm = r.normalize ? 1.0 / (sum + kNormEpsilon) : 1.0;
      for (int j = 0; j < r.k; ++j) {
        const int e = chosen[j];
        index[t * r.k + j] = e;
        weight[t * r.k + j] = from_float<T>(static_cast<float>(s[e] * norm * r.scaling));
      }
    }
    for (int e = lane; e < r.E; e += 32) {
      scores[t * r.E + e] = from_float<T>(s[e]);
      if (p) p[t * r.E + e] = s[e] / (row_sum + static_cast<float>(kNormEpsilon));
    }
    __syncwarp();  // s is the next token's
  }
}


// ---- the aux loss: per-expert sums, then one thread (no float atomics) -------------------
// Block e: stats[2e] = sum_t p[t, e], stats[2e + 1] = how many of the T k choices picked e.
// The order of the additions depends only on blockDim (common.cuh's block_sum); the counts
// are exact in fp32 while T k < 2^24.
__global__ void aux_stats_kernel(const float* __restrict__ p, const int32_t* __restrict__ index, int64_t tokens,
                                 int E, int k, float* __restrict__ stats) {
  __shared__ float scratch[32];
  for (int e = blockIdx.x; e < E; e += gridDim.x) {
    float mass = 0.f, picked = 0.f;
    for (int64_t t = threadIdx.x; t < tokens; t += blockDim.x) mass += p[t * E + e];
    for (int64_t i = threadIdx.x; i < tokens * k; i += blockDim.x) picked += index[i] == e ? 1.f : 0.f;
    mass = block_sum(mass, scratch);
    picked = block_sum(picked, scratch);
    if (threadIdx.x == 0) {
      stats[2 * e] = mass;
      stats[2 * e + 1] = picked;
    }
  }
}

// aux = E * sum_e f_e P_e = E * sum_e picked_e mass_e / (T k T), summed in expert order.
__global__ void aux_loss_kernel(const float* __restrict__ stats, int64_t tokens, int E, int k, float* aux) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (tokens == 0) {  // no tokens, no stats (the cpu's 0)
    aux[0] = 0.f;
    return;
  }
  double loss = 0;
  for (int e = 0; e < E; ++e) loss += static_cast<double>(stats[2 * e + 1]) * stats[2 * e];
  const double pairs = static_cast<double>(tokens) * k;
  aux[0] = static_cast<float>(E * loss / (pairs * static_cast<double>(tokens)));
}

// ---- routing backward: one warp per token -------------------------------------------------
// w_j = c g_j / S (S = sum_j g_j + eps, when normalised), so dg_j = c (dw_j - sum_i dw_i g_i / S) / S.
// Every lane computes the k sums itself (k loads, no shuffles), in double and in choice
// order as the cpu; then each lane writes its experts' d logits. An expert outside [0, E) in
// topk_index (which moe_route never writes; the cpu refuses it) contributes nothing here.
template <class T>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_bwd_kernel(const T* __restrict__ d_weight, const T* __restrict__ scores, const int32_t* __restrict__ index,
                     RouteShape r, int64_t tokens, T* __restrict__ d_logits) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * kRouteWarps) {
    const T* s = scores + t * r.E;
    const T* dw = d_weight + t * r.k;
    const int32_t* idx = index + t * r.k;
    auto valid = [&](int j) { return idx[j] >= 0 && idx[j] < r.E; };
    double sum = 0, dot = 0;
    for (int j = 0; j < r.k; ++j)
      if (valid(j)) {
        sum += to_float(s[idx[j]]);
        dot += static_cast<double>(to_float(dw[j])) * to_float(s[idx[j]]);
      }
    const double S = sum + kNormEpsilon;
    auto d_score = [&](int j) {  // the scaled gradient of pair j's score
      const double g = to_float(dw[j]);
      return r.scaling * (r.normalize ? (g - dot / S) / S : g);
    };
    double inner = 0;  // softmax: dl = s (ds - sum_e s_e ds_e)
    if (!r.sigmoid)
      for (int j = 0; j < r.k; ++j)
        if (valid(j)) inner += to_float(s[idx[j]]) * d_score(j);
    for (int e = lane; e < r.E; e += 32) {
      double ds = 0;
      for (int j = 0; j < r.k; ++j)
        if (idx[j] == e) ds += d_score(j);
      const double se = to_float(s[e]);
      const double dl = r.sigmoid ? ds * se * (1.0 - se) : se * (ds - inner);
      d_logits[t * r.E + e] = from_float<T>(static_cast<float>(dl));
    }
  }
}

// ---- the dispatch plan: three passes over chunks of kChunk pairs ---------------------------
// A pair's row is first_row[e] + its place among expert e's pairs in token order, and the
// pair is kept when that place is below the capacity. The places come from a stable counting
// sort: (1) per chunk, how many pairs each expert has; (2) one block turns those counts into
// each chunk's starting place per expert, the kept counts and each expert's first row (E and
// the number of chunks are small); (3) per chunk, each pair adds the pairs of its expert
// before it in the chunk. All integer, no atomics: the plan is the same on every run.
constexpr int kChunk = 256;
constexpr int kPlanThreads = 256;

// Pass 1: counts[c * E + e], the pairs of chunk c routed to e; bad[c], the first pair of chunk
// c with an expert outside [0, E) (-1: none).
__global__ void plan_count_kernel(const int32_t* __restrict__ index, int64_t pairs, int E, int32_t* __restrict__ counts,
                                  int32_t* __restrict__ bad) {
  __shared__ int32_t chunk[kChunk];
  const int64_t c = blockIdx.x, first = c * kChunk;
  const int n = static_cast<int>(pairs - first < kChunk ? pairs - first : kChunk);
  for (int i = threadIdx.x; i < n; i += blockDim.x) chunk[i] = index[first + i];
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int count = 0;
    for (int i = 0; i < n; ++i) count += chunk[i] == e;
    counts[c * E + e] = count;
  }
  if (threadIdx.x == 0) {
    int32_t first_bad = -1;
    for (int i = 0; i < n && first_bad < 0; ++i)
      if (chunk[i] < 0 || chunk[i] >= E) first_bad = static_cast<int32_t>(first + i);
    bad[c] = first_bad;
  }
}

// Pass 2 (one block): counts become each chunk's first place per expert (an exclusive scan
// over chunks, one thread per expert); tokens_per_expert = min(routed, capacity); first_row
// the exclusive scan of those over experts (thread 0, in expert order); status = {the first
// bad pair or -1, its expert}.
__global__ void plan_scan_kernel(int32_t* __restrict__ counts, const int32_t* __restrict__ bad, const int32_t* index,
                                 int64_t chunks, int E, int64_t capacity, int32_t* __restrict__ tokens_per_expert,
                                 int32_t* __restrict__ first_row, int32_t* __restrict__ status) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t running = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t n = counts[c * E + e];
      counts[c * E + e] = static_cast<int32_t>(running);
      running += n;
    }
    tokens_per_expert[e] = static_cast<int32_t>(running < capacity ? running : capacity);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t row = 0;
  for (int e = 0; e < E; ++e) {
    first_row[e] = row;
    row += tokens_per_expert[e];
  }
  status[0] = -1;
  status[1] = 0;
  for (int64_t c = 0; c < chunks; ++c)
    if (bad[c] >= 0) {
      status[0] = bad[c];
      status[1] = index[bad[c]];
      break;
    }
}

// Pass 3: each pair's place, row, slot_row and (kept) row_slot. row_slot was filled with -1.
// A pair with a bad expert is dropped here (the launcher refuses the plan afterwards).
__global__ void plan_place_kernel(const int32_t* __restrict__ index, int64_t pairs, int E, int64_t capacity,
                                  const int32_t* __restrict__ chunk_start, const int32_t* __restrict__ first_row,
                                  int32_t* __restrict__ row_slot, int32_t* __restrict__ slot_row) {
  __shared__ int32_t chunk[kChunk];
  const int64_t c = blockIdx.x, first = c * kChunk;
  const int n = static_cast<int>(pairs - first < kChunk ? pairs - first : kChunk);
  for (int i = threadIdx.x; i < n; i += blockDim.x) chunk[i] = index[first + i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t e = chunk[i];
    int32_t row = -1;
    if (e >= 0 && e < E) {
      int64_t place = chunk_start[c * E + e];
      for (int j = 0; j < i; ++j) place += chunk[j] == e;
      if (place < capacity) row = static_cast<int32_t>(first_row[e] + place);
    }
    slot_row[first + i] = row;
    if (row >= 0) row_slot[row] = static_cast<int32_t>(first + i);
  }
}

// ---- permute and combine: one block per row ------------------------------------------------
// out row r = x row of row_slot[r] / k, as raw units V (16, 8, 4, 2 or 1 bytes: the widest
// dividing the row and both base addresses). A row no pair fills (a plan whose counts do not
// match out's rows) is written as zeros rather than read from outside x.
template <class V>
__global__ void permute_kernel(const V* __restrict__ x, const int32_t* __restrict__ row_slot, int64_t rows,
                               int64_t pairs, int k, int64_t units, V* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t slot = row_slot[r];
    const bool filled = slot >= 0 && slot < pairs;
    const V* src = x + (filled ? slot / k : 0) * units;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) out[r * units + u] = filled ? src[u] : V{};
  }
}

// A kept pair's row, or -1 (dropped, or outside the rows a plan with the wrong counts gave).
__device__ __forceinline__ int64_t kept_row(const int32_t* slot_row, int64_t pair, int64_t rows) {
  const int32_t row = slot_row[pair];
  return row >= 0 && row < rows ? row : -1;
}

// dx[t] = sum of token t's kept rows of d_out, in choice order, fp32.
template <class T>
__global__ void permute_bwd_kernel(const T* __restrict__ d_out, const int32_t* __restrict__ slot_row, int64_t tokens,
                                   int k, int64_t rows, int64_t h, T* __restrict__ dx) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x)
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      float acc = 0.f;
      for (int j = 0; j < k; ++j) {
        const int64_t row = kept_row(slot_row, t * k + j, rows);
        if (row >= 0) acc += to_float(d_out[row * h + i]);
      }
      dx[t * h + i] = from_float<T>(acc);
    }
}

// out[t] = sum_j weight[t, j] y[row of (t, j)], in choice order, fp32.
template <class T>
__global__ void unpermute_kernel(const T* __restrict__ y, const int32_t* __restrict__ slot_row,
                                 const T* __restrict__ weight, int64_t tokens, int k, int64_t rows, int64_t h,
                                 T* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x)
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      float acc = 0.f;
      for (int j = 0; j < k; ++j) {
        const int64_t row = kept_row(slot_row, t * k + j, rows);
        if (row >= 0) acc += to_float(weight[t * k + j]) * to_float(y[row * h + i]);
      }
      out[t * h + i] = from_float<T>(acc);
    }
}

// dy[row] = weight * d_out[t] (rounded once, as the cpu's float product); d_weight[t, j] =
// d_out[t] . y[row] by a block reduction (0 for a dropped pair).
template <class T>
__global__ void unpermute_bwd_kernel(const T* __restrict__ d_out, const T* __restrict__ y,
                                     const int32_t* __restrict__ slot_row, const T* __restrict__ weight,
                                     int64_t tokens, int k, int64_t rows, int64_t h, T* __restrict__ dy,
                                     T* __restrict__ d_weight) {
  __shared__ float scratch[32];
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x)
    for (int j = 0; j < k; ++j) {
      const int64_t row = kept_row(slot_row, t * k + j, rows);
      if (row < 0) {  // the same for the whole block: no thread reaches block_sum
        if (threadIdx.x == 0) d_weight[t * k + j] = from_float<T>(0.f);
        continue;
      }
      const float w = to_float(weight[t * k + j]);
      float dot = 0.f;
      for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
        const float g = to_float(d_out[t * h + i]);
        dy[row * h + i] = from_float<T>(w * g);
        dot += g * to_float(y[row * h + i]);
      }
      dot = block_sum(dot, scratch);
      if (threadIdx.x == 0) d_weight[t * k + j] = from_float<T>(dot);
    }
}

// The routing weights into the experts' rows: one block per row (grid-stride), the weight read
// once per row, the width in coalesced strides.
template <typename T>
__global__ void weight_rows_kernel(const T* __restrict__ x, const T* __restrict__ weight, int64_t rows, int64_t w,
                                   T* __restrict__ y) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float p = to_float(weight[r]);
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) y[r * w + i] = from_float<T>(p * to_float(x[r * w + i]));
  }
}

// Its backward: dx = weight * dy along the row, and the row's dot of dy with x in the same pass
// (block_sum: the order of the additions depends on blockDim alone).
template <typename T>
__global__ void weight_rows_bwd_kernel(const T* __restrict__ dy, const T* x, const T* __restrict__ weight,
                                       int64_t rows, int64_t w, T* dx, T* __restrict__ d_weight) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float p = to_float(weight[r]);
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {  // x read before dx is written: dx may be x
      const float g = to_float(dy[r * w + i]);
      dot += g * to_float(x[r * w + i]);
      dx[r * w + i] = from_float<T>(p * g);
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) d_weight[r] = from_float<T>(dot);
  }
}

RouteShape route_shape(int64_t E, const MoeRouting& r) {
  return RouteShape{static_cast<int>(E), static_cast<int>(r.top_k), static_cast<int>(r.num_groups),
                    static_cast<int>(r.group_top_k), r.score == MoeRouting::Score::sigmoid, r.normalize, r.scaling};
}

unsigned route_blocks(int64_t tokens) { return row_blocks((tokens + kRouteWarps - 1) / kRouteWarps); }

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

int64_t moe_route_workspace_floats(int64_t T, int64_t E) { return T * E + 2 * E; }

void moe_route(DType dt, const void* logits, const void* bias, int64_t T, int64_t E, const MoeRouting& routing,
               void* scores, int32_t* index, void* weight, float* aux, float* workspace, cudaStream_t stream) {
  const RouteShape r = route_shape(E, routing);
  const size_t smem = static_cast<size_t>(kRouteWarps) * route_words(r) * sizeof(float);
  if (smem > kRouteMaxSharedBytes)
    throw InvalidArgument("moe_route: " + std::to_string(E) + " experts need " + std::to_string(smem) +
                          " bytes of shared memory per block, more than the cuda kernel's " +
                          std::to_string(kRouteMaxSharedBytes));
  float* p = aux ? workspace : nullptr;
  if (T > 0) {
    ACTBENCH_DISPATCH_FLOAT(dt, "moe_route", S,
                            route_kernel<S><<<route_blocks(T), kRouteWarps * 32, smem, stream>>>(
                                static_cast<const S*>(logits), static_cast<const S*>(bias), r, T,
                                static_cast<S*>(scores), index, static_cast<S*>(weight), p));
    CUDA_CHECK_LAUNCH();
  }
  if (!aux) return;
  float* stats = workspace + T * E;
  if (T > 0) {
    aux_stats_kernel<<<row_blocks(E), kPlanThreads, 0, stream>>>(p, index, T, r.E, r.k, stats);
    CUDA_CHECK_LAUNCH();
  }
  aux_loss_kernel<<<1, 32, 0, stream>>>(stats, T, r.E, r.k, aux);
  CUDA_CHECK_LAUNCH();
}

void moe_route_bwd(DType dt, const void* d_weight, const void* scores, const int32_t* index, int64_t T, int64_t E,
                   const MoeRouting& routing, void* d_logits, cudaStream_t stream) {
  if (T == 0) return;
  const RouteShape r = route_shape(E, routing);
  ACTBENCH_DISPATCH_FLOAT(dt, "moe_route_bwd", S,
                          route_bwd_kernel<S><<<route_blocks(T), kRouteWarps * 32, 0, stream>>>(
                              static_cast<const S*>(d_weight), static_cast<const S*>(scores), index, r, T,
                              static_cast<S*>(d_logits)));
  CUDA_CHECK_LAUNCH();
}

int64_t moe_dispatch_workspace_ints(int64_t T, int64_t k, int64_t E) {
  const int64_t chunks = (T * k + kChunk - 1) / kChunk;
  return chunks * E + chunks + E + 2;
}

void moe_dispatch(const int32_t* index, int64_t T, int64_t k, int64_t E, int64_t capacity, int32_t* tokens_per_expert,
                  int32_t* row_slot, int32_t* slot_row, int32_t* workspace, cudaStream_t stream) {
  const int64_t pairs = T * k, chunks = (pairs + kChunk - 1) / kChunk;
  if (pairs > INT32_MAX || E > INT32_MAX)
    throw InvalidArgument("moe_dispatch: " + std::to_string(pairs) + " pairs do not fit the i32 plan");
  if (capacity < 0) capacity = pairs;  // dropless: no expert holds more than every pair
  int32_t *counts = workspace, *bad = counts + chunks * E, *first_row = bad + chunks, *status = first_row + E;
  if (pairs > 0) {
    CUDA_CHECK(cudaMemsetAsync(row_slot, 0xff, static_cast<size_t>(pairs) * sizeof(int32_t), stream));  // -1
    plan_count_kernel<<<static_cast<unsigned>(chunks), kPlanThreads, 0, stream>>>(index, pairs, static_cast<int>(E),
                                                                                  counts, bad);
    CUDA_CHECK_LAUNCH();
  }
  plan_scan_kernel<<<1, kPlanThreads, 0, stream>>>(counts, bad, index, chunks, static_cast<int>(E), capacity,
                                                   tokens_per_expert, first_row, status);
  CUDA_CHECK_LAUNCH();
  if (pairs > 0) {
    plan_place_kernel<<<static_cast<unsigned>(chunks), kPlanThreads, 0, stream>>>(
        index, pairs, static_cast<int>(E), capacity, counts, first_row, row_slot, slot_row);
    CUDA_CHECK_LAUNCH();
  }
  // The one value the plan cannot carry: whether topk_index held an expert outside [0, E).
  // The cpu refuses that plan, so the cuda backend does too, which costs this one copy.
  int32_t host_status[2] = {-1, 0};
  CUDA_CHECK(cudaMemcpyAsync(host_status, status, sizeof host_status, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host_status[0] >= 0)
    throw InvalidArgument("moe_dispatch: topk_index holds expert " + std::to_string(host_status[1]) +
                          ", outside [0, " + std::to_string(E) + ")");
}

void moe_permute(size_t element, const void* x, const int32_t* row_slot, int64_t N, int64_t T, int64_t k, int64_t h,
                 void* out, cudaStream_t stream) {
  if (N == 0) return;
  const uint64_t bits = static_cast<uint64_t>(h) * element | reinterpret_cast<uintptr_t>(x) |
                        reinterpret_cast<uintptr_t>(out);
  const int64_t unit = widest_unit(bits), units = h * static_cast<int64_t>(element) / unit;
  auto go = [&](auto tag) {
    using V = decltype(tag);
    permute_kernel<V><<<row_blocks(N), kRowThreads, 0, stream>>>(static_cast<const V*>(x), row_slot, N, T * k,
                                                                 static_cast<int>(k), units, static_cast<V*>(out));
  };
  switch (unit) {
    case 16: go(uint4{}); break;
    case 8: go(uint2{}); break;
    case 4: go(uint32_t{}); break;
    case 2: go(uint16_t{}); break;
    default: go(uint8_t{}); break;
  }
  CUDA_CHECK_LAUNCH();
}

void moe_permute_bwd(DType dt, const void* d_out, const int32_t* slot_row, int64_t N, int64_t T, int64_t k, int64_t h,
                     void* dx, cudaStream_t stream) {
  if (T == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "moe_permute_bwd", S,
                          permute_bwd_kernel<S><<<row_blocks(T), kRowThreads, 0, stream>>>(
                              static_cast<const S*>(d_out), slot_row, T, static_cast<int>(k), N, h,
                              static_cast<S*>(dx)));
  CUDA_CHECK_LAUNCH();
}

void moe_unpermute(DType dt, const void* y, const int32_t* slot_row, const void* weight, int64_t N, int64_t T,
                   int64_t k, int64_t h, void* out, cudaStream_t stream) {
  if (T == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "moe_unpermute", S,
                          unpermute_kernel<S><<<row_blocks(T), kRowThreads, 0, stream>>>(
                              static_cast<const S*>(y), slot_row, static_cast<const S*>(weight), T,
                              static_cast<int>(k), N, h, static_cast<S*>(out)));
  CUDA_CHECK_LAUNCH();
}

void moe_unpermute_bwd(DType dt, const void* d_out, const void* y, const int32_t* slot_row, const void* weight,
                       int64_t N, int64_t T, int64_t k, int64_t h, void* dy, void* d_weight, cudaStream_t stream) {
  if (T == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "moe_unpermute_bwd", S,
                          unpermute_bwd_kernel<S><<<row_blocks(T), kRowThreads, 0, stream>>>(
                              static_cast<const S*>(d_out), static_cast<const S*>(y), slot_row,
                              static_cast<const S*>(weight), T, static_cast<int>(k), N, h, static_cast<S*>(dy),
                              static_cast<S*>(d_weight)));
  CUDA_CHECK_LAUNCH();
}

void moe_weight_rows(DType dt, const void* x, const void* weight, int64_t N, int64_t w, void* y, cudaStream_t stream) {
  if (N == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "moe_weight_rows", S,
                          weight_rows_kernel<S><<<row_blocks(N), kRowThreads, 0, stream>>>(
                              static_cast<const S*>(x), static_cast<const S*>(weight), N, w, static_cast<S*>(y)));
  CUDA_CHECK_LAUNCH();
}

void moe_weight_rows_bwd(DType dt, const void* dy, const void* x, const void* weight, int64_t N, int64_t w, void* dx,
                         void* d_weight, cudaStream_t stream) {
  if (N == 0) return;
  ACTBENCH_DISPATCH_FLOAT(dt, "moe_weight_rows_bwd", S,
                          weight_rows_bwd_kernel<S><<<row_blocks(N), kRowThreads, 0, stream>>>(
                              static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<const S*>(weight), N,
                              w, static_cast<S*>(dx), static_cast<S*>(d_weight)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace actbench::cuda
