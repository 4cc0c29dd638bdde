#!/usr/bin/env python3
"""Activation memory against sequence length: Table 2's curves per configuration
(seqlen.csv from `theory --out`, one sequence per microbatch) with measured points from
layer_run rows of the same layer width and t (act_bytes / batch), and the two terms of
Table 2 for GPT-3 175B: the linear 34·sbh part and the attention 5·as²b part, which
cross near s ≈ 870."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_COLOR, CONFIG_LABEL, CONFIGS, GIB, MODEL_LABEL, Skip, num  # noqa: E402


def curves(rows, model):
    out = {}
    for r in rows:
        if r["model"] == model:
            out.setdefault(r["config"], []).append((num(r["seq"]), r))
    for v in out.values():
        v.sort(key=lambda p: p[0])
    return out


def measured_points(ctx, shape):
    """{config: [(seq, bytes per sequence)]} of ok rows at this width, heads and t."""
    h, a, t = shape
    pts = {}
    for r in ctx.ok_runs():
        if (num(r.get("hidden")), num(r.get("heads")), num(r.get("tp"))) != (h, a, t):
            continue
        act, b, s = num(r.get("act_bytes")), num(r.get("batch")), num(r.get("seq"))
        if act is None or not b or not s or r.get("dtype") not in ("bf16", "fp16"):
            continue
        pts.setdefault(r["config"], {})[s] = act / b  # bytes are linear in b
    return {c: sorted(v.items()) for c, v in pts.items()}


def make(ctx):
    rows = ctx.theory.table("seqlen.csv")
    if not rows:
        raise Skip("seqlen.csv is empty")
    out = []
    # 1) configurations against s, at the width the measurements used (22B when none).
    shapes = {r["model"]: (num(r["hidden"]), num(r["heads"]), num(r["tp"])) for r in rows}
    counts = {m: sum(len(v) for v in measured_points(ctx, shape).values()) for m, shape in shapes.items()}
    model = max(counts, key=lambda m: (counts[m], m == "22b")) if any(counts.values()) else "22b"
    if model not in shapes:
        model = next(iter(shapes))
    pts = measured_points(ctx, shapes[model])
    fig, ax = common.figure(2.5)
    cv = curves(rows, model)
    for c in CONFIGS:
        if c not in cv:
            continue
        xs = [s for s, _ in cv[c]]
        ax.plot(xs, [num(r["act_bytes"]) / GIB for _, r in cv[c]], color=CONFIG_COLOR[c], label=CONFIG_LABEL[c],
                lw=1.0)
        if c in pts:
            ax.plot([s for s, _ in pts[c]], [v / GIB for _, v in pts[c]], "D", color=CONFIG_COLOR[c], mec="black",
                    mew=0.5, markersize=3)
    crossover = num(cv[next(iter(cv))][0][1]["crossover_seq"])
    ax.axvline(crossover, color="black", lw=0.6, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel("activations per layer and sequence (GiB)")
    h, a, t = shapes[model]
    ax.set_title(f"{MODEL_LABEL.get(model, model)} layer (h={h:g}, a={a:g}), t={t:g}, b=1, bf16; "
                 f"dotted: 5as/h = 34 at s={crossover:.0f}", fontsize=5.5)
    from matplotlib.lines import Line2D
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], ls="none", marker="D", color="gray", mec="black", mew=0.5, markersize=3,
                          label="measured (ours)" if pts else "measured: none yet"))
    ax.legend(handles=handles, loc="upper left", fontsize=5.5, ncol=2)
    out.append(common.save(fig, ctx.out_dir, "seqlen_memory"))

    # 2) the two terms of Table 2 for GPT-3 (no recompute, TP+SP: both divided by t).
    gpt3 = curves(rows, "175b").get("sp")
    if gpt3:
        fig, ax = common.figure(2.2)
        xs = [s for s, _ in gpt3]
        ax.plot(xs, [num(r["linear_bytes"]) / GIB for _, r in gpt3], color="#4c72b0", label="34·sbh/t (linear in s)")
        ax.plot(xs, [num(r["attention_bytes"]) / GIB for _, r in gpt3], color="#c44e52",
                label="5·as²b/t (softmax, its dropout mask and output)")
        cross = num(gpt3[0][1]["crossover_seq"])
        ax.axvline(cross, color="black", lw=0.6, ls=":")
        ax.annotate(f"s ≈ {cross:.0f}", (cross, 0.9), xycoords=("data", "axes fraction"), xytext=(3, 0),
                    textcoords="offset points",
                    fontsize=6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length s (tokens)")
        ax.set_ylabel("bytes per layer (GiB)")
        r = gpt3[0][1]  # the shape theory computed these rows at
        ax.set_title(f"GPT-3 175B (h={r['hidden']}, a={r['heads']}), t={r['tp']} with SP, b={r['batch']}", fontsize=6)
        ax.legend(loc="lower right", fontsize=5.5)
        out.append(common.save(fig, ctx.out_dir, "seqlen_terms_175b"))

    header = ["model", "seq", "config", "formula (GiB per sequence)", "measured (GiB per sequence)"]
    table = []
    for c in CONFIGS:
        measured = dict(pts.get(c, []))
        for s, r in cv.get(c, []):
            if s in measured or (s >= 512 and (int(s) & (int(s) - 1)) == 0):
                m = measured.get(s)
                table.append([model, f"{s:.0f}", c, f"{num(r['act_bytes']) / GIB:.4f}",
                              f"{m / GIB:.4f}" if m is not None else ""])
    out.append(common.write_text(ctx.out_dir, "seqlen_memory.md",
                                 "# Activation memory per layer against sequence length\n\n" +
                                 common.markdown_table(header, table)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
