#pragma once
// Host-callable launchers of the kernels in kernels/cuda/*.cu. They take raw device
// pointers, element counts and the stream to run on; CudaBackend checks shapes and dtypes
// first. Every float tensor of one call has the same storage dtype `dt` (bf16, fp16 or
// fp32); mean/rstd and workspaces are fp32, masks u8. Math is fp32, rounded once on store.
// Every launch is followed by a cudaGetLastError check (throws RuntimeFailure).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/backend.hpp"
#include "runtime/dtype.hpp"

namespace actbench::cuda {

// ---- layernorm.cu ---------------------------------------------------------------------
void layernorm_fwd(DType dt, const void* x, const void* weight, const void* bias, float eps, void* y, float* mean,
                   float* rstd, int64_t rows, int64_t cols, cudaStream_t stream);
// fp32 elements of workspace layernorm_bwd needs for its two-stage dweight/dbias reduction.
int64_t layernorm_bwd_workspace_floats(int64_t rows, int64_t cols);
void layernorm_bwd(DType dt, const void* dy, const void* x, const void* weight, const float* mean, const float* rstd,
                   void* dx, void* dweight, void* dbias, float* workspace, int64_t rows, int64_t cols,
                   cudaStream_t stream);

// ---- softmax.cu: rows of length `cols`, in matrices of `matrix_rows` rows; row r of the
// scores is row r % matrix_rows of its matrix, at position positions.at(r % matrix_rows) < cols,
// and sees the columns up to its position (the square [..., S, S]: matrix_rows = cols, the
// identity positions).
void softmax_causal_fwd(DType dt, const void* scores, void* probs, int64_t rows, int64_t matrix_rows, int64_t cols,
                        const SeqPositions& positions, cudaStream_t stream);
void softmax_causal_bwd(DType dt, const void* dprobs, const void* probs, void* dscores, int64_t rows,
                        int64_t matrix_rows, int64_t cols, const SeqPositions& positions, cudaStream_t stream);

// ---- dropout.cu ------------------------------------------------------------------------
void dropout_fwd(DType dt, const void* x, const DropoutSpec& spec, void* y, uint8_t* mask, cudaStream_t stream);
void dropout_bwd(DType dt, const void* dy, const uint8_t* mask, float scale, void* dx, int64_t n, cudaStream_t stream);

// ---- attention.cu: fused causal attention (FlashAttention-2 style) ----------------------
// q, out, dout, dq [B, S, D], k, v, dk, dv [B / group, Sk, D] with D <= kAttentionMaxHeadDim
// (InvalidArgument otherwise); lse [B, S] fp32. rows places the query and key rows in one
// sequence of rows.total positions (total 0: the square causal attention, Sk = S, T = S): key j
// is visible from query i when keys.at(j) <= queries.at(i), and dropout keeps element (b, i, j)
// iff spec.keep((b*T + queries.at(i))*T + keys.at(j)), regenerated in every kernel. A row that
// sees no key gets out 0 and lse -inf, and contributes nothing in backward. attention_bwd
// needs an fp32 workspace of attention_bwd_workspace_floats(dt, shape) floats: delta [B*S],
// and for bf16 and fp16 the dQ accumulator [B*S*D]. Grouped-query attention: query batch i reads
// key/value batch i / group, and dk, dv sum over the group's query batches.
// 192: multi-latent attention's q·k head (DeepSeek-V3's 128 + 64 RoPE dims); its narrower v
// runs padded to it (cuda_backend.cpp).
constexpr int64_t kAttentionMaxHeadDim = 192;
struct AttentionShape {
  int64_t B = 0, S = 0, Sk = 0, D = 0, group = 1;
  AttentionRows rows;
};
void attention_fwd(DType dt, const void* q, const void* k, const void* v, float scale, const DropoutSpec& spec,
                   void* out, float* lse, const AttentionShape& shape, cudaStream_t stream);
void attention_bwd(DType dt, const void* q, const void* k, const void* v, const void* out, const void* dout,
                   const float* lse, float scale, const DropoutSpec& spec, void* dq, void* dk, void* dv,
                   float* workspace, const AttentionShape& shape, cudaStream_t stream);
int64_t attention_bwd_workspace_floats(DType dt, const AttentionShape& shape);
// out, out_part [rows, D], lse, lse_part [rows] fp32: out and lse become those of both parts
// (Backend::attention_merge); fp32 math.
void attention_merge(DType dt, void* out, float* lse, const void* out_part, const float* lse_part, int64_t rows,
                     int64_t D, cudaStream_t stream);

// ---- activation.cu: GeLU (tanh) and squared ReLU over n elements -------------------
void gelu_fwd(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream);
void gelu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t stream);
void squared_relu_fwd(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream);
void squared_relu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t stream);

// ---- residual.cu -----------------------------------------------------------------------
// out = residual + dropout(x + bias[col]); x, residual, out [rows, cols], spec.numel() == rows*cols.
// bias == nullptr: no bias, out = residual + dropout(x) (cols then only divides the elements).
void bias_dropout_residual_fwd(DType dt, const void* x, const void* bias, const void* residual, const DropoutSpec& spec,
                               void* out, uint8_t* mask, int64_t rows, int64_t cols, cudaStream_t stream);
void add_bias(DType dt, void* y, const void* bias, int64_t rows, int64_t cols, cudaStream_t stream);
int64_t bias_grad_workspace_floats(int64_t rows, int64_t cols);
void bias_grad(DType dt, const void* dy, void* db, float* workspace, int64_t rows, int64_t cols, cudaStream_t stream);
void add_inplace(DType dt, void* dst, const void* src, int64_t n, cudaStream_t stream);
// c *= beta (beta == 0 writes zeros, whatever c held): GEMMs with k == 0.
void scale_inplace(DType dt, void* c, float beta, int64_t n, cudaStream_t stream);

// ---- llama.cu: the llama family (--arch llama) ---------------------------------------
// RMSNorm over rows of x [rows, cols]: rstd fp32 [rows]; dweight written (not accumulated).
void rmsnorm_fwd(DType dt, const void* x, const void* weight, float eps, void* y, float* rstd, int64_t rows,
                 int64_t cols, cudaStream_t stream);
int64_t rmsnorm_bwd_workspace_floats(int64_t rows, int64_t cols);
void rmsnorm_bwd(DType dt, const void* dy, const void* x, const void* weight, const float* rstd, void* dx,
                 void* dweight, float* workspace, int64_t rows, int64_t cols, cudaStream_t stream);
// Rotate-half RoPE on the first rotary_dim (even, <= D) dims of rows of x [rows, D], row r at
// position positions.at(r % S); the other dims are copied; inverse: the backward. y may be x.
void rope(DType dt, const void* x, void* y, int64_t rows, int64_t S, int64_t D, int64_t rotary_dim, double theta,
          bool inverse, const SeqPositions& positions, cudaStream_t stream);
// x [M, 2N] = [gate | up], y [M, N] = silu(gate) * up; dx [M, 2N].
void swiglu_fwd(DType dt, const void* x, void* y, int64_t M, int64_t N, cudaStream_t stream);
void swiglu_bwd(DType dt, const void* dy, const void* x, void* dx, int64_t M, int64_t N, cudaStream_t stream);

// ---- layout.cu -------------------------------------------------------------------------
// The sequence-major activation [S, B, W] and its heads [B, NH, S, D], which are columns
// [col_offset, col_offset + NH*D) of it, head-major. split: sbw -> heads; merge: heads -> sbw
// (other columns of sbw untouched).
void split_heads(DType dt, const void* sbw, void* heads, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
                 int64_t col_offset, cudaStream_t stream);
void merge_heads(DType dt, const void* heads, void* sbw, int64_t S, int64_t B, int64_t W, int64_t NH, int64_t D,
                 int64_t col_offset, cudaStream_t stream);
// Backend::copy_rows as raw bytes: for o < outer, rows x row_bytes bytes from row src_row of
// src's block o (src_rows rows of row_bytes) to row dst_row of dst's block o (dst_rows rows).
void copy_rows(const void* src, int64_t src_rows, int64_t src_row, void* dst, int64_t dst_rows, int64_t dst_row,
               int64_t rows, int64_t outer, int64_t row_bytes, cudaStream_t stream);

// ---- moe.cu: mixture of experts (docs/moe.md; Backend's moe_* ops, same shapes) ---------
// Routing, one warp per token: logits, scores [T, E], bias [E] or nullptr, index, weight
// [T, k]; aux [1] or nullptr, which needs a workspace of moe_route_workspace_floats(T, E)
// (the row-normalised scores and per-expert sums of its deterministic reduction).
int64_t moe_route_workspace_floats(int64_t T, int64_t E);
void moe_route(DType dt, const void* logits, const void* bias, int64_t T, int64_t E, const MoeRouting& routing,
               void* scores, int32_t* index, void* weight, float* aux, float* workspace, cudaStream_t stream);
void moe_route_bwd(DType dt, const void* d_weight, const void* scores, const int32_t* index, int64_t T, int64_t E,
                   const MoeRouting& routing, void* d_logits, cudaStream_t stream);
// The plan of index [T, k] (capacity < 0: dropless) into tokens_per_expert [E], row_slot
// [T k], slot_row [T, k], with a workspace of moe_dispatch_workspace_ints(T, k, E). Waits for
// the stream once: an expert outside [0, E) in index throws InvalidArgument, as on the cpu.
int64_t moe_dispatch_workspace_ints(int64_t T, int64_t k, int64_t E);
void moe_dispatch(const int32_t* index, int64_t T, int64_t k, int64_t E, int64_t capacity, int32_t* tokens_per_expert,
                  int32_t* row_slot, int32_t* slot_row, int32_t* workspace, cudaStream_t stream);
// N rows of the permuted tensors [N, h], T tokens [T, h], k choices; element: bytes per element.
void moe_permute(size_t element, const void* x, const int32_t* row_slot, int64_t N, int64_t T, int64_t k, int64_t h,
                 void* out, cudaStream_t stream);
void moe_permute_bwd(DType dt, const void* d_out, const int32_t* slot_row, int64_t N, int64_t T, int64_t k, int64_t h,
                     void* dx, cudaStream_t stream);
void moe_unpermute(DType dt, const void* y, const int32_t* slot_row, const void* weight, int64_t N, int64_t T,
                   int64_t k, int64_t h, void* out, cudaStream_t stream);
void moe_unpermute_bwd(DType dt, const void* d_out, const void* y, const int32_t* slot_row, const void* weight,
                       int64_t N, int64_t T, int64_t k, int64_t h, void* dy, void* d_weight, cudaStream_t stream);
// y [N, w] = weight[r] * x[r, :]; back: dx = weight[r] * dy[r, :], d_weight[r] = dy[r] . x[r].
void moe_weight_rows(DType dt, const void* x, const void* weight, int64_t N, int64_t w, void* y, cudaStream_t stream);
void moe_weight_rows_bwd(DType dt, const void* dy, const void* x, const void* weight, int64_t N, int64_t w, void* dx,
                         void* d_weight, cudaStream_t stream);

}  // namespace actbench::cuda
