#include "runners/pipeline_layout.hpp"

#include <numeric>
#include <regex>

#include "runners/options.hpp"  // printable
#include "runtime/error.hpp"

namespace actbench {
namespace {

const char* const kFlag = "--pipeline-model-parallel-layout";
constexpr size_t kMaxExpanded = 1 << 20;  // symbols after the repeats are unrolled

[[noreturn]] void refuse(const std::string& text, const std::string& problem) {
  throw InvalidArgument(std::string(kFlag) + " " + printable(text) + ": " + problem);
}

// Replaces each match of `pattern` (group 1 the repeated text, group 2 the count) by its copies.
std::string unroll(const std::string& in, const std::regex& pattern, const std::string& original) {
  std::string out;
  auto from = in.cbegin();
  for (std::sregex_iterator it(in.begin(), in.end(), pattern), end; it != end; ++it) {
    const std::smatch& m = *it;
    out.append(from, m[0].first);
    const std::string count = m[2].str();
    if (count.size() > 6) refuse(original, "a repeat count of " + count + " is too large");
    for (long n = std::stol(count); n > 0; --n) {
      out += m[1].str();
      if (out.size() > kMaxExpanded) refuse(original, "unrolls to more than a million layers");
    }
    from = m[0].second;
  }
  out.append(from, in.cend());
  return out;
}

}  // namespace

int PipelineLayout::decoder_layers() const { return std::accumulate(stage_layers.begin(), stage_layers.end(), 0); }

PipelineLayout parse_pipeline_layout(const std::string& text) {
  // Commas are cosmetic (Megatron drops them); backslashes and blanks are what a launcher's
  // quoting leaves around '|' and the parentheses.
  std::string s;
  for (char c : text)
    if (c != ',' && c != '\\' && c != ' ' && c != '\t') s += c;
  static const std::regex group(R"(\(([^)]+)\)\*([0-9]+))"), symbol(R"((.)\*([0-9]+))");
  s = unroll(unroll(s, group, text), symbol, text);
  PipelineLayout out;
  out.stage_layers.push_back(0);
  int embeddings = 0, losses = 0;
  bool decoder_after_mtp = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool last_stage = s.find('|', i) == std::string::npos;
    switch (c) {
      case '|': out.stage_layers.push_back(0); break;
      case 't':
        ++out.stage_layers.back();
        decoder_after_mtp |= out.mtp_layers > 0;
        break;
      case 'E':
        if (i != 0) refuse(text, "the embedding (E) must come first, once");
        ++embeddings;
        break;
      case 'L':
        if (i + 1 != s.size()) refuse(text, "the loss (L) must come last, once (a loss split over stages is not modelled)");
        ++losses;
        break;
      case 'm':
        if (!last_stage) refuse(text, "MTP layers (m) on a stage before the last are not modelled by theory memory");
        ++out.mtp_layers;
        break;
      default:
        refuse(text, std::string("'") + printable(std::string(1, c)) +
                         "' is not a layer: E (embedding), t (decoder), m (MTP), L (loss), | between stages");
    }
  }
  if (embeddings != 1 || losses != 1) refuse(text, "needs the embedding (E) first and the loss (L) last");
  if (decoder_after_mtp) refuse(text, "decoder layers (t) must come before the MTP layers (m)");
  return out;
}

}  // namespace actbench
