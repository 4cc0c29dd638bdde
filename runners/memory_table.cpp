#include "runners/memory_table.hpp"

namespace actbench::tables {

const std::vector<MemoryColumn>& memory_columns() {
  using S = theory::StageMemory;
  static const std::vector<MemoryColumn> columns = {
      {"stage", "", "pipeline stage, 0 (the embedding) to p - 1 (the output layer and loss)",
       [](const S& s) { return std::to_string(s.stage); }},
      {"layers", "", "transformer layers on the stage, all its virtual stages",
       [](const S& s) { return std::to_string(s.layers); }},
      {"parameters", "", "parameters on one GPU of the stage (split ones / t, norms and row-parallel biases whole)",
       [](const S& s) { return fmt_bytes(s.parameters); }},
      {"expert_parameters", "", "of them, the routed experts' (E/ep experts per GPU, each split over etp); 0 without experts",
       [](const S& s) { return fmt_bytes(s.expert_parameters); }},
      {"rest_bytes", "bytes", "allocated between steps: weight_bytes + grad_bytes + optimizer_bytes + workspace_bytes + fp8_weight_bytes",
       [](const S& s) { return fmt_bytes(s.rest_bytes); }},
      {"peak_bytes", "bytes", "allocated at the run's peak: the larger of step_peak_bytes and setup_peak_bytes",
       [](const S& s) { return fmt_bytes(s.peak_bytes); }},
      {"step_peak_bytes", "bytes", "allocated at a training step's peak: rest_bytes + every term below at that moment",
       [](const S& s) { return fmt_bytes(s.step_peak_bytes); }},
      {"setup_peak_bytes", "bytes", "allocated before the first step: weights and gradients, with the distributed optimizer the last model chunk's weights twice",
       [](const S& s) { return fmt_bytes(s.setup_peak_bytes); }},
      {"weight_bytes", "bytes", "the parameters in the training precision (bf16/fp16: 2 bytes, fp32: 4), / data-parallel size when Megatron-FSDP shards them",
       [](const S& s) { return fmt_bytes(s.weight_bytes); }},
      {"grad_bytes", "bytes", "the main_grad buffer (fp32 with bf16), whole on every data-parallel rank unless Megatron-FSDP shards the gradients",
       [](const S& s) { return fmt_bytes(s.grad_bytes); }},
      {"optimizer_bytes", "bytes", "fp32 master copy and Adam's moments, / data-parallel size with the distributed optimizer or Megatron-FSDP",
       [](const S& s) { return fmt_bytes(s.optimizer_bytes); }},
      {"workspace_bytes", "bytes", "library workspaces held from the first step on: cuBLAS's and Transformer Engine's (modelled sizes)",
       [](const S& s) { return fmt_bytes(s.workspace_bytes); }},
      {"fp8_weight_bytes", "bytes", "with --fp8-format: Transformer Engine's FP8 copies of the GEMM weights (rowwise and columnwise, and the recipe's scales), kept between steps",
       [](const S& s) { return fmt_bytes(s.fp8_weight_bytes); }},
      {"microbatches_in_flight", "", "chunk-micro-batches whose forward has run and backward not, at the peak",
       [](const S& s) { return std::to_string(s.microbatches_in_flight); }},
      {"activation_bytes", "bytes", "their layers' saved tensors (the per-layer closed forms, norm statistics included)",
       [](const S& s) { return fmt_bytes(s.activation_bytes); }},
      {"embedding_bytes", "bytes", "their token ids, position ids and embedding dropout masks (first stage)",
       [](const S& s) { return fmt_bytes(s.embedding_bytes); }},
      {"output_bytes", "bytes", "their final norm input, output layer input and fp32 loss softmax (last stage)",
       [](const S& s) { return fmt_bytes(s.output_bytes); }},
      {"recompute_working_set_bytes", "bytes", "what recompute rebuilds for the layer whose backward runs at the peak",
       [](const S& s) { return fmt_bytes(s.recompute_working_set_bytes); }},
      {"grad_working_set_bytes", "bytes", "gradients that layer's backward holds at once (modelled, not measured)",
       [](const S& s) { return fmt_bytes(s.grad_working_set_bytes); }},
      {"loss_working_set_bytes", "bytes", "the loss's transient (16-bit logits beside their fp32 copy; more under native cross-entropy fusion), when the peak is at the loss",
       [](const S& s) { return fmt_bytes(s.loss_working_set_bytes); }},
      {"embedding_grad_bytes", "bytes", "the embedding's dense weight gradient, when the peak is at its backward",
       [](const S& s) { return fmt_bytes(s.embedding_grad_bytes); }},
      {"fsdp_gathered_weight_bytes", "bytes", "Megatron-FSDP's all-gathered weights at the peak: the non-layer ones, the running and the prefetched layer's; 0 unless the weights are sharded",
       [](const S& s) { return fmt_bytes(s.fsdp_gathered_weight_bytes); }},
      {"fsdp_unsharded_grad_bytes", "bytes", "Megatron-FSDP's gradients not yet reduce-scattered at the peak: the running layer's, the output layer's; 0 unless the gradients are sharded",
       [](const S& s) { return fmt_bytes(s.fsdp_unsharded_grad_bytes); }},
      {"peak_at", "", "the pipeline op at the peak: forward|backward mb N chunk C",
       [](const S& s) { return s.peak_at; }},
  };
  return columns;
}

Table memory_table(const std::vector<theory::StageMemory>& stages) {
  Table t;
  for (const MemoryColumn& c : memory_columns()) t.header.push_back(c.name);
  for (const theory::StageMemory& s : stages) {
    std::vector<std::string> row;
    for (const MemoryColumn& c : memory_columns()) row.push_back(c.cell(s));
    t.add(row);
  }
  return t;
}

}  // namespace actbench::tables
