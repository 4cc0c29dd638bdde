#include "theory/policy.hpp"

#include <cmath>
#include <utility>

#include "runtime/error.hpp"  // InvalidArgument: header only, no link to the runtime library

namespace actbench {

const std::vector<std::string>& paper_config_names() {
  static const std::vector<std::string> names = {"baseline", "sp", "full", "selective", "selective+sp"};
  return names;
}

const std::vector<std::string>& config_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = paper_config_names();
    all.push_back("full+sp");
    return all;
  }();
  return names;
}

LayerPolicy parse_config(const std::string& name) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    for (bool sp : {false, true})
      if (config_name({r, sp}) == name) return {r, sp};
  throw InvalidArgument("unknown config '" + name + "' (expected baseline, sp, full, selective, selective+sp or full+sp)");
}

std::string config_name(LayerPolicy p) {
  switch (p.recompute) {
    case Recompute::none: return p.sequence_parallel ? "sp" : "baseline";
    case Recompute::selective: return p.sequence_parallel ? "selective+sp" : "selective";
    case Recompute::full: return p.sequence_parallel ? "full+sp" : "full";
  }
  return "?";
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

const char* attention_name(Attention a) { return a == Attention::fused ? "fused" : "unfused"; }

Attention parse_attention(const std::string& name) {
  if (name == "unfused") return Attention::unfused;
  if (name == "fused") return Attention::fused;
  throw InvalidArgument("unknown attention '" + name + "' (expected unfused or fused)");
}

const char* cp_comm_type_name(CpCommType c) {
  switch (c) {
    case CpCommType::p2p: return "p2p";
    case CpCommType::all_gather: return "all_gather";
    case CpCommType::a2a: return "a2a";
  }
  return "?";
}

CpCommType parse_cp_comm_type(const std::string& name) {
  for (CpCommType c : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a})
    if (name == cp_comm_type_name(c)) return c;
  throw InvalidArgument("unknown --cp-comm-type '" + name + "' (expected p2p, all_gather or a2a)");
}

CpRule context_parallel_rule(double seq, double heads, double groups, int t, int cp, const LayerPolicy& p) {
  if (cp == 1) return CpRule::ok;
  if (std::fmod(seq, 2.0 * cp) != 0) return CpRule::chunks;
  if (p.sequence_parallel && std::fmod(seq / cp, t) != 0) return CpRule::sp_rows;
  if (p.cp_comm == CpCommType::p2p && p.attention != Attention::fused) return CpRule::p2p_needs_fused;
  if (p.cp_comm == CpCommType::a2a && (std::fmod(heads, double(t) * cp) != 0 || std::fmod(groups, double(t) * cp) != 0))
    return CpRule::a2a_heads;
  return CpRule::ok;
}

RecomputeModules parse_recompute_modules(const std::string& list) {
  RecomputeModules out{false, false, false};
  const std::string expected =
      " (expected a comma-separated subset of core_attn, mlp, layernorm, moe_act, moe, shared_experts, mla_up_proj)";
  size_t begin = 0;
  while (true) {
    const size_t comma = list.find(',', begin);
    const std::string word = list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    bool* flag = word == "core_attn" ? &out.core_attn
                 : word == "mlp"     ? &out.mlp
                 : word == "layernorm" ? &out.layernorm
                 : word == "moe_act" ? &out.moe_act
                 : word == "moe" ? &out.moe
                 : word == "shared_experts" ? &out.shared_experts
                 : word == "mla_up_proj" ? &out.mla_up_proj
                                       : nullptr;
    if (flag == nullptr) throw InvalidArgument("unknown recompute module '" + word + "'" + expected);
    if (*flag) throw InvalidArgument("recompute module '" + word + "' named twice" + expected);
    *flag = true;
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

std::string recompute_modules_name(RecomputeModules m) {
  std::string out;
  const std::pair<bool, const char*> words[] = {{m.core_attn, "core_attn"}, {m.mlp, "mlp"},
                                                {m.layernorm, "layernorm"}, {m.moe_act, "moe_act"},
                                                {m.moe, "moe"}, {m.shared_experts, "shared_experts"},
                                                {m.mla_up_proj, "mla_up_proj"}};
  for (const auto& [on, word] : words) {
    if (!on) continue;
    if (!out.empty()) out += ',';
    out += word;
  }
  return out;
}

std::string recomputed_modules_text(const LayerPolicy& p) {
  return p.recompute == Recompute::selective ? recompute_modules_name(p.modules) : "";
}

const char* recompute_method_name(RecomputeMethod m) {
  switch (m) {
    case RecomputeMethod::uniform: return "uniform";
    case RecomputeMethod::block: return "block";
    case RecomputeMethod::none: break;
  }
  return "";
}

RecomputeMethod parse_recompute_method(const std::string& name) {
  if (name == "uniform") return RecomputeMethod::uniform;
  if (name == "block") return RecomputeMethod::block;
  throw InvalidArgument("--recompute-method must be uniform or block, got '" + name + "'");
}

}  // namespace actbench
