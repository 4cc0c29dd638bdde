#pragma once
// The mixture-of-experts ops on the CPU (docs/moe.md): routing, the dispatch plan, permute
// and the weighted combine, grouped GEMMs. fp32 math on fp32 buffers (the backend widens and
// rounds storage around these), double accumulators for sums; indices int32. The reference
// the CUDA kernels and the NumPy reference (tests/moe_reference.py) are checked against.
// Arguments meet the contract of kernels/backend.cpp; what it cannot see (the values of the
// indices and counts) is checked here: InvalidArgument "op: what".
#include <cstdint>
#include <optional>

#include "kernels/backend.hpp"

namespace actbench::cpu {

// logits, scores [T, E]; bias [E] or nullptr; index, weight [T, k]; aux [1] or nullptr.
void moe_route(const float* logits, const float* bias, int64_t T, int64_t E, const MoeRouting& routing, float* scores,
               int32_t* index, float* weight, float* aux);
// d_weight, index [T, k]; scores, d_logits [T, E].
void moe_route_bwd(const float* d_weight, const float* scores, const int32_t* index, int64_t T, int64_t E,
                   const MoeRouting& routing, float* d_logits);

// The plan of index [T, k] over E experts (backend.hpp's MoeDispatch); capacity: the most
// pairs an expert keeps (none: dropless).
void moe_dispatch(const int32_t* index, int64_t T, int64_t k, int64_t E, std::optional<int64_t> capacity,
                  int32_t* tokens_per_expert, int32_t* row_slot, int32_t* slot_row);
// N, the sum of tokens_per_expert [E], checked against `rows` (the rows of the op's permuted
// tensor), each count >= 0.
int64_t moe_plan_rows(const int32_t* tokens_per_expert, int64_t E, int64_t rows, const char* op, const char* what);

// The rows of slot_row [T, k] (pairs (t, j)); h the row width.
// out [N, h] = the token rows of x [T, h] in plan order (bytes of `element` size each).
void moe_permute(const void* x, const int32_t* row_slot, int64_t N, int64_t k, int64_t h, size_t element, void* out);
// dx [T, h] = sum of the kept rows of d_out [N, h] of each token.
void moe_permute_bwd(const float* d_out, const int32_t* slot_row, int64_t T, int64_t k, int64_t h, float* dx);
// out [T, h] = sum_j weight[t, j] * y[slot_row[t, j]] over kept pairs.
void moe_unpermute(const float* y, const int32_t* slot_row, const float* weight, int64_t T, int64_t k, int64_t h,
                   float* out);
// dy [N, h] (every row is some kept pair's), d_weight [T, k].
void moe_unpermute_bwd(const float* d_out, const float* y, const int32_t* slot_row, const float* weight, int64_t T,
                       int64_t k, int64_t h, float* dy, float* d_weight);
// y [N, w] = weight[r] * x[r, :]; and back: dx = weight[r] * dy[r, :], d_weight[r] = dy[r] . x[r].
void moe_weight_rows(const float* x, const float* weight, int64_t N, int64_t w, float* y);
void moe_weight_rows_bwd(const float* dy, const float* x, const float* weight, int64_t N, int64_t w, float* dx,
                         float* d_weight);

// x [N, in], w [E, in, out], counts [E] (summing to N): y [N, out] = x_e w_e.
void grouped_gemm(const float* x, const float* w, const int32_t* counts, int64_t E, int64_t in, int64_t out, float* y);
// dx [N, in] = dy_e w_e^T, dw [E, in, out] = x_e^T dy_e.
void grouped_gemm_bwd(const float* dy, const float* x, const float* w, const int32_t* counts, int64_t E, int64_t in,
                      int64_t out, float* dx, float* dw);

}  // namespace actbench::cpu
