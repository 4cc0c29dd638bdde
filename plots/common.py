"""Shared by the plot scripts: finding matplotlib, reading the CSVs, one figure style.

Every plot reads CSVs only: layer_run results (any *.csv in RESULTS_DIR with layer_run's
header), CUPTI phase breakdowns (columns config, phase, gpu_ms), and the tables that
`theory --out DIR` writes (which carry the paper's numbers in their paper_* columns).
"""
import csv
import glob
import os
import sys


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

# The five configurations of the paper, then full recompute with distributed checkpoints.
CONFIGS = ["baseline", "sp", "selective", "selective+sp", "full", "full+sp"]
CONFIG_LABEL = {"baseline": "TP (baseline)", "sp": "TP+SP", "selective": "TP+selective",
                "selective+sp": "TP+SP+selective", "full": "full recompute", "full+sp": "full+SP"}
CONFIG_COLOR = {"baseline": "#7f7f7f", "sp": "#1f77b4", "selective": "#ff7f0e", "selective+sp": "#2ca02c",
                "full": "#d62728", "full+sp": "#9467bd"}
MODELS = ["22b", "175b", "530b", "1t"]
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


def save(fig, out_dir, name):
    """Writes OUT/name.png (and .pdf) atomically; returns the PNG path."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        tmp = os.path.join(out_dir, f".{name}.tmp.{os.getpid()}.{ext}")
        fig.savefig(tmp, bbox_inches="tight")
        os.replace(tmp, path)
        paths.append(path)
    plt.close(fig)
    return paths[0]


def write_text(out_dir, name, text):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    tmp = os.path.join(out_dir, f".{name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join("" if v is None else str(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- reading

def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def csv_header(path):
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError):
        return []


def num(v):
    """float of a CSV cell, None for an empty or unreadable one."""
    if v is None or v == "":
        return None
    try:
        return float(v)
    except ValueError:
        return None


def csv_files(results_dir):
    return sorted(glob.glob(os.path.join(results_dir, "*.csv")))


def load_layer_runs(results_dir):
    """All rows of every layer_run CSV in results_dir (other CSVs are skipped)."""
    rows = []
    for path in csv_files(results_dir):
        if LAYER_RUN_COLUMNS <= set(csv_header(path)):
            for r in read_csv(path):
                r["_file"] = os.path.basename(path)
                rows.append(r)
    return rows


def load_cupti(results_dir):
    rows = []
    for path in csv_files(results_dir):
        header = set(csv_header(path))
        if CUPTI_COLUMNS <= header and not LAYER_RUN_COLUMNS <= header:
            rows.extend(read_csv(path))
    return rows


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
        self.runs = load_layer_runs(results_dir) if results_dir else []
        self.cupti = load_cupti(results_dir) if results_dir else []

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


def main_for(make, description):
    """CLI of a single plot script: RESULTS_DIR OUT_DIR [--theory DIR]."""
    import argparse
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("results_dir", help="folder of layer_run / CUPTI CSVs (may be empty)")
    ap.add_argument("out_dir", help="where the figure and table go")
    ap.add_argument("--theory", default=None, help="folder written by `theory --out` (default: RESULTS_DIR/theory)")
    args = ap.parse_args()
    if not os.path.isdir(args.results_dir):
        print(f"plots: error: {args.results_dir} is not a folder", file=sys.stderr)
        return 2
    theory_dir = args.theory or os.path.join(args.results_dir, "theory")
    ctx = Context(args.results_dir, args.out_dir, theory_dir)
    try:
        for path in make(ctx):
            print(path)
    except Skip as e:
        print(f"skipped: {e}")
    return 0
