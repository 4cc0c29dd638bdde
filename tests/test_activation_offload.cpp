// theory/activation_offload and its schedule in theory/step_memory: each offload group's bytes
// against the closed forms of the categories its module saves, the size threshold per tensor,
// which micro-batches keep their last layer's groups on the GPU under 1F1B, and the launch
// script's flags (Megatron's names, its refusals).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "runners/megatron_args.hpp"
#include "megatron_script.hpp"
#include "runtime/error.hpp"
#include "theory/activation_offload.hpp"
#include "theory/step_memory.hpp"

using namespace actbench;
using namespace actbench::theory;

namespace {

double bytes_of(const LayerOffload& o, OffloadModule m) { return o.bytes[static_cast<int>(m)]; }
bool runs(const LayerOffload& o, OffloadModule m) { return o.present[static_cast<int>(m)]; }

ActivationOffload all_modules(double min_elements = 0) {
  ActivationOffload o;
  o.modules.fill(true);
  o.min_tensor_elements = min_elements;
  return o;
}

// A DeepSeek-like layer: multi-latent attention (q latent 96, kv latent 32, heads 16 + 8 wide
// for q and k, 16 for v), a SwiGLU MoE of 8 experts (width 32, top 2) with a shared expert.
LayerSpec mla_moe_spec() {
  LayerSpec s = llama_layer_spec(0, 128);
  s.mla.enabled = true;
  s.mla.q_lora_rank = 96, s.mla.kv_lora_rank = 32, s.mla.qk_head_dim = 16, s.mla.qk_pos_emb_head_dim = 8,
  s.mla.v_head_dim = 16;
  s.moe.num_experts = 8, s.moe.top_k = 2, s.moe.ffn_hidden = 32, s.moe.shared_ffn_hidden = 64;
  return s;
}

Dims dims(double s, double h, double a, double t) {
  Dims d;
  d.s = s, d.b = 1, d.h = h, d.a = a, d.t = t;
  return d;
}

}  // namespace

TEST(ActivationOffload, EachGroupMovesWhatItsModuleSavesByHand) {
  const LayerSpec spec = mla_moe_spec();
  const Dims d = dims(256, 64, 4, 2);
  LayerPolicy c;  // selective as the DeepSeek proxies run it: the norms, the up projections, moe_act
  c.recompute = Recompute::selective, c.sequence_parallel = true;
  c.modules = RecomputeModules{false, false, true};
  c.modules.moe_act = true, c.modules.mla_up_proj = true;
  const LayerOffload o = layer_offload(d, spec, c, Precision{}, all_modules());
  // e = 2, the rank's rows s/t = 128 under SP; balanced routing: 128 x 2 routed rows.
  const double rows = 128, routed = 256;
  EXPECT_EQ(bytes_of(o, OffloadModule::attn_norm), 2 * rows * 64);  // the layer input (its norm is recomputed)
  // the two latents and the RoPE part of k (whole rows), which mla_up_proj's checkpoint keeps
  EXPECT_EQ(bytes_of(o, OffloadModule::qkv_linear), 2 * rows * (96 + 32) + 2 * 256 * 8);
  // unfused, no dropout; q, k, v are rebuilt from the latents: the softmax output, a/t heads
  EXPECT_EQ(bytes_of(o, OffloadModule::core_attn), 2 * 2 * 256.0 * 256);
  EXPECT_EQ(bytes_of(o, OffloadModule::attn_proj), 2 * 256 * 4 * 16 / 2.0);
  EXPECT_EQ(bytes_of(o, OffloadModule::mlp_norm), 2 * rows * 64);
  EXPECT_EQ(bytes_of(o, OffloadModule::expert_fc1), 2 * routed * 64);
  // fc1's output (gate | up) and the rows' weights, moe_act's checkpoint inputs
  EXPECT_EQ(bytes_of(o, OffloadModule::moe_act), 2 * 2 * routed * 32 + 2 * routed);
}

TEST(ActivationOffload, TheThresholdIsPerTensorInElements) {
  LayerSpec spec = llama_layer_spec(0, 4096);
  LayerPolicy c;
  c.sequence_parallel = true;
  ActivationOffload o;
  o.modules[static_cast<int>(OffloadModule::qkv_linear)] = true;  // the fused norm's input rides with QKV
  // s·h/t = 2048 x 1024 / 2: exactly 1024·1024 elements, which move; two rows fewer do not.
  const LayerOffload at = layer_offload(dims(2048, 1024, 8, 2), spec, c, Precision{}, o);
  EXPECT_EQ(bytes_of(at, OffloadModule::qkv_linear), 2 * 2 * 1048576.0);  // ln1_input and qkv_input
  const LayerOffload below = layer_offload(dims(2046, 1024, 8, 2), spec, c, Precision{}, o);
  EXPECT_TRUE(runs(below, OffloadModule::qkv_linear));
  EXPECT_EQ(below.total(), 0);
  // fp32 per-row statistics count their own elements: 4 bytes each, not the activations' 2
  o.min_tensor_elements = 1024;
  const LayerOffload stats = layer_offload(dims(2048, 1024, 8, 2), spec, c, Precision{}, o);
  EXPECT_EQ(bytes_of(stats, OffloadModule::qkv_linear), 2 * 2 * 1048576.0 + 4 * 1024);
}

TEST(ActivationOffload, GroupsALayerDoesNotRunOffloadNothing) {
  const Dims d = dims(256, 64, 4, 2);
  LayerPolicy c;
  c.sequence_parallel = true;
  // A dense layer under Transformer Engine: the norms are inside the QKV GEMM and fc1, no MoE.
  const LayerOffload dense = layer_offload(d, llama_layer_spec(0, 128), c, Precision{}, all_modules());
  for (OffloadModule m : {OffloadModule::attn_norm, OffloadModule::mlp_norm, OffloadModule::expert_fc1,
                          OffloadModule::moe_act})
    EXPECT_FALSE(runs(dense, m)) << offload_module_name(m);
  EXPECT_EQ(bytes_of(dense, OffloadModule::qkv_linear), 2 * 128 * 64 * 2 + 4 * 128);  // ln1_input, its rstd, qkv_input
  // Core attention recomputed: Megatron offloads nothing of it (its checkpoint keeps q, k, v).
  c.recompute = Recompute::selective;  // core_attn, Megatron's default module
  EXPECT_FALSE(runs(layer_offload(d, mla_moe_spec(), c, Precision{}, all_modules()), OffloadModule::core_attn));
  // Full recompute keeps checkpoints only.
  c.recompute = Recompute::full;
  EXPECT_EQ(layer_offload(d, mla_moe_spec(), c, Precision{}, all_modules()).total(), 0);
  ActivationOffload none;
  EXPECT_FALSE(none.enabled());
}

namespace {

TransformerModel offload_model() {
  TransformerModel m;
  m.name = "offload-test";
  m.h = 64, m.a = 4, m.L = 4, m.vocab = 1000, m.seq = 256;
  m.learned_positions = false, m.tied_embeddings = false;
  m.layer = mla_moe_spec();
  m.moe_layers = {true, true, true, true};
  return m;
}

StepConfig offload_config(int p, double global_batch) {
  StepConfig c;
  c.layout.t = 2, c.layout.p = p, c.layout.dp = 4, c.layout.ep = 4, c.layout.etp = 1;
  c.seq = 256, c.micro_batch = 1, c.global_batch = global_batch;
  c.policy.sequence_parallel = true;
  return c;
}

}  // namespace

TEST(StepMemoryOffload, OneStageHoldsItsMicroBatchLessAllButItsLastLayersGroups) {
  const TransformerModel m = offload_model();
  StepConfig c = offload_config(1, 16);
  const double plain = step_memory(m, c)[0].activation_bytes;
  c.offload = all_modules();
  const LayerOffload layer = layer_offload(c.layer_dims(m), m.layer, c.policy, Precision{}, c.offload);
  const ChunkBytes b = chunk_bytes(m, c, 4, true, true);
  EXPECT_DOUBLE_EQ(b.offloaded, 4 * layer.total());
  EXPECT_DOUBLE_EQ(b.offload_tail, layer.total());
  // One stage runs each micro-batch's backward right after its forward: Megatron keeps the last
  // layer's groups on the GPU, the other three layers' wait on the host.
  const StageMemory s = step_memory(m, c)[0];
  EXPECT_EQ(s.microbatches_in_flight, 1);
  EXPECT_DOUBLE_EQ(s.activation_bytes, plain - 3 * layer.total());
}

TEST(StepMemoryOffload, EarlierStagesHoldOneTailAtATime) {
  const TransformerModel m = offload_model();
  StepConfig c = offload_config(2, 16);  // 4 micro-batches per step, two layers a stage
  const std::vector<StageMemory> plain = step_memory(m, c);
  c.offload = all_modules();
  const double layer = layer_offload(c.layer_dims(m), m.layer, c.policy, Precision{}, c.offload).total();
  const std::vector<StageMemory> off = step_memory(m, c);
  // Stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3. F0's backward is the next to run at its forward: it
  // keeps its tail; F1's is not (B0 comes first), but B0's end fetches F1's tail back, so every
  // moment holds one micro-batch with its tail and one without: both less the first layer's
  // groups, one less the second's.
  ASSERT_EQ(off[0].microbatches_in_flight, 2);
  EXPECT_DOUBLE_EQ(off[0].activation_bytes, plain[0].activation_bytes - 3 * layer);
  // The last stage runs each backward right after its forward, as one stage does.
  EXPECT_DOUBLE_EQ(off[1].activation_bytes, plain[1].activation_bytes - layer);
  // Nothing at rest changes.
  EXPECT_EQ(off[0].rest_bytes, plain[0].rest_bytes);
}

TEST(StepMemoryOffload, TheMtpLayerIsTheTail) {
  TransformerModel m = offload_model();
  m.mtp_layers = 1;
  StepConfig c = offload_config(2, 16);
  c.offload = all_modules();
  const double layer = layer_offload(c.layer_dims(m), m.layer, c.policy, Precision{}, c.offload).total();
  const ChunkBytes b = chunk_bytes(m, c, 2, false, true, 2);
  EXPECT_DOUBLE_EQ(b.offloaded, 3 * layer);  // the stage's two layers and the MTP layer
  EXPECT_DOUBLE_EQ(b.mtp_offloaded, layer);
  EXPECT_DOUBLE_EQ(b.offload_tail, layer);
  EXPECT_DOUBLE_EQ(b.tail_in_mtp, layer);
}

namespace {

using actbench::testing::flags_of;

const std::string kBase =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 2 --bf16 ";

}  // namespace

TEST(MegatronArgs, FineGrainedOffloadingFlags) {
  const ActivationOffload read =
      megatron_run(flags_of(kBase + "--fine-grained-activation-offloading --offload-modules core_attn attn_proj "
                                    "--min-offloaded-tensor-size 4096"),
                   std::nullopt, 0)
          .step.offload;
  EXPECT_TRUE(read.on(OffloadModule::core_attn));
  EXPECT_TRUE(read.on(OffloadModule::attn_proj));
  EXPECT_FALSE(read.on(OffloadModule::expert_fc1));
  EXPECT_EQ(read.min_tensor_elements, 4096);
  // Megatron's list without the switch offloads nothing; its default threshold is 1024·1024.
  EXPECT_FALSE(megatron_run(flags_of(kBase + "--offload-modules expert_fc1"), std::nullopt, 0).step.offload.enabled());
  EXPECT_EQ(megatron_run(flags_of(kBase + "--fine-grained-activation-offloading --offload-modules moe_act"),
                         std::nullopt, 0)
                .step.offload.min_tensor_elements,
            1024.0 * 1024);
  for (const char* bad : {"--fine-grained-activation-offloading --offload-modules mlp",
                          "--offload-modules core_attn,shared_fc1",
                          "--fine-grained-activation-offloading --offload-modules attn_proj",
                          "--fine-grained-activation-offloading",
                          "--fine-grained-activation-offloading --offload-modules core_attn --transformer-impl local",
                          "--fine-grained-activation-offloading --offload-modules core_attn "
                          "--min-offloaded-tensor-size -1"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(megatron_run(flags_of(kBase + bad), std::nullopt, 0), InvalidArgument);
  }
}
