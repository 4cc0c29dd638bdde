#include "layers/config.hpp"

#include "runtime/error.hpp"

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
  if (name == "baseline") return {Recompute::none, false, Attention::unfused};
  if (name == "sp") return {Recompute::none, true, Attention::unfused};
  if (name == "full") return {Recompute::full, false, Attention::unfused};
  if (name == "full+sp") return {Recompute::full, true, Attention::unfused};
  if (name == "selective") return {Recompute::selective, false, Attention::unfused};
  if (name == "selective+sp") return {Recompute::selective, true, Attention::unfused};
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

const char* arch_name(Arch a) { return a == Arch::llama ? "llama" : "gpt"; }

Arch parse_arch(const std::string& name) {
  if (name == "gpt") return Arch::gpt;
  if (name == "llama") return Arch::llama;
  throw InvalidArgument("unknown arch '" + name + "' (expected gpt or llama)");
}

const char* attention_name(Attention a) { return a == Attention::fused ? "fused" : "unfused"; }

Attention parse_attention(const std::string& name) {
  if (name == "unfused") return Attention::unfused;
  if (name == "fused") return Attention::fused;
  throw InvalidArgument("unknown attention '" + name + "' (expected unfused or fused)");
}

void validate_layer(const LayerDims& d, int t, LayerPolicy p) {
  auto fail = [](const std::string& m) { throw InvalidArgument(m); };
  if (d.s < 1 || d.b < 1 || d.h < 1 || d.a < 1) fail("seq, batch, hidden and heads must all be >= 1");
  if (t < 1) fail("--tp must be >= 1");
  if (d.h % d.a != 0)
    fail("hidden " + std::to_string(d.h) + " is not divisible by heads " + std::to_string(d.a));
  if (d.a % t != 0)
    fail("heads " + std::to_string(d.a) + " are not divisible by tp " + std::to_string(t) +
         " (each rank needs whole heads)");
  if (d.h % t != 0) fail("hidden " + std::to_string(d.h) + " is not divisible by tp " + std::to_string(t));
  if (d.arch == Arch::llama) {
    const int64_t g = d.groups();
    if (g < 1 || g > d.a || d.a % g != 0)
      fail("kv-heads " + std::to_string(g) + " must be between 1 and heads " + std::to_string(d.a) + " and divide it");
    if (g % t != 0)
      fail("kv-heads " + std::to_string(g) + " are not divisible by tp " + std::to_string(t) +
           " (each rank needs whole key/value groups)");
    if (d.ffn() < 1 || d.ffn() % t != 0)
      fail("ffn-hidden " + std::to_string(d.ffn()) + " must be >= 1 and divisible by tp " + std::to_string(t));
    if ((d.h / d.a) % 2 != 0)
      fail("head size " + std::to_string(d.h / d.a) + " must be even for RoPE (pairs i and i + d/2)");
    if (!(d.rope_theta > 0)) fail("rope-theta must be positive");
    if (!(d.norm_eps > 0)) fail("the RMSNorm epsilon must be positive");
  }
  if (p.sequence_parallel && d.s % t != 0)
    fail("seq " + std::to_string(d.s) + " is not divisible by tp " + std::to_string(t) + " (needed by config " +
         config_name(p) + ")");
}

}  // namespace actbench
