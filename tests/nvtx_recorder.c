/* A minimal NVTX3 injection library for tests: NVTX loads it when NVTX_INJECTION64_PATH
 * names it, calls InitializeInjectionNvtx2, and we point the core RangePushA/RangePop slots
 * at functions that log every push and pop. The log goes to $ACTBENCH_NVTX_LOG, with
 * ".rank<N>" appended under mpirun so that ranks do not share a file. Lines:
 *   push <name>
 *   pop
 * Written with the NVTX3 headers' documented injection interface (nvtxDetail/nvtxInit.h,
 * nvtxTypes.h); nothing else from NVTX is linked. */
#include <nvtx3/nvToolsExt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE* g_log = NULL;
static int g_depth = 0;

static int recorder_push(const char* message) {
  if (g_log) fprintf(g_log, "push %s\n", message ? message : "");
  return g_depth++;
}

static int recorder_pop(void) {
  if (g_log) fputs("pop\n", g_log);
  return --g_depth;
}

static void close_log(void) {
  if (g_log) fclose(g_log);
  g_log = NULL;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const char* base = getenv("ACTBENCH_NVTX_LOG");
  if (!base || !get_export_table) return 0;
  char path[4096];
  const char* rank = getenv("OMPI_COMM_WORLD_RANK");
  if (rank) snprintf(path, sizeof path, "%s.rank%s", base, rank);
  else snprintf(path, sizeof path, "%s", base);
  const NvtxExportTableCallbacks* callbacks = (const NvtxExportTableCallbacks*)get_export_table(NVTX_ETID_CALLBACKS);
  if (!callbacks || !callbacks->GetModuleFunctionTable) return 0;
  NvtxFunctionTable table = NULL;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table) return 0;
  if (size < NVTX_CBID_CORE_RangePop) return 0; /* size is the last valid index */
  g_log = fopen(path, "w");
  if (!g_log) return 0;
  atexit(close_log);
  *table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)recorder_push;
  *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)recorder_pop;
  return 1;
}
