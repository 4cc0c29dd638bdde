#include "runners/result_columns.hpp"

#include "runtime/csv.hpp"
#include "runtime/error.hpp"

namespace actbench {

// Bytes and times are per layer and per tensor-parallel rank (rank 0's, the one that writes
// the row) unless a meaning says otherwise. "Empty unless ok": empty in status=oom rows.
const std::vector<Column>& result_columns() {
  static const std::vector<Column> columns = {
      {"backend", "", "`cpu`, `cuda` or `meta` (meta: the exact allocation schedule, nothing computed, no times)"},
      {"device", "",
       "the backend's device: the GPU's name as the driver reports it (e.g. `NVIDIA H100 80GB HBM3`), `host-cpu`, "
       "`meta`"},
      {"model", "",
       "the `--model` preset (runners/presets.cpp: the paper's Table 3 models, the llama3 family, `tiny`) or the "
       "`--hf-config` model's name; the shape columns say what ran"},
      {"hidden", "", "h, the hidden size"},
      {"heads", "", "a, the attention (query) heads"},
      {"seq", "tokens", "s, the sequence length"},
      {"batch", "sequences", "b, the microbatch"},
      {"tp", "ranks", "t, the tensor-parallel size"},
      {"emulated", "", "1: `--emulate-tp` (or `--emulate-cp`, `--emulate-ep`), one process played rank 0 of its "
                       "group (collectives replaced by local copies, communication time modeled); 0: real groups"},
      {"config", "", "`baseline` (tensor parallelism), `sp`, `full`, `selective`, `selective+sp` or `full+sp`"},
      {"attention", "",
       "`unfused` (the paper's core attention) or `fused` (FlashAttention-style: no a·s² tensors stored, an fp32 "
       "log-sum-exp per row instead; beyond the paper)"},
      {"recompute", "", "the config's recomputation: `none`, `selective` or `full`"},
      {"sequence_parallel", "", "1: the config is sequence parallel (the norms', dropouts' and residuals' activations sharded "
                                "along s over the t ranks)"},
      {"dtype", "", "the layer's tensors' type (`bf16`, `fp16`, `fp32`); masks are 1 byte, norm statistics fp32"},
      {"dropout", "probability",
       "the dropout probability when attention and hidden dropout are one (`--dropout`; 0 for the llama preset), "
       "written as the shortest %.{p}g that reads back as the float32 the run used; empty when they differ"},
      {"layers", "", "layers in the stack that ran; times and bytes are divided by it"},
      {"warmup", "iterations", "untimed iterations before the timed ones (meta and the simulator: 0 unless given)"},
      {"iters", "iterations",
       "timed iterations (meta and the simulator: 1 unless given; meta runs one iteration whatever this says)"},
      {"fwd_ms", "ms",
       "forward time per layer: the median over the timed iterations of each iteration's slowest rank, the "
       "emulated collectives' copies excluded (see `comm_ms_emulated`); empty on meta, on the simulator and "
       "unless ok"},
      {"bwd_ms", "ms", "the same for backward, recomputation included"},
      {"total_ms", "ms",
       "the same for forward and backward as one interval (its own median, not `fwd_ms` + `bwd_ms`)"},
      {"fwd_ms_min", "ms", "the fastest timed iteration's forward (as `fwd_ms`)"},
      {"fwd_ms_max", "ms", "the slowest timed iteration's forward (as `fwd_ms`)"},
      {"bwd_ms_min", "ms", "the fastest timed iteration's backward (as `bwd_ms`)"},
      {"bwd_ms_max", "ms", "the slowest timed iteration's backward (as `bwd_ms`)"},
      {"act_bytes", "bytes",
       "**measured**: the tensors a layer saves for backward, in the paper's categories (every layer of the "
       "stack saves the same; checked); under a `recompute_method`, whose layers differ, `stack_act_bytes` / "
       "`layers` rounded down; empty unless ok"},
      {"act_extra_bytes", "bytes",
       "saved bytes outside the paper's count: the norms' fp32 statistics (LayerNorm mean and rstd, RMSNorm "
       "rstd); empty unless ok"},
      {"act_bytes_formula", "bytes",
       "the formula at this shape, spec, dtype, t and config: theory::layer_bytes, the layer's pieces summed "
       "(Table 2 for the paper's layer, the llama family's closed form for its preset); under a "
       "`recompute_method`, `stack_act_bytes_formula` / `layers`; also in oom rows"},
      {"stack_act_bytes", "bytes",
       "**measured**: what the whole stack keeps for backward after forward: every layer's saved tensors in "
       "the paper's categories and the group checkpoints that `recompute_method` uniform holds; empty unless ok"},
      {"stack_act_bytes_formula", "bytes",
       "the stack's closed form: layers x act_bytes_formula without a `recompute_method`; block: N full "
       "layers' inputs and L - N layers that keep everything; uniform: ceil(L / N) group inputs"},
      {"fwd_retained_bytes", "bytes",
       "growth of the allocator's requested bytes across the stack's forward pass (its input counted, its "
       "output not), divided by `layers`; empty unless ok"},
      {"peak_allocated_bytes", "bytes",
       "the allocator's peak allocated bytes over the measured iteration (the first timed one; meta's only one) "
       "of the whole stack, with its parameters, gradients, input and upstream gradient resident; the cache is "
       "emptied before each configuration; oom rows: the peak up to the failure"},
      {"peak_reserved_bytes", "bytes", "the same for the allocator's reserved bytes (its segments, cache included)"},
      {"memory_limit_bytes", "bytes", "the emulated device capacity (`--memory-limit`; past it: oom), 0 = none"},
      {"comm_mode", "",
       "`none` (t = 1), `mpi` or `nccl` (measured, inside the times) or `modeled` (emulated TP: not inside the "
       "times)"},
      {"comm_bytes", "bytes",
       "ring bytes one rank sends in the TP/SP (and CP) collectives per layer over the measured iteration; empty "
       "unless ok"},
      {"link_gbps", "GB/s", "link bandwidth per direction assumed for `comm_ms_modeled` (`--link-gbps`)"},
      {"comm_ms_modeled", "ms", "`comm_bytes` at `link_gbps`, per layer and iteration; 0 when t = 1; empty unless ok"},
      {"comm_ms_emulated", "ms",
       "emulated TP only (`comm_mode=modeled`): the median time of the local copies that stand in for the "
       "collectives (SP's all-gathers and reduce-scatters), per layer, measured apart and not in "
       "`fwd_ms`/`bwd_ms`; 0 when there are none (baseline's all-reduce); empty for real groups, on meta, on the "
       "simulator and unless ok"},
      {"status", "", "`ok`, `oom` (out of memory: no measured activation bytes, communication or times; the peaks up to the "
                     "failure) or `failed` (written by the sweep driver for a point that ended without a row)"},
      {"message", "", "why the row is not ok (the allocator's message, or which rank ran out of memory); empty when ok"},
      {"seed", "", "seed of parameters, inputs and dropout masks"},
      {"git_sha", "", "the commit layer_run was built from"},
      {"driver_version", "", "cuda: the GPU driver's version; empty elsewhere"},
      {"cuda_runtime_version", "", "cuda: the CUDA runtime's version; empty elsewhere"},
      {"cublas_version", "", "cuda: cuBLAS's version; empty elsewhere"},
      {"nccl_version", "", "cuda: NCCL's version; empty elsewhere"},
      {"sm_clock_mhz_start", "MHz",
       "cuda: the GPU's SM clock before the configuration ran (NVML, loaded at run time); empty off a GPU or "
       "without NVML, as are the other GPU-state columns"},
      {"sm_clock_mhz_end", "MHz", "cuda: the SM clock after the configuration ran"},
      {"mem_clock_mhz_start", "MHz", "cuda: the memory clock before the configuration ran"},
      {"mem_clock_mhz_end", "MHz", "cuda: the memory clock after the configuration ran"},
      {"power_limit_w", "W", "cuda: the GPU's power management limit before the configuration ran"},
      {"throttle_reasons_start", "bitmask",
       "cuda: NVML's clocks-event (throttle) reasons before the configuration ran, in hex (0x0 none, 0x1 idle, "
       "0x4 software power cap, 0x20/0x40 thermal, ...)"},
      {"throttle_reasons_end", "bitmask", "cuda: the same after the configuration ran"},
      {"hostname", "", "the machine that ran rank 0"},
      {"timestamp", "UTC", "when the row was made, ISO 8601 (`2026-11-23T10:00:00Z`)"},
      {"command", "", "the layer_run command line, its arguments joined by spaces"},
      {"arch", "",
       "the spec's preset: `moe` for a mixture-of-experts layer, `gpt` (the paper's layer), `llama` (RMSNorm, GQA, "
       "RoPE, SwiGLU, no biases, no dropout) when the spec is that preset (whatever its widths, groups, theta, "
       "epsilon and, for gpt, dropouts), else `custom`; the spec columns below say what ran"},
      {"kv_heads", "", "g, the key/value heads (`--num-query-groups`; g = heads is multi-head attention)"},
      {"kv_channels", "",
       "d, each head's size (`--kv-channels`, Hugging Face's `head_dim`): hidden / heads unless given; QKV has "
       "(heads + 2 kv_heads) x d outputs and the projection heads x d inputs"},
      {"ffn_hidden", "", "F, the MLP's width (`--ffn-hidden-size`; SwiGLU's fc1 has 2F outputs)"},
      {"normalization", "", "`LayerNorm` or `RMSNorm` (`--normalization`), both block norms and the q/k norms"},
      {"norm_epsilon", "", "the norms' epsilon, as the float32 the run used (shortest decimal)"},
      {"qk_layernorm", "", "1: a norm over each head of q and k before RoPE (`--qk-layernorm`)"},
      {"activation", "", "the MLP's activation: `gelu` (tanh), `swiglu` or `squared_relu`"},
      {"add_bias_linear", "", "1: a bias on every linear; 0: `--disable-bias-linear`"},
      {"add_qkv_bias", "", "1: `--add-qkv-bias` (a bias on QKV even without the others)"},
      {"position_embedding", "",
       "`rope` (on q and k inside the layer) or `none` (also for learned absolute positions, added before the "
       "first layer)"},
      {"rotary_percent", "", "the share of each head's dimensions RoPE rotates; empty without RoPE"},
      {"rotary_base", "", "RoPE's base theta; empty without RoPE"},
      {"attention_dropout", "probability", "dropout on the attention probabilities (as `dropout`)"},
      {"hidden_dropout", "probability", "dropout on each block's output before its residual add (as `dropout`)"},
      {"recompute_modules", "",
       "selective rows: what backward rebuilds (`--recompute-modules`, e.g. `core_attn` (the paper's), "
       "`core_attn,mlp,layernorm`); empty for the others"},
      {"recompute_method", "",
       "full rows over a stack: `uniform` (groups of `recompute_num_layers` layers, each recomputed from its "
       "input) or `block` (the first `recompute_num_layers` layers recomputed, the rest not); empty: each "
       "layer its own checkpoint"},
      {"recompute_num_layers", "layers", "N of `--recompute-num-layers`; empty without a `recompute_method`"},
      {"cp", "ranks",
       "C, the context-parallel size (`--cp`): each rank holds chunks i and 2C-1-i of the sequence; the world is "
       "t x C ranks"},
      {"cp_comm_type", "",
       "context parallelism's attention (`--cp-comm-type`): `p2p` (ring), `all_gather` or `a2a` (Ulysses); empty "
       "when cp = 1"},
      {"comm_bytes_cp", "bytes",
       "of `comm_bytes`, what the context-parallel group sends (comm.cp.* phases); 0 when cp = 1; empty unless ok"},
      // An MoE layer (docs/moe.md); every column empty for a dense layer.
      {"num_experts", "experts", "E, the routed experts (`--num-experts`)"},
      {"top_k", "experts", "k, the experts each token is routed to (`--moe-router-topk`)"},
      {"moe_ffn_hidden", "", "each expert's width (`--moe-ffn-hidden-size`; SwiGLU's fc1 has twice as many outputs)"},
      {"moe_shared_ffn_hidden", "",
       "the shared experts' width (`--moe-shared-expert-intermediate-size`); 0 without shared experts"},
      {"moe_router_score", "", "the router's score function: `softmax` or `sigmoid` (`--moe-router-score-function`)"},
      {"moe_capacity_factor", "", "`--moe-expert-capacity-factor`; empty: dropless"},
      {"ep", "ranks",
       "expert-parallel size (`--expert-model-parallel-size`): each rank holds num_experts / ep experts; the ranks are "
       "the TP group (ep = tp) or ep / tp data-parallel replicas of it, each its own micro-batch; the tokens travel "
       "by all-to-all (comm.*.all_to_all.moe_tokens)"},
      {"etp", "ranks",
       "expert-tensor-parallel size (`--expert-tensor-parallel-size`): 1, each expert whole on its rank, or tp, "
       "each expert split over the tensor-parallel group"},
      {"moe_routing", "",
       "where layer 0's routing came from: `measured` (the run routed its tokens), `given` "
       "(`--moe-tokens-per-expert`, meta) or `balanced` (meta without it); empty when no forward routed"},
      {"moe_routed_rows", "rows",
       "N, the (token, choice) pairs layer 0 routed and kept on this rank; the `*_formula` columns take it (and, "
       "under `ep` > 1, the rows this rank's experts received)"},
      {"tokens_per_expert_max", "rows", "the most rows one expert of layer 0 processed"},
      {"tokens_per_expert_min", "rows", "the fewest rows one expert of layer 0 processed"},
      {"dropped_tokens", "pairs", "the (token, choice) pairs layer 0's capacity dropped; 0 when dropless"},
      {"aux_loss", "",
       "layer 0's load-balancing loss E x sum_e f_e P_e, reported (not trained; docs/moe.md); empty on meta"},
      // Multi-latent attention (docs/theory.md); every column empty for the other attentions.
      {"q_lora_rank", "", "L_q, q's latent width (`--q-lora-rank`); 0: q projected from the hidden size directly"},
      {"kv_lora_rank", "", "L_kv, k's and v's shared latent width (`--kv-lora-rank`)"},
      {"qk_head_dim", "", "each head's q and k width without RoPE (`--qk-head-dim`, Hugging Face's `qk_nope_head_dim`)"},
      {"qk_pos_emb_head_dim", "",
       "the RoPE part of each head's q and k (`--qk-pos-emb-head-dim`); k's is shared by the heads"},
      {"v_head_dim", "", "each head's v width (`--v-head-dim`): the attention output is heads x v_head_dim wide"},
  };
  return columns;
}

// Per layer and timed iteration, so that it reads like fwd_ms/bwd_ms; rows of ok
// configurations only. The columns before `phase` mean what they mean in the rows above.
const std::vector<Column>& cupti_columns() {
  static const std::vector<Column> columns = {
      {"backend", "", "`cuda` (CUPTI records GPU activity)"},
      {"device", "", "as in the rows above"},
      {"model", "", "as in the rows above"},
      {"hidden", "", "as in the rows above"},
      {"heads", "", "as in the rows above"},
      {"seq", "tokens", "as in the rows above"},
      {"batch", "sequences", "as in the rows above"},
      {"tp", "ranks", "as in the rows above"},
      {"emulated", "", "as in the rows above"},
      {"config", "", "as in the rows above"},
      {"dtype", "", "as in the rows above"},
      {"dropout", "probability", "as in the rows above"},
      {"layers", "", "as in the rows above"},
      {"iters", "iterations", "as in the rows above"},
      {"phase", "",
       "where the activity ran: `fwd.*`, `bwd.*`, `recompute.*` or `comm.*` (e.g. `fwd.core_attn`, "
       "`recompute.core_attn`, `comm.fwd.all_gather.qkv`)"},
      {"stage", "", "the phase's first part: `fwd`, `bwd`, `recompute` or `comm`"},
      {"kernels", "count",
       "GPU activities (kernels, memcpys, memsets) of the phase per layer and timed iteration (two decimals)"},
      {"gpu_ms", "ms",
       "their summed duration per layer and timed iteration; empty on the simulator (no GPU clock); Figure 8 "
       "needs only `config`, `phase` and this"},
      {"dropped_records", "count",
       "activity records CUPTI dropped for want of buffer space over the configuration's timed iterations "
       "(non-zero: the sums are short)"},
      {"git_sha", "", "as in the rows above"},
      {"timestamp", "UTC", "as in the rows above"},
      {"cp", "ranks", "as in the rows above"},
      {"cp_comm_type", "", "as in the rows above"},
  };
  return columns;
}

std::vector<std::string> column_names(const std::vector<Column>& columns) {
  std::vector<std::string> names;
  for (const Column& c : columns) names.emplace_back(c.name);
  return names;
}

namespace {

std::string markdown_table(const std::vector<Column>& columns) {
  std::string out = "| column | unit | meaning |\n|---|---|---|\n";
  for (const Column& c : columns)
    out += std::string("| `") + c.name + "` | " + (*c.unit ? std::string(c.unit) + " " : "") + "| " + c.meaning + " |\n";
  return out;
}

}  // namespace

std::string results_schema_markdown() {
  return "# Results schema\n"
         "\n"
         "The columns of layer_run's CSVs. Generated from runners/result_columns.cpp by\n"
         "`layer_run --print-csv-schema > docs/results_schema.md`; a test fails when this file and\n"
         "that table differ.\n"
         "\n"
         "## layer_run rows (`layer_run --csv FILE`)\n"
         "\n"
         "One row per configuration of one `layer_run` call, appended whole under a lock, the header\n"
         "once (`layer_run --print-csv-header` prints it). Each row is one line, whole once its line\n"
         "end is written: a last line without one is an unfinished row (still being written, or its\n"
         "writer was killed), never read as a row. A field holds at most " +
         std::to_string(kMaxCsvFieldBytes) +
         " bytes and no line break.\n"
         "Bytes and times are **per layer and per tensor-parallel rank** (rank 0's, which writes the\n"
         "row) unless the meaning says otherwise; \"empty unless ok\" means empty in rows whose\n"
         "`status` is not `ok`.\n"
         "\n" +
         markdown_table(result_columns()) +
         "\n"
         "## CUPTI breakdown (`layer_run --cupti FILE`, cuda only)\n"
         "\n"
         "GPU kernel time per phase, per layer and timed iteration (Figure 8's split): one row per\n"
         "phase of each configuration that ran ok.\n"
         "\n" +
         markdown_table(cupti_columns());
}

CsvRow::CsvRow(const std::vector<Column>& columns) : columns_(columns), values_(columns.size()) {}

void CsvRow::set(const std::string& name, std::string value) {
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (name != columns_[i].name) continue;
    if (values_[i]) throw RuntimeFailure("CSV column '" + name + "' set twice");
    values_[i] = std::move(value);
    return;
  }
  throw RuntimeFailure("no CSV column '" + name + "'");
}

std::vector<std::string> CsvRow::fields() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (!values_[i]) throw RuntimeFailure(std::string("CSV column '") + columns_[i].name + "' not set");
    out.push_back(*values_[i]);
  }
  return out;
}

}  // namespace actbench
