#pragma once
// The one interface the layer code is written against. Three implementations:
//   cpu   reference ops: fp32 math on bf16/fp16/fp32 storage, Eigen GEMMs
//   meta  allocations only; ops do nothing (the memory schedule of any shape, instantly)
//   cuda  cuBLASLt + kernels/cuda
// All tensors are contiguous row-major. Shapes named below are the contract each op checks.
// Outputs are `const Tensor&` like PyTorch's out= variants: a Tensor is a handle, the op
// writes the data it refers to, never the handle (so views such as t.view(...) can be passed).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/allocator.hpp"
#include "runtime/error.hpp"
#include "runtime/gpu_state.hpp"
#include "runtime/philox.hpp"
#include "runtime/seq_positions.hpp"
#include "runtime/tensor.hpp"
#include "runtime/timing.hpp"

namespace actbench {

// C[i] = alpha * op(A[i]) * op(B[i]) + beta * C[i] for i < batch, row-major.
// op(A) is m x k: A is stored [m, k], or [k, m] when trans_a. op(B) is k x n: B is stored
// [k, n], or [n, k] when trans_b. C is [m, n]. Batches are contiguous (stride = matrix size).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  float alpha = 1.f, beta = 0.f;
};
inline GemmArgs gemm_args(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t batch = 1,
                          float alpha = 1.f, float beta = 0.f) {
  return GemmArgs{trans_a, trans_b, m, n, k, batch, alpha, beta};
}

// Where a dropout mask comes from. The local tensor is viewed as [outer, mid_local, inner]
// and its element (o, m, i) is element (((outer_offset + o) * mid_global + mid_offset + m) *
// inner_global + inner_positions.at(i)) of the canonical unsharded tensor (outer_offset: a
// data-parallel rank's first batch of a canonical batch of several ranks'); that canonical index is the Philox
// counter, so the mask is the same for every t, SP or not, and when recomputed. Context
// parallelism's attention probabilities keep only some rows of each head's [S, S]: their
// inner index runs are placed by inner_positions in an inner_global (0: inner) of S * S.
struct DropoutSpec {
  float p = 0.f;
  uint64_t seed = 0;
  uint32_t layer = 0;
  uint32_t site = 0;
  int64_t outer = 1, mid_local = 1, mid_global = 1, mid_offset = 0, inner = 1, outer_offset = 0;
  int64_t inner_global = 0;
  SeqPositions inner_positions;
  ACTBENCH_HD int64_t numel() const { return outer * mid_local * inner; }
  ACTBENCH_HD int64_t inner_canonical() const { return inner_global > 0 ? inner_global : inner; }
  ACTBENCH_HD int64_t canonical_index(int64_t local) const {
    int64_t i = local % inner;
    int64_t rest = local / inner;
    int64_t m = rest % mid_local;
    int64_t o = rest / mid_local;
    return ((outer_offset + o) * mid_global + mid_offset + m) * inner_canonical() + inner_positions.at(i);
  }
  ACTBENCH_HD bool keep(int64_t local) const {
    return philox_word(seed, layer, site, static_cast<uint64_t>(canonical_index(local))) >= dropout_threshold(p);
  }
  ACTBENCH_HD float scale() const { return p > 0.f ? 1.f / (1.f - p) : 1.f; }
};

// The rows of a fused attention within one sequence of `total` positions: query row i is at
// queries.at(i), key row j at keys.at(j), and j is visible from i when keys.at(j) <=
// queries.at(i) (causal). Context parallelism runs a rank's query chunks against its own keys,
// another rank's (ring) or all of them (all-gather). The dropout spec then describes the
// B * total * total probabilities of the whole sequence: element (b, i, j) is its local index
// (b * total + queries.at(i)) * total + keys.at(j). The default (total 0) is the square causal
// attention of S rows: every row at its own index, total = S.
struct AttentionRows {
  SeqPositions queries, keys;
  int64_t total = 0;
  bool operator==(const AttentionRows&) const = default;
};

// ---- mixture of experts (docs/moe.md) ------------------------------------------------------
// How a router turns logits [T, E] into each token's top_k experts and their weights.
//   scores = softmax(logits) over the E experts, or sigmoid(logits) (DeepSeek-V3);
//   selection: the top_k of scores + bias (bias [E], optional: aux-loss-free balancing; it
//     changes which experts are chosen, never their weights), ties to the lower expert index;
//     with num_groups > 1 (DeepSeek-V3's device-limited routing) only the experts of the
//     group_top_k best groups compete, a group scored by the sum of its two best biased
//     scores (its best one when a group holds one expert), ties to the lower group index;
//   weights: the unbiased scores of the chosen experts g_j, divided by (sum_j g_j + 1e-20)
//     when `normalize`, times `scaling`.
struct MoeRouting {
  enum class Score { softmax, sigmoid };
  Score score = Score::softmax;
  int64_t top_k = 1;
  bool normalize = false;
  float scaling = 1.f;
  int64_t num_groups = 1, group_top_k = 1;
};
const char* moe_score_name(MoeRouting::Score s);

// Where each (token, choice) pair of a routing decision goes. T tokens, top_k choices each,
// E experts; the permuted tensor holds the N kept pairs as rows grouped by expert (expert 0's
// first), each expert's rows in token order. All int32.
//   tokens_per_expert [E]  the rows of each expert (kept pairs; N = their sum)
//   row_slot [T * top_k]   row r < N came from pair t * top_k + j; rows N.. hold -1
//   slot_row [T, top_k]    pair (t, j)'s row, or -1 when it was dropped
struct MoeDispatch {
  Tensor tokens_per_expert, row_slot, slot_row;
};
// The capacity of each expert: ceil((T * top_k / E) * capacity_factor), capacity_factor > 0.
int64_t moe_expert_capacity(int64_t tokens, int64_t top_k, int64_t experts, double capacity_factor);

// The contract, written once (kernels/backend.cpp) and the same for every backend: the public
// ops below are not virtual; each checks its arguments, then calls the backend's protected
// <op>_impl. So meta, which proves the shapes of runs too large for any device, refuses exactly
// what cpu and cuda refuse. Every violation is InvalidArgument, one line "op: what".
//   - Every tensor is defined and, when it holds elements, lives on this backend's device.
//   - Shapes as named at each op; "float" tensors are bf16, fp16 or fp32, not u8 or i32. The float
//     tensors of one op may differ in dtype (the cpu computes in fp32 whatever the storage);
//     the cuda backend, whose kernels are built per dtype, needs one dtype per op (GEMM: the
//     pairs cuBLASLt supports), a limit of that backend like its head size of at most 128.
//   - Statistics (LayerNorm mean/rstd, RMSNorm rstd, attention lse) are fp32; masks are u8;
//     indices (MoE routing and dispatch) are i32.
//   - A DropoutSpec has p in [0, 1), a shard [mid_offset, mid_offset + mid_local) inside
//     [0, mid_global) and as many elements as the tensor it drops from.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;         // "cpu" | "meta" | "cuda"
  virtual std::string device_name() const = 0;  // e.g. "host-cpu", "NVIDIA H100 80GB HBM3"
  // False for meta: ops do not touch data, results are undefined (and never read).
  virtual bool computes() const = 0;
  // True when the device is simulated on the CPU (the cuda backend of an ACTBENCH_CUDA_SIM
  // build): values, bytes and kernel counts are real results, times are host time of the
  // simulator and never a device measurement, so runners leave timing columns empty.
  virtual bool simulated() const { return false; }

  CachingAllocator& allocator() { return *allocator_; }
  Tensor empty(Shape shape, DType dtype) { return Tensor(*allocator_, std::move(shape), dtype); }
  Tensor zeros(Shape shape, DType dtype) {
    Tensor t = empty(std::move(shape), dtype);
    fill_zero(t);
    return t;
  }

  // ---- data movement -------------------------------------------------------------------
  void fill_zero(const Tensor& t);
  void copy(const Tensor& src, const Tensor& dst);        // same numel and dtype
  void upload(const float* host, const Tensor& dst);      // rounds to dst dtype
  void download(const Tensor& src, float* host);          // widens to float
  void add_inplace(const Tensor& dst, const Tensor& src);  // dst += src, same numel, floats
  virtual void synchronize() {}

  // ---- stream-ordered timing ---------------------------------------------------------
  // mark() records a point in the order ops execute (a CUDA event on the compute stream;
  // the host clock after synchronize() on cpu/meta); ms_between() waits for both marks
  // and returns the milliseconds between them. Shared by layer_run and bench/.
  struct Mark {
    double host_ms = 0;
    std::shared_ptr<void> event;  // backend-owned (cudaEvent_t on cuda)
  };
  virtual Mark mark() {
    synchronize();
    return Mark{host_now_ms(), nullptr};
  }
  virtual double ms_between(const Mark& begin, const Mark& end) { return end.host_ms - begin.host_ms; }
  // The software under this backend, for the provenance columns of results ("" if none).
  struct Versions {
    std::string driver, cuda_runtime, cublas, nccl;
  };
  virtual Versions versions() const { return {}; }
  // Clocks, power limit and throttle reasons of the device now (NVML; empty off a GPU).
  virtual GpuState gpu_state() const { return {}; }
  // Brackets the timed iterations for profilers (cudaProfilerStart/Stop on cuda).
  virtual void profiling(bool on) {}

  // ---- GEMM --------------------------------------------------------------------------
  // A, B, C of the sizes GemmArgs names (m, n, k, batch >= 0), of any float dtype;
  // accumulation is fp32. C must not overlap A or B.
  void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, const Tensor& c);
  // y[M, N] += bias[N], N >= 1
  void add_bias(const Tensor& y, const Tensor& bias);
  // db[N] = sum over rows of dy[M, N], N >= 1
  void bias_grad(const Tensor& dy, const Tensor& db);

  // ---- LayerNorm over the last dim: x [M, H], weight/bias [H], mean/rstd [M] fp32 -------
  // y has the elements of x.
  void layernorm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& y,
                     const Tensor& mean, const Tensor& rstd);
  // dy, dx have the elements of x; dweight, dbias [H] written (not accumulated).
  void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias);

  // ---- causal softmax over the last dim of scores [..., R, C] ----------------------------
  // Row i of each matrix sees the columns <= rows.at(i) (< C); the rest are exactly zero.
  // The default is the square [..., S, S] (row i sees columns <= i); context parallelism's
  // rows are two chunks of a longer sequence. probs (dprobs, dscores) have the elements of
  // scores (probs).
  void softmax_causal_fwd(const Tensor& scores, const Tensor& probs, const SeqPositions& rows = {});
  void softmax_causal_bwd(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores,
                          const SeqPositions& rows = {});

  // ---- dropout: y = x * keep / (1 - p); mask u8 (1 = kept); y, mask (dx) like x (dy) ----
  void dropout_fwd(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask);
  void dropout_bwd(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx);

  // ---- MLP activations; y, dy, dx have the elements of x --------------------------------
  // GeLU, tanh approximation.
  void gelu_fwd(const Tensor& x, const Tensor& y);
  void gelu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx);
  // Squared ReLU (Megatron's --squared-relu): y = max(x, 0)^2; dx = 2 max(x, 0) dy. The
  // backward reads x or, equally, relu(x) (max(relu(x), 0) = relu(x)).
  void squared_relu_fwd(const Tensor& x, const Tensor& y);
  void squared_relu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx);

  // ---- out = residual + dropout(x + bias); x, residual, out, mask [M, N], bias [N] ------
  // bias may be an undefined Tensor: no bias, out = residual + dropout(x), x of any shape
  // (a layer with dropout and --disable-bias-linear).
  void bias_dropout_residual_fwd(const Tensor& x, const Tensor& bias, const Tensor& residual, const DropoutSpec& spec,
                                 const Tensor& out, const Tensor& mask);

  // ---- fused causal attention (FlashAttention-style; --attention fused) ----------------
  // q, out [B, S, D] (B = batch x heads of this rank), k, v [B, Sk, D] with Sk = S unless
  // `rows` places them (AttentionRows: query and key rows in a longer sequence); lse [B, S]
  // fp32, the
  // log-sum-exp of each row of scale * q k^T over the causal columns. Probabilities are never
  // stored: forward keeps out and lse; backward recomputes the scores tile by tile. Dropout
  // on the probabilities uses `spec` (B * S * S elements) exactly as dropout_fwd on the
  // [B, S, S] probabilities would (same Philox counters, so the same mask as the unfused
  // path), regenerated in backward instead of stored. dq, dk, dv written.
  // Grouped-query attention: k, v (and dk, dv) may hold B/r batches for r = B / k.dim(0)
  // query batches per key/value batch; query batch i reads key/value batch i / r, and dk, dv
  // sum over the r queries of their group (r = 1 is multi-head attention). B = 0 (no work)
  // pairs with an empty k and v. A query row that sees no key (context parallelism's
  // blocks) gets out = 0 and lse = -inf, and contributes nothing in backward. Backward reads
  // the out and lse of the whole attention (after every attention_merge): with those, one
  // key block's dk, dv and its share of dq are exact.
  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const DropoutSpec& spec,
                     const Tensor& out, const Tensor& lse, const AttentionRows& rows = {});
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                     const Tensor& lse, float scale, const DropoutSpec& spec, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv, const AttentionRows& rows = {});
  // Two partial attentions of the same queries over disjoint keys, merged (the online
  // softmax's rescaling): out, lse hold one, out_part, lse_part the other; afterwards out and
  // lse are those of both key sets. out, out_part [B, S, D] float; lse, lse_part [B, S] fp32.
  // A row whose lse is -inf has seen no key: its out is ignored.
  void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_part, const Tensor& lse_part);

  // ---- the llama family (--arch llama) ---------------------------------------------------
  // RMSNorm over the last dim: x [M, H], weight [H], rstd [M] fp32 = 1 / sqrt(mean(x²) + eps),
  // eps > 0; y = x * rstd * weight.
  void rmsnorm_fwd(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd);
  // dy, dx have the elements of x; dweight [H] written (not accumulated).
  void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                   const Tensor& dweight);
  // Rotary embedding, rotate-half convention, on the first R = rotary_dim dims of each head
  // of x [B, NH, S, D] (R even, 2 <= R <= D; theta > 0): for position p (0..S-1) and
  // i < R/2, angle = p * theta^(-2i/R);
  //   y[i] = x[i] cos - x[i + R/2] sin,  y[i + R/2] = x[i + R/2] cos + x[i] sin;
  // dims R..D-1 pass through unchanged (Megatron-Core's --rotary-percent: R = int(D * percent)).
  // y may be x (in place). Backward is the rotation by -angle (dx may be dy). Row s of each
  // head is at position positions.at(s) (default: s; context parallelism's two chunks).
  void rope_fwd(const Tensor& x, double theta, int64_t rotary_dim, const Tensor& y, const SeqPositions& positions = {});
  void rope_bwd(const Tensor& dy, double theta, int64_t rotary_dim, const Tensor& dx,
                const SeqPositions& positions = {});
  // SwiGLU: x [M, 2N] is [gate | up] per row (N >= 1); y [M, N] = silu(gate) * up.
  void swiglu_fwd(const Tensor& x, const Tensor& y);
  // dx [M, 2N] = [d gate | d up].
  void swiglu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx);

  // ---- attention head layout (any dtype, the same on both sides) -------------------------
  // src [S, B, W]; dst [B, NH, S, D] = columns [col_offset, col_offset + NH*D) of src,
  // head-major (head j at columns col_offset + j*D ...); col_offset >= 0.
  void split_heads(const Tensor& src, int64_t col_offset, const Tensor& dst);
  // The inverse: writes src [B, NH, S, D] into columns [col_offset, col_offset + NH*D) of dst [S, B, W].
  void merge_heads(const Tensor& src, int64_t col_offset, const Tensor& dst);
  // dst[o, dst_row + r, :] = src[o, src_row + r, :] for r < rows: src [O, Rs, W] and dst
  // [O, Rd, W] (any dtype, the same; 3-d views), the runs inside both. Context parallelism
  // moves sequence chunks between a rank's order and the whole sequence's with it.
  void copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows);

  // ---- mixture of experts (docs/moe.md; cpu and meta) -----------------------------------
  // Routing (MoeRouting): logits [T, E] float, bias [E] float or undefined (no bias);
  // scores [T, E] float (what backward reads), topk_index [T, k] i32, topk_weight [T, k]
  // float (any float dtype: rounded once from fp32); aux_loss [1] fp32 or undefined, the
  // load-balancing loss E * sum_e f_e P_e (f_e: the share of the T * k choices that picked
  // e; P_e: the mean over tokens of the scores, each row divided by its sum), reported only.
  // 1 <= k <= E; num_groups divides E, 1 <= group_top_k <= num_groups and k <= group_top_k
  // * E / num_groups; scaling > 0. Selection and weights come from the fp32 scores before
  // they are stored.
  void moe_route(const Tensor& logits, const Tensor& bias, const MoeRouting& routing, const Tensor& scores,
                 const Tensor& topk_index, const Tensor& topk_weight, const Tensor& aux_loss);
  // d_logits [T, E] from d_topk_weight [T, k], through the normalisation and the score
  // function (the bias has no gradient: it is not in the weights).
  void moe_route_bwd(const Tensor& d_topk_weight, const Tensor& scores, const Tensor& topk_index,
                     const MoeRouting& routing, const Tensor& d_logits);
  // The dispatch plan of topk_index [T, k] (experts in [0, E), E = tokens_per_expert's
  // elements). Dropless without a capacity factor; with one, each expert keeps the first
  // moe_expert_capacity(...) of its pairs in token order and drops the rest (which token
  // drops depends on the routing alone, not on the weights).
  void moe_dispatch(const Tensor& topk_index, std::optional<double> capacity_factor, const MoeDispatch& plan);
  // out [N, h] = the rows x [T, h] of the kept pairs in plan order (same dtype; N <= T * k,
  // the sum of tokens_per_expert, which cpu checks).
  void moe_permute(const Tensor& x, const MoeDispatch& plan, const Tensor& out);
  // dx [T, h] = for each token, the sum of its kept rows of d_out [N, h] (written).
  void moe_permute_bwd(const Tensor& d_out, const MoeDispatch& plan, const Tensor& dx);
  // out [T, h] = sum over token t's kept pairs j of topk_weight[t, j] * y[slot_row[t, j]];
  // a token whose pairs were all dropped gets 0. y [N, h], topk_weight [T, k], all float.
  void moe_unpermute(const Tensor& y, const MoeDispatch& plan, const Tensor& topk_weight, const Tensor& out);
  // dy [N, h] = weight * d_out of its token; d_topk_weight [T, k] = d_out[t] . y[row] (0 for
  // dropped pairs). Both written.
  void moe_unpermute_bwd(const Tensor& d_out, const Tensor& y, const MoeDispatch& plan, const Tensor& topk_weight,
                         const Tensor& dy, const Tensor& d_topk_weight);
  // The routing weights into the experts' rows (Megatron-Core >= 0.13 weights the experts'
  // activation): y [N, w] = weight[r] * x[r, :] per row, weight [N, 1]; fp32 math, rounded once.
  void moe_weight_rows(const Tensor& x, const Tensor& weight, const Tensor& y);
  // Its backward: dx [N, w] = weight[r] * dy[r, :]; d_weight [N, 1] = dy[r] . x[r] (fp32
  // accumulation). Both written; dx may be x itself (each element read before it is written).
  void moe_weight_rows_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                           const Tensor& d_weight);
  // The experts' GEMMs over their rows: x [N, in] holds tokens_per_expert [E] (i32) rows of
  // each expert in order; w [E, in, out]; y [N, out] = x_e w_e per expert. Floats of any
  // dtype, fp32 accumulation; y must not overlap x or w. host_rows, when given, are the same
  // counts already on the host (the layer read them once after the dispatch), so that a GPU
  // need not copy them back and wait, as Megatron-Core's grouped GEMM takes its m_splits; they
  // must sum to N (cpu also checks that they equal tokens_per_expert).
  void grouped_gemm(const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert, const Tensor& y,
                    const std::vector<int64_t>& host_rows = {});
  // dx [N, in] = dy_e w_e^T, dw [E, in, out] = x_e^T dy_e (written; 0 for an expert of no rows).
  void grouped_gemm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert,
                        const Tensor& dx, const Tensor& dw, const std::vector<int64_t>& host_rows = {});

 protected:
  explicit Backend(std::unique_ptr<CachingAllocator> alloc) : allocator_(std::move(alloc)) {}

  // The ops themselves, called only with arguments that meet the contract above.
  virtual void fill_zero_impl(const Tensor& t) = 0;
  virtual void copy_impl(const Tensor& src, const Tensor& dst) = 0;
  virtual void upload_impl(const float* host, const Tensor& dst) = 0;
  virtual void download_impl(const Tensor& src, float* host) = 0;
  virtual void add_inplace_impl(const Tensor& dst, const Tensor& src) = 0;
  virtual void gemm_impl(const GemmArgs& args, const Tensor& a, const Tensor& b, const Tensor& c) = 0;
  virtual void add_bias_impl(const Tensor& y, const Tensor& bias) = 0;
  virtual void bias_grad_impl(const Tensor& dy, const Tensor& db) = 0;
  virtual void layernorm_fwd_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& y,
                                  const Tensor& mean, const Tensor& rstd) = 0;
  virtual void layernorm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) = 0;
  virtual void softmax_causal_fwd_impl(const Tensor& scores, const Tensor& probs, const SeqPositions& rows) = 0;
  virtual void softmax_causal_bwd_impl(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores,
                                       const SeqPositions& rows) = 0;
  virtual void dropout_fwd_impl(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask) = 0;
  virtual void dropout_bwd_impl(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) = 0;
  virtual void gelu_fwd_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void gelu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) = 0;
  virtual void squared_relu_fwd_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void squared_relu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) = 0;
  virtual void bias_dropout_residual_fwd_impl(const Tensor& x, const Tensor& bias, const Tensor& residual,
                                              const DropoutSpec& spec, const Tensor& out, const Tensor& mask) = 0;
  virtual void split_heads_impl(const Tensor& src, int64_t col_offset, const Tensor& dst) = 0;
  virtual void merge_heads_impl(const Tensor& src, int64_t col_offset, const Tensor& dst) = 0;
  virtual void copy_rows_impl(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row,
                              int64_t rows) = 0;

  // Optional: a backend without them says so.
  virtual void attention_fwd_impl(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                  const DropoutSpec& spec, const Tensor& out, const Tensor& lse,
                                  const AttentionRows& rows) {
    throw InvalidArgument(std::string("--attention fused is not implemented on the ") + name() + " backend");
  }
  virtual void attention_bwd_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& dout, const Tensor& lse, float scale, const DropoutSpec& spec,
                                  const Tensor& dq, const Tensor& dk, const Tensor& dv, const AttentionRows& rows) {
    throw InvalidArgument(std::string("--attention fused is not implemented on the ") + name() + " backend");
  }
  virtual void attention_merge_impl(const Tensor& out, const Tensor& lse, const Tensor& out_part,
                                    const Tensor& lse_part) {
    throw InvalidArgument(std::string("attention_merge (context parallelism) is not implemented on the ") + name() +
                          " backend");
  }
  virtual void rmsnorm_fwd_impl(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd) {
    not_implemented("rmsnorm_fwd");
  }
  virtual void rmsnorm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                const Tensor& dx, const Tensor& dweight) {
    not_implemented("rmsnorm_bwd");
  }
  virtual void rope_fwd_impl(const Tensor& x, double theta, int64_t rotary_dim, const Tensor& y,
                             const SeqPositions& positions) {
    not_implemented("rope_fwd");
  }
  virtual void rope_bwd_impl(const Tensor& dy, double theta, int64_t rotary_dim, const Tensor& dx,
                             const SeqPositions& positions) {
    not_implemented("rope_bwd");
  }
  virtual void swiglu_fwd_impl(const Tensor& x, const Tensor& y) { not_implemented("swiglu_fwd"); }
  virtual void swiglu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) { not_implemented("swiglu_bwd"); }

  virtual void moe_route_impl(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                              const Tensor& scores, const Tensor& topk_index, const Tensor& topk_weight,
                              const Tensor& aux_loss) {
    moe_not_implemented("moe_route");
  }
  virtual void moe_route_bwd_impl(const Tensor& d_topk_weight, const Tensor& scores, const Tensor& topk_index,
                                  const MoeRouting& routing, const Tensor& d_logits) {
    moe_not_implemented("moe_route_bwd");
  }
  virtual void moe_dispatch_impl(const Tensor& topk_index, std::optional<double> capacity_factor,
                                 const MoeDispatch& plan) {
    moe_not_implemented("moe_dispatch");
  }
  virtual void moe_permute_impl(const Tensor& x, const MoeDispatch& plan, const Tensor& out) {
    moe_not_implemented("moe_permute");
  }
  virtual void moe_permute_bwd_impl(const Tensor& d_out, const MoeDispatch& plan, const Tensor& dx) {
    moe_not_implemented("moe_permute_bwd");
  }
  virtual void moe_unpermute_impl(const Tensor& y, const MoeDispatch& plan, const Tensor& topk_weight,
                                  const Tensor& out) {
    moe_not_implemented("moe_unpermute");
  }
  virtual void moe_weight_rows_impl(const Tensor& x, const Tensor& weight, const Tensor& y) {
    moe_not_implemented("moe_weight_rows");
  }
  virtual void moe_weight_rows_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                                        const Tensor& d_weight) {
    moe_not_implemented("moe_weight_rows_bwd");
  }
  virtual void moe_unpermute_bwd_impl(const Tensor& d_out, const Tensor& y, const MoeDispatch& plan,
                                      const Tensor& topk_weight, const Tensor& dy, const Tensor& d_topk_weight) {
    moe_not_implemented("moe_unpermute_bwd");
  }
  virtual void grouped_gemm_impl(const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert, const Tensor& y,
                                 const std::vector<int64_t>& host_rows) {
    moe_not_implemented("grouped_gemm");
  }
  virtual void grouped_gemm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& w,
                                     const Tensor& tokens_per_expert, const Tensor& dx, const Tensor& dw,
                                     const std::vector<int64_t>& host_rows) {
    moe_not_implemented("grouped_gemm_bwd");
  }

  [[noreturn]] void not_implemented(const char* op) const {
    throw InvalidArgument(std::string(op) + " (--arch llama) is not implemented on the " + name() + " backend yet");
  }
  [[noreturn]] void moe_not_implemented(const char* op) const {
    throw InvalidArgument(std::string(op) + " (mixture of experts) is not implemented on the " + name() +
                          " backend yet");
  }
  std::unique_ptr<CachingAllocator> allocator_;
};

// capacity_bytes > 0 emulates a device of that size (allocations past it are OOM).
std::unique_ptr<Backend> make_cpu_backend(size_t capacity_bytes = 0);
std::unique_ptr<Backend> make_meta_backend(size_t capacity_bytes = 0);
// Throws InvalidArgument("... no CUDA device ...") where the CUDA backend cannot run.
std::unique_ptr<Backend> make_backend(const std::string& name, size_t capacity_bytes = 0);

// The int32 tensors of a dispatch plan for T tokens, top_k choices each and E experts.
MoeDispatch make_moe_dispatch(Backend& be, int64_t tokens, int64_t top_k, int64_t experts);

}  // namespace actbench
