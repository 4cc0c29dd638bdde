"""theory memory as a user runs it: Megatron-LM launch scripts (tests/fixtures/megatron) and
bad ones, the CSV's columns as docs/step_memory.md declares them, and the activations in
flight against the per-layer bytes the meta backend measures.

Run by ctest with ACTBENCH_THEORY and ACTBENCH_LAYER_RUN pointing at the binaries. Standard
library only.
"""
import csv
import os
import re
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
THEORY = os.environ.get("ACTBENCH_THEORY", os.path.join(ROOT, "build", "runners", "theory"))
LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN", os.path.join(ROOT, "build", "runners", "layer_run"))
SCRIPTS = os.path.join(HERE, "fixtures", "megatron")


def run(args, timeout=60):
    return subprocess.run([THEORY, "memory", *args], capture_output=True, text=True, timeout=timeout)


def documented_columns():
    """The column names of docs/step_memory.md's CSV table, in order."""
    with open(os.path.join(ROOT, "docs", "step_memory.md"), encoding="utf-8") as f:
        text = f.read()
    table = text.split("## The CSV", 1)[1]
    return re.findall(r"^\| `([a-z0-9_]+)` \|", table, flags=re.M)


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


TERMS = ["activation_bytes", "embedding_bytes", "output_bytes", "recompute_working_set_bytes",
         "grad_working_set_bytes", "loss_working_set_bytes", "embedding_grad_bytes", "fsdp_gathered_weight_bytes",
         "fsdp_unsharded_grad_bytes"]


class LaunchScripts(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def memory_csv(self, args):
        out = os.path.join(self.tmp.name, "memory.csv")
        r = run([*args, "--csv", out])
        self.assertEqual(r.returncode, 0, r.stderr)
        return r, read_rows(out)

    def test_deepseek_v3_config_with_expert_parallelism_stage_by_stage(self):
        config = os.path.join(ROOT, "tests", "fixtures", "hf", "DeepSeek-V3", "config.json")
        r, (header, rows) = self.memory_csv([
            "--hf-config", config, "--gpus", "1024", "--tensor-model-parallel-size", "2",
            "--pipeline-model-parallel-size", "8", "--decoder-first-pipeline-num-layers", "5",
            "--expert-model-parallel-size", "64", "--expert-tensor-parallel-size", "1", "--sequence-parallel",
            "--seq-length", "4096", "--global-batch-size", "8192", "--use-distributed-optimizer",
            "--recompute-granularity", "selective", "--recompute-modules", "moe_act,layernorm"])
        self.assertEqual(header, documented_columns())
        self.assertEqual([int(row["layers"]) for row in rows], [5] + [8] * 7)
        self.assertIn("+experts E=256 k=8", r.stdout)
        self.assertIn("58 of 61 layers, ep=64 etp=1", r.stdout)
        self.assertEqual(len(r.stdout.splitlines()), 3 + 8 + 1)  # the run, the header, a line per stage, the note
        experts = [int(row["expert_parameters"]) for row in rows]
        # stage 0: layers 0-4, of which 3 and 4 have experts; the others 8 MoE layers each
        self.assertEqual(experts[1], 4 * experts[0])
        self.assertEqual(len(set(experts[1:])), 1)
        # 4 of the 256 experts per GPU, each 2048 wide (SwiGLU: 3 x 7168 x 2048 weights), whole (etp 1)
        self.assertEqual(experts[1], 8 * 4 * 3 * 7168 * 2048)
        for row in rows:
            params, expert = int(row["parameters"]), int(row["expert_parameters"])
            # bf16 weights, fp32 main_grad, 12 bytes of optimizer state: dense parameters sharded
            # over dp = 1024 / (2 x 8) = 64, the experts' over 2 x 64 / (64 x 1) = 2
            self.assertEqual(int(row["weight_bytes"]), 2 * params)
            self.assertEqual(int(row["grad_bytes"]), 4 * params)
            self.assertAlmostEqual(int(row["optimizer_bytes"]) / (12 * ((params - expert) / 64 + expert / 2)), 1,
                                   places=9)

    def test_routing_imbalance_grows_the_experts_rows_up_to_the_dropless_bound(self):
        mixtral = ["--model", "mixtral-8x7b", "--gpus", "64", "--tensor-model-parallel-size", "2",
                   "--pipeline-model-parallel-size", "4", "--expert-model-parallel-size", "8", "--sequence-parallel",
                   "--micro-batch-size", "1", "--global-batch-size", "256"]
        peaks = {}
        for load in ("1", "2", "4", "max"):
            r, (_, rows) = self.memory_csv(mixtral + ["--moe-expert-load", load])
            peaks[load] = [int(row["peak_bytes"]) for row in rows]
            rests = [int(row["rest_bytes"]) for row in rows]
            if load == "1":
                self.assertNotIn("balanced rows", r.stdout)
                balanced_rests = rests
            self.assertEqual(rests, balanced_rests)  # the state does not move with the routing
        self.assertIn("busiest rank's experts 4x balanced rows (the dropless bound)", r.stdout)
        for stage in range(4):
            self.assertLess(peaks["1"][stage], peaks["2"][stage])
            self.assertLess(peaks["2"][stage], peaks["4"][stage])
        # 8 experts over ep = 8, k = 2: one expert per rank, so every token reaches it at most once
        self.assertEqual(peaks["4"], peaks["max"])
        for bad in ("0.5", "x", "", "inf"):
            with self.subTest(bad):
                r = run(mixtral + ["--moe-expert-load", bad])
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn("--moe-expert-load", r.stderr)
        r = run(["--model", "llama3-8b", "--gpus", "8", "--moe-expert-load", "2"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("has no experts", r.stderr)

    def test_each_script_gives_one_row_per_stage_that_adds_up(self):
        stages = {"gpt3_857m.sh": 2, "llama3_8b.sh": 2, "qwen3_like_interleaved.sh": 4}
        zero3 = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
        runs = [(name, p, []) for name, p in stages.items()] + [("llama3_8b.sh", 2, zero3)]
        for name, p, extra in runs:
            with self.subTest(name, extra=extra):
                r, (header, rows) = self.memory_csv(["--megatron-args", os.path.join(SCRIPTS, name)] + extra)
                if extra:  # Megatron-FSDP's unsharded copies are part of every stage's peak
                    self.assertTrue(all(int(row["fsdp_gathered_weight_bytes"]) > 0 for row in rows))
                self.assertEqual(header, documented_columns())
                self.assertEqual(len(rows), p)
                self.assertEqual([int(row["stage"]) for row in rows], list(range(p)))
                for row in rows:
                    rest = sum(int(row[k]) for k in ("weight_bytes", "grad_bytes", "optimizer_bytes", "workspace_bytes", "fp8_weight_bytes"))
                    self.assertEqual(int(row["rest_bytes"]), rest)
                    self.assertEqual(int(row["step_peak_bytes"]), rest + sum(int(row[k]) for k in TERMS))
                    self.assertEqual(int(row["peak_bytes"]),
                                     max(int(row["step_peak_bytes"]), int(row["setup_peak_bytes"])))
                self.assertGreater(int(rows[0]["embedding_bytes"]), 0)
                self.assertGreater(int(rows[-1]["output_bytes"]), 0)
                self.assertIn("GiB per GPU", r.stdout)

    def test_a_deepseek_recipe_with_megatrons_router_flags(self):
        # --moe-router-dtype, the aux loss and --moe-permute-fusion are read, not refused, and
        # change only the MoE stages' saved tensors: the router's bookkeeping, per MoE layer.
        script = os.path.join(SCRIPTS, "deepseek_v3_proxy.sh")
        r, (header, rows) = self.memory_csv(["--megatron-args", script])
        self.assertEqual(r.stderr, "")
        self.assertEqual(len(rows), 4)
        self.assertIn("13 of 16 layers, ep=32 etp=1", r.stdout)
        _, (_, plain) = self.memory_csv(["--megatron-args", script, "--moe-aux-loss-coeff", "0",
                                         "--moe-router-load-balancing-type", "none"])
        for got, without in zip(rows, plain):
            self.assertEqual(got["rest_bytes"], without["rest_bytes"])
            self.assertEqual(got["microbatches_in_flight"], without["microbatches_in_flight"])
            self.assertGreater(int(got["activation_bytes"]), int(without["activation_bytes"]))
        # the aux loss's fp32 sigmoid and row sums: 4 x 4096 x (256 + 1) bytes per MoE layer and
        # micro-batch; stage 3 holds 1 micro-batch of its 4 MoE layers at its peak
        last, last_plain = rows[-1], plain[-1]
        self.assertEqual(int(last["microbatches_in_flight"]), 1)
        self.assertEqual(int(last["activation_bytes"]) - int(last_plain["activation_bytes"]), 4 * 4 * 4096 * 257)
        # DeepSeek-V3's multi-token prediction: one more MoE layer and the embedding's copy on the
        # last stage (129280 x 7168 at t = 1), nothing elsewhere
        r, (_, mtp) = self.memory_csv(["--megatron-args", script, "--mtp-num-layers", "1"])
        self.assertIn("+mtp 1 (last stage)", r.stdout)
        self.assertEqual([row["parameters"] for row in mtp[:3]], [row["parameters"] for row in rows[:3]])
        self.assertGreater(int(mtp[3]["parameters"]) - int(rows[3]["parameters"]), 129280 * 7168)
        self.assertGreater(int(mtp[3]["output_bytes"]), int(rows[3]["output_bytes"]))

    def test_the_command_line_overrides_the_script(self):
        script = os.path.join(SCRIPTS, "llama3_8b.sh")
        _, (_, base) = self.memory_csv(["--megatron-args", script])
        _, (_, wider) = self.memory_csv(["--megatron-args", script, "--tensor-model-parallel-size", "4",
                                         "--pipeline-model-parallel-size", "1", "--gpus", "8"])
        self.assertEqual(len(wider), 1)
        self.assertLess(int(wider[0]["weight_bytes"]), 2 * int(base[0]["weight_bytes"]))

    def test_presets_take_their_own_layout(self):
        _, (_, rows) = self.memory_csv(["--model", "175b", "--gpus", "512"])
        self.assertEqual(len(rows), 8)  # Table 3's p = 8

    def test_unmodelled_flags_are_named_in_one_warning_line(self):
        with open(os.path.join(SCRIPTS, "llama3_8b.sh"), encoding="utf-8") as f:
            text = f.read()
        path = os.path.join(self.tmp.name, "fp8.sh")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.rstrip() + " \\\n    --fp8-format hybrid --fp16-lm-cross-entropy\n")
        r = run(["--megatron-args", path])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("--fp8-format (its activations, counted in 16 bits", lines[0])  # read in part
        self.assertIn("--fp16-lm-cross-entropy", lines[0])
        # The FP8 weight caches: their own column, in REST; the 16-bit weights stay.
        self.assertIn("fp8 w", r.stdout)
        self.assertIn("FP8 delayed (GEMM weights cached)", r.stdout)
        _, (_, fp8_rows) = self.memory_csv(["--megatron-args", path])
        _, (_, bf16_rows) = self.memory_csv(["--megatron-args", os.path.join(SCRIPTS, "llama3_8b.sh")])
        for fp8, bf16 in zip(fp8_rows, bf16_rows):
            cache = int(fp8["fp8_weight_bytes"])
            self.assertGreater(cache, int(fp8["weight_bytes"]) * 0.8)  # 2 bytes a GEMM weight, most of the weights
            self.assertLess(cache, int(fp8["weight_bytes"]))           # not the embedding and output layer
            self.assertEqual(int(fp8["rest_bytes"]) - int(bf16["rest_bytes"]), cache)
            self.assertEqual(fp8["weight_bytes"], bf16["weight_bytes"])


class PlanFromAScript(unittest.TestCase):
    def test_the_layout_search_reads_a_scripts_model_as_the_preset(self):
        # llama3_8b.sh describes the llama3-8b preset exactly (8192 tokens, padded vocabulary).
        with tempfile.TemporaryDirectory() as tmp:
            tables = []
            for source in (["--megatron-args", os.path.join(SCRIPTS, "llama3_8b.sh")], ["--model", "llama3-8b"]):
                out = os.path.join(tmp, "plan%d.csv" % len(tables))
                r = subprocess.run([THEORY, "plan", *source, "--gpus", "16", "--global-batch", "64", "--gpu", "h100",
                                    "--csv", out], capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                tables.append([{k: v for k, v in row.items() if k != "model"} for row in read_rows(out)[1]])
        self.assertEqual(tables[0], tables[1])
        self.assertGreater(len(tables[0]), 10)

    def test_the_scripts_global_batch_is_the_default(self):
        r = subprocess.run([THEORY, "plan", "--megatron-args", os.path.join(SCRIPTS, "llama3_8b.sh"), "--gpus", "8",
                            "--top", "1"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("global batch 128 sequences", r.stdout)


class BadInput(unittest.TestCase):
    BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
            "--max-position-embeddings 512 --vocab-size 1000 --world-size 4 --bf16 ")

    def check_refused(self, script, words, extra=()):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "train.sh")
            with open(path, "w", encoding="utf-8") as f:
                f.write(script)
            r = run(["--megatron-args", path, *extra])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("theory: error: "), lines[0])
        for w in words:
            self.assertIn(w, lines[0])
        self.assertEqual(r.stdout, "")

    def test_bad_scripts_are_one_line_naming_the_flag(self):
        cases = {
            "--num-experts 8 --moe-router-dtype bf16": ["--moe-router-dtype", "fp32 or fp64", "bf16"],
            "--num-experts 8 --moe-router-load-balancing-type sinkhorn aux_loss": ["sinkhorn", "alone"],
            "--num-experts 6 --expert-model-parallel-size 4": ["--num-experts (6)", "--expert-model-parallel-size (4)"],
            "--expert-model-parallel-size 2": ["--expert-model-parallel-size 2", "mixture of experts"],
            "--num-experts 8 --expert-model-parallel-size 2 --expert-tensor-parallel-size 4":
                ["must divide tensor x context x data parallel (4)"],
            "--num-experts 8 --moe-layer-freq [1,0]": ["--moe-layer-freq", "one entry per layer (4)"],
            "--context-parallel-size 3": ["context parallel (3)"],
            "--context-parallel-size 2 --cp-comm-type a2a+p2p": ["--cp-comm-type", "a2a+p2p"],
            "--context-parallel-size 2 --seq-length 510": ["--seq-length (510)", "2 x 2"],
            "--multi-latent-attention --kv-lora-rank 0": ["--kv-lora-rank"],
            "--tensor-model-parallel-size $TP": ["--tensor-model-parallel-size", "$TP"],
            "--tensor-model-parallel-size 3": ["3"],
            "--recompute-granularity full": ["--recompute-method"],
            "--recompute-granularity everything": ["--recompute-granularity"],
            "--normalization BatchNorm": ["BatchNorm"],
            "--global-batch-size 6": ["--global-batch-size"],
            "--hidden-size 0": ["--hidden-size"],
            "--micro-batch-size": ["--micro-batch-size", "needs a value"],
            "--optimizer lion": ["--optimizer"],
            "--pipeline-model-parallel-size 3": ["pipeline"],
            "--data-path 'unterminated": ["quote"],
        }
        for extra, words in cases.items():
            with self.subTest(extra):
                self.check_refused(self.BASE + extra + "\n", words)

    def test_what_the_script_does_not_say(self):
        self.check_refused("--hidden-size 256 --num-attention-heads 8 --vocab-size 10 --world-size 1\n",
                           ["--num-layers"])
        self.check_refused("--num-layers 2 --hidden-size 256 --num-attention-heads 8 --vocab-size 10\n",
                           ["--gpus"])
        self.check_refused("--num-layers 2 --hidden-size 256 --num-attention-heads 8 --world-size 1 "
                           "--tokenizer-type HuggingFaceTokenizer\n", ["--vocab-size"])

    def test_the_command_line_is_strict(self):
        script = self.BASE + "\n"
        self.check_refused(script, ["--tensor-model-paralel-size"], ["--tensor-model-paralel-size", "2"])
        self.check_refused(script, ["stray"], ["stray"])

    def test_one_model_source(self):
        for args in (["--model", "22b", "--megatron-args", os.path.join(SCRIPTS, "llama3_8b.sh")], [],
                     ["--model", "22b", "--gpus", "8", "--hidden-size", "128"],
                     ["--model", "nope", "--gpus", "8"],
                     ["--megatron-args", HERE]):
            with self.subTest(args):
                r = run(args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


class AgainstMeta(unittest.TestCase):
    """Stage 0's activations at its peak are the micro-batches the schedule holds there times
    what one stage's layers keep, as layer_run measures it on the meta backend."""

    SHAPE = ["--model", "tiny", "--hidden", "256", "--heads", "8", "--seq", "256", "--batch", "2"]

    def measure(self, tmp, flags, layers):
        out = os.path.join(tmp, "meta.csv")
        args = [LAYER_RUN, "--backend", "meta", *self.SHAPE, "--tp", "2", "--emulate-tp", "--layers", str(layers),
                *flags, "--csv", out]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        _, rows = read_rows(out)
        self.assertEqual(len(rows), 1)
        return rows[0]

    def stage0(self, tmp, megatron_flags):
        script = os.path.join(tmp, "train.sh")
        with open(script, "w", encoding="utf-8") as f:
            f.write("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 256 "
                    "--max-position-embeddings 256 --micro-batch-size 2 --global-batch-size 16 "
                    "--vocab-size 1000 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                    "--world-size 4 --bf16 " + " ".join(megatron_flags) + "\n")
        out = os.path.join(tmp, "memory.csv")
        r = run(["--megatron-args", script, "--csv", out])
        self.assertEqual(r.returncode, 0, r.stderr)
        return read_rows(out)[1][0]

    def check(self, layer_flags, megatron_flags, run_flags, stack=False):
        with tempfile.TemporaryDirectory() as tmp:
            row = self.stage0(tmp, layer_flags + megatron_flags)
            measured = self.measure(tmp, layer_flags + run_flags, 4 if stack else 1)
        per_stage = int(measured["stack_act_bytes"]) if stack else \
            4 * (int(measured["act_bytes"]) + int(measured["act_extra_bytes"]))
        in_flight = int(row["microbatches_in_flight"])
        self.assertIn(in_flight, (1, 2))  # 1F1B's stage 0 of 2 holds 2 (1 at its embedding's backward)
        self.assertEqual(int(row["activation_bytes"]), in_flight * per_stage)

    def test_gpt_layer_unfused_no_recompute(self):
        spec = ["--attention-dropout", "0.1", "--hidden-dropout", "0.1"]
        self.check(spec, ["--transformer-impl", "local"], ["--config", "baseline", "--attention", "unfused"])

    def test_llama_style_layer_fused_selective_with_modules(self):
        spec = ["--normalization", "RMSNorm", "--swiglu", "--ffn-hidden-size", "704", "--disable-bias-linear",
                "--group-query-attention", "--num-query-groups", "2", "--position-embedding-type", "rope",
                "--qk-layernorm", "--attention-dropout", "0", "--hidden-dropout", "0",
                "--recompute-granularity", "selective", "--sequence-parallel", "--recompute-modules", "core_attn,mlp"]
        self.check(spec, [], ["--attention", "fused"])

    def test_full_recompute_uniform_groups(self):
        spec = ["--attention-dropout", "0.1", "--hidden-dropout", "0.1", "--recompute-granularity", "full",
                "--sequence-parallel", "--recompute-method", "uniform", "--recompute-num-layers", "2"]
        self.check(spec, [], ["--attention", "fused"], stack=True)


if __name__ == "__main__":
    unittest.main()
