"""bench/peers/torch_layer.py, the PyTorch eager peer of layer_run, and side_by_side.sh.

Runs everywhere: the CLI's bad-input and no-torch paths, the CSV writer (header once, whole
rows under concurrent writers), shapes and sharding, the side-by-side table. Where torch is
importable (by this python, or ACTBENCH_TORCH_PYTHON): the layer on the cpu at the tiny
shape, its saved bytes against layer_run's, recomputation changing nothing, and the layer
against a `layer_run --dump` in float64 (ACTBENCH_LAYER_RUN or build/runners/layer_run).
Where torch sees a GPU: the caching allocator's delta against the saved bytes.
"""
import csv
import multiprocessing
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "..", "bench", "peers")
PEER = os.path.join(PEERS, "torch_layer.py")
SIDE = os.path.join(PEERS, "side_by_side.sh")
sys.path.insert(0, PEERS)

import torch_layer  # noqa: E402  (imports no torch)

LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN", os.path.join(HERE, "..", "build", "runners", "layer_run"))
PEER_PYTHON = os.environ.get("ACTBENCH_TORCH_PYTHON", sys.executable)
ENV = dict(os.environ, ACTBENCH_GIT_SHA="test")


def _probe(code):
    try:
        return subprocess.run([PEER_PYTHON, "-c", code], capture_output=True, timeout=120, env=ENV).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


HAVE_TORCH = _probe("import torch")
HAVE_NUMPY = HAVE_TORCH and _probe("import numpy")
HAVE_CUDA = HAVE_TORCH and _probe("import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)")
HAVE_LAYER_RUN = os.access(LAYER_RUN, os.X_OK)


def run_peer(*args, python=None, env=None, timeout=300):
    return subprocess.run([python or PEER_PYTHON, PEER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or ENV)


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _append_many(args):
    path, writer, n = args
    for i in range(n):
        torch_layer.append_csv_row(path, {"peer": "w%d" % writer, "config": "row %d" % i,
                                          "command": 'a "quoted", multi\nline %d' % i})


class PeerCliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_peer_")
        self.csv = os.path.join(self.tmp, "peer.csv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- bad input: exit 2, one line, no row (checked before torch is imported) ----
    def test_bad_inputs_exit_2_with_one_line_and_no_row(self):
        cases = {
            "h not divisible by a": (["--hidden", "65", "--model", "tiny"], "hidden 65 is not divisible by heads 4"),
            "a not divisible by t": (["--tp", "3"], "heads 64 are not divisible by tp 3"),
            "s not divisible by t with SP": (["--model", "tiny", "--tp", "4", "--seq", "30", "--config", "sp"],
                                             "seq 30 is not divisible by tp 4 (needed by config sp)"),
            "unknown config": (["--config", "baseline,bogus"], "unknown config 'bogus'"),
            "unknown model": (["--model", "7b"], "unknown model '7b'"),
            "unknown dtype": (["--dtype", "int8"], "unknown dtype 'int8'"),
            "unknown device": (["--device", "tpu"], "unknown device 'tpu'"),
            "dropout out of range": (["--dropout", "1.5"], "--dropout must be in [0, 1)"),
            "zero iterations": (["--iters", "0"], "--iters must be >= 1"),
            "negative warm-up": (["--warmup", "-1"], "--warmup must be >= 0"),
            "not a number": (["--iters", "x"], "invalid int value: 'x'"),
            "unknown flag": (["--bogus"], "unrecognized arguments: --bogus"),
            "zero batch": (["--batch", "0"], "must all be >= 1"),
            "csv folder missing": (["--csv", os.path.join(self.tmp, "no", "such.csv")], "is not writable or missing"),
            "dump folder missing": (["--check-against", os.path.join(self.tmp, "nodump")], "does not exist"),
            "two modes": (["--check-against", self.tmp, "--self-check"], "separate modes"),
        }
        for name, (args, message) in cases.items():
            with self.subTest(name):
                if "--csv" not in args and "--check-against" not in args:
                    args = args + ["--csv", self.csv]
                r = run_peer(*args, python=sys.executable)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertTrue(r.stderr.startswith("torch_layer.py: error: "), r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertFalse(os.path.exists(self.csv))

    def test_missing_csv_is_bad_input(self):
        r = run_peer("--model", "tiny", python=sys.executable)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--csv FILE is required", r.stderr)

    def test_csv_with_another_header_is_bad_input(self):
        with open(self.csv, "w") as f:
            f.write("backend,device\ncpu,cpu\n")
        r = run_peer("--model", "tiny", "--csv", self.csv, python=sys.executable)
        self.assertEqual(r.returncode, 2)
        self.assertIn("has a different header", r.stderr)
        with open(self.csv) as f:
            self.assertEqual(f.read(), "backend,device\ncpu,cpu\n")

    def test_no_torch_exits_2_with_one_line(self):
        fake = os.path.join(self.tmp, "fake")
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError(\"No module named 'torch'\")\n")
        env = dict(ENV, PYTHONPATH=fake + os.pathsep + ENV.get("PYTHONPATH", ""))
        for args in (["--model", "tiny", "--device", "cpu", "--csv", self.csv], ["--self-check", "--model", "tiny"],
                     ["--check-against", self.tmp]):
            with self.subTest(args[0]):
                r = run_peer(*args, env=env, python=sys.executable)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("PyTorch is not installed", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertFalse(os.path.exists(self.csv))

    def test_print_csv_header_needs_no_torch(self):
        r = run_peer("--print-csv-header", python=sys.executable)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip().split(","), torch_layer.CSV_HEADER)
        for col in ["peer", "device", "model", "hidden", "heads", "seq", "batch", "tp", "emulated", "config", "dtype",
                    "dropout", "iters", "fwd_ms", "bwd_ms", "total_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms_min",
                    "bwd_ms_max", "act_bytes_measured", "peak_allocated_bytes", "torch_version", "cuda_version",
                    "git_sha", "hostname", "timestamp", "command"]:
            self.assertIn(col, torch_layer.CSV_HEADER)

    # ---- CSV writer ----
    def test_csv_rows_round_trip_with_header_once(self):
        torch_layer.append_csv_row(self.csv, {"peer": "torch", "config": "selective+sp", "command": 'x "y", z'})
        torch_layer.append_csv_row(self.csv, [str(i) for i in range(len(torch_layer.CSV_HEADER))])
        with open(self.csv) as f:
            text = f.read()
        self.assertEqual(text.count("peer,device,model"), 1)
        rows = read_rows(self.csv)
        self.assertEqual(len(rows), 2)
        self.assertEqual(rows[0]["config"], "selective+sp")
        self.assertEqual(rows[0]["command"], 'x "y", z')
        self.assertEqual(rows[0]["fwd_ms"], "")
        self.assertEqual(rows[1]["timestamp"], str(torch_layer.CSV_HEADER.index("timestamp")))
        torch_layer.check_csv(self.csv)  # our own file passes the pre-run check

    def test_csv_writer_rejects_bad_rows_and_foreign_files(self):
        with self.assertRaises(ValueError):
            torch_layer.append_csv_row(self.csv, {"no_such_column": 1})
        with self.assertRaises(ValueError):
            torch_layer.append_csv_row(self.csv, ["too", "short"])
        self.assertFalse(os.path.exists(self.csv))
        other = os.path.join(self.tmp, "other.csv")
        with open(other, "w") as f:
            f.write("a,b\n1,2\n")
        with self.assertRaises(torch_layer.BadInput):
            torch_layer.append_csv_row(other, {"peer": "torch"})
        with self.assertRaises(torch_layer.BadInput):
            torch_layer.check_csv(other)
        with open(other) as f:
            self.assertEqual(f.read(), "a,b\n1,2\n")

    def test_concurrent_writers_leave_whole_rows_and_one_header(self):
        writers, n = 4, 60
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(writers) as pool:
            pool.map(_append_many, [(self.csv, w, n) for w in range(writers)])
        rows = read_rows(self.csv)
        self.assertEqual(len(rows), writers * n)
        with open(self.csv) as f:
            self.assertEqual(f.read().count("peer,device"), 1)
        for w in range(writers):
            mine = [r for r in rows if r["peer"] == "w%d" % w]
            self.assertEqual([r["config"] for r in mine], ["row %d" % i for i in range(n)])
            self.assertTrue(all(r["command"].startswith('a "quoted", multi\nline ') for r in mine))
            self.assertTrue(all(len(r) == len(torch_layer.CSV_HEADER) for r in mine))

    # ---- configurations, shapes, sharding ----
    def test_config_lists(self):
        self.assertEqual(torch_layer.parse_config_list("sp,baseline,sp"), ["sp", "baseline"])
        self.assertEqual(torch_layer.parse_config_list("full+sp"), ["full+sp"])
        with self.assertRaises(torch_layer.BadInput):
            torch_layer.parse_config_list(",")
        self.assertEqual(torch_layer.CONFIG_POLICY["selective+sp"], ("selective", True))
        self.assertEqual(torch_layer.CONFIG_POLICY["full"], ("full", False))

    def test_22b_per_rank_shapes_at_t8(self):
        sh = torch_layer.layer_shapes(6144, 64, 2048, 4, 8, "baseline")
        self.assertEqual((sh["heads_local"], sh["head_dim"], sh["hidden_local"], sh["ffn_local"]), (8, 96, 768, 3072))  # 6144 / 64 = 96
        self.assertEqual(sh["x"], (2048, 4, 6144))
        self.assertEqual(sh["gemm_rows"], 8192)
        self.assertEqual(sh["scores"], (4, 8, 2048, 2048))
        self.assertEqual(sh["params"], {
            "ln1.weight": (6144,), "ln1.bias": (6144,), "qkv.weight": (2304, 6144), "qkv.bias": (2304,),
            "proj.weight": (6144, 768), "proj.bias": (6144,), "ln2.weight": (6144,), "ln2.bias": (6144,),
            "fc1.weight": (3072, 6144), "fc1.bias": (3072,), "fc2.weight": (6144, 3072), "fc2.bias": (6144,)})
        sp = torch_layer.layer_shapes(6144, 64, 2048, 4, 8, "selective+sp")
        self.assertEqual((sp["seq_local"], sp["x"], sp["gemm_rows"]), (256, (256, 4, 6144), 8192))
        self.assertEqual(sp["recompute"], "selective")

    def test_sharding_is_layer_runs(self):
        # qkv rows of rank r: its heads of Q, then of K, then of V (layers/params.cpp qkv_rows)
        rows, cols = torch_layer.local_param_index("qkv.weight", 8, 4, 1)
        self.assertEqual([list(r) for r in rows], [[2, 3], [10, 11], [18, 19]])
        self.assertEqual([list(c) for c in cols], [list(range(8))])
        rows, cols = torch_layer.local_param_index("fc1.weight", 8, 4, 3)
        self.assertEqual(list(rows[0]), list(range(24, 32)))
        rows, cols = torch_layer.local_param_index("fc2.weight", 8, 4, 2)
        self.assertEqual((list(rows[0]), list(cols[0])), (list(range(8)), list(range(16, 24))))
        rows, cols = torch_layer.local_param_index("proj.bias", 8, 4, 2)
        self.assertEqual((list(rows[0]), cols), (list(range(8)), None))
        for name in torch_layer.PARAMS:
            for t in (1, 2, 4):
                rows, cols = torch_layer.local_param_index(name, 8, t, t - 1)
                shape = (sum(len(r) for r in rows),) + ((sum(len(c) for c in cols),) if cols else ())
                self.assertEqual(shape, torch_layer.local_param_shape(name, 8, t), (name, t))

    def test_check_against_refuses_a_layer_it_does_not_build_before_torch(self):
        llama = {"normalization": "RMSNorm", "activation": "swiglu", "add_bias_linear": False, "add_qkv_bias": False,
                 "qk_layernorm": False, "position_embedding": "rope", "rotary_percent": 1.0, "heads": 4,
                 "kv_heads": 2, "hidden": 32, "ffn_hidden": 40, "attention_dropout": 0.0, "hidden_dropout": 0.0}
        gpt = {"normalization": "LayerNorm", "activation": "gelu", "add_bias_linear": True, "add_qkv_bias": False,
               "qk_layernorm": False, "position_embedding": "none", "heads": 4, "kv_heads": 4, "hidden": 32,
               "ffn_hidden": 128, "attention_dropout": 0.0, "hidden_dropout": 0.0}
        for what, meta in {"qk-layernorm": dict(llama, qk_layernorm=True), "squared relu": dict(gpt, activation="squared_relu"),
                           "gpt with GQA": dict(gpt, kv_heads=2), "partial rope": dict(llama, rotary_percent=0.5),
                           "RMSNorm gpt": dict(gpt, normalization="RMSNorm"),
                           "llama with kv-channels": dict(llama, kv_channels=16)}.items():
            with self.subTest(what):
                dump = os.path.join(self.tmp, "dump_" + what.replace(" ", "_"))
                os.mkdir(dump)
                with open(os.path.join(dump, "layer.json"), "w") as f:
                    json.dump(meta, f)
                r = run_peer("--check-against", dump, python=sys.executable)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn("is a layer this peer does not build", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1)

    # ---- side_by_side.sh's table (no GPU needed) ----
    def test_side_by_side_table(self):
        ours = os.path.join(self.tmp, "ours.csv")
        with open(ours, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["backend", "device", "model", "hidden", "heads", "seq", "batch", "tp", "config", "dtype",
                        "fwd_ms", "bwd_ms", "total_ms", "fwd_retained_bytes", "peak_allocated_bytes", "status",
                        "git_sha"])
            base = ["cuda", "H100", "22b", "6144", "64", "2048", "4", "8"]
            w.writerow(base + ["baseline", "bf16", "9", "9", "18", str(2 ** 30), str(2 ** 31), "ok", "abc"])
            w.writerow(base + ["baseline", "bf16", "3", "5", "8", str(2 ** 30), str(2 ** 31), "ok", "abc"])
            w.writerow(base + ["selective", "bf16", "3", "6", "9", str(2 ** 29), str(2 ** 31), "ok", "abc"])
        for config, total in (("baseline", "10"), ("selective", "10"), ("baseline", "12.5")):
            torch_layer.append_csv_row(self.csv, {
                "peer": "torch", "hidden": 6144, "heads": 64, "seq": 2048, "batch": 4, "tp": 8, "config": config,
                "dtype": "bf16", "fwd_ms": 4, "bwd_ms": 6, "total_ms": total, "act_bytes_measured": 2 ** 30,
                "status": "ok"})
        r = subprocess.run(["bash", SIDE, "--table", ours, self.csv], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = {l.split()[0]: l.split() for l in r.stdout.splitlines() if l.split()}
        self.assertEqual(lines["baseline"][7:9], ["0.640", "yes"])   # newest rows: 8 / 12.5
        self.assertEqual(lines["selective"][7:9], ["0.900", "NO"])   # 9 / 10
        self.assertEqual(lines["selective"][9], "+12.5")             # ours: 9 vs baseline 8
        self.assertEqual(lines["baseline"][11:13], ["1024.0", "1024.0"])
        self.assertIn("1 of 2 configurations", r.stdout)
        bad = subprocess.run(["bash", SIDE, "--table", ours], capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)


@unittest.skipUnless(HAVE_TORCH, "torch not importable by %s" % PEER_PYTHON)
class PeerTorchTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_peer_")
        self.csv = os.path.join(self.tmp, "peer.csv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_tiny_on_cpu_writes_one_row_per_config(self):
        r = run_peer("--device", "cpu", "--model", "tiny", "--tp", "2", "--dtype", "fp32", "--warmup", "1",
                     "--iters", "3", "--csv", self.csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = read_rows(self.csv)
        self.assertEqual([x["config"] for x in rows], torch_layer.PAPER_CONFIGS)
        for row in rows:
            self.assertEqual((row["peer"], row["device"], row["status"], row["tp"], row["emulated"]),
                             ("torch", "cpu", "ok", "2", "1"))
            self.assertEqual((row["iters"], row["git_sha"], row["act_bytes_source"]), ("3", "test", "saved_tensors"))
            self.assertGreater(float(row["fwd_ms"]), 0)
            self.assertGreater(float(row["bwd_ms"]), 0)
            self.assertLessEqual(float(row["fwd_ms_min"]), float(row["fwd_ms"]))
            self.assertGreaterEqual(float(row["bwd_ms_max"]), float(row["bwd_ms"]))
            self.assertGreater(int(row["act_bytes_measured"]), 0)
            self.assertTrue(row["torch_version"] and row["timestamp"].endswith("Z"))
        act = {x["config"]: int(x["act_bytes_measured"]) for x in rows}
        self.assertLess(act["selective+sp"], act["sp"])
        self.assertLess(act["selective"], act["baseline"])
        self.assertLess(act["full"], act["selective+sp"])

    @unittest.skipUnless(HAVE_LAYER_RUN, "layer_run not built")
    def test_saved_bytes_equal_layer_runs(self):
        configs = ",".join(torch_layer.ALL_CONFIGS)
        for tp in (1, 2, 4):
            with self.subTest(tp=tp):
                ours = os.path.join(self.tmp, "ours%d.csv" % tp)
                peer = os.path.join(self.tmp, "peer%d.csv" % tp)
                lr = [LAYER_RUN, "--backend", "cpu", "--model", "tiny", "--dtype", "fp32", "--config", configs,
                      "--warmup", "0", "--iters", "1", "--csv", ours]
                if tp > 1:
                    lr += ["--tp", str(tp), "--emulate-tp"]
                r = subprocess.run(lr, capture_output=True, text=True, timeout=300)
                self.assertEqual(r.returncode, 0, r.stderr)
                r = run_peer("--device", "cpu", "--model", "tiny", "--tp", str(tp), "--dtype", "fp32", "--config",
                             configs, "--warmup", "0", "--iters", "1", "--csv", peer)
                self.assertEqual(r.returncode, 0, r.stderr)
                mine = {x["config"]: int(x["act_bytes_measured"]) for x in read_rows(peer)}
                for row in read_rows(ours):
                    want = int(row["act_bytes"]) + int(row["act_extra_bytes"])
                    self.assertEqual(mine[row["config"]], want, row["config"])

    def test_self_check_recompute_changes_nothing(self):
        r = run_peer("--self-check", "--device", "cpu", "--model", "tiny", "--tp", "2", "--dropout", "0.2",
                     "--config", ",".join(torch_layer.ALL_CONFIGS))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("56 passed, 0 failed", r.stdout)

    @unittest.skipUnless(HAVE_LAYER_RUN and HAVE_NUMPY, "layer_run not built or numpy missing")
    def test_check_against_layer_run_dump(self):
        dump = os.path.join(self.tmp, "dump")
        r = subprocess.run([LAYER_RUN, "--backend", "cpu", "--dtype", "fp32", "--dropout", "0", "--config",
                            "baseline", "--model", "tiny", "--dump", dump, "--csv", os.path.join(self.tmp, "x.csv")],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_peer("--check-against", dump)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # y, dx and 12 gradients for each of the six configurations, all at t = 1
        self.assertIn("84 passed, 0 failed", r.stdout)
        for name in ["y", "dx"] + ["grad." + n for n in torch_layer.PARAMS]:
            self.assertIn(" %s " % name, r.stdout)
        # the check is not blind: a perturbed gradient fails, and only that one
        import numpy as np
        path = os.path.join(dump, "grad.proj.weight.npy")
        g = np.load(path)
        g[1, 2] += 1e-2 * np.abs(g).max()
        np.save(path, g)
        r = run_peer("--check-against", dump, "--config", "baseline,selective")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        wrong = [l.split()[:2] for l in r.stdout.splitlines() if l.endswith("WRONG")]
        self.assertEqual(wrong, [["baseline", "grad.proj.weight"], ["selective", "grad.proj.weight"]])

    @unittest.skipUnless(HAVE_LAYER_RUN and HAVE_NUMPY, "layer_run not built or numpy missing")
    def test_check_against_llama_dump(self):
        # grouped-query (4 query heads on 2 key/value groups), F = 96: every head-major and stacked layout is exercised
        dump = os.path.join(self.tmp, "dump_llama")
        r = subprocess.run([LAYER_RUN, "--arch", "llama", "--kv-heads", "2", "--ffn-hidden", "96", "--backend", "cpu",
                            "--dtype", "fp32", "--dropout", "0", "--config", "baseline", "--model", "tiny", "--dump",
                            dump, "--csv", os.path.join(self.tmp, "x.csv")], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_peer("--check-against", dump)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # y, dx and 6 gradients (no biases) for each of the six configurations, all at t = 1
        self.assertIn("48 passed, 0 failed", r.stdout)
        for name in ["y", "dx"] + ["grad." + n for n in torch_layer.LLAMA_PARAMS]:
            self.assertIn(" %s " % name, r.stdout)
        import numpy as np
        path = os.path.join(dump, "grad.qkv.weight.npy")  # a K row of group 1: the GQA fold must be right
        g = np.load(path)
        g[4 * 16 + 16 + 3, 5] += 1e-2 * np.abs(g).max()
        np.save(path, g)
        r = run_peer("--check-against", dump, "--config", "baseline,selective")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        wrong = [l.split()[:2] for l in r.stdout.splitlines() if l.endswith("WRONG")]
        self.assertEqual(wrong, [["baseline", "grad.qkv.weight"], ["selective", "grad.qkv.weight"]])
        with open(os.path.join(dump, "layer.json")) as f:
            meta = f.read()
        with open(os.path.join(dump, "layer.json"), "w") as f:
            f.write(meta.replace('"swiglu"', '"gelu"'))
        r = run_peer("--check-against", dump)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("is a layer this peer does not build", r.stderr)

    @unittest.skipUnless(HAVE_LAYER_RUN and HAVE_NUMPY, "layer_run not built or numpy missing")
    def test_check_against_refuses_dropout_dump(self):
        dump = os.path.join(self.tmp, "dump_p")
        r = subprocess.run([LAYER_RUN, "--backend", "cpu", "--dtype", "fp32", "--dropout", "0.1", "--config",
                            "baseline", "--model", "tiny", "--dump", dump, "--csv", os.path.join(self.tmp, "x.csv")],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_peer("--check-against", dump)
        self.assertEqual(r.returncode, 2)
        self.assertIn("needs a dump made with --dropout 0", r.stderr)

    def test_cuda_without_gpu_is_bad_input(self):
        if HAVE_CUDA:
            self.skipTest("this torch sees a GPU")
        r = run_peer("--device", "cuda", "--model", "tiny", "--csv", self.csv)
        self.assertEqual(r.returncode, 2)
        self.assertIn("torch sees no CUDA device", r.stderr)
        self.assertFalse(os.path.exists(self.csv))

    @unittest.skipUnless(HAVE_CUDA, "torch sees no GPU")
    def test_cuda_allocator_delta_equals_saved_bytes(self):
        configs = ",".join(torch_layer.ALL_CONFIGS)
        gpu, cpu = os.path.join(self.tmp, "gpu.csv"), os.path.join(self.tmp, "cpu.csv")
        common = ["--model", "tiny", "--tp", "2", "--dtype", "fp32", "--config", configs, "--warmup", "1", "--iters",
                  "3"]
        r = run_peer("--device", "cuda", *common, "--csv", gpu)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_peer("--device", "cpu", *common, "--csv", cpu)
        self.assertEqual(r.returncode, 0, r.stderr)
        want = {x["config"]: int(x["act_bytes_measured"]) for x in read_rows(cpu)}
        for row in read_rows(gpu):
            self.assertIn(row["act_bytes_source"], ("requested", "allocated"))
            got = int(row["act_bytes_measured"])
            if row["act_bytes_source"] == "requested":
                self.assertEqual(got, want[row["config"]], row["config"])
            else:  # 512-byte rounding of each block
                self.assertGreaterEqual(got, want[row["config"]], row["config"])
            self.assertGreater(int(row["peak_allocated_bytes"]), got)


if __name__ == "__main__":
    unittest.main()
