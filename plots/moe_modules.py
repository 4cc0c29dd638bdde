#!/usr/bin/env python3
"""Megatron-Core's MoE recompute modules: stacked bars of the bytes one MoE layer keeps for
backward, by category, for the module sets an MoE layer reads (moe_act, moe, shared_experts,
layernorm, mla_up_proj with core_attn), no recompute and full recompute, all with sequence
parallelism; one row of panels per MoE preset (mixtral-8x7b, qwen3-30b-a3b, deepseek-v3 at t = 2,
balanced routing), unfused attention on the left, fused on the right. The bars are the formula
(moe_modules.csv from `theory --out`); measured layer_run rows of the same layer are drawn on
them as points (meta runs balanced routing unless given a histogram). Drawn by
plots/recompute_modules.py's code."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import recompute_modules  # noqa: E402


def make(ctx):
    return recompute_modules.make_for(ctx, "moe_modules.csv", "moe_modules_bytes", "MoE --recompute-modules set",
                                      "attn = core_attn, norm = layernorm, act = moe_act, shared = shared_experts, "
                                      "mla = mla_up_proj")


if __name__ == "__main__":
    sys.exit(common.main_for(make, __doc__))
