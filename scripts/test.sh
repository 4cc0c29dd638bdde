#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every ctest test (labels cpu,
# mpi, gpu-sim; gpu tests skip without a device). Extra arguments go to that ctest (e.g. -L cpu).
# Then the simulator build (build-sim/, -DACTBENCH_CUDA_SIM=ON): the cuda backend on the CPU
# simulator, its tests (label cuda-sim). ACTBENCH_CUDA_SIM_TESTS=0 leaves that part out.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ACTBENCH_BUILD:-$root/build}"
sim_build="${ACTBENCH_SIM_BUILD:-$root/build-sim}"
bash "$root/scripts/build.sh"
status=0
(cd "$build" && ctest --output-on-failure -j "$(nproc)" "$@") || status=$?
if [ "${ACTBENCH_CUDA_SIM_TESTS:-1}" != 0 ]; then
  echo "== the cuda backend on the simulator (build-sim, label cuda-sim)"
  ACTBENCH_BUILD="$sim_build" bash "$root/scripts/build.sh" -DACTBENCH_CUDA_SIM=ON
  (cd "$sim_build" && ctest --output-on-failure -j "$(nproc)" -L cuda-sim) || status=$?
fi
exit "$status"
