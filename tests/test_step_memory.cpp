// theory/step_memory: the at-rest bytes against the parameters counted tensor by tensor as
// Megatron's GPTModel names them, the activations in flight against the pipeline schedule's
// count, the stack closed forms and the peak's bookkeeping; runners/megatron_args: a launch
// script's words, Megatron's defaults and what is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "runners/closed_form.hpp"
#include "runners/megatron_args.hpp"
#include "megatron_script.hpp"
#include "runners/pipeline_layout.hpp"
#include "runtime/error.hpp"
#include "theory/layer_pieces.hpp"
#include "theory/pipeline.hpp"
#include "theory/step_memory.hpp"

using namespace actbench;
using namespace actbench::theory;

namespace {

TransformerModel gpt_model() {
  TransformerModel m;
  m.name = "gpt-test";
  m.h = 512, m.a = 8, m.L = 8, m.vocab = 50257, m.seq = 1024;
  m.learned_positions = true;
  m.tied_embeddings = true;
  m.layer = gpt_layer_spec();
  return m;
}

TransformerModel llama_model() {
  TransformerModel m;
  m.name = "llama-test";
  m.h = 512, m.a = 8, m.L = 8, m.vocab = 32000, m.seq = 1024;
  m.learned_positions = false;
  m.tied_embeddings = false;
  m.layer = llama_layer_spec(2, 1408);
  return m;
}

// Qwen3-like: QK-norm, a head size that is not h/a, QKV bias (Qwen2's), LayerNorm for the
// biases' sake.
TransformerModel odd_model() {
  TransformerModel m = llama_model();
  m.name = "odd-test";
  m.layer.qk_layernorm = true;
  m.layer.kv_channels = 96;
  m.layer.add_qkv_bias = true;
  m.layer.normalization = Norm::layernorm;
  return m;
}

using Tensors = std::vector<std::pair<std::string, int64_t>>;

// One layer's tensors on one tensor-parallel rank, as Megatron-Core's TE spec names them.
void add_layer(const TransformerModel& m, int64_t t, int i, Tensors& out) {
  const int64_t h = int64_t(m.h), a = int64_t(m.a), g = m.layer.kv_heads > 0 ? int64_t(m.layer.kv_heads) : a;
  const int64_t d = m.layer.kv_channels > 0 ? int64_t(m.layer.kv_channels) : h / a;
  const int64_t F = m.layer.ffn_hidden > 0 ? int64_t(m.layer.ffn_hidden) : 4 * h;
  const int64_t fc1 = m.layer.activation == Activation::swiglu ? 2 * F : F;
  const bool ln = m.layer.normalization == Norm::layernorm, bias = m.layer.add_bias_linear;
  const std::string p = "decoder.layers." + std::to_string(i) + ".";
  out.push_back({p + "self_attention.linear_qkv.layer_norm_weight", h});
  if (ln) out.push_back({p + "self_attention.linear_qkv.layer_norm_bias", h});
  out.push_back({p + "self_attention.linear_qkv.weight", (a + 2 * g) * d / t * h});
  if (bias || m.layer.add_qkv_bias) out.push_back({p + "self_attention.linear_qkv.bias", (a + 2 * g) * d / t});
  if (m.layer.qk_layernorm)
    for (const char* n : {"q_layernorm", "k_layernorm"}) {
      out.push_back({p + "self_attention." + n + ".weight", d});
      if (ln) out.push_back({p + "self_attention." + n + ".bias", d});
    }
  out.push_back({p + "self_attention.linear_proj.weight", h * (a * d / t)});
  if (bias) out.push_back({p + "self_attention.linear_proj.bias", h});
  out.push_back({p + "mlp.linear_fc1.layer_norm_weight", h});
  if (ln) out.push_back({p + "mlp.linear_fc1.layer_norm_bias", h});
  out.push_back({p + "mlp.linear_fc1.weight", fc1 / t * h});
  if (bias) out.push_back({p + "mlp.linear_fc1.bias", fc1 / t});
  out.push_back({p + "mlp.linear_fc2.weight", h * (F / t)});
  if (bias) out.push_back({p + "mlp.linear_fc2.bias", h});
}

int64_t padded(int64_t vocab, int64_t multiple) { return (vocab + multiple - 1) / multiple * multiple; }

// Stage `stage`'s tensors: its layers (assigned as given), the embedding on stage 0, the final
// norm and output layer on the last (the tied one shared only when both are on one rank).
Tensors stage_tensors(const TransformerModel& m, int64_t t, int p, int stage, const std::vector<int>& layers_of_stage) {
  Tensors out;
  const int64_t h = int64_t(m.h), V = padded(int64_t(m.vocab), 128 * t);
  int first_layer = 0;
  for (int k = 0; k < stage; ++k) first_layer += layers_of_stage[k];
  for (int i = 0; i < layers_of_stage[stage]; ++i) add_layer(m, t, first_layer + i, out);
  if (stage == 0) {
    out.push_back({"embedding.word_embeddings.weight", V / t * h});
    if (m.learned_positions) out.push_back({"embedding.position_embeddings.weight", int64_t(m.seq) * h});
  }
  if (stage == p - 1) {
    out.push_back({"decoder.final_layernorm.weight", h});
    if (m.layer.normalization == Norm::layernorm) out.push_back({"decoder.final_layernorm.bias", h});
    if (!m.tied_embeddings || p > 1) out.push_back({"output_layer.weight", V / t * h});
  }
  return out;
}

double numel(const Tensors& ts) {
  double n = 0;
  for (const auto& [name, count] : ts) n += double(count);
  return n;
}

StepConfig config(int t, int p, int dp, double global_batch) {
  StepConfig c;
  c.layout.t = t, c.layout.p = p, c.layout.dp = dp;
  c.seq = 1024, c.micro_batch = 1, c.global_batch = global_batch;
  return c;
}

struct RestCase {
  TransformerModel model;
  StepConfig config;
  std::vector<int> layers_of_stage;
};

}  // namespace

TEST(StepMemory, RestIsTheStageParametersCountedTensorByTensorTimesTheirBytes) {
  std::vector<RestCase> cases;
  cases.push_back({gpt_model(), config(1, 1, 1, 4), {8}});
  cases.push_back({gpt_model(), config(2, 2, 2, 8), {4, 4}});
  cases.push_back({llama_model(), config(2, 2, 2, 8), {4, 4}});
  cases.push_back({odd_model(), config(2, 4, 1, 8), {2, 2, 2, 2}});
  RestCase uneven{llama_model(), config(2, 3, 1, 6), {2, 4, 2}};
  uneven.config.layout.first_stage_layers = 2, uneven.config.layout.last_stage_layers = 2;
  cases.push_back(uneven);
  RestCase distributed{odd_model(), config(1, 2, 4, 16), {4, 4}};
  distributed.config.distributed_optimizer = true;
  cases.push_back(distributed);
  RestCase fp32{gpt_model(), config(2, 2, 2, 8), {4, 4}};
  fp32.config.precision = {4, 4, 4, 0, 8};
  cases.push_back(fp32);
  RestCase interleaved{llama_model(), config(2, 2, 1, 8), {4, 4}};
  interleaved.config.layout.vp = 2;
  cases.push_back(interleaved);
  for (const RestCase& k : cases) {
    const StepConfig& c = k.config;
    const std::vector<StageMemory> stages = step_memory(k.model, c);
    ASSERT_EQ(int(stages.size()), c.layout.p);
    for (int stage = 0; stage < c.layout.p; ++stage) {
      SCOPED_TRACE(k.model.name + " t=" + std::to_string(c.layout.t) + " p=" + std::to_string(c.layout.p) +
                   " stage " + std::to_string(stage));
      const double n = numel(stage_tensors(k.model, c.layout.t, c.layout.p, stage, k.layers_of_stage));
      const TrainingPrecision& b = c.precision;
      const double expected = n * (b.weight + b.grad) +
                              n * (b.master + b.optimizer_state) / (c.distributed_optimizer ? c.layout.dp : 1);
      EXPECT_EQ(stages[stage].parameters, n);
      EXPECT_EQ(stages[stage].layers, k.layers_of_stage[stage]);
      EXPECT_DOUBLE_EQ(stages[stage].rest_bytes, expected);
      EXPECT_DOUBLE_EQ(stages[stage].rest_bytes,
                       stages[stage].weight_bytes + stages[stage].grad_bytes + stages[stage].optimizer_bytes);
    }
  }
}

TEST(StepMemory, ActivationsInFlightAreTheScheduleCountTimesTheLayerBytes) {
  const TransformerModel m = llama_model();
  for (const int vp : {1, 2})
    for (const char* name : {"baseline", "selective+sp", "full+sp"})
      for (const Attention attention : {Attention::unfused, Attention::fused}) {
        StepConfig c = config(2, 2, 1, 8);
        c.layout.vp = vp;
        c.policy = parse_config(name);
        c.policy.attention = attention;
        SCOPED_TRACE(std::string(name) + " vp=" + std::to_string(vp));
        const std::vector<int> in_flight = max_in_flight(pipeline_order(2, 8, vp));
        const Dims d = m.dims(c.seq, c.micro_batch, 2);
        const double layer = layer_bytes(d, m.layer, c.policy) + layer_extra_bytes(d, m.layer, c.policy);
        const double chunk_layers = m.L / (2.0 * vp);
        for (const StageMemory& s : step_memory(m, c)) {
          // At the embedding's backward the micro-batch's own layers are freed already.
          const bool at_lookup = s.peak_at.find("(embedding)") != std::string::npos;
          EXPECT_EQ(s.microbatches_in_flight, in_flight[s.stage] - (at_lookup ? 1 : 0)) << s.peak_at;
          EXPECT_DOUBLE_EQ(s.activation_bytes, s.microbatches_in_flight * chunk_layers * layer);
          const double terms = s.activation_bytes + s.embedding_bytes + s.output_bytes + s.recompute_working_set_bytes +
                               s.grad_working_set_bytes + s.loss_working_set_bytes + s.embedding_grad_bytes;
          EXPECT_DOUBLE_EQ(s.step_peak_bytes, s.rest_bytes + terms);
          EXPECT_DOUBLE_EQ(s.peak_bytes, std::max(s.step_peak_bytes, s.setup_peak_bytes));
        }
      }
}

TEST(StepMemory, FullRecomputeChunksKeepWhatTheStackClosedFormSays) {
  const TransformerModel m = gpt_model();
  for (const RecomputeMethod method : {RecomputeMethod::uniform, RecomputeMethod::block})
    for (const int n : {1, 3, 4}) {
      StepConfig c = config(2, 1, 1, 2);
      c.policy = parse_config("full+sp");
      c.stack = {method, n};
      ExperimentSpec spec;
      spec.dims.s = 1024, spec.dims.b = 1, spec.dims.h = 512, spec.dims.a = 8;
      spec.dims.spec = m.layer;
      spec.policy = c.policy;
      spec.layers = 8;
      spec.stack = c.stack;
      SCOPED_TRACE(std::string(recompute_method_name(method)) + " " + std::to_string(n));
      // block's kept layers also keep their norms' statistics, outside the paper's count.
      LayerPolicy all = c.policy;
      all.recompute = Recompute::none;
      const double stats = method == RecomputeMethod::block ? (8 - n) * layer_extra_bytes(m.dims(1024, 1, 2), m.layer, all) : 0;
      EXPECT_DOUBLE_EQ(chunk_bytes(m, c, 8, false, false).layers, stack_formula_bytes(spec, 2) + stats);
    }
}

TEST(StepMemory, FirstStageHoldsMoreMicroBatchesThanTheLastWhichHoldsTheLoss) {
  const TransformerModel m = llama_model();
  StepConfig c = config(1, 4, 1, 16);
  c.policy = parse_config("selective");
  const std::vector<StageMemory> s = step_memory(m, c);
  EXPECT_EQ(s[0].microbatches_in_flight, 4);
  EXPECT_EQ(s[3].microbatches_in_flight, 1);
  EXPECT_GT(s[0].embedding_bytes, 0);
  EXPECT_EQ(s[0].output_bytes, 0);
  EXPECT_GT(s[3].output_bytes, 4 * c.seq * 32000);  // the fp32 softmax over the whole vocabulary
  EXPECT_GT(s[3].loss_working_set_bytes, 0);
  EXPECT_EQ(s[1].embedding_bytes + s[1].output_bytes, 0);
}

// The last chunk's first backward is two moments: the loss's backward (its fp32 softmax, the
// 16-bit logits' gradient) and then the chunk's last layer (the loss's and the output layer's
// bytes released, the layer's gradients held). The peak is the larger of the two, never their
// sum: short sequences put it at the loss, long ones with unfused attention at the layer.
TEST(StepMemory, TheLossAndTheLastLayersBackwardAreSeparateMoments) {
  const TransformerModel m = gpt_model();
  for (const double seq : {256.0, 32768.0}) {
    StepConfig c = config(1, 1, 1, 1);
    c.seq = seq;
    c.policy.attention = Attention::unfused;
    SCOPED_TRACE("seq " + std::to_string(seq));
    const StageMemory s = step_memory(m, c).front();
    const int L = static_cast<int>(m.L);
    const ChunkBytes live = chunk_bytes(m, c, L, true, true);
    const ChunkTransients layer = chunk_transients(m, c, L, L - 1);
    const double logits = 2.0 * seq * 50304;  // bf16, the vocabulary padded to 128
    const double at_loss = live.total() + logits, at_layer = live.layers + live.embedding + layer.grads;
    EXPECT_DOUBLE_EQ(s.step_peak_bytes - s.rest_bytes, std::max(at_loss, at_layer));
    if (at_loss > at_layer) {
      EXPECT_EQ(s.loss_working_set_bytes, logits);
      EXPECT_EQ(s.grad_working_set_bytes, 0);
    } else {
      EXPECT_EQ(s.peak_at, "backward mb 0 chunk 0");
      EXPECT_EQ(s.output_bytes + s.loss_working_set_bytes, 0);
      EXPECT_EQ(s.grad_working_set_bytes, layer.grads);
    }
  }
  StepConfig shorter = config(1, 1, 1, 1), longer = shorter;
  shorter.seq = 256, longer.seq = 32768;
  shorter.policy.attention = longer.policy.attention = Attention::unfused;
  EXPECT_GT(step_memory(m, shorter).front().loss_working_set_bytes, 0);  // both moments are reached
  EXPECT_GT(step_memory(m, longer).front().grad_working_set_bytes, 0);
}

TEST(StepMemory, TheDistributedOptimizersSetupCanBeTheRunsPeak) {
  // 32 data-parallel ranks, full recompute, short sequences: Adam's state is 12/32 bytes per
  // parameter, less than the second copy of the weights while DDP fills its buffer.
  const TransformerModel m = llama_model();
  StepConfig c = config(1, 1, 32, 32);
  c.seq = 128;
  c.policy = parse_config("full");
  c.distributed_optimizer = true;
  const StageMemory s = step_memory(m, c).front();
  EXPECT_DOUBLE_EQ(s.setup_peak_bytes, 2 * 2 * s.parameters + 4 * s.parameters);
  EXPECT_GT(s.setup_peak_bytes, s.step_peak_bytes);
  EXPECT_EQ(s.peak_bytes, s.setup_peak_bytes);
  c.distributed_optimizer = false;  // no parameter buffer: the step is the peak
  const StageMemory replicated = step_memory(m, c).front();
  EXPECT_DOUBLE_EQ(replicated.setup_peak_bytes, replicated.weight_bytes + replicated.grad_bytes);
  EXPECT_EQ(replicated.peak_bytes, replicated.step_peak_bytes);
}

TEST(StepMemory, VirtualAndUnevenStagesAsMegatronAssignsLayers) {
  TransformerModel m = llama_model();
  m.L = 10;
  StepLayout l;
  l.p = 3, l.first_stage_layers = 2, l.last_stage_layers = 4;
  EXPECT_EQ(virtual_stage_layers(m, l), (std::vector<int>{2, 4, 4}));
  l = {};
  l.p = 2, l.vp = 3, l.embedding_in_split = true, l.loss_in_split = true;
  m.L = 10;  // 12 "layers" over 6 virtual stages
  EXPECT_EQ(virtual_stage_layers(m, l), (std::vector<int>{1, 2, 2, 2, 2, 1}));
  l = {};
  l.p = 3;
  EXPECT_THROW(virtual_stage_layers(m, l), InvalidArgument);  // 10 layers over 3 stages
  l.vp = 2, l.p = 1;
  EXPECT_THROW(virtual_stage_layers(m, l), InvalidArgument);  // virtual stages without a pipeline
}

TEST(StepMemory, BadLayoutsAreOneLine) {
  const TransformerModel m = llama_model();
  StepConfig c = config(3, 1, 1, 1);  // 3 does not divide the heads
  EXPECT_THROW(step_memory(m, c), InvalidArgument);
  c = config(2, 2, 2, 3);  // 3 sequences over 2 data-parallel ranks
  EXPECT_THROW(step_memory(m, c), InvalidArgument);
  c = config(2, 2, 1, 6);
  c.layout.vp = 2;  // 6 micro-batches, not a multiple of p = 4? p = 2: fine; vp needs N % p
  EXPECT_NO_THROW(step_memory(m, c));
  c = config(2, 4, 1, 6);
  c.layout.vp = 2;
  EXPECT_THROW(step_memory(m, c), InvalidArgument);
}

// ---- Megatron-FSDP and hybrid replicas ----

// Each level shards one more kind of state over the data-parallel group: the bytes are the
// tensor-by-tensor count times its bytes, divided where the level says.
TEST(StepMemoryFsdp, EachLevelDividesItsStateByTheDataParallelSize) {
  const TransformerModel m = llama_model();
  const std::vector<int> layers = {4, 4};
  for (const DpShard level : {DpShard::none, DpShard::optimizer, DpShard::gradients, DpShard::parameters}) {
    SCOPED_TRACE(dp_shard_name(level));
    StepConfig c = config(2, 2, 4, 16);
    c.sharding.fsdp = true, c.sharding.level = level;
    const TrainingPrecision& b = c.precision;
    const std::vector<StageMemory> stages = step_memory(m, c);
    for (int stage = 0; stage < 2; ++stage) {
      const double n = numel(stage_tensors(m, 2, 2, stage, layers));
      const StageMemory& s = stages[stage];
      EXPECT_DOUBLE_EQ(s.weight_bytes, b.weight * n / (level >= DpShard::parameters ? 4 : 1));
      EXPECT_DOUBLE_EQ(s.grad_bytes, b.grad * n / (level >= DpShard::gradients ? 4 : 1));
      EXPECT_DOUBLE_EQ(s.optimizer_bytes, (b.master + b.optimizer_state) * n / (level >= DpShard::optimizer ? 4 : 1));
    }
  }
}

// With the weights sharded every op holds the stage's non-layer weights and two layers' whole;
// with the gradients sharded a backward holds one layer's 16-bit gradients, and on the last
// stage the output layer's and the final norm's.
TEST(StepMemoryFsdp, UnshardedCopiesAreTheRootAndTwoLayersWeightsAndOneLayersGradients) {
  const TransformerModel m = llama_model();
  const std::vector<int> layers = {4, 4};
  Tensors one_layer;
  add_layer(m, 2, 0, one_layer);
  const double layer = numel(one_layer);
  for (const DpShard level : {DpShard::optimizer, DpShard::gradients, DpShard::parameters}) {
    SCOPED_TRACE(dp_shard_name(level));
    StepConfig c = config(2, 2, 4, 16);
    c.sharding.fsdp = true, c.sharding.level = level;
    const std::vector<StageMemory> stages = step_memory(m, c);
    for (int stage = 0; stage < 2; ++stage) {
      const StageMemory& s = stages[stage];
      const double root = numel(stage_tensors(m, 2, 2, stage, layers)) - 4 * layer;
      const bool backward = s.peak_at.rfind("backward", 0) == 0;
      const double output = stage == 1 ? padded(int64_t(m.vocab), 256) / 2 * m.h + m.h : 0;  // and the final norm
      EXPECT_DOUBLE_EQ(s.fsdp_gathered_weight_bytes, level == DpShard::parameters ? 2 * (root + 2 * layer) : 0);
      EXPECT_DOUBLE_EQ(s.fsdp_unsharded_grad_bytes,
                       level >= DpShard::gradients && backward ? 2 * (layer + (s.peak_at.find("chunk 0") != std::string::npos ? output : 0)) : 0)
          << s.peak_at;
      EXPECT_DOUBLE_EQ(s.step_peak_bytes, s.rest_bytes + s.activation_bytes + s.embedding_bytes + s.output_bytes +
                                              s.working_set_bytes());
    }
  }
  // Megatron's DDP holds no such copies, distributed optimizer or not.
  StepConfig ddp = config(2, 2, 4, 16);
  ddp.distributed_optimizer = true;
  for (const StageMemory& s : step_memory(m, ddp)) {
    EXPECT_EQ(s.fsdp_gathered_weight_bytes, 0);
    EXPECT_EQ(s.fsdp_unsharded_grad_bytes, 0);
  }
}

// Hybrid sharding: each level shards within one of the replicas; the outer strategy optim
// spreads the optimizer state over all of them. The experts' own group splits the same way.
TEST(StepMemoryFsdp, ReplicasShardWithinOneAndTheOuterOptimSpreadsTheState) {
  TransformerModel m = llama_model();
  m.layer.moe.num_experts = 8, m.layer.moe.top_k = 2, m.layer.moe.ffn_hidden = 256;
  m.moe_layers.assign(8, true);
  StepConfig c = config(1, 1, 8, 8);
  c.layout.ep = 2;
  c.sharding.fsdp = true, c.sharding.level = DpShard::parameters;
  const StageMemory whole = step_memory(m, c).front();
  const double experts = whole.expert_parameters, dense = whole.parameters - experts;
  const double state = c.precision.master + c.precision.optimizer_state;
  EXPECT_DOUBLE_EQ(whole.weight_bytes, 2 * (dense / 8 + experts / 4));
  c.sharding.instances = 2;
  const StageMemory hsdp = step_memory(m, c).front();
  EXPECT_DOUBLE_EQ(hsdp.weight_bytes, 2 * (dense / 4 + experts / 2));
  EXPECT_DOUBLE_EQ(hsdp.grad_bytes, 4 * (dense / 4 + experts / 2));
  EXPECT_DOUBLE_EQ(hsdp.optimizer_bytes, state * (dense / 4 + experts / 2));
  c.sharding.outer_optimizer = true;
  EXPECT_DOUBLE_EQ(step_memory(m, c).front().optimizer_bytes, state * (dense / 8 + experts / 2));
  c.sharding.expert_outer_optimizer = true;
  EXPECT_DOUBLE_EQ(step_memory(m, c).front().optimizer_bytes, state * (dense / 8 + experts / 4));
  // The distributed optimizer with instances shards its state within one replica.
  StepConfig ddp = config(1, 1, 8, 8);
  ddp.layout.ep = 2, ddp.distributed_optimizer = true, ddp.sharding.instances = 2;
  EXPECT_DOUBLE_EQ(step_memory(m, ddp).front().optimizer_bytes, state * (dense / 4 + experts / 2));
  for (const int instances : {0, 3, 8}) {
    ddp.sharding.instances = instances;
    SCOPED_TRACE(instances);
    EXPECT_THROW(step_memory(m, ddp), InvalidArgument);  // 8 does not divide the experts' group of 4
  }
  c.sharding.instances = 1;
  EXPECT_THROW(step_memory(m, c), InvalidArgument);  // an outer strategy needs replicas
}

// ---- runners/megatron_args ----

namespace {

using actbench::testing::flags_of;

const char* const kLlamaScript = R"(#!/bin/bash
# a comment --num-layers 99
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096
    --num-attention-heads 32 --group-query-attention --num-query-groups 8
    --swiglu --normalization RMSNorm --disable-bias-linear
    --position-embedding-type rope --untie-embeddings-and-output-weights
)
torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py ${MODEL_ARGS[@]} \
    --seq-length 4096 --max-position-embeddings 4096 \
    --tokenizer-type NullTokenizer --vocab-size 128255 \
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --sequence-parallel \
    --micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer \
    --recompute-granularity selective --recompute-modules core_attn mlp \
    --data-path "$DATA" --lr 3e-4 --eval-interval=1000 --no-masked-softmax-fusion
)";

}  // namespace

TEST(MegatronArgs, ShellWordsKeepQuotesJoinLinesAndDropComments) {
  EXPECT_EQ(shell_words("a 'b c' \"d e\" \\\n f # g h\n--x=1", "t"),
            (std::vector<std::string>{"a", "b c", "d e", "f", "--x=1"}));
  EXPECT_THROW(shell_words("--a 'open", "t"), InvalidArgument);
}

TEST(MegatronArgs, ALaunchScriptWithMegatronsDefaults) {
  const MegatronRun r = megatron_run(flags_of(kLlamaScript), std::nullopt, 0);
  const TransformerModel& m = r.model;
  EXPECT_EQ(m.L, 32);
  EXPECT_EQ(m.h, 4096);
  EXPECT_EQ(m.layer.kv_heads, 8);
  EXPECT_EQ(m.layer.ffn_hidden, 10880);  // SwiGLU's default: 2/3 of 4h down to a multiple of 64
  EXPECT_EQ(m.layer.normalization, Norm::rmsnorm);
  EXPECT_FALSE(m.layer.add_bias_linear);
  EXPECT_EQ(m.layer.position, PositionEmbedding::rope);
  EXPECT_FALSE(m.learned_positions);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.vocab, 128256);  // NullTokenizer adds its end-of-document id
  EXPECT_EQ(padded_vocab(m, 4), 128512);
  EXPECT_EQ(m.layer.attention_dropout, 0.1);  // Megatron's default
  EXPECT_EQ(r.world_size, 16);
  EXPECT_EQ(r.step.layout.t, 4);
  EXPECT_EQ(r.step.layout.p, 2);
  EXPECT_EQ(r.step.layout.dp, 2);
  EXPECT_EQ(r.step.microbatches(), 32);
  EXPECT_TRUE(r.step.policy.sequence_parallel);
  EXPECT_EQ(r.step.policy.recompute, Recompute::selective);
  EXPECT_EQ(r.step.policy.modules, (RecomputeModules{true, true, false}));
  EXPECT_EQ(r.step.policy.attention, Attention::fused);  // Transformer Engine's attention
  EXPECT_TRUE(r.step.distributed_optimizer);
  EXPECT_EQ(r.step.precision.grad, 4);
}

TEST(MegatronArgs, LaterFlagsWinAndGpusOverrideTheLauncher) {
  MegatronFlags f = flags_of(kLlamaScript);
  apply_megatron_words({"--tensor-model-parallel-size", "2", "--recompute-granularity", "full", "--recompute-method",
                        "uniform", "--recompute-num-layers", "2"},
                       true, "cli", f);
  const MegatronRun r = megatron_run(f, std::nullopt, 8);
  EXPECT_EQ(r.step.layout.t, 2);
  EXPECT_EQ(r.step.layout.dp, 2);
  EXPECT_EQ(r.step.policy.recompute, Recompute::full);
  EXPECT_EQ(r.step.stack, (StackRecompute{RecomputeMethod::uniform, 2}));
}

TEST(MegatronArgs, PrecisionAndOptimizerBytes) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 1 ";
  auto precision = [&](const std::string& extra) { return megatron_run(flags_of(base + extra), std::nullopt, 0).step.precision; };
  TrainingPrecision p = precision("");
  EXPECT_EQ(p.weight, 4);
  EXPECT_EQ(p.master, 0);
  p = precision("--fp16");
  EXPECT_EQ(p.grad, 2);
  p = precision("--fp16 --accumulate-allreduce-grads-in-fp32");
  EXPECT_EQ(p.grad, 4);
  p = precision("--bf16 --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16");
  EXPECT_EQ(p.optimizer_state, 4);
  p = precision("--bf16 --optimizer sgd");
  EXPECT_EQ(p.optimizer_state, 4);
  EXPECT_EQ(megatron_run(flags_of(base + "--tokenizer-type GPT2BPETokenizer"), std::nullopt, 0).model.vocab, 50257);
  EXPECT_EQ(megatron_run(flags_of(base + "--transformer-impl local"), std::nullopt, 0).step.policy.attention,
            Attention::unfused);
}

TEST(MegatronArgs, MegatronFsdpFlags) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 8 --bf16 ";
  auto run = [&](const std::string& extra) { return megatron_run(flags_of(base + extra), std::nullopt, 0).step; };
  StepConfig c = run("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params "
                     "--num-distributed-optimizer-instances 2 --outer-dp-sharding-strategy optim");
  EXPECT_TRUE(c.sharding.fsdp);
  EXPECT_EQ(c.sharding.level, DpShard::parameters);
  EXPECT_EQ(c.sharding.instances, 2);
  EXPECT_TRUE(c.sharding.outer_optimizer);
  EXPECT_FALSE(c.sharding.expert_outer_optimizer);
  EXPECT_EQ(c.precision.grad, 4);  // bf16 training accumulates main grads in fp32
  EXPECT_EQ(run("--use-custom-fsdp").sharding.level, DpShard::none);  // Megatron's default strategy
  EXPECT_TRUE(run("--use-custom-fsdp").sharding.fsdp);
  EXPECT_EQ(run("--use-megatron-fsdp --megatron-fsdp-main-grads-dtype bf16").precision.grad, 2);
  EXPECT_EQ(run("--use-megatron-fsdp --megatron-fsdp-main-params-dtype fp16").precision.master, 2);
  EXPECT_EQ(run("--grad-reduce-in-bf16").precision.grad, 2);
  EXPECT_EQ(run("--use-distributed-optimizer --num-distributed-optimizer-instances 4").sharding.instances, 4);
  for (const char* bad : {"--use-megatron-fsdp --data-parallel-sharding-strategy zero3",
                          "--use-megatron-fsdp --outer-dp-sharding-strategy optim_grads",
                          "--use-megatron-fsdp --num-distributed-optimizer-instances 0",
                          "--use-megatron-fsdp --megatron-fsdp-version 3", "--use-torch-fsdp2",
                          "--use-megatron-fsdp --megatron-fsdp-main-grads-dtype fp64"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(run(bad), InvalidArgument);
  }
}

TEST(MegatronArgs, CrossEntropyFusionAndTheLocalSoftmax) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 8 --bf16 ";
  auto run = [&](const std::string& extra) { return megatron_run(flags_of(base + extra), std::nullopt, 0); };
  EXPECT_EQ(run("").step.cross_entropy, CrossEntropyFusion::none);
  EXPECT_EQ(run("--cross-entropy-fusion-impl te").step.cross_entropy, CrossEntropyFusion::none);  // no fusion asked
  EXPECT_EQ(run("--cross-entropy-loss-fusion").step.cross_entropy, CrossEntropyFusion::native);
  EXPECT_EQ(run("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te").step.cross_entropy, CrossEntropyFusion::te);
  EXPECT_THROW(run("--cross-entropy-loss-fusion --cross-entropy-fusion-impl triton"), InvalidArgument);
  const std::string local = "--transformer-impl local --no-masked-softmax-fusion ";
  EXPECT_TRUE(run(local + "--attention-softmax-in-fp32").model.layer.megatron_fp32_torch_softmax);
  EXPECT_TRUE(run(local + "--apply-query-key-layer-scaling").model.layer.megatron_fp32_torch_softmax);
  EXPECT_FALSE(run(local).model.layer.megatron_fp32_torch_softmax);  // a 16-bit softmax keeps 16 bits
  EXPECT_FALSE(run("--no-masked-softmax-fusion --attention-softmax-in-fp32 --attention-backend unfused")
                   .model.layer.megatron_fp32_torch_softmax);  // Transformer Engine's softmax
}

// The local attention's scores buffer stays allocated beside the library workspaces: bf16
// [b·a/t, s, s] = 2 x 2·2·128·128, or under SP the gathered input [s, b, h] if larger.
TEST(MegatronArgs, LocalAttentionKeepsItsScoresBuffer) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 8 "
                           "--bf16 --seq-length 128 --micro-batch-size 2 --tensor-model-parallel-size 2 ";
  auto workspace = [&](const std::string& extra) {
    return megatron_run(flags_of(base + extra), std::nullopt, 0).step.workspace_bytes;
  };
  const double MiB = 1024.0 * 1024;
  EXPECT_EQ(workspace(""), 96 * MiB);  // Transformer Engine's attention allocates per call
  EXPECT_EQ(workspace("--transformer-impl local"), 64 * MiB + 2.0 * 2 * 2 * 128 * 128);
  EXPECT_EQ(workspace("--transformer-impl local --sequence-parallel --hidden-size 1024 --ffn-hidden-size 1024"),
            64 * MiB + 2.0 * 128 * 2 * 1024);  // the gathered input is the larger request
  // The allgather dispatcher gathers its tokens (s·b/t rows under SP) over etp·ep = 2·2 ranks
  // into the same buffer; the alltoall dispatcher does not.
  const std::string moe = "--sequence-parallel --num-experts 4 --expert-model-parallel-size 2 ";
  EXPECT_EQ(workspace(moe), 96 * MiB + 2.0 * (128 * 2 / 2) * 4 * 64);
  EXPECT_EQ(workspace(moe + "--moe-token-dispatcher-type alltoall"), 96 * MiB);
}

// The library workspaces at the GPU's sizes: Transformer Engine's 32 MiB from compute capability
// 9.0 and 4 MiB before, PyTorch's two at CUBLAS_WORKSPACE_CONFIG's size or the default for the
// architecture; the grouped GEMM adds one of Transformer Engine's per stream (4).
TEST(MegatronArgs, LibraryWorkspacesAreSizedForTheGpu) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 8 "
                           "--bf16 --sequence-parallel --tensor-model-parallel-size 2 --num-experts 4 "
                           "--expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall ";
  const double KiB = 1024, MiB = 1024 * KiB;
  const Gpu& a100 = gpu("a100");
  auto workspace = [&](const std::string& script, const Gpu* device) {
    return megatron_run(flags_of(script), std::nullopt, 0, device).step.workspace_bytes;
  };
  EXPECT_EQ(workspace(base, nullptr), 96 * MiB);                       // Hopper's, no GPU named
  EXPECT_EQ(workspace(base, &gpu("h100")), 96 * MiB);
  EXPECT_EQ(workspace(base, &a100), 2 * (8 * MiB + 128 * KiB) + 4 * MiB);  // PyTorch's :4096:2:16:8
  EXPECT_EQ(workspace("export CUBLAS_WORKSPACE_CONFIG=:4096:8\n" + base, &a100), 2 * 32 * MiB + 4 * MiB);
  EXPECT_EQ(workspace("CUBLAS_WORKSPACE_CONFIG=:16:8 " + base + "--moe-grouped-gemm", &a100),
            2 * 128 * KiB + 5 * 4 * MiB);
  EXPECT_EQ(workspace(base + "--moe-grouped-gemm", nullptr), 224 * MiB);
  for (const char* bad : {"CUBLAS_WORKSPACE_CONFIG=4096:8 ", "CUBLAS_WORKSPACE_CONFIG=:4096 ",
                          "CUBLAS_WORKSPACE_CONFIG=:a:8 "}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(workspace(bad + base, nullptr), InvalidArgument);
  }
  // A test configuration's ENV_VARS are the environment its launcher exports.
  const std::string yaml = "ENV_VARS:\n  CUBLAS_WORKSPACE_CONFIG: :4096:8\nMODEL_ARGS:\n  --num-layers: 2\n"
                           "  --hidden-size: 64\n  --num-attention-heads: 4\n  --vocab-size: 100\n  --world-size: 8\n"
                           "  --bf16: true\n";
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "actbench_workspace_test.yaml";
  std::ofstream(file) << yaml;
  const MegatronFlags read = read_megatron_args(file.string());
  std::filesystem::remove(file);
  EXPECT_EQ(read.cublas_workspace_config, ":4096:8");
  EXPECT_EQ(megatron_run(read, std::nullopt, 0, &a100).step.workspace_bytes, 2 * 32 * MiB + 4 * MiB);
}

// The three losses' bytes on the last stage (sb = 1024 rows, V/t = 50304 columns, bf16).
TEST(StepMemory, TheLossKeepsAndHoldsWhatItsImplementationDoes) {
  const TransformerModel m = gpt_model();
  auto stage = [&](CrossEntropyFusion loss) {
    StepConfig c = config(1, 1, 1, 1);
    c.seq = 256;  // the loss dominates
    c.cross_entropy = loss;
    return step_memory(m, c).front();
  };
  const double rows = 256, cols = 50304, logits = rows * cols;
  const StageMemory none = stage(CrossEntropyFusion::none), native = stage(CrossEntropyFusion::native),
                    te = stage(CrossEntropyFusion::te);
  EXPECT_EQ(none.loss_working_set_bytes, 2 * logits);
  EXPECT_EQ(native.loss_working_set_bytes, 2 * logits + 4 * logits);
  EXPECT_EQ(native.output_bytes, none.output_bytes);
  EXPECT_EQ(te.loss_working_set_bytes, 0);
  // fp32 softmax, bool mask and int64 targets against the 16-bit logits, int64 targets, 3 fp32 per row
  EXPECT_EQ(none.output_bytes - te.output_bytes, (4 * logits + 9 * rows) - (2 * logits + 8 * rows + 12 * rows));
  EXPECT_EQ(native.step_peak_bytes - none.step_peak_bytes, 4 * logits);
}

// --defer-embedding-wgrad-compute: each of the first K micro-batches (--wgrad-deferral-limit;
// 0: all) leaves the output layer's input from its forward and the logits' gradient from its
// backward on the last stage until the step's end (gpt_model at t = 2 with SP, p = 2: rows
// 1024, h 512 over t, V/t = 50432 / 2 columns (50257 padded to 128·t), bf16).
TEST(StepMemory, DeferredEmbeddingWgradsStayToTheStepsEnd) {
  const TransformerModel m = gpt_model();
  StepConfig c = config(2, 2, 1, 8);  // 8 micro-batches
  c.policy.sequence_parallel = true;
  const std::vector<StageMemory> plain_stages = step_memory(m, c);
  const StageMemory plain = plain_stages[1];
  const double per_microbatch = 2.0 * 1024 * 512 / 2 + 2.0 * 1024 * 50432 / 2;
  c.defer_embedding_wgrad = true, c.wgrad_deferral_limit = 2;
  const StageMemory two = step_memory(m, c)[1];
  // The last stage holds one micro-batch at a time: every later op holds both deferred ones.
  EXPECT_DOUBLE_EQ(two.peak_bytes - plain.peak_bytes, 2 * per_microbatch);
  EXPECT_DOUBLE_EQ(two.rest_bytes, plain.rest_bytes);
  c.wgrad_deferral_limit = 0;  // every micro-batch: the last backward holds all eight
  const StageMemory all = step_memory(m, c)[1];
  EXPECT_GE(all.peak_bytes - plain.peak_bytes, 8 * per_microbatch - 2.0 * 1024 * 50432);
  c.wgrad_deferral_limit = 100;  // more than the step's micro-batches: all of them
  EXPECT_DOUBLE_EQ(step_memory(m, c)[1].peak_bytes, all.peak_bytes);
  EXPECT_EQ(step_memory(m, c)[0].peak_bytes, plain_stages[0].peak_bytes);  // no output layer there
}

// Megatron's local attention with torch's fp32 softmax keeps its fp32 output per layer, in place
// of (with attention dropout) or beside (without) the 16-bit probabilities; only Megatron's
// bookkeeping counts it.
TEST(LayerPieces, LocalTorchSoftmaxKeepsItsFp32Output) {
  LayerSpec spec = gpt_layer_spec();
  const Dims d{256, 2, 512, 8, 2};
  const double scores = 2.0 * 8 / 2 * 256 * 256;  // b·a/t·s²
  LayerPolicy c;
  c.attention = Attention::unfused;
  const double fused_kernel = layer_bytes(d, spec, c, {2, 1}, Bookkeeping::megatron);
  spec.megatron_fp32_torch_softmax = true;
  EXPECT_EQ(layer_bytes(d, spec, c, {2, 1}, Bookkeeping::actbench), fused_kernel);
  EXPECT_EQ(layer_bytes(d, spec, c, {2, 1}, Bookkeeping::megatron) - fused_kernel, 2 * scores);  // 4 for 2 bytes
  spec.attention_dropout = 0;
  LayerSpec kernel = spec;
  kernel.megatron_fp32_torch_softmax = false;
  EXPECT_EQ(layer_bytes(d, spec, c, {2, 1}, Bookkeeping::megatron) -
                layer_bytes(d, kernel, c, {2, 1}, Bookkeeping::megatron),
            4 * scores);  // the 16-bit copy is V's input too
  EXPECT_EQ(layer_bytes(d, spec, c, {4, 1}, Bookkeeping::megatron),
            layer_bytes(d, kernel, c, {4, 1}, Bookkeeping::megatron));  // fp32 activations: nothing more
}

TEST(MegatronArgs, UnknownFlagsAreSkippedUnmodelledOnesNamedUnexpressibleOnesRefused) {
  MegatronFlags f = flags_of("--foo 3 --num-layers 2 --tp-comm-overlap --fp8-format hybrid --bar --hidden-size 64");
  EXPECT_EQ(f.values.at("num-layers"), "2");
  EXPECT_EQ(f.values.at("hidden-size"), "64");
  // --fp8-format is read and named with the part it leaves out; --tp-comm-overlap only named.
  EXPECT_EQ(f.values.at("fp8-format"), "hybrid");
  EXPECT_FALSE(f.has("tp-comm-overlap"));
  ASSERT_EQ(f.unmodelled.size(), 2u);
  EXPECT_EQ(f.unmodelled[0], "--tp-comm-overlap");
  EXPECT_EQ(f.unmodelled[1].rfind("--fp8-format (its activations", 0), 0u) << f.unmodelled[1];
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 2 ";
  for (const char* bad : {"--num-experts 8 --moe-router-dtype bf16", "--num-experts 6 --expert-model-parallel-size 4",
                          "--expert-model-parallel-size 2", "--num-experts 8 --moe-router-topk 9",
                          "--num-experts 8 --moe-layer-freq [1,0,1]", "--num-experts 8 --moe-router-score-function relu",
                          "--num-experts 8 --expert-model-parallel-size 2 --expert-tensor-parallel-size 2",
                          "--moe-token-dispatcher-type ring", "--q-lora-rank 0",
                          "--num-experts 8 --moe-router-load-balancing-type sinkhorn seq_aux_loss",
                          "--num-experts 8 --moe-router-load-balancing-type balanced", "--moe-aux-loss-coeff -1",
                          "--moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0 x",
                          "--moe-z-loss-coeff big", "--moe-token-drop-policy random", "--moe-router-bias-update-rate -1",
                          "--context-parallel-size 3",
                          "--context-parallel-size 2 --cp-comm-type a2a+p2p", "--hierarchical-context-parallel-sizes 2 2",
                          "--context-parallel-size 2 --cp-comm-type p2p p2p a2a", "--cp-comm-type ring",
                          "--context-parallel-size 2 --transformer-impl local",
                          "--context-parallel-size 2 --cp-comm-type a2a --group-query-attention --num-query-groups 1",
                          "--context-parallel-size 2 --seq-length 1022",
                          "--recompute-granularity full", "--optimizer lion", "--global-batch-size 3",
                          "--tensor-model-parallel-size 3", "--hidden-size $H"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(
        {
          const MegatronRun r = megatron_run(flags_of(base + bad), std::nullopt, 0);
          step_memory(r.model, r.step);
        },
        InvalidArgument);
  }
  EXPECT_NO_THROW(megatron_run(flags_of(base + "--context-parallel-size 1 --num-experts 0"), std::nullopt, 0));
  EXPECT_NO_THROW(megatron_run(flags_of(base + "--num-experts 8 --multi-latent-attention --moe-router-dtype fp64 "
                                                 "--moe-permute-fusion --moe-shared-expert-overlap"),
                               std::nullopt, 0));
  MegatronFlags strict;
  EXPECT_THROW(apply_megatron_words({"--tensor-model-paralel-size", "2"}, true, "cli", strict), InvalidArgument);
  EXPECT_THROW(megatron_run(flags_of("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 9"),
                            std::nullopt, 0),
               InvalidArgument);  // no GPU count anywhere
}

// ---- context parallelism ----

namespace {

StepConfig cp_config(int t, int cp, int dp, double seq, Attention attention, CpCommType type) {
  StepConfig c = config(t, 1, dp, 2.0 * dp);
  c.layout.cp = cp;
  c.seq = seq;
  c.policy = {Recompute::none, t > 1, attention, {}, type};
  c.distributed_optimizer = true;
  return c;
}

}  // namespace

// Each of C ranks keeps s/C of every sequence: its layers, token ids and loss terms are those
// of a run at s/C without context parallelism; the parameters are not split, the distributed
// optimizer's state is sharded over dp·C.
TEST(StepMemory, ContextParallelRanksKeepTheSequenceDependentTermsAtSOverC) {
  for (const TransformerModel& m : {gpt_model(), llama_model(), odd_model()})
    for (const int C : {2, 4, 8})
      for (const Attention attention : {Attention::fused, Attention::unfused})
        for (const CpCommType type : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a}) {
          if (attention == Attention::unfused && type == CpCommType::p2p) continue;
          if (type == CpCommType::a2a && std::fmod(m.layer.groups(m.dims(1, 1, 2)), 2.0 * C) != 0) continue;
          SCOPED_TRACE(m.name + " C=" + std::to_string(C) + " " + attention_name(attention) + " " +
                       cp_comm_type_name(type));
          const StepConfig with = cp_config(2, C, 1, 4096, attention, type);
          StepConfig without = cp_config(2, 1, C, 4096.0 / C, attention, type);
          without.global_batch = with.global_batch * C;  // the same micro-batches per rank
          const StageMemory a = step_memory(m, with).front(), b = step_memory(m, without).front();
          EXPECT_EQ(a.parameters, b.parameters);
          EXPECT_EQ(a.optimizer_bytes, b.optimizer_bytes);  // dp·C shards either way
          EXPECT_EQ(a.microbatches_in_flight, b.microbatches_in_flight);
          EXPECT_EQ(a.embedding_bytes, b.embedding_bytes);
          EXPECT_EQ(a.output_bytes, b.output_bytes);
          const Dims d = with.layer_dims(m);
          const double layer = layer_bytes(d, m.layer, with.policy, {2, 1}) + layer_extra_bytes(d, m.layer, with.policy);
          EXPECT_EQ(a.activation_bytes, a.microbatches_in_flight * m.L * layer);
          if (attention == Attention::fused)  // unfused scores are s/C rows of s keys: C× those at s/C
            EXPECT_EQ(a.activation_bytes, b.activation_bytes);
          else
            EXPECT_GT(a.activation_bytes, b.activation_bytes);
          EXPECT_GE(a.grad_working_set_bytes, b.grad_working_set_bytes);  // the exchange's buffers besides
        }
}

// The exchange's buffers in the working set, one layer's key/value shard e·(s/C)·b·g·d/t at a
// time: p2p three k/v pairs (the block, the next, dk/dv travelling), all_gather the whole
// sequence's k, v and their gradients, a2a the head-split q, k, v and their gradients. (GPT's
// attention backward outweighs its MLP's, so they show in the working set's maximum.)
TEST(StepMemory, ContextParallelExchangeBuffersAreInTheBackwardWorkingSet) {
  const TransformerModel m = gpt_model();  // a = g = 8 heads of d = 64
  const double s = 8192, C = 2, t = 2, kv = 2 * (s / C) * 8 * 64 / t;  // k or v of the rank's rows, bf16
  const int L = static_cast<int>(m.L);
  auto workset = [&](CpCommType type) {
    return chunk_transients(m, cp_config(2, 2, 1, s, Attention::fused, type), L, L - 1).grads;
  };
  const double without = chunk_transients(m, cp_config(2, 1, 2, s / C, Attention::fused, CpCommType::p2p), L, L - 1).grads;
  EXPECT_EQ(workset(CpCommType::p2p) - without, 6 * kv);
  EXPECT_EQ(workset(CpCommType::all_gather) - without, 4 * kv * C);
  EXPECT_EQ(workset(CpCommType::a2a) - without, 2 * (kv + 2 * kv));  // q is as wide as k here
}

TEST(StepMemory, ContextParallelLayoutsMegatronRefusesAreOneLine) {
  const TransformerModel m = gpt_model();  // 8 heads
  auto message = [&](StepConfig c) {
    try {
      step_memory(m, c);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(cp_config(2, 4, 1, 4100, Attention::fused, CpCommType::p2p)).find("divisible by 2 x 4"),
            std::string::npos);
  EXPECT_NE(message(cp_config(1, 2, 1, 4096, Attention::unfused, CpCommType::p2p)).find("needs fused attention"),
            std::string::npos);
  EXPECT_NE(message(cp_config(2, 8, 1, 4096, Attention::fused, CpCommType::a2a)).find("--cp-comm-type a2a"),
            std::string::npos);  // 8 heads over t·C = 16
  EXPECT_NE(message(cp_config(4, 2, 1, 4100, Attention::fused, CpCommType::p2p)).find("--sequence-parallel"),
            std::string::npos);  // 4100 / 2 = 2050 rows, not a multiple of t = 4
  EXPECT_EQ(message(cp_config(2, 2, 1, 4096, Attention::unfused, CpCommType::all_gather)), "accepted");
  EXPECT_EQ(message(cp_config(2, 4, 1, 4096, Attention::fused, CpCommType::a2a)), "accepted");
}

TEST(MegatronArgs, ContextParallelSizeAndCommTypeAreRead) {
  const std::string base = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --vocab-size 1000 "
                           "--seq-length 8192 --max-position-embeddings 8192 --world-size 16 --bf16 "
                           "--tensor-model-parallel-size 2 --use-distributed-optimizer ";
  MegatronRun r = megatron_run(flags_of(base + "--context-parallel-size 4"), std::nullopt, 0);
  EXPECT_EQ(r.step.layout.cp, 4);
  EXPECT_EQ(r.step.layout.dp, 2);  // 16 / (t 2 x cp 4)
  EXPECT_EQ(r.step.world_size(), 16);
  EXPECT_EQ(r.step.policy.cp_comm, CpCommType::p2p);  // Megatron's default
  r = megatron_run(flags_of(base + "--context-parallel-size 2 --cp-comm-type a2a a2a a2a a2a"), std::nullopt, 0);
  EXPECT_EQ(r.step.policy.cp_comm, CpCommType::a2a);  // one per layer, all alike
  EXPECT_EQ(r.step.layout.dp, 4);
  const StageMemory with = step_memory(r.model, r.step).front();
  r = megatron_run(flags_of(base + "--cp-comm-type all_gather"), std::nullopt, 0);
  EXPECT_EQ(r.step.layout.cp, 1);
  EXPECT_EQ(r.step.policy.cp_comm, CpCommType::all_gather);  // read, used once C > 1
  EXPECT_LT(with.activation_bytes, step_memory(r.model, r.step).front().activation_bytes);
}


// ---- mixtures of experts and latent attention ----

namespace {

// h 64, a 4, g 2, SwiGLU of 128, RMSNorm, no biases; 8 experts of 32 with a shared expert of
// 64, the first of its 4 layers dense.
TransformerModel moe_model() {
  TransformerModel m = llama_model();
  m.name = "moe-test";
  m.h = 64, m.a = 4, m.L = 4, m.vocab = 1000, m.seq = 256;
  m.layer = llama_layer_spec(2, 128);
  m.layer.moe.num_experts = 8;
  m.layer.moe.top_k = 2;
  m.layer.moe.ffn_hidden = 32;
  m.layer.moe.shared_ffn_hidden = 64;
  m.moe_layers = {false, true, true, true};
  return m;
}

// moe_model's layout in these tests: t = 2 with SP, p stages, dp = 4, each expert whole on one
// of 4 expert-parallel ranks, s tokens a sequence.
StepConfig moe_config(int p, double global_batch, double seq = 256) {
  StepConfig c = config(2, p, 4, global_batch);
  c.seq = seq;
  c.policy.sequence_parallel = true;
  c.layout.ep = 4, c.layout.etp = 1;
  return c;
}

}  // namespace

TEST(StepMemoryMoe, ParametersSplitOverTensorAndExpertParallelism) {
  const TransformerModel m = moe_model();
  StepLayout l;
  l.t = 2, l.dp = 4, l.ep = 4, l.etp = 1;  // 8 GPUs; the experts' data-parallel group: 8 / (4 x 1) = 2
  // Attention on one of t = 2 ranks: QKV (4 + 2·2) heads of 16 from 64, projection 64 x 64;
  // the two RMSNorms whole.
  const double attention = ((4 + 4) * 16 * 64 + 64 * 64) / 2.0, norms = 2 * 64;
  // The dense layer: SwiGLU fc1 2·128 x 64, fc2 64 x 128, over t.
  const LayerParameters dense = layer_parameters(m, 0, l);
  EXPECT_EQ(dense.dense, attention + norms + (2 * 128 * 64 + 128 * 64) / 2.0);
  EXPECT_EQ(dense.expert, 0);
  // An MoE layer: the router 8 x 64 whole, the shared expert (2·64 x 64, 64 x 64) over t; the
  // routed experts 8 / ep = 2 per rank, each 2·32 x 64 and 64 x 32, whole (etp 1).
  const LayerParameters moe = layer_parameters(m, 1, l);
  EXPECT_EQ(moe.dense, attention + norms + 8 * 64 + (2 * 64 * 64 + 64 * 64) / 2.0);
  EXPECT_EQ(moe.expert, 2 * (2 * 32 * 64 + 64 * 32));
  // etp = t (Megatron's default when not given): each expert split over 2 as well
  l.etp = 0;
  EXPECT_EQ(layer_parameters(m, 1, l).expert, 2 * (2 * 32 * 64 + 64 * 32) / 2.0);
}

// Expert tensor parallelism (etp = t, Megatron's default) gathers the TP group's routed rows into
// each MoE layer's experts at 1/t of their width: counted by hand, per MoE layer at t = 2, SP, s
// 256: T = 128 tokens, k = 2, so fc1's input holds 512 rows instead of 256 (64 wide, bf16) and
// the rows' weights 512 instead of 256; fc1's output and fc2's input the same bytes (twice the
// rows, half of 32 wide). Megatron's unfused permutation keeps nothing for the received rows
// (they are sorted by a split and a cat).
TEST(StepMemoryMoe, ExpertTensorParallelismGathersTheGroupsRowsIntoEachMoeLayer) {
  const TransformerModel m = moe_model();
  StepConfig c = config(2, 1, 4, 4);
  c.seq = 256;
  c.policy.sequence_parallel = true;
  c.layout.etp = 1;
  const double whole = chunk_bytes(m, c, 4, true, true).layers;
  c.layout.etp = 0;  // t
  const double split = chunk_bytes(m, c, 4, true, true).layers;
  const double per_moe_layer = 2.0 * 256 * 64 + 2.0 * 256;
  EXPECT_EQ(split - whole, 3 * per_moe_layer);  // layers 1..3 are MoE layers
}

TEST(StepMemoryMoe, TheDistributedOptimizerShardsExpertsOverTheExpertDataParallelGroup) {
  const TransformerModel m = moe_model();
  StepConfig c = moe_config(1, 4);
  c.distributed_optimizer = true;
  const std::vector<StageMemory> stages = step_memory(m, c);
  ASSERT_EQ(stages.size(), 1u);
  const StageMemory& s = stages[0];
  // per rank, counted by hand: attention 6144, norms 128; dense MLP 12288; router 512, shared
  // expert 6144, experts 12288; embedding and output layer 1024 (1000 padded to 256) x 64 / 2
  // each, the final norm 64
  const double dense_layer = 6144 + 128 + 12288, moe_dense = 6144 + 128 + 512 + 6144, experts = 3 * 12288;
  const double dense = dense_layer + 3 * moe_dense + 2 * 32768 + 64;
  EXPECT_EQ(s.parameters, dense + experts);
  EXPECT_EQ(s.expert_parameters, experts);
  EXPECT_EQ(s.weight_bytes, 2 * (dense + experts));
  EXPECT_EQ(s.grad_bytes, 4 * (dense + experts));  // main_grad whole on every rank
  // fp32 master + Adam's moments: dense over dp = 4, experts over t·dp / (ep·etp) = 2
  EXPECT_EQ(s.optimizer_bytes, 12 * (dense / 4 + experts / 2));
  // without the distributed optimizer nothing is sharded
  c.distributed_optimizer = false;
  EXPECT_EQ(step_memory(m, c)[0].optimizer_bytes, 12 * (dense + experts));
  // The last layer's backward (MoE) holds, beside the output's gradient (2 bytes x 256 rows / 2
  // x 64), its experts' activation gradients over 128 tokens x k 2 rows, 2·32 wide, and the
  // shared expert's over 256 rows, 2·64 / 2 wide; fused attention's (dO, dq, dk, dv: 12 heads
  // of 16 over 2 ranks, fp32 row sums) are fewer.
  c.policy.attention = Attention::fused;
  EXPECT_EQ(chunk_transients(m, c, 4, 3).grads, 2.0 * 256 * 64 / 2 + 2.0 * (128 * 2 * 2 * 32 + 256 * 2 * 64 / 2));
}

TEST(StepMemoryMoe, MegatronsExpertLayoutRules) {
  const TransformerModel m = moe_model();
  auto fails = [&](int t, int dp, int ep, int etp, bool sp, const std::string& words) {
    StepConfig c = config(t, 1, dp, dp);
    c.seq = 256;
    c.layout.ep = ep, c.layout.etp = etp;
    c.policy.sequence_parallel = sp;
    try {
      step_memory(m, c);
      ADD_FAILURE() << "accepted t " << t << " dp " << dp << " ep " << ep << " etp " << etp;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  fails(2, 4, 8, 2, true, "must divide tensor x context x data parallel (8)");  // ep·etp 16 > 8
  fails(2, 4, 3, 1, true, "--num-experts (8) must be divisible by --expert-model-parallel-size (3)");
  fails(2, 4, 4, 1, false, "needs --sequence-parallel");
  fails(1, 8, 1, 64, false, "must divide tensor x context x data parallel");
  fails(1, 64, 1, 64, false, "must be divisible by the expert-tensor-parallel size (64)");  // experts 32 wide
  TransformerModel dense = gpt_model();
  StepConfig c = config(1, 1, 8, 8);
  c.layout.ep = 2;
  EXPECT_THROW(step_memory(dense, c), InvalidArgument);  // expert parallelism without experts
  TransformerModel wrong = m;
  wrong.moe_layers = {true, true};
  c = config(1, 1, 8, 8);
  c.seq = 256;
  EXPECT_THROW(step_memory(wrong, c), InvalidArgument);  // 2 pattern entries for 4 layers
  c.layout.ep = 8;  // 8 experts over 8 ranks, one each: accepted
  EXPECT_NO_THROW(step_memory(m, c));
}

TEST(StepMemoryMoe, LatentAttentionsParameters) {
  TransformerModel m = moe_model();
  m.layer.moe = {};
  m.moe_layers.clear();
  MlaSpec& a = m.layer.mla;
  a.enabled = true, a.q_lora_rank = 24, a.kv_lora_rank = 16, a.qk_head_dim = 8, a.qk_pos_emb_head_dim = 4, a.v_head_dim = 8;
  StepLayout l;
  l.t = 2;
  // q down 24 x 64 and its norm, kv down (16 + 4) x 64 and its norm: whole on every rank;
  // q up 4·(8 + 4) x 24, kv up 4·(8 + 8) x 16, projection 64 x 4·8: over t = 2
  const double whole = 24 * 64 + 24 + 20 * 64 + 16, split = (4 * 12 * 24 + 4 * 16 * 16 + 64 * 32) / 2.0;
  const double mlp = (2 * 128 * 64 + 128 * 64) / 2.0, norms = 2 * 64;
  EXPECT_EQ(layer_parameters(m, 0, l).dense, whole + split + norms + mlp);
  a.q_lora_rank = 0;  // q projected from h directly: 4·12 x 64 over t
  EXPECT_EQ(layer_parameters(m, 0, l).dense, 20 * 64 + 16 + (4 * 12 * 64 + 4 * 16 * 16 + 64 * 32) / 2.0 + norms + mlp);
}

TEST(MegatronArgs, MixtureOfExpertsAndLatentAttentionFlags) {
  const std::string script =
      "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --vocab-size 1000 --swiglu --ffn-hidden-size 128 "
      "--normalization RMSNorm --disable-bias-linear --tensor-model-parallel-size 2 --sequence-parallel "
      "--world-size 16 --bf16 --use-distributed-optimizer "
      "--num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 64 "
      "--moe-router-score-function sigmoid --moe-router-topk-scaling-factor 2.5 --moe-router-num-groups 4 "
      "--moe-router-group-topk 2 --moe-router-enable-expert-bias --moe-expert-capacity-factor 1.25 "
      "--moe-layer-freq ([0]*2+[1]*6) --moe-grouped-gemm --moe-token-dispatcher-type alltoall "
      "--expert-model-parallel-size 4 --expert-tensor-parallel-size 1 "
      "--multi-latent-attention --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 4 "
      "--v-head-dim 8";
  const MegatronRun r = megatron_run(flags_of(script), std::nullopt, 0);
  const MoeSpec& e = r.model.layer.moe;
  EXPECT_EQ((std::vector<double>{e.num_experts, e.top_k, e.ffn_hidden, e.shared_ffn_hidden, e.scaling, e.num_groups,
                                 e.group_top_k, e.capacity_factor}),
            (std::vector<double>{16, 4, 32, 64, 2.5, 4, 2, 1.25}));
  EXPECT_EQ(e.score, MoeScore::sigmoid);
  EXPECT_TRUE(e.expert_bias);
  EXPECT_FALSE(e.pre_softmax);
  EXPECT_EQ(r.model.layer.ffn_hidden, 128);  // the dense layers' width
  EXPECT_EQ(r.model.moe_layers, (std::vector<bool>{false, false, true, true, true, true, true, true}));
  EXPECT_EQ(r.model.moe_layer_count(), 6);
  EXPECT_EQ((std::vector<int>{r.step.layout.ep, r.step.layout.etp, r.step.layout.expert_dp()}),
            (std::vector<int>{4, 1, 4}));  // t 2 x dp 8 / (4 x 1)
  const MlaSpec& a = r.model.layer.mla;
  EXPECT_TRUE(a.enabled);
  EXPECT_EQ((std::vector<double>{a.q_lora_rank, a.kv_lora_rank, a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim}),
            (std::vector<double>{24, 16, 8, 4, 8}));
  EXPECT_NO_THROW(step_memory(r.model, r.step));
  // Megatron's defaults: top-2, softmax, the expert width ffn-hidden-size, every layer MoE,
  // etp = t; --multi-latent-attention alone: q from h, kv_lora_rank 32, heads 128 + 64 and 128
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 4 "
                           "--tensor-model-parallel-size 2 --sequence-parallel ";
  const MegatronRun d = megatron_run(flags_of(base + "--num-experts 4 --moe-router-pre-softmax --multi-latent-attention"),
                                     std::nullopt, 0);
  EXPECT_EQ(d.model.layer.moe.top_k, 2);
  EXPECT_EQ(d.model.layer.moe.score, MoeScore::softmax);
  EXPECT_TRUE(d.model.layer.moe.pre_softmax);
  EXPECT_EQ(d.model.layer.expert_ffn(d.model.dims(1, 1, 1)), 256);
  EXPECT_TRUE(d.model.moe_layers.empty());
  EXPECT_EQ(d.step.layout.expert_tp(), 2);
  EXPECT_EQ(d.model.layer.mla.kv_lora_rank, 32);
  EXPECT_EQ(d.model.layer.mla.q_lora_rank, 0);
  // --moe-layer-freq N: every N-th layer from layer 0
  EXPECT_EQ(megatron_run(flags_of(base + "--num-experts 4 --moe-layer-freq 2"), std::nullopt, 0).model.moe_layers,
            (std::vector<bool>{true, false}));
  // a pattern is one 0/1 entry per layer, lists joined with + and repeated with *
  for (const char* bad : {"[2]*2", "[1]*", "[1,0", "x", "0", "[1]*2+", "[1]+[1]+[1]", "[0]*9999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(moe_layer_pattern(bad, 2, "--moe-layer-freq"), InvalidArgument);
  }
  EXPECT_EQ(moe_layer_pattern("([1]*1 + [0])", 2, "--moe-layer-freq"), (std::vector<bool>{true, false}));
  EXPECT_EQ(moe_layer_pattern("[0,1,1]", 3, "--moe-layer-freq"), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(moe_layer_pattern("3", 7, "--moe-layer-freq"),
            (std::vector<bool>{true, false, false, true, false, false, true}));
  // MoE flags without experts change nothing (Megatron ignores them), once their values are checked
  EXPECT_FALSE(megatron_run(flags_of(base + "--moe-router-topk 4"), std::nullopt, 0).model.layer.moe.enabled());
}

TEST(MegatronArgs, RouterPrecisionLossesAndPermutationFlags) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 4 "
                           "--tensor-model-parallel-size 2 --sequence-parallel --num-experts 4 ";
  auto routing = [&](const std::string& flags) {
    return megatron_run(flags_of(base + flags), std::nullopt, 0).model.layer.moe.megatron;
  };
  // Megatron's defaults: the router in the activations' type, aux_loss at coefficient 0 (off);
  // GeLU experts weight their activation unfused, SwiGLU ones in the fused kernel unless told
  EXPECT_EQ(routing(""), MegatronRouting{.unfused_weighted_activation = true});
  EXPECT_EQ(routing("--swiglu"), MegatronRouting{});
  EXPECT_TRUE(routing("--swiglu --no-bias-swiglu-fusion").unfused_weighted_activation);
  const MegatronRouting all = routing("--moe-router-dtype fp32 --moe-aux-loss-coeff 1e-3 --moe-z-loss-coeff 1e-3 "
                                      "--moe-permute-fusion --moe-token-drop-policy position --swiglu");
  EXPECT_EQ(all, (MegatronRouting{.router_bytes = 4, .aux_loss = true, .z_loss = true, .permute_fusion = true}));
  EXPECT_EQ(routing("--moe-router-dtype fp64").router_bytes, 8);
  EXPECT_TRUE(routing("--moe-z-loss-coeff 0").z_loss);  // Megatron computes it whenever a coefficient is given
  EXPECT_TRUE(routing("--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4").aux_loss);
  EXPECT_TRUE(routing("--moe-router-load-balancing-type global_aux_loss --moe-aux-loss-coeff 1e-4").aux_loss);
  EXPECT_FALSE(routing("--moe-router-load-balancing-type none --moe-aux-loss-coeff 1e-2").aux_loss);
  EXPECT_FALSE(routing("--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0").aux_loss);
  // a coefficient per type, the i-th for the i-th: only the listed types with one above 0 run
  EXPECT_TRUE(routing("--moe-router-load-balancing-type none seq_aux_loss --moe-aux-loss-coeff 0 1e-3").aux_loss);
  EXPECT_FALSE(routing("--moe-router-load-balancing-type seq_aux_loss none --moe-aux-loss-coeff 0 1e-3").aux_loss);
  EXPECT_FALSE(routing("--moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0").aux_loss);
}

// ---- multi-token prediction (--mtp-num-layers) ----

TEST(StepMemoryMtp, TheLastStageHoldsEachMtpLayerAndAnEmbeddingCopy) {
  TransformerModel m = moe_model();  // untied, RMSNorm, h 64, vocab 1000 (padded to 1024 at t = 2)
  StepConfig c = moe_config(2, 16);
  const std::vector<StageMemory> plain = step_memory(m, c);
  m.mtp_layers = 2;
  const std::vector<StageMemory> mtp = step_memory(m, c);
  EXPECT_EQ(mtp[0].parameters, plain[0].parameters);  // stage 0 is untouched
  // Per MTP layer: the last layer's parameters (an MoE layer), enorm, hnorm and the final norm
  // (64 each), eh_proj 64 x 128 over t = 2; once, the embedding copy (1024 / 2 rows of 64).
  const LayerParameters last = layer_parameters(m, 3, c.layout);
  EXPECT_EQ(mtp[1].parameters - plain[1].parameters, 2 * (last.total() + 3 * 64 + 64 * 128 / 2) + 512 * 64);
  EXPECT_EQ(mtp[1].expert_parameters - plain[1].expert_parameters, 2 * last.expert);
  // A tied output layer reads the embedding copy: no weight of its own, the same count as the
  // tied copy it held before.
  m.tied_embeddings = true;
  m.mtp_layers = 0;
  const double tied = step_memory(m, c)[1].parameters;
  m.mtp_layers = 2;
  EXPECT_EQ(step_memory(m, c)[1].parameters - tied, 2 * (last.total() + 3 * 64 + 64 * 128 / 2));
  // At p = 1 the stage's own embedding serves the lookups.
  StepConfig one = moe_config(1, 16);
  m.tied_embeddings = false;
  m.mtp_layers = 0;
  const double alone = step_memory(m, one)[0].parameters;
  m.mtp_layers = 1;
  EXPECT_EQ(step_memory(m, one)[0].parameters - alone, last.total() + 3 * 64 + 64 * 128 / 2);
}

TEST(StepMemoryMtp, EachMtpLayerKeepsItsLayerLookupNormsAndLossByHand) {
  TransformerModel m = moe_model();
  StepConfig c = moe_config(2, 16);
  const ChunkBytes plain = chunk_bytes(m, c, 2, false, true, 2);
  m.mtp_layers = 1;
  const ChunkBytes mtp = chunk_bytes(m, c, 2, false, true, 2);
  // The layer: the last layer's saved tensors (one more of layer 3's: the chunk is layers 2, 3).
  EXPECT_EQ(mtp.layers - plain.layers, plain.layers / 2);
  // s·b = 256 rows, 128 under SP; one [128, 64] bf16 tensor is 16384 bytes, RMSNorm's fp32
  // statistics 4 x 128. The lookup: int64 ids 8 x 256, at t = 2 the shard's ids and the masked
  // rows' indices 8 x 256 + 8 x 128. enorm and hnorm: input and statistics each; eh_proj's
  // input 2 x 16384; the final norm: input and statistics; the loss: fp32 softmax 4 x 256 x 512,
  // mask and targets 9 x 256, rolled labels' mask and per-token loss 8 x 256; the concatenated
  // buffer's one more [128, 64].
  const double rows = 16384, stats = 512, lookup = 2048 + 2048 + 1024;
  const double loss = 4.0 * 256 * 512 + 9 * 256 + 8 * 256;
  EXPECT_EQ(mtp.output - plain.output, lookup + 2 * (rows + stats) + 2 * rows + rows + stats + loss + rows);
  EXPECT_EQ(mtp.embedding, 0);
  // Full recompute keeps the MTP layer's checkpointed input ([128, 64] under SP).
  c.policy.recompute = Recompute::full;
  c.stack = {RecomputeMethod::uniform, 1};
  m.mtp_layers = 0;
  const double full_plain = chunk_bytes(m, c, 2, false, true, 2).layers;
  m.mtp_layers = 1;
  EXPECT_EQ(chunk_bytes(m, c, 2, false, true, 2).layers - full_plain, rows);
}

TEST(StepMemoryMtp, TheFirstBackwardLayerIsAnMtpLayerWhoseInputsAreAlive) {
  TransformerModel m = moe_model();
  StepConfig c = moe_config(2, 16);
  m.mtp_layers = 2;
  const ChunkBytes b = chunk_bytes(m, c, 2, false, true, 2);
  // Per MTP layer: the lookup (5120), enorm's and hnorm's inputs and statistics (16384 + 512
  // each) and eh_proj's 2h-wide input (2 x 16384); once, the decoder's final norm (16896).
  EXPECT_EQ(b.output_held, 16896 + 2 * (5120 + 2 * 16896 + 2 * 16384));
  m.mtp_layers = 0;
  const ChunkBytes plain = chunk_bytes(m, c, 2, false, true, 2);
  EXPECT_EQ(b.mtp_layers, b.layers - plain.layers);
  EXPECT_GT(b.mtp_layers, 0);
  EXPECT_EQ(plain.output_held + plain.mtp_layers, 0);  // the final norm runs backward before the last layer
  // One micro-batch on a single stage: the backward's moments, each from the live bytes by hand.
  for (const double seq : {256.0, 4096.0}) {
    SCOPED_TRACE("seq " + std::to_string(seq));
    StepConfig one = moe_config(1, 4, seq);
    one.policy.attention = Attention::unfused;
    m.mtp_layers = 1;
    const int L = static_cast<int>(m.L);
    const ChunkBytes live = chunk_bytes(m, one, L, true, true);
    const ChunkTransients layer = chunk_transients(m, one, L, L - 1);
    const double logits = 2.0 * seq * 1024 / 2, embedding_grad = 2.0 * 1024 / 2 * 64;  // vocab padded to 1024
    const double at_loss = live.total() + logits;
    const double at_layer = live.layers + live.embedding + live.output_held + layer.recompute + layer.grads;
    const double at_mtp_lookup = live.layers - live.mtp_layers + live.embedding + live.output_held + embedding_grad;
    const double at_lookup = live.embedding + embedding_grad;
    const StageMemory s = step_memory(m, one).front();
    EXPECT_DOUBLE_EQ(s.step_peak_bytes - s.rest_bytes, std::max({at_loss, at_layer, at_mtp_lookup, at_lookup}));
    if (at_layer > at_loss) {
      EXPECT_EQ(s.output_bytes, live.output_held);
    }
  }
}

TEST(StepMemoryMoe, TheBusiestRanksExpertsProcessTheLoadTimesBalancedRows) {
  const TransformerModel m = moe_model();
  StepConfig c = moe_config(1, 4);
  const LayerSpec spec = m.layer_spec(1);
  const Dims balanced = c.layer_dims(m);
  c.moe_expert_load = 1.5;
  const Dims busy = c.layer_dims(m);
  EXPECT_EQ(moe_expert_load(busy, spec), 1.5);
  // The pieces over the rows the rank's experts process grow by the load; nothing else does.
  const ByteCategories one = layer_bytes_by_category(balanced, spec, c.policy);
  const ByteCategories more = layer_bytes_by_category(busy, spec, c.policy);
  ASSERT_EQ(one.size(), more.size());
  int scaled = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    SCOPED_TRACE(one[i].first);
    const bool expert_rows = one[i].first == "moe_permuted" || one[i].first == "moe_act_input" ||
                             one[i].first == "moe_permuted_probs" || one[i].first == "moe_fc2_input";
    EXPECT_EQ(more[i].second, (expert_rows ? 1.5 : 1.0) * one[i].second);
    scaled += expert_rows;
  }
  EXPECT_EQ(scaled, 4);
  // The bound: 8 experts over ep = 4 (2 per rank), k = 2: every token's both choices on this
  // rank's experts, 4x balanced; with a capacity factor each expert's capacity bounds the rows.
  c.moe_expert_load = 100;
  EXPECT_EQ(moe_expert_load(c.layer_dims(m), spec), 4);
  LayerSpec capped = spec;
  capped.moe.capacity_factor = 1.25;
  EXPECT_EQ(moe_expert_load(c.layer_dims(m), capped), 1);
  // The step: more activations and a larger MoE gradient working set; a dense model or a load
  // below balanced is refused.
  c.moe_expert_load = 1;
  c.policy.attention = Attention::fused;
  const StageMemory at_one = step_memory(m, c).front();
  const double grads_at_one = chunk_transients(m, c, 4, 3).grads;
  c.moe_expert_load = 2;
  const StageMemory at_two = step_memory(m, c).front();
  EXPECT_GT(at_two.peak_bytes, at_one.peak_bytes);
  EXPECT_EQ(at_two.rest_bytes, at_one.rest_bytes);
  // The experts' activation gradients: 128 tokens routed twice, 32 wide, SwiGLU's two, bf16 —
  // twice the rows at load 2 (the MLP term is the larger here).
  EXPECT_EQ(chunk_transients(m, c, 4, 3).grads - grads_at_one, 2.0 * 2 * 128 * 2 * 32);
  c.moe_expert_load = 0.5;
  EXPECT_THROW(step_memory(m, c), InvalidArgument);
  StepConfig dense = config(1, 1, 1, 1);
  dense.moe_expert_load = 2;
  EXPECT_THROW(step_memory(gpt_model(), dense), InvalidArgument);
}

TEST(StepMemoryFp8, TheGemmWeightsFp8CachesAreHeldAtRestByHand) {
  TransformerModel m = moe_model();
  m.mtp_layers = 1;
  StepConfig c = moe_config(2, 16);
  const std::vector<StageMemory> plain = step_memory(m, c);
  // Layers 2 and 3 (MoE, SwiGLU, RMSNorm) and the MTP layer (layer 3's spec) on the last stage,
  // t = 2: QKV (4 + 2·2 heads of 16) x 64 and the projection 64 x 64, over t; the shared
  // experts 3 x 64 x 64 over t; 8 / 4 experts whole, 3 x 64 x 32 each; the MTP layer's eh_proj
  // 64 x 128 over t. The norms, the router and the embedding copy stay in 16 bits.
  const double attention = (128 * 64 + 64 * 64) / 2.0, shared = 3 * 64 * 64 / 2.0, experts = 2 * 3 * 64 * 32;
  const double gemm_last = 3 * (attention + shared + experts) + 64 * 128 / 2.0;
  const struct {
    Fp8Recipe recipe;
    double bytes;
  } recipes[] = {{Fp8Recipe::delayed, 2}, {Fp8Recipe::tensorwise, 2}, {Fp8Recipe::blockwise, 2 + 8.0 / 16384},
                 {Fp8Recipe::mxfp8, 2 + 2.0 / 32}};
  for (const auto& [recipe, bytes] : recipes) {
    c.fp8 = recipe;
    const std::vector<StageMemory> fp8 = step_memory(m, c);
    EXPECT_DOUBLE_EQ(fp8[1].fp8_weight_bytes, bytes * gemm_last);
    EXPECT_DOUBLE_EQ(fp8[1].rest_bytes - plain[1].rest_bytes, fp8[1].fp8_weight_bytes);
    EXPECT_DOUBLE_EQ(fp8[1].peak_bytes - plain[1].peak_bytes, fp8[1].fp8_weight_bytes);
    EXPECT_EQ(fp8[1].weight_bytes, plain[1].weight_bytes);  // the 16-bit weights stay
  }
  // Layers 0 (dense: fc1 2 x 128 x 64 and fc2 128 x 64 over t) and 1 on the first stage.
  c.fp8 = Fp8Recipe::delayed;
  EXPECT_DOUBLE_EQ(step_memory(m, c)[0].fp8_weight_bytes,
                   2 * (2 * attention + 3 * 128 * 64 / 2.0 + shared + experts));
  // --fp8-param-gather: the parameters are the FP8 weights (data and transpose), no cache beside
  c.fp8_param_gather = true;
  EXPECT_EQ(step_memory(m, c)[1].fp8_weight_bytes, 0);
  EXPECT_EQ(step_memory(m, c)[1].weight_bytes, plain[1].weight_bytes);
  c.fp8_param_gather = false;
  c.sharding.fsdp = true, c.sharding.level = DpShard::optimizer, c.distributed_optimizer = true;
  EXPECT_EQ(step_memory(m, c)[1].fp8_weight_bytes, 0);  // Megatron-FSDP's are not modelled
}

TEST(MegatronArgs, Fp8FormatAndRecipe) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 2 --bf16 ";
  EXPECT_EQ(megatron_run(flags_of(base), std::nullopt, 0).step.fp8, Fp8Recipe::none);
  EXPECT_EQ(megatron_run(flags_of(base + "--fp8-recipe mxfp8"), std::nullopt, 0).step.fp8, Fp8Recipe::none);
  EXPECT_EQ(megatron_run(flags_of(base + "--fp8-format hybrid"), std::nullopt, 0).step.fp8, Fp8Recipe::delayed);
  EXPECT_EQ(megatron_run(flags_of(base + "--fp8-format e4m3 --fp8-recipe blockwise"), std::nullopt, 0).step.fp8,
            Fp8Recipe::blockwise);
  EXPECT_EQ(megatron_run(flags_of(base + "--fp8-format hybrid --fp8-recipe tensorwise"), std::nullopt, 0).step.fp8,
            Fp8Recipe::tensorwise);
  EXPECT_TRUE(megatron_run(flags_of(base + "--fp8-format hybrid --fp8-param-gather"), std::nullopt, 0).step.fp8_param_gather);
  EXPECT_FALSE(megatron_run(flags_of(base + "--fp8-param-gather"), std::nullopt, 0).step.fp8_param_gather);
  for (const char* bad : {"--fp8-format e5m2", "--fp8-format hybrid --fp8-recipe custom", "--fp8-recipe x"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(megatron_run(flags_of(base + bad), std::nullopt, 0), InvalidArgument);
  }
}

// --overlap-moe-expert-parallel-comm: a steady-state backward runs beside its paired forward,
// whose first layer's saved tensors are alive when the backward's first layer starts.
TEST(StepMemory, CombinedOneFOneBHoldsThePairedForwardsFirstLayer) {
  const TransformerModel m = gpt_model();
  StepConfig c = config(2, 2, 1, 8);
  c.policy.sequence_parallel = true;
  const std::vector<StageMemory> plain = step_memory(m, c);
  c.overlap_moe_ep_comm = true;
  const std::vector<StageMemory> paired = step_memory(m, c);
  const double layer = layer_bytes(c.layer_dims(m), m.layer, c.policy, Precision{}, Bookkeeping::megatron) +
                       layer_extra_bytes(c.layer_dims(m), m.layer, c.policy);
  // Stage 0 peaks at a steady backward (F1 B0 ...): one layer more.
  ASSERT_EQ(plain[0].peak_at.rfind("backward", 0), 0u) << plain[0].peak_at;
  EXPECT_DOUBLE_EQ(paired[0].peak_bytes - plain[0].peak_bytes, layer);
  EXPECT_DOUBLE_EQ(paired[0].activation_bytes - plain[0].activation_bytes, layer);
  EXPECT_EQ(paired[0].rest_bytes, plain[0].rest_bytes);
  // One micro-batch per step leaves no forward to pair with.
  StepConfig one = config(2, 1, 1, 1);
  one.policy.sequence_parallel = true;
  const double alone = step_memory(m, one)[0].peak_bytes;
  one.overlap_moe_ep_comm = true;
  EXPECT_EQ(step_memory(m, one)[0].peak_bytes, alone);
}

TEST(MegatronArgs, DeferredEmbeddingWgradFlags) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 2 --bf16 ";
  const StepConfig plain = megatron_run(flags_of(base), std::nullopt, 0).step;
  EXPECT_FALSE(plain.defer_embedding_wgrad);
  const StepConfig deferred =
      megatron_run(flags_of(base + "--defer-embedding-wgrad-compute --wgrad-deferral-limit 3"), std::nullopt, 0).step;
  EXPECT_TRUE(deferred.defer_embedding_wgrad);
  EXPECT_EQ(deferred.wgrad_deferral_limit, 3);
  for (const char* bad : {"--wgrad-deferral-limit -1", "--defer-embedding-wgrad-compute --wgrad-deferral-limit x"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(megatron_run(flags_of(base + bad), std::nullopt, 0), InvalidArgument);
  }
}

TEST(MegatronArgs, MultiTokenPredictionFlags) {
  const std::string base = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 4 "
                           "--pipeline-model-parallel-size 2 ";
  EXPECT_EQ(megatron_run(flags_of(base), std::nullopt, 0).model.mtp_layers, 0);  // Megatron's default: none
  const MegatronRun r = megatron_run(flags_of(base + "--mtp-num-layers 1 --mtp-loss-scaling-factor 0.1"), std::nullopt, 0);
  EXPECT_EQ(r.model.mtp_layers, 1);
  EXPECT_GT(step_memory(r.model, r.step)[1].parameters,
            step_memory(megatron_run(flags_of(base), std::nullopt, 0).model, r.step)[1].parameters);
  for (const char* bad : {"--mtp-num-layers -1", "--mtp-num-layers x", "--mtp-num-layers 1 --mtp-use-repeated-layer",
                          "--mtp-loss-scaling-factor -2"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(megatron_run(flags_of(base + bad), std::nullopt, 0), InvalidArgument);
  }
}

// ---- Megatron-LM's test configurations (model_config.yaml) and pipeline layouts ----

namespace {

// Writes `text` to dir/name under a fresh folder of the system's temporary directory.
std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::filesystem::path folder = std::filesystem::temp_directory_path() / "actbench_test_step_memory" / dir;
  std::filesystem::create_directories(folder);
  const std::filesystem::path path = folder / name;
  std::ofstream(path) << text;
  return path.string();
}

const char* const kModelConfig = R"(ENV_VARS:
  CUDA_DEVICE_MAX_CONNECTIONS: 1
  --num-layers: 99
MODEL_ARGS:
  # Distributed args
  --tensor-model-parallel-size: 2
  --pipeline-model-parallel-size: 2
  --sequence-parallel: true
  --use-distributed-optimizer: false
  --num-layers: 8 # eight
  --hidden-size: 64
  --num-attention-heads: 4
  --seq-length: 128
  --micro-batch-size: 2
  --global-batch-size: 16
  --vocab-file: ${DATA_PATH}/bpe/vocab.json
  --merge-file: ${DATA_PATH}/bpe/merges.txt
  --data-path: ${DATA_PATH}/text
  --recompute-granularity: selective
  --recompute-modules: "[layernorm core_attn]"
  --moe-layer-freq: ([0]*2+[1]*6)
  --num-experts: 4
  --bf16: true
TEST_TYPE: regular
METRICS:
  - "lm loss"
)";

}  // namespace

TEST(MegatronArgs, MegatronsTestConfigurationIsReadAsItsLauncherPassesIt) {
  const MegatronFlags f = read_megatron_args(write_file("gpt3_mcore_tp2_pp2_1N8G_moe", "model_config.yaml", kModelConfig));
  EXPECT_EQ(f.values.at("num-layers"), "8");               // MODEL_ARGS's, not ENV_VARS's, comment dropped
  EXPECT_EQ(f.values.at("sequence-parallel"), "1");        // true: the bare switch
  EXPECT_FALSE(f.has("use-distributed-optimizer"));        // false: not passed
  EXPECT_EQ(f.values.at("recompute-modules"), "layernorm,core_attn");  // a Python list's brackets dropped
  EXPECT_EQ(f.values.at("moe-layer-freq"), "([0]*2+[1]*6)");
  EXPECT_EQ(f.values.at("world-size"), "8");                // 1N8G: one node of 8 GPUs
  const MegatronRun r = megatron_run(f, std::nullopt, 0);
  EXPECT_EQ(r.model.vocab, 50257);  // the BPE vocabulary and merges files: GPT-2's tokenizer
  EXPECT_EQ((std::vector<int>{r.step.layout.t, r.step.layout.p, r.step.layout.dp}), (std::vector<int>{2, 2, 2}));
  EXPECT_TRUE(r.step.policy.modules.layernorm && r.step.policy.modules.core_attn);
  EXPECT_EQ(r.model.moe_layer_count(), 6);
  EXPECT_NO_THROW(step_memory(r.model, r.step));
  // Without the test's name the GPU count must come from elsewhere.
  EXPECT_FALSE(read_megatron_args(write_file("plain", "model_config.yaml", kModelConfig)).has("world-size"));
  // An entry that is not `--flag: value` is one line naming the line.
  EXPECT_THROW(read_megatron_args(write_file("bad", "model_config.yaml", "MODEL_ARGS:\n  num-layers: 2\n")),
               InvalidArgument);
}

TEST(MegatronArgs, AShellVariableIsAnErrorOnlyIfNothingGivesItsValue) {
  MegatronFlags f = flags_of("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 4 "
                             "--tensor-model-parallel-size ${TP} --data-path $DATA");
  try {
    megatron_run(f, std::nullopt, 0);
    ADD_FAILURE() << "a shell variable's value was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size is '${TP}'"), std::string::npos) << e.what();
  }
  apply_megatron_words({"--tensor-model-parallel-size", "2"}, true, "cli", f);
  EXPECT_EQ(megatron_run(f, std::nullopt, 0).step.layout.t, 2);
}

TEST(MegatronArgs, PipelineLayoutStringsUnrollAsMegatronParsesThem) {
  const PipelineLayout deepseek = parse_pipeline_layout("Et*3|(tt|)*6tmL");
  EXPECT_EQ(deepseek.stage_layers, (std::vector<int>{3, 2, 2, 2, 2, 2, 2, 1}));
  EXPECT_EQ(deepseek.mtp_layers, 1);
  EXPECT_EQ(deepseek.decoder_layers(), 16);
  // a launcher's escapes and Megatron's cosmetic commas; stages may hold no layer
  EXPECT_EQ(parse_pipeline_layout(R"(Et*3\|\(tt\|\)*6mL)").stage_layers, (std::vector<int>{3, 2, 2, 2, 2, 2, 2, 0}));
  EXPECT_EQ(parse_pipeline_layout("E|t*4,|t,t,t,t|L").stage_layers, (std::vector<int>{0, 4, 4, 0}));
  EXPECT_EQ(parse_pipeline_layout("E(t)*2|(t|)*2tL").stage_layers, (std::vector<int>{2, 1, 1, 1}));
  for (const char* bad : {"tt|L", "Ett|", "Et|L|t", "EtLt", "Et|m|tL", "EtmtL", "Etx|L", "Et*9999999L", "E(tt|L",
                          "EEt|L", "Et|LL"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_pipeline_layout(bad), InvalidArgument);
  }
}

TEST(MegatronArgs, APipelineLayoutGivesTheVirtualStagesAndTheirLayers) {
  const std::string base = "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 2 "
                           "--pipeline-model-parallel-size 2 --global-batch-size 4 ";
  const MegatronRun r = megatron_run(flags_of(base + "--pipeline-model-parallel-layout E|tttt|tttt|L"), std::nullopt, 0);
  EXPECT_EQ(r.step.layout.vp, 2);
  EXPECT_EQ(virtual_stage_layers(r.model, r.step.layout), (std::vector<int>{0, 4, 4, 0}));
  const std::vector<StageMemory> stages = step_memory(r.model, r.step);
  EXPECT_EQ(stages[0].layers, 4);
  EXPECT_EQ(stages[1].layers, 4);
  // The same layers as --decoder-first/last: stage 0 its 3, stage 1 the other 5.
  const MegatronRun layout = megatron_run(flags_of(base + "--pipeline-model-parallel-layout Ettt|t*5L"), std::nullopt, 0);
  const MegatronRun uneven = megatron_run(flags_of(base + "--decoder-first-pipeline-num-layers 3"), std::nullopt, 0);
  const std::vector<StageMemory> a = step_memory(layout.model, layout.step), b = step_memory(uneven.model, uneven.step);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(a[s].peak_bytes, b[s].peak_bytes) << s;
  // MTP layers where --mtp-num-layers says, and on the last stage
  EXPECT_NO_THROW(megatron_run(flags_of(base + "--mtp-num-layers 1 --pipeline-model-parallel-layout Ettt|t*5mL"),
                               std::nullopt, 0));
  for (const char* bad : {"--pipeline-model-parallel-layout Ettt|t*4L", "--pipeline-model-parallel-layout Et*8|L|t",
                          "--pipeline-model-parallel-layout Ett|t*3|t*3L",
                          "--pipeline-model-parallel-layout Ettt|t*5mL",
                          "--mtp-num-layers 1 --pipeline-model-parallel-layout Ettt|t*5L",
                          "--pipeline-model-parallel-layout Ettt|t*5L --decoder-first-pipeline-num-layers 3",
                          "--pipeline-model-parallel-layout Ettt|t*5L --num-virtual-stages-per-pipeline-rank 2"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(
        {
          const MegatronRun run = megatron_run(flags_of(base + bad), std::nullopt, 0);
          step_memory(run.model, run.step);
        },
        InvalidArgument);
  }
}

TEST(MegatronArgs, SinkhornRoutingAndLatentNormsAsMegatronCoreBuildsThem) {
  const std::string base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --world-size 4 "
                           "--tensor-model-parallel-size 2 --sequence-parallel --num-experts 4 ";
  EXPECT_TRUE(megatron_run(flags_of(base + "--moe-router-load-balancing-type sinkhorn --moe-router-topk 1"),
                           std::nullopt, 0)
                  .model.layer.moe.megatron.sinkhorn);
  for (const char* bad : {"--moe-router-load-balancing-type sinkhorn --moe-aux-loss-coeff 1e-2",
                          "--moe-router-load-balancing-type sinkhorn aux_loss"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(megatron_run(flags_of(base + bad), std::nullopt, 0), InvalidArgument);
  }
  // Qwen2-MoE's shared-expert gate: one h-vector per MoE layer, and it needs shared experts.
  const std::string shared = base + "--moe-shared-expert-intermediate-size 32 ";
  const MegatronRun gated = megatron_run(flags_of(shared + "--moe-shared-expert-gate"), std::nullopt, 0);
  const MegatronRun ungated = megatron_run(flags_of(shared), std::nullopt, 0);
  EXPECT_TRUE(gated.model.layer.moe.megatron.shared_expert_gate);
  EXPECT_EQ(layer_parameters(gated.model, 0, gated.step.layout).dense -
                layer_parameters(ungated.model, 0, ungated.step.layout).dense,
            64);
  EXPECT_THROW(megatron_run(flags_of(base + "--moe-shared-expert-gate"), std::nullopt, 0), InvalidArgument);
  // With latent attention --qk-layernorm is the latents' norms; without it they are absent.
  const std::string mla = base + "--multi-latent-attention --q-lora-rank 16 --kv-lora-rank 8 ";
  const MegatronRun normed = megatron_run(flags_of(mla + "--qk-layernorm"), std::nullopt, 0);
  const MegatronRun bare = megatron_run(flags_of(mla), std::nullopt, 0);
  EXPECT_TRUE(normed.model.layer.mla.latent_norms);
  EXPECT_FALSE(normed.model.layer.qk_layernorm);
  EXPECT_FALSE(bare.model.layer.mla.latent_norms);
  // LayerNorm: weight and bias over each latent, 16 + 8 wide, on every rank
  EXPECT_EQ(layer_parameters(normed.model, 0, normed.step.layout).dense -
                layer_parameters(bare.model, 0, bare.step.layout).dense,
            2 * (16 + 8));
}
