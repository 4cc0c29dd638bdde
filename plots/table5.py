#!/usr/bin/env python3
"""Table 5: end-to-end iteration time, full recompute against the present work, for the
four Table 3 models: the paper's A100 times beside our iteration model (table5.csv from
`theory --out`: Table 4's layer carried to each model, pipeline schedule, output layer,
optimizer; plus any GPU whose layer times are in the results). The markdown adds MFU and
HFU recomputed from the paper's times (Eq. 7, Eq. 8, the exact selective count, causal)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import MODEL_LABEL, PAPER_GPU, Skip, num  # noqa: E402


def fmt(v, f="{:.2f}"):
    return "" if v is None else f.format(v)


def make(ctx):
    rows = ctx.theory.table("table5.csv")
    if not rows:
        raise Skip("table5.csv is empty")
    main = [r for r in rows if r["dp"] == "1"]
    models = [m for m in common.MODELS if any(r["model"] == m for r in main)]
    # One bar group per device: the A100 model from Table 4, and per measured GPU its own
    # layer times ("measured") or, for a model it did not time, another model's carried over.
    devices = []
    for r in main:
        if r["device"] not in devices:
            devices.append(r["device"])

    def modeled(model, device):
        cands = [r for r in main if r["model"] == model and r["device"] == device]
        cands.sort(key=lambda r: r["source"] != "measured")
        return cands[0] if cands else None

    fig, ax = common.figure(2.5)
    n = 1 + len(devices)
    width = 0.8 / n
    colors = {"full": "#d62728", "present": "#2ca02c"}
    styles = [dict(hatch=None), dict(hatch="/////"), dict(fill=False), dict(hatch="...")]
    top = 0
    for i, m in enumerate(models):
        paper = next(r for r in main if r["model"] == m)
        bars = [(num(paper["paper_full_s"]), num(paper["paper_present_s"]), False)]
        for dev in devices:
            r = modeled(m, dev)
            bars.append((num(r["modeled_full_s"]) if r else None, num(r["modeled_present_s"]) if r else None,
                         bool(r) and r["source"].startswith("scaled")))
        for j, (full, present, scaled) in enumerate(bars):
            x = i + (j - (n - 1) / 2) * width
            style = styles[min(j, len(styles) - 1)]
            for key, v, dx in (("full", full, -width / 4), ("present", present, width / 4)):
                if v is None:
                    continue
                top = max(top, v)
                kw = dict(edgecolor=colors[key], linewidth=0.8, facecolor="none") if style.get("fill") is False \
                    else dict(color=colors[key], hatch=style.get("hatch"), edgecolor="white", linewidth=0.3)
                ax.bar(x + dx, v, width / 2, alpha=0.5 if scaled else 1.0, **kw)
    from matplotlib.patches import Patch
    handles = [Patch(color=colors["full"], label="full recompute"),
               Patch(color=colors["present"], label="present work"),
               Patch(facecolor="gray", label=f"paper ({PAPER_GPU})")]
    for j, dev in enumerate(devices, start=1):
        style = styles[min(j, len(styles) - 1)]
        text = "our model, Table 4 layer (A100)" if dev.startswith("A100 (paper") else f"our model, {dev}"
        if style.get("fill") is False:
            handles.append(Patch(facecolor="none", edgecolor="gray", linewidth=0.8, label=text))
        else:
            handles.append(Patch(facecolor="gray", hatch=style.get("hatch"), edgecolor="white", label=text))
    if any(r["source"].startswith("scaled") for r in main):
        handles.append(Patch(facecolor="gray", alpha=0.5, label="faded: layer times carried from another model"))
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([MODEL_LABEL[m] for m in models])
    ax.set_xlabel("model")
    ax.set_ylabel("iteration time (s)")
    ax.set_ylim(0.3, top * 30)
    ax.legend(handles=handles, loc="upper left", fontsize=5, ncol=2, columnspacing=0.8, handlelength=1.5)
    out = [common.save(fig, ctx.out_dir, "table5_iteration_time")]

    header = ["model", "GPUs", f"paper full (s, {PAPER_GPU})", "paper present (s)", "paper gain", "paper MFU",
              "paper HFU", "MFU (Eq. 7)", "HFU (Eq. 8)", "HFU exact", "MFU causal", "MFU full", "HFU full"]
    seen, table = set(), []
    for r in rows:
        key = (r["model"], r["dp"])
        if key in seen:
            continue
        seen.add(key)
        table.append([MODEL_LABEL.get(r["model"], r["model"]), r["gpus"], r["paper_full_s"], r["paper_present_s"],
                      fmt(num(r["paper_gain_percent"]), "{:.1f}%"), fmt(num(r["paper_mfu_percent"]), "{:.1f}%"),
                      fmt(num(r["paper_hfu_percent"]), "{:.1f}%"), fmt(num(r["mfu_percent"]), "{:.1f}%"),
                      fmt(num(r["hfu_percent"]), "{:.1f}%"), fmt(num(r["hfu_exact_percent"]), "{:.1f}%"),
                      fmt(num(r["mfu_causal_percent"]), "{:.1f}%"), fmt(num(r["mfu_full_percent"]), "{:.1f}%"),
                      fmt(num(r["hfu_full_percent"]), "{:.1f}%")])
    md = ["# Table 5: end-to-end iteration time\n",
          f"## MFU and HFU from the paper's iteration times ({PAPER_GPU}, 312 TFLOP/s)\n",
          "Eq. 8 is the paper's HFU; 'exact' counts only the recomputed QKᵀ and ·V (1 + 2s/(9h)); 'causal' "
          "halves the attention FLOPs as current Megatron does. The 2240-GPU 530B row's full-recompute time "
          "is derived from its reported 42.1% MFU.\n",
          common.markdown_table(header, table)]
    header = ["model", "GPUs", "layer times from", "device", "modeled full (s)", "modeled present (s)",
              "modeled gain", "modeled MFU", "modeled HFU", "bubble", f"paper full ({PAPER_GPU})", "paper present",
              "paper MFU"]
    table = [[MODEL_LABEL.get(r["model"], r["model"]), r["gpus"], r["source"], r["device"],
              fmt(num(r["modeled_full_s"])), fmt(num(r["modeled_present_s"])),
              fmt(num(r["modeled_gain_percent"]), "{:.1f}%"), fmt(num(r["modeled_mfu_percent"]), "{:.1f}%"),
              fmt(num(r["modeled_hfu_percent"]), "{:.1f}%"), fmt(num(r["modeled_bubble_percent"]), "{:.1f}%"),
              r["paper_full_s"], r["paper_present_s"], fmt(num(r["paper_mfu_percent"]), "{:.1f}%")] for r in rows]
    md += ["\n## Our iteration model beside the paper\n",
           "MFU of a modeled row is against the peak of the GPU its layer times come from.\n",
           common.markdown_table(header, table)]
    out.append(common.write_text(ctx.out_dir, "table5_iteration_time.md", "\n".join(md)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
