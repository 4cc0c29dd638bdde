// The meta backend: every allocation is real bookkeeping in the caching allocator, over
// virtual addresses; no op touches data. The memory schedule of any shape, in milliseconds.
// Every op still passes the contract of kernels/backend.cpp first, the same checks as on cpu
// and cuda, so a meta run proves the layer's shapes as well as its bytes.
#include "kernels/backend.hpp"

namespace actbench {
namespace {

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(size_t capacity)
      : Backend(std::make_unique<CachingAllocator>(make_meta_source(), capacity)) {}
  const char* name() const override { return "meta"; }
  std::string device_name() const override { return "meta"; }
  bool computes() const override { return false; }

 private:
  void fill_zero_impl(const Tensor&) override {}
  void copy_impl(const Tensor&, const Tensor&) override {}
  void upload_impl(const float*, const Tensor&) override {}
  void download_impl(const Tensor&, float*) override {}
  void add_inplace_impl(const Tensor&, const Tensor&) override {}
  void gemm_impl(const GemmArgs&, const Tensor&, const Tensor&, const Tensor&) override {}
  void add_bias_impl(const Tensor&, const Tensor&) override {}
  void bias_grad_impl(const Tensor&, const Tensor&) override {}
  void layernorm_fwd_impl(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&, const Tensor&,
                          const Tensor&) override {}
  void layernorm_bwd_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&) override {}
  void softmax_causal_fwd_impl(const Tensor&, const Tensor&, const SeqPositions&) override {}
  void softmax_causal_bwd_impl(const Tensor&, const Tensor&, const Tensor&, const SeqPositions&) override {}
  void dropout_fwd_impl(const Tensor&, const DropoutSpec&, const Tensor&, const Tensor&) override {}
  void dropout_bwd_impl(const Tensor&, const Tensor&, float, const Tensor&) override {}
  void gelu_fwd_impl(const Tensor&, const Tensor&) override {}
  void gelu_bwd_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void squared_relu_fwd_impl(const Tensor&, const Tensor&) override {}
  void squared_relu_bwd_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void bias_dropout_residual_fwd_impl(const Tensor&, const Tensor&, const Tensor&, const DropoutSpec&, const Tensor&,
                                      const Tensor&) override {}
  void attention_fwd_impl(const Tensor&, const Tensor&, const Tensor&, float, const DropoutSpec&, const Tensor&,
                          const Tensor&, const AttentionRows&) override {}
  void attention_bwd_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          float, const DropoutSpec&, const Tensor&, const Tensor&, const Tensor&,
                          const AttentionRows&) override {}
  void rmsnorm_fwd_impl(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&) override {}
  void rmsnorm_bwd_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&) override {}
  void rope_fwd_impl(const Tensor&, double, int64_t, const Tensor&, const SeqPositions&) override {}
  void rope_bwd_impl(const Tensor&, double, int64_t, const Tensor&, const SeqPositions&) override {}
  void swiglu_fwd_impl(const Tensor&, const Tensor&) override {}
  void swiglu_bwd_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void split_heads_impl(const Tensor&, int64_t, const Tensor&) override {}
  void copy_rows_impl(const Tensor&, int64_t, const Tensor&, int64_t, int64_t) override {}
  void attention_merge_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void merge_heads_impl(const Tensor&, int64_t, const Tensor&) override {}
  void moe_route_impl(const Tensor&, const Tensor&, const MoeRouting&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) override {}
  void moe_route_bwd_impl(const Tensor&, const Tensor&, const Tensor&, const MoeRouting&, const Tensor&) override {}
  void moe_dispatch_impl(const Tensor&, std::optional<double>, const MoeDispatch&) override {}
  void moe_permute_impl(const Tensor&, const MoeDispatch&, const Tensor&) override {}
  void moe_permute_bwd_impl(const Tensor&, const MoeDispatch&, const Tensor&) override {}
  void moe_unpermute_impl(const Tensor&, const MoeDispatch&, const Tensor&, const Tensor&) override {}
  void moe_unpermute_bwd_impl(const Tensor&, const Tensor&, const MoeDispatch&, const Tensor&, const Tensor&,
                              const Tensor&) override {}
  void moe_weight_rows_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void moe_weight_rows_bwd_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void grouped_gemm_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const std::vector<int64_t>&) override {}
  void grouped_gemm_bwd_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const std::vector<int64_t>&) override {}
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(size_t capacity_bytes) { return std::make_unique<MetaBackend>(capacity_bytes); }

}  // namespace actbench
