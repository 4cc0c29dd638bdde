"""Shared by the plot scripts: finding matplotlib, reading the CSVs, one figure style.

Every plot reads CSVs only: layer_run results (any *.csv file in RESULTS_DIR with layer_run's
header; folders, FIFOs and devices named *.csv are ignored and named, never opened), CUPTI
phase breakdowns (columns config, phase, gpu_ms), and the tables that `theory --out DIR`
writes (which carry the paper's numbers in their paper_* columns). Malformed lines (wrong
field count, glued or half-written rows, bytes that are not UTF-8, runaway fields), values
that are not numbers as layer_run writes them (ASCII digits: not '１２', '1_000' or ' 7'),
status=ok rows without their measurements and CSVs meant as results but missing a required
column are each named (file and line), left out of every plot, and make the run end with
status 2; the figures the rest allows are made.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runners"))
import number_text  # noqa: E402  (numbers spelled as layer_run writes them, shared with sweep.py)
import results_csv  # noqa: E402  (the line-by-line CSV reader shared with sweep.py)
import user_files  # noqa: E402


def ensure_matplotlib():
    """Re-run the calling script under /usr/bin/python3 when this python3 lacks matplotlib."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system) \
            and not os.environ.get("ACTBENCH_PLOTS_REEXEC"):
        os.environ["ACTBENCH_PLOTS_REEXEC"] = "1"
        os.execv(system, [system] + sys.argv)
    raise SystemExit("plots: error: matplotlib is not installed (apt-get install python3-matplotlib)")


ensure_matplotlib()

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The configurations and models (runners/facts.json, written by actbench_facts from the C++
# tables); labels and colours are the plots' own, keyed by those names.
with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runners", "facts.json")) as _f:
    FACTS = json.load(_f)
RECOMPUTE_ORDER = ["none", "selective", "full"]
# Shown from least recomputed to most, each without SP then with it: the paper's five, then
# full recompute with distributed checkpoints.
CONFIGS = [c["name"] for c in sorted(FACTS["configs"],
                                     key=lambda c: (RECOMPUTE_ORDER.index(c["recompute"]), c["sequence_parallel"]))]
CONFIG_LABEL = {"baseline": "TP (baseline)", "sp": "TP+SP", "selective": "TP+selective",
                "selective+sp": "TP+SP+selective", "full": "full recompute", "full+sp": "full+SP"}
CONFIG_COLOR = {"baseline": "#7f7f7f", "sp": "#1f77b4", "selective": "#ff7f0e", "selective+sp": "#2ca02c",
                "full": "#d62728", "full+sp": "#9467bd"}
PRESETS = {p["name"]: p for p in FACTS["presets"]}
MODELS = [p["name"] for p in FACTS["presets"] if p["paper"]]  # Table 3
MODEL_LABEL = {"22b": "22B", "175b": "175B", "530b": "530B", "1t": "1T"}
GIB = 1024.0 ** 3
PAPER_GPU = "A100"  # every number the paper reports was measured on A100s

# The columns that identify a layer_run results CSV and a CUPTI breakdown.
LAYER_RUN_COLUMNS = {"backend", "device", "model", "hidden", "heads", "seq", "batch", "tp", "config", "dtype",
                     "fwd_ms", "bwd_ms", "act_bytes", "act_bytes_formula", "status"}
CUPTI_COLUMNS = {"config", "phase", "gpu_ms"}

HALF_PAGE_WIDTH_IN = 3.4


class Skip(Exception):
    """Raised by a plot when the data it needs is not there; the message says what is missing."""


def style():
    plt.rcParams.update({
        "font.size": 7, "axes.titlesize": 7.5, "axes.labelsize": 7, "xtick.labelsize": 6.5, "ytick.labelsize": 6.5,
        "legend.fontsize": 6, "legend.frameon": False, "axes.spines.top": False, "axes.spines.right": False,
        "axes.grid": True, "grid.alpha": 0.25, "grid.linewidth": 0.5, "axes.axisbelow": True,
        "savefig.dpi": 200, "figure.dpi": 100, "lines.linewidth": 1.2, "lines.markersize": 3.5,
        "hatch.linewidth": 0.5, "pdf.fonttype": 42,
    })


def figure(height_in=2.4, width_in=HALF_PAGE_WIDTH_IN):
    style()
    return plt.subplots(figsize=(width_in, height_in), constrained_layout=True)


class OutputError(Exception):
    """An output file cannot be written (its path is a folder, the folder is a file, ...)."""


def _replace_atomically(out_dir, name, write):
    """write(tmp) then rename onto OUT/name: a reader never sees half a file; no temporary is left."""
    path = os.path.join(out_dir, name)
    tmp = os.path.join(out_dir, f".{name}.tmp.{os.getpid()}")
    try:
        os.makedirs(out_dir, exist_ok=True)
        if os.path.isdir(path):
            raise IsADirectoryError(21, "is a folder", path)
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.unlink(tmp)
        raise OutputError(f"cannot write {e.filename or path}: {e.strerror or e}")
    return path


def save(fig, out_dir, name):
    """Writes OUT/name.png (and .pdf) atomically; returns the PNG path."""
    try:
        paths = [_replace_atomically(out_dir, f"{name}.{ext}",
                                     lambda tmp, ext=ext: fig.savefig(tmp, bbox_inches="tight", format=ext))
                 for ext in ("png", "pdf")]
    finally:
        plt.close(fig)
    return paths[0]


def write_text(out_dir, name, text):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    return _replace_atomically(out_dir, name, write)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join("" if v is None else str(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- reading

# The columns a layer_run CSV must have for the plots, and the ones only layer_run writes
# (a CSV holding one of those is meant to be a layer_run CSV, so a missing column is an error).
LAYER_RUN_MARKERS = {"act_bytes_formula", "act_extra_bytes", "fwd_retained_bytes"}
CUPTI_MARKERS = {"phase", "gpu_ms"}
# Columns that are numbers in every layer_run row that has them, and the ones an ok row must fill.
SHAPE_COLUMNS = ["hidden", "heads", "seq", "batch", "tp"]
OK_ROW_NEEDS = SHAPE_COLUMNS + ["act_bytes", "act_bytes_formula"]


def is_number_column(name):
    return name in SHAPE_COLUMNS or name in ("layers", "iters", "warmup", "dropout") or \
        name.endswith(("_ms", "_bytes", "_gbps"))


class Inputs:
    """Every CSV read, once, and every problem found in them as 'FILE[:LINE]: what'."""

    def __init__(self):
        self.cache = {}
        self.problems = []   # errors: malformed lines, missing columns, unreadable files; every one
        self.summary = []    # the same, at most a few lines per file plus a count: for stderr
        self.ignored = []    # CSVs in RESULTS_DIR that are neither layer_run nor CUPTI ones

    def problem(self, text):
        self.problems.append(text)
        self.summary.append(text)

    def line_problems(self, path, problems):
        """[(line, why)] of one file: each named in problems, the first few in summary."""
        self.problems += results_csv.summarize(path, problems, limit=len(problems))
        self.summary += results_csv.summarize(path, problems)

    def read(self, path):
        """(header, rows as dicts with _file and _line) or (None, []) when the file is unusable."""
        if path not in self.cache:
            try:
                user_files.check_file(path, path)  # a FIFO would block the reader
                header, rows, problems = results_csv.read(path)
            except user_files.UserFileError as e:
                self.problem(str(e))
                self.cache[path] = (None, [])
            except results_csv.BadFile as e:
                self.problem(f"{path}: {e}")
                self.cache[path] = (None, [])
            else:
                self.line_problems(path, problems)
                name = os.path.basename(path)
                self.cache[path] = (header, [dict(zip(header, row), _file=name, _line=line) for line, row in rows])
        return self.cache[path]

    def bad_values(self, path, rows, check):
        """Rows for which check(row) gives no complaint; each complaint is a problem."""
        good, bad = [], []
        for r in rows:
            why = check(r)
            (bad if why else good).append((r["_line"], why) if why else r)
        self.line_problems(path, bad)
        return good


INPUTS = Inputs()


def read_csv(path):
    return INPUTS.read(path)[1]


def num(v):
    """float of a CSV cell spelled as layer_run writes numbers (ASCII), None for any other
    (empty, '１２', '1_000', ' 7', 'inf')."""
    return number_text.real(v)


def layer_run_row_problem(r):
    for c, v in r.items():
        if c.startswith("_") or v == "" or not is_number_column(c):
            continue
        x = num(v)
        if x is None:
            return f"{c} is '{v[:40]}', not a finite number as layer_run writes one (ASCII digits)"
        if x < 0 or x > 2.0 ** 63:  # times, bytes and sizes: none is negative or past 64 bits
            return f"{c} is {v[:40]}, out of range"
        if c in SHAPE_COLUMNS and number_text.integer(v, 1, number_text.INT64_MAX) is None:
            return f"{c} is {v[:40]}, not a positive integer"
    if r.get("status") == "ok":
        for c in OK_ROW_NEEDS:
            if num(r.get(c)) is None:
                return f"{c} is empty in a status=ok row"
        for c in ("act_bytes", "act_bytes_formula"):
            if num(r.get(c)) == 0:  # a layer always saves its input at least
                return f"{c} is 0 in a status=ok row"
    return None


def cupti_row_problem(r):
    if num(r.get("gpu_ms")) is None:
        return f"gpu_ms is '{(r.get('gpu_ms') or '')[:40]}', not a finite number (ASCII digits)"
    return None


def csv_files(results_dir):
    return sorted(glob.glob(os.path.join(results_dir, "*.csv")))


def classify(path, header):
    """'layer_run', 'cupti' or None; a CSV meant as one of them but missing columns is a problem."""
    cols = set(header)
    if LAYER_RUN_COLUMNS <= cols:
        return "layer_run"
    if CUPTI_COLUMNS <= cols and not cols & LAYER_RUN_MARKERS:
        return "cupti"
    if "peer" in cols:  # bench/peers/ CSVs (PyTorch): read by their own tables, not by these plots
        INPUTS.ignored.append(f"{os.path.basename(path)} (a peer's CSV)")
        return None
    for kind, needed, markers, most in (("layer_run", LAYER_RUN_COLUMNS, LAYER_RUN_MARKERS, 13),
                                        ("CUPTI", CUPTI_COLUMNS, CUPTI_MARKERS, 3)):
        if cols & markers or len(cols & needed) >= most:
            missing = ", ".join(sorted(needed - cols))
            INPUTS.problem(f"{path}: a {kind} CSV without the required column(s) {missing}: not read")
            return None
    INPUTS.ignored.append(f"{os.path.basename(path)} (neither a layer_run nor a CUPTI CSV)")
    return None


def load_results(results_dir):
    """(layer_run rows, CUPTI rows) of every CSV in results_dir; what is wrong goes to INPUTS."""
    runs, cupti = [], []
    for path in csv_files(results_dir):
        try:
            user_files.check_file(os.path.basename(path), path)
        except user_files.UserFileError as e:
            if os.path.exists(path):  # a folder, FIFO or device: no results file, never opened
                INPUTS.ignored.append(str(e))
                continue
        header, rows = INPUTS.read(path)  # one that cannot be read is a problem
        if header is None:
            continue
        kind = classify(path, header)
        if kind == "layer_run":
            runs += INPUTS.bad_values(path, rows, layer_run_row_problem)
        elif kind == "cupti":
            cupti += INPUTS.bad_values(path, rows, cupti_row_problem)
    return runs, cupti


class Theory:
    """The CSVs of `theory --out DIR`; missing ones raise Skip when asked for."""

    def __init__(self, directory):
        self.dir = directory

    def has(self, name):
        return bool(self.dir) and os.path.exists(os.path.join(self.dir, name))

    def table(self, name):
        if not self.has(name):
            raise Skip(f"no theory table {name} (run `theory --out DIR` or pass --theory DIR)")
        return read_csv(os.path.join(self.dir, name))


class Context:
    def __init__(self, results_dir, out_dir, theory_dir):
        self.results_dir = results_dir
        self.out_dir = out_dir
        self.theory = Theory(theory_dir)
        self.runs, self.cupti = load_results(results_dir) if results_dir else ([], [])
        self.inputs = INPUTS

    def ok_runs(self):
        """Rows of the paper's layer (unfused attention; older CSVs have no attention column)."""
        return [r for r in self.all_ok_runs() if r.get("attention", "unfused") in ("", "unfused")]

    def all_ok_runs(self):
        """Every ok row, fused attention (beyond the paper) included."""
        return [r for r in self.runs if r.get("status") == "ok"]

    def timed_runs(self):
        return [r for r in self.ok_runs() if num(r.get("fwd_ms")) is not None and num(r.get("bwd_ms")) is not None]


def shape_key(r):
    """What makes two layer_run rows comparable (one layer shape on one device)."""
    return (r.get("backend"), r.get("device"), r.get("model"), r.get("hidden"), r.get("heads"), r.get("seq"),
            r.get("batch"), r.get("tp"), r.get("dtype"))


def is_preset_shape(key, model, fields):
    """Whether a shape_key is `model` at its preset's values of fields (of seq, batch, tp)."""
    index = {"seq": 5, "batch": 6, "tp": 7}
    return key[2] == model and all(key[index[f]] == str(PRESETS[model][f]) for f in fields)


def describe_shape(key):
    backend, device, model, h, a, s, b, t, dtype = key
    return f"{model} (h={h}, a={a}, s={s}, b={b}, t={t}, {dtype}) on {device or backend}"


def latest_by_config(rows):
    """The newest row of each config (rows appended later win ties)."""
    out = {}
    for r in rows:
        c = r.get("config")
        if c not in out or r.get("timestamp", "") >= out[c].get("timestamp", ""):
            out[c] = r
    return out


def report(prog, inputs, out=sys.stderr):
    """Prints the input problems (a few lines per file, then a count); returns the exit status
    (2 when there was one)."""
    for p in inputs.summary:
        print(f"{prog}: error: {p}", file=out)
    return 2 if inputs.problems else 0


def main_for(make, description):
    """CLI of a single plot script: RESULTS_DIR OUT_DIR [--theory DIR]."""
    import argparse
    prog = os.path.basename(sys.argv[0])
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("results_dir", help="folder of layer_run / CUPTI CSVs (may be empty)")
    ap.add_argument("out_dir", help="where the figure and table go")
    ap.add_argument("--theory", default=None, help="folder written by `theory --out` (default: RESULTS_DIR/theory)")
    args = ap.parse_args()
    if not os.path.isdir(args.results_dir):
        print(f"{prog}: error: {args.results_dir} is not a folder", file=sys.stderr)
        return 2
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        print(f"{prog}: error: OUT_DIR {args.out_dir} is a file, not a folder", file=sys.stderr)
        return 2
    theory_dir = args.theory or os.path.join(args.results_dir, "theory")
    ctx = Context(args.results_dir, args.out_dir, theory_dir)
    status = 0
    try:
        for path in make(ctx):
            print(path)
    except Skip as e:
        print(f"skipped: {e}")
    except OutputError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        status = 2
    return report(prog, ctx.inputs) or status
