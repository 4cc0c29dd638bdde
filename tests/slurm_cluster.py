"""A one-node Slurm cluster on this machine, for tests: munged, slurmctld and slurmd on
localhost, every file (key, config, state, spool, logs) in a temporary folder.

    with SlurmCluster() as cluster:      # SlurmUnavailable (one line) when it cannot run here
        env = cluster.env                # SLURM_CONF set: sbatch, squeue, ... talk to it
        ...

Every process it starts is stopped when the block ends, however it ends: the jobs are
cancelled, the daemons sent SIGTERM (then SIGKILL), and any slurmstepd left behind (found by
the SLURM_CONF in its environment, which only this cluster's processes hold) killed.
Needs Debian's slurmctld, slurmd, slurm-client and munge (scripts/setup.sh) and root (slurmd
runs jobs as their users, and the config says SlurmUser=root).
"""
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun")
START_TIMEOUT_S = 60


def _die_with_parent():
    """In a daemon before exec: SIGTERM when the test process dies, even of SIGKILL (a ctest
    timeout), so that no daemon outlives its test. The daemons run in the foreground for it."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class SlurmUnavailable(Exception):
    """Why no cluster can run here, in one line."""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name):
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(p, os.X_OK)),
                                      None)


class SlurmCluster:
    def __init__(self, cpus=2):
        self.cpus = cpus  # declared to Slurm (config_overrides): at least 2, whatever the machine has
        self.tmp = None
        self.procs = []
        self.env = None

    def __enter__(self):
        missing = [d for d in DAEMONS if not _which(d)]
        if missing:
            raise SlurmUnavailable(f"no {', '.join(missing)} (scripts/setup.sh installs Slurm and munge)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("slurmd must run as root to start jobs")
        self.tmp = tempfile.mkdtemp(prefix="actbench-slurm-")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def _start(self):
        os.chmod(self.tmp, 0o755)
        for d in ("munge", "state", "spool", "log"):
            os.mkdir(self.path(d), 0o700)
        key, sock = self.path("munge", "munge.key"), self.path("munge", "socket")
        self._check([_which("mungekey"), "--create", "--keyfile", key])
        self._spawn("munged", [_which("munged"), "--foreground", "--force", "--socket", sock, "--key-file", key,
                               "--pid-file", self.path("munge", "pid"), "--log-file", self.path("log", "munged.log"),
                               "--seed-file", self.path("munge", "seed")])
        self._wait_for(lambda: os.path.exists(sock), "munged", "munged.log")
        host = socket.gethostname().split(".")[0]
        conf = self.path("slurm.conf")
        with open(conf, "w") as f:
            f.write(self._config(host, sock))
        self.env = dict(os.environ, SLURM_CONF=conf)
        for k in [k for k in self.env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del self.env[k]  # a test run inside some other allocation: not ours
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", conf])
        self._spawn("slurmd", [_which("slurmd"), "-D", "-N", "actbench", "-f", conf])
        self._wait_for(self._node_idle, "the node", "slurmd.log")

    def _config(self, host, sock):
        ports = (_free_port(), _free_port())
        lines = {
            "ClusterName": "actbench", "SlurmctldHost": f"{host}(127.0.0.1)", "SlurmUser": "root",
            "SlurmctldPort": ports[0], "SlurmdPort": ports[1], "AuthType": "auth/munge", "CredType": "cred/munge",
            "AuthInfo": f"socket={sock}", "StateSaveLocation": self.path("state"),
            "SlurmdSpoolDir": self.path("spool"), "SlurmctldPidFile": self.path("slurmctld.pid"),
            "SlurmdPidFile": self.path("slurmd.pid"), "SlurmctldLogFile": self.path("log", "slurmctld.log"),
            "SlurmdLogFile": self.path("log", "slurmd.log"), "SlurmctldDebug": "info", "SlurmdDebug": "info",
            # No cgroups in a container: processes tracked through /proc, no task binding.
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_CPU",
            "SchedulerType": "sched/builtin", "MpiDefault": "none", "SwitchType": "switch/none",
            # No slurmdbd: sacct has nothing, finished jobs are known to scontrol for MinJobAge s.
            "AccountingStorageType": "accounting_storage/none", "JobAcctGatherType": "jobacct_gather/none",
            "JobCompType": "jobcomp/none", "MinJobAge": 3600, "ReturnToService": 2, "KillWait": 2,
            "InactiveLimit": 0, "SlurmdTimeout": 300, "MaxArraySize": 10001,
            "SlurmdParameters": "config_overrides",  # the node as declared here, whatever slurmd -C says
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        text += (f"NodeName=actbench NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 "
                 f"State=UNKNOWN\n")
        text += "PartitionName=debug Nodes=actbench Default=YES MaxTime=INFINITE State=UP\n"
        return text

    def _spawn(self, name, cmd):
        log = open(self.path("log", f"{name}.out"), "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=self.env or dict(os.environ), start_new_session=True,
                                           preexec_fn=_die_with_parent))
        log.close()

    def _check(self, cmd):
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        if r.returncode != 0:
            raise SlurmUnavailable(f"{os.path.basename(cmd[0])} failed: {(r.stderr or r.stdout).strip()[:200]}")
        return r.stdout

    def _node_idle(self):
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
        return r.returncode == 0 and r.stdout.strip() in ("idle", "mixed", "allocated")

    def _wait_for(self, ready, what, log):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        raise SlurmUnavailable(f"{what} did not come up: {self.log_tail(log)}")

    def log_tail(self, name, lines=3):
        for candidate in (self.path("log", name), self.path("log", name.replace(".log", ".out"))):
            try:
                with open(candidate, errors="replace") as f:
                    tail = [l.strip() for l in f.read().splitlines() if l.strip()][-lines:]
                if tail:
                    return " | ".join(tail)
            except OSError:
                pass
        return "(no log)"

    def stop(self):
        if self.env is not None and self.procs and all(p.poll() is None for p in self.procs):
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True, timeout=30)
            self._wait_no_jobs(15)
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._kill_leftovers()
        self.procs = []
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _wait_no_jobs(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=self.env)
            if r.returncode != 0 or not r.stdout.strip():
                return
            time.sleep(0.5)

    def _kill_leftovers(self):
        """slurmstepd and the job's processes outlive slurmd: ours hold our SLURM_CONF."""
        marker = f"SLURM_CONF={self.path('slurm.conf')}".encode()
        for pid in [int(d) for d in os.listdir("/proc") if d.isdigit()]:
            if pid == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker in env:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
