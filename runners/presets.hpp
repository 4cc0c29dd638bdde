#pragma once
// Model presets: Table 3 of the paper (s = 2048) and a tiny layer for tests.
#include <string>
#include <vector>

#include "layers/config.hpp"

namespace actbench {

struct ModelPreset {
  std::string name;
  LayerDims dims;
  int tp;          // the paper's tensor-parallel size
  int layers;      // L of the whole model
  int pipeline;    // p
  int vocab = 51200;
};

const std::vector<ModelPreset>& model_presets();
// Throws InvalidArgument for an unknown name.
const ModelPreset& find_preset(const std::string& name);

}  // namespace actbench
