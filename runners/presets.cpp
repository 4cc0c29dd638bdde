#include "runners/presets.hpp"

#include "runtime/error.hpp"
#include "theory/model_table.hpp"

namespace actbench {

namespace {

ModelPreset preset_of(const theory::ModelRow& r) {
  LayerDims dims{r.seq, r.batch, r.hidden, r.heads, parse_arch(r.arch), r.kv_heads, r.ffn_hidden};
  if (r.rope_theta > 0) dims.rope_theta = r.rope_theta;
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

const ModelPreset& find_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  std::string names;
  for (const auto& p : model_presets()) names += (names.empty() ? "" : ", ") + p.name;
  throw InvalidArgument("unknown model '" + name + "' (expected one of " + names + ")");
}

}  // namespace actbench
