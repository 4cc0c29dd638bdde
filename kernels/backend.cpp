// The contract of kernels/backend.hpp, checked here once for every backend: each public op
// checks its arguments, then calls the backend's <op>_impl. cpu, cuda and meta therefore
// refuse the same calls with the same one-line message, and a meta run (the shapes of 530B)
// proves what a cpu or cuda run of those shapes would accept.
#include "kernels/backend.hpp"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "runtime/error.hpp"

namespace actbench {
namespace {

using Named = std::pair<const char*, const Tensor*>;

// True when the bytes of a and b intersect (an in-place GEMM would read what it has written).
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* pa = static_cast<const char*>(a.data());
  const char* pb = static_cast<const char*>(b.data());
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

// The checks of one call of one op. Every failure is InvalidArgument("op: what").
// Fused attention's output [B, S, Dv]: q's rows, v's width (checked by attention_qkv first).
Shape attention_out_shape(const Tensor& q, const Tensor& v) { return {q.dim(0), q.dim(1), v.dim(2)}; }

class Contract {
 public:
  // Every tensor of the op is defined and, when it holds elements, lives on `device`.
  Contract(const char* op, Device device, std::initializer_list<Named> tensors) : op_(op), device_(device) {
    for (const auto& [name, t] : tensors) {
      if (!t->defined()) fail(std::string(name) + " is undefined");
      on_device(name, *t);
    }
  }
  // A tensor the op may go without (undefined: absent); when given, it lives on the device.
  void optional(const char* name, const Tensor& t) const {
    if (t.defined()) on_device(name, t);
  }

  [[noreturn]] void fail(const std::string& what) const { throw InvalidArgument(std::string(op_) + ": " + what); }

  void numel(const char* name, const Tensor& t, int64_t n) const {
    if (t.numel() != n)
      fail(std::string(name) + " has " + std::to_string(t.numel()) + " elements " + shape_str(t.shape()) +
           ", expected " + std::to_string(n));
  }
  void floats(std::initializer_list<Named> tensors) const {
    for (const auto& [name, t] : tensors)
      if (!is_float(t->dtype()))
        fail(std::string(name) + " must be a float tensor (bf16, fp16 or fp32), not " + dtype_name(t->dtype()));
  }
  void dtype(const char* name, const Tensor& t, DType want) const {
    if (t.dtype() != want) fail(std::string(name) + " must be " + dtype_name(want) + ", got " + dtype_name(t.dtype()));
  }
  void same_dtype(const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) const {
    if (a.dtype() != b.dtype())
      fail(std::string("dtypes differ: ") + a_name + " " + dtype_name(a.dtype()) + ", " + b_name + " " +
           dtype_name(b.dtype()));
  }
  void positive(const char* name, double value) const {
    if (!(value > 0)) fail(std::string(name) + " must be positive, got " + std::to_string(value));
  }
  void probability(float p) const {
    if (!(p >= 0.f && p < 1.f)) fail("dropout probability must be in [0, 1), got " + std::to_string(p));
  }

  // The size N of the last dimension of t, which must equal the N >= 1 elements of param.
  int64_t last_dim(const char* name, const Tensor& t, const char* param_name, const Tensor& param) const {
    const int64_t n = param.numel();
    if (t.ndim() < 1 || n < 1 || t.dim(-1) != n)
      fail(std::string(name) + " " + shape_str(t.shape()) + " must end in the " + std::to_string(n) +
           " elements of " + param_name + " " + shape_str(param.shape()));
    return n;
  }

  // t [..., S, S], or [..., R, C] with rows placed inside [0, C).
  void causal_rows(const char* name, const Tensor& t, const SeqPositions& rows) const {
    if (t.ndim() < 2) fail(std::string(name) + " must be [..., R, C], got " + shape_str(t.shape()));
    if (rows.is_identity(t.dim(-2))) {
      if (t.dim(-1) != t.dim(-2)) fail(std::string(name) + " must be [..., S, S], got " + shape_str(t.shape()));
      return;
    }
    positions("score rows", rows, t.dim(-2), t.dim(-1));
  }

  // Rows [0, n) placed by `pos` inside [0, limit) (limit < 0: no upper bound).
  void positions(const char* what, const SeqPositions& pos, int64_t n, int64_t limit) const {
    SeqPositions::Run runs[2];
    const int count = pos.runs(n, runs);
    for (int r = 0; r < count; ++r)
      if (runs[r].position < 0 || (limit >= 0 && runs[r].position + runs[r].rows > limit))
        fail(std::string(what) + " " + std::to_string(runs[r].row) + ".." + std::to_string(runs[r].row + runs[r].rows) +
             " at positions " + std::to_string(runs[r].position) + ".." +
             std::to_string(runs[r].position + runs[r].rows) +
             (limit >= 0 ? " do not fit [0, " + std::to_string(limit) + ")" : " must not be negative"));
  }

  // A spec whose shard fits mid_global, with p in [0, 1), describing `numel` elements.
  void dropout_spec(const DropoutSpec& spec, int64_t numel, const char* of) const {
    if (spec.outer < 0 || spec.mid_local < 0 || spec.inner < 0 || spec.mid_offset < 0 || spec.outer_offset < 0 ||
        spec.mid_offset + spec.mid_local > spec.mid_global)
      fail("dropout spec shard [" + std::to_string(spec.mid_offset) + ", " +
           std::to_string(spec.mid_offset + spec.mid_local) + ") does not fit mid_global " +
           std::to_string(spec.mid_global));
    positions("dropout spec inner elements", spec.inner_positions, spec.inner, spec.inner_canonical());
    if (spec.numel() != numel)
      fail("the dropout spec describes " + std::to_string(spec.numel()) + " elements, expected " +
           std::to_string(numel) + " (" + of + ")");
    probability(spec.p);
  }

  // q [B, S, D] with k, v [B / r, Sk, D], r dividing B (B = 0: empty k and v); Sk = S
  // unless `rows` places both in a sequence of rows.total positions.
  void attention_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionRows& rows) const {
    if (q.ndim() != 3) fail("q must be [B, S, D], got " + shape_str(q.shape()));
    const bool placed = rows.total > 0;
    // v may be narrower or wider than q and k (multi-latent attention's d_v): out is v's width.
    if (k.ndim() != 3 || v.ndim() != 3 || k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) ||
        (!placed && k.dim(1) != q.dim(1)) || k.dim(2) != q.dim(2) || v.dim(2) < 1 ||
        (k.dim(0) < 1 ? q.dim(0) != 0 : q.dim(0) % k.dim(0) != 0))
      fail(std::string("k and v must be [B / r, ") + (placed ? "Sk" : "S") + ", D] and [B / r, " +
           (placed ? "Sk" : "S") + ", Dv] with r dividing B for q " + shape_str(q.shape()) + ", got " +
           shape_str(k.shape()) + " and " + shape_str(v.shape()));
    if (!placed) {
      if (!rows.queries.is_identity(q.dim(1)) || !rows.keys.is_identity(k.dim(1)))
        fail("query or key positions need the sequence's total length (AttentionRows::total)");
      return;
    }
    positions("query rows", rows.queries, q.dim(1), rows.total);
    positions("key rows", rows.keys, k.dim(1), rows.total);
  }
  void same_shape(const char* name, const Tensor& t, const char* like_name, const Shape& like) const {
    if (t.shape() != like)
      fail(std::string(name) + " must be " + shape_str(like) + " like " + like_name + ", got " + shape_str(t.shape()));
  }
  void same_shape(const char* name, const Tensor& t, const char* like_name, const Tensor& like) const {
    if (t.shape() != like.shape())
      fail(std::string(name) + " must be " + shape_str(like.shape()) + " like " + like_name + ", got " +
           shape_str(t.shape()));
  }
  // lse [B, S] fp32 and a spec of the B * T * T probabilities, for q [B, S, D] (T = S, or
  // the total of the rows' sequence).
  void attention_rows(const Tensor& q, const Tensor& lse, const DropoutSpec& spec, const AttentionRows& rows) const {
    const int64_t B = q.dim(0), S = q.dim(1), T = rows.total > 0 ? rows.total : S;
    numel("lse", lse, B * S);
    dtype("lse", lse, DType::fp32);
    dropout_spec(spec, B * T * T, "the [B, T, T] probabilities of the whole sequence");
  }

  // A rotary embedding (either direction): in [B, NH, S, D] rotated on its first rotary_dim
  // dims (even, 2 <= rotary_dim <= D), out of its size, both float, theta > 0.
  void rotation(const char* in_name, const Tensor& in, const char* out_name, const Tensor& out, double theta,
                int64_t rotary_dim) const {
    if (in.ndim() != 4) fail(std::string(in_name) + " must be [B, NH, S, D], got " + shape_str(in.shape()));
    if (rotary_dim < 2 || rotary_dim > in.dim(3) || rotary_dim % 2 != 0)
      fail("rotary_dim must be even and in [2, D = " + std::to_string(in.dim(3)) + "], got " +
           std::to_string(rotary_dim));
    numel(out_name, out, in.numel());
    floats({{in_name, &in}, {out_name, &out}});
    positive("theta", theta);
  }

  // An elementwise activation's forward: y has the elements of x, both float.
  void activation_fwd(const Tensor& x, const Tensor& y) const {
    numel("y", y, x.numel());
    floats({{"x", &x}, {"y", &y}});
  }
  // Its backward: dy, dx have the elements of x, all float.
  void activation_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) const {
    numel("dy", dy, x.numel());
    numel("dx", dx, x.numel());
    floats({{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  }

  // x [..., 2N] = [gate | up] and y [..., N] with the same rows, N >= 1.
  void swiglu_widths(const Tensor& x, const char* y_name, const Tensor& y) const {
    if (x.ndim() < 1 || y.ndim() < 1 || y.dim(-1) < 1 || x.dim(-1) != 2 * y.dim(-1) ||
        x.numel() / x.dim(-1) != y.numel() / y.dim(-1))
      fail("x must be [..., 2N] = [gate | up] for " + std::string(y_name) + " [..., N], got " + shape_str(x.shape()) +
           " and " + shape_str(y.shape()));
  }

  // heads [B, NH, S, D] are columns [off, off + NH*D) of wide [S, B, W], of one dtype.
  void heads(const Tensor& wide, int64_t off, const Tensor& heads) const {
    if (wide.ndim() != 3 || heads.ndim() != 4)
      fail("expected [S, B, W] and [B, NH, S, D], got " + shape_str(wide.shape()) + " and " +
           shape_str(heads.shape()));
    if (wide.dim(0) != heads.dim(2) || wide.dim(1) != heads.dim(0) || off < 0 ||
        off + heads.dim(1) * heads.dim(3) > wide.dim(2))
      fail("heads " + shape_str(heads.shape()) + " at column " + std::to_string(off) + " do not fit " +
           shape_str(wide.shape()));
    same_dtype("[S, B, W]", wide, "[B, NH, S, D]", heads);
  }

  // t holds exactly `want`.
  void shape(const char* name, const Tensor& t, const Shape& want, const char* want_names) const {
    if (t.shape() != want)
      fail(std::string(name) + " must be " + want_names + " = " + shape_str(want) + ", got " + shape_str(t.shape()));
  }
  // t [rows, cols] with rows >= 0 and cols >= 1 (the names are for the message).
  void matrix(const char* name, const Tensor& t, const char* names) const {
    if (t.ndim() != 2 || t.dim(1) < 1) fail(std::string(name) + " must be " + names + ", got " + shape_str(t.shape()));
  }

  // A router over E >= 1 experts: 1 <= top_k <= E, groups dividing E with enough experts in
  // the group_top_k chosen groups, scaling > 0.
  void routing(const MoeRouting& r, int64_t E) const {
    if (r.top_k < 1 || r.top_k > E)
      fail("top_k must be in [1, E = " + std::to_string(E) + "], got " + std::to_string(r.top_k));
    if (r.num_groups < 1 || E % r.num_groups != 0)
      fail("num_groups must divide the " + std::to_string(E) + " experts, got " + std::to_string(r.num_groups));
    if (r.group_top_k < 1 || r.group_top_k > r.num_groups)
      fail("group_top_k must be in [1, num_groups = " + std::to_string(r.num_groups) + "], got " +
           std::to_string(r.group_top_k));
    if (r.top_k > r.group_top_k * (E / r.num_groups))
      fail("top_k " + std::to_string(r.top_k) + " exceeds the " + std::to_string(r.group_top_k * (E / r.num_groups)) +
           " experts of the group_top_k best groups");
    if (!(r.scaling > 0.f) || !std::isfinite(r.scaling))
      fail("scaling must be positive and finite, got " + std::to_string(r.scaling));
  }

  // A dispatch plan for T tokens (MoeDispatch): slot_row [T, k], row_slot [T * k],
  // tokens_per_expert [E], E >= 1, all i32. Returns k.
  int64_t dispatch_plan(const MoeDispatch& p, int64_t T) const {
    if (p.slot_row.ndim() != 2 || p.slot_row.dim(0) != T || p.slot_row.dim(1) < 1)
      fail("plan slot_row must be [T = " + std::to_string(T) + ", k], got " + shape_str(p.slot_row.shape()));
    const int64_t k = p.slot_row.dim(1);
    shape("plan row_slot", p.row_slot, {T * k}, "[T * k]");
    if (p.tokens_per_expert.ndim() != 1 || p.tokens_per_expert.numel() < 1)
      fail("plan tokens_per_expert must be [E], E >= 1, got " + shape_str(p.tokens_per_expert.shape()));
    dtype("plan slot_row", p.slot_row, DType::i32);
    dtype("plan row_slot", p.row_slot, DType::i32);
    dtype("plan tokens_per_expert", p.tokens_per_expert, DType::i32);
    return k;
  }
  // t [N, h] with N <= max_rows: the permuted rows of a plan.
  void permuted(const char* name, const Tensor& t, int64_t max_rows, int64_t h) const {
    if (t.ndim() != 2 || t.dim(0) > max_rows || t.dim(1) != h)
      fail(std::string(name) + " must be [N, h = " + std::to_string(h) + "] with N <= T * k = " +
           std::to_string(max_rows) + ", got " + shape_str(t.shape()));
  }

  // x [N, in], w [E, in, out], tokens_per_expert [E] i32: returns out.
  int64_t experts(const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert,
                  const std::vector<int64_t>& host_rows) const {
    matrix("x", x, "[N, in]");
    if (w.ndim() != 3 || w.dim(0) < 1 || w.dim(1) != x.dim(1))
      fail("w must be [E, in = " + std::to_string(x.dim(1)) + ", out], got " + shape_str(w.shape()));
    shape("tokens_per_expert", tokens_per_expert, {w.dim(0)}, "[E]");
    dtype("tokens_per_expert", tokens_per_expert, DType::i32);
    if (!host_rows.empty()) {
      int64_t sum = 0;
      bool negative = false;
      for (int64_t n : host_rows) sum += n, negative = negative || n < 0;
      if (static_cast<int64_t>(host_rows.size()) != w.dim(0) || negative || sum != x.dim(0))
        fail("host_rows must be E = " + std::to_string(w.dim(0)) + " counts >= 0 summing to the " +
             std::to_string(x.dim(0)) + " rows of x");
    }
    return w.dim(2);
  }

 private:
  void on_device(const char* name, const Tensor& t) const {
    if (t.numel() > 0 && t.device() != device_)
      fail(std::string(name) + " " + shape_str(t.shape()) + " is on " + device_name(t.device()) + ", not on the " +
           device_name(device_) + " device of this backend");
  }

  const char* op_;
  Device device_;
};

}  // namespace

// ---- data movement ----------------------------------------------------------------------

void Backend::fill_zero(const Tensor& t) {
  Contract("fill_zero", allocator_->device(), {{"t", &t}});
  fill_zero_impl(t);
}

void Backend::copy(const Tensor& src, const Tensor& dst) {
  const Contract c("copy", allocator_->device(), {{"src", &src}, {"dst", &dst}});
  c.numel("dst", dst, src.numel());
  c.same_dtype("src", src, "dst", dst);
  copy_impl(src, dst);
}

void Backend::upload(const float* host, const Tensor& dst) {
  Contract("upload", allocator_->device(), {{"dst", &dst}});
  upload_impl(host, dst);
}

void Backend::download(const Tensor& src, float* host) {
  Contract("download", allocator_->device(), {{"src", &src}});
  download_impl(src, host);
}

void Backend::add_inplace(const Tensor& dst, const Tensor& src) {
  const Contract c("add_inplace", allocator_->device(), {{"dst", &dst}, {"src", &src}});
  c.numel("src", src, dst.numel());
  c.floats({{"dst", &dst}, {"src", &src}});
  add_inplace_impl(dst, src);
}

// ---- GEMM and bias ------------------------------------------------------------------------

void Backend::gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c) {
  const Contract k("gemm", allocator_->device(), {{"A", &a}, {"B", &b}, {"C", &c}});
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0)
    k.fail("negative size m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
           " batch=" + std::to_string(g.batch));
  k.numel("A", a, g.batch * g.m * g.k);
  k.numel("B", b, g.batch * g.k * g.n);
  k.numel("C", c, g.batch * g.m * g.n);
  k.floats({{"A", &a}, {"B", &b}, {"C", &c}});
  if (overlaps(c, a) || overlaps(c, b)) k.fail("C must not overlap A or B");
  gemm_impl(g, a, b, c);
}

void Backend::add_bias(const Tensor& y, const Tensor& bias) {
  const Contract c("add_bias", allocator_->device(), {{"y", &y}, {"bias", &bias}});
  c.last_dim("y", y, "bias", bias);
  c.floats({{"y", &y}, {"bias", &bias}});
  add_bias_impl(y, bias);
}

void Backend::bias_grad(const Tensor& dy, const Tensor& db) {
  const Contract c("bias_grad", allocator_->device(), {{"dy", &dy}, {"db", &db}});
  c.last_dim("dy", dy, "db", db);
  c.floats({{"dy", &dy}, {"db", &db}});
  bias_grad_impl(dy, db);
}

// ---- LayerNorm ----------------------------------------------------------------------------

void Backend::layernorm_fwd(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& y,
                            const Tensor& mean, const Tensor& rstd) {
  const Contract c("layernorm_fwd", allocator_->device(),
                   {{"x", &x}, {"weight", &weight}, {"bias", &bias}, {"y", &y}, {"mean", &mean}, {"rstd", &rstd}});
  const int64_t H = c.last_dim("x", x, "weight", weight), M = x.numel() / H;
  c.numel("bias", bias, H);
  c.numel("y", y, x.numel());
  c.numel("mean", mean, M);
  c.numel("rstd", rstd, M);
  c.floats({{"x", &x}, {"weight", &weight}, {"bias", &bias}, {"y", &y}});
  c.dtype("mean", mean, DType::fp32);
  c.dtype("rstd", rstd, DType::fp32);
  layernorm_fwd_impl(x, weight, bias, eps, y, mean, rstd);
}

void Backend::layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                            const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const Contract c("layernorm_bwd", allocator_->device(),
                   {{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"mean", &mean}, {"rstd", &rstd}, {"dx", &dx},
                    {"dweight", &dweight}, {"dbias", &dbias}});
  const int64_t H = c.last_dim("x", x, "weight", weight), M = x.numel() / H;
  c.numel("dy", dy, x.numel());
  c.numel("dx", dx, x.numel());
  c.numel("mean", mean, M);
  c.numel("rstd", rstd, M);
  c.numel("dweight", dweight, H);
  c.numel("dbias", dbias, H);
  c.floats({{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"dx", &dx}, {"dweight", &dweight}, {"dbias", &dbias}});
  c.dtype("mean", mean, DType::fp32);
  c.dtype("rstd", rstd, DType::fp32);
  layernorm_bwd_impl(dy, x, weight, mean, rstd, dx, dweight, dbias);
}

// ---- causal softmax -----------------------------------------------------------------------

void Backend::softmax_causal_fwd(const Tensor& scores, const Tensor& probs, const SeqPositions& rows) {
  const Contract c("softmax_causal_fwd", allocator_->device(), {{"scores", &scores}, {"probs", &probs}});
  c.causal_rows("scores", scores, rows);
  c.numel("probs", probs, scores.numel());
  c.floats({{"scores", &scores}, {"probs", &probs}});
  softmax_causal_fwd_impl(scores, probs, rows);
}

void Backend::softmax_causal_bwd(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores,
                                 const SeqPositions& rows) {
  const Contract c("softmax_causal_bwd", allocator_->device(),
                   {{"dprobs", &dprobs}, {"probs", &probs}, {"dscores", &dscores}});
  c.causal_rows("probs", probs, rows);
  c.numel("dprobs", dprobs, probs.numel());
  c.numel("dscores", dscores, probs.numel());
  c.floats({{"dprobs", &dprobs}, {"probs", &probs}, {"dscores", &dscores}});
  softmax_causal_bwd_impl(dprobs, probs, dscores, rows);
}

// ---- dropout, activations, residual -----------------------------------------------------

void Backend::dropout_fwd(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask) {
  const Contract c("dropout_fwd", allocator_->device(), {{"x", &x}, {"y", &y}, {"mask", &mask}});
  c.dropout_spec(spec, x.numel(), "x");
  c.numel("y", y, x.numel());
  c.numel("mask", mask, x.numel());
  c.floats({{"x", &x}, {"y", &y}});
  c.dtype("mask", mask, DType::u8);
  dropout_fwd_impl(x, spec, y, mask);
}

void Backend::dropout_bwd(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) {
  const Contract c("dropout_bwd", allocator_->device(), {{"dy", &dy}, {"mask", &mask}, {"dx", &dx}});
  c.numel("mask", mask, dy.numel());
  c.numel("dx", dx, dy.numel());
  c.floats({{"dy", &dy}, {"dx", &dx}});
  c.dtype("mask", mask, DType::u8);
  c.probability(p);
  dropout_bwd_impl(dy, mask, p, dx);
}

void Backend::gelu_fwd(const Tensor& x, const Tensor& y) {
  Contract("gelu_fwd", allocator_->device(), {{"x", &x}, {"y", &y}}).activation_fwd(x, y);
  gelu_fwd_impl(x, y);
}

void Backend::gelu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  Contract("gelu_bwd", allocator_->device(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}}).activation_bwd(dy, x, dx);
  gelu_bwd_impl(dy, x, dx);
}

void Backend::squared_relu_fwd(const Tensor& x, const Tensor& y) {
  Contract("squared_relu_fwd", allocator_->device(), {{"x", &x}, {"y", &y}}).activation_fwd(x, y);
  squared_relu_fwd_impl(x, y);
}

void Backend::squared_relu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  Contract("squared_relu_bwd", allocator_->device(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}}).activation_bwd(dy, x, dx);
  squared_relu_bwd_impl(dy, x, dx);
}

void Backend::bias_dropout_residual_fwd(const Tensor& x, const Tensor& bias, const Tensor& residual,
                                        const DropoutSpec& spec, const Tensor& out, const Tensor& mask) {
  const Contract c("bias_dropout_residual_fwd", allocator_->device(),
                   {{"x", &x}, {"residual", &residual}, {"out", &out}, {"mask", &mask}});
  c.optional("bias", bias);  // undefined: no bias
  if (bias.defined()) {
    c.last_dim("x", x, "bias", bias);
    c.floats({{"bias", &bias}});
  }
  c.dropout_spec(spec, x.numel(), "x");
  c.numel("residual", residual, x.numel());
  c.numel("out", out, x.numel());
  c.numel("mask", mask, x.numel());
  c.floats({{"x", &x}, {"residual", &residual}, {"out", &out}});
  c.dtype("mask", mask, DType::u8);
  bias_dropout_residual_fwd_impl(x, bias, residual, spec, out, mask);
}

// ---- fused attention ----------------------------------------------------------------------

void Backend::attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const DropoutSpec& spec,
                            const Tensor& out, const Tensor& lse, const AttentionRows& rows) {
  const Contract c("attention_fwd", allocator_->device(),
                   {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}});
  c.attention_qkv(q, k, v, rows);
  c.same_shape("out", out, "q with v's width", attention_out_shape(q, v));
  c.attention_rows(q, lse, spec, rows);
  c.floats({{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}});
  attention_fwd_impl(q, k, v, scale, spec, out, lse, rows);
}

void Backend::attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                            const Tensor& lse, float scale, const DropoutSpec& spec, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const AttentionRows& rows) {
  const Contract c("attention_bwd", allocator_->device(),
                   {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout}, {"lse", &lse}, {"dq", &dq},
                    {"dk", &dk}, {"dv", &dv}});
  c.attention_qkv(q, k, v, rows);
  const Shape out_like = attention_out_shape(q, v);
  c.same_shape("out", out, "q with v's width", out_like);
  c.same_shape("dout", dout, "q with v's width", out_like);
  c.same_shape("dq", dq, "q", q);
  c.same_shape("dk", dk, "k", k);
  c.same_shape("dv", dv, "v", v);
  c.attention_rows(q, lse, spec, rows);
  c.floats({{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  attention_bwd_impl(q, k, v, out, dout, lse, scale, spec, dq, dk, dv, rows);
}

void Backend::attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_part, const Tensor& lse_part) {
  const Contract c("attention_merge", allocator_->device(),
                   {{"out", &out}, {"lse", &lse}, {"out_part", &out_part}, {"lse_part", &lse_part}});
  if (out.ndim() != 3) c.fail("out must be [B, S, D], got " + shape_str(out.shape()));
  c.same_shape("out_part", out_part, "out", out);
  c.numel("lse", lse, out.dim(0) * out.dim(1));
  c.numel("lse_part", lse_part, out.dim(0) * out.dim(1));
  c.dtype("lse", lse, DType::fp32);
  c.dtype("lse_part", lse_part, DType::fp32);
  c.floats({{"out", &out}, {"out_part", &out_part}});
  attention_merge_impl(out, lse, out_part, lse_part);
}

// ---- the llama family ---------------------------------------------------------------------

void Backend::rmsnorm_fwd(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd) {
  const Contract c("rmsnorm_fwd", allocator_->device(), {{"x", &x}, {"weight", &weight}, {"y", &y}, {"rstd", &rstd}});
  const int64_t H = c.last_dim("x", x, "weight", weight);
  c.numel("y", y, x.numel());
  c.numel("rstd", rstd, x.numel() / H);
  c.floats({{"x", &x}, {"weight", &weight}, {"y", &y}});
  c.dtype("rstd", rstd, DType::fp32);
  c.positive("eps", eps);
  rmsnorm_fwd_impl(x, weight, eps, y, rstd);
}

void Backend::rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                          const Tensor& dweight) {
  const Contract c("rmsnorm_bwd", allocator_->device(),
                   {{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"rstd", &rstd}, {"dx", &dx}, {"dweight", &dweight}});
  const int64_t H = c.last_dim("x", x, "weight", weight);
  c.numel("dy", dy, x.numel());
  c.numel("dx", dx, x.numel());
  c.numel("rstd", rstd, x.numel() / H);
  c.numel("dweight", dweight, H);
  c.floats({{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"dx", &dx}, {"dweight", &dweight}});
  c.dtype("rstd", rstd, DType::fp32);
  rmsnorm_bwd_impl(dy, x, weight, rstd, dx, dweight);
}

void Backend::rope_fwd(const Tensor& x, double theta, int64_t rotary_dim, const Tensor& y,
                       const SeqPositions& positions) {
  const Contract c("rope_fwd", allocator_->device(), {{"x", &x}, {"y", &y}});
  c.rotation("x", x, "y", y, theta, rotary_dim);
  c.positions("rows", positions, x.dim(2), -1);
  rope_fwd_impl(x, theta, rotary_dim, y, positions);
}

void Backend::rope_bwd(const Tensor& dy, double theta, int64_t rotary_dim, const Tensor& dx,
                       const SeqPositions& positions) {
  const Contract c("rope_bwd", allocator_->device(), {{"dy", &dy}, {"dx", &dx}});
  c.rotation("dy", dy, "dx", dx, theta, rotary_dim);
  c.positions("rows", positions, dy.dim(2), -1);
  rope_bwd_impl(dy, theta, rotary_dim, dx, positions);
}

void Backend::swiglu_fwd(const Tensor& x, const Tensor& y) {
  const Contract c("swiglu_fwd", allocator_->device(), {{"x", &x}, {"y", &y}});
  c.swiglu_widths(x, "y", y);
  c.floats({{"x", &x}, {"y", &y}});
  swiglu_fwd_impl(x, y);
}

void Backend::swiglu_bwd(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const Contract c("swiglu_bwd", allocator_->device(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  c.swiglu_widths(x, "dy", dy);
  c.numel("dx", dx, x.numel());
  c.floats({{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  swiglu_bwd_impl(dy, x, dx);
}

// ---- attention head layout ----------------------------------------------------------------

void Backend::split_heads(const Tensor& src, int64_t col_offset, const Tensor& dst) {
  const Contract c("split_heads", allocator_->device(), {{"src", &src}, {"dst", &dst}});
  c.heads(src, col_offset, dst);
  split_heads_impl(src, col_offset, dst);
}

void Backend::merge_heads(const Tensor& src, int64_t col_offset, const Tensor& dst) {
  const Contract c("merge_heads", allocator_->device(), {{"src", &src}, {"dst", &dst}});
  c.heads(dst, col_offset, src);
  merge_heads_impl(src, col_offset, dst);
}

void Backend::copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows) {
  const Contract c("copy_rows", allocator_->device(), {{"src", &src}, {"dst", &dst}});
  if (src.ndim() != 3 || dst.ndim() != 3 || src.dim(0) != dst.dim(0) || src.dim(2) != dst.dim(2))
    c.fail("src and dst must be [O, Rs, W] and [O, Rd, W], got " + shape_str(src.shape()) + " and " +
           shape_str(dst.shape()));
  c.same_dtype("src", src, "dst", dst);
  if (rows < 0 || src_row < 0 || dst_row < 0 || src_row + rows > src.dim(1) || dst_row + rows > dst.dim(1))
    c.fail("rows " + std::to_string(src_row) + ".." + std::to_string(src_row + rows) + " -> " +
           std::to_string(dst_row) + ".." + std::to_string(dst_row + rows) + " do not fit " + shape_str(src.shape()) +
           " -> " + shape_str(dst.shape()));
  copy_rows_impl(src, src_row, dst, dst_row, rows);
}


// ---- mixture of experts -------------------------------------------------------------------

const char* moe_score_name(MoeRouting::Score s) { return s == MoeRouting::Score::sigmoid ? "sigmoid" : "softmax"; }

int64_t moe_expert_capacity(int64_t tokens, int64_t top_k, int64_t experts, double capacity_factor) {
  if (!(capacity_factor > 0) || !std::isfinite(capacity_factor))
    throw InvalidArgument("moe capacity factor must be positive and finite, got " + std::to_string(capacity_factor));
  if (tokens < 0 || top_k < 1 || experts < 1)
    throw InvalidArgument("moe capacity: tokens " + std::to_string(tokens) + ", top_k " + std::to_string(top_k) +
                          ", experts " + std::to_string(experts) + " (tokens >= 0, top_k and experts >= 1)");
  // Megatron-Core's order of operations (get_capacity), so the same factor gives the same capacity.
  const double per_expert = static_cast<double>(tokens * top_k) / static_cast<double>(experts);
  return static_cast<int64_t>(std::ceil(per_expert * capacity_factor));
}

MoeDispatch make_moe_dispatch(Backend& be, int64_t tokens, int64_t top_k, int64_t experts) {
  return MoeDispatch{be.empty({experts}, DType::i32), be.empty({tokens * top_k}, DType::i32),
                     be.empty({tokens, top_k}, DType::i32)};
}

void Backend::moe_route(const Tensor& logits, const Tensor& bias, const MoeRouting& routing, const Tensor& scores,
                        const Tensor& topk_index, const Tensor& topk_weight, const Tensor& aux_loss) {
  const Contract c("moe_route", allocator_->device(),
                   {{"logits", &logits}, {"scores", &scores}, {"topk_index", &topk_index},
                    {"topk_weight", &topk_weight}});
  c.optional("bias", bias);  // undefined: no bias
  c.optional("aux_loss", aux_loss);
  c.matrix("logits", logits, "[T, E] with E >= 1");
  const int64_t T = logits.dim(0), E = logits.dim(1);
  c.routing(routing, E);
  c.same_shape("scores", scores, "logits", logits);
  c.shape("topk_index", topk_index, {T, routing.top_k}, "[T, top_k]");
  c.shape("topk_weight", topk_weight, {T, routing.top_k}, "[T, top_k]");
  c.floats({{"logits", &logits}, {"scores", &scores}, {"topk_weight", &topk_weight}});
  c.dtype("topk_index", topk_index, DType::i32);
  if (bias.defined()) {
    c.shape("bias", bias, {E}, "[E]");
    c.floats({{"bias", &bias}});
  }
  if (aux_loss.defined()) {
    c.shape("aux_loss", aux_loss, {1}, "[1]");
    c.dtype("aux_loss", aux_loss, DType::fp32);
  }
  moe_route_impl(logits, bias, routing, scores, topk_index, topk_weight, aux_loss);
}

void Backend::moe_route_bwd(const Tensor& d_topk_weight, const Tensor& scores, const Tensor& topk_index,
                            const MoeRouting& routing, const Tensor& d_logits) {
  const Contract c("moe_route_bwd", allocator_->device(),
                   {{"d_topk_weight", &d_topk_weight}, {"scores", &scores}, {"topk_index", &topk_index},
                    {"d_logits", &d_logits}});
  c.matrix("scores", scores, "[T, E] with E >= 1");
  const int64_t T = scores.dim(0), E = scores.dim(1);
  c.routing(routing, E);
  c.shape("topk_index", topk_index, {T, routing.top_k}, "[T, top_k]");
  c.shape("d_topk_weight", d_topk_weight, {T, routing.top_k}, "[T, top_k]");
  c.same_shape("d_logits", d_logits, "scores", scores);
  c.floats({{"d_topk_weight", &d_topk_weight}, {"scores", &scores}, {"d_logits", &d_logits}});
  c.dtype("topk_index", topk_index, DType::i32);
  moe_route_bwd_impl(d_topk_weight, scores, topk_index, routing, d_logits);
}

void Backend::moe_dispatch(const Tensor& topk_index, std::optional<double> capacity_factor, const MoeDispatch& plan) {
  const Contract c("moe_dispatch", allocator_->device(),
                   {{"topk_index", &topk_index}, {"plan tokens_per_expert", &plan.tokens_per_expert},
                    {"plan row_slot", &plan.row_slot}, {"plan slot_row", &plan.slot_row}});
  c.matrix("topk_index", topk_index, "[T, k] with k >= 1");
  c.dtype("topk_index", topk_index, DType::i32);
  const int64_t k = c.dispatch_plan(plan, topk_index.dim(0)), E = plan.tokens_per_expert.numel();
  c.shape("plan slot_row", plan.slot_row, topk_index.shape(), "[T, k] like topk_index");
  if (k > E) c.fail("top_k " + std::to_string(k) + " exceeds the " + std::to_string(E) + " experts");
  if (capacity_factor && (!(*capacity_factor > 0) || !std::isfinite(*capacity_factor)))
    c.fail("capacity factor must be positive and finite, got " + std::to_string(*capacity_factor));
  moe_dispatch_impl(topk_index, capacity_factor, plan);
}

void Backend::moe_permute(const Tensor& x, const MoeDispatch& plan, const Tensor& out) {
  const Contract c("moe_permute", allocator_->device(),
                   {{"x", &x}, {"out", &out}, {"plan tokens_per_expert", &plan.tokens_per_expert},
                    {"plan row_slot", &plan.row_slot}, {"plan slot_row", &plan.slot_row}});
  c.matrix("x", x, "[T, h] with h >= 1");
  const int64_t k = c.dispatch_plan(plan, x.dim(0));
  c.permuted("out", out, x.dim(0) * k, x.dim(1));
  c.floats({{"x", &x}, {"out", &out}});
  c.same_dtype("x", x, "out", out);
  moe_permute_impl(x, plan, out);
}

void Backend::moe_permute_bwd(const Tensor& d_out, const MoeDispatch& plan, const Tensor& dx) {
  const Contract c("moe_permute_bwd", allocator_->device(),
                   {{"d_out", &d_out}, {"dx", &dx}, {"plan tokens_per_expert", &plan.tokens_per_expert},
                    {"plan row_slot", &plan.row_slot}, {"plan slot_row", &plan.slot_row}});
  c.matrix("dx", dx, "[T, h] with h >= 1");
  const int64_t k = c.dispatch_plan(plan, dx.dim(0));
  c.permuted("d_out", d_out, dx.dim(0) * k, dx.dim(1));
  c.floats({{"d_out", &d_out}, {"dx", &dx}});
  moe_permute_bwd_impl(d_out, plan, dx);
}

void Backend::moe_unpermute(const Tensor& y, const MoeDispatch& plan, const Tensor& topk_weight, const Tensor& out) {
  const Contract c("moe_unpermute", allocator_->device(),
                   {{"y", &y}, {"topk_weight", &topk_weight}, {"out", &out},
                    {"plan tokens_per_expert", &plan.tokens_per_expert}, {"plan row_slot", &plan.row_slot},
                    {"plan slot_row", &plan.slot_row}});
  c.matrix("out", out, "[T, h] with h >= 1");
  const int64_t k = c.dispatch_plan(plan, out.dim(0));
  c.permuted("y", y, out.dim(0) * k, out.dim(1));
  c.shape("topk_weight", topk_weight, plan.slot_row.shape(), "[T, k]");
  c.floats({{"y", &y}, {"topk_weight", &topk_weight}, {"out", &out}});
  moe_unpermute_impl(y, plan, topk_weight, out);
}

void Backend::moe_unpermute_bwd(const Tensor& d_out, const Tensor& y, const MoeDispatch& plan,
                                const Tensor& topk_weight, const Tensor& dy, const Tensor& d_topk_weight) {
  const Contract c("moe_unpermute_bwd", allocator_->device(),
                   {{"d_out", &d_out}, {"y", &y}, {"topk_weight", &topk_weight}, {"dy", &dy},
                    {"d_topk_weight", &d_topk_weight}, {"plan tokens_per_expert", &plan.tokens_per_expert},
                    {"plan row_slot", &plan.row_slot}, {"plan slot_row", &plan.slot_row}});
  c.matrix("d_out", d_out, "[T, h] with h >= 1");
  const int64_t k = c.dispatch_plan(plan, d_out.dim(0));
  c.permuted("y", y, d_out.dim(0) * k, d_out.dim(1));
  c.same_shape("dy", dy, "y", y);
  c.shape("topk_weight", topk_weight, plan.slot_row.shape(), "[T, k]");
  c.shape("d_topk_weight", d_topk_weight, plan.slot_row.shape(), "[T, k]");
  c.floats({{"d_out", &d_out}, {"y", &y}, {"topk_weight", &topk_weight}, {"dy", &dy},
            {"d_topk_weight", &d_topk_weight}});
  moe_unpermute_bwd_impl(d_out, y, plan, topk_weight, dy, d_topk_weight);
}

void Backend::moe_weight_rows(const Tensor& x, const Tensor& weight, const Tensor& y) {
  const Contract c("moe_weight_rows", allocator_->device(), {{"x", &x}, {"weight", &weight}, {"y", &y}});
  c.matrix("x", x, "[N, w] with w >= 1");
  c.shape("weight", weight, {x.dim(0), 1}, "[N, 1]");
  c.same_shape("y", y, "x", x);
  c.floats({{"x", &x}, {"weight", &weight}, {"y", &y}});
  moe_weight_rows_impl(x, weight, y);
}

void Backend::moe_weight_rows_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                                  const Tensor& d_weight) {
  const Contract c("moe_weight_rows_bwd", allocator_->device(),
                   {{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"dx", &dx}, {"d_weight", &d_weight}});
  c.matrix("x", x, "[N, w] with w >= 1");
  c.same_shape("dy", dy, "x", x);
  c.same_shape("dx", dx, "x", x);
  c.shape("weight", weight, {x.dim(0), 1}, "[N, 1]");
  c.shape("d_weight", d_weight, {x.dim(0), 1}, "[N, 1]");
  c.floats({{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"dx", &dx}, {"d_weight", &d_weight}});
  moe_weight_rows_bwd_impl(dy, x, weight, dx, d_weight);
}

void Backend::grouped_gemm(const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert, const Tensor& y,
                           const std::vector<int64_t>& host_rows) {
  const Contract c("grouped_gemm", allocator_->device(),
                   {{"x", &x}, {"w", &w}, {"tokens_per_expert", &tokens_per_expert}, {"y", &y}});
  const int64_t out = c.experts(x, w, tokens_per_expert, host_rows);
  c.shape("y", y, {x.dim(0), out}, "[N, out]");
  c.floats({{"x", &x}, {"w", &w}, {"y", &y}});
  if (overlaps(y, x) || overlaps(y, w)) c.fail("y must not overlap x or w");
  grouped_gemm_impl(x, w, tokens_per_expert, y, host_rows);
}

void Backend::grouped_gemm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert,
                               const Tensor& dx, const Tensor& dw, const std::vector<int64_t>& host_rows) {
  const Contract c("grouped_gemm_bwd", allocator_->device(),
                   {{"dy", &dy}, {"x", &x}, {"w", &w}, {"tokens_per_expert", &tokens_per_expert}, {"dx", &dx},
                    {"dw", &dw}});
  const int64_t out = c.experts(x, w, tokens_per_expert, host_rows);
  c.shape("dy", dy, {x.dim(0), out}, "[N, out]");
  c.same_shape("dx", dx, "x", x);
  c.same_shape("dw", dw, "w", w);
  c.floats({{"dy", &dy}, {"x", &x}, {"w", &w}, {"dx", &dx}, {"dw", &dw}});
  for (const Tensor* in : {&dy, &x, &w})
    if (overlaps(dx, *in) || overlaps(dw, *in)) c.fail("dx and dw must not overlap dy, x or w");
  if (overlaps(dx, dw)) c.fail("dx must not overlap dw");
  grouped_gemm_bwd_impl(dy, x, w, tokens_per_expert, dx, dw, host_rows);
}

}  // namespace actbench
