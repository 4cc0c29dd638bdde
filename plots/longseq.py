#!/usr/bin/env python3
"""Beyond the paper: long sequences, the paper's attention against fused (FlashAttention-
style) attention. Left: activation bytes per layer of the 22B layer (t = 8, b = 1) from 1k
to 128k tokens (longseq.csv from `theory --out`; measured points from layer_run rows at
that shape, e.g. `sweep.py longseq`). Right: the first pipeline stage's memory
(activations + one layer's recompute working set + parameters and optimizer state)
against the 80 GB and 141 GB lines, which shows where each configuration stops fitting."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_COLOR, CONFIG_LABEL, GIB, Skip, num  # noqa: E402

SHOWN = ["baseline", "sp", "selective+sp", "full"]
STYLE = {"unfused": "-", "fused": "--"}


def measured(ctx, h, a, t):
    pts = {}
    for r in ctx.all_ok_runs():
        if (num(r.get("hidden")), num(r.get("heads")), num(r.get("tp")), num(r.get("batch"))) != (h, a, t, 1):
            continue
        if r.get("dtype") not in ("bf16", "fp16") or num(r.get("act_bytes")) is None:
            continue
        if (num(r.get("cp")) or 1) > 1:  # context-parallel rows are longcontext.py's
            continue
        key = (r.get("attention") or "unfused", r["config"])
        pts.setdefault(key, {})[num(r["seq"])] = num(r["act_bytes"])
    return {k: sorted(v.items()) for k, v in pts.items()}


def make(ctx):
    rows = ctx.theory.table("longseq.csv")
    if not rows:
        raise Skip("longseq.csv is empty")
    h, a, t = num(rows[0]["hidden"]), num(rows[0]["heads"]), num(rows[0]["tp"])
    curves = {}
    for r in rows:
        curves.setdefault((r["attention"], r["config"]), []).append(r)
    pts = measured(ctx, h, a, t)
    fig, left = common.figure(2.6)
    fig_fit, right = common.figure(2.6)
    for (attention, config), rs in sorted(curves.items()):
        if config not in SHOWN:
            continue
        xs = [num(r["seq"]) for r in rs]
        kw = dict(color=CONFIG_COLOR[config], ls=STYLE[attention], lw=1.0)
        label = f"{CONFIG_LABEL[config]}, {attention}"
        left.plot(xs, [num(r["act_bytes_per_layer"]) / GIB for r in rs], label=label, **kw)
        right.plot(xs, [num(r["total_gib"]) for r in rs], **kw)
        if (attention, config) in pts:
            p = pts[(attention, config)]
            left.plot([s for s, _ in p], [v / GIB for _, v in p], "D" if attention == "unfused" else "o",
                      color=CONFIG_COLOR[config], mec="black", mew=0.5, markersize=3)
    for gib, label in ((80e9 / GIB, "80 GB (A100/H100)"), (141e9 / GIB, "141 GB (H200)")):
        right.axhline(gib, color="black", lw=0.6, ls=":")
        right.annotate(label, (131072, gib), xytext=(-2, 2), textcoords="offset points", fontsize=5.5, ha="right")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length s (tokens)")
    left.set_ylabel("activations per layer (GiB)")
    right.set_ylabel("first-stage memory per GPU (GiB)")
    left.set_title(f"22B layer (h={h:g}, a={a:g}), t={t:g}, b=1, bf16; markers: measured", fontsize=6)
    right.set_title("22B first stage (48 layers, p=1): where each stops fitting", fontsize=6)
    left.legend(fontsize=5, ncol=2, loc="upper left")
    right.legend(*left.get_legend_handles_labels(), fontsize=5, ncol=2, loc="upper left")
    out = [common.save(fig, ctx.out_dir, "longseq_memory"), common.save(fig_fit, ctx.out_dir, "longseq_fit")]

    header = ["seq", "config", "unfused GiB/layer", "fused GiB/layer", "unfused fits 80 GB", "fused fits 80 GB",
              "measured unfused", "measured fused"]
    table = []
    for config in common.CONFIGS:
        un, fu = curves.get(("unfused", config), []), curves.get(("fused", config), [])
        mu, mf = dict(pts.get(("unfused", config), [])), dict(pts.get(("fused", config), []))
        for ru, rf in zip(un, fu):
            s = num(ru["seq"])
            table.append([f"{s:.0f}", config, f"{num(ru['act_bytes_per_layer']) / GIB:.3f}",
                          f"{num(rf['act_bytes_per_layer']) / GIB:.3f}", "yes" if ru["fits_h100_80gb"] == "1" else "no",
                          "yes" if rf["fits_h100_80gb"] == "1" else "no",
                          f"{mu[s] / GIB:.3f}" if s in mu else "", f"{mf[s] / GIB:.3f}" if s in mf else ""])
    out.append(common.write_text(ctx.out_dir, "longseq_memory.md",
                                 "# Long sequences: the paper's attention vs fused attention (22B, t = 8, b = 1)\n\n"
                                 + common.markdown_table(header, table)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
