#!/usr/bin/env bash
# The whole GPU evaluation in one command, within a time budget, on a GPU node. The runner is
# runners/gpu_eval.py (python3 >= 3.9, standard library only); `--help` says everything:
#   bash scripts/gpu_eval.sh OUTDIR [--budget SEC] [--steps LIST] [--quick] [--fresh] ...
#   bash scripts/gpu_eval.sh --list-steps | --env | --unpack OUTDIR_OR_TARBALL [RESULTS_DIR]
root="$(cd "$(dirname "$0")/.." && pwd)"
command -v python3 >/dev/null 2>&1 || { echo "gpu_eval: error: python3 not found (runners/gpu_eval.py needs it)" >&2; exit 2; }
exec python3 "$root/runners/gpu_eval.py" "$@"
