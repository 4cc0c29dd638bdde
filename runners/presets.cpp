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
      // The llama family (--arch llama): {s, b, h, a, arch, g, F}, t, L, p, vocab at s = 8192.
      {"llama3-8b", {8192, 1, 4096, 32, Arch::llama, 8, 14336, 500000.0}, 1, 32, 1, 128256},
      {"llama3-70b", {8192, 1, 8192, 64, Arch::llama, 8, 28672, 500000.0}, 8, 80, 4, 128256},
      {"llama3-405b", {8192, 1, 16384, 128, Arch::llama, 8, 53248, 500000.0}, 8, 126, 9, 128256},
  };
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
