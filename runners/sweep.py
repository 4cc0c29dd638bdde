#!/usr/bin/env python3
"""sweep.py: run layer_run over a plan of points, resumably, into one CSV.

    sweep.py PLAN --csv FILE [--backend cpu|cuda|meta] [--launcher auto|mpi|emulate]
             [--dry-run] [--retry-failed] [--no-wait] [--warmup W] [--iters I] [--dtype D]
             [--dropout P] [--memory-limit 80GiB] [--build DIR] [--extra "ARGS"]

PLAN is a built-in plan (table4, seqlen, tp, models, longseq, llama, longcontext, moe, smoke) or a
JSON plan file:

    {"name": "mine",
     "fixed": {"model": "22b", "batch": 1, "tp": 8},
     "grid":  {"seq": [1024, 2048, 4096], "config": ["baseline", "selective+sp"]}}

Every combination of the grid's values (with the fixed ones) is one point; a point is one
layer_run process writing one row. No config means the paper's five; a config given as a
list ("baseline,sp" or, in fixed, ["baseline", "sp"]) is one point per configuration. Fields
of a point: model hidden heads seq batch tp config attention dtype dropout layers arch, and
the layer spec's, each named as the CSV column that records it and passed under layer_run's
Megatron-LM flag: normalization norm_epsilon qk_layernorm activation ffn_hidden
add_bias_linear add_qkv_bias kv_heads kv_channels position_embedding rotary_percent rotary_base
attention_dropout hidden_dropout recompute_modules, and cp cp_comm_type ep etp (docs/sweeps.md). A point's key is the
text layer_run writes in those columns (plus the backend and whether t is emulated), predicted
by the rules layer_run writes them with (the arch column is gpt, llama or custom, as the spec
is); a point whose key is already in the CSV is skipped, so a sweep killed at any moment is
resumed by running it again. Numbers in a plan or an option are taken only as layer_run
spells them (ASCII digits); a plan file is at most 4 levels deep and 1000000 points.

Models: tiny 22b 175b 530b 1t (arch gpt) and llama3-8b llama3-70b llama3-405b (arch llama),
each with layer_run's preset shape and spec (runners/facts.json) unless the plan sets them;
mixtral-8x7b qwen3-30b-a3b deepseek-v3 (arch moe) with their preset's spec (a plan sets their
shape, ep and etp, not their spec).
"arch": "llama" on a gpt model starts from the llama spec at that shape. --dropout is the
default of gpt points; a llama point keeps the preset's 0 unless the plan sets dropout.
recompute_modules applies to selective configurations (else its column is empty). --extra
may not set what the sweep sets (every spec flag included), nor --hf-config.

Rows are appended whole by layer_run (one write under a lock); a point that fails without a
row gets a row with status=failed written by this driver, the same way. Out-of-memory points
are rows with status=oom (layer_run exit status 3) and the sweep goes on. Malformed lines
already in the CSV (half-written or glued rows, bytes that are not UTF-8, runaway fields) are
named with their line number; their points run again.

One sweep at a time per CSV file: a sweep holds FILE.lock (flock) and a lock named after the
file's device and inode (so every hard-linked name is one lock) from start to end, and every
point's process inherits both, so a second sweep on the same file, or a rerun right after a
sweep was killed while a point was still running, waits for it (--no-wait: exit 2 instead)
and then runs only the points still missing. Each point's process runs in its own process
group: SIGINT / SIGTERM to the sweep are passed on to it, and on Linux it is sent SIGTERM
when the sweep dies, however it dies.

With --launcher mpi (or auto with a cuda/cpu backend and mpirun on PATH and t > 1) a point
runs under `mpirun -np t` (t x C with context parallelism; ep, or t x ep with etp = t, with
expert parallelism over data-parallel replicas) (Open MPI: run-as-root variables set when
running as root, --oversubscribe when the ranks exceed the CPUs); with emulate (the default for
meta, and for auto without mpirun) one process plays rank 0 (--emulate-tp, --emulate-cp,
--emulate-ep). Binaries are found in
$ACTBENCH_BUILD, --build, or the newest build*/ folder of the repository (not a simulator build). Only Python's
standard library.

With --launcher slurm (runners/sweep_slurm.py) the points are submitted from a login node as job
arrays, each task running its point under srun into a file of its own, and the sweep merges
each row into the CSV once, under its lock; a rerun finds the queued tasks through squeue
(--no-wait: submit and return; --collect --csv FILE: merge later).
"""
import argparse
import ctypes
import fcntl
import io
import csv
import itertools
import json
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import number_text  # noqa: E402
import results_csv  # noqa: E402
import user_files  # noqa: E402

# layer_run's facts (runners/facts.json, written by actbench_facts from the C++ tables): its
# presets (the paper's Table 3 models, the llama family with g = kv_heads and F = ffn_hidden, tiny),
# the paper's five configurations, the attention modes and the architectures.
with open(os.path.join(HERE, "facts.json")) as _facts_file:
    FACTS = json.load(_facts_file)
PAPER_CONFIGS = FACTS["paper_configs"]
SELECTIVE_CONFIGS = {c["name"] for c in FACTS["configs"] if c["recompute"] == "selective"}
PRESETS = {p["name"]: p for p in FACTS["presets"]}
# The mixtures of experts (arch moe: Mixtral, Qwen3-MoE, DeepSeek-V3) run their preset's spec,
# experts and latent attention included; a plan varies their shape, parallelism (ep, etp) and
# recompute, not their spec.
MOE_MODELS = {name for name, p in PRESETS.items() if p["arch"] == "moe"}
PAPER_MODELS = [p["name"] for p in FACTS["presets"] if p["paper"]]
ATTENTIONS = FACTS["attention"]
ARCHS = tuple(FACTS["archs"])
ARCH_SPECS = FACTS["arch_specs"]  # the spec --arch starts from on a model of the other family
SPEC_OPTIONS = FACTS["spec_options"]  # the names and bounds layer_run takes for the spec's options

# The layer spec's plan fields, each named as the CSV column that records it, with the
# layer_run (Megatron-LM) flag that sets it. A switch sets its field to one value only (the
# other is reachable only as the preset's); the activation's flags name swiglu and squared_relu
# (gelu is neither, so only a gelu preset runs it).
SPEC_VALUE_FLAGS = {"normalization": "--normalization", "norm_epsilon": "--norm-epsilon",
                    "ffn_hidden": "--ffn-hidden", "kv_heads": "--kv-heads", "kv_channels": "--kv-channels",
                    "position_embedding": "--position-embedding-type", "rotary_percent": "--rotary-percent",
                    "rotary_base": "--rotary-base", "attention_dropout": "--attention-dropout",
                    "hidden_dropout": "--hidden-dropout"}
SPEC_SWITCHES = {"qk_layernorm": ("--qk-layernorm", True), "add_bias_linear": ("--disable-bias-linear", False),
                 "add_qkv_bias": ("--add-qkv-bias", True)}
ACTIVATION_FLAGS = {"swiglu": "--swiglu", "squared_relu": "--squared-relu"}
SPEC_FIELDS = set(SPEC_VALUE_FLAGS) | set(SPEC_SWITCHES) | {"activation"}
# The columns that identify a point (as layer_run writes them): every field a plan may vary.
KEY_COLUMNS = ["backend", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "attention",
               "dtype", "dropout", "layers", "arch", "kv_heads", "kv_channels", "ffn_hidden", "normalization",
               "norm_epsilon",
               "qk_layernorm", "activation", "add_bias_linear", "add_qkv_bias", "position_embedding",
               "rotary_percent", "rotary_base", "attention_dropout", "hidden_dropout", "recompute_modules", "cp",
               "cp_comm_type", "ep", "etp"]
SHAPE_FIELDS = ("seq", "batch", "hidden", "heads", "tp")

BUILTIN_PLANS = {
    # Table 4: one 22B layer, t = 8, all five configurations.
    "table4": {"fixed": {"model": "22b", "tp": 8}, "grid": {"config": PAPER_CONFIGS}},
    # Memory and time against sequence length at 22B width (b = 1 so that long s fits).
    "seqlen": {"fixed": {"model": "22b", "tp": 8, "batch": 1},
               "grid": {"seq": [512, 1024, 2048, 4096, 8192, 16384, 32768], "config": PAPER_CONFIGS}},
    # Tensor-parallel size 1..8 at the 22B layer.
    "tp": {"fixed": {"model": "22b", "batch": 1}, "grid": {"tp": [1, 2, 4, 8], "config": PAPER_CONFIGS}},
    # The four Table 3 models at their per-rank shapes.
    "models": {"fixed": {}, "grid": {"model": PAPER_MODELS, "config": PAPER_CONFIGS}},
    # Beyond the paper: 1k..128k tokens at 22B width, the paper's attention and fused
    # (FlashAttention-style), with and without SP, full recompute; run with --memory-limit 80GiB
    # to see where each configuration stops fitting.
    "longseq": {"fixed": {"model": "22b", "tp": 8, "batch": 1},
                "grid": {"seq": [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
                         "attention": ATTENTIONS,
                         "config": ["baseline", "sp", "selective", "selective+sp", "full"]}},
    # Beyond the paper: the llama family (RMSNorm, GQA g = 8, RoPE, SwiGLU) at Llama 3 8B and
    # 70B per-rank shapes, s = 8192, t = 8, all five configurations.
    "llama": {"fixed": {"tp": 8}, "grid": {"model": ["llama3-8b", "llama3-70b"], "config": PAPER_CONFIGS}},
    # Beyond the paper: context parallelism at 22B width, 32k..1M tokens, t = 8 and C = 1..16
    # (ring attention, fused), with selective and full recompute under SP; on meta with
    # --memory-limit 80GiB it shows where each (configuration, C) stops fitting.
    "longcontext": {"fixed": {"model": "22b", "tp": 8, "batch": 1, "attention": "fused", "cp_comm_type": "p2p"},
                    "grid": {"seq": [32768, 65536, 131072, 262144, 524288, 1048576], "cp": [1, 2, 4, 8, 16],
                             "config": ["selective+sp", "full+sp"]}},
    # Beyond the paper: Mixtral-8x7B's MoE layer at t = 2 (SP, fused attention) with its experts
    # whole on each rank (ep 1), over the TP group (ep 2), over 2 and 4 replicas of it (ep 4, 8),
    # each split over TP or not (etp), under Megatron-Core's MoE recompute modules.
    "moe": {"fixed": {"model": "mixtral-8x7b", "tp": 2, "attention": "fused"},
            "grid": {"ep": [1, 2, 4, 8], "etp": [1, 2], "config": ["sp", "selective+sp", "full+sp"],
                     "recompute_modules": ["core_attn", "core_attn,moe_act", "core_attn,moe"]}},
    # A few seconds anywhere: for tests and first runs.
    "smoke": {"fixed": {"model": "tiny", "tp": 2}, "grid": {"seq": [16, 32], "config": PAPER_CONFIGS}},
}

INT_FIELDS = {"hidden", "heads", "seq", "batch", "tp", "layers", "kv_heads", "kv_channels", "ffn_hidden", "cp", "ep",
              "etp"}
TEXT_FIELDS = {"model", "config", "attention", "dtype", "arch", "cp_comm_type"}
CP_COMM_TYPES = ("p2p", "all_gather", "a2a")  # layer_run's --cp-comm-type
PROBABILITY_FIELDS = {"dropout", "attention_dropout", "hidden_dropout"}
NAME_FIELDS = {"normalization", "activation", "position_embedding"}  # names from SPEC_OPTIONS
POINT_FIELDS = INT_FIELDS | TEXT_FIELDS | SPEC_FIELDS | PROBABILITY_FIELDS | {"recompute_modules"}
# Megatron-LM's spelling of learned absolute positions: added before the first layer, so inside
# the layer they are none (layer_run writes none).
POSITION_ALIASES = {"learned_absolute": "none"}
# layer_run options the sweep sets itself (from the plan or its own options); --extra may not
# set them (the point key would lie).
OWN_OPTIONS = {"--backend", "--model", "--hidden", "--heads", "--seq", "--batch", "--tp", "--config", "--attention",
               "--dtype", "--dropout", "--layers", "--arch", "--kv-heads", "--ffn-hidden", "--csv", "--emulate-tp",
               "--warmup", "--iters", "--memory-limit", "--print-csv-header", "--help", "-h",
               "--cp", "--context-parallel-size", "--cp-comm-type", "--emulate-cp",
               *SPEC_VALUE_FLAGS.values(), *(flag for flag, _ in SPEC_SWITCHES.values()), *ACTIVATION_FLAGS.values(),
               "--norm-eps", "--rope-theta", "--ffn-hidden-size", "--group-query-attention", "--num-query-groups",
               "--recompute-modules", "--recompute-granularity", "--recompute-activations", "--sequence-parallel",
               "--expert-model-parallel-size", "--ep", "--expert-tensor-parallel-size", "--etp", "--emulate-ep",
               # an MoE or latent-attention spec: only an MoE preset's, which its model names
               "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
               "--moe-router-score-function", "--moe-router-pre-softmax", "--moe-router-topk-scaling-factor",
               "--moe-router-num-groups", "--moe-router-group-topk", "--moe-router-enable-expert-bias",
               "--moe-expert-capacity-factor", "--moe-tokens-per-expert", "--multi-latent-attention", "--q-lora-rank",
               "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"}
# layer_run options that change what runs but that no key column records: refused in --extra,
# since rows run with and without them would be the same point to a resumed sweep.
UNKEYED_OPTIONS = {"--hf-config": "put the config's shape in the plan (arch llama, hidden, heads, kv_heads, "
                                  "kv_channels, ffn_hidden, rotary_base, norm_epsilon, seq)"}
GRACE_S = 10.0  # after passing on a signal (or a timeout), how long a point may take to exit before SIGKILL
MAX_WARNINGS = 20

PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


class SweepError(Exception):
    pass


# ---------------------------------------------------------------- plans

MAX_PLAN_DEPTH = 4  # the plan > "grid" > a field's list > a list of configurations
MAX_POINTS = 1000000  # each point is a process: more is a mistake, not a sweep
MAX_SHOWN_CHARS = 60  # of a bad value, in its error line


def load_plan(name):
    if name in BUILTIN_PLANS:
        plan = dict(BUILTIN_PLANS[name])
        plan["name"] = name
        return plan
    if not os.path.lexists(name):
        raise SweepError(f"unknown plan '{name}': not one of {', '.join(BUILTIN_PLANS)} and no such file")
    try:
        text = user_files.read_text(f"plan file {name}", name)
    except user_files.UserFileError as e:
        raise SweepError(str(e))
    try:
        plan = json.loads(text, parse_constant=refuse_constant)
    except RecursionError:
        plan = None  # deeper than the parser goes: refused below as too deep
    except ValueError as e:  # not JSON, NaN or Infinity, an integer of thousands of digits
        raise SweepError(f"plan file {name}: not a JSON plan ({e})")
    if plan is None or nesting_depth(plan) > MAX_PLAN_DEPTH:
        raise SweepError(f"plan file {name}: nested deeper than a plan is (at most {MAX_PLAN_DEPTH} levels: "
                         f"the plan, grid, a field's list, a list of configurations)")
    if not isinstance(plan, dict) or not isinstance(plan.get("grid", {}), dict) \
            or not isinstance(plan.get("fixed", {}), dict):
        raise SweepError(f"plan file {name}: expected an object with 'grid' (and optional 'fixed') objects")
    plan.setdefault("name", os.path.splitext(os.path.basename(name))[0])
    if isinstance(plan["name"], (list, dict)):
        raise SweepError(f"plan file {name}: name={shown(plan['name'])} is not a name")
    plan["name"] = str(plan["name"])
    return plan


def refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def nesting_depth(value):
    """How many lists and objects deep value goes (without recursion: any depth is measured)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (v.values() if isinstance(v, dict) else v))
    return deepest


def shown(v):
    """A plan value as JSON, cut short for an error line."""
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "..."


def plan_value(plan, k, v):
    """A plan's value for field k as layer_run takes it; SweepError names what is wrong.
    Numbers are JSON numbers or strings spelled as layer_run reads them (number_text)."""
    where = f"plan '{plan['name']}': {k}={shown(v)}"
    if k in SPEC_SWITCHES:
        return plan_switch(where, v)
    if isinstance(v, bool) or v is None or isinstance(v, (list, dict)):
        raise SweepError(f"{where} is not a single value")
    if k in INT_FIELDS:
        if isinstance(v, str):
            v = number_text.integer(v, 1, number_text.INT64_MAX)
        elif isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or not 1 <= v <= number_text.INT64_MAX:
            raise SweepError(f"{where} is not a positive integer (1 .. 2^63-1, ASCII digits)")
        return v
    if k in PROBABILITY_FIELDS:
        v = plan_real(where, v)
        if not 0 <= v < 1 or number_text.to_float32(v) >= 1:
            raise SweepError(f"{where} is not in [0, 1) (as a float32, which layer_run runs)")
        return v
    if k == "rotary_percent":
        v = plan_real(where, v)
        if not 0 < v <= 1:
            raise SweepError(f"{where} is not in (0, 1]")
        return v
    if k in ("norm_epsilon", "rotary_base"):
        v, (lo, hi) = plan_real(where, v), SPEC_OPTIONS[f"{k}_range"]
        if not lo <= v <= hi:
            raise SweepError(f"{where} is not in [{lo:g}, {hi:g}]")
        return v
    if not isinstance(v, str) or not v.strip():
        raise SweepError(f"{where} is not a name")
    v = v.strip()
    if k == "recompute_modules":
        return modules_text(where, v)
    if k == "position_embedding":
        v = POSITION_ALIASES.get(v, v)
    if k in NAME_FIELDS and v not in SPEC_OPTIONS[k]:
        known = SPEC_OPTIONS[k] + (list(POSITION_ALIASES) if k == "position_embedding" else [])
        raise SweepError(f"{where} is not one of {', '.join(known)}")
    return v


def plan_real(where, v):
    """A finite number: a JSON number or a string layer_run reads as one."""
    if isinstance(v, str):
        v = number_text.real(v)
    try:
        finite = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    except OverflowError:  # an integer of hundreds of digits
        finite = False
    if not finite:
        raise SweepError(f"{where} is not a finite number (ASCII digits)")
    return float(v)


def plan_switch(where, v):
    """An on/off field: true or false, or 1 or 0 as its column writes it."""
    if v in (True, False, 1, 0, "1", "0") and not isinstance(v, float):
        return v in (True, 1, "1")
    raise SweepError(f"{where} is not true, false, 1 or 0")


def modules_text(where, v):
    """The recompute modules as layer_run writes them: its canonical order, each once."""
    names = SPEC_OPTIONS["recompute_modules"]
    words = v.split(",")
    for w in words:
        if w not in names:
            raise SweepError(f"{where}: '{w}' is not a recompute module (a comma-separated subset of "
                             f"{', '.join(names)})")
        if words.count(w) > 1:
            raise SweepError(f"{where} names '{w}' twice")
    return ",".join(n for n in names if n in words)


def config_list(plan, v):
    """'baseline,sp' or ['baseline', 'sp'] -> ['baseline', 'sp'] (one point each)."""
    out = []
    for item in (v if isinstance(v, list) else [v]):
        if not isinstance(item, str):
            raise SweepError(f"plan '{plan['name']}': config={shown(v)}: configurations are names")
        for c in item.split(","):
            if not c.strip():
                raise SweepError(f"plan '{plan['name']}': config={shown(v)} has an empty configuration")
            if c.strip() not in out:
                out.append(c.strip())
    if not out:
        raise SweepError(f"plan '{plan['name']}': config={shown(v)} is empty")
    return out


def expand(plan, defaults):
    """All points of a plan, each once: dicts of layer_run settings with every key column filled."""
    fixed = dict(plan.get("fixed", {}))
    grid = dict(plan.get("grid", {}))
    for k in list(fixed) + list(grid):
        if k not in POINT_FIELDS:
            raise SweepError(f"plan '{plan['name']}': unknown field '{k}' (known: {', '.join(sorted(POINT_FIELDS))})")
    for k in set(fixed) & set(grid):
        raise SweepError(f"plan '{plan['name']}': '{k}' is both fixed and in the grid")
    if "config" in fixed:  # a fixed list of configurations is a grid dimension
        grid["config"] = [fixed.pop("config")]
    grid.setdefault("config", list(PAPER_CONFIGS))  # as layer_run: all five, one point each
    dims = {}
    for k, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"plan '{plan['name']}': grid field '{k}' must be a non-empty list")
        if k == "config":
            dims[k] = [c for v in values for c in config_list(plan, v)]
        else:
            dims[k] = [plan_value(plan, k, v) for v in values]
    for k, v in fixed.items():
        if isinstance(v, list):
            raise SweepError(f"plan '{plan['name']}': fixed field '{k}' is a list: put it in 'grid'")
        fixed[k] = plan_value(plan, k, v)
    names = list(dims)
    if math.prod(len(dims[k]) for k in names) > MAX_POINTS:
        raise SweepError(f"plan '{plan['name']}': its grid has "
                         + " x ".join(f"{len(dims[k])} {k}" for k in names)
                         + f" values: more than {MAX_POINTS} points")
    points, seen = [], set()
    for values in itertools.product(*(dims[k] for k in names)):
        given = dict(fixed)
        given.update(zip(names, values))
        p = resolve(plan, given, defaults)
        ident = tuple(key_texts(p).values())
        if ident not in seen:  # a value listed twice (or a default spelled out) is still one point
            seen.add(ident)
            points.append(p)
    if ("recompute_modules" in fixed or "recompute_modules" in grid) and not any(p["recompute_modules"]
                                                                                 for p in points):
        raise SweepError(f"plan '{plan['name']}': recompute_modules needs a selective configuration "
                         f"({', '.join(sorted(SELECTIVE_CONFIGS))}) in config")
    return points


def resolve(plan, given, defaults):
    """One point's layer_run settings, every key column filled as layer_run will write its row:
    the preset's shape and spec (facts.json) unless the plan sets them. "arch" names the preset
    family the spec starts from (llama on a gpt model: the llama spec at its shape, g = heads
    and F = 4 x hidden); the plan's spec fields edit it. dropout is the point's --dropout,
    always given: the plan's, else defaults' for a gpt point, else the preset's."""
    p = {"dtype": "bf16", "layers": 1, "attention": "unfused", "cp": 1, "cp_comm_type": "p2p", "ep": 1, "etp": 1}
    p.update({k: v for k, v in defaults.items() if k != "dropout"})
    p.update(given)
    model = p.get("model", "tiny")
    if p["cp_comm_type"] not in CP_COMM_TYPES:
        raise SweepError(f"plan '{plan['name']}': unknown cp_comm_type '{p['cp_comm_type']}' "
                         f"(known: {', '.join(CP_COMM_TYPES)})")
    if model not in PRESETS:
        raise SweepError(f"plan '{plan['name']}': unknown model '{model}' (known: {', '.join(PRESETS)})")
    preset = PRESETS[model]
    p["model"] = model
    for k in SHAPE_FIELDS:
        p.setdefault(k, preset[k])
    where = f"plan '{plan['name']}': model {model}"
    check_experts(where, model, given, p)
    if model in MOE_MODELS:
        return resolve_moe(p, preset)
    arch = p.setdefault("arch", preset["arch"])
    if arch not in ARCHS:
        raise SweepError(f"{where}: unknown arch '{arch}' (known: {', '.join(ARCHS)})")
    if arch == "gpt" and preset["arch"] == "llama":
        raise SweepError(f"{where} is a llama model: arch gpt cannot run it")
    base = preset["spec"] if arch == preset["arch"] else ARCH_SPECS[arch]
    if "dropout" not in given:
        p["dropout"] = defaults.get("dropout", base["attention_dropout"]) if arch == "gpt" \
            else base["attention_dropout"]
    edits = {k: v for k, v in given.items() if k in SPEC_FIELDS}
    if arch == "llama":  # spelled out, as always: a llama point's row says the g and F it ran
        edits.setdefault("kv_heads", int(base["kv_heads"]) or p["heads"])
        edits.setdefault("ffn_hidden", int(base["ffn_hidden"]) or 4 * p["hidden"])
    p["varied"] = sorted(k for k in given if k in SPEC_FIELDS or k == "recompute_modules")
    p["spec"], p["spec_args"] = edited_spec(f"{where}, arch {arch}", base, p["dropout"], edits)
    return with_spec_columns(p, "recompute_modules" in given)


def with_spec_columns(p, modules_given):
    """p with the columns its spec fills (g, d, F as layer_run writes them) and its recompute
    modules (a selective configuration's: given, or layer_run's default; else none)."""
    p["kv_heads"] = int(p["spec"]["kv_heads"]) or p["heads"]
    p["kv_channels"] = int(p["spec"]["kv_channels"]) or p["hidden"] // p["heads"]  # the head size d
    p["ffn_hidden"] = int(p["spec"]["ffn_hidden"]) or 4 * p["hidden"]
    selective = p["config"] in SELECTIVE_CONFIGS
    p["recompute_modules"] = p.get("recompute_modules", SPEC_OPTIONS["default_recompute_modules"]) \
        if selective else ""
    if selective and modules_given:
        p["spec_args"] += ["--recompute-modules", p["recompute_modules"]]
    return p


def check_experts(where, model, given, p):
    """ep and etp on an MoE model only; an MoE model's spec is its preset's (not swept)."""
    if model not in MOE_MODELS:
        for k in ("ep", "etp"):
            if p[k] != 1:
                raise SweepError(f"{where}: {k}={p[k]} needs a mixture of experts (models "
                                 f"{', '.join(sorted(MOE_MODELS))})")
        return
    edited = sorted(k for k in given if k in SPEC_FIELDS or k in ("arch", "dropout"))
    if edited:
        raise SweepError(f"{where} runs its preset's spec: {', '.join(edited)} cannot be set on it")
    if p["etp"] not in (1, p["tp"]):
        raise SweepError(f"{where}: etp={p['etp']} must be 1 or tp ({p['tp']})")


def resolve_moe(p, preset):
    """An MoE preset's point: its spec as facts.json gives it, no spec flags, arch moe."""
    base = preset["spec"]
    p["arch"] = "moe"
    p["dropout"] = base["attention_dropout"]
    p["varied"] = sorted(k for k in ("recompute_modules",) if k in p)
    p["spec"], p["spec_args"] = dict(base), []
    return with_spec_columns(p, "recompute_modules" in p)


def experts_over_tp(p):
    """ep = tp with whole experts: the experts split over the tensor-parallel group itself."""
    return p["ep"] > 1 and p["ep"] == p["tp"] and p["etp"] == 1


def edited_spec(where, base, dropout, edits):
    """(the spec layer_run runs, the flags that make it from base): --dropout sets both
    dropouts, then each edit its own field, as layer_run applies them."""
    spec = dict(base, attention_dropout=number_text.to_float32(dropout),
                hidden_dropout=number_text.to_float32(dropout))
    args = []
    for k, v in ((c, edits[c]) for c in KEY_COLUMNS if c in edits):  # in the key's order
        if k in SPEC_SWITCHES:
            flag, sets = SPEC_SWITCHES[k]
            if v == sets:
                args.append(flag)
            elif v != base[k]:
                raise SweepError(f"{where}: {k}={int(v)}, but layer_run's {flag} only sets it to {int(sets)}")
        elif k == "activation":
            if v in ACTIVATION_FLAGS:
                args.append(ACTIVATION_FLAGS[v])
            elif v != base[k]:
                raise SweepError(f"{where}: activation={v}, but layer_run has no flag that turns "
                                 f"{base[k]} into {v} (only {' and '.join(ACTIVATION_FLAGS)})")
        else:
            args += [SPEC_VALUE_FLAGS[k], number_flag_text(k, v)]
        if k in PROBABILITY_FIELDS or k == "norm_epsilon":  # layer_run runs them as float32
            v = number_text.to_float32(v)
        spec[k] = v
    return spec, args


def number_flag_text(k, v):
    """A value as the sweep passes it: probabilities as their key text, other reals in
    Python's shortest round-trip spelling (layer_run's from_chars reads back the same double)."""
    if k in PROBABILITY_FIELDS:
        return key_text(k, v)
    return repr(v) if isinstance(v, float) else str(v)


def spec_family(s):
    """The arch column: layers/config.cpp's spec_family, on the spec layer_run runs."""
    plain = not s["qk_layernorm"] and s["rotary_percent"] == 1.0
    if plain and s["normalization"] == "LayerNorm" and s["activation"] == "gelu" and s["ffn_hidden"] == 0 \
            and s["add_bias_linear"] and s["kv_heads"] == 0 and s["kv_channels"] == 0 \
            and s["position_embedding"] == "none":
        return "gpt"
    if plain and s["normalization"] == "RMSNorm" and s["activation"] == "swiglu" and not s["add_bias_linear"] \
            and not s["add_qkv_bias"] and s["position_embedding"] == "rope" and s["attention_dropout"] == 0 \
            and s["hidden_dropout"] == 0:
        return "llama"
    return "custom"


def key_text(column, value):
    """The one spelling of a probability column's value: the text layer_run writes in its row,
    number_text.float32_text of the float32 it runs."""
    return number_text.float32_text(value) if column in PROBABILITY_FIELDS else str(value)


def key_texts(p):
    """The key columns of a point's row (but backend and emulated), as layer_run writes them
    (runners/result_row.cpp). A point is in the CSV when a row holds exactly these texts."""
    s = p["spec"]
    rope = s["position_embedding"] == "rope"
    texts = {c: str(p[c]) for c in ("model", "hidden", "heads", "seq", "batch", "tp", "config", "attention",
                                    "dtype", "cp")}
    texts["cp_comm_type"] = p["cp_comm_type"] if int(p["cp"]) > 1 else ""
    moe = p["model"] in MOE_MODELS
    texts["ep"], texts["etp"] = (str(p["ep"]), str(p["etp"])) if moe else ("", "")
    texts.update(
        dropout=key_text("dropout", s["attention_dropout"]) if s["attention_dropout"] == s["hidden_dropout"] else "",
        layers=str(p["layers"]), arch="moe" if moe else spec_family(s), kv_heads=str(p["kv_heads"]),
        kv_channels=str(p["kv_channels"]),
        ffn_hidden=str(p["ffn_hidden"]), normalization=s["normalization"],
        norm_epsilon=number_text.float32_text(s["norm_epsilon"]), qk_layernorm=str(int(s["qk_layernorm"])),
        activation=s["activation"], add_bias_linear=str(int(s["add_bias_linear"])),
        add_qkv_bias=str(int(s["add_qkv_bias"])), position_embedding=s["position_embedding"],
        rotary_percent="%.17g" % s["rotary_percent"] if rope else "",
        rotary_base="%.17g" % s["rotary_base"] if rope else "",
        attention_dropout=key_text("attention_dropout", s["attention_dropout"]),
        hidden_dropout=key_text("hidden_dropout", s["hidden_dropout"]),
        recompute_modules=p["recompute_modules"])
    return texts


def point_label(p):
    """A point in the progress lines: its shape and configuration, its family's g and F
    unless gpt, then the spec fields the plan set and a gpt dropout other than the preset's."""
    texts = key_texts(p)
    dropout, preset_dropout = key_text("dropout", p["dropout"]), PRESETS[p["model"]]["spec"]["attention_dropout"]
    return (f"{p['model']} s={p['seq']} b={p['batch']} t={p['tp']} {p['config']}"
            + (f" {texts['arch']} g={p['kv_heads']} F={p['ffn_hidden']}" if texts["arch"] != "gpt" else "")
            + (f" {p['attention']}" if p["attention"] != "unfused" else "")
            + (f" C={p['cp']} {p['cp_comm_type']}" if int(p["cp"]) > 1 else "")
            + (f" ep={p['ep']} etp={p['etp']}" if p["model"] in MOE_MODELS else "")
            + (f" p={dropout}" if p["arch"] == "gpt" and dropout != key_text("dropout", preset_dropout) else "")
            + "".join(f" {k}={texts[k]}" for k in p["varied"]
                      if texts[k] and k not in ("dropout", "kv_heads", "ffn_hidden")))


def key_columns(p, backend, emulated):
    """Every key column of a point's row, by name (key_texts with the backend and emulated)."""
    return dict(key_texts(p), backend=backend, emulated="1" if emulated else "0")


def point_key(p, backend, emulated):
    texts = key_columns(p, backend, emulated)
    return tuple(texts[c] for c in KEY_COLUMNS)


# ---------------------------------------------------------------- the CSV

def find_layer_run(build):
    candidates = []
    if build:
        candidates.append(build)
    elif os.environ.get("ACTBENCH_BUILD"):
        candidates.append(os.environ["ACTBENCH_BUILD"])
    else:
        # Every build*/ folder but simulator builds (ACTBENCH_CUDA_SIM=ON): their cuda backend
        # runs on the CPU, never what a sweep on a GPU node means. Name one with --build to use it.
        for d in sorted(os.listdir(ROOT)):
            if d.startswith("build") and not is_simulator_build(os.path.join(ROOT, d)):
                candidates.append(os.path.join(ROOT, d))
    found = [os.path.join(c, "runners", "layer_run") for c in candidates]
    found = [f for f in found if os.access(f, os.X_OK)]
    if not found:
        raise SweepError("layer_run not found: build first (bash scripts/build.sh) or set ACTBENCH_BUILD / --build")
    return max(found, key=os.path.getmtime)


def is_simulator_build(folder):
    try:
        with open(os.path.join(folder, "CMakeCache.txt"), errors="replace") as f:
            return any(line.startswith("ACTBENCH_CUDA_SIM:BOOL=ON") for line in f)
    except OSError:
        return False


def read_header(layer_run):
    out = subprocess.run([layer_run, "--print-csv-header"], capture_output=True, text=True, check=True).stdout
    return next(csv.reader(io.StringIO(out)))


def done_keys(path, header, retry_failed):
    """(keys of the points already in the CSV, malformed lines as 'FILE:LINE: why').

    A failed point counts as done unless retry_failed. A malformed line is no result: its
    point runs again."""
    try:
        if not results_csv.check_appendable(path, header):  # as layer_run decides: nothing yet, or refused
            return set(), []
        got, rows, problems = results_csv.read(path)
    except results_csv.BadFile as e:
        raise SweepError(f"{path}: {e}")
    if got != header:
        raise SweepError(f"{path} has a different header than this layer_run writes: use another --csv")
    idx = [header.index(c) for c in KEY_COLUMNS]
    status = header.index("status")
    keys = set()
    for _, row in rows:
        if retry_failed and row[status] == "failed":
            continue
        keys.add(tuple(row[i] for i in idx))
    return keys, results_csv.summarize(path, problems, MAX_WARNINGS)


def append_row(path, header, row):
    """One row appended as layer_run appends it (results_csv.append_row: under an exclusive lock,
    after cutting away an unfinished last row, taken back when the write fails); every refusal
    is an OSError naming the cause."""
    try:
        results_csv.append_row(path, header, row)
    except results_csv.BadFile as e:
        raise OSError(str(e)) from e


def end_last_line(path):
    """Makes the CSV end with its last whole row: an unfinished one (its writer was killed) is cut away."""
    results_csv.drop_unfinished_row(path)


def failed_row(header, key, status, message, command):
    """The row of a point that wrote none; key: its key columns by name (key_columns)."""
    values = {c: "" for c in header}
    values.update(key)
    values.update(status=status,
                  timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command=command)
    if "message" in values:
        values["message"] = message
    return [values[c] for c in header]


def create_csv(path, header):
    """A CSV that does not exist yet is made holding its header line, so that the sweep can lock
    the file (not only its name) and a sweep stopped before its first row leaves a CSV, not an
    empty file. The same discipline as append_row: one write, under flock, only into an empty file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size == 0:  # a layer_run run by hand may have been first
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerow(header)
            os.write(fd, buf.getvalue().encode())
    finally:
        os.close(fd)


# Locks named after a file's identity (device, inode), shared by every user of this host.
FILE_LOCK_DIR = "/tmp/actbench-sweep-locks"
MAX_NOTE_BYTES = 1 << 16  # a lock file's note: the holder's pid, point and CSV


class SweepLock:
    """Whoever holds it may run points into the CSV: two flocks, held for the whole sweep and
    inherited by each point's process. First FILE.lock beside the CSV's name (as a sweep on
    another host sharing the folder sees it), then, once the CSV exists, a lock named after the
    file's identity in FILE_LOCK_DIR, so that every name of one file (hard links) is one lock.
    Each lock file names its holder."""

    def __init__(self, csv_path):
        self.csv = os.path.realpath(csv_path)
        self.fds = []

    def acquire(self, wait, stopped, header):
        """Both locks (creating the CSV with its header when missing); False when stopped()
        while waiting."""
        if not self._take(self.csv + ".lock", wait, stopped):
            return False
        try:
            create_csv(self.csv, header)
            st = os.stat(self.csv)
        except OSError as e:
            raise SweepError(f"--csv {self.csv}: cannot create ({e.strerror or e})")
        return self._take(self._file_lock_path(st), wait, stopped)

    def _file_lock_path(self, st):
        try:
            os.mkdir(FILE_LOCK_DIR, 0o700)
            os.chmod(FILE_LOCK_DIR, 0o1777)  # every user's sweeps, like /tmp (umask aside)
        except FileExistsError:
            pass
        except OSError as e:
            raise SweepError(f"cannot create the lock folder {FILE_LOCK_DIR}: {e.strerror or e}")
        if not os.path.isdir(FILE_LOCK_DIR) or os.path.islink(FILE_LOCK_DIR):
            raise SweepError(f"the lock folder {FILE_LOCK_DIR} is not a folder")
        return os.path.join(FILE_LOCK_DIR, f"{st.st_dev}-{st.st_ino}.lock")

    def _open(self, path):
        """(fd, writable): a lock file made by another user may be flock'd read-only."""
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # no FIFO blocks the open
        try:
            fd, writable = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644), True
        except PermissionError:
            try:
                fd, writable = os.open(path, os.O_RDONLY | flags), False
            except OSError as e:
                raise SweepError(f"cannot open the lock file {path}: {e.strerror or e}")
        except OSError as e:
            raise SweepError(f"cannot open the lock file {path}: {e.strerror or e}")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SweepError(f"the lock file {path} is not a file: remove it")
        return fd, writable

    def _take(self, path, wait, stopped):
        fd, writable = self._open(path)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            if not wait:
                os.close(fd)
                raise SweepError(f"{self.csv} is in use by {self._holder(path)} (without --no-wait: wait for it)")
            if not told:
                print(f"sweep: {self.csv} is in use by {self._holder(path)}; waiting for it to end "
                      f"(Ctrl-C to stop)", file=sys.stderr, flush=True)
                told = True
            if stopped():
                os.close(fd)
                return False
            time.sleep(0.2)  # polled, so that a signal is answered at once
        self.fds.append((fd, writable))
        self.note(None)
        return True

    def _holder(self, path):
        try:
            info = json.loads(user_files.read_text("lock file", path, MAX_NOTE_BYTES))
            pid = int(info["sweep_pid"])
        except (user_files.UserFileError, ValueError, KeyError, TypeError, RecursionError):
            return "another sweep"
        try:
            os.kill(pid, 0)
            alive = True
        except (ProcessLookupError, OverflowError):
            alive = False
        except PermissionError:
            alive = True
        point = info.get("point")
        other = info.get("csv")
        via = f" through its other name {other}" if isinstance(other, str) and other != self.csv else ""
        if alive:
            return f"sweep pid {pid}" + (f" (running {point})" if point else "") + via
        return (f"a point left running by sweep pid {pid}, which has exited" + (f" ({point})" if point else "")
                + via)

    @property
    def inherited(self):
        """The lock fds each point's process keeps open (and so holds the locks while it runs)."""
        return tuple(fd for fd, _ in self.fds)

    def note(self, point):
        text = (json.dumps({"sweep_pid": os.getpid(), "point": point, "csv": self.csv}) + "\n").encode()
        for fd, writable in self.fds:
            if writable:
                os.ftruncate(fd, 0)
                os.pwrite(fd, text, 0)


# ---------------------------------------------------------------- running points

def mpirun_flavor(mpirun):
    if not mpirun:
        return None
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "other"
    return "openmpi" if "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr else "other"


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def layer_run_command(p, args, layer_run, emulated, csv_path):
    """The point's layer_run command, writing its row into csv_path."""
    moe = p["model"] in MOE_MODELS
    cmd = [layer_run, "--backend", args.backend, "--model", p["model"], "--hidden", str(p["hidden"]),
           "--heads", str(p["heads"]), "--seq", str(p["seq"]), "--batch", str(p["batch"]), "--tp", str(p["tp"]),
           "--config", p["config"], "--attention", p["attention"], "--dtype", p["dtype"],
           *([] if moe else ["--dropout", key_text("dropout", p["dropout"])]), "--layers", str(p["layers"]),
           *([] if moe else ["--arch", p["arch"]]), *p["spec_args"], "--csv", csv_path]
    if int(p["cp"]) > 1:
        cmd += ["--cp", str(p["cp"]), "--cp-comm-type", p["cp_comm_type"]]
    if moe:
        cmd += ["--expert-model-parallel-size", str(p["ep"]), "--expert-tensor-parallel-size", str(p["etp"])]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    if args.iters is not None:
        cmd += ["--iters", str(args.iters)]
    if args.memory_limit:
        cmd += ["--memory-limit", args.memory_limit]
    if args.extra:
        cmd += shlex.split(args.extra)
    if emulated and p["ep"] > 1 and not experts_over_tp(p):
        cmd.append("--emulate-ep")  # rank 0 of the expert-parallel world (its TP group too)
    elif emulated:
        cmd.append("--emulate-tp")
        if int(p["cp"]) > 1:
            cmd.append("--emulate-cp")
    return cmd


def world_size(p):
    """The point's ranks: t x C (Megatron's order inside layer_run); under expert parallelism
    over data-parallel replicas of the TP group, ep ranks (ep/t replicas) with whole experts or
    t x ep (ep replicas) with each expert split over TP."""
    if p["ep"] > 1 and not experts_over_tp(p):
        return int(p["tp"]) * int(p["ep"]) if p["etp"] > 1 else int(p["ep"])
    return int(p["tp"]) * int(p["cp"])


def command_for(p, args, layer_run, emulated, mpirun, flavor=None):
    """The point's command on this machine: layer_run, under mpirun -np t for real ranks."""
    cmd = layer_run_command(p, args, layer_run, emulated, args.csv)
    if not emulated and world_size(p) > 1:
        launcher = [mpirun, "-np", str(world_size(p))]
        if flavor == "openmpi" and world_size(p) > cpu_count():
            launcher.append("--oversubscribe")
        cmd = [*launcher, *cmd]
    return cmd


def check_recordable(todo, command_of):
    """Every point's command (command_of(point, emulated)) fits in its row's command column, one
    line of at most results_csv.MAX_FIELD_BYTES bytes (layer_run refuses a longer one, and so
    would the failed row the sweep writes for it): refused before any point runs, not at the
    first point."""
    for p, emulated, _, skip in todo:
        if skip:
            continue
        cmd = command_of(p, emulated)
        if any("\n" in w or "\r" in w for w in cmd):
            raise SweepError("--extra holds a line break: a row's command column is one line")
        size = len(shlex.join(cmd).encode("utf-8", "surrogateescape"))
        if size > results_csv.MAX_FIELD_BYTES:
            raise SweepError(f"the command of a point is {size} bytes, more than a CSV field holds "
                             f"({results_csv.MAX_FIELD_BYTES}); shorten --extra or --csv")


def launcher_env(flavor):
    """What our own launcher needs: Open MPI refuses root without these two variables."""
    env = dict(os.environ)
    if flavor == "openmpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def error_line(stderr, code):
    """The line that says why a point failed: not mpirun's boxed banners around it, nor srun's
    own lines after it ("srun: error: ...: task 0: Exited with exit code 2")."""
    outside, boxed, launcher, in_box = [], [], [], False
    for line in stderr.splitlines():
        s = line.strip()
        if s and set(s) <= set("-="):
            in_box = not in_box
            continue
        if s:
            (boxed if in_box else launcher if s.startswith("srun: ") else outside).append(s)
    for s in reversed(outside):
        if "error" in s.lower():
            return s
    if outside:
        return outside[-1]
    if boxed:
        return boxed[0]
    if launcher:
        return launcher[-1]
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _child_setup(parent_pid):
    """In the child before exec: die with the sweep (SIGTERM when it dies, however it dies)."""
    def setup():
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGTERM), ctypes.c_ulong(0), ctypes.c_ulong(0),
                        ctypes.c_ulong(0))
        if os.getppid() != parent_pid:  # the sweep died before the death signal was armed
            os._exit(1)
    return setup


class Runner:
    """Runs one point at a time in its own process group and passes SIGINT / SIGTERM on to it."""

    def __init__(self):
        self.child = None
        self.stop = None      # the signal that asked us to stop
        self.kill_at = None

    def on_signal(self, signum, frame):
        if self.stop is None:
            self.stop = signum
        if self.child is not None:
            self._signal_group(signum)
            if self.kill_at is None:
                self.kill_at = time.monotonic() + GRACE_S

    def _signal_group(self, signum):
        try:
            os.killpg(self.child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def run(self, cmd, env, timeout, keep_fds, output=None):
        """(exit status, stderr, timed_out). With output (an open file), stdout and stderr both go
        there (stderr is then ""), and stdin is /dev/null: how runners/gpu_eval.py runs a step."""
        if output is None:
            streams = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        else:
            streams = dict(stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
        try:
            self.child = subprocess.Popen(cmd, text=True, errors="replace", env=env, start_new_session=True,
                                          preexec_fn=_child_setup(os.getpid()), pass_fds=keep_fds, **streams)
        except (OSError, subprocess.SubprocessError) as e:
            return 127, f"cannot start {cmd[0]}: {getattr(e, 'strerror', None) or e}", False
        if self.stop is not None:
            self._signal_group(self.stop)
            self.kill_at = time.monotonic() + GRACE_S
        deadline = time.monotonic() + timeout
        timed_out = False
        while True:
            try:
                _, err = self.child.communicate(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if not timed_out and now > deadline:
                    timed_out = True
                    self._signal_group(signal.SIGTERM)
                    self.kill_at = now + GRACE_S
                if self.kill_at is not None and now > self.kill_at:
                    self._signal_group(signal.SIGKILL)
        self._signal_group(signal.SIGKILL)  # ranks or helpers the launcher left behind
        code = self.child.returncode
        self.child, self.kill_at = None, None
        return code, err or "", timed_out


# ---------------------------------------------------------------- main

def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def use_emulation(args, tp, mpirun, gpus):
    if tp == 1:
        return False
    if args.launcher == "emulate" or args.backend == "meta":
        return True
    if args.launcher == "slurm":
        return False  # srun starts the ranks on the allocation's nodes
    if args.launcher == "mpi":
        if not mpirun:
            raise SweepError("--launcher mpi but mpirun is not on PATH")
        return False
    # auto: real ranks when we can launch them (one GPU per rank for cuda)
    return mpirun is None or (args.backend == "cuda" and gpus < tp)


def fmt_time(sec):
    sec = int(sec)
    return f"{sec // 3600}:{sec // 60 % 60:02d}:{sec % 60:02d}"


def check_args(args):
    folder = os.path.dirname(os.path.abspath(args.csv))
    if os.path.isdir(args.csv):
        raise SweepError(f"--csv {args.csv} is a folder")
    if not os.path.isdir(folder):
        raise SweepError(f"--csv {args.csv}: folder {folder} does not exist")
    try:
        user_files.check_file(f"--csv {args.csv}", args.csv, must_exist=False)
    except user_files.UserFileError as e:
        raise SweepError(str(e))
    if args.extra:
        try:
            words = shlex.split(args.extra)
        except ValueError as e:
            raise SweepError(f"--extra: {e}")
        options = [w.split("=")[0] for w in words]
        own = sorted({o for o in options if o in OWN_OPTIONS})
        if own:
            raise SweepError(f"--extra may not set {', '.join(own)}: the sweep sets it (put it in the plan "
                             f"or use the sweep's own option)")
        unkeyed = sorted({o for o in options if o in UNKEYED_OPTIONS})
        if unkeyed:
            raise SweepError(f"--extra may not set {', '.join(unkeyed)}: it changes what runs but no CSV column "
                             f"records it, so a resumed sweep could not tell its points apart ("
                             + "; ".join(f"{o}: {UNKEYED_OPTIONS[o]}" for o in unkeyed) + ")")
    timeout = number_text.real(args.timeout)
    if timeout is None or timeout <= 0:
        raise SweepError(f"--timeout must be a positive number of seconds (ASCII digits), got '{args.timeout}'")
    args.timeout = timeout
    for option, least in (("warmup", 0), ("iters", 1), ("layers", 1)):  # layer_run bounds them from above
        given = getattr(args, option)
        if given is not None:
            value = number_text.integer(given, least, number_text.INT64_MAX)
            if value is None:
                raise SweepError(f"--{option} must be a whole number >= {least} (ASCII digits), got '{given}'")
            setattr(args, option, value)


def collect(args, lock, runner):
    """sweep.py --collect: under the CSV's lock, merges the rows of the points submitted to Slurm."""
    header = read_header(find_layer_run(args.build))
    if not lock.acquire(not args.no_wait, lambda: runner.stop is not None, header):
        print("sweep: stopped while waiting; nothing merged", file=sys.stderr)
        return 128 + runner.stop
    done, warnings = done_keys(args.csv, header, args.retry_failed)
    end_last_line(args.csv)
    for w in warnings:
        print(f"sweep: warning: {w}; not a result", file=sys.stderr)
    import sweep_slurm  # not at the top: it imports this module
    return sweep_slurm.collect(args, header, done, runner)


def main(argv=None):
    import sweep_slurm  # not at the top: it imports this module
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", nargs="?", help=" | ".join(BUILTIN_PLANS) + " | PLAN.json")
    ap.add_argument("--csv", required=True,
                    help="results CSV (appended to; resumable; FILE.lock beside it; created with its header)")
    ap.add_argument("--backend", default="meta", choices=["cpu", "cuda", "meta"])
    ap.add_argument("--launcher", default="auto", choices=["auto", "mpi", "emulate", "slurm"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--attention", default="unfused", choices=ATTENTIONS,
                    help="default for points whose plan does not set it")
    ap.add_argument("--dropout",
                    help="default for points of arch gpt whose plan does not set it (the preset's, 0.1); llama "
                         "points keep the preset's 0 unless the plan sets dropout")
    ap.add_argument("--layers", default="1")
    ap.add_argument("--warmup")
    ap.add_argument("--iters")
    ap.add_argument("--memory-limit", help="e.g. 80GiB: points past it are recorded as oom")
    ap.add_argument("--build", help="build folder holding runners/layer_run")
    ap.add_argument("--extra", help="more layer_run arguments, one string (not the ones the sweep sets, such as "
                                       "the spec's flags, nor --hf-config)")
    ap.add_argument("--dry-run", action="store_true", help="list the points and what would run; run nothing")
    ap.add_argument("--retry-failed", action="store_true", help="run points recorded as failed again")
    ap.add_argument("--no-wait", action="store_true",
                    help="exit 2 at once when another sweep holds the CSV, instead of waiting for it; with "
                         "slurm, also return once the points are submitted")
    ap.add_argument("--timeout", default="3600", help="seconds per point before it is failed (not with slurm: "
                                                      "--time)")
    sweep_slurm.add_options(ap)
    args = ap.parse_args(argv)

    runner = Runner()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, runner.on_signal)

    lock = SweepLock(args.csv)
    try:
        check_args(args)
        sweep_slurm.check_options(args)
        if args.collect:
            return collect(args, lock, runner)
        plan = load_plan(args.plan)
        defaults = {"dtype": args.dtype, "layers": args.layers, "attention": args.attention}  # checked
        if args.dropout is not None:
            defaults["dropout"] = plan_value({"name": "--dropout"}, "dropout", args.dropout)
        points = expand(plan, defaults)
        layer_run = find_layer_run(args.build)
        header = read_header(layer_run)
        if not args.dry_run and not lock.acquire(not args.no_wait, lambda: runner.stop is not None, header):
            print("sweep: stopped while waiting; nothing ran", file=sys.stderr)
            return 128 + runner.stop
        done, warnings = done_keys(args.csv, header, args.retry_failed)
        if not args.dry_run:
            end_last_line(args.csv)
    except (SweepError, subprocess.CalledProcessError, OSError) as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"sweep: warning: {w}; not a result, its point runs again", file=sys.stderr)
    mpirun = shutil.which("mpirun")
    gpus = gpu_count() if args.backend == "cuda" else 0

    todo = []
    for p in points:
        try:
            emulated = use_emulation(args, world_size(p), mpirun, gpus)
        except SweepError as e:
            print(f"sweep: error: {e}", file=sys.stderr)
            return 2
        key = point_key(p, args.backend, emulated)
        todo.append((p, emulated, key, key in done))
    if args.launcher == "slurm":
        return sweep_slurm.run(args, plan, todo, header, done, layer_run, runner)
    flavor = mpirun_flavor(mpirun) if any(not e and world_size(p) > 1 for p, e, _, _ in todo) else None
    env = launcher_env(flavor)
    try:
        check_recordable(todo, lambda p, emulated: command_for(p, args, layer_run, emulated, mpirun, flavor))
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    n_skip = sum(1 for t in todo if t[3])
    print(f"sweep {plan['name']}: {len(points)} points, {n_skip} already in {args.csv}, "
          f"{len(points) - n_skip} to run ({args.backend})", file=sys.stderr)
    if args.dry_run:
        for p, emulated, _, skip in todo:
            cmd = command_for(p, args, layer_run, emulated, mpirun, flavor)
            print(("skip  " if skip else "run   ") + shlex.join(cmd))
        return 0

    start = time.time()
    ran = failures = ooms = 0
    remaining = [t for t in todo if not t[3]]
    for i, (p, emulated, key, _) in enumerate(remaining):
        if runner.stop is not None:
            break
        cmd = command_for(p, args, layer_run, emulated, mpirun, flavor)
        label = point_label(p)
        lock.note(label)
        code, err, timed_out = runner.run(cmd, env, args.timeout, lock.inherited)
        if flavor == "openmpi" and code != 0 and "not enough slots" in err and "--oversubscribe" not in cmd:
            cmd.insert(3, "--oversubscribe")  # more ranks than Open MPI counts cores: run them anyway
            code, err, timed_out = runner.run(cmd, env, args.timeout, lock.inherited)
        lock.note(None)
        if runner.stop is not None and code != 0 and not timed_out:
            break  # stopped mid-point: no result, the point runs again next time
        # Whatever the exit status, the point has a row exactly when its process wrote one.
        try:
            written = point_key(p, args.backend, emulated) in done_keys(args.csv, header, False)[0]
        except SweepError as e:
            print(f"sweep: error: {e}", file=sys.stderr)
            return 2
        ran += 1
        message = None
        if timed_out:
            message = f"timed out after {args.timeout:g} s"
        elif code not in (0, 3):
            message = error_line(err, code)
        elif not written:
            message = f"layer_run exited with status {code} but wrote no row"
        if message is not None and not written:
            failures += 1
            state = "failed"
            try:
                append_row(args.csv, header, failed_row(header, key_columns(p, args.backend, emulated), "failed",
                                                        message, shlex.join(cmd)))
            except OSError as e:
                print(f"sweep: error: cannot append to {args.csv}: {e.strerror or e}", file=sys.stderr)
                return 2
        elif message is not None:
            failures += 1
            state = "failed (its row was written)"
        else:
            state = "oom" if code == 3 else "ok"
            ooms += code == 3
        elapsed = time.time() - start
        eta = elapsed / (i + 1) * (len(remaining) - i - 1)
        print(f"[{n_skip + i + 1}/{len(points)}] {label}: {state}  elapsed {fmt_time(elapsed)}  "
              f"eta {fmt_time(eta)}" + (f"  ({message})" if message else ""), file=sys.stderr, flush=True)
    if runner.stop is not None:
        print(f"sweep: stopped by {signal.Signals(runner.stop).name} after {ran} points; finished rows are in "
              f"{args.csv}, run again to resume", file=sys.stderr)
        return 128 + runner.stop
    print(f"sweep {plan['name']}: ran {ran} ({ooms} oom, {failures} failed) in {fmt_time(time.time() - start)}; "
          f"results in {args.csv}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    # Run as the module `sweep`, the one runners/sweep_slurm.py imports: one copy of its names
    # (SweepError above all), not a second one under __main__.
    import sweep as _sweep_module  # noqa: E402
    sys.exit(_sweep_module.main())
