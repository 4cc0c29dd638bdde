"""runners/sweep.py: plans expand as documented, a killed sweep resumes without losing or
duplicating rows, failures and OOMs are recorded and the sweep goes on, concurrent sweeps
never interleave rows and run each point once, killing the sweep ends its point, malformed
CSV lines are named. Needs ACTBENCH_BUILD (the build folder) for layer_run.
"""
import contextlib
import csv
import errno
import fcntl
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNERS = os.path.join(HERE, "..", "runners")
sys.path.insert(0, RUNNERS)
import results_csv  # noqa: E402
import sweep  # noqa: E402

SWEEP = os.path.join(RUNNERS, "sweep.py")
MPIRUN = shutil.which("mpirun")


def processes_with(text):
    """pids of live processes whose command line holds text (the test's unique CSV path)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and "sweep.py" not in cmd and state != "Z":
            pids.append(int(d))
    return pids


def lines_until(proc, text, timeout=120):
    """The stderr lines of proc up to the first holding text (or its end, or timeout seconds)."""
    said = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        said.append(line)
        if text in line:
            break
    return said


def keys_of(path):
    header, rows, problems = results_csv.read(path)
    return [tuple(row[header.index(c)] for c in sweep.KEY_COLUMNS) for _, row in rows], problems


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


class PlanExpansion(unittest.TestCase):
    def points(self, name):
        return sweep.expand(sweep.load_plan(name), {"dtype": "bf16", "layers": 1})

    def test_builtin_plans(self):
        t4 = self.points("table4")
        self.assertEqual([p["config"] for p in t4], sweep.PAPER_CONFIGS)
        self.assertTrue(all(p["model"] == "22b" and p["tp"] == 8 and p["batch"] == 4 and p["seq"] == 2048 for p in t4))
        seq = self.points("seqlen")
        self.assertEqual(len(seq), 7 * 5)
        self.assertEqual(sorted({p["seq"] for p in seq}), [512, 1024, 2048, 4096, 8192, 16384, 32768])
        self.assertTrue(all(p["hidden"] == 6144 and p["batch"] == 1 for p in seq))
        tp = self.points("tp")
        self.assertEqual(sorted({p["tp"] for p in tp}), [1, 2, 4, 8])
        models = self.points("models")
        self.assertEqual(len(models), 20)
        self.assertEqual({(p["model"], p["hidden"], p["heads"]) for p in models},
                         {("22b", 6144, 64), ("175b", 12288, 96), ("530b", 20480, 128), ("1t", 25600, 160)})
        moe = self.points("moe")  # 4 ep x 2 etp x (sp, full+sp and selective+sp under 3 module sets)
        self.assertEqual(len(moe), 4 * 2 * 5)
        self.assertEqual({sweep.world_size(p) for p in moe if p["config"] == "sp"}, {2, 4, 8, 16})
        self.assertEqual({(p["ep"], p["etp"]): sweep.world_size(p) for p in moe},
                         {(1, 1): 2, (1, 2): 2, (2, 1): 2, (2, 2): 4, (4, 1): 4, (4, 2): 8, (8, 1): 8, (8, 2): 16})

    def test_experts_only_on_moe_models_and_their_spec_is_the_presets(self):
        for fixed, said in (({"model": "llama3-8b", "ep": 2}, "ep=2 needs a mixture of experts"),
                            ({"model": "mixtral-8x7b", "kv_heads": 4}, "kv_heads cannot be set on it"),
                            ({"model": "mixtral-8x7b", "arch": "llama"}, "arch cannot be set on it"),
                            ({"model": "mixtral-8x7b", "tp": 2, "etp": 4}, "etp=4 must be 1 or tp (2)")):
            with self.subTest(**fixed), self.assertRaises(sweep.SweepError) as e:
                sweep.expand({"name": "t", "fixed": fixed, "grid": {"config": ["sp"]}}, {})
            self.assertIn(said, str(e.exception))

    def test_plan_file_and_bad_fields(self):
        tmp = tempfile.mkdtemp()
        try:
            path = os.path.join(tmp, "p.json")
            with open(path, "w") as f:
                json.dump({"fixed": {"model": "tiny"}, "grid": {"seq": [8, 16, 24], "batch": [1, 3]}}, f)
            pts = sweep.expand(sweep.load_plan(path), {"dtype": "fp32", "layers": 2})
            self.assertEqual(len(pts), 6 * 5)  # no config: the paper's five, one point each
            self.assertEqual({(p["seq"], p["batch"], p["config"]) for p in pts},
                             {(s, b, c) for s in (8, 16, 24) for b in (1, 3) for c in sweep.PAPER_CONFIGS})
            self.assertTrue(all(p["layers"] == 2 and p["dtype"] == "fp32" and p["hidden"] == 64 for p in pts))
            with open(path, "w") as f:
                json.dump({"grid": {"sequence": [1]}}, f)
            with self.assertRaises(sweep.SweepError):
                sweep.expand(sweep.load_plan(path), {})
            with self.assertRaises(sweep.SweepError):
                sweep.load_plan("no_such_plan")
            for bad in ({"grid": {"seq": [16, "x"]}}, {"grid": {"seq": [0]}}, {"fixed": {"seq": [8, 16]}},
                        {"grid": {"config": ["baseline,,sp"]}}, {"grid": {"dropout": ["nan"]}},
                        {"fixed": {"seq": 8}, "grid": {"seq": [16]}}, {"grid": {"batch": [True]}}):
                with open(path, "w") as f:
                    json.dump(bad, f)
                with self.assertRaises(sweep.SweepError, msg=bad):
                    sweep.expand(sweep.load_plan(path), {})
        finally:
            shutil.rmtree(tmp)

    def test_every_varied_field_is_in_the_key_and_config_lists_split(self):
        for field in sweep.POINT_FIELDS:
            self.assertIn(field, sweep.KEY_COLUMNS)
        tmp = tempfile.mkdtemp()
        try:
            path = os.path.join(tmp, "p.json")
            with open(path, "w") as f:  # a config list in fixed, repeated values: each point once
                json.dump({"fixed": {"model": "tiny", "config": "baseline,sp,baseline"},
                           "grid": {"dropout": [0.0, 0.1, "0.10", 0.2], "seq": [16, 16.0]}}, f)
            pts = sweep.expand(sweep.load_plan(path), {})
            self.assertEqual(sorted((p["config"], p["dropout"]) for p in pts),
                             sorted((c, d) for c in ("baseline", "sp") for d in (0.0, 0.1, 0.2)))
            keys = {sweep.point_key(p, "meta", False) for p in pts}
            self.assertEqual(len(keys), 6)
        finally:
            shutil.rmtree(tmp)

    def test_numbers_only_as_layer_run_spells_them(self):
        # int() and float() take other scripts' digits, underscores, blanks and '+'; layer_run
        # takes ASCII digits only: a plan value it would refuse is refused here, naming it.
        tmp = tempfile.mkdtemp()
        try:
            path = os.path.join(tmp, "p.json")
            for field, value in (("seq", "\u0661\u0662\u0663"), ("batch", "\uff11\uff12"), ("seq", "1_000"),
                                 ("seq", " 16"), ("seq", "+16"), ("hidden", "6.4e1"), ("tp", 2 ** 64),
                                 ("dropout", "\uff10.\uff11"), ("dropout", "0.1_0"), ("dropout", " 0.1"),
                                 ("dropout", "+0.1"), ("dropout", "infinity"), ("dropout", 1.0),
                                 ("dropout", 0.9999999999), ("dropout", -0.1)):
                with open(path, "w", encoding="utf-8") as f:
                    json.dump({"fixed": {"model": "tiny", field: value}}, f, ensure_ascii=False)
                with self.assertRaisesRegex(sweep.SweepError, rf"{field}=", msg=(field, value)):
                    sweep.expand(sweep.load_plan(path), {})
            with open(path, "w") as f:  # the spellings layer_run takes
                json.dump({"fixed": {"model": "tiny", "seq": "0016", "batch": 2.0, "dropout": "1.e-1"},
                           "grid": {"heads": ["4", 8]}}, f)
            pts = sweep.expand(sweep.load_plan(path), {})
            self.assertEqual({(p["seq"], p["batch"], p["heads"], p["dropout"]) for p in pts},
                             {(16, 2, 4, 0.1), (16, 2, 8, 0.1)})
        finally:
            shutil.rmtree(tmp)

    def test_one_spelling_of_a_dropout(self):
        # The float32 that layer_run runs, as the shortest text that reads back as it: the
        # usual dropouts keep the spelling layer_run has always written ("%g").
        for value, text in ((0.1, "0.1"), (0, "0"), (0.05, "0.05"), (-0.0, "0"), ("0.10", "0.1"), (1e-5, "1e-05"),
                            (0.1234567, "0.1234567"), (0.123456789, "0.12345679"), (0.30000001, "0.3")):
            p = sweep.plan_value({"name": "t"}, "dropout", value)
            self.assertEqual(sweep.key_text("dropout", p), text, value)


    def test_llama_points_fill_their_family_keys(self):
        pts = self.points("llama")
        self.assertEqual(len(pts), 2 * 5)
        self.assertEqual({(p["model"], p["arch"], p["hidden"], p["heads"], p["kv_heads"], p["ffn_hidden"], p["seq"],
                           p["batch"], p["tp"], p["dropout"]) for p in pts},
                         {("llama3-8b", "llama", 4096, 32, 8, 14336, 8192, 1, 8, 0.0),
                          ("llama3-70b", "llama", 8192, 64, 8, 28672, 8192, 1, 8, 0.0)})
        self.assertEqual(sorted(p["config"] for p in pts), sorted(sweep.PAPER_CONFIGS * 2))
        tmp = tempfile.mkdtemp()
        try:
            path = os.path.join(tmp, "p.json")

            def expand(plan, defaults=None):
                with open(path, "w") as f:
                    json.dump(plan, f)
                return sweep.expand(sweep.load_plan(path), defaults or {})

            # A gpt shape run as llama: g = heads and F = 4 hidden unless given (at the plan's
            # hidden and heads, not the preset's); gpt points too, as layer_run writes them.
            pts = expand({"fixed": {"model": "tiny", "config": "baseline"},
                          "grid": {"arch": ["gpt", "llama"], "hidden": [64, 128], "heads": [4, 8]}},
                         {"dropout": 0.2})
            self.assertEqual(len(pts), 8)
            for p in pts:
                if p["arch"] == "gpt":
                    self.assertEqual((p["kv_heads"], p["ffn_hidden"], p["dropout"]),
                                     (p["heads"], 4 * p["hidden"], 0.2))
                else:
                    self.assertEqual((p["kv_heads"], p["ffn_hidden"], p["dropout"]),
                                     (p["heads"], 4 * p["hidden"], 0.0))
            # Given values win; a preset's g and F stay when only the width changes.
            pts = expand({"fixed": {"model": "llama3-70b", "hidden": 4096, "config": "baseline"},
                          "grid": {"kv_heads": [8, 16], "ffn_hidden": [28672, 1000]}})
            self.assertEqual(sorted((p["kv_heads"], p["ffn_hidden"], p["hidden"], p["heads"]) for p in pts),
                             [(8, 1000, 4096, 64), (8, 28672, 4096, 64), (16, 1000, 4096, 64),
                              (16, 28672, 4096, 64)])
            # Spelling out a default is the same point as leaving it out.
            a = expand({"fixed": {"model": "tiny", "arch": "llama", "config": "sp"}})
            b = expand({"fixed": {"model": "tiny", "arch": "llama", "config": "sp", "kv_heads": 4,
                                  "ffn_hidden": 256, "dropout": 0}})
            self.assertEqual([sweep.point_key(p, "meta", False) for p in a],
                             [sweep.point_key(p, "meta", False) for p in b])
            # ... and a gpt point is never the llama point of the same shape.
            g = expand({"fixed": {"model": "tiny", "config": "sp"}})
            self.assertNotEqual(sweep.point_key(g[0], "meta", False), sweep.point_key(a[0], "meta", False))
            # GQA and a wider MLP on the gpt preset, dropout on the llama one: layer_run runs
            # them as custom specs, and so the key says.
            gqa = expand({"fixed": {"model": "tiny", "config": "sp"}, "grid": {"kv_heads": [2], "ffn_hidden": [128]}})
            self.assertEqual([(t["arch"], t["kv_heads"], t["ffn_hidden"], t["dropout"])
                              for t in map(sweep.key_texts, gqa)], [("custom", "2", "128", "0.1")])
            self.assertEqual(gqa[0]["spec_args"], ["--kv-heads", "2", "--ffn-hidden", "128"])
            wet = expand({"fixed": {"model": "llama3-8b", "config": "sp", "dropout": 0.1}})
            self.assertEqual([(t["arch"], t["dropout"], t["attention_dropout"]) for t in map(sweep.key_texts, wet)],
                             [("custom", "0.1", "0.1")])
            for bad, why in (({"fixed": {"model": "llama3-8b", "arch": "gpt"}}, "is a llama model"),
                             ({"fixed": {"arch": "bert"}}, "unknown arch"),
                             ({"fixed": {"model": "llama3-8b", "kv_heads": 0}}, "positive integer"),
                             ({"fixed": {"model": "llama3-9b"}}, "unknown model")):
                with self.assertRaisesRegex(sweep.SweepError, why, msg=bad):
                    expand(bad)
        finally:
            shutil.rmtree(tmp)

    def test_spec_fields_are_keyed_as_layer_run_writes_them(self):
        tmp = tempfile.mkdtemp()
        try:
            path = os.path.join(tmp, "p.json")

            def expand(plan):
                with open(path, "w") as f:
                    json.dump(plan, f)
                return sweep.expand(sweep.load_plan(path), {})

            texts = [sweep.key_texts(p) for p in expand(
                {"fixed": {"model": "tiny", "normalization": "RMSNorm", "norm_epsilon": "1e-6", "qk_layernorm": True,
                           "activation": "squared_relu", "add_bias_linear": 0, "add_qkv_bias": "1",
                           "position_embedding": "rope", "rotary_percent": 0.5, "rotary_base": 1e6,
                           "attention_dropout": 0.2},
                 "grid": {"config": ["baseline", "selective"], "recompute_modules": ["mlp,core_attn", "core_attn"]}})]
            spec = ("custom", "RMSNorm", "1e-06", "1", "squared_relu", "0", "1", "rope", "0.5", "1000000", "", "0.2",
                    "0.1")
            columns = ("arch", "normalization", "norm_epsilon", "qk_layernorm", "activation", "add_bias_linear",
                       "add_qkv_bias", "position_embedding", "rotary_percent", "rotary_base", "dropout",
                       "attention_dropout", "hidden_dropout")
            self.assertTrue(all(tuple(t[c] for c in columns) == spec for t in texts), texts)
            # Modules are a selective point's own (one baseline point), in layer_run's order.
            self.assertEqual(sorted((t["config"], t["recompute_modules"]) for t in texts),
                             [("baseline", ""), ("selective", "core_attn"), ("selective", "core_attn,mlp")])
            # Learned absolute positions are none inside the layer: no RoPE columns, one point.
            texts = [sweep.key_texts(p) for p in expand({"fixed": {"model": "tiny", "config": "sp", "rotary_base": 5},
                                                         "grid": {"position_embedding": ["none", "learned_absolute"]}})]
            self.assertEqual([(t["arch"], t["position_embedding"], t["rotary_base"]) for t in texts],
                             [("gpt", "none", "")])
            for bad, why in (({"fixed": {"qk_layer_norm": True}}, "unknown field 'qk_layer_norm'"),
                             ({"fixed": {"normalization": "rmsnorm"}}, "not one of LayerNorm, RMSNorm"),
                             ({"grid": {"activation": ["swiglu", "relu"]}}, "not one of gelu, swiglu"),
                             ({"fixed": {"model": "llama3-8b", "activation": "gelu"}}, "no flag that turns swiglu"),
                             ({"fixed": {"model": "llama3-8b", "add_bias_linear": True}}, "only sets it to 0"),
                             ({"fixed": {"recompute_modules": "core_attn,attn"}}, "'attn' is not a recompute module"),
                             ({"fixed": {"recompute_modules": "mlp,mlp"}}, "names 'mlp' twice"),
                             ({"fixed": {"recompute_modules": ""}}, "is not a name"),
                             ({"fixed": {"recompute_modules": "mlp", "config": "baseline,full+sp"}},
                              "needs a selective configuration"),
                             ({"fixed": {"qk_layernorm": "yes"}}, "not true, false, 1 or 0"),
                             ({"fixed": {"add_qkv_bias": 2}}, "not true, false, 1 or 0"),
                             ({"fixed": {"rotary_percent": 0}}, r"not in \(0, 1\]"),
                             ({"fixed": {"norm_epsilon": 2}}, "norm_epsilon=2 is not in"),
                             ({"fixed": {"rotary_base": "0.5"}}, "rotary_base=\"0.5\" is not in"),
                             ({"fixed": {"hidden_dropout": 1}}, r"not in \[0, 1\)"),
                             ({"fixed": {"attention_dropout": "0,1"}}, "not a finite number")):
                with self.assertRaisesRegex(sweep.SweepError, why, msg=bad):
                    expand(bad)
        finally:
            shutil.rmtree(tmp)

    def test_error_line_is_not_mpiruns_banner(self):
        dashes = "-" * 74
        banner = (f"{dashes}\nmpirun has detected an attempt to run as root.\n\nRunning as root is *strongly* "
                  f"discouraged\n{dashes}\n")
        failed = (f"layer_run: error: hidden 64 is not divisible by heads 5\n{dashes}\nPrimary job  terminated "
                  f"normally, but 1 process returned\na non-zero exit code.\n{dashes}\n{dashes}\nmpirun detected "
                  f"that one or more processes exited with non-zero status\n\n  Exit code:    2\n{dashes}\n")
        self.assertEqual(sweep.error_line(failed, 2), "layer_run: error: hidden 64 is not divisible by heads 5")
        self.assertEqual(sweep.error_line(banner + failed, 2),
                         "layer_run: error: hidden 64 is not divisible by heads 5")
        self.assertEqual(sweep.error_line(banner, 1), "mpirun has detected an attempt to run as root.")
        self.assertEqual(sweep.error_line("", -9), "killed by SIGKILL")
        self.assertEqual(sweep.error_line("", 7), "exit status 7")


class FindLayerRun(unittest.TestCase):
    def test_simulator_builds_are_not_picked_unless_named(self):
        root = tempfile.mkdtemp(prefix="actbench_find_")
        saved = sweep.ROOT
        try:
            for name, sim in [("build", False), ("build-sim", True)]:
                os.makedirs(os.path.join(root, name, "runners"))
                exe = os.path.join(root, name, "runners", "layer_run")
                with open(exe, "w") as f:
                    f.write("#!/bin/sh\n")
                os.chmod(exe, 0o755)
                with open(os.path.join(root, name, "CMakeCache.txt"), "w") as f:
                    f.write("ACTBENCH_CUDA_SIM:BOOL=%s\n" % ("ON" if sim else "OFF"))
            # the simulator build is the newest, yet the GPU build is the one found
            os.utime(os.path.join(root, "build", "runners", "layer_run"), (1, 1))
            sweep.ROOT = root
            env = os.environ.pop("ACTBENCH_BUILD", None)
            try:
                self.assertEqual(sweep.find_layer_run(None), os.path.join(root, "build", "runners", "layer_run"))
                named = os.path.join(root, "build-sim")
                self.assertEqual(sweep.find_layer_run(named), os.path.join(named, "runners", "layer_run"))
            finally:
                if env is not None:
                    os.environ["ACTBENCH_BUILD"] = env
        finally:
            sweep.ROOT = saved
            shutil.rmtree(root, ignore_errors=True)


class ResultsCsvReader(unittest.TestCase):
    """runners/results_csv.py, shared by the sweep and the plots: every line a row or a named problem."""

    def read(self, data):
        fd, path = tempfile.mkstemp(suffix=".csv")
        try:
            os.write(fd, data)
            os.close(fd)
            return results_csv.read(path)
        finally:
            os.unlink(path)

    def test_each_line_is_a_row_or_a_named_problem(self):
        header, rows, problems = self.read(
            b'a,b,c\r\n1,2,3\r\n1,"x\ny",3\n1,2\n\n1,2,31,2,3\n1,"open,3\n4,5,6\n\x00\x00\n7,"8"9,9\n1,2,\xff\n7,8,9')
        self.assertEqual(header, ["a", "b", "c"])
        # A quoted field may hold a line end; an open quote never swallows the rows after it.
        self.assertEqual(rows, [(2, ["1", "2", "3"]), (3, ["1", "x\ny", "3"]), (9, ["4", "5", "6"])])
        why = dict(problems)
        self.assertEqual(sorted(why), [5, 7, 8, 10, 11, 12, 13])
        self.assertIn("half-written", why[5])
        self.assertIn("glued", why[7])
        self.assertIn("never closed", why[8])
        self.assertIn("NUL", why[10])
        self.assertIn("glued", why[11])
        self.assertIn("not UTF-8", why[12])
        self.assertEqual(why[13], results_csv.UNFINISHED)  # no line end yet: no row, whatever it looks like

    def test_unusable_files(self):
        for data in (b"", b"\n\n", b"a,\xff\n1,2\n", b"a,a\n1,2\n", b'a,"b\n', b"a,b"):
            with self.assertRaises(results_csv.BadFile, msg=data):
                self.read(data)
        # Not regular files: refused at once, never read (a FIFO would block).
        folder = tempfile.mkdtemp(prefix="actbench_results_")
        try:
            os.mkfifo(os.path.join(folder, "fifo.csv"))
            for path, kind in ((folder, "a folder"), (os.path.join(folder, "fifo.csv"), "a FIFO")):
                with self.assertRaisesRegex(results_csv.BadFile, f"^is {kind}"):
                    results_csv.read(path)
        finally:
            shutil.rmtree(folder)


def layer_run_row(folder):
    """(header, one row) as layer_run writes them, its command a quoted field (a comma and a
    quote in the CSV's name)."""
    path = os.path.join(folder, 'one, "row".csv')
    layer_run = sweep.find_layer_run(os.environ.get("ACTBENCH_BUILD"))
    subprocess.run([layer_run, "--backend", "meta", "--model", "tiny", "--config", "baseline", "--csv", path],
                   check=True, capture_output=True, timeout=120)
    with open(path, "rb") as f:
        header, row = f.read().splitlines(keepends=True)
    os.unlink(path)
    assert row.count(b'"') >= 4, row
    return header, row


class ResultsCsvAppend(unittest.TestCase):
    """results_csv's writer keeps runtime/csv.cpp's protocol: a row is whole when its line end
    is written; a killed writer costs only its own row; a failed write leaves the file as it was."""

    def setUp(self):
        # Thousands of synced appends below: in memory where there is a tmpfs.
        self.tmp = tempfile.mkdtemp(prefix="actbench_rows_", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
        self.csv = os.path.join(self.tmp, "out.csv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def append(self, header, row):
        """results_csv.append_row; what it said on stderr."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            results_csv.append_row(self.csv, header, row)
        return err.getvalue()

    def test_a_kill_at_any_byte_costs_only_the_row_being_written(self):
        header_line, row_line = layer_run_row(self.tmp)
        header = next(csv.reader([header_line.decode()]))
        row = next(csv.reader([row_line.decode()]))
        longer = list(row)  # a long command line with commas and quotes, crossing a 4 KiB page
        longer[header.index("command")] += ' --seed 0000000000000000000000000001234,"x"' * 100
        killed = results_csv._csv_line(longer)
        self.assertGreater(len(killed), 4096)
        nxt = list(row)
        nxt[header.index("seq")] = "64"
        head = header_line + row_line
        for cut in range(len(killed) + 1):
            whole = cut == len(killed)
            with open(self.csv, "wb") as f:
                f.write(head + killed[:cut])
            got_header, rows, problems = results_csv.read(self.csv)
            self.assertEqual((got_header, [r for _, r in rows]), (header, [row] + ([longer] if whole else [])), cut)
            self.assertEqual(problems, [(3, results_csv.UNFINISHED)] if 0 < cut < len(killed) else [], cut)
            said = self.append(header, nxt)
            with open(self.csv, "rb") as f:
                self.assertEqual(f.read(), head + (killed if whole else b"") + results_csv._csv_line(nxt), cut)
            self.assertEqual(said.count("removed an unfinished last row"), 1 if 0 < cut < len(killed) else 0, cut)
        # The file's first write (header and row together) cut anywhere: the header is written again.
        for cut in range(len(head)):
            with open(self.csv, "wb") as f:
                f.write(head[:cut])
            self.assertEqual(results_csv.check_appendable(self.csv, header), cut >= len(header_line), cut)
            self.append(header, nxt)
            with open(self.csv, "rb") as f:
                self.assertEqual(f.read(), header_line + results_csv._csv_line(nxt), cut)

    def test_the_sweep_cuts_an_unfinished_row_before_it_runs(self):
        header_line, row_line = layer_run_row(self.tmp)
        for tail in (row_line[:40], b""):
            with open(self.csv, "wb") as f:
                f.write(header_line + row_line + tail)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                sweep.end_last_line(self.csv)
            with open(self.csv, "rb") as f:
                self.assertEqual(f.read(), header_line + row_line)
            self.assertEqual(err.getvalue().count("removed an unfinished last row"), 1 if tail else 0)
        with open(self.csv, "wb") as f:
            f.write(b"notes without a line end")  # no whole line: not ours to cut
        sweep.end_last_line(self.csv)
        with open(self.csv, "rb") as f:
            self.assertEqual(f.read(), b"notes without a line end")

    def test_a_failed_write_leaves_the_file_as_it_was_and_says_why(self):
        header = ["a", "b"]
        self.append(header, ["1", "2"])
        with open(self.csv, "rb") as f:
            before = f.read()
        # The file size limit (EFBIG; a full disk gives ENOSPC the same way) cuts the write short.
        code = (f"import resource, sys; sys.path.insert(0, {RUNNERS!r}); import results_csv\n"
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) + 100}, {len(before) + 100}))\n"
                f"try:\n    results_csv.append_row({self.csv!r}, ['a', 'b'], ['3', 'x' * 5000])\n"
                f"except OSError as e:\n    print(e.strerror)\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout.strip(), os.strerror(errno.EFBIG) + " (the file is left as it was)", r.stderr)
        with open(self.csv, "rb") as f:
            self.assertEqual(f.read(), before)

    def test_fields_are_bounded_as_the_readers_bound_them(self):
        header = ["a", "command"]
        self.append(header, ["1", "y" * results_csv.MAX_FIELD_BYTES])
        with open(self.csv, "rb") as f:
            before = f.read()
        self.assertEqual(len(results_csv.read(self.csv)[1][0][1][1]), results_csv.MAX_FIELD_BYTES)
        for bad in ("y" * (results_csv.MAX_FIELD_BYTES + 1), "\u00e9" * (results_csv.MAX_FIELD_BYTES // 2 + 1)):
            with self.assertRaisesRegex(results_csv.BadFile, "CSV field 'command'"):
                results_csv.append_row(self.csv, header, ["2", bad])
            with self.assertRaisesRegex(OSError, "CSV field 'command'"):  # as the sweep reports it
                sweep.append_row(self.csv, header, ["2", bad])
        with open(self.csv, "rb") as f:
            self.assertEqual(f.read(), before)
        # A longer field written by something else is named by the reader, in bytes.
        with open(self.csv, "ab") as f:
            f.write(b"3," + "\u00e9".encode() * (results_csv.MAX_FIELD_BYTES // 2 + 1) + b"\n")
        self.assertIn(f"at most {results_csv.MAX_FIELD_BYTES}", dict(results_csv.read(self.csv)[2])[3])

    def test_check_appendable_decides_as_layer_run_does(self):
        layer_run = sweep.find_layer_run(os.environ.get("ACTBENCH_BUILD"))
        header_line = subprocess.run([layer_run, "--print-csv-header"], capture_output=True, check=True).stdout
        header = next(csv.reader([header_line.decode()]))
        crlf = header_line[:-1] + b"\r\n"
        cases = {"missing": None, "empty": b"", "unfinished header": header_line[:30], "our header": header_line,
                 "crlf header": crlf, "crlf rows": crlf + b"1,2\r\n", "other header": b"a,b\n",
                 "text without a line end": b"notes"}
        for name, data in cases.items():
            with self.subTest(name):
                if os.path.exists(self.csv):
                    os.unlink(self.csv)
                if data is not None:
                    with open(self.csv, "wb") as f:
                        f.write(data)
                try:
                    verdict = results_csv.check_appendable(self.csv, header)
                except results_csv.BadFile as e:
                    verdict = str(e)
                r = subprocess.run([layer_run, "--backend", "meta", "--model", "tiny", "--config", "baseline",
                                    "--csv", self.csv], capture_output=True, text=True, timeout=120)
                if isinstance(verdict, str):
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn(f"CSV '{self.csv}' {verdict}", r.stderr)
                else:
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(verdict, name == "our header")
                if name.startswith("crlf"):
                    self.assertIn("line ends differ", verdict)



class SweepRuns(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_sweep_")
        self.csv = os.path.join(self.tmp, "sweep.csv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def plan(self, grid, fixed=None):
        path = os.path.join(self.tmp, f"plan{len(os.listdir(self.tmp))}.json")
        with open(path, "w") as f:
            json.dump({"fixed": fixed or {"model": "tiny"}, "grid": grid}, f)
        return path

    def sweep(self, *args, csv_path=None, timeout=600):
        return subprocess.run([sys.executable, SWEEP, *args, "--csv", csv_path or self.csv],
                              capture_output=True, text=True, timeout=timeout)

    def test_bad_plan_is_one_line_and_exit_2(self):
        r = self.sweep("nonsense")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown plan", r.stderr)
        self.assertFalse(os.path.exists(self.csv))

    def test_dry_run_runs_nothing(self):
        r = self.sweep("table4", "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len([l for l in r.stdout.splitlines() if l.startswith("run ")]), 5)
        self.assertIn("--emulate-tp", r.stdout)  # meta emulates t = 8
        self.assertFalse(os.path.exists(self.csv))

    def test_meta_models_then_resume_skips_everything(self):
        r = self.sweep("models", "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(self.csv)
        self.assertEqual(len(rows), 20)
        self.assertTrue(all(row[header.index("status")] == "ok" for row in rows))
        r = self.sweep("models", "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("20 already in", r.stderr)
        self.assertEqual(len(read_rows(self.csv)[1]), 20)

    def test_keys_filled_before_a_run_are_the_rows_layer_run_writes_on_its_own(self):
        # layer_run left to its own defaults (no --kv-heads, --ffn-hidden, --dropout): its row's
        # key is the one the sweep fills for the same point, for every preset and for llama at
        # a gpt shape, so a point's defaults in the sweep cannot drift from layer_run's.
        layer_run = sweep.find_layer_run(os.environ.get("ACTBENCH_BUILD"))
        cases = [({"model": m}, []) for m in sweep.PRESETS]
        cases += [({"model": "tiny", "arch": "llama"}, ["--arch", "llama"]),
                  ({"model": "22b", "arch": "llama", "hidden": 1024, "heads": 16, "seq": 128},
                   ["--arch", "llama", "--hidden", "1024", "--heads", "16", "--seq", "128"]),
                  ({"model": "llama3-70b", "hidden": 4096, "heads": 32, "kv_heads": 16},
                   ["--hidden", "4096", "--heads", "32", "--kv-heads", "16"]),
                  # The spec's options in Megatron-LM's spellings.
                  ({"model": "tiny", "kv_heads": 2, "ffn_hidden": 128},
                   ["--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "128"]),
                  ({"model": "tiny", "normalization": "RMSNorm", "norm_epsilon": 1e-6, "qk_layernorm": True,
                    "activation": "squared_relu", "add_bias_linear": False, "add_qkv_bias": True,
                    "position_embedding": "rope", "rotary_percent": 0.5, "rotary_base": 1e6,
                    "attention_dropout": 0.2, "hidden_dropout": 0.05},
                   ["--normalization", "RMSNorm", "--norm-eps", "1e-6", "--qk-layernorm", "--squared-relu",
                    "--disable-bias-linear", "--add-qkv-bias", "--position-embedding-type", "rope",
                    "--rotary-percent", "0.5", "--rope-theta", "1e6", "--attention-dropout", "0.2",
                    "--hidden-dropout", "0.05"]),
                  ({"model": "llama3-8b", "dropout": 0.1, "position_embedding": "learned_absolute"},
                   ["--dropout", "0.1", "--position-embedding-type", "learned_absolute"]),
                  ({"model": "tiny", "arch": "llama", "rotary_percent": 0.25, "norm_epsilon": 0.1,
                    "hidden_dropout": 0.3},
                   ["--arch", "llama", "--rotary-percent", "0.25", "--norm-epsilon", "0.1", "--hidden-dropout", "0.3"]),
                  # --kv-channels: d apart from h/a on both families (a gpt spec with it is custom)
                  ({"model": "tiny", "kv_channels": 8}, ["--kv-channels", "8"]),
                  ({"model": "llama3-8b", "kv_channels": 64, "kv_heads": 4}, ["--kv-heads", "4", "--kv-channels", "64"]),
                  ({"model": "tiny", "config": "selective"}, []),
                  ({"model": "tiny", "config": "selective", "recompute_modules": "layernorm,mlp"},
                   ["--recompute-modules", "layernorm,mlp"])]
        for given, options in cases:
            with self.subTest(**given):
                given = {k: sweep.plan_value({"name": "t"}, k, v) for k, v in given.items()}
                config = given.setdefault("config", "baseline")
                p = sweep.resolve({"name": "t"}, given, {})
                emulated = p["tp"] > 1
                r = subprocess.run([layer_run, "--backend", "meta", "--model", given["model"], "--config", config,
                                    *options, *(["--emulate-tp"] if emulated else []), "--csv", self.csv],
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                keys, problems = keys_of(self.csv)
                self.assertEqual(keys[-1], sweep.point_key(p, "meta", emulated))

    def test_llama_plan_runs_on_meta_and_resumes(self):
        r = self.sweep("llama", "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(self.csv)
        self.assertEqual(len(rows), 10)
        col = {c: header.index(c) for c in ("model", "arch", "kv_heads", "ffn_hidden", "dropout", "status", "tp",
                                            "act_bytes", "act_bytes_formula")}
        self.assertEqual({(row[col["model"]], row[col["arch"]], row[col["kv_heads"]], row[col["ffn_hidden"]],
                           row[col["dropout"]], row[col["tp"]], row[col["status"]]) for row in rows},
                         {("llama3-8b", "llama", "8", "14336", "0", "8", "ok"),
                          ("llama3-70b", "llama", "8", "28672", "0", "8", "ok")})
        self.assertTrue(all(row[col["act_bytes"]] == row[col["act_bytes_formula"]] for row in rows))
        r = self.sweep("llama", "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("10 already in", r.stderr)
        self.assertEqual(len(read_rows(self.csv)[1]), 10)

    def test_gpt_and_llama_points_of_one_shape_are_different_points(self):
        gpt = self.plan({"seq": [8, 16]}, fixed={"model": "tiny", "config": "baseline"})
        both = self.plan({"seq": [8, 16], "arch": ["gpt", "llama"]}, fixed={"model": "tiny", "config": "baseline"})
        gqa = self.plan({"seq": [8, 16], "kv_heads": [1, 2, 4]},
                        fixed={"model": "tiny", "arch": "llama", "config": "baseline"})
        self.assertEqual(self.sweep(gpt).returncode, 0)
        r = self.sweep(both, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        run = [l for l in r.stdout.splitlines() if l.startswith("run ")]
        self.assertEqual(len(run), 2)  # the llama points only, each with its family's options spelled out
        self.assertTrue(all("--arch llama --kv-heads 4 --ffn-hidden 256" in l and "--dropout 0 " in l for l in run))
        r = self.sweep(both)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("4 points, 2 already in", r.stderr)
        # kv_heads 4 is tiny's default g: those two points are done; g = 1 and 2 run.
        r = self.sweep(gqa)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("6 points, 2 already in", r.stderr)
        self.assert_each_point_once(8)
        header, rows = read_rows(self.csv)
        got = sorted((row[header.index("seq")], row[header.index("arch")], row[header.index("kv_heads")],
                      row[header.index("ffn_hidden")], row[header.index("dropout")]) for row in rows)
        self.assertEqual(got, sorted([(s, "gpt", "4", "256", "0.1") for s in ("8", "16")]
                                     + [(s, "llama", g, "256", "0") for s in ("8", "16") for g in ("1", "2", "4")]))
        for plan, n in ((gpt, 2), (both, 4), (gqa, 6)):
            self.assertIn(f"{n} points, {n} already in", self.sweep(plan).stderr)
        # A llama point layer_run refuses (g = 3 does not divide a = 4): the sweep's own failed
        # row carries the llama key, so a resume counts it done and --retry-failed runs it again.
        bad = self.plan({"kv_heads": [3]}, fixed={"model": "tiny", "arch": "llama", "seq": 8, "config": "baseline"})
        r = self.sweep(bad)
        self.assertEqual(r.returncode, 1, r.stderr)
        header, rows = read_rows(self.csv)
        failed = rows[-1]
        self.assertEqual([failed[header.index(c)] for c in ("status", "arch", "kv_heads", "ffn_hidden", "dropout")],
                         ["failed", "llama", "3", "256", "0"])
        self.assertIn("1 points, 1 already in", self.sweep(bad).stderr)
        self.assertIn("1 points, 0 already in", self.sweep(bad, "--retry-failed").stderr)

    def test_a_csv_from_before_the_llama_or_spec_columns_is_refused(self):
        layer_run = sweep.find_layer_run(os.environ.get("ACTBENCH_BUILD"))
        header = sweep.read_header(layer_run)
        for last in ("command", "ffn_hidden"):  # before the llama columns; before the spec's
            with self.subTest(last=last):
                old = ",".join(header[:header.index(last) + 1]) + "\n"
                with open(self.csv, "w") as f:
                    f.write(old)
                r = self.sweep("smoke")
                self.assertEqual(r.returncode, 2)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn("different header", r.stderr)
                with open(self.csv) as f:
                    self.assertEqual(f.read(), old)

    def test_gqa_gpt_and_llama_with_dropout_run_and_resume(self):
        # layer_run runs both (as custom specs): so does the sweep, and finds their rows again.
        plan = self.plan({"arch": ["gpt", "llama"], "kv_heads": [2, 4], "dropout": [0, 0.1]},
                         fixed={"model": "tiny", "seq": 8, "config": "baseline"})
        r = self.sweep(plan)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_each_point_once(8)
        header, rows = read_rows(self.csv)
        got = sorted(tuple(row[header.index(c)] for c in ("arch", "kv_heads", "ffn_hidden", "dropout", "normalization",
                                                           "status")) for row in rows)
        self.assertEqual(got, sorted([("custom", g, "256", p, "LayerNorm", "ok") for g in "24" for p in ("0", "0.1")]
                                     + [("llama", g, "256", "0", "RMSNorm", "ok") for g in "24"]
                                     + [("custom", g, "256", "0.1", "RMSNorm", "ok") for g in "24"]))
        self.assertIn("8 points, 8 already in", self.sweep(plan).stderr)

    def test_a_plan_of_spec_fields_and_recompute_modules_resumes(self):
        plan = self.plan({"config": ["baseline", "selective"], "qk_layernorm": [False, True],
                          "recompute_modules": ["core_attn", "layernorm,mlp,core_attn"]},
                         fixed={"model": "tiny", "seq": 8, "position_embedding": "rope", "rotary_percent": 0.5,
                                "normalization": "RMSNorm", "activation": "swiglu", "attention_dropout": 0})
        r = self.sweep(plan)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_each_point_once(6)  # baseline has no modules: 2 points, selective 4
        header, rows = read_rows(self.csv)
        self.assertEqual(sorted((row[header.index("config")], row[header.index("qk_layernorm")],
                                 row[header.index("recompute_modules")], row[header.index("dropout")],
                                 row[header.index("rotary_percent")]) for row in rows),
                         sorted([("baseline", q, "", "", "0.5") for q in "01"]
                                + [("selective", q, m, "", "0.5") for q in "01"
                                   for m in ("core_attn", "core_attn,mlp,layernorm")]))
        r = self.sweep(plan)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("6 points, 6 already in", r.stderr)
        self.assertIn("ran 0 ", r.stderr)

    def test_moe_plan_runs_on_meta_and_resumes(self):
        # Every parallel layout of the experts (whole, over TP, over replicas, split over TP) is
        # a point of its own, keyed by ep and etp, emulated on meta; each row equals its formula.
        plan = self.plan({"ep": [1, 2, 4], "etp": [1, 2], "config": ["sp", "selective+sp"]},
                         fixed={"model": "mixtral-8x7b", "tp": 2, "seq": 1024, "recompute_modules": "core_attn,moe_act"})
        r = self.sweep(plan, "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(self.csv)
        self.assertEqual(len(rows), 12)
        col = {c: header.index(c) for c in ("ep", "etp", "arch", "emulated", "status", "act_bytes",
                                            "act_bytes_formula", "command", "recompute_modules")}
        self.assertEqual({(row[col["ep"]], row[col["etp"]]) for row in rows},
                         {(e, t) for e in ("1", "2", "4") for t in ("1", "2")})
        for row in rows:
            self.assertEqual((row[col["status"]], row[col["arch"]], row[col["emulated"]]), ("ok", "moe", "1"), row)
            self.assertEqual(row[col["act_bytes"]], row[col["act_bytes_formula"]])
            over_replicas = row[col["ep"]] == "4" or (row[col["ep"]], row[col["etp"]]) == ("2", "2")
            self.assertEqual("--emulate-ep" in row[col["command"]], over_replicas, row[col["command"]])
        r = self.sweep(plan, "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("12 points, 12 already in", r.stderr)

    @unittest.skipUnless(MPIRUN, "mpirun not on PATH")
    def test_moe_points_run_their_expert_parallel_world_under_mpirun(self):
        # Qwen3-30B-A3B's layer at a small width on the cpu, t = 2: ep 2 whole (the experts over
        # the TP group: 2 ranks), ep 4 whole (two replicas: 4), ep 2 split over TP (two replicas:
        # 4) and ep 4 split (four replicas: 8).
        plan = self.plan({"ep": [4, 2], "etp": [1, 2]},
                         fixed={"model": "qwen3-30b-a3b", "tp": 2, "hidden": 64, "heads": 4, "seq": 16, "batch": 1,
                                "config": "sp"})
        args = [plan, "--backend", "cpu", "--launcher", "mpi", "--iters", "1", "--warmup", "0", "--dtype", "fp32"]
        r = self.sweep(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(self.csv)
        col = {c: header.index(c) for c in ("ep", "etp", "status", "emulated", "act_bytes", "act_bytes_formula",
                                            "comm_mode", "message")}
        self.assertEqual(len(rows), 4, rows)
        for row in rows:
            self.assertEqual((row[col["status"]], row[col["emulated"]]), ("ok", "0"), row[col["message"]])
            self.assertEqual(row[col["act_bytes"]], row[col["act_bytes_formula"]])
            self.assertEqual(row[col["comm_mode"]], "mpi")  # real ranks
        r = self.sweep(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("4 points, 4 already in", r.stderr)

    def test_context_parallel_points_run_under_mpirun_and_resume(self):
        # C = 2 and C = 1 of each comm type are points of their own; C = 2 runs as 2 real ranks,
        # and cp_comm_type is empty (not a point) where C = 1.
        plan = self.plan({"cp": [1, 2], "cp_comm_type": ["p2p", "a2a"]},
                         fixed={"model": "tiny", "seq": 8, "attention": "fused", "config": "selective"})
        args = [plan, "--backend", "cpu", "--launcher", "mpi", "--iters", "1", "--warmup", "0"]
        r = self.sweep(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(self.csv)
        col = {c: header.index(c) for c in ("cp", "cp_comm_type", "emulated", "status", "act_bytes",
                                            "act_bytes_formula", "comm_bytes_cp", "comm_mode")}
        self.assertEqual(sorted((row[col["cp"]], row[col["cp_comm_type"]]) for row in rows),
                         [("1", ""), ("2", "a2a"), ("2", "p2p")])
        for row in rows:
            self.assertEqual((row[col["status"]], row[col["emulated"]]), ("ok", "0"), row)
            self.assertEqual(row[col["act_bytes"]], row[col["act_bytes_formula"]])
            if row[col["cp"]] == "2":
                self.assertGreater(float(row[col["comm_bytes_cp"]]), 0)
                self.assertEqual(row[col["comm_mode"]], "mpi")  # two real ranks
        r = self.sweep(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("3 points, 3 already in", r.stderr)

    def test_longcontext_plan_emulates_both_groups_on_meta(self):
        points = sweep.expand(sweep.load_plan("longcontext"), {"dtype": "bf16", "layers": 1})
        self.assertEqual(len(points), 6 * 5 * 2)
        self.assertEqual(max(p["seq"] for p in points), 1048576)
        plan = self.plan({"cp": [2, 4]}, fixed={"model": "22b", "tp": 8, "batch": 1, "seq": 65536, "attention": "fused",
                                                 "config": "selective+sp"})
        r = self.sweep(plan, "--backend", "meta")
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(self.csv)
        self.assertEqual(len(rows), 2)
        for row in rows:
            self.assertEqual(row[header.index("emulated")], "1")
            self.assertIn("--emulate-cp", row[header.index("command")])
            self.assertEqual(row[header.index("act_bytes")], row[header.index("act_bytes_formula")])

    def test_failed_and_oom_points_are_recorded_and_the_sweep_goes_on(self):
        # heads 5 do not divide h = 64: layer_run refuses the point; the others run.
        plan = self.plan({"heads": [4, 5], "config": ["baseline", "full"]}, fixed={"model": "tiny", "tp": 2})
        r = self.sweep(plan, "--backend", "meta")
        self.assertEqual(r.returncode, 1)
        header, rows = read_rows(self.csv)
        status = [(row[header.index("heads")], row[header.index("status")]) for row in rows]
        self.assertEqual(sorted(status), [("4", "ok"), ("4", "ok"), ("5", "failed"), ("5", "failed")])
        failed = [row for row in rows if row[header.index("status")] == "failed"]
        self.assertTrue(all("divisible" in row[header.index("message")] for row in failed), failed)
        # A resume skips recorded failures; --retry-failed runs them again.
        self.assertIn("4 already in", self.sweep(plan, "--backend", "meta").stderr)
        self.assertIn("2 already in", self.sweep(plan, "--backend", "meta", "--retry-failed").stderr)
        # Out of memory: rows with status oom, exit 0 (an oom is a result, not a failure).
        oom_csv = os.path.join(self.tmp, "oom.csv")
        r = self.sweep("table4", "--backend", "meta", "--memory-limit", "1GiB", csv_path=oom_csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, rows = read_rows(oom_csv)
        self.assertEqual([row[header.index("status")] for row in rows], ["oom"] * 5)

    def test_killed_sweep_resumes_without_loss_or_duplicates(self):
        plan = self.plan({"seq": [8, 16, 24, 32], "config": sweep.PAPER_CONFIGS},
                         fixed={"model": "tiny", "tp": 2})
        args = [sys.executable, SWEEP, plan, "--backend", "cpu", "--launcher", "emulate", "--dtype", "fp32",
                "--iters", "300", "--warmup", "0", "--csv", self.csv]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:  # kill the whole process group once two rows are in
            if os.path.exists(self.csv) and len(read_rows(self.csv)[1]) >= 2:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        header, before = read_rows(self.csv)
        self.assertGreaterEqual(len(before), 2)
        self.assertLess(len(before), 20, "the sweep finished before it could be killed: make points slower")
        self.assertTrue(all(len(row) == len(header) for row in before))
        r = subprocess.run(args, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, after = read_rows(self.csv)
        self.assertEqual(after[:len(before)], before)  # finished rows untouched
        keys = [tuple(row[header.index(c)] for c in sweep.KEY_COLUMNS) for row in after]
        self.assertEqual(len(keys), 20)
        self.assertEqual(len(set(keys)), 20)

    def test_concurrent_sweeps_never_interleave_rows(self):
        plans = [self.plan({"seq": [8, 16, 24, 32], "config": sweep.PAPER_CONFIGS}, fixed={"model": "tiny", "batch": b})
                 for b in (1, 2, 3)]
        procs = [subprocess.Popen([sys.executable, SWEEP, p, "--backend", "meta", "--csv", self.csv],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in plans]
        for p in procs:
            self.assertEqual(p.wait(timeout=600), 0)
        with open(self.csv) as f:
            lines = f.read().splitlines()
        header = lines[0]
        self.assertEqual(sum(1 for l in lines if l == header), 1)  # header once
        header_cols, rows = read_rows(self.csv)
        self.assertEqual(len(rows), 60)
        self.assertTrue(all(len(row) == len(header_cols) for row in rows))

    def slow_args(self, plan, iters):
        # cpu points of about 0.2 s per 300 iterations
        return [sys.executable, SWEEP, plan, "--backend", "cpu", "--launcher", "emulate", "--dtype", "fp32",
                "--iters", str(iters), "--warmup", "0", "--csv", self.csv]

    def wait_for_point(self, proc, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            pids = processes_with(self.csv)
            if pids:
                return pids
            time.sleep(0.02)
        self.fail("no point started")

    def assert_gone(self, text, timeout=3):
        deadline = time.time() + timeout
        while processes_with(text) and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(processes_with(text), [], "a point outlived its sweep")

    def assert_each_point_once(self, n):
        keys, problems = keys_of(self.csv)
        self.assertEqual(problems, [])
        self.assertEqual(len(keys), n)
        self.assertEqual(len(set(keys)), n)

    def test_killing_only_the_sweep_ends_its_point_and_a_rerun_runs_each_point_once(self):
        plan = self.plan({"seq": [8, 16], "config": ["baseline", "full"]}, fixed={"model": "tiny", "tp": 2})
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=sig.name):
                # Points of several seconds: one still running 3 s after its sweep died is caught.
                proc = subprocess.Popen(self.slow_args(plan, 30000), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                self.wait_for_point(proc)
                proc.send_signal(sig)  # the sweep alone, not its process group
                _, err = proc.communicate(timeout=60)
                if sig != signal.SIGKILL:
                    self.assertEqual(proc.returncode, 128 + sig, err)
                    self.assertIn("run again to resume", err)
                self.assert_gone(self.csv)
                if os.path.exists(self.csv):
                    header, rows = read_rows(self.csv)  # an interrupted point is no failure
                    self.assertEqual([r for r in rows if r[header.index("status")] != "ok"], [])
        # The same points (iterations are not part of a point), quickly.
        r = subprocess.run(self.slow_args(plan, 30), capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_each_point_once(4)

    def test_a_sweep_waits_for_the_one_holding_the_csv(self):
        plan = self.plan({"seq": [8, 16], "config": ["baseline"]})
        # A point left running by a sweep that has exited holds FILE.lock, as its process inherits it.
        fd = os.open(self.csv + ".lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"sweep_pid": 2 ** 22 + 12345, "point": "tiny s=8"}).encode())
        try:
            r = self.sweep(plan, "--no-wait")
            self.assertEqual(r.returncode, 2)
            self.assertIn("in use by a point left running by sweep pid", r.stderr)
            self.assertFalse(os.path.exists(self.csv))
            proc = subprocess.Popen([sys.executable, SWEEP, plan, "--csv", self.csv], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            # The lock is held until the sweep says it waits (however long a loaded machine takes
            # to get it there), so the sweep cannot find it free.
            said = lines_until(proc, "waiting for it to end")
            self.assertIn("waiting for it to end", "".join(said))
            self.assertIsNone(proc.poll(), "the sweep did not wait")
            self.assertFalse(os.path.exists(self.csv))
        finally:
            os.close(fd)
        _, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, "".join(said) + err)
        self.assert_each_point_once(2)

    def test_two_sweeps_of_one_plan_run_each_point_once(self):
        plan = self.plan({"seq": [8, 16, 24, 32], "config": sweep.PAPER_CONFIGS, "dropout": [0.0, 0.1]})
        procs = [subprocess.Popen([sys.executable, SWEEP, plan, "--backend", "meta", "--csv", self.csv],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=600)
            self.assertEqual(p.returncode, 0, err)
        self.assert_each_point_once(40)
        header, rows = read_rows(self.csv)
        self.assertEqual(sorted({r[header.index("dropout")] for r in rows}, key=float), ["0", "0.1"]
                         if rows[0][header.index("dropout")] in ("0", "0.1") else sorted(
                             {r[header.index("dropout")] for r in rows}, key=float))
        self.assertEqual({float(r[header.index("dropout")]) for r in rows}, {0.0, 0.1})
        r = self.sweep(plan)
        self.assertIn("40 already in", r.stderr)

    def test_config_list_plan_resumes(self):
        plan = self.plan({"seq": [8, 16]}, fixed={"model": "tiny", "config": "baseline,selective+sp"})
        r = self.sweep(plan)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_each_point_once(4)
        self.assertIn("4 already in", self.sweep(plan).stderr)

    def test_malformed_lines_are_named_and_an_unfinished_row_is_cut_away(self):
        plan = self.plan({"seq": [8, 16, 24]}, fixed={"model": "tiny", "config": "baseline"})
        self.assertEqual(self.sweep(plan).returncode, 0)
        with open(self.csv, "rb") as f:
            lines = f.read().splitlines(keepends=True)
        good = lines[1]
        # Line 2 glued to line 3 (its point is lost), a non-UTF-8 line, a huge field, and a last
        # row cut in half without its line end (its writer was killed).
        body = [lines[0], lines[1].rstrip(b"\n") + lines[2], b"x,\xff\xfe," + good[6:],
                good.replace(b",ok,", b",ok," + b"y" * 200000 + b","), lines[3][:40]]
        with open(self.csv, "wb") as f:
            f.write(b"".join(body))
        r = self.sweep(plan)
        self.assertEqual(r.returncode, 0, r.stderr)
        name = os.path.basename(self.csv)
        for line, why in ((2, "glued"), (3, "not UTF-8"), (4, "bytes long"), (5, "unfinished last row")):
            self.assertRegex(r.stderr, rf"warning: .*{name}:{line}: .*{why}")
        self.assertEqual(r.stderr.count("removed an unfinished last row"), 1)
        self.assertIn("0 already in", r.stderr)  # every point's row is malformed: all run again
        keys, problems = keys_of(self.csv)
        self.assertEqual([line for line, _ in problems], [2, 3, 4])  # the unfinished row was cut away
        self.assertEqual(sorted(keys), sorted(set(keys)))
        self.assertEqual(len(keys), 3)
        # A header that is not UTF-8: one line, exit 2, nothing run.
        with open(self.csv, "wb") as f:
            f.write(b"backend,\xff\n")
        r = self.sweep(plan)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("not UTF-8", r.stderr)

    def assert_refused(self, r, said):
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn(said, r.stderr)

    def test_plan_files_that_are_no_plans_are_one_line_and_exit_2(self):
        def plan_text(text):
            path = os.path.join(self.tmp, "bad.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return path

        deep = '{"grid": {"seq": ' + "[" * 100000 + "]" * 100000 + "}}"
        for text, said in ((deep, "nested deeper than a plan"),
                           ('{"grid": {"seq": [[[[[16]]]]]}}', "nested deeper than a plan"),
                           ('{"grid": {"dropout": [NaN]}}', "NaN is not a JSON number"),
                           ('{"grid": {"seq": [' + "1" * 5000 + "]}}", "not a JSON plan"),
                           ('{"grid": {"seq": ["\u0661\u0662"]}}', "seq="),
                           ('{"grid": {"seq": [' + ", ".join(map(str, range(1, 1001))) + '], "batch": ['
                            + ", ".join(map(str, range(1, 1001))) + '], "config": ["baseline", "sp"]}}',
                            "more than 1000000 points")):
            self.assert_refused(self.sweep(plan_text(text), timeout=60), said)
        fifo = os.path.join(self.tmp, "fifo.json")
        os.mkfifo(fifo)
        self.assert_refused(self.sweep(fifo, timeout=60), "a FIFO")  # answered at once: nobody writes to it
        folder = os.path.join(self.tmp, "plans.json")
        os.mkdir(folder)
        self.assert_refused(self.sweep(folder, timeout=60), "a folder")
        self.assertFalse(os.path.exists(self.csv))

    def test_options_take_numbers_as_layer_run_spells_them(self):
        for option, value in (("--layers", "\uff11"), ("--iters", "\u0663"), ("--warmup", "1_0"),
                              ("--timeout", "\uff11\uff10"), ("--dropout", "0.1_0"), ("--dropout", "\u0660.\u0661")):
            self.assert_refused(self.sweep("smoke", option, value, timeout=60), option.lstrip("-"))
        fifo = os.path.join(self.tmp, "fifo.csv")
        os.mkfifo(fifo)
        self.assert_refused(self.sweep("smoke", csv_path=fifo, timeout=60), "a FIFO")

    def test_a_dropout_of_many_digits_is_one_point(self):
        # layer_run runs a float32 and records it with the sweep's own spelling of that float32,
        # so a dropout of more than six significant digits is found again on every re-run.
        values = [0.1234567, 0.123456789, 0.1, 0.05, 0, 1e-05, "0.30000001"]
        plan = self.plan({"dropout": values}, fixed={"model": "tiny", "seq": 8, "config": "baseline"})
        for run in range(2):
            r = self.sweep(plan, "--backend", "meta")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"{len(values)} points, {len(values) if run else 0} already in", r.stderr)
        header, rows = read_rows(self.csv)
        self.assertEqual(sorted(row[header.index("dropout")] for row in rows),
                         sorted(["0.1234567", "0.12345679", "0.1", "0.05", "0", "1e-05", "0.3"]))

    def test_two_names_of_one_csv_are_one_lock(self):
        plan = self.plan({"seq": [8, 16], "config": ["baseline"]})
        self.assertEqual(self.sweep(self.plan({"seq": [24], "config": ["baseline"]})).returncode, 0)
        other = os.path.join(self.tmp, "other.csv")
        os.link(self.csv, other)  # a hard link: another name of the same file
        first = subprocess.Popen(self.slow_args(plan, 30000), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
        try:
            self.wait_for_point(first)
            r = self.sweep(plan, "--no-wait", csv_path=other, timeout=60)
            self.assert_refused(r, f"in use by sweep pid {first.pid}")
            self.assertIn(f"through its other name {os.path.realpath(self.csv)}", r.stderr)
            second = subprocess.Popen([sys.executable, SWEEP, plan, "--csv", other], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
            said = lines_until(second, "waiting for it to end")
            self.assertIn("waiting for it to end", "".join(said))
        finally:
            first.send_signal(signal.SIGINT)
            first.communicate(timeout=60)
        _, err = second.communicate(timeout=120)
        self.assertEqual(second.returncode, 0, "".join(said) + err)
        self.assert_each_point_once(3)

    def test_a_command_no_row_could_hold_is_refused_before_any_point(self):
        # layer_run refuses a command line longer than a CSV field or holding a line break, and
        # so would the failed row the sweep writes for it: the sweep refuses it up front.
        # One argument holds at most 128 KiB (the kernel's limit): with the rest of the command, enough.
        for extra, said in (("--seed " + "0" * 130980 + "7", "more than a CSV field holds"),
                            ("--seed '7\n'", "line break")):
            r = self.sweep("smoke", f"--extra={extra}")
            self.assertEqual(r.returncode, 2, r.stderr[-300:])
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr[-300:])
            self.assertIn(said, r.stderr)
            if os.path.exists(self.csv):  # the sweep may have made it, holding its header only
                self.assertEqual(read_rows(self.csv)[1], [])

    def test_bad_arguments_exit_2(self):
        for args in (["smoke", "--extra=--dropout 0.3"], ["smoke", "--extra=--csv=x.csv"],
                     ["smoke", "--timeout", "0"], ["smoke", "--dropout", "nan"]):
            r = self.sweep(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        # The llama family's options: keyed ones belong in the plan, unkeyed ones are refused.
        for extra, said in (("--arch llama", "--arch: the sweep sets it"), ("--kv-heads=2", "--kv-heads: the sweep"),
                            ("--seed 7 --ffn-hidden 128", "--ffn-hidden: the sweep"),
                            ("--hf-config config.json", "--hf-config: it changes what runs"),
                            ("--rope-theta=1e6", "--rope-theta: the sweep sets it"),
                            ("--norm-eps 1e-6 --rope-theta 1", "--norm-eps, --rope-theta: the sweep sets it"),
                            ("--qk-layernorm --swiglu", "--qk-layernorm, --swiglu: the sweep sets it"),
                            ("--recompute-modules mlp", "--recompute-modules: the sweep sets it"),
                            ("--num-experts 8", "--num-experts: the sweep sets it"),
                            ("--ep 2", "--ep: the sweep sets it")):
            r = self.sweep("llama", f"--extra={extra}")
            self.assertEqual(r.returncode, 2, extra)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(said, r.stderr)
        # A misspelt spec field, or a value layer_run would refuse: one line naming it, nothing run.
        for grid, said in (({"qk_layer_norm": [True]}, "unknown field 'qk_layer_norm'"),
                           ({"recompute_modules": ["mlp", "attn"]}, "'attn' is not a recompute module")):
            r = self.sweep(self.plan(grid))
            self.assertEqual(r.returncode, 2)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(said, r.stderr)
            self.assertFalse(os.path.exists(self.csv))
        r = self.sweep("smoke", csv_path=os.path.join(self.tmp, "missing", "x.csv"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("does not exist", r.stderr)
        r = self.sweep("smoke", csv_path=self.tmp)
        self.assertEqual(r.returncode, 2)
        self.assertIn("is a folder", r.stderr)

    @unittest.skipUnless(MPIRUN, "mpirun not on PATH")
    def test_mpi_points_without_open_mpis_root_variables(self):
        # As root Open MPI refuses to start without two variables: the sweep sets them for its
        # own launcher. A failed point's message is layer_run's error, not mpirun's banner.
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
        env.pop("OMPI_MCA_rmaps_base_oversubscribe", None)  # the sweep adds --oversubscribe itself when needed
        plan = self.plan({"heads": [4, 5]}, fixed={"model": "tiny", "tp": 2, "seq": 8, "config": "baseline"})
        r = subprocess.run([sys.executable, SWEEP, plan, "--backend", "cpu", "--launcher", "mpi", "--iters", "1",
                            "--warmup", "0", "--timeout", "120", "--csv", self.csv],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        header, rows = read_rows(self.csv)
        got = {row[header.index("heads")]: row for row in rows}
        self.assertEqual(len(rows), 2)
        self.assertEqual(got["4"][header.index("status")], "ok", got["4"])
        self.assertEqual(got["4"][header.index("emulated")], "0")
        failed = got["5"]
        self.assertEqual(failed[header.index("status")], "failed")
        self.assertIn("divisible", failed[header.index("message")])
        self.assertNotIn("mpirun", failed[header.index("message")])
        self.assertTrue(failed[header.index("command")].startswith(MPIRUN))
        # Killing the sweep alone ends mpirun and its ranks too.
        os.unlink(self.csv)
        proc = subprocess.Popen([sys.executable, SWEEP, plan, "--backend", "cpu", "--launcher", "mpi", "--dtype",
                                 "fp32", "--iters", "1000000", "--warmup", "0", "--csv", self.csv],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self.wait_for_point(proc)
        time.sleep(0.5)  # mpirun has started its ranks
        proc.kill()
        proc.wait()
        self.assert_gone(self.csv, timeout=10)


if __name__ == "__main__":
    unittest.main()
