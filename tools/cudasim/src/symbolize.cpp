// Source locations of code addresses (the instrumented kernels' call sites of the access
// hooks), from the line tables the kernel objects carry (-gline-tables-only), by addr2line.
// Batched: one addr2line process per module and 128 addresses, so symbolizing every access
// site of a launch costs a few processes, not one per site. Results are cached.
#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "internal.hpp"

namespace cudasim::internal {
namespace {

std::map<const void*, std::string>& cache() {
  static std::map<const void*, std::string> c;
  return c;
}

// addr2line's answer for one address: "file:line", without " (discriminator N)"; empty when
// it does not know.
std::string clean(std::string line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.rfind("??", 0) == 0) return "";
  const size_t disc = line.find(" (discriminator");
  if (disc != std::string::npos) line.erase(disc);
  return line;
}

// Runs addr2line on `offsets` of module `file`; stores the answers for `pcs` (same order).
void run_addr2line(const std::string& file, const std::vector<const void*>& pcs, const std::vector<uintptr_t>& offsets) {
  std::string cmd = "addr2line -C -e '" + file + "'";
  for (uintptr_t o : offsets) {
    char b[32];
    std::snprintf(b, sizeof b, " %#lx", static_cast<unsigned long>(o));
    cmd += b;
  }
  cmd += " 2>/dev/null";
  std::vector<std::string> answers;
  if (FILE* f = file.empty() ? nullptr : popen(cmd.c_str(), "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f)) answers.push_back(clean(line));
    pclose(f);
  }
  for (size_t i = 0; i < pcs.size(); ++i) {
    std::string s = i < answers.size() ? answers[i] : "";
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
      run_addr2line(module, mpcs, offs);
      mpcs.clear();
      offs.clear();
    }
  }
  for (auto& [module, batch] : by_module)
    if (!batch.first.empty()) run_addr2line(module, batch.first, batch.second);
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
    char cmd[1200];
    std::snprintf(cmd, sizeof cmd, "addr2line -f -C -e '%s' %#lx 2>/dev/null", info.dli_fname,
                  static_cast<unsigned long>(reinterpret_cast<uintptr_t>(fn) - reinterpret_cast<uintptr_t>(info.dli_fbase)));
    if (FILE* f = popen(cmd, "r")) {
      char line[4096];
      if (std::fgets(line, sizeof line, f)) name = clean(line);
      pclose(f);
    }
  }
  return names[fn] = name;
}

}  // namespace cudasim::internal
