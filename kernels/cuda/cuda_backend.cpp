// CudaBackend: the launchers of kernels/cuda/*.cu and cuBLASLt, all on the backend's own
// stream, behind the contract that kernels/backend.cpp checks for every backend. Checked here
// only what this backend alone cannot do (one dtype per op, the attention's head size).
// Host <-> device conversion happens on the host with the CPU's own rounding functions
// (runtime/dtype.hpp), so an uploaded tensor holds the same bits on both backends and no
// device temporary disturbs the allocator's statistics.
#include "kernels/cuda/cuda_backend.hpp"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_moe.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/gemm.hpp"
#include "runtime/error.hpp"
#include "runtime/timing.hpp"

#if ACTBENCH_HAVE_NCCL
#include <nccl.h>
#endif

#ifndef ACTBENCH_CUDA_SIM
#define ACTBENCH_CUDA_SIM 0  // 1: built against the CPU simulator (tools/cudasim/sim_backend.cmake)
#endif

namespace actbench {
namespace {

constexpr size_t kGemmWorkspaceBytes = 32u << 20;

// Segments of the caching allocator. A failed cudaMalloc is "not available" (nullptr: the
// allocator flushes its cache and retries, then reports OutOfMemory), and its error is
// cleared so that the next launch check does not report it.
class CudaSource final : public RawMemorySource {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    CUDA_CHECK(err);
    return p;
  }
  // Called from the allocator's destructor too, so it never throws; at process exit the
  // runtime may already be unloading, which is not worth a word.
  void release(void* ptr, size_t) override {
    // A segment goes back only when all its blocks are free, but a freed block may still be
    // read or written by kernels queued on the stream (the allocator frees on the host, in
    // stream order). cudaFree only "may" synchronise (CUDA docs), so wait for the device here:
    // this runs on empty_cache(), the OOM retry and the allocator's destructor, never per op.
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();  // cudaFree reports it
    const cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      if (err != cudaErrorCudartUnloading)
        std::fprintf(stderr, "actbench: warning: cudaFree: %s\n", cudaGetErrorString(err));
    }
  }
  Device device() const override { return Device::cuda; }
};

int current_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// The kernels are instantiated per storage dtype: the float tensors of one op share one dtype
// (the contract lets the cpu mix them).
DType one_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype();
  for (const Tensor* t : ts)
    if (t->dtype() != dt)
      throw InvalidArgument(std::string(op) + ": the cuda backend needs one dtype for these tensors, got " +
                            dtype_name(dt) + " and " + dtype_name(t->dtype()));
  return dt;
}

std::string cuda_version_string(int v) {  // 12040 -> "12.4"
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(size_t capacity)
      : Backend(std::make_unique<CachingAllocator>(std::make_unique<CudaSource>(), capacity)),
        device_(current_device()) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;
    CUDA_CHECK(cudaStreamCreate(&stream_));
    try {
      // Once, from the caching allocator: the workspace is part of what the device holds.
      gemm_workspace_ = empty({static_cast<int64_t>(kGemmWorkspaceBytes)}, DType::u8);
      gemm_ = std::make_unique<cuda::LtGemm>(gemm_workspace_.data(), kGemmWorkspaceBytes);
    } catch (...) {
      cudaStreamDestroy(stream_);
      throw;
    }
  }
  ~CudaBackend() override {
    // No throwing from here: errors of the last work surface at the last synchronize().
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    gemm_workspace_ = Tensor();
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  bool computes() const override { return true; }
  bool simulated() const override { return ACTBENCH_CUDA_SIM != 0; }
  cudaStream_t stream() const { return stream_; }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // ---- timing ---------------------------------------------------------------------------
  Mark mark() override {
    cudaEvent_t ev = nullptr;
    CUDA_CHECK(cudaEventCreate(&ev));
    Mark m;
    m.event = std::shared_ptr<void>(ev, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
    CUDA_CHECK(cudaEventRecord(ev, stream_));
    m.host_ms = host_now_ms();  // when the mark was enqueued, not when the GPU reached it
    return m;
  }
  double ms_between(const Mark& begin, const Mark& end) override {
    if (!begin.event || !end.event) return end.host_ms - begin.host_ms;
    auto b = static_cast<cudaEvent_t>(begin.event.get()), e = static_cast<cudaEvent_t>(end.event.get());
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventSynchronize(e));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, b, e));
    return static_cast<double>(ms);
  }
  Versions versions() const override {
    Versions v;
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess) v.driver = cuda_version_string(driver);
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) v.cuda_runtime = cuda_version_string(runtime);
    v.cublas = cuda::LtGemm::version();
#if ACTBENCH_HAVE_NCCL
    int nccl = 0;
    if (ncclGetVersion(&nccl) == ncclSuccess)  // >= 2.9: major * 10000 + minor * 100 + patch
      v.nccl = std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100);
#endif
#if ACTBENCH_CUDA_SIM
    // The interfaces the simulator and the stand-ins implement, never a driver or library.
    v.driver = "none (cudasim)";
    v.cuda_runtime += " (cudasim)";
    v.cublas += " (stand-in)";
    if (!v.nccl.empty()) v.nccl += " (stand-in)";
#endif
    return v;
  }
  GpuState gpu_state() const override {
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    return read_gpu_state(bus_id);
  }
  void profiling(bool on) override {
    // Outside a profiler these return cudaSuccess or a harmless "not initialized"; never fatal.
    (void)(on ? cudaProfilerStart() : cudaProfilerStop());
    (void)cudaGetLastError();
  }

 private:
  // The ops, on arguments that meet the contract (kernels/backend.cpp checked them).
  // ---- data movement ------------------------------------------------------------------
  void fill_zero_impl(const Tensor& t) override {
    if (t.bytes()) CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.bytes(), stream_));
  }
  void copy_impl(const Tensor& src, const Tensor& dst) override {
    if (src.bytes() && src.data() != dst.data())
      CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice, stream_));
  }
  void upload_impl(const float* host, const Tensor& dst) override {
    if (!dst.bytes()) return;
    if (dst.dtype() == DType::fp32) {
      CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, dst.bytes(), cudaMemcpyHostToDevice, stream_));
    } else {
      std::vector<unsigned char> staged(dst.bytes());
      for (int64_t i = 0; i < dst.numel(); ++i) store_from_float(staged.data(), dst.dtype(), static_cast<size_t>(i), host[i]);
      CUDA_CHECK(cudaMemcpyAsync(dst.data(), staged.data(), dst.bytes(), cudaMemcpyHostToDevice, stream_));
    }
    // The host buffer may go away when we return.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download_impl(const Tensor& src, float* host) override {
    if (!src.bytes()) return;
    if (src.dtype() == DType::fp32) {
      CUDA_CHECK(cudaMemcpyAsync(host, src.data(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    std::vector<unsigned char> staged(src.bytes());
    CUDA_CHECK(cudaMemcpyAsync(staged.data(), src.data(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int64_t i = 0; i < src.numel(); ++i) host[i] = load_as_float(staged.data(), src.dtype(), static_cast<size_t>(i));
  }
  void add_inplace_impl(const Tensor& dst, const Tensor& src) override {
    const DType dt = one_dtype("add_inplace", {&dst, &src});
    cuda::add_inplace(dt, dst.data(), src.data(), dst.numel(), stream_);
  }

  // ---- GEMM ---------------------------------------------------------------------------
  void gemm_impl(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c) override {
    gemm_->run(g, a.dtype(), a.data(), b.dtype(), b.data(), c.dtype(), c.data(), stream_);
  }
  void add_bias_impl(const Tensor& y, const Tensor& bias) override {
    const DType dt = one_dtype("add_bias", {&y, &bias});
    const int64_t cols = bias.numel();  // >= 1 (the contract)
    cuda::add_bias(dt, y.data(), bias.data(), y.numel() / cols, cols, stream_);
  }
  void bias_grad_impl(const Tensor& dy, const Tensor& db) override {
    const DType dt = one_dtype("bias_grad", {&dy, &db});
    const int64_t cols = db.numel(), rows = dy.numel() / cols;
    Tensor ws = empty({cuda::bias_grad_workspace_floats(rows, cols)}, DType::fp32);
    cuda::bias_grad(dt, dy.data(), db.data(), ws.data_as<float>(), rows, cols, stream_);
    // ws goes back to the cache now; its next user is ordered after this kernel on stream_.
  }

  // ---- LayerNorm ----------------------------------------------------------------------
  void layernorm_fwd_impl(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y,
                          const Tensor& mean, const Tensor& rstd) override {
    const DType dt = one_dtype("layernorm_fwd", {&x, &w, &b, &y});
    const int64_t cols = w.numel(), rows = x.numel() / cols;
    cuda::layernorm_fwd(dt, x.data(), w.data(), b.data(), eps, y.data(), mean.data_as<float>(), rstd.data_as<float>(),
                        rows, cols, stream_);
  }
  void layernorm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          const Tensor& dx, const Tensor& dw, const Tensor& db) override {
    const DType dt = one_dtype("layernorm_bwd", {&dy, &x, &w, &dx, &dw, &db});
    const int64_t cols = w.numel(), rows = x.numel() / cols;
    Tensor ws = empty({cuda::layernorm_bwd_workspace_floats(rows, cols)}, DType::fp32);
    cuda::layernorm_bwd(dt, dy.data(), x.data(), w.data(), mean.data_as<float>(), rstd.data_as<float>(), dx.data(),
                        dw.data(), db.data(), ws.data_as<float>(), rows, cols, stream_);
  }

  // ---- softmax ------------------------------------------------------------------------
  void softmax_causal_fwd_impl(const Tensor& s, const Tensor& p, const SeqPositions& rows) override {
    const DType dt = one_dtype("softmax_causal_fwd", {&s, &p});
    const int64_t cols = s.dim(-1);
    cuda::softmax_causal_fwd(dt, s.data(), p.data(), cols ? s.numel() / cols : 0, s.dim(-2), cols, rows, stream_);
  }
  void softmax_causal_bwd_impl(const Tensor& dp, const Tensor& p, const Tensor& ds, const SeqPositions& rows) override {
    const DType dt = one_dtype("softmax_causal_bwd", {&dp, &p, &ds});
    const int64_t cols = p.dim(-1);
    cuda::softmax_causal_bwd(dt, dp.data(), p.data(), ds.data(), cols ? p.numel() / cols : 0, p.dim(-2), cols, rows,
                             stream_);
  }

  // ---- dropout ------------------------------------------------------------------------
  void dropout_fwd_impl(const Tensor& x, const DropoutSpec& spec, const Tensor& y, const Tensor& mask) override {
    const DType dt = one_dtype("dropout_fwd", {&x, &y});
    cuda::dropout_fwd(dt, x.data(), spec, y.data(), mask.data_as<uint8_t>(), stream_);
  }
  void dropout_bwd_impl(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) override {
    const DType dt = one_dtype("dropout_bwd", {&dy, &dx});
    DropoutSpec scale_of;  // the forward's 1 / (1 - p), computed the same way
    scale_of.p = p;
    cuda::dropout_bwd(dt, dy.data(), mask.data_as<uint8_t>(), scale_of.scale(), dx.data(), dy.numel(), stream_);
  }

  // ---- activations --------------------------------------------------------------------
  void gelu_fwd_impl(const Tensor& x, const Tensor& y) override {
    const DType dt = one_dtype("gelu_fwd", {&x, &y});
    cuda::gelu_fwd(dt, x.data(), y.data(), x.numel(), stream_);
  }
  void gelu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    const DType dt = one_dtype("gelu_bwd", {&dy, &x, &dx});
    cuda::gelu_bwd(dt, dy.data(), x.data(), dx.data(), x.numel(), stream_);
  }
  void squared_relu_fwd_impl(const Tensor& x, const Tensor& y) override {
    const DType dt = one_dtype("squared_relu_fwd", {&x, &y});
    cuda::squared_relu_fwd(dt, x.data(), y.data(), x.numel(), stream_);
  }
  void squared_relu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    const DType dt = one_dtype("squared_relu_bwd", {&dy, &x, &dx});
    cuda::squared_relu_bwd(dt, dy.data(), x.data(), dx.data(), x.numel(), stream_);
  }

  // ---- residual -----------------------------------------------------------------------
  void bias_dropout_residual_fwd_impl(const Tensor& x, const Tensor& bias, const Tensor& r, const DropoutSpec& spec,
                                      const Tensor& out, const Tensor& mask) override {
    const char* op = "bias_dropout_residual_fwd";
    if (!bias.defined()) {  // no bias: the elements as one row
      const DType dt = one_dtype(op, {&x, &r, &out});
      cuda::bias_dropout_residual_fwd(dt, x.data(), nullptr, r.data(), spec, out.data(), mask.data_as<uint8_t>(), 1,
                                      x.numel(), stream_);
      return;
    }
    const DType dt = one_dtype(op, {&x, &bias, &r, &out});
    const int64_t cols = bias.numel();
    cuda::bias_dropout_residual_fwd(dt, x.data(), bias.data(), r.data(), spec, out.data(), mask.data_as<uint8_t>(),
                                    x.numel() / cols, cols, stream_);
  }

  // ---- fused attention (kernels/cuda/attention.cu) ------------------------------------
  void attention_fwd_impl(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const DropoutSpec& spec,
                          const Tensor& out, const Tensor& lse, const AttentionRows& rows) override {
    const DType dt = one_dtype("attention_fwd", {&q, &k, &v, &out});
    require_v_not_wider("attention_fwd", q, v);
    const cuda::AttentionShape shape = attention_shape(q, k, rows);
    if (v.dim(2) == q.dim(2)) {
      cuda::attention_fwd(dt, q.data(), k.data(), v.data(), scale, spec, out.data(), lse.data_as<float>(), shape,
                          stream_);
      return;
    }
    // Multi-latent attention's v is narrower than q and k: the kernels run v and out padded to
    // q's head size with zero columns (exact: the padding's outputs are zero, and dropped).
    const Tensor vp = padded_heads(v, q.dim(2)), outp = empty({out.dim(0), out.dim(1), q.dim(2)}, dt);
    cuda::attention_fwd(dt, q.data(), k.data(), vp.data(), scale, spec, outp.data(), lse.data_as<float>(), shape,
                        stream_);
    unpad_heads(outp, out);
  }
  void attention_bwd_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, float scale, const DropoutSpec& spec, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const AttentionRows& rows) override {
    const char* op = "attention_bwd";
    const DType dt = one_dtype(op, {&q, &k, &v, &out, &dout, &dq, &dk, &dv});
    require_v_not_wider(op, q, v);
    const cuda::AttentionShape shape = attention_shape(q, k, rows);
    if (shape.D > cuda::kAttentionMaxHeadDim)  // before the workspace is allocated
      throw InvalidArgument(std::string(op) + ": head dim " + std::to_string(shape.D) + " is larger than " +
                            std::to_string(cuda::kAttentionMaxHeadDim) + ", the most the cuda kernels support");
    if (shape.B * shape.S == 0) return;
    // delta_i = rowsum(dO o O) and, for bf16 and fp16, the fp32 dQ accumulator: scratch from
    // the caching allocator, back to the cache on return (its next user is ordered after these
    // kernels on stream_).
    Tensor workspace = empty({cuda::attention_bwd_workspace_floats(dt, shape)}, DType::fp32);
    if (v.dim(2) == q.dim(2)) {
      cuda::attention_bwd(dt, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data_as<float>(), scale,
                          spec, dq.data(), dk.data(), dv.data(), workspace.data_as<float>(), shape, stream_);
      return;
    }
    // A narrower v (multi-latent attention) as in the forward: v, out and dO padded with zero
    // columns, so delta = rowsum(dO o O) and dP = dO·vᵀ are unchanged, and dv's padding dropped.
    const int64_t D = q.dim(2);
    const Tensor vp = padded_heads(v, D), outp = padded_heads(out, D), doutp = padded_heads(dout, D);
    const Tensor dvp = empty({dv.dim(0), dv.dim(1), D}, dt);
    cuda::attention_bwd(dt, q.data(), k.data(), vp.data(), outp.data(), doutp.data(), lse.data_as<float>(), scale,
                        spec, dq.data(), dk.data(), dvp.data(), workspace.data_as<float>(), shape, stream_);
    unpad_heads(dvp, dv);
  }
  void attention_merge_impl(const Tensor& out, const Tensor& lse, const Tensor& out_part,
                            const Tensor& lse_part) override {
    const DType dt = one_dtype("attention_merge", {&out, &out_part});
    cuda::attention_merge(dt, out.data(), lse.data_as<float>(), out_part.data(), lse_part.data_as<const float>(),
                          out.dim(0) * out.dim(1), out.dim(2), stream_);
  }

  // ---- the llama family -------------------------------------------------------------------
  void rmsnorm_fwd_impl(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) override {
    const DType dt = one_dtype("rmsnorm_fwd", {&x, &w, &y});
    const int64_t cols = w.numel(), rows = x.numel() / cols;
    cuda::rmsnorm_fwd(dt, x.data(), w.data(), eps, y.data(), rstd.data_as<float>(), rows, cols, stream_);
  }
  void rmsnorm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw) override {
    const DType dt = one_dtype("rmsnorm_bwd", {&dy, &x, &w, &dx, &dw});
    const int64_t cols = w.numel(), rows = x.numel() / cols;
    Tensor ws = empty({cuda::rmsnorm_bwd_workspace_floats(rows, cols)}, DType::fp32);
    cuda::rmsnorm_bwd(dt, dy.data(), x.data(), w.data(), rstd.data_as<float>(), dx.data(), dw.data(),
                      ws.data_as<float>(), rows, cols, stream_);
  }
  void rope_fwd_impl(const Tensor& x, double theta, int64_t rotary_dim, const Tensor& y,
                     const SeqPositions& positions) override {
    rope("rope_fwd", x, theta, rotary_dim, false, y, positions);
  }
  void rope_bwd_impl(const Tensor& dy, double theta, int64_t rotary_dim, const Tensor& dx,
                     const SeqPositions& positions) override {
    rope("rope_bwd", dy, theta, rotary_dim, true, dx, positions);
  }
  void swiglu_fwd_impl(const Tensor& x, const Tensor& y) override {
    const DType dt = one_dtype("swiglu_fwd", {&x, &y});
    const int64_t N = y.dim(-1);  // >= 1 (the contract)
    cuda::swiglu_fwd(dt, x.data(), y.data(), y.numel() / N, N, stream_);
  }
  void swiglu_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) override {
    const DType dt = one_dtype("swiglu_bwd", {&dy, &x, &dx});
    const int64_t N = dy.dim(-1);
    cuda::swiglu_bwd(dt, dy.data(), x.data(), dx.data(), dy.numel() / N, N, stream_);
  }

  // ---- attention head layout ----------------------------------------------------------
  void split_heads_impl(const Tensor& src, int64_t off, const Tensor& dst) override {
    cuda::split_heads(src.dtype(), src.data(), dst.data(), src.dim(0), src.dim(1), src.dim(2), dst.dim(1), dst.dim(3),
                      off, stream_);
  }
  void merge_heads_impl(const Tensor& src, int64_t off, const Tensor& dst) override {
    cuda::merge_heads(src.dtype(), src.data(), dst.data(), dst.dim(0), dst.dim(1), dst.dim(2), src.dim(1), src.dim(3),
                      off, stream_);
  }

  void copy_rows_impl(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows) override {
    const int64_t row_bytes = src.dim(2) * static_cast<int64_t>(src.element_size());
    cuda::copy_rows(src.data(), src.dim(1), src_row, dst.data(), dst.dim(1), dst_row, rows, src.dim(0), row_bytes,
                    stream_);
  }

  // ---- mixture of experts (kernels/cuda/moe.cu; the grouped GEMMs on cuBLASLt) ---------
  void moe_route_impl(const Tensor& logits, const Tensor& bias, const MoeRouting& routing, const Tensor& scores,
                      const Tensor& topk_index, const Tensor& topk_weight, const Tensor& aux_loss) override {
    const DType dt = bias.defined() ? one_dtype("moe_route", {&logits, &bias, &scores, &topk_weight})
                                    : one_dtype("moe_route", {&logits, &scores, &topk_weight});
    const int64_t T = logits.dim(0), E = logits.dim(1);
    Tensor ws;  // fp32 scratch of the aux loss's reduction, back to the cache on return
    if (aux_loss.defined()) ws = empty({cuda::moe_route_workspace_floats(T, E)}, DType::fp32);
    cuda::moe_route(dt, logits.data(), bias.defined() ? bias.data() : nullptr, T, E, routing, scores.data(),
                    topk_index.data_as<int32_t>(), topk_weight.data(),
                    aux_loss.defined() ? aux_loss.data_as<float>() : nullptr,
                    ws.defined() ? ws.data_as<float>() : nullptr, stream_);
  }
  void moe_route_bwd_impl(const Tensor& d_topk_weight, const Tensor& scores, const Tensor& topk_index,
                          const MoeRouting& routing, const Tensor& d_logits) override {
    const DType dt = one_dtype("moe_route_bwd", {&d_topk_weight, &scores, &d_logits});
    cuda::moe_route_bwd(dt, d_topk_weight.data(), scores.data(), topk_index.data_as<const int32_t>(), scores.dim(0),
                        scores.dim(1), routing, d_logits.data(), stream_);
  }
  void moe_dispatch_impl(const Tensor& topk_index, std::optional<double> capacity_factor,
                         const MoeDispatch& plan) override {
    const int64_t T = topk_index.dim(0), k = topk_index.dim(1), E = plan.tokens_per_expert.numel();
    const int64_t capacity = capacity_factor ? moe_expert_capacity(T, k, E, *capacity_factor) : -1;
    Tensor ws = empty({cuda::moe_dispatch_workspace_ints(T, k, E)}, DType::i32);
    cuda::moe_dispatch(topk_index.data_as<const int32_t>(), T, k, E, capacity,
                       plan.tokens_per_expert.data_as<int32_t>(), plan.row_slot.data_as<int32_t>(),
                       plan.slot_row.data_as<int32_t>(), ws.data_as<int32_t>(), stream_);
  }
  // The permute and combine kernels read the plan on the device and do not check that its
  // counts sum to the permuted tensor's rows (the cpu does; that would cost a copy to the host
  // per op): with a plan that does not fit, they never touch memory outside the tensors.
  void moe_permute_impl(const Tensor& x, const MoeDispatch& plan, const Tensor& out) override {
    cuda::moe_permute(x.element_size(), x.data(), plan.row_slot.data_as<const int32_t>(), out.dim(0), x.dim(0),
                      plan.slot_row.dim(1), x.dim(1), out.data(), stream_);
  }
  void moe_permute_bwd_impl(const Tensor& d_out, const MoeDispatch& plan, const Tensor& dx) override {
    const DType dt = one_dtype("moe_permute_bwd", {&d_out, &dx});
    cuda::moe_permute_bwd(dt, d_out.data(), plan.slot_row.data_as<const int32_t>(), d_out.dim(0), dx.dim(0),
                          plan.slot_row.dim(1), dx.dim(1), dx.data(), stream_);
  }
  void moe_unpermute_impl(const Tensor& y, const MoeDispatch& plan, const Tensor& topk_weight,
                          const Tensor& out) override {
    const DType dt = one_dtype("moe_unpermute", {&y, &topk_weight, &out});
    cuda::moe_unpermute(dt, y.data(), plan.slot_row.data_as<const int32_t>(), topk_weight.data(), y.dim(0),
                        out.dim(0), plan.slot_row.dim(1), out.dim(1), out.data(), stream_);
  }
  void moe_unpermute_bwd_impl(const Tensor& d_out, const Tensor& y, const MoeDispatch& plan,
                              const Tensor& topk_weight, const Tensor& dy, const Tensor& d_topk_weight) override {
    const DType dt = one_dtype("moe_unpermute_bwd", {&d_out, &y, &topk_weight, &dy, &d_topk_weight});
    cuda::moe_unpermute_bwd(dt, d_out.data(), y.data(), plan.slot_row.data_as<const int32_t>(), topk_weight.data(),
                            y.dim(0), d_out.dim(0), plan.slot_row.dim(1), d_out.dim(1), dy.data(),
                            d_topk_weight.data(), stream_);
  }

  void moe_weight_rows_impl(const Tensor& x, const Tensor& weight, const Tensor& y) override {
    const DType dt = one_dtype("moe_weight_rows", {&x, &weight, &y});
    cuda::moe_weight_rows(dt, x.data(), weight.data(), x.dim(0), x.dim(1), y.data(), stream_);
  }

  void moe_weight_rows_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                                const Tensor& d_weight) override {
    const DType dt = one_dtype("moe_weight_rows_bwd", {&dy, &x, &weight, &dx, &d_weight});
    cuda::moe_weight_rows_bwd(dt, dy.data(), x.data(), weight.data(), x.dim(0), x.dim(1), dx.data(), d_weight.data(),
                              stream_);
  }

  // Grouped GEMM: one cuBLASLt GEMM per expert over its rows. A GEMM's shape is a host
  // argument: the counts come from the caller's host copy (the MoE layer reads them once after
  // the dispatch, as Megatron-Core's dropless path does, and passes them to every grouped GEMM
  // of the layer) or, without one, from the device (the dispatch wrote them), at the cost of a
  // copy and a wait per call. (A device-side grouped kernel would need neither; these calls
  // keep cuBLASLt's tuned kernels and fp32 accumulation.)
  std::vector<int32_t> expert_rows(const Tensor& tokens_per_expert, int64_t rows, const char* op,
                                   const std::vector<int64_t>& host_rows) {
    if (!host_rows.empty()) return {host_rows.begin(), host_rows.end()};  // the contract checked their sum
    std::vector<int32_t> counts(static_cast<size_t>(tokens_per_expert.numel()));
    CUDA_CHECK(cudaMemcpyAsync(counts.data(), tokens_per_expert.data(), tokens_per_expert.bytes(),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    cpu::moe_plan_rows(counts.data(), static_cast<int64_t>(counts.size()), rows, op, "x");  // the cpu's check
    return counts;
  }
  void grouped_gemm_impl(const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert, const Tensor& y,
                         const std::vector<int64_t>& host_rows) override {
    const DType dt = one_dtype("grouped_gemm", {&x, &w, &y});
    const std::vector<int32_t> counts = expert_rows(tokens_per_expert, x.dim(0), "grouped_gemm", host_rows);
    const int64_t in = w.dim(1), out = w.dim(2), es = static_cast<int64_t>(dtype_size(dt));
    int64_t row = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n > 0)  // y_e [n, out] = x_e [n, in] w_e [in, out]
        gemm_->run(gemm_args(false, false, n, out, in), dt, bytes_at(x, row * in * es), dt,
                   bytes_at(w, static_cast<int64_t>(e) * in * out * es), dt, bytes_at(y, row * out * es), stream_);
      row += n;
    }
  }
  void grouped_gemm_bwd_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& tokens_per_expert,
                             const Tensor& dx, const Tensor& dw, const std::vector<int64_t>& host_rows) override {
    const DType dt = one_dtype("grouped_gemm_bwd", {&dy, &x, &w, &dx, &dw});
    const std::vector<int32_t> counts =
        expert_rows(tokens_per_expert, x.dim(0), "grouped_gemm_bwd", host_rows);
    const int64_t in = w.dim(1), out = w.dim(2), es = static_cast<int64_t>(dtype_size(dt));
    int64_t row = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      void* dw_e = bytes_at(dw, static_cast<int64_t>(e) * in * out * es);
      if (n == 0) {  // no rows, no gradient: written as zeros, like every other expert's
        CUDA_CHECK(cudaMemsetAsync(dw_e, 0, static_cast<size_t>(in * out * es), stream_));
        continue;
      }
      // dx_e [n, in] = dy_e [n, out] w_e^T;  dw_e [in, out] = x_e^T [in, n] dy_e [n, out]
      gemm_->run(gemm_args(false, true, n, in, out), dt, bytes_at(dy, row * out * es), dt,
                 bytes_at(w, static_cast<int64_t>(e) * in * out * es), dt, bytes_at(dx, row * in * es), stream_);
      gemm_->run(gemm_args(true, false, in, out, n), dt, bytes_at(x, row * in * es), dt, bytes_at(dy, row * out * es),
                 dt, dw_e, stream_);
      row += n;
    }
  }
  static void* bytes_at(const Tensor& t, int64_t offset) { return static_cast<char*>(t.data()) + offset; }

  // k, v [B / r, Sk, D] for q [B, S, D]: r query batches per key/value batch (GQA; 1 for B = 0).
  // v may be narrower than q and k (multi-latent attention), not wider.
  static void require_v_not_wider(const char* op, const Tensor& q, const Tensor& v) {
    if (v.dim(2) > q.dim(2))
      throw InvalidArgument(std::string(op) + ": v's head size " + std::to_string(v.dim(2)) + " is larger than q's " +
                            std::to_string(q.dim(2)) + "; the cuda fused kernels take v at most as wide as q and k");
  }
  // [N, R, d] rows as [N, R, D] (D >= d) with zero columns after d, scratch from the caching
  // allocator: merge_heads with one head writes columns [0, d) of each D-wide row.
  Tensor padded_heads(const Tensor& x, int64_t D) {
    const Tensor out = empty({x.dim(0), x.dim(1), D}, x.dtype());
    fill_zero_impl(out);
    if (x.numel()) cuda::merge_heads(x.dtype(), x.data(), out.data(), x.dim(0) * x.dim(1), 1, D, 1, x.dim(2), 0, stream_);
    return out;
  }
  // The first d columns of padded [N, R, D] rows into x [N, R, d].
  void unpad_heads(const Tensor& padded, const Tensor& x) {
    if (x.numel()) cuda::split_heads(x.dtype(), padded.data(), x.data(), x.dim(0) * x.dim(1), 1, padded.dim(2), 1,
                                     x.dim(2), 0, stream_);
  }
  static cuda::AttentionShape attention_shape(const Tensor& q, const Tensor& k, const AttentionRows& rows) {
    return cuda::AttentionShape{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(0) ? q.dim(0) / k.dim(0) : 1, rows};
  }

  void rope(const char* op, const Tensor& x, double theta, int64_t rotary_dim, bool inverse, const Tensor& y,
            const SeqPositions& positions) {
    const DType dt = one_dtype(op, {&x, &y});
    const int64_t D = x.dim(3);  // >= rotary_dim >= 2 (the contract)
    cuda::rope(dt, x.data(), y.data(), x.numel() / D, x.dim(2), D, rotary_dim, theta, inverse, positions, stream_);
  }

  int device_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  Tensor gemm_workspace_;
  std::unique_ptr<cuda::LtGemm> gemm_;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(size_t capacity_bytes) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw InvalidArgument(std::string("backend 'cuda': no CUDA device is available (cudaGetDeviceCount: ") +
                          cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + ")");
  }
  if (n == 0) throw InvalidArgument("backend 'cuda': no CUDA device is available (cudaGetDeviceCount returned 0)");
  return std::make_unique<CudaBackend>(capacity_bytes);
}

cudaStream_t cuda_stream_of(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) throw InvalidArgument(std::string("backend '") + backend.name() + "' has no CUDA stream");
  return cuda->stream();
}

}  // namespace actbench
