#!/usr/bin/env python3
"""Figure 8: where one layer's GPU time goes — forward, backward, recomputation and
communication kernels — as a percentage of the baseline's forward + backward, from a CUPTI
breakdown CSV (columns config, phase, kernels, gpu_ms; phases fwd.*, bwd.*, recompute.*,
comm.*; layer_run --cupti writes one). The paper's split (A100, read off its Figure 8;
paper_fig8.csv from `theory --out`) is drawn beside ours for the same model."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_LABEL, CONFIGS, MODEL_LABEL, PAPER_GPU, Skip, num  # noqa: E402

STAGES = ["fwd", "bwd", "recompute", "comm"]
STAGE_LABEL = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "comm": "communication"}
STAGE_COLOR = {"fwd": "#4c72b0", "bwd": "#dd8452", "recompute": "#c44e52", "comm": "#8172b3"}


def split_by_stage(rows):
    """{group: {config: {stage: ms}}}; a group is one layer shape on one device."""
    out = {}
    for r in rows:
        ms = num(r.get("gpu_ms"))
        phase = r.get("phase", "")
        stage = phase.split(".", 1)[0]
        if ms is None or stage not in STAGES:
            continue
        group = tuple(r.get(k, "") for k in ("device", "model", "hidden", "heads", "seq", "batch", "tp", "dtype"))
        out.setdefault(group, {}).setdefault(r["config"], {}).setdefault(stage, 0.0)
        out[group][r["config"]][stage] += ms
    return out


def make(ctx):
    if not ctx.cupti:
        raise Skip("no CUPTI breakdown CSV (columns config, phase, gpu_ms): run layer_run --cupti on a GPU")
    groups = {g: c for g, c in split_by_stage(ctx.cupti).items() if "baseline" in c}
    if not groups:
        raise Skip("the CUPTI breakdown has no baseline configuration to normalise by")
    paper = ctx.theory.table("paper_fig8.csv") if ctx.theory.has("paper_fig8.csv") else []
    out = []
    md = ["# Figure 8: per-layer GPU time by phase (% of the baseline's forward + backward)\n"]
    for gi, (group, by_config) in enumerate(sorted(groups.items())):
        device, model = group[0], group[1]
        base = by_config["baseline"].get("fwd", 0.0) + by_config["baseline"].get("bwd", 0.0)
        if base <= 0:
            continue
        configs = [c for c in CONFIGS if c in by_config]
        bars = [(CONFIG_LABEL[c], {s: 100 * by_config[c].get(s, 0.0) / base for s in STAGES}, False) for c in configs]
        for p in paper:
            if p["model"] == model:
                bars.append((f"{CONFIG_LABEL.get(p['config'], p['config'])}\npaper ({PAPER_GPU})",
                             {"fwd": num(p["fwd_percent"]), "bwd": num(p["bwd_percent"]),
                              "recompute": num(p["recompute_percent"]), "comm": 0.0}, True))
        fig, ax = common.figure(2.4)
        xs = range(len(bars))
        bottom = [0.0] * len(bars)
        for s in STAGES:
            vals = [b[1][s] for b in bars]
            if not any(vals):
                continue
            ax.bar(xs, vals, 0.65, bottom=bottom, color=STAGE_COLOR[s], label=STAGE_LABEL[s],
                   hatch=None, edgecolor="white", linewidth=0.3)
            bottom = [a + v for a, v in zip(bottom, vals)]
        for x, (label, split, is_paper), total in zip(xs, bars, bottom):
            ax.text(x, total + 2, f"{total:.0f}", ha="center", va="bottom", fontsize=5)
            if is_paper:
                ax.bar(x, total, 0.65, fill=False, hatch="////", edgecolor="black", linewidth=0)
        ax.axhline(100, color="black", lw=0.6, ls=":")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b[0] for b in bars], rotation=30, ha="right", fontsize=5.5)
        ax.set_ylabel("GPU time per layer\n(% of baseline fwd + bwd)")
        ax.set_ylim(0, max(bottom) * 1.3)
        ax.legend(loc="upper left", ncol=4, fontsize=5.5, columnspacing=0.8)
        ax.set_title(f"ours: {MODEL_LABEL.get(model, model)} layer (h={group[2]}, s={group[4]}, b={group[5]}, "
                     f"t={group[6]}) on {device}; hatched: paper", fontsize=5.5)
        name = "fig8_time_breakdown" if gi == 0 else f"fig8_time_breakdown_{gi}"
        out.append(common.save(fig, ctx.out_dir, name))
        header = ["config", "source"] + [f"{STAGE_LABEL[s]} (%)" for s in STAGES] + ["total (%)"]
        table = [[label.replace("\n", " "), PAPER_GPU if is_paper else device] +
                 [f"{split[s]:.1f}" for s in STAGES] + [f"{sum(split.values()):.1f}"]
                 for label, split, is_paper in bars]
        md.append(f"\n## {MODEL_LABEL.get(model, model)} on {device}\n\n" + common.markdown_table(header, table))
    if not out:
        raise Skip("the CUPTI baseline has no forward or backward kernel time")
    out.append(common.write_text(ctx.out_dir, "fig8_time_breakdown.md", "\n".join(md)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
