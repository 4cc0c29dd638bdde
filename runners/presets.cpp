#include "runners/presets.hpp"

#include <cstdio>

#include "runtime/error.hpp"
#include "theory/model_table.hpp"

namespace actbench {

namespace {

ModelPreset preset_of(const theory::ModelRow& r) {
  LayerDims dims{r.seq, r.batch, r.hidden, r.heads};
  dims.spec = theory::preset_layer_spec(r);
  return {r.name, dims, r.tp, r.layers, r.pipeline, r.vocab};
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = [] {
    std::vector<ModelPreset> list;
    for (const theory::ModelRow& r : theory::model_table()) list.push_back(preset_of(r));
    return list;
  }();
  return presets;
}

std::string presets_table() {
  char line[160];
  std::snprintf(line, sizeof line, "%-14s %-6s %6s %3s %6s %4s %4s %6s %3s %4s\n", "model", "arch", "seq", "b", "hidden",
                "a", "g", "ffn", "t", "L");
  std::string text = line;
  for (const ModelPreset& p : model_presets()) {
    const LayerDims& d = p.dims;
    std::snprintf(line, sizeof line, "%-14s %-6s %6lld %3lld %6lld %4lld %4lld %6lld %3d %4d\n", p.name.c_str(),
                  spec_family(d.spec).c_str(), static_cast<long long>(d.s), static_cast<long long>(d.b),
                  static_cast<long long>(d.h), static_cast<long long>(d.a), static_cast<long long>(d.groups()),
                  static_cast<long long>(d.ffn()), p.tp, p.layers);
    text += line;
  }
  return text;
}

const ModelPreset& find_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  std::string names;
  for (const auto& p : model_presets()) names += (names.empty() ? "" : ", ") + p.name;
  throw InvalidArgument("unknown model '" + name + "' (expected one of " + names + ")");
}

}  // namespace actbench
