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

// q, out: [B, S, D] row-major float; lse: [B, S]. k, v: [B / group, S, D]: query batch i
// reads key/value batch i / group (grouped-query attention; group 1 is multi-head).
void attention_fwd(const float* q, const float* k, const float* v, int64_t B, int64_t S, int64_t D, float scale,
                   const DropoutSpec& spec, float* out, float* lse, int64_t group = 1);
// dq written; dk, dv [B / group, S, D] written, each the sum over the group's query batches.
void attention_bwd(const float* q, const float* k, const float* v, const float* out, const float* dout,
                   const float* lse, int64_t B, int64_t S, int64_t D, float scale, const DropoutSpec& spec, float* dq,
                   float* dk, float* dv, int64_t group = 1);

}  // namespace actbench::cpu
