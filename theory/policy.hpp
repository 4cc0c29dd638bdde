#pragma once
// How a layer is run: what it recomputes, whether sequence parallelism splits what tensor
// parallelism cannot, and which attention it uses. The layers run it; theory's formulas take
// it. It lives in theory/ so that both can: layers links theory, never the other way round.
#include <string>
#include <vector>

namespace actbench {

enum class Recompute { none, selective, full };

// unfused: the paper's core attention (scores, softmax, dropout mask stored or recomputed);
// fused: FlashAttention-style, only the output and a per-row log-sum-exp are kept.
enum class Attention { unfused, fused };

struct LayerPolicy {
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  Attention attention = Attention::unfused;
  bool operator==(const LayerPolicy&) const = default;
};

// The paper's rows: baseline, sp, full, selective, selective+sp; also full+sp (the input
// checkpoint stored as its sequence shard, Megatron's --distribute-saved-activations), which
// the paper does not measure. The names leave the attention out: it is set on its own.
LayerPolicy parse_config(const std::string& name);  // throws InvalidArgument
std::string config_name(LayerPolicy p);
// The paper's five in the canonical order (layer_run's default), then every name parse_config takes.
const std::vector<std::string>& paper_config_names();
const std::vector<std::string>& config_names();
const char* recompute_name(Recompute r);
const char* attention_name(Attention a);
Attention parse_attention(const std::string& name);  // "unfused" | "fused"; throws InvalidArgument

}  // namespace actbench
