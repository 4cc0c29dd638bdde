#pragma once
// Activation bytes of the llama family (--arch llama) per layer and tensor-parallel rank, by
// category: the analogue of Table 2 for RMSNorm + grouped-query attention with RoPE + SwiGLU,
// no biases and no dropout, under Megatron-Core's conventions of what each op keeps:
//
//   category       kept by                            bytes (e = bytes per element)
//   ln1_input      RMSNorm 1, its input               e·sbh / r      r = t under SP, else 1
//   qkv_input      the QKV GEMM, its input            e·sbh / r
//   q, k           the scores GEMM, after RoPE        e·sbh / t,  e·sbh·g/a / t
//   softmax_out    softmax, and ·V (one tensor)       e·as²b / t     (unfused, not selective)
//   attn_lse       fused attention, fp32 per row      4·asb / t      (fused, not selective)
//   v              ·V                                 e·sbh·g/a / t
//   proj_input     the output projection              e·sbh / t
//   ln2_input      RMSNorm 2, its input               e·sbh / r
//   fc1_input      fc1, its input                     e·sbh / r
//   swiglu_input   SwiGLU, the fc1 output gate | up   2e·sbF / t
//   fc2_input      fc2, its input                     e·sbF / t
//   layer_input    full recompute: the only tensor    e·sbh / r
//
// With 16-bit activations the sum is (the closed form, like Table 2's rows):
//   none        sbh·(8/r + (4 + 4g/a + 6F/h + 2as/h)/t)
//   selective   sbh·(8/r + (4 + 4g/a + 6F/h)/t)
//   fused       sbh·(8/r + (4 + 4g/a + 6F/h + 4a/h)/t)      (selective fused: as selective)
//   full        2sbh / r
// RMSNorm's rstd (fp32, one per row, two norms) is an extra, outside the count, as LayerNorm's
// statistics are for the paper's layer.
#include <string>
#include <utility>
#include <vector>

#include "theory/activation_memory.hpp"

namespace actbench::theory {

struct LlamaDims {
  double s = 0, b = 0, h = 0, a = 0;  // sequence, microbatch, hidden, query heads
  double g = 0;                       // key/value heads (0: g = a)
  double f = 0;                       // SwiGLU width F (0: 4h)
  double t = 1;                       // tensor-parallel size
  double groups() const { return g > 0 ? g : a; }
  double ffn() const { return f > 0 ? f : 4 * h; }
};

// (category, bytes) in the order of the table above; categories c does not keep are left out.
std::vector<std::pair<std::string, double>> llama_activation_bytes_by_category(const LlamaDims& d, LayerPolicy c,
                                                                               Precision p = {});
double llama_activation_bytes(const LlamaDims& d, LayerPolicy c, Precision p = {});
// The closed forms above (16-bit activations), written independently of the categories.
double llama_closed_form(const LlamaDims& d, LayerPolicy c);
// RMSNorm rstd: fp32, one per row of each of the two norms; not in the count.
double llama_norm_stats_bytes(const LlamaDims& d, LayerPolicy c);

}  // namespace actbench::theory
