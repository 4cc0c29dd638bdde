#!/usr/bin/env python3
"""Figure 7: activation memory of each configuration as a percentage of the tensor-parallel
baseline, for the four Table 3 models. Bars: Table 2's formulas (fig7.csv from `theory
--out`); black ticks: the paper's Figure 7 (A100 setup, computed from Table 2); diamonds:
our measured bytes (layer_run act_bytes of the configuration over the baseline's, same
shape), where the results hold both."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_COLOR, CONFIG_LABEL, MODEL_LABEL, PAPER_GPU, Skip, num  # noqa: E402

SHOWN = ["sp", "selective", "selective+sp", "full"]


def preset_shapes(ctx):
    """{model: (hidden, heads, seq, batch, tp)} of the Table 3 models, from table2.csv."""
    shapes = {}
    if ctx.theory.has("table2.csv"):
        for r in ctx.theory.table("table2.csv"):
            shapes[r["model"]] = tuple(num(r[k]) for k in ("hidden", "heads", "seq", "batch", "tp"))
    return shapes


def measured_percents(ctx):
    """{(model, config): percent} from layer_run rows at the Table 3 shapes (any backend)."""
    shapes = preset_shapes(ctx)
    groups = {}
    for r in ctx.ok_runs():
        if num(r.get("act_bytes")) is None or r.get("model") not in shapes:
            continue
        if tuple(num(r.get(k)) for k in ("hidden", "heads", "seq", "batch", "tp")) != shapes[r["model"]]:
            continue
        groups.setdefault(common.shape_key(r), []).append(r)
    out = {}
    for key, rows in groups.items():
        by = common.latest_by_config(rows)
        if "baseline" not in by:
            continue
        base = num(by["baseline"]["act_bytes"])
        for c, r in by.items():
            out.setdefault((key[2], c), 100.0 * num(r["act_bytes"]) / base)
    return out


def make(ctx):
    rows = ctx.theory.table("fig7.csv")
    formula = {(r["model"], r["config"]): num(r["percent_of_tp_baseline"]) for r in rows}
    paper = {(r["model"], r["config"]): num(r["paper_percent"])
             for r in rows if num(r.get("paper_percent")) is not None}
    models = [m for m in common.MODELS if any(k[0] == m for k in formula)]
    if not models:
        raise Skip("fig7.csv has none of the Table 3 models")
    measured = measured_percents(ctx)
    fig, ax = common.figure(2.4)
    width = 0.8 / len(SHOWN)
    any_measured = False
    for j, c in enumerate(SHOWN):
        xs = [i + (j - (len(SHOWN) - 1) / 2) * width for i in range(len(models))]
        ax.bar(xs, [formula.get((m, c), 0) for m in models], width, color=CONFIG_COLOR[c], label=CONFIG_LABEL[c])
        for x, m in zip(xs, models):
            if (m, c) in paper:
                ax.plot(x, paper[(m, c)], marker="_", color="black", markersize=7, mew=1.2)
            if (m, c) in measured:
                any_measured = True
                ax.plot(x, measured[(m, c)], marker="D", color="white", mec="black", mew=0.7, markersize=3)
    from matplotlib.lines import Line2D
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="_", color="black", ls="none", markersize=7, mew=1.2,
                          label=f"paper Fig. 7 ({PAPER_GPU})"))
    if any_measured:
        handles.append(Line2D([], [], marker="D", color="white", mec="black", ls="none", markersize=3,
                              label="measured (ours)"))
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([MODEL_LABEL[m] for m in models])
    ax.set_xlabel("model")
    ax.set_ylabel("activation memory\n(% of TP baseline)")
    ax.set_ylim(0, 100)
    ax.legend(handles=handles, loc="upper center", ncol=3, fontsize=5.5, bbox_to_anchor=(0.5, 1.0),
              columnspacing=0.8, handlelength=1.4)
    out = [common.save(fig, ctx.out_dir, "fig7_percent_of_baseline")]
    header = ["model", "config", "formula (%)", f"paper ({PAPER_GPU})", "measured (%)"]
    table = []
    for m in models:
        for c in SHOWN + ["full+sp"]:
            if (m, c) not in formula:
                continue
            meas = measured.get((m, c))
            table.append([MODEL_LABEL[m], CONFIG_LABEL[c], f"{formula[(m, c)]:.1f}",
                          f"{paper[(m, c)]:.1f}" if (m, c) in paper else "",
                          f"{meas:.1f}" if meas is not None else ""])
    out.append(common.write_text(ctx.out_dir, "fig7_percent_of_baseline.md",
                                 "# Figure 7: activation memory as % of the tensor-parallel baseline\n\n" +
                                 common.markdown_table(header, table)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
