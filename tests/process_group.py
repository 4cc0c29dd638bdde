"""A test's child process (mpirun and its ranks, or one binary) in a process group of its own,
so that a hang kills all of it and fails the test instead of hanging CI. Standard library only."""
import os
import signal
import subprocess


def run_in_group(test, cmd, timeout, what=None, **popen):
    """Runs `cmd` with stdout and stderr captured as text; returns the CompletedProcess. Past
    `timeout` seconds the whole process group is killed and `test` fails, naming `what`."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         **popen)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        test.fail("%s hung for %d s: %s" % (what or os.path.basename(cmd[0]), timeout, " ".join(cmd)))
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)
