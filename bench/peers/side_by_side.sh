#!/usr/bin/env bash
# actbench's layer and the PyTorch eager peer on this GPU in one launch, then a table.
#
#   bash bench/peers/side_by_side.sh [--iters N] [--warmup W] [--config LIST] [--device-name NAME]
#   bash bench/peers/side_by_side.sh --table OURS.csv PEER.csv     # only the table, any machine
#
# 1. build/runners/layer_run --backend cuda --model 22b --tp 8 --emulate-tp
#        --config baseline,sp,full,selective,selective+sp --warmup 3 --iters 20
#        --csv results/table4_<device>.csv
# 2. bench/peers/torch_layer.py, the same shape and configurations, --csv results/peer_torch_<device>.csv
# 3. per configuration: forward / backward / total ms of both, ours/torch time ratio (target
#    <= 0.80), activation bytes (allocator delta across forward) and peak allocated bytes.
#
# <device> is the GPU's short name (h100, h200, a100; --device-name or DEVICE overrides).
# ACTBENCH_BUILD: build folder (default build/; built with scripts/build.sh when layer_run is
# missing). ACTBENCH_TORCH_PYTHON: the python that has torch with CUDA (default python3).
# ACTBENCH_RESULTS: the folder of the two CSVs (default results/). Rows are appended; the table
# uses the newest row of each configuration. Exit status: 0 ok, 2 bad input or no GPU / no torch,
# 1 a run failed.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/bench/peers"

print_table() {
  python3 - "$1" "$2" <<'PYEOF'
import csv
import sys

ours_path, peer_path = sys.argv[1], sys.argv[2]
SHAPE = ("hidden", "heads", "seq", "batch", "tp", "dtype")
TARGET = 0.80


def rows(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        sys.exit("side_by_side: error: %s" % e)


def newest(rs, ok):
    out = {}
    for r in rs:  # appended in time order: the last row of a configuration wins
        if ok(r):
            out[r["config"]] = r
    return out


ours = newest(rows(ours_path), lambda r: r.get("status") == "ok" and r.get("fwd_ms") not in ("", None))
peer_rows = rows(peer_path)
if not ours:
    sys.exit("side_by_side: error: no timed rows with status ok in %s" % ours_path)


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def mib(v):
    v = num(v)
    return "-" if v is None else "%.1f" % (v / 2 ** 20)


def ms(v):
    v = num(v)
    return "-" if v is None else "%.2f" % v


head = ["config", "ours fwd", "torch fwd", "ours bwd", "torch bwd", "ours tot", "torch tot", "ours/torch",
        "<=0.80", "ours ovh%", "torch ovh%", "ours act MiB", "torch act MiB", "ours peak MiB", "torch peak MiB"]
table, met, compared = [], 0, 0
base_ours = num(ours.get("baseline", {}).get("total_ms"))
order = ["baseline", "sp", "full", "selective", "selective+sp", "full+sp"]
configs = [c for c in order if c in ours] + [c for c in ours if c not in order]
peer_by_config = {}
for c in configs:
    key = tuple(ours[c].get(k) for k in SHAPE)
    match = newest(peer_rows, lambda r, key=key: r.get("status") == "ok" and tuple(r.get(k) for k in SHAPE) == key)
    peer_by_config[c] = match.get(c)
base_peer = num((peer_by_config.get("baseline") or {}).get("total_ms"))
for c in configs:
    o, p = ours[c], peer_by_config[c] or {}
    ot, pt = num(o.get("total_ms")), num(p.get("total_ms"))
    ratio = ot / pt if ot and pt else None
    if ratio is not None:
        compared += 1
        met += ratio <= TARGET
    ovh = lambda t, b: "-" if t is None or not b else "%+.1f" % (100 * (t / b - 1))
    table.append([c, ms(o.get("fwd_ms")), ms(p.get("fwd_ms")), ms(o.get("bwd_ms")), ms(p.get("bwd_ms")), ms(ot),
                  ms(pt), "-" if ratio is None else "%.3f" % ratio,
                  "-" if ratio is None else ("yes" if ratio <= TARGET else "NO"),
                  ovh(ot, base_ours), ovh(pt, base_peer),
                  mib(o.get("fwd_retained_bytes")), mib(p.get("act_bytes_measured")),
                  mib(o.get("peak_allocated_bytes")), mib(p.get("peak_allocated_bytes"))])
any_row = next(iter(ours.values()))
print("ours:  %s  (%s, %s)" % (ours_path, any_row.get("device", "?"), any_row.get("git_sha", "?")))
print("torch: %s" % peer_path)
print("shape: h %s, a %s, s %s, b %s, t %s, %s; times in ms (median), ovh%% = total vs the same side's baseline"
      % tuple(any_row.get(k, "?") for k in SHAPE))
widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
for line in [head] + table:
    print("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(line, widths))))
missing = [c for c in configs if peer_by_config[c] is None]
if missing:
    print("no torch row of the same shape for: %s" % ", ".join(missing))
print("target ours/torch <= %.2f: %d of %d configurations" % (TARGET, met, compared))
PYEOF
}

if [[ "${1:-}" == "--table" ]]; then
  [[ $# -eq 3 ]] || { echo "side_by_side: error: --table needs OURS.csv PEER.csv" >&2; exit 2; }
  print_table "$2" "$3"
  exit 0
fi

iters=20 warmup=3 configs="baseline,sp,full,selective,selective+sp" device="${DEVICE:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iters) iters="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --config) configs="$2"; shift 2 ;;
    --device-name) device="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "side_by_side: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "side_by_side: error: no GPU here (nvidia-smi -L fails); the table alone: --table OURS.csv PEER.csv" >&2
  exit 2
fi
py="${ACTBENCH_TORCH_PYTHON:-python3}"
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "side_by_side: error: '$py' has no torch with a CUDA device (set ACTBENCH_TORCH_PYTHON)" >&2
  exit 2
fi
if [[ -z "$device" ]]; then
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  device="$(grep -oE '\b[A-Z]{1,3}[0-9]{2,4}\b' <<<"$gpu_name" | head -1 | tr '[:upper:]' '[:lower:]' || true)"
  [[ -n "$device" ]] || device="$(tr -c 'A-Za-z0-9\n' '_' <<<"$gpu_name" | tr '[:upper:]' '[:lower:]')"
fi

build="${ACTBENCH_BUILD:-$root/build}"
lr="$build/runners/layer_run"
if [[ ! -x "$lr" ]]; then
  echo "== building actbench (no $lr yet)"
  bash "$root/scripts/build.sh"
fi
results="${ACTBENCH_RESULTS:-$root/results}"
mkdir -p "$results"
ours_csv="$results/table4_${device}.csv"
peer_csv="$results/peer_torch_${device}.csv"

echo "== ours: 22B layer, t = 8 emulated, bf16 -> $ours_csv"
"$lr" --backend cuda --model 22b --tp 8 --emulate-tp --config "$configs" --warmup "$warmup" --iters "$iters" \
      --csv "$ours_csv"
echo "== torch eager peer ($("$py" -c 'import torch; print(torch.__version__)')) -> $peer_csv"
"$py" "$here/torch_layer.py" --device cuda --model 22b --tp 8 --dtype bf16 --dropout 0.1 --config "$configs" \
      --warmup "$warmup" --iters "$iters" --csv "$peer_csv"
echo
print_table "$ours_csv" "$peer_csv"
