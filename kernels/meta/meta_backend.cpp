// The meta backend: every allocation is real bookkeeping in the caching allocator, over
// virtual addresses; no op touches data. The memory schedule of any shape, in milliseconds.
// Ops still check shapes, so a meta run proves the layer's shapes as well as its bytes.
#include "kernels/backend.hpp"
#include "runtime/error.hpp"

namespace actbench {
namespace {

void require(bool ok, const char* op, const Tensor& a, const Tensor& b) {
  if (!ok) throw InvalidArgument(std::string(op) + ": shape mismatch " + shape_str(a.shape()) + " vs " + shape_str(b.shape()));
}

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(size_t capacity)
      : Backend(std::make_unique<CachingAllocator>(make_meta_source(), capacity)) {}
  const char* name() const override { return "meta"; }
  std::string device_name() const override { return "meta"; }
  bool computes() const override { return false; }

  void fill_zero(const Tensor&) override {}
  void copy(const Tensor& s, const Tensor& d) override { require(s.numel() == d.numel(), "copy", s, d); }
  void upload(const float*, const Tensor&) override {}
  void download(const Tensor&, float*) override {}
  void add_inplace(const Tensor& d, const Tensor& s) override { require(s.numel() == d.numel(), "add_inplace", d, s); }
  void gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c) override {
    require(a.numel() == g.batch * g.m * g.k && b.numel() == g.batch * g.k * g.n, "gemm", a, b);
    require(c.numel() == g.batch * g.m * g.n, "gemm", a, c);
  }
  void add_bias(const Tensor& y, const Tensor& bias) override { require(y.dim(-1) == bias.numel(), "add_bias", y, bias); }
  void bias_grad(const Tensor& dy, const Tensor& db) override { require(dy.dim(-1) == db.numel(), "bias_grad", dy, db); }
  void layernorm_fwd(const Tensor& x, const Tensor& w, const Tensor&, float, const Tensor& y, const Tensor& mean, const Tensor&) override {
    require(x.numel() == y.numel() && x.dim(-1) == w.numel(), "layernorm_fwd", x, y);
    require(mean.numel() * x.dim(-1) == x.numel(), "layernorm_fwd", x, mean);
  }
  void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor&, const Tensor&, const Tensor&, const Tensor& dx,
                     const Tensor&, const Tensor&) override {
    require(dy.numel() == x.numel() && dx.numel() == x.numel(), "layernorm_bwd", dy, x);
  }
  void softmax_causal_fwd(const Tensor& s, const Tensor& p) override { require(s.numel() == p.numel(), "softmax", s, p); }
  void softmax_causal_bwd(const Tensor& dp, const Tensor& p, const Tensor& ds) override {
    require(dp.numel() == p.numel() && ds.numel() == p.numel(), "softmax_bwd", dp, p);
  }
  void dropout_fwd(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask) override {
    require(x.numel() == spec.numel() && y.numel() == x.numel() && mask.numel() == x.numel(), "dropout", x, y);
  }
  void dropout_bwd(const Tensor& dy, const Tensor& mask, float, const Tensor& dx) override {
    require(dy.numel() == mask.numel() && dx.numel() == dy.numel(), "dropout_bwd", dy, mask);
  }
  void gelu_fwd(const Tensor& x, const Tensor& y) override { require(x.numel() == y.numel(), "gelu", x, y); }
  void gelu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    require(dy.numel() == x.numel() && dx.numel() == x.numel(), "gelu_bwd", dy, x);
  }
  void bias_dropout_residual_fwd(const Tensor& x, const Tensor& bias, const Tensor& r, const DropoutSpec& spec,
                                 const Tensor& out, const Tensor& mask) override {
    require(x.numel() == r.numel() && out.numel() == x.numel() && mask.numel() == x.numel() &&
                x.numel() == spec.numel() && x.dim(-1) == bias.numel(),
            "bias_dropout_residual", x, r);
  }
  // k, v may hold B / r batches (grouped-query attention).
  static bool kv_fits(const Tensor& q, const Tensor& k, const Tensor& v) {
    return q.ndim() == 3 && k.ndim() == 3 && k.shape() == v.shape() && k.dim(1) == q.dim(1) && k.dim(2) == q.dim(2) &&
           (k.dim(0) >= 1 ? q.dim(0) % k.dim(0) == 0 : q.dim(0) == 0);  // B = 0: empty k and v
  }
  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, float, const DropoutSpec& spec,
                     const Tensor& out, const Tensor& lse) override {
    require(kv_fits(q, k, v) && q.shape() == out.shape(), "attention_fwd", q, k);
    require(lse.numel() == q.dim(0) * q.dim(1) && spec.numel() == q.dim(0) * q.dim(1) * q.dim(1), "attention_fwd", q, lse);
  }
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                     const Tensor& lse, float, const DropoutSpec&, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    require(kv_fits(q, k, v) && q.shape() == out.shape() && dout.shape() == q.shape() && dq.shape() == q.shape() &&
                dk.shape() == k.shape() && dv.shape() == k.shape(),
            "attention_bwd", q, dout);
    require(lse.numel() == q.dim(0) * q.dim(1), "attention_bwd", q, lse);
  }
  void rmsnorm_fwd(const Tensor& x, const Tensor& w, float, const Tensor& y, const Tensor& rstd) override {
    require(x.numel() == y.numel() && x.dim(-1) == w.numel(), "rmsnorm_fwd", x, y);
    require(rstd.numel() * x.dim(-1) == x.numel() && rstd.dtype() == DType::fp32, "rmsnorm_fwd", x, rstd);
  }
  void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                   const Tensor& dw) override {
    require(dy.numel() == x.numel() && dx.numel() == x.numel() && dw.numel() == w.numel() &&
                rstd.numel() * x.dim(-1) == x.numel(),
            "rmsnorm_bwd", dy, x);
  }
  void rope_fwd(const Tensor& x, double, const Tensor& y) override {
    require(x.ndim() == 4 && x.dim(3) % 2 == 0 && y.numel() == x.numel(), "rope_fwd", x, y);
  }
  void rope_bwd(const Tensor& dy, double, const Tensor& dx) override {
    require(dy.ndim() == 4 && dy.dim(3) % 2 == 0 && dx.numel() == dy.numel(), "rope_bwd", dy, dx);
  }
  void swiglu_fwd(const Tensor& x, const Tensor& y) override {
    require(x.dim(-1) == 2 * y.dim(-1) && x.numel() == 2 * y.numel(), "swiglu_fwd", x, y);
  }
  void swiglu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    require(x.dim(-1) == 2 * dy.dim(-1) && x.numel() == 2 * dy.numel() && dx.numel() == x.numel(), "swiglu_bwd", dy, x);
  }
  void split_heads(const Tensor& src, int64_t off, const Tensor& dst) override {
    require(dst.ndim() == 4 && src.ndim() == 3 && off + dst.dim(1) * dst.dim(3) <= src.dim(2) &&
                src.dim(0) == dst.dim(2) && src.dim(1) == dst.dim(0),
            "split_heads", src, dst);
  }
  void merge_heads(const Tensor& src, int64_t off, const Tensor& dst) override {
    require(src.ndim() == 4 && dst.ndim() == 3 && off + src.dim(1) * src.dim(3) <= dst.dim(2) &&
                dst.dim(0) == src.dim(2) && dst.dim(1) == src.dim(0),
            "merge_heads", src, dst);
  }
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(size_t capacity_bytes) { return std::make_unique<MetaBackend>(capacity_bytes); }

}  // namespace actbench
