#include "runners/presets.hpp"

#include "runtime/error.hpp"

namespace actbench {

const std::vector<ModelPreset>& model_presets() {
  // name, {s, b, h, a}, t, L, p
  static const std::vector<ModelPreset> presets = {
      {"tiny", {32, 2, 64, 4}, 1, 2, 1},
      {"22b", {2048, 4, 6144, 64}, 8, 48, 1},
      {"175b", {2048, 1, 12288, 96}, 8, 96, 8},
      {"530b", {2048, 1, 20480, 128}, 8, 105, 35},
      {"1t", {2048, 1, 25600, 160}, 8, 128, 64},
  };
  return presets;
}

const ModelPreset& find_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  throw InvalidArgument("unknown model '" + name + "' (expected tiny, 22b, 175b, 530b or 1t)");
}

}  // namespace actbench
