#pragma once
// layer_run's arguments taken strictly: a given value is used or refused with one line that
// names the option, never replaced by a preset; every element and byte count a run can
// produce is checked to fit 64 bits, and the work one run may ask for is bounded, before
// anything is allocated or written.
#include <cstdint>
#include <string>
#include <vector>

#include "layers/config.hpp"

namespace actbench {

// The whole text must be the integer (no blanks, no '+', no fraction) and lie in [min, max].
int64_t parse_int_option(const std::string& option, const std::string& text, int64_t min, int64_t max);
// 0 .. 2^64 - 1, refused (not wrapped) outside.
uint64_t parse_uint64_option(const std::string& option, const std::string& text);
// A finite real number, the whole text.
double parse_real_option(const std::string& option, const std::string& text);
// The one spelling of a float value (the row's dropout, layer.json's): the shortest "%.{p}g",
// p = 1..9, that reads back as the same float the way --dropout is read (text -> double ->
// float). The sweep (runners/number_text.py, float32_text) spells its points' keys by the same
// rule, so a point's row is found again whatever digits its plan gave ("%g" alone cut 0.1234567
// to 0.123457).
std::string float32_text(float v);
// "80GiB", "1.5GB", "512MiB", "1e9" (bytes): a whole number of bytes in 1 .. 2^63.
uint64_t parse_memory_size(const std::string& option, const std::string& text);
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

// `dir` is a writable directory or can be created (its nearest existing ancestor is a
// writable directory); otherwise InvalidArgument naming `option` and the path.
void check_output_dir(const std::string& option, const std::string& dir);

// A 62-bit FNV-1a hash: ranks compare their arguments through it (max of h and of -h).
int64_t argument_hash(const std::string& text);

}  // namespace actbench
