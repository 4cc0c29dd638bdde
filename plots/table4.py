#!/usr/bin/env python3
"""Table 4: forward and backward time of one layer per configuration, and the overhead over
the baseline, ours (layer_run) beside the paper's (22B layer, t = 8, A100; paper_table4.csv
from `theory --out`). Absolute times depend on the GPU, so the figure draws each source's
times as a percentage of its own baseline: the bar height is the overhead column."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_LABEL, CONFIGS, PAPER_GPU, Skip, num  # noqa: E402


def pick_group(ctx):
    groups = {}
    for r in ctx.timed_runs():
        groups.setdefault(common.shape_key(r), []).append(r)
    if not groups:
        return None, {}

    def score(item):
        key, rows = item
        configs = {r["config"] for r in rows}
        preset = common.is_preset_shape(key, "22b", ("seq", "batch", "tp"))
        return ("baseline" in configs, preset, key[0] == "cuda", len(configs))
    key, rows = max(groups.items(), key=score)
    return key, common.latest_by_config(rows)


def make(ctx):
    paper = {r["config"]: r for r in ctx.theory.table("paper_table4.csv")} if ctx.theory.has("paper_table4.csv") \
        else {}
    key, ours = pick_group(ctx)
    if not ours:
        raise Skip("no timed layer_run rows (fwd_ms, bwd_ms): run layer_run on cuda or cpu")
    if "baseline" not in ours:
        raise Skip(f"timed rows for {common.describe_shape(key)} lack the baseline configuration")
    # Emulated TP holds no communication in fwd/bwd: its modeled time is shown apart.
    comm = {c: num(r.get("comm_ms_modeled")) or 0.0 for c, r in ours.items()} \
        if all(r.get("comm_mode") == "modeled" for r in ours.values()) else {c: 0.0 for c in ours}
    base_total = num(ours["baseline"]["fwd_ms"]) + num(ours["baseline"]["bwd_ms"]) + comm["baseline"]
    configs = [c for c in CONFIGS if c in ours or c in paper]

    header = ["config", "fwd (ms)", "bwd (ms)", "combined (ms)", "overhead"]
    if any(comm.values()):
        header.insert(3, "modeled comm (ms)")
    header += [f"paper fwd ({PAPER_GPU})", "paper bwd", "paper combined", "paper overhead"]
    table = []
    for c in configs:
        row = [CONFIG_LABEL[c]]
        if c in ours:
            f, b = num(ours[c]["fwd_ms"]), num(ours[c]["bwd_ms"])
            total = f + b + comm[c]
            row += [f"{f:.3f}", f"{b:.3f}"] + ([f"{comm[c]:.3f}"] if any(comm.values()) else []) + \
                [f"{total:.3f}", "–" if c == "baseline" else f"{100 * (total / base_total - 1):+.1f}%"]
        else:
            row += [""] * (5 if any(comm.values()) else 4)
        if c in paper:
            p = paper[c]
            row += [p["fwd_ms"], p["bwd_ms"], p["total_ms"],
                    "–" if not p["overhead_percent"] else f'{num(p["overhead_percent"]):+.0f}%']
        else:
            row += [""] * 4
        table.append(row)
    md = (f"# Table 4: one layer, forward and backward time\n\nOurs: {common.describe_shape(key)}, "
          f"median of {ours['baseline'].get('iters', '?')} iterations. Paper: 22B layer, t = 8, {PAPER_GPU}.\n\n" +
          common.markdown_table(header, table))
    out = [common.write_text(ctx.out_dir, "table4_layer_times.md", md)]

    fig, ax = common.figure(2.4)
    width = 0.38
    sources = [("ours", ours, comm)]
    if paper:
        sources.append((f"paper ({PAPER_GPU})", paper, {c: 0.0 for c in paper}))
    for j, (label, rows, cm) in enumerate(sources):
        base = num(rows["baseline"]["fwd_ms"]) + num(rows["baseline"]["bwd_ms"]) + cm.get("baseline", 0.0)
        xs, fwd, bwd, com = [], [], [], []
        for i, c in enumerate(configs):
            if c not in rows:
                continue
            xs.append(i + (j - (len(sources) - 1) / 2) * width)
            fwd.append(100 * num(rows[c]["fwd_ms"]) / base)
            bwd.append(100 * num(rows[c]["bwd_ms"]) / base)
            com.append(100 * cm.get(c, 0.0) / base)
        hatch = None if j == 0 else "////"
        ax.bar(xs, fwd, width, color="#4c72b0", hatch=hatch, edgecolor="white", linewidth=0.3,
               label="forward" if j == 0 else None)
        ax.bar(xs, bwd, width, bottom=fwd, color="#dd8452", hatch=hatch, edgecolor="white", linewidth=0.3,
               label="backward (incl. recompute)" if j == 0 else None)
        if any(com):
            ax.bar(xs, com, width, bottom=[a + b for a, b in zip(fwd, bwd)], color="#8172b3", hatch=hatch,
                   edgecolor="white", linewidth=0.3, label="comm (modeled)")
        for x, a, b, k in zip(xs, fwd, bwd, com):
            ax.text(x, a + b + k + 1.5, f"{a + b + k:.0f}", ha="center", va="bottom", fontsize=5)
    from matplotlib.patches import Patch
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="black", label="left: ours"))
    if paper:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label=f"right: paper ({PAPER_GPU})"))
    ax.axhline(100, color="black", lw=0.6, ls=":")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([CONFIG_LABEL[c] for c in configs], rotation=20, ha="right")
    ax.set_ylabel("layer time (% of own baseline)")
    ax.set_ylim(0, 175)
    ax.legend(handles=handles, loc="upper left", ncol=2, fontsize=5.5)
    ax.set_title(f"ours: {common.describe_shape(key)}", fontsize=5.5)
    out.insert(0, common.save(fig, ctx.out_dir, "table4_layer_times"))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
