#include "runners/rank_agreement.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "runners/run_args.hpp"
#include "runtime/error.hpp"
#include "runtime/provenance.hpp"

namespace actbench {
namespace {

// How long a rank that failed alone waits for its peers to take its verdict before it ends
// the job: peers that failed at the same point arrive within moments (an allocation that
// fails on one rank fails on all, perhaps one operation later on a slower rank).
constexpr double kFailureWaitSeconds = 3.0, kOutOfMemoryWaitSeconds = 10.0;

void say(const Failure& f) {
  std::fprintf(stderr, "%s\n", f.line.c_str());
  std::fflush(stderr);
}

// Offers this rank's failure (if any) to every rank; slot 0 of `slots` carries the verdict,
// the rest any payload. When some rank failed, the lowest failing rank prints its line and
// every rank throws AgreedExit with that rank's status. Returns false (nothing thrown) when
// the peers did not all join within timeout_s (< 0: wait).
bool agree(Communicator& world, const Failure& mine, int64_t* slots, double timeout_s = -1) {
  const int64_t n = world.size(), rank = world.rank();
  // The max picks the lowest failing rank; its status rides in the low byte.
  slots[0] = mine.code ? ((n - rank) << 8) | mine.code : 0;
  if (!mpi_agree_max(slots, timeout_s)) return false;
  if (slots[0] == 0) return true;
  const int64_t speaker = n - (slots[0] >> 8);
  if (speaker == rank) say(mine);
  throw AgreedExit{static_cast<int>(slots[0] & 0xff)};
}

}  // namespace

Failure current_failure() {
  auto one_line = [](std::string s) {
    for (char& c : s)
      if (c == '\n' || c == '\r') c = ' ';
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  };
  try {
    throw;
  } catch (const InvalidArgument& e) {
    return {2, "layer_run: error: " + one_line(e.what())};
  } catch (const OutOfMemory& e) {
    return {3, "layer_run: out of memory outside a measurement: " + one_line(e.what())};
  } catch (const std::exception& e) {
    return {1, "layer_run: failure: " + one_line(e.what())};
  } catch (...) {
    return {1, "layer_run: failure: unknown exception"};
  }
}

void Verdicts::offer(const Failure& mine) {
  int64_t slots[kAgreeSlots] = {};
  agree(*world_, mine, slots);
}

void Verdicts::same_arguments(const std::vector<std::pair<std::string, std::string>>& options) {
  if (!world_) return;
  // Each option takes two slots (its hash and the negated hash: the max of both is the
  // max and the min of the ranks' hashes); options beyond one round's slots take more rounds.
  constexpr size_t kPerRound = (kAgreeSlots - 1) / 2;
  for (size_t first = 0; first < options.size(); first += kPerRound) {
    const size_t count = std::min(kPerRound, options.size() - first);
    int64_t slots[kAgreeSlots] = {};
    for (size_t i = 0; i < count; ++i) {
      const int64_t h = argument_hash(options[first + i].second);
      slots[1 + 2 * i] = h;
      slots[2 + 2 * i] = -h;
    }
    agree(*world_, {}, slots);
    for (size_t i = 0; i < count; ++i)
      if (slots[1 + 2 * i] != -slots[2 + 2 * i]) {
        if (world_->rank() == 0)
          say({2, "layer_run: error: the ranks were given different " + options[first + i].first +
                      " (every rank must get the same arguments)"});
        throw AgreedExit{2};
      }
  }
}

void Verdicts::same_status(ExperimentResult& r) {
  if (!world_) return;
  const bool oom = r.status == "oom";
  int64_t slots[kAgreeSlots] = {};
  slots[1] = oom ? world_->size() - world_->rank() : 0;  // the lowest rank out of memory
  if (!agree(*world_, {}, slots, oom ? kOutOfMemoryWaitSeconds : -1)) {
    say({3, "layer_run: out of memory on rank " + std::to_string(world_->rank()) +
                " alone (the other ranks cannot go on): " + r.message});
    mpi_abort_if_initialized(3);
  }
  if (slots[1] && !oom) {
    r = ExperimentResult{};
    r.status = "oom";
    r.message = "out of memory on rank " + std::to_string(world_->size() - slots[1]);
  }
}

int Verdicts::exit_code(int mine) {
  if (!world_) return mine;
  int64_t slots[kAgreeSlots] = {};
  slots[1] = mine;
  agree(*world_, {}, slots);
  return static_cast<int>(slots[1]);
}

int fail(Communicator* world) {
  const Failure mine = current_failure();
  if (world && world->size() > 1) {
    int64_t slots[kAgreeSlots] = {};
    try {
      if (agree(*world, mine, slots, kFailureWaitSeconds)) return mine.code;  // not reached: a failure throws
    } catch (const AgreedExit& e) {
      return e.code;
    } catch (...) {  // MPI itself failed: nothing left to agree with
    }
    say(mine);
    mpi_abort_if_initialized(mine.code);
    return mine.code;
  }
  say(mine);
  return mine.code;
}

namespace {

std::string exact_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

// What a --hf-config file says, not its name: ranks started in different working folders read
// different files under one name. Every field of the model and of its layer, exactly.
std::string hf_config_contents(const std::optional<HfModelConfig>& c) {
  if (!c) return "";
  const theory::TransformerModel& m = c->model;
  const theory::LayerSpec& s = m.layer;
  auto code = [](auto e) { return static_cast<double>(static_cast<int>(e)); };
  std::string text = m.name;
  for (double v : {m.h, m.a, m.L, m.vocab, m.vocab_divisible_by, m.seq, m.max_positions, code(m.learned_positions),
                   code(m.tied_embeddings), code(s.normalization), s.norm_epsilon, code(s.qk_layernorm),
                   code(s.activation), s.ffn_hidden, code(s.add_bias_linear), code(s.add_qkv_bias), s.kv_heads,
                   s.kv_channels, code(s.position), s.rotary_percent, s.rotary_base, s.attention_dropout,
                   s.hidden_dropout})
    text.append(" ").append(exact_text(v));
  const theory::MoeSpec& e = s.moe;
  const theory::MlaSpec& l = s.mla;
  for (double v : {e.num_experts, e.top_k, e.ffn_hidden, e.shared_ffn_hidden, code(e.score), code(e.pre_softmax),
                   e.scaling, e.num_groups, e.group_top_k, code(e.expert_bias), e.capacity_factor, code(l.enabled),
                   l.q_lora_rank, l.kv_lora_rank, l.qk_head_dim, l.qk_pos_emb_head_dim, l.v_head_dim})
    text.append(" ").append(exact_text(v));
  text += " moe layers ";
  for (bool moe : m.moe_layers) text += moe ? '1' : '0';
  return text;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> normalized(const LayerRunOptions& o) {
  auto given = [](int64_t v) { return v ? std::to_string(v) : std::string("preset"); };
  auto real = exact_text;
  std::string configs;
  for (const std::string& c : o.configs) configs += (configs.empty() ? "" : ",") + c;
  std::vector<std::pair<std::string, std::string>> out = {{"layer_run build (git sha)", build_git_sha()},
          {"--help/--print-csv-header/--print-csv-schema", o.print_only},
          {"--backend", o.backend},
          {"--model", o.model},
          {"--hidden", given(o.hidden)},
          {"--heads", given(o.heads)},
          {"--seq", given(o.seq)},
          {"--batch", given(o.batch)},
          {"--tp", given(o.tp)},
          {"--emulate-tp", o.emulate_tp ? "1" : "0"},
          {"--cp", std::to_string(o.cp)},
          {"--cp-comm-type", o.cp_comm_type},
          {"--emulate-cp", o.emulate_cp ? "1" : "0"},
          {"--config", configs},
          {"--attention", o.attention},
          {"--dtype", o.dtype},
          {"--layers", std::to_string(o.layers)},
          {"--warmup", o.warmup_given ? std::to_string(o.warmup) : "default"},
          {"--iters", o.iters_given ? std::to_string(o.iters) : "default"},
          {"--seed", std::to_string(o.seed)},
          {"--link-gbps", real(o.link_gbps)},
          {"--memory-limit", std::to_string(o.memory_limit)},
          {"--csv", o.csv},
          {"--dump", o.dump},
          {"--cupti", o.cupti},
          {"--kernel-report", o.kernel_report},
          {"--kernel-report-device", o.kernel_report_device},
          {"--arch", o.arch},
          {"--hf-config contents", hf_config_contents(o.hf)}};
  for (const auto& entry : layer_spec_edits_text(o.spec_edits)) out.push_back(entry);
  for (const auto& entry : recompute_flags_text(o.recompute)) out.push_back(entry);
  return out;
}

}  // namespace actbench
