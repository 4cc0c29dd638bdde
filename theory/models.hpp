#pragma once
// The paper's models (Table 3, views of model_table.hpp) and the GPUs we compare against, as
// plain data for the formulas. Nothing here depends on the rest of actbench.
#include <string>
#include <vector>

#include "theory/activation_memory.hpp"

namespace actbench::theory {

// One training setup: the model's shape and how it is laid out over GPUs.
struct ModelSpec {
  std::string name;
  double s = 2048, h = 0, a = 0, L = 0, v = 51200;  // sequence, hidden, heads, layers, vocabulary
  double b = 1;                                     // microbatch (sequences)
  double B = 1;                                     // global batch (sequences per iteration)
  int t = 1, p = 1;                                 // tensor-, pipeline-parallel sizes
  int m = 1;                                        // model chunks per pipeline stage (1 = plain 1F1B)
  int dp = 1;                                       // data-parallel replicas

  int gpus() const { return t * p * dp; }
  // Microbatches each pipeline runs per iteration: B / (b · dp).
  double microbatches() const { return B / (b * dp); }
  Dims layer_dims() const { return {s, b, h, a, static_cast<double>(t)}; }
};

// Table 3: 22b, 175b, 530b, 1t (the rows of model_table.hpp marked paper).
const std::vector<ModelSpec>& paper_models();
// Throws std::invalid_argument for a name that is not in Table 3.
const ModelSpec& paper_model(const std::string& name);
// Checks that a spec is usable by the formulas (positive sizes, L divisible by p·m, h by a
// and t, ...); throws std::invalid_argument with one line saying what is wrong.
void validate(const ModelSpec& m);

// A GPU for Figure 1's memory line, MFU peaks and the iteration-time model.
struct Gpu {
  std::string name;            // a100, h100, h200
  std::string label;           // "A100 SXM 80GB"
  double memory_bytes = 0;     // total device memory as nvidia-smi reports it
  double peak_flops = 0;       // dense bf16 per second
  double hbm_bytes_per_s = 0;  // memory bandwidth
  double nvlink_bytes_per_s = 0;   // per direction (tensor-parallel collectives)
  double network_bytes_per_s = 0;  // per GPU between nodes (pipeline p2p, data-parallel all-reduce)
  int compute_major = 9;           // compute capability's major version (library workspace sizes)
};
// a100 (A100 SXM 80GB, the paper's), h100 (H100 SXM 80GB), h200 (H200 SXM 141GB).
const std::vector<Gpu>& gpus();
// Throws std::invalid_argument for an unknown name.
const Gpu& gpu(const std::string& name);

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace actbench::theory
