#!/usr/bin/env bash
# Installs what actbench needs from Debian's packages, only what is missing.
# The CUDA toolkit is not installed here: the build uses it when /usr/local/cuda exists.
set -euo pipefail
packages=(cmake g++ clang make libeigen3-dev libcli11-dev libgtest-dev libbenchmark-dev
          openmpi-bin libopenmpi-dev python3 python3-numpy python3-matplotlib nlohmann-json3-dev
          python3-torch
          slurmctld slurmd slurm-client munge)  # a one-node Slurm for tests/test_sweep_slurm.py
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
