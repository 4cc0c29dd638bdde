#pragma once
// Megatron-LM's --pipeline-model-parallel-layout: which virtual pipeline stage holds which
// layers, written as stages separated by '|', each a run of E (the embedding), t (a decoder
// layer), m (a multi-token-prediction layer) and L (the loss), with `x*n` and `(...)*n`
// repeats and commas for readability: "Et*3|(tt|)*6tmL" is 8 stages. Stage i of the string is
// virtual stage i: pipeline rank i % p, model chunk i / p, as Megatron-Core assigns them.
#include <string>
#include <vector>

namespace actbench {

struct PipelineLayout {
  std::vector<int> stage_layers;  // decoder layers (t) of each stage, in the string's order
  int mtp_layers = 0;             // its m's, all on the last stage
  int decoder_layers() const;
};

// The layout, checked as Megatron checks it (the embedding first, the loss last, each once;
// the MTP layers after every decoder layer) and as theory memory models it (the MTP layers on
// the last stage, one loss). Throws InvalidArgument naming the flag.
PipelineLayout parse_pipeline_layout(const std::string& text);

}  // namespace actbench
