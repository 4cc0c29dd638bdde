#include "layers/parallel.hpp"

namespace actbench {
namespace {

std::string phase_name(const CommContext& comm, const char* op, const char* what) {
  return "comm." + comm.stage + "." + op + "." + what;
}

Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

Tensor all_gather(const CommContext& comm, const Tensor& x, const char* what) {
  PhaseRange phase(phase_name(comm, "all_gather", what), comm.log);
  Tensor full = comm.backend.empty(with_rows(x, x.dim(0) * comm.communicator.size()), x.dtype());
  comm.communicator.all_gather(x, full);
  return full;
}

Tensor reduce_scatter(const CommContext& comm, const Tensor& x, const char* what) {
  PhaseRange phase(phase_name(comm, "reduce_scatter", what), comm.log);
  Tensor part = comm.backend.empty(with_rows(x, x.dim(0) / comm.communicator.size()), x.dtype());
  comm.communicator.reduce_scatter(x, part);
  return part;
}

Tensor all_reduce(const CommContext& comm, Tensor x, const char* what) {
  PhaseRange phase(phase_name(comm, "all_reduce", what), comm.log);
  comm.communicator.all_reduce(x);
  return x;
}

}  // namespace

// f: identity | g: all-gather
Tensor region_entry_fwd(const CommContext& comm, const Tensor& x, const char* what) {
  return comm.sequence_parallel ? all_gather(comm, x, what) : x;
}
// f: all-reduce | g: reduce-scatter
Tensor region_entry_bwd(const CommContext& comm, Tensor d_full, const char* what) {
  return comm.sequence_parallel ? reduce_scatter(comm, d_full, what) : all_reduce(comm, std::move(d_full), what);
}
// f̄: all-reduce | ḡ: reduce-scatter
Tensor region_exit_fwd(const CommContext& comm, Tensor partial, const char* what) {
  return comm.sequence_parallel ? reduce_scatter(comm, partial, what) : all_reduce(comm, std::move(partial), what);
}
// f̄: identity | ḡ: all-gather
Tensor region_exit_bwd(const CommContext& comm, const Tensor& dout, const char* what) {
  return comm.sequence_parallel ? all_gather(comm, dout, what) : dout;
}

}  // namespace actbench
