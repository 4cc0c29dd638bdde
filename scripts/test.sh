#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every ctest test (labels cpu,
# mpi, gpu-sim; gpu tests skip without a device). Extra arguments go to that ctest (e.g. -L cpu).
# Then the simulator build (build-sim/, -DACTBENCH_CUDA_SIM=ON): the cuda backend on the CPU
# simulator, its tests (label cuda-sim); and the counting flavour of it (build-sim-counters/,
# -DACTBENCH_CUDA_SIM_COUNTERS=ON: only layer_run, for the tests of --kernel-report and of
# runners/modeled_table4.py).
# ACTBENCH_CUDA_SIM_TESTS=0 leaves both out.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ACTBENCH_BUILD:-$root/build}"
sim_build="${ACTBENCH_SIM_BUILD:-$root/build-sim}"
counting_build="${ACTBENCH_SIM_COUNTERS_BUILD:-$root/build-sim-counters}"
bash "$root/scripts/build.sh"
status=0
(cd "$build" && ctest --output-on-failure -j "$(nproc)" "$@") || status=$?
if [ "${ACTBENCH_CUDA_SIM_TESTS:-1}" != 0 ]; then
  echo "== the cuda backend on the simulator (build-sim, label cuda-sim)"
  ACTBENCH_BUILD="$sim_build" bash "$root/scripts/build.sh" -DACTBENCH_CUDA_SIM=ON
  (cd "$sim_build" && ctest --output-on-failure -j "$(nproc)" -L cuda-sim) || status=$?
  echo "== layer_run --kernel-report (build-sim-counters: kernels counted)"
  cmake -S "$root" -B "$counting_build" -DCMAKE_BUILD_TYPE=Release -DACTBENCH_CUDA_SIM=ON \
    -DACTBENCH_CUDA_SIM_COUNTERS=ON >/dev/null
  cmake --build "$counting_build" -j "$(nproc)" --target layer_run
  (cd "$counting_build" && ctest --output-on-failure -R '^cuda_sim_(kernel_report|modeled_table4)$') || status=$?
fi
exit "$status"
