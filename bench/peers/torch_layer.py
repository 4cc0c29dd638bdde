#!/usr/bin/env python3
"""actbench's transformer layer in PyTorch eager: the side-by-side peer of layer_run.

    torch_layer.py --csv FILE [--config baseline,sp,full,selective,selective+sp]
                   [--model 22b|tiny|175b|530b|1t] [--hidden H --heads A --seq S --batch B --tp T]
                   [--dtype bf16|fp16|fp32] [--dropout P] [--warmup W] [--iters I] [--seed N]
                   [--device cuda|cpu]
    torch_layer.py --check-against DUMP_DIR [--config LIST] [--rtol R]
    torch_layer.py --self-check [--device cpu|cuda] [--model tiny] [--tp T] [--config LIST]
    torch_layer.py --print-csv-header

The layer is actbench's (layers/transformer_layer.cpp, tools/numpy_layer.py): pre-LN GPT,
x1 = x + dropout(proj(attn(ln1(x)))), y = x1 + dropout(fc2(gelu_tanh(fc1(ln2(x1))))),
activations [s, b, h], linear weights [out, in], qkv.weight = Q; K; V stacked, each
head-major, causal softmax over explicit scores (no fused SDPA), dropout on the attention
probabilities and on both residual branches, LayerNorm eps 1e-5.

One process plays rank 0 of t exactly as `layer_run --emulate-tp` does: per-rank shapes
(a/t heads, 3h/t qkv and 4h/t fc1 columns, h/t proj and 4h/t fc2 inputs), no real
collectives: an all-reduce does nothing, an all-gather of the sequence shard is t copies of
the local shard, a reduce-scatter is a copy of the first s/t rows. With sequence
parallelism the LayerNorms, dropouts and residual adds run on s/t rows and the
column-parallel linears save only their local input shard and all-gather it again in
backward (Megatron's way, which is what makes Table 2's 34/t).

Configurations: baseline (TP), sp (TP + SP), full (torch.utils.checkpoint of the whole
layer, use_reentrant=False), selective (checkpoint of core attention only: QK^T, softmax,
dropout, .V), selective+sp, and full+sp.

Measurement per configuration: --warmup untimed iterations, then --iters timed ones,
torch.cuda.Event on the current stream around forward and backward (host clock on cpu),
one synchronize per iteration; medians and min/max. Activation memory on cuda: the caching
allocator's requested bytes (where the PyTorch has that statistic; else its allocated
bytes) after forward minus before the input was made, the output excluded, on the first
timed iteration (act_bytes_source = requested | allocated); peak = max_memory_allocated over
that iteration (parameters and gradients included). On the cpu (no allocator statistics):
the bytes of the distinct storages autograd saves for backward plus the inputs a checkpoint
holds, parameters excluded (act_bytes_source = saved_tensors), which on a layer_run cpu run
is act_bytes + act_extra_bytes. One CSV row
per configuration, appended with one write() under flock, header once.

--check-against DUMP_DIR loads a `layer_run --dump` folder (float32 .npy, dropout 0) and
runs this layer in float64 on the cpu from the dumped parameters, x and dy, for each
configuration at t = 1, and prints the max error of y, dx and every gradient.
A dump of a LLaMA-shaped layer (RMSNorm, grouped-query attention, rotate-half RoPE over the
whole head, SwiGLU, no biases) runs the llama layer instead; any other composition is refused
(tools/numpy_layer.py checks every one). Timing and --self-check are the GPT layer's only.
--self-check runs each configuration once (float64 on cpu, fp32 on cuda) at the given
shape and t and checks that recomputation changes nothing: full and selective must give
the outputs and gradients of baseline (sp, selective+sp and full+sp those of sp), dropout
masks included.

Exit status: 0 ok; 1 a check failed or anything else; 2 bad input (one line on stderr, no
row; also "PyTorch is not installed"); 3 out of memory (a row with status=oom).
Only the standard library, torch and (for --check-against) numpy.
"""
import argparse
import csv
import datetime
import fcntl
import io
import json
import math
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
import traceback

PROG = "torch_layer.py"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# layer_run's facts (runners/facts.json, written by actbench_facts): the configurations in their
# canonical order with their policy, the paper's five, and the presets this GPT peer runs.
with open(os.path.join(REPO, "runners", "facts.json")) as _facts_file:
    FACTS = json.load(_facts_file)
PAPER_CONFIGS = FACTS["paper_configs"]
ALL_CONFIGS = [c["name"] for c in FACTS["configs"]]
# name -> (recompute: none | selective | full, sequence parallel)
CONFIG_POLICY = {c["name"]: (c["recompute"], c["sequence_parallel"]) for c in FACTS["configs"]}
# The gpt presets: hidden, heads, seq, batch, t
MODELS = {p["name"]: dict(hidden=p["hidden"], heads=p["heads"], seq=p["seq"], batch=p["batch"], tp=p["tp"])
          for p in FACTS["presets"] if p["arch"] == "gpt"}
DTYPES = ("bf16", "fp16", "fp32")
LN_EPS = 1e-5
DEFAULT_SEED = 1234

# The twelve parameters in layer_run's --dump order: canonical shape as a function of h,
# and how rank r of t holds them (layers/params.cpp).
PARAMS = ["ln1.weight", "ln1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
          "ln2.weight", "ln2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
PARAM_SHARDING = {
    "ln1.weight": "replicated", "ln1.bias": "replicated",
    "qkv.weight": "qkv_rows", "qkv.bias": "qkv_rows",
    "proj.weight": "cols", "proj.bias": "replicated",
    "ln2.weight": "replicated", "ln2.bias": "replicated",
    "fc1.weight": "rows", "fc1.bias": "rows",
    "fc2.weight": "cols", "fc2.bias": "replicated",
}

# --arch llama (layer_run --dump): no biases; qkv.weight [(a+2g)d, h] = Q; K; V head-major,
# fc1.weight [2F, h] = gate; up, fc2.weight [h, F].
LLAMA_PARAMS = ["ln1.weight", "qkv.weight", "proj.weight", "ln2.weight", "fc1.weight", "fc2.weight"]


def llama_param_shape(name, h, heads, kv_heads, ffn_hidden):
    d = h // heads
    return {"qkv.weight": ((heads + 2 * kv_heads) * d, h), "proj.weight": (h, h),
            "fc1.weight": (2 * ffn_hidden, h), "fc2.weight": (h, ffn_hidden)}.get(name, (h,))


CSV_HEADER = [
    "peer", "device", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "dtype", "dropout",
    "iters", "fwd_ms", "bwd_ms", "total_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms_min", "bwd_ms_max",
    "act_bytes_measured", "peak_allocated_bytes", "act_bytes_source", "status", "torch_version", "cuda_version",
    "git_sha", "hostname", "timestamp", "command"]


class BadInput(Exception):
    """Bad command-line input: one line on stderr, exit status 2, no row."""


class NoTorch(BadInput):
    pass


# ----------------------------------------------------------------------------------------
# Pure Python: configurations, shapes, sharding, CSV (testable without torch)
# ----------------------------------------------------------------------------------------

def parse_config_list(text):
    """'baseline,sp' -> ['baseline', 'sp'] (order kept, duplicates dropped)."""
    out = []
    for name in (n.strip() for n in text.split(",")):
        if not name:
            continue
        if name not in CONFIG_POLICY:
            raise BadInput("unknown config '%s' (expected %s)" % (name, ", ".join(ALL_CONFIGS)))
        if name not in out:
            out.append(name)
    if not out:
        raise BadInput("--config needs at least one configuration")
    return out


def validate_layer(hidden, heads, seq, batch, tp, configs):
    """The checks of layers/config.cpp validate_layer, with its messages."""
    if min(seq, batch, hidden, heads) < 1:
        raise BadInput("seq, batch, hidden and heads must all be >= 1")
    if tp < 1:
        raise BadInput("--tp must be >= 1")
    if hidden % heads:
        raise BadInput("hidden %d is not divisible by heads %d" % (hidden, heads))
    if heads % tp:
        raise BadInput("heads %d are not divisible by tp %d (each rank needs whole heads)" % (heads, tp))
    if hidden % tp:
        raise BadInput("hidden %d is not divisible by tp %d" % (hidden, tp))
    for c in configs:
        if CONFIG_POLICY[c][1] and seq % tp:
            raise BadInput("seq %d is not divisible by tp %d (needed by config %s)" % (seq, tp, c))


def canonical_param_shape(name, h):
    return {
        "qkv.weight": (3 * h, h), "qkv.bias": (3 * h,),
        "proj.weight": (h, h), "fc1.weight": (4 * h, h), "fc1.bias": (4 * h,), "fc2.weight": (h, 4 * h),
    }.get(name, (h,))


def local_param_shape(name, h, t):
    """Shape of rank r's shard of a parameter (the same on every rank)."""
    shape = canonical_param_shape(name, h)
    kind = PARAM_SHARDING[name]
    if kind in ("rows", "qkv_rows"):
        return (shape[0] // t,) + shape[1:]
    if kind == "cols":
        return (shape[0], shape[1] // t)
    return shape


def local_param_index(name, h, t, rank):
    """(rows, cols) of the canonical parameter that rank `rank` of t holds, as lists of
    ranges in local order (cols is None for a 1-D parameter): layers/params.cpp's ShardSpec."""
    shape = canonical_param_shape(name, h)
    rows = shape[0]
    cols = shape[1] if len(shape) > 1 else None
    kind = PARAM_SHARDING[name]
    all_cols = None if cols is None else [range(0, cols)]
    if kind == "replicated":
        return [range(0, rows)], all_cols
    if kind == "rows":
        lr = rows // t
        return [range(rank * lr, (rank + 1) * lr)], all_cols
    if kind == "cols":
        lc = cols // t
        return [range(0, rows)], [range(rank * lc, (rank + 1) * lc)]
    hl = h // t  # qkv_rows: this rank's heads of each of Q, K and V
    return [range(part * h + rank * hl, part * h + (rank + 1) * hl) for part in range(3)], all_cols


def layer_shapes(hidden, heads, seq, batch, tp, config):
    """Per-rank shapes of rank 0 of t under `config` (what this peer allocates)."""
    sp = CONFIG_POLICY[config][1]
    s_local = seq // tp if sp else seq
    hl, al, d = hidden // tp, heads // tp, hidden // heads
    return {
        "sequence_parallel": sp,
        "recompute": CONFIG_POLICY[config][0],
        "seq_local": s_local,              # rows of LayerNorm, dropout and residual parts
        "heads_local": al,
        "head_dim": d,
        "hidden_local": hl,                # qkv per part, proj input
        "ffn_local": 4 * hl,               # fc1 output, fc2 input
        "x": (s_local, batch, hidden),     # layer input and output, dy, dx
        "gemm_rows": seq * batch,          # rows of the full-sequence GEMMs
        "qkv_out": (seq, batch, 3 * hl),
        "scores": (batch, al, seq, seq),
        "params": {n: local_param_shape(n, hidden, tp) for n in PARAMS},
    }


def csv_line(fields):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()


def _first_line(fd):
    out = b""
    off = 0
    while True:
        chunk = os.pread(fd, 4096, off)
        if not chunk:
            return out.decode("utf-8", "replace")
        nl = chunk.find(b"\n")
        if nl >= 0:
            return (out + chunk[:nl]).decode("utf-8", "replace")
        out += chunk
        off += len(chunk)


def check_csv(path, header=CSV_HEADER):
    """Before any work: the file can be written and, if it has rows, has our header."""
    if not path:
        raise BadInput("--csv needs a file name")
    if not os.path.exists(path):
        d = os.path.dirname(path) or "."
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            raise BadInput("cannot write CSV '%s': directory '%s' is not writable or missing" % (path, d))
        return
    if not os.path.isfile(path):
        raise BadInput("CSV '%s' is not a regular file" % path)
    if not os.access(path, os.W_OK):
        raise BadInput("cannot write CSV '%s'" % path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_size and _first_line(fd) != csv_line(header).rstrip("\n"):
            raise BadInput("CSV '%s' has a different header (written by another version?); use a new file" % path)
    finally:
        os.close(fd)


def append_csv_row(path, row, header=CSV_HEADER):
    """One row (a dict or a list in header order) appended whole: O_APPEND, one os.write,
    under an exclusive flock; the header is written once, with the first row."""
    if isinstance(row, dict):
        unknown = set(row) - set(header)
        if unknown:
            raise ValueError("unknown CSV columns: %s" % ", ".join(sorted(unknown)))
        row = [row.get(c, "") for c in header]
    if len(row) != len(header):
        raise ValueError("CSV row has %d fields, header %d" % (len(row), len(header)))
    fields = ["" if v is None else str(v) for v in row]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = ""
        if os.fstat(fd).st_size == 0:
            data = csv_line(header)
        else:
            rfd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                first = _first_line(rfd)
            finally:
                os.close(rfd)
            if first != csv_line(header).rstrip("\n"):
                raise BadInput("CSV '%s' has a different header (written by another version?); use a new file" % path)
        data = (data + csv_line(fields)).encode()
        n = os.write(fd, data)
        if n != len(data):
            raise OSError("short write to CSV '%s'" % path)
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock


def git_sha():
    env = os.environ.get("ACTBENCH_GIT_SHA")
    if env:
        return env
    try:
        r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                           timeout=10)
        sha = r.stdout.strip()
        return sha if r.returncode == 0 and sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def utc_timestamp():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def summarize(values):
    """(median, min, max) of a list of floats, formatted; empty strings for no values."""
    if not values:
        return "", "", ""
    f = lambda v: "%.4f" % v
    return f(statistics.median(values)), f(min(values)), f(max(values))


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are BadInput: one line, exit 2 (argparse would print the usage too)."""
    def error(self, message):
        raise BadInput(message)


def build_parser():
    ap = OneLineParser(prog=PROG, add_help=True, description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="append one row per configuration to this CSV")
    ap.add_argument("--config", help="comma-separated list of %s (default: the paper's five; with "
                    "--check-against all six)" % ", ".join(ALL_CONFIGS))
    ap.add_argument("--model", default="22b", help="preset: %s" % ", ".join(MODELS))
    for name in ("hidden", "heads", "seq", "batch", "tp"):
        ap.add_argument("--" + name, type=int, help="override the preset's %s" % name)
    ap.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--check-against", metavar="DUMP_DIR", help="compare with a layer_run --dump folder (float64, cpu)")
    ap.add_argument("--rtol", type=float, default=1e-4, help="--check-against tolerance, relative to max|ref|")
    ap.add_argument("--self-check", action="store_true", help="recompute must not change outputs or gradients")
    ap.add_argument("--print-csv-header", action="store_true")
    return ap


def parse_args(argv):
    """Parses and validates everything that needs no torch; raises BadInput."""
    args = build_parser().parse_args(argv)
    if args.print_csv_header:
        return args
    modes = sum(bool(m) for m in (args.check_against, args.self_check))
    if modes > 1:
        raise BadInput("--check-against and --self-check are separate modes: give one")
    if args.model not in MODELS:
        raise BadInput("unknown model '%s' (expected %s)" % (args.model, ", ".join(MODELS)))
    preset = MODELS[args.model]
    for name in ("hidden", "heads", "seq", "batch", "tp"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    if args.dtype not in DTYPES:
        raise BadInput("unknown dtype '%s' (expected bf16, fp16 or fp32)" % args.dtype)
    if args.device not in ("cuda", "cpu"):
        raise BadInput("unknown device '%s' (expected cuda or cpu)" % args.device)
    if not (0.0 <= args.dropout < 1.0) or math.isnan(args.dropout):
        raise BadInput("--dropout must be in [0, 1)")
    if args.warmup < 0:
        raise BadInput("--warmup must be >= 0")
    if args.iters < 1:
        raise BadInput("--iters must be >= 1")
    if not args.rtol > 0:
        raise BadInput("--rtol must be > 0")
    if args.config is None:
        args.config = ",".join(ALL_CONFIGS if args.check_against else PAPER_CONFIGS)
    args.configs = parse_config_list(args.config)
    if args.check_against:
        if not os.path.isdir(args.check_against):
            raise BadInput("dump folder '%s' does not exist" % args.check_against)
        root = args.check_against
        for folder in [root] + [os.path.join(root, d) for d in sorted(os.listdir(root))]:
            try:
                with open(os.path.join(folder, "layer.json")) as f:
                    meta = json.load(f)
            except (OSError, ValueError):
                continue  # not a dump folder: run_check reports it
            dump_family(meta, folder)
        return args
    validate_layer(args.hidden, args.heads, args.seq, args.batch, args.tp, args.configs)
    if not args.self_check:
        if not args.csv:
            raise BadInput("--csv FILE is required (or --check-against DUMP_DIR, --self-check)")
        check_csv(args.csv)
    return args


# ----------------------------------------------------------------------------------------
# The layer in PyTorch (imported lazily: everything above runs without torch)
# ----------------------------------------------------------------------------------------

_TORCH = None


def import_torch():
    global _TORCH
    if _TORCH is None:
        try:
            import torch  # noqa: F401
            import torch.nn.functional  # noqa: F401
            import torch.utils.checkpoint  # noqa: F401
        except ImportError as e:
            raise NoTorch("PyTorch is not installed (import torch: %s); this peer needs torch" % e)
        _TORCH = _build_torch_impl(torch)
    return _TORCH


def _build_torch_impl(torch):
    F = torch.nn.functional
    checkpoint = torch.utils.checkpoint.checkpoint

    class ScatterSeq(torch.autograd.Function):
        """ḡ emulated on rank 0 of t: reduce-scatter = copy of the first s/t rows (forward),
        all-gather = t copies of the local shard (backward)."""

        @staticmethod
        def forward(ctx, x, t):
            ctx.t = t
            return x[: x.shape[0] // t].clone()

        @staticmethod
        def backward(ctx, g):
            return g.repeat(ctx.t, *([1] * (g.dim() - 1))), None

    class SPColumnLinear(torch.autograd.Function):
        """g + column-parallel linear under SP (Megatron): all-gather the local sequence shard,
        y = x W^T + b; save only the shard and all-gather it again in backward; the input
        gradient is reduce-scattered (emulated: the first s/t rows)."""

        @staticmethod
        def forward(ctx, x_local, weight, bias, t):
            ctx.t = t
            ctx.has_bias = bias is not None  # llama's linears have none
            ctx.save_for_backward(x_local, weight)
            total = x_local.repeat(t, 1, 1) if t > 1 else x_local
            return F.linear(total, weight, bias)

        @staticmethod
        def backward(ctx, g):
            x_local, weight = ctx.saved_tensors
            t = ctx.t
            total = x_local.repeat(t, 1, 1) if t > 1 else x_local
            g2 = g.reshape(-1, g.shape[-1])
            grad_total = g.matmul(weight)
            grad_w = g2.t().matmul(total.reshape(-1, total.shape[-1]))
            grad_b = g2.sum(0) if ctx.has_bias else None
            grad_x = grad_total[: grad_total.shape[0] // t].clone() if t > 1 else grad_total
            return grad_x, grad_w, grad_b, None

    native_dropout = getattr(torch, "native_dropout", None)

    def dropout(x, p):
        """F.dropout; on the cpu the op it calls on cuda (native_dropout: a 1-byte mask saved,
        where the cpu F.dropout would save a full-width noise tensor)."""
        if p <= 0:
            return x
        if x.is_cuda or native_dropout is None:
            return F.dropout(x, p, training=True)
        return native_dropout(x, p, True)[0]

    class SavedBytes:
        """Bytes of the distinct storages that autograd saves for backward (a pack hook), plus
        what a checkpoint holds as its inputs; parameters and constants excluded. The cpu's
        activation measure (no allocator statistics there)."""

        def __init__(self, exclude):
            self.exclude = {self._key(t) for t in exclude}
            self.seen = {}

        @staticmethod
        def _key(t):
            st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
            return st.data_ptr(), st.nbytes()

        def add(self, *tensors):
            for t in tensors:
                key = self._key(t)
                if key not in self.exclude:
                    self.seen[key] = key[1]

        def pack(self, t):
            self.add(t)
            return t

        def total(self):
            return sum(self.seen.values())

        def hooks(self):
            return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def core_attention(q, k, v, p, scale, causal):
        """q, k, v [b, a/t, s, d] -> context [b, a/t, s, d]: explicit scores, causal softmax,
        dropout on the probabilities, then .V (the paper's core attention, not fused)."""
        b, al, s, d = q.shape
        q2, k2, v2 = q.view(b * al, s, d), k.view(b * al, s, d), v.view(b * al, s, d)
        zero = torch.zeros((), dtype=q.dtype, device=q.device)  # beta = 0: never read
        scores = torch.baddbmm(zero, q2, k2.transpose(1, 2), beta=0.0, alpha=scale)
        scores.masked_fill_(causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = dropout(probs, p)
        return torch.bmm(probs, v2).view(b, al, s, d)

    class Layer:
        """Rank 0 of t: local parameter shards in P (name -> leaf tensor)."""

        def __init__(self, P, hidden, heads, seq, batch, tp, config, dropout_p, device):
            self.P = P
            self.h, self.s, self.b, self.t = hidden, seq, batch, tp
            self.al, self.d, self.hl = heads // tp, hidden // heads, hidden // tp
            self.recompute, self.sp = CONFIG_POLICY[config]
            self.p = dropout_p
            self.scale = 1.0 / math.sqrt(self.d)
            # constant like Megatron's cached mask: True above the diagonal
            self.causal = torch.ones(seq, seq, dtype=torch.bool, device=device).triu_(1)
            self.probe = None  # a SavedBytes while one forward is being measured on the cpu

        def column_linear(self, x, w, bias):  # f | g, then x W^T + b
            if self.sp:
                return SPColumnLinear.apply(x, w, bias, self.t)
            return F.linear(x, w, bias)

        def row_linear(self, x, w):  # x W^T, then f̄ (all-reduce: nothing) | ḡ
            out = F.linear(x, w)
            return ScatterSeq.apply(out, self.t) if self.sp and self.t > 1 else out

        def heads(self, qkv, part):  # [s, b, 3h/t] -> [b, a/t, s, d] (contiguous, as split_heads)
            s, b = qkv.shape[0], qkv.shape[1]
            x = qkv[..., part * self.hl:(part + 1) * self.hl].reshape(s, b, self.al, self.d)
            return x.permute(1, 2, 0, 3).contiguous()

        def attention(self, q, k, v):
            if self.recompute == "selective":
                if self.probe is not None:
                    self.probe.add(q, k, v)
                return checkpoint(core_attention, q, k, v, self.p, self.scale, self.causal, use_reentrant=False)
            return core_attention(q, k, v, self.p, self.scale, self.causal)

        def forward_impl(self, x):
            P, h = self.P, self.h
            ln1 = F.layer_norm(x, (h,), P["ln1.weight"], P["ln1.bias"], LN_EPS)
            qkv = self.column_linear(ln1, P["qkv.weight"], P["qkv.bias"])
            q, k, v = self.heads(qkv, 0), self.heads(qkv, 1), self.heads(qkv, 2)
            del qkv
            ctx = self.attention(q, k, v)
            del q, k, v
            s, b = ctx.shape[2], ctx.shape[0]
            ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, self.hl)  # merge heads
            attn_out = self.row_linear(ctx, P["proj.weight"])
            del ctx
            x1 = x + dropout(attn_out + P["proj.bias"], self.p)
            del attn_out
            ln2 = F.layer_norm(x1, (h,), P["ln2.weight"], P["ln2.bias"], LN_EPS)
            f1 = self.column_linear(ln2, P["fc1.weight"], P["fc1.bias"])
            del ln2
            g1 = F.gelu(f1, approximate="tanh")
            del f1
            mlp_out = self.row_linear(g1, P["fc2.weight"])
            del g1
            return x1 + dropout(mlp_out + P["fc2.bias"], self.p)

        def forward(self, x):
            if self.recompute == "full":
                if self.probe is not None:
                    self.probe.add(x)
                return checkpoint(self.forward_impl, x, use_reentrant=False)
            return self.forward_impl(x)

    class LlamaLayer(Layer):
        """The llama family on rank 0 of t (the math of tools/numpy_layer.py): RMSNorm,
        grouped-query attention (query head j reads key/value group j // (a/g)), rotate-half
        RoPE on q and k, SwiGLU (fc1 = gate; up stacked), no biases, no dropout."""

        def __init__(self, P, hidden, heads, kv_heads, ffn_hidden, seq, batch, tp, config, device, norm_eps,
                     rope_theta):
            super().__init__(P, hidden, heads, seq, batch, tp, config, 0.0, device)
            self.gl, self.fl = kv_heads // tp, ffn_hidden // tp
            self.group = heads // kv_heads  # query heads per key/value head
            self.eps = norm_eps
            d = self.d
            inv_freq = rope_theta ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
            angle = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
            dtype = P["qkv.weight"].dtype
            self.cos = torch.cos(angle).to(device=device, dtype=dtype)  # [s, d/2], constants
            self.sin = torch.sin(angle).to(device=device, dtype=dtype)

        def rmsnorm(self, x, w):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * w

        def rope(self, t):  # t [b, n, s, d]: pairs (i, i + d/2) rotated by their position's angle
            half = t.shape[-1] // 2
            lo, hi = t[..., :half], t[..., half:]
            return torch.cat([lo * self.cos - hi * self.sin, hi * self.cos + lo * self.sin], dim=-1)

        def split(self, qkv, first_head, n):  # [s, b, (a+2g)d/t] -> [b, n, s, d]
            s, b, d = qkv.shape[0], qkv.shape[1], self.d
            x = qkv[..., first_head * d:(first_head + n) * d].reshape(s, b, n, d)
            return x.permute(1, 2, 0, 3).contiguous()

        def forward_impl(self, x):
            P = self.P
            n1 = self.rmsnorm(x, P["ln1.weight"])
            qkv = self.column_linear(n1, P["qkv.weight"], None)
            q = self.rope(self.split(qkv, 0, self.al))
            k = self.rope(self.split(qkv, self.al, self.gl))
            v = self.split(qkv, self.al + self.gl, self.gl)
            del qkv
            if self.group > 1:  # each key/value group serves `group` query heads
                k, v = k.repeat_interleave(self.group, dim=1), v.repeat_interleave(self.group, dim=1)
            ctx = self.attention(q, k, v)
            del q, k, v
            s, b = ctx.shape[2], ctx.shape[0]
            ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, self.hl)
            x1 = x + self.row_linear(ctx, P["proj.weight"])
            del ctx
            n2 = self.rmsnorm(x1, P["ln2.weight"])
            f1 = self.column_linear(n2, P["fc1.weight"], None)
            del n2
            act = F.silu(f1[..., :self.fl]) * f1[..., self.fl:]
            del f1
            return x1 + self.row_linear(act, P["fc2.weight"])

    def init_params(hidden, tp, dtype, device, seed):
        """Rank 0's shards, uniform like layers/params.cpp (values differ: torch's generator):
        LayerNorm weights 1 + 0.1u, linear weights u/sqrt(fan_in), biases 0.1u, u in [-1, 1)."""
        gen = torch.Generator().manual_seed(seed)
        P = {}
        for name in PARAMS:
            shape = local_param_shape(name, hidden, tp)
            u = torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1
            if name in ("ln1.weight", "ln2.weight"):
                v = 1 + 0.1 * u
            elif name.endswith(".weight"):
                v = u / math.sqrt(canonical_param_shape(name, hidden)[1])
            else:
                v = 0.1 * u
            P[name] = v.to(device=device, dtype=dtype).requires_grad_()
        return P

    def uniform(shape, seed, dtype, device):
        gen = torch.Generator().manual_seed(seed)
        return (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1).to(device=device, dtype=dtype)

    class Impl:
        pass

    impl = Impl()
    impl.torch = torch
    impl.Layer = Layer
    impl.LlamaLayer = LlamaLayer
    impl.init_params = init_params
    impl.uniform = uniform
    impl.core_attention = core_attention
    impl.SavedBytes = SavedBytes
    impl.ScatterSeq = ScatterSeq
    impl.SPColumnLinear = SPColumnLinear
    return impl


TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def run_once(impl, layer, x_base, dy):
    """Forward and backward of one fresh input; returns (y, dx, {name: grad})."""
    for p in layer.P.values():
        p.grad = None
    x = x_base.clone().requires_grad_()
    y = layer.forward(x)
    impl.torch.autograd.backward(y, dy)
    return y.detach(), x.grad, {n: p.grad for n, p in layer.P.items()}


# ---- timing mode ------------------------------------------------------------------------

def is_oom(torch, e):
    """torch.cuda.OutOfMemoryError, or an error that says it ran out of memory."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def measure_config(impl, args, config, P, device):
    """Warm-up, then timed iterations of one configuration; returns a result dict."""
    torch = impl.torch
    dtype = getattr(torch, TORCH_DTYPE[args.dtype])
    cuda = device == "cuda"
    layer = impl.Layer(P, args.hidden, args.heads, args.seq, args.batch, args.tp, config, args.dropout, device)
    shp = layer_shapes(args.hidden, args.heads, args.seq, args.batch, args.tp, config)
    torch.manual_seed(args.seed)
    dy = impl.uniform(shp["x"], args.seed + 101, dtype, device)
    x_base = impl.uniform(shp["x"], args.seed + 100, dtype, device)
    fwd, bwd = [], []
    res = {"act_bytes_measured": "", "peak_allocated_bytes": "", "act_bytes_source": ""}
    if cuda:
        torch.cuda.synchronize()
    for it in range(args.warmup + args.iters):
        measure = cuda and it == args.warmup
        timed = it >= args.warmup
        for p in P.values():
            p.grad = None
        if measure:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            stats = torch.cuda.memory_stats()
            source = "requested" if "requested_bytes.all.current" in stats else "allocated"
            before = memory_now(torch, source)
        x = x_base.clone().requires_grad_()  # allocated inside the window: the layer keeps it
        probe = None
        if not cuda and it == 0:  # the saved bytes are the same every iteration
            probe = layer.probe = impl.SavedBytes(list(P.values()) + [layer.causal])
        if cuda:
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
        else:
            t0 = time.perf_counter()
        if probe is not None:
            with probe.hooks():
                y = layer.forward(x)
        else:
            y = layer.forward(x)
        if cuda:
            e1.record()
        else:
            t1 = time.perf_counter()
        if probe is not None:
            layer.probe = None
            res["act_bytes_measured"] = str(probe.total())
            res["act_bytes_source"] = "saved_tensors"
        if measure:
            out_bytes = y.numel() * y.element_size()
            if source == "allocated":
                out_bytes = -(-out_bytes // 512) * 512  # the allocator's 512-byte rounding
            res["act_bytes_measured"] = str(memory_now(torch, source) - before - out_bytes)
            res["act_bytes_source"] = source
        torch.autograd.backward(y, dy)
        del y
        if cuda:
            e2.record()
            torch.cuda.synchronize()
            if measure:
                res["peak_allocated_bytes"] = str(torch.cuda.max_memory_allocated())
            f_ms, b_ms = e0.elapsed_time(e1), e1.elapsed_time(e2)
        else:
            t2 = time.perf_counter()
            f_ms, b_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        del x
        if timed:
            fwd.append(f_ms)
            bwd.append(b_ms)
    for p in P.values():
        p.grad = None
    res["fwd"], res["bwd"] = fwd, bwd
    return res


def memory_now(torch, source):
    """The caching allocator's requested (or allocated) bytes now."""
    if source == "requested":
        return torch.cuda.memory_stats()["requested_bytes.all.current"]
    return torch.cuda.memory_allocated()


def run_timing(args):
    impl = import_torch()
    torch = impl.torch
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda but torch sees no CUDA device (torch %s, built for CUDA %s); use --device cpu"
                       % (torch.__version__, torch.version.cuda))
    device = args.device
    dtype = getattr(torch, TORCH_DTYPE[args.dtype])
    dev_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    command = " ".join(shlex.quote(a) for a in sys.argv)
    sha, host = git_sha(), socket.gethostname()
    status_code = 0
    P = impl.init_params(args.hidden, args.tp, dtype, device, args.seed)
    for config in args.configs:
        row = {
            "peer": "torch", "device": dev_name, "model": args.model, "hidden": args.hidden, "heads": args.heads,
            "seq": args.seq, "batch": args.batch, "tp": args.tp, "emulated": 1 if args.tp > 1 else 0,
            "config": config, "dtype": args.dtype, "dropout": "%g" % args.dropout, "iters": args.iters,
            "torch_version": torch.__version__, "cuda_version": torch.version.cuda or "none",
            "git_sha": sha, "hostname": host, "command": command,
        }
        try:
            r = measure_config(impl, args, config, P, device)
            fwd, bwd = r["fwd"], r["bwd"]
            tot = [a + b for a, b in zip(fwd, bwd)]
            row["fwd_ms"], row["fwd_ms_min"], row["fwd_ms_max"] = summarize(fwd)
            row["bwd_ms"], row["bwd_ms_min"], row["bwd_ms_max"] = summarize(bwd)
            row["total_ms"] = summarize(tot)[0]
            for k in ("act_bytes_measured", "peak_allocated_bytes", "act_bytes_source"):
                row[k] = r[k]
            row["status"] = "ok"
            msg = "%-13s ok    fwd %.3f ms  bwd %.3f ms" % (config, statistics.median(fwd), statistics.median(bwd))
            if r["act_bytes_measured"]:
                msg += "  act %.3f MiB (%s)" % (int(r["act_bytes_measured"]) / 2 ** 20, r["act_bytes_source"])
        except Exception as e:  # noqa: BLE001
            if not (device == "cuda" and is_oom(impl.torch, e)):
                raise
            row["status"] = "oom"
            msg = "%-13s oom   %s" % (config, str(e).splitlines()[0] if str(e) else "out of memory")
            status_code = 3
        if row.get("status") == "oom":  # outside the handler: its traceback no longer pins tensors
            for p in P.values():
                p.grad = None
            row["peak_allocated_bytes"] = str(torch.cuda.max_memory_allocated())
            torch.cuda.empty_cache()
        row["timestamp"] = utc_timestamp()
        append_csv_row(args.csv, row)
        print(msg, flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return status_code


# ---- check against a layer_run --dump ---------------------------------------------------

# The two layers this peer builds, as layer.json spells their options (the rest are checked apart).
PEER_FAMILIES = {
    "gpt": {"normalization": "LayerNorm", "activation": "gelu", "add_bias_linear": True, "qk_layernorm": False,
            "position_embedding": "none"},
    "llama": {"normalization": "RMSNorm", "activation": "swiglu", "add_bias_linear": False, "add_qkv_bias": False,
              "qk_layernorm": False, "position_embedding": "rope", "rotary_percent": 1.0},
}


def dump_family(meta, folder):
    """'gpt' or 'llama': the peer layer that computes the dump's layer (without dropout); else BadInput."""
    if not isinstance(meta, dict):
        raise BadInput("the dump in '%s' has a layer.json that is not an object" % folder)
    for key in ("attention_dropout", "hidden_dropout"):
        if meta.get(key, 0) != 0:
            raise BadInput("the dump in '%s' has %s %s; --check-against needs a dump made with --dropout 0"
                           % (folder, key, meta[key]))
    # Both families' heads are hidden / heads wide (a dump before the kv_channels key has those).
    heads_of_h_over_a = "kv_channels" not in meta or meta["kv_channels"] * meta.get("heads", 0) == meta.get("hidden")
    for family, options in PEER_FAMILIES.items():
        if heads_of_h_over_a and all(meta.get(k) == v for k, v in options.items()):
            if family == "gpt" and (meta.get("kv_heads") != meta.get("heads")
                                    or meta.get("ffn_hidden") != 4 * meta.get("hidden", 0)):
                break
            return family
    raise BadInput("the dump in '%s' is a layer this peer does not build (it has the gpt and llama layers only: "
                   "%s)" % (folder, ", ".join("%s %s" % (k, meta.get(k)) for k in PEER_FAMILIES["gpt"])))


def _dump_folders(root):
    if os.path.isfile(os.path.join(root, "layer.json")):
        return [root]
    subs = sorted(os.path.join(root, d) for d in os.listdir(root)
                  if os.path.isfile(os.path.join(root, d, "layer.json")))
    if not subs:
        raise BadInput("'%s' is not a layer_run --dump folder (no layer.json)" % root)
    return subs


def check_dump(impl, folder, configs, rtol):
    """[(config, name, max_abs_err, max_abs_ref, ok)] for one dump folder."""
    try:
        import numpy as np
    except ImportError:
        raise BadInput("--check-against needs numpy")
    torch = impl.torch
    with open(os.path.join(folder, "layer.json")) as f:
        meta = json.load(f)
    arch = dump_family(meta, folder)

    def load(name):
        path = os.path.join(folder, name + ".npy")
        if not os.path.isfile(path):
            raise BadInput("dump '%s' has no %s.npy" % (folder, name))
        return torch.from_numpy(np.load(path).astype(np.float64))

    x, dy = load("x"), load("dy")
    s, b, h = x.shape
    try:
        heads = int(meta["heads"])
        if arch == "llama":
            kv_heads, ffn_hidden = int(meta["kv_heads"]), int(meta["ffn_hidden"])
            norm_eps, rope_theta = float(meta["norm_epsilon"]), float(meta["rotary_base"])
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput("dump '%s': layer.json lacks a valid %s" % (folder, e))
    if arch == "gpt":
        eps = float(meta.get("norm_epsilon", LN_EPS))
        if abs(eps - LN_EPS) > 1e-12:
            raise BadInput("the dump's LayerNorm eps is %g; this layer uses %g" % (eps, LN_EPS))
    try:
        validate_layer(h, heads, s, b, 1, configs)
        if arch == "llama" and (kv_heads < 1 or heads % kv_heads or ffn_hidden < 1 or (h // heads) % 2):
            raise BadInput("heads %d, kv_heads %d, ffn_hidden %d, head dim %d: need g | a, F >= 1 and an even head"
                           " dim" % (heads, kv_heads, ffn_hidden, h // heads))
    except BadInput as e:
        raise BadInput("dump '%s': %s" % (folder, e))
    names = LLAMA_PARAMS if arch == "llama" else PARAMS
    ref = {n: load(n) for n in ["y", "dx"] + names + ["grad." + n for n in names]}
    for n in names:
        want = (llama_param_shape(n, h, heads, kv_heads, ffn_hidden) if arch == "llama"
                else canonical_param_shape(n, h))
        if tuple(ref[n].shape) != want:
            raise BadInput("dump '%s': %s is %s, expected %s" % (folder, n, tuple(ref[n].shape), want))
    results = []
    for config in configs:
        P = {n: ref[n].clone().requires_grad_() for n in names}
        if arch == "llama":
            layer = impl.LlamaLayer(P, h, heads, kv_heads, ffn_hidden, s, b, 1, config, "cpu", norm_eps, rope_theta)
        else:
            layer = impl.Layer(P, h, heads, s, b, 1, config, 0.0, "cpu")
        y, dx, G = run_once(impl, layer, x, dy)
        for name, got in [("y", y), ("dx", dx)] + [("grad." + n, G[n]) for n in names]:
            want = ref[name]
            if got is None or tuple(got.shape) != tuple(want.shape):
                err = float("inf")
            else:
                err = float((got.detach() - want).abs().max())
            scale = float(want.abs().max()) or 1.0
            results.append((config, name, err, scale, err <= rtol * scale + 1e-6))
    return results


def run_check(args):
    impl = import_torch()
    impl.torch.set_default_dtype(impl.torch.float64)
    bad = total = 0
    for folder in _dump_folders(args.check_against):
        print("dump %s" % folder)
        for config, name, err, scale, ok in check_dump(impl, folder, args.configs, args.rtol):
            print("  %-13s %-18s max|err| %.3e  max|ref| %.3e  %s" % (config, name, err, scale, "ok" if ok else "WRONG"))
            bad += not ok
            total += 1
    print("%d passed, %d failed" % (total - bad, bad))
    return 1 if bad else 0


# ---- self-check: recompute changes nothing ----------------------------------------------

def run_self_check(args):
    impl = import_torch()
    torch = impl.torch
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda but torch sees no CUDA device; use --device cpu")
    device = args.device
    dtype = torch.float64 if device == "cpu" else torch.float32
    results = {}
    for config in args.configs:
        P = impl.init_params(args.hidden, args.tp, dtype, device, args.seed)
        layer = impl.Layer(P, args.hidden, args.heads, args.seq, args.batch, args.tp, config, args.dropout, device)
        shp = layer_shapes(args.hidden, args.heads, args.seq, args.batch, args.tp, config)
        x = impl.uniform(shp["x"], args.seed + 100, dtype, device)
        dy = impl.uniform(shp["x"], args.seed + 101, dtype, device)
        torch.manual_seed(args.seed)  # the same dropout masks for every configuration
        y, dx, G = run_once(impl, layer, x, dy)
        results[config] = dict(y=y, dx=dx, **{"grad." + n: g for n, g in G.items()})
        finite = all(bool(torch.isfinite(v).all()) for v in results[config].values())
        print("%-13s ran: y %s, all outputs and gradients finite: %s" % (config, tuple(y.shape), finite))
        if not finite:
            return 1
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    bad = total = 0
    for config in args.configs:
        ref_config = "sp" if CONFIG_POLICY[config][1] else "baseline"
        if config == ref_config or ref_config not in results:
            continue
        for name, got in results[config].items():
            want = results[ref_config][name]
            err = float((got - want).abs().max())
            scale = float(want.abs().max()) or 1.0
            ok = err <= tol * scale
            total += 1
            bad += not ok
            if not ok or name in ("y", "dx"):
                print("  %-13s vs %-8s %-18s max|err| %.3e  %s" % (config, ref_config, name, err, "ok" if ok else "WRONG"))
    print("%d passed, %d failed" % (total - bad, bad))
    return 1 if bad else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        if args.print_csv_header:
            print(csv_line(CSV_HEADER), end="")
            return 0
        if args.check_against:
            return run_check(args)
        if args.self_check:
            return run_self_check(args)
        return run_timing(args)
    except BadInput as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2
    except OSError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 1
    except RuntimeError as e:  # a torch failure (e.g. an op this torch lacks for a dtype on the cpu)
        traceback.print_exc()
        print("%s: error: %s" % (PROG, str(e).strip().splitlines()[0] if str(e).strip() else repr(e)),
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
