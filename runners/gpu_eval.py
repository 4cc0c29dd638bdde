#!/usr/bin/env python3
"""The whole GPU evaluation in one command, within a time budget, on a GPU node: the GPU kernel
tests, Table 4 (with its CUPTI phase split, and fused attention), the Google Benchmark
binaries, the PyTorch peer, fused attention against SDPA and the sequence-length sweep. Each
step runs under its own timeout and the evaluation goes on past failures; results are packed
into one archive, OUTDIR/results.tar.gz, after every step. Run it again with the same OUTDIR to
resume: steps that finished are kept, the rest run. Without a GPU it exits 0 and marks every
step skipped with the reason.

  bash scripts/build.sh                                  # once: build/ (CUDA on when nvcc exists)
  bash scripts/gpu_eval.sh OUTDIR [--budget SEC] [--steps LIST] [--quick] [--fresh]
                                  [--bin-dir DIR] [--max-step SEC] [--force] [--python PY]
  bash scripts/gpu_eval.sh --list-steps
  bash scripts/gpu_eval.sh --env [--bin-dir DIR]        # prints `export LD_LIBRARY_PATH=...`
  bash scripts/gpu_eval.sh --unpack OUTDIR_OR_TARBALL [RESULTS_DIR]   # merge into results/

(scripts/gpu_eval.sh runs this file, runners/gpu_eval.py, with python3 >= 3.9; standard library only.)

Steps, in this order (groups in --steps: tests table4 bench peer attention sweep cputests
sanitize, or single steps; default: all but cputests and sanitize):
  tests          test_gpu_ops (GPU kernels against the cpu reference; run first, flagged if failed)
  table4         layer_run --backend cuda --model 22b --tp 8 --emulate-tp, the five configurations,
  table4_cupti     --warmup 3 --iters 20; then the same with --cupti (Figure 8's phase split);
  table4_fused     then with --attention fused
  bench_kernels  bench_kernels --backend=cuda, bench_layer --backend=cuda (JSON)
  bench_layer
  peer           bench/peers/side_by_side.sh: the PyTorch eager peer beside our layer, and its table
  attention_s*   bench_kernels --backend=cuda --benchmark_filter=attention --seq=2048|8192|32768 and
  attention_sdpa   bench/peers/attention_sdpa.py --seq 2048,8192,32768 (each only if it exists);
                   then attention_table.py's table of both (raw/attention_table.txt, summary)
  attention_goal   the tensor-core kernel's goal shape (s = 8192, d = 128, bf16, causal): bench_kernels'
  attention_goal_sdpa  fused fwd/bwd at --attn-dropout 0 and 0.1, SDPA's cudnn and flash backends at
                   the same; then attention_goal.py's verdict (raw/attention_goal.txt, summary)
  sweep_seqlen   runners/sweep.py seqlen --backend cuda (resumable; whatever time is left),
  sweep_seqlen_fused   then with --attention fused,
  sweep_longcontext    then the longcontext plan (22B, t = 8 and C = 1..16 emulated, 32k..1M
                       tokens, ring attention): each rank's time and bytes
  sweep_moe            then the moe plan (Mixtral-8x7B's layer, t = 2 and the expert layouts
                       ep 1..8 x etp 1, 2 emulated, the MoE recompute modules): rank 0's time
  cputests       the cpu gtests (of a portable bundle: bin/cpu_tests.tar.xz); not in the default
  sanitize_memcheck   compute-sanitizer memcheck / racecheck (shared memory) on test_gpu_ops, the
  sanitize_racecheck  kernels at small shapes (worth one run when kernels change); not in the default
Before them, always: `env` records nvidia-smi, versions, the libraries the binaries resolve.

Binaries: --bin-dir DIR (a build folder, or a bundle from scripts/portable_bundle.sh for a node
without MPI or Google Benchmark), else $ACTBENCH_BUILD, else build/, else .portable-bundle/.
Time: --budget (default 2400 s) is shared by the steps in order; a step gets min(its cap, what is
left, --max-step); one that cannot get its minimum is skipped and named at the end: run again
with the same OUTDIR (and a budget) to do it. --fresh forgets an earlier run in OUTDIR.
--quick: warm-up 1, 3 iterations, benchmark_min_time 0.05 (a first look). --force: run the GPU
steps without a GPU too (they fail, each with its reason: for testing this runner).
Libraries: LD_LIBRARY_PATH (for our binaries only; python keeps its own) = the bundle's lib/,
then PyTorch's site-packages/nvidia/*/lib, then /usr/local/cuda/lib64 (and extras/CUPTI/lib64),
then the bundle's lib/fallback/{cuda,nccl-stub,cxx} each only if ldd finds no such library.

OUTDIR gets log.txt (everything), steps.csv (step, status, seconds, detail; status ok | failed |
timeout | skipped), summary.txt (also printed) and results.tar.gz:
  results/  CSVs and JSON to keep: table4_<dev>.csv, table4_<dev>_cupti.csv,
            table4_fused_<dev>.csv, peer_torch_<dev>.csv, bench_*_<dev>.json,
            attention_*_<dev>*, seqlen_cuda_<dev>.csv, longcontext_cuda_<dev>.csv, moe_cuda_<dev>.csv
  raw/      test XML, nvidia-smi, versions, the CUPTI run's own rows, the peer's table
A JSON file that does not parse after a step (a benchmark cut at its timeout) is moved to
raw/NAME.partial and named in the step's detail.
`--unpack` appends those CSV rows to results/ (rows carry their provenance; a row already there is
not added again; a half-written line is left out and named) and puts the rest in
results/device/<dev>-<UTC time>/ (a JSON file that does not parse under raw/ as NAME.partial, named). A CSV whose header differs from the one in results/ is refused,
and then nothing is unpacked. Exit status: 0 when the evaluation ran (see steps.csv), 2 bad usage
or a refused unpack, 143 when stopped by SIGINT / SIGTERM (after packing what there is).
"""
import csv
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import results_csv  # noqa: E402
import sweep  # noqa: E402  (its Runner runs each step; its append_row merges rows on --unpack)

ME = "gpu_eval"
GROUPS = {  # --steps names, in the order the steps run
    "tests": ["tests"],
    "table4": ["table4", "table4_cupti", "table4_fused"],
    "bench": ["bench_kernels", "bench_layer"],
    "peer": ["peer"],
    "attention": ["attention_s2048", "attention_s8192", "attention_s32768", "attention_sdpa", "attention_goal",
                  "attention_goal_sdpa"],
    "sweep": ["sweep_seqlen", "sweep_seqlen_fused", "sweep_longcontext", "sweep_moe"],
    "cputests": ["cputests"],
    "sanitize": ["sanitize_memcheck", "sanitize_racecheck"],
}
ALL_STEPS = [s for steps in GROUPS.values() for s in steps]
DEFAULT_STEPS = [s for g, steps in GROUPS.items() if g not in ("cputests", "sanitize") for s in steps]
# Each step's timeout: at most CAP seconds; skipped when fewer than MIN seconds of the budget are left.
CAP = {"tests": 150, "table4": 120, "table4_cupti": 120, "table4_fused": 120, "bench_kernels": 150,
       "bench_layer": 120, "peer": 240, "attention_s2048": 90, "attention_s8192": 90, "attention_s32768": 120,
       "attention_sdpa": 150, "attention_goal": 120, "attention_goal_sdpa": 150, "sweep_seqlen": 300, "sweep_seqlen_fused": 300, "sweep_longcontext": 300,
       "sweep_moe": 300, "cputests": 240,
       "sanitize_memcheck": 300, "sanitize_racecheck": 240}
MIN = {"tests": 20, "table4": 30, "table4_cupti": 30, "table4_fused": 30, "bench_kernels": 30,
       "bench_layer": 30, "peer": 60, "attention_s2048": 20, "attention_s8192": 20, "attention_s32768": 20,
       "attention_sdpa": 30, "attention_goal": 20, "attention_goal_sdpa": 30, "sweep_seqlen": 60, "sweep_seqlen_fused": 60, "sweep_longcontext": 60,
       "sweep_moe": 60, "cputests": 30,
       "sanitize_memcheck": 60, "sanitize_racecheck": 60}
RESERVE_S = 10         # seconds of the budget kept for the last packing
SWEEP_POINT_MAX_S = 90  # one sweep point's timeout, at most
CONFIGS = ",".join(sweep.PAPER_CONFIGS)  # the paper's five, from runners/facts.json
ATTENTION_SEQS = (2048, 8192, 32768)
# The tensor-core attention's goal (docs/fused_attention.md): s, d, and the dropouts it is judged at.
GOAL_SEQ, GOAL_HEAD_DIM, GOAL_DROPOUTS = 8192, 128, ("0", "0.1")


def all_of(commands):
    """One shell line that runs every command and exits with the last failure's status (0: none)."""
    return "rc=0; " + " ".join(shlex.join(c) + " || rc=$?;" for c in commands) + " exit $rc"
NO_GPU = "no GPU (nvidia-smi -L lists none)"
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the benchmarks' console colours
TORCH_PROBE = """import sys; print(sys.version.split()[0])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("nccl", ".".join(map(str, torch.cuda.nccl.version())), "device", torch.cuda.get_device_name(0))
except Exception as e:
    print("torch: not importable:", e)"""


class UsageError(Exception):
    pass


class Interrupted(Exception):
    pass


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def output_of(cmd, timeout, env=None):
    """stdout and stderr of a command together ('' when it cannot start or hangs past timeout)."""
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace", timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return ""
    return p.stdout


def succeeds(cmd, timeout, env=None):
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True, errors="replace", timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def extract(tarball, dest):
    kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # no paths outside dest
    with tarfile.open(tarball, "r:gz") as t:
        t.extractall(dest, **kw)


def key_value_lines(path):
    """'key: value' lines of a file such as raw/run.txt ({} when it is missing)."""
    out = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                k, sep, v = line.rstrip("\n").partition(": ")
                if sep:
                    out.setdefault(k, v)
    except OSError:
        pass
    return out


def set_aside_unreadable_json(results, raw):
    """Moves each JSON file of results/ that does not parse to raw/NAME.partial, and returns
    what it moved as 'NAME: not valid JSON, set aside as raw/NAME.partial'. Google Benchmark
    writes its JSON's closing brackets last, so a benchmark cut at its timeout leaves a file that
    does not parse: its runs are kept for reading, never taken for a result."""
    moved = []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        if not os.path.isfile(path):
            continue
        try:
            with open(path, errors="replace") as f:
                json.load(f)
            continue
        except ValueError:
            pass
        name = os.path.basename(path)
        os.makedirs(raw, exist_ok=True)
        os.replace(path, os.path.join(raw, name + ".partial"))
        moved.append(f"{name}: not valid JSON, set aside as raw/{name}.partial")
    return moved


# ---------------------------------------------------------------- binaries and libraries

class Binaries:
    """The folder the binaries come from (a build folder or a portable bundle; "" when none) and
    the LD_LIBRARY_PATH they run with."""

    def __init__(self, bin_dir, python):
        self.python = python
        self.folder = self._find(bin_dir)
        self.libpath = ""
        self.notes = ""

    @staticmethod
    def _find(bin_dir):  # --bin-dir, else $ACTBENCH_BUILD, else build/, else .portable-bundle/
        if bin_dir:
            if not os.path.isdir(bin_dir):
                raise UsageError(f"no folder of binaries at {bin_dir}")
            return os.path.abspath(bin_dir)
        for c in (os.environ.get("ACTBENCH_BUILD", ""), os.path.join(ROOT, "build"),
                  os.path.join(ROOT, ".portable-bundle")):
            if c and any(os.access(os.path.join(c, d, "layer_run"), os.X_OK) for d in ("runners", "bin")):
                return os.path.abspath(c)
        return ""

    def path(self, name):
        """A binary of a portable bundle (bin/) or of a build folder (runners/ bench/ tests/), or None."""
        if not self.folder:
            return None
        for d in ("bin", "runners", "bench", "tests"):
            p = os.path.join(self.folder, d, name)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
        return None

    def env(self):
        return dict(os.environ, LD_LIBRARY_PATH=self.libpath)

    def make_executable(self, scratch):
        """A copy that lost the executable bits (or a read-only one): make them executable, else
        work on a copy in scratch."""
        bin_dir = os.path.join(self.folder, "bin") if self.folder else ""
        if not os.path.isdir(bin_dir):
            return

        def needing():
            return [f for f in glob.glob(os.path.join(bin_dir, "*"))
                    if os.path.isfile(f) and not os.access(f, os.X_OK) and not f.endswith(".tar.xz")]
        for f in needing():
            try:
                os.chmod(f, os.stat(f).st_mode | 0o755)
            except OSError:
                pass
        if needing():
            copy = os.path.join(scratch, "bundle")
            shutil.copytree(self.folder, copy, symlinks=True)
            for f in glob.glob(os.path.join(copy, "bin", "*")):
                os.chmod(f, os.stat(f).st_mode | 0o755)
            self.folder = copy

    def _torch_lib_dirs(self):
        if not shutil.which(self.python):
            return []
        probe = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))"
        dirs = []
        for sp in (succeeds([self.python, "-c", probe], 30) or "").splitlines():
            if sp and os.path.isdir(os.path.join(sp, "nvidia")):
                dirs += sorted(d for d in glob.glob(os.path.join(sp, "nvidia", "*", "lib")) if os.path.isdir(d))
        return dirs

    def make_libpath(self):
        dirs = []
        if self.folder and os.path.isdir(os.path.join(self.folder, "lib")):
            dirs.append(os.path.join(self.folder, "lib"))
        dirs += self._torch_lib_dirs()
        dirs += [d for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/nvidia/lib64",
                             "/usr/local/nvidia/lib") if os.path.isdir(d)]
        parts = [":".join(dirs)]
        if os.environ.get("LD_LIBRARY_PATH"):  # what the machine had set (the driver's libcuda may be only there)
            parts.append(os.environ["LD_LIBRARY_PATH"])
        self.libpath = ":".join(parts).lstrip(":")
        probe = self.path("layer_run")
        if not probe:
            self.notes = "no layer_run to probe"
            return
        ldd = output_of(["ldd", probe], 60, self.env())
        fallbacks = (("cuda", r"^\s*lib(cudart|cupti)\S* => not found", "fallback cudart/cupti; "),
                     ("nccl-stub", r"^\s*libnccl\S* => not found",
                      "NCCL stub (no NCCL here: nccl_version stays empty); "),
                     ("cxx", r"(GLIBCXX|CXXABI)_[0-9.]+' not found", "bundled libstdc++; "))
        for sub, missing, note in fallbacks:
            d = os.path.join(self.folder, "lib", "fallback", sub)
            if re.search(missing, ldd, re.M) and os.path.isdir(d):
                self.libpath = (self.libpath + ":" + d).lstrip(":")
                self.notes += note

    def make_view(self, view):
        """A build-folder look-alike of wrappers (runners/layer_run ...) for sweep.py and side_by_side.sh."""
        for name, sub in (("layer_run", "runners"), ("theory", "runners"), ("bench_kernels", "bench"),
                          ("bench_layer", "bench")):
            b = self.path(name)
            if not b:
                continue
            os.makedirs(os.path.join(view, sub), exist_ok=True)
            wrapper = os.path.join(view, sub, name)
            with open(wrapper, "w") as f:
                f.write(f'#!/bin/sh\nexport LD_LIBRARY_PATH={shlex.quote(self.libpath)}\nexec {shlex.quote(b)} "$@"\n')
            os.chmod(wrapper, 0o755)


# ---------------------------------------------------------------- --unpack

def csv_merge_plan(archived, dest):
    """(header, rows to append, rows already in dest, malformed lines of the archived CSV), or
    None when the archived file has no header to merge by (it is kept whole instead);
    UsageError when dest's header differs or dest cannot be read as CSV."""
    try:
        header, rows, problems = results_csv.read(archived)
    except results_csv.BadFile:
        return None
    existing = set()
    if os.path.isfile(dest) and os.path.getsize(dest) > 0:
        try:
            dest_header, dest_rows, _ = results_csv.read(dest)
        except results_csv.BadFile as e:
            raise UsageError(f"{dest}: {e}; nothing unpacked")
        if dest_header != header:
            raise UsageError(f"{dest} has other columns than {os.path.basename(archived)} in the archive "
                             f"({header_difference(dest_header, header)}); nothing unpacked")
        existing = {tuple(r) for _, r in dest_rows}
    new = []
    for _, r in rows:
        if tuple(r) not in existing:
            existing.add(tuple(r))
            new.append(r)
    return header, new, len(rows) - len(new), problems


def header_difference(have, got):
    missing = [c for c in got if c not in have]
    extra = [c for c in have if c not in got]
    parts = ([f"the archive adds {', '.join(missing)}"] if missing else []) + \
            ([f"the archive lacks {', '.join(extra)}"] if extra else [])
    return "; ".join(parts) or "the same columns in another order"


def unpack(src, results):
    results = results or os.path.join(ROOT, "results")
    tarball = os.path.join(src, "results.tar.gz") if os.path.isdir(src) else src
    if not os.path.isfile(tarball):
        raise UsageError(f"no results.tar.gz at {src}")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            extract(tarball, tmp)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise UsageError(f"cannot read {tarball}: {e}")
        run = key_value_lines(os.path.join(tmp, "raw", "run.txt"))
        stamp = run.get("start_utc", "").replace(":", "").replace("-", "") or time.strftime("%Y%m%dT%H%M%SZ",
                                                                                          time.gmtime())
        keep = os.path.join(results, "device", f"{run.get('dev') or 'gpu'}-{stamp}")
        if os.path.exists(keep):
            raise UsageError(f"already unpacked: {keep} exists (its rows are in {results})")
        partial = set_aside_unreadable_json(os.path.join(tmp, "results"), os.path.join(tmp, "raw"))
        files = sorted(f for f in glob.glob(os.path.join(tmp, "results", "*")) if os.path.isfile(f))
        # Every CSV is checked before anything is written: a refusal leaves results/ as it was.
        plans = {f: csv_merge_plan(f, os.path.join(results, os.path.basename(f))) for f in files if f.endswith(".csv")}
        os.makedirs(keep)
        for line in partial:
            print(f"{ME}: warning: {line} (its step was cut before it finished?)", file=sys.stderr)
        for f in files:
            name = os.path.basename(f)
            if plans.get(f):
                merge_csv(f, os.path.join(results, name), keep, plans[f])
            else:
                shutil.copy(f, keep)
                print(f"  {keep}/{name}" + ("  (no CSV header: not merged)" if f in plans else ""))
        if os.path.isdir(os.path.join(tmp, "raw")):
            shutil.copytree(os.path.join(tmp, "raw"), os.path.join(keep, "raw"))
    for name in ("log.txt", "steps.csv", "summary.txt"):
        if os.path.isdir(src) and os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), keep)
    print(f"  {keep}/: raw files, JSON, log")


def merge_csv(archived, dest, keep, plan):
    header, new, already, problems = plan
    was_new = not (os.path.isfile(dest) and os.path.getsize(dest) > 0)
    if not was_new:
        sweep.end_last_line(dest)
    for row in new:  # each row one write under the CSV's lock, as layer_run and sweep.py append
        sweep.append_row(dest, header, row)
    if was_new and not new:  # an archived CSV with no rows still gives results/ its header
        with open(dest, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerow(header)
    said = f"new, {len(new)} rows" if was_new else f"{len(new)} rows appended"
    if already:
        said += f", {already} already there"
    print(f"  {dest}: {said}")
    if problems:
        shutil.copy(archived, keep)  # the file whole, so that nothing of it is lost
        for line in results_csv.summarize(archived, problems):
            print(f"{ME}: warning: {line.replace(archived, os.path.basename(archived))}; left out "
                  f"(the whole file is in {keep})", file=sys.stderr)


# ---------------------------------------------------------------- what a step printed

GTEST_LINES = {"passed": r"^\[  PASSED  \] (\d+)", "skipped": r"^\[  SKIPPED \] (\d+)",
               "failed": r"^\[  FAILED  \] (\d+) test"}


def gtest_counts(out, combine):
    """'passed P, skipped S, failed F' from gtest's summary lines, combined by combine (a list -> int)."""
    counts = {k: combine([int(n) for n in re.findall(p, out, re.M)] or [0]) for k, p in GTEST_LINES.items()}
    return "passed {passed}, skipped {skipped}, failed {failed}".format(**counts)


def bench_counts(out):
    """Google Benchmark: how many ran, how many reported an error (or skipped)."""
    ran = [line for line in out.splitlines() if re.search(r"/(manual|real)_time", line)]
    errors = sum(1 for line in ran if "ERROR OCCURRED" in line)
    return f"{len(ran)} benchmarks, {errors} with errors or skipped"


def step_counts(step, out):
    """The counts a step's detail starts with ('' for steps without any)."""
    if step == "tests":
        return gtest_counts(out, lambda ns: ns[-1])  # test_gpu_ops's own summary
    if step == "cputests":
        return gtest_counts(out, sum)  # every cpu test binary's, added up
    if step.startswith("bench_") or re.fullmatch(r"attention_s\d+", step):
        return bench_counts(out)
    return ""


def shell_status(code):
    return 128 - code if code < 0 else code  # killed by signal n: 128 + n, as a shell says


# ---------------------------------------------------------------- the evaluation

class Evaluation:
    def __init__(self, opts, binaries, selected, outdir):
        self.opts, self.bins, self.selected, self.outdir = opts, binaries, selected, outdir
        self.log = os.path.join(outdir, "log.txt")
        self.steps_csv = os.path.join(outdir, "steps.csv")
        self.summary = os.path.join(outdir, "summary.txt")
        self.tarball = os.path.join(outdir, "results.tar.gz")
        self.work = tempfile.mkdtemp(prefix="actbench_gpu.")
        self.pack = os.path.join(self.work, "pack")
        self.results = os.path.join(self.pack, "results")  # what --unpack merges into results/
        self.raw = os.path.join(self.pack, "raw")
        self.view = os.path.join(self.work, "view")
        for d in (self.results, self.raw, self.view):
            os.makedirs(d)
        self.runner = sweep.Runner()
        self.done_before = set()
        self.step_lines = []
        self.skipped_for_time = []
        self.gpu_tests_failed = False
        self.have_gpu, self.gpu_name, self.dev, self.sha = False, "", "nogpu", ""
        self.start = time.monotonic()
        self.deadline = self.start + opts.budget
        self.start_utc = utc_now()
        if opts.quick:
            self.warmup, self.iters, self.bench_time = "1", "3", ["--benchmark_color=false",
                                                                  "--benchmark_min_time=0.05"]
        else:
            self.warmup, self.iters, self.bench_time = "3", "20", ["--benchmark_color=false"]

    # ------------------------------------------------ log, records, archive

    def append_log(self, text):
        with open(self.log, "a", errors="replace") as f:
            f.write(text)

    def say(self, text):
        print(text, flush=True)
        self.append_log(text + "\n")

    def record(self, step, status, secs, detail):
        detail = detail.replace("\r", "")
        with open(self.steps_csv, "a") as f:
            f.write(f'{step},{status},{secs},"{detail.replace(chr(34), chr(34) * 2)}"\n')
        line = f"[{step:<18}] {status:<8} {secs:>6}s  {detail}"
        self.step_lines.append(line)
        self.say(line)

    def skip(self, step, why):
        self.record(step, "skipped", "0", why)
        return None

    def pack_results(self):
        """OUTDIR/results.tar.gz from results/ and raw/ (a whole archive replaces the last one)."""
        part = os.path.join(self.outdir, ".results.tar.gz.part")
        try:
            shutil.copy(self.steps_csv, os.path.join(self.raw, "steps.csv"))
            with tarfile.open(part, "w:gz") as t:
                t.add(self.results, "results")
                t.add(self.raw, "raw")
            os.replace(part, self.tarball)
        except (OSError, tarfile.TarError) as e:
            self.say(f"{ME}: warning: cannot pack {self.tarball}: {e}")

    def archived_files(self):
        try:
            with tarfile.open(self.tarball) as t:
                return sum(1 for m in t.getmembers() if not m.isdir())
        except (OSError, tarfile.TarError, EOFError):
            return 0

    def write_summary(self):
        lines = [f"actbench GPU evaluation: {self.gpu_name or 'no GPU'} ({self.dev}), binaries {self.sha}, "
                 f"started {self.start_utc}, {int(time.monotonic() - self.start)}s"]
        if self.gpu_tests_failed:
            lines.append("WARNING: GPU correctness tests (test_gpu_ops) did not pass: treat the timings with care")
        lines += [""] + self.step_lines
        for name in ("side_by_side_table.txt", "attention_table.txt", "attention_goal.txt"):
            text = self.read_raw(name)
            if text.strip():
                lines += ["", text.rstrip("\n")]
        if self.skipped_for_time:
            later = ",".join(self.skipped_for_time)
            lines += ["", f"not run for lack of time: {later}",
                      f"to run them: bash scripts/gpu_eval.sh {self.outdir} --budget SEC   (resumes; or only these: "
                      f"--steps {later})"]
        lines += ["", f"results: {self.tarball} ({self.archived_files()} files); merge into results/ with: "
                      f"bash scripts/gpu_eval.sh --unpack {self.outdir}"]
        with open(self.summary, "w") as f:
            f.write("\n".join(lines) + "\n")

    def read_raw(self, name):
        try:
            with open(os.path.join(self.raw, name), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def check_stop(self):
        if self.runner.stop is not None:
            raise Interrupted()

    def left(self):
        return int(self.deadline - time.monotonic())

    # ------------------------------------------------ before the steps

    def resume_or_start(self):
        """The archive of an earlier run in OUTDIR is the starting point, and its steps that
        finished ok are not run again (--fresh forgets them)."""
        if self.opts.fresh:
            for p in (self.tarball, self.steps_csv, self.summary, self.log):
                if os.path.exists(p):
                    os.remove(p)
        resumed = False
        if os.path.isfile(self.tarball) and os.path.isfile(self.steps_csv):
            try:
                extract(self.tarball, self.pack)
                resumed = True
            except (tarfile.TarError, OSError, EOFError):
                pass
        if resumed:
            with open(self.steps_csv, newline="", errors="replace") as f:
                self.done_before = {r["step"] for r in csv.DictReader(f)
                                    if r.get("status") == "ok" and r.get("step") not in (None, "env")}
            self.append_log(f"== {utc_now()}: resuming; done before: {' '.join(sorted(self.done_before))}\n")
        else:
            open(self.log, "w").close()
        with open(self.steps_csv, "w") as f:
            f.write("step,status,seconds,detail\n")

    def detect_gpu(self):
        listing = output_of(["nvidia-smi", "-L"], 30) if shutil.which("nvidia-smi") else ""
        if not any(line.startswith("GPU ") for line in listing.splitlines()):
            return
        self.have_gpu = True
        names = (succeeds(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], 30) or "").splitlines()
        self.gpu_name = names[0].strip() if names else ""
        short = re.search(r"\b[A-Z]{1,3}[0-9]{2,4}\b", self.gpu_name)  # "NVIDIA H100 80GB HBM3" -> h100
        self.dev = (short.group(0) if short else re.sub(r"[^A-Za-z0-9]", "_", self.gpu_name)).lower() or "gpu"

    def binaries_sha(self):
        folder = self.bins.folder
        sha = key_value_lines(os.path.join(folder, "MANIFEST.txt")).get("git_sha", "") if folder else ""
        return sha or (succeeds(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], 30) or "").strip() or "unknown"

    def run_txt(self):
        return "".join(f"{k}: {v}\n" for k, v in (
            ("dev", self.dev), ("gpu_name", self.gpu_name), ("start_utc", self.start_utc),
            ("host", os.uname().nodename), ("binaries", self.bins.folder or "none"), ("binaries_git_sha", self.sha),
            ("steps", " ".join(self.selected)), ("budget_s", self.opts.budget), ("quick", int(self.opts.quick)),
            ("ld_library_path", self.bins.libpath), ("lib_notes", self.bins.notes)))

    def nvidia_smi_txt(self):
        if not self.have_gpu:
            return NO_GPU + "\n"
        return output_of(["nvidia-smi"], 30) + output_of(["nvidia-smi", "-q"], 60)

    def versions_txt(self):
        def first(text, n, pattern=None):
            lines = [l for l in text.splitlines() if pattern is None or re.search(pattern, l)]
            return "\n".join(lines[:n])
        nvcc = next((out for out in (succeeds([c, "--version"], 30) for c in ("/usr/local/cuda/bin/nvcc", "nvcc"))
                     if out), "nvcc not found")
        py = self.opts.python
        lr = self.bins.path("layer_run")
        libcuda = first(output_of(["ldconfig", "-p"], 30), 2, r"libcuda\.so\.1").splitlines()
        libcuda += [os.path.join(d, "libcuda.so.1") for d in self.bins.libpath.split(":")
                    if d and os.path.exists(os.path.join(d, "libcuda.so.1"))]
        sections = [
            ("uname", output_of(["uname", "-a"], 30)),
            ("os", first(read_text("/etc/os-release"), 4)),
            ("glibc", first(output_of(["ldd", "--version"], 30), 1)),
            ("cpu", first(output_of(["lscpu"], 30) or read_text("/proc/cpuinfo"), 3, r"Model name|^CPU\(s\)|Socket")),
            ("nvcc", "\n".join(nvcc.splitlines()[-2:])),
            (f"python ({py})", output_of([py, "-c", TORCH_PROBE], 90) or f"cannot run {py}"),
            ("bundle MANIFEST", (read_text(os.path.join(self.bins.folder, "MANIFEST.txt")) if self.bins.folder
                                 else "") or "(none)"),
            ("libcuda (the driver's)", "\n".join("  " + l.strip() for l in libcuda)
             or "  libcuda.so.1 not found in ldconfig or LD_LIBRARY_PATH"),
            (f"ldd layer_run (LD_LIBRARY_PATH={self.bins.libpath})",
             output_of(["ldd", lr], 60, self.bins.env()) if lr else "(no layer_run)"),
        ]
        return "".join(f"== {title}\n{text.rstrip(chr(10))}\n" for title, text in sections)

    def describe_environment(self):
        """The `env` step: raw/run.txt, raw/nvidia-smi.txt, raw/versions.txt, and whether the
        binaries can run here."""
        t0 = time.monotonic()
        for name, text in (("run.txt", self.run_txt()), ("nvidia-smi.txt", self.nvidia_smi_txt()),
                           ("versions.txt", self.versions_txt())):
            with open(os.path.join(self.raw, name), "w") as f:
                f.write(text)
            if name != "nvidia-smi.txt":
                self.append_log(text)
        versions = self.read_raw("versions.txt")
        missing = sorted({l.split()[0] for l in versions.splitlines() if "=> not found" in l})
        secs = str(int(time.monotonic() - t0))
        if not self.bins.folder:
            self.record("env", "failed", secs, "no binaries: build with scripts/build.sh (or name them with --bin-dir)")
        elif not self.bins.path("layer_run"):
            self.record("env", "failed", secs, f"{self.bins.folder} has no layer_run (build with scripts/build.sh)")
        elif missing:
            self.record("env", "failed", secs, f"libraries not found: {' '.join(missing)}")
        elif self.have_gpu:
            if "libcuda.so.1 not found" in versions:
                self.bins.notes += "libcuda.so.1 not found (the driver's: add its folder to LD_LIBRARY_PATH); "
            self.record("env", "ok", secs, f"{self.gpu_name}; binaries {self.sha}; {self.bins.notes}")
        else:
            self.record("env", "ok", secs, f"no GPU here; binaries {self.sha}")
        self.pack_results()

    def prepare(self):
        self.resume_or_start()
        self.bins.make_executable(self.work)
        self.detect_gpu()
        self.bins.make_libpath()
        self.bins.make_view(self.view)
        self.sha = self.binaries_sha()
        os.environ["ACTBENCH_GIT_SHA"] = os.environ.get("ACTBENCH_GIT_SHA") or self.sha  # torch_layer.py's provenance
        self.say(f"== {ME}: {self.gpu_name or 'no GPU'}, steps: {' '.join(self.selected)}, budget {self.opts.budget}s, "
                 f"binaries {self.bins.folder or 'none'}, results -> {self.outdir}")
        self.describe_environment()
        self.check_stop()

    # ------------------------------------------------ running a step

    def gate(self, step, need=None):
        """The step's timeout (seconds) when it may run now; else None, with why recorded."""
        self.check_stop()
        if step not in self.selected:
            return self.skip(step, "not selected (--steps)")
        if step in self.done_before:
            self.record(step, "ok", "0", f"done in an earlier run in {self.outdir} (--fresh to redo)")
            return None
        if need and not self.bins.path(need):
            return self.skip(step, f"{need} not in {self.bins.folder}" if self.bins.folder
                             else "no binaries (build with scripts/build.sh)")
        if not self.have_gpu and not self.opts.force:
            return self.skip(step, NO_GPU)
        left = self.left() - RESERVE_S
        if left < MIN[step]:
            self.skipped_for_time.append(step)
            return self.skip(step, f"time budget: {left}s left, needs {MIN[step]}s")
        timeout = min(CAP[step], left)
        return min(timeout, self.opts.max_step) if self.opts.max_step > 0 else timeout

    def run_step(self, step, cmd, timeout, env=None):
        """Runs cmd in its time box (SIGTERM to its process group, SIGKILL sweep.GRACE_S later), output to
        the log, status to steps.csv; re-packs the archive. Returns (status, its output)."""
        self.append_log(f"==== [{step}] {time.strftime('%H:%M:%S', time.gmtime())} timeout {timeout}s: "
                        f"{shlex.join(cmd)}\n")
        offset = os.path.getsize(self.log)
        t0 = time.monotonic()
        with open(self.log, "ab") as out:
            code, err, timed_out = self.runner.run(cmd, env, timeout, (), output=out)
        secs = f"{time.monotonic() - t0:.1f}"
        if err:  # it could not start
            self.append_log(err + "\n")
        with open(self.log, "rb") as f:
            f.seek(offset)
            output = ANSI_COLOUR.sub("", f.read().decode("utf-8", errors="replace"))
        shown = [l for l in output.splitlines() if l.strip()]
        last = shown[-1][:240] if shown else ""
        if timed_out:
            status, detail = "timeout", f"killed after {timeout}s; last output: {last}"
        elif self.runner.stop is not None and code != 0:
            status, detail = "failed", f"stopped by {signal.Signals(self.runner.stop).name}: {last}"
        elif code == 0:
            status, detail = "ok", last
        else:
            status, detail = "failed", f"exit {shell_status(code)}: {last}"
        counts = step_counts(step, output)
        if counts:
            detail = counts + (f"; {detail}" if detail else "")
        for line in set_aside_unreadable_json(self.results, self.raw):
            detail += f"; {line}"
        self.record(step, status, secs, detail)
        if status != "ok":
            for line in output.splitlines()[-8:]:
                print(f"    | {line}")
        self.pack_results()
        self.check_stop()
        return status, output

    def run_bin(self, step, timeout, name, args):
        """A binary of the bundle (gate checked that it is there) with the bundle's library path."""
        return self.run_step(step, [self.bins.path(name), *args], timeout, self.bins.env())

    def result(self, name):
        return os.path.join(self.results, name)

    # ------------------------------------------------ the steps, in order

    def steps_tests(self):
        """GPU correctness first (flagged in the summary, not fatal)."""
        t = self.gate("tests", "test_gpu_ops")
        if t is not None:
            status, _ = self.run_bin("tests", t, "test_gpu_ops", [f"--gtest_output=xml:{self.raw}/test_gpu_ops.xml"])
            self.gpu_tests_failed = status != "ok"

    def steps_table4(self):
        """Table 4: the 22B layer, t = 8 emulated, five configurations; the CUPTI split; fused attention."""
        common = ["--backend", "cuda", "--model", "22b", "--tp", "8", "--emulate-tp", "--config", CONFIGS,
                  "--warmup", self.warmup, "--iters", self.iters]
        dev = self.dev
        variants = (("table4", ["--csv", self.result(f"table4_{dev}.csv")]),
                    ("table4_cupti", ["--csv", os.path.join(self.raw, f"table4_{dev}_under_cupti.csv"),
                                      "--cupti", self.result(f"table4_{dev}_cupti.csv")]),
                    ("table4_fused", ["--attention", "fused", "--csv", self.result(f"table4_fused_{dev}.csv")]))
        for step, args in variants:
            t = self.gate(step, "layer_run")
            if t is not None:
                self.run_bin(step, t, "layer_run", common + args)

    def steps_bench(self):
        """The Google Benchmark binaries (JSON)."""
        for name in ("bench_kernels", "bench_layer"):
            t = self.gate(name, name)
            if t is not None:
                self.run_bin(name, t, name, ["--backend=cuda", *self.bench_time,
                                             f"--benchmark_out={self.result(f'{name}_{self.dev}.json')}",
                                             "--benchmark_out_format=json"])

    def steps_peer(self):
        """The PyTorch eager peer beside our layer (its own layer_run rows stay in raw/)."""
        t = self.gate("peer", "layer_run")
        if t is None:
            return
        peer_dir = os.path.join(self.work, "peer")
        args = ["--device-name", self.dev] + (["--iters", self.iters, "--warmup", self.warmup] if self.opts.quick
                                              else [])
        env = dict(os.environ, ACTBENCH_BUILD=self.view, ACTBENCH_RESULTS=peer_dir,
                   ACTBENCH_TORCH_PYTHON=self.opts.python)
        _, output = self.run_step("peer", ["bash", os.path.join(ROOT, "bench", "peers", "side_by_side.sh"), *args],
                                  t, env)
        for name, dest in ((f"peer_torch_{self.dev}.csv", self.result(f"peer_torch_{self.dev}.csv")),
                           (f"table4_{self.dev}.csv", os.path.join(self.raw, f"peer_table4_{self.dev}.csv"))):
            if os.path.isfile(os.path.join(peer_dir, name)):
                shutil.copy(os.path.join(peer_dir, name), dest)
        lines = output.splitlines(keepends=True)
        start = next((i for i, l in enumerate(lines) if l.startswith("ours: ")), len(lines))
        if lines[start:]:
            with open(os.path.join(self.raw, "side_by_side_table.txt"), "w") as f:
                f.write("".join(lines[start:]))
        self.pack_results()

    def steps_attention(self):
        """Fused attention against PyTorch's SDPA (each part only where it exists), then their table."""
        has_seq = None
        for s in ATTENTION_SEQS:
            step = f"attention_s{s}"
            t = self.gate(step, "bench_kernels")
            if t is None:
                continue
            if has_seq is None:
                has_seq = bool((succeeds([self.bins.path("bench_kernels"), "--backend=cuda", "--seq=2048",
                                          "--benchmark_filter=attention", "--benchmark_list_tests=true"], 60,
                                         self.bins.env()) or "").strip())
            if not has_seq:
                self.skip(step, "bench_kernels has no --seq or no attention benchmark (an older build)")
                continue
            out = self.result(f"attention_kernels_{self.dev}_s{s}.json")
            self.run_bin(step, t, "bench_kernels", ["--backend=cuda", "--benchmark_filter=attention", f"--seq={s}",
                                                    *self.bench_time, f"--benchmark_out={out}",
                                                    "--benchmark_out_format=json"])
        self.step_sdpa()
        self.attention_table()
        self.steps_goal()

    def steps_goal(self):
        """The goal shape, ours and SDPA's cudnn and flash backends, each dropout; then the verdict."""
        t = self.gate("attention_goal", "bench_kernels")
        if t is not None:
            runs = [[self.bins.path("bench_kernels"), "--backend=cuda", "--benchmark_filter=attention_fused_(fwd|bwd)",
                     f"--seq={GOAL_SEQ}", f"--head-dim={GOAL_HEAD_DIM}", f"--attn-dropout={p}", *self.bench_time,
                     f"--benchmark_out={self.result(f'attention_goal_{self.dev}_p{p}.json')}",
                     "--benchmark_out_format=json"] for p in GOAL_DROPOUTS]
            self.run_step("attention_goal", ["sh", "-c", all_of(runs)], t, self.bins.env())
        t = self.gate("attention_goal_sdpa")
        py, sdpa = self.opts.python, os.path.join(ROOT, "bench", "peers", "attention_sdpa.py")
        if t is not None:
            if succeeds([py, sdpa, "--help"], 90) is None:
                self.skip("attention_goal_sdpa", f"{py} {sdpa} --help fails (no torch?)")
            else:
                quick = ["--warmup", self.warmup, "--iters", self.iters] if self.opts.quick else []
                runs = [[py, sdpa, "--csv", self.result(f"attention_goal_sdpa_{self.dev}.csv"), "--seq", str(GOAL_SEQ),
                         "--head-dim", str(GOAL_HEAD_DIM), "--dropout", p, "--backend", b, *quick]
                        for b in ("cudnn", "flash") for p in GOAL_DROPOUTS]
                self.run_step("attention_goal_sdpa", ["sh", "-c", all_of(runs)], t)
        self.goal_verdict()

    def goal_verdict(self):
        """attention_goal.py over the goal runs, where there are some."""
        ours = sorted(glob.glob(self.result("attention_goal_*_p*.json")))
        if not ours:
            return
        sdpa = sorted(glob.glob(self.result("attention_goal_sdpa_*.csv")))
        verdict = output_of([sys.executable, os.path.join(ROOT, "bench", "peers", "attention_goal.py"), *ours, *sdpa], 60)
        with open(os.path.join(self.raw, "attention_goal.txt"), "w") as f:
            f.write(verdict)
        self.append_log(verdict)
        self.pack_results()

    def step_sdpa(self):
        t = self.gate("attention_sdpa")
        if t is None:
            return
        py, sdpa = self.opts.python, os.path.join(ROOT, "bench", "peers", "attention_sdpa.py")
        if not os.path.isfile(sdpa):
            self.skip("attention_sdpa", "bench/peers/attention_sdpa.py does not exist")
        elif succeeds([py, sdpa, "--help"], 90) is None:
            self.skip("attention_sdpa", f"{py} {sdpa} --help fails (no torch?)")
        else:
            args = ["--csv", self.result(f"attention_sdpa_{self.dev}.csv"), "--seq", ",".join(map(str, ATTENTION_SEQS))]
            args += ["--warmup", self.warmup, "--iters", self.iters] if self.opts.quick else []
            self.run_step("attention_sdpa", [py, sdpa, *args], t)

    def attention_table(self):
        """The table of both, where attention_table.py exists and there is something to show."""
        script = os.path.join(ROOT, "bench", "peers", "attention_table.py")
        kernels = sorted(glob.glob(self.result("attention_kernels_*.json")))
        if not os.path.isfile(script) or not kernels:
            return
        sdpa = sorted(glob.glob(self.result("attention_sdpa_*.csv")))[:1]
        table = output_of([sys.executable, script, *kernels, *sdpa], 60)
        with open(os.path.join(self.raw, "attention_table.txt"), "w") as f:
            f.write(table)
        self.append_log(table)
        self.pack_results()

    def steps_sweep(self):
        """The sequence-length sweeps (resumable rows; whatever time is left), then long context
        and the MoE expert layouts."""
        common = ["--backend", "cuda", "--launcher", "emulate", "--build", self.view]
        common += ["--warmup", "1", "--iters", "2"] if self.opts.quick else ["--warmup", "2", "--iters", "5"]
        seqlen = ["seqlen", "--csv", self.result(f"seqlen_cuda_{self.dev}.csv")]
        longcontext = ["longcontext", "--csv", self.result(f"longcontext_cuda_{self.dev}.csv")]
        moe = ["moe", "--csv", self.result(f"moe_cuda_{self.dev}.csv")]
        for step, args in (("sweep_seqlen", seqlen), ("sweep_seqlen_fused", seqlen + ["--attention", "fused"]),
                           ("sweep_longcontext", longcontext), ("sweep_moe", moe)):
            t = self.gate(step, "layer_run")
            if t is not None:
                self.run_step(step, [sys.executable, os.path.join(HERE, "sweep.py"), *args, *common,
                                     "--timeout", str(min(t, SWEEP_POINT_MAX_S))], t)

    def steps_cputests(self):
        """The cpu gtests of the build or bundle (not in the default: ctest runs them anywhere)."""
        folder = self.bins.folder
        bundled = os.path.join(folder, "bin", "cpu_tests.tar.xz") if folder else ""
        has_tests = self.bins.path("test_runtime") or (bundled and os.path.isfile(bundled))
        if "cputests" in self.selected and not has_tests:
            self.skip("cputests", f"no cpu tests in {folder or '(no binaries)'}")
            return
        t = self.gate("cputests")
        if t is None:
            return
        tests = os.path.join(self.work, "cputests")
        os.makedirs(tests, exist_ok=True)
        if os.path.isfile(bundled):
            output_of(["tar", "-xJf", bundled, "-C", tests], 120)
        for b in glob.glob(os.path.join(folder, "tests", "test_*")) + glob.glob(os.path.join(folder, "bin", "test_*")):
            name = os.path.basename(b)
            gpu_or_mpi = name == "test_gpu_ops" or name.startswith("test_mpi_")
            if os.path.isfile(b) and os.access(b, os.X_OK) and not gpu_or_mpi:
                shutil.copy2(b, tests)
        each = ('rc=0; for t in "$1"/test_*; do echo "== $t"; '
                '"$t" --gtest_output="xml:$2/$(basename "$t").xml" --gtest_brief=1 || rc=1; done; exit $rc')
        self.run_step("cputests", ["sh", "-c", each, "_", tests, self.raw], t, self.bins.env())

    def steps_sanitize(self):
        """compute-sanitizer over the GPU tests (not in the default): out-of-bounds and misaligned
        accesses of every kernel, then shared-memory races of the tiled ones (attention, softmax,
        LN). The long-row and whole-layer tests take minutes under the sanitizer; the kernels they
        run are covered at smaller shapes by the others."""
        sanitizer = shutil.which("compute-sanitizer") or ""
        if not sanitizer and os.path.isfile("/usr/local/cuda/bin/compute-sanitizer"):
            sanitizer = "/usr/local/cuda/bin/compute-sanitizer"
        for tool, tests in (("memcheck", "-*RowOf16400*:*LargeTensor*:*WholeLayer*"),
                            ("racecheck", "*Attention*:*Softmax*:*LayerNorm*:-*RowOf16400*:*WholeLayer*")):
            step = f"sanitize_{tool}"
            t = self.gate(step, "test_gpu_ops")
            if t is None:
                continue
            if not sanitizer:
                self.skip(step, "compute-sanitizer not found")
                continue
            self.run_step(step, [sanitizer, "--tool", tool, "--error-exitcode", "1",
                                 "--log-file", os.path.join(self.raw, f"sanitize_{tool}.txt"),
                                 self.bins.path("test_gpu_ops"), f"--gtest_filter={tests}", "--gtest_brief=1"],
                          t, self.bins.env())

    # ------------------------------------------------ the whole run

    def run(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self.runner.on_signal)  # passed on to the running step, then we stop
        try:
            self.prepare()
            for steps in (self.steps_tests, self.steps_table4, self.steps_bench, self.steps_peer,
                          self.steps_attention, self.steps_sweep, self.steps_cputests, self.steps_sanitize):
                steps()
            self.pack_results()
            self.write_summary()
            with open(self.summary) as f:
                text = f.read()
            print("\n" + text, end="", flush=True)
            self.append_log(text)
            return 0
        except Interrupted:
            self.say(f"{ME}: interrupted; packing what there is")
            self.pack_results()
            self.write_summary()
            return 143
        finally:
            shutil.rmtree(self.work, ignore_errors=True)


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------- arguments

def parse_args(argv):
    o = dict(outdir="", bin_dir="", steps="", budget=2400, max_step=0, quick=False, force=False, fresh=False,
             python=os.environ.get("ACTBENCH_TORCH_PYTHON") or "python3", mode="run", unpack=None)
    flags = {"--quick": "quick", "--force": "force", "--fresh": "fresh"}
    valued = {"--steps": ("steps", "a list"), "--bin-dir": ("bin_dir", "a folder"), "--python": ("python", "a program"),
              "--budget": ("budget", "seconds"), "--max-step": ("max_step", "seconds")}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            return dict(o, mode="help")
        if a == "--unpack":  # the rest of the line is its own
            if i + 1 >= len(argv):
                raise UsageError("--unpack needs a folder or results.tar.gz")
            return dict(o, mode="unpack", unpack=(argv[i + 1], argv[i + 2] if i + 2 < len(argv) else ""))
        if a in ("--list-steps", "--env"):
            o["mode"] = a[2:]
        elif a in flags:
            o[flags[a]] = True
        elif a in valued:
            key, what = valued[a]
            value = argv[i + 1] if i + 1 < len(argv) else None
            if value is None or (what == "seconds" and not re.fullmatch(r"[0-9]+", value)):
                raise UsageError(f"{a} needs {what}")
            o[key] = int(value) if what == "seconds" else value
            i += 1
        elif a.startswith("-"):
            raise UsageError(f"unknown option '{a}' (see --help)")
        elif o["outdir"]:
            raise UsageError(f"one OUTDIR only (got '{o['outdir']}' and '{a}')")
        else:
            o["outdir"] = a
        i += 1
    return o


def select_steps(arg):
    """The steps of --steps (groups or single steps, by commas or spaces), in running order."""
    if not arg.strip():
        return list(DEFAULT_STEPS)
    chosen = set()
    for name in arg.replace(",", " ").split():
        if name in GROUPS:
            chosen.update(GROUPS[name])
        elif name in ALL_STEPS:
            chosen.add(name)
        else:
            raise UsageError(f"unknown step '{name}' (see --list-steps)")
    return [s for s in ALL_STEPS if s in chosen]


def main(argv=None):
    os.environ["PYTHONUNBUFFERED"] = "1"  # a step killed at its timeout still leaves its output in the log
    try:
        o = parse_args(sys.argv[1:] if argv is None else argv)
        if o["mode"] == "help":
            print(__doc__)
            return 0
        if o["mode"] == "unpack":
            unpack(*o["unpack"])
            return 0
        if o["mode"] == "list-steps":
            for group, steps in GROUPS.items():
                print(f"{group}: {' '.join(steps)}")
            print(f"default: {' '.join(DEFAULT_STEPS)}")
            return 0
        bins = Binaries(o["bin_dir"], o["python"])
        if o["mode"] == "env":
            bins.make_libpath()
            print(f"export LD_LIBRARY_PATH={shlex.quote(bins.libpath)}")
            if bins.notes:
                print(f"# {bins.notes}")
            return 0
        if not o["outdir"]:
            raise UsageError("usage: gpu_eval.sh OUTDIR [options] (see --help)")
        selected = select_steps(o["steps"])
        try:
            os.makedirs(o["outdir"], exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create {o['outdir']}: {e.strerror or e}")
    except UsageError as e:
        print(f"{ME}: error: {e}", file=sys.stderr)
        return 2
    return Evaluation(types.SimpleNamespace(**o), bins, selected, os.path.abspath(o["outdir"])).run()


if __name__ == "__main__":
    sys.exit(main())
