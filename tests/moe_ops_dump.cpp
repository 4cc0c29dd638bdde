// A mixture-of-experts block run through a backend's MoE ops (cpu by default; cuda on a GPU or
// the simulator build), for the float64 NumPy
// reference (tools/numpy_moe.py, checked by tests/test_moe_reference.py): router GEMM,
// moe_route, moe_dispatch, moe_permute, grouped GEMM fc1, SwiGLU, grouped GEMM fc2,
// moe_unpermute, then the whole backward from a given d_out. Inputs are drawn from a seed
// and written with every result as float32 .npy files (indices as exact floats) into --out.
//
//   moe_ops_dump --out DIR [--backend cpu|cuda] [--tokens T] [--hidden H] [--experts E] [--top-k K] [--ffn F]
//                [--score softmax|sigmoid] [--normalize] [--scaling S] [--bias]
//                [--groups G --group-top-k G2] [--capacity-factor CF] [--seed N]
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "runtime/error.hpp"
#include "runtime/npy.hpp"

using namespace actbench;

namespace {

struct Config {
  std::string out, backend = "cpu";
  int64_t tokens = 12, hidden = 16, experts = 4, ffn = 8;
  MoeRouting routing;
  bool bias = false;
  std::optional<double> capacity_factor;
  uint32_t seed = 1;
};

Config parse(int argc, char** argv) {
  Config c;
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--normalize") c.routing.normalize = true;
    else if (a == "--bias") c.bias = true;
    else if (i + 1 < argc && a.rfind("--", 0) == 0) values[a] = argv[++i];
    else throw InvalidArgument("unknown argument '" + a + "'");
  }
  for (const auto& [key, v] : values) {
    if (key == "--out") c.out = v;
    else if (key == "--backend" && (v == "cpu" || v == "cuda")) c.backend = v;
    else if (key == "--tokens") c.tokens = std::stoll(v);
    else if (key == "--hidden") c.hidden = std::stoll(v);
    else if (key == "--experts") c.experts = std::stoll(v);
    else if (key == "--top-k") c.routing.top_k = std::stoll(v);
    else if (key == "--ffn") c.ffn = std::stoll(v);
    else if (key == "--score" && (v == "softmax" || v == "sigmoid"))
      c.routing.score = v == "sigmoid" ? MoeRouting::Score::sigmoid : MoeRouting::Score::softmax;
    else if (key == "--scaling") c.routing.scaling = std::stof(v);
    else if (key == "--groups") c.routing.num_groups = std::stoll(v);
    else if (key == "--group-top-k") c.routing.group_top_k = std::stoll(v);
    else if (key == "--capacity-factor") c.capacity_factor = std::stod(v);
    else if (key == "--seed") c.seed = static_cast<uint32_t>(std::stoul(v));
    else throw InvalidArgument("bad option " + key + " " + v);
  }
  if (c.out.empty()) throw InvalidArgument("--out DIR is required");
  return c;
}

class Dumper {
 public:
  Dumper(Backend& be, std::string dir, uint32_t seed) : be_(be), dir_(std::move(dir)), rng_(seed) {}

  // A tensor of values uniform in [-scale, scale), written as an input.
  Tensor input(const std::string& name, Shape shape, double scale) {
    Tensor t = be_.empty(std::move(shape), DType::fp32);
    std::uniform_real_distribution<float> u(static_cast<float>(-scale), static_cast<float>(scale));
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (float& x : v) x = u(rng_);
    be_.upload(v.data(), t);
    write(name, t);
    return t;
  }
  void write(const std::string& name, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be_.download(t, v.data());
    write_npy_f32(dir_ + "/" + name + ".npy", t.shape(), v);
  }

 private:
  Backend& be_;
  std::string dir_;
  std::mt19937 rng_;
};

void run(const Config& c) {
  auto be = make_backend(c.backend);
  std::filesystem::create_directories(c.out);
  Dumper d(*be, c.out, c.seed);
  const int64_t T = c.tokens, H = c.hidden, E = c.experts, F = c.ffn, k = c.routing.top_k;
  const DType f = DType::fp32;
  const Tensor x = d.input("x", {T, H}, 1.0), w_router = d.input("w_router", {H, E}, 1.0);
  const Tensor bias = c.bias ? d.input("bias", {E}, 0.1) : Tensor();
  const Tensor w1 = d.input("w1", {E, H, 2 * F}, 0.5), w2 = d.input("w2", {E, F, H}, 0.5);
  const Tensor d_out = d.input("d_out", {T, H}, 1.0);

  // ---- forward ----
  Tensor logits = be->empty({T, E}, f), scores = be->empty({T, E}, f), index = be->empty({T, k}, DType::i32),
         weight = be->empty({T, k}, f), aux = be->empty({1}, f);
  be->gemm(gemm_args(false, false, T, E, H), x, w_router, logits);
  be->moe_route(logits, bias, c.routing, scores, index, weight, aux);
  const MoeDispatch plan = make_moe_dispatch(*be, T, k, E);
  be->moe_dispatch(index, c.capacity_factor, plan);
  std::vector<float> counts(static_cast<size_t>(E));  // the plan lives on the backend's device
  be->download(plan.tokens_per_expert, counts.data());
  int64_t N = 0;
  for (float n : counts) N += static_cast<int64_t>(n);
  Tensor permuted = be->empty({N, H}, f), fc1 = be->empty({N, 2 * F}, f), act = be->empty({N, F}, f),
         fc2 = be->empty({N, H}, f), out = be->empty({T, H}, f);
  be->moe_permute(x, plan, permuted);
  be->grouped_gemm(permuted, w1, plan.tokens_per_expert, fc1);
  be->swiglu_fwd(fc1, act);
  be->grouped_gemm(act, w2, plan.tokens_per_expert, fc2);
  be->moe_unpermute(fc2, plan, weight, out);

  // ---- backward ----
  Tensor d_fc2 = be->empty({N, H}, f), d_weight = be->empty({T, k}, f), d_act = be->empty({N, F}, f),
         dw2 = be->empty({E, F, H}, f), d_fc1 = be->empty({N, 2 * F}, f), d_permuted = be->empty({N, H}, f),
         dw1 = be->empty({E, H, 2 * F}, f), dx = be->empty({T, H}, f), d_logits = be->empty({T, E}, f),
         dw_router = be->empty({H, E}, f);
  be->moe_unpermute_bwd(d_out, fc2, plan, weight, d_fc2, d_weight);
  be->grouped_gemm_bwd(d_fc2, act, w2, plan.tokens_per_expert, d_act, dw2);
  be->swiglu_bwd(d_act, fc1, d_fc1);
  be->grouped_gemm_bwd(d_fc1, permuted, w1, plan.tokens_per_expert, d_permuted, dw1);
  be->moe_permute_bwd(d_permuted, plan, dx);
  be->moe_route_bwd(d_weight, scores, index, c.routing, d_logits);
  be->gemm(gemm_args(false, true, T, H, E, 1, 1.f, 1.f), d_logits, w_router, dx);  // dx += d_logits w_router^T
  be->gemm(gemm_args(true, false, H, E, T), x, d_logits, dw_router);

  const std::vector<std::pair<const char*, const Tensor*>> results = {
      {"logits", &logits}, {"scores", &scores}, {"topk_index", &index}, {"topk_weight", &weight},
      {"aux_loss", &aux}, {"tokens_per_expert", &plan.tokens_per_expert}, {"row_slot", &plan.row_slot},
      {"slot_row", &plan.slot_row}, {"permuted", &permuted}, {"fc1", &fc1}, {"act", &act}, {"fc2", &fc2},
      {"out", &out}, {"d_topk_weight", &d_weight}, {"d_logits", &d_logits}, {"dx", &dx},
      {"dw_router", &dw_router}, {"dw1", &dw1}, {"dw2", &dw2}};
  for (const auto& [name, t] : results) d.write(name, *t);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(parse(argc, argv));
    return 0;
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "moe_ops_dump: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_ops_dump: %s\n", e.what());
    return 1;
  }
}
