#pragma once
// layer_run's command line: parsed strictly (run_args.hpp: a given value is used or refused),
// then resolved against the preset and checked, every refusal an InvalidArgument.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layers/config.hpp"
#include "runners/hf_config.hpp"
#include "runners/layer_spec_options.hpp"
#include "runners/presets.hpp"
#include "runtime/csv.hpp"

namespace actbench {

struct LayerRunOptions {
  std::string backend, model, attention, dtype, csv, dump, cupti;
  std::string kernel_report, kernel_report_device = "h100";  // --kernel-report FILE (simulator build)
  std::vector<std::string> configs;
  int64_t hidden = 0, heads = 0, seq = 0, batch = 0;  // 0: not given, the preset's
  int tp = 0;                                          // 0: not given
  int layers = 1, warmup = 2, iters = 10;
  bool warmup_given = false, iters_given = false, emulate_tp = false;
  int cp = 1;               // --cp / --context-parallel-size: C
  bool emulate_cp = false;  // one process plays rank 0 of the C context-parallel ranks
  std::string cp_comm_type = "p2p";
  int ep = 1;               // --expert-model-parallel-size: an MoE layer's experts over ep ranks (the MPI world)
  bool emulate_ep = false;  // one process plays rank 0 of the ep ranks
  int etp = 1;              // --expert-tensor-parallel-size: 1, or tp (each expert split over the TP group)
  // --tp given equal to --expert-model-parallel-size: the experts over the tensor-parallel group
  // (each rank's sequence rows to their experts), not over data-parallel ranks.
  bool experts_over_tp() const { return ep > 1 && tp == ep && etp == 1; }
  // The ranks expert parallelism over data-parallel replicas runs on: ep/(tp·cp) replicas of the
  // tp x cp grid (etp 1), or ep/cp replicas of it (etp = tp).
  int expert_parallel_world() const { return etp > 1 ? tp * ep : ep; }
  uint64_t seed = 1234;
  double link_gbps = 450.0;
  uint64_t memory_limit = 0;  // 0: none
  std::vector<int64_t> moe_tokens_per_expert;  // meta: an MoE layer's routing (empty: balanced)
  std::string print_only;     // --help, --print-csv-header or --print-csv-schema: print this, run nothing
  // The layer's spec: --arch's preset (empty: the model's), --hf-config's model, the edits.
  std::string arch, hf_config;
  std::optional<HfModelConfig> hf;  // --hf-config's model, read while parsing (o.model is its name)
  LayerSpecEdits spec_edits;
  RecomputeFlags recompute;  // Megatron's recompute flags (one configuration instead of --config's)
};

// Parses the command line into `o` (o.print_only set for --help and the --print-* flags). With
// --hf-config the file is read here, so that ranks compare what it says (rank_agreement.hpp).
void parse_layer_run_options(int argc, char** argv, LayerRunOptions& o);

// What one call runs, resolved against the preset.
struct LayerRunPlan {
  LayerDims dims;
  std::vector<LayerPolicy> policies;  // the --config list in its order, each with --attention
  DType dtype = DType::bf16;
};

// Resolves --tp (with --emulate-tp the preset's t unless given; else the MPI world's size,
// which a given --tp must equal), the shape (the preset's, under the shape and layer-family
// flags) and the configurations, and checks the layer, the stack and the flags that need a
// particular backend, before anything is allocated. May set o.tp and o.model.
LayerRunPlan plan_layer_run(LayerRunOptions& o, int world);

// Every output, before anything runs (rank 0 writes them all): the CSVs are writable with our
// headers, no two outputs are the same path, the --dump folders can be made.
void check_outputs(const LayerRunOptions& o, const std::vector<LayerPolicy>& policies, const CsvAppender& csv,
                   const CsvAppender* cupti_csv, const CsvAppender* kernel_report_csv);

// Where --dump writes configuration p: the folder itself for one configuration, else a
// subfolder named after it.
std::string dump_dir(const LayerRunOptions& o, size_t configurations, LayerPolicy p);

}  // namespace actbench
