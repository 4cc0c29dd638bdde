#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every ctest test (labels cpu,
# mpi; gpu tests skip without a device). Extra arguments go to ctest (e.g. -L cpu).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ACTBENCH_BUILD:-$root/build}"
bash "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
