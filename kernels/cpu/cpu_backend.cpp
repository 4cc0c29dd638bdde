// The CPU reference backend: fp32 math on bf16/fp16/fp32 storage, double accumulators for
// reductions, Eigen for GEMMs. Correctness first: this is what the CUDA kernels and the
// NumPy reference are checked against, at small shapes. Elementwise and per-row loops write
// disjoint outputs, so they can be parallelised as they stand; the column sums (bias_grad,
// LayerNorm weight grads) would need per-thread partial sums.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_attention.hpp"
#include "kernels/cpu/cpu_moe.hpp"

namespace actbench {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM = Eigen::Map<RowMajor>;
using ConstMapRM = Eigen::Map<const RowMajor>;

// ---- fp32 views of any float storage -------------------------------------------------------

// Read-only fp32 elements of a tensor: its own storage when fp32 (no copy), else a widened copy.
class FloatIn {
 public:
  explicit FloatIn(const Tensor& t) {
    if (t.dtype() == DType::fp32) {
      p_ = t.data_as<const float>();
      return;
    }
    buf_.resize(static_cast<size_t>(t.numel()));
    const void* src = t.data();
    for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = load_as_float(src, t.dtype(), i);
    p_ = buf_.data();
  }
  const float* data() const { return p_; }
  float operator[](int64_t i) const { return p_[i]; }

 private:
  std::vector<float> buf_;
  const float* p_ = nullptr;
};

// Writable fp32 elements of a tensor: its own storage when fp32, else a scratch buffer that
// commit() rounds into the tensor once (so 16-bit outputs are rounded exactly once).
// `load` fills the scratch buffer with the current values (for outputs that are also read).
class FloatOut {
 public:
  explicit FloatOut(const Tensor& t, bool load = false) : t_(t) {
    if (t.dtype() == DType::fp32) {
      p_ = t.data_as<float>();
      return;
    }
    buf_.assign(static_cast<size_t>(t.numel()), 0.f);
    if (load) {
      const void* src = t.data();
      for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = load_as_float(src, t.dtype(), i);
    }
    p_ = buf_.data();
  }
  float* data() { return p_; }
  float& operator[](int64_t i) { return p_[i]; }
  void commit() {
    if (t_.dtype() == DType::fp32) return;
    void* dst = t_.data();
    for (size_t i = 0; i < buf_.size(); ++i) store_from_float(dst, t_.dtype(), i, buf_[i]);
  }

 private:
  const Tensor& t_;
  std::vector<float> buf_;
  float* p_ = nullptr;
};

// Writes double accumulators into a [N] output of any float dtype.
void store_doubles(const std::vector<double>& v, const Tensor& t) {
  void* dst = t.data();
  for (size_t i = 0; i < v.size(); ++i) store_from_float(dst, t.dtype(), i, static_cast<float>(v[i]));
}

// ---- elementwise math ----------------------------------------------------------------------

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

float gelu_tanh(float x) { return 0.5f * x * (1.f + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x))); }

// d/dx of gelu_tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3c x^2), t = tanh(inner).
float gelu_tanh_grad(float x) {
  const float t = std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
}

// max(x, 0), NaN kept (a NaN input must not come out as a clean 0).
float relu(float x) { return x < 0.f ? 0.f : x; }

// 1 / (1 - p), the scale of kept elements (1 when nothing is dropped).
float keep_scale(float p) { return p > 0.f ? 1.f / (1.f - p) : 1.f; }

// One op(A) * op(B) into C with alpha/beta. beta == 0 never reads C (it may be uninitialised).
template <class OpA, class OpB>
void gemm_one(const OpA& a, const OpB& b, float alpha, float beta, MapRM& c) {
  if (beta == 0.f) {
    c.noalias() = alpha * a * b;
  } else {
    if (beta != 1.f) c *= beta;
    c.noalias() += alpha * a * b;
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(size_t capacity) : Backend(std::make_unique<CachingAllocator>(make_host_source(), capacity)) {}
  const char* name() const override { return "cpu"; }
  std::string device_name() const override { return "host-cpu"; }
  bool computes() const override { return true; }

 private:
  // The ops, on arguments that meet the contract (kernels/backend.cpp checked them).
  // ---- data movement ----
  void fill_zero_impl(const Tensor& t) override {
    if (t.numel() > 0) std::memset(t.data(), 0, t.bytes());  // all-zero bits are 0.0 in every dtype
  }
  void copy_impl(const Tensor& src, const Tensor& dst) override {
    if (src.numel() > 0) std::memmove(dst.data(), src.data(), src.bytes());
  }
  void upload_impl(const float* host, const Tensor& dst) override {
    if (dst.numel() == 0) return;
    if (dst.dtype() == DType::fp32) {
      std::memcpy(dst.data(), host, dst.bytes());
      return;
    }
    void* p = dst.data();
    for (size_t i = 0; i < static_cast<size_t>(dst.numel()); ++i) store_from_float(p, dst.dtype(), i, host[i]);
  }
  void download_impl(const Tensor& src, float* host) override {
    if (src.numel() == 0) return;
    if (src.dtype() == DType::fp32) {
      std::memcpy(host, src.data(), src.bytes());
      return;
    }
    const void* p = src.data();
    for (size_t i = 0; i < static_cast<size_t>(src.numel()); ++i) host[i] = load_as_float(p, src.dtype(), i);
  }
  void add_inplace_impl(const Tensor& dst, const Tensor& src) override {
    const FloatIn s(src);
    FloatOut d(dst, /*load=*/true);
    for (int64_t i = 0; i < dst.numel(); ++i) d[i] += s[i];
    d.commit();
  }

  // ---- GEMM ----
  void gemm_impl(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c) override {
    if (c.numel() == 0) return;
    // fp32 operands are mapped in place; 16-bit ones are widened to fp32 temporaries first.
    const FloatIn A(a), B(b);
    FloatOut C(c, /*load=*/g.beta != 0.f);
    const int64_t sa = g.m * g.k, sb = g.k * g.n, sc = g.m * g.n;
    for (int64_t i = 0; i < g.batch; ++i) {
      // Stored shapes: A [m, k] or [k, m] (trans_a); B [k, n] or [n, k] (trans_b).
      const ConstMapRM Ai(A.data() + i * sa, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k);
      const ConstMapRM Bi(B.data() + i * sb, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n);
      MapRM Ci(C.data() + i * sc, g.m, g.n);
      if (g.trans_a && g.trans_b) gemm_one(Ai.transpose(), Bi.transpose(), g.alpha, g.beta, Ci);
      else if (g.trans_a) gemm_one(Ai.transpose(), Bi, g.alpha, g.beta, Ci);
      else if (g.trans_b) gemm_one(Ai, Bi.transpose(), g.alpha, g.beta, Ci);
      else gemm_one(Ai, Bi, g.alpha, g.beta, Ci);
    }
    C.commit();
  }

  void add_bias_impl(const Tensor& y, const Tensor& bias) override {
    const int64_t N = bias.numel();
    const int64_t M = y.numel() / N;
    const FloatIn bv(bias);
    FloatOut yv(y, /*load=*/true);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) yv[r * N + j] += bv[j];
    yv.commit();
  }

  void bias_grad_impl(const Tensor& dy, const Tensor& db) override {
    const int64_t N = db.numel();
    const int64_t M = dy.numel() / N;
    const FloatIn g(dy);
    std::vector<double> acc(static_cast<size_t>(N), 0.0);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) acc[static_cast<size_t>(j)] += g[r * N + j];
    store_doubles(acc, db);  // written, not accumulated
  }

  // ---- LayerNorm ----
  void layernorm_fwd_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& y,
                          const Tensor& mean, const Tensor& rstd) override {
    const int64_t H = weight.numel(), M = x.numel() / H;
    const FloatIn xv(x), w(weight), b(bias);
    FloatOut yv(y);
    float* mp = mean.data_as<float>();
    float* rp = rstd.data_as<float>();
    for (int64_t r = 0; r < M; ++r) {
      const float* row = xv.data() + r * H;
      double mu = 0;
      for (int64_t j = 0; j < H; ++j) mu += row[j];
      mu /= static_cast<double>(H);
      double var = 0;  // two passes: no cancellation for rows with a large mean
      for (int64_t j = 0; j < H; ++j) var += (row[j] - mu) * (row[j] - mu);
      var /= static_cast<double>(H);  // biased, as LayerNorm defines it
      const float mu_f = static_cast<float>(mu), rs = static_cast<float>(1.0 / std::sqrt(var + eps));
      for (int64_t j = 0; j < H; ++j) yv[r * H + j] = (row[j] - mu_f) * rs * w[j] + b[j];
      mp[r] = mu_f;
      rp[r] = rs;
    }
    yv.commit();
  }

  void layernorm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) override {
    const int64_t H = weight.numel(), M = x.numel() / H;
    const FloatIn g(dy), xv(x), w(weight);
    const float* mp = mean.data_as<const float>();
    const float* rp = rstd.data_as<const float>();
    FloatOut dxo(dx);  // row r of dx is written after row r of dy and x is read: dx may alias either
    std::vector<double> dw(static_cast<size_t>(H), 0.0), db(static_cast<size_t>(H), 0.0);
    for (int64_t r = 0; r < M; ++r) {
      const float mu = mp[r], rs = rp[r];
      const float* xr = xv.data() + r * H;
      const float* gr = g.data() + r * H;
      double sum_g = 0, sum_gx = 0;  // of g = dy * w and of g * xhat
      for (int64_t j = 0; j < H; ++j) {
        const float xhat = (xr[j] - mu) * rs, gj = gr[j] * w[j];
        sum_g += gj;
        sum_gx += static_cast<double>(gj) * xhat;
        dw[static_cast<size_t>(j)] += static_cast<double>(gr[j]) * xhat;
        db[static_cast<size_t>(j)] += gr[j];
      }
      const float mean_g = static_cast<float>(sum_g / static_cast<double>(H));
      const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(H));
      for (int64_t j = 0; j < H; ++j) {
        const float xhat = (xr[j] - mu) * rs, gj = gr[j] * w[j];
        dxo[r * H + j] = rs * (gj - mean_g - xhat * mean_gx);
      }
    }
    dxo.commit();
    store_doubles(dw, dweight);  // written, not accumulated
    store_doubles(db, dbias);
  }

  // ---- causal softmax ----
  void softmax_causal_fwd_impl(const Tensor& scores, const Tensor& probs, const SeqPositions& pos) override {
    const int64_t C = scores.dim(-1), R = scores.dim(-2);
    const int64_t rows = C > 0 ? scores.numel() / C : 0;  // row r of each matrix sees columns <= pos.at(r)
    const FloatIn sv(scores);
    FloatOut pv(probs);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t last = pos.at(r % R);
      const float* in = sv.data() + r * C;
      float* out = pv.data() + r * C;
      float mx = in[0];
      for (int64_t j = 1; j <= last; ++j) mx = std::max(mx, in[j]);
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) {
        out[j] = std::exp(in[j] - mx);  // max subtracted: exp never overflows
        sum += out[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= last; ++j) out[j] *= inv;
      for (int64_t j = last + 1; j < C; ++j) out[j] = 0.f;  // the causal mask: exactly zero
    }
    pv.commit();
  }

  void softmax_causal_bwd_impl(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores,
                               const SeqPositions& pos) override {
    const int64_t C = probs.dim(-1), R = probs.dim(-2);
    const int64_t rows = C > 0 ? probs.numel() / C : 0;
    const FloatIn dp(dprobs), p(probs);
    FloatOut ds(dscores);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t last = pos.at(r % R), o = r * C;
      double dot = 0;  // sum_j p_j dp_j over the visible columns
      for (int64_t j = 0; j <= last; ++j) dot += static_cast<double>(p[o + j]) * dp[o + j];
      const float dot_f = static_cast<float>(dot);
      for (int64_t j = 0; j <= last; ++j) ds[o + j] = p[o + j] * (dp[o + j] - dot_f);
      for (int64_t j = last + 1; j < C; ++j) ds[o + j] = 0.f;
    }
    ds.commit();
  }

  // ---- dropout ----
  void dropout_fwd_impl(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask) override {
    const FloatIn xv(x);
    FloatOut yv(y);
    uint8_t* m = mask.data_as<uint8_t>();
    const float scale = spec.scale();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const bool keep = spec.p == 0.f || spec.keep(i);  // the canonical index keys the Philox counter
      m[i] = keep ? 1 : 0;
      yv[i] = keep ? xv[i] * scale : 0.f;
    }
    yv.commit();
  }

  void dropout_bwd_impl(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) override {
    const FloatIn g(dy);
    FloatOut out(dx);
    const uint8_t* m = mask.data_as<const uint8_t>();
    const float scale = keep_scale(p);
    for (int64_t i = 0; i < dy.numel(); ++i) out[i] = (p == 0.f || m[i]) ? g[i] * scale : 0.f;
    out.commit();
  }

  // ---- GeLU ----
  void gelu_fwd_impl(const Tensor& x, const Tensor& y) override {
    const FloatIn xv(x);
    FloatOut yv(y);
    for (int64_t i = 0; i < x.numel(); ++i) yv[i] = gelu_tanh(xv[i]);
    yv.commit();
  }

  void gelu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    const FloatIn g(dy), xv(x);
    FloatOut out(dx);
    for (int64_t i = 0; i < x.numel(); ++i) out[i] = g[i] * gelu_tanh_grad(xv[i]);
    out.commit();
  }

  // ---- squared ReLU ----
  void squared_relu_fwd_impl(const Tensor& x, const Tensor& y) override {
    const FloatIn xv(x);
    FloatOut yv(y);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float r = relu(xv[i]);
      yv[i] = r * r;
    }
    yv.commit();
  }

  void squared_relu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    const FloatIn g(dy), xv(x);
    FloatOut out(dx);
    for (int64_t i = 0; i < x.numel(); ++i) out[i] = 2.f * relu(xv[i]) * g[i];
    out.commit();
  }

  // ---- out = residual + dropout(x + bias); no bias when bias is undefined ----
  void bias_dropout_residual_fwd_impl(const Tensor& x, const Tensor& bias, const Tensor& residual,
                                      const DropoutSpec& spec, const Tensor& out, const Tensor& mask) override {
    const FloatIn xv(x), rv(residual);
    std::optional<FloatIn> bv;
    if (bias.defined()) bv.emplace(bias);
    const int64_t N = bv ? bias.numel() : 1;
    FloatOut ov(out);
    uint8_t* m = mask.data_as<uint8_t>();
    const float scale = spec.scale();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const bool keep = spec.p == 0.f || spec.keep(i);  // exactly dropout_fwd's mask
      m[i] = keep ? 1 : 0;
      const float v = bv ? xv[i] + (*bv)[i % N] : xv[i];  // x + bias stays fp32: fused
      ov[i] = rv[i] + (keep ? v * scale : 0.f);
    }
    ov.commit();
  }

  // ---- fused attention (kernels/cpu/cpu_attention.cpp) ----
  void attention_fwd_impl(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const DropoutSpec& spec,
                          const Tensor& out, const Tensor& lse, const AttentionRows& rows) override {
    const FloatIn qv(q), kv(k), vv(v);
    FloatOut ov(out);
    cpu::attention_fwd(qv.data(), kv.data(), vv.data(), attention_shape(q, k, v, rows), scale, spec, ov.data(),
                       lse.data_as<float>());
    ov.commit();
  }

  void attention_bwd_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, float scale, const DropoutSpec& spec, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const AttentionRows& rows) override {
    const FloatIn qv(q), kv(k), vv(v), ov(out), gv(dout), lv(lse);
    FloatOut dqo(dq), dko(dk), dvo(dv);
    cpu::attention_bwd(qv.data(), kv.data(), vv.data(), ov.data(), gv.data(), lv.data(),
                       attention_shape(q, k, v, rows), scale, spec, dqo.data(), dko.data(), dvo.data());
    dqo.commit();
    dko.commit();
    dvo.commit();
  }

  void attention_merge_impl(const Tensor& out, const Tensor& lse, const Tensor& out_part,
                            const Tensor& lse_part) override {
    const int64_t D = out.dim(2), rows = out.dim(0) * out.dim(1);
    const FloatIn part(out_part);
    FloatOut acc(out, /*load=*/true);
    float* l = lse.data_as<float>();
    const float* lp = lse_part.data_as<const float>();
    for (int64_t r = 0; r < rows; ++r) {
      if (std::isinf(lp[r]) && lp[r] < 0) continue;  // the part saw no key: nothing to add
      const double a = l[r], b = lp[r];
      const double m = std::max(a, b);
      const double merged = m + std::log(std::exp(a - m) + std::exp(b - m));  // exp(-inf) = 0
      const double wa = std::exp(a - merged), wb = std::exp(b - merged);
      for (int64_t d = 0; d < D; ++d)
        acc[r * D + d] = static_cast<float>(wa * acc[r * D + d] + wb * part[r * D + d]);
      l[r] = static_cast<float>(merged);
    }
    acc.commit();
  }

  // ---- the llama family ----
  void rmsnorm_fwd_impl(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd) override {
    const int64_t H = weight.numel(), M = x.numel() / H;
    const FloatIn xv(x), w(weight);
    FloatOut yv(y);
    float* rp = rstd.data_as<float>();
    for (int64_t r = 0; r < M; ++r) {
      const float* row = xv.data() + r * H;
      double sq = 0;
      for (int64_t j = 0; j < H; ++j) sq += static_cast<double>(row[j]) * row[j];
      const float rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(H) + eps));
      for (int64_t j = 0; j < H; ++j) yv[r * H + j] = row[j] * rs * w[j];
      rp[r] = rs;
    }
    yv.commit();
  }

  void rmsnorm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dweight) override {
    const int64_t H = weight.numel(), M = x.numel() / H;
    const FloatIn g(dy), xv(x), w(weight);
    const float* rp = rstd.data_as<const float>();
    FloatOut dxo(dx);
    std::vector<double> dw(static_cast<size_t>(H), 0.0);
    for (int64_t r = 0; r < M; ++r) {
      const float rs = rp[r];
      const float* xr = xv.data() + r * H;
      const float* gr = g.data() + r * H;
      // y = xhat * w, xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w.
      double sum_gx = 0;
      for (int64_t j = 0; j < H; ++j) {
        const float xhat = xr[j] * rs;
        sum_gx += static_cast<double>(gr[j]) * w[j] * xhat;
        dw[static_cast<size_t>(j)] += static_cast<double>(gr[j]) * xhat;
      }
      const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(H));
      for (int64_t j = 0; j < H; ++j) dxo[r * H + j] = rs * (gr[j] * w[j] - xr[j] * rs * mean_gx);
    }
    dxo.commit();
    store_doubles(dw, dweight);
  }

  void rope_fwd_impl(const Tensor& x, double theta, int64_t rotary_dim, const Tensor& y,
                     const SeqPositions& positions) override {
    rope(x, theta, rotary_dim, 1.0, y, positions);
  }
  void rope_bwd_impl(const Tensor& dy, double theta, int64_t rotary_dim, const Tensor& dx,
                     const SeqPositions& positions) override {
    rope(dy, theta, rotary_dim, -1.0, dx, positions);
  }

  void swiglu_fwd_impl(const Tensor& x, const Tensor& y) override {
    const int64_t N = y.dim(-1);
    const int64_t M = y.numel() / N;
    const FloatIn xv(x);
    FloatOut yv(y);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) {
        const float gate = xv[r * 2 * N + j], up = xv[r * 2 * N + N + j];
        yv[r * N + j] = gate / (1.f + std::exp(-gate)) * up;
      }
    yv.commit();
  }

  void swiglu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    const int64_t N = dy.dim(-1);
    const int64_t M = dy.numel() / N;
    const FloatIn g(dy), xv(x);
    FloatOut out(dx);  // row r of dx is written after row r of x is read: dx may alias x
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) {
        const float gate = xv[r * 2 * N + j], up = xv[r * 2 * N + N + j], gr = g[r * N + j];
        const float sig = 1.f / (1.f + std::exp(-gate));
        out[r * 2 * N + j] = gr * up * sig * (1.f + gate * (1.f - sig));  // d silu = sig (1 + gate (1 - sig))
        out[r * 2 * N + N + j] = gr * gate * sig;
      }
    out.commit();
  }

  // ---- head layout: byte copies of D-element runs, so any dtype round-trips exactly ----
  void split_heads_impl(const Tensor& src, int64_t col_offset, const Tensor& dst) override {
    const int64_t B = dst.dim(0), NH = dst.dim(1), S = dst.dim(2), D = dst.dim(3), W = src.dim(2);
    const size_t es = src.element_size(), run = static_cast<size_t>(D) * es;
    const char* s = static_cast<const char*>(src.data());
    char* d = static_cast<char*>(dst.data());
    if (dst.numel() == 0) return;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t i = 0; i < S; ++i)  // dst[b, h, i, :] = src[i, b, col_offset + h*D :]
          std::memcpy(d + static_cast<size_t>(((b * NH + h) * S + i) * D) * es,
                      s + static_cast<size_t>((i * B + b) * W + col_offset + h * D) * es, run);
  }

  void merge_heads_impl(const Tensor& src, int64_t col_offset, const Tensor& dst) override {
    const int64_t B = src.dim(0), NH = src.dim(1), S = src.dim(2), D = src.dim(3), W = dst.dim(2);
    const size_t es = src.element_size(), run = static_cast<size_t>(D) * es;
    const char* s = static_cast<const char*>(src.data());
    char* d = static_cast<char*>(dst.data());
    if (src.numel() == 0) return;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t i = 0; i < S; ++i)  // dst[i, b, col_offset + h*D :] = src[b, h, i, :]; other columns untouched
          std::memcpy(d + static_cast<size_t>((i * B + b) * W + col_offset + h * D) * es,
                      s + static_cast<size_t>(((b * NH + h) * S + i) * D) * es, run);
  }

  void copy_rows_impl(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows) override {
    const size_t es = src.element_size(), run = static_cast<size_t>(rows * src.dim(2)) * es;
    if (run == 0) return;
    const char* s = static_cast<const char*>(src.data());
    char* d = static_cast<char*>(dst.data());
    for (int64_t o = 0; o < src.dim(0); ++o)  // one run of rows x W elements per outer index
      std::memcpy(d + static_cast<size_t>((o * dst.dim(1) + dst_row) * dst.dim(2)) * es,
                  s + static_cast<size_t>((o * src.dim(1) + src_row) * src.dim(2)) * es, run);
  }

  // ---- mixture of experts (kernels/cpu/cpu_moe.cpp) ----
  void moe_route_impl(const Tensor& logits, const Tensor& bias, const MoeRouting& routing, const Tensor& scores,
                      const Tensor& topk_index, const Tensor& topk_weight, const Tensor& aux_loss) override {
    const FloatIn lv(logits);
    std::optional<FloatIn> bv;
    if (bias.defined()) bv.emplace(bias);
    FloatOut sv(scores), wv(topk_weight);
    cpu::moe_route(lv.data(), bv ? bv->data() : nullptr, logits.dim(0), logits.dim(1), routing, sv.data(),
                   topk_index.data_as<int32_t>(), wv.data(), aux_loss.defined() ? aux_loss.data_as<float>() : nullptr);
    sv.commit();
    wv.commit();
  }

  void moe_route_bwd_impl(const Tensor& d_topk_weight, const Tensor& scores, const Tensor& topk_index,
                          const MoeRouting& routing, const Tensor& d_logits) override {
    const FloatIn dw(d_topk_weight), sv(scores);
    FloatOut dl(d_logits);
    cpu::moe_route_bwd(dw.data(), sv.data(), topk_index.data_as<const int32_t>(), scores.dim(0), scores.dim(1),
                       routing, dl.data());
    dl.commit();
  }

  void moe_dispatch_impl(const Tensor& topk_index, std::optional<double> capacity_factor,
                         const MoeDispatch& plan) override {
    const int64_t T = topk_index.dim(0), k = topk_index.dim(1), E = plan.tokens_per_expert.numel();
    std::optional<int64_t> capacity;
    if (capacity_factor) capacity = moe_expert_capacity(T, k, E, *capacity_factor);
    cpu::moe_dispatch(topk_index.data_as<const int32_t>(), T, k, E, capacity,
                      plan.tokens_per_expert.data_as<int32_t>(), plan.row_slot.data_as<int32_t>(),
                      plan.slot_row.data_as<int32_t>());
  }

  void moe_permute_impl(const Tensor& x, const MoeDispatch& plan, const Tensor& out) override {
    const int64_t N = plan_rows(plan, out.dim(0), "moe_permute", "out");
    cpu::moe_permute(x.data(), plan.row_slot.data_as<const int32_t>(), N, plan.slot_row.dim(1), x.dim(1),
                     x.element_size(), out.data());
  }

  void moe_permute_bwd_impl(const Tensor& d_out, const MoeDispatch& plan, const Tensor& dx) override {
    plan_rows(plan, d_out.dim(0), "moe_permute_bwd", "d_out");
    const FloatIn g(d_out);
    FloatOut dxo(dx);
    cpu::moe_permute_bwd(g.data(), plan.slot_row.data_as<const int32_t>(), dx.dim(0), plan.slot_row.dim(1), dx.dim(1),
                         dxo.data());
    dxo.commit();
  }

  void moe_unpermute_impl(const Tensor& y, const MoeDispatch& plan, const Tensor& topk_weight,
                          const Tensor& out) override {
    plan_rows(plan, y.dim(0), "moe_unpermute", "y");
    const FloatIn yv(y), wv(topk_weight);
    FloatOut ov(out);
    cpu::moe_unpermute(yv.data(), plan.slot_row.data_as<const int32_t>(), wv.data(), out.dim(0), plan.slot_row.dim(1),
                       out.dim(1), ov.data());
    ov.commit();
  }

  void moe_unpermute_bwd_impl(const Tensor& d_out, const Tensor& y, const MoeDispatch& plan,
                              const Tensor& topk_weight, const Tensor& dy, const Tensor& d_topk_weight) override {
    plan_rows(plan, y.dim(0), "moe_unpermute_bwd", "y");
    const FloatIn g(d_out), yv(y), wv(topk_weight);
    FloatOut dyo(dy), dwo(d_topk_weight);
    cpu::moe_unpermute_bwd(g.data(), yv.data(), plan.slot_row.data_as<const int32_t>(), wv.data(), d_out.dim(0),
                           plan.slot_row.dim(1), d_out.dim(1), dyo.data(), dwo.data());
    dyo.commit();
    dwo.commit();
  }

  void moe_weight_rows_impl(const Tensor& x, const Tensor& weight, const Tensor& y) override {
    const FloatIn xv(x), wv(weight);
    FloatOut yo(y);
    cpu::moe_weight_rows(xv.data(), wv.data(), x.dim(0), x.dim(1), yo.data());
    yo.commit();
  }

  void moe_weight_rows_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                                const Tensor& d_weight) override {
    const FloatIn g(dy), xv(x), wv(weight);
    FloatOut dxo(dx), dwo(d_weight);
    cpu::moe_weight_rows_bwd(g.data(), xv.data(), wv.data(), x.dim(0), x.dim(1), dxo.data(), dwo.data());
    dxo.commit();
    dwo.commit();
  }

  // The host's counts, when given, must be the device's: a layer that passed others would run
  // its GPU GEMMs over the wrong rows.
  static void check_host_rows(const int32_t* counts, const std::vector<int64_t>& host_rows, const char* op) {
    for (size_t e = 0; e < host_rows.size(); ++e)
      if (host_rows[e] != counts[e])
        throw InvalidArgument(std::string(op) + ": host_rows[" + std::to_string(e) + "] = " +
                              std::to_string(host_rows[e]) + " but tokens_per_expert holds " +
                              std::to_string(counts[e]));
  }

  void grouped_gemm_impl(const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert, const Tensor& y,
                         const std::vector<int64_t>& host_rows) override {
    const int32_t* counts = tokens_per_expert.data_as<const int32_t>();
    cpu::moe_plan_rows(counts, w.dim(0), x.dim(0), "grouped_gemm", "x");
    check_host_rows(counts, host_rows, "grouped_gemm");
    const FloatIn xv(x), wv(w);
    FloatOut yv(y);
    cpu::grouped_gemm(xv.data(), wv.data(), counts, w.dim(0), w.dim(1), w.dim(2), yv.data());
    yv.commit();
  }

  void grouped_gemm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert,
                             const Tensor& dx, const Tensor& dw, const std::vector<int64_t>& host_rows) override {
    const int32_t* counts = tokens_per_expert.data_as<const int32_t>();
    cpu::moe_plan_rows(counts, w.dim(0), x.dim(0), "grouped_gemm_bwd", "x");
    check_host_rows(counts, host_rows, "grouped_gemm_bwd");
    const FloatIn g(dy), xv(x), wv(w);
    FloatOut dxo(dx), dwo(dw);
    cpu::grouped_gemm_bwd(g.data(), xv.data(), wv.data(), counts, w.dim(0), w.dim(1), w.dim(2), dxo.data(),
                          dwo.data());
    dxo.commit();
    dwo.commit();
  }

  // N, the plan's kept rows, which must be the `rows` of the op's permuted tensor `what`.
  static int64_t plan_rows(const MoeDispatch& plan, int64_t rows, const char* op, const char* what) {
    return cpu::moe_plan_rows(plan.tokens_per_expert.data_as<const int32_t>(), plan.tokens_per_expert.numel(), rows,
                              op, what);
  }

  // k, v [B / r, S, D] for q [B, S, D]: r, the query batches per key/value batch (1 for B = 0).
  static int64_t kv_group(const Tensor& q, const Tensor& k) { return k.dim(0) ? q.dim(0) / k.dim(0) : 1; }
  static cpu::AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionRows& rows) {
    return cpu::AttentionShape{q.dim(0), q.dim(1), k.dim(1), q.dim(2), kv_group(q, k), rows, v.dim(2)};
  }

  // y = rotation of x by sign * angle, pairs (i, i + R/2) of the first R = rotary_dim dims of
  // each row of x [B, NH, S, D]; dims R..D-1 are copied.
  static void rope(const Tensor& x, double theta, int64_t rotary_dim, double sign, const Tensor& y,
                   const SeqPositions& positions) {
    const int64_t S = x.dim(2), D = x.dim(3), R = rotary_dim, half = R / 2, rows = x.numel() / D;
    std::vector<float> cosines(static_cast<size_t>(S * half)), sines(static_cast<size_t>(S * half));
    for (int64_t p = 0; p < S; ++p)  // row p of each head, at its place in the whole sequence
      for (int64_t i = 0; i < half; ++i) {
        const double exponent = -2.0 * static_cast<double>(i) / static_cast<double>(R);
        const double angle = static_cast<double>(positions.at(p)) * std::pow(theta, exponent);
        cosines[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
        sines[static_cast<size_t>(p * half + i)] = static_cast<float>(sign * std::sin(angle));
      }
    const FloatIn xv(x);
    FloatOut yv(y);  // each pair is read before it is written: y may be x
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = r % S;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cosines[static_cast<size_t>(p * half + i)], sn = sines[static_cast<size_t>(p * half + i)];
        const float lo = xv[r * D + i], hi = xv[r * D + half + i];
        yv[r * D + i] = lo * c - hi * sn;
        yv[r * D + half + i] = hi * c + lo * sn;
      }
      for (int64_t j = R; j < D; ++j) yv[r * D + j] = xv[r * D + j];  // y may be x: then a no-op
    }
    yv.commit();
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(size_t capacity_bytes) { return std::make_unique<CpuBackend>(capacity_bytes); }

}  // namespace actbench
