#!/usr/bin/env python3
"""Measured against predicted activation memory per layer, every layer_run row: the saved
tensors (act_bytes, by the paper's categories) and what the allocator kept across forward
(fwd_retained_bytes: LayerNorm statistics and anything else a layer holds), each against
Table 2 at the row's shape and dtype (act_bytes_formula). On the diagonal the formula is
exact; above it the device keeps more than the formula says."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_COLOR, CONFIG_LABEL, CONFIGS, Skip, num  # noqa: E402

MEASURES = [("act_bytes", "o", "saved tensors (paper categories)"),
            ("fwd_retained_bytes", "x", "allocator delta across forward")]


def make(ctx):
    rows = [r for r in ctx.ok_runs() if num(r.get("act_bytes_formula")) and num(r.get("act_bytes")) is not None]
    if not rows:
        raise Skip("no layer_run rows with act_bytes and act_bytes_formula")
    fig, ax = common.figure(2.6)
    lo, hi, top, bottom = float("inf"), 0.0, 1.0, 1.0
    for col, marker, _ in MEASURES:
        for c in CONFIGS:
            pts = [(num(r["act_bytes_formula"]), num(r.get(col))) for r in rows if r["config"] == c]
            pts = [(x, y / x) for x, y in pts if y is not None and y > 0 and x > 0]
            if not pts:
                continue
            lo, hi = min(lo, *(p[0] for p in pts)), max(hi, *(p[0] for p in pts))
            top = max(top, *(p[1] for p in pts))
            bottom = min(bottom, *(p[1] for p in pts))
            style = dict(facecolors="none", edgecolors=CONFIG_COLOR[c], s=10) if marker == "o" \
                else dict(c=CONFIG_COLOR[c], s=14)
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, linewidths=0.6, **style)
    ax.axhline(1.0, color="black", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_xlim(lo / 3, hi * 3)
    span = max(top - 1, 1 - bottom, 0.01)
    ax.set_ylim(1 - 1.3 * span if bottom < 1 else 1 - 0.15 * span, 1 + 2.2 * span)
    ax.set_xlabel("Table 2 prediction (bytes per layer)")
    ax.set_ylabel("measured / predicted")
    from matplotlib.lines import Line2D
    present = [c for c in CONFIGS if any(r["config"] == c for r in rows)]
    handles = [Line2D([], [], ls="none", marker="s", color=CONFIG_COLOR[c], label=CONFIG_LABEL[c]) for c in present]
    handles += [Line2D([], [], ls="none", marker=m, color="black", mfc="none" if m == "o" else "black",
                       label=label) for col, m, label in MEASURES]
    handles.append(Line2D([], [], color="black", lw=0.6, ls="--", label="measured = predicted"))
    ax.legend(handles=handles, loc="upper left", fontsize=5, ncol=2, columnspacing=0.6)
    out = [common.save(fig, ctx.out_dir, "memory_measured_vs_predicted")]

    header = ["config", "rows", "act_bytes / formula (min … max)", "allocator delta / formula (min … max)"]
    table = []
    for c in present:
        sel = [r for r in rows if r["config"] == c]
        cells = []
        for col, _, _ in MEASURES:
            ratios = [num(r.get(col)) / num(r["act_bytes_formula"]) for r in sel if num(r.get(col)) is not None]
            cells.append(f"{min(ratios):.4f} … {max(ratios):.4f}" if ratios else "")
        table.append([CONFIG_LABEL[c], len(sel)] + cells)
    out.append(common.write_text(ctx.out_dir, "memory_measured_vs_predicted.md",
                                 "# Measured against predicted activation memory (all layer_run rows)\n\n" +
                                 common.markdown_table(header, table)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
