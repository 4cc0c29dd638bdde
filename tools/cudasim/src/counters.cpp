// Memory-access counters (include/cudasim/counters.hpp): what Nsight Compute's L1TEX metrics
// count, from the accesses the instrumentation hooks (race.cpp) see.
//
// Grouping: every access is keyed by the lane's converged stretch (the block's barrier epoch
// and the warp's full-collective epoch at the access), its site (call site of the hook, load or
// store, global or shared) and k, the number of times the lane has executed that site in that
// stretch. The lanes of a warp with the same key are one request: the k-th execution of one
// instruction by the warp. A stretch is complete, and its groups are counted, when the barrier
// that ends it releases, when a collective naming every live lane of the warp completes, or
// when the warp's last lane exits; the key makes the result independent of the schedule.
#include "cudasim/counters.hpp"

#include <algorithm>
#include <bitset>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <unordered_map>

#include "internal.hpp"

#ifndef CUDASIM_SOURCE_ROOT
#define CUDASIM_SOURCE_ROOT ""
#endif

namespace cudasim {

AccessCounts& AccessCounts::operator+=(const AccessCounts& o) {
  global_ld_requests += o.global_ld_requests;
  global_ld_sectors += o.global_ld_sectors;
  global_ld_bytes += o.global_ld_bytes;
  global_st_requests += o.global_st_requests;
  global_st_sectors += o.global_st_sectors;
  global_st_bytes += o.global_st_bytes;
  global_ld_ideal_sectors += o.global_ld_ideal_sectors;
  global_st_ideal_sectors += o.global_st_ideal_sectors;
  shared_ld_requests += o.shared_ld_requests;
  shared_ld_wavefronts += o.shared_ld_wavefronts;
  shared_ld_bank_conflicts += o.shared_ld_bank_conflicts;
  shared_st_requests += o.shared_st_requests;
  shared_st_wavefronts += o.shared_st_wavefronts;
  shared_st_bank_conflicts += o.shared_st_bank_conflicts;
  return *this;
}
double AccessCounts::global_ld_sectors_per_request() const {
  return global_ld_requests ? static_cast<double>(global_ld_sectors) / static_cast<double>(global_ld_requests) : 0.0;
}
double AccessCounts::global_st_sectors_per_request() const {
  return global_st_requests ? static_cast<double>(global_st_sectors) / static_cast<double>(global_st_requests) : 0.0;
}

const LineCounts* LaunchCounts::find_line(const std::string& suffix) const {
  for (const LineCounts& l : lines) {
    const std::string s = l.file + ":" + std::to_string(l.line);
    if (s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) return &l;
  }
  return nullptr;
}

namespace internal {
namespace {

constexpr int kWarpSize = 32;
constexpr size_t kSectorBytes = 32, kWordBytes = 4, kBanks = 32;

struct LaneAccess {
  uintptr_t addr;
  uint32_t size;
};
// The lanes' accesses of one warp-level request.
struct Group {
  const void* pc = nullptr;
  bool write = false, shared = false;
  uint32_t lanes = 0;  // one bit per lane present
  LaneAccess at[kWarpSize];
};
struct GroupKey {
  uint32_t bar, wsync, k;
  uintptr_t site;  // pc << 2 | write << 1 | shared
  bool operator==(const GroupKey&) const = default;
};
struct GroupKeyHash {
  size_t operator()(const GroupKey& g) const {
    uint64_t h = g.site * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(g.bar) << 40) ^ (static_cast<uint64_t>(g.wsync) << 20) ^ g.k;
    return static_cast<size_t>(h * 0xBF58476D1CE4E5B9ull);
  }
};
using PendingGroups = std::unordered_map<GroupKey, Group, GroupKeyHash>;

// A lane's executions of each site in its current stretch.
struct Lane {
  uint32_t bar = ~0u, wsync = ~0u;
  std::unordered_map<uintptr_t, uint32_t> executions;
};

// One bit per byte of device memory.
class ByteSet {
 public:
  void add(uintptr_t a, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const uintptr_t b = a + i, page = b / kPage;
      if (page != last_page_) {
        auto& p = pages_[page];
        if (!p) p = std::make_unique<std::bitset<kPage>>();
        last_page_ = page;
        last_ = p.get();
      }
      last_->set(b % kPage);
    }
  }
  uint64_t count() const {
    uint64_t n = 0;
    for (const auto& [page, bits] : pages_) n += bits->count();
    return n;
  }
  // Whether any byte of [a, a + n) is in the set.
  bool any(uintptr_t a, size_t n) const {
    for (size_t i = 0; i < n; ++i) {
      const uintptr_t b = a + i;
      auto it = pages_.find(b / kPage);
      if (it == pages_.end()) {
        i += kPage - 1 - b % kPage;  // skip the rest of an absent page
        continue;
      }
      if (it->second->test(b % kPage)) return true;
    }
    return false;
  }
  void clear() {
    pages_.clear();
    last_page_ = ~uintptr_t{0};
    last_ = nullptr;
  }

 private:
  static constexpr size_t kPage = 4096;
  std::unordered_map<uintptr_t, std::unique_ptr<std::bitset<kPage>>> pages_;
  uintptr_t last_page_ = ~uintptr_t{0};
  std::bitset<kPage>* last_ = nullptr;
};

struct Counters {
  bool on = false;
  bool in_launch = false;  // counting the running launch
  uint64_t next_min_bytes = 0;
  FILE* csv = nullptr;  // CUDASIM_COUNTERS
  std::vector<Lane> lanes;                  // per thread of the running block
  std::vector<PendingGroups> pending;       // per warp of the running block
  std::unordered_map<const void*, AccessCounts> per_site;
  ByteSet read, written;
  ByteSet static_shared;  // bytes of the static __shared__ section the launch touched
  std::vector<LaunchCounts> launches;

  Counters() {
    on = open_env_kernel_report();
    const char* path = std::getenv("CUDASIM_COUNTERS");
    if (!path) return;
    csv = *path ? std::fopen(path, "w") : nullptr;
    if (!csv) {
      std::fprintf(stderr, "cudasim: error: CUDASIM_COUNTERS=%s: cannot write the file%s%s\n", path,
                   *path ? ": " : " (an empty name)", *path ? std::strerror(errno) : "");
      std::exit(2);
    }
    std::fputs(counters_csv_header().c_str(), csv);
    std::fflush(csv);
    on = true;
  }
};
Counters& counters() {
  static Counters c;
  return c;
}

// The declared sizes of the static __shared__ variables any of whose bytes are in `touched`
// (symbol sizes from the symbol table: static_shared_variables); without a symbol table, the
// touched bytes themselves.
uint64_t static_shared_bytes_touched(const ByteSet& touched) {
  if (touched.count() == 0) return 0;
  const std::vector<SharedVariable>& vars = static_shared_variables();
  uint64_t bytes = 0;
  for (const SharedVariable& v : vars)
    if (touched.any(v.address, v.size)) bytes += v.size;
  return bytes > 0 ? bytes : touched.count();
}

// ---- one request ----

// The distinct bytes of the lanes' [addr, addr + size) ranges (lanes asking for the same
// bytes, a broadcast, count them once).
uint64_t distinct_bytes(std::vector<std::pair<uintptr_t, uintptr_t>>& ranges) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t bytes = 0;
  uintptr_t covered = 0;  // end of the union so far
  for (const auto& [lo, hi] : ranges) {
    const uintptr_t from = std::max(lo, covered);
    if (hi > from) bytes += hi - from;
    covered = std::max(covered, hi);
  }
  return bytes;
}

void count_global(const Group& g, AccessCounts& m) {
  std::vector<uintptr_t> sectors;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  uint64_t bytes = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    if (!(g.lanes & (1u << l))) continue;
    const LaneAccess& a = g.at[l];
    bytes += a.size;
    ranges.emplace_back(a.addr, a.addr + a.size);
    for (uintptr_t s = a.addr / kSectorBytes; s <= (a.addr + a.size - 1) / kSectorBytes; ++s) sectors.push_back(s);
  }
  std::sort(sectors.begin(), sectors.end());
  const uint64_t distinct = static_cast<uint64_t>(std::unique(sectors.begin(), sectors.end()) - sectors.begin());
  const uint64_t ideal = (distinct_bytes(ranges) + kSectorBytes - 1) / kSectorBytes;
  if (g.write) {
    ++m.global_st_requests;
    m.global_st_sectors += distinct;
    m.global_st_bytes += bytes;
    m.global_st_ideal_sectors += ideal;
  } else {
    ++m.global_ld_requests;
    m.global_ld_sectors += distinct;
    m.global_ld_bytes += bytes;
    m.global_ld_ideal_sectors += ideal;
  }
}

// Shared memory serves a request in phases of 32 lanes (accesses of up to 4 bytes), 16 (8
// bytes) or 8 (16 bytes); a phase needs one wavefront per distinct word in its busiest bank.
void count_shared(const Group& g, AccessCounts& m) {
  uint32_t widest = 0;
  for (int l = 0; l < kWarpSize; ++l)
    if (g.lanes & (1u << l)) widest = std::max(widest, g.at[l].size);
  const int phase_lanes = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
  uint64_t wavefronts = 0, conflicts = 0;
  for (int first = 0; first < kWarpSize; first += phase_lanes) {
    std::vector<uintptr_t> words;
    for (int l = first; l < first + phase_lanes; ++l) {
      if (!(g.lanes & (1u << l))) continue;
      const LaneAccess& a = g.at[l];
      for (uintptr_t w = a.addr / kWordBytes; w <= (a.addr + a.size - 1) / kWordBytes; ++w) words.push_back(w);
    }
    if (words.empty()) continue;
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    uint32_t per_bank[kBanks] = {};
    uint32_t busiest = 0;
    for (uintptr_t w : words) busiest = std::max(busiest, ++per_bank[w % kBanks]);
    wavefronts += busiest;
    conflicts += busiest - 1;
  }
  if (g.write) {
    ++m.shared_st_requests;
    m.shared_st_wavefronts += wavefronts;
    m.shared_st_bank_conflicts += conflicts;
  } else {
    ++m.shared_ld_requests;
    m.shared_ld_wavefronts += wavefronts;
    m.shared_ld_bank_conflicts += conflicts;
  }
}

void flush(PendingGroups& groups) {
  Counters& c = counters();
  for (const auto& [key, g] : groups) {
    AccessCounts& m = c.per_site[g.pc];
    if (g.shared)
      count_shared(g, m);
    else
      count_global(g, m);
  }
  groups.clear();
}

// ---- per-line table ----

// `file` relative to the source tree when it lies inside it.
std::string source_relative(const std::string& file) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(file);
  if (it != cache.end()) return it->second;
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string root = fs::weakly_canonical(CUDASIM_SOURCE_ROOT, ec).string();
  const std::string path = fs::weakly_canonical(file, ec).string();
  std::string out = file;
  if (!root.empty() && !ec && path.size() > root.size() + 1 && path.compare(0, root.size(), root) == 0 &&
      path[root.size()] == '/')
    out = path.substr(root.size() + 1);
  return cache[file] = out;
}

std::vector<LineCounts> per_line(const std::unordered_map<const void*, AccessCounts>& per_site) {
  std::vector<const void*> pcs;
  for (const auto& [pc, counts] : per_site) pcs.push_back(pc);
  symbolize_all(pcs);
  std::map<std::pair<std::string, int>, AccessCounts> lines;
  for (const auto& [pc, counts] : per_site) {
    const std::string where = symbolize(pc);
    const size_t colon = where.rfind(':');
    int line = 0;
    std::string file = where;
    if (colon != std::string::npos && colon + 1 < where.size() &&
        where.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
      line = std::atoi(where.c_str() + colon + 1);
      file = source_relative(where.substr(0, colon));
    }
    lines[{file, line}] += counts;
  }
  std::vector<LineCounts> out;
  for (const auto& [where, counts] : lines) out.push_back({where.first, where.second, counts});
  return out;
}

// ---- the CSV's columns ----

struct Column {
  CounterColumn head;
  // The value on the row of `line` (null: the launch made no counted access).
  std::string (*value)(const LaunchCounts& launch, const LineCounts* line);
};

std::string num(uint64_t v) { return std::to_string(v); }
std::string ratio(uint64_t a, uint64_t b) {
  if (b == 0) return "";
  char s[32];
  std::snprintf(s, sizeof s, "%.6g", static_cast<double>(a) / static_cast<double>(b));
  return s;
}
std::string dims(const Dim& d) { return num(d.x) + "x" + num(d.y) + "x" + num(d.z); }
const AccessCounts& of(const LineCounts* l) {
  static const AccessCounts none;
  return l ? l->counts : none;
}

#define CUDASIM_COUNT_COLUMN(name, unit, meaning, field) \
  {{name, unit, meaning}, [](const LaunchCounts&, const LineCounts* l) { return num(of(l).field); }}

const std::vector<Column>& columns() {
  static const std::vector<Column> c = {
      {{"launch", "", "the process's n-th kernel launch (cudasim::launch_count())"},
       [](const LaunchCounts& k, const LineCounts*) { return num(k.launch); }},
      {{"kernel", "", "the kernel as written before <<<...>>>"},
       [](const LaunchCounts& k, const LineCounts*) { return k.kernel; }},
      {{"function", "", "the kernel function as instantiated (template arguments filled in), from the symbol table"},
       [](const LaunchCounts& k, const LineCounts*) { return k.function; }},
      {{"launched_at", "file:line", "where the launch is written"},
       [](const LaunchCounts& k, const LineCounts*) { return k.launched_at; }},
      {{"grid", "blocks", "gridDim as XxYxZ"}, [](const LaunchCounts& k, const LineCounts*) { return dims(k.grid); }},
      {{"block", "threads", "blockDim as XxYxZ"},
       [](const LaunchCounts& k, const LineCounts*) { return dims(k.block); }},
      {{"dynamic_smem", "bytes", "dynamic shared memory of the launch"},
       [](const LaunchCounts& k, const LineCounts*) { return num(k.dynamic_smem_bytes); }},
      {{"source", "file:line", "the source line of the rest of the row's counts (empty: the launch made no access)"},
       [](const LaunchCounts&, const LineCounts* l) {
         return l ? l->file + ":" + std::to_string(l->line) : std::string();
       }},
      CUDASIM_COUNT_COLUMN("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "requests",
                           "global loads executed by a warp (one request per warp-level execution)",
                           global_ld_requests),
      CUDASIM_COUNT_COLUMN("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "sectors",
                           "32-byte sectors the global load requests touch, counted per request", global_ld_sectors),
      {{"l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio", "sectors/request",
        "global load sectors / requests (4 for 128 contiguous bytes per warp; empty: no request)"},
       [](const LaunchCounts&, const LineCounts* l) {
         return ratio(of(l).global_ld_sectors, of(l).global_ld_requests);
       }},
      CUDASIM_COUNT_COLUMN("cudasim__global_ld_bytes_requested", "bytes",
                           "bytes the lanes loaded from global memory (the sectors' 32 bytes each hold at least these)",
                           global_ld_bytes),
      CUDASIM_COUNT_COLUMN("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "requests",
                           "global stores executed by a warp", global_st_requests),
      CUDASIM_COUNT_COLUMN("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "sectors",
                           "32-byte sectors the global store requests touch, counted per request", global_st_sectors),
      {{"l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_st.ratio", "sectors/request",
        "global store sectors / requests (empty: no request)"},
       [](const LaunchCounts&, const LineCounts* l) {
         return ratio(of(l).global_st_sectors, of(l).global_st_requests);
       }},
      CUDASIM_COUNT_COLUMN("cudasim__global_st_bytes_requested", "bytes", "bytes the lanes stored to global memory",
                           global_st_bytes),
      CUDASIM_COUNT_COLUMN("smsp__inst_executed_op_shared_ld.sum", "requests",
                           "shared-memory loads executed by a warp (one request each)", shared_ld_requests),
      CUDASIM_COUNT_COLUMN("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "wavefronts",
                           "shared load wavefronts: per phase, the distinct words in its busiest bank",
                           shared_ld_wavefronts),
      CUDASIM_COUNT_COLUMN("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "conflicts",
                           "shared load bank conflicts: wavefronts beyond the first of each phase",
                           shared_ld_bank_conflicts),
      CUDASIM_COUNT_COLUMN("smsp__inst_executed_op_shared_st.sum", "requests",
                           "shared-memory stores executed by a warp (one request each)", shared_st_requests),
      CUDASIM_COUNT_COLUMN("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", "wavefronts",
                           "shared store wavefronts", shared_st_wavefronts),
      CUDASIM_COUNT_COLUMN("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "conflicts",
                           "shared store bank conflicts", shared_st_bank_conflicts),
      {{"cudasim__unique_global_bytes_read", "bytes",
        "per launch (repeated on each of its rows): distinct bytes of device memory it read, a lower bound on "
        "its DRAM reads (compare dram__bytes_read.sum)"},
       [](const LaunchCounts& k, const LineCounts*) { return num(k.unique_global_bytes_read); }},
      {{"cudasim__unique_global_bytes_written", "bytes",
        "per launch (repeated): distinct bytes of device memory it wrote, a lower bound on its DRAM writes"},
       [](const LaunchCounts& k, const LineCounts*) { return num(k.unique_global_bytes_written); }},
      {{"cudasim__min_bytes", "bytes",
        "per launch (repeated): the bytes its caller declared it must move at least (declare_min_bytes; 0: none)"},
       [](const LaunchCounts& k, const LineCounts*) { return num(k.min_bytes); }},
  };
  return c;
}
#undef CUDASIM_COUNT_COLUMN

}  // namespace

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"') q += '"';
    q += ch;
  }
  return q + "\"";
}

namespace {

std::string csv_row(const LaunchCounts& launch, const LineCounts* line) {
  std::string row;
  for (const Column& col : columns()) {
    if (!row.empty()) row += ',';
    row += csv_field(col.value(launch, line));
  }
  return row + "\n";
}

}  // namespace

// ---- hooks: instrumentation (race.cpp) and engine (sim.cpp) ----

void count_access(uintptr_t a, size_t n, bool write, const void* pc) {
  Counters& c = counters();
  Thread* t = current_thread();
  if (!c.in_launch || !t || n == 0) return;
  bool shared = (a >= running.shared_lo && a < running.shared_hi) || (a >= running.dynamic_lo && a < running.dynamic_hi);
  if (!shared && !find_allocation(reinterpret_cast<const void*>(a), n)) return;  // stack, host, out of bounds
  if (!shared) (write ? c.written : c.read).add(a, n);
  if (shared && a >= running.shared_lo && a < running.shared_hi) c.static_shared.add(a, n);
  Lane& lane = c.lanes[t->linear];
  const uint32_t bar = running.bar_epoch, wsync = (*running.warps)[t->warp].sync_epoch;
  if (lane.bar != bar || lane.wsync != wsync) {
    lane.bar = bar;
    lane.wsync = wsync;
    lane.executions.clear();
  }
  const uintptr_t site = reinterpret_cast<uintptr_t>(pc) << 2 | uintptr_t{write} << 1 | uintptr_t{shared};
  const uint32_t k = lane.executions[site]++;
  Group& g = c.pending[t->warp][GroupKey{bar, wsync, k, site}];
  if (!g.lanes) {
    g.pc = pc;
    g.write = write;
    g.shared = shared;
  }
  g.lanes |= 1u << t->lane;
  g.at[t->lane] = LaneAccess{a, static_cast<uint32_t>(n)};
}

void count_block_copy(uintptr_t a, size_t n, bool write, const void* pc) {
  if (!counters().in_launch) return;
  // As a GPU compiler would split it: the widest naturally aligned pieces of at most 16 bytes.
  while (n > 0) {
    size_t piece = 16;
    while (piece > 1 && (piece > n || a % piece != 0)) piece /= 2;
    count_access(a, piece, write, pc);
    a += piece;
    n -= piece;
  }
}

void counters_begin_launch() {
  Counters& c = counters();
  c.in_launch = c.on;
  c.per_site.clear();
  c.read.clear();
  c.written.clear();
  c.static_shared.clear();
}

void counters_begin_block() {
  Counters& c = counters();
  if (!c.in_launch) return;
  const size_t threads = running.threads->size();
  if (c.lanes.size() < threads) c.lanes.resize(threads);
  for (Lane& l : c.lanes) l.bar = l.wsync = ~0u;  // a new block: every lane's stretch is new
  c.pending.resize(running.warps->size());
}

void counters_flush_warp(int warp) {
  Counters& c = counters();
  if (c.in_launch && static_cast<size_t>(warp) < c.pending.size()) flush(c.pending[warp]);
}

void counters_flush_block() {
  Counters& c = counters();
  if (!c.in_launch) return;
  for (PendingGroups& g : c.pending) flush(g);
}

void counters_end_launch(const void* kernel, dim3 grid, dim3 block, size_t smem, uint64_t blocks_run,
                         uint64_t sample) {
  Counters& c = counters();
  if (!c.in_launch) return;
  counters_flush_block();
  c.in_launch = false;
  LaunchCounts k;
  k.launch = launch_count();
  k.kernel = running.kernel;
  k.function = function_name(kernel);
  k.launched_at = source_relative(running.file) + ":" + std::to_string(running.line);
  k.grid = {grid.x, grid.y, grid.z};
  k.block = {block.x, block.y, block.z};
  k.dynamic_smem_bytes = smem;
  k.blocks_run = blocks_run;
  k.block_sample = sample;
  k.static_smem_bytes = static_shared_bytes_touched(c.static_shared);
  k.unique_global_bytes_read = c.read.count();
  k.unique_global_bytes_written = c.written.count();
  k.min_bytes = c.next_min_bytes;
  c.next_min_bytes = 0;
  k.lines = per_line(c.per_site);
  for (const LineCounts& l : k.lines) k.total += l.counts;
  c.per_site.clear();
  c.read.clear();
  c.written.clear();
  c.static_shared.clear();
  add_to_env_kernel_report(k);
  if (c.csv) {
    std::fputs(counters_csv_rows(k).c_str(), c.csv);
    std::fflush(c.csv);
  }
  c.launches.push_back(std::move(k));
}

}  // namespace internal

// ---- public API ----

bool counters_available() { return true; }  // this file is linked only where the kernels are instrumented
bool set_counters(bool on) { return internal::counters().on = on; }
bool counters_enabled() { return internal::counters().on; }
void declare_min_bytes(uint64_t bytes) { internal::counters().next_min_bytes = bytes; }
const std::vector<LaunchCounts>& counted_launches() { return internal::counters().launches; }
std::vector<LaunchCounts> take_counted_launches() {
  std::vector<LaunchCounts> out;
  out.swap(internal::counters().launches);
  return out;
}

const std::vector<CounterColumn>& counter_columns() {
  static const std::vector<CounterColumn> heads = [] {
    std::vector<CounterColumn> h;
    for (const internal::Column& c : internal::columns()) h.push_back(c.head);
    return h;
  }();
  return heads;
}
std::string counters_csv_header() {
  std::string h;
  for (const CounterColumn& c : counter_columns()) h += (h.empty() ? "" : ",") + std::string(c.name);
  return h + "\n";
}
std::string counters_csv_rows(const LaunchCounts& launch) {
  if (launch.lines.empty()) return internal::csv_row(launch, nullptr);
  std::string rows;
  for (const LineCounts& l : launch.lines) rows += internal::csv_row(launch, &l);
  return rows;
}

}  // namespace cudasim
