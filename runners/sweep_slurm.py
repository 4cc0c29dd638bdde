"""sweep.py --launcher slurm: each point of a sweep on its own Slurm allocation, every row once.

The sweep runs on a login node and submits the points that are not in the CSV yet as job
arrays (one per world size: the tasks of an array share one allocation shape); each array
task runs its point with srun (--mpi=pmix where `srun --mpi=list` offers it) and writes its
row into a file of its own in FOLDER = CSV.slurm/ (beside the CSV, so on the file system the
nodes share), never into the CSV:

    FOLDER/points/D.json  a point submitted and not yet in the CSV: its key, command, attempts
                          and array task (written by the sweep, before sbatch)
    FOLDER/rows/D.csv     the task's row (layer_run's header and row), renamed into place whole
    FOLDER/rows/D.exit    the exit status of a task that ran to its end; D.err its stderr
    FOLDER/logs/          Slurm's output of each task

D is a digest of the point's key. Only the sweep writes the CSV, under its own lock (sweep.py's
SweepLock, taken on the login node: no lock crosses the shared file system): it appends a
finished row when its key is not in the CSV yet, then removes the point's files. A rerun of
the same command (or `sweep.py --collect`) finds the points still open in FOLDER and their
array tasks through squeue by job name (actbench-TAG-N, TAG naming the CSV), so a point queued
or running is never submitted twice. A task that ended without a row or an exit status
(cancelled, node failure, lost) is submitted again, at most --resubmit times; after that, and
at once for a time limit or the node's out-of-memory kill, the point gets a status=failed row
with Slurm's reason (from sacct; without accounting, from squeue's record of the finished task;
else "no longer known to Slurm"). A task that ran to its end without a row gets a failed row
with layer_run's error line, as on one machine.
"""
import glob
import hashlib
import json
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time

import number_text
import results_csv
import sweep
import user_files
from sweep import SweepError

SBATCH_OWN = {"--array": "the sweep makes the arrays", "-a": "the sweep makes the arrays",
              "--job-name": "a rerun finds its jobs by name", "-J": "a rerun finds its jobs by name",
              "--output": "the sweep keeps each task's output", "-o": "the sweep keeps each task's output",
              "--error": "the sweep keeps each task's output", "-e": "the sweep keeps each task's output",
              "--ntasks": "a point's ranks are its t", "-n": "a point's ranks are its t",
              "--wrap": "the sweep writes the batch script", "--parsable": "the sweep reads the job id",
              "--array-task-ids": "the sweep makes the arrays"}
# A Slurm time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds (ASCII digits), or no limit.
SLURM_TIME = re.compile(r"(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE)", re.ASCII)
# squeue states of a task that has not ended.
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
               "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
# Why a task waits, when it is only its turn (other reasons are shown with the progress).
USUAL_WAITS = {"None", "Priority", "Resources", "JobArrayTaskLimit", "BeginTime", "Dependency", ""}
# Ends of a task that Slurm decided, whatever the task's own exit status says.
SCHEDULER_ENDS = {"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
                  "REVOKED", "SPECIAL_EXIT"}
# Ends that would come again on a resubmission: recorded as failed at once.
FINAL_STATES = {"TIMEOUT", "OUT_OF_MEMORY", "DEADLINE"}
FINISH_GRACE_S = 60  # a task Slurm says finished may take this long to show its files (NFS caches)
DIGEST_CHARS = 24


# ---------------------------------------------------------------- options

def add_options(ap):
    g = ap.add_argument_group("with --launcher slurm (docs/sweeps.md)")
    g.add_argument("--partition")
    g.add_argument("--account")
    g.add_argument("--time", help="each point's time limit, as sbatch takes it (e.g. 00:30:00)")
    g.add_argument("--gpus-per-node", help="GPUs of a node: a point of t ranks takes ceil(t / G) nodes")
    g.add_argument("--max-concurrent", help="array tasks running at once, per array (sbatch --array=...%%N)")
    g.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="one more sbatch option, e.g. --sbatch-arg=--qos=high (repeatable)")
    g.add_argument("--resubmit",
                   help="times a task that ended without a result (cancelled, node failure) is submitted again "
                        "(default 2)")
    g.add_argument("--poll", help="seconds between looks at the queue (default 10)")
    g.add_argument("--collect", action="store_true",
                   help="merge what finished into --csv and say what is still queued; submits nothing (no PLAN)")


SLURM_ONLY = ("partition", "account", "time", "gpus_per_node", "max_concurrent", "sbatch_arg", "resubmit", "poll")
DEFAULTS = {"resubmit": "2", "poll": "10"}
MAX_ARRAY_TASKS = 1000  # Slurm's default MaxArraySize is 1001: indices 0..1000


def check_options(args):
    """The slurm options, refused with one line (SweepError) when wrong or given without slurm."""
    if args.collect:
        if args.plan is not None:
            raise SweepError("--collect takes no PLAN: it merges whatever was submitted for --csv")
        if args.launcher not in ("auto", "slurm"):
            raise SweepError(f"--collect is for sweeps of --launcher slurm, not {args.launcher}")
        args.launcher = "slurm"
    elif args.plan is None:
        raise SweepError("a PLAN is needed (or --collect)")
    if args.launcher != "slurm":
        given = [o for o in SLURM_ONLY if getattr(args, o)]
        if given:
            raise SweepError(f"--{given[0].replace('_', '-')} needs --launcher slurm")
        return
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("partition", "account"):
        value = getattr(args, name)
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise SweepError(f"--{name} '{value}' is not a Slurm name (empty or holds blanks)")
    if args.time is not None and (not SLURM_TIME.fullmatch(args.time) or not re.search("[1-9]|U|I", args.time)):
        raise SweepError(f"--time '{args.time}' is not a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                         f"D-HH:MM:SS, ASCII digits, not zero)")
    for name, least in (("gpus_per_node", 1), ("max_concurrent", 1), ("resubmit", 0)):
        given = getattr(args, name)
        if given is not None:
            value = number_text.integer(given, least, 1 << 31)
            if value is None:
                raise SweepError(f"--{name.replace('_', '-')} must be a whole number >= {least} (ASCII digits), "
                                 f"got '{given}'")
            setattr(args, name, value)
    poll = number_text.real(args.poll)
    if poll is None or not 0 < poll <= 3600:
        raise SweepError(f"--poll must be a number of seconds in (0, 3600] (ASCII digits), got '{args.poll}'")
    args.poll = poll
    for arg in args.sbatch_arg:
        check_sbatch_arg(arg)
    if not args.dry_run and not shutil.which("sbatch"):
        raise SweepError("--launcher slurm but sbatch is not on PATH (run the sweep on a login node)")


def check_sbatch_arg(arg):
    if not arg.startswith("-") or any(c in arg for c in "\n\r\0"):
        raise SweepError(f"--sbatch-arg '{arg}' is not one sbatch option (starting with -, on one line)")
    name = arg.split("=")[0] if arg.startswith("--") else arg[:2]
    # sbatch takes any unambiguous start of a long option: --job is --job-name.
    own = [o for o in SBATCH_OWN if o == name or (len(name) > 3 and o.startswith(name))]
    if own:
        raise SweepError(f"--sbatch-arg {arg}: the sweep sets {own[0]} itself ({SBATCH_OWN[own[0]]})")


# ---------------------------------------------------------------- the folder

class Folder:
    """FOLDER = CSV.slurm/: the points submitted for one CSV and what their tasks left."""

    def __init__(self, csv_path):
        self.csv = os.path.realpath(csv_path)
        self.root = self.csv + ".slurm"
        self.tag = hashlib.sha256(self.csv.encode("utf-8", "surrogateescape")).hexdigest()[:10]

    def make(self):
        for d in ("points", "rows", "logs"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)

    def path(self, kind, digest, suffix=""):
        return os.path.join(self.root, kind, digest + suffix)

    def open_points(self):
        folder = os.path.join(self.root, "points")
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return {}
        points = {}
        for name in names:
            if name.endswith(".json"):
                try:
                    point = json.loads(user_files.read_text("point file", os.path.join(folder, name)))
                    points[name[:-5]] = point
                except (user_files.UserFileError, ValueError) as e:
                    print(f"sweep: warning: {folder}/{name}: unreadable ({e}); its point is submitted again",
                          file=sys.stderr)
        return points

    def save(self, digest, point):
        write_whole(self.path("points", digest, ".json"), json.dumps(point, sort_keys=True))

    def forget(self, digest):
        """A point whose result is in the CSV: its files go (what its tasks left first, the point
        file last: a sweep killed in between finds the point in the CSV and ends the job)."""
        for path in sorted(glob.glob(glob.escape(self.path("rows", digest)) + ".*")) \
                + glob.glob(glob.escape(self.path("points", digest, ".json")) + ".tmp.*") \
                + [self.path("points", digest, ".json")]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def write_whole(path, text):
    """path holds text, or what it held before: written beside it, then renamed over it."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_or_empty(path):
    try:
        return user_files.read_text(path, path)
    except user_files.UserFileError:
        return ""


def digest_of(key):
    return hashlib.sha256("\x1f".join(key).encode("utf-8", "surrogateescape")).hexdigest()[:DIGEST_CHARS]


# ---------------------------------------------------------------- what runs

# The layer_run --csv of a task: a file of its own (the shell expands it in the task).
PART_WORD = '"$rows/$point.part.$SLURM_JOB_ID"'
PART_MARK = "\0part"  # stands for PART_WORD in a command (no argument can hold a NUL)


def mpi_option():
    """srun's --mpi=pmix where this Slurm has the plugin (Open MPI, MPICH and Intel MPI take
    PMIx); else nothing, the cluster's MpiDefault."""
    try:
        out = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return ["--mpi=pmix"] if re.search(r"^\s*pmix\s*$", out.stdout + out.stderr, re.M) else []


def ranks_of(p, emulated):
    return 1 if emulated else sweep.world_size(p)


def task_command(p, args, layer_run, emulated, mpi):
    """srun over the point's ranks, running layer_run into the task's own file (PART_MARK)."""
    srun = ["srun", *mpi, f"--ntasks={ranks_of(p, emulated)}", "--kill-on-bad-exit=1"]
    return srun + sweep.layer_run_command(p, args, os.path.abspath(layer_run), emulated, PART_MARK)


def shown_command(words, part):
    return shlex.join(part if w == PART_MARK else w for w in words)


def sbatch_options(name, folder, ranks, count, args):
    opts = [f"--job-name={name}", f"--array=0-{count - 1}" + (f"%{args.max_concurrent}" if args.max_concurrent
                                                              else ""),
            f"--output={folder.root.replace('%', '%%')}/logs/%x_%a.out", f"--ntasks={ranks}"]
    if args.gpus_per_node:
        per_node = min(ranks, args.gpus_per_node)
        opts += [f"--nodes={math.ceil(ranks / args.gpus_per_node)}", f"--ntasks-per-node={per_node}",
                 f"--gpus-per-node={per_node}"]
    opts += [f"--{o}={getattr(args, o)}" for o in ("partition", "account", "time") if getattr(args, o)]
    return opts + list(args.sbatch_arg)


def batch_script(folder, tasks, opts, plan_name):
    """The job array's script: task i runs tasks[i] = (digest, command words), its row renamed
    into rows/D.csv once whole, then its exit status into rows/D.exit. Cancelled or out of
    time (SIGTERM), it leaves neither: the sweep asks Slurm what happened."""
    lines = ["#!/bin/bash", f"# actbench sweep {plan_name}: {len(tasks)} points into {folder.csv}",
             f"# submitted as: sbatch --parsable {shlex.join(opts)} SCRIPT",
             f"rows={shlex.quote(os.path.join(folder.root, 'rows'))}",
             'case "$SLURM_ARRAY_TASK_ID" in']
    for i, (digest, words) in enumerate(tasks):
        run = " ".join(PART_WORD if w == PART_MARK else shlex.quote(w) for w in words)
        lines += [f"  {i}) point={digest}", f"     run=({run}) ;;"]
    lines += ['  *) echo "actbench: no point for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac",
              "stopped=",
              "trap 'stopped=1' TERM INT",
              f"part={PART_WORD}",
              '"${run[@]}" 2> "$rows/$point.err.$SLURM_JOB_ID"',
              "code=$?",
              "# A row is whole once its line end is in: header and row are two lines.",
              'if [ "$(wc -l < "$part" 2>/dev/null || echo 0)" -ge 2 ]; then mv -f "$part" "$rows/$point.csv"; '
              'else rm -f "$part"; fi',
              'if [ -n "$stopped" ]; then exit 143; fi',
              'mv -f "$rows/$point.err.$SLURM_JOB_ID" "$rows/$point.err"',
              'echo "$code" > "$rows/$point.exit.$SLURM_JOB_ID" && mv -f "$rows/$point.exit.$SLURM_JOB_ID" '
              '"$rows/$point.exit"',
              'exit "$code"', ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the queue

def queue(folder):
    """{job name: {array index: (task id, state, reason)}} of this CSV's tasks that Slurm still
    knows (queued, running, or recently finished); None when squeue does not answer."""
    try:
        r = subprocess.run(["squeue", f"--user={os.getuid()}", "--noheader", "--array", "--states=all",
                            "--format=%j|%i|%T|%r"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    tasks = {}
    prefix = f"actbench-{folder.tag}-"
    for line in r.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[0].startswith(prefix) or "_" not in parts[1]:
            continue
        name, task, state, reason = parts
        index = task.split("_", 1)[1]
        if index.isdigit():
            tasks.setdefault(name, {})[int(index)] = (task, state.split()[0], reason)
    return tasks


def task_of(point, tasks):
    """(task id, state, reason) of the point's array task as queue() found it, or None."""
    job = point.get("job") or {}
    return tasks.get(job.get("name"), {}).get(job.get("index"))


def accounting(task):
    """(state, detail) of a finished task from sacct; None without accounting data."""
    try:
        r = subprocess.run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", task,
                            "--format=State,ExitCode,Reason"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    if r.returncode != 0 or not lines:
        return None
    state, code, reason = (lines[-1].split("|") + ["", ""])[:3]
    detail = f"exit {code}" + (f", {reason}" if reason and reason != "None" else "")
    return state.split()[0] if state else "UNKNOWN", f"{state} ({detail})"


# ---------------------------------------------------------------- the sweep

class Slurm:
    """One sweep's (or --collect's) dealings with Slurm and FOLDER, under the sweep's lock."""

    def __init__(self, args, header, done, runner):
        self.args, self.header, self.done, self.runner = args, header, done, runner
        self.folder = Folder(args.csv)
        self.points = {}        # digest -> its point file's contents: the points open in FOLDER
        self.ended_since = {}   # digest -> when it was first seen ended without its files
        self.counts = {"ok": 0, "oom": 0, "failed": 0}
        self.shown = None
        self.mpi = None

    def submit(self, entries, plan_name, dry_run=False):
        """Submits entries [(digest, point file)] as one job array per world size."""
        by_ranks = {}
        for digest, point in entries:
            by_ranks.setdefault(point["ranks"], []).append((digest, point))
        arrays = [(ranks, group[i:i + MAX_ARRAY_TASKS]) for ranks, group in sorted(by_ranks.items())
                  for i in range(0, len(group), MAX_ARRAY_TASKS)]
        for ranks, group in arrays:
            name = f"actbench-{self.folder.tag}-{secrets.token_hex(4)}"
            opts = sbatch_options(name, self.folder, ranks, len(group), self.args)
            script = batch_script(self.folder, [(d, p["command"]) for d, p in group], opts, plan_name)
            if dry_run:
                print(script)
                continue
            before = {d: dict(p) for d, p in group}
            for i, (digest, point) in enumerate(group):  # recorded before sbatch: a rerun finds the job by name
                point.update(attempts=point.get("attempts", 0) + 1, job={"name": name, "index": i, "id": None})
                self.folder.save(digest, point)
            job_id = self._sbatch(opts, script, before)
            for digest, point in group:
                point["job"]["id"] = job_id
                self.folder.save(digest, point)
                self.points[digest] = point
                self.ended_since.pop(digest, None)
            print(f"slurm: submitted {len(group)} points as job {job_id} ({name}, {ranks} rank"
                  f"{'s' if ranks > 1 else ''} each)",
                  file=sys.stderr, flush=True)

    def _sbatch(self, opts, script, before):
        try:
            r = subprocess.run(["sbatch", "--parsable", *opts], input=script, capture_output=True, text=True,
                               timeout=300, start_new_session=True)  # a Ctrl-C is for the sweep, not mid-submit
            error = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1] if r.returncode else None
        except (OSError, subprocess.TimeoutExpired) as e:
            error = str(e)
        if error is None and r.stdout.strip().split(";")[0].isdigit():
            return r.stdout.strip().split(";")[0]
        for digest, point in before.items():  # not submitted: as it was
            if "job" in point:
                self.folder.save(digest, point)
            else:
                self.folder.forget(digest)
        raise SweepError(f"sbatch refused the job: {error or r.stdout.strip()}")

    def new_point(self, p, emulated, key, layer_run):
        cmd = task_command(p, self.args, layer_run, emulated, self.mpi)
        return {"key": list(key), "label": sweep.point_label(p), "ranks": ranks_of(p, emulated), "command": cmd,
                "attempts": 0}

    def look(self):
        """One look at the queue and FOLDER: merges what finished; returns (counts of open
        points by state, [digests to submit again]), or None when squeue did not answer."""
        tasks = queue(self.folder)
        if tasks is None:
            return None
        states = {"pending": 0, "running": 0, "why": set()}
        again = []
        for digest, point in list(self.points.items()):
            state = self._settle(digest, point, tasks)
            if state in states:
                states[state] += 1
            elif state == "again":
                again.append(digest)
            if state == "pending" and task_of(point, tasks)[2] not in USUAL_WAITS:  # e.g. ReqNodeNotAvail
                states["why"].add(task_of(point, tasks)[2])
        return states, again

    def _settle(self, digest, point, tasks):
        """What became of one open point: 'pending' or 'running' (queued), 'done' (its result is
        in the CSV now), 'again' (to submit again), or 'lost' (for a rerun to submit)."""
        key = tuple(point["key"])
        if key in self.done:
            self._close(digest)
            return "done"
        task = task_of(point, tasks)
        live = bool(task) and task[1] in LIVE_STATES
        # The task renames its row into place, then writes its exit status: a row is its result
        # once both are there, or once Slurm says it ended (killed in between).
        row_file, exit_file = self.folder.path("rows", digest, ".csv"), self.folder.path("rows", digest, ".exit")
        has_exit = os.path.exists(exit_file)
        if os.path.exists(row_file) and (has_exit or not live):
            self._merge_row(digest, point, row_file)
            return "done"
        if live:
            return "pending" if task[1] == "PENDING" else "running"
        # An exit status without a row is layer_run's failure, unless Slurm ended the task
        # (cancelled, out of time, node failure: srun then fails too, but that is no verdict).
        if has_exit and not (task and task[1] in SCHEDULER_ENDS):
            self._merge_exit(digest, point, exit_file)
            return "done"
        first = self.ended_since.setdefault(digest, time.monotonic())
        if task and task[1] in ("COMPLETED", "FAILED") and time.monotonic() - first < FINISH_GRACE_S:
            return "running"  # ran to its end: its files are on their way
        return self._ended_without_result(digest, point, task)

    def _ended_without_result(self, digest, point, task):
        task_id = task[0] if task else (f"{point['job']['id']}_{point['job']['index']}"
                                        if point.get("job", {}).get("id") else None)
        found = accounting(task_id) if task_id else None
        if found is None and task:
            found = (task[1], task[1] + (f" ({task[2]})" if task[2] not in ("None", "") else ""))
        state, reason = found or ("LOST", "no longer known to Slurm")
        if state not in FINAL_STATES and point.get("attempts", 0) <= self.args.resubmit:
            return "again" if not self.args.collect else "lost"
        where = f"slurm task {task_id}" if task_id else "slurm task"
        self._record_failure(digest, point, f"{where}: {reason}",
                             shown_command(point["command"], self.folder.path("rows", digest, ".part")))
        return "done"

    def _merge_row(self, digest, point, row_file):
        try:
            got, rows, problems = results_csv.read(row_file)
        except results_csv.BadFile as e:
            got, rows, problems = None, [], [(0, str(e))]
        if got != self.header or len(rows) != 1 or problems:
            why = problems[0][1] if problems else "not one row under this layer_run's header"
            self._record_failure(digest, point, f"the task's row file is unusable: {why}",
                                 shown_command(point["command"], row_file))
            return
        row = rows[0][1]
        key = tuple(row[self.header.index(c)] for c in sweep.KEY_COLUMNS)
        if key not in self.done:
            sweep.append_row(self.folder.csv, self.header, row)
            self.done.add(key)
        status = row[self.header.index("status")]
        self._tell(point, {"ok": "ok", "oom": "oom"}.get(status, "failed"), row[self.header.index("message")]
                   if status not in ("ok", "oom") else None)
        self._close(digest)

    def _merge_exit(self, digest, point, exit_file):
        code_text, err = (read_or_empty(path) for path in (exit_file, self.folder.path("rows", digest, ".err")))
        code = int(code_text) if code_text.strip().isdigit() else 1
        message = sweep.error_line(err, code) if code not in (0, 3) else \
            f"layer_run exited with status {code} but wrote no row"
        self._record_failure(digest, point, message, shown_command(point["command"], "(its row file)"))

    def _record_failure(self, digest, point, message, command):
        key = tuple(point["key"])
        if key not in self.done:
            row = sweep.failed_row(self.header, dict(zip(sweep.KEY_COLUMNS, key)), "failed", message, command)
            sweep.append_row(self.folder.csv, self.header, row)
            self.done.add(key)
        self._tell(point, "failed", message)
        self._close(digest)

    def _tell(self, point, state, message):
        self.counts[state] += 1
        job = point.get("job") or {}
        print(f"slurm: {point['label']}: {state} (task {job.get('id')}_{job.get('index')})"
              + (f"  ({message})" if message else ""), file=sys.stderr, flush=True)

    def _close(self, digest):
        self.folder.forget(digest)
        self.points.pop(digest, None)
        self.ended_since.pop(digest, None)

    def progress(self, states, force=False):
        why = ", ".join(sorted(states["why"]))
        now = (states["pending"], why, states["running"], self.counts["ok"] + self.counts["oom"],
               self.counts["failed"])
        if force or now != self.shown:
            print(f"slurm: {now[0]} pending" + (f" ({why})" if why else "")
                  + f", {now[2]} running, {now[3]} done, {now[4]} failed", file=sys.stderr, flush=True)
            self.shown = now

    def wait(self, plan_name):
        """Looks every --poll seconds until no point is open; submits lost tasks again."""
        told_silent = False
        while True:
            seen = self.look()
            if seen is None:
                if not told_silent:
                    print("slurm: warning: squeue does not answer; waiting (nothing is submitted meanwhile)",
                          file=sys.stderr, flush=True)
                    told_silent = True
            else:
                states, again = seen
                if again:
                    print(f"slurm: tasks ended without a result: {len(again)}; submitting them again",
                          file=sys.stderr, flush=True)
                    try:
                        self.submit([(d, self.points[d]) for d in again], plan_name)
                        states["pending"] += len(again)
                    except SweepError as e:  # the controller busy, say: the next look tries again
                        print(f"slurm: warning: {e}; trying again at the next look", file=sys.stderr, flush=True)
                self.progress(states)
                if not self.points:
                    return None
            if self._sleep():
                return self.runner.stop

    def _sleep(self):
        """Sleeps --poll seconds; True when a signal asked the sweep to stop."""
        end = time.monotonic() + self.args.poll
        while time.monotonic() < end:
            if self.runner.stop is not None:
                return True
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))
        return self.runner.stop is not None


def run(args, plan, todo, header, done, layer_run, runner):
    """The sweep of plan's points (todo as sweep.main builds it) through Slurm; its exit status."""
    slurm = Slurm(args, header, done, runner)
    slurm.mpi = mpi_option() if shutil.which("srun") else []
    part = slurm.folder.path("rows", "0" * DIGEST_CHARS, ".part.99999999999")  # as long as a task's
    try:
        sweep.check_recordable(todo, lambda p, e: [w if w != PART_MARK else part
                                                   for w in task_command(p, args, layer_run, e, slurm.mpi)])
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    slurm.points = {} if args.dry_run else slurm.folder.open_points()
    missing = [(p, e, key) for p, e, key, skip in todo if not skip]
    fresh = [(digest_of(key), slurm.new_point(p, e, key, layer_run)) for p, e, key in missing
             if digest_of(key) not in slurm.points]
    print(f"sweep {plan['name']}: {len(todo)} points, {len(todo) - len(missing)} already in {args.csv}, "
          f"{len(missing) - len(fresh)} already submitted, {len(fresh)} to submit (slurm, {args.backend})",
          file=sys.stderr, flush=True)
    try:
        if args.dry_run:
            slurm.submit(fresh, plan["name"], dry_run=True)
            return 0
        slurm.folder.make()
        slurm.submit(fresh, plan["name"])
        if args.no_wait:
            print(f"slurm: submitted; `sweep.py --collect --csv {args.csv}` (or this command again) merges the "
                  f"rows", file=sys.stderr)
            return 0
        stopped = slurm.wait(plan["name"])
    except (SweepError, OSError) as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    return finish(slurm, stopped, args.csv)


def collect(args, header, done, runner):
    """--collect: one look; merges what finished, says what is still open."""
    slurm = Slurm(args, header, done, runner)
    slurm.points = slurm.folder.open_points()
    try:
        seen = slurm.look()
    except OSError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    if seen is None:
        print("sweep: error: squeue does not answer: nothing merged", file=sys.stderr)
        return 1
    states, _ = seen
    slurm.progress(states, force=True)
    lost = len(slurm.points) - states["pending"] - states["running"]
    if lost:
        print(f"slurm: {lost} tasks ended without a result: run the sweep's command again to submit them again",
              file=sys.stderr)
    return 1 if slurm.counts["failed"] else 0


def finish(slurm, stopped, csv_path):
    if stopped is not None:
        print(f"sweep: stopped by {signal.Signals(stopped).name}; the submitted tasks go on: run again (or --collect) to merge "
              f"their rows into {csv_path}", file=sys.stderr)
        return 128 + stopped
    c = slurm.counts
    print(f"sweep: {c['ok'] + c['oom']} points done ({c['oom']} oom), {c['failed']} failed; results in {csv_path}",
          file=sys.stderr)
    return 1 if c["failed"] else 0
