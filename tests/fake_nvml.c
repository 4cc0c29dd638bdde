/* A stand-in for libnvidia-ml.so.1 with fixed readings, so that runtime/gpu_state.cpp's
 * run-time loading and formatting are tested without a GPU (ACTBENCH_NVML_LIBRARY names it).
 * Only the device "00000000:01:00.0" exists. */
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static int g_device;

EXPORT int nvmlInit_v2(void) { return 0; }
EXPORT int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  if (strcmp(bus_id, "00000000:01:00.0") != 0) return 6; /* NVML_ERROR_NOT_FOUND */
  *device = &g_device;
  return 0;
}
EXPORT int nvmlDeviceGetClockInfo(void* device, int type, unsigned* mhz) {
  if (device != &g_device) return 2;
  if (type == 1) *mhz = 1980; /* SM */
  else if (type == 2) *mhz = 2619; /* memory */
  else return 3; /* NVML_ERROR_NOT_SUPPORTED */
  return 0;
}
EXPORT int nvmlDeviceGetPowerManagementLimit(void* device, unsigned* milliwatts) {
  *milliwatts = 700000;
  return device == &g_device ? 0 : 2;
}
/* Only the older name, so that the fallback lookup is what finds it. */
EXPORT int nvmlDeviceGetCurrentClocksThrottleReasons(void* device, unsigned long long* reasons) {
  *reasons = 0x4; /* SW power cap */
  return device == &g_device ? 0 : 2;
}
