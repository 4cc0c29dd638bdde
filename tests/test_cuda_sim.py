"""`layer_run --backend cuda` of the simulator build (ACTBENCH_CUDA_SIM=ON) as a user runs it:
the whole cuda backend (kernels, caching allocator over cudaMalloc, streams, events, cuBLASLt
GEMMs, the NCCL communicator, CUPTI) on the CPU simulator. Its dumps must match the cpu
backend's and the float64 NumPy layer, its activation bytes meta's, on one rank and under
`mpirun -np 2 --tp 2`; its rows must say they are simulated and carry no time.

Run by ctest of a simulator build (label cuda-sim) with ACTBENCH_LAYER_RUN pointing at its
layer_run, ACTBENCH_BENCH_LAYER/_KERNELS at its benchmarks and ACTBENCH_MPIEXEC at mpirun.
"""
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import stream_order  # noqa: E402

LAYER_RUN = os.environ.get("ACTBENCH_LAYER_RUN", os.path.join(HERE, "..", "build-sim", "runners", "layer_run"))
BENCH_LAYER = os.environ.get("ACTBENCH_BENCH_LAYER", "")
BENCH_KERNELS = os.environ.get("ACTBENCH_BENCH_KERNELS", "")
MPIEXEC = os.environ.get("ACTBENCH_MPIEXEC") or shutil.which("mpirun")
if MPIEXEC == "none":  # a build without MPI: one rank only
    MPIEXEC = None
PAPER_CONFIGS = ["baseline", "sp", "full", "selective", "selective+sp"]
TIME_COLUMNS = ["fwd_ms", "bwd_ms", "total_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms_min", "bwd_ms_max",
                "comm_ms_emulated"]

try:
    import numpy as np
    import numpy_layer
    import test_composed_dumps as composed  # the option combinations (as a module: its tests stay there)
    import test_mla_dumps as mla_dumps  # multi-latent attention's
    import test_moe_dumps as moe_dumps  # the MoE block's
except ImportError:
    np = numpy_layer = composed = mla_dumps = moe_dumps = None
# Combinations of the composed layer's options run here: qk-layernorm (LayerNorm, and RMSNorm with
# dropout, GQA and fused attention) with squared-ReLU, squared-ReLU with a QKV bias alone, GQA with
# partial RoPE, every option with dropout, and heads of --kv-channels wider than h/a (fused: the
# kernels' padded head size) and narrower (unfused, GeLU with biases and dropout).
SIM_COMBOS = ["layernorm_qk_squared_relu_fused", "dropout_fused_gqa_qk_squared_relu", "squared_relu_qkv_bias_no_rope",
              "gqa2_half_rope", "everything_on", "wide_heads_gqa_qk_half_rope_fused",
              "narrow_heads_gelu_biases_dropout"]


def has_zero_gradient(combo):
    """LayerNorm q/k norms: softmax ignores a shift shared by every key, so k_norm.bias's gradient
    is zero and both backends dump rounding noise (~1e-8) that no relative tolerance can compare;
    the NumPy check's absolute floor takes it."""
    return combo.expect.get("qk_layernorm") and combo.expect.get("normalization") == "LayerNorm"


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class CudaSimTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="actbench_cudasim_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def layer_run(self, name, *args, np_ranks=None, timeout=600, env=None):
        """Runs layer_run with --csv NAME.csv (and --dump NAME/ when asked), returns the rows."""
        out = os.path.join(self.tmp, name + ".csv")
        cmd = [LAYER_RUN, *args, "--csv", out]
        if np_ranks:
            cmd = [MPIEXEC, "-np", str(np_ranks), *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **env) if env else None)
        self.assertEqual(r.returncode, 0, "%s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        self.last_stderr = r.stderr
        return read_rows(out)

    def dump_dir(self, name):
        return os.path.join(self.tmp, name)

    # ---- checks shared by the tests ----
    def assert_simulated_rows(self, rows, configs):
        self.assertEqual([r["config"] for r in rows], configs)
        for r in rows:
            self.assertEqual(r["backend"], "cuda")
            self.assertEqual(r["status"], "ok", r["message"])
            self.assertTrue(r["device"].startswith("cuda-sim ("), r["device"])
            for col in TIME_COLUMNS:
                self.assertEqual(r[col], "", "%s of a simulated run must stay empty" % col)
            self.assertIn("(cudasim)", r["cuda_runtime_version"])
            self.assertIn("(stand-in)", r["cublas_version"])

    def assert_dumps_match(self, got_dir, ref_dir, rtol=1e-4):
        """Inputs bit for bit; every output within rtol of the reference's largest magnitude."""
        got = sorted(os.path.basename(p) for p in glob.glob(os.path.join(got_dir, "*.npy")))
        ref = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ref_dir, "*.npy")))
        self.assertEqual(got, ref)
        self.assertIn("dx.npy", got)
        for name in got:
            a, b = np.load(os.path.join(got_dir, name)), np.load(os.path.join(ref_dir, name))
            self.assertEqual(a.shape, b.shape, name)
            if name == "y.npy" or name == "dx.npy" or name.startswith("grad."):
                scale = float(np.abs(b).max()) or 1.0
                err = float(np.abs(a.astype(np.float64) - b).max())
                self.assertLessEqual(err, rtol * scale, "%s: max|cuda - cpu| %.3e vs max|cpu| %.3e" % (name, err, scale))
            else:
                self.assertTrue(np.array_equal(a, b), "%s: inputs must be bit-identical" % name)

    def assert_numpy_reference(self, dump):
        results = numpy_layer.check(dump, rtol=1e-4)
        names = [r[0] for r in results]
        self.assertIn("y", names)
        self.assertIn("dx", names)
        self.assertGreaterEqual(len(names), 6)  # y, dx and the parameters' gradients
        for name, err, scale, ok in results:
            self.assertTrue(ok, "%s: max|err| %.3e vs max|ref| %.3e" % (name, err, scale))

    # ---- the paper's five configurations ----
    @unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
    def test_five_configurations_match_cpu_numpy_and_meta(self):
        common = ["--model", "tiny", "--config", ",".join(PAPER_CONFIGS), "--dropout", "0", "--dtype", "fp32"]
        rows = self.layer_run("cuda", "--backend", "cuda", *common, "--dump", self.dump_dir("cuda"))
        self.assertIn("CPU simulator", self.last_stderr)
        self.assert_simulated_rows(rows, PAPER_CONFIGS)
        cpu = self.layer_run("cpu", "--backend", "cpu", *common, "--dump", self.dump_dir("cpu"))
        meta = self.layer_run("meta", "--backend", "meta", *common)
        for r, c, m in zip(rows, cpu, meta):
            with self.subTest(r["config"]):
                self.assertEqual(r["act_bytes"], m["act_bytes"])
                self.assertEqual(r["act_bytes"], c["act_bytes"])
                self.assertEqual(r["fwd_retained_bytes"], m["fwd_retained_bytes"])
                self.assertEqual(float(r["act_bytes"]), float(r["act_bytes_formula"]))
                self.assertGreater(int(r["peak_reserved_bytes"]), int(r["peak_allocated_bytes"]) // 2)
                got, ref = os.path.join(self.dump_dir("cuda"), r["config"]), os.path.join(self.dump_dir("cpu"), r["config"])
                self.assert_dumps_match(got, ref)
                self.assert_numpy_reference(got)
        # The check is not blind: a perturbed gradient of the cuda dump fails it.
        path = os.path.join(self.dump_dir("cuda"), "baseline", "grad.fc1.weight.npy")
        g = np.load(path)
        g.flat[0] += 1e-2 * np.abs(g).max()
        np.save(path, g)
        with self.assertRaises(AssertionError):
            self.assert_dumps_match(os.path.join(self.dump_dir("cuda"), "baseline"),
                                    os.path.join(self.dump_dir("cpu"), "baseline"))

    @unittest.skipUnless(numpy_layer and MPIEXEC, "numpy or mpirun missing")
    def test_two_ranks_tensor_and_sequence_parallel_over_the_nccl_stand_in(self):
        common = ["--model", "tiny", "--config", ",".join(PAPER_CONFIGS), "--dropout", "0", "--dtype", "fp32",
                  "--tp", "2"]
        rows = self.layer_run("cuda2", "--backend", "cuda", *common, "--dump", self.dump_dir("cuda2"), np_ranks=2)
        self.assert_simulated_rows(rows, PAPER_CONFIGS)
        self.assertEqual({r["comm_mode"] for r in rows}, {"nccl"})
        self.assertTrue(all("(stand-in)" in r["nccl_version"] for r in rows))
        cpu = self.layer_run("cpu2", "--backend", "cpu", *common, "--dump", self.dump_dir("cpu2"), np_ranks=2)
        meta = self.layer_run("meta2", "--backend", "meta", *common, np_ranks=2)
        for r, c, m in zip(rows, cpu, meta):
            with self.subTest(r["config"]):
                self.assertEqual(r["act_bytes"], m["act_bytes"])
                self.assertEqual(r["comm_bytes"], c["comm_bytes"])
                got = os.path.join(self.dump_dir("cuda2"), r["config"])
                self.assert_dumps_match(got, os.path.join(self.dump_dir("cpu2"), r["config"]))
                self.assert_numpy_reference(got)

    @unittest.skipUnless(numpy_layer and MPIEXEC, "numpy or mpirun missing")
    def test_context_parallel_over_the_nccl_stand_in(self):
        # Two ranks as C = 2: the ring (fused), all-gather and a2a (unfused), gpt with dropout and
        # llama (GQA, RoPE at each rank's positions): the cuda dumps equal the cpu backend's and
        # the NumPy layer's, and the bytes equal meta's.
        llama = ["--arch", "llama", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "96"]
        cases = [("ring", ["--cp-comm-type", "p2p", "--attention", "fused", "--dropout", "0.1"]),
                 ("gather", ["--cp-comm-type", "all_gather", "--dropout", "0.1"]),
                 ("a2a_llama", ["--cp-comm-type", "a2a", *llama])]
        configs = ["baseline", "selective+sp"]
        for tag, flags in cases:
            with self.subTest(tag):
                common = ["--model", "tiny", "--seq", "24", "--batch", "2", "--cp", "2", "--config", ",".join(configs),
                          "--dtype", "fp32", *flags]
                rows = self.layer_run("cuda_" + tag, "--backend", "cuda", *common, "--dump",
                                      self.dump_dir("cuda_" + tag), np_ranks=2)
                self.assert_simulated_rows(rows, configs)
                self.assertEqual({(r["cp"], r["comm_mode"]) for r in rows}, {("2", "nccl")})
                self.layer_run("cpu_" + tag, "--backend", "cpu", *common, "--dump", self.dump_dir("cpu_" + tag),
                               np_ranks=2)
                meta = self.layer_run("meta_" + tag, "--backend", "meta", *common, np_ranks=2)
                for r, m in zip(rows, meta):
                    self.assertEqual(r["act_bytes"], m["act_bytes"])
                    self.assertEqual(r["act_bytes"], r["act_bytes_formula"])
                for config in configs:
                    got = os.path.join(self.dump_dir("cuda_" + tag), config)
                    self.assert_dumps_match(got, os.path.join(self.dump_dir("cpu_" + tag), config))
                    self.assert_numpy_reference(got)

    @unittest.skipUnless(numpy_layer and MPIEXEC, "numpy or mpirun missing")
    def test_ring_exchanges_overlap_the_attention_in_stream_order(self):
        # C = 2 on two ranks, the p2p ring: each next K/V block (in backward also the dK/dV sums)
        # travels on the NCCL communicator's own stream while the backend's stream computes the
        # current block's attention. The simulator runs all work at once in issue order, so the
        # values cannot show a missing dependency; its stream log can (tools/stream_order.py).
        common = ["--model", "tiny", "--seq", "24", "--batch", "2", "--cp", "2", "--cp-comm-type", "p2p",
                  "--attention", "fused", "--dropout", "0.1", "--dtype", "fp32", "--config", "baseline,full",
                  "--warmup", "0", "--iters", "1"]
        log = os.path.join(self.tmp, "streams", "log")
        os.makedirs(os.path.dirname(log))
        self.layer_run("cuda_ring", "--backend", "cuda", *common, "--dump", self.dump_dir("cuda_ring"), np_ranks=2,
                       env={"CUDASIM_STREAM_LOG": log})
        self.layer_run("cpu_ring", "--backend", "cpu", *common, "--dump", self.dump_dir("cpu_ring"), np_ranks=2)
        for config in ["baseline", "full"]:
            self.assert_dumps_match(os.path.join(self.dump_dir("cuda_ring"), config),
                                    os.path.join(self.dump_dir("cpu_ring"), config))
        logs = stream_order.read_logs(log)
        self.assertEqual(len(logs), 2)
        for pid, ops in logs.items():
            with self.subTest(rank_pid=pid):
                self.assert_ring_overlaps_in_order(ops)

    def assert_ring_overlaps_in_order(self, ops):
        """Per received block: issued on a stream of its own before the attention of the block
        before it (so they can overlap), read only after a wait on an event recorded after the
        receive; and no work of two streams touching the same bytes unordered (a send's buffer
        written, or a received one read, before the exchange is done)."""
        recvs = [o for o in ops if o.what == "nccl" and o.name == "recv"]
        kernels = [o for o in ops if o.what == "kernel"]
        compute = {o.stream for o in kernels if o.name.startswith("attention_fwd")}
        self.assertEqual(len(compute), 1)
        self.assertTrue(recvs)
        alone = []
        for recv in recvs:
            self.assertNotIn(recv.stream, compute)
            readers = stream_order.readers(ops, recv)
            self.assertTrue(readers, "%r: nothing reads the received block" % recv)
            first = readers[0]
            self.assertTrue(stream_order.before(recv, first), "%r reads %r before it is done" % (first, recv))
            self.assertTrue(stream_order.waits_between(ops, recv, first),
                            "%r is not ordered after %r by an event" % (first, recv))
            if not any(o.name.startswith("attention_") for o in kernels if recv.index < o.index < first.index):
                alone.append(recv)
        # Every exchange is in flight during an attention kernel but the dK and dV sums of each
        # backward ring's last step, which follow its last attention (C = 2: two dkdv launches
        # per backward ring).
        backward_rings = sum(o.name.startswith("attention_dkdv") for o in kernels) // 2
        self.assertEqual(len(alone), 2 * backward_rings, alone)
        races = stream_order.races(ops)
        self.assertEqual(races, [], "unordered work on two streams: %s" % races[:5])

    @unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
    def test_dropout_and_bf16_match_the_cpu_backend(self):
        # Dropout masks come from the same Philox stream on both backends; bf16 rounds alike.
        # bf16 with fused attention runs the tensor-core forward and backward (attention_tc.cu).
        for dtype, dropout, rtol, attention in [("fp32", "0.1", 1e-4, "unfused"), ("bf16", "0.1", 3e-2, "unfused"),
                                                ("bf16", "0.1", 3e-2, "fused")]:
            name = dtype + attention
            with self.subTest(name):
                common = ["--model", "tiny", "--config", "selective+sp,full", "--dropout", dropout, "--dtype", dtype,
                          "--attention", attention, "--seq", "24", "--batch", "2"]
                self.layer_run("c" + name, "--backend", "cuda", *common, "--dump", self.dump_dir("c" + name))
                self.layer_run("p" + name, "--backend", "cpu", *common, "--dump", self.dump_dir("p" + name))
                for config in ["selective+sp", "full"]:
                    self.assert_dumps_match(os.path.join(self.dump_dir("c" + name), config),
                                            os.path.join(self.dump_dir("p" + name), config), rtol)

    @unittest.skipUnless(numpy_layer, "numpy missing: run with /usr/bin/python3")
    def test_fused_attention_and_the_llama_layer(self):
        rows = self.layer_run("fused", "--backend", "cuda", "--model", "tiny", "--attention", "fused", "--config",
                              "baseline,selective+sp", "--dropout", "0", "--dtype", "fp32", "--dump",
                              self.dump_dir("fused"))
        self.assertEqual({r["attention"] for r in rows}, {"fused"})
        for config in ["baseline", "selective+sp"]:
            self.assert_numpy_reference(os.path.join(self.dump_dir("fused"), config))
        llama = ["--arch", "llama", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "96",
                 "--seq", "24", "--batch", "2", "--config", "baseline,selective", "--dropout", "0", "--dtype", "fp32"]
        rows = self.layer_run("llama", "--backend", "cuda", *llama, "--dump", self.dump_dir("llama"))
        meta = self.layer_run("llama_meta", "--backend", "meta", *llama)
        self.assertEqual([r["act_bytes"] for r in rows], [m["act_bytes"] for m in meta])
        for config in ["baseline", "selective"]:
            dump = os.path.join(self.dump_dir("llama"), config)
            with open(os.path.join(dump, "layer.json")) as f:
                layer = json.load(f)
            self.assertEqual((layer["normalization"], layer["activation"], layer["kv_heads"]), ("RMSNorm", "swiglu", 2))
            self.assert_numpy_reference(dump)

    # ---- the composed layer's options ----
    def assert_composed_dump(self, folder, combo, config, tp):
        with open(os.path.join(folder, "layer.json")) as f:
            layer = json.load(f)
        for key, value in composed.expected_layer_json(combo, config, tp).items():
            self.assertEqual(layer[key], value, "%s of %s/%s" % (key, combo.name, config))
        self.assert_numpy_reference(folder)

    def run_composed(self, configs, tp=1):
        """Each of SIM_COMBOS on the cuda backend as `configs`, its dumps against the cpu backend's
        and the NumPy layer."""
        parallel = ["--tp", str(tp)] if tp > 1 else []
        ranks = tp if tp > 1 else None
        for name in SIM_COMBOS:
            combo = composed.COMBO[name]
            args = [*composed.SHAPE, *combo.flags, *parallel, "--config", ",".join(configs), "--recompute-modules",
                    combo.modules]
            tag = "%s_tp%d" % (name, tp)
            rows = self.layer_run("cuda_" + tag, "--backend", "cuda", *args, "--dump", self.dump_dir("cuda_" + tag),
                                  np_ranks=ranks)
            self.assert_simulated_rows(rows, configs)
            self.layer_run("cpu_" + tag, "--backend", "cpu", *args, "--dump", self.dump_dir("cpu_" + tag),
                           np_ranks=ranks)
            for config in configs:
                with self.subTest(combo=name, config=config, tp=tp):
                    got = os.path.join(self.dump_dir("cuda_" + tag), config)
                    self.assert_composed_dump(got, combo, config, tp)
                    if not has_zero_gradient(combo):
                        self.assert_dumps_match(got, os.path.join(self.dump_dir("cpu_" + tag), config))

    def run_against_cpu(self, tag, args, configs, np_ranks):
        """layer_run `args` on the cuda backend (simulated rows) and on the cpu, both dumped; yields
        each configuration's (cuda row, cpu row, cuda dump folder) inside its subTest. The bytes
        must equal the cpu's and the formula, and the cuda dump the NumPy layer."""
        rows = self.layer_run("cuda_" + tag, "--backend", "cuda", *args, "--config", ",".join(configs), "--dump",
                              self.dump_dir("cuda_" + tag), np_ranks=np_ranks)
        self.assert_simulated_rows(rows, configs)
        cpu = self.layer_run("cpu_" + tag, "--backend", "cpu", *args, "--config", ",".join(configs), "--dump",
                             self.dump_dir("cpu_" + tag), np_ranks=np_ranks)
        for r, c in zip(rows, cpu):
            with self.subTest(tag=tag, config=r["config"]):
                self.assertEqual(r["act_bytes"], c["act_bytes"])
                self.assertEqual(r["act_bytes"], r["act_bytes_formula"])
                got = os.path.join(self.dump_dir("cuda_" + tag), r["config"])
                self.assert_numpy_reference(got)
                yield r, c, got

    @unittest.skipUnless(mla_dumps and MPIEXEC, "numpy or mpirun missing")
    def test_multi_latent_attention_matches_cpu_and_numpy(self):
        # DeepSeek's latent attention on the cuda backend, unfused and fused (the fused kernels run
        # its narrower v padded to q's head size), with mla_up_proj: one rank, then two over the
        # NCCL stand-in with SP.
        for attention in ["unfused", "fused"]:
            for ranks, configs in [(1, ["baseline", "selective", "full"]), (2, ["sp", "selective+sp"])]:
                args = [*mla_dumps.SHAPE, *mla_dumps.COMBOS["q_latent_rmsnorm"], "--recompute-modules",
                        "mla_up_proj,layernorm", "--tp", str(ranks), "--attention", attention]
                tag = "mla%d_%s" % (ranks, attention)
                for r, _, got in self.run_against_cpu(tag, args, configs, ranks if ranks > 1 else None):
                    self.assert_dumps_match(got, os.path.join(self.dump_dir("cpu_" + tag), r["config"]))

    @unittest.skipUnless(moe_dumps and MPIEXEC, "numpy or mpirun missing")
    def test_moe_layer_matches_cpu_and_numpy(self):
        # The MoE block on the cuda backend (routing, dispatch, grouped GEMMs, shared experts,
        # hidden dropout): one rank, TP 2 + SP with whole experts and with each split over TP,
        # expert parallelism 2, over two replicas of TP 2 expert parallelism 4 (experts whole)
        # and 2 (each split over TP), expert parallelism 4 over two replicas of CP 2, and each
        # expert split over TP 2 with EP over its CP 2 peers, over the NCCL stand-in.
        combo = moe_dumps.COMBOS["pre_softmax_shared_dropout"]
        runs = [("moe1", [], None, ["baseline", "selective"]), ("moe_tp2", ["--tp", "2"], 2, ["sp", "selective+sp"]),
                ("moe_ep2", ["--expert-model-parallel-size", "2"], 2, ["baseline", "selective"]),
                ("moe_etp2", ["--tp", "2", "--expert-tensor-parallel-size", "2"], 2, ["sp", "selective+sp"]),
                ("moe_ep4_tp2", ["--tp", "2", "--expert-model-parallel-size", "4"], 4, ["sp", "selective+sp"]),
                ("moe_ep2_etp2", ["--tp", "2", "--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2"],
                 4, ["sp", "selective+sp"]),
                ("moe_cp2_ep4", ["--cp", "2", "--cp-comm-type", "all_gather", "--expert-model-parallel-size", "4"], 4,
                 ["baseline", "selective"]),
                ("moe_cp2_etp2_ep2", ["--tp", "2", "--cp", "2", "--cp-comm-type", "all_gather",
                                      "--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2"], 4,
                 ["sp", "selective+sp"])]
        for tag, extra, ranks, configs in runs:
            args = [*moe_dumps.SHAPE, *combo, *extra, "--recompute-modules", "moe_act,shared_experts"]
            for r, c, _ in self.run_against_cpu(tag, args, configs, ranks):
                self.assertEqual(r["moe_routed_rows"], c["moe_routed_rows"])  # the same routing decision

    @unittest.skipUnless(composed, "numpy missing: run with /usr/bin/python3")
    def test_composed_options_match_cpu_and_numpy(self):
        self.run_composed(["baseline", "selective", "full"])

    @unittest.skipUnless(composed and MPIEXEC, "numpy or mpirun missing")
    def test_composed_options_under_two_ranks_and_sequence_parallel(self):
        self.run_composed(["sp", "selective+sp"], tp=2)

    def test_cupti_phase_split_of_simulated_kernels(self):
        # The simulated runtime reports every API call, kernel, copy and set to the CUPTI
        # stand-in; layer_run's profiler attributes them to phases as on a GPU.
        cupti = os.path.join(self.tmp, "cupti.csv")
        self.layer_run("cupti_layer", "--backend", "cuda", "--model", "tiny", "--config", "baseline,full,selective",
                       "--dtype", "fp32", "--cupti", cupti)
        rows = read_rows(cupti)
        kernels = {}
        for r in rows:
            self.assertEqual(r["gpu_ms"], "", "simulated kernels have no GPU time")
            self.assertEqual(r["dropped_records"], "0")
            self.assertTrue(r["device"].startswith("cuda-sim ("))
            kernels.setdefault(r["config"], {})[r["phase"]] = float(r["kernels"])
        for config in ["baseline", "full", "selective"]:
            phases = kernels[config]
            for stage in ["fwd", "bwd"]:
                for block in ["ln1", "qkv", "core_attn", "fc1", "gelu"]:
                    self.assertGreater(phases.get(stage + "." + block, 0), 0, (config, stage, block))
        self.assertFalse([p for p in kernels["baseline"] if p.startswith("recompute.")])
        # Full recompute re-runs every forward phase's kernels; selective only (part of) core attention.
        fwd = {p[4:]: n for p, n in kernels["full"].items() if p.startswith("fwd.")}
        rec = {p[10:]: n for p, n in kernels["full"].items() if p.startswith("recompute.")}
        self.assertEqual(rec, fwd)
        rec = {p: n for p, n in kernels["selective"].items() if p.startswith("recompute.")}
        self.assertEqual(list(rec), ["recompute.core_attn"])
        self.assertLessEqual(rec["recompute.core_attn"], kernels["selective"]["fwd.core_attn"])

    def test_fused_attention_refuses_heads_wider_than_its_kernels_with_one_line(self):
        # The fused kernels take heads of up to 192 channels (Gemma's 256 run unfused): exit 2,
        # one error line naming the head size, no row.
        out = os.path.join(self.tmp, "wide.csv")
        r = subprocess.run([LAYER_RUN, "--backend", "cuda", "--attention", "fused", "--kv-channels", "256",
                            "--seq", "16", "--batch", "1", "--config", "baseline", "--csv", out],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 2, r.stderr)
        errors = [l for l in r.stderr.splitlines() if l.startswith("layer_run: error:")]
        self.assertEqual(len(errors), 1, r.stderr)
        self.assertIn("head dim 256", errors[0])
        self.assertFalse(os.path.exists(out))

    def test_launch_limits_of_the_simulated_device_are_the_drivers(self):
        # fp32 fused attention at head size 128 (the CUDA-core kernels; bf16's tensor-core ones
        # fit) needs more shared memory than an sm_86 block may opt into (99 KiB): refused as
        # the driver refuses it, one line naming the call site.
        out = os.path.join(self.tmp, "sm86.csv")
        env = dict(os.environ, CUDASIM_DEVICE="sm86")
        r = subprocess.run([LAYER_RUN, "--backend", "cuda", "--attention", "fused", "--hidden", "256", "--heads", "2",
                            "--seq", "16", "--batch", "1", "--dtype", "fp32", "--config", "baseline", "--csv", out],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertNotEqual(r.returncode, 0)
        errors = [l for l in r.stderr.splitlines() if "failure" in l]
        self.assertEqual(len(errors), 1, r.stderr)
        # The attention family's shared-memory opt-in (attention_common.cuh), with its line.
        self.assertRegex(errors[0], r"kernels/cuda/attention\w*\.cuh?:\d+: cudaFuncSetAttribute")
        self.assertIn("cudaErrorInvalidValue", errors[0])
        self.assertIn("cuda-sim (sm86 limits)", r.stderr)
        # The same run within the H100's limits is fine.
        r = subprocess.run([LAYER_RUN, "--backend", "cuda", "--attention", "fused", "--hidden", "256", "--heads", "2",
                            "--seq", "16", "--batch", "1", "--dtype", "fp32", "--config", "baseline", "--csv", out],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_rows(out)[0]["device"], "cuda-sim (h100 limits)")

    @unittest.skipUnless(BENCH_LAYER and BENCH_KERNELS, "ACTBENCH_BENCH_LAYER or ACTBENCH_BENCH_KERNELS not set")
    def test_benchmarks_on_the_simulator_say_so(self):
        for binary, pattern in [(BENCH_LAYER, "selective"), (BENCH_KERNELS, "layernorm|gemm_qkv|attention_fused")]:
            out = os.path.join(self.tmp, "bench.json")
            r = subprocess.run([binary, "--backend=cuda", "--benchmark_filter=" + pattern,
                                "--benchmark_min_time=0.001", "--benchmark_format=json", "--benchmark_out=" + out],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(out) as f:
                report = json.load(f)
            self.assertTrue(report["context"]["actbench_device"].startswith("cuda-sim ("), report["context"])
            self.assertIn("simulated", report["context"]["actbench_timing"])
            self.assertEqual(report["context"]["actbench_shape"], "small")
            self.assertTrue(report["benchmarks"])
            for b in report["benchmarks"]:
                self.assertNotIn("error_occurred", b, b)
                self.assertIn("simulated", b.get("label", ""), b)


if __name__ == "__main__":
    unittest.main()
