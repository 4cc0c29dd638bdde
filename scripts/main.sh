#!/usr/bin/env bash
# The main job: the formulas, every measurement this machine can make, and the figures.
#   theory  Table 2, Figures 1 and 7, Table 5's model, long-sequence fit  -> OUT/theory
#   meta    activation bytes of one layer per rank, the four paper models (t = 8) and the
#           22B layer from 1k to 128k tokens, paper's and fused attention, and from 32k to
#           1M tokens with context parallelism C = 1..16                   -> OUT/meta_*.csv
#   llama   the same bytes for LLaMA-3 8B/70B/405B layers (meta, t = 8)  -> OUT/meta_llama.csv
#   modules each --recompute-modules set, 22B and LLaMA-3 8B (meta, t = 8) -> OUT/meta_recompute_modules.csv
#   cpu     the tiny layer, all configurations, t = 1 and t = 2 over MPI   -> OUT/cpu_tiny.csv
#           (and its llama-family twin                                     -> OUT/cpu_tiny_llama.csv)
#   cuda    Table 4 (22B layer, t = 8 emulated) + CUPTI phase split, when a GPU is present
#   plots   every table and figure the data allows                         -> OUT/figures
# Usage: bash scripts/main.sh [OUT]   (default OUT = out/). Results are appended, so a
# second run adds rows; delete OUT to start over.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ACTBENCH_BUILD:-$root/build}"
out="${1:-$root/out}"
bash "$root/scripts/build.sh"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export ACTBENCH_BUILD="$build"
lr="$build/runners/layer_run"
py=python3
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then py=/usr/bin/python3; fi
configs=baseline,sp,full,selective,selective+sp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
       OMPI_MCA_btl_vader_single_copy_mechanism=none

echo "== theory: the paper's formulas -> $out/theory"
"$build/runners/theory" --out "$out/theory" >/dev/null

echo "== meta: activation memory of one layer per rank, four paper models, t = 8"
for attention in unfused fused; do
  for m in 22b 175b 530b 1t; do
    "$lr" --backend meta --model "$m" --tp 8 --emulate-tp --config "$configs,full+sp" --attention "$attention" \
          --csv "$out/meta_models.csv" >/dev/null
  done
done

echo "== meta: LLaMA-3 layers (GQA, RMSNorm, RoPE, SwiGLU), 8B/70B/405B, t = 8"
for attention in unfused fused; do
  for m in llama3-8b llama3-70b llama3-405b; do
    "$lr" --backend meta --model "$m" --tp 8 --emulate-tp --config "$configs" --attention "$attention" \
          --csv "$out/meta_llama.csv" >/dev/null
  done
done

echo "== meta: every --recompute-modules set (selective+sp), 22B and LLaMA-3 8B, t = 8"
for attention in unfused fused; do
  for m in 22b llama3-8b; do
    for modules in core_attn mlp layernorm core_attn,mlp core_attn,layernorm mlp,layernorm core_attn,mlp,layernorm; do
      "$lr" --backend meta --model "$m" --tp 8 --emulate-tp --config selective+sp --recompute-modules "$modules" \
            --attention "$attention" --csv "$out/meta_recompute_modules.csv" >/dev/null
    done
  done
done

echo "== meta: MoE presets (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3), t = 2 + SP, every MoE module set, balanced routing"
for attention in unfused fused; do
  for m in mixtral-8x7b qwen3-30b-a3b; do
    "$lr" --backend meta --model "$m" --tp 2 --emulate-tp --config sp,full+sp --attention "$attention" \
          --csv "$out/meta_moe_modules.csv" >/dev/null
    for modules in core_attn core_attn,moe_act core_attn,layernorm,moe_act core_attn,moe core_attn,layernorm,moe; do
      "$lr" --backend meta --model "$m" --tp 2 --emulate-tp --config selective+sp --recompute-modules "$modules" \
            --attention "$attention" --csv "$out/meta_moe_modules.csv" >/dev/null
    done
  done
done
# DeepSeek-V3: shared experts and latent attention add their module sets.
for attention in unfused fused; do
  "$lr" --backend meta --model deepseek-v3 --tp 2 --emulate-tp --config sp,full+sp --attention "$attention" \
        --csv "$out/meta_moe_modules.csv" >/dev/null
  for modules in core_attn core_attn,moe_act core_attn,moe_act,shared_experts core_attn,layernorm,moe_act \
                 core_attn,moe core_attn,layernorm,moe core_attn,mla_up_proj,moe_act core_attn,layernorm,mla_up_proj,moe; do
    "$lr" --backend meta --model deepseek-v3 --tp 2 --emulate-tp --config selective+sp --recompute-modules "$modules" \
          --attention "$attention" --csv "$out/meta_moe_modules.csv" >/dev/null
  done
done

echo "== meta: 22B layer, 1k..128k tokens, paper's and fused attention, 80 GB device (resumable sweep)"
"$py" "$root/runners/sweep.py" longseq --backend meta --memory-limit 80GB --csv "$out/meta_longseq.csv"

echo "== meta: 22B layer, 32k..1M tokens, context parallelism C = 1..16 (ring), 80 GB device (resumable sweep)"
"$py" "$root/runners/sweep.py" longcontext --backend meta --memory-limit 80GB \
      --csv "$out/meta_longcontext.csv"

echo "== cpu: tiny layer, t = 1 and t = 2 (MPI), fp32"
"$lr" --backend cpu --model tiny --config "$configs" --dtype fp32 --iters 20 --csv "$out/cpu_tiny.csv" >/dev/null
if command -v mpirun >/dev/null; then
  mpirun -np 2 "$lr" --backend cpu --model tiny --tp 2 --config "$configs" --dtype fp32 --iters 20 \
         --csv "$out/cpu_tiny.csv" >/dev/null
fi

echo "== cpu: tiny llama-family layer (4 query heads, 2 key/value groups), t = 1 and t = 2 (MPI), fp32"
"$lr" --backend cpu --model tiny --arch llama --kv-heads 2 --config "$configs" --dtype fp32 --iters 20 \
      --csv "$out/cpu_tiny_llama.csv" >/dev/null
if command -v mpirun >/dev/null; then
  mpirun -np 2 "$lr" --backend cpu --model tiny --arch llama --kv-heads 2 --tp 2 --config "$configs" --dtype fp32 \
         --iters 20 --csv "$out/cpu_tiny_llama.csv" >/dev/null
fi

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "== cuda: Table 4 (22B layer, t = 8 emulated, bf16) with the CUPTI phase split"
  "$lr" --backend cuda --model 22b --tp 8 --emulate-tp --config "$configs" --warmup 3 --iters 20 \
        --csv "$out/table4_cuda.csv" --cupti "$out/table4_cuda_cupti.csv"
else
  echo "== cuda: skipped (no GPU on this machine)"
fi

echo "== plots"
"$py" "$root/plots/make_all.py" "$out" "$out/figures" --theory "$out/theory"
"$py" "$root/tools/summarize.py" "$out/meta_models.csv" "$out/cpu_tiny.csv"
echo
echo "results: $out/*.csv   formulas: $out/theory/   tables and figures: $out/figures/index.md"
