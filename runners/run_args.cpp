#include "runners/run_args.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "runtime/allocator.hpp"
#include "runtime/error.hpp"

namespace actbench {
namespace {

[[noreturn]] void refuse(const std::string& what) { throw InvalidArgument(what); }

void require_text(const std::string& option, const std::string& text) {
  if (text.empty()) refuse(option + " needs a value (got an empty string)");
}

std::string quoted(const std::string& text) { return "'" + text + "'"; }

int64_t checked_mul(int64_t a, int64_t b, const std::string& quantity, const std::string& operands) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) refuse(quantity + " overflows 64 bits (" + operands + ")");
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& quantity, const std::string& operands) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) refuse(quantity + " overflows 64 bits (" + operands + ")");
  return r;
}

}  // namespace

std::vector<std::string> parse_config_list(const std::string& option, const std::string& text) {
  require_text(option, text);
  std::vector<std::string> names;
  std::set<std::string> seen;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string name = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.empty()) refuse(option + " " + quoted(text) + " has an empty entry");
    parse_config(name);  // a known name, else InvalidArgument
    if (!seen.insert(name).second) refuse(option + " " + quoted(text) + " lists " + name + " twice");
    names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

void check_layer_extent(const LayerDims& d, int64_t layers) {
  const std::string sb = "seq " + std::to_string(d.s) + ", batch " + std::to_string(d.b);
  const std::string sbh = sb + ", hidden " + std::to_string(d.h);
  const int64_t tokens = checked_mul(d.s, d.b, "tokens (seq x batch)", sb);
  const int64_t act = checked_mul(tokens, d.h, "activation elements (seq x batch x hidden)", sbh);
  checked_mul(act, 4 * 4, "MLP activation bytes (seq x batch x 4 hidden, fp32)", sbh);
  const std::string bas = "batch " + std::to_string(d.b) + ", heads " + std::to_string(d.a) + ", seq " +
                          std::to_string(d.s);
  const int64_t scores = checked_mul(checked_mul(checked_mul(d.b, d.a, "attention scores (batch x heads x seq x seq)", bas),
                                                 d.s, "attention scores (batch x heads x seq x seq)", bas),
                                     d.s, "attention scores (batch x heads x seq x seq)", bas);
  checked_mul(scores, 4, "attention score bytes (batch x heads x seq x seq, fp32)", bas);
  const std::string h = "hidden " + std::to_string(d.h);
  const int64_t params = checked_add(
      checked_mul(checked_mul(d.h, d.h, "parameter elements (12 hidden^2 + 13 hidden)", h), 12,
                  "parameter elements (12 hidden^2 + 13 hidden)", h),
      checked_mul(d.h, 13, "parameter elements (12 hidden^2 + 13 hidden)", h), "parameter elements (12 hidden^2 + 13 hidden)",
      h);
  // One layer at its fullest: parameters and gradients, the paper's 34 sbh + 5 as^2b of
  // activations with room for transients, all counted in fp32.
  const std::string all = sbh + ", heads " + std::to_string(d.a);
  const char* layer_bytes = "bytes of one layer (parameters, gradients and activations)";
  const int64_t per_layer =
      checked_mul(checked_add(checked_add(checked_mul(params, 2, layer_bytes, all), checked_mul(act, 40, layer_bytes, all),
                                          layer_bytes, all),
                              checked_mul(scores, 6, layer_bytes, all), layer_bytes, all),
                  4, layer_bytes, all);
  {
    // The MLP (fc1 has up to 2F outputs per token) and its weights (up to 2F h + F h), in fp32.
    const std::string f = sbh + ", ffn_hidden " + std::to_string(d.ffn());
    checked_mul(checked_mul(tokens, d.ffn(), "SwiGLU activation elements (seq x batch x 2 ffn_hidden)", f), 2 * 4,
                "SwiGLU activation bytes (seq x batch x 2 ffn_hidden, fp32)", f);
    checked_mul(checked_mul(checked_mul(d.h, d.ffn(), "MLP weight elements (3 hidden x ffn_hidden)", f), 3,
                            "MLP weight elements (3 hidden x ffn_hidden)", f),
                2 * 4, "MLP weight and gradient bytes (3 hidden x ffn_hidden, fp32)", f);
  }
  checked_mul(per_layer, layers, "bytes of the stack (--layers x one layer)",
              "--layers " + std::to_string(layers) + ", " + std::to_string(per_layer) + " bytes per layer");
}

void check_host_memory(const LayerDims& d, int t, int64_t layers, DType dtype, double activation_bytes_per_layer,
                       uint64_t memory_limit) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;  // unknown: nothing to compare with
  const long double host = static_cast<long double>(pages) * page;
  if (memory_limit > 0 && memory_limit < host) return;  // the emulated device runs out first
  const long double params = (12.0L * d.h * d.h + 13.0L * d.h) / t;
  const long double bytes =
      (params * 2 * static_cast<long double>(dtype_size(dtype)) + activation_bytes_per_layer) * layers;
  if (bytes > host) {
    auto text = [](long double b) { return format_bytes(static_cast<int64_t>(std::min(b, 0x1p62L))); };
    refuse("the cpu backend would hold " + text(bytes) + " of parameters, gradients and activations per rank (--layers " +
           std::to_string(layers) + "), more than this machine's " + text(host) +
           " of memory; use --backend meta, a smaller shape or a --memory-limit");
  }
}

int64_t argument_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 2);
}

}  // namespace actbench
