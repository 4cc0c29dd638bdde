// Megatron's --recompute-method over a stack of layers (full recompute): uniform keeps each
// group's input and recomputes the group; block recomputes the first N layers and keeps all
// of the rest. Meta measures the bytes the stack keeps; they must equal the stack's closed
// form built from the per-layer ones (result_row.hpp), and on cpu neither method may change
// a gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "layer_harness.hpp"
#include "layers/layer.hpp"
#include "layers/params.hpp"
#include "runners/experiment.hpp"
#include "runners/closed_form.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

ExperimentSpec stack_spec(const std::string& config, int layers, StackRecompute stack, LayerDims d) {
  ExperimentSpec spec = small_spec(config, DType::bf16, 0.1f, d);
  spec.layers = layers;
  spec.stack = stack;
  spec.warmup = 0;
  spec.iters = 1;
  return spec;
}

// Bytes one layer keeps under the policy (the per-layer closed form at t).
double layer_formula(const ExperimentSpec& spec, int t, Recompute r) {
  LayerPolicy p = spec.policy;
  p.recompute = r;
  return formula_bytes(spec.dims, t, p, spec.dtype);
}

}  // namespace

TEST(StackRecompute, MetaBytesEqualTheStacksClosedForm) {
  LayerDims gpt{64, 2, 64, 8};
  LayerDims llama{64, 2, 64, 8};
  llama.spec = theory::llama_layer_spec(4, 96);
  for (const LayerDims& d : {gpt, llama})
    for (int t : {1, 2, 4})
      for (const std::string config : {"full", "full+sp"})
        for (Attention att : {Attention::unfused, Attention::fused})
          for (int layers = 1; layers <= 5; ++layers)
            for (RecomputeMethod method : {RecomputeMethod::none, RecomputeMethod::uniform, RecomputeMethod::block})
              for (int n = 1; n <= (method == RecomputeMethod::none ? 1 : layers); ++n) {
                auto be = make_meta_backend();
                auto comm = make_emulated_communicator(t);
                ExperimentSpec spec = stack_spec(config, layers, {method, n}, d);
                spec.policy.attention = att;
                const ExperimentResult r = run_experiment(*be, *comm, spec);
                const std::string what = config + " t=" + std::to_string(t) + " L=" + std::to_string(layers) +
                                         " " + recompute_method_name(method) + " N=" + std::to_string(n);
                ASSERT_EQ(r.status, "ok") << r.message << " " << what;
                EXPECT_EQ(static_cast<double>(r.stack_act_bytes), stack_formula_bytes(spec, t)) << what;
                EXPECT_EQ(r.act_bytes, r.stack_act_bytes / layers) << what;
              }
}

TEST(StackRecompute, TheMethodsKeepWhatMegatronSays) {
  // Written out from the per-layer forms: block keeps N inputs and L - N whole layers;
  // uniform keeps ceil(L / N) inputs; N = 1 is full recompute layer by layer either way.
  LayerDims d{64, 2, 64, 8};
  auto be = make_meta_backend();
  auto comm = make_emulated_communicator(2);
  for (const std::string config : {"full", "full+sp"}) {
    const ExperimentSpec base = stack_spec(config, 6, {}, d);
    const double input = layer_formula(base, 2, Recompute::full), whole = layer_formula(base, 2, Recompute::none);
    auto bytes = [&](RecomputeMethod m, int n) {
      return static_cast<double>(run_experiment(*be, *comm, stack_spec(config, 6, {m, n}, d)).stack_act_bytes);
    };
    EXPECT_EQ(bytes(RecomputeMethod::none, 1), 6 * input);
    EXPECT_EQ(bytes(RecomputeMethod::block, 2), 2 * input + 4 * whole);
    EXPECT_EQ(bytes(RecomputeMethod::block, 6), 6 * input);
    EXPECT_EQ(bytes(RecomputeMethod::uniform, 1), 6 * input);
    EXPECT_EQ(bytes(RecomputeMethod::uniform, 4), 2 * input);  // groups of 4 and 2
    EXPECT_EQ(bytes(RecomputeMethod::uniform, 6), 1 * input);
  }
}

TEST(StackRecompute, UniformHoldsOneGroupInBackward) {
  // A larger group keeps fewer inputs but rebuilds more layers at once: its peak is higher.
  LayerDims d{64, 2, 64, 8};
  auto be = make_meta_backend();
  auto comm = make_local_communicator();
  auto peak = [&](int n) {
    return run_experiment(*be, *comm, stack_spec("full", 6, {RecomputeMethod::uniform, n}, d)).peak_allocated_bytes;
  };
  EXPECT_LT(peak(1), peak(3));
  EXPECT_LT(peak(3), peak(6));
}

TEST(StackRecompute, UniformsRebuiltGroupIsLoggedAsRecomputeNotForward) {
  // Every phase a layer enters, counted by its stage: "fwd" for the forward pass, "recompute"
  // for what backward runs again (Figure 8's split and the nsys ranges read these names).
  struct StageCounts : PhaseListener {
    int fwd = 0, recompute = 0;
    void enter(const std::string& phase) override {
      fwd += phase.rfind("fwd.", 0) == 0;
      recompute += phase.rfind("recompute.", 0) == 0;
    }
    void exit() override {}
  };
  LayerDims d{64, 2, 64, 8};
  auto be = make_meta_backend();
  auto comm = make_local_communicator();
  auto count = [&](const std::string& config, StackRecompute stack) {
    LayerStackRunner runner(*be, *comm, stack_spec(config, 4, stack, d));
    StageCounts counts;
    PhaseLog log;
    log.set_listener(&counts);
    runner.iteration(false, &log);
    return counts;
  };
  const StageCounts plain = count("baseline", {}), uniform = count("full", {RecomputeMethod::uniform, 2});
  ASSERT_GT(plain.fwd, 0);
  EXPECT_EQ(plain.recompute, 0);
  EXPECT_EQ(uniform.fwd, plain.fwd);        // the forward pass once
  EXPECT_EQ(uniform.recompute, plain.fwd);  // and every layer's forward again, as recompute
}

TEST(StackRecompute, NoMethodChangesAGradient) {
  LayerDims d{8, 2, 32, 4};
  d.spec = theory::llama_layer_spec(2, 48);
  d.spec.attention_dropout = d.spec.hidden_dropout = 0.1;
  auto be = make_cpu_backend();
  auto comm = make_local_communicator();
  auto gradients = [&](StackRecompute stack) {
    ExperimentSpec spec = stack_spec("full", 4, stack, d);
    spec.dtype = DType::fp32;
    LayerStackRunner runner(*be, *comm, spec);
    runner.iteration();
    std::vector<std::vector<float>> out;
    for (const auto& layer : runner.layers())
      for (const ParamInfo& p : layer_param_table(d)) {
        const Tensor& g = layer->grads().*p.member;
        out.emplace_back(g.numel());
        be->download(g, out.back().data());
      }
    return out;
  };
  const auto expected = gradients({});
  for (StackRecompute stack : {StackRecompute{RecomputeMethod::uniform, 2}, StackRecompute{RecomputeMethod::uniform, 3},
                               StackRecompute{RecomputeMethod::block, 1}, StackRecompute{RecomputeMethod::block, 4}})
    EXPECT_EQ(gradients(stack), expected) << recompute_method_name(stack.method) << " " << stack.num_layers;
}

TEST(StackRecompute, RefusesWhatMegatronRefuses) {
  LayerDims d{64, 2, 64, 8};
  auto be = make_meta_backend();
  auto comm = make_local_communicator();
  EXPECT_THROW(run_experiment(*be, *comm, stack_spec("selective", 4, {RecomputeMethod::uniform, 2}, d)),
               InvalidArgument);
  EXPECT_THROW(run_experiment(*be, *comm, stack_spec("full", 4, {RecomputeMethod::block, 5}, d)), InvalidArgument);
  EXPECT_THROW(run_experiment(*be, *comm, stack_spec("full", 4, {RecomputeMethod::uniform, 0}, d)), InvalidArgument);
  EXPECT_THROW(parse_recompute_method("selective"), InvalidArgument);
}
