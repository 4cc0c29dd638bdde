#include "runtime/gpu_state.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace actbench {
namespace {

// The few NVML entry points used, declared from NVML's API reference (no header needed):
// every call returns nvmlReturn_t, 0 = NVML_SUCCESS; nvmlClockType_t NVML_CLOCK_SM = 1,
// NVML_CLOCK_MEM = 2; the power limit is in milliwatts.
using nvml_return = int;
using nvml_device = void*;
constexpr int kClockSm = 1, kClockMem = 2;

struct Nvml {
  nvml_return (*init)() = nullptr;
  nvml_return (*by_pci)(const char*, nvml_device*) = nullptr;
  nvml_return (*clock)(nvml_device, int, unsigned*) = nullptr;
  nvml_return (*power_limit)(nvml_device, unsigned*) = nullptr;
  nvml_return (*reasons)(nvml_device, unsigned long long*) = nullptr;
  bool ok = false;
};

template <class F>
void load(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
}

// Loaded and initialised once per process; left loaded (NVML is cheap to keep).
const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("ACTBENCH_NVML_LIBRARY");
    void* lib = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    load(lib, "nvmlInit_v2", n.init);
    load(lib, "nvmlDeviceGetHandleByPciBusId_v2", n.by_pci);
    load(lib, "nvmlDeviceGetClockInfo", n.clock);
    load(lib, "nvmlDeviceGetPowerManagementLimit", n.power_limit);
    load(lib, "nvmlDeviceGetCurrentClocksEventReasons", n.reasons);  // the newer name
    if (!n.reasons) load(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", n.reasons);
    n.ok = n.init && n.by_pci && n.init() == 0;
  });
  return n;
}

}  // namespace

GpuState read_gpu_state(const std::string& pci_bus_id) {
  GpuState s;
  const Nvml& n = nvml();
  nvml_device dev = nullptr;
  if (!n.ok || pci_bus_id.empty() || n.by_pci(pci_bus_id.c_str(), &dev) != 0) return s;
  unsigned v = 0;
  if (n.clock && n.clock(dev, kClockSm, &v) == 0) s.sm_clock_mhz = std::to_string(v);
  if (n.clock && n.clock(dev, kClockMem, &v) == 0) s.mem_clock_mhz = std::to_string(v);
  if (n.power_limit && n.power_limit(dev, &v) == 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v / 1000.0);
    s.power_limit_w = buf;
  }
  unsigned long long r = 0;
  if (n.reasons && n.reasons(dev, &r) == 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", r);
    s.throttle_reasons = buf;
  }
  return s;
}

}  // namespace actbench
