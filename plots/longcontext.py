#!/usr/bin/env python3
"""Beyond the paper: long context with context parallelism. The 22B model (t = 8, b = 1,
fused attention, the ring's p2p exchange) from 32k to 1M tokens on C = 1..32 context-parallel
ranks. Left: the activation bytes one layer keeps per GPU (longcontext.csv from `theory
--out`; markers: layer_run rows at that shape with their cp, e.g. `sweep.py longcontext`).
Right: the whole training step's peak per GPU (weights, gradients, the optimizer sharded over
C, activations, loss and working sets) for TP+SP+selective and full+SP, against 80 GB and
141 GB: where each (configuration, C) stops fitting. The table lists the longest sequence
that fits 80 GB for each."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_LABEL, GIB, Skip, num  # noqa: E402

LEFT_CONFIG = "selective+sp"
RIGHT_CONFIGS = {"selective+sp": "-", "full+sp": "--"}


def cp_of(row):
    return int(num(row.get("cp")) or 1)


def measured(ctx, h, a, t):
    """{(config, C): [(seq, act_bytes)]} of fused layer_run rows at the table's shape."""
    pts = {}
    for r in ctx.all_ok_runs():
        if (num(r.get("hidden")), num(r.get("heads")), num(r.get("tp")), num(r.get("batch"))) != (h, a, t, 1):
            continue
        if r.get("attention") != "fused" or r.get("dtype") not in ("bf16", "fp16") or num(r.get("act_bytes")) is None:
            continue
        if cp_of(r) > 1 and r.get("cp_comm_type") not in ("p2p", None, ""):
            continue
        pts.setdefault((r["config"], cp_of(r)), {})[num(r["seq"])] = num(r["act_bytes"])
    return {k: sorted(v.items()) for k, v in pts.items()}


def colors(cps):
    cmap = common.plt.get_cmap("viridis")
    return {c: cmap(i / max(1, len(cps) - 1)) for i, c in enumerate(cps)}


def make(ctx):
    rows = ctx.theory.table("longcontext.csv")
    if not rows:
        raise Skip("longcontext.csv is empty")
    h, a, t = num(rows[0]["hidden"]), num(rows[0]["heads"]), num(rows[0]["tp"])
    curves = {}
    for r in rows:
        curves.setdefault((r["config"], cp_of(r)), []).append(r)
    cps = sorted({c for _, c in curves})
    color = colors(cps)
    shortest = min(num(r["seq"]) for r in rows)
    pts = {k: [(s, v) for s, v in p if s >= shortest] for k, p in measured(ctx, h, a, t).items()}
    fig, left = common.figure(2.6)
    fig_fit, right = common.figure(2.6)
    for (config, C), rs in sorted(curves.items()):
        xs = [num(r["seq"]) for r in rs]
        if config == LEFT_CONFIG:
            left.plot(xs, [num(r["act_bytes_per_layer"]) / GIB for r in rs], color=color[C], lw=1.0, label=f"C={C}")
            p = pts.get((config, C), [])
            if p:
                left.plot([s for s, _ in p], [v / GIB for _, v in p], "o", color=color[C], mec="black", mew=0.5,
                          markersize=3)
        if config in RIGHT_CONFIGS:
            right.plot(xs, [num(r["peak_gib"]) for r in rs], color=color[C], ls=RIGHT_CONFIGS[config], lw=1.0,
                       label=f"{CONFIG_LABEL[config]}, C={C}")
    top = max(num(r["seq"]) for r in rows)
    for gib, label in ((80e9 / GIB, "80 GB (H100)"), (141e9 / GIB, "141 GB (H200)")):
        right.axhline(gib, color="black", lw=0.6, ls=":")
        right.annotate(label, (top, gib), xytext=(-2, 2), textcoords="offset points", fontsize=5.5, ha="right")
    seqs = sorted({num(r["seq"]) for r in rows})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(seqs, [f"{s / 1024:.0f}k" if s < 1 << 20 else f"{s / (1 << 20):.0f}M" for s in seqs])
        ax.set_xlabel("sequence length s (tokens)")
    left.set_ylabel("activations per layer per GPU (GiB)")
    right.set_ylabel("training-step peak per GPU (GiB)")
    left.set_title(f"22B layer (h={h:g}, a={a:g}), t={t:g}, {CONFIG_LABEL[LEFT_CONFIG]}, fused, ring; "
                   "markers: measured", fontsize=6)
    right.set_title("22B step (48 layers, p=1, distributed optimizer): solid selective, dashed full", fontsize=6)
    left.legend(fontsize=5, ncol=2, loc="upper left")
    right.legend(*left.get_legend_handles_labels(), fontsize=5, ncol=2, loc="upper left")
    out = [common.save(fig, ctx.out_dir, "longcontext_memory"), common.save(fig_fit, ctx.out_dir, "longcontext_fit")]
    out.append(common.write_text(ctx.out_dir, "longcontext_fit.md", fit_table(curves, cps)))
    return out


def fit_table(curves, cps):
    """The longest sequence each (configuration, C) fits in 80 GB, from the step model."""
    configs = [c for c in common.CONFIGS if any(k[0] == c for k in curves)]
    header = ["config"] + [f"C={c}" for c in cps]
    table = []
    for config in configs:
        line = [CONFIG_LABEL[config]]
        for C in cps:
            fits = [num(r["seq"]) for r in curves.get((config, C), []) if r["fits_h100_80gb"] == "1"]
            line.append(f"{max(fits) / 1024:.0f}k" if fits else "-")
        table.append(line)
    return ("# Long context: the longest sequence whose training step fits an 80 GB GPU (22B, t = 8, b = 1, "
            "fused attention, ring p2p, distributed optimizer)\n\n" + common.markdown_table(header, table))


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
