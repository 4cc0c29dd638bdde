# The race variant's flags, one home for the simulator's own build (tools/cudasim/CMakeLists.txt)
# and the simulator build of the whole backend (sim_backend.cmake, tools/standins).
#
# Kernels: every access of the source as written. -O0: at -O1 SROA splits a 16-byte
# `uint4 v = *p;` whose parts are used one by one into separate 2- or 4-byte loads (nvcc's
# load/store vectorizer merges them back; the host has none), which the counters would count
# as 8 requests. -tsan-instrument-read-before-write: TSan drops the hook of a load followed by
# a store to the same address (`x[i] *= 2`), which the race checker does not need but the
# counters do.
set(cudasim_kernel_flags_race -O0 -fsanitize=thread -gline-tables-only -mllvm -tsan-instrument-read-before-write)
# -fsanitize=thread turns aggregate copies (`uint4 v = *p;`) into calls of memcpy/memmove/memset,
# which race.cpp intercepts (TSan's runtime would).
set(cudasim_link_race -Wl,--wrap=memcpy,--wrap=memmove,--wrap=memset)
# The simulator's sources the race variant adds: the hooks, the counters, the kernel report and
# the symbolizer of their source lines (relative to tools/cudasim).
set(cudasim_sources_race src/race.cpp src/counters.cpp src/kernel_report.cpp src/symbolize.cpp)
