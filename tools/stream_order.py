"""What a GPU would order, from the simulator's stream log (CUDASIM_STREAM_LOG, written by
tools/cudasim/src/stream_log.cpp and the NCCL stand-in): the simulator runs every piece of work
at once in issue order, so its results cannot show a missing dependency between streams; this
reads the log and computes the happens-before order the CUDA stream semantics guarantee:

- work on one stream runs in issue order;
- cudaStreamWaitEvent(s, e) orders the work issued on s after it behind the work before the
  latest cudaEventRecord(e, ...) issued before it;
- the legacy default stream (0x0, 0x1) waits for the blocking streams and they for it (streams
  created with cudaStreamNonBlocking, flags 1, do not);
- the host learns of completion by cudaStreamSynchronize / cudaStreamQuery (that stream),
  cudaEventSynchronize / cudaEventQuery (that event), cudaDeviceSynchronize (all) and a
  synchronous cudaMemcpy (host_sync=1); work issued later is after what the host knows.

Every operation gets a vector clock (per stream, the last operation known done before it
starts); a happens before b iff b's clock covers a. `races(ops)` lists pairs of operations on
different streams that touch the same bytes, at least one writing, with neither before the
other. Kernels' accesses are their pointer parameters (no extent: a pointer inside the other
operation's range counts); copies, sets and NCCL calls carry exact ranges.
"""
import glob
import os

LEGACY = "legacy"


class Op:
    def __init__(self, index, fields):
        self.index = index
        self.what = fields["what"]
        stream = fields.get("stream")
        self.stream = LEGACY if stream in ("0x0", "0x1") else stream
        self.name = fields.get("name", "")
        self.event = fields.get("event")
        self.flags = int(fields.get("flags", "0"))
        self.host_sync = fields.get("host_sync") == "1"
        self.reads = _ranges(fields.get("reads", ""))
        self.writes = _ranges(fields.get("writes", ""))
        self.clock = {}

    def is_work(self):
        return self.what in ("kernel", "copy", "set", "nccl")

    def __repr__(self):
        return "#%d %s%s on %s" % (self.index, self.what, " " + self.name if self.name else "", self.stream)


def _ranges(text):
    """'0x10+8,0x40' -> [(16, 8), (64, None)] (None: a kernel's pointer, extent unknown)."""
    out = []
    for word in filter(None, text.split(",")):
        base, _, n = word.partition("+")
        out.append((int(base, 16), int(n) if n else None))
    return out


def parse(lines):
    ops = []
    for line in lines:
        fields = dict(w.split("=", 1) for w in line.split())
        if fields:
            ops.append(Op(len(ops), fields))
    return ops


def read_logs(prefix):
    """{pid: ops} of every PREFIX.<pid> file (one per process)."""
    logs = {}
    for path in sorted(glob.glob(glob.escape(prefix) + ".*")):
        with open(path) as f:
            logs[os.path.basename(path).rsplit(".", 1)[1]] = order(parse(f))
    return logs


def _join(a, b):
    out = dict(a)
    for s, i in b.items():
        if out.get(s, -1) < i:
            out[s] = i
    return out


def order(ops):
    """Sets each operation's clock; returns ops."""
    tail, events, host, blocking = {}, {}, {}, set()
    for op in ops:
        if op.what == "stream":
            (blocking.discard if op.flags & 1 else blocking.add)(op.stream)
        elif op.what == "sync_stream":
            host = _join(host, tail.get(op.stream, {}))
        elif op.what == "sync_device":
            for c in tail.values():
                host = _join(host, c)
        elif op.what == "sync_event":
            host = _join(host, events.get(op.event, {}))
        elif op.what == "wait":
            tail[op.stream] = _join(_join(tail.get(op.stream, {}), host), events.get(op.event, {}))
        else:  # work or a record: a place in its stream
            c = _join(tail.get(op.stream, {}), host)
            if op.stream == LEGACY:
                for s in blocking:
                    c = _join(c, tail.get(s, {}))
            if op.is_work():
                c[op.stream] = op.index
            op.clock = c
            tail[op.stream] = c
            if op.stream == LEGACY:
                for s in blocking:
                    tail[s] = _join(tail.get(s, {}), c)
            if op.what == "record":
                events[op.event] = c
            if op.host_sync:
                host = _join(host, c)
    return ops


def before(a, b):
    """Whether work a is done before work b starts."""
    return b.clock.get(a.stream, -1) >= a.index


def _touch(x, y):
    (p, n), (q, m) = x, y
    if n is None and m is None:
        return p == q
    if n is None:
        return q <= p < q + m
    if m is None:
        return p <= q < p + n
    return p < q + m and q < p + n


def conflict(a, b):
    """Whether a and b touch the same bytes, one of them writing."""
    return any(_touch(x, y) for x in a.writes for y in b.reads + b.writes) or \
        any(_touch(x, y) for x in a.reads for y in b.writes)


def races(ops):
    """(a, b): conflicting work on different streams, a issued first, not ordered before b.
    Pairs of two kernels are left out (their pointers carry no extent)."""
    work = [op for op in ops if op.is_work()]
    ranged = [op for op in work if op.what != "kernel"]
    found = []
    for r in ranged:
        for o in work:
            if o is r or o.stream == r.stream or (o.what != "kernel" and o.index < r.index):
                continue  # each pair of ranged operations once
            a, b = (r, o) if r.index < o.index else (o, r)
            if conflict(a, b) and not before(a, b):
                found.append((a, b))
    return found


def readers(ops, op):
    """The work issued after op on another stream that reads what op wrote, in issue order."""
    return [o for o in ops[op.index + 1:] if o.is_work() and o.stream != op.stream and
            any(_touch(x, y) for x in op.writes for y in o.reads)]


def waits_between(ops, a, b):
    """cudaStreamWaitEvent calls on b's stream, issued between a and b, on an event recorded on
    a's stream after a: the edges that order b after a."""
    recorded = {}
    found = []
    for o in ops[a.index + 1:b.index]:
        if o.what == "record" and o.stream == a.stream:
            recorded[o.event] = o
        elif o.what == "wait" and o.stream == b.stream and o.event in recorded:
            found.append(o)
    return found
