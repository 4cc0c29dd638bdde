#!/usr/bin/env python3
"""Prints ptxas's resource counts (registers, stack, spill bytes) of each kernel of a .cu file.

    python3 tools/ptxas_usage.py kernels/cuda/attention_tc.cu [--arch 80 90] [--match REGEX]

Compiles the file with nvcc -Xptxas -v (no GPU needed; CUDA_HOME or /usr/local/cuda) for each
architecture and prints one row per kernel instantiation. The spill counts are the bytes of
the spill instructions in the code (ptxas's "spill stores / loads"), not traffic at run time.
Standard library only.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = re.compile(r"Compiling entry function '(\w+)' for 'sm_(\d+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")


def demangle(names):
    """Short names: namespaces and parameter lists dropped, template arguments kept."""
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    short = []
    for full in out.splitlines():
        full = full.replace("(anonymous namespace)::", "")
        head = full[: full.find("(")] if "(" in full else full  # drop the parameter list
        base = head.split("<", 1)
        base[0] = base[0].rsplit("::", 1)[-1].split()[-1]  # no return type, no namespaces
        short.append("<".join(base))
    return short


def usage(source, arch, nvcc):
    """[(mangled name, registers, stack, spill stores, spill loads)] of one compile."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "-std=c++20", "-O3", "-I", ROOT, "-arch=sm_%s" % arch, "-Xptxas", "-v", "-c", source,
               "-o", os.path.join(tmp, "k.o")]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("ptxas_usage.py: error: nvcc failed on %s for sm_%s:\n%s" % (source, arch, run.stderr[-2000:]))
    rows, name, frame = [], None, (0, 0, 0)
    for line in run.stderr.splitlines():
        if m := ENTRY.search(line):
            name, frame = m.group(1), (0, 0, 0)
        elif (m := FRAME.search(line)) and name:
            frame = tuple(int(x) for x in m.groups())
        elif (m := USED.search(line)) and name:
            rows.append((name, int(m.group(1))) + frame)
            name = None
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a .cu file")
    ap.add_argument("--arch", nargs="+", default=["80", "90"], help="compute capabilities (default 80 90)")
    ap.add_argument("--match", default="", help="only kernels whose short name matches this regex")
    args = ap.parse_args()
    if not os.path.isfile(args.source):
        sys.exit("ptxas_usage.py: error: no file %s" % args.source)
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        sys.exit("ptxas_usage.py: error: no nvcc at %s (set CUDA_HOME)" % nvcc)
    print("%-6s %-55s %5s %6s %12s %11s" % ("arch", "kernel", "regs", "stack", "spill_stores", "spill_loads"))
    for arch in args.arch:
        rows = usage(args.source, arch, nvcc)
        names = demangle([r[0] for r in rows])
        for short, r in sorted(zip(names, rows)):
            if re.search(args.match, short):
                print("sm_%-3s %-55s %5d %6d %12d %11d" % ((arch, short) + r[1:]))


if __name__ == "__main__":
    main()
