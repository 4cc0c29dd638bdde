#!/usr/bin/env python3
"""Modeled Table 4: one layer's forward and backward time per configuration on an A100 and an
H100, predicted from the simulator's kernel report of that layer (docs/kernel_efficiency.md,
"Modeled Table 4"). A model, not a measurement: every time it writes is labeled modeled.

For each device, runs the counting simulator build's layer_run on the cuda backend at the
model's shape (the 22B layer, t = 8 emulated, bf16, the paper's five configurations) with
    CUDASIM_BLOCK_SAMPLE=N        one block in N of every launch, counts scaled to the grid
    CUDASIM_RACE_CHECKS=0         counting only (the race checker's shadow is not needed)
    ACTBENCH_STANDIN_GEMM=skip    the cuBLASLt stand-in checks and records GEMMs, computes none
and --kernel-report (the memory-bound kernels from their counts, the GEMMs from their FLOPs at
the stated fraction of peak), then sums the modeled time per pass: fwd.* phases are the
forward, bwd.* and recompute.* the backward. Communication is layer_run's comm_ms_modeled
(ring bytes at the device's NVLink bandwidth per direction, theory's gpus.csv), shown apart as
in plots/table4.py. Writes OUT/modeled_table4.csv and OUT/modeled_table4.md (beside the paper's
Table 4, theory's paper_table4.csv), each whole or not at all.

    /usr/bin/python3 runners/modeled_table4.py --build build-sim-counters --out results
"""
import argparse
import csv
import io
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import user_files  # noqa: E402

CONFIGS = ["baseline", "sp", "full", "selective", "selective+sp"]
DEVICES = ["a100", "h100"]
GEMM = "cublasLtMatmul"  # the kernel report's rows of the cuBLASLt stand-in's calls
PAPER_MODEL = "22b"  # the layer of the paper's Table 4: its columns are filled for this model only

# The CSV's columns, declared once: name, unit, meaning. The markdown legend is made from it.
COLUMNS = [
    ("device", "", "the modeled device (the kernel report's model devices: a100, h100)"),
    ("config", "", "layer_run's configuration"),
    ("model", "", "layer_run's --model"),
    ("seq", "tokens", "sequence length"),
    ("batch", "sequences", "micro-batch size"),
    ("tp", "ranks", "tensor-parallel size (emulated: one process plays rank 0)"),
    ("dtype", "", "activation and weight type"),
    ("fwd_ms_modeled", "ms (modeled)", "forward phases (fwd.*): kernels from their counts + GEMMs from their FLOPs"),
    ("bwd_ms_modeled", "ms (modeled)", "backward phases, recompute included (bwd.*, recompute.*)"),
    ("recompute_ms_modeled", "ms (modeled)", "of bwd_ms_modeled, the recompute.* phases"),
    ("gemm_ms_modeled", "ms (modeled)", "of fwd + bwd, the cuBLASLt GEMM rows"),
    ("kernels_ms_modeled", "ms (modeled)", "of fwd + bwd, actbench's own kernels (memory-bound)"),
    ("comm_ms_modeled", "ms (modeled)", "TP/SP collectives: ring bytes / NVLink bandwidth per direction"),
    ("total_ms_modeled", "ms (modeled)", "fwd + bwd + comm"),
    ("overhead_percent_modeled", "%", "total over the baseline's total, minus 100 (empty for the baseline)"),
    ("paper_fwd_ms", "ms (A100, measured)", "the paper's Table 4 forward (communication included)"),
    ("paper_bwd_ms", "ms (A100, measured)", "the paper's Table 4 backward"),
    ("paper_total_ms", "ms (A100, measured)", "the paper's combined time"),
    ("paper_overhead_percent", "%", "the paper's overhead over its baseline"),
    ("block_sample", "", "one block in N of every kernel launch ran; counts scaled to the grid"),
    ("link_gbps", "GB/s", "NVLink bandwidth per direction used for comm_ms_modeled"),
    ("git_sha", "", "the layer_run build's commit"),
    ("command", "", "the layer_run command line (its environment before it)"),
]
HEADER = [c[0] for c in COLUMNS]


class Refused(Exception):
    """Bad input or a failed step: one line, exit 2."""


def read_csv_text(text):
    return list(csv.DictReader(io.StringIO(text)))


def layer_run_path(build):
    path = os.path.join(build, "runners", "layer_run")
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise Refused(f"--build {build}: no runners/layer_run there (configure it with -DACTBENCH_CUDA_SIM=ON "
                      "-DACTBENCH_CUDA_SIM_COUNTERS=ON and build the layer_run target)")
    return path


def theory_table(theory_dir, name):
    path = os.path.join(theory_dir, name)
    try:
        return read_csv_text(user_files.read_text(f"--theory-dir {path}", path))
    except user_files.UserFileError as e:
        raise Refused(f"{e} (run `theory --out {theory_dir}` to make it)")


def link_gbps(gpus, device):
    for g in gpus:
        if g.get("gpu") == device:
            return g["nvlink_gbps"]
    raise Refused(f"gpus.csv has no row for {device}")


def run_device(layer_run, device, args, link, tmp):
    """The kernel report rows and the layer rows of one device's run."""
    report = os.path.join(tmp, f"kernels_{device}.csv")
    rows = os.path.join(tmp, f"layer_{device}.csv")
    env = {"CUDASIM_BLOCK_SAMPLE": str(args.block_sample), "CUDASIM_RACE_CHECKS": "0",
           "ACTBENCH_STANDIN_GEMM": "skip"}
    cmd = [layer_run, "--backend", "cuda", "--model", args.model, "--emulate-tp", "--config", ",".join(CONFIGS),
           "--dtype", args.dtype, "--warmup", "0", "--iters", "1", "--link-gbps", link, "--csv", rows,
           "--kernel-report", report, "--kernel-report-device", device]
    shown = " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(cmd)
    print(f"modeled_table4: {device}: {shown}", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise Refused(f"layer_run failed on {device} (exit {r.returncode}): {last}")
    with open(report, newline="") as f:
        kernels = list(csv.DictReader(f))
    with open(rows, newline="") as f:
        layer = list(csv.DictReader(f))
    return kernels, layer, shown


def pass_of(phase):
    """fwd, bwd or recompute: the first part of a phase name; anything else is refused."""
    first = phase.split(".")[0]
    if first not in ("fwd", "bwd", "recompute"):
        raise Refused(f"the kernel report has a phase '{phase}' outside fwd.*, bwd.*, recompute.*")
    return first


def sums(kernels, device):
    """Per config: modeled microseconds per pass, and of them the GEMMs' and the kernels'."""
    column = "modeled_us_" + device
    out = {}
    for r in kernels:
        s = out.setdefault(r["config"], {"fwd": 0.0, "bwd": 0.0, "recompute": 0.0, "gemm": 0.0, "kernels": 0.0})
        if not r[column]:
            raise Refused(f"{r['config']} {r['phase']} {r['kernel']}: no modeled time on {device} (it does not fit)")
        us = float(r[column])
        s[pass_of(r["phase"])] += us
        s["gemm" if r["kernel"] == GEMM else "kernels"] += us
    return out


def fmt(v, digits=3):
    return "" if v is None else f"{v:.{digits}f}"


def device_rows(device, kernels, layer, shown, paper, args, link):
    by_config = {r["config"]: r for r in layer}
    modeled = sums(kernels, device)
    missing = [c for c in CONFIGS if c not in modeled or c not in by_config or by_config[c]["status"] != "ok"]
    if missing:
        raise Refused(f"{device}: no modeled row for {', '.join(missing)}")
    totals = {}
    rows = []
    for c in CONFIGS:
        m, lr = modeled[c], by_config[c]
        fwd, bwd = m["fwd"] / 1e3, (m["bwd"] + m["recompute"]) / 1e3
        comm = float(lr["comm_ms_modeled"] or 0)
        totals[c] = fwd + bwd + comm
        p = paper.get(c, {}) if args.model == PAPER_MODEL else {}
        rows.append({
            "device": device, "config": c, "model": lr["model"], "seq": lr["seq"], "batch": lr["batch"],
            "tp": lr["tp"], "dtype": lr["dtype"], "fwd_ms_modeled": fmt(fwd), "bwd_ms_modeled": fmt(bwd),
            "recompute_ms_modeled": fmt(m["recompute"] / 1e3), "gemm_ms_modeled": fmt(m["gemm"] / 1e3),
            "kernels_ms_modeled": fmt(m["kernels"] / 1e3), "comm_ms_modeled": fmt(comm),
            "total_ms_modeled": fmt(totals[c]),
            "overhead_percent_modeled": "" if c == "baseline" else fmt(100 * (totals[c] / totals["baseline"] - 1), 1),
            "paper_fwd_ms": p.get("fwd_ms", ""), "paper_bwd_ms": p.get("bwd_ms", ""),
            "paper_total_ms": p.get("total_ms", ""), "paper_overhead_percent": p.get("overhead_percent", ""),
            "block_sample": str(args.block_sample), "link_gbps": link, "git_sha": lr.get("git_sha", ""),
            "command": shown})
    return rows


def markdown(rows, args):
    lines = [
        "# Modeled Table 4: one layer's time per configuration (a model, not a measurement)",
        "",
        f"Predicted from the simulator's kernel report of the {rows[0]['model']} layer (s {rows[0]['seq']}, "
        f"b {rows[0]['batch']}, t = {rows[0]['tp']} emulated, {rows[0]['dtype']}): actbench's kernels from their "
        "counted memory traffic, cuBLASLt GEMMs from their FLOPs at 70 % of the dense tensor-core peak, "
        "communication from ring bytes at the NVLink bandwidth, apart (the paper's times include it). "
        f"One block in {args.block_sample} of every launch ran. How: docs/kernel_efficiency.md, \"Modeled Table 4\". "
        "The paper's columns are its measurements on an A100 (for the 22b layer only).",
        "",
        "| device | config | fwd | bwd (recompute) | comm | combined | overhead | paper fwd | paper bwd | "
        "paper combined | paper overhead |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ov = "–" if not r["overhead_percent_modeled"] else f"{float(r['overhead_percent_modeled']):+.1f}%"
        pov = "–" if not r["paper_overhead_percent"] else f"{float(r['paper_overhead_percent']):+.0f}%"
        lines.append(f"| {r['device']} | {r['config']} | {r['fwd_ms_modeled']} | {r['bwd_ms_modeled']} "
                     f"({r['recompute_ms_modeled']}) | {r['comm_ms_modeled']} | {r['total_ms_modeled']} | {ov} | "
                     f"{r['paper_fwd_ms']} | {r['paper_bwd_ms']} | {r['paper_total_ms']} | {pov} |")
    lines += ["", "Times in ms. Columns of modeled_table4.csv:", "", "| column | unit | meaning |", "|---|---|---|"]
    lines += [f"| `{n}` | {u} | {m} |" for n, u, m in COLUMNS]
    return "\n".join(lines) + "\n"


def write_whole(path, text):
    """Writes `text` to a temporary name beside `path`, then renames it: whole or not at all."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".modeled_table4.", dir=folder)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def csv_text(rows):
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=HEADER, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


class OneLineParser(argparse.ArgumentParser):
    """Bad options are one line (Refused), not a usage block."""

    def error(self, message):
        raise Refused(message)


def parse_args(argv):
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-sim-counters"),
                    help="the counting simulator build (ACTBENCH_CUDA_SIM=ON, ACTBENCH_CUDA_SIM_COUNTERS=ON)")
    ap.add_argument("--device", action="append", choices=DEVICES, help="modeled device (repeatable; default both)")
    ap.add_argument("--model", default="22b", help="layer_run preset (default 22b, the paper's Table 4 layer)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--block-sample", type=int, default=61, help="run one block in N of every launch (default 61)")
    ap.add_argument("--theory-dir", default=os.path.join(ROOT, "results", "theory"),
                    help="theory --out folder: gpus.csv (NVLink bandwidth) and paper_table4.csv")
    ap.add_argument("--out", default=os.path.join(ROOT, "results"), help="folder for modeled_table4.{csv,md}")
    args = ap.parse_args(argv)
    if args.block_sample < 1:
        raise Refused(f"--block-sample must be >= 1, got {args.block_sample}")
    if not os.path.isdir(args.out):
        raise Refused(f"--out {args.out}: not a folder")
    return args


def main(argv):
    try:
        args = parse_args(argv)
        layer_run = layer_run_path(args.build)
        gpus = theory_table(args.theory_dir, "gpus.csv")
        paper = {r["config"]: r for r in theory_table(args.theory_dir, "paper_table4.csv")}
        rows = []
        with tempfile.TemporaryDirectory(prefix="actbench_modeled_table4_") as tmp:
            for device in args.device or DEVICES:
                link = link_gbps(gpus, device)
                kernels, layer, shown = run_device(layer_run, device, args, link, tmp)
                rows += device_rows(device, kernels, layer, shown, paper, args, link)
        write_whole(os.path.join(args.out, "modeled_table4.csv"), csv_text(rows))
        write_whole(os.path.join(args.out, "modeled_table4.md"), markdown(rows, args))
    except Refused as e:
        print(f"modeled_table4: error: {e}", file=sys.stderr)
        return 2
    print(f"modeled_table4: wrote {os.path.join(args.out, 'modeled_table4.csv')} and modeled_table4.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
