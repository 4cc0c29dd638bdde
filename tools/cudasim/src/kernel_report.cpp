// The kernel report (include/cudasim/kernel_report.hpp): counted launches summed per launch or
// per kernel function, with excess sectors, bytes moved against the declared minimum, and a
// modeled time on a stated device. The devices' numbers and the model's assumptions are
// stated, with their sources, in tools/cudasim/README.md ("Kernel report").
#include "cudasim/kernel_report.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "internal.hpp"

namespace cudasim {

const std::vector<ModelDevice>& model_devices() {
  // H100 SXM5: 3.35 TB/s HBM3, 132 SMs, 67 TFLOPS FP32 = 132 SMs x 128 lanes x 2 x 1.98 GHz;
  // compute capability 9.0: 228 KiB shared memory per SM, 227 KiB per block.
  // A100 SXM4 80GB: 2039 GB/s HBM2e, 108 SMs, 1.41 GHz boost; compute capability 8.0: 164 KiB
  // per SM, 163 KiB per block. Both: 2048 threads and 32 blocks per SM, 32 banks of 4 bytes a
  // clock, 1 KiB of shared memory reserved per block. Dense tensor-core BF16/FP16 (no
  // sparsity): H100 SXM5 989.4 TFLOPS, A100 312 TFLOPS; FP32: 67 and 19.5 TFLOPS.
  static const std::vector<ModelDevice> devices = {
      {"h100", "H100 SXM5 80GB", 3.35e12, 132, 1.98e9, 128, 2048, 32, 228 * 1024, 227 * 1024, 1024, 989.4e12, 67e12},
      {"a100", "A100 SXM4 80GB", 2.039e12, 108, 1.41e9, 128, 2048, 32, 164 * 1024, 163 * 1024, 1024, 312e12,
       19.5e12},
  };
  return devices;
}

const ModelDevice* find_model_device(const std::string& name) {
  for (const ModelDevice& d : model_devices())
    if (name == d.name) return &d;
  return nullptr;
}

std::string model_device_names() {
  std::string s;
  for (const ModelDevice& d : model_devices()) s += (s.empty() ? "" : " | ") + std::string(d.name);
  return s;
}

namespace {

uint64_t volume(const Dim& d) { return static_cast<uint64_t>(d.x) * d.y * d.z; }

// Resident blocks per SM: the tightest of threads (whole warps), the block limit and shared memory.
void occupancy(const LaunchCounts& k, const ModelDevice& dev, LaunchModel& m) {
  const uint64_t threads = (volume(k.block) + 31) / 32 * 32;
  const uint64_t user_shared = k.static_smem_bytes + k.dynamic_smem_bytes;
  m.shared_per_block = user_shared + dev.shared_reserved_per_block;
  if (threads == 0 || threads > static_cast<uint64_t>(dev.max_threads_per_sm) || user_shared > dev.shared_per_block_max) {
    m.blocks_per_sm = 0;
    m.limited_by = threads == 0 || threads > static_cast<uint64_t>(dev.max_threads_per_sm) ? "threads" : "shared memory";
    return;
  }
  const uint64_t by_threads = dev.max_threads_per_sm / threads, by_shared = dev.shared_per_sm / m.shared_per_block;
  uint64_t fit = static_cast<uint64_t>(dev.max_blocks_per_sm);
  m.limited_by = "blocks";
  if (by_threads < fit) {
    fit = by_threads;
    m.limited_by = "threads";
  }
  if (by_shared < fit) {
    fit = by_shared;
    m.limited_by = "shared memory";
  }
  m.blocks_per_sm = static_cast<int>(fit);
}

std::string num(uint64_t v) { return std::to_string(v); }
std::string real(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.6g", v);
  return s;
}
std::string ratio(uint64_t a, uint64_t b) { return b ? real(static_cast<double>(a) / static_cast<double>(b)) : ""; }
std::string dims(const Dim& d) { return num(d.x) + "x" + num(d.y) + "x" + num(d.z); }

// A block-sampled launch (set_block_sample) as the whole launch would count: every count times
// blocks / blocks_run. Exact for kernels whose blocks all do the same work (elementwise and
// grid-stride kernels, rows of one length); an estimate for rows of varying work (the causal
// softmax's rows, sampled evenly). Unique bytes scale too, which over-counts what every block
// reads alike (a weight vector) by the sample factor: negligible beside row traffic.
AccessCounts scaled(const AccessCounts& c, double f) {
  auto x = [f](uint64_t v) { return static_cast<uint64_t>(static_cast<double>(v) * f + 0.5); };
  AccessCounts s;
  s.global_ld_requests = x(c.global_ld_requests);
  s.global_ld_sectors = x(c.global_ld_sectors);
  s.global_ld_bytes = x(c.global_ld_bytes);
  s.global_ld_ideal_sectors = x(c.global_ld_ideal_sectors);
  s.global_st_requests = x(c.global_st_requests);
  s.global_st_sectors = x(c.global_st_sectors);
  s.global_st_bytes = x(c.global_st_bytes);
  s.global_st_ideal_sectors = x(c.global_st_ideal_sectors);
  s.shared_ld_requests = x(c.shared_ld_requests);
  s.shared_ld_wavefronts = x(c.shared_ld_wavefronts);
  s.shared_ld_bank_conflicts = x(c.shared_ld_bank_conflicts);
  s.shared_st_requests = x(c.shared_st_requests);
  s.shared_st_wavefronts = x(c.shared_st_wavefronts);
  s.shared_st_bank_conflicts = x(c.shared_st_bank_conflicts);
  return s;
}
LaunchCounts whole_launch(const LaunchCounts& k) {
  if (k.block_sample <= 1 || k.blocks_run == 0 || k.blocks_run >= volume(k.grid)) return k;
  const double f = static_cast<double>(volume(k.grid)) / static_cast<double>(k.blocks_run);
  LaunchCounts w = k;
  w.total = scaled(k.total, f);
  for (LineCounts& l : w.lines) l.counts = scaled(l.counts, f);
  w.unique_global_bytes_read = static_cast<uint64_t>(static_cast<double>(k.unique_global_bytes_read) * f + 0.5);
  w.unique_global_bytes_written = static_cast<uint64_t>(static_cast<double>(k.unique_global_bytes_written) * f + 0.5);
  return w;
}

KernelRow launch_row(const LaunchCounts& sampled_or_whole, const ModelDevice& dev) {
  const LaunchCounts k = whole_launch(sampled_or_whole);
  KernelRow r;
  r.block_sample = k.block_sample;
  r.kernel = k.kernel;
  r.function = k.function;
  r.launched_at = {k.launched_at};
  r.launches = 1;
  r.grid = k.grid;
  r.block = k.block;
  r.dynamic_smem_bytes = k.dynamic_smem_bytes;
  r.static_smem_bytes = k.static_smem_bytes;
  r.total = k.total;
  r.unique_bytes_read = k.unique_global_bytes_read;
  r.unique_bytes_written = k.unique_global_bytes_written;
  r.min_bytes = k.min_bytes;
  for (const LineCounts& l : k.lines) {
    const AccessCounts& c = l.counts;
    const uint64_t excess = c.global_ld_sectors - c.global_ld_ideal_sectors + c.global_st_sectors - c.global_st_ideal_sectors;
    if (excess) r.excess_lines.push_back({l.file + ":" + std::to_string(l.line), excess});
  }
  std::stable_sort(r.excess_lines.begin(), r.excess_lines.end(),
                   [](const LineExcess& a, const LineExcess& b) { return a.sectors > b.sectors; });
  r.model = model_launch(k, dev);
  r.device = &dev;
  return r;
}

bool same_geometry(const KernelRow& a, const KernelRow& b) {
  auto same = [](const Dim& x, const Dim& y) { return x.x == y.x && x.y == y.y && x.z == y.z; };
  return same(a.grid, b.grid) && same(a.block, b.block) && a.dynamic_smem_bytes == b.dynamic_smem_bytes &&
         a.static_smem_bytes == b.static_smem_bytes;
}

void add_into(KernelRow& sum, const KernelRow& r) {
  sum.geometry_varies = sum.geometry_varies || r.geometry_varies || !same_geometry(sum, r);
  sum.launches += r.launches;
  sum.block_sample = std::max(sum.block_sample, r.block_sample);
  for (const std::string& at : r.launched_at)
    if (std::find(sum.launched_at.begin(), sum.launched_at.end(), at) == sum.launched_at.end())
      sum.launched_at.push_back(at);
  sum.total += r.total;
  sum.unique_bytes_read += r.unique_bytes_read;
  sum.unique_bytes_written += r.unique_bytes_written;
  sum.min_bytes = sum.min_bytes && r.min_bytes ? sum.min_bytes + r.min_bytes : 0;
  std::map<std::string, uint64_t> lines;
  for (const LineExcess& l : sum.excess_lines) lines[l.where] += l.sectors;
  for (const LineExcess& l : r.excess_lines) lines[l.where] += l.sectors;
  sum.excess_lines.clear();
  for (const auto& [where, sectors] : lines) sum.excess_lines.push_back({where, sectors});
  std::stable_sort(sum.excess_lines.begin(), sum.excess_lines.end(),
                   [](const LineExcess& a, const LineExcess& b) { return a.sectors > b.sectors; });
  LaunchModel& m = sum.model;
  m.waves += r.model.waves;
  m.dram_us += r.model.dram_us;
  m.shared_us += r.model.shared_us;
  m.waves_us += r.model.waves_us;
  m.total_us += r.model.total_us;
}

// Adds launch `k` to the row of its kernel function (a new row for a new function).
void add_launch(std::vector<KernelRow>& rows, std::map<std::string, size_t>& index, const LaunchCounts& k,
                const ModelDevice& dev) {
  const std::string key = k.function.empty() ? k.kernel : k.function;
  auto [it, fresh] = index.try_emplace(key, rows.size());
  if (fresh)
    rows.push_back(launch_row(k, dev));
  else
    add_into(rows[it->second], launch_row(k, dev));
}

// The three lines with the most excess sectors: "file:line +N; ...".
std::string top_excess(const KernelRow& r) {
  std::string s;
  for (size_t i = 0; i < r.excess_lines.size() && i < 3; ++i)
    s += (s.empty() ? "" : "; ") + r.excess_lines[i].where + " +" + num(r.excess_lines[i].sectors);
  return s;
}

// A modeled number: empty where the block does not fit the device or the geometry varies.
bool modeled(const KernelRow& r) { return r.model.blocks_per_sm > 0 || r.geometry_varies || r.library_call; }
std::string geometry(const KernelRow& r, std::string value) { return r.geometry_varies ? "" : value; }

struct Column {
  const char* name;  // "{dev}" is replaced by the device's name
  const char* unit;
  const char* meaning;
  std::string (*value)(const KernelRow&);
};

const std::vector<Column>& columns() {
  static const std::vector<Column> c = {
      {"kernel", "", "the kernel as written before <<<...>>>", [](const KernelRow& r) { return r.kernel; }},
      {"function", "", "the kernel function as instantiated (template arguments filled in)",
       [](const KernelRow& r) { return r.function; }},
      {"launched_at", "file:line", "where the launches are written (the distinct places, separated by '; ')",
       [](const KernelRow& r) {
         std::string s;
         for (const std::string& at : r.launched_at) s += (s.empty() ? "" : "; ") + at;
         return s;
       }},
      {"launches", "launches", "launches summed in this row", [](const KernelRow& r) { return num(r.launches); }},
      {"block_sample", "",
       "1: every block ran; N: one block in N ran (set_block_sample) and the counts are scaled to the whole grid",
       [](const KernelRow& r) { return num(r.block_sample); }},
      {"grid", "blocks", "gridDim as XxYxZ (empty: the summed launches differ in grid, block or shared memory)",
       [](const KernelRow& r) { return geometry(r, dims(r.grid)); }},
      {"block", "threads", "blockDim as XxYxZ (empty: it varies)",
       [](const KernelRow& r) { return geometry(r, dims(r.block)); }},
      {"dynamic_smem", "bytes", "dynamic shared memory per block (empty: it varies)",
       [](const KernelRow& r) { return geometry(r, num(r.dynamic_smem_bytes)); }},
      {"static_smem", "bytes",
       "static __shared__ variables the launch touched, their declared sizes summed (a lower bound; empty: it varies)",
       [](const KernelRow& r) { return geometry(r, num(r.static_smem_bytes)); }},
      {"global_ld_requests", "requests", "global load requests (l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum)",
       [](const KernelRow& r) { return num(r.total.global_ld_requests); }},
      {"global_ld_sectors", "sectors", "global load sectors (l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum)",
       [](const KernelRow& r) { return num(r.total.global_ld_sectors); }},
      {"global_ld_sectors_per_request", "sectors/request", "global load sectors / requests (empty: no request)",
       [](const KernelRow& r) { return ratio(r.total.global_ld_sectors, r.total.global_ld_requests); }},
      {"global_ld_ideal_sectors", "sectors",
       "per load request, its distinct bytes / 32 rounded up, summed: the fewest sectors that hold what was asked for",
       [](const KernelRow& r) { return num(r.total.global_ld_ideal_sectors); }},
      {"global_st_requests", "requests", "global store requests (l1tex__t_requests_pipe_lsu_mem_global_op_st.sum)",
       [](const KernelRow& r) { return num(r.total.global_st_requests); }},
      {"global_st_sectors", "sectors", "global store sectors (l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum)",
       [](const KernelRow& r) { return num(r.total.global_st_sectors); }},
      {"global_st_sectors_per_request", "sectors/request", "global store sectors / requests (empty: no request)",
       [](const KernelRow& r) { return ratio(r.total.global_st_sectors, r.total.global_st_requests); }},
      {"global_st_ideal_sectors", "sectors", "the same ideal for the store requests",
       [](const KernelRow& r) { return num(r.total.global_st_ideal_sectors); }},
      {"excess_sectors", "sectors", "load and store sectors beyond the ideal",
       [](const KernelRow& r) { return num(r.excess_sectors()); }},
      {"excess_lines", "file:line +sectors", "the (up to) three source lines with the most excess sectors",
       [](const KernelRow& r) { return top_excess(r); }},
      {"shared_wavefronts", "wavefronts",
       "shared-memory load and store wavefronts (l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}.sum)",
       [](const KernelRow& r) { return num(r.total.shared_ld_wavefronts + r.total.shared_st_wavefronts); }},
      {"shared_bank_conflicts", "conflicts",
       "shared-memory load and store bank conflicts (l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.sum)",
       [](const KernelRow& r) { return num(r.total.shared_ld_bank_conflicts + r.total.shared_st_bank_conflicts); }},
      {"unique_bytes_read", "bytes", "distinct bytes of device memory read, per launch, summed",
       [](const KernelRow& r) { return num(r.unique_bytes_read); }},
      {"unique_bytes_written", "bytes", "distinct bytes of device memory written, per launch, summed",
       [](const KernelRow& r) { return num(r.unique_bytes_written); }},
      {"bytes_moved", "bytes", "global load and store sectors x 32: the bytes the L1 is asked for",
       [](const KernelRow& r) { return num(r.bytes_moved()); }},
      {"min_bytes", "bytes", "the minimum the callers declared (empty: not every launch declared one)",
       [](const KernelRow& r) { return r.min_bytes ? num(r.min_bytes) : std::string(); }},
      {"bytes_moved_per_min", "ratio", "bytes_moved / min_bytes (empty: no minimum)",
       [](const KernelRow& r) { return ratio(r.bytes_moved(), r.min_bytes); }},
      {"flops", "FLOP", "a library GEMM row's floating-point operations (2 m n k per batch; empty for kernels)",
       [](const KernelRow& r) { return r.library_call ? real(r.flops) : std::string(); }},
      {"blocks_per_sm_{dev}", "blocks",
       "modeled occupancy: resident blocks per SM from the block's threads and shared memory (0: it does not fit; "
       "empty: it varies)",
       [](const KernelRow& r) { return geometry(r, num(static_cast<uint64_t>(r.model.blocks_per_sm))); }},
      {"occupancy_limit_{dev}", "", "what limits blocks_per_sm: threads, blocks or shared memory (modeled)",
       [](const KernelRow& r) { return geometry(r, r.model.limited_by); }},
      {"waves_{dev}", "waves", "modeled launch waves: grid blocks / (SMs x blocks per SM), rounded up, summed",
       [](const KernelRow& r) { return modeled(r) ? num(r.model.waves) : std::string(); }},
      {"modeled_dram_us_{dev}", "us (modeled)", "unique bytes read and written / DRAM bandwidth",
       [](const KernelRow& r) { return modeled(r) ? real(r.model.dram_us) : std::string(); }},
      {"modeled_shared_us_{dev}", "us (modeled)", "shared wavefronts / (SMs x clock): one wavefront a clock per SM",
       [](const KernelRow& r) { return modeled(r) ? real(r.model.shared_us) : std::string(); }},
      {"modeled_waves_us_{dev}", "us (modeled)", "waves x the per-wave minimum",
       [](const KernelRow& r) { return modeled(r) ? real(r.model.waves_us) : std::string(); }},
      {"modeled_math_us_{dev}", "us (modeled)",
       "a GEMM row's flops / (the device's math peak x the stated efficiency; empty for kernels)",
       [](const KernelRow& r) { return r.library_call ? real(r.model.math_us) : std::string(); }},
      {"modeled_us_{dev}", "us (modeled)",
       "launch overhead + the largest of the three above, summed over the launches: a model, not a measurement",
       [](const KernelRow& r) { return modeled(r) ? real(r.model.total_us) : std::string(); }},
  };
  return c;
}

std::string column_name(const Column& c, const ModelDevice& dev) {
  std::string n = c.name;
  const size_t at = n.find("{dev}");
  if (at != std::string::npos) n.replace(at, 5, dev.name);
  return n;
}

}  // namespace

LaunchModel model_launch(const LaunchCounts& k, const ModelDevice& dev) {
  LaunchModel m;
  occupancy(k, dev, m);
  if (m.blocks_per_sm == 0) return m;
  const uint64_t resident = static_cast<uint64_t>(dev.sms) * static_cast<uint64_t>(m.blocks_per_sm);
  m.waves = (volume(k.grid) + resident - 1) / resident;
  const double dram_bytes = static_cast<double>(k.unique_global_bytes_read + k.unique_global_bytes_written);
  const double wavefronts = static_cast<double>(k.total.shared_ld_wavefronts + k.total.shared_st_wavefronts);
  m.dram_us = dram_bytes / dev.dram_bytes_per_s * 1e6;
  // A wavefront is one clock of one SM's 32 banks x 4 bytes.
  m.shared_us = wavefronts * 128.0 / (dev.sms * dev.clock_hz * dev.shared_bytes_per_clock_per_sm) * 1e6;
  m.waves_us = static_cast<double>(m.waves) * kModeledWaveMinimumUs;
  m.total_us = kModeledLaunchOverheadUs + std::max({m.dram_us, m.shared_us, m.waves_us});
  return m;
}

uint64_t KernelRow::excess_sectors() const {
  return total.global_ld_sectors - total.global_ld_ideal_sectors + total.global_st_sectors - total.global_st_ideal_sectors;
}
uint64_t KernelRow::bytes_moved() const { return (total.global_ld_sectors + total.global_st_sectors) * 32; }

std::vector<KernelRow> launch_rows(const std::vector<LaunchCounts>& launches, const ModelDevice& dev) {
  std::vector<KernelRow> rows;
  for (const LaunchCounts& k : launches) rows.push_back(launch_row(k, dev));
  return rows;
}

std::vector<KernelRow> kernel_rows(const std::vector<LaunchCounts>& launches, const ModelDevice& dev) {
  std::vector<KernelRow> rows;
  std::map<std::string, size_t> index;
  for (const LaunchCounts& k : launches) add_launch(rows, index, k, dev);
  return rows;
}

std::vector<ReportColumn> kernel_report_columns(const ModelDevice& dev) {
  std::vector<ReportColumn> out;
  for (const Column& c : columns()) out.push_back({column_name(c, dev), c.unit, c.meaning});
  return out;
}

std::vector<std::string> kernel_report_csv_header(const ModelDevice& dev) {
  std::vector<std::string> out;
  for (const Column& c : columns()) out.push_back(column_name(c, dev));
  return out;
}

// What a library GEMM row has: no counts, no launch geometry of its own.
static bool library_column(const Column& c) {
  static const std::set<std::string> kept = {"kernel",        "function",         "launches",
                                             "block_sample",  "min_bytes",        "flops",
                                             "modeled_dram_us_{dev}", "modeled_math_us_{dev}", "modeled_us_{dev}"};
  return kept.count(c.name) > 0;
}
static std::string field(const Column& c, const KernelRow& row) {
  return !row.library_call || library_column(c) ? c.value(row) : std::string();
}

std::vector<std::string> kernel_report_csv_fields(const KernelRow& row) {
  std::vector<std::string> out;
  for (const Column& c : columns()) out.push_back(field(c, row));
  return out;
}

KernelRow gemm_row(const std::string& function, uint64_t calls, double flops, uint64_t bytes, bool tensor_cores,
                   const ModelDevice& dev) {
  KernelRow r;
  r.kernel = "cublasLtMatmul";
  r.function = function;
  r.launches = calls;
  r.library_call = true;
  r.flops = flops;
  r.min_bytes = bytes;
  r.device = &dev;
  LaunchModel& m = r.model;
  m.dram_us = static_cast<double>(bytes) / dev.dram_bytes_per_s * 1e6;
  m.math_us = flops / ((tensor_cores ? dev.tensor_flops : dev.fp32_flops) * kModeledGemmEfficiency) * 1e6;
  m.total_us = static_cast<double>(calls) * kModeledLaunchOverheadUs + std::max(m.dram_us, m.math_us);
  return r;
}

std::string kernel_report_csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + internal::csv_field(fields[i]);
  return line + "\n";
}

std::string kernel_report_text(const std::vector<KernelRow>& rows, const ModelDevice& dev) {
  std::string out = "kernel report: modeled columns for the " + std::string(dev.description) +
                    " (a model from the counts, not a measurement)\n";
  size_t width = 0;
  for (const Column& c : columns()) width = std::max(width, column_name(c, dev).size());
  for (const KernelRow& r : rows) {
    out += "\n";
    for (const Column& c : columns()) {
      const std::string v = field(c, r);
      std::string name = column_name(c, dev);
      name.resize(width + 2, ' ');
      out += "  " + name + (v.empty() ? "-" : v) + (*c.unit && !v.empty() ? std::string(" ") + c.unit : "") + "\n";
    }
  }
  return out;
}

// ---- CUDASIM_KERNEL_REPORT ----

namespace internal {
namespace {

struct EnvReport {
  std::string path;
  const ModelDevice* device = nullptr;
  std::vector<KernelRow> rows;
  std::map<std::string, size_t> index;
};
EnvReport& env_report() {
  static EnvReport r;
  return r;
}

void write_env_report() {
  EnvReport& r = env_report();
  FILE* f = std::fopen(r.path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cudasim: error: CUDASIM_KERNEL_REPORT=%s: cannot write the file: %s\n", r.path.c_str(),
                 std::strerror(errno));
    return;
  }
  const bool csv = r.path.size() >= 4 && r.path.compare(r.path.size() - 4, 4, ".csv") == 0;
  std::string text;
  if (csv) {
    text = kernel_report_csv_line(kernel_report_csv_header(*r.device));
    for (const KernelRow& row : r.rows) text += kernel_report_csv_line(kernel_report_csv_fields(row));
  } else {
    text = kernel_report_text(r.rows, *r.device);
  }
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

}  // namespace

bool open_env_kernel_report() {
  const char* path = std::getenv("CUDASIM_KERNEL_REPORT");
  if (!path) return false;
  const char* dev = std::getenv("CUDASIM_REPORT_DEVICE");
  const ModelDevice* device = find_model_device(dev ? dev : "h100");
  if (!device) {
    std::fprintf(stderr, "cudasim: error: CUDASIM_REPORT_DEVICE=%s is not one of %s\n", dev,
                 model_device_names().c_str());
    std::exit(2);
  }
  // Refused now, not after the run: the file must be writable.
  FILE* f = *path ? std::fopen(path, "w") : nullptr;
  if (!f) {
    std::fprintf(stderr, "cudasim: error: CUDASIM_KERNEL_REPORT=%s: cannot write the file%s%s\n", path,
                 *path ? ": " : " (an empty name)", *path ? std::strerror(errno) : "");
    std::exit(2);
  }
  std::fclose(f);
  env_report().path = path;
  env_report().device = device;
  std::atexit(write_env_report);
  return true;
}

void add_to_env_kernel_report(const LaunchCounts& k) {
  EnvReport& r = env_report();
  if (r.device) add_launch(r.rows, r.index, k, *r.device);
}

}  // namespace internal
}  // namespace cudasim
