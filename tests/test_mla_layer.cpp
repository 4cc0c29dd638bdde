// The composed layer with multi-latent attention in place of its QKV projection
// (layers/mla_attention.cpp):
// - the bytes it keeps equal theory/layer_pieces.hpp's MLA rows to the byte, category by
//   category (statistics too), on meta and on the cpu, for each MLA option × configuration ×
//   recompute module set (mla_up_proj among them) × t, and under context parallelism;
// - the mla_up_proj module frees exactly the up projections' inputs and q, k, v, and keeps k's
//   RoPE part, on the whole sequence;
// - no recompute module changes a computed value;
// - the fused kernel with v's own head size equals the unfused path;
// - what is not built yet is refused with one line.
// The values themselves are checked against the float64 NumPy layer (tests/test_mla_dumps.py)
// and across ranks in test_mpi_layer (MpiMla) and test_mpi_context_parallel.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "layer_harness.hpp"
#include "layers/theory_dims.hpp"
#include "runners/experiment.hpp"
#include "runtime/error.hpp"
#include "theory/layer_pieces.hpp"

using namespace actbench;
using namespace actbench::testing;
using theory::Activation;
using theory::LayerSpec;
using theory::Norm;

namespace {

struct MlaCase {
  std::string name;
  LayerSpec spec;
};

LayerSpec mla_spec(LayerSpec base, double q_rank, double kv_rank, double nope, double rope, double v) {
  base.mla.enabled = true;
  base.mla.q_lora_rank = q_rank;
  base.mla.kv_lora_rank = kv_rank;
  base.mla.qk_head_dim = nope;
  base.mla.qk_pos_emb_head_dim = rope;
  base.mla.v_head_dim = v;
  base.kv_heads = 0;
  return base;
}

// Each MLA option on and off at least once: q's latent or not, LayerNorm and RMSNorm, v's head
// size below, equal to and above k's nope part, dropout, and the MoE block after it.
std::vector<MlaCase> mla_cases() {
  std::vector<MlaCase> out;
  out.push_back({"q latent, RMSNorm, swiglu", mla_spec(theory::llama_layer_spec(0, 48), 6, 5, 4, 2, 3)});
  LayerSpec gpt = theory::gpt_layer_spec();
  gpt.add_bias_linear = false;
  gpt.position = theory::PositionEmbedding::rope;
  gpt.attention_dropout = gpt.hidden_dropout = 0.1;
  out.push_back({"q projected, LayerNorm, gelu, dropout", mla_spec(gpt, 0, 8, 8, 4, 8)});
  LayerSpec moe = mla_spec(theory::llama_layer_spec(0, 48), 12, 6, 6, 2, 10);
  moe.moe.num_experts = 4;
  moe.moe.top_k = 2;
  moe.moe.ffn_hidden = 12;
  out.push_back({"DeepSeek-like: q latent + MoE", moe});
  return out;
}

// Every non-empty subset of core_attn, mlp, layernorm and mla_up_proj.
std::vector<RecomputeModules> module_sets() {
  std::vector<RecomputeModules> out;
  for (int bits = 1; bits < 16; ++bits) {
    RecomputeModules m{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0};
    m.mla_up_proj = (bits & 8) != 0;
    out.push_back(m);
  }
  return out;
}

std::vector<LayerPolicy> policies() {
  std::vector<LayerPolicy> out;
  for (Attention att : {Attention::unfused, Attention::fused}) {
    for (const std::string& name : config_names()) {
      LayerPolicy p = parse_config(name);
      p.attention = att;
      out.push_back(p);
    }
    for (bool sp : {false, true})
      for (RecomputeModules m : module_sets()) out.push_back({Recompute::selective, sp, att, m});
  }
  return out;
}

theory::ByteCategories as_theory(const std::vector<std::pair<std::string, int64_t>>& measured, bool extras) {
  theory::ByteCategories out;
  for (const auto& [name, bytes] : measured)
    if (name.ends_with("_stats") == extras) out.push_back({name, static_cast<double>(bytes)});
  return out;
}

LayerDims mla_dims(const LayerSpec& spec) {
  LayerDims d{8, 2, 32, 4};
  d.spec = spec;
  return d;
}

// Runs every policy at t on the backend and holds its bytes to the pieces.
void expect_pieces(Backend& be, const MlaCase& c, int t, DType dtype) {
  const LayerDims d = mla_dims(c.spec);
  for (const LayerPolicy& p : policies()) {
    if (c.spec.moe.enabled() && t > 1 && !p.sequence_parallel) continue;  // MoE under TP needs SP
    const ExperimentResult r = measure_once(be, d, t, p, dtype);
    const std::string where = c.name + " | " + config_name(p) + " " + recompute_modules_name(p.modules) + " " +
                              attention_name(p.attention) + " t=" + std::to_string(t) + " " + dtype_name(dtype) +
                              " " + be.name();
    ASSERT_EQ(r.status, "ok") << where << ": " << r.message;
    const theory::Dims td = theory_dims(d, t);
    const theory::Precision prec{static_cast<double>(dtype_size(dtype)), 1.0};
    EXPECT_EQ(as_theory(r.act_by_category, false), theory::layer_bytes_by_category(td, d.spec, p, prec)) << where;
    EXPECT_EQ(as_theory(r.act_by_category, true), theory::layer_extra_bytes_by_category(td, d.spec, p)) << where;
    EXPECT_EQ(r.fwd_retained_bytes, r.act_bytes + r.act_extra_bytes) << where;
  }
}

int64_t bytes_of(const ExperimentResult& r, const std::string& category) {
  for (const auto& [name, bytes] : r.act_by_category)
    if (name == category) return bytes;
  return 0;
}

}  // namespace

TEST(MlaLayerMeta, MeasuredBytesEqualThePieces) {
  auto be = make_meta_backend();
  for (const MlaCase& c : mla_cases())
    for (int t : {1, 2, 4})
      for (DType dtype : {DType::bf16, DType::fp32}) expect_pieces(*be, c, t, dtype);
}

// Context parallelism (emulated, rank 0 of C): each rank's latents, k's RoPE part and heads on
// its s/C rows, whatever the comm type; the bytes equal the pieces with C.
TEST(MlaLayerMeta, ContextParallelBytesEqualThePieces) {
  auto be = make_meta_backend();
  LayerDims d = mla_dims(mla_cases()[1].spec);  // q projected, LayerNorm, dropout: all on s/C rows
  d.s = 16;
  d.a = 8;  // a2a: heads over t x C = 8
  for (int C : {2, 4})
    for (CpCommType type : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a})
      for (const std::string config : {"sp", "selective+sp", "full+sp"}) {
        ExperimentSpec spec;
        spec.dims = d;
        spec.policy = parse_config(config);
        spec.policy.attention = type == CpCommType::p2p ? Attention::fused : Attention::unfused;
        spec.policy.cp_comm = type;
        spec.policy.modules.mla_up_proj = true;
        spec.warmup = 0;
        spec.iters = 1;
        auto tp = make_emulated_communicator(2), cp = make_emulated_communicator(C);
        spec.cp_group = cp.get();
        const ExperimentResult r = run_experiment(*be, *tp, spec);
        const std::string where = config + " " + cp_comm_type_name(type) + " C=" + std::to_string(C);
        ASSERT_EQ(r.status, "ok") << where << ": " << r.message;
        theory::Dims td = theory_dims(d, 2);
        td.cp = C;
        EXPECT_EQ(as_theory(r.act_by_category, false), theory::layer_bytes_by_category(td, d.spec, spec.policy))
            << where;
        EXPECT_EQ(as_theory(r.act_by_category, true), theory::layer_extra_bytes_by_category(td, d.spec, spec.policy))
            << where;
      }
}

// The cpu computes every value, routing included: its bytes are held to the same pieces (the
// MoE case routes balanced by chance only, so its pieces take the rows it routed).
TEST(MlaLayerCpu, MeasuredBytesEqualThePieces) {
  auto be = make_cpu_backend();
  for (const MlaCase& c : mla_cases()) {
    if (c.spec.moe.enabled()) continue;  // test_moe_layer holds MoE rows to a measured histogram
    for (int t : {1, 2}) expect_pieces(*be, c, t, DType::fp32);
  }
}

// mla_up_proj drops the latent norms' outputs and q, k, v (counted from the shapes here), and
// keeps k's RoPE part on the whole sequence, under SP too.
TEST(MlaLayerEffects, UpProjFreesTheUpProjectionsInputsAndHeads) {
  auto be = make_meta_backend();
  const LayerDims d = mla_dims(mla_cases()[0].spec);  // L_q 6, L_kv 5, d_qk 4 + 2, d_v 3, a 4
  const int64_t e = 2, sb = d.s * d.b, t = 2;
  for (bool sp : {false, true}) {
    const int64_t rows = sp ? sb / t : sb;  // the norm region's
    RecomputeModules up{false, false, false};
    up.mla_up_proj = true;
    const ExperimentResult kept = measure_once(*be, d, t, {Recompute::none, sp, Attention::unfused, {}}, DType::bf16);
    const ExperimentResult rebuilt =
        measure_once(*be, d, t, {Recompute::selective, sp, Attention::unfused, up}, DType::bf16);
    const std::string where = sp ? "sp" : "no sp";
    EXPECT_EQ(bytes_of(kept, "q_up_input"), e * rows * 6) << where;
    EXPECT_EQ(bytes_of(kept, "kv_up_input"), e * rows * 5) << where;
    EXPECT_EQ(bytes_of(kept, "q"), e * sb * (d.a / t) * 6) << where;
    EXPECT_EQ(bytes_of(kept, "v"), e * sb * (d.a / t) * 3) << where;
    EXPECT_EQ(bytes_of(kept, "k_pos_emb"), 0) << where;
    for (const char* gone : {"q_up_input", "kv_up_input", "q", "k", "v", "q_latent_norm_stats", "kv_latent_norm_stats"})
      EXPECT_EQ(bytes_of(rebuilt, gone), 0) << where << " " << gone;
    for (const char* still : {"q_latent", "kv_latent", "softmax_out", "proj_input"})
      EXPECT_EQ(bytes_of(rebuilt, still), bytes_of(kept, still)) << where << " " << still;
    EXPECT_EQ(bytes_of(rebuilt, "k_pos_emb"), e * sb * 2) << where;  // all s rows: gathered before the checkpoint
    EXPECT_EQ(kept.act_bytes - rebuilt.act_bytes,
              e * rows * (6 + 5) + e * sb * (d.a / t) * (6 + 6 + 3) - e * sb * 2)
        << where;
  }
}

// Whatever is rebuilt, backward computes exactly what it computes from kept tensors: every
// output and gradient bit for bit, dropout on, for every module set and full recompute, unfused
// and fused.
TEST(MlaLayerEffects, RecomputeChangesNoValue) {
  auto be = make_cpu_backend();
  auto local = make_local_communicator();
  for (const MlaCase& c : mla_cases())
    for (Attention att : {Attention::unfused, Attention::fused}) {
    ExperimentSpec ref = small_spec("baseline", DType::fp32, 0.1f, mla_dims(c.spec));
    ref.policy.attention = att;
    // The routing decision is dumped only while forward keeps it (not under full recompute).
    auto without_topk = [](std::vector<CanonicalTensor> v) {
      std::erase_if(v, [](const CanonicalTensor& t) { return t.name.starts_with("moe.topk"); });
      return v;
    };
    const auto expected = without_topk(run_layer_canonical(*be, *local, ref));
    std::vector<LayerPolicy> runs = {{Recompute::full, false, att, {}}};
    for (RecomputeModules m : module_sets()) runs.push_back({Recompute::selective, false, att, m});
    for (const LayerPolicy& p : runs) {
      ExperimentSpec spec = ref;
      spec.policy = p;
      expect_same_tensors(without_topk(run_layer_canonical(*be, *local, spec)), expected, 0, 0,
                          c.name + " " + config_name(p) + " " + recompute_modules_name(p.modules) + " " +
                              attention_name(att));
    }
  }
}

// The fused kernel with v's own head size computes the unfused path's attention (dropout's mask
// from the same Philox counters): every output and gradient within float rounding.
TEST(MlaLayerCpu, FusedAttentionEqualsUnfused) {
  auto be = make_cpu_backend();
  auto local = make_local_communicator();
  for (const MlaCase& c : mla_cases()) {
    ExperimentSpec unfused = small_spec("baseline", DType::fp32, 0.1f, mla_dims(c.spec));
    ExperimentSpec fused = unfused;
    fused.policy.attention = Attention::fused;
    expect_same_tensors(run_layer_canonical(*be, *local, fused), run_layer_canonical(*be, *local, unfused), 1e-6,
                        1e-4, c.name);
  }
}

// What MLA is not built for yet: one line each, naming the flag.
TEST(MlaLayerRefusals, OneLineEach) {
  auto be = make_meta_backend();
  const LayerSpec ok = mla_cases()[0].spec;
  auto refusal = [&](LayerSpec spec, LayerPolicy p) -> std::string {
    try {
      validate_layer(mla_dims(spec), 1, p);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  const LayerPolicy unfused{};
  EXPECT_EQ(refusal(ok, unfused), "");
  EXPECT_EQ(refusal(ok, {Recompute::none, false, Attention::fused, {}}), "");
  LayerSpec gqa = ok;
  gqa.kv_heads = 2;
  EXPECT_NE(refusal(gqa, unfused).find("--num-query-groups"), std::string::npos);
  LayerSpec bias = ok;
  bias.add_bias_linear = true;
  EXPECT_NE(refusal(bias, unfused).find("--disable-bias-linear"), std::string::npos);
  LayerSpec no_rope = ok;
  no_rope.position = theory::PositionEmbedding::none;
  EXPECT_NE(refusal(no_rope, unfused).find("rope"), std::string::npos);
  LayerSpec partial = ok;
  partial.rotary_percent = 0.5;
  EXPECT_NE(refusal(partial, unfused).find("--rotary-percent 1"), std::string::npos);
}
