#include "layers/saved_activations.hpp"

namespace actbench {

std::vector<SavedActivations::Entry> SavedActivations::paper_categories() const {
  return {{"ln1_input", &ln1_input},
          {"qkv_input", &qkv_input},
          {"q_latent", &q_latent},
          {"q_up_input", &q_up_input},
          {"kv_latent", &kv_latent},
          {"kv_up_input", &kv_up_input},
          {"k_pos_emb", &k_pos_emb},
          {"q_norm_input", &q_norm_input},
          {"k_norm_input", &k_norm_input},
          {"q", &q},
          {"k", &k},
          {"attn_lse", &attn_lse},
          {"softmax_out", &softmax_out},
          {"attn_dropout_mask", &attn_dropout_mask},
          {"attn_dropout_out", &attn_dropout_out},
          {"v", &v},
          {"proj_input", &proj_input},
          {"attn_residual_mask", &attn_residual_mask},
          {"ln2_input", &ln2_input},
          {"fc1_input", &fc1_input},
          {"gelu_input", &gelu_input},
          {"swiglu_input", &swiglu_input},
          {"squared_relu_input", &squared_relu_input},
          {"fc2_input", &fc2_input},
          {"moe_input", &moe_input},
          {"router_scores", &router_scores},
          {"router_topk_index", &router_topk_index},
          {"router_topk_weight", &router_topk_weight},
          {"moe_dispatch_plan", &moe_tokens_per_expert},
          {"moe_dispatch_plan", &moe_row_slot},
          {"moe_dispatch_plan", &moe_slot_row},
          {"moe_dispatch_plan", &moe_expert_counts},
          {"moe_permuted", &moe_permuted},
          {"moe_act_input", &moe_act_input},
          {"moe_permuted_probs", &moe_permuted_probs},
          {"moe_fc2_input", &moe_fc2_input},
          {"shared_act_input", &shared_act_input},
          {"shared_fc2_input", &shared_fc2_input},
          {"mlp_residual_mask", &mlp_residual_mask},
          {"layer_input", &layer_input}};
}

std::vector<SavedActivations::Entry> SavedActivations::extra_categories() const {
  return {{"ln1_mean", &ln1_mean},
          {"ln1_rstd", &ln1_rstd},
          {"q_latent_norm_mean", &q_latent_norm_mean},
          {"q_latent_norm_rstd", &q_latent_norm_rstd},
          {"kv_latent_norm_mean", &kv_latent_norm_mean},
          {"kv_latent_norm_rstd", &kv_latent_norm_rstd},
          {"q_norm_mean", &q_norm_mean},
          {"q_norm_rstd", &q_norm_rstd},   {"k_norm_mean", &k_norm_mean},   {"k_norm_rstd", &k_norm_rstd},
          {"ln2_mean", &ln2_mean},         {"ln2_rstd", &ln2_rstd}};
}

static int64_t sum_bytes(const std::vector<SavedActivations::Entry>& entries) {
  int64_t n = 0;
  for (const auto& [name, t] : entries)
    if (t->defined()) n += static_cast<int64_t>(t->bytes());
  return n;
}

int64_t SavedActivations::paper_bytes() const { return sum_bytes(paper_categories()); }
int64_t SavedActivations::extra_bytes() const { return sum_bytes(extra_categories()); }

std::vector<std::pair<std::string, int64_t>> SavedActivations::bytes_by_category(bool include_extra) const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [name, t] : paper_categories()) {
    if (!t->defined()) continue;
    if (!out.empty() && out.back().first == name)
      out.back().second += static_cast<int64_t>(t->bytes());
    else
      out.emplace_back(name, static_cast<int64_t>(t->bytes()));
  }
  if (include_extra) {
    const std::pair<const char*, std::vector<Entry>> stats[] = {
        {"ln1_stats", {{"", &ln1_mean}, {"", &ln1_rstd}}},
        {"q_latent_norm_stats", {{"", &q_latent_norm_mean}, {"", &q_latent_norm_rstd}}},
        {"kv_latent_norm_stats", {{"", &kv_latent_norm_mean}, {"", &kv_latent_norm_rstd}}},
        {"q_norm_stats", {{"", &q_norm_mean}, {"", &q_norm_rstd}}},
        {"k_norm_stats", {{"", &k_norm_mean}, {"", &k_norm_rstd}}},
        {"ln2_stats", {{"", &ln2_mean}, {"", &ln2_rstd}}}};
    for (const auto& [name, entries] : stats)
      if (int64_t bytes = sum_bytes(entries)) out.emplace_back(name, bytes);
  }
  return out;
}

}  // namespace actbench
