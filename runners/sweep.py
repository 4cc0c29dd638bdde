#!/usr/bin/env python3
"""sweep.py: run layer_run over a plan of points, resumably, into one CSV.

    sweep.py PLAN --csv FILE [--backend cpu|cuda|meta] [--launcher auto|mpi|emulate]
             [--dry-run] [--retry-failed] [--warmup W] [--iters I] [--dtype D]
             [--memory-limit 80GiB] [--build DIR] [--extra "ARGS"]

PLAN is a built-in plan (table4, seqlen, tp, models, longseq, smoke) or a JSON plan file:

    {"name": "mine",
     "fixed": {"model": "22b", "batch": 1, "tp": 8},
     "grid":  {"seq": [1024, 2048, 4096], "config": ["baseline", "selective+sp"]}}

Every combination of the grid's values (with the fixed ones) is one point; a point is one
layer_run process writing one row. Keys of a point: model hidden heads seq batch tp config
dtype layers (plus the backend and whether t is emulated). A point whose key is already in
the CSV is skipped, so a sweep killed at any moment is resumed by running it again: rows are
appended whole by layer_run (one write under a lock), and a point that fails without a row
(a crash, a bad point) gets a row with status=failed written by this driver, the same way.
Out-of-memory points are rows with status=oom (layer_run exit status 3) and the sweep goes on.

With --launcher mpi (or auto with a cuda/cpu backend and mpirun on PATH and t > 1) a point
runs under `mpirun -np t`; with emulate (the default for meta, and for auto without mpirun)
one process plays rank 0 of t (--emulate-tp). Binaries are found in $ACTBENCH_BUILD, --build,
or the newest build*/ folder of the repository. Only Python's standard library.
"""
import argparse
import csv
import fcntl
import io
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_CONFIGS = ["baseline", "sp", "full", "selective", "selective+sp"]
# The columns that identify a point (as layer_run writes them).
KEY_COLUMNS = ["backend", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "attention",
               "dtype", "layers"]
# Per-rank shapes of the paper's models (PAPER.md Table 3) for filling keys before a run.
PRESETS = {
    "tiny": dict(seq=32, batch=2, hidden=64, heads=4, tp=1),
    "22b": dict(seq=2048, batch=4, hidden=6144, heads=64, tp=8),
    "175b": dict(seq=2048, batch=1, hidden=12288, heads=96, tp=8),
    "530b": dict(seq=2048, batch=1, hidden=20480, heads=128, tp=8),
    "1t": dict(seq=2048, batch=1, hidden=25600, heads=160, tp=8),
}

BUILTIN_PLANS = {
    # Table 4: one 22B layer, t = 8, all five configurations.
    "table4": {"fixed": {"model": "22b", "tp": 8}, "grid": {"config": PAPER_CONFIGS}},
    # Memory and time against sequence length at 22B width (b = 1 so that long s fits).
    "seqlen": {"fixed": {"model": "22b", "tp": 8, "batch": 1},
               "grid": {"seq": [512, 1024, 2048, 4096, 8192, 16384, 32768], "config": PAPER_CONFIGS}},
    # Tensor-parallel size 1..8 at the 22B layer.
    "tp": {"fixed": {"model": "22b", "batch": 1}, "grid": {"tp": [1, 2, 4, 8], "config": PAPER_CONFIGS}},
    # The four Table 3 models at their per-rank shapes.
    "models": {"fixed": {}, "grid": {"model": ["22b", "175b", "530b", "1t"], "config": PAPER_CONFIGS}},
    # Beyond the paper: 1k..128k tokens at 22B width, the paper's attention and fused
    # (FlashAttention-style), with and without SP, full recompute; run with --memory-limit 80GiB
    # to see where each configuration stops fitting.
    "longseq": {"fixed": {"model": "22b", "tp": 8, "batch": 1},
                "grid": {"seq": [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
                         "attention": ["unfused", "fused"],
                         "config": ["baseline", "sp", "selective", "selective+sp", "full"]}},
    # A few seconds anywhere: for tests and first runs.
    "smoke": {"fixed": {"model": "tiny", "tp": 2}, "grid": {"seq": [16, 32], "config": PAPER_CONFIGS}},
}

POINT_FIELDS = {"model", "hidden", "heads", "seq", "batch", "tp", "config", "attention", "dtype", "layers", "dropout"}


class SweepError(Exception):
    pass


def load_plan(name):
    if name in BUILTIN_PLANS:
        plan = dict(BUILTIN_PLANS[name])
        plan["name"] = name
        return plan
    if not os.path.exists(name):
        raise SweepError(f"unknown plan '{name}': not one of {', '.join(BUILTIN_PLANS)} and no such file")
    try:
        with open(name) as f:
            plan = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"cannot read plan file {name}: {e}")
    if not isinstance(plan, dict) or not isinstance(plan.get("grid", {}), dict):
        raise SweepError(f"plan file {name}: expected an object with 'grid' (and optional 'fixed')")
    plan.setdefault("name", os.path.splitext(os.path.basename(name))[0])
    return plan


def expand(plan, defaults):
    """All points of a plan: dicts of layer_run settings with every key column filled."""
    fixed = dict(plan.get("fixed", {}))
    grid = plan.get("grid", {})
    for k in list(fixed) + list(grid):
        if k not in POINT_FIELDS:
            raise SweepError(f"plan '{plan['name']}': unknown field '{k}' (known: {', '.join(sorted(POINT_FIELDS))})")
    names = list(grid)
    for k in names:
        if not isinstance(grid[k], list) or not grid[k]:
            raise SweepError(f"plan '{plan['name']}': grid field '{k}' must be a non-empty list")
    points = []
    for values in itertools.product(*(grid[k] for k in names)):
        p = {"dtype": "bf16", "layers": 1, "attention": "unfused"}
        p.update(defaults)
        p.update(fixed)
        p.update(zip(names, values))
        model = p.get("model", "tiny")
        if model not in PRESETS:
            raise SweepError(f"plan '{plan['name']}': unknown model '{model}'")
        for k, v in PRESETS[model].items():
            p.setdefault(k, v)
        p["model"] = model
        points.append(p)
    return points


def point_key(p, backend, emulated):
    values = dict(p, backend=backend, emulated=1 if emulated else 0)
    return tuple(str(values[c]) for c in KEY_COLUMNS)


def find_layer_run(build):
    candidates = []
    if build:
        candidates.append(build)
    elif os.environ.get("ACTBENCH_BUILD"):
        candidates.append(os.environ["ACTBENCH_BUILD"])
    else:
        for d in sorted(os.listdir(ROOT)):
            if d.startswith("build"):
                candidates.append(os.path.join(ROOT, d))
    found = [os.path.join(c, "runners", "layer_run") for c in candidates]
    found = [f for f in found if os.access(f, os.X_OK)]
    if not found:
        raise SweepError("layer_run not found: build first (bash scripts/build.sh) or set ACTBENCH_BUILD / --build")
    return max(found, key=os.path.getmtime)


def read_header(layer_run):
    out = subprocess.run([layer_run, "--print-csv-header"], capture_output=True, text=True, check=True).stdout
    return next(csv.reader(io.StringIO(out)))


def done_keys(path, header, retry_failed):
    """Keys of the points already in the CSV (a failed point counts unless retry_failed)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return set()
    with open(path, newline="") as f:
        reader = csv.reader(f)
        got = next(reader, None)
        if got != header:
            raise SweepError(f"{path} has a different header than this layer_run writes: use another --csv")
        idx = [header.index(c) for c in KEY_COLUMNS]
        status = header.index("status")
        keys = set()
        for row in reader:
            if len(row) != len(header):
                continue  # cannot happen with whole-row appends; ignore rather than guess
            if retry_failed and row[status] == "failed":
                continue
            keys.add(tuple(row[i] for i in idx))
        return keys


def append_row(path, header, row):
    """One row with one write() under an exclusive lock: the same discipline as layer_run."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size == 0:
            writer.writerow(header)
        writer.writerow(row)
        os.write(fd, buf.getvalue().encode())
    finally:
        os.close(fd)


def failed_row(header, p, backend, emulated, status, message, command):
    values = {c: "" for c in header}
    values.update({k: str(v) for k, v in p.items() if k in values})
    values.update(backend=backend, emulated="1" if emulated else "0", status=status,
                  timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command=command)
    if "message" in values:
        values["message"] = message
    return [values[c] for c in header]


def command_for(p, args, layer_run, emulated, mpirun):
    cmd = [layer_run, "--backend", args.backend, "--model", p["model"], "--hidden", str(p["hidden"]),
           "--heads", str(p["heads"]), "--seq", str(p["seq"]), "--batch", str(p["batch"]), "--tp", str(p["tp"]),
           "--config", p["config"], "--attention", p["attention"], "--dtype", p["dtype"], "--layers", str(p["layers"]), "--csv", args.csv]
    if "dropout" in p:
        cmd += ["--dropout", str(p["dropout"])]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    if args.iters is not None:
        cmd += ["--iters", str(args.iters)]
    if args.memory_limit:
        cmd += ["--memory-limit", args.memory_limit]
    if args.extra:
        cmd += shlex.split(args.extra)
    if emulated:
        cmd.append("--emulate-tp")
    elif int(p["tp"]) > 1:
        cmd = [mpirun, "-np", str(p["tp"]), *cmd]
    return cmd


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def use_emulation(args, tp, mpirun, gpus):
    if tp == 1:
        return False
    if args.launcher == "emulate" or args.backend == "meta":
        return True
    if args.launcher == "mpi":
        if not mpirun:
            raise SweepError("--launcher mpi but mpirun is not on PATH")
        return False
    # auto: real ranks when we can launch them (one GPU per rank for cuda)
    return mpirun is None or (args.backend == "cuda" and gpus < tp)


def fmt_time(sec):
    sec = int(sec)
    return f"{sec // 3600}:{sec // 60 % 60:02d}:{sec % 60:02d}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", help="table4 | seqlen | tp | models | longseq | smoke | PLAN.json")
    ap.add_argument("--csv", required=True, help="results CSV (appended to; resumable)")
    ap.add_argument("--backend", default="meta", choices=["cpu", "cuda", "meta"])
    ap.add_argument("--launcher", default="auto", choices=["auto", "mpi", "emulate"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--attention", default="unfused", choices=["unfused", "fused"],
                    help="default for points whose plan does not set it")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--memory-limit", help="e.g. 80GiB: points past it are recorded as oom")
    ap.add_argument("--build", help="build folder holding runners/layer_run")
    ap.add_argument("--extra", help="more layer_run arguments, one string")
    ap.add_argument("--dry-run", action="store_true", help="list the points and what would run; run nothing")
    ap.add_argument("--retry-failed", action="store_true", help="run points recorded as failed again")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per point before it is failed")
    args = ap.parse_args(argv)

    try:
        plan = load_plan(args.plan)
        points = expand(plan, {"dtype": args.dtype, "layers": args.layers, "attention": args.attention})
        layer_run = find_layer_run(args.build)
        header = read_header(layer_run)
        done = done_keys(args.csv, header, args.retry_failed)
    except (SweepError, subprocess.CalledProcessError, OSError) as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    mpirun = shutil.which("mpirun")
    gpus = gpu_count() if args.backend == "cuda" else 0

    todo = []
    for p in points:
        try:
            emulated = use_emulation(args, int(p["tp"]), mpirun, gpus)
        except SweepError as e:
            print(f"sweep: error: {e}", file=sys.stderr)
            return 2
        key = point_key(p, args.backend, emulated)
        todo.append((p, emulated, key in done))
    n_skip = sum(1 for t in todo if t[2])
    print(f"sweep {plan['name']}: {len(points)} points, {n_skip} already in {args.csv}, "
          f"{len(points) - n_skip} to run ({args.backend})", file=sys.stderr)
    if args.dry_run:
        for p, emulated, skip in todo:
            cmd = command_for(p, args, layer_run, emulated, mpirun)
            print(("skip  " if skip else "run   ") + shlex.join(cmd))
        return 0

    start = time.time()
    ran = failures = ooms = 0
    remaining = [t for t in todo if not t[2]]
    try:
        for i, (p, emulated, _) in enumerate(remaining):
            cmd = command_for(p, args, layer_run, emulated, mpirun)
            label = f"{p['model']} s={p['seq']} b={p['batch']} t={p['tp']} {p['config']}"
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                code, err = proc.returncode, proc.stderr.strip()
            except subprocess.TimeoutExpired:
                code, err = -1, f"timed out after {args.timeout:g} s"
            ran += 1
            if code == 3:
                ooms += 1
                state = "oom"
            elif code != 0:
                failures += 1
                state = "failed"
                msg = err.splitlines()[-1] if err else f"exit status {code}"
                append_row(args.csv, header, failed_row(header, p, args.backend, emulated,
                                                        "failed", msg, shlex.join(cmd)))
            else:
                state = "ok"
            elapsed = time.time() - start
            eta = elapsed / (i + 1) * (len(remaining) - i - 1)
            print(f"[{n_skip + i + 1}/{len(points)}] {label}: {state}  elapsed {fmt_time(elapsed)}  "
                  f"eta {fmt_time(eta)}" + (f"  ({err.splitlines()[-1]})" if state == "failed" and err else ""),
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"sweep: interrupted after {ran} points; finished rows are in {args.csv}, run again to resume",
              file=sys.stderr)
        return 130
    print(f"sweep {plan['name']}: ran {ran} ({ooms} oom, {failures} failed) in {fmt_time(time.time() - start)}; "
          f"results in {args.csv}", file=sys.stderr)
    return 1 if failures else 0


def _terminate(signum, frame):
    raise KeyboardInterrupt  # a kill is handled like Ctrl-C: say where the rows are, exit


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
