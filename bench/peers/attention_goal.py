#!/usr/bin/env python3
"""Fused attention against cuDNN's SDPA at one shape: is the tensor-core kernel's goal met?

    attention_goal.py OURS.json [OURS.json ...] SDPA.csv [SDPA.csv ...] [--seq 8192] [--head-dim 128]
                      [--dtype bf16]

The goal (docs/fused_attention.md): bench_kernels' attention_fused_fwd and _bwd each reach at
least 0.6x the TFLOP/s of PyTorch SDPA's cuDNN backend without dropout, and 0.5x with it, at
s = 8192, d = 128, bf16, causal. OURS.json: `bench_kernels --backend=cuda
--benchmark_filter=attention_fused_ --seq=8192 --head-dim=128 --attn-dropout=P
--benchmark_out=OURS.json --benchmark_out_format=json`, one file per P. SDPA.csv:
bench/peers/attention_sdpa.py --csv at the same shape and dropouts, --backend cudnn (and flash,
shown beside it). Files are told apart by their ending (.json ours, .csv SDPA's).

TFLOP/s of both sides are the FlashAttention convention (causal 4*b*heads*s^2*d / 2 forward,
2.5x backward) over the median time, so the ratio is a ratio of times. Per dropout present on
our side, one line per pass: ours, cudnn and flash TFLOP/s, ours/cudnn, the goal, and met /
not met / - (a side missing). The last line says whether every goal with both sides measured
was met. Exit status: 0 the report was written (met or not); 2 bad input (one line on stderr).
"""
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_table import BadInput, _num  # noqa: E402  (the same files' bad input, their numbers)

PROG = "attention_goal.py"
GOALS = {False: 0.6, True: 0.5}  # ours / cudnn, per pass, without and with dropout
PASSES = ("fwd", "bwd")


def _same(a, b):
    return a is not None and b is not None and abs(a - b) < 1e-9


def read_ours(paths, seq, head_dim, dtype):
    """{(dropout, pass): TFLOP/s} of attention_fused_fwd / _bwd rows at the shape, and the devices."""
    out, devices = {}, set()
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise BadInput("cannot read bench_kernels JSON '%s': %s" % (path, e))
        if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
            raise BadInput("'%s' is not a Google Benchmark JSON file (no 'benchmarks' list)" % path)
        ctx = doc.get("context") if isinstance(doc.get("context"), dict) else {}
        if ctx.get("actbench_dtype", dtype) != dtype:
            continue
        for b in doc["benchmarks"]:
            name = str(b.get("name", ""))
            pas = next((p for p in PASSES if name.endswith("/attention_fused_" + p)), None)
            if pas is None or b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
                continue
            if not (_same(_num(b.get("seq")), seq) and _same(_num(b.get("head_dim")), head_dim)):
                continue
            ms, flops = _num(b.get("ms_median")), _num(b.get("flops"))
            dropout = _num(b.get("dropout"))
            if dropout is None:
                dropout = _num(ctx.get("actbench_attn_dropout"))
            if ms is None or flops is None or ms <= 0 or dropout is None:
                continue
            out[(round(dropout, 6), pas)] = flops / (ms * 1e-3) / 1e12
            devices.add("%s on %s" % (ctx.get("actbench_backend", "?"), ctx.get("actbench_device", "?")))
    return out, sorted(devices)


def read_sdpa(paths, seq, head_dim, dtype):
    """{(backend, dropout, pass): TFLOP/s} from ok rows at the shape (the newest row wins)."""
    out = {}
    for path in paths:
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as e:
            raise BadInput("cannot read SDPA CSV '%s': %s" % (path, e))
        if rows and not {"sdpa_backend", "seq", "head_dim", "dtype", "dropout", "fwd_tflops", "bwd_tflops",
                         "status"} <= set(rows[0]):
            raise BadInput("'%s' is not an attention_sdpa.py CSV (columns sdpa_backend, seq, head_dim, dtype, "
                           "dropout, fwd_tflops, bwd_tflops, status)" % path)
        for r in rows:
            if r.get("status") != "ok" or r.get("dtype") != dtype or r.get("causal", "1") not in ("1", "True", "true"):
                continue
            if not (_same(_num(r.get("seq")), seq) and _same(_num(r.get("head_dim")), head_dim)):
                continue
            dropout = _num(r.get("dropout"))
            for pas in PASSES:
                v = _num(r.get(pas + "_tflops"))
                if v is not None and dropout is not None:
                    out[(r.get("sdpa_backend"), round(dropout, 6), pas)] = v
    return out


def report(ours, sdpa, devices, seq, head_dim, dtype):
    """The report's lines, and whether every goal with both sides measured was met (None: none was)."""
    lines = ["fused attention vs SDPA, s = %d, d = %d, %s, causal (TFLOP/s, FlashAttention convention)"
             % (seq, head_dim, dtype), "ours: %s" % ("; ".join(devices) or "no rows at this shape")]
    head = ["dropout", "pass", "ours", "cudnn", "flash", "ours/cudnn", "goal", "verdict"]
    body, verdicts = [], []
    for dropout in sorted({d for d, _ in ours}):
        goal = GOALS[dropout > 0]
        for pas in PASSES:
            mine, cudnn, flash = ours.get((dropout, pas)), sdpa.get(("cudnn", dropout, pas)), sdpa.get(("flash", dropout, pas))
            r = mine / cudnn if mine is not None and cudnn else None
            verdict = "-" if r is None else ("met" if r >= goal else "not met")
            if r is not None:
                verdicts.append(r >= goal)
            cell = lambda v: "-" if v is None else "%.1f" % v
            body.append(["%g" % dropout, pas, cell(mine), cell(cudnn), cell(flash),
                         "-" if r is None else "%.3f" % r, ">=%.1f" % goal, verdict])
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    lines += [""] + ["  ".join(v.rjust(widths[i]) for i, v in enumerate(row)) for row in [head] + body]
    met = all(verdicts) if verdicts else None
    lines.append("")
    lines.append("goal: " + ("not measured (no pass has both sides)" if met is None else
                             "met" if met else "not met") +
                 " (%d of %d passes measured on both sides)" % (len(verdicts), len(body)))
    return lines, met


def parse(argv):
    opts = {"--seq": 8192, "--head-dim": 128, "--dtype": "bf16"}
    files = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in opts:
            if i + 1 >= len(argv):
                raise BadInput("%s needs a value" % a)
            v = argv[i + 1]
            if a != "--dtype":
                try:
                    v = int(v)
                except ValueError:
                    raise BadInput("%s must be an integer (got '%s')" % (a, argv[i + 1]))
                if v < 1:
                    raise BadInput("%s must be >= 1 (got %d)" % (a, v))
            opts[a] = v
            i += 2
        elif a.startswith("-"):
            raise BadInput("unknown option '%s' (usage: %s OURS.json... SDPA.csv... [--seq N] [--head-dim N] "
                           "[--dtype bf16])" % (a, PROG))
        else:
            files.append(a)
            i += 1
    ours = [f for f in files if f.endswith(".json")]
    sdpa = [f for f in files if f.endswith(".csv")]
    other = [f for f in files if f not in ours and f not in sdpa]
    if other:
        raise BadInput("'%s' is neither a .json (bench_kernels) nor a .csv (attention_sdpa.py) file" % other[0])
    if not ours:
        raise BadInput("no bench_kernels JSON given")
    return ours, sdpa, opts["--seq"], opts["--head-dim"], opts["--dtype"]


def main(argv=None):
    try:
        ours_paths, sdpa_paths, seq, head_dim, dtype = parse(sys.argv[1:] if argv is None else argv)
        ours, devices = read_ours(ours_paths, seq, head_dim, dtype)
        sdpa = read_sdpa(sdpa_paths, seq, head_dim, dtype)
    except BadInput as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2
    lines, _ = report(ours, sdpa, devices, seq, head_dim, dtype)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
