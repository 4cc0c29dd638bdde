// The llama family on the cuda backend against the cpu reference: RMSNorm, RoPE, SwiGLU and
// grouped-query fused attention op by op (outputs NaN-poisoned first), the whole layer in
// every configuration (unfused and fused, GQA/MQA/MHA), and its activation bytes against meta
// and the closed forms. Without a device every test skips with one line.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/backend_comm.hpp"
#include "layer_harness.hpp"
#include "runners/experiment.hpp"
#include "runtime/error.hpp"
#include "theory/llama_memory.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

double tol_for(DType dt) { return dt == DType::fp32 ? 1e-5 : (dt == DType::fp16 ? 2e-3 : 1e-2); }

LayerDims llama(int64_t s, int64_t b, int64_t h, int64_t a, int64_t g, int64_t f) {
  LayerDims d{s, b, h, a};
  d.spec = theory::llama_layer_spec(double(g), double(f));
  return d;
}

class GpuLlama : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      gpu_ = make_backend("cuda");
    } catch (const InvalidArgument&) {
      GTEST_SKIP() << "no CUDA device: GPU test skipped";
    }
    cpu_ = make_backend("cpu");
  }
  struct Both {
    Tensor g, c;
  };
  Both random(const Shape& shape, DType dt, float lo = -1.f, float hi = 1.f) {
    const auto host = random_values(static_cast<size_t>(shape_numel(shape)), seed_++, lo, hi);
    Both t{gpu_->empty(shape, dt), cpu_->empty(shape, dt)};
    gpu_->upload(host.data(), t.g);
    cpu_->upload(host.data(), t.c);
    return t;
  }
  Both poisoned(const Shape& shape, DType dt) {
    const std::vector<float> nan(static_cast<size_t>(shape_numel(shape)), std::numeric_limits<float>::quiet_NaN());
    Both t{gpu_->empty(shape, dt), cpu_->empty(shape, dt)};
    gpu_->upload(nan.data(), t.g);
    cpu_->upload(nan.data(), t.c);
    return t;
  }
  void expect_close(const Both& t, double tol, const std::string& what) {
    std::vector<float> g(static_cast<size_t>(t.g.numel())), c(g.size());
    gpu_->download(t.g, g.data());
    cpu_->download(t.c, c.data());
    EXPECT_LE(worst_ratio(g, c, tol, tol), 1.0) << what;
  }
  std::unique_ptr<Backend> gpu_, cpu_;
  uint32_t seed_ = 11;
};

}  // namespace

TEST_F(GpuLlama, RmsNormMatchesCpu) {
  for (DType dt : {DType::fp32, DType::bf16})
    for (int64_t cols : {37, 256, 1000}) {
      const int64_t rows = 19;
      Both x = random({rows, cols}, dt, -2, 2), w = random({cols}, dt, 0.5, 1.5), dy = random({rows, cols}, dt);
      Both y = poisoned({rows, cols}, dt), rstd = poisoned({rows}, DType::fp32);
      gpu_->rmsnorm_fwd(x.g, w.g, 1e-5f, y.g, rstd.g);
      cpu_->rmsnorm_fwd(x.c, w.c, 1e-5f, y.c, rstd.c);
      const std::string what = std::string(dtype_name(dt)) + " cols=" + std::to_string(cols);
      expect_close(y, tol_for(dt), "rmsnorm y " + what);
      expect_close(rstd, 1e-5, "rmsnorm rstd " + what);
      Both dx = poisoned({rows, cols}, dt), dw = poisoned({cols}, dt);
      gpu_->rmsnorm_bwd(dy.g, x.g, w.g, rstd.g, dx.g, dw.g);
      cpu_->rmsnorm_bwd(dy.c, x.c, w.c, rstd.c, dx.c, dw.c);
      expect_close(dx, tol_for(dt) * 10, "rmsnorm dx " + what);
      expect_close(dw, tol_for(dt) * 10, "rmsnorm dw " + what);
    }
}

TEST_F(GpuLlama, RopeAndSwigluMatchCpu) {
  for (DType dt : {DType::fp32, DType::bf16}) {
    const std::string what = dtype_name(dt);
    for (double theta : {10000.0, 500000.0}) {
      Both x = random({2, 3, 70, 14}, dt), y = poisoned({2, 3, 70, 14}, dt);
      gpu_->rope_fwd(x.g, theta, 14, y.g);
      cpu_->rope_fwd(x.c, theta, 14, y.c);
      expect_close(y, tol_for(dt), "rope_fwd " + what);
      gpu_->rope_bwd(y.g, theta, 14, y.g);  // in place
      cpu_->rope_bwd(y.c, theta, 14, y.c);
      expect_close(y, tol_for(dt), "rope_bwd " + what);
    }
    Both x = random({23, 2 * 41}, dt, -4, 4), y = poisoned({23, 41}, dt), dy = random({23, 41}, dt);
    gpu_->swiglu_fwd(x.g, y.g);
    cpu_->swiglu_fwd(x.c, y.c);
    expect_close(y, tol_for(dt), "swiglu_fwd " + what);
    Both dx = poisoned({23, 2 * 41}, dt);
    gpu_->swiglu_bwd(dy.g, x.g, dx.g);
    cpu_->swiglu_bwd(dy.c, x.c, dx.c);
    expect_close(dx, tol_for(dt), "swiglu_bwd " + what);
  }
}

TEST_F(GpuLlama, GroupedQueryFusedAttentionMatchesCpu) {
  const int64_t S = 77, D = 24, B = 8;
  for (int64_t r : {1, 2, 8}) {
    DropoutSpec none;
    none.outer = B;
    none.inner = S * S;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    Both q = random({B, S, D}, DType::fp32), k = random({B / r, S, D}, DType::fp32), v = random({B / r, S, D}, DType::fp32);
    Both out = poisoned({B, S, D}, DType::fp32), lse = poisoned({B, S}, DType::fp32), dout = random({B, S, D}, DType::fp32);
    gpu_->attention_fwd(q.g, k.g, v.g, scale, none, out.g, lse.g);
    cpu_->attention_fwd(q.c, k.c, v.c, scale, none, out.c, lse.c);
    const std::string what = "r=" + std::to_string(r);
    expect_close(out, 1e-4, "out " + what);
    expect_close(lse, 1e-4, "lse " + what);
    Both dq = poisoned({B, S, D}, DType::fp32), dk = poisoned({B / r, S, D}, DType::fp32),
         dv = poisoned({B / r, S, D}, DType::fp32);
    gpu_->attention_bwd(q.g, k.g, v.g, out.g, dout.g, lse.g, scale, none, dq.g, dk.g, dv.g);
    cpu_->attention_bwd(q.c, k.c, v.c, out.c, dout.c, lse.c, scale, none, dq.c, dk.c, dv.c);
    expect_close(dq, 1e-4, "dq " + what);
    expect_close(dk, 1e-4, "dk " + what);
    expect_close(dv, 1e-4, "dv " + what);
  }
}

TEST_F(GpuLlama, WholeLayerMatchesCpuInEveryConfiguration) {
  for (const LayerDims& d : {llama(33, 2, 48, 4, 2, 40), llama(20, 1, 64, 4, 1, 72), llama(16, 2, 32, 2, 2, 56)})
    for (const std::string& config : config_names())
      for (Attention att : {Attention::unfused, Attention::fused}) {
        ExperimentSpec spec = small_spec(config, DType::fp32, 0.f, d);
        spec.policy.attention = att;
        auto gcomm = make_backend_local_communicator(*gpu_);
        auto ccomm = make_local_communicator();
        expect_same_tensors(run_layer_canonical(*gpu_, *gcomm, spec), run_layer_canonical(*cpu_, *ccomm, spec), 1e-4,
                            1e-4, config + " " + attention_name(att) + " g=" + std::to_string(d.groups()));
      }
}

// Multi-latent attention (layers/mla_attention.cpp) runs on the cuda backend's existing ops
// (row-block GEMMs, head layouts of odd widths, RoPE on a column range): every tensor equals
// the cpu's, in every configuration and with the mla_up_proj module, and the bytes equal meta's.
TEST_F(GpuLlama, MultiLatentAttentionLayerMatchesCpuAndMeta) {
  LayerDims q_latent = llama(17, 2, 32, 4, 0, 40);
  q_latent.spec.kv_heads = 0;
  q_latent.spec.mla = {true, 6, 5, 4, 2, 3};
  LayerDims q_projected{12, 1, 24, 2};
  q_projected.spec.add_bias_linear = false;
  q_projected.spec.position = theory::PositionEmbedding::rope;
  q_projected.spec.mla = {true, 0, 8, 8, 4, 6};
  for (const LayerDims& d : {q_latent, q_projected})
    for (const std::string& config : config_names()) {
      ExperimentSpec spec = small_spec(config, DType::fp32, d.spec.add_bias_linear ? 0.f : 0.1f, d);
      if (spec.policy.recompute == Recompute::selective) spec.policy.modules.mla_up_proj = true;
      auto gcomm = make_backend_local_communicator(*gpu_);
      auto ccomm = make_local_communicator();
      const std::string what = "mla L_q=" + std::to_string(int(d.spec.mla.q_lora_rank)) + " " + config;
      expect_same_tensors(run_layer_canonical(*gpu_, *gcomm, spec), run_layer_canonical(*cpu_, *ccomm, spec), 1e-4,
                          1e-4, what);
      spec.dtype = DType::bf16;
      spec.warmup = 0;
      spec.iters = 1;
      auto meta = make_backend("meta");
      auto mcomm = make_local_communicator();
      const ExperimentResult g = run_experiment(*gpu_, *gcomm, spec), m = run_experiment(*meta, *mcomm, spec);
      ASSERT_EQ(g.status, "ok") << what << ": " << g.message;
      EXPECT_EQ(g.act_by_category, m.act_by_category) << what;
      EXPECT_EQ(g.fwd_retained_bytes, g.act_bytes + g.act_extra_bytes) << what;
    }
  // Fused attention with latent attention's narrower v (the cuda backend pads it to q's head
  // size): the cpu's tensors, with dropout, and meta's bytes.
  for (const LayerDims& d : {q_latent, q_projected})
    for (const std::string config : {"baseline", "selective"}) {
      ExperimentSpec fused = small_spec(config, DType::fp32, 0.1f, d);
      fused.policy.attention = Attention::fused;
      auto gcomm = make_backend_local_communicator(*gpu_);
      auto ccomm = make_local_communicator();
      const std::string what = "fused mla L_q=" + std::to_string(int(d.spec.mla.q_lora_rank)) + " " + config;
      expect_same_tensors(run_layer_canonical(*gpu_, *gcomm, fused), run_layer_canonical(*cpu_, *ccomm, fused), 1e-4,
                          1e-4, what);
      fused.warmup = 0, fused.iters = 1;
      auto meta = make_backend("meta");
      auto mcomm = make_local_communicator();
      const ExperimentResult g = run_experiment(*gpu_, *gcomm, fused), m = run_experiment(*meta, *mcomm, fused);
      ASSERT_EQ(g.status, "ok") << what << ": " << g.message;
      EXPECT_EQ(g.act_by_category, m.act_by_category) << what;
    }
}

TEST_F(GpuLlama, ActivationBytesEqualMetaAndTheClosedForms) {
  const LayerDims d = llama(64, 2, 128, 8, 2, 200);
  for (int t : {1, 2})
    for (const std::string& config : config_names())
      for (Attention att : {Attention::unfused, Attention::fused}) {
        ExperimentSpec spec = small_spec(config, DType::bf16, 0.f, d);
        spec.policy.attention = att;
        spec.warmup = 0;
        spec.iters = 1;
        auto meta = make_backend("meta");
        auto gcomm = t == 1 ? make_backend_local_communicator(*gpu_) : make_backend_emulated_communicator(*gpu_, t);
        auto mcomm = t == 1 ? make_local_communicator() : make_emulated_communicator(t);
        const ExperimentResult g = run_experiment(*gpu_, *gcomm, spec), m = run_experiment(*meta, *mcomm, spec);
        const std::string what = config + " " + attention_name(att) + " t=" + std::to_string(t);
        ASSERT_EQ(g.status, "ok") << what << ": " << g.message;
        EXPECT_EQ(g.act_bytes, m.act_bytes) << what;
        EXPECT_EQ(g.act_by_category, m.act_by_category) << what;
        EXPECT_EQ(g.fwd_retained_bytes, g.act_bytes + g.act_extra_bytes) << what;
        EXPECT_EQ(static_cast<double>(g.act_bytes),
                  theory::llama_closed_form({64, 2, 128, 8, 2, 200, static_cast<double>(t)}, spec.policy))
            << what;
      }
}
