#include "runners/result_row.hpp"

#include <algorithm>
#include <cmath>

#include <cstdio>
#include <numeric>

#include "runners/closed_form.hpp"
#include "runners/result_columns.hpp"
#include "runners/run_args.hpp"
#include "runtime/allocator.hpp"
#include "runtime/provenance.hpp"

namespace actbench {
namespace {

std::string fmt_ms(double v, bool have) {
  if (!have) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}
std::string fmt_num(double v, const char* f = "%.0f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}


}  // namespace



namespace {

// An MoE layer's routed rows in the run (layer 0's), which its closed form takes; 0: a dense
// layer, or a run that stopped before routing (balanced routing then).
double routed_rows(const ExperimentResult& r) {
  return static_cast<double>(std::accumulate(r.moe.tokens_per_expert.begin(), r.moe.tokens_per_expert.end(), int64_t{0}));
}

MoeRows moe_rows(const Measurement& m, int tp) {
  return {routed_rows(m.result), static_cast<double>(m.result.moe.expert_rows), m.spec.expert_parallel(tp),
          m.spec.expert_tensor_parallel_size(tp)};
}

// Per layer: the layer's closed form, or the stack's over its layers under a --recompute-method.
double per_layer_formula_bytes(const Measurement& m, int tp) {
  const ExperimentSpec& spec = m.spec;
  if (spec.stack.method == RecomputeMethod::none)
    return formula_bytes(spec.dims, tp, spec.policy, spec.dtype, spec.cp(), moe_rows(m, tp));
  return stack_formula_bytes(spec, tp, moe_rows(m, tp)) / spec.layers;
}

// The backend's times are results: not meta, not the CPU simulator, and the run was ok.
bool have_time(const RunContext& run, const Measurement& m) {
  return run.be.computes() && !run.be.simulated() && m.result.status == "ok";
}

// The columns the results rows and the CUPTI rows share: what ran, where.
void set_run_columns(CsvRow& row, const RunContext& run, const Measurement& m) {
  const LayerDims& d = m.spec.dims;
  row.set("backend", run.be.name());
  row.set("device", run.be.device_name());
  row.set("model", run.options.model);
  row.set("hidden", std::to_string(d.h));
  row.set("heads", std::to_string(d.a));
  row.set("seq", std::to_string(d.s));
  row.set("batch", std::to_string(d.b));
  row.set("tp", std::to_string(run.options.tp));
  row.set("emulated", run.options.emulate_tp || run.options.emulate_cp || run.options.emulate_ep ? "1" : "0");
  row.set("cp", std::to_string(m.spec.cp()));
  row.set("cp_comm_type", m.spec.cp() > 1 ? cp_comm_type_name(m.spec.policy.cp_comm) : "");
  row.set("config", config_name(m.spec.policy));
  row.set("dtype", dtype_name(m.spec.dtype));
  const theory::LayerSpec& spec = m.spec.dims.spec;
  // One probability when the two dropouts agree (the paper's --dropout), else empty.
  row.set("dropout", spec.attention_dropout == spec.hidden_dropout
                         ? float32_text(static_cast<float>(spec.attention_dropout))
                         : "");
  row.set("layers", std::to_string(m.spec.layers));
  row.set("iters", std::to_string(m.spec.iters));
  row.set("git_sha", build_git_sha());
  row.set("timestamp", utc_timestamp());
}

// What the layer is composed of, and what selective recompute rebuilds.
void set_spec_columns(CsvRow& row, const LayerDims& d, const LayerPolicy& p) {
  const theory::LayerSpec& s = d.spec;
  const bool rope = s.position == theory::PositionEmbedding::rope;
  auto flag = [](bool v) { return v ? "1" : "0"; };
  auto f32 = [](double v) { return float32_text(static_cast<float>(v)); };
  row.set("arch", spec_family(s));
  row.set("kv_heads", std::to_string(d.groups()));
  row.set("kv_channels", std::to_string(d.kv_channels()));
  row.set("ffn_hidden", std::to_string(d.ffn()));
  row.set("normalization", theory::norm_name(s.normalization));
  row.set("norm_epsilon", f32(s.norm_epsilon));
  row.set("qk_layernorm", flag(s.qk_layernorm));
  row.set("activation", theory::activation_name(s.activation));
  row.set("add_bias_linear", flag(s.add_bias_linear));
  row.set("add_qkv_bias", flag(s.add_qkv_bias));
  row.set("position_embedding", theory::position_name(s.position));
  row.set("rotary_percent", rope ? fmt_num(s.rotary_percent, "%.17g") : "");
  row.set("rotary_base", rope ? fmt_num(s.rotary_base, "%.17g") : "");
  row.set("attention_dropout", f32(s.attention_dropout));
  row.set("hidden_dropout", f32(s.hidden_dropout));
  row.set("recompute_modules", recomputed_modules_text(p));
}

void set_stack_columns(CsvRow& row, const ExperimentSpec& spec) {
  const bool method = spec.stack.method != RecomputeMethod::none;
  row.set("recompute_method", recompute_method_name(spec.stack.method));
  row.set("recompute_num_layers", method ? std::to_string(spec.stack.num_layers) : "");
}

void set_layer_columns(CsvRow& row, const Measurement& m) {
  const LayerPolicy& p = m.spec.policy;
  const LayerDims& d = m.spec.dims;
  row.set("attention", attention_name(p.attention));
  row.set("recompute", recompute_name(p.recompute));
  row.set("sequence_parallel", p.sequence_parallel ? "1" : "0");
  row.set("warmup", std::to_string(m.spec.warmup));
  row.set("seed", std::to_string(m.spec.seed));
  set_spec_columns(row, d, p);
  set_stack_columns(row, m.spec);
}

void set_time_columns(CsvRow& row, const RunContext& run, const Measurement& m) {
  const ExperimentResult& r = m.result;
  const bool have = have_time(run, m);
  row.set("fwd_ms", fmt_ms(r.fwd_ms.median, have));
  row.set("bwd_ms", fmt_ms(r.bwd_ms.median, have));
  row.set("total_ms", fmt_ms(r.total_ms.median, have));
  row.set("fwd_ms_min", fmt_ms(r.fwd_ms.min, have));
  row.set("fwd_ms_max", fmt_ms(r.fwd_ms.max, have));
  row.set("bwd_ms_min", fmt_ms(r.bwd_ms.min, have));
  row.set("bwd_ms_max", fmt_ms(r.bwd_ms.max, have));
}

void set_memory_columns(CsvRow& row, const RunContext& run, const Measurement& m) {
  const ExperimentResult& r = m.result;
  const bool ok = r.status == "ok";
  row.set("act_bytes", ok ? std::to_string(r.act_bytes) : "");
  row.set("act_extra_bytes", ok ? std::to_string(r.act_extra_bytes) : "");
  row.set("act_bytes_formula", fmt_num(per_layer_formula_bytes(m, run.options.tp)));
  row.set("stack_act_bytes", ok ? std::to_string(r.stack_act_bytes) : "");
  const int tp = run.options.tp;
  row.set("stack_act_bytes_formula", fmt_num(stack_formula_bytes(m.spec, tp, moe_rows(m, tp))));
  row.set("fwd_retained_bytes", ok ? std::to_string(r.fwd_retained_bytes) : "");
  row.set("peak_allocated_bytes", std::to_string(r.peak_allocated_bytes));
  row.set("peak_reserved_bytes", std::to_string(r.peak_reserved_bytes));
  row.set("memory_limit_bytes", std::to_string(run.options.memory_limit));
}

void set_comm_columns(CsvRow& row, const RunContext& run, const Measurement& m) {
  const ExperimentResult& r = m.result;
  const bool ok = r.status == "ok";
  row.set("comm_mode", comm_mode_name(run.comm_mode));
  row.set("comm_bytes", ok ? fmt_num(r.comm_bytes) : "");
  row.set("comm_bytes_cp", ok ? fmt_num(r.comm_bytes_cp) : "");
  row.set("link_gbps", fmt_num(m.spec.link_gbps, "%g"));
  row.set("comm_ms_modeled", ok ? fmt_num(r.comm_ms_modeled, "%.4f") : "");
  row.set("comm_ms_emulated",
          fmt_ms(r.comm_ms_emulated.median, have_time(run, m) && run.comm_mode == CommMode::modeled));
  row.set("status", r.status);
  row.set("message", r.message);
}

// An MoE layer's options and its routing in the run (layer 0's); empty for a dense layer.
void set_moe_columns(CsvRow& row, const RunContext& run, const Measurement& m) {
  const theory::MoeSpec& moe = m.spec.dims.spec.moe;
  const MoeRoutingStats& routing = m.result.moe;
  const bool on = moe.enabled(), routed = on && !routing.tokens_per_expert.empty();
  const auto& rows = routing.tokens_per_expert;
  auto when = [](bool v, const std::string& text) { return v ? text : std::string(); };
  row.set("num_experts", when(on, fmt_num(moe.num_experts, "%.17g")));
  row.set("top_k", when(on, fmt_num(moe.top_k, "%.17g")));
  row.set("moe_ffn_hidden", when(on, std::to_string(m.spec.dims.expert_ffn())));
  row.set("moe_shared_ffn_hidden", when(on, fmt_num(moe.shared_ffn_hidden, "%.17g")));
  row.set("moe_router_score", when(on, theory::moe_score_name(moe.score)));
  row.set("moe_capacity_factor", when(on && moe.capacity_factor > 0, fmt_num(moe.capacity_factor, "%.17g")));
  row.set("ep", when(on, std::to_string(m.spec.expert_parallel(run.options.tp))));
  row.set("etp", when(on, std::to_string(m.spec.expert_tensor_parallel_size(run.options.tp))));
  row.set("moe_routing", when(routed, routing.measured ? "measured" : (m.spec.moe_tokens_per_expert.empty() ? "balanced" : "given")));
  row.set("moe_routed_rows", when(routed, fmt_num(routed_rows(m.result))));
  const auto [fewest, most] = std::minmax_element(rows.begin(), rows.end());  // read only when routed
  row.set("tokens_per_expert_max", routed ? std::to_string(*most) : "");
  row.set("tokens_per_expert_min", routed ? std::to_string(*fewest) : "");
  row.set("dropped_tokens", when(routed, std::to_string(routing.dropped)));
  row.set("aux_loss", when(routed && routing.measured, fmt_num(routing.aux_loss, "%.9g")));
}

// A multi-latent attention layer's widths; empty for the other attentions.
void set_mla_columns(CsvRow& row, const theory::MlaSpec& mla) {
  auto width = [&](double v) { return mla.enabled ? fmt_num(v, "%.17g") : std::string(); };
  row.set("q_lora_rank", width(mla.q_lora_rank));
  row.set("kv_lora_rank", width(mla.kv_lora_rank));
  row.set("qk_head_dim", width(mla.qk_head_dim));
  row.set("qk_pos_emb_head_dim", width(mla.qk_pos_emb_head_dim));
  row.set("v_head_dim", width(mla.v_head_dim));
}

void set_provenance_columns(CsvRow& row, const RunContext& run, const Measurement& m) {
  row.set("driver_version", run.versions.driver);
  row.set("cuda_runtime_version", run.versions.cuda_runtime);
  row.set("cublas_version", run.versions.cublas);
  row.set("nccl_version", run.versions.nccl);
  row.set("sm_clock_mhz_start", m.start.sm_clock_mhz);
  row.set("sm_clock_mhz_end", m.end.sm_clock_mhz);
  row.set("mem_clock_mhz_start", m.start.mem_clock_mhz);
  row.set("mem_clock_mhz_end", m.end.mem_clock_mhz);
  row.set("power_limit_w", m.start.power_limit_w);
  row.set("throttle_reasons_start", m.start.throttle_reasons);
  row.set("throttle_reasons_end", m.end.throttle_reasons);
  row.set("hostname", hostname());
  row.set("command", run.command);
}

}  // namespace

std::vector<std::string> result_row(const RunContext& run, const Measurement& m) {
  CsvRow row(result_columns());
  set_run_columns(row, run, m);
  set_layer_columns(row, m);
  set_time_columns(row, run, m);
  set_memory_columns(row, run, m);
  set_comm_columns(row, run, m);
  set_provenance_columns(row, run, m);
  set_moe_columns(row, run, m);
  set_mla_columns(row, m.spec.dims.spec.mla);
  return row.fields();
}

std::vector<std::vector<std::string>> cupti_rows(const RunContext& run, const Measurement& m) {
  // Per layer and timed iteration, so that it reads like fwd_ms/bwd_ms.
  const double per = static_cast<double>(m.spec.iters) * m.spec.layers;
  std::vector<std::vector<std::string>> rows;
  for (const PhaseTime& p : m.result.kernel_phases) {
    CsvRow row(cupti_columns());
    set_run_columns(row, run, m);
    row.set("phase", p.phase);
    row.set("stage", p.phase.substr(0, p.phase.find('.')));
    row.set("kernels", fmt_num(static_cast<double>(p.kernels) / per, "%.2f"));
    row.set("gpu_ms", run.be.simulated() ? "" : fmt_num(p.gpu_ms / per, "%.5f"));
    row.set("dropped_records", std::to_string(m.result.cupti_dropped_records));
    rows.push_back(row.fields());
  }
  return rows;
}

std::string console_line(const RunContext& run, const Measurement& m) {
  const ExperimentResult& r = m.result;
  const double formula = per_layer_formula_bytes(m, run.options.tp);
  char head[256];
  std::snprintf(head, sizeof head, "%-13s %-5s act %s (formula %s)", config_name(m.spec.policy).c_str(),
                r.status.c_str(), format_bytes(r.act_bytes).c_str(),
                format_bytes(static_cast<int64_t>(formula)).c_str());
  std::string line = head;
  if (have_time(run, m))
    line += " fwd " + fmt_ms(r.fwd_ms.median, true) + " ms bwd " + fmt_ms(r.bwd_ms.median, true) + " ms";
  if (r.status != "ok") line += " " + r.message;
  return line + "\n";
}

}  // namespace actbench
