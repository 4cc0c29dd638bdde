#!/usr/bin/env python3
"""theory memory against the peaks Megatron-LM measured in its own functional tests.

Each case is a folder holding Megatron-LM's test configuration (model_config.yaml, read by
`theory memory --megatron-args` as its launcher reads it) and measured.json: the test's
recorded `mem-max-allocated-bytes` and `mem-allocated-bytes` at its last logged step (what
torch.cuda.memory_stats() gave on the last rank, whose pipeline stage is the last), the GPU
count and where the numbers come from. For every case this runs `theory memory` and writes one
row: the measured and modelled bytes side by side, and whether the case is one theory models
(no flag in its warning line), one it only approximates (flags named), or one it refuses.

    /usr/bin/python3 runners/megatron_validation.py [--theory build/runners/theory]
        [--cases tests/fixtures/megatron_functional] [--csv results/megatron_validation.csv]
        [--check 0.10]

--check F exits 1 (after writing everything) when a modelled case's peak is off by more than
the fraction F, naming each one. Standard library only.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import user_files

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Every output column, declared once: (name, unit, meaning).
COLUMNS = [
    ("suite", "", "the test suite folder (gpt, moe)"),
    ("case", "", "the test case, as Megatron-LM names its folder"),
    ("status", "", "modelled: no unmodelled flag; unmodelled: flags the warning names; refused: theory's error"),
    ("gpu", "", "the GPU the measurement ran on"),
    ("gpus", "", "the world size"),
    ("measured_peak_bytes", "bytes", "mem-max-allocated-bytes at the last logged step, last rank (measured)"),
    ("modelled_peak_bytes", "bytes", "theory memory's peak_bytes of the last pipeline stage (modelled)"),
    ("peak_ratio", "", "modelled / measured peak"),
    ("measured_allocated_bytes", "bytes", "mem-allocated-bytes at the last logged step (measured, between steps)"),
    ("modelled_rest_bytes", "bytes", "theory memory's rest_bytes of the last stage (modelled, between steps)"),
    ("rest_ratio", "", "modelled rest / measured allocated"),
    ("peak_at", "", "the op theory places the last stage's peak at"),
    ("note", "", "the flags not modelled, or why theory refused the case"),
]
HEADER = [name for name, _, _ in COLUMNS]
KNOWN_GPUS = ("a100", "h100", "h200", "b200")  # theory memory --gpu


def read_case(folder):
    measured = json.loads(user_files.read_bytes("measured.json", os.path.join(folder, "measured.json")))
    for key in ("mem-max-allocated-bytes", "mem-allocated-bytes", "gpus"):
        if key not in measured:
            raise user_files.UserFileError(f"{folder}/measured.json: no '{key}'")
    return measured


def run_theory(theory, config, gpus, gpu):
    """(last stage's CSV row or None, status, note). gpu: the measurement's (it sizes the
    library workspaces), when theory knows it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "stages.csv")
        args = [theory, "memory", "--megatron-args", config, "--gpus", str(gpus), "--csv", out]
        if gpu.lower() in KNOWN_GPUS:
            args += ["--gpu", gpu.lower()]
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        lines = p.stderr.strip().splitlines()
        if p.returncode != 0:
            return None, "refused", (lines[-1] if lines else f"exit {p.returncode}").removeprefix("theory: error: ")
        warnings = [l.split("): ", 1)[-1] for l in lines if "warning: not modelled" in l]
        with open(out, newline="") as f:
            stages = list(csv.DictReader(f))
    return stages[-1], ("unmodelled" if warnings else "modelled"), "; ".join(warnings)


def validate(theory, cases):
    rows = []
    for suite in sorted(os.listdir(cases)):
        suite_dir = os.path.join(cases, suite)
        if not os.path.isdir(suite_dir):
            continue
        for case in sorted(os.listdir(suite_dir)):
            folder = os.path.join(suite_dir, case)
            measured = read_case(folder)
            stage, status, note = run_theory(theory, os.path.join(folder, "model_config.yaml"), measured["gpus"],
                                             measured.get("gpu", ""))
            peak, allocated = measured["mem-max-allocated-bytes"], measured["mem-allocated-bytes"]
            row = {"suite": suite, "case": case, "status": status, "gpu": measured.get("gpu", ""),
                   "gpus": measured["gpus"], "measured_peak_bytes": peak, "measured_allocated_bytes": allocated,
                   "note": note}
            if stage:
                row["modelled_peak_bytes"] = int(float(stage["peak_bytes"]))
                row["modelled_rest_bytes"] = int(float(stage["rest_bytes"]))
                row["peak_ratio"] = f"{row['modelled_peak_bytes'] / peak:.4f}"
                row["rest_ratio"] = f"{row['modelled_rest_bytes'] / allocated:.4f}"
                row["peak_at"] = stage["peak_at"]
            rows.append(row)
    return rows


def write_csv(path, rows):
    """Whole or not at all: the rows go to a temporary file renamed over `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".megatron_validation.")
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER)
        w.writeheader()
        for row in rows:
            w.writerow(row)
    os.replace(tmp, path)


def summary(rows):
    lines = []
    for status in ("modelled", "unmodelled"):
        errors = sorted(abs(float(r["peak_ratio"]) - 1) for r in rows if r["status"] == status)
        if errors:
            median = errors[len(errors) // 2]
            lines.append(f"{status}: {len(errors)} cases, peak error median {median:.1%}, largest {errors[-1]:.1%}")
    refused = sum(r["status"] == "refused" for r in rows)
    lines.append(f"refused: {refused} cases")
    return lines


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--theory", default=os.path.join(ROOT, "build", "runners", "theory"))
    ap.add_argument("--cases", default=os.path.join(ROOT, "tests", "fixtures", "megatron_functional"))
    ap.add_argument("--csv", default=os.path.join(ROOT, "results", "megatron_validation.csv"))
    ap.add_argument("--check", type=float, default=None, metavar="F",
                    help="exit 1 when a modelled case's peak is off by more than the fraction F")
    a = ap.parse_args(argv)
    if not os.path.isfile(a.theory) or not os.access(a.theory, os.X_OK):
        print(f"megatron_validation: --theory {a.theory}: not an executable (build first: bash scripts/build.sh)",
              file=sys.stderr)
        return 2
    if not os.path.isdir(a.cases):
        print(f"megatron_validation: --cases {a.cases}: not a folder", file=sys.stderr)
        return 2
    try:
        rows = validate(a.theory, a.cases)
    except (user_files.UserFileError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
        print(f"megatron_validation: {e}", file=sys.stderr)
        return 2
    write_csv(a.csv, rows)
    for r in rows:
        ratio = r.get("peak_ratio", "-")
        print(f"{r['status']:10} {ratio:>7} {r['suite']}/{r['case']}" + (f"  ({r['note']})" if r["note"] else ""))
    for line in summary(rows):
        print(line)
    if a.check is not None:
        off = [r for r in rows if r["status"] == "modelled" and abs(float(r["peak_ratio"]) - 1) > a.check]
        for r in off:
            print(f"#wrong {r['suite']}/{r['case']}: modelled peak {r['peak_ratio']} x the measured", file=sys.stderr)
        if off:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
