#include "theory/model_table.hpp"

namespace actbench::theory {

namespace {

// The mixtures of experts from their published Hugging Face configs, at s = 4096, b = 1,
// untied embeddings, t = p = 1 (give the layout with theory memory's flags).
ModelRow moe_row(const char* name, int64_t h, int64_t a, int64_t g, int64_t F, double theta, int layers, int64_t vocab) {
  ModelRow r{name, "moe", 4096, 1, h, a, g, F, theta, 1, layers, 1, 1, 0, vocab, false, false};
  return r;
}

std::vector<ModelRow> moe_rows() {
  // Mixtral-8x7B-v0.1: 8 experts of 14336 (intermediate_size), top-2 softmax, normalised.
  ModelRow mixtral = moe_row("mixtral-8x7b", 4096, 32, 8, 14336, 1e6, 32, 32000);
  mixtral.moe = {8, 2, 14336};
  // Qwen3-30B-A3B: 128 experts of 768, top-8, normalised; head_dim 128, q/k norms.
  ModelRow qwen = moe_row("qwen3-30b-a3b", 2048, 32, 4, 6144, 1e6, 48, 151936);
  qwen.moe = {128, 8, 768};
  qwen.head_dim = 128, qwen.qk_norm = true, qwen.norm_epsilon = 1e-6;
  // DeepSeek-V3: 256 experts of 2048 and one shared, top-8 sigmoid scores scaled 2.5 over 4
  // of 8 groups with the score bias; the first 3 layers dense (18432); latent attention.
  ModelRow deepseek = moe_row("deepseek-v3", 7168, 128, 128, 18432, 10000, 61, 129280);
  deepseek.moe = {256, 8, 2048, 2048, true, true, 2.5, 8, 4, true, 3};
  deepseek.mla = {1536, 512, 128, 64, 128};
  deepseek.norm_epsilon = 1e-6;
  return {mixtral, qwen, deepseek};
}

}  // namespace

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
  static const std::vector<ModelRow> all = [] {
    std::vector<ModelRow> list = rows;
    for (const ModelRow& r : moe_rows()) list.push_back(r);
    return list;
  }();
  return all;
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
