#!/usr/bin/env bash
# Configures and builds actbench into build/ (CUDA backend when nvcc is found).
# ACTBENCH_BUILD overrides the build folder; extra arguments go to cmake's configure step.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ACTBENCH_BUILD:-$root/build}"
bash "$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
