// Source locations of code addresses (the instrumented kernels' call sites of the access
// hooks), from the line tables the kernel objects carry (-gline-tables-only), by addr2line.
// Batched: one process per module and 128 addresses, so symbolizing every access site of a
// launch costs a few processes, not one per site. Cached.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "internal.hpp"

namespace cudasim::internal {
namespace {

std::map<const void*, std::string>& cache() {
  static std::map<const void*, std::string> c;
  return c;
}

// The file a rewritten source stands for: the rewrite (src/rewrite.cpp) starts its copy with
// `#line 1 "ORIGINAL"`, and addr2line names the copy instead of ORIGINAL for code of -O0
// objects (it takes the DWARF 5 line table's file 1, which the #line names, for file 0, the
// compilation unit). Any other file is itself.
std::string original_file(const std::string& file) {
  static std::map<std::string, std::string> originals;
  auto it = originals.find(file);
  if (it != originals.end()) return it->second;
  std::string out = file;
  if (FILE* f = std::fopen(file.c_str(), "r")) {
    char first[4096];
    const std::string prefix = "#line 1 \"";
    if (std::fgets(first, sizeof first, f)) {
      std::string line = first;
      const size_t end = line.rfind('"');
      if (line.rfind(prefix, 0) == 0 && end > prefix.size()) out = line.substr(prefix.size(), end - prefix.size());
    }
    std::fclose(f);
  }
  return originals[file] = out;
}

// One answer of addr2line without " (discriminator N)"; empty when it does not know.
std::string clean(std::string line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.rfind("??", 0) == 0) return "";
  const size_t disc = line.find(" (discriminator");
  if (disc != std::string::npos) line.erase(disc);
  return line;
}

// A "file:line" answer with the original file of a rewritten source.
std::string located(const std::string& answer) {
  const size_t colon = answer.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == answer.size() ||
      answer.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    return answer;
  return original_file(answer.substr(0, colon)) + answer.substr(colon);
}

// addr2line on `module`: one answer ("file:line") per address, or two ("function",
// "file:line") with `functions`.
std::string symbolizer_command(const std::string& module, bool functions) {
  return std::string("addr2line -C ") + (functions ? "-f " : "") + "-e '" + module + "'";
}

// Runs the symbolizer on `offsets` of `module`; returns its answer lines.
std::vector<std::string> run_symbolizer(const std::string& module, const std::vector<uintptr_t>& offsets,
                                        bool functions) {
  std::vector<std::string> answers;
  if (module.empty()) return answers;
  std::string cmd = symbolizer_command(module, functions);
  for (uintptr_t o : offsets) {
    char b[32];
    std::snprintf(b, sizeof b, " %#lx", static_cast<unsigned long>(o));
    cmd += b;
  }
  cmd += " 2>/dev/null";
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f)) answers.push_back(clean(line));
    pclose(f);
  }
  return answers;
}

// Stores the answers for `pcs` (offsets in `module`, same order) in the cache.
void symbolize_batch(const std::string& module, const std::vector<const void*>& pcs,
                     const std::vector<uintptr_t>& offsets) {
  const std::vector<std::string> answers = run_symbolizer(module, offsets, false);
  for (size_t i = 0; i < pcs.size(); ++i) {
    std::string s = i < answers.size() ? located(answers[i]) : "";
    if (s.empty()) {
      char b[32];
      std::snprintf(b, sizeof b, "pc %p", pcs[i]);
      s = b;
    }
    cache()[pcs[i]] = s;
  }
}

}  // namespace

void symbolize_all(const std::vector<const void*>& pcs) {
  constexpr size_t kBatch = 128;
  std::map<std::string, std::pair<std::vector<const void*>, std::vector<uintptr_t>>> by_module;
  for (const void* pc : pcs) {
    if (cache().count(pc)) continue;
    Dl_info info{};
    std::string module;
    uintptr_t offset = 0;
    if (dladdr(pc, &info) && info.dli_fname) {
      module = info.dli_fname;
      // A return address: the call instruction ends one byte before it.
      offset = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase) - 1;
    }
    auto& [mpcs, offs] = by_module[module];
    mpcs.push_back(pc);
    offs.push_back(offset);
    if (mpcs.size() == kBatch) {
      symbolize_batch(module, mpcs, offs);
      mpcs.clear();
      offs.clear();
    }
  }
  for (auto& [module, batch] : by_module)
    if (!batch.first.empty()) symbolize_batch(module, batch.first, batch.second);
}

const void* source_site(const char* file, int line) {
  static std::map<std::pair<std::string, int>, std::unique_ptr<char>> sites;
  std::unique_ptr<char>& site = sites[{file ? file : "?", line}];
  if (!site) {
    site = std::make_unique<char>();
    cache()[site.get()] = std::string(file ? file : "?") + ":" + std::to_string(line);
  }
  return site.get();
}

std::string symbolize(const void* pc) {
  auto it = cache().find(pc);
  if (it != cache().end()) return it->second;
  symbolize_all({pc});
  return cache()[pc];
}

std::string function_name(const void* fn) {
  static std::map<const void*, std::string> names;
  auto it = names.find(fn);
  if (it != names.end()) return it->second;
  std::string name;
  Dl_info info{};
  if (dladdr(fn, &info) && info.dli_fname) {
    const uintptr_t offset = reinterpret_cast<uintptr_t>(fn) - reinterpret_cast<uintptr_t>(info.dli_fbase);
    const std::vector<std::string> answers = run_symbolizer(info.dli_fname, {offset}, true);
    if (!answers.empty()) name = answers[0];
  }
  return names[fn] = name;
}

const std::vector<SharedVariable>& static_shared_variables() {
  static const std::vector<SharedVariable> vars = [] {
    std::vector<SharedVariable> out;
    const uintptr_t lo = running.shared_lo, hi = running.shared_hi;
    Dl_info info{};
    if (lo >= hi || !dladdr(reinterpret_cast<const void*>(lo), &info) || !info.dli_fname) return out;
    // nm's values are link-time addresses; the section's start symbol ties them to this process.
    const std::string cmd = std::string("nm -S --defined-only '") + info.dli_fname + "' 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) return out;
    std::vector<std::pair<unsigned long, unsigned long>> sized;  // value, size
    unsigned long start = 0;
    bool have_start = false;
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
      // "VALUE SIZE TYPE NAME" for a sized symbol, "VALUE TYPE NAME" for a label.
      std::vector<std::string> fields;
      for (char* tok = std::strtok(line, " \t\n"); tok; tok = std::strtok(nullptr, " \t\n")) fields.push_back(tok);
      if (fields.size() == 4) {
        sized.emplace_back(std::strtoul(fields[0].c_str(), nullptr, 16), std::strtoul(fields[1].c_str(), nullptr, 16));
      } else if (fields.size() == 3 && fields[2] == "__start_cudasim_shared") {
        start = std::strtoul(fields[0].c_str(), nullptr, 16);
        have_start = true;
      }
    }
    pclose(f);
    if (!have_start) return out;
    for (const auto& [value, size] : sized) {
      const uintptr_t address = lo + (value - start);
      if (value >= start && address < hi && size > 0) out.push_back({address, size});
    }
    std::sort(out.begin(), out.end(), [](const SharedVariable& a, const SharedVariable& b) { return a.address < b.address; });
    return out;
  }();
  return vars;
}

}  // namespace cudasim::internal
