"""layer_run --arch llama as a user runs it: bad input, meta bytes at the LLaMA-3 presets against
closed forms written out here, --hf-config, and --dump against the float64 NumPy reference
(one process and two MPI ranks). Standard library only (NumPy where present).

Run by ctest with ACTBENCH_LAYER_RUN pointing at the binary (and ACTBENCH_MPIEXEC at mpirun).
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from process_group import run_in_group  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN", os.path.join(HERE, "..", "build", "runners", "layer_run"))
MPIEXEC = os.environ.get("ACTBENCH_MPIEXEC") or shutil.which("mpirun")
THEORY = os.environ.get("ACTBENCH_THEORY", os.path.join(HERE, "..", "build", "runners", "theory"))
CONFIGS = ["baseline", "sp", "full", "selective", "selective+sp", "full+sp"]

try:
    import numpy  # noqa: F401
    import numpy_layer
except ImportError:
    numpy_layer = None

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}


# Published config.json files (tests/fixtures/hf): the families --hf-config reads, with the
# spec columns each row must show, and those it refuses, with what the one line must say.
HF_FIXTURES = os.path.join(HERE, "fixtures", "hf")
HF_READ = {
    "Llama-3.1-8B": dict(model="llama:Llama-3.1-8B", arch="llama", hidden="4096", heads="32", kv_heads="8",
                         ffn_hidden="14336", norm_epsilon="1e-05", rotary_base="500000", qk_layernorm="0",
                         add_bias_linear="0", add_qkv_bias="0"),
    "Mistral-7B-v0.3": dict(model="mistral:Mistral-7B-v0.3", arch="llama", hidden="4096", heads="32", kv_heads="8",
                            ffn_hidden="14336", norm_epsilon="1e-05", rotary_base="1000000", qk_layernorm="0",
                            add_bias_linear="0", add_qkv_bias="0"),
    "Qwen2.5-7B": dict(model="qwen2:Qwen2.5-7B", arch="custom", hidden="3584", heads="28", kv_heads="4",
                       ffn_hidden="18944", norm_epsilon="1e-06", rotary_base="1000000", qk_layernorm="0",
                       add_bias_linear="0", add_qkv_bias="1"),
    "Qwen3-8B": dict(model="qwen3:Qwen3-8B", arch="custom", hidden="4096", heads="32", kv_heads="8",
                     ffn_hidden="12288", norm_epsilon="1e-06", rotary_base="1000000", qk_layernorm="1",
                     add_bias_linear="0", add_qkv_bias="0"),
}
HF_REFUSED = {
    "Mistral-7B-v0.1": '"sliding_window" is 4096',
    "gemma-2b": '"hidden_activation" is "gelu_pytorch_tanh"',
}
# Mixtures of experts are read, but llama-table and plan tabulate dense layers alone.
HF_EXPERTS = {"Qwen3-30B-A3B": "qwen3_moe:Qwen3-30B-A3B", "Mixtral-8x7B-v0.1": "mixtral:Mixtral-8x7B-v0.1",
              "DeepSeek-V3": "deepseek_v3:DeepSeek-V3"}


def hf_fixture(model):
    return os.path.join(HF_FIXTURES, model, "config.json")


def llama_bytes(s, b, h, a, g, F, t, config, attention="unfused"):
    """Bytes one llama layer keeps per rank, 16-bit activations, counted tensor by tensor from the
    issue's list (independently of the C++ theory)."""
    r = t if config in ("sp", "selective+sp", "full+sp") else 1
    if config.startswith("full"):
        return 2 * s * b * h // r
    d = h // a
    norm_region = 4 * (2 * s * b * h) // r          # ln1, qkv, ln2, fc1 inputs
    tp_region = (2 * s * b * a * d                   # q after RoPE
                 + 2 * 2 * s * b * g * d             # k after RoPE, v
                 + 2 * s * b * h                     # proj input
                 + 2 * s * b * 2 * F                 # swiglu input (gate | up)
                 + 2 * s * b * F)                    # fc2 input
    if attention == "fused":
        if not config.startswith("selective"):       # selective re-runs the fused forward: no lse kept
            tp_region += 4 * a * s * b               # fp32 log-sum-exp
    elif not config.startswith("selective"):
        tp_region += 2 * a * s * s * b               # softmax output, also the input of .V
    return norm_region + tp_region // t


class LlamaCliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_llama_")
        self.csv = os.path.join(self.tmp, "out.csv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_layer(self, *args, mpi_np=None):
        cmd = [LAYER_RUN, *args, "--csv", self.csv]
        if mpi_np:
            cmd = [MPIEXEC, "-np", str(mpi_np), *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    def rows(self):
        if not os.path.exists(self.csv):
            return []
        with open(self.csv, newline="") as f:
            return list(csv.DictReader(f))

    def write_config(self, name, **changes):
        cfg = dict(LLAMA3_8B)
        cfg.update(changes)
        folder = os.path.join(self.tmp, name)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def test_bad_inputs_exit_2_with_one_line_and_no_row(self):
        tiny = ["--backend", "meta", "--arch", "llama"]
        cases = {
            "kv-heads not dividing heads": tiny + ["--kv-heads", "3"],
            "kv-heads above heads": tiny + ["--kv-heads", "8"],
            "negative kv-heads": tiny + ["--kv-heads", "-2"],
            "kv-heads not divisible by tp": tiny + ["--kv-heads", "2", "--tp", "4", "--emulate-tp"],
            "ffn-hidden not divisible by tp": tiny + ["--ffn-hidden", "30", "--tp", "4", "--emulate-tp"],
            "num-query-groups without group-query-attention": tiny + ["--num-query-groups", "2"],
            "unknown arch": ["--backend", "meta", "--arch", "mamba"],
            "gpt arch of a llama preset": ["--backend", "meta", "--model", "llama3-8b", "--arch", "gpt"],
            "odd head size": tiny + ["--hidden", "36", "--heads", "4"],
            "bad rope theta": tiny + ["--rope-theta", "-5"],
            "missing config": ["--backend", "meta", "--hf-config", os.path.join(self.tmp, "none.json")],
            "gelu config": ["--backend", "meta", "--hf-config", self.write_config("gelu", hidden_act="gelu")],
            "biased config": ["--backend", "meta", "--hf-config", self.write_config("bias", attention_bias=True)],
            "moe config": ["--backend", "meta", "--hf-config", self.write_config("moe", num_local_experts=8)],
        }
        for what, args in cases.items():
            with self.subTest(what):
                r = self.run_layer(*args)
                self.assertEqual(r.returncode, 2, what + ": " + r.stderr)
                lines = [l for l in r.stderr.splitlines() if l.strip()]
                self.assertEqual(len(lines), 1, what + ": " + r.stderr)
                self.assertTrue(lines[0].startswith("layer_run: error:"), lines[0])
                self.assertFalse(os.path.exists(self.csv), what + " left a CSV behind")

    def fresh_csv(self):
        if os.path.exists(self.csv):
            os.remove(self.csv)

    def assert_refused(self, r, what, *needles):
        """Exit 2, exactly one line on stderr (layer_run's) naming every needle, no row."""
        self.assertEqual(r.returncode, 2, "%s: rc %s: %s" % (what, r.returncode, r.stderr))
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, what + ": " + r.stderr)
        self.assertTrue(lines[0].startswith("layer_run: error:"), what + ": " + lines[0])
        for needle in needles:
            self.assertIn(needle, lines[0], what)
        self.assertEqual(self.rows(), [], what + " wrote a row")

    def run_quick(self, *args):
        """layer_run that must answer at once: a hang fails the test instead of blocking it."""
        try:
            return subprocess.run([LAYER_RUN, *args, "--csv", self.csv], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            self.fail("layer_run blocked: " + " ".join(args))

    # ---- --hf-config: every value the reader uses is checked like a flag ----
    def test_hf_config_values_of_the_wrong_type_or_out_of_range_are_refused(self):
        bad = [
            ("hidden_act", 5), ("hidden_act", ["silu"]), ("hidden_act", True), ("hidden_act", {"a": 1}),
            ("rms_norm_eps", 1e300), ("rms_norm_eps", 0), ("rms_norm_eps", -1e-5), ("rms_norm_eps", "1e-5"),
            ("rms_norm_eps", 1e-50), ("rms_norm_eps", 2.0), ("rms_norm_eps", [1e-5]),
            ("rope_theta", 0), ("rope_theta", -1.0), ("rope_theta", 1e300), ("rope_theta", "500000"),
            ("rope_theta", 0.5), ("rope_theta", True),
            ("num_hidden_layers", 1000000000000), ("num_hidden_layers", 0), ("num_hidden_layers", -1),
            ("num_hidden_layers", 2.5), ("num_hidden_layers", 32.0), ("num_hidden_layers", "32"),
            ("num_hidden_layers", True), ("num_hidden_layers", 1e12),
            ("hidden_size", 2 ** 62), ("hidden_size", 2 ** 63), ("hidden_size", 2 ** 64), ("hidden_size", -4096),
            ("hidden_size", 4096.5), ("hidden_size", None),
            ("num_attention_heads", 0), ("num_attention_heads", 2 ** 40), ("num_attention_heads", "32"),
            ("num_key_value_heads", 0), ("num_key_value_heads", "8"), ("num_key_value_heads", 2 ** 62),
            ("intermediate_size", 2 ** 62), ("intermediate_size", 0), ("intermediate_size", 1.5),
            ("vocab_size", 2 ** 40), ("vocab_size", 0), ("vocab_size", "128256"),
            ("max_position_embeddings", 2 ** 40), ("max_position_embeddings", 0), ("max_position_embeddings", -5),
            ("max_position_embeddings", "8192"),
            ("head_dim", "128"), ("head_dim", 2 ** 62), ("head_dim", 0),
            ("attention_bias", "no"), ("attention_bias", 1), ("mlp_bias", [False]),
            ("model_type", 5), ("model_type", ""), ("model_type", "x" * 100), ("model_type", "lla,ma"),
            ("model_type", "llama\nnext"),
            ("num_local_experts", "8"), ("sliding_window", 4096),
        ]
        for key, value in bad:
            what = "%s: %r" % (key, value)
            with self.subTest(what):
                self.fresh_csv()
                path = self.write_config("bad")
                with open(path) as f:
                    cfg = json.load(f)
                cfg[key] = value
                with open(path, "w") as f:
                    json.dump(cfg, f)
                self.assert_refused(self.run_quick("--backend", "meta", "--hf-config", path), what, path, key)

    def test_hf_config_that_is_not_a_json_object_is_refused(self):
        cases = {"a list": "[1, 2]", "NaN": '{"rms_norm_eps": NaN}', "not JSON": "{ not json",
                 "a number overflowing a double": '{"rope_theta": 1e400}', "empty": "",
                 "deep nesting": '{"x": ' + "[" * 100000 + "]" * 100000 + "}", "bad UTF-8": b'{"\xff": 1}'}
        for what, text in cases.items():
            with self.subTest(what):
                path = os.path.join(self.tmp, "config.json")
                with open(path, "wb") as f:
                    f.write(text if isinstance(text, bytes) else text.encode())
                self.assert_refused(self.run_quick("--backend", "meta", "--hf-config", path), what, path)

    def test_hf_config_that_is_a_folder_or_a_fifo_is_refused_at_once(self):
        folder = os.path.join(self.tmp, "folder.json")
        os.mkdir(folder)
        fifo = os.path.join(self.tmp, "fifo.json")
        os.mkfifo(fifo)
        for what, path in [("a folder", folder), ("a FIFO", fifo)]:
            with self.subTest(what):
                self.assert_refused(self.run_quick("--backend", "meta", "--hf-config", path), what, "--hf-config",
                                    path)

    def test_a_valid_hf_config_writes_a_layer_json_that_is_json(self):
        path = self.write_config("small", hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=40, max_position_embeddings=16, rms_norm_eps=1e-6,
                                 rope_theta=1e6)
        dump = os.path.join(self.tmp, "dump")
        r = self.run_quick("--backend", "cpu", "--hf-config", path, "--config", "baseline", "--dump", dump)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(dump, "layer.json")) as f:
            meta = json.load(f)
        self.assertEqual((meta["hidden"], meta["kv_heads"], meta["rotary_base"]), (48, 2, 1e6))
        self.assertAlmostEqual(meta["norm_epsilon"], 1e-6)

    # ---- --hf-config with the other flags: what the file defines cannot be given again ----
    def test_flags_the_hf_config_defines_are_refused(self):
        path = self.write_config("Meta-Llama-3-8B")
        for flag, value in [("--model", "llama3-8b"), ("--model", "tiny"), ("--hidden", "4096"), ("--heads", "16"),
                            ("--kv-heads", "4"), ("--kv-channels", "64"), ("--ffn-hidden", "1024"),
                            ("--rope-theta", "10000"),
                            ("--norm-eps", "1e-6")]:
            with self.subTest(flag):
                self.fresh_csv()
                r = self.run_quick("--backend", "meta", "--hf-config", path, flag, value)
                self.assert_refused(r, flag, flag, "--hf-config")
        # --emulate-tp takes its tensor-parallel size from a preset; the file has none
        r = self.run_quick("--backend", "meta", "--hf-config", path, "--emulate-tp")
        self.assert_refused(r, "--emulate-tp without --tp", "--emulate-tp", "--tp", "--hf-config")

    def test_flags_the_hf_config_does_not_define_are_used(self):
        path = self.write_config("Meta-Llama-3-8B")
        r = self.run_quick("--backend", "meta", "--hf-config", path, "--batch", "3", "--seq", "512", "--layers", "2",
                           "--tp", "4", "--emulate-tp", "--arch", "llama", "--config", "baseline")
        self.assertEqual(r.returncode, 0, r.stderr)
        row = self.rows()[0]
        self.assertEqual((row["model"], row["hidden"], row["heads"], row["kv_heads"], row["ffn_hidden"]),
                         ("llama:Meta-Llama-3-8B", "4096", "32", "8", "14336"))
        self.assertEqual((row["batch"], row["seq"], row["layers"], row["tp"]), ("3", "512", "2", "4"))
        self.assertEqual(int(row["act_bytes"]), llama_bytes(512, 3, 4096, 32, 8, 14336, 4, "baseline"))

    def run_mpi_in_folders(self, args, folders, timeout=60):
        """One rank per folder, each started there (MPMD, -wdir) with the same arguments. A hang past
        `timeout` kills the whole process group and fails the test instead of hanging CI."""
        cmd = [MPIEXEC, "-q"]
        for i, folder in enumerate(folders):
            cmd += ([":"] if i else []) + ["-np", "1", "-wdir", folder, os.path.abspath(LAYER_RUN), *args]
        return run_in_group(self, cmd, timeout, "mpirun")

    @unittest.skipUnless(MPIEXEC, "no mpirun")
    def test_mpi_ranks_compare_what_the_hf_config_says_not_its_name(self):
        folders = [os.path.join(self.tmp, "rank%d" % i) for i in range(2)]
        for folder in folders:
            os.makedirs(folder)
        small = dict(LLAMA3_8B, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                     max_position_embeddings=16)

        def write(folder, **changes):
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(dict(small, **changes), f)

        args = ["--backend", "cpu", "--hf-config", "config.json", "--tp", "2", "--iters", "1", "--config", "baseline",
                "--csv", self.csv]
        for key, other in [("hidden_size", 128), ("num_key_value_heads", 4), ("rope_theta", 1e6),
                           ("rms_norm_eps", 1e-6), ("max_position_embeddings", 32)]:
            with self.subTest(key):
                write(folders[0])
                write(folders[1], **{key: other})
                start = time.monotonic()
                self.assert_refused(self.run_mpi_in_folders(args, folders), key, "--hf-config")
                self.assertLess(time.monotonic() - start, 60)
        # a file only one rank can read: that rank's line, every rank stops
        os.remove(os.path.join(folders[1], "config.json"))
        self.assert_refused(self.run_mpi_in_folders(args, folders), "missing on rank 1", "config.json")
        # the same contents in two folders are the same arguments
        write(folders[1])
        r = self.run_mpi_in_folders(args, folders)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([(row["hidden"], row["tp"]) for row in self.rows()], [("64", "2")])

    @unittest.skipUnless(MPIEXEC, "no mpirun")
    def test_mpi_ranks_compare_the_experts_an_hf_config_says(self):
        folders = [os.path.join(self.tmp, "moe%d" % i) for i in range(2)]
        for folder in folders:
            os.makedirs(folder)
        with open(hf_fixture("Qwen3-30B-A3B")) as f:
            small = dict(json.load(f), hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, num_hidden_layers=2)

        def write(folder, **changes):
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(dict(small, **changes), f)

        args = ["--backend", "meta", "--hf-config", "config.json", "--tp", "2", "--config", "sp", "--seq", "16",
                "--csv", self.csv]
        for key, other in [("num_experts_per_tok", 1), ("norm_topk_prob", False), ("mlp_only_layers", [1])]:
            with self.subTest(key):
                write(folders[0])
                write(folders[1], **{key: other})
                self.assert_refused(self.run_mpi_in_folders(args, folders), key, "--hf-config")
        write(folders[1])
        r = self.run_mpi_in_folders(args, folders)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([(row["num_experts"], row["top_k"], row["tp"]) for row in self.rows()], [("4", "2", "2")])

    def test_meta_presets_equal_the_closed_forms(self):
        shapes = {"llama3-8b": (4096, 32, 8, 14336, 1), "llama3-70b": (8192, 64, 8, 28672, 8),
                  "llama3-405b": (16384, 128, 8, 53248, 8)}
        for model, (h, a, g, F, t) in shapes.items():
            for attention in ["unfused", "fused"]:
                with self.subTest(model=model, attention=attention):
                    if os.path.exists(self.csv):
                        os.remove(self.csv)
                    r = self.run_layer("--backend", "meta", "--model", model, "--emulate-tp", "--config",
                                       ",".join(CONFIGS), "--attention", attention)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    rows = self.rows()
                    self.assertEqual([row["config"] for row in rows], CONFIGS)
                    for row in rows:
                        expected = llama_bytes(8192, 1, h, a, g, F, t, row["config"], attention)
                        self.assertEqual(int(row["act_bytes"]), expected, row["config"])
                        self.assertEqual(float(row["act_bytes_formula"]), expected)
                        self.assertEqual(int(row["fwd_retained_bytes"]),
                                         int(row["act_bytes"]) + int(row["act_extra_bytes"]))
                        self.assertEqual((row["arch"], row["kv_heads"], row["ffn_hidden"]), ("llama", str(g), str(F)))
                        self.assertEqual(row["dropout"], "0")

    def test_hf_config_runs_like_the_preset(self):
        path = self.write_config("Meta-Llama-3-8B")
        r = self.run_layer("--backend", "meta", "--hf-config", path, "--seq", "4096", "--config", "baseline,full")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.run_layer("--backend", "meta", "--model", "llama3-8b", "--seq", "4096", "--config", "baseline,full")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = self.rows()
        self.assertEqual(len(rows), 4)
        self.assertEqual(rows[0]["model"], "llama:Meta-Llama-3-8B")
        for a, b in [(rows[0], rows[2]), (rows[1], rows[3])]:
            for col in ["hidden", "heads", "seq", "batch", "kv_heads", "ffn_hidden", "act_bytes", "act_extra_bytes"]:
                self.assertEqual(a[col], b[col], col)
        self.assertEqual(int(rows[0]["act_bytes"]), llama_bytes(4096, 1, 4096, 32, 8, 14336, 1, "baseline"))
        # without --seq, max_position_embeddings is the sequence length
        os.remove(self.csv)
        r = self.run_layer("--backend", "meta", "--hf-config", path, "--config", "full")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.rows()[0]["seq"], "8192")

    # ---- --hf-config: each family's published config ----
    def test_hf_config_families_run_with_their_spec_columns(self):
        for model, columns in HF_READ.items():
            with self.subTest(model):
                self.fresh_csv()
                r = self.run_quick("--backend", "meta", "--hf-config", hf_fixture(model), "--seq", "256",
                                   "--config", "baseline,selective")
                self.assertEqual(r.returncode, 0, r.stderr)
                for row in self.rows():
                    self.assertEqual({k: row[k] for k in columns}, columns)
                    self.assertEqual((row["seq"], row["normalization"], row["activation"], row["position_embedding"],
                                      row["attention_dropout"], row["hidden_dropout"]),
                                     ("256", "RMSNorm", "swiglu", "rope", "0", "0"))
                    self.assertEqual(float(row["act_bytes"]), float(row["act_bytes_formula"]), row["config"])

    def test_hf_config_families_the_spec_cannot_express_are_refused(self):
        for model, words in HF_REFUSED.items():
            path = hf_fixture(model)
            with self.subTest(model):
                self.assert_refused(self.run_quick("--backend", "meta", "--hf-config", path), model, path, words)
                r = subprocess.run([THEORY, "llama-table", "--hf-config", path], capture_output=True, text=True,
                                   timeout=20)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertTrue(r.stderr.startswith("theory: error: --hf-config " + path + ": "), r.stderr)
                self.assertIn(words, r.stderr)

    def test_hf_config_experts_are_read_but_not_tabled_as_llama(self):
        for model, name in HF_EXPERTS.items():
            path = hf_fixture(model)
            with self.subTest(model):
                r = subprocess.run([THEORY, "llama-table", "--hf-config", path], capture_output=True, text=True,
                                   timeout=20)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertIn("does not yet model", r.stderr)
                self.assertIn("theory memory does", r.stderr)

    def test_hf_config_experts_are_planned(self):
        for model, name in HF_EXPERTS.items():
            path = hf_fixture(model)
            with self.subTest(model):
                r = subprocess.run([THEORY, "plan", "--gpus", "64", "--global-batch", "64", "--top", "1",
                                    "--hf-config", path], capture_output=True, text=True, timeout=20)
                self.assertEqual(r.returncode, 0, r.stderr)  # DeepSeek-V3's 671B: "nothing fits"
                self.assertEqual(r.stdout.splitlines()[1].split()[0], "ep", r.stdout)

    def test_hf_config_defines_the_layer_that_arch_would_replace(self):
        # --arch may restate the config's family, never replace its layer
        path = hf_fixture("Qwen3-8B")
        r = self.run_quick("--backend", "meta", "--hf-config", path, "--seq", "64", "--arch", "llama")
        self.assert_refused(r, "--arch llama on qwen3", "--arch llama", "--hf-config", path)
        r = self.run_quick("--backend", "meta", "--hf-config", hf_fixture("Llama-3.1-8B"), "--arch", "gpt")
        self.assert_refused(r, "--arch gpt on llama", "--arch gpt", "--hf-config")

    def test_hf_config_head_dim_is_the_head_size(self):
        # Qwen3-0.6B: head_dim 128 at hidden 1024 / 16 heads
        r = self.run_quick("--backend", "meta", "--hf-config", hf_fixture("Qwen3-0.6B"), "--seq", "64",
                           "--config", "baseline")
        self.assertEqual(r.returncode, 0, r.stderr)
        row = self.rows()[0]
        self.assertEqual((row["model"], row["hidden"], row["heads"], row["kv_heads"], row["kv_channels"],
                          row["qk_layernorm"]), ("qwen3:Qwen3-0.6B", "1024", "16", "8", "128", "1"))
        self.assertEqual(row["act_bytes"], row["act_bytes_formula"])
        self.fresh_csv()
        r = self.run_quick("--backend", "meta", "--hf-config", hf_fixture("Qwen3-0.6B"), "--kv-channels", "64")
        self.assert_refused(r, "--kv-channels", "--kv-channels", "--hf-config", "head_dim")

    @unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
    def test_hf_config_qwen_layers_on_cpu_match_numpy(self):
        """Qwen2's QKV biases and Qwen3's q/k norms as the cpu backend runs them from the config,
        at a small width (the published shape keys scaled down, every other key the file's)."""
        small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                     head_dim=16, num_hidden_layers=2)
        for model, present in [("Qwen2.5-7B", "grad.qkv.bias"), ("Qwen3-8B", "grad.q_norm.weight"),
                               ("Qwen3-0.6B", "grad.k_norm.weight")]:
            with self.subTest(model):
                with open(hf_fixture(model)) as f:
                    cfg = dict(json.load(f), **small)
                if model == "Qwen2.5-7B":
                    del cfg["head_dim"]
                if model == "Qwen3-0.6B":
                    cfg["head_dim"] = 24  # not 64 / 4, as Qwen3-0.6B's 128 is not 1024 / 16
                folder = os.path.join(self.tmp, model)
                os.makedirs(folder)
                path = os.path.join(folder, "config.json")
                with open(path, "w") as f:
                    json.dump(cfg, f)
                dump = os.path.join(self.tmp, "dump_" + model)
                self.fresh_csv()
                r = self.run_quick("--backend", "cpu", "--hf-config", path, "--seq", "12", "--batch", "2",
                                   "--dtype", "fp32", "--config", "baseline", "--dump", dump)
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(os.path.join(dump, "layer.json")) as f:
                    meta = json.load(f)
                self.assertEqual((meta["add_qkv_bias"], meta["qk_layernorm"], meta["add_bias_linear"]),
                                 (model == "Qwen2.5-7B", model.startswith("Qwen3"), False))
                self.assertEqual(meta["kv_channels"], cfg["head_dim"] if "head_dim" in cfg else 16)
                results = numpy_layer.check(dump, rtol=1e-4)
                self.assertIn(present, [name for name, *_ in results])
                for name, err, scale, ok in results:
                    self.assertTrue(ok, "%s: max|err| %.3e vs max|ref| %.3e" % (name, err, scale))
                row = self.rows()[0]
                self.assertEqual((row["model"], row["add_qkv_bias"], row["qk_layernorm"]),
                                 (cfg["model_type"] + ":" + model, meta["add_qkv_bias"] and "1" or "0",
                                  meta["qk_layernorm"] and "1" or "0"))

    def check_dump(self, dump, heads, kv_heads):
        with open(os.path.join(dump, "layer.json")) as f:
            meta = json.load(f)
        self.assertEqual((meta["normalization"], meta["activation"], meta["heads"], meta["kv_heads"]),
                         ("RMSNorm", "swiglu", heads, kv_heads))
        results = numpy_layer.check(dump, rtol=1e-4)
        # y, dx and the gradients of the six weights
        self.assertEqual([r[0] for r in results][2:], ["grad.ln1.weight", "grad.qkv.weight", "grad.proj.weight",
                                                       "grad.ln2.weight", "grad.fc1.weight", "grad.fc2.weight"])
        for name, err, scale, ok in results:
            self.assertTrue(ok, "%s: max|err| %.3e vs max|ref| %.3e" % (name, err, scale))

    @unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
    def test_dump_matches_numpy_float64_reference(self):
        import numpy as np
        base = ["--backend", "cpu", "--arch", "llama", "--dtype", "fp32", "--seq", "20", "--hidden", "48",
                "--heads", "4", "--batch", "3", "--ffn-hidden", "40", "--rope-theta", "100"]
        for attention, g in [("unfused", 2), ("fused", 1), ("unfused", 4)]:
            dump = os.path.join(self.tmp, "dump_%s_%d" % (attention, g))
            r = self.run_layer(*base, "--kv-heads", str(g), "--attention", attention, "--config",
                               "baseline,selective,full", "--dump", dump)
            self.assertEqual(r.returncode, 0, r.stderr)
            for config in ["baseline", "selective", "full"]:
                with self.subTest(attention=attention, g=g, config=config):
                    self.check_dump(os.path.join(dump, config), 4, g)
            self.assertEqual(np.load(os.path.join(dump, "baseline", "qkv.weight.npy")).shape, ((4 + 2 * g) * 12, 48))
        # the checker is not blind: a perturbed gradient fails, and so does a wrong rope theta
        dump = os.path.join(self.tmp, "dump_unfused_2", "baseline")
        g = np.load(os.path.join(dump, "grad.qkv.weight.npy"))
        g[-1, 0] += 1e-2 * np.abs(g).max()
        np.save(os.path.join(dump, "grad.qkv.weight.npy"), g)
        self.assertEqual([r[0] for r in numpy_layer.check(dump) if not r[3]], ["grad.qkv.weight"])
        meta_path = os.path.join(self.tmp, "dump_unfused_2", "full", "layer.json")
        with open(meta_path) as f:
            meta = json.load(f)
        meta["rotary_base"] = 10000.0
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        self.assertIn("y", [r[0] for r in numpy_layer.check(os.path.dirname(meta_path)) if not r[3]])

    @unittest.skipUnless(numpy_layer and MPIEXEC, "numpy or mpirun missing")
    def test_dump_under_tp_and_sp_matches_numpy(self):
        for attention in ["unfused", "fused"]:
            dump = os.path.join(self.tmp, "dump_mpi_" + attention)
            r = self.run_layer("--backend", "cpu", "--arch", "llama", "--dtype", "fp32", "--seq", "20", "--hidden",
                               "64", "--heads", "8", "--kv-heads", "2", "--ffn-hidden", "48", "--batch", "2",
                               "--attention", attention, "--config", "sp,selective+sp,full", "--tp", "2",
                               "--dump", dump, mpi_np=2)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for config in ["sp", "selective+sp", "full"]:
                with self.subTest(attention=attention, config=config):
                    self.check_dump(os.path.join(dump, config), 8, 2)


class TheoryLlamaTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_llama_theory_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def theory(self, *args):
        return subprocess.run([THEORY, *args], capture_output=True, text=True, timeout=300)

    def test_plan_llama3_70b_on_64_h100_at_8k(self):
        out = os.path.join(self.tmp, "plan.csv")
        r = self.theory("plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
                        "--global-batch", "128", "--csv", out, "--top", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("llama3-70b on 64 x H100", lines[0])
        self.assertEqual(len(lines), 2 + 3)  # title, header, three plans
        with open(out, newline="") as f:
            rows = list(csv.DictReader(f))
        fits = [row for row in rows if row["fits"] == "1"]
        self.assertTrue(fits)
        for row in rows:
            parts = sum(int(row[k]) for k in ["weight_bytes", "grad_bytes", "optimizer_bytes", "workspace_bytes", "activation_bytes",
                                             "extra_bytes", "working_set_bytes", "headroom_bytes"])
            self.assertLessEqual(abs(parts - int(row["total_bytes"])), 7, row)  # each rounded to a byte
            self.assertEqual(int(row["tp"]) * int(row["cp"]) * int(row["pp"]) * int(row["dp"]), 64)
        times = [float(row["iteration_s"]) for row in fits]
        self.assertEqual(times, sorted(times))

    def test_plan_from_hf_config_equals_the_preset(self):
        folder = os.path.join(self.tmp, "Meta-Llama-3-8B")
        os.makedirs(folder)
        path = os.path.join(folder, "config.json")
        with open(path, "w") as f:
            json.dump(LLAMA3_8B, f)
        a = os.path.join(self.tmp, "a.csv")
        b = os.path.join(self.tmp, "b.csv")
        # Both pad the 128256 rows to a multiple of 128·t as Megatron does: every layout agrees.
        common = ["--gpu", "b200", "--gpus", "16", "--seq", "8192", "--global-batch", "64", "--distributed-optimizer"]
        self.assertEqual(self.theory("plan", "--hf-config", path, *common, "--csv", a).returncode, 0)
        self.assertEqual(self.theory("plan", "--model", "llama3-8b", *common, "--csv", b).returncode, 0)
        strip = lambda rows: [{k: v for k, v in row.items() if k != "model"} for row in rows]
        with open(a) as fa, open(b) as fb:
            plans = strip(csv.DictReader(fa))
            self.assertEqual(plans, strip(csv.DictReader(fb)))
        self.assertEqual({row["tp"] for row in plans}, {"1", "2", "4", "8"})

    def test_an_hf_config_is_padded_as_megatron_pads_unless_told_not_to(self):
        path = hf_fixture("Llama-3.1-8B")
        common = ["memory", "--hf-config", path, "--gpus", "8", "--tensor-model-parallel-size", "8",
                  "--seq-length", "4096"]
        params = []
        for padding in (["--make-vocab-size-divisible-by", "1"], []):
            out = os.path.join(self.tmp, "memory%d.csv" % len(padding))
            r = self.theory(*common, *padding, "--csv", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out, newline="") as f:
                params.append(int(next(csv.DictReader(f))["parameters"]))
        # 128256 rows padded to 129024 (a multiple of 128 × 8): 96 more rows of h on each rank,
        # in the word embedding and in the untied output layer
        self.assertEqual(params[1] - params[0], 2 * (129024 - 128256) // 8 * 4096)

    def test_hf_config_families_in_theory(self):
        # a llama-shaped config of another family is tabled; llama-table's closed forms are the
        # llama layer's, so Qwen's QKV biases and q/k norms are one line there, while plan and
        # memory (the composed layer's pieces) read them
        r = self.theory("llama-table", "--hf-config", hf_fixture("Mistral-7B-v0.3"), "--seq", "4096")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("mistral:Mistral-7B-v0.3: s=4096 b=1 h=4096 a=32 g=8 F=14336"), r.stdout)
        for model, what in [("Qwen2.5-7B", "QKV biases"), ("Qwen3-8B", "q/k RMSNorm"), ("Qwen3-0.6B", "q/k RMSNorm")]:
            with self.subTest(model):
                path = hf_fixture(model)
                r = self.theory("llama-table", "--hf-config", path)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertIn(path, r.stderr)
                self.assertIn("llama-table does not yet model " + what, r.stderr)
                r = self.theory("plan", "--hf-config", path, "--gpus", "8", "--global-batch", "8", "--seq", "4096",
                                "--top", "1")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(r.stdout.startswith(model.split("-")[0].lower().replace(".5", "") + ":" + model),
                                r.stdout)

    def test_llama_table_prints_the_categories(self):
        r = self.theory("llama-table", "--model", "llama3-8b", "--seq", "4096")
        self.assertEqual(r.returncode, 0, r.stderr)
        total = next(l for l in r.stdout.splitlines() if l.startswith("total")).split()[1:]
        closed = next(l for l in r.stdout.splitlines() if l.startswith("closed form")).split()[2:]
        self.assertEqual(total, closed)
        self.assertEqual(int(total[0]), llama_bytes(4096, 1, 4096, 32, 8, 14336, 1, "baseline"))

    def test_out_writes_the_llama_tables(self):
        r = self.theory("--out", self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.tmp, "llama_table2.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        shapes = {"llama3-8b": (4096, 32, 8, 14336, 1), "llama3-70b": (8192, 64, 8, 28672, 8),
                  "llama3-405b": (16384, 128, 8, 53248, 8)}
        self.assertEqual(len(rows), 3 * 2 * len(CONFIGS))
        for row in rows:
            h, a, g, F, t = shapes[row["model"]]
            self.assertEqual(int(row["bytes"]), llama_bytes(8192, 1, h, a, g, F, t, row["config"], row["attention"]))
            self.assertEqual(row["bytes"], row["closed_form_bytes"])
        with open(os.path.join(self.tmp, "llama_seqlen.csv"), newline="") as f:
            seq = list(csv.DictReader(f))
        self.assertEqual({row["kv_heads"] for row in seq}, {"8", "64"})

    def test_bad_inputs_exit_2(self):
        cases = {
            "no global batch": ["plan", "--model", "llama3-8b", "--gpus", "8"],
            "unknown gpu": ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--gpu", "v100"],
            "no layout": ["plan", "--model", "llama3-8b", "--gpus", "7", "--global-batch", "5"],
            "model and config": ["plan", "--model", "llama3-8b", "--hf-config", "x.json", "--gpus", "8"],
            "missing config": ["plan", "--hf-config", os.path.join(self.tmp, "none.json"), "--gpus", "8",
                               "--global-batch", "8"],
            "gpt in llama-table": ["llama-table", "--model", "175b"],
            "tp not dividing kv heads": ["llama-table", "--model", "llama3-8b", "--tp", "16"],
        }
        for what, args in cases.items():
            with self.subTest(what):
                r = self.theory(*args)
                self.assertEqual(r.returncode, 2, what + ": " + r.stdout + r.stderr)
                self.assertTrue(r.stderr.startswith("theory: error:"), r.stderr)


if __name__ == "__main__":
    unittest.main()
