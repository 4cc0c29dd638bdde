#!/usr/bin/env bash
# The main job: every measurement this machine can make, into out/ (or $1).
#   meta  the four paper models per rank (t = 8 emulated), all configurations: memory
#   cpu   the tiny layer, all configurations, t = 1 and t = 2 over MPI: time and memory
#   cuda  the Table 4 experiment (22B layer, t = 8 emulated) when a GPU is present
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ACTBENCH_BUILD:-$root/build}"
out="${1:-$root/out}"
bash "$root/scripts/build.sh"
mkdir -p "$out"
lr="$build/runners/layer_run"
configs=baseline,sp,full,selective,selective+sp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
       OMPI_MCA_btl_vader_single_copy_mechanism=none

echo "== meta: activation memory of one layer per rank, four paper models, t = 8"
rm -f "$out/meta_models.csv"
for m in 22b 175b 530b 1t; do
  "$lr" --backend meta --model "$m" --tp 8 --emulate-tp --config "$configs" --csv "$out/meta_models.csv" >/dev/null
done

echo "== cpu: tiny layer, t = 1 and t = 2 (MPI)"
rm -f "$out/cpu_tiny.csv"
"$lr" --backend cpu --model tiny --config "$configs" --iters 20 --csv "$out/cpu_tiny.csv" >/dev/null
mpirun -np 2 "$lr" --backend cpu --model tiny --tp 2 --config "$configs" --iters 20 --csv "$out/cpu_tiny.csv" >/dev/null

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && "$lr" --backend cuda --iters 1 --warmup 0 \
     --config baseline --csv /dev/null >/dev/null 2>&1; then
  echo "== cuda: Table 4 (22B layer, t = 8 emulated, bf16)"
  rm -f "$out/table4_cuda.csv"
  "$lr" --backend cuda --model 22b --tp 8 --emulate-tp --config "$configs" --warmup 3 --iters 20 \
        --csv "$out/table4_cuda.csv"
else
  echo "== cuda: skipped (no usable GPU or no CUDA backend in this build)"
fi

"${ACTBENCH_PYTHON:-python3}" "$root/tools/summarize.py" "$out/meta_models.csv" "$out/cpu_tiny.csv"
echo
echo "results: $out/meta_models.csv $out/cpu_tiny.csv"
