#include "layers/parallel.hpp"

namespace actbench {
namespace {

std::string phase(const CommContext& c, const char* op, const char* what) {
  return "comm." + c.stage + "." + op + "." + what;
}

Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

Tensor all_gather(const CommContext& c, const Tensor& x, const char* what) {
  PhaseRange r(phase(c, "all_gather", what), c.log);
  Tensor full = c.be.empty(with_rows(x, x.dim(0) * c.comm.size()), x.dtype());
  c.comm.all_gather(x, full);
  return full;
}

Tensor reduce_scatter(const CommContext& c, const Tensor& x, const char* what) {
  PhaseRange r(phase(c, "reduce_scatter", what), c.log);
  Tensor part = c.be.empty(with_rows(x, x.dim(0) / c.comm.size()), x.dtype());
  c.comm.reduce_scatter(x, part);
  return part;
}

Tensor all_reduce(const CommContext& c, Tensor x, const char* what) {
  PhaseRange r(phase(c, "all_reduce", what), c.log);
  c.comm.all_reduce(x);
  return x;
}

}  // namespace

// f: identity | g: all-gather
Tensor region_entry_fwd(const CommContext& c, const Tensor& x, const char* what) {
  return c.sequence_parallel ? all_gather(c, x, what) : x;
}
// f: all-reduce | g: reduce-scatter
Tensor region_entry_bwd(const CommContext& c, Tensor dfull, const char* what) {
  return c.sequence_parallel ? reduce_scatter(c, dfull, what) : all_reduce(c, std::move(dfull), what);
}
// f̄: all-reduce | ḡ: reduce-scatter
Tensor region_exit_fwd(const CommContext& c, Tensor partial, const char* what) {
  return c.sequence_parallel ? reduce_scatter(c, partial, what) : all_reduce(c, std::move(partial), what);
}
// f̄: identity | ḡ: all-gather
Tensor region_exit_bwd(const CommContext& c, const Tensor& dout, const char* what) {
  return c.sequence_parallel ? all_gather(c, dout, what) : dout;
}

}  // namespace actbench
