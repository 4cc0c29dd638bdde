"""Fuzzes every option of layer_run and theory, and every user-named path, against the contract.

The options are read from each entry point's own --help, so a new option is fuzzed without
touching this file. Each option gets every value below, one at a time, in an otherwise good
command; each path option gets every kind of file that is not what it expects. The oracle is
the contract of docs/layer_run.md ("Contracts"), whatever the value:

  - the process ends within the time limit (never blocks on a FIFO, never loops on a value);
  - it exits 0 (the value was good), 2 (bad input) or 3 (out of memory), nothing else;
  - exit 2 comes with exactly one stderr line and no crash text (traceback, abort, what());
  - exit 2 leaves the results CSV byte for byte as it was, and writes no output file;
  - exit 0 prints no number that is not finite (nan, inf) where a size or a time belongs;
  - a value no option can mean (blank, non-finite, out of every integer range, not ASCII
    digits, "-1") is refused, never replaced by a default.

    ACTBENCH_LAYER_RUN=build/runners/layer_run ACTBENCH_THEORY=build/runners/theory \
        /usr/bin/python3 tests/fuzz_cli.py [--full] [-v]

Without --full (the ctest `fuzz_cli`), layer_run's options get a rotating sample of the values
(a layer_run process costs a second; theory's get them all); `cmake --build build --target
fuzz` runs the whole campaign.

Exit status 1 and a line per broken case when any case breaks the contract.
"""
import concurrent.futures
import os
import random
import signal
import re
import shutil
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 20
# make_all draws every figure from the theory tables even when the results folder holds nothing
# usable (about 10 s on an idle machine): its cases get longer, still far short of a blocked read.
MAKE_ALL_TIMEOUT_S = 120

# Values a user mistypes, and values only a fuzzer types: empty, blanks, signs, other bases,
# digits that are not ASCII, magnitudes past every integer type, non-finite reals, units.
VALUES = [
    "", " ", "0", "-0", "-1", "1", "+1", "1.5", "1e3", "0x10", "1_0", "\uff11\uff12", "\u0661\u0662",
    "nan", "inf", "-inf", "1e999", "99999999999999999999999", "4294967296", "9223372036854775808",
    "3x", "abc", "1GiB", "infGiB", "-1GiB", "0GiB", "nanGiB", "1e308GiB", "baseline,", ",", "0001",
]

# Values that no option of ours can accept: each must be refused (exit 2), whatever the option.
MUST_REFUSE = {"", " ", "-1", "nan", "inf", "-inf", "1e999", "99999999999999999999999", "3x", "1_0",
               "\uff11\uff12", "\u0661\u0662", "infGiB", "-1GiB", "nanGiB", "1e308GiB", ","}

# Options that name a file or folder: fuzzed with kinds of paths, not with values.
PATH_OPTIONS = {"--csv", "--dump", "--cupti", "--hf-config", "--megatron-args", "--out", "--results"}

# theory memory's Megatron-LM flags (not in its --help: any Megatron flag is taken), each fuzzed
# with every value like a declared option.
MEGATRON_VALUE_FLAGS = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                        "--num-virtual-stages-per-pipeline-rank", "--seq-length", "--micro-batch-size",
                        "--global-batch-size", "--recompute-num-layers", "--hidden-dropout",
                        "--make-vocab-size-divisible-by", "--decoder-first-pipeline-num-layers",
                        "--recompute-modules", "--exp-avg-dtype"]

CRASH_TEXT = re.compile(r"Traceback|terminate called|what\(\)|Aborted|Segmentation|core dumped|std::", re.I)
NON_FINITE = re.compile(r"(?<![A-Za-z_])(nan|inf|infinity)(?![A-Za-z_])", re.I)

# Flags that take no value, or print and exit: not fuzzed with values.
SKIP = {"--help", "-h", "--emulate-tp", "--print-csv-header", "--print-csv-schema", "--list-presets", "--json",
        "--distributed-optimizer"}


def options_of(command):
    """The value-taking options listed by `command --help`."""
    text = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=TIMEOUT_S).stdout
    found = []
    for m in re.finditer(r"^\s+(?:-\w,)?(--[\w-]+)(?: (TEXT|INT|FLOAT|UINT))", text, re.M):
        if m.group(1) not in SKIP and m.group(1) not in found:
            found.append(m.group(1))
    return found


def sample(values, i, n):
    """n of values, a different slice for each i, so that all are tried across options."""
    return [values[(i * n + j) % len(values)] for j in range(n)]


class Campaign:
    def __init__(self, work, full):
        self.work = work
        self.full = full
        self.broken = []
        self.cases = 0
        self.jobs = []  # (label, argv, keywords of run): run in parallel by run_all
        os.mkfifo(os.path.join(work, "fifo"))
        os.mkdir(os.path.join(work, "folder"))

    def paths(self):
        """Every kind of path that is not a plain, present, readable file."""
        w = self.work
        return {"fifo": os.path.join(w, "fifo"), "folder": os.path.join(w, "folder"),
                "missing": os.path.join(w, "missing"), "empty-name": "",
                "in-missing-folder": os.path.join(w, "nowhere", "x"), "device": "/dev/null"}

    def run(self, label, argv, csv=None, out_dir=None, path_case=False, must_refuse=False, seed_csv=None,
            timeout_s=TIMEOUT_S):
        self.cases += 1
        if seed_csv:  # each case its own copy of the CSV, so cases can run side by side
            shutil.copyfile(seed_csv, csv)
        before = open(csv, "rb").read() if csv and os.path.exists(csv) else None
        listing = sorted(os.listdir(out_dir)) if out_dir and os.path.isdir(out_dir) else None
        try:
            p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout_s,
                               stdin=subprocess.DEVNULL, cwd=self.work)  # stray outputs land in the scratch folder
        except subprocess.TimeoutExpired:
            return self.fail(label, f"no answer within {timeout_s} s (blocked or unbounded work)")
        err_lines = [l for l in p.stderr.splitlines() if l.strip()]
        if p.returncode not in (0, 2, 3):
            return self.fail(label, f"exit {p.returncode}: {p.stderr.strip()[:200]}")
        if CRASH_TEXT.search(p.stderr):
            return self.fail(label, f"crash text on stderr: {p.stderr.strip()[:200]}")
        if p.returncode == 2:
            if len(err_lines) != 1:
                return self.fail(label, f"exit 2 with {len(err_lines)} stderr lines: {p.stderr.strip()[:200]}")
            if csv and (open(csv, "rb").read() if os.path.exists(csv) else None) != before:
                return self.fail(label, "exit 2 changed the results CSV")
            if listing is not None and sorted(os.listdir(out_dir)) != listing:
                return self.fail(label, "exit 2 wrote into the output folder")
        if p.returncode == 0 and NON_FINITE.search(p.stdout):
            return self.fail(label, f"exit 0 printed a non-finite number: {NON_FINITE.search(p.stdout).group(0)}")
        if p.returncode == 0 and path_case:
            return self.fail(label, "exit 0 for a path that is not a usable file")
        if p.returncode == 0 and must_refuse:
            return self.fail(label, "exit 0: the value was taken (or silently replaced) instead of refused")
        return None

    def run_all(self, workers):
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda j: self.run(j[0], j[1], **j[2]), self.jobs))
        self.jobs = []

    def fail(self, label, why):
        self.broken.append(f"{label}: {why}")
        return why


def fuzz_layer_run(c, layer_run):
    seed = os.path.join(c.work, "seed.csv")
    base = [layer_run, "--backend", "meta", "--model", "tiny", "--config", "baseline", "--warmup", "0", "--iters", "1",
            "--csv", seed]
    subprocess.run(base, capture_output=True, timeout=TIMEOUT_S, check=True)  # a header and one good row
    cases = 0

    def own_csv(argv):
        """argv writing to a copy of the seed CSV of its own, and the keywords that say so."""
        nonlocal cases
        cases += 1
        csv = os.path.join(c.work, f"results_{cases}.csv")
        return [csv if a == seed else a for a in argv], dict(csv=csv, seed_csv=seed)

    for i, opt in enumerate(options_of([layer_run])):
        if opt in PATH_OPTIONS:
            continue  # fuzzed with paths below
        for v in VALUES if c.full else sample(VALUES, i, 6):
            argv = [a for a in base]
            if opt in argv:
                argv[argv.index(opt) + 1] = v
            else:
                argv += [opt, v]
            argv, kw = own_csv(argv)
            c.jobs.append((f"layer_run {opt} {v!r}", argv, dict(kw, must_refuse=v in MUST_REFUSE)))
    # Paths: --hf-config and --csv must refuse what is not a regular file; --dump and --cupti
    # name outputs (a folder, a CSV) and refuse what cannot be one.
    for opt in ("--hf-config", "--csv", "--cupti"):
        for kind, path in c.paths().items():
            if opt in ("--csv", "--cupti") and kind in ("missing",):
                continue  # a missing output file is created: good input
            argv = [a for a in base]
            if opt == "--csv":
                argv[argv.index("--csv") + 1] = path
            else:
                argv += [opt, path]
            if opt == "--hf-config":
                argv[argv.index("--model"):argv.index("--model") + 2] = []
            argv, kw = own_csv(argv) if opt != "--csv" else (argv, {})
            c.jobs.append((f"layer_run {opt} <{kind}>", argv, dict(kw, path_case=True)))
    for kind in ("fifo", "device", "empty-name"):
        argv, kw = own_csv(base + ["--dump", c.paths()[kind]])
        c.jobs.append((f"layer_run --dump <{kind}>", argv, dict(kw, path_case=True)))


def fuzz_theory(c, theory):
    out = os.path.join(c.work, "tables")
    os.mkdir(out)
    plan_paper = [theory, "plan", "--model", "175b"]
    plan_search = [theory, "plan", "--model", "llama3-70b", "--gpus", "64", "--global-batch", "64"]
    llama = [theory, "llama-table", "--model", "llama3-8b"]
    memory = [theory, "memory", "--model", "llama3-8b", "--gpus", "8"]
    tables = [theory, "--out", out]
    for base, sub in ((plan_paper, ["plan"]), (plan_search, ["plan"]), (llama, ["llama-table"]), (memory, ["memory"]),
                      (tables, [])):
        extra = MEGATRON_VALUE_FLAGS if sub == ["memory"] else []
        for opt in options_of([theory] + sub) + extra:
            if opt in PATH_OPTIONS:
                continue  # fuzzed with paths below
            for v in VALUES:
                argv = list(base)
                if opt in argv:
                    argv[argv.index(opt) + 1] = v
                else:
                    argv += [opt, v]
                c.jobs.append((f"{' '.join(['theory'] + sub)} ({base[-1]}) {opt} {v!r}", argv,
                               dict(out_dir=out if base is tables else None, must_refuse=v in MUST_REFUSE)))
    for kind, path in c.paths().items():
        if kind in ("missing", "empty-name"):
            continue  # --results of nothing: an error, checked below with the others
        c.jobs.append((f"theory --results <{kind}>", tables + ["--results", path],
                       dict(out_dir=out, path_case=kind in ("fifo", "device"))))
    for kind, path in c.paths().items():
        c.jobs.append((f"theory plan --hf-config <{kind}>",
                       [theory, "plan", "--hf-config", path, "--gpus", "8", "--global-batch", "8"], dict(path_case=True)))
        c.jobs.append((f"theory llama-table --hf-config <{kind}>", [theory, "llama-table", "--hf-config", path],
                       dict(path_case=True)))
        c.jobs.append((f"theory memory --megatron-args <{kind}>", [theory, "memory", "--megatron-args", path, "--gpus", "8"],
                       dict(path_case=True)))
        c.jobs.append((f"theory plan --megatron-args <{kind}>",
                       [theory, "plan", "--megatron-args", path, "--gpus", "8", "--global-batch", "8"], dict(path_case=True)))


# Plans a user (or a fuzzer) writes wrong: each is refused with one line before any point runs.
BAD_PLANS = {
    "deep-nesting": "[" * 100000 + "]" * 100000,
    "deep-object": '{"a":' * 50000 + "1" + "}" * 50000,
    "not-json": "{name: mine}",
    "not-utf8": b"{\"name\": \"\xff\"}",
    "list": "[1, 2]",
    "empty": "",
    "arabic-digits": '{"name": "x", "fixed": {"model": "tiny", "seq": "\u0661\u0662\u0668"}}',
    "fullwidth-digits": '{"name": "x", "fixed": {"model": "tiny", "batch": "\uff11"}}',
    "underscore-number": '{"name": "x", "fixed": {"model": "tiny", "seq": "1_024"}}',
    "huge-number": '{"name": "x", "fixed": {"model": "tiny", "seq": 1e400}}',
    "huge-int": '{"name": "x", "fixed": {"model": "tiny", "seq": 99999999999999999999999}}',
    "huge-grid": '{"name": "x", "grid": {"seq": [' + ",".join(str(i) for i in range(1, 2001)) + '],'
                 ' "batch": [' + ",".join(str(i) for i in range(1, 2001)) + ']}}',
    "nan": '{"name": "x", "fixed": {"model": "tiny", "dropout": NaN}}',
    "bool-seq": '{"name": "x", "fixed": {"model": "tiny", "seq": true}}',
    "nested-value": '{"name": "x", "fixed": {"model": "tiny", "seq": [[128]]}}',
    "unknown-key": '{"name": "x", "fixed": {"model": "tiny", "seqq": 128}}',
}


def fuzz_scripts(c, python, build, root):
    sweep = [python, os.path.join(root, "runners", "sweep.py"), "--build", build, "--backend", "meta"]
    csv = os.path.join(c.work, "sweep.csv")
    for name, text in BAD_PLANS.items():
        plan = os.path.join(c.work, f"plan_{name}.json")
        with open(plan, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
        c.jobs.append((f"sweep.py plan <{name}>", sweep + ["--dry-run", "--csv", csv, plan], dict(must_refuse=True)))
    for kind, path in c.paths().items():
        c.jobs.append((f"sweep.py plan <{kind}>", sweep + ["--dry-run", "--csv", csv, path + ".json" if kind ==
                       "in-missing-folder" else path], dict(path_case=True)))
        if kind not in ("missing",):
            c.jobs.append((f"sweep.py --csv <{kind}>", sweep + ["--csv", path, "smoke"], dict(path_case=True)))
    # make_all over a results folder holding a FIFO and a folder named like CSVs, and a results
    # "folder" that is a FIFO: each answered, none blocks.
    results = os.path.join(c.work, "results_with_odd_entries")
    os.mkdir(results)
    os.mkfifo(os.path.join(results, "fifo.csv"))
    os.mkdir(os.path.join(results, "folder.csv"))
    make_all = [python, os.path.join(root, "plots", "make_all.py"), "--theory-bin",
                os.path.join(build, "runners", "theory")]
    c.jobs.append(("make_all.py <results with a FIFO>", make_all + [results, os.path.join(c.work, "figs1")],
                   dict(timeout_s=MAKE_ALL_TIMEOUT_S)))
    for kind in ("fifo", "device", "missing"):
        c.jobs.append((f"make_all.py results <{kind}>", make_all + [c.paths()[kind], os.path.join(c.work, "figs2")],
                       dict(path_case=True, timeout_s=MAKE_ALL_TIMEOUT_S)))


def fuzz_row_kills(c, layer_run, root, kills=60):
    """layer_run killed at random moments while appending rows as long as the limit allows:
    every run that exited 0 has its row, whole, once; no fragment is ever read as a row."""
    sys.path.insert(0, os.path.join(root, "runners"))
    import results_csv  # noqa: E402  (the readers' own line reader)
    csv = os.path.join(c.work, "kills.csv")
    done, rng = 0, random.Random(21)
    for i in range(kills):
        # Zero padding makes the command line, a column of the row, long: large rows take
        # more than one page to write.
        seed = str(i + 1).rjust(rng.choice([10, 1000, 20000]), "0")
        argv = [layer_run, "--backend", "meta", "--model", "tiny", "--config", "baseline", "--warmup", "0",
                "--iters", "1", "--seed", seed, "--csv", csv]
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.0, 0.4))
        p.kill()
        _, err = p.communicate(timeout=TIMEOUT_S)
        if p.returncode == 0:
            done += 1
        elif p.returncode not in (-signal.SIGKILL, 2):
            c.fail(f"row kill {i}", f"exit {p.returncode}: {err.decode(errors='replace').strip()[:200]}")
    c.cases += kills
    if not os.path.exists(csv):
        return
    header, rows, problems = results_csv.read(csv)
    complete_seeds = [r[header.index("seed")] for _, r in rows]
    if len(set(complete_seeds)) != len(complete_seeds):
        c.fail("row kills", "a row appears twice")
    if len(rows) < done:
        c.fail("row kills", f"{done} runs exited 0 but only {len(rows)} rows are whole")
    for line, why in problems:  # at most the fragment of the last, killed writer
        if "unfinished last row" not in why:
            c.fail("row kills", f"line {line}: {why}")


def main():
    layer_run = os.path.abspath(os.environ.get("ACTBENCH_LAYER_RUN", "build/runners/layer_run"))
    theory = os.path.abspath(os.environ.get("ACTBENCH_THEORY", "build/runners/theory"))
    verbose = "-v" in sys.argv
    work = tempfile.mkdtemp(prefix="actbench_fuzz_")
    try:
        c = Campaign(work, full="--full" in sys.argv)
        fuzz_layer_run(c, layer_run)
        fuzz_theory(c, theory)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        build = os.path.dirname(os.path.dirname(os.path.abspath(layer_run)))
        fuzz_scripts(c, os.environ.get("ACTBENCH_PYTHON", "/usr/bin/python3"), build, root)
        c.run_all(workers=int(os.environ.get("ACTBENCH_FUZZ_JOBS", "2")))
        fuzz_row_kills(c, layer_run, root, kills=200 if c.full else 30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for line in c.broken if verbose else c.broken[:200]:
        print(line)
    print(f"fuzz_cli: {c.cases} cases, {len(c.broken)} broke the contract")
    return 1 if c.broken else 0


if __name__ == "__main__":
    sys.exit(main())
