#pragma once
// layer_run's model presets: the rows of theory/model_table.hpp as layer shapes.
#include <string>
#include <vector>

#include "layers/config.hpp"

namespace actbench {

struct ModelPreset {
  std::string name;
  LayerDims dims;
  int tp;          // t of the model's own layout (the paper's for Table 3)
  int layers;      // L of the whole model
  int pipeline;    // p
  int64_t vocab;   // v
};

const std::vector<ModelPreset>& model_presets();
// layer_run --list-presets: one line per preset (name, arch, s, b, h, a, g, F, t, L), aligned.
std::string presets_table();
// Throws InvalidArgument for an unknown name.
const ModelPreset& find_preset(const std::string& name);

}  // namespace actbench
