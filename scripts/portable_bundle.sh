#!/usr/bin/env bash
# A portable bundle of actbench's CUDA build, for a GPU node that lacks Open MPI, Google
# Benchmark or Eigen (it needs a CUDA driver, and cuBLAS/NCCL from a CUDA toolkit or PyTorch's
# wheels). Build on a machine with the full toolchain, copy the folder over, then on the node:
#   bash scripts/gpu_eval.sh OUTDIR --bin-dir .portable-bundle
#
#   bash scripts/portable_bundle.sh [DIR]        # default DIR = .portable-bundle/ (git-ignored)
#   bash scripts/portable_bundle.sh --check DIR  # only the checks of step 3, on a staged bundle
#
# 1. configures and builds build-portable/ (ACTBENCH_PORTABLE_BUILD overrides): Release,
#    -DACTBENCH_ENABLE_MPI=OFF, -DCMAKE_CUDA_ARCHITECTURES=90 (ACTBENCH_PORTABLE_ARCH overrides,
#    e.g. "80;90"), tests and benchmarks on, RUNPATH $ORIGIN/../lib (then the toolkit's lib dir);
# 2. stages into DIR:
#      bin/   layer_run theory bench_kernels bench_layer test_gpu_ops (stripped), and
#             cpu_tests.tar.xz: the other gtest binaries (no MPI), xz-compressed together
#             (gpu_eval.sh --steps cputests unpacks and runs them)
#      lib/   every shared library the binaries need that the node may lack (libbenchmark, ...)
#      lib/fallback/cuda       libcudart, libcupti  } used by scripts/gpu_eval.sh only when the
#      lib/fallback/nccl-stub  libnccl.so.2 stub    } node has no such library (each probed with
#      lib/fallback/cxx        libstdc++, libgcc_s  } ldd); the stub only makes ncclGetVersion fail
#      MANIFEST.txt            git sha baked into the binaries, build options, sizes, sha256
#    cuBLAS / cuBLASLt (≈600 MB) and NCCL (≈220 MB) are not copied: the node's toolkit
#    (/usr/local/cuda/lib64) or PyTorch's wheels (site-packages/nvidia/*/lib) provide them;
#    scripts/gpu_eval.sh puts those on LD_LIBRARY_PATH.
# 3. checks: no binary depends on libmpi / Open MPI; with `env -i LD_LIBRARY_PATH=DIR/lib` every
#    library resolves, into DIR/lib or the C/C++ runtime, except the CUDA libraries the node
#    provides (and libcuda, the driver, which is loaded at run time); with the loader's cache
#    off and no LD_LIBRARY_PATH the RUNPATH alone finds DIR/lib; the bundle's size.
# Build it from a committed tree, so that rows do not say `-dirty`.
# Exit status: 0 ok, 1 a build or check failed (or bad usage).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ACTBENCH_PORTABLE_BUILD:-$root/build-portable}"
arch="${ACTBENCH_PORTABLE_ARCH:-90}"
dir="${1:-$root/.portable-bundle}"
warn_mib=100   # a bundle this large usually means a library was copied that the node has

die() { echo "portable_bundle: error: $*" >&2; exit 1; }
check_only=0
case "${1:-}" in
  -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
  --check) [[ $# -eq 2 && -d "$2/bin" ]] || die "usage: portable_bundle.sh --check DIR (a staged bundle)"
           check_only=1; dir="$2" ;;
  -*) die "unknown option '$1' (see --help)" ;;
esac
[[ $# -le 1 || $check_only -eq 1 ]] || die "usage: portable_bundle.sh [DIR]"

# Which libraries the binaries load, classified by where they must come from on the node.
is_system() {  # glibc, the C++ runtime, the vDSO: every Linux has them
  [[ "$1" =~ ^(linux-vdso\.|ld-linux|(libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.) ]]
}
is_cuda() {    # the CUDA runtime libraries (the node's toolkit or PyTorch's wheels, or lib/fallback)
  [[ "$1" =~ ^(libcuda|libcudart|libcublas|libcublasLt|libcupti|libnccl|libnvrtc|libnvJitLink)\. ]]
}
ldd_triples() {  # "name => path" per dependency; path "not" when not found
  awk '/=>/ {print $1, $2, $3} !/=>/ && NF {print $1, "=>", $1}'
}

# The checks of step 3 on the staged binaries (every regular file in DIR/bin but archives).
# Prints one line per problem; returns 1 when there is one.
check_bundle() {
  local d b n name arrow path deps dyn fail=0
  d="$(cd "$1" && pwd)"
  for b in "$d"/bin/*; do
    [[ -f "$b" && -x "$b" ]] || continue
    n="$(basename "$b")"
    # Whole outputs into variables, then grep: under pipefail, `ldd | grep -q` fails at random
    # when grep exits at the first match and ldd dies of SIGPIPE.
    deps="$(ldd "$b" 2>&1 || true)"
    if grep -qE 'libmpi|openmpi|libopen-rte|libopen-pal' <<<"$deps"; then echo "  $n: links MPI"; fail=1; fi
    # (1) only the bundle's lib/ on the search path
    while read -r name arrow path; do
      name="${name##*/}"
      is_system "$name" && continue
      if [[ "$path" == "not" ]]; then
        is_cuda "$name" && continue
        echo "  $n: $name not found with LD_LIBRARY_PATH=$d/lib"; fail=1; continue
      fi
      is_cuda "$name" && continue
      [[ "$(realpath -m "$path")" == "$d/lib/"* ]] || { echo "  $n: $name resolves outside the bundle ($path)"; fail=1; }
    done < <(env -i LD_LIBRARY_PATH="$d/lib" ldd "$b" | ldd_triples)
    # (2) the RUNPATH alone, the loader's cache off (as on a machine that lacks these libraries)
    while read -r name arrow path; do
      name="${name##*/}"
      is_system "$name" || is_cuda "$name" && continue
      [[ "$(realpath -m "$path")" == "$d/lib/"* ]] || { echo "  $n: the RUNPATH does not find $name in the bundle ($path)"; fail=1; }
    done < <(env -i /lib64/ld-linux-x86-64.so.2 --inhibit-cache --list "$b" 2>&1 | ldd_triples)
    dyn="$(readelf -d "$b" 2>&1 || true)"
    grep -q 'R.*PATH.*\$ORIGIN/\.\./lib' <<<"$dyn" || { echo "  $n: no \$ORIGIN/../lib RUNPATH"; fail=1; }
  done
  return $fail
}

if [[ $check_only -eq 1 ]]; then
  if out="$(check_bundle "$dir")"; then echo "portable_bundle: $dir passes the checks"; exit 0; fi
  echo "$out"; die "checks failed on $dir"
fi

nvcc=/usr/local/cuda/bin/nvcc
[[ -x "$nvcc" ]] || nvcc="$(command -v nvcc || true)"
[[ -n "$nvcc" && -x "$nvcc" ]] || die "no CUDA toolkit (nvcc) here: the bundle needs the CUDA backend"

bash "$root/scripts/setup.sh"
echo "== configure $build (MPI off, sm_$arch, RUNPATH \$ORIGIN/../lib)"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_COMPILER="$nvcc" \
      -DACTBENCH_ENABLE_MPI=OFF -DACTBENCH_ENABLE_CUDA=ON \
      -DACTBENCH_BUILD_TESTS=ON -DACTBENCH_BUILD_BENCH=ON \
      "-DCMAKE_CUDA_ARCHITECTURES=$arch" \
      -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' \
      -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON >/dev/null
grep -q '^ACTBENCH_ENABLE_MPI:BOOL=OFF' "$build/CMakeCache.txt" || die "MPI is not off in $build"
echo "== build (this takes a while on few cores)"
cmake --build "$build" -j "$(nproc)"

# ---- stage ----
bins=(runners/layer_run runners/theory runners/experiment bench/bench_kernels bench/bench_layer tests/test_gpu_ops)
for t in "$build"/tests/test_*; do   # every other gtest binary of this (MPI-free) build
  if [[ -f "$t" && -x "$t" && "$t" != */test_gpu_ops ]]; then bins+=("tests/$(basename "$t")"); fi
done
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib/fallback/cuda" "$dir/lib/fallback/nccl-stub" "$dir/lib/fallback/cxx"
dir="$(cd "$dir" && pwd)"
staged=()
for b in "${bins[@]}"; do
  if [[ -x "$build/$b" && -f "$build/$b" ]]; then
    cp "$build/$b" "$dir/bin/"
    strip "$dir/bin/$(basename "$b")"
    staged+=("$dir/bin/$(basename "$b")")
  elif [[ "$b" != runners/experiment ]]; then   # experiment is a library today; a binary if it appears
    die "$build/$b was not built"
  fi
done

copied=" "
for b in "${staged[@]}"; do
  while read -r name _ path; do
    [[ -n "$name" ]] || continue
    name="${name##*/}"
    if [[ "$name" =~ (libmpi|openmpi|libopen-rte|libopen-pal) ]]; then die "$(basename "$b") needs $name (MPI)"; fi
    is_system "$name" && continue
    if is_cuda "$name"; then
      case "$name" in
        libcudart.*|libcupti.*) if [[ -f "$path" ]]; then cp -L "$path" "$dir/lib/fallback/cuda/$name"; fi ;;
      esac
      continue
    fi
    [[ "$path" == /* && -f "$path" ]] || die "$(basename "$b"): $name does not resolve here"
    if [[ "$copied" != *" $name "* ]]; then cp -L "$path" "$dir/lib/$name"; copied+="$name "; fi
  done < <(ldd "$b" | ldd_triples)
done
for l in libstdc++.so.6 libgcc_s.so.1; do
  p="$(ldd "$dir/bin/layer_run" | awk -v l="$l" '$1 == l {print $3}')"
  if [[ -n "$p" ]]; then cp -L "$p" "$dir/lib/fallback/cxx/$l"; fi
done
chmod 644 "$dir"/lib/*.so* "$dir"/lib/fallback/*/* 2>/dev/null || true

# NCCL stub: the binaries link libnccl.so.2 (the non-MPI build calls only ncclGetVersion, for
# provenance). Where the node has no NCCL at all, this lets them load; every call fails.
syms="$(for b in "${staged[@]}"; do nm -D --undefined-only "$b" | awk '{print $2}'; done | grep -E '^nccl' | sort -u)"
stub_c="$build/nccl_stub.c"
{
  echo "/* generated by scripts/portable_bundle.sh: stands in for libnccl.so.2 where the node has none */"
  for s in $syms; do
    if [[ "$s" == ncclGetErrorString ]]; then
      echo "const char* ncclGetErrorString(int r) { (void)r; return \"NCCL stub (no NCCL on this machine)\"; }"
    else
      echo "int $s(void) { return 3; /* ncclInternalError */ }"
    fi
  done
} >"$stub_c"
cc -shared -fPIC -O2 -Wl,-soname,libnccl.so.2 -o "$dir/lib/fallback/nccl-stub/libnccl.so.2" "$stub_c"

# ---- checks, then the cpu-only tests packed ----
echo "== checks"
fail=0
check_bundle "$dir" || fail=1
stub_syms="$(nm -D "$dir/lib/fallback/nccl-stub/libnccl.so.2")"
grep -q ' T ncclGetVersion' <<<"$stub_syms" || { echo "  nccl stub lacks ncclGetVersion"; fail=1; }
# the staged binaries start with nothing but the bundle's lib/ (meta backend: no GPU needed here)
if ! env -i LD_LIBRARY_PATH="$dir/lib" "$dir/bin/layer_run" --backend meta --model 22b --tp 8 --emulate-tp \
       --config baseline --csv "$build/bundle_smoke.csv" >/dev/null; then echo "  bin/layer_run does not run"; fail=1; fi
if ! env -i LD_LIBRARY_PATH="$dir/lib" "$dir/bin/bench_kernels" --backend=cpu --benchmark_list_tests >/dev/null; then
  echo "  bin/bench_kernels does not run"; fail=1
fi
# with the NCCL stub instead of NCCL, every symbol bound at start: the binaries still load
if ! env -i LD_BIND_NOW=1 LD_LIBRARY_PATH="$dir/lib:$dir/lib/fallback/nccl-stub" "$dir/bin/layer_run" \
       --print-csv-header >/dev/null; then echo "  bin/layer_run does not load with the NCCL stub"; fail=1; fi
cuda_from_node="$(for b in "${staged[@]}"; do ldd "$b"; done | awk '{print $1}' | sort -u |
                    while read -r l; do if is_cuda "$l"; then echo -n "$l "; fi; done)"
glibc_needed="$(for b in "${staged[@]}"; do objdump -T "$b"; done | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)"
glibcxx_needed="$(for b in "${staged[@]}"; do objdump -T "$b"; done | grep -oE 'GLIBCXX_[0-9.]+' | sort -uV | tail -1)"
cpu_tests=()
for b in "${staged[@]}"; do
  n="$(basename "$b")"
  if [[ "$n" == test_* && "$n" != test_gpu_ops ]]; then cpu_tests+=("$n"); fi
done
if [[ ${#cpu_tests[@]} -gt 0 ]]; then
  tar -C "$dir/bin" -cf - "${cpu_tests[@]}" | xz -T0 -6 >"$dir/bin/cpu_tests.tar.xz"
  (cd "$dir/bin" && rm -f "${cpu_tests[@]}")
fi
# ---- manifest ----
sha="$(sed -n 's/.*return "\(.*\)";.*/\1/p' "$build/git_sha.cpp" 2>/dev/null || true)"
{
  echo "actbench portable bundle"
  echo "git_sha: ${sha:-unknown}"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "cuda_architectures: $arch"
  echo "nvcc: $("$nvcc" --version | tail -1)"
  echo "cxx: $(c++ --version | head -1)"
  echo "glibc_needed: $glibc_needed (the node's glibc must be at least this)"
  echo "glibcxx_needed: $glibcxx_needed (lib/fallback/cxx has one if the node's libstdc++ is older)"
  echo "cuda_from_node: $cuda_from_node"
  echo "cmake: -DACTBENCH_ENABLE_MPI=OFF -DCMAKE_CUDA_ARCHITECTURES=$arch -DCMAKE_INSTALL_RPATH=\$ORIGIN/../lib"
  echo "files:"
  (cd "$dir" && find . -type f ! -name MANIFEST.txt | sort | while read -r f; do
     printf '  %-44s %10d  %s\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)"; done)
} >"$dir/MANIFEST.txt"

bytes="$(du -sb "$dir" | cut -f1)"
mib=$(( (bytes + 1048575) / 1048576 ))
echo "  no MPI; every non-CUDA library resolves from $dir/lib; RUNPATH \$ORIGIN/../lib"
echo "  CUDA libraries taken from the node (toolkit or PyTorch wheels): ${cuda_from_node}libcuda.so.1 (driver)"
echo "  fallbacks in lib/fallback: $(cd "$dir/lib/fallback" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ')"
echo "  cpu-only gtests in bin/cpu_tests.tar.xz: ${cpu_tests[*]}"
[[ $fail -eq 0 ]] || die "checks failed (above)"
if (( mib > warn_mib )); then echo "portable_bundle: warning: bundle is ${mib} MiB (over ${warn_mib})" >&2; fi
echo "== bundle $dir: ${mib} MiB ($bytes bytes), git ${sha:-unknown}"
du -sh "$dir/bin" "$dir/lib"
echo "next: copy the repository with $(realpath --relative-to="$root" "$dir")/ to the GPU node and run there:"
echo "  bash scripts/gpu_eval.sh OUTDIR --bin-dir $(realpath --relative-to="$root" "$dir")"
