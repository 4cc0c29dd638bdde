#!/usr/bin/env bash
# The whole GPU evaluation in one command, within a time budget, on a GPU node: the GPU kernel
# tests, Table 4 (with its CUPTI phase split, and fused attention), the Google Benchmark
# binaries, the PyTorch peer, fused attention against SDPA and the sequence-length sweep. Each
# step runs under its own timeout and the evaluation goes on past failures; results are packed
# into one archive, OUTDIR/results.tar.gz, after every step. Run it again with the same OUTDIR to
# resume: steps that finished are kept, the rest run. Without a GPU it exits 0 and marks every
# step skipped with the reason.
#
#   bash scripts/build.sh                                  # once: build/ (CUDA on when nvcc exists)
#   bash scripts/gpu_eval.sh OUTDIR [--budget SEC] [--steps LIST] [--quick] [--fresh]
#                                   [--bin-dir DIR] [--max-step SEC] [--force] [--python PY]
#   bash scripts/gpu_eval.sh --list-steps
#   bash scripts/gpu_eval.sh --env [--bin-dir DIR]        # prints `export LD_LIBRARY_PATH=...`
#   bash scripts/gpu_eval.sh --unpack OUTDIR_OR_TARBALL [RESULTS_DIR]   # merge into results/
#
# Steps, in this order (groups in --steps: tests table4 bench peer attention sweep cputests
# sanitize, or single steps; default: all but cputests and sanitize):
#   tests          test_gpu_ops (GPU kernels against the cpu reference; run first, flagged if failed)
#   table4         layer_run --backend cuda --model 22b --tp 8 --emulate-tp, the five configurations,
#   table4_cupti     --warmup 3 --iters 20; then the same with --cupti (Figure 8's phase split);
#   table4_fused     then with --attention fused
#   bench_kernels  bench_kernels --backend=cuda, bench_layer --backend=cuda (JSON)
#   bench_layer
#   peer           bench/peers/side_by_side.sh: the PyTorch eager peer beside our layer, and its table
#   attention_s*   bench_kernels --backend=cuda --benchmark_filter=attention --seq=2048|8192|32768 and
#   attention_sdpa   bench/peers/attention_sdpa.py --seq 2048,8192,32768 (each only if it exists);
#                    then attention_table.py's table of both (raw/attention_table.txt, summary)
#   sweep_seqlen   runners/sweep.py seqlen --backend cuda (resumable; whatever time is left),
#   sweep_seqlen_fused   then with --attention fused
#   cputests       the cpu gtests (of a portable bundle: bin/cpu_tests.tar.xz); not in the default
#   sanitize_memcheck   compute-sanitizer memcheck / racecheck (shared memory) on test_gpu_ops, the
#   sanitize_racecheck  kernels at small shapes (worth one run when kernels change); not in the default
# Before them, always: `env` records nvidia-smi, versions, the libraries the binaries resolve.
#
# Binaries: --bin-dir DIR (a build folder, or a bundle from scripts/portable_bundle.sh for a node
# without MPI or Google Benchmark), else $ACTBENCH_BUILD, else build/, else .portable-bundle/.
# Time: --budget (default 2400 s) is shared by the steps in order; a step gets min(its cap, what is
# left, --max-step); one that cannot get its minimum is skipped and named at the end: run again
# with the same OUTDIR (and a budget) to do it. --fresh forgets an earlier run in OUTDIR.
# --quick: warm-up 1, 3 iterations, benchmark_min_time 0.05 (a first look). --force: run the GPU
# steps without a GPU too (they fail, each with its reason: for testing this script).
# Libraries: LD_LIBRARY_PATH (for our binaries only; python keeps its own) = the bundle's lib/,
# then PyTorch's site-packages/nvidia/*/lib, then /usr/local/cuda/lib64 (and extras/CUPTI/lib64),
# then the bundle's lib/fallback/{cuda,nccl-stub,cxx} each only if ldd finds no such library.
#
# OUTDIR gets log.txt (everything), steps.csv (step, status, seconds, detail; status ok | failed |
# timeout | skipped), summary.txt (also printed) and results.tar.gz:
#   results/  CSVs and JSON to keep: table4_<dev>.csv, table4_<dev>_cupti.csv,
#             table4_fused_<dev>.csv, peer_torch_<dev>.csv, bench_*_<dev>.json,
#             attention_*_<dev>*, seqlen_cuda_<dev>.csv
#   raw/      test XML, nvidia-smi, versions, the CUPTI run's own rows, the peer's table
# `--unpack` appends those CSV rows to results/ (same header; rows carry their provenance) and
# puts the rest in results/device/<dev>-<UTC time>/. Exit status: 0 when the evaluation ran (see
# steps.csv), 2 bad usage.
set -uo pipefail
export PYTHONUNBUFFERED=1   # a step killed at its timeout still leaves its output in the log

root="$(cd "$(dirname "$0")/.." && pwd)"
me="gpu_eval"
usage_lines='2,55p'

GROUP_tests="tests"
GROUP_table4="table4 table4_cupti table4_fused"
GROUP_bench="bench_kernels bench_layer"
GROUP_peer="peer"
GROUP_attention="attention_s2048 attention_s8192 attention_s32768 attention_sdpa"
GROUP_sweep="sweep_seqlen sweep_seqlen_fused"
GROUP_cputests="cputests"
GROUP_sanitize="sanitize_memcheck sanitize_racecheck"
ALL_STEPS="$GROUP_tests $GROUP_table4 $GROUP_bench $GROUP_peer $GROUP_attention $GROUP_sweep $GROUP_cputests $GROUP_sanitize"
DEFAULT_STEPS="$GROUP_tests $GROUP_table4 $GROUP_bench $GROUP_peer $GROUP_attention $GROUP_sweep"
# cap (s) and minimum (s) of each step's timeout
declare -A CAP=([tests]=150 [table4]=120 [table4_cupti]=120 [table4_fused]=120 [bench_kernels]=150
                [bench_layer]=120 [peer]=240 [attention_s2048]=90 [attention_s8192]=90 [attention_s32768]=120
                [attention_sdpa]=150 [sweep_seqlen]=300 [sweep_seqlen_fused]=300 [cputests]=240
                [sanitize_memcheck]=300 [sanitize_racecheck]=240)
declare -A MIN=([tests]=20 [table4]=30 [table4_cupti]=30 [table4_fused]=30 [bench_kernels]=30
                [bench_layer]=30 [peer]=60 [attention_s2048]=20 [attention_s8192]=20 [attention_s32768]=20
                [attention_sdpa]=30 [sweep_seqlen]=60 [sweep_seqlen_fused]=60 [cputests]=30
                [sanitize_memcheck]=60 [sanitize_racecheck]=60)
RESERVE=10   # seconds kept for the last packing

die_usage() { echo "$me: error: $*" >&2; exit 2; }

# ---------------------------------------------------------------- binaries and libraries
bundle=""   # the folder the binaries come from: a build folder or a portable bundle
find_bundle() {  # --bin-dir, else $ACTBENCH_BUILD, else build/, else .portable-bundle/
  local c
  if [[ -n "${opt_bundle:-}" ]]; then
    [[ -d "$opt_bundle" ]] || return 1
    bundle="$(cd "$opt_bundle" && pwd)"; return 0
  fi
  bundle=""
  for c in "${ACTBENCH_BUILD:-}" "$root/build" "$root/.portable-bundle"; do
    [[ -n "$c" && ( -x "$c/runners/layer_run" || -x "$c/bin/layer_run" ) ]] && { bundle="$(cd "$c" && pwd)"; return 0; }
  done
  return 0
}
binpath() {  # a binary of a portable bundle (bin/) or of a build folder (runners/ bench/ tests/)
  local d
  [[ -n "$bundle" ]] || return 1
  for d in bin runners bench tests; do
    [[ -f "$bundle/$d/$1" && -x "$bundle/$d/$1" ]] && { echo "$bundle/$d/$1"; return 0; }
  done
  return 1
}
libpath=""
lib_notes=""
make_libpath() {
  local dirs=() sp d probe out
  [[ -n "$bundle" && -d "$bundle/lib" ]] && dirs+=("$bundle/lib")
  if command -v "$py" >/dev/null 2>&1; then
    while read -r sp; do
      [[ -n "$sp" && -d "$sp/nvidia" ]] || continue
      for d in "$sp"/nvidia/*/lib; do [[ -d "$d" ]] && dirs+=("$d"); done
    done < <(timeout 30 "$py" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [[ -d "$d" ]] && dirs+=("$d")
  done
  libpath="$(IFS=:; echo "${dirs[*]}")"
  # what the machine had set (the driver's libcuda may be found only through it)
  [[ -n "${LD_LIBRARY_PATH:-}" ]] && libpath+=":$LD_LIBRARY_PATH"
  probe="$(binpath layer_run)" || { lib_notes="no layer_run to probe"; return 0; }
  out="$(LD_LIBRARY_PATH="$libpath" ldd "$probe" 2>&1)"
  if grep -qE '^\s*lib(cudart|cupti)\S* => not found' <<<"$out" && [[ -d "$bundle/lib/fallback/cuda" ]]; then
    libpath+=":$bundle/lib/fallback/cuda"; lib_notes+="fallback cudart/cupti; "
  fi
  if grep -qE '^\s*libnccl\S* => not found' <<<"$out" && [[ -d "$bundle/lib/fallback/nccl-stub" ]]; then
    libpath+=":$bundle/lib/fallback/nccl-stub"; lib_notes+="NCCL stub (no NCCL here: nccl_version stays empty); "
  fi
  if grep -qE "GLIBCXX_[0-9.]+' not found|CXXABI_[0-9.]+' not found" <<<"$out" && [[ -d "$bundle/lib/fallback/cxx" ]]; then
    libpath+=":$bundle/lib/fallback/cxx"; lib_notes+="bundled libstdc++; "
  fi
  libpath="${libpath#:}"
}
run_bin() {  # run_bin NAME ARGS...: a bundle binary with the bundle's library path
  local b
  b="$(binpath "$1")" || { echo "$me: $1 is not in $bundle" >&2; return 127; }
  shift
  LD_LIBRARY_PATH="$libpath" "$b" "$@"
}
make_view() {  # a build-folder look-alike of wrappers (runners/layer_run ...) for sweep.py, side_by_side.sh
  local n sub b
  for n in layer_run:runners theory:runners bench_kernels:bench bench_layer:bench; do
    sub="${n#*:}"; n="${n%%:*}"
    b="$(binpath "$n")" || continue
    mkdir -p "$view/$sub"
    printf '#!/usr/bin/env bash\nexport LD_LIBRARY_PATH=%q\nexec %q "$@"\n' "$libpath" "$b" >"$view/$sub/$n"
    chmod +x "$view/$sub/$n"
  done
}

# ---------------------------------------------------------------- --unpack
unpack() {
  local src="$1" results="${2:-$root/results}" tmp tarball stamp dev name dest n
  if [[ -d "$src" ]]; then tarball="$src/results.tar.gz"; else tarball="$src"; fi
  [[ -f "$tarball" ]] || die_usage "no results.tar.gz at $src"
  tmp="$(mktemp -d)"
  tar -xzf "$tarball" -C "$tmp" || { rm -rf "$tmp"; die_usage "cannot read $tarball"; }
  dev="$(sed -n 's/^dev: //p' "$tmp/raw/run.txt" 2>/dev/null)"
  stamp="$(sed -n 's/^start_utc: //p' "$tmp/raw/run.txt" 2>/dev/null | tr -d ':-')"
  local keep="$results/device/${dev:-gpu}-${stamp:-$(date -u +%Y%m%dT%H%M%SZ)}"
  if [[ -e "$keep" ]]; then rm -rf "$tmp"; die_usage "already unpacked: $keep exists (its rows are in $results)"; fi
  mkdir -p "$results" "$keep"
  for f in "$tmp"/results/*; do
    [[ -f "$f" ]] || continue
    name="$(basename "$f")"
    if [[ "$name" != *.csv ]]; then cp "$f" "$keep/"; echo "  $keep/$name"; continue; fi
    dest="$results/$name"
    n=$(( $(wc -l <"$f") - 1 ))
    if [[ ! -s "$dest" ]]; then
      cp "$f" "$dest"; echo "  $dest: new, $n rows"
    elif [[ "$(head -1 "$dest")" == "$(head -1 "$f")" ]]; then
      tail -n +2 "$f" >>"$dest"; echo "  $dest: $n rows appended"
    else
      cp "$f" "$keep/"; echo "  $keep/$name: header differs from $dest, kept apart"
    fi
  done
  [[ -d "$tmp/raw" ]] && cp -r "$tmp/raw" "$keep/"
  for f in log.txt steps.csv summary.txt; do [[ -d "$src" && -f "$src/$f" ]] && cp "$src/$f" "$keep/"; done
  echo "  $keep/: raw files, JSON, log"
  rm -rf "$tmp"
}

# ---------------------------------------------------------------- arguments
outdir="" opt_bundle="" steps_arg="" budget=2400 max_step=0 quick=0 force=0 fresh=0 mode=run
py="${ACTBENCH_TORCH_PYTHON:-python3}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) sed -n "$usage_lines" "$0"; exit 0 ;;
    --list-steps) mode=list; shift ;;
    --env) mode=env; shift ;;
    --unpack) [[ $# -ge 2 ]] || die_usage "--unpack needs a folder or results.tar.gz"
              unpack "$2" "${3:-}"; exit 0 ;;
    --steps) [[ $# -ge 2 ]] || die_usage "--steps needs a list"; steps_arg="$2"; shift 2 ;;
    --budget) [[ "${2:-}" =~ ^[0-9]+$ ]] || die_usage "--budget needs seconds"; budget="$2"; shift 2 ;;
    --max-step) [[ "${2:-}" =~ ^[0-9]+$ ]] || die_usage "--max-step needs seconds"; max_step="$2"; shift 2 ;;
    --bin-dir) [[ $# -ge 2 ]] || die_usage "--bin-dir needs a folder"; opt_bundle="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die_usage "--python needs a program"; py="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --force) force=1; shift ;;
    --fresh) fresh=1; shift ;;
    -*) die_usage "unknown option '$1' (see --help)" ;;
    *) [[ -z "$outdir" ]] || die_usage "one OUTDIR only (got '$outdir' and '$1')"; outdir="$1"; shift ;;
  esac
done

if [[ "$mode" == list ]]; then
  for g in tests table4 bench peer attention sweep cputests sanitize; do v="GROUP_$g"; echo "$g: ${!v}"; done
  echo "default: $DEFAULT_STEPS"
  exit 0
fi
find_bundle || die_usage "no folder of binaries at $opt_bundle"
if [[ "$mode" == env ]]; then
  make_libpath
  printf 'export LD_LIBRARY_PATH=%q\n' "$libpath"
  [[ -n "$lib_notes" ]] && echo "# $lib_notes"
  exit 0
fi
[[ -n "$outdir" ]] || die_usage "usage: gpu_eval.sh OUTDIR [options] (see --help)"

selected=" "
for s in ${steps_arg//,/ }; do
  v="GROUP_$s"
  if [[ -n "${!v:-}" ]]; then selected+="${!v} "
  elif [[ " $ALL_STEPS " == *" $s "* ]]; then selected+="$s "
  else die_usage "unknown step '$s' (see --list-steps)"
  fi
done
[[ -n "$steps_arg" ]] || selected=" $DEFAULT_STEPS "

mkdir -p "$outdir" || die_usage "cannot create $outdir"
outdir="$(cd "$outdir" && pwd)"
log="$outdir/log.txt"
steps_csv="$outdir/steps.csv"
summary="$outdir/summary.txt"
work="$(mktemp -d "${TMPDIR:-/tmp}/actbench_gpu.XXXXXX")"
pack="$work/pack"
view="$work/view"
R="$pack/results"
RAW="$pack/raw"
mkdir -p "$R" "$RAW" "$view"
trap 'rm -rf "$work"' EXIT
# Resuming: the archive of an earlier run in OUTDIR is the starting point, and its steps that
# finished ok are not run again (--fresh forgets them).
declare -A DONE=()
if (( fresh )); then rm -f "$outdir/results.tar.gz" "$steps_csv" "$summary" "$log"; fi
if [[ -f "$outdir/results.tar.gz" && -f "$steps_csv" ]] && tar -xzf "$outdir/results.tar.gz" -C "$pack" 2>/dev/null; then
  while IFS=, read -r s st _; do [[ "$st" == ok && "$s" != env ]] && DONE[$s]=1; done < <(tail -n +2 "$steps_csv")
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ): resuming; done before: ${!DONE[*]}" >>"$log"
else
  : >"$log"
fi
echo "step,status,seconds,detail" >"$steps_csv"
# A copy that lost the executable bits (or a read-only one): make them executable, else work on a copy.
if [[ -n "$bundle" && -d "$bundle/bin" ]]; then
  for f in "$bundle"/bin/*; do [[ -f "$f" && ! -x "$f" && "$f" != *.tar.xz ]] && chmod +x "$f" 2>/dev/null; done
  for f in "$bundle"/bin/*; do
    if [[ -f "$f" && ! -x "$f" && "$f" != *.tar.xz ]]; then
      cp -r "$bundle" "$work/bundle" && chmod +x "$work"/bundle/bin/* && bundle="$work/bundle"; break
    fi
  done
fi
have_gpu=0 gpu_name="" dev="nogpu" bundle_sha="" gpu_tests_failed=0 skipped_for_time=""
start=$(date +%s)
deadline=$((start + budget))
start_utc="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

say() { echo "$*"; echo "$*" >>"$log"; }
csvq() { local s="${1//$'\r'/}"; s="${s//\"/\"\"}"; printf '"%s"' "$s"; }
record() {  # record STEP STATUS SECONDS DETAIL
  printf '%s,%s,%s,%s\n' "$1" "$2" "$3" "$(csvq "$4")" >>"$steps_csv"
  printf '[%-18s] %-8s %6ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$log" "$work/steps.txt"
}
do_pack() {
  cp "$steps_csv" "$pack/raw/steps.csv" 2>/dev/null
  tar -C "$pack" -czf "$outdir/.results.tar.gz.part" results raw 2>/dev/null &&
    mv -f "$outdir/.results.tar.gz.part" "$outdir/results.tar.gz"
}
write_summary() {
  {
    echo "actbench GPU evaluation: ${gpu_name:-no GPU} ($dev), binaries $bundle_sha, started $start_utc, $(( $(date +%s) - start ))s"
    (( gpu_tests_failed )) && echo "WARNING: GPU correctness tests (test_gpu_ops) did not pass: treat the timings with care"
    echo
    cat "$work/steps.txt" 2>/dev/null
    if [[ -f "$RAW/side_by_side_table.txt" ]]; then echo; cat "$RAW/side_by_side_table.txt"; fi
    if [[ -s "$RAW/attention_table.txt" ]]; then echo; cat "$RAW/attention_table.txt"; fi
    if [[ -n "$skipped_for_time" ]]; then
      echo
      echo "not run for lack of time: ${skipped_for_time%,}"
      echo "to run them: bash scripts/gpu_eval.sh $outdir --budget SEC   (resumes; or only these: --steps ${skipped_for_time%,})"
    fi
    echo
    echo "results: $outdir/results.tar.gz ($(tar -tzf "$outdir/results.tar.gz" 2>/dev/null | grep -c '[^/]$') files);" \
         "merge into results/ with: bash scripts/gpu_eval.sh --unpack $outdir"
  } >"$summary"
}
on_signal() { say "$me: interrupted; packing what there is"; do_pack; write_summary; exit 143; }
trap on_signal TERM INT
left() { echo $((deadline - $(date +%s))); }

# ---------------------------------------------------------------- environment
gpus="$(command -v nvidia-smi >/dev/null 2>&1 && timeout 30 nvidia-smi -L 2>/dev/null || true)"
if grep -q '^GPU ' <<<"$gpus"; then   # whole output first: `nvidia-smi | grep -q` fails at random under pipefail
  have_gpu=1
  gpu_name="$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  dev="$(grep -oE '\b[A-Z]{1,3}[0-9]{2,4}\b' <<<"$gpu_name" | head -1 | tr '[:upper:]' '[:lower:]')"
  [[ -n "$dev" ]] || dev="$(tr -c 'A-Za-z0-9\n' '_' <<<"$gpu_name" | tr '[:upper:]' '[:lower:]')"
fi
make_libpath
make_view
bundle_sha="$(sed -n 's/^git_sha: //p' "$bundle/MANIFEST.txt" 2>/dev/null)"
[[ -n "$bundle_sha" ]] || bundle_sha="$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
export ACTBENCH_GIT_SHA="${ACTBENCH_GIT_SHA:-$bundle_sha}"   # torch_layer.py's provenance (a bundle has no .git)
if (( quick )); then W=1 I=3 MINTIME=0.05; else W=3 I=20 MINTIME=""; fi
say "== $me: ${gpu_name:-no GPU}, steps: $(echo $selected), budget ${budget}s, binaries ${bundle:-none}, results -> $outdir"
configs="baseline,sp,full,selective,selective+sp"

t0=$(date +%s)
{
  echo "dev: $dev"
  echo "gpu_name: $gpu_name"
  echo "start_utc: $start_utc"
  echo "host: $(hostname)"
  echo "binaries: ${bundle:-none}"
  echo "binaries_git_sha: $bundle_sha"
  echo "steps: $(echo $selected)"
  echo "budget_s: $budget"
  echo "quick: $quick"
  echo "ld_library_path: $libpath"
  echo "lib_notes: $lib_notes"
} >"$pack/raw/run.txt"
cat "$pack/raw/run.txt" >>"$log"
{
  if (( have_gpu )); then timeout 30 nvidia-smi; timeout 60 nvidia-smi -q; else echo "no GPU (nvidia-smi -L lists none)"; fi
} >"$pack/raw/nvidia-smi.txt" 2>&1
{
  echo "== uname"; uname -a
  echo "== os"; cat /etc/os-release 2>/dev/null | head -4
  echo "== glibc"; ldd --version 2>&1 | head -1
  echo "== cpu"; (lscpu 2>/dev/null || cat /proc/cpuinfo) | grep -m3 -E 'Model name|^CPU\(s\)|Socket'
  echo "== nvcc"; (/usr/local/cuda/bin/nvcc --version || nvcc --version) 2>&1 | tail -2
  echo "== python ($py)"
  timeout 90 "$py" -c 'import sys; print(sys.version.split()[0])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("nccl", ".".join(map(str, torch.cuda.nccl.version())), "device", torch.cuda.get_device_name(0))
except Exception as e:
    print("torch: not importable:", e)' 2>&1
  echo "== bundle MANIFEST"; cat "$bundle/MANIFEST.txt" 2>/dev/null || echo "(none)"
  echo "== libcuda (the driver's)"
  (ldconfig -p 2>/dev/null | grep -m2 'libcuda\.so\.1'; IFS=:; for d in $libpath; do ls "$d"/libcuda.so.1 2>/dev/null; done) |
    sed 's/^/  /' | grep . || echo "  libcuda.so.1 not found in ldconfig or LD_LIBRARY_PATH"
  echo "== ldd layer_run (LD_LIBRARY_PATH=$libpath)"
  if b="$(binpath layer_run)"; then LD_LIBRARY_PATH="$libpath" ldd "$b" 2>&1; else echo "(no layer_run)"; fi
} >"$pack/raw/versions.txt" 2>&1
cat "$pack/raw/versions.txt" >>"$log"
missing="$(grep -E '=> not found' "$pack/raw/versions.txt" | awk '{print $1}' | sort -u | tr '\n' ' ')"
if [[ -z "$bundle" ]]; then
  record env failed $(( $(date +%s) - t0 )) "no binaries: build with scripts/build.sh (or name them with --bin-dir)"
elif ! binpath layer_run >/dev/null; then
  record env failed $(( $(date +%s) - t0 )) "$bundle has no layer_run (build with scripts/build.sh)"
elif [[ -n "$missing" ]]; then
  record env failed $(( $(date +%s) - t0 )) "libraries not found: $missing"
elif (( have_gpu )); then
  grep -q 'libcuda.so.1 not found' "$pack/raw/versions.txt" && lib_notes+="libcuda.so.1 not found (the driver's: add its folder to LD_LIBRARY_PATH); "
  record env ok $(( $(date +%s) - t0 )) "$gpu_name; binaries $bundle_sha; $lib_notes"
else
  record env ok $(( $(date +%s) - t0 )) "no GPU here; binaries ${bundle_sha}"
fi
do_pack

# ---------------------------------------------------------------- step runner
# gate STEP [BINARY]: prints why STEP cannot run (and records it), or nothing; sets step_timeout
gate() {
  local step="$1" need="${2:-}" l t
  if [[ "$selected" != *" $step "* ]]; then record "$step" skipped 0 "not selected (--steps)"; return 1; fi
  if [[ -n "${DONE[$step]:-}" ]]; then record "$step" ok 0 "done in an earlier run in $outdir (--fresh to redo)"; return 1; fi
  if [[ -n "$need" ]] && ! binpath "$need" >/dev/null; then
    if [[ -n "$bundle" ]]; then record "$step" skipped 0 "$need not in $bundle"
    else record "$step" skipped 0 "no binaries (build with scripts/build.sh)"; fi
    return 1
  fi
  if (( ! have_gpu && ! force )); then record "$step" skipped 0 "no GPU (nvidia-smi -L lists none)"; return 1; fi
  l=$(( $(left) - RESERVE ))
  if (( l < ${MIN[$step]} )); then
    record "$step" skipped 0 "time budget: ${l}s left, needs ${MIN[$step]}s"; skipped_for_time+="$step,"; return 1
  fi
  t=${CAP[$step]}
  (( t > l )) && t=$l
  (( max_step > 0 && t > max_step )) && t=$max_step
  step_timeout=$t
  return 0
}
# run STEP CMD...: runs under timeout, output to the log, status to steps.csv, results re-packed.
# A function detail_STEP, if defined, adds its line (from $step_out) to the detail.
run() {
  local step="$1" t0 rc secs off last status detail extra="" b
  shift
  if [[ "$1" == run_bin ]]; then  # timeout runs programs, not functions
    b="$(binpath "$2")" || { step_status=skipped; record "$step" skipped 0 "$2 not in $bundle"; return 0; }
    set -- env LD_LIBRARY_PATH="$libpath" "$b" "${@:3}"
  fi
  t0=$(date +%s.%N)
  off=$(stat -c %s "$log")
  echo "==== [$step] $(date -u +%H:%M:%S) timeout ${step_timeout}s: $*" >>"$log"
  timeout -k 10 "$step_timeout" "$@" >>"$log" 2>&1 </dev/null
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  step_out="$(tail -c +$((off + 1)) "$log" | tail -n +2)"
  step_out="$(sed 's/\x1b\[[0-9;]*m//g' <<<"$step_out")"   # the benchmarks' console colours
  last="$(grep -v '^[[:space:]]*$' <<<"$step_out" | tail -1 | cut -c1-240)"
  case $rc in
    0) status=ok; detail="$last" ;;
    124|137) status=timeout; detail="killed after ${step_timeout}s; last output: $last" ;;
    *) status=failed; detail="exit $rc: $last" ;;
  esac
  if declare -F "detail_$step" >/dev/null; then extra="$("detail_$step")"
  elif [[ $step == bench_* || $step == attention_s* ]]; then extra="$(detail_bench)"; fi
  [[ -n "$extra" ]] && detail="$extra${detail:+; $detail}"
  step_status=$status
  record "$step" "$status" "$secs" "$detail"
  if [[ $status != ok ]]; then tail -n 8 <<<"$step_out" | sed 's/^/    | /'; fi
  do_pack
  return 0
}
detail_bench() {  # Google Benchmark: how many ran, how many reported an error (or skipped)
  awk '/\/(manual|real)_time/ {n++; if (/ERROR OCCURRED/) e++} END {printf "%d benchmarks, %d with errors or skipped", n, e}' <<<"$step_out"
}
detail_cputests() {  # the gtest summaries added up
  awk '/^\[  PASSED  \] [0-9]+/ {p += $4} /^\[  FAILED  \] [0-9]+ test/ {f += $4} /^\[  SKIPPED \] [0-9]+/ {s += $4}
       END {printf "passed %d, skipped %d, failed %d", p, s, f}' <<<"$step_out"
}
detail_tests() {  # gtest's summary in one line
  local p s f
  p="$(grep -oE '^\[  PASSED  \] [0-9]+' <<<"$step_out" | grep -oE '[0-9]+$' | tail -1)"
  s="$(grep -oE '^\[  SKIPPED \] [0-9]+' <<<"$step_out" | grep -oE '[0-9]+$' | tail -1)"
  f="$(grep -oE '^\[  FAILED  \] [0-9]+ test' <<<"$step_out" | grep -oE '[0-9]+' | tail -1)"
  echo "passed ${p:-0}, skipped ${s:-0}, failed ${f:-0}"
}

bench_time=(--benchmark_color=false)
[[ -n "$MINTIME" ]] && bench_time+=(--benchmark_min_time="$MINTIME")

# a. GPU correctness first (flagged, not fatal)
if gate tests test_gpu_ops; then
  run tests run_bin test_gpu_ops --gtest_output="xml:$RAW/test_gpu_ops.xml"
  [[ $step_status == ok ]] || gpu_tests_failed=1
fi

# b. Table 4: the 22B layer, t = 8 emulated, five configurations; CUPTI split; fused attention
lr_args=(--backend cuda --model 22b --tp 8 --emulate-tp --config "$configs" --warmup "$W" --iters "$I")
if gate table4 layer_run; then
  run table4 run_bin layer_run "${lr_args[@]}" --csv "$R/table4_$dev.csv"
fi
if gate table4_cupti layer_run; then
  run table4_cupti run_bin layer_run "${lr_args[@]}" --csv "$RAW/table4_${dev}_under_cupti.csv" \
      --cupti "$R/table4_${dev}_cupti.csv"
fi
if gate table4_fused layer_run; then
  run table4_fused run_bin layer_run "${lr_args[@]}" --attention fused --csv "$R/table4_fused_$dev.csv"
fi

# c. Google Benchmark binaries (JSON)
if gate bench_kernels bench_kernels; then
  run bench_kernels run_bin bench_kernels --backend=cuda "${bench_time[@]}" \
      --benchmark_out="$R/bench_kernels_$dev.json" --benchmark_out_format=json
fi
if gate bench_layer bench_layer; then
  run bench_layer run_bin bench_layer --backend=cuda "${bench_time[@]}" \
      --benchmark_out="$R/bench_layer_$dev.json" --benchmark_out_format=json
fi

# d. the PyTorch eager peer beside our layer (its own layer_run rows stay in raw/)
if gate peer layer_run; then
  peer_dir="$work/peer"
  peer_args=(--device-name "$dev")
  (( quick )) && peer_args+=(--iters "$I" --warmup "$W")
  run peer env ACTBENCH_BUILD="$view" ACTBENCH_RESULTS="$peer_dir" ACTBENCH_TORCH_PYTHON="$py" \
      bash "$root/bench/peers/side_by_side.sh" "${peer_args[@]}"
  [[ -f "$peer_dir/peer_torch_$dev.csv" ]] && cp "$peer_dir/peer_torch_$dev.csv" "$R/"
  [[ -f "$peer_dir/table4_$dev.csv" ]] && cp "$peer_dir/table4_$dev.csv" "$RAW/peer_table4_$dev.csv"
  sed -n '/^ours: /,$p' <<<"$step_out" >"$RAW/side_by_side_table.txt"
  [[ -s "$RAW/side_by_side_table.txt" ]] || rm -f "$RAW/side_by_side_table.txt"
  do_pack
fi

# e. fused attention against PyTorch's SDPA (each part only where it exists)
attention_seq_ok=-1
for s in 2048 8192 32768; do
  step="attention_s$s"
  gate "$step" bench_kernels || continue
  if (( attention_seq_ok < 0 )); then
    attention_seq_ok=0
    if lst="$(timeout 60 env LD_LIBRARY_PATH="$libpath" "$(binpath bench_kernels)" --backend=cuda --seq=2048 \
              --benchmark_filter=attention --benchmark_list_tests=true 2>/dev/null)" && [[ -n "$lst" ]]; then
      attention_seq_ok=1
    fi
  fi
  if (( attention_seq_ok == 0 )); then
    record "$step" skipped 0 "bench_kernels has no --seq or no attention benchmark (an older build)"; continue
  fi
  run "$step" run_bin bench_kernels --backend=cuda --benchmark_filter=attention --seq="$s" "${bench_time[@]}" \
      --benchmark_out="$R/attention_kernels_${dev}_s$s.json" --benchmark_out_format=json
done
if gate attention_sdpa; then
  sdpa="$root/bench/peers/attention_sdpa.py"
  if [[ ! -f "$sdpa" ]]; then
    record attention_sdpa skipped 0 "bench/peers/attention_sdpa.py does not exist"
  elif ! timeout 90 "$py" "$sdpa" --help >/dev/null 2>&1; then
    record attention_sdpa skipped 0 "$py $sdpa --help fails (no torch?)"
  else
    sdpa_args=(--csv "$R/attention_sdpa_$dev.csv" --seq 2048,8192,32768)
    (( quick )) && sdpa_args+=(--warmup "$W" --iters "$I")
    run attention_sdpa "$py" "$sdpa" "${sdpa_args[@]}"
  fi
fi
# the table of both, where bench/peers/attention_table.py exists and there is something to show
if [[ -f "$root/bench/peers/attention_table.py" ]] && compgen -G "$R/attention_kernels_*.json" >/dev/null; then
  timeout 60 python3 "$root/bench/peers/attention_table.py" "$R"/attention_kernels_*.json \
      $(compgen -G "$R/attention_sdpa_*.csv" | head -1) >"$RAW/attention_table.txt" 2>&1 || true
  cat "$RAW/attention_table.txt" >>"$log"
  do_pack
fi

# f. sequence-length sweep (resumable rows; whatever time is left)
sweep_common=(seqlen --backend cuda --launcher emulate --build "$view" --csv "$R/seqlen_cuda_$dev.csv")
(( quick )) && sweep_common+=(--warmup 1 --iters 2) || sweep_common+=(--warmup 2 --iters 5)
if gate sweep_seqlen layer_run; then
  run sweep_seqlen python3 "$root/runners/sweep.py" "${sweep_common[@]}" --timeout $(( step_timeout < 90 ? step_timeout : 90 ))
fi
if gate sweep_seqlen_fused layer_run; then
  run sweep_seqlen_fused python3 "$root/runners/sweep.py" "${sweep_common[@]}" --attention fused \
      --timeout $(( step_timeout < 90 ? step_timeout : 90 ))
fi

# cpu gtests of the build or bundle (not in the default: ctest runs them anywhere)
if [[ "$selected" == *" cputests "* ]] && { binpath test_runtime >/dev/null || [[ -f "$bundle/bin/cpu_tests.tar.xz" ]]; }; then
  if gate cputests; then
    ct="$work/cputests"; mkdir -p "$ct"
    if [[ -f "$bundle/bin/cpu_tests.tar.xz" ]]; then tar -xJf "$bundle/bin/cpu_tests.tar.xz" -C "$ct"; fi
    for b in "$bundle"/tests/test_* "$bundle"/bin/test_*; do   # a build folder's (or an unpacked bundle's)
      [[ -f "$b" && -x "$b" && "$b" != */test_gpu_ops && "$b" != */test_mpi_* ]] && cp "$b" "$ct/"
    done
    run cputests env LD_LIBRARY_PATH="$libpath" bash -c 'rc=0; for t in "$1"/test_*; do echo "== $t"; "$t" --gtest_output="xml:$2/$(basename "$t").xml" --gtest_brief=1 || rc=1; done; exit $rc' _ "$ct" "$RAW"
  fi
elif [[ "$selected" == *" cputests "* ]]; then
  record cputests skipped 0 "no cpu tests in $bundle"
else
  record cputests skipped 0 "not selected (--steps)"
fi

# compute-sanitizer over the GPU tests (not in the default): out-of-bounds and misaligned
# accesses of every kernel, then shared-memory races of the tiled ones (attention, softmax, LN)
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
for tool in memcheck racecheck; do
  step="sanitize_$tool"
  gate "$step" test_gpu_ops || continue
  if [[ -z "$sanitizer" ]]; then record "$step" skipped 0 "compute-sanitizer not found"; continue; fi
  # the long-row and whole-layer tests take minutes under the sanitizer; the kernels they run are
  # covered at smaller shapes by the others
  filter='-*RowOf16400*:*LargeTensor*:*WholeLayer*'
  [[ $tool == racecheck ]] && filter='*Attention*:*Softmax*:*LayerNorm*:-*RowOf16400*:*WholeLayer*'
  b="$(binpath test_gpu_ops)"
  run "$step" env LD_LIBRARY_PATH="$libpath" "$sanitizer" --tool "$tool" --error-exitcode 1 \
      --log-file "$RAW/sanitize_$tool.txt" "$b" --gtest_filter="$filter" --gtest_brief=1
done

# ---------------------------------------------------------------- summary
do_pack
write_summary
echo
cat "$summary" | tee -a "$log"
exit 0
