#include "theory/models.hpp"

#include <cmath>
#include <stdexcept>

#include "theory/model_table.hpp"

namespace actbench::theory {

const std::vector<ModelSpec>& paper_models() {
  static const std::vector<ModelSpec> models = [] {
    std::vector<ModelSpec> list;
    for (const ModelRow& r : model_table())
      if (r.paper)
        list.push_back({r.name, double(r.seq), double(r.hidden), double(r.heads), double(r.layers), double(r.vocab),
                        double(r.batch), double(r.global_batch), r.tp, r.pipeline, r.chunks});
    return list;
  }();
  return models;
}

const ModelSpec& paper_model(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& m : paper_models()) {
    if (m.name == name) return m;
    names.push_back(m.name);
  }
  throw std::invalid_argument("unknown model '" + name + "' (expected " + one_of(names) + ")");
}

namespace {
bool whole(double x) { return x > 0 && std::floor(x) == x; }
}  // namespace

void validate(const ModelSpec& m) {
  const std::string who = m.name.empty() ? "model" : m.name;
  auto fail = [&](const std::string& what) { throw std::invalid_argument(who + ": " + what); };
  if (!whole(m.s) || !whole(m.h) || !whole(m.a) || !whole(m.L) || !whole(m.v) || !whole(m.b) || !whole(m.B))
    fail("s, h, a, L, v, b and B must be positive whole numbers");
  if (m.t < 1 || m.p < 1 || m.m < 1 || m.dp < 1) fail("t, p, m and dp must be >= 1");
  if (std::fmod(m.h, m.a) != 0) fail("hidden size h must be divisible by the heads a");
  if (std::fmod(m.a, m.t) != 0) fail("heads a must be divisible by the tensor-parallel size t");
  if (std::fmod(m.L, static_cast<double>(m.p) * m.m) != 0) fail("layers L must be divisible by p * m");
  if (std::fmod(m.B, m.b * m.dp) != 0) fail("global batch B must be divisible by b * dp");
  if (m.m > 1 && m.p == 1) fail("the interleaved schedule (m > 1) needs p > 1");
}

const std::vector<Gpu>& gpus() {
  // docs/paper.md "Hardware limits"; memory is the total nvidia-smi reports (81920, 81559 and
  // 143771 MiB), network is one 200 Gb/s HDR (A100) or 400 Gb/s NDR (H100/H200) port per GPU.
  static const std::vector<Gpu> list = {
      {"a100", "A100 SXM 80GB", 81920.0 * 1024 * 1024, 312e12, 2.0e12, 300e9, 25e9, 8},
      {"h100", "H100 SXM 80GB", 81559.0 * 1024 * 1024, 989e12, 3.35e12, 450e9, 50e9, 9},
      {"h200", "H200 SXM 141GB", 143771.0 * 1024 * 1024, 989e12, 4.8e12, 450e9, 50e9, 9},
  };
  return list;
}

const Gpu& gpu(const std::string& name) {
  for (const auto& g : gpus())
    if (g.name == name) return g;
  throw std::invalid_argument("unknown GPU '" + name + "' (expected a100, h100 or h200)");
}

}  // namespace actbench::theory
