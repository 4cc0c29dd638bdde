// The CPU reference backend: fp32 math on bf16/fp16/fp32 storage, double accumulators for
// reductions, Eigen for GEMMs. Correctness first: this is what the CUDA kernels and the
// NumPy reference are checked against, at small shapes.
#include <Eigen/Core>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_attention.hpp"
#include "runtime/error.hpp"

namespace actbench {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM = Eigen::Map<RowMajor>;
using ConstMapRM = Eigen::Map<const RowMajor>;

[[noreturn]] void fail(const std::string& op, const std::string& what) { throw InvalidArgument(op + ": " + what); }

void require_numel(const char* op, const char* name, const Tensor& t, int64_t numel) {
  if (!t.defined()) fail(op, std::string(name) + " is undefined");
  if (t.numel() != numel)
    fail(op, std::string(name) + " has " + std::to_string(t.numel()) + " elements " + shape_str(t.shape()) +
                 ", expected " + std::to_string(numel));
}

void require_float(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() == DType::u8) fail(op, std::string(name) + " must be a float tensor, not u8");
}

// The whole tensor widened to float.
std::vector<float> to_float(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::fp32) {
    std::memcpy(out.data(), t.data(), t.bytes());
  } else {
    const void* p = t.data();
    for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(p, t.dtype(), i);
  }
  return out;
}

// Rounds floats into the tensor's dtype.
void from_float(const std::vector<float>& v, const Tensor& t) {
  if (t.dtype() == DType::fp32) {
    std::memcpy(t.data(), v.data(), t.bytes());
  } else {
    void* p = t.data();
    for (size_t i = 0; i < v.size(); ++i) store_from_float(p, t.dtype(), i, v[i]);
  }
}

float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + std::tanh(c * (x + 0.044715f * x * x * x)));
}
float gelu_tanh_grad(float x) {
  const float c = 0.7978845608028654f;
  const float inner = c * (x + 0.044715f * x * x * x);
  const float th = std::tanh(inner);
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * c * (1.f + 3.f * 0.044715f * x * x);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(size_t capacity) : Backend(std::make_unique<CachingAllocator>(make_host_source(), capacity)) {}
  const char* name() const override { return "cpu"; }
  std::string device_name() const override { return "host-cpu"; }
  bool computes() const override { return true; }

  // ---- data movement ----
  void fill_zero(const Tensor& t) override { std::memset(t.data(), 0, t.bytes()); }
  void copy(const Tensor& src, const Tensor& dst) override {
    require_numel("copy", "dst", dst, src.numel());
    if (src.dtype() != dst.dtype())
      fail("copy", std::string("dtypes differ: ") + dtype_name(src.dtype()) + " -> " + dtype_name(dst.dtype()));
    std::memmove(dst.data(), src.data(), src.bytes());
  }
  void upload(const float* host, const Tensor& dst) override {
    void* p = dst.data();
    for (int64_t i = 0; i < dst.numel(); ++i) store_from_float(p, dst.dtype(), static_cast<size_t>(i), host[i]);
  }
  void download(const Tensor& src, float* host) override {
    const void* p = src.data();
    for (int64_t i = 0; i < src.numel(); ++i) host[i] = load_as_float(p, src.dtype(), static_cast<size_t>(i));
  }
  void add_inplace(const Tensor& dst, const Tensor& src) override {
    require_numel("add_inplace", "src", src, dst.numel());
    void* d = dst.data();
    const void* s = src.data();
    for (int64_t i = 0; i < dst.numel(); ++i) {
      const auto u = static_cast<size_t>(i);
      store_from_float(d, dst.dtype(), u, load_as_float(d, dst.dtype(), u) + load_as_float(s, src.dtype(), u));
    }
  }

  // ---- GEMM ----
  void gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c) override {
    if (g.m < 1 || g.n < 1 || g.k < 1 || g.batch < 1) fail("gemm", "m, n, k and batch must be >= 1");
    require_numel("gemm", "A", a, g.batch * g.m * g.k);
    require_numel("gemm", "B", b, g.batch * g.k * g.n);
    require_numel("gemm", "C", c, g.batch * g.m * g.n);
    require_float("gemm", "A", a);
    require_float("gemm", "B", b);
    require_float("gemm", "C", c);
    const std::vector<float> av = to_float(a), bv = to_float(b);
    // beta == 0 must not read C: an uninitialised (or NaN-poisoned) C is simply overwritten.
    std::vector<float> cv = g.beta != 0.f ? to_float(c) : std::vector<float>(static_cast<size_t>(c.numel()), 0.f);
    const int64_t sa = g.m * g.k, sb = g.k * g.n, sc = g.m * g.n;
    for (int64_t i = 0; i < g.batch; ++i) {
      ConstMapRM A(av.data() + i * sa, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k);
      ConstMapRM B(bv.data() + i * sb, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n);
      MapRM C(cv.data() + i * sc, g.m, g.n);
      RowMajor prod;
      if (g.trans_a && g.trans_b) prod.noalias() = A.transpose() * B.transpose();
      else if (g.trans_a) prod.noalias() = A.transpose() * B;
      else if (g.trans_b) prod.noalias() = A * B.transpose();
      else prod.noalias() = A * B;
      if (g.beta != 0.f) C = g.alpha * prod + g.beta * C;
      else C = g.alpha * prod;
    }
    from_float(cv, c);
  }
  void add_bias(const Tensor& y, const Tensor& bias) override {
    const int64_t n = bias.numel();
    if (n < 1 || y.numel() % n != 0 || y.dim(-1) != n) fail("add_bias", "y " + shape_str(y.shape()) + " vs bias " + shape_str(bias.shape()));
    std::vector<float> yv = to_float(y);
    const std::vector<float> bv = to_float(bias);
    for (size_t i = 0; i < yv.size(); ++i) yv[i] += bv[i % static_cast<size_t>(n)];
    from_float(yv, y);
  }
  void bias_grad(const Tensor& dy, const Tensor& db) override {
    const int64_t n = db.numel();
    if (n < 1 || dy.dim(-1) != n) fail("bias_grad", "dy " + shape_str(dy.shape()) + " vs db " + shape_str(db.shape()));
    const std::vector<float> g = to_float(dy);
    std::vector<double> acc(static_cast<size_t>(n), 0.0);
    for (size_t i = 0; i < g.size(); ++i) acc[i % static_cast<size_t>(n)] += g[i];
    from_float(std::vector<float>(acc.begin(), acc.end()), db);
  }

  // ---- LayerNorm ----
  void layernorm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& y,
                     const Tensor& mean, const Tensor& rstd) override {
    const int64_t H = weight.numel(), M = H > 0 ? x.numel() / H : 0;
    if (H < 1 || x.dim(-1) != H) fail("layernorm_fwd", "x " + shape_str(x.shape()) + " vs weight " + shape_str(weight.shape()));
    require_numel("layernorm_fwd", "bias", bias, H);
    require_numel("layernorm_fwd", "y", y, x.numel());
    require_numel("layernorm_fwd", "mean", mean, M);
    require_numel("layernorm_fwd", "rstd", rstd, M);
    if (mean.dtype() != DType::fp32 || rstd.dtype() != DType::fp32) fail("layernorm_fwd", "mean and rstd must be fp32");
    const std::vector<float> xv = to_float(x), w = to_float(weight), b = to_float(bias);
    std::vector<float> yv(xv.size());
    float* mp = mean.data_as<float>();
    float* rp = rstd.data_as<float>();
    for (int64_t r = 0; r < M; ++r) {
      const float* row = xv.data() + r * H;
      double mu = 0;
      for (int64_t j = 0; j < H; ++j) mu += row[j];
      mu /= static_cast<double>(H);
      double var = 0;
      for (int64_t j = 0; j < H; ++j) var += (row[j] - mu) * (row[j] - mu);
      var /= static_cast<double>(H);  // biased, as LayerNorm defines it
      const double rs = 1.0 / std::sqrt(var + eps);
      for (int64_t j = 0; j < H; ++j) yv[r * H + j] = static_cast<float>((row[j] - mu) * rs) * w[j] + b[j];
      mp[r] = static_cast<float>(mu);
      rp[r] = static_cast<float>(rs);
    }
    from_float(yv, y);
  }
  void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias) override {
    const int64_t H = weight.numel(), M = H > 0 ? x.numel() / H : 0;
    if (H < 1 || x.dim(-1) != H) fail("layernorm_bwd", "x " + shape_str(x.shape()) + " vs weight " + shape_str(weight.shape()));
    require_numel("layernorm_bwd", "dy", dy, x.numel());
    require_numel("layernorm_bwd", "dx", dx, x.numel());
    require_numel("layernorm_bwd", "mean", mean, M);
    require_numel("layernorm_bwd", "rstd", rstd, M);
    require_numel("layernorm_bwd", "dweight", dweight, H);
    require_numel("layernorm_bwd", "dbias", dbias, H);
    const std::vector<float> g = to_float(dy), xv = to_float(x), w = to_float(weight);
    const float* mp = mean.data_as<const float>();
    const float* rp = rstd.data_as<const float>();
    std::vector<float> dxv(xv.size());
    std::vector<double> dw(static_cast<size_t>(H), 0.0), db(static_cast<size_t>(H), 0.0);
    for (int64_t r = 0; r < M; ++r) {
      const double mu = mp[r], rs = rp[r];
      double mean_g = 0, mean_gx = 0;  // mean(g) and mean(g * xhat), g = dy * w
      for (int64_t j = 0; j < H; ++j) {
        const double xhat = (xv[r * H + j] - mu) * rs, gj = static_cast<double>(g[r * H + j]) * w[j];
        mean_g += gj;
        mean_gx += gj * xhat;
        dw[j] += static_cast<double>(g[r * H + j]) * xhat;
        db[j] += g[r * H + j];
      }
      mean_g /= static_cast<double>(H);
      mean_gx /= static_cast<double>(H);
      for (int64_t j = 0; j < H; ++j) {
        const double xhat = (xv[r * H + j] - mu) * rs, gj = static_cast<double>(g[r * H + j]) * w[j];
        dxv[r * H + j] = static_cast<float>(rs * (gj - mean_g - xhat * mean_gx));
      }
    }
    from_float(dxv, dx);
    from_float(std::vector<float>(dw.begin(), dw.end()), dweight);
    from_float(std::vector<float>(db.begin(), db.end()), dbias);
  }

  // ---- causal softmax ----
  void softmax_causal_fwd(const Tensor& scores, const Tensor& probs) override {
    const int64_t S = scores.dim(-1);
    if (scores.ndim() < 2 || scores.dim(-2) != S) fail("softmax_causal_fwd", "scores must be [..., S, S], got " + shape_str(scores.shape()));
    require_numel("softmax_causal_fwd", "probs", probs, scores.numel());
    const int64_t B = scores.numel() / (S * S);
    const std::vector<float> sv = to_float(scores);
    std::vector<float> pv(sv.size(), 0.f);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < S; ++i) {
        const float* row = sv.data() + (bi * S + i) * S;
        float* out = pv.data() + (bi * S + i) * S;
        float mx = row[0];
        for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
        for (int64_t j = 0; j <= i; ++j) out[j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - mx) / sum);
        // j > i stays exactly 0: the causal mask
      }
    from_float(pv, probs);
  }
  void softmax_causal_bwd(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores) override {
    const int64_t S = probs.dim(-1);
    if (probs.ndim() < 2 || probs.dim(-2) != S) fail("softmax_causal_bwd", "probs must be [..., S, S], got " + shape_str(probs.shape()));
    require_numel("softmax_causal_bwd", "dprobs", dprobs, probs.numel());
    require_numel("softmax_causal_bwd", "dscores", dscores, probs.numel());
    const int64_t B = probs.numel() / (S * S);
    const std::vector<float> dp = to_float(dprobs), p = to_float(probs);
    std::vector<float> ds(p.size(), 0.f);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t o = (bi * S + i) * S;
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(p[o + j]) * dp[o + j];
        for (int64_t j = 0; j <= i; ++j) ds[o + j] = static_cast<float>(p[o + j] * (dp[o + j] - dot));
      }
    from_float(ds, dscores);
  }

  // ---- dropout ----
  void dropout_fwd(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask) override {
    require_numel("dropout_fwd", "x (vs spec)", x, spec.numel());
    require_numel("dropout_fwd", "y", y, x.numel());
    require_numel("dropout_fwd", "mask", mask, x.numel());
    if (mask.dtype() != DType::u8) fail("dropout_fwd", "mask must be u8");
    const std::vector<float> xv = to_float(x);
    std::vector<float> yv(xv.size());
    uint8_t* m = mask.data_as<uint8_t>();
    const float scale = spec.scale();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const bool keep = spec.p <= 0.f || spec.keep(i);
      m[i] = keep ? 1 : 0;
      yv[i] = keep ? xv[i] * scale : 0.f;
    }
    from_float(yv, y);
  }
  void dropout_bwd(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) override {
    require_numel("dropout_bwd", "mask", mask, dy.numel());
    require_numel("dropout_bwd", "dx", dx, dy.numel());
    if (mask.dtype() != DType::u8) fail("dropout_bwd", "mask must be u8");
    const std::vector<float> g = to_float(dy);
    std::vector<float> out(g.size());
    const uint8_t* m = mask.data_as<const uint8_t>();
    const float scale = p > 0.f ? 1.f / (1.f - p) : 1.f;
    for (size_t i = 0; i < g.size(); ++i) out[i] = m[i] ? g[i] * scale : 0.f;
    from_float(out, dx);
  }

  // ---- GeLU ----
  void gelu_fwd(const Tensor& x, const Tensor& y) override {
    require_numel("gelu_fwd", "y", y, x.numel());
    std::vector<float> v = to_float(x);
    for (float& e : v) e = gelu_tanh(e);
    from_float(v, y);
  }
  void gelu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    require_numel("gelu_bwd", "dy", dy, x.numel());
    require_numel("gelu_bwd", "dx", dx, x.numel());
    const std::vector<float> g = to_float(dy), xv = to_float(x);
    std::vector<float> out(g.size());
    for (size_t i = 0; i < g.size(); ++i) out[i] = g[i] * gelu_tanh_grad(xv[i]);
    from_float(out, dx);
  }

  // ---- out = residual + dropout(x + bias) ----
  void bias_dropout_residual_fwd(const Tensor& x, const Tensor& bias, const Tensor& residual, const DropoutSpec& spec,
                                 const Tensor& out, const Tensor& mask) override {
    const int64_t n = bias.numel();
    if (n < 1 || x.dim(-1) != n) fail("bias_dropout_residual_fwd", "x " + shape_str(x.shape()) + " vs bias " + shape_str(bias.shape()));
    require_numel("bias_dropout_residual_fwd", "x (vs spec)", x, spec.numel());
    require_numel("bias_dropout_residual_fwd", "residual", residual, x.numel());
    require_numel("bias_dropout_residual_fwd", "out", out, x.numel());
    require_numel("bias_dropout_residual_fwd", "mask", mask, x.numel());
    if (mask.dtype() != DType::u8) fail("bias_dropout_residual_fwd", "mask must be u8");
    const std::vector<float> xv = to_float(x), bv = to_float(bias), rv = to_float(residual);
    std::vector<float> ov(xv.size());
    uint8_t* m = mask.data_as<uint8_t>();
    const float scale = spec.scale();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const bool keep = spec.p <= 0.f || spec.keep(i);
      m[i] = keep ? 1 : 0;
      // x + bias rounded to the storage type first, as a separate bias-add kernel would.
      const float biased = xv[i] + bv[i % n];
      ov[i] = rv[i] + (keep ? biased * scale : 0.f);
    }
    from_float(ov, out);
  }

  // ---- fused attention (kernels/cpu/cpu_attention.cpp) ----
  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const DropoutSpec& spec,
                     const Tensor& out, const Tensor& lse) override {
    if (q.ndim() != 3) fail("attention_fwd", "q must be [B, S, D], got " + shape_str(q.shape()));
    const int64_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
    for (const Tensor* t : {&k, &v, &out})
      if (t->shape() != q.shape()) fail("attention_fwd", "k, v, out must be " + shape_str(q.shape()) + ", got " + shape_str(t->shape()));
    require_numel("attention_fwd", "lse", lse, B * S);
    if (lse.dtype() != DType::fp32) fail("attention_fwd", "lse must be fp32");
    if (spec.numel() != B * S * S) fail("attention_fwd", "dropout spec does not describe [B, S, S] probabilities");
    const std::vector<float> qv = to_float(q), kv = to_float(k), vv = to_float(v);
    std::vector<float> ov(qv.size());
    cpu::attention_fwd(qv.data(), kv.data(), vv.data(), B, S, D, scale, spec, ov.data(), lse.data_as<float>());
    from_float(ov, out);
  }
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                     const Tensor& lse, float scale, const DropoutSpec& spec, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    if (q.ndim() != 3) fail("attention_bwd", "q must be [B, S, D], got " + shape_str(q.shape()));
    const int64_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
    for (const Tensor* t : {&k, &v, &out, &dout, &dq, &dk, &dv})
      if (t->shape() != q.shape()) fail("attention_bwd", "all of q k v out dout dq dk dv must be " + shape_str(q.shape()));
    require_numel("attention_bwd", "lse", lse, B * S);
    if (spec.numel() != B * S * S) fail("attention_bwd", "dropout spec does not describe [B, S, S] probabilities");
    const std::vector<float> qv = to_float(q), kv = to_float(k), vv = to_float(v), ov = to_float(out),
                             gv = to_float(dout), lv = to_float(lse);
    std::vector<float> dqv(qv.size()), dkv(qv.size()), dvv(qv.size());
    cpu::attention_bwd(qv.data(), kv.data(), vv.data(), ov.data(), gv.data(), lv.data(), B, S, D, scale, spec,
                       dqv.data(), dkv.data(), dvv.data());
    from_float(dqv, dq);
    from_float(dkv, dk);
    from_float(dvv, dv);
  }

  // ---- head layout ----
  void split_heads(const Tensor& src, int64_t col_offset, const Tensor& dst) override {
    check_heads("split_heads", src, col_offset, dst);
    const int64_t B = dst.dim(0), NH = dst.dim(1), S = dst.dim(2), D = dst.dim(3), W = src.dim(2);
    const size_t es = src.element_size();
    const char* s = static_cast<const char*>(src.data());
    char* d = static_cast<char*>(dst.data());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t i = 0; i < S; ++i)
          std::memcpy(d + (((b * NH + h) * S + i) * D) * es, s + ((i * B + b) * W + col_offset + h * D) * es, D * es);
  }
  void merge_heads(const Tensor& src, int64_t col_offset, const Tensor& dst) override {
    check_heads("merge_heads", dst, col_offset, src);
    const int64_t B = src.dim(0), NH = src.dim(1), S = src.dim(2), D = src.dim(3), W = dst.dim(2);
    const size_t es = src.element_size();
    const char* s = static_cast<const char*>(src.data());
    char* d = static_cast<char*>(dst.data());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t i = 0; i < S; ++i)
          std::memcpy(d + ((i * B + b) * W + col_offset + h * D) * es, s + (((b * NH + h) * S + i) * D) * es, D * es);
  }

 private:
  // wide [S, B, W] and heads [B, NH, S, D], columns [off, off + NH*D) of wide.
  static void check_heads(const char* op, const Tensor& wide, int64_t off, const Tensor& heads) {
    if (wide.ndim() != 3 || heads.ndim() != 4) fail(op, "expected [S, B, W] and [B, NH, S, D], got " + shape_str(wide.shape()) + " and " + shape_str(heads.shape()));
    if (wide.dim(0) != heads.dim(2) || wide.dim(1) != heads.dim(0) || off < 0 || off + heads.dim(1) * heads.dim(3) > wide.dim(2))
      fail(op, "heads " + shape_str(heads.shape()) + " at column " + std::to_string(off) + " do not fit " + shape_str(wide.shape()));
    if (wide.dtype() != heads.dtype()) fail(op, "dtypes differ");
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(size_t capacity_bytes) { return std::make_unique<CpuBackend>(capacity_bytes); }

}  // namespace actbench
