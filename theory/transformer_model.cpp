#include "theory/transformer_model.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "runtime/error.hpp"  // InvalidArgument: header only

#include "theory/model_table.hpp"

namespace actbench::theory {

TransformerModel preset_model(const ModelRow& row) {
  TransformerModel m;
  m.name = row.name;
  m.h = double(row.hidden);
  m.a = double(row.heads);
  m.L = row.layers;
  m.vocab = double(row.vocab);
  m.seq = double(row.seq);
  m.learned_positions = row.arch == "gpt";
  m.tied_embeddings = row.tied_embeddings;
  m.layer = preset_layer_spec(row);
  for (int i = 0; i < row.moe.first_dense; ++i) m.moe_layers.push_back(false);
  if (!m.moe_layers.empty()) m.moe_layers.resize(row.layers, true);
  return m;
}

bool TransformerModel::is_moe_layer(int i) const {
  if (!layer.moe.enabled()) return false;
  return moe_layers.empty() || (i >= 0 && i < static_cast<int>(moe_layers.size()) && moe_layers[i]);
}

LayerSpec TransformerModel::layer_spec(int i) const {
  LayerSpec s = layer;
  if (!is_moe_layer(i)) s.moe = {};
  return s;
}

int TransformerModel::moe_layer_count() const {
  int n = 0;
  for (int i = 0; i < static_cast<int>(L); ++i) n += is_moe_layer(i);
  return n;
}

namespace {

[[noreturn]] void bad_pattern(const std::string& flag, const std::string& freq, const std::string& why) {
  std::string shown;
  for (char c : freq.substr(0, 60)) shown += c >= 0x20 && c < 0x7f ? c : '?';
  throw InvalidArgument(flag + " '" + shown + "': " + why);
}

// One "[a,b,...]" or "[a,b,...]*n" term of a pattern: its entries appended to `out`.
size_t pattern_term(const std::string& text, size_t i, int layers, const std::string& flag, const std::string& freq,
                    std::vector<bool>& out) {
  if (i >= text.size() || text[i] != '[') bad_pattern(flag, freq, "expected a list such as [0]*3+[1]*58");
  std::vector<bool> list;
  for (++i; i < text.size() && text[i] != ']'; ++i) {
    if (text[i] == ',') continue;
    if (text[i] != '0' && text[i] != '1') bad_pattern(flag, freq, "a pattern's entries are 0 (dense) or 1 (MoE)");
    list.push_back(text[i] == '1');
  }
  if (i >= text.size()) bad_pattern(flag, freq, "an unclosed [");
  ++i;
  size_t repeat = 1;
  if (i < text.size() && text[i] == '*') {
    size_t end = ++i;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == i || end - i > 6) bad_pattern(flag, freq, "a list's repeat count must be a whole number");
    repeat = std::stoul(text.substr(i, end - i));
    i = end;
  }
  for (size_t r = 0; r < repeat && out.size() <= static_cast<size_t>(layers); ++r) out.insert(out.end(), list.begin(), list.end());
  return i;
}

}  // namespace

std::vector<bool> moe_layer_pattern(const std::string& freq, int layers, const std::string& flag) {
  std::string text;
  for (char c : freq)
    if (c != ' ' && c != '(' && c != ')') text += c;
  std::vector<bool> out;
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    if (text.size() > 6 || std::stoi(text) < 1) bad_pattern(flag, freq, "every N-th layer needs N in 1..999999");
    const int n = std::stoi(text);
    for (int i = 0; i < layers; ++i) out.push_back(i % n == 0);
    return out;
  }
  for (size_t i = pattern_term(text, 0, layers, flag, freq, out); i < text.size();) {
    if (text[i] != '+') bad_pattern(flag, freq, "lists are joined with +");
    i = pattern_term(text, i + 1, layers, flag, freq, out);
  }
  if (out.size() != static_cast<size_t>(layers))
    bad_pattern(flag, freq, "the pattern must have one entry per layer (" + std::to_string(layers) + ")");
  return out;
}

double padded_vocab(const TransformerModel& m, double t) {
  const double multiple = std::max(1.0, m.vocab_divisible_by) * t;
  return std::ceil(m.vocab / multiple) * multiple;
}

}  // namespace actbench::theory
