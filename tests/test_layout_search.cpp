// theory/layout_search and the llama closed forms it uses (theory/llama_memory): the closed
// forms against a count written here, the schedule's in-flight counts, and the search's
// memory breakdown and ordering, for llama, the paper's GPT models and mixtures of experts
// (their FLOPs against a GEMM-by-GEMM count written here, expert parallelism's memory and
// all-to-all time against hand counts).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <cmath>

#include "theory/flops.hpp"
#include "theory/llama_memory.hpp"
#include "theory/layout_search.hpp"
#include "theory/pipeline.hpp"

using namespace actbench;
using namespace actbench::theory;

TEST(LlamaMemory, ClosedFormsEqualTheCategoriesAtOddShapes) {
  // s, b, h, a, g, F, t with nothing a power of two, and t dividing a and g.
  for (const LlamaDims& d : {LlamaDims{1000, 3, 960, 12, 6, 2568, 3}, LlamaDims{4097, 1, 5120, 40, 8, 13824, 4},
                             LlamaDims{8192, 2, 8192, 64, 8, 28672, 8}, LlamaDims{77, 5, 96, 6, 1, 200, 1}})
    for (const std::string& name : config_names())
      for (bool fused : {false, true}) {
        LayerPolicy c = parse_config(name);
        c.attention = fused ? Attention::fused : Attention::unfused;
        EXPECT_EQ(llama_activation_bytes(d, c), llama_closed_form(d, c)) << name << " fused=" << fused << " h=" << d.h;
      }
}

TEST(LlamaMemory, GroupedQueryAttentionSavesOnlyKeysAndValues) {
  const LlamaDims gqa{8192, 1, 8192, 64, 8, 28672, 8}, mha{8192, 1, 8192, 64, 64, 28672, 8};
  const LayerPolicy c = parse_config("selective+sp");
  // k and v: 2 · 2sbh/t · (1 − g/a)
  EXPECT_EQ(llama_activation_bytes(mha, c) - llama_activation_bytes(gqa, c), 2 * 2 * 8192.0 * 8192 / 8 * (1 - 8.0 / 64));
}

TEST(LayoutSearch, FirstChunkHoldsMinPNFor1F1BAnd2PInterleaved) {
  for (int p : {2, 4, 8}) {
    EXPECT_EQ(first_chunk_microbatches_in_flight(p, 3 * p, 1), p);
    EXPECT_EQ(first_chunk_microbatches_in_flight(p, p - 1, 1), p - 1);  // fewer micro-batches than stages
    for (int m : {2, 3}) EXPECT_EQ(first_chunk_microbatches_in_flight(p, 4 * p, m), 2 * p) << "p=" << p << " m=" << m;
  }
}

// Stage 0's peaks walked on the whole order, op by op.
StageZeroPeaks peaks_of_whole_order(int p, int n, int m) {
  const auto order = pipeline_order(p, n, m);
  StageZeroPeaks whole;
  whole.chunks = max_in_flight(order)[0];
  int live = 0;
  for (const PipelineOp& op : order[0])
    if (op.chunk == 0)
      whole.first_chunk_microbatches = std::max(whole.first_chunk_microbatches, live += op.forward ? 1 : -1);
  return whole;
}

TEST(LayoutSearch, StageZeroPeaksEqualTheWholeOrdersAtEveryLength) {
  for (int p = 1; p <= 9; ++p)
    for (int m = 1; m <= 4; ++m)
      for (int n = 1; n <= 14 * p; ++n) {
        if (m > 1 && n % p != 0) continue;
        const StageZeroPeaks got = stage_zero_in_flight(p, n, m), want = peaks_of_whole_order(p, n, m);
        EXPECT_EQ(got.chunks, want.chunks) << "p=" << p << " n=" << n << " m=" << m;
        EXPECT_EQ(got.first_chunk_microbatches, want.first_chunk_microbatches) << "p=" << p << " n=" << n << " m=" << m;
      }
}

TEST(LayoutSearch, StageZeroPeaksDoNotWalkEveryMicrobatch) {
  // 2^24 micro-batches on 64 stages: a whole order would hold billions of ops.
  const StageZeroPeaks peaks = stage_zero_in_flight(64, 1 << 24, 4);
  EXPECT_EQ(peaks.chunks, 64 * 4 + 64 - 1);
  EXPECT_EQ(peaks.first_chunk_microbatches, 2 * 64);
  EXPECT_EQ(stage_zero_in_flight(64, 1 << 24, 1).chunks, 64);
}

TEST(LayoutSearch, ManyLayersOrAHugeBatchCostNoMoreThanTheGpuCount) {
  PlanRequest r;
  r.model = plan_model("llama3-8b");
  r.model.L = kMaxPlanLayers;  // divisors are looked for among the pipeline sizes the GPUs allow, not up to L
  r.gpu = plan_gpu("h100");
  r.gpus = 64;
  r.global_batch = 1 << 24;
  const auto plans = plan_search(r);
  ASSERT_FALSE(plans.empty());
  for (const PlanCandidate& k : plans) {
    EXPECT_EQ(k.t * k.cp * k.p * k.dp, 64);
    EXPECT_EQ(std::fmod(r.model.L, k.p), 0);
  }
}

TEST(LayoutSearch, PipelineSizesAreTheDivisorsOfLThatTheGpusAllowInOrder) {
  PlanRequest r;
  r.model = plan_model("llama3-8b");  // L = 32
  r.gpu = plan_gpu("b200");
  r.gpus = 96;
  r.global_batch = 96;
  std::vector<int> seen;
  for (const PlanCandidate& k : plan_search(r))
    if (std::find(seen.begin(), seen.end(), k.p) == seen.end()) seen.push_back(k.p);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 4, 8, 16, 32}));
}

TEST(LayoutSearch, Llama70bOn64H100At8kHasPlansThatFitAndAddUp) {
  PlanRequest r;
  r.model = plan_model("llama3-70b");
  r.gpu = plan_gpu("h100");
  r.gpus = 64;
  r.seq = 8192;
  r.global_batch = 128;
  const auto plans = plan_search(r);
  ASSERT_FALSE(plans.empty());
  ASSERT_TRUE(plans.front().fits);
  bool seen_unfit = false;
  for (size_t i = 0; i < plans.size(); ++i) {
    const PlanCandidate& k = plans[i];
    EXPECT_EQ(k.t * k.cp * k.p * k.dp, 64);
    EXPECT_EQ(std::fmod(8, k.t), 0);  // kv-heads split whole
    const double step = k.weight_bytes + k.grad_bytes + k.optimizer_bytes + k.workspace_bytes + k.activation_bytes + k.extra_bytes +
                        k.working_set_bytes;
    EXPECT_DOUBLE_EQ(k.total_bytes, std::max(step, k.setup_bytes) + k.headroom_bytes);
    EXPECT_EQ(k.fits, k.total_bytes <= r.gpu.memory_bytes);
    EXPECT_EQ(k.grad_bytes, 2 * k.weight_bytes);
    EXPECT_EQ(k.optimizer_bytes, 6 * k.weight_bytes);  // replicated Adam: 12 B vs 2 B per parameter
    EXPECT_NE(k.config.find("selective"), 0u) << "fused attention: selective equals none and is left out";
    if (!k.fits) {
      seen_unfit = true;
    } else {
      EXPECT_FALSE(seen_unfit) << "fitting plans come first";
    }
    if (i > 0 && plans[i - 1].fits == k.fits) {
      EXPECT_LE(plans[i - 1].iteration_s, k.iteration_s);
    }
    const LlamaDims d{8192 / k.cp, k.b, 8192, 64, 8, 28672, static_cast<double>(k.t)};  // fused: s/C rows
    LayerPolicy c = parse_config(k.config);
    c.attention = Attention::fused;
    EXPECT_EQ(k.per_layer_activation_bytes, llama_activation_bytes(d, c) + llama_norm_stats_bytes(d, c));
    if (k.stage == 0 && k.m == 1 && k.microbatches >= k.p) {
      // 1F1B: p micro-batches of L/p layers (one fewer at the embedding's backward).
      EXPECT_TRUE(k.layers_in_flight == 80 || k.layers_in_flight == 80 - 80 / k.p) << k.layers_in_flight;
    }
  }
  // A hand count: t 8, p 4, 1F1B, b 1, sp: stage 0 peaks with 80 layers' worth of the sp row
  // (and the RMSNorms' fp32 rstd), 20 layers of weights (2 norms of h, the rest /8) + the word
  // embedding's 128256 rows padded to a multiple of 128 x 8, / 8.
  const auto it = std::find_if(plans.begin(), plans.end(), [](const PlanCandidate& k) {
    return k.t == 8 && k.cp == 1 && k.p == 4 && k.m == 1 && k.b == 1 && k.config == "sp";
  });
  ASSERT_NE(it, plans.end());
  ASSERT_EQ(it->stage, 0);
  const double h = 8192, layer = 2 * h + ((64 + 16) * 128 * h + h * h + 3 * 28672 * h) / 8;
  EXPECT_DOUBLE_EQ(it->params_per_gpu, 20 * layer + 129024 * h / 8);
  const LlamaDims sp_dims{8192, 1, h, 64, 8, 28672, 8};
  const LayerPolicy sp{Recompute::none, true, Attention::fused};
  EXPECT_DOUBLE_EQ(it->activation_bytes, 80 * (llama_closed_form(sp_dims, sp) + llama_norm_stats_bytes(sp_dims, sp)));
  // Token ids of the 4 micro-batches in flight, with the shard's ids and the masked rows' indices at t = 8.
  EXPECT_DOUBLE_EQ(it->extra_bytes, (8 + 8 + 7) * 8192 * 4.0);
  // The distributed optimizer shards Adam's 12 bytes over dp.
  r.distributed_optimizer = true;
  for (const PlanCandidate& k : plan_search(r)) EXPECT_DOUBLE_EQ(k.optimizer_bytes, 6 * k.weight_bytes / (k.dp * k.cp));
}

// Megatron-FSDP's ZeRO-3 in the search: the weights and gradients of every candidate divided
// over its data-parallel group as the optimizer state is, so more layouts fit; it sends more
// per step (two all-gathers and a reduce-scatter per micro-batch), so at equal layout it is
// never faster than the distributed optimizer.
TEST(LayoutSearch, MegatronFsdpShardsEveryCandidatesWeightsAndCostsTraffic) {
  PlanRequest r;
  r.model = plan_model("llama3-70b");
  r.gpu = plan_gpu("h100");
  r.gpus = 64;
  r.seq = 4096;
  r.global_batch = 64;
  r.distributed_optimizer = true;
  const std::vector<PlanCandidate> ddp = plan_search(r);
  r.sharding.fsdp = true, r.sharding.level = DpShard::parameters;
  const std::vector<PlanCandidate> zero3 = plan_search(r);
  ASSERT_EQ(ddp.size(), zero3.size());
  auto key = [](const PlanCandidate& k) {
    return std::make_tuple(k.t, k.cp, k.p, k.m, k.dp, k.b, k.config, k.modules, k.ep, k.etp);
  };
  std::map<decltype(key(ddp.front())), const PlanCandidate*> by_layout;
  for (const PlanCandidate& k : ddp) by_layout[key(k)] = &k;
  int fits_ddp = 0, fits_zero3 = 0;
  for (const PlanCandidate& k : zero3) {
    const PlanCandidate& d = *by_layout.at(key(k));
    const double shards = k.dp * k.cp;
    // the candidate's peak stage may differ between the two: its own parameters are the base
    EXPECT_DOUBLE_EQ(k.weight_bytes, 2 * k.params_per_gpu / shards);
    EXPECT_DOUBLE_EQ(k.grad_bytes, 4 * k.params_per_gpu / shards);
    EXPECT_DOUBLE_EQ(k.optimizer_bytes, 12 * k.params_per_gpu / shards);
    EXPECT_DOUBLE_EQ(d.weight_bytes, 2 * d.params_per_gpu);
    if (k.dp * k.cp > 1 && k.microbatches > 1) EXPECT_GT(k.iteration_s, d.iteration_s);
    fits_ddp += d.fits, fits_zero3 += k.fits;
  }
  EXPECT_GT(fits_zero3, fits_ddp);
}

// A million tokens: no layout without context parallelism fits 64 H100s, the search finds
// ones with it, and each candidate's C is a power of two whose 2C chunks cut s evenly.
TEST(LayoutSearch, AMillionTokensFitOnlyWithContextParallelism) {
  PlanRequest r;
  r.model = plan_model("llama3-8b");
  r.gpu = plan_gpu("h100");
  r.gpus = 64;
  r.seq = 1 << 20;
  r.global_batch = 8;
  r.distributed_optimizer = true;
  const auto plans = plan_search(r);
  ASSERT_TRUE(plans.front().fits);
  std::vector<int> seen;
  for (const PlanCandidate& k : plans) {
    EXPECT_EQ(k.t * k.cp * k.p * k.dp, 64);
    EXPECT_EQ(k.cp & (k.cp - 1), 0);
    if (k.cp == 1) EXPECT_FALSE(k.fits) << k.t << " " << k.p << " " << k.config;
    if (std::find(seen.begin(), seen.end(), k.cp) == seen.end()) seen.push_back(k.cp);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 4, 8, 16, 32, 64}));
  r.max_cp = 1;
  for (const PlanCandidate& k : plan_search(r)) EXPECT_EQ(k.cp, 1);
  r.max_cp = 64;
  r.seq = 6 * 1024 + 4;  // 2C | s only for C = 1, 2
  for (const PlanCandidate& k : plan_search(r)) EXPECT_LE(k.cp, 2);
  r.seq = 1 << 20;
  r.attention = Attention::unfused;  // the ring needs fused attention; all_gather does not
  for (const PlanCandidate& k : plan_search(r)) EXPECT_EQ(k.cp, 1);
  r.cp_comm = CpCommType::all_gather;
  bool found = false;
  for (const PlanCandidate& k : plan_search(r)) found |= k.cp > 1;
  EXPECT_TRUE(found);
  r.cp_comm = CpCommType::a2a;  // heads 32 and 8 kv-heads over t·C
  for (const PlanCandidate& k : plan_search(r)) EXPECT_EQ(std::fmod(8, k.t * k.cp), 0);
}

// What one rank sends per layer: p2p C − 1 key/value blocks forward and twice that backward
// (k, v and dk, dv); all_gather the other ranks' shares; a2a q, k, v and the output each way.
TEST(LayoutSearch, ContextParallelExchangeBytes) {
  const TransformerModel m = plan_model("llama3-8b");  // a 32, g 8, d 128
  const double s = 65536, kv = 2 * 2 * (s / 4) * 8 * 128 / 2;  // k and v of s/C rows at t = 2, bf16
  EXPECT_EQ(cp_exchange_bytes(m, s, 1, 2, 1, CpCommType::p2p, false), 0);
  EXPECT_EQ(cp_exchange_bytes(m, s, 1, 2, 4, CpCommType::p2p, false), 3 * 3 * kv);
  EXPECT_EQ(cp_exchange_bytes(m, s, 1, 2, 4, CpCommType::p2p, true), 4 * 3 * kv);
  EXPECT_EQ(cp_exchange_bytes(m, s, 1, 2, 4, CpCommType::all_gather, false), 3 * 0.75 * 4 * kv);
  EXPECT_EQ(cp_exchange_bytes(m, s, 1, 2, 4, CpCommType::a2a, false), 2 * 0.75 * 2 * (s / 4) * (64 + 16) * 128 / 2);
  // Latent attention: every head its own k (d_qk = 128 + 64, the RoPE part in each) and v (128).
  const TransformerModel ds = plan_model("deepseek-v3");  // a 128
  const double mla_kv = 2 * (s / 4) * 128 * (192 + 128) / 2;
  EXPECT_EQ(cp_exchange_bytes(ds, s, 1, 2, 4, CpCommType::p2p, false), 3 * 3 * mla_kv);
  EXPECT_EQ(cp_exchange_bytes(ds, s, 1, 2, 4, CpCommType::a2a, false),
            2 * 0.75 * 2 * (s / 4) * (128 + 128) * (192 + 128) / 2);  // q, out (a) and k, v (a): d_qk + d_v
}

TEST(LayoutSearch, BadRequestsAreInvalidArguments) {
  PlanRequest r;
  r.model = plan_model("llama3-8b");
  r.gpu = plan_gpu("b200");
  r.gpus = 8;
  r.global_batch = 0;
  EXPECT_THROW(plan_search(r), std::invalid_argument);
  r.global_batch = 3;
  r.gpus = 3;  // no t in {1,2,4,8} with p | 32 and dp | 3 ... t = 1, p = 1, dp = 3 works
  EXPECT_NO_THROW(plan_search(r));
  r.gpus = 7;
  r.global_batch = 5;  // dp must divide 5: t=1,p=1 gives dp=7
  EXPECT_THROW(plan_search(r), std::invalid_argument);
  EXPECT_THROW(plan_model("llama2-7b"), std::invalid_argument);
  EXPECT_THROW(plan_gpu("v100"), std::invalid_argument);
}

TEST(LayoutSearch, ThePapersGptModelsPlanToo) {
  PlanRequest r;
  r.model = plan_model("175b");
  ASSERT_TRUE(r.model.learned_positions);
  r.gpu = plan_gpu("a100");
  r.gpus = 64;
  r.seq = 2048;
  r.global_batch = 64;
  r.attention = Attention::unfused;
  const auto plans = plan_search(r);
  ASSERT_FALSE(plans.empty());
  EXPECT_TRUE(plans.front().fits);
  bool seen_selective = false;
  for (const PlanCandidate& k : plans) {
    const LayerPolicy c = parse_config(k.config);
    seen_selective |= c.recompute == Recompute::selective;
    const Dims d{2048, k.b, 12288, 96, static_cast<double>(k.t)};
    EXPECT_EQ(k.per_layer_activation_bytes, activation_bytes(d, c) + layernorm_stats_bytes(d, c));
    // 12 h² + 7h split over t, 6h replicated per layer; word embedding /t and positions whole on
    // the first stage; the final LayerNorm and (p > 1) the tied output weight's copy on the last.
    const double h = 12288, layer = (12 * h * h + 7 * h) / k.t + 6 * h;
    double params = 96.0 / k.p * layer;
    if (k.stage == 0) params += 51200 * h / k.t + 2048 * h;
    if (k.stage == k.p - 1) params += 2 * h + (k.p > 1 ? 51200 * h / k.t : 0);
    EXPECT_DOUBLE_EQ(k.params_per_gpu, params) << k.t << " " << k.p;
  }
  EXPECT_TRUE(seen_selective) << "unfused attention: selective recompute is searched";
}

// ---- mixtures of experts ----

// 2·M·K·N: one (M × K)·(K × N) GEMM.
double gemm(double M, double K, double N) { return 2 * M * K * N; }

// A small MoE layer with every piece: GQA, a head size other than h/a, SwiGLU, shared experts.
LayerSpec small_moe_spec() {
  LayerSpec spec = llama_layer_spec(2, 96);
  spec.kv_channels = 24;  // a·d = 96 ≠ h = 64
  spec.moe.num_experts = 6, spec.moe.top_k = 2, spec.moe.ffn_hidden = 40, spec.moe.shared_ffn_hidden = 56;
  return spec;
}

TEST(MoePlan, LayerFlopsEqualAGemmByGemmCount) {
  const double h = 64, a = 4, g = 2, d = 24, batch = 3, s = 10, T = batch * s, E = 6, k = 2, Fe = 40, Fs = 56;
  const LayerSpec spec = small_moe_spec();
  const LayerFlops f = spec_layer_forward_flops(spec, h, a, batch, s, AttentionSpan::full);
  // q, k, v and the output projection; per sequence and head QKᵀ (s×d by d×s) and ·V (s×s by s×d).
  EXPECT_DOUBLE_EQ(f.attention_linear, gemm(T, h, a * d) + 2 * gemm(T, h, g * d) + gemm(T, a * d, h));
  EXPECT_DOUBLE_EQ(f.core_attention, batch * a * (gemm(s, d, s) + gemm(s, s, d)));
  EXPECT_DOUBLE_EQ(f.router, gemm(T, h, E));
  // Each of the T·k (token, expert) pairs: fc1 to gate | up (2Fe), fc2 back to h.
  EXPECT_DOUBLE_EQ(f.experts, T * k * (gemm(1, h, 2 * Fe) + gemm(1, Fe, h)));
  EXPECT_DOUBLE_EQ(f.shared_experts, gemm(T, h, 2 * Fs) + gemm(T, Fs, h));
  EXPECT_EQ(f.mlp, 0);
  EXPECT_DOUBLE_EQ(f.total(), f.attention_linear + f.core_attention + f.router + f.experts + f.shared_experts);
  const LayerFlops causal = spec_layer_forward_flops(spec, h, a, batch, s, AttentionSpan::causal);
  EXPECT_DOUBLE_EQ(causal.core_attention, f.core_attention / 2);
  // The same layer dense: its MLP of F = 96, no experts.
  LayerSpec dense = spec;
  dense.moe = {};
  const LayerFlops fd = spec_layer_forward_flops(dense, h, a, batch, s, AttentionSpan::full);
  EXPECT_DOUBLE_EQ(fd.mlp, gemm(T, h, 2 * 96) + gemm(T, 96, h));
  EXPECT_EQ(fd.moe(), 0);

  // What recompute reruns: everything (full), each module's GEMMs (selective); moe_act only
  // elementwise work.
  auto rerun = [&](Recompute r, RecomputeModules m, Attention att = Attention::fused) {
    LayerPolicy c;
    c.recompute = r, c.modules = m, c.attention = att;
    return recompute_forward_flops(f, c);
  };
  const RecomputeModules none{false, false, false};
  RecomputeModules moe = none, shared = none, act = none, core = none;
  moe.moe = true, shared.shared_experts = true, act.moe_act = true, core.core_attn = true;
  EXPECT_DOUBLE_EQ(rerun(Recompute::full, none), f.total());
  EXPECT_EQ(rerun(Recompute::none, moe), 0);
  EXPECT_DOUBLE_EQ(rerun(Recompute::selective, moe), gemm(T, h, E) + f.experts + f.shared_experts);
  EXPECT_DOUBLE_EQ(rerun(Recompute::selective, shared), gemm(T, h, 2 * Fs) + gemm(T, Fs, h));
  EXPECT_EQ(rerun(Recompute::selective, act), 0);
  EXPECT_DOUBLE_EQ(rerun(Recompute::selective, core, Attention::unfused), batch * a * gemm(s, d, s));  // QKᵀ only
}

// One rank's all-to-all bytes per MoE layer and micro-batch: its s·b/(t·C) tokens' k choices,
// h wide in bf16, 3/4 of them leaving the rank at ep 4, four exchanges (six when rerun).
TEST(MoePlan, ExpertParallelExchangeBytes) {
  const TransformerModel m = plan_model("mixtral-8x7b");  // h 4096, k 2
  const double sent = 4096.0 / (2 * 2) * 2 * 4096 * 2 * 3 / 4;  // s 4096, b 1, t 2, C 2
  EXPECT_EQ(ep_exchange_bytes(m, 4096, 1, 2, 2, 1, false), 0);
  EXPECT_DOUBLE_EQ(ep_exchange_bytes(m, 4096, 1, 2, 2, 4, false), 4 * sent);
  EXPECT_DOUBLE_EQ(ep_exchange_bytes(m, 4096, 1, 2, 2, 4, true), 6 * sent);
  EXPECT_DOUBLE_EQ(ep_exchange_bytes(m, 4096, 2, 2, 2, 4, false), 8 * sent);  // b 2: twice the tokens
}

PlanRequest mixtral_on_64_h100() {
  PlanRequest r;
  r.model = plan_model("mixtral-8x7b");
  r.gpu = plan_gpu("h100");
  r.gpus = 64;
  r.global_batch = 64;
  return r;
}

bool same_layout_and_config(const PlanCandidate& x, const PlanCandidate& y) {
  return x.t == y.t && x.cp == y.cp && x.p == y.p && x.m == y.m && x.dp == y.dp && x.b == y.b &&
         x.config == y.config && x.modules == y.modules;
}
bool same_but_ep(const PlanCandidate& x, const PlanCandidate& y) {
  return same_layout_and_config(x, y) && x.etp == y.etp;
}

TEST(MoePlan, Mixtral8x7bOn64H100HasPlansThatFitWithinMegatronsRules) {
  const PlanRequest r = mixtral_on_64_h100();
  const auto plans = plan_search(r);
  ASSERT_FALSE(plans.empty());
  ASSERT_TRUE(plans.front().fits);
  std::vector<int> eps;
  bool seen_moe_module = false, seen_etp = false;
  for (const PlanCandidate& k : plans) {
    EXPECT_EQ(k.t * k.cp * k.p * k.dp, 64);
    EXPECT_EQ(8 % k.ep, 0) << "ep divides the experts";
    EXPECT_TRUE(k.etp == 1 || k.etp == k.t) << "etp 1 or t";
    EXPECT_EQ((k.t * k.cp * k.dp) % (k.ep * k.etp), 0) << "ep·etp divides t·C·dp";
    seen_etp |= k.etp > 1;
    if (k.t > 1) EXPECT_NE(k.config.find("sp"), std::string::npos) << "MoE under TP needs SP: " << k.config;
    if (k.ep == 1) EXPECT_EQ(k.a2a_s, 0);
    if (k.ep > 1) EXPECT_GT(k.a2a_s, 0);
    const double step = k.weight_bytes + k.grad_bytes + k.optimizer_bytes + k.workspace_bytes + k.activation_bytes + k.extra_bytes +
                        k.working_set_bytes;
    EXPECT_DOUBLE_EQ(k.total_bytes, std::max(step, k.setup_bytes) + k.headroom_bytes);
    EXPECT_EQ(k.fits, k.total_bytes <= r.gpu.memory_bytes);
    // The stage's E/ep experts (fc1 gate | up, fc2; no biases), each split over etp, on each of
    // its L/p layers.
    EXPECT_DOUBLE_EQ(k.expert_params_per_gpu, 32.0 / k.p * (8 / k.ep) * 3 * 4096 * 14336 / k.etp);
    if (k.config.find("selective") == 0) {
      // Fused attention: only the MoE modules, one each (no shared experts in Mixtral).
      EXPECT_TRUE(k.modules == "moe_act" || k.modules == "moe") << k.modules;
      seen_moe_module |= k.modules == "moe";
    } else {
      EXPECT_EQ(k.modules, "");
    }
    if (std::find(eps.begin(), eps.end(), k.ep) == eps.end()) eps.push_back(k.ep);
  }
  std::sort(eps.begin(), eps.end());
  EXPECT_EQ(eps, (std::vector<int>{1, 2, 4, 8}));
  EXPECT_TRUE(seen_moe_module);
  EXPECT_TRUE(seen_etp);
}

// Fine-grained offloading changes a plan's activations only: each layout keeps its weights,
// state and iteration time, and holds at most the activations it held without it.
TEST(MoePlan, OffloadingLowersActivationsAndLeavesTheRest) {
  PlanRequest r = mixtral_on_64_h100();
  const std::vector<PlanCandidate> plain = plan_search(r);
  r.offload = parse_offload_modules("core_attn,attn_proj,expert_fc1,moe_act");
  const std::vector<PlanCandidate> offloaded = plan_search(r);
  ASSERT_EQ(plain.size(), offloaded.size());
  int lower = 0;
  for (const PlanCandidate& k : offloaded) {
    const auto same = std::find_if(plain.begin(), plain.end(), [&](const PlanCandidate& y) {
      return same_but_ep(k, y) && y.ep == k.ep;
    });
    ASSERT_NE(same, plain.end()) << k.config;
    EXPECT_LE(k.activation_bytes, same->activation_bytes) << k.config;
    lower += k.activation_bytes < same->activation_bytes;
    if (k.stage != same->stage) continue;  // the reported stage (the highest peak) moved
    EXPECT_EQ(k.weight_bytes + k.grad_bytes + k.optimizer_bytes, same->weight_bytes + same->grad_bytes + same->optimizer_bytes);
    EXPECT_EQ(k.iteration_s, same->iteration_s);
  }
  EXPECT_GT(lower, 0);
}

// Expert parallelism shrinks each GPU's experts by ep and adds the all-to-alls: the iteration
// changes by exactly the all-to-all time, less the smaller expert gradient reduction and Adam step.
TEST(MoePlan, ExpertParallelismTradesMemoryForAllToAllTime) {
  const PlanRequest r = mixtral_on_64_h100();
  const auto plans = plan_search(r);
  const Gpu& G = r.gpu;
  int compared = 0;
  for (const PlanCandidate& k : plans) {
    if (k.ep == 1) continue;
    const auto twin = std::find_if(plans.begin(), plans.end(), [&](const PlanCandidate& y) {
      return y.ep == 1 && same_but_ep(k, y);
    });
    ASSERT_NE(twin, plans.end());
    const double experts_saved = twin->expert_params_per_gpu - k.expert_params_per_gpu;
    EXPECT_DOUBLE_EQ(experts_saved, twin->expert_params_per_gpu * (1 - 1.0 / k.ep));
    EXPECT_DOUBLE_EQ(twin->weight_bytes - k.weight_bytes, 2 * experts_saved);  // bf16
    EXPECT_LT(k.total_bytes, twin->total_bytes);
    // All-to-all: the slowest stage's L/p layers, each micro-batch's four exchanges (six when
    // the block is rerun), the schedule's N + (p − 1)/m micro-batch times.
    const bool rerun = k.config.find("full") == 0 || k.modules == "moe";
    const double tokens = 4096.0 * k.b / (k.t * k.cp);
    const double bytes = (rerun ? 6 : 4) * tokens * 2 * 4096 * 2 * (k.ep - 1.0) / k.ep;
    const double link = k.ep <= 8 ? G.nvlink_bytes_per_s : G.network_bytes_per_s;
    const double a2a = (k.microbatches + (k.p - 1.0) / k.m) * (32.0 / k.p) * bytes / link;
    EXPECT_NEAR(k.a2a_s, a2a, 1e-12 * a2a);
    // Replicated Adam: 30 bytes of HBM traffic per parameter; the experts' fp32 gradients
    // all-reduced (2(n−1)/n of them) over their expert-data-parallel group t·C·dp/(ep·etp).
    auto reduce = [&](const PlanCandidate& c) {
      const double n = static_cast<double>(c.t) * c.cp * c.dp / (c.ep * c.etp);
      return 2 * (n - 1) / n * c.expert_params_per_gpu * 4 / G.network_bytes_per_s;
    };
    const double saved = 30 * experts_saved / G.hbm_bytes_per_s + reduce(*twin) - reduce(k);
    EXPECT_NEAR(k.iteration_s - twin->iteration_s, a2a - saved, 1e-9 * twin->iteration_s);
    ++compared;
  }
  EXPECT_GT(compared, 100);
}

// Expert tensor parallelism (etp = t) splits each GPU's experts t ways more and adds, per MoE
// layer and micro-batch, the TP gather of the rows the experts received and the reduce-scatter
// of their partial outputs: against its etp = 1 twin the iteration changes by exactly that
// NVLink time less the smaller expert reduction and Adam step.
TEST(MoePlan, ExpertTensorParallelismTradesMemoryForTheGroupsGather) {
  const PlanRequest r = mixtral_on_64_h100();
  const auto plans = plan_search(r);
  const Gpu& G = r.gpu;
  int compared = 0;
  for (const PlanCandidate& k : plans) {
    if (k.etp == 1) continue;
    ASSERT_EQ(k.etp, k.t);
    const auto twin = std::find_if(plans.begin(), plans.end(), [&](const PlanCandidate& y) {
      return y.etp == 1 && y.ep == k.ep && same_layout_and_config(k, y);
    });
    ASSERT_NE(twin, plans.end());
    EXPECT_DOUBLE_EQ(k.expert_params_per_gpu, twin->expert_params_per_gpu / k.t);
    EXPECT_EQ(k.a2a_s, twin->a2a_s);  // the EP all-to-alls are the same
    const bool rerun = k.config.find("full") == 0 || k.modules == "moe";
    const double tokens = 4096.0 * k.b / (k.t * k.cp);
    const double bytes = (rerun ? 6 : 4) * tokens * 2 * 4096 * 2 * (k.t - 1.0);
    EXPECT_DOUBLE_EQ(etp_exchange_bytes(r.model, 4096, k.b, k.t, k.cp, k.etp, rerun), bytes);
    const double gather = (k.microbatches + (k.p - 1.0) / k.m) * (32.0 / k.p) * bytes / G.nvlink_bytes_per_s;
    // Replicated Adam (30 bytes of HBM traffic per parameter) and the fp32 gradients' ring
    // all-reduces: the dense ones over dp·C, the experts' over t·C·dp/(ep·etp). Both on the
    // stage whose memory peaks, which the split experts may move (its embedding or final norm).
    auto step_s = [&](const PlanCandidate& c) {
      const double n = static_cast<double>(c.t) * c.cp * c.dp / (c.ep * c.etp), d = c.dp * c.cp;
      const double experts = n > 1 ? 2 * (n - 1) / n * c.expert_params_per_gpu * 4 : 0.0;
      const double dense = d > 1 ? 2 * (d - 1) / d * (c.params_per_gpu - c.expert_params_per_gpu) * 4 : 0.0;
      return 30 * c.params_per_gpu / G.hbm_bytes_per_s + (experts + dense) / G.network_bytes_per_s;
    };
    EXPECT_NEAR(k.iteration_s - twin->iteration_s, gather + step_s(k) - step_s(*twin), 1e-9 * twin->iteration_s);
    ++compared;
  }
  EXPECT_GT(compared, 50);
}

TEST(MoePlan, Qwen3SearchesItsManyExpertParallelSizes) {
  PlanRequest r;
  r.model = plan_model("qwen3-30b-a3b");  // 128 experts, no shared experts, head_dim 128 ≠ h/a
  r.gpu = plan_gpu("h100");
  r.gpus = 64;
  r.global_batch = 128;
  r.attention = Attention::unfused;
  r.cp_comm = CpCommType::all_gather;
  const auto plans = plan_search(r);
  ASSERT_TRUE(plans.front().fits);
  int largest = 1;
  std::vector<std::string> modules;
  for (const PlanCandidate& k : plans) {
    largest = std::max(largest, k.ep);
    if (std::find(modules.begin(), modules.end(), k.modules) == modules.end()) modules.push_back(k.modules);
  }
  EXPECT_EQ(largest, 64);
  std::sort(modules.begin(), modules.end());
  // Unfused: Megatron's default core_attn, and each MoE module alone or with it.
  EXPECT_EQ(modules, (std::vector<std::string>{"", "core_attn", "core_attn,moe", "core_attn,moe_act", "moe",
                                               "moe_act"}));
}

TEST(MoePlan, LatentAttentionFlopsEqualAGemmByGemmCount) {
  const double h = 64, a = 4, batch = 2, s = 12, T = batch * s, Lq = 20, Lkv = 16, dn = 8, dr = 4, dv = 10;
  LayerSpec spec = small_moe_spec();
  spec.kv_channels = 0;
  spec.mla = {true, Lq, Lkv, dn, dr, dv};
  const LayerFlops f = spec_layer_forward_flops(spec, h, a, batch, s, AttentionSpan::full);
  // q down and up, kv down (latent and the shared RoPE part), kv up (k's and v's head parts).
  const double up = gemm(T, Lq, a * (dn + dr)) + gemm(T, Lkv, a * (dn + dv));
  EXPECT_DOUBLE_EQ(f.latent_up, up);
  EXPECT_DOUBLE_EQ(f.attention_linear, gemm(T, h, Lq) + gemm(T, h, Lkv + dr) + up + gemm(T, a * dv, h));
  // Per sequence and head: QKᵀ over d_qk = dn + dr, ·V over dv.
  EXPECT_DOUBLE_EQ(f.core_attention, batch * a * (gemm(s, dn + dr, s) + gemm(s, s, dv)));
  spec.mla.q_lora_rank = 0;  // q straight from h, counted as mla_up_proj's
  const LayerFlops g = spec_layer_forward_flops(spec, h, a, batch, s, AttentionSpan::full);
  EXPECT_DOUBLE_EQ(g.latent_up, gemm(T, h, a * (dn + dr)) + gemm(T, Lkv, a * (dn + dv)));
  LayerPolicy c;
  c.recompute = Recompute::selective, c.modules = RecomputeModules{false, false, false};
  c.modules.mla_up_proj = true;
  EXPECT_DOUBLE_EQ(recompute_forward_flops(g, c), g.latent_up);
}

// DeepSeek-V3 (latent attention, 256 experts, its first 3 layers dense) on 61 stages of 8
// H100s: plans that fit, mla_up_proj searched.
TEST(MoePlan, DeepSeekV3Plans) {
  PlanRequest r;
  r.model = plan_model("deepseek-v3");
  r.gpu = plan_gpu("h100");
  r.gpus = 61 * 8;
  r.global_batch = 61 * 8;
  r.distributed_optimizer = true;
  const auto plans = plan_search(r);
  ASSERT_TRUE(plans.front().fits);
  bool seen_up_proj = false;
  for (const PlanCandidate& k : plans) {
    EXPECT_TRUE(k.p == 61 || (k.p == 1 && !k.fits)) << k.p;  // 61 layers: 671B whole on one stage never fits
    seen_up_proj |= k.modules == "mla_up_proj";
    // One layer a stage: stages 0-2 hold a dense layer, the others E/ep experts of 3·h·2048/etp.
    if (k.stage >= 3) EXPECT_DOUBLE_EQ(k.expert_params_per_gpu, 256.0 / k.ep * 3 * 7168 * 2048 / k.etp);
  }
  EXPECT_TRUE(seen_up_proj);
}

TEST(MoePlan, ARequestNoLayoutSuitsIsOneLine) {
  PlanRequest r = mixtral_on_64_h100();
  r.gpus = 7;
  r.global_batch = 5;  // t 1, p 1 (7 does not divide 32 layers), dp 7 does not divide 5
  try {
    plan_search(r);
    FAIL() << "planned";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no layout of 7 GPUs fits mixtral-8x7b"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// Only layers 0-7 of Mixtral's 32 with experts: the slowest stage is the one with most MoE
// layers, and its all-to-alls are theirs: all 8 on stage 0 at p 4 (as many as with every
// layer MoE), 4 per stage at p 4 interleaved (chunks of 4 layers), a quarter at p 1.
TEST(MoePlan, TheSlowestStageIsTheOneWithTheMostMoeLayers) {
  PlanRequest all = mixtral_on_64_h100(), first = all;
  first.model.moe_layers.assign(32, false);
  std::fill(first.model.moe_layers.begin(), first.model.moe_layers.begin() + 8, true);
  const auto every = plan_search(all), some = plan_search(first);
  int compared = 0;
  for (const PlanCandidate& k : some) {
    if (k.ep == 1 || (k.p != 1 && k.p != 4)) continue;
    const auto twin = std::find_if(every.begin(), every.end(), [&](const PlanCandidate& y) {
      return y.ep == k.ep && same_but_ep(k, y);
    });
    ASSERT_NE(twin, every.end());
    // p 4: stage 0's first chunk holds layers 0 .. 8/m − 1, its others none of 0-7.
    const double share = k.p == 1 ? 8.0 / 32 : 1.0 / k.m;
    EXPECT_NEAR(k.a2a_s, share * twin->a2a_s, 1e-12 * twin->a2a_s) << k.p << " " << k.m;
    ++compared;
  }
  EXPECT_GT(compared, 50);
}
