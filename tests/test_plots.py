"""plots/ and the theory runner as a user runs them: make_all on fixture CSVs produces every
figure and table, says what it skips and why, and the theory CSVs carry the columns the
plots read. Standard library only (the plot scripts bring matplotlib themselves).

Run by ctest with ACTBENCH_THEORY pointing at the theory binary; without it the committed
snapshot tests/fixtures/theory/ stands in and the runner's own tests are skipped.
"""
import csv
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PLOTS = os.path.join(ROOT, "plots")
FIXTURES = os.path.join(HERE, "fixtures")
RESULTS = os.path.join(FIXTURES, "results")
THEORY_SNAPSHOT = os.path.join(FIXTURES, "theory")
THEORY = os.environ.get("ACTBENCH_THEORY")
LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN")
# The system python has matplotlib; the scripts re-exec into it from any other python3.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

ALL_FIGURES = ["table2_activation_bytes", "table4_layer_times", "table5_iteration_time", "fig1_memory",
               "fig7_percent_of_baseline", "fig8_time_breakdown", "seqlen_memory", "seqlen_terms_175b",
               "memory_measured_vs_predicted", "longseq_memory", "longseq_fit", "longcontext_memory", "longcontext_fit", "llama_activation_bytes",
               "llama_seqlen_memory", "recompute_modules_bytes", "moe_modules_bytes"]
ALL_TABLES = ["table2_activation_bytes.md", "table4_layer_times.md", "table5_iteration_time.md", "fig1_memory.md",
              "fig7_percent_of_baseline.md", "fig8_time_breakdown.md", "seqlen_memory.md",
              "memory_measured_vs_predicted.md", "longseq_memory.md", "longcontext_fit.md", "llama_activation_bytes.md",
              "recompute_modules_bytes.md", "moe_modules_bytes.md"]


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise AssertionError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def run(args, timeout=120, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def theory_args():
    """make_all arguments that pick the theory tables: the binary when we have it."""
    return ["--theory-bin", THEORY] if THEORY else ["--theory", THEORY_SNAPSHOT]


class MakeAll(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_plots_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def make_all(self, results, out, extra=()):
        env = dict(os.environ)
        env.pop("ACTBENCH_THEORY", None)  # only what the arguments say
        return run([PYTHON, os.path.join(PLOTS, "make_all.py"), results, out, *theory_args(), *extra], env=env)

    def test_every_artifact_from_the_fixtures(self):
        out = os.path.join(self.tmp, "out")
        p = self.make_all(RESULTS, out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("13 made, 0 skipped", p.stdout)
        # notes.csv is not a layer_run CSV: skipped; 63 layer_run rows and the CUPTI file read.
        self.assertIn("read 63 layer_run rows and 96 CUPTI rows", p.stdout)
        for name in ALL_FIGURES:
            png = os.path.join(out, name + ".png")
            self.assertTrue(os.path.exists(png), name)
            w, h = png_size(png)
            # Half a page wide at 200 dpi: 500–1000 px, wider than tall.
            self.assertTrue(450 <= w <= 1100 and 250 <= h <= w, f"{name}: {w}x{h}")
            self.assertGreater(os.path.getsize(png), 10_000, name)
            self.assertGreater(os.path.getsize(os.path.join(out, name + ".pdf")), 1000, name)
        for name in ALL_TABLES:
            with open(os.path.join(out, name)) as f:
                text = f.read()
            self.assertIn("|---", text, name)
            self.assertGreater(text.count("\n| "), 2, name)
        with open(os.path.join(out, "index.md")) as f:
            self.assertIn("## Made", f.read())
        leftovers = [n for n in os.listdir(out) if ".tmp." in n]
        self.assertEqual(leftovers, [])

    def test_paper_values_beside_ours(self):
        out = os.path.join(self.tmp, "out")
        self.assertEqual(self.make_all(RESULTS, out).returncode, 0)
        with open(os.path.join(out, "table4_layer_times.md")) as f:
            t4 = f.read()
        self.assertIn("paper fwd (A100)", t4)
        self.assertIn("| TP+SP+selective | 2.850 | 5.450 | 1.566 | 9.866 | +3.1% | 7.2 | 13.1 | 20.3 | +4% |", t4)
        with open(os.path.join(out, "table5_iteration_time.md")) as f:
            t5 = f.read()
        # MFU / HFU recomputed from the paper's times next to the paper's own columns.
        self.assertIn("| 175B | 64 | 18.13 | 13.75 | 31.8% | 51.4% | 52.8% | 51.4% | 52.8% | 51.9% |", t5)
        with open(os.path.join(out, "fig8_time_breakdown.md")) as f:
            f8 = f.read()
        self.assertIn("full recompute paper (A100)", f8)
        with open(os.path.join(out, "fig7_percent_of_baseline.md")) as f:
            self.assertIn("| 22B | TP+SP+selective | 16.1 | 16.1 | 16.1 |", f.read())

    def test_empty_results_skip_what_needs_measurements(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        out = os.path.join(self.tmp, "out")
        p = self.make_all(empty, out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("10 made, 3 skipped", p.stdout)
        for what in ("skipped: Table 4", "skipped: Figure 8", "skipped: Measured vs predicted"):
            self.assertIn(what, p.stdout)
        self.assertTrue(os.path.exists(os.path.join(out, "fig1_memory.png")))
        self.assertFalse(os.path.exists(os.path.join(out, "table4_layer_times.png")))

    def test_no_theory_tables_skips_the_formula_plots(self):
        out = os.path.join(self.tmp, "out")
        # --theory names a folder without the theory tables.
        p = run([PYTHON, os.path.join(PLOTS, "make_all.py"), RESULTS, out, "--theory", self.tmp])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("skipped: Figure 1", p.stdout)
        self.assertIn("made: table4_layer_times.png", p.stdout)  # needs only measured rows

    def bad_results(self):
        """The fixtures plus one of each bad input, every bad row a copy of a good one (so that
        every figure can still be made from the rest)."""
        bad = os.path.join(self.tmp, "bad")
        shutil.copytree(RESULTS, bad)
        with open(os.path.join(RESULTS, "layer_runs.csv"), "rb") as f:
            lines = f.read().splitlines(keepends=True)
        header = lines[0].decode().rstrip("\n").split(",")
        cols = lines[1].decode().rstrip("\n").split(",")

        def with_value(col, value):
            row = list(cols)
            row[header.index(col)] = value
            return ",".join(row).encode() + b"\n"

        tail = [with_value("act_bytes_formula", ""),                       # line 65
                with_value("message", "x" * 300000),                       # line 66: a huge field
                with_value("hostname", "host") .replace(b"host", b"h\xffst"),  # line 67: not UTF-8
                lines[2].rstrip(b"\r\n") + lines[3],                      # line 68: two rows glued
                with_value("fwd_ms", "fast"),                              # line 69: not a number
                with_value("act_bytes", "1e308"),                          # line 70: past 64 bits
                lines[4][:50]]                                             # line 71: unfinished (no line end)
        with open(os.path.join(bad, "layer_runs.csv"), "ab") as f:
            f.write(b"".join(tail))
        # A layer_run CSV without a required column, a CUPTI one with a bad gpu_ms, a peer's CSV.
        with open(os.path.join(bad, "torch_peer.csv"), "w") as f:
            f.write("peer,device,model,hidden,heads,seq,batch,tp,config,dtype,fwd_ms,bwd_ms,status\n")
        drop = header.index("act_bytes_formula")
        with open(os.path.join(bad, "old.csv"), "w") as f:
            for line in lines[:3]:
                fields = line.decode().rstrip("\n").split(",")
                f.write(",".join(fields[:drop] + fields[drop + 1:]) + "\n")
        with open(os.path.join(RESULTS, "cupti_22b.csv")) as f:
            cupti = f.read().splitlines(keepends=True)
        with open(os.path.join(bad, "cupti_bad.csv"), "w") as f:
            f.write(cupti[0] + cupti[1].replace(",0.08000,", ",abc,"))
        return bad

    def test_bad_inputs_are_named_and_the_other_figures_made(self):
        with open(os.path.join(RESULTS, "layer_runs.csv")) as f:
            header = f.readline().strip().split(",")
        out = os.path.join(self.tmp, "out")
        os.makedirs(os.path.join(out, "fig1_memory.png"))  # an output path that is a folder
        p = run([PYTHON, os.path.join(PLOTS, "make_all.py"), self.bad_results(), out, "--theory", THEORY_SNAPSHOT])
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        errors = p.stderr.strip().splitlines()
        expected = [r"layer_runs\.csv:65: act_bytes_formula is empty",
                    rf"layer_runs\.csv:66: field {header.index('message') + 1} is 300000",
                    r"layer_runs\.csv:67: bytes that are not UTF-8", r"layer_runs\.csv:68: .*glued",
                    r"layer_runs\.csv:69: fwd_ms is 'fast'", r"layer_runs\.csv:70: act_bytes is 1e308, out of range",
                    r"layer_runs\.csv:71: an unfinished last row",
                    r"old\.csv: a layer_run CSV without the required column\(s\) act_bytes_formula",
                    r"cupti_bad\.csv:2: gpu_ms is 'abc'", r"Figure 1 .*cannot write .*fig1_memory\.png: is a folder"]
        for pattern in expected:
            self.assertEqual(len([e for e in errors if re.search(pattern, e)]), 1, f"{pattern}\n{p.stderr}")
        self.assertEqual(len(errors), len(expected), p.stderr)
        self.assertTrue(all(e.startswith("make_all: error: ") for e in errors), p.stderr)
        # The good rows are all read (95 CUPTI rows: the bad file's one row is left out) and every
        # figure but the unwritable one is made.
        self.assertIn("read 63 layer_run rows and 96 CUPTI rows", p.stdout)
        self.assertIn("12 made, 0 skipped, 1 failed", p.stdout)
        self.assertIn("ignored: notes.csv", p.stdout)
        self.assertIn("ignored: torch_peer.csv (a peer's CSV)", p.stdout)
        for name in ALL_FIGURES[1:]:
            self.assertTrue(os.path.exists(os.path.join(out, name + ".png")), name)
        with open(os.path.join(out, "index.md")) as f:
            self.assertIn("layer_runs.csv:68", f.read())
        self.assertEqual([n for n in os.listdir(out) if ".tmp." in n], [])
        # A single script says the same about its inputs, and still makes its figure.
        p = run([PYTHON, os.path.join(PLOTS, "table4.py"), self.tmp + "/bad", self.tmp + "/one",
                 "--theory", THEORY_SNAPSHOT])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("layer_runs.csv:68", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "one", "table4_layer_times.png")))

    def test_numbers_not_spelled_as_layer_run_writes_them_and_every_bad_line_in_the_index(self):
        # float() takes '６１４４', '1_0.5', ' 2048' and '+4'; layer_run writes none of them: each
        # such row is named and left out. Thirty malformed lines: all named in index.md, while
        # stderr names the first few and counts the rest.
        bad = os.path.join(self.tmp, "bad")
        shutil.copytree(RESULTS, bad)
        with open(os.path.join(RESULTS, "layer_runs.csv"), encoding="utf-8") as f:
            lines = f.read().splitlines(keepends=True)
        header = lines[0].rstrip("\n").split(",")
        cols = lines[1].rstrip("\n").split(",")

        def with_value(col, value):
            row = list(cols)
            row[header.index(col)] = value
            return ",".join(row) + "\n"

        spelled = [("hidden", "\uff16\uff11\uff14\uff14"), ("fwd_ms", "1_0.5"), ("seq", " 2048"), ("batch", "+4"),
                   ("act_bytes", "\u0661\u0662\u0663"), ("dropout", "\uff10.1"), ("bwd_ms", "nan")]
        tail = [with_value(col, value) for col, value in spelled] + [lines[1][:40] + "\n"] * 30
        with open(os.path.join(bad, "layer_runs.csv"), "a", encoding="utf-8") as f:
            f.write("".join(tail))
        out = os.path.join(self.tmp, "out")
        p = run([PYTHON, os.path.join(PLOTS, "make_all.py"), bad, out, "--theory", THEORY_SNAPSHOT], timeout=120)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertIn("read 63 layer_run rows", p.stdout)  # only the fixture's own rows
        with open(os.path.join(out, "index.md"), encoding="utf-8") as f:
            index = f.read()
        first = len(lines) + 1
        for i, (col, value) in enumerate(spelled):
            self.assertRegex(index, rf"layer_runs\.csv:{first + i}: {col} is ", (col, value))
        for line in range(first + len(spelled), first + len(tail)):
            self.assertRegex(index, rf"layer_runs\.csv:{line}: .*half-written")
        named = [e for e in p.stderr.splitlines() if re.search(r"layer_runs\.csv:\d+:", e)]
        self.assertEqual(len(named), 10, p.stderr)  # five of the malformed lines, five of the bad values
        self.assertIn("layer_runs.csv: 25 more malformed lines", p.stderr)
        self.assertIn("layer_runs.csv: 2 more malformed lines", p.stderr)

    def test_a_fifo_among_the_inputs_blocks_nothing(self):
        results = os.path.join(self.tmp, "results")
        shutil.copytree(RESULTS, results)
        os.mkfifo(os.path.join(results, "pipe.csv"))
        theory = os.path.join(self.tmp, "theory")
        shutil.copytree(THEORY_SNAPSHOT, theory)
        os.unlink(os.path.join(theory, "fig7.csv"))
        os.mkfifo(os.path.join(theory, "fig7.csv"))
        out = os.path.join(self.tmp, "out")
        # Nobody writes to either FIFO: a script that opened one would wait for ever.
        p = run([PYTHON, os.path.join(PLOTS, "make_all.py"), results, out, "--theory", theory], timeout=120)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertIn("ignored: pipe.csv: is a FIFO", p.stdout)
        self.assertEqual([e for e in p.stderr.splitlines() if "fig7.csv" in e],
                         [f"make_all: error: {os.path.join(theory, 'fig7.csv')}: is a FIFO (named pipe), not a file"])
        p = run([PYTHON, os.path.join(PLOTS, "table4.py"), results, os.path.join(self.tmp, "one"),
                 "--theory", THEORY_SNAPSHOT], timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_a_peers_csv_beside_the_results_is_no_problem(self):
        # gpu_eval --unpack puts the PyTorch peer's CSV beside layer_run's: read by its own
        # table, named here as not read, and no problem.
        results = os.path.join(self.tmp, "results")
        shutil.copytree(RESULTS, results)
        with open(os.path.join(results, "peer_torch_h200.csv"), "w") as f:
            f.write("peer,device,model,config,fwd_ms,bwd_ms,status\ntorch,NVIDIA H200,22b,baseline,3.2,4.8,ok\n")
        out = os.path.join(self.tmp, "out")
        p = run([PYTHON, os.path.join(PLOTS, "make_all.py"), results, out, "--theory", THEORY_SNAPSHOT])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        with open(os.path.join(out, "index.md")) as f:
            index = f.read()
        self.assertNotIn("Problems", index)
        not_read = index.split("## Not read by these plots\n\n", 1)[1].splitlines()
        self.assertEqual(not_read, ["- notes.csv (neither a layer_run nor a CUPTI CSV)",
                                    "- peer_torch_h200.csv (a peer's CSV)"])

    def test_a_failing_theory_binary_is_a_problem(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        failing = os.path.join(self.tmp, "theory")
        with open(failing, "w") as f:
            f.write("#!/bin/sh\necho 'theory: error: cannot read the results' >&2\nexit 2\n")
        os.chmod(failing, 0o755)
        env = dict(os.environ)
        env.pop("ACTBENCH_THEORY", None)
        p = run([PYTHON, os.path.join(PLOTS, "make_all.py"), empty, os.path.join(self.tmp, "out"),
                 "--theory-bin", failing], env=env)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         [f"make_all: error: {failing} --results {empty} failed: "
                          "theory: error: cannot read the results"])
        self.assertIn("skipped: Figure 1", p.stdout)

    def test_out_dir_that_is_a_file(self):
        path = os.path.join(self.tmp, "file")
        with open(path, "w") as f:
            f.write("x")
        for script in ("make_all.py", "fig7.py"):
            p = run([PYTHON, os.path.join(PLOTS, script), RESULTS, path, "--theory", THEORY_SNAPSHOT])
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
            self.assertIn("is a file", p.stderr)

    def test_bad_arguments(self):
        p = run([PYTHON, os.path.join(PLOTS, "make_all.py"), os.path.join(self.tmp, "missing"), self.tmp])
        self.assertEqual(p.returncode, 2)
        self.assertIn("error", p.stderr)

    def test_longcontext_fit_grows_with_the_context_parallel_size(self):
        out = os.path.join(self.tmp, "lc")
        p = run([PYTHON, os.path.join(PLOTS, "longcontext.py"), RESULTS, out, "--theory", THEORY_SNAPSHOT])
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "longcontext_fit.md")) as f:
            rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                    for line in f if line.startswith("| ") and not line.startswith("| config")}
        self.assertEqual(set(rows), {"TP (baseline)", "TP+SP", "TP+SP+selective", "full+SP"})
        for config, cells in rows.items():
            longest = [int(c[:-1]) if c != "-" else 0 for c in cells]  # C = 1, 2, ..., 32
            self.assertEqual(longest, sorted(longest), config)
        # The step model (longcontext.csv): full+SP runs 1M tokens from C = 4 on an 80 GB GPU.
        self.assertEqual(rows["full+SP"][:3], ["128k", "512k", "1024k"])

    def test_each_script_alone(self):
        for script in ("table2", "table4", "table5", "fig1", "fig7", "fig8", "seqlen", "memory_vs_predicted",
                       "longseq", "longcontext", "recompute_modules"):
            out = os.path.join(self.tmp, script)
            p = run([PYTHON, os.path.join(PLOTS, script + ".py"), RESULTS, out, "--theory", THEORY_SNAPSHOT])
            self.assertEqual(p.returncode, 0, f"{script}: {p.stderr}")
            self.assertNotIn("skipped", p.stdout, script)
            self.assertTrue(any(n.endswith(".png") for n in os.listdir(out)), script)

    def test_runs_from_a_python_without_matplotlib(self):
        # The python3 first on PATH may lack matplotlib: the scripts re-exec into /usr/bin/python3.
        other = shutil.which("python3")
        if not other or os.path.realpath(other) == os.path.realpath(PYTHON):
            self.skipTest("only one python3 here")
        out = os.path.join(self.tmp, "out")
        p = run([other, os.path.join(PLOTS, "fig7.py"), RESULTS, out, "--theory", THEORY_SNAPSHOT])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "fig7_percent_of_baseline.png")))


MIB = 1024.0 ** 2


def recompute_rows(md_path):
    """recompute_modules_bytes.md as {(model, attention, recompute): (formula MiB, {backend: MiB},
    {category: MiB})}."""
    def pairs(cell):
        return {k: float(v) for k, v in (item.rsplit(" ", 1) for item in cell.split(", ") if item)}

    rows = {}
    with open(md_path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 7 or cells[0] in ("model", "---"):
                continue
            model, attention, recompute, formula, measured, _, categories = cells
            rows[(model, attention, recompute)] = (float(formula), pairs(measured), pairs(categories))
    return rows


class RecomputeModulesFigure(unittest.TestCase):
    """The --recompute-modules figure: its table is the theory CSV, bar by bar, it shows what each
    module frees, and (with layer_run) every bar equals the bytes layer_run's meta backend measures."""
    SETS = ["none", "core_attn", "mlp", "layernorm", "core_attn,mlp", "core_attn,layernorm", "mlp,layernorm",
            "core_attn,mlp,layernorm", "full"]

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_recompute_")
        self.theory = THEORY_SNAPSHOT
        if THEORY:
            self.theory = os.path.join(self.tmp, "theory")
            p = run([THEORY, "--out", self.theory])
            self.assertEqual(p.returncode, 0, p.stderr)
        self.results = os.path.join(self.tmp, "results")
        os.makedirs(self.results)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def make(self):
        out = os.path.join(self.tmp, "out")
        p = run([PYTHON, os.path.join(PLOTS, "recompute_modules.py"), self.results, out, "--theory", self.theory])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "recompute_modules_bytes.png")))
        return recompute_rows(os.path.join(out, "recompute_modules_bytes.md"))

    TABLE = "recompute_modules.csv"

    def theory_bars(self):
        bars = {}
        with open(os.path.join(self.theory, self.TABLE), newline="") as f:
            for r in csv.DictReader(f):
                name = r["recompute_modules"] if r["recompute"] == "selective" else r["recompute"]
                bars.setdefault((r["model"], r["attention"], name), {})[r["category"]] = int(r["bytes"])
        return bars

    def test_each_bar_is_its_categories_as_theory_writes_them(self):
        rows, bars = self.make(), self.theory_bars()
        expected = [(m, a, n) for m in ("22b", "llama3-8b") for a in ("unfused", "fused") for n in self.SETS]
        self.assertEqual(list(rows), expected)
        self.assertEqual(sorted(bars), sorted(expected))
        for key, (formula, measured, cats) in rows.items():
            self.assertEqual(measured, {}, key)  # no layer_run rows given
            self.assertEqual(f"{formula:.3f}", f"{sum(bars[key].values()) / MIB:.3f}", key)
            self.assertEqual({c: f"{v:.3f}" for c, v in cats.items()},
                             {c: f"{b / MIB:.3f}" for c, b in bars[key].items()}, key)
            self.assertAlmostEqual(sum(cats.values()), formula, delta=0.0005 * (len(cats) + 1), msg=key)

    def test_what_each_module_frees(self):
        bars = self.theory_bars()

        def without(model, attention, *freed):
            kept = dict(bars[(model, attention, "none")])
            for c in freed:
                self.assertIn(c, kept, (model, attention, c))
                del kept[c]
            return kept

        for model, activation in (("22b", "gelu_input"), ("llama3-8b", "swiglu_input")):
            # Fused: core_attn frees the log-sum-exp alone (q, k, v and the projection's input stay).
            self.assertEqual(bars[(model, "fused", "core_attn")], without(model, "fused", "attn_lse"))
            unfused_attn = [c for c in ("softmax_out", "attn_dropout_mask", "attn_dropout_out")
                            if c in bars[(model, "unfused", "none")]]
            self.assertEqual(bars[(model, "unfused", "core_attn")], without(model, "unfused", *unfused_attn))
            for attention in ("unfused", "fused"):
                # layernorm frees the two norm outputs; mlp the activation's input and fc2's.
                self.assertEqual(bars[(model, attention, "layernorm")],
                                 without(model, attention, "qkv_input", "fc1_input"))
                self.assertEqual(bars[(model, attention, "mlp")], without(model, attention, activation, "fc2_input"))
                self.assertEqual(list(bars[(model, attention, "full")]), ["layer_input"])
        # The paper's 22B layer, MiB: fused core_attn frees 0.25 of 204.25.
        rows = self.make()
        self.assertEqual(rows[("22b", "fused", "none")][0], 204.25)
        self.assertEqual(rows[("22b", "fused", "core_attn")][0], 204.0)

    @unittest.skipUnless(LAYER_RUN, "ACTBENCH_LAYER_RUN (the layer_run binary) not set")
    def test_every_bar_equals_the_meta_backend(self):
        # The bars are the formula; layer_run's meta backend measures the same layers: its rows
        # appear beside each bar in the table, and equal it to the printed digit.
        path = os.path.join(self.results, "meta.csv")
        for model, attention, name in self.theory_bars():
            args = [LAYER_RUN, "--backend", "meta", "--model", model, "--tp", "8", "--emulate-tp",
                    "--sequence-parallel", "--attention", attention, "--csv", path]
            if name == "full":
                args += ["--recompute-granularity", "full"]
            elif name != "none":
                args += ["--recompute-granularity", "selective", "--recompute-modules", name]
            p = run(args)
            self.assertEqual(p.returncode, 0, f"{args}: {p.stderr}")
        rows = self.make()
        self.assertEqual(len(rows), 36)
        for key, (formula, measured, _) in rows.items():
            self.assertEqual(list(measured), ["meta"], key)
            self.assertEqual(measured["meta"], formula, key)


class MoeModulesFigure(RecomputeModulesFigure):
    """The MoE presets' module-set figure: every bar of the two presets the layers build (the latent
    attention of deepseek-v3 is theory's alone) equals the bytes layer_run's meta backend measures,
    and each MoE module frees what it names. (Its set-up is the dense figure's; its own tests
    replace the dense ones.)"""
    test_each_bar_is_its_categories_as_theory_writes_them = None
    test_what_each_module_frees = None
    test_every_bar_equals_the_meta_backend = None
    TABLE = "moe_modules.csv"

    def make(self):
        out = os.path.join(self.tmp, "out")
        p = run([PYTHON, os.path.join(PLOTS, "moe_modules.py"), self.results, out, "--theory", self.theory])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        return recompute_rows(os.path.join(out, "moe_modules_bytes.md"))


    def test_each_moe_module_frees_what_it_names(self):
        bars = self.theory_bars()
        self.assertEqual(sorted({m for m, _, _ in bars}), ["deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"])
        for model in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
            for attention in ("unfused", "fused"):
                attn = bars[(model, attention, "core_attn")]
                act = bars[(model, attention, "core_attn,moe_act")]
                self.assertEqual(set(attn) - set(act), {"moe_fc2_input"}, model)
                moe = bars[(model, attention, "core_attn,moe")]
                self.assertEqual(set(attn) - set(moe) - {"shared_act_input", "shared_fc2_input"},
                                 {"router_scores", "router_topk_index", "router_topk_weight", "moe_dispatch_plan",
                                  "moe_permuted", "moe_act_input", "moe_permuted_probs", "moe_fc2_input"}, model)
                self.assertIn("moe_input", moe)  # the checkpoint's input stays
        shared = bars[("deepseek-v3", "fused", "core_attn,moe_act,shared_experts")]
        self.assertEqual(set(bars[("deepseek-v3", "fused", "core_attn,moe_act")]) - set(shared),
                         {"shared_act_input", "shared_fc2_input"})

    @unittest.skipUnless(LAYER_RUN, "ACTBENCH_LAYER_RUN (the layer_run binary) not set")
    def test_every_bar_equals_the_meta_backend(self):
        path = os.path.join(self.results, "meta.csv")
        bars = list(self.theory_bars())
        for model, attention, name in bars:
            args = [LAYER_RUN, "--backend", "meta", "--model", model, "--tp", "2", "--emulate-tp",
                    "--sequence-parallel", "--attention", attention, "--csv", path]
            if name == "full":
                args += ["--recompute-granularity", "full"]
            elif name != "none":
                args += ["--recompute-granularity", "selective", "--recompute-modules", name]
            p = run(args)
            self.assertEqual(p.returncode, 0, f"{args}: {p.stderr}")
        rows = self.make()
        for key in bars:
            formula, measured, _ = rows[key]
            self.assertEqual(measured, {"meta": formula}, key)  # the bar the row's module set names


class Labels(unittest.TestCase):
    def test_every_exported_config_and_paper_model_has_a_label(self):
        """plots/common.py keys its labels and colours by the names runners/facts.json exports."""
        with open(os.path.join(ROOT, "runners", "facts.json")) as f:
            facts = json.load(f)
        p = run([PYTHON, "-c", "import common, json; print(json.dumps([common.CONFIG_LABEL, common.CONFIG_COLOR, "
                 "common.MODEL_LABEL, common.CONFIGS, common.MODELS]))"], cwd=PLOTS)
        self.assertEqual(p.returncode, 0, p.stderr)
        config_label, config_color, model_label, configs, models = json.loads(p.stdout)
        names = [c["name"] for c in facts["configs"]]
        paper_models = [m["name"] for m in facts["presets"] if m["paper"]]
        self.assertEqual(sorted(configs), sorted(names))
        self.assertEqual(models, paper_models)
        for name in names:
            self.assertIn(name, config_label)
            self.assertIn(name, config_color)
        for name in paper_models:
            self.assertIn(name, model_label)


@unittest.skipUnless(THEORY, "ACTBENCH_THEORY (the theory binary) not set")
class TheoryRunner(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_theory_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def table(self, name):
        with open(os.path.join(self.tmp, name), newline="") as f:
            return list(csv.DictReader(f))

    def test_tables_and_columns(self):
        p = run([THEORY, "--out", self.tmp, "--results", RESULTS])
        self.assertEqual(p.returncode, 0, p.stderr)
        for name in ("table2.csv", "fig1.csv", "fig7.csv", "table5.csv", "seqlen.csv", "gpus.csv", "plan.csv",
                     "pipeline.csv", "totals.csv", "paper_table4.csv", "paper_fig8.csv", "recompute_modules.csv"):
            self.assertTrue(os.path.exists(os.path.join(self.tmp, name)), name)
        self.assertEqual([n for n in os.listdir(self.tmp) if ".tmp." in n], [])
        fig1 = {r["model"]: r for r in self.table("fig1.csv")}
        self.assertEqual(list(fig1), ["22b", "175b", "530b", "1t"])
        # docs/paper.md Figure 1: 59.0 GiB of baseline activations for 22B, 114.0 for 530B.
        self.assertAlmostEqual(float(fig1["22b"]["activations_baseline_gib"]), 59.0, delta=0.5)
        self.assertAlmostEqual(float(fig1["530b"]["activations_baseline_gib"]), 114.0, delta=0.5)
        fig7 = {(r["model"], r["config"]): float(r["percent_of_tp_baseline"]) for r in self.table("fig7.csv")}
        self.assertAlmostEqual(fig7[("175b", "selective+sp")], 18.5, delta=0.1)
        t5 = self.table("table5.csv")
        for col in ("mfu_percent", "hfu_percent", "hfu_exact_percent", "modeled_present_s", "modeled_full_s"):
            self.assertIn(col, t5[0])
        # The fixture's H100 rows give a second, measured source for 22b and 175b.
        sources = {(r["model"], r["source"]) for r in t5}
        self.assertIn(("22b", "measured"), sources)
        self.assertIn(("1t", "scaled-from-22b"), sources)
        # GPT-3's crossover of the two Table 2 terms.
        crossover = {r["model"]: float(r["crossover_seq"]) for r in self.table("seqlen.csv")}
        self.assertAlmostEqual(crossover["175b"], 870.4, delta=0.1)

    def test_an_unfinished_row_is_no_measurement(self):
        # A 22b selective+sp row and a full row, the last one cut after its status (its writer
        # was killed): the whole row is used, the unfinished one is not, and a note says so.
        with open(os.path.join(RESULTS, "layer_runs.csv"), "rb") as f:
            lines = f.read().splitlines(keepends=True)
        rows = [next(l for l in lines if l.startswith(b"cuda,") and f",22b,6144,64,2048,4,8,1,{c},".encode() in l
                     and b",ok," in l) for c in ("selective+sp", "full")]
        path = os.path.join(self.tmp, "killed.csv")
        with open(path, "wb") as f:
            f.write(lines[0] + rows[0] + rows[1][:rows[1].index(b",ok,") + 4])
        p = run([THEORY, "--out", self.tmp, "--results", path])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("(1 measured layer rows used)", p.stdout + p.stderr)
        self.assertIn(f"{path}: an unfinished last row", p.stderr)

    def test_bad_input_is_one_line_and_status_2(self):
        for args in (["--out", self.tmp, "--dtype", "fp8"], ["--nonsense"], [],
                     ["--out", self.tmp, "--results", os.path.join(self.tmp, "missing.csv")],
                     ["--out", self.tmp, "--results", os.path.join(RESULTS, "notes.csv")],
                     ["plan", "--model", "7b"], ["plan", "--model", "175b", "--tp", "7"],
                     ["plan", "--model", "175b", "--gpu-memory", "80XB"]):
            p = run([THEORY, *args])
            self.assertEqual(p.returncode, 2, f"{args}: {p.stdout} {p.stderr}")
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, f"{args}: {p.stderr}")
            self.assertTrue(p.stderr.startswith("theory: error:"), p.stderr)

    def test_plan(self):
        csv_path = os.path.join(self.tmp, "plan.csv")
        p = run([THEORY, "plan", "--model", "175b", "--gpu", "a100", "--csv", csv_path])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("selective+sp", p.stdout)
        rows = {r["config"]: r for r in self.table("plan.csv")}
        self.assertEqual(rows["selective+sp"]["cheapest"], "1")
        self.assertEqual(rows["baseline"]["fits"], "0")


if __name__ == "__main__":
    unittest.main()
