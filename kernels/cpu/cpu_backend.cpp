// The CPU reference backend: fp32 math on bf16/fp16/fp32 storage, double accumulators for
// reductions, Eigen for GEMMs. Correctness first: this is what the CUDA kernels and the
// NumPy reference are checked against, at small shapes. Elementwise and per-row loops write
// disjoint outputs, so they can be parallelised as they stand; the column sums (bias_grad,
// LayerNorm weight grads) would need per-thread partial sums.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_attention.hpp"
#include "runtime/error.hpp"

namespace actbench {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM = Eigen::Map<RowMajor>;
using ConstMapRM = Eigen::Map<const RowMajor>;

// ---- argument checks ----------------------------------------------------------------------

[[noreturn]] void fail(const std::string& op, const std::string& what) { throw InvalidArgument(op + ": " + what); }

void require_defined(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, std::string(name) + " is undefined");
}

void require_numel(const char* op, const char* name, const Tensor& t, int64_t numel) {
  require_defined(op, name, t);
  if (t.numel() != numel)
    fail(op, std::string(name) + " has " + std::to_string(t.numel()) + " elements " + shape_str(t.shape()) +
                 ", expected " + std::to_string(numel));
}

void require_float(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() == DType::u8) fail(op, std::string(name) + " must be a float tensor (bf16, fp16 or fp32), not u8");
}

using Named = std::pair<const char*, const Tensor*>;
void require_floats(const char* op, std::initializer_list<Named> tensors) {
  for (const auto& [name, t] : tensors) require_float(op, name, *t);
}

void require_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  if (t.dtype() != want)
    fail(op, std::string(name) + " must be " + dtype_name(want) + ", got " + dtype_name(t.dtype()));
}

// The size of the last dimension, checked against a [N] parameter (bias, weight).
int64_t require_last_dim(const char* op, const char* name, const Tensor& t, const char* pname, const Tensor& param) {
  require_defined(op, name, t);
  require_defined(op, pname, param);
  const int64_t n = param.numel();
  if (t.ndim() < 1 || n < 1 || t.dim(-1) != n)
    fail(op, std::string(name) + " " + shape_str(t.shape()) + " must end in the " + std::to_string(n) + " elements of " +
                 pname + " " + shape_str(param.shape()));
  return n;
}

// True when the bytes of a and b intersect (an in-place GEMM would read what it has written).
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* pa = static_cast<const char*>(a.data());
  const char* pb = static_cast<const char*>(b.data());
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

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

// 1 / (1 - p), the scale of kept elements (1 when nothing is dropped).
float keep_scale(float p) { return p > 0.f ? 1.f / (1.f - p) : 1.f; }

void require_probability(const char* op, float p) {
  if (!(p >= 0.f && p < 1.f)) fail(op, "dropout probability must be in [0, 1), got " + std::to_string(p));
}

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

  // ---- data movement ----
  void fill_zero(const Tensor& t) override {
    require_defined("fill_zero", "t", t);
    if (t.numel() > 0) std::memset(t.data(), 0, t.bytes());  // all-zero bits are 0.0 in every dtype
  }
  void copy(const Tensor& src, const Tensor& dst) override {
    require_defined("copy", "src", src);
    require_numel("copy", "dst", dst, src.numel());
    if (src.dtype() != dst.dtype())
      fail("copy", std::string("dtypes differ: ") + dtype_name(src.dtype()) + " -> " + dtype_name(dst.dtype()));
    if (src.numel() > 0) std::memmove(dst.data(), src.data(), src.bytes());
  }
  void upload(const float* host, const Tensor& dst) override {
    require_defined("upload", "dst", dst);
    if (dst.numel() == 0) return;
    if (dst.dtype() == DType::fp32) {
      std::memcpy(dst.data(), host, dst.bytes());
      return;
    }
    void* p = dst.data();
    for (size_t i = 0; i < static_cast<size_t>(dst.numel()); ++i) store_from_float(p, dst.dtype(), i, host[i]);
  }
  void download(const Tensor& src, float* host) override {
    require_defined("download", "src", src);
    if (src.numel() == 0) return;
    if (src.dtype() == DType::fp32) {
      std::memcpy(host, src.data(), src.bytes());
      return;
    }
    const void* p = src.data();
    for (size_t i = 0; i < static_cast<size_t>(src.numel()); ++i) host[i] = load_as_float(p, src.dtype(), i);
  }
  void add_inplace(const Tensor& dst, const Tensor& src) override {
    require_defined("add_inplace", "dst", dst);
    require_numel("add_inplace", "src", src, dst.numel());
    require_float("add_inplace", "dst", dst);
    require_float("add_inplace", "src", src);
    const FloatIn s(src);
    FloatOut d(dst, /*load=*/true);
    for (int64_t i = 0; i < dst.numel(); ++i) d[i] += s[i];
    d.commit();
  }

  // ---- GEMM ----
  void gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c) override {
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0)
      fail("gemm", "negative size m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                       " batch=" + std::to_string(g.batch));
    require_numel("gemm", "A", a, g.batch * g.m * g.k);
    require_numel("gemm", "B", b, g.batch * g.k * g.n);
    require_numel("gemm", "C", c, g.batch * g.m * g.n);
    require_float("gemm", "A", a);
    require_float("gemm", "B", b);
    require_float("gemm", "C", c);
    if (overlaps(c, a) || overlaps(c, b)) fail("gemm", "C must not overlap A or B");
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

  void add_bias(const Tensor& y, const Tensor& bias) override {
    const int64_t N = require_last_dim("add_bias", "y", y, "bias", bias);
    require_float("add_bias", "y", y);
    require_float("add_bias", "bias", bias);
    const int64_t M = y.numel() / N;
    const FloatIn bv(bias);
    FloatOut yv(y, /*load=*/true);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) yv[r * N + j] += bv[j];
    yv.commit();
  }

  void bias_grad(const Tensor& dy, const Tensor& db) override {
    const int64_t N = require_last_dim("bias_grad", "dy", dy, "db", db);
    require_float("bias_grad", "dy", dy);
    require_float("bias_grad", "db", db);
    const int64_t M = dy.numel() / N;
    const FloatIn g(dy);
    std::vector<double> acc(static_cast<size_t>(N), 0.0);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) acc[static_cast<size_t>(j)] += g[r * N + j];
    store_doubles(acc, db);  // written, not accumulated
  }

  // ---- LayerNorm ----
  void layernorm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& y,
                     const Tensor& mean, const Tensor& rstd) override {
    const char* op = "layernorm_fwd";
    const int64_t H = require_last_dim(op, "x", x, "weight", weight);
    const int64_t M = x.numel() / H;
    require_numel(op, "bias", bias, H);
    require_numel(op, "y", y, x.numel());
    require_numel(op, "mean", mean, M);
    require_numel(op, "rstd", rstd, M);
    require_floats(op, {{"x", &x}, {"weight", &weight}, {"bias", &bias}, {"y", &y}});
    require_dtype(op, "mean", mean, DType::fp32);
    require_dtype(op, "rstd", rstd, DType::fp32);
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

  void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias) override {
    const char* op = "layernorm_bwd";
    const int64_t H = require_last_dim(op, "x", x, "weight", weight);
    const int64_t M = x.numel() / H;
    require_numel(op, "dy", dy, x.numel());
    require_numel(op, "dx", dx, x.numel());
    require_numel(op, "mean", mean, M);
    require_numel(op, "rstd", rstd, M);
    require_numel(op, "dweight", dweight, H);
    require_numel(op, "dbias", dbias, H);
    require_floats(op, {{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"dx", &dx}, {"dweight", &dweight}, {"dbias", &dbias}});
    require_dtype(op, "mean", mean, DType::fp32);
    require_dtype(op, "rstd", rstd, DType::fp32);
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
  void softmax_causal_fwd(const Tensor& scores, const Tensor& probs) override {
    const char* op = "softmax_causal_fwd";
    const int64_t S = square_last_dims(op, "scores", scores);
    require_numel(op, "probs", probs, scores.numel());
    require_float(op, "scores", scores);
    require_float(op, "probs", probs);
    const int64_t rows = S > 0 ? scores.numel() / S : 0;  // B * S rows, row i of each matrix sees j <= i
    const FloatIn sv(scores);
    FloatOut pv(probs);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % S;
      const float* in = sv.data() + r * S;
      float* out = pv.data() + r * S;
      float mx = in[0];
      for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, in[j]);
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        out[j] = std::exp(in[j] - mx);  // max subtracted: exp never overflows
        sum += out[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= i; ++j) out[j] *= inv;
      for (int64_t j = i + 1; j < S; ++j) out[j] = 0.f;  // the causal mask: exactly zero
    }
    pv.commit();
  }

  void softmax_causal_bwd(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores) override {
    const char* op = "softmax_causal_bwd";
    const int64_t S = square_last_dims(op, "probs", probs);
    require_numel(op, "dprobs", dprobs, probs.numel());
    require_numel(op, "dscores", dscores, probs.numel());
    require_floats(op, {{"dprobs", &dprobs}, {"probs", &probs}, {"dscores", &dscores}});
    const int64_t rows = S > 0 ? probs.numel() / S : 0;
    const FloatIn dp(dprobs), p(probs);
    FloatOut ds(dscores);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % S, o = r * S;
      double dot = 0;  // sum_j p_j dp_j over the visible columns
      for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(p[o + j]) * dp[o + j];
      const float dot_f = static_cast<float>(dot);
      for (int64_t j = 0; j <= i; ++j) ds[o + j] = p[o + j] * (dp[o + j] - dot_f);
      for (int64_t j = i + 1; j < S; ++j) ds[o + j] = 0.f;
    }
    ds.commit();
  }

  // ---- dropout ----
  void dropout_fwd(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask) override {
    const char* op = "dropout_fwd";
    require_dropout_spec(op, x, spec);
    require_numel(op, "y", y, x.numel());
    require_numel(op, "mask", mask, x.numel());
    require_float(op, "x", x);
    require_float(op, "y", y);
    require_dtype(op, "mask", mask, DType::u8);
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

  void dropout_bwd(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) override {
    const char* op = "dropout_bwd";
    require_defined(op, "dy", dy);
    require_numel(op, "mask", mask, dy.numel());
    require_numel(op, "dx", dx, dy.numel());
    require_float(op, "dy", dy);
    require_float(op, "dx", dx);
    require_dtype(op, "mask", mask, DType::u8);
    require_probability(op, p);
    const FloatIn g(dy);
    FloatOut out(dx);
    const uint8_t* m = mask.data_as<const uint8_t>();
    const float scale = keep_scale(p);
    for (int64_t i = 0; i < dy.numel(); ++i) out[i] = (p == 0.f || m[i]) ? g[i] * scale : 0.f;
    out.commit();
  }

  // ---- GeLU ----
  void gelu_fwd(const Tensor& x, const Tensor& y) override {
    require_defined("gelu_fwd", "x", x);
    require_numel("gelu_fwd", "y", y, x.numel());
    require_float("gelu_fwd", "x", x);
    require_float("gelu_fwd", "y", y);
    const FloatIn xv(x);
    FloatOut yv(y);
    for (int64_t i = 0; i < x.numel(); ++i) yv[i] = gelu_tanh(xv[i]);
    yv.commit();
  }

  void gelu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    require_defined("gelu_bwd", "x", x);
    require_numel("gelu_bwd", "dy", dy, x.numel());
    require_numel("gelu_bwd", "dx", dx, x.numel());
    require_floats("gelu_bwd", {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
    const FloatIn g(dy), xv(x);
    FloatOut out(dx);
    for (int64_t i = 0; i < x.numel(); ++i) out[i] = g[i] * gelu_tanh_grad(xv[i]);
    out.commit();
  }

  // ---- out = residual + dropout(x + bias) ----
  void bias_dropout_residual_fwd(const Tensor& x, const Tensor& bias, const Tensor& residual, const DropoutSpec& spec,
                                 const Tensor& out, const Tensor& mask) override {
    const char* op = "bias_dropout_residual_fwd";
    const int64_t N = require_last_dim(op, "x", x, "bias", bias);
    require_dropout_spec(op, x, spec);
    require_numel(op, "residual", residual, x.numel());
    require_numel(op, "out", out, x.numel());
    require_numel(op, "mask", mask, x.numel());
    require_floats(op, {{"x", &x}, {"bias", &bias}, {"residual", &residual}, {"out", &out}});
    require_dtype(op, "mask", mask, DType::u8);
    const FloatIn xv(x), bv(bias), rv(residual);
    FloatOut ov(out);
    uint8_t* m = mask.data_as<uint8_t>();
    const float scale = spec.scale();
    const int64_t M = x.numel() / N;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) {
        const int64_t i = r * N + j;
        const bool keep = spec.p == 0.f || spec.keep(i);  // exactly dropout_fwd's mask
        m[i] = keep ? 1 : 0;
        ov[i] = rv[i] + (keep ? (xv[i] + bv[j]) * scale : 0.f);  // x + bias stays fp32: fused
      }
    ov.commit();
  }

  // ---- fused attention (kernels/cpu/cpu_attention.cpp) ----
  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const DropoutSpec& spec,
                     const Tensor& out, const Tensor& lse) override {
    const char* op = "attention_fwd";
    require_defined(op, "q", q);
    if (q.ndim() != 3) fail(op, "q must be [B, S, D], got " + shape_str(q.shape()));
    const int64_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
    if (out.shape() != q.shape()) fail(op, "out must be " + shape_str(q.shape()) + ", got " + shape_str(out.shape()));
    const int64_t group = kv_group(op, q, k, v);
    require_numel(op, "lse", lse, B * S);
    require_dtype(op, "lse", lse, DType::fp32);
    if (spec.numel() != B * S * S) fail(op, "dropout spec does not describe [B, S, S] probabilities");
    const FloatIn qv(q), kv(k), vv(v);
    FloatOut ov(out);
    cpu::attention_fwd(qv.data(), kv.data(), vv.data(), B, S, D, scale, spec, ov.data(), lse.data_as<float>(), group);
    ov.commit();
  }

  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                     const Tensor& lse, float scale, const DropoutSpec& spec, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    const char* op = "attention_bwd";
    require_defined(op, "q", q);
    if (q.ndim() != 3) fail(op, "q must be [B, S, D], got " + shape_str(q.shape()));
    const int64_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
    for (const Tensor* t : {&out, &dout, &dq})
      if (t->shape() != q.shape()) fail(op, "all of q out dout dq must be " + shape_str(q.shape()));
    const int64_t group = kv_group(op, q, k, v);
    for (const Tensor* t : {&dk, &dv})
      if (t->shape() != k.shape()) fail(op, "dk and dv must be " + shape_str(k.shape()) + ", like k and v");
    require_numel(op, "lse", lse, B * S);
    if (spec.numel() != B * S * S) fail(op, "dropout spec does not describe [B, S, S] probabilities");
    const FloatIn qv(q), kv(k), vv(v), ov(out), gv(dout), lv(lse);
    FloatOut dqo(dq), dko(dk), dvo(dv);
    cpu::attention_bwd(qv.data(), kv.data(), vv.data(), ov.data(), gv.data(), lv.data(), B, S, D, scale, spec,
                       dqo.data(), dko.data(), dvo.data(), group);
    dqo.commit();
    dko.commit();
    dvo.commit();
  }

  // ---- the llama family ----
  void rmsnorm_fwd(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd) override {
    const char* op = "rmsnorm_fwd";
    const int64_t H = require_last_dim(op, "x", x, "weight", weight);
    const int64_t M = x.numel() / H;
    require_numel(op, "y", y, x.numel());
    require_numel(op, "rstd", rstd, M);
    require_floats(op, {{"x", &x}, {"weight", &weight}, {"y", &y}});
    require_dtype(op, "rstd", rstd, DType::fp32);
    if (!(eps > 0.f)) fail(op, "eps must be positive");
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

  void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                   const Tensor& dweight) override {
    const char* op = "rmsnorm_bwd";
    const int64_t H = require_last_dim(op, "x", x, "weight", weight);
    const int64_t M = x.numel() / H;
    require_numel(op, "dy", dy, x.numel());
    require_numel(op, "dx", dx, x.numel());
    require_numel(op, "rstd", rstd, M);
    require_numel(op, "dweight", dweight, H);
    require_floats(op, {{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"dx", &dx}, {"dweight", &dweight}});
    require_dtype(op, "rstd", rstd, DType::fp32);
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

  void rope_fwd(const Tensor& x, double theta, const Tensor& y) override { rope("rope_fwd", x, theta, 1.0, y); }
  void rope_bwd(const Tensor& dy, double theta, const Tensor& dx) override { rope("rope_bwd", dy, theta, -1.0, dx); }

  void swiglu_fwd(const Tensor& x, const Tensor& y) override {
    const char* op = "swiglu_fwd";
    const int64_t N = swiglu_width(op, x, y);
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

  void swiglu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    const char* op = "swiglu_bwd";
    const int64_t N = swiglu_width(op, x, dy);
    require_numel(op, "dx", dx, x.numel());
    require_float(op, "dx", dx);
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
  void split_heads(const Tensor& src, int64_t col_offset, const Tensor& dst) override {
    check_heads("split_heads", src, col_offset, dst);
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

  void merge_heads(const Tensor& src, int64_t col_offset, const Tensor& dst) override {
    check_heads("merge_heads", dst, col_offset, src);
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

 private:
  // k, v [B / r, S, D] for q [B, S, D]: returns r, the query batches per key/value batch.
  static int64_t kv_group(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
    require_defined(op, "k", k);
    require_defined(op, "v", v);
    // B = 0 (an empty batch) pairs with an empty k and v: group 1.
    if (k.shape() != v.shape() || k.ndim() != 3 || k.dim(1) != q.dim(1) || k.dim(2) != q.dim(2) ||
        (k.dim(0) < 1 ? q.dim(0) != 0 : q.dim(0) % k.dim(0) != 0))
      fail(op, "k and v must be [B / r, S, D] with r dividing B for q " + shape_str(q.shape()) + ", got " +
                   shape_str(k.shape()) + " and " + shape_str(v.shape()));
    return k.dim(0) ? q.dim(0) / k.dim(0) : 1;
  }

  // y = rotation of x by sign * angle, pairs (i, i + D/2) of each row of x [B, NH, S, D].
  static void rope(const char* op, const Tensor& x, double theta, double sign, const Tensor& y) {
    require_defined(op, "x", x);
    if (x.ndim() != 4 || x.dim(3) % 2 != 0) fail(op, "x must be [B, NH, S, D] with D even, got " + shape_str(x.shape()));
    require_numel(op, "y", y, x.numel());
    require_float(op, "x", x);
    require_float(op, "y", y);
    if (!(theta > 0)) fail(op, "theta must be positive");
    const int64_t S = x.dim(2), D = x.dim(3), half = D / 2, rows = x.numel() / D;
    std::vector<float> cosines(static_cast<size_t>(S * half)), sines(static_cast<size_t>(S * half));
    for (int64_t p = 0; p < S; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
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
    }
    yv.commit();
  }

  // x [..., 2N] and y [..., N] with the same rows: returns N.
  static int64_t swiglu_width(const char* op, const Tensor& x, const Tensor& y) {
    require_defined(op, "x", x);
    require_defined(op, "y", y);
    if (x.ndim() < 1 || y.ndim() < 1 || x.dim(-1) != 2 * y.dim(-1) || y.dim(-1) < 1 ||
        x.numel() / x.dim(-1) != y.numel() / y.dim(-1))
      fail(op, "x must be [..., 2N] = [gate | up] for [..., N], got " + shape_str(x.shape()) + " and " +
                   shape_str(y.shape()));
    require_float(op, "x", x);
    require_float(op, "y", y);
    return y.dim(-1);
  }

  // [..., S, S]: returns S.
  static int64_t square_last_dims(const char* op, const char* name, const Tensor& t) {
    require_defined(op, name, t);
    if (t.ndim() < 2 || t.dim(-1) != t.dim(-2))
      fail(op, std::string(name) + " must be [..., S, S], got " + shape_str(t.shape()));
    return t.dim(-1);
  }

  static void require_dropout_spec(const char* op, const Tensor& x, const DropoutSpec& spec) {
    require_defined(op, "x", x);
    if (spec.outer < 0 || spec.mid_local < 0 || spec.inner < 0 || spec.mid_offset < 0 ||
        spec.mid_offset + spec.mid_local > spec.mid_global)
      fail(op, "dropout spec shard [" + std::to_string(spec.mid_offset) + ", " +
                   std::to_string(spec.mid_offset + spec.mid_local) + ") does not fit mid_global " +
                   std::to_string(spec.mid_global));
    if (spec.numel() != x.numel())
      fail(op, "x has " + std::to_string(x.numel()) + " elements " + shape_str(x.shape()) + ", the dropout spec " +
                   std::to_string(spec.numel()));
    require_probability(op, spec.p);
  }

  // wide [S, B, W] and heads [B, NH, S, D]: columns [off, off + NH*D) of wide.
  static void check_heads(const char* op, const Tensor& wide, int64_t off, const Tensor& heads) {
    require_defined(op, "[S, B, W] tensor", wide);
    require_defined(op, "[B, NH, S, D] tensor", heads);
    if (wide.ndim() != 3 || heads.ndim() != 4)
      fail(op, "expected [S, B, W] and [B, NH, S, D], got " + shape_str(wide.shape()) + " and " + shape_str(heads.shape()));
    if (wide.dim(0) != heads.dim(2) || wide.dim(1) != heads.dim(0) || off < 0 ||
        off + heads.dim(1) * heads.dim(3) > wide.dim(2))
      fail(op, "heads " + shape_str(heads.shape()) + " at column " + std::to_string(off) + " do not fit " +
                   shape_str(wide.shape()));
    if (wide.dtype() != heads.dtype())
      fail(op, std::string("dtypes differ: ") + dtype_name(wide.dtype()) + " vs " + dtype_name(heads.dtype()));
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(size_t capacity_bytes) { return std::make_unique<CpuBackend>(capacity_bytes); }

}  // namespace actbench
