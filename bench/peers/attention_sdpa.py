#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention, forward and backward, at bench_kernels' attention shape.

    attention_sdpa.py --csv FILE [--seq 2048,8192,32768] [--batch 4] [--heads 8] [--head-dim 96]
                      [--dtype bf16|fp16|fp32] [--dropout 0.1] [--warmup 3] [--iters 20]
                      [--backend flash|efficient|math|cudnn] [--device cuda|cpu]
    attention_sdpa.py --print-csv-header

The peer of bench_kernels' attention_fused_fwd / attention_fused_bwd (issue 7): q, k, v
[b, heads, s, d] (the 22B layer's rank 0 of t = 8 by default: b 4, 8 heads of 96), causal,
dropout on the probabilities, the SDPA backend forced with torch.nn.attention.sdpa_kernel (flash
by default). One CSV row per sequence length. A point the backend cannot run (a head size, dtype
or device it does not support) is a row with status=unsupported and PyTorch's reasons; a point
that runs out of memory a row with status=oom.

Measurement per point: an untimed pass that measures memory, --warmup untimed iterations, then
--iters timed ones: torch.cuda.Event on the current stream around the forward and around the
backward (host clock on the cpu), one synchronize per iteration, median / min / max. The inputs
exist before the forward; gradients are reset to None every iteration (no accumulation).
  fwd_flops, bwd_flops   the FlashAttention convention bench_kernels uses: 4*b*heads*s^2*d / 2
                         (causal), backward 2.5x; fwd_tflops / bwd_tflops = those / median time
  saved_bytes            bytes of the distinct storages autograd saves for backward (q, k, v,
                         the output, the log-sum-exp, the dropout RNG state; parameters: none)
  fwd_delta_bytes        cuda: the caching allocator's bytes after the forward minus before it
                         (the output included; requested bytes where the statistic exists, else
                         allocated, see mem_source), fwd_peak_bytes its peak above the start;
                         bwd_peak_bytes the backward's peak above its start
Exit status: 0 every point ran or was unsupported; 2 bad input (one line on stderr, no row; also
"PyTorch is not installed" and --device cuda without a GPU); 3 a point ran out of memory (its
row written); 1 anything else. Only the standard library and torch.
"""
import math
import os
import shlex
import socket
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch_layer  # noqa: E402  (the CSV writer and provenance helpers; imports no torch)
from torch_layer import BadInput, NoTorch  # noqa: E402

PROG = "attention_sdpa.py"
BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH",
            "cudnn": "CUDNN_ATTENTION"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

CSV_HEADER = [
    "peer", "sdpa_backend", "device", "seq", "batch", "heads", "head_dim", "dtype", "dropout", "causal",
    "warmup", "iters", "fwd_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms", "bwd_ms_min", "bwd_ms_max", "total_ms",
    "fwd_flops", "bwd_flops", "fwd_tflops", "bwd_tflops", "saved_bytes", "fwd_delta_bytes", "fwd_peak_bytes",
    "bwd_peak_bytes", "mem_source", "status", "reason", "torch_version", "cuda_version", "git_sha", "hostname",
    "timestamp", "command"]


# ----------------------------------------------------------------------------------------
# Pure Python (testable without torch)
# ----------------------------------------------------------------------------------------

def parse_seq_list(text):
    """'2048,8192' -> [2048, 8192] (order kept, duplicates dropped); BadInput otherwise."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise BadInput("--seq: '%s' is not an integer" % part)
        if v < 1:
            raise BadInput("--seq: %d must be >= 1" % v)
        if v not in out:
            out.append(v)
    if not out:
        raise BadInput("--seq needs at least one sequence length")
    return out


def causal_flops(batch, heads, seq, head_dim):
    """(forward, backward) FLOPs, FlashAttention's convention: QK^T and P.V over half the
    score matrix; the backward 2.5x the forward."""
    fwd = 4.0 * batch * heads * seq * seq * head_dim / 2.0
    return fwd, 2.5 * fwd


def tflops(flops, ms):
    return "" if not ms else "%.3f" % (flops / (float(ms) * 1e-3) / 1e12)


def build_parser():
    ap = torch_layer.OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="append one row per sequence length to this CSV")
    ap.add_argument("--seq", default="2048,8192,32768", help="comma-separated sequence lengths")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=96)
    ap.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backend", default="flash", help="SDPA backend forced: " + ", ".join(BACKENDS))
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--print-csv-header", action="store_true")
    return ap


def parse_args(argv):
    """Parses and validates everything that needs no torch; raises BadInput."""
    args = build_parser().parse_args(argv)
    if args.print_csv_header:
        return args
    args.seqs = parse_seq_list(args.seq)
    for name in ("batch", "heads", "head_dim"):
        if getattr(args, name) < 1:
            raise BadInput("--%s must be >= 1" % name.replace("_", "-"))
    if args.dtype not in DTYPES:
        raise BadInput("unknown dtype '%s' (expected bf16, fp16 or fp32)" % args.dtype)
    if args.backend not in BACKENDS:
        raise BadInput("unknown backend '%s' (expected %s)" % (args.backend, ", ".join(BACKENDS)))
    if args.device not in ("cuda", "cpu"):
        raise BadInput("unknown device '%s' (expected cuda or cpu)" % args.device)
    if math.isnan(args.dropout) or not (0.0 <= args.dropout < 1.0):
        raise BadInput("--dropout must be in [0, 1)")
    if args.warmup < 0:
        raise BadInput("--warmup must be >= 0")
    if args.iters < 1:
        raise BadInput("--iters must be >= 1")
    if not args.csv:
        raise BadInput("--csv FILE is required")
    torch_layer.check_csv(args.csv, CSV_HEADER)
    return args


def one_line(text, limit=400):
    """A message as one CSV-friendly line."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------

def import_torch():
    try:
        import torch  # noqa: F401
        import torch.nn.functional  # noqa: F401
    except ImportError as e:
        raise NoTorch("PyTorch is not installed (import torch: %s); this peer needs torch" % e)
    return torch


def backend_context(torch, name):
    """A context manager that lets SDPA use only the named backend."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        raise BadInput("this PyTorch (%s) has no torch.nn.attention.sdpa_kernel (PyTorch >= 2.3 needed)"
                       % torch.__version__)
    member = getattr(SDPBackend, BACKENDS[name], None)
    if member is None:
        raise BadInput("this PyTorch (%s) has no SDPA backend '%s'" % (torch.__version__, name))
    return sdpa_kernel([member])


class Unsupported(Exception):
    """The forced backend cannot run this point (PyTorch's reasons in the message)."""


def _is_unsupported(e):
    text = str(e)
    return "No available kernel" in text or "not supported" in text.lower() or "no kernel" in text.lower()


class _SavedBytes:
    """Bytes of the distinct storages autograd saves for backward (a pack hook)."""

    def __init__(self, torch):
        self.torch = torch
        self.seen = {}

    def pack(self, t):
        try:
            st = t.untyped_storage()
            self.seen[(st.data_ptr(), t.device.type)] = st.nbytes()
        except (RuntimeError, AttributeError):  # a tensor without storage (e.g. a wrapper): not counted
            pass
        return t

    def hooks(self):
        return self.torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def total(self):
        return sum(self.seen.values())


def measure_point(torch, args, seq):
    """Runs one sequence length; returns a dict of result columns. Raises Unsupported,
    or the OOM / other exception of the run."""
    F = torch.nn.functional
    cuda = args.device == "cuda"
    dtype = getattr(torch, DTYPES[args.dtype])
    shape = (args.batch, args.heads, seq, args.head_dim)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)

    def rand():
        return (torch.rand(shape, generator=gen, device=args.device, dtype=torch.float32) * 2 - 1).to(dtype)

    q, k, v, dout = rand(), rand(), rand(), rand()
    for t in (q, k, v):
        t.requires_grad_()

    def forward():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=args.dropout, is_causal=True)

    res = {"fwd_delta_bytes": "", "fwd_peak_bytes": "", "bwd_peak_bytes": "", "mem_source": ""}
    with backend_context(torch, args.backend):
        # The memory pass: also where an unsupported point shows itself (with PyTorch's reasons).
        probe = _SavedBytes(torch)
        source = None
        if cuda:
            torch.cuda.synchronize()
            source = "requested" if "requested_bytes.all.current" in torch.cuda.memory_stats() else "allocated"
            torch.cuda.reset_peak_memory_stats()
            before = torch_layer.memory_now(torch, source)
            peak_before = torch.cuda.max_memory_allocated()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with probe.hooks():
                    out = forward()
            except RuntimeError as e:
                if torch_layer.is_oom(torch, e) or not _is_unsupported(e):
                    raise
                reasons = [one_line(w.message) for w in caught]
                raise Unsupported("; ".join(reasons + [one_line(str(e).splitlines()[0] if str(e) else repr(e))]))
        res["saved_bytes"] = str(probe.total())
        if cuda:
            torch.cuda.synchronize()
            after = torch_layer.memory_now(torch, source)
            res["fwd_delta_bytes"] = str(after - before)
            # max_memory_allocated is allocated bytes; its rise above the start is the forward's peak
            res["fwd_peak_bytes"] = str(torch.cuda.max_memory_allocated() - peak_before)
            res["mem_source"] = source
            torch.cuda.reset_peak_memory_stats()
            bwd_start = torch.cuda.memory_allocated()
        out.backward(dout)
        if cuda:
            torch.cuda.synchronize()
            res["bwd_peak_bytes"] = str(torch.cuda.max_memory_allocated() - bwd_start)
        else:
            res["mem_source"] = "saved_tensors"
        del out
        fwd, bwd = [], []
        for it in range(args.warmup + args.iters):
            q.grad = k.grad = v.grad = None
            if cuda:
                e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                e0.record()
            else:
                t0 = time.perf_counter()
            out = forward()
            if cuda:
                e1.record()
            else:
                t1 = time.perf_counter()
            out.backward(dout)
            if cuda:
                e2.record()
                torch.cuda.synchronize()
                f_ms, b_ms = e0.elapsed_time(e1), e1.elapsed_time(e2)
            else:
                t2 = time.perf_counter()
                f_ms, b_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
            del out
            if it >= args.warmup:
                fwd.append(f_ms)
                bwd.append(b_ms)
    q.grad = k.grad = v.grad = None
    res["fwd"], res["bwd"] = fwd, bwd
    return res


def run(args):
    torch = import_torch()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda but torch sees no CUDA device (torch %s, built for CUDA %s); use --device cpu"
                       % (torch.__version__, torch.version.cuda))
    backend_context(torch, args.backend)  # a PyTorch without the API or the backend: bad input, no row
    dev_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    command = " ".join(shlex.quote(a) for a in [sys.argv[0] or PROG] + list(args.argv))
    sha, host = torch_layer.git_sha(), socket.gethostname()
    status_code = 0
    for seq in args.seqs:
        fwd_flops, bwd_flops = causal_flops(args.batch, args.heads, seq, args.head_dim)
        row = {
            "peer": "sdpa", "sdpa_backend": args.backend, "device": dev_name, "seq": seq, "batch": args.batch,
            "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype, "dropout": "%g" % args.dropout,
            "causal": 1, "warmup": args.warmup, "iters": args.iters, "fwd_flops": "%.0f" % fwd_flops,
            "bwd_flops": "%.0f" % bwd_flops, "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda or "none", "git_sha": sha, "hostname": host, "command": command,
        }
        oom = False
        try:
            r = measure_point(torch, args, seq)
            row["fwd_ms"], row["fwd_ms_min"], row["fwd_ms_max"] = torch_layer.summarize(r["fwd"])
            row["bwd_ms"], row["bwd_ms_min"], row["bwd_ms_max"] = torch_layer.summarize(r["bwd"])
            row["total_ms"] = torch_layer.summarize([a + b for a, b in zip(r["fwd"], r["bwd"])])[0]
            row["fwd_tflops"] = tflops(fwd_flops, row["fwd_ms"])
            row["bwd_tflops"] = tflops(bwd_flops, row["bwd_ms"])
            for key in ("saved_bytes", "fwd_delta_bytes", "fwd_peak_bytes", "bwd_peak_bytes", "mem_source"):
                row[key] = r[key]
            row["status"] = "ok"
            msg = "s=%-6d ok           fwd %.3f ms (%s TFLOP/s)  bwd %.3f ms (%s TFLOP/s)  saved %.1f MiB" % (
                seq, float(row["fwd_ms"]), row["fwd_tflops"], float(row["bwd_ms"]), row["bwd_tflops"],
                int(r["saved_bytes"]) / 2 ** 20)
        except Unsupported as e:
            row["status"], row["reason"] = "unsupported", one_line(e)
            msg = "s=%-6d unsupported  %s" % (seq, row["reason"])
        except Exception as e:  # noqa: BLE001
            if not (args.device == "cuda" and torch_layer.is_oom(torch, e)):
                raise
            row["status"], row["reason"] = "oom", one_line(str(e).splitlines()[0] if str(e) else "out of memory")
            msg = "s=%-6d oom          %s" % (seq, row["reason"])
            oom = True
        if oom:
            status_code = 3
        row["timestamp"] = torch_layer.utc_timestamp()
        torch_layer.append_csv_row(args.csv, row, CSV_HEADER)
        print(msg, flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return status_code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        if args.print_csv_header:
            print(torch_layer.csv_line(CSV_HEADER), end="")
            return 0
        args.argv = argv
        return run(args)
    except BadInput as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2
    except OSError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 1
    except RuntimeError as e:  # a torch failure
        traceback.print_exc()
        print("%s: error: %s" % (PROG, one_line(str(e).strip().splitlines()[0] if str(e).strip() else repr(e))),
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
