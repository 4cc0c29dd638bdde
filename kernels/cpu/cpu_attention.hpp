#pragma once
// Fused causal attention on the CPU, FlashAttention-style: scores exist only a tile at a
// time, softmax is computed online (running max and sum), forward keeps out and the row
// log-sum-exp, backward recomputes each score from q, k and lse. Dropout keeps/drops the
// same elements as dropout_fwd over the [B, S, S] probabilities (spec.keep of the flat index).
// The reference for the CUDA kernel, and checked against the unfused path of the layer.
#include <cstdint>

#include "kernels/backend.hpp"

namespace actbench::cpu {

constexpr int64_t kAttentionTile = 16;  // keys per tile: small, so tests cross many tiles

// The shape of one call: q [B, S, D], out [B, S, Dv] row-major float, lse [B, S]; k [B / group,
// Sk, D], v [B / group, Sk, Dv] (Dv: v's head size, D unless multi-latent attention's):
// query batch i reads key/value batch i / group (grouped-query attention; group 1 is
// multi-head). rows places query and key rows in one sequence (backend.hpp's AttentionRows;
// total 0: Sk = S, each row at its own index).
struct AttentionShape {
  int64_t B = 0, S = 0, Sk = 0, D = 0, group = 1;
  AttentionRows rows;
  int64_t Dv = 0;  // 0: D
  int64_t v_dim() const { return Dv > 0 ? Dv : D; }
  int64_t total() const { return rows.total > 0 ? rows.total : S; }
};
// The (query, key) scores this process has computed in fused attention, forward and backward:
// the work a rank did, which context parallelism's chunk assignment balances (read by tests).
int64_t attention_score_count();

void attention_fwd(const float* q, const float* k, const float* v, const AttentionShape& shape, float scale,
                   const DropoutSpec& spec, float* out, float* lse);
// dq written; dk, dv [B / group, Sk, D or Dv] written, each the sum over the group's query batches.
void attention_bwd(const float* q, const float* k, const float* v, const float* out, const float* dout,
                   const float* lse, const AttentionShape& shape, float scale, const DropoutSpec& spec, float* dq,
                   float* dk, float* dv);

}  // namespace actbench::cpu
