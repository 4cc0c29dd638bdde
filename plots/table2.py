#!/usr/bin/env python3
"""Table 2: activation bytes per layer, formula against measured. The markdown lists every
measured layer_run row (act_bytes: the saved tensors by category; act_bytes_formula: Table 2
at that shape and dtype; fwd_retained_bytes: what the allocator kept across forward) and
the formula for the Table 3 models (table2.csv from `theory --out`). The figure draws
formula bars and measured points for one shape (the paper's 22B layer when measured)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import CONFIG_COLOR, CONFIG_LABEL, CONFIGS, MODEL_LABEL, Skip, num  # noqa: E402

MIB = 1024.0 ** 2


def pick_shape(groups):
    """The 22B layer at t = 8 when measured (any backend), else the group with most configs."""
    def score(item):
        key, rows = item
        preset = common.is_preset_shape(key, "22b", ("seq", "tp"))
        return (preset, key[0] == "cuda", len({r["config"] for r in rows}))
    return max(groups.items(), key=score)


def make(ctx):
    measured = [r for r in ctx.ok_runs() if num(r.get("act_bytes")) is not None]
    formula_rows = ctx.theory.table("table2.csv") if ctx.theory.has("table2.csv") else []
    if not measured and not formula_rows:
        raise Skip("no layer_run rows with act_bytes and no theory table2.csv")
    out = []
    md = ["# Table 2: activation bytes per layer (per tensor-parallel rank)\n"]
    if measured:
        header = ["model", "h", "a", "s", "b", "t", "dtype", "config", "backend", "measured (MiB)", "formula (MiB)",
                  "measured / formula", "LN stats (MiB)", "allocator delta (MiB)"]
        table = []
        seen = set()
        for r in measured:
            key = common.shape_key(r) + (r["config"],)
            if key in seen:
                continue
            seen.add(key)
            act, f = num(r["act_bytes"]), num(r["act_bytes_formula"])
            retained, extra = num(r.get("fwd_retained_bytes")), num(r.get("act_extra_bytes"))
            table.append([r["model"], r["hidden"], r["heads"], r["seq"], r["batch"], r["tp"], r["dtype"], r["config"],
                          r["backend"], f"{act / MIB:.3f}", f"{f / MIB:.3f}" if f else "",
                          f"{act / f:.4f}" if f else "", f"{extra / MIB:.3f}" if extra is not None else "",
                          f"{retained / MIB:.3f}" if retained is not None else ""])
        md.append("## Measured (layer_run) against Table 2\n\n" + common.markdown_table(header, table))
    if formula_rows:
        header = ["model", "config", "dtype", "bytes / sbh", "MiB per layer", "of which attention (MiB)",
                  "LN stats (MiB, not in Table 2)"]
        table = [[MODEL_LABEL.get(r["model"], r["model"]), r["config"], r["dtype"], f'{num(r["sbh_multiple"]):.3f}',
                  f'{num(r["act_bytes"]) / MIB:.1f}', f'{num(r["attention_bytes"]) / MIB:.1f}',
                  f'{num(r["ln_stats_bytes"]) / MIB:.2f}'] for r in formula_rows if r["dtype"] == "bf16"]
        md.append("\n## Formula at the Table 3 shapes (t = 8, bf16 activations, 1-byte masks)\n\n" +
                  common.markdown_table(header, table))
    out.append(common.write_text(ctx.out_dir, "table2_activation_bytes.md", "\n".join(md)))

    fig, ax = common.figure(2.3)
    if measured:
        groups = {}
        for r in measured:
            groups.setdefault(common.shape_key(r), []).append(r)
        key, rows = pick_shape(groups)
        by = common.latest_by_config(rows)
        configs = [c for c in CONFIGS if c in by]
        xs = range(len(configs))
        ax.bar(xs, [num(by[c]["act_bytes_formula"]) / MIB for c in configs], 0.6,
               color=[CONFIG_COLOR[c] for c in configs], alpha=0.85, label="Table 2 formula")
        ax.plot(xs, [num(by[c]["act_bytes"]) / MIB for c in configs], "D", color="white", mec="black", mew=0.7,
                label="measured: saved tensors")
        retained = [num(by[c].get("fwd_retained_bytes")) for c in configs]
        if all(v is not None for v in retained):
            ax.plot(xs, [v / MIB for v in retained], "x", color="black", mew=0.8, label="measured: allocator delta")
        ax.set_title(common.describe_shape(key), fontsize=6)
    else:
        rows = [r for r in formula_rows if r["dtype"] == "bf16" and r["model"] == "22b"]
        if not rows:
            raise Skip("table2.csv has no 22b bf16 rows")
        by = {r["config"]: r for r in rows}
        configs = [c for c in CONFIGS if c in by]
        xs = range(len(configs))
        ax.bar(xs, [num(by[c]["act_bytes"]) / MIB for c in configs], 0.6, color=[CONFIG_COLOR[c] for c in configs],
               label="Table 2 formula")
        ax.set_title("22B layer, t=8 (formula only: no measured rows)", fontsize=6)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([CONFIG_LABEL[c] for c in configs], rotation=25, ha="right")
    ax.set_ylabel("activation memory per layer (MiB)")
    ax.legend(loc="upper right")
    out.insert(0, common.save(fig, ctx.out_dir, "table2_activation_bytes"))
    return out


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
