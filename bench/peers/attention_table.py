#!/usr/bin/env python3
"""Core attention side by side: bench_kernels' fused and unfused paths against PyTorch SDPA.

    attention_table.py OURS.json [OURS.json ...] [SDPA.csv] [--sdpa-backend flash]

OURS.json: `bench_kernels --benchmark_filter=attention --seq=S --benchmark_out=OURS.json
--benchmark_out_format=json` (one file per S, or several S in one file: each benchmark
carries its `seq` and `batch` counters). SDPA.csv: bench/peers/attention_sdpa.py --csv.
Files are told apart by their ending (.json ours, .csv SDPA's; at most one CSV). A JSON file
that does not parse (a run cut before it finished) is skipped with a note, if another one parses.

Per sequence length, median milliseconds of
  fused fwd / bwd                attention_fused_fwd / _bwd
  unfused fwd / bwd / sel.bwd    attention_unfused_fwd / _bwd (from stored probabilities) /
                                 _selective_bwd (recompute, then backward)
  sdpa fwd / bwd                 the newest SDPA row of that s for the backend (default flash)
and the ratios fused/sdpa (fwd, bwd, fwd+bwd), fused/selective (fused fwd+bwd over unfused fwd +
selective bwd: issue 7's comparison) and fused/unfused (fwd+bwd, no recompute); then the bytes
each path keeps for backward. A cell that ran at another batch than the fused one (the unfused
paths halve b to fit at long s) says [b=N]; ratios are then per sample (ms / b) and marked *.
Cells: oom (out of memory), skip (skipped, e.g. no GPU), unsup (SDPA backend cannot run it),
- (not measured). Exit status: 0 ok; 2 bad input (one line on stderr).
"""
import csv
import json
import os
import re
import sys

PROG = "attention_table.py"
NAME = re.compile(r"^(?P<backend>[^/]+)/attention_(?P<path>fused|unfused_selective|unfused)_(?P<pass>fwd|bwd)(/|$)")
UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
KEYS = [("fused", "fwd"), ("fused", "bwd"), ("unfused", "fwd"), ("unfused", "bwd"), ("unfused_selective", "bwd")]


class BadInput(Exception):
    pass


class Cell:
    """One measurement: ms (median) at batch, or a status."""

    def __init__(self, ms=None, batch=None, status="ok", saved=None, note=""):
        self.ms, self.batch, self.status, self.saved, self.note = ms, batch, status, saved, note

    @property
    def ok(self):
        return self.status == "ok" and self.ms is not None


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def load_json(paths):
    """[(path, document)] of the files that parse. One that does not (a bench_kernels run cut at its
    timeout never writes its closing brackets) is skipped with a note, so that the others still make
    a table; when none parses, the first one's error is the error."""
    docs, errors = [], []
    for path in paths:
        try:
            with open(path) as f:
                docs.append((path, json.load(f)))
        except (OSError, ValueError) as e:
            errors.append((path, e))
    if errors and not docs:
        raise BadInput("cannot read bench_kernels JSON '%s': %s" % errors[0])
    for path, e in errors:
        print("%s: note: skipped '%s': not valid JSON (%s)" % (PROG, path, e), file=sys.stderr)
    return docs


def read_ours(paths):
    """{seq: {(path, pass): Cell}}, plus a description of where they ran."""
    table, devices = {}, set()
    for path, doc in load_json(paths):
        if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
            raise BadInput("'%s' is not a Google Benchmark JSON file (no 'benchmarks' list)" % path)
        ctx = doc.get("context", {}) if isinstance(doc.get("context"), dict) else {}
        for b in doc["benchmarks"]:
            m = NAME.match(str(b.get("name", "")))
            if not m or b.get("run_type", "iteration") != "iteration":
                continue
            devices.add("%s on %s" % (ctx.get("actbench_backend", m.group("backend")), ctx.get("actbench_device", "?")))
            seq = _num(b.get("seq")) or _num(ctx.get("actbench_seq"))
            batch = _num(b.get("batch")) or _num(ctx.get("actbench_attn_batch"))
            if seq is None:
                raise BadInput("'%s': benchmark %s has no seq (counter or actbench_seq context)" % (path, b["name"]))
            key = (m.group("path"), m.group("pass"))
            if b.get("error_occurred") or b.get("skipped"):
                msg = str(b.get("error_message") or b.get("skip_message") or "")
                status = "oom" if "out of memory" in msg else "skip"
                cell = Cell(batch=batch, status=status, note=msg)
            else:
                ms = _num(b.get("ms_median"))
                if ms is None:
                    rt = _num(b.get("real_time"))
                    ms = None if rt is None else rt * UNIT_MS.get(b.get("time_unit", "ns"), 1e-6)
                cell = Cell(ms=ms, batch=batch, saved=_num(b.get("saved_bytes")), note=str(b.get("label", "")))
            table.setdefault(int(seq), {})[key] = cell  # later files / rows win
    if not table:
        raise BadInput("no attention_* benchmarks in %s (run bench_kernels with --benchmark_filter=attention)"
                       % ", ".join(paths))
    return table, sorted(devices)


def read_sdpa(path, backend):
    """{seq: Cell(fwd), Cell(bwd)} from the newest row per seq of `backend`, and a description."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise BadInput("cannot read SDPA CSV '%s': %s" % (path, e))
    if rows and not {"seq", "fwd_ms", "bwd_ms", "status", "sdpa_backend"} <= set(rows[0]):
        raise BadInput("'%s' is not an attention_sdpa.py CSV (columns seq, fwd_ms, bwd_ms, status, sdpa_backend)"
                       % path)
    out, desc = {}, set()
    for r in rows:  # appended in time order: the newest row of a seq wins
        if r.get("sdpa_backend") != backend:
            continue
        seq, batch = _num(r.get("seq")), _num(r.get("batch"))
        if seq is None:
            continue
        desc.add("%s, torch %s on %s" % (backend, r.get("torch_version", "?"), r.get("device", "?")))
        status = r.get("status", "")
        if status == "ok":
            saved = _num(r.get("saved_bytes"))
            cells = (Cell(_num(r.get("fwd_ms")), batch, saved=saved), Cell(_num(r.get("bwd_ms")), batch, saved=saved))
        else:
            st = "unsup" if status == "unsupported" else (status or "?")
            cells = (Cell(batch=batch, status=st, note=r.get("reason", "")),) * 2
        out[int(seq)] = cells
    return out, sorted(desc)


def fmt_cell(cell, ref_batch):
    if cell is None:
        return "-"
    if not cell.ok:
        return cell.status
    text = "%.3f" % cell.ms if cell.ms < 100 else "%.1f" % cell.ms
    if ref_batch is not None and cell.batch is not None and cell.batch != ref_batch:
        text += " [b=%d]" % cell.batch
    return text


def ratio(num_cells, den_cells):
    """sum(ms) of num over den; per sample (ms / b, marked *) when the batches differ."""
    cells = list(num_cells) + list(den_cells)
    if any(c is None or not c.ok for c in cells):
        return "-"
    batches = {c.batch for c in cells}
    mark = ""
    if len(batches) == 1:
        num, den = sum(c.ms for c in num_cells), sum(c.ms for c in den_cells)
    elif None in batches:
        return "-"
    else:
        num, den = sum(c.ms / c.batch for c in num_cells), sum(c.ms / c.batch for c in den_cells)
        mark = "*"
    return "%.3f%s" % (num / den, mark) if den > 0 else "-"


def fmt_bytes(v):
    return "-" if v is None else "%.1f" % (v / 2 ** 20)


def render(ours, sdpa, backend, devices, sdpa_desc):
    lines = ["core attention, forward and backward (median ms): bench_kernels vs PyTorch SDPA (%s)" % backend,
             "ours: %s" % ("; ".join(devices) or "?"),
             "sdpa: %s" % ("; ".join(sdpa_desc) or "no rows for backend %s" % backend)]
    head = ["s", "b", "fused fwd", "fused bwd", "unf fwd", "unf bwd", "sel bwd", "sdpa fwd", "sdpa bwd",
            "fused/sdpa fwd", "bwd", "total", "fused/sel", "fused/unf"]
    body = []
    mixed = False
    for seq in sorted(set(ours) | set(sdpa)):
        o = ours.get(seq, {})
        ff, fb = o.get(("fused", "fwd")), o.get(("fused", "bwd"))
        uf, ub, sb = o.get(("unfused", "fwd")), o.get(("unfused", "bwd")), o.get(("unfused_selective", "bwd"))
        sf, sbw = sdpa.get(seq, (None, None))
        ref = next((c.batch for c in (ff, fb, uf, sf) if c is not None and c.batch is not None), None)
        row = [str(seq), "-" if ref is None else "%d" % ref]
        row += [fmt_cell(c, ref) for c in (ff, fb, uf, ub, sb, sf, sbw)]
        row += [ratio([ff], [sf]), ratio([fb], [sbw]), ratio([ff, fb], [sf, sbw]),
                ratio([ff, fb], [uf, sb]), ratio([ff, fb], [uf, ub])]
        mixed |= any(r.endswith("*") for r in row[-5:])
        body.append(row)
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    fmt = lambda r: "  ".join(v.rjust(widths[i]) for i, v in enumerate(r))
    lines += ["", fmt(head)] + [fmt(r) for r in body]
    lines.append("fused/sel = (fused fwd + bwd) / (unfused fwd + selective bwd); fused/unf = (fused fwd + bwd) / "
                 "(unfused fwd + bwd); < 1: fused faster")
    if mixed:
        lines.append("* per sample (ms / b): the two sides ran at different batch sizes")
    # bytes kept for backward
    head2 = ["s", "b", "fused", "unfused", "selective", "sdpa"]
    body2 = []
    for seq in sorted(set(ours) | set(sdpa)):
        o = ours.get(seq, {})
        ref = next((c.batch for c in (o.get(("fused", "fwd")), o.get(("fused", "bwd"))) + sdpa.get(seq, (None,))
                    if c is not None and c.batch is not None), None)

        def saved(*cells):
            for c in cells:
                if c is not None and c.ok and c.saved is not None:
                    differs = ref is not None and c.batch is not None and c.batch != ref
                    return fmt_bytes(c.saved) + (" [b=%d]" % c.batch if differs else "")
            return "-"

        body2.append([str(seq), "-" if ref is None else "%d" % ref, saved(o.get(("fused", "fwd")), o.get(("fused", "bwd"))),
                      saved(o.get(("unfused", "fwd")), o.get(("unfused", "bwd"))),
                      saved(o.get(("unfused_selective", "bwd"))), saved(*sdpa.get(seq, (None, None)))])
    widths2 = [max(len(r[i]) for r in [head2] + body2) for i in range(len(head2))]
    lines += ["", "saved for backward (MiB: q, k, v + what forward leaves allocated)",
              "  ".join(v.rjust(widths2[i]) for i, v in enumerate(head2))]
    lines += ["  ".join(v.rjust(widths2[i]) for i, v in enumerate(r)) for r in body2]
    notes = []
    for seq in sorted(ours):
        for key in KEYS:
            c = ours[seq].get(key)
            if c is not None and not c.ok and c.note:
                notes.append("s=%d %s_%s: %s" % (seq, key[0], key[1], c.note))
    for seq in sorted(sdpa):
        c = sdpa[seq][0]
        if not c.ok and c.note:
            notes.append("s=%d sdpa: %s" % (seq, c.note))
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        backend = "flash"
        files = []
        it = iter(argv)
        for a in it:
            if a == "--sdpa-backend":
                backend = next(it, None)
                if not backend:
                    raise BadInput("--sdpa-backend needs a value")
            elif a.startswith("--sdpa-backend="):
                backend = a.split("=", 1)[1]
            elif a in ("-h", "--help"):
                print(__doc__)
                return 0
            elif a.startswith("-"):
                raise BadInput("unknown option '%s'" % a)
            else:
                files.append(a)
        jsons = [f for f in files if f.endswith(".json")]
        csvs = [f for f in files if f.endswith(".csv")]
        other = [f for f in files if f not in jsons and f not in csvs]
        if other:
            raise BadInput("'%s' is neither .json (bench_kernels) nor .csv (attention_sdpa.py)" % other[0])
        if not jsons:
            raise BadInput("usage: %s OURS.json [OURS.json ...] [SDPA.csv] [--sdpa-backend NAME]" % PROG)
        if len(csvs) > 1:
            raise BadInput("give at most one SDPA CSV")
        for f in files:
            if not os.path.isfile(f):
                raise BadInput("no such file '%s'" % f)
        ours, devices = read_ours(jsons)
        sdpa, desc = read_sdpa(csvs[0], backend) if csvs else ({}, [])
        sys.stdout.write(render(ours, sdpa, backend, devices, desc))
        return 0
    except BadInput as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
