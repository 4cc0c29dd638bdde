#!/usr/bin/env python3
"""The llama family (--arch llama): Table 2-style stacked bars of activation bytes per layer
by category for LLaMA-3 70B at t = 8 (llama_table2_categories.csv from `theory --out`) with
measured layer_run points of the same shape, and activation memory against sequence length
with grouped-query attention (g = 8) against multi-head attention (g = a) (llama_seqlen.csv)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_COLOR, CONFIG_LABEL, CONFIGS, GIB, Skip, num  # noqa: E402

MIB = 1024.0 ** 2
# Category groups of the stacked bars, bottom to top.
GROUPS = [
    ("norm inputs (ln1, ln2)", ("ln1_input", "ln2_input"), "#9e9e9e"),
    ("GEMM inputs (qkv, fc1)", ("qkv_input", "fc1_input"), "#bdbdbd"),
    ("q, k, v after RoPE", ("q", "k", "v"), "#1f77b4"),
    ("softmax output / lse", ("softmax_out", "attn_lse"), "#d62728"),
    ("projection input", ("proj_input",), "#9467bd"),
    ("SwiGLU input (gate | up)", ("swiglu_input",), "#ff7f0e"),
    ("fc2 input", ("fc2_input",), "#2ca02c"),
    ("full: layer input", ("layer_input",), "#8c564b"),
]


def measured_70b(ctx):
    """{(config, attention): act_bytes} of llama3-70b-shaped rows at t = 8, s = 8192, b = 1, bf16."""
    out = {}
    for r in ctx.ok_runs():
        if (r.get("arch"), r.get("hidden"), r.get("heads"), r.get("kv_heads"), r.get("tp"), r.get("seq"),
                r.get("batch"), r.get("dtype")) != ("llama", "8192", "64", "8", "8", "8192", "1", "bf16") \
                or r.get("kv_channels", "") not in ("", "128"):  # rows before the column: h/a = 128
            continue
        if num(r.get("act_bytes")) is not None:
            out[(r["config"], r.get("attention", "unfused"))] = num(r["act_bytes"])
    return out


def make(ctx):
    cats = ctx.theory.table("llama_table2_categories.csv")
    seq = ctx.theory.table("llama_seqlen.csv")
    rows = [r for r in cats if r["model"] == "llama3-70b"]
    if not rows:
        raise Skip("llama_table2_categories.csv has no llama3-70b rows")
    out = []
    bars = [(c, a) for a in ("unfused", "fused") for c in CONFIGS]
    bytes_of = {}
    for r in rows:
        bytes_of.setdefault((r["config"], r["attention"]), {})[r["category"]] = num(r["bytes"])
    bars = [b for b in bars if b in bytes_of]
    fig, ax = common.figure(2.6)
    xs = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    for label, members, color in GROUPS:
        vals = [sum(bytes_of[b].get(m, 0.0) for m in members) / MIB for b in bars]
        if any(vals):
            ax.bar(xs, vals, 0.7, bottom=bottom, color=color, label=label, edgecolor="white", linewidth=0.3)
            bottom = [x + v for x, v in zip(bottom, vals)]
    measured = measured_70b(ctx)
    pts = [(i, measured[b] / MIB) for i, b in enumerate(bars) if b in measured]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "D", color="white", mec="black", mew=0.7,
                label="measured (layer_run)")
    ax.set_xticks(xs)
    ax.set_xticklabels([CONFIG_LABEL[c] + (" (fused)" if a == "fused" else "") for c, a in bars], rotation=35,
                       ha="right", fontsize=5.5)
    ax.set_ylabel("activations per layer and rank (MiB)")
    ax.set_title("LLaMA-3 70B layer (h=8192, a=64, g=8, F=28672), s=8192, b=1, t=8, bf16", fontsize=6)
    ax.legend(loc="upper right", fontsize=5, ncol=2)
    out.append(common.save(fig, ctx.out_dir, "llama_activation_bytes"))

    fig, ax = common.figure(2.5)
    curves = {}
    for r in seq:
        curves.setdefault((r["kv_heads"], r["config"], r["attention"]), []).append((num(r["seq"]), num(r["bytes"])))
    if not curves:
        raise Skip("llama_seqlen.csv is empty")
    for (g, config, attention), pts in sorted(curves.items()):
        pts.sort()
        ls = "-" if g == "8" else "--"
        marker = "o" if attention == "fused" else None
        ax.plot([p[0] for p in pts], [p[1] / GIB for p in pts], ls=ls, marker=marker, markersize=2,
                color=CONFIG_COLOR[config], lw=0.9,
                label=f"{CONFIG_LABEL[config]}, {'GQA g=8' if g == '8' else 'MHA g=64'}, {attention}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel("activations per layer and rank (GiB)")
    ax.set_title("LLaMA-3 70B layer, t=8, b=1, bf16: grouped-query vs multi-head attention", fontsize=6)
    ax.legend(loc="upper left", fontsize=4.5, ncol=2)
    out.append(common.save(fig, ctx.out_dir, "llama_seqlen_memory"))

    header = ["config", "attention", "bytes per layer (MiB)", "closed form (MiB)", "measured (MiB)"]
    table = []
    totals = {(r["config"], r["attention"]): r for r in ctx.theory.table("llama_table2.csv") if r["model"] == "llama3-70b"}
    for b in bars:
        t = totals.get(b)
        table.append([CONFIG_LABEL[b[0]], b[1], f'{num(t["bytes"]) / MIB:.2f}' if t else "",
                      f'{num(t["closed_form_bytes"]) / MIB:.2f}' if t else "",
                      f"{measured[b] / MIB:.2f}" if b in measured else ""])
    out.append(common.write_text(ctx.out_dir, "llama_activation_bytes.md",
                                 "# The llama family: LLaMA-3 70B layer, t = 8, s = 8192, b = 1, bf16\n\n" +
                                 common.markdown_table(header, table)))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
