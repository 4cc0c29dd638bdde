#pragma once
// The kernel report: the counters of counted launches (cudasim/counters.hpp) summed per launch
// or per kernel function, with what they mean for a real device: excess sectors (and the
// source lines that cause them), bytes moved against the declared minimum, occupancy, launch
// waves and a MODELED time on an H100 or an A100 (tools/cudasim/README.md, "Kernel report").
// Host code, in the binaries that have the counters (the race variant).
//
// Environment: CUDASIM_KERNEL_REPORT=FILE turns the counters on and, when the process exits,
// writes the report of every counted launch, one row per kernel function, to FILE (CSV when
// FILE ends in .csv, else the text form); CUDASIM_REPORT_DEVICE=h100 (default) | a100 names
// the device its modeled columns are for.
#include <cstdint>
#include <string>
#include <vector>

#include "cudasim/counters.hpp"

namespace cudasim {

// A device's limits, as its maker states them (each with its source in the README).
struct ModelDevice {
  const char* name;                // "h100", "a100": the suffix of the modeled columns
  const char* description;         // "H100 SXM5 80GB"
  double dram_bytes_per_s;         // DRAM bandwidth
  int sms;                         // streaming multiprocessors
  double clock_hz;                 // SM boost clock
  int shared_bytes_per_clock_per_sm;  // 32 banks x 4 bytes: one wavefront per clock
  int max_threads_per_sm, max_blocks_per_sm;
  uint64_t shared_per_sm, shared_per_block_max;  // bytes, the opt-in maximum per block
  uint64_t shared_reserved_per_block;            // bytes the system reserves for each block
  double tensor_flops;  // dense bf16/fp16 tensor-core FLOP/s (fp32 accumulate): 16-bit GEMMs
  double fp32_flops;    // FP32 FLOP/s of the CUDA cores: fp32 GEMMs (cuBLASLt's COMPUTE_32F)
};
const std::vector<ModelDevice>& model_devices();
// Null when `name` is none of model_devices().
const ModelDevice* find_model_device(const std::string& name);
std::string model_device_names();  // "h100 | a100"

// The model's assumptions besides the device's limits (stated in the README).
constexpr double kModeledLaunchOverheadUs = 2.0;  // per launch, added to the bound below
constexpr double kModeledWaveMinimumUs = 1.0;     // the least time one wave of blocks takes
constexpr double kModeledGemmEfficiency = 0.7;    // of the math peak, for a library GEMM row

// Where one launch stands on `dev`: resident blocks per SM from its block size and shared
// memory (static + dynamic + the reserved bytes), the waves its grid takes, and its modeled
// time = launch overhead + max(DRAM bytes / bandwidth, shared wavefronts / (SMs x clock x
// bytes per clock / 128), waves x the wave minimum), DRAM bytes being the launch's unique
// bytes read and written (the no-cache lower bound).
struct LaunchModel {
  uint64_t shared_per_block = 0;  // bytes, as the occupancy counts them
  int blocks_per_sm = 0;          // 0: the block does not fit an SM (no time is modeled)
  const char* limited_by = "";    // "threads", "blocks", "shared memory"
  uint64_t waves = 0;
  double dram_us = 0, shared_us = 0, waves_us = 0, math_us = 0, total_us = 0;
};
LaunchModel model_launch(const LaunchCounts& launch, const ModelDevice& dev);

// A source line's sectors beyond the ideal (loads and stores).
struct LineExcess {
  std::string where;  // file:line
  uint64_t sectors = 0;
};

// One row of the report: one launch, or every launch of one kernel function summed. Fields
// that differ between the summed launches are flagged `varies` (empty in the CSV).
struct KernelRow {
  std::string kernel, function;
  std::vector<std::string> launched_at;  // the distinct file:line the launches are written at
  uint64_t launches = 0;
  uint64_t block_sample = 1;  // the largest block sample of the launches (counts scaled to whole grids)
  Dim grid, block;
  uint64_t dynamic_smem_bytes = 0, static_smem_bytes = 0;
  bool geometry_varies = false;  // grid, block or shared memory differ between the launches
  AccessCounts total;
  uint64_t unique_bytes_read = 0, unique_bytes_written = 0;
  uint64_t min_bytes = 0;  // 0 unless every launch declared its minimum
  std::vector<LineExcess> excess_lines;  // every line with excess, largest first
  LaunchModel model;  // summed: waves and times; blocks_per_sm 0 when it varies
  const ModelDevice* device = nullptr;
  // A library call the simulator does not execute as kernels (a cuBLASLt GEMM, gemm_row): no
  // counts, only its FLOPs, its bytes (min_bytes) and their modeled time.
  bool library_call = false;
  double flops = 0;
  uint64_t excess_sectors() const;
  uint64_t bytes_moved() const;  // (load + store sectors) x 32: what L1 is asked for
};

// A library GEMM (cuBLASLt) as one row: `calls` calls of `flops` FLOPs and `bytes` bytes in all
// (A and B read, C read when beta != 0, D written: its minimum), modeled as launch overhead +
// max(bytes / DRAM bandwidth, flops / (peak x kModeledGemmEfficiency)), the peak being the
// tensor cores' for 16-bit operands and the CUDA cores' FP32 rate otherwise.
KernelRow gemm_row(const std::string& function, uint64_t calls, double flops, uint64_t bytes, bool tensor_cores,
                   const ModelDevice& dev);

// One row per launch, in launch order.
std::vector<KernelRow> launch_rows(const std::vector<LaunchCounts>& launches, const ModelDevice& dev);
// One row per kernel function (its first launch's order), every launch of it summed.
std::vector<KernelRow> kernel_rows(const std::vector<LaunchCounts>& launches, const ModelDevice& dev);

// The report's columns, declared once: name (the modeled ones end in _<device>), unit and
// meaning. kernel_report_csv_* and the text form write them.
struct ReportColumn {
  std::string name;
  const char* unit;
  const char* meaning;
};
std::vector<ReportColumn> kernel_report_columns(const ModelDevice& dev);
std::vector<std::string> kernel_report_csv_header(const ModelDevice& dev);
std::vector<std::string> kernel_report_csv_fields(const KernelRow& row);
// A CSV line of `fields` (quoted where they need it), newline-terminated.
std::string kernel_report_csv_line(const std::vector<std::string>& fields);
// The text form: per row, one "name  value unit" line per column.
std::string kernel_report_text(const std::vector<KernelRow>& rows, const ModelDevice& dev);

}  // namespace cudasim
