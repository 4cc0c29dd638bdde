#include "theory/model_table.hpp"

namespace actbench::theory {

const std::vector<ModelRow>& model_table() {
  // name, arch, s, b, h, a, g, F, rope theta, t, L, p, m, B, v, tied embeddings, Table 3
  static const std::vector<ModelRow> rows = {
      {"tiny", "gpt", 32, 2, 64, 4, 0, 0, 0, 1, 2, 1, 1, 0, 51200, true, false},
      // Table 3 at s = 2048, v = 51200; 175b and 530b interleaved with m = 3.
      {"22b", "gpt", 2048, 4, 6144, 64, 0, 0, 0, 8, 48, 1, 1, 4, 51200, true, true},
      {"175b", "gpt", 2048, 1, 12288, 96, 0, 0, 0, 8, 96, 8, 3, 64, 51200, true, true},
      {"530b", "gpt", 2048, 1, 20480, 128, 0, 0, 0, 8, 105, 35, 3, 280, 51200, true, true},
      {"1t", "gpt", 2048, 1, 25600, 160, 0, 0, 0, 8, 128, 64, 1, 512, 51200, true, true},
      // Llama 3 (Meta's configs) at s = 8192, untied embeddings.
      {"llama3-8b", "llama", 8192, 1, 4096, 32, 8, 14336, 500000.0, 1, 32, 1, 1, 0, 128256, false, false},
      {"llama3-70b", "llama", 8192, 1, 8192, 64, 8, 28672, 500000.0, 8, 80, 4, 1, 0, 128256, false, false},
      {"llama3-405b", "llama", 8192, 1, 16384, 128, 8, 53248, 500000.0, 8, 126, 9, 1, 0, 128256, false, false},
  };
  return rows;
}

std::string one_of(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += names[i];
  }
  return text;
}

}  // namespace actbench::theory
