#!/usr/bin/env python3
"""Megatron-Core's --recompute-modules: stacked bars of the bytes one layer keeps for backward,
by category, for every module set (none, each subset of core_attn, mlp and layernorm, and full
recompute), all with sequence parallelism; one row of panels per model (the paper's 22B layer
at t = 8, llama3-8b's at t = 8), unfused attention on the left, fused on the right. The bars
are the formula (recompute_modules.csv from `theory --out`); measured layer_run rows of the
same layer (any backend) are drawn on them as points and listed beside them in the table."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Skip, num  # noqa: E402

MIB = 1024.0 ** 2
TABLE = "recompute_modules.csv"
ATTENTIONS = ("unfused", "fused")
# Category groups of the stacked bars, bottom to top; what a module frees sits in its own group.
GROUPS = [
    ("norm inputs (ln1, ln2)", ("ln1_input", "ln2_input"), "#9e9e9e"),
    ("norm outputs (qkv, fc1 inputs): layernorm", ("qkv_input", "fc1_input"), "#c7c7c7"),
    ("q, k, v", ("q", "k", "v", "q_norm_input", "k_norm_input"), "#1f77b4"),
    ("log-sum-exp (fused): core_attn", ("attn_lse",), "#e377c2"),
    ("softmax, dropout mask and output: core_attn", ("softmax_out", "attn_dropout_mask", "attn_dropout_out"),
     "#d62728"),
    ("projection input", ("proj_input",), "#9467bd"),
    ("residual dropout masks", ("attn_residual_mask", "mlp_residual_mask"), "#bcbd22"),
    ("activation input (GeLU, SwiGLU): mlp", ("gelu_input", "swiglu_input", "squared_relu_input"), "#ff7f0e"),
    ("fc2 input: mlp", ("fc2_input",), "#2ca02c"),
    # an MoE layer (plots/moe_modules.py): the router's, the experts' and the shared experts' tensors
    ("MoE input (norm 2's output): layernorm", ("moe_input",), "#dbdb8d"),
    ("router scores, top-k, dispatch plan: moe", ("router_scores", "router_topk_index", "router_topk_weight",
                                                  "moe_dispatch_plan"), "#393b79"),
    ("experts' fc1 input and output, routing weights: moe", ("moe_permuted", "moe_act_input", "moe_permuted_probs"),
     "#ff9896"),
    ("experts' fc2 input (the weighted activation): moe_act", ("moe_fc2_input",), "#98df8a"),
    ("shared experts: shared_experts", ("shared_act_input", "shared_fc2_input"), "#f7b6d2"),
    # latent attention: the latents and their norms' outputs
    ("latents (q, kv), k's RoPE part", ("q_latent", "kv_latent", "k_pos_emb"), "#aec7e8"),
    ("latent norms' outputs: mla_up_proj", ("q_up_input", "kv_up_input"), "#ffbb78"),
    ("full: layer input", ("layer_input",), "#8c564b"),
]
GROUPED = {c for _, members, _ in GROUPS for c in members}
SHORT = {"core_attn": "attn", "mlp": "mlp", "layernorm": "norm", "moe_act": "act", "moe": "moe",
         "shared_experts": "shared", "mla_up_proj": "mla"}
MARKERS = {"meta": ("D", "white"), "cpu": ("s", "white"), "cuda": ("x", "black")}
# The columns that say which layer a row is (with the two dropouts, which the gpt family leaves free).
LAYER_COLUMNS = ("arch", "hidden", "heads", "kv_heads", "ffn_hidden", "seq", "batch", "tp", "dtype")
MOE_COLUMNS = ("num_experts", "top_k", "moe_ffn_hidden")  # in an MoE table's rows, and layer_run's
NEEDED = ("model",) + LAYER_COLUMNS + ("attention_dropout", "hidden_dropout", "attention", "recompute",
                                       "recompute_modules", "category", "bytes")


def bar_name(recompute, modules):
    """"none", "full", or the selective module list ("core_attn,mlp")."""
    return modules if recompute == "selective" else recompute


def bar_label(name):
    return "+".join(SHORT[m] for m in name.split(",")) if name not in ("none", "full") else name


def read_bars(rows):
    """{model: (layer, {(attention, bar): {category: bytes}}, [bar names in order])}."""
    out = {}
    for r in rows:
        layer = {c: r[c] for c in LAYER_COLUMNS + ("attention_dropout", "hidden_dropout") + MOE_COLUMNS if c in r}
        layer["kv_channels"] = layer_value(r, "kv_channels")  # the formula tables' heads are h/a
        _, bars, order = out.setdefault(r["model"], (layer, {}, []))
        name = bar_name(r["recompute"], r["recompute_modules"])
        if name not in order:
            order.append(name)
        bars.setdefault((r["attention"], name), {})[r["category"]] = num(r["bytes"])
    return out


def layer_value(r, column):
    """A row's value of a layer column; older rows leave kv_heads (a), kv_channels (h/a) and
    ffn_hidden (4h) empty."""
    v = r.get(column) or ""
    if v == "" and column == "kv_heads":
        return r.get("heads")
    if v == "" and column == "kv_channels" and num(r.get("hidden")) is not None and num(r.get("heads")):
        return str(int(num(r["hidden"])) // int(num(r["heads"])))
    if v == "" and column == "ffn_hidden" and num(r.get("hidden")) is not None:
        return str(4 * int(num(r["hidden"])))
    return v


def same_layer(r, layer):
    """Whether a layer_run row ran this layer (older rows have one dropout column for both)."""
    if any(layer_value(r, c) != layer[c] for c in LAYER_COLUMNS + ("kv_channels",)):
        return False
    if any((r.get(c) or "") != layer[c] for c in MOE_COLUMNS if c in layer):
        return False
    for c in ("attention_dropout", "hidden_dropout"):
        if num(r.get(c) or r.get("dropout")) != num(layer[c]):
            return False
    return True


def measured_bars(ctx, layer):
    """{(attention, bar): {backend: act_bytes}} of the ok layer_run rows of this layer with SP
    (the newest row of each)."""
    recompute_of = {"sp": "none", "selective+sp": "selective", "full+sp": "full"}
    newest = {}
    for r in ctx.all_ok_runs():
        if r.get("config") not in recompute_of or not same_layer(r, layer) or num(r.get("act_bytes")) is None:
            continue
        recompute = recompute_of[r["config"]]
        modules = r.get("recompute_modules") or ""
        if recompute == "selective" and not modules:
            continue  # written before the modules: its fused selective recompute kept the lse
        key = (r.get("attention") or "unfused", bar_name(recompute, modules), r["backend"])
        if key not in newest or r.get("timestamp", "") >= newest[key].get("timestamp", ""):
            newest[key] = r
    out = {}
    for (attention, name, backend), r in newest.items():
        out.setdefault((attention, name), {})[backend] = num(r["act_bytes"])
    return out


def stack_groups(all_cats):
    """GROUPS, then each category no group names (as itself): the segments of every bar."""
    unnamed = [c for cats in all_cats for c in cats if c not in GROUPED]
    return GROUPS + [(c, (c,), "#17becf") for c in dict.fromkeys(unnamed)]


def draw_panel(ax, bars, order, attention, measured):
    xs = list(range(len(order)))
    bottom = [0.0] * len(order)
    cats = [bars.get((attention, name), {}) for name in order]
    for label, members, color in stack_groups(cats):
        vals = [sum(c.get(m, 0.0) for m in members) / MIB for c in cats]
        if any(vals):
            ax.bar(xs, vals, 0.7, bottom=bottom, color=color, label=label, edgecolor="white", linewidth=0.3)
            bottom = [b + v for b, v in zip(bottom, vals)]
    points = []
    for backend, (marker, face) in MARKERS.items():
        pts = [(x, measured[(attention, name)][backend] / MIB) for x, name in enumerate(order)
               if backend in measured.get((attention, name), {})]
        points += pts
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color=face, mec="black", mew=0.7, ms=3,
                    ls="none", label=f"measured: layer_run --backend {backend}")
    # Room above the tallest bar for its point (a zero-height segment's sticky edge defeats margins).
    ax.set_ylim(0, 1.08 * max(bottom + [y for _, y in points]) or 1)
    ax.set_xticks(xs)
    ax.set_xticklabels([bar_label(n) for n in order], rotation=40, ha="right", fontsize=5)
    ax.set_title(f"{attention} attention", fontsize=6)


def describe(model, layer):
    g = f", g={layer['kv_heads']}" if layer["kv_heads"] != layer["heads"] else ""
    mlp = (f"E={layer['num_experts']}, k={layer['top_k']}, F_e={layer['moe_ffn_hidden']}" if "num_experts" in layer
           else f"F={layer['ffn_hidden']}")
    return (f"{model} layer (h={layer['hidden']}, a={layer['heads']}{g}, {mlp}), "
            f"s={layer['seq']}, b={layer['batch']}, t={layer['tp']}, SP, {layer['dtype']}")


def markdown(models, measured_of, table=TABLE, what="--recompute-modules set"):
    header = ["model", "attention", "recompute", "formula (MiB)", "measured (MiB)", "freed vs none (MiB)",
              "categories (MiB)"]
    table = []
    for model, (layer, bars, order) in models.items():
        for attention in ATTENTIONS:
            none = sum(bars.get((attention, "none"), {}).values())
            for name in order:
                cats = bars.get((attention, name))
                if cats is None:
                    continue
                total = sum(cats.values())
                seen = measured_of[model].get((attention, name), {})
                table.append([model, attention, name, f"{total / MIB:.3f}",
                              ", ".join(f"{b} {v / MIB:.3f}" for b, v in sorted(seen.items())),
                              f"{(none - total) / MIB:.3f}",
                              ", ".join(f"{c} {b / MIB:.3f}" for c, b in cats.items())])
    return (f"# Bytes by category for each {what} (with SP)\n\n"
            f"Per layer and tensor-parallel rank. formula: `theory`'s {table} (the categories "
            "sum to the total; layer_run's meta backend measures every bar to the byte, as tests/test_plots.py "
            "checks); measured: layer_run's act_bytes for the same layer and module set, per backend, where the "
            "results have such rows (selective rows only from CSVs with recompute_modules: before the modules, "
            "fused selective recompute kept the log-sum-exp). `none` is TP+SP without recompute, `full` is full "
            "recompute with SP.\n\n" +
            common.markdown_table(header, table))


def draw(models, measured_of, short_names="attn = core_attn, norm = layernorm"):
    """One row of panels per model (its layer above), one panel per attention, one legend."""
    common.style()
    # Rows share at most a page's height (the MoE presets are three rows).
    fig = common.plt.figure(figsize=(5.2, min(2.3 * len(models), 4.4)), constrained_layout=True)
    rows = fig.subfigures(len(models), 1, squeeze=False)[:, 0]
    handles = {}
    for sub, (model, (layer, bars, order)) in zip(rows, models.items()):
        sub.suptitle(describe(model, layer), fontsize=6)
        for ax, attention in zip(sub.subplots(1, len(ATTENTIONS)), ATTENTIONS):
            draw_panel(ax, bars, order, attention, measured_of[model])
            ax.set_ylabel("MiB per layer and rank", fontsize=5.5)
            handles.update((label, h) for h, label in zip(*ax.get_legend_handles_labels()) if label not in handles)
    labels = [label for label, _, _ in GROUPS if label in handles]
    labels += [label for label in handles if label not in labels]  # unnamed categories, then measured points
    ncol = 3 if max(len(label) for label in labels) < 45 else 2  # the MoE groups' labels are long
    fig.legend([handles[label] for label in labels], labels, loc="upper center", bbox_to_anchor=(0.5, 0), ncol=ncol,
               fontsize=4.5)
    fig.suptitle(f"Bytes kept for backward by --recompute-modules set; bars: formula\n({short_names})", fontsize=6)
    return fig


def make_for(ctx, table, stem, what, short_names):
    """The figure and its markdown table from `theory`'s `table`, as `stem`.png / `stem`.md."""
    rows = ctx.theory.table(table)
    if not rows:
        raise Skip(f"{table} has no rows")
    missing = [c for c in NEEDED if c not in rows[0]]
    if missing:
        raise Skip(f"{table} has no column {', '.join(missing)} (written by an older `theory`?)")
    models = read_bars(rows)
    measured_of = {model: measured_bars(ctx, layer) for model, (layer, _, _) in models.items()}
    fig = draw(models, measured_of, short_names)
    out = [common.save(fig, ctx.out_dir, stem)]
    out.append(common.write_text(ctx.out_dir, stem + ".md", markdown(models, measured_of, table, what)))
    return out


def make(ctx):
    return make_for(ctx, TABLE, "recompute_modules_bytes", "--recompute-modules set",
                    "attn = core_attn, norm = layernorm")


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
