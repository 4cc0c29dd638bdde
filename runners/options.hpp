#pragma once
// Strict option values, shared by layer_run and theory: a given value is used or refused with
// one line (InvalidArgument) that names the option, never replaced by a default.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "runtime/error.hpp"

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
// "80GiB", "1.5GB", "512MiB", "1e9" (bytes): a whole number of bytes in min_bytes .. 2^63.
uint64_t parse_memory_size(const std::string& option, const std::string& text, uint64_t min_bytes = 1);

// `dir` is a writable directory or can be created (its nearest existing ancestor is a
// writable directory); otherwise InvalidArgument naming `option` and the path.
void check_output_dir(const std::string& option, const std::string& dir);

// `path` can be written whole (runtime/csv write_file_atomic: a temporary beside it, renamed
// over it): it is not a folder, FIFO or device, and its folder exists and is writable;
// otherwise InvalidArgument naming `option` and the path.
void check_output_file(const std::string& option, const std::string& path);

// `text` with its control characters written as escapes (\n, \t, \xNN), so that an error
// line quoting what a user typed stays one line.
std::string printable(const std::string& text);

// lookup() (a name lookup of the formulas, which throws without naming the option) with the
// option put in front of what it throws: "--gpu: unknown GPU 'x' (...)".
template <class F>
auto named(const std::string& option, F&& lookup) -> decltype(lookup()) {
  try {
    return lookup();
  } catch (const std::invalid_argument& e) {
    throw InvalidArgument(option + ": " + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(option + ": " + e.what());
  }
}

}  // namespace actbench
