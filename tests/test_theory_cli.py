"""theory as a user runs it: every option of every subcommand is used or refused (exit 2, one
line on stderr naming the option, nothing written), each planner refuses the flags it does not
read, the work one call may ask for is bounded, user-named files never block, and good input
prints what it printed before (tests/fixtures/theory_cli/).

Run by ctest with ACTBENCH_THEORY pointing at the binary. Standard library only.
"""
import csv
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
THEORY = os.environ.get("ACTBENCH_THEORY", os.path.join(HERE, "..", "build", "runners", "theory"))
GOLDEN = os.path.join(HERE, "fixtures", "theory_cli")
RESULTS = os.path.join(HERE, "fixtures", "results")

# Good invocations and the file their stdout was recorded in ("{csv}": a --csv target, whose
# content is recorded beside it as NAME.csv).
GOOD = {
    "fit_175b": ["plan", "--model", "175b", "--gpu", "a100", "--csv", "{csv}"],
    "fit_22b_layout": ["plan", "--model", "22b", "--gpu", "h100", "--tp", "4", "--pp", "2", "--batch", "2",
                       "--seq", "4096", "--headroom", "2GiB", "--csv", "{csv}"],
    "fit_1t_pp32": ["plan", "--model", "1t", "--gpu", "h200", "--pp", "32", "--headroom", "1.5GiB"],
    "fit_175b_fp32": ["--dtype", "fp32", "--optimizer", "fp32", "plan", "--model", "175b", "--gpu", "h100"],
    "fit_530b_memory": ["plan", "--model", "530b", "--gpu-memory", "80GB"],
    "search_llama3_70b": ["plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
                          "--global-batch", "128", "--distributed-optimizer", "--top", "5", "--csv", "{csv}"],
    "search_175b_unfused": ["plan", "--model", "175b", "--gpus", "1024", "--global-batch", "1536", "--attention",
                            "unfused", "--efficiency", "0.4", "--headroom", "3GiB", "--top", "20"],
    "search_llama3_8b_b200": ["plan", "--model", "llama3-8b", "--gpu", "b200", "--gpus", "16", "--seq", "8192",
                              "--global-batch", "64", "--csv", "{csv}"],
    "search_mixtral_8x7b": ["plan", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "64",
                            "--global-batch", "256", "--distributed-optimizer", "--top", "8"],
    "llama_table_8b": ["llama-table", "--model", "llama3-8b", "--seq", "4096"],
    "llama_table_70b": ["llama-table", "--model", "llama3-70b", "--tp", "8", "--batch", "2"],
    "llama_table_405b": ["llama-table", "--model", "llama3-405b"],
}

# Values no integer option takes, whatever its range.
BAD_INTS = ["", " ", "8 ", " 8", "+1", "1e3", "1.5", "0x10", "3x", "0", "-1", "-4096", "nan", "inf", "-inf",
            "99999999999999999999999", "-99999999999999999999999", "4294967296", "\u0661", "8\n"]
BAD_SIZES = ["", " ", "GiB", "80XB", "80 GiB", "80gib", "infGiB", "nanGiB", "-1GiB", "1e30GiB", "9EiB", "+-1GiB"]
BAD_REALS = ["", " ", "nan", "inf", "-inf", "0", "-0.5", "1.5", "0.5x", " 0.5", "1e-400", "1e999"]
BAD_NAMES = ["", " ", "bogus"]

FIT = ["plan", "--model", "175b"]
SEARCH = ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "8"]
LLAMA_TABLE = ["llama-table", "--model", "llama3-8b"]

# (how the option is reached, option, bad values)
OPTIONS = [
    (FIT, "--tp", BAD_INTS), (FIT, "--pp", BAD_INTS), (FIT, "--interleave", BAD_INTS),
    (FIT, "--batch", BAD_INTS), (FIT, "--seq", BAD_INTS),
    (FIT, "--gpu-memory", BAD_SIZES), (FIT, "--headroom", BAD_SIZES), (FIT, "--gpu", BAD_NAMES + ["b200"]),
    (FIT, "--model", BAD_NAMES + ["llama3-8b"]),
    (SEARCH, "--gpus", BAD_INTS), (SEARCH, "--global-batch", BAD_INTS), (SEARCH, "--seq", BAD_INTS),
    (SEARCH, "--top", BAD_INTS), (SEARCH, "--efficiency", BAD_REALS), (SEARCH, "--headroom", BAD_SIZES),
    (SEARCH, "--gpu", BAD_NAMES), (SEARCH, "--attention", BAD_NAMES), (SEARCH, "--model", BAD_NAMES),
    (SEARCH, "--max-cp", BAD_INTS), (SEARCH, "--cp-comm-type", BAD_NAMES + ["a2a+p2p"]),
    (SEARCH, "--moe-expert-load", ["", " ", "nan", "inf", "0", "0.5", "-1", "x", "maxx", "1e999"]),
    (SEARCH, "--offload-modules", ["", " ", "bogus", "attn_proj", "core_attn,,moe_act", "mlp"]),
    (LLAMA_TABLE, "--tp", BAD_INTS), (LLAMA_TABLE, "--seq", BAD_INTS), (LLAMA_TABLE, "--batch", BAD_INTS),
    (LLAMA_TABLE, "--model", BAD_NAMES + ["175b"]),
]


def run(args, timeout=60):
    return subprocess.run([THEORY, *args], capture_output=True, text=True, timeout=timeout)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_theory_cli_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def assertRefused(self, args, *names, timeout=60):
        """Exit 2, one stderr line naming each of `names`, nothing on stdout, nothing written."""
        before = sorted(os.listdir(self.tmp))
        r = run(args, timeout)
        where = f"{args}: rc={r.returncode} stdout={r.stdout!r} stderr={r.stderr!r}"
        self.assertEqual(r.returncode, 2, where)
        self.assertEqual(len(r.stderr.splitlines()), 1, where)
        self.assertTrue(r.stderr.startswith("theory: error: "), where)
        for name in names:
            self.assertIn(name, r.stderr, where)
        self.assertEqual(r.stdout, "", where)
        self.assertEqual(sorted(os.listdir(self.tmp)), before, where)
        return r.stderr

    def fifo(self, name):
        path = os.path.join(self.tmp, name)
        os.mkfifo(path)
        return path


class StrictValues(Base):
    def test_every_bad_value_of_every_option_is_refused_naming_it(self):
        csv_path = os.path.join(self.tmp, "plan.csv")
        for base, option, values in OPTIONS:
            for value in values:
                args = list(base) + [option, value]
                if base is not LLAMA_TABLE:
                    args += ["--csv", csv_path]
                with self.subTest(option=option, value=value, command=base[0]):
                    self.assertRefused(args, option)

    def test_top_level_options(self):
        out = os.path.join(self.tmp, "tables")
        for option, values in (("--dtype", BAD_NAMES + ["fp8"]), ("--optimizer", BAD_NAMES + ["adam"])):
            for value in values:
                with self.subTest(option=option, value=value):
                    self.assertRefused(["--out", out, option, value], option)
        self.assertRefused(["--out", ""], "--out")
        self.assertRefused(["--out", out, "--results", ""], "--results")

    def test_out_of_range_says_so(self):
        err = self.assertRefused(LLAMA_TABLE + ["--seq", "99999999999999999999999"], "--seq")
        self.assertNotIn("must be >= 1", err)
        self.assertIn("..", err)  # the range it must lie in
        err = self.assertRefused(SEARCH[:-2] + ["--global-batch", "4294967296"], "--global-batch")
        self.assertIn("4294967296", err)

    def test_repeated_options_are_refused(self):
        self.assertRefused(FIT + ["--tp", "8", "--tp", "4"], "--tp")

    def test_headroom_zero_and_a_sized_memory_are_taken(self):
        r = run(FIT + ["--headroom", "0", "--gpu-memory", "81920MiB"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("80.0 GiB per GPU", r.stdout)


class PlannerChoice(Base):
    def test_gpus_zero_says_gpus(self):
        self.assertRefused(["plan", "--model", "175b", "--gpus", "0", "--global-batch", "8"], "--gpus", "1..")
        self.assertRefused(["plan", "--gpus", "0", "--model", "llama3-70b"], "--gpus")

    def test_flags_of_the_other_planner_are_refused(self):
        cases = {
            "--global-batch": FIT + ["--global-batch", "8"],
            "--hf-config": ["plan", "--hf-config", "x.json"],
            "--top": FIT + ["--top", "3"],
            "--efficiency": FIT + ["--efficiency", "0.5"],
            "--attention": FIT + ["--attention", "fused"],
            "--distributed-optimizer": FIT + ["--distributed-optimizer"],
            "--cp-comm-type": FIT + ["--cp-comm-type", "a2a"],
            "--max-cp": FIT + ["--max-cp", "4"],
            "--tp": SEARCH + ["--tp", "2"],
            "--pp": SEARCH + ["--pp", "2"],
            "--interleave": SEARCH + ["--interleave", "2"],
            "--batch": SEARCH + ["--batch", "2"],
            "--gpu-memory": SEARCH + ["--gpu-memory", "80GiB"],
            "--dtype": ["--dtype", "fp32"] + SEARCH,
            "--optimizer": ["--optimizer", "fp32"] + SEARCH,
        }
        for option, args in cases.items():
            with self.subTest(option):
                err = self.assertRefused(args, option, "not used by")
                self.assertIn("--gpus" if option in ("--global-batch", "--hf-config", "--top", "--efficiency",
                                                    "--attention", "--distributed-optimizer", "--cp-comm-type",
                                                    "--max-cp") else "layout search",
                              err)

    def test_other_subcommands_refuse_what_they_do_not_read(self):
        out = os.path.join(self.tmp, "tables")
        for args, option in ((["--out", out] + FIT, "--out"), (["--results", RESULTS] + SEARCH, "--results"),
                             (["--dtype", "fp32"] + LLAMA_TABLE, "--dtype"), (["--out", out] + LLAMA_TABLE, "--out")):
            with self.subTest(option=option, command=args[2]):
                self.assertRefused(args, option, "not used by")

    def test_llama_model_without_gpus_names_the_layout_search(self):
        self.assertRefused(["plan", "--model", "llama3-70b"], "llama3-70b", "--gpus")

    def test_search_needs_global_batch(self):
        self.assertRefused(["plan", "--model", "llama3-8b", "--gpus", "8"], "--global-batch")

    def test_fit_layout_problems_name_the_flags(self):
        self.assertRefused(FIT + ["--tp", "7"], "--tp")
        self.assertRefused(["plan", "--model", "530b", "--interleave", "2"], "--interleave")
        self.assertRefused(FIT + ["--pp", "5"], "--pp")
        self.assertRefused(FIT + ["--batch", "3"], "--batch")
        self.assertRefused(FIT + ["--pp", "1", "--interleave", "2"], "--interleave")


class BoundedWork(Base):
    def test_a_huge_global_batch_is_refused_by_its_range(self):
        self.assertRefused(SEARCH[:-2] + ["--global-batch", "1000000000"], "--global-batch", "16777216")

    def test_the_largest_global_batch_and_gpu_count_run_at_once(self):
        for args in (SEARCH[:-2] + ["--global-batch", "16777216", "--top", "1"],
                     ["plan", "--model", "llama3-405b", "--gpus", "1048576", "--global-batch", "16777216",
                      "--top", "1"],
                     ["plan", "--model", "qwen3-30b-a3b", "--gpus", "1048576", "--global-batch", "16777216",
                      "--top", "1"]):  # 128 experts: many expert-parallel sizes as well
            with self.subTest(args=args):
                start = time.monotonic()
                r = run(args, timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertLess(time.monotonic() - start, 20)

    def test_a_config_with_very_many_layers_does_not_loop_over_them(self):
        config = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1000000000000,
                  "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                  "vocab_size": 128256, "tie_word_embeddings": False}
        path = os.path.join(self.tmp, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        start = time.monotonic()
        r = run(["plan", "--hf-config", path, "--gpus", "64", "--global-batch", "64", "--top", "1"], timeout=60)
        self.assertLess(time.monotonic() - start, 20)
        self.assertIn(r.returncode, (0, 2), r.stderr)  # planned, or the config's layers refused
        if r.returncode == 2:
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)


class MixtureOfExperts(Base):
    def test_mixtral_plans_over_expert_parallel_sizes_and_the_first_fits(self):
        csv_path = os.path.join(self.tmp, "plan.csv")
        r = run(["plan", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "64", "--global-batch", "64",
                 "--top", "3", "--csv", csv_path])
        self.assertEqual(r.returncode, 0, r.stderr)
        header = r.stdout.splitlines()[1].split()
        self.assertEqual(header[:3], ["ep", "etp", "modules"])
        self.assertEqual(header[-1], "a2a_s")
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(rows[0]["fits"], "1")
        gib = float(r.stdout.split("(", 1)[1].split(" GiB)", 1)[0])  # the GPU's memory, as the title says
        self.assertLessEqual(int(rows[0]["total_bytes"]), gib * 2**30 * 1.001)
        self.assertEqual(sorted({int(row["ep"]) for row in rows}), [1, 2, 4, 8])
        self.assertEqual({row["etp"] for row in rows}, {"1", "2", "4", "8"})  # 1 or t, each t searched
        for row in rows:
            self.assertEqual(float(row["a2a_s"]) == 0, row["ep"] == "1", row)
            self.assertIn(row["etp"], ("1", row["tp"]), row)
            if int(row["tp"]) > 1:
                self.assertIn("sp", row["config"], row)  # Megatron-Core's MoE under TP needs SP

    def test_deepseek_plans_with_latent_attention_on_61_stages(self):
        r = run(["plan", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "488", "--global-batch", "488",
                 "--distributed-optimizer", "--top", "1"])
        self.assertEqual(r.returncode, 0, r.stderr)
        row = dict(zip(r.stdout.splitlines()[1].split(), r.stdout.splitlines()[2].split()))
        self.assertEqual(row["p"], "61", r.stdout)  # one layer a stage: 671B whole on fewer never fits

    def test_routing_imbalance_costs_memory_in_every_layout_and_not_time(self):
        def plans(load):
            csv_path = os.path.join(self.tmp, f"plan_{load}.csv")
            r = run(["plan", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "64", "--global-batch", "64",
                     "--top", "1048576", "--moe-expert-load", load, "--csv", csv_path])
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(csv_path) as f:
                key = ("tp", "cp", "pp", "interleave", "dp", "ep", "etp", "microbatch", "config", "recompute_modules")
                return r.stdout, {tuple(row[k] for k in key): row for row in csv.DictReader(f)}
        _, balanced = plans("1")
        out, busy = plans("2")
        self.assertIn("busiest rank's experts at 2x balanced rows", out)
        self.assertEqual(set(busy), set(balanced))
        grown = spread = 0
        for k, row in balanced.items():
            if row["ep"] == "1":  # all 8 experts on every rank: each token's 2 choices are its rows, whatever the router
                self.assertEqual(row["total_bytes"], busy[k]["total_bytes"], k)
            else:  # more, unless the stage's peak is a moment without expert rows (the loss, the setup)
                self.assertLessEqual(int(row["total_bytes"]), int(busy[k]["total_bytes"]), k)
                spread += 1
                grown += int(row["total_bytes"]) < int(busy[k]["total_bytes"])
            if row["peak_stage"] == busy[k]["peak_stage"]:  # the time reads that stage's parameters
                self.assertEqual(row["iteration_s"], busy[k]["iteration_s"], k)
        self.assertGreater(grown, spread / 2)
        self.assertLess(sum(r["fits"] == "1" for r in busy.values()), sum(r["fits"] == "1" for r in balanced.values()))
        self.assertRefused(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "8",
                            "--moe-expert-load", "2"], "has no experts")

    def test_a_request_no_layout_suits_is_one_line(self):
        self.assertRefused(["plan", "--model", "mixtral-8x7b", "--gpus", "7", "--global-batch", "5"],
                           "no layout of 7 GPUs fits mixtral-8x7b")


class UserFiles(Base):
    def test_a_fifo_never_blocks(self):
        fifo = self.fifo("results.csv")
        out = os.path.join(self.tmp, "tables")
        self.assertRefused(["--out", out, "--results", fifo], "--results", "FIFO", timeout=20)
        self.assertRefused(["plan", "--hf-config", fifo, "--gpus", "8", "--global-batch", "8"], "--hf-config",
                           timeout=20)
        self.assertRefused(["llama-table", "--hf-config", fifo], "--hf-config", timeout=20)
        self.assertRefused(FIT + ["--csv", fifo], "--csv", timeout=20)

    def test_a_fifo_in_a_results_folder_is_skipped(self):
        folder = os.path.join(self.tmp, "results")
        shutil.copytree(RESULTS, folder)
        os.mkfifo(os.path.join(folder, "pipe.csv"))
        r = run(["--out", os.path.join(self.tmp, "tables"), "--results", folder], timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_table5_takes_the_papers_layer_only(self):
        # Table 5 carries Table 4's layer (unfused attention, the gpt layer) to whole models: a newer
        # row of another attention or layer family at the same shape must not replace it.
        with open(os.path.join(RESULTS, "layer_runs.csv"), newline="") as f:
            header, *rows = list(csv.reader(f))
        ts, fwd, bwd = header.index("timestamp"), header.index("fwd_ms"), header.index("bwd_ms")
        tables = {}
        other = [("fused", "gpt", "core_attn"), ("unfused", "custom", "core_attn"), ("unfused", "gpt", "core_attn,mlp")]
        for name, extra in (("paper", []), ("other", other)):
            folder = os.path.join(self.tmp, name)
            os.mkdir(folder)
            with open(os.path.join(folder, "runs.csv"), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(header + ["attention", "arch", "recompute_modules"])
                w.writerows(r + ["unfused", "gpt", "core_attn"] for r in rows)
                for columns in extra:
                    for r in rows:
                        later = list(r)
                        later[ts] = "2099-01-01T00:00:00Z"
                        later[fwd], later[bwd] = (str(3 * float(r[i])) if r[i] else "" for i in (fwd, bwd))
                        w.writerow(later + list(columns))
            r = run(["--out", os.path.join(folder, "tables"), "--results", folder], timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(folder, "tables", "table5.csv")) as f:
                tables[name] = f.read()
        self.assertIn("measured", tables["paper"])
        self.assertEqual(tables["other"], tables["paper"])

    def test_outputs_that_are_not_files_are_refused_before_anything_is_printed(self):
        folder = os.path.join(self.tmp, "folder.csv")
        os.mkdir(folder)
        self.assertRefused(FIT + ["--csv", folder], "--csv")
        self.assertRefused(SEARCH + ["--csv", folder], "--csv")
        self.assertRefused(FIT + ["--csv", os.path.join(self.tmp, "missing", "plan.csv")], "--csv")
        afile = os.path.join(self.tmp, "afile")
        open(afile, "w").close()
        self.assertRefused(["--out", afile], "--out")
        self.assertRefused(["--out", os.path.join(afile, "sub")], "--out")

    def test_results_folder_and_missing_file(self):
        self.assertRefused(["--out", os.path.join(self.tmp, "t"), "--results", os.path.join(self.tmp, "none.csv")],
                           "--results")


class GoodOutputUnchanged(Base):
    def test_good_invocations_print_what_they_printed(self):
        for name, args in GOOD.items():
            with self.subTest(name):
                csv_path = os.path.join(self.tmp, name + ".csv")
                r = run([a.replace("{csv}", csv_path) for a in args])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stderr, "")
                with open(os.path.join(GOLDEN, name + ".txt")) as f:
                    self.assertEqual(r.stdout, f.read())
                if "{csv}" in args:
                    with open(csv_path, "rb") as got, open(os.path.join(GOLDEN, name + ".csv"), "rb") as want:
                        self.assertEqual(got.read(), want.read())


def record_golden():
    """Writes tests/fixtures/theory_cli/ from the current binary (run by hand, then review)."""
    os.makedirs(GOLDEN, exist_ok=True)
    for name, args in GOOD.items():
        csv_path = os.path.join(GOLDEN, name + ".csv")
        r = run([a.replace("{csv}", csv_path) for a in args])
        assert r.returncode == 0, r.stderr
        with open(os.path.join(GOLDEN, name + ".txt"), "w") as f:
            f.write(r.stdout)


if __name__ == "__main__":
    if os.environ.get("ACTBENCH_RECORD_THEORY_GOLDEN"):
        record_golden()
    else:
        unittest.main()
