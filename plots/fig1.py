#!/usr/bin/env python3
"""Figure 1: parameters + optimizer state and activations per GPU for the four Table 3
models, baseline (TP) against the present work (TP + SP + selective recompute), with the
GPUs' memory as lines. Reads fig1.csv and gpus.csv from `theory --out`; the paper's bars
(read off its figure, A100) are drawn as markers."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import GIB, MODEL_LABEL, PAPER_GPU, Skip, num  # noqa: E402,F401


def make(ctx):
    rows = ctx.theory.table("fig1.csv")
    gpus = ctx.theory.table("gpus.csv") if ctx.theory.has("gpus.csv") else []
    if not rows:
        raise Skip("fig1.csv is empty")
    fig, ax = common.figure(2.6)
    width = 0.36
    params_color, base_color, present_color = "#4c72b0", "#c44e52", "#55a868"
    for i, r in enumerate(rows):
        params = num(r["params_optimizer_gib"])
        for j, (key, color, paper_key) in enumerate([
                ("activations_baseline_gib", base_color, "paper_activations_baseline_gib"),
                ("activations_present_gib", present_color, "paper_activations_present_gib")]):
            x = i + (j - 0.5) * width
            act = num(r[key])
            ax.bar(x, params, width, color=params_color, edgecolor="white", linewidth=0.4)
            ax.bar(x, act, width, bottom=params, color=color, edgecolor="white", linewidth=0.4)
            paper_params, paper_act = num(r.get("paper_params_optimizer_gib")), num(r.get(paper_key))
            if paper_params is not None and paper_act is not None:
                ax.plot(x, paper_params + paper_act, marker="_", color="black", markersize=9, mew=1.2)
                ax.plot(x, paper_params, marker="_", color="black", markersize=9, mew=0.8, alpha=0.6)
    line_styles = {"a100": ("--", "#d62728"), "h100": (":", "#8c564b"), "h200": ("-.", "#9467bd")}
    # GPUs within 1 GiB of each other (A100 and H100 80GB) share one line.
    groups = []
    for g in sorted(gpus, key=lambda g: num(g["memory_gib"])):
        if groups and abs(num(g["memory_gib"]) - num(groups[-1][0]["memory_gib"])) < 1.0:
            groups[-1].append(g)
        else:
            groups.append([g])
    lines = []
    for group in groups:
        names_in = [g["gpu"] for g in group]
        ls, color = line_styles.get("a100" if "a100" in names_in else names_in[0], ("-", "gray"))
        names = " / ".join(g["gpu"].upper() for g in sorted(group, key=lambda g: g["gpu"]))
        lines.append(ax.axhline(num(group[0]["memory_gib"]), ls=ls, color=color, lw=0.9,
                                label=f'{names} ({num(group[0]["memory_gib"]):.0f} GiB)'))
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([MODEL_LABEL.get(r["model"], r["model"]) for r in rows])
    ax.set_xlabel("model (left bar: TP baseline, right bar: TP+SP+selective)")
    ax.set_ylabel("memory per GPU (GiB)")
    top = max(num(r["params_optimizer_gib"]) + num(r["activations_baseline_gib"]) for r in rows)
    ax.set_ylim(0, top * 1.32)
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D
    handles = [Patch(color=params_color, label=f"params + optimizer ({num(rows[0]['bytes_per_param']):g} B/param)"),
               Patch(color=base_color, label="activations, baseline"),
               Patch(color=present_color, label="activations, present work"),
               Line2D([], [], marker="_", color="black", ls="none", markersize=9, mew=1.2,
                      label=f"paper, read off Fig. 1 ({PAPER_GPU})")] + lines
    ax.legend(handles=handles, loc="upper left", ncol=2, fontsize=5.5, handlelength=1.6, columnspacing=0.8)
    out = [common.save(fig, ctx.out_dir, "fig1_memory")]
    header = ["model", "params+opt (GiB)", "baseline act. (GiB)", "present act. (GiB)",
              f"paper params+opt ({PAPER_GPU})", "paper baseline", "paper present"]
    table = [[MODEL_LABEL.get(r["model"], r["model"]), f'{num(r["params_optimizer_gib"]):.1f}',
              f'{num(r["activations_baseline_gib"]):.1f}', f'{num(r["activations_present_gib"]):.1f}',
              r.get("paper_params_optimizer_gib", ""), r.get("paper_activations_baseline_gib", ""),
              r.get("paper_activations_present_gib", "")] for r in rows]
    out.append(common.write_text(ctx.out_dir, "fig1_memory.md",
                                 "# Figure 1: memory per GPU (first pipeline stage)\n\n" +
                                 common.markdown_table(header, table)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
