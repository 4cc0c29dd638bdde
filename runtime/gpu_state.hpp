#pragma once
// The GPU's clocks and limits at a moment, read through NVML (as nvbench records them), so a
// result shows when clocks were not stable. NVML ships with the driver, not the toolkit: it is
// loaded at run time (dlopen of libnvidia-ml.so.1, or $ACTBENCH_NVML_LIBRARY), so nothing is
// needed to build; where it is absent or a query fails, the fields stay empty.
#include <string>

namespace actbench {

struct GpuState {
  std::string sm_clock_mhz, mem_clock_mhz;  // current clocks
  std::string power_limit_w;                // power management limit
  std::string throttle_reasons;             // clocks event (throttle) reasons bitmask, hex
};

// The device with this PCI bus id (as cudaDeviceGetPCIBusId writes it).
GpuState read_gpu_state(const std::string& pci_bus_id);

}  // namespace actbench
