#include "theory/policy.hpp"

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

}  // namespace actbench
