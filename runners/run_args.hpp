#pragma once
// layer_run's arguments taken strictly: a given value is used or refused with one line that
// names the option, never replaced by a preset; every element and byte count a run can
// produce is checked to fit 64 bits, and the work one run may ask for is bounded, before
// anything is allocated or written.
#include <cstdint>
#include <string>
#include <vector>

#include "layers/config.hpp"
#include "runners/options.hpp"  // parse_int_option, parse_memory_size, ...

namespace actbench {

// "baseline,sp,...": known names, no empty entries, none twice; in the given order.
std::vector<std::string> parse_config_list(const std::string& option, const std::string& text);

// More layers or iterations than any measurement needs only make a run that never ends or
// dies of host memory: refused up front.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxIterations = 1000000;

// Every element and byte count of a stack of `layers` layers of these dims (activations,
// MLP activations, attention scores, parameters with gradients, the whole stack) fits in a
// signed 64-bit integer, counted in fp32 (the widest copy any backend or --dump makes);
// otherwise InvalidArgument naming the quantity.
void check_layer_extent(const LayerDims& d, int64_t layers);

// The cpu backend holds everything in host memory: a stack whose parameters and gradients
// (12 h^2 / t per layer, each twice, in `dtype`) and saved activations (per layer, as given)
// exceed the machine's memory would be killed by the system part-way rather than report out
// of memory, so it is refused, unless a --memory-limit below the machine's memory makes it
// an out-of-memory row.
void check_host_memory(const LayerDims& d, int t, int64_t layers, DType dtype, double activation_bytes_per_layer,
                       uint64_t memory_limit);

// A 62-bit FNV-1a hash: ranks compare their arguments through it (max of h and of -h).
int64_t argument_hash(const std::string& text);

}  // namespace actbench
