// The contract of kernels/backend.hpp, one set of cases on every backend of this build: cpu
// and meta always, cuda where it is built (the simulator build runs it; a CUDA build without a
// device skips it). Each case first runs the op on valid arguments, so a check that refused
// everything would fail, then breaks one rule at a time: the op must throw InvalidArgument,
// one line that names the op and the mismatch. meta proves the shapes of runs no device holds,
// so it must refuse exactly what cpu and cuda refuse.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "contract_checks.hpp"
#include "dropout_specs.hpp"
#include "kernels/backend.hpp"
#include "runtime/error.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

constexpr DType f32 = DType::fp32, bf16 = DType::bf16, u8 = DType::u8;

class BackendContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      be_ = make_backend(GetParam());
    } catch (const InvalidArgument& e) {
      GTEST_SKIP() << "no " << GetParam() << " backend here: " << e.what();
    }
    // Tensors of another device: cpu's come from meta, the others' from cpu.
    other_ = make_backend(GetParam() == "cpu" ? "meta" : "cpu");
  }

  Tensor t(Shape shape, DType dt = f32) { return be_->zeros(std::move(shape), dt); }
  Tensor elsewhere(Shape shape, DType dt = f32) { return other_->zeros(std::move(shape), dt); }

  void accepts(const std::function<void()>& call, const std::string& what) {
    EXPECT_NO_THROW({
      call();
      be_->synchronize();
    }) << GetParam()
       << " refused valid arguments: " << what;
  }
  // InvalidArgument, one line "op: ..." that contains `mentions`.
  void refuses(const std::string& op, const std::string& mentions, const std::function<void()>& call) {
    actbench::testing::expect_refused(GetParam(), op, mentions, call);
  }

  std::unique_ptr<Backend> be_, other_;
};

TEST_P(BackendContract, DataMovement) {
  Tensor a = t({2, 3}), b = t({3, 2});
  std::vector<float> host(6, 1.f);
  accepts([&] { be_->fill_zero(a); }, "fill_zero");
  accepts([&] { be_->copy(a, b); }, "copy of the same elements in another shape");
  accepts([&] { be_->upload(host.data(), a); }, "upload");
  accepts([&] { be_->download(a, host.data()); }, "download");
  accepts([&] { be_->add_inplace(a, b); }, "add_inplace");

  refuses("fill_zero", "t is undefined", [&] { be_->fill_zero(Tensor()); });
  refuses("fill_zero", "not on the", [&] { be_->fill_zero(elsewhere({2})); });
  refuses("copy", "dst has 5 elements", [&] { be_->copy(a, t({5})); });
  refuses("copy", "dtypes differ", [&] { be_->copy(a, t({6}, bf16)); });
  refuses("copy", "src [6] is on", [&] { be_->copy(elsewhere({6}), a); });
  refuses("upload", "dst [6] is on", [&] { be_->upload(host.data(), elsewhere({6})); });
  refuses("download", "src is undefined", [&] { be_->download(Tensor(), host.data()); });
  refuses("add_inplace", "src has 7 elements", [&] { be_->add_inplace(a, t({7})); });
  refuses("add_inplace", "src must be a float tensor", [&] { be_->add_inplace(a, t({6}, u8)); });
}

TEST_P(BackendContract, Gemm) {
  const GemmArgs g = gemm_args(false, false, 2, 4, 3);  // [2, 3] x [3, 4]
  Tensor A = t({2, 3}), B = t({3, 4}), C = t({2, 4});
  accepts([&] { be_->gemm(g, A, B, C); }, "gemm");
  accepts([&] { be_->gemm(gemm_args(true, true, 2, 4, 3), t({3, 2}), t({4, 3}), C); }, "gemm, both transposed");

  refuses("gemm", "A has 5 elements", [&] { be_->gemm(g, t({5}), B, C); });
  refuses("gemm", "B has 15 elements", [&] { be_->gemm(g, A, t({3, 5}), C); });
  refuses("gemm", "C has 10 elements", [&] { be_->gemm(g, A, B, t({2, 5})); });
  refuses("gemm", "A has 6 elements", [&] { be_->gemm(gemm_args(false, false, 2, 4, 3, 2), A, B, C); });  // batch 2
  refuses("gemm", "negative size", [&] { be_->gemm(gemm_args(false, false, -2, 4, 3), A, B, C); });
  refuses("gemm", "C must be a float tensor", [&] { be_->gemm(g, A, B, t({2, 4}, u8)); });
  Tensor square = t({3, 3});
  refuses("gemm", "C must not overlap", [&] { be_->gemm(gemm_args(false, false, 3, 3, 3), square, t({3, 3}), square); });
  refuses("gemm", "A [2, 3] is on", [&] { be_->gemm(g, elsewhere({2, 3}), B, C); });
  refuses("gemm", "B is undefined", [&] { be_->gemm(g, A, Tensor(), C); });
}

TEST_P(BackendContract, BiasAndBiasGrad) {
  Tensor Y = t({3, 5}), bias = t({5});
  accepts([&] { be_->add_bias(Y, bias); }, "add_bias");
  accepts([&] { be_->bias_grad(Y, bias); }, "bias_grad");

  refuses("add_bias", "must end in the 6 elements of bias", [&] { be_->add_bias(Y, t({6})); });
  refuses("add_bias", "must end in", [&] { be_->add_bias(t({}), t({1})); });               // rank 0
  refuses("add_bias", "must end in the 0 elements", [&] { be_->add_bias(t({3, 0}), t({0})); });  // N >= 1
  refuses("add_bias", "bias must be a float tensor", [&] { be_->add_bias(Y, t({5}, u8)); });
  refuses("bias_grad", "must end in the 4 elements of db", [&] { be_->bias_grad(Y, t({4})); });
  refuses("bias_grad", "db must be a float tensor", [&] { be_->bias_grad(Y, t({5}, u8)); });
}

TEST_P(BackendContract, LayerNorm) {
  const int64_t M = 4, H = 6;
  Tensor X = t({M, H}), W = t({H}), B = t({H}), Y = t({M, H}), mean = t({M}), rstd = t({M});
  Tensor DY = t({M, H}), DX = t({M, H}), DW = t({H}), DB = t({H});
  accepts([&] { be_->layernorm_fwd(X, W, B, 1e-5f, Y, mean, rstd); }, "layernorm_fwd");
  accepts([&] { be_->layernorm_bwd(DY, X, W, mean, rstd, DX, DW, DB); }, "layernorm_bwd");

  refuses("layernorm_fwd", "must end in the 7 elements of weight",
          [&] { be_->layernorm_fwd(X, t({7}), B, 1e-5f, Y, mean, rstd); });
  refuses("layernorm_fwd", "bias has 7 elements", [&] { be_->layernorm_fwd(X, W, t({7}), 1e-5f, Y, mean, rstd); });
  refuses("layernorm_fwd", "y has 20 elements", [&] { be_->layernorm_fwd(X, W, B, 1e-5f, t({M, 5}), mean, rstd); });
  refuses("layernorm_fwd", "mean has 5 elements", [&] { be_->layernorm_fwd(X, W, B, 1e-5f, Y, t({5}), rstd); });
  refuses("layernorm_fwd", "rstd must be fp32, got bf16",
          [&] { be_->layernorm_fwd(X, W, B, 1e-5f, Y, mean, t({M}, bf16)); });
  refuses("layernorm_fwd", "x must be a float tensor", [&] { be_->layernorm_fwd(t({M, H}, u8), W, B, 1e-5f, Y, mean, rstd); });
  refuses("layernorm_bwd", "dweight has 5 elements", [&] { be_->layernorm_bwd(DY, X, W, mean, rstd, DX, t({5}), DB); });
  refuses("layernorm_bwd", "dbias has 7 elements", [&] { be_->layernorm_bwd(DY, X, W, mean, rstd, DX, DW, t({7})); });
  refuses("layernorm_bwd", "dx has 23 elements", [&] { be_->layernorm_bwd(DY, X, W, mean, rstd, t({23}), DW, DB); });
  refuses("layernorm_bwd", "mean must be fp32", [&] { be_->layernorm_bwd(DY, X, W, t({M}, bf16), rstd, DX, DW, DB); });
}

TEST_P(BackendContract, CausalSoftmax) {
  Tensor S = t({2, 4, 4}), P = t({2, 4, 4}), DP = t({2, 4, 4}), DS = t({2, 4, 4});
  accepts([&] { be_->softmax_causal_fwd(S, P); }, "softmax_causal_fwd");
  accepts([&] { be_->softmax_causal_bwd(DP, P, DS); }, "softmax_causal_bwd");

  refuses("softmax_causal_fwd", "scores must be [..., S, S]", [&] { be_->softmax_causal_fwd(t({2, 4, 5}), t({2, 4, 5})); });
  refuses("softmax_causal_fwd", "scores must be [..., R, C]", [&] { be_->softmax_causal_fwd(t({4}), t({4})); });
  // Rows placed in a longer sequence (context parallelism): [.., R, C] with every row inside C.
  accepts([&] { be_->softmax_causal_fwd(t({2, 2, 8}), t({2, 2, 8}), SeqPositions::chunks(1, 1, 6)); },
          "softmax_causal_fwd");
  refuses("softmax_causal_fwd", "score rows 1..2 at positions 8..9 do not fit [0, 8)",
          [&] { be_->softmax_causal_fwd(t({2, 2, 8}), t({2, 2, 8}), SeqPositions::chunks(1, 1, 8)); });
  refuses("softmax_causal_fwd", "probs has 24 elements", [&] { be_->softmax_causal_fwd(S, t({2, 4, 3})); });
  refuses("softmax_causal_fwd", "probs must be a float tensor", [&] { be_->softmax_causal_fwd(S, t({2, 4, 4}, u8)); });
  refuses("softmax_causal_bwd", "probs must be [..., S, S]", [&] { be_->softmax_causal_bwd(DP, t({2, 8, 2}), DS); });
  refuses("softmax_causal_bwd", "dscores has 31 elements", [&] { be_->softmax_causal_bwd(DP, P, t({31})); });
}

TEST_P(BackendContract, ContextParallelCopiesAndMerges) {
  accepts([&] { be_->copy_rows(t({2, 3, 4}), 1, t({2, 5, 4}), 3, 2); }, "copy_rows");
  refuses("copy_rows", "do not fit", [&] { be_->copy_rows(t({2, 3, 4}), 2, t({2, 5, 4}), 3, 2); });
  refuses("copy_rows", "src and dst must be [O, Rs, W] and [O, Rd, W]",
          [&] { be_->copy_rows(t({2, 3, 4}), 0, t({3, 5, 4}), 0, 1); });
  Tensor out = t({2, 3, 4}), lse = t({2, 3}, f32), part = t({2, 3, 4}), part_lse = t({2, 3}, f32);
  accepts([&] { be_->attention_merge(out, lse, part, part_lse); }, "attention_merge");
  refuses("attention_merge", "lse_part has 5 elements", [&] { be_->attention_merge(out, lse, part, t({5}, f32)); });
}

TEST_P(BackendContract, Dropout) {
  const DropoutSpec spec = make_spec(0.1f, 1, 4, 4, 0, 8, 0);
  Tensor X = t({4, 8}), Y = t({4, 8}), mask = t({4, 8}, u8);
  accepts([&] { be_->dropout_fwd(X, spec, Y, mask); }, "dropout_fwd");
  accepts([&] { be_->dropout_fwd(X, make_spec(0.1f, 1, 4, 12, 8, 8, 0), Y, mask); }, "dropout_fwd of the last shard");
  accepts([&] { be_->dropout_bwd(X, mask, 0.1f, Y); }, "dropout_bwd");

  refuses("dropout_fwd", "dropout spec describes 28 elements, expected 32",
          [&] { be_->dropout_fwd(X, make_spec(0.1f, 1, 4, 4, 0, 7, 0), Y, mask); });
  refuses("dropout_fwd", "does not fit mid_global", [&] { be_->dropout_fwd(X, make_spec(0.1f, 1, 4, 4, 1, 8, 0), Y, mask); });
  refuses("dropout_fwd", "mask must be u8, got fp32", [&] { be_->dropout_fwd(X, spec, Y, t({4, 8})); });
  refuses("dropout_fwd", "y has 28 elements", [&] { be_->dropout_fwd(X, spec, t({4, 7}), mask); });
  for (float p : {-0.1f, 1.f, std::numeric_limits<float>::quiet_NaN()})
    refuses("dropout_fwd", "dropout probability", [&] { be_->dropout_fwd(X, make_spec(p, 1, 4, 4, 0, 8, 0), Y, mask); });
  refuses("dropout_bwd", "mask has 31 elements", [&] { be_->dropout_bwd(X, t({31}, u8), 0.1f, Y); });
  refuses("dropout_bwd", "mask must be u8, got bf16", [&] { be_->dropout_bwd(X, t({4, 8}, bf16), 0.1f, Y); });
  refuses("dropout_bwd", "dx has 33 elements", [&] { be_->dropout_bwd(X, mask, 0.1f, t({33})); });
  refuses("dropout_bwd", "dropout probability", [&] { be_->dropout_bwd(X, mask, 1.5f, Y); });
}

TEST_P(BackendContract, Gelu) {
  Tensor X = t({3, 7}), Y = t({3, 7}), DY = t({3, 7}), DX = t({21});
  accepts([&] { be_->gelu_fwd(X, Y); }, "gelu_fwd");
  accepts([&] { be_->gelu_bwd(DY, X, DX); }, "gelu_bwd");

  refuses("gelu_fwd", "y has 20 elements", [&] { be_->gelu_fwd(X, t({20})); });
  refuses("gelu_fwd", "x must be a float tensor", [&] { be_->gelu_fwd(t({3, 7}, u8), Y); });
  refuses("gelu_bwd", "dy has 22 elements", [&] { be_->gelu_bwd(t({22}), X, DX); });
  refuses("gelu_bwd", "dx must be a float tensor", [&] { be_->gelu_bwd(DY, X, t({21}, u8)); });
}

TEST_P(BackendContract, SquaredRelu) {
  Tensor X = t({3, 7}), Y = t({3, 7}), DY = t({3, 7}), DX = t({21});
  accepts([&] { be_->squared_relu_fwd(X, Y); }, "squared_relu_fwd");
  accepts([&] { be_->squared_relu_bwd(DY, X, DX); }, "squared_relu_bwd");
  accepts([&] { be_->squared_relu_bwd(DY, X, DY); }, "squared_relu_bwd in place");

  refuses("squared_relu_fwd", "y has 20 elements", [&] { be_->squared_relu_fwd(X, t({20})); });
  refuses("squared_relu_fwd", "x must be a float tensor", [&] { be_->squared_relu_fwd(t({3, 7}, u8), Y); });
  refuses("squared_relu_fwd", "x is undefined", [&] { be_->squared_relu_fwd(Tensor(), Y); });
  refuses("squared_relu_fwd", "y [3, 7] is on", [&] { be_->squared_relu_fwd(X, elsewhere({3, 7})); });
  refuses("squared_relu_bwd", "dy has 22 elements", [&] { be_->squared_relu_bwd(t({22}), X, DX); });
  refuses("squared_relu_bwd", "dx has 20 elements", [&] { be_->squared_relu_bwd(DY, X, t({20})); });
  refuses("squared_relu_bwd", "dx must be a float tensor", [&] { be_->squared_relu_bwd(DY, X, t({21}, u8)); });
}

TEST_P(BackendContract, BiasDropoutResidual) {
  const DropoutSpec spec = make_spec(0.1f, 1, 4, 4, 0, 8, 0);
  Tensor X = t({4, 8}), bias = t({8}), R = t({4, 8}), out = t({4, 8}), mask = t({4, 8}, u8);
  accepts([&] { be_->bias_dropout_residual_fwd(X, bias, R, spec, out, mask); }, "bias_dropout_residual_fwd");

  const std::string op = "bias_dropout_residual_fwd";
  refuses(op, "must end in the 7 elements of bias", [&] { be_->bias_dropout_residual_fwd(X, t({7}), R, spec, out, mask); });
  refuses(op, "dropout spec describes 36 elements",
          [&] { be_->bias_dropout_residual_fwd(X, bias, R, make_spec(0.1f, 1, 4, 4, 0, 9, 0), out, mask); });
  refuses(op, "residual has 24 elements", [&] { be_->bias_dropout_residual_fwd(X, bias, t({3, 8}), spec, out, mask); });
  refuses(op, "out has 40 elements", [&] { be_->bias_dropout_residual_fwd(X, bias, R, spec, t({5, 8}), mask); });
  refuses(op, "mask must be u8, got fp32", [&] { be_->bias_dropout_residual_fwd(X, bias, R, spec, out, t({4, 8})); });
  refuses(op, "dropout probability",
          [&] { be_->bias_dropout_residual_fwd(X, bias, R, make_spec(1.f, 1, 4, 4, 0, 8, 0), out, mask); });
  refuses(op, "bias [8] is on", [&] { be_->bias_dropout_residual_fwd(X, elsewhere({8}), R, spec, out, mask); });
  refuses(op, "bias must be a float tensor", [&] { be_->bias_dropout_residual_fwd(X, t({8}, u8), R, spec, out, mask); });
}

TEST_P(BackendContract, DropoutResidualWithoutBias) {
  // An undefined bias is no bias: out = residual + dropout(x), x of any shape.
  const DropoutSpec spec = make_spec(0.1f, 1, 4, 4, 0, 8, 0);
  const Tensor none;
  Tensor X = t({4, 8}), R = t({4, 8}), out = t({4, 8}), mask = t({4, 8}, u8);
  accepts([&] { be_->bias_dropout_residual_fwd(X, none, R, spec, out, mask); }, "no bias");
  accepts([&] { be_->bias_dropout_residual_fwd(t({32}), none, t({2, 16}), spec, t({8, 4}), t({32}, u8)); },
          "no bias, the elements in other shapes");

  const std::string op = "bias_dropout_residual_fwd";
  refuses(op, "dropout spec describes 36 elements",
          [&] { be_->bias_dropout_residual_fwd(X, none, R, make_spec(0.1f, 1, 4, 4, 0, 9, 0), out, mask); });
  refuses(op, "residual has 24 elements", [&] { be_->bias_dropout_residual_fwd(X, none, t({3, 8}), spec, out, mask); });
  refuses(op, "out has 40 elements", [&] { be_->bias_dropout_residual_fwd(X, none, R, spec, t({5, 8}), mask); });
  refuses(op, "mask must be u8, got fp32", [&] { be_->bias_dropout_residual_fwd(X, none, R, spec, out, t({4, 8})); });
  refuses(op, "x must be a float tensor", [&] { be_->bias_dropout_residual_fwd(t({4, 8}, u8), none, R, spec, out, mask); });
  refuses(op, "x is undefined", [&] { be_->bias_dropout_residual_fwd(none, none, R, spec, out, mask); });
}

TEST_P(BackendContract, FusedAttention) {
  const int64_t B = 4, S = 5, D = 8;
  const DropoutSpec spec = make_spec(0.1f, B, S, S, 0, S, 0);  // the [B, S, S] probabilities
  Tensor Q = t({B, S, D}), K = t({B, S, D}), V = t({B, S, D}), O = t({B, S, D}), lse = t({B, S});
  Tensor K2 = t({B / 2, S, D}), V2 = t({B / 2, S, D}), DQ = t({B, S, D}), DK = t({B, S, D}), DV = t({B, S, D});
  Tensor DK2 = t({B / 2, S, D}), DV2 = t({B / 2, S, D}), DO = t({B, S, D});
  accepts([&] { be_->attention_fwd(Q, K, V, 0.5f, spec, O, lse); }, "attention_fwd");
  accepts([&] { be_->attention_fwd(Q, K2, V2, 0.5f, spec, O, lse); }, "attention_fwd, 2 query batches per k, v");
  accepts([&] { be_->attention_bwd(Q, K, V, O, DO, lse, 0.5f, spec, DQ, DK, DV); }, "attention_bwd");
  accepts([&] { be_->attention_bwd(Q, K2, V2, O, DO, lse, 0.5f, spec, DQ, DK2, DV2); }, "attention_bwd, grouped");
  Tensor Q0 = t({0, S, D});
  accepts([&] { be_->attention_fwd(Q0, Q0, Q0, 0.5f, make_spec(0.1f, 0, S, S, 0, S, 0), Q0, t({0, S})); },
          "attention_fwd of an empty batch");

  const char* fwd = "attention_fwd";
  refuses(fwd, "q must be [B, S, D]", [&] { be_->attention_fwd(t({B * S, D}), K, V, 0.5f, spec, O, lse); });
  refuses(fwd, "k and v must be [B / r, S, D] and [B / r, S, Dv]", [&] { be_->attention_fwd(Q, t({B, S + 1, D}), V, 0.5f, spec, O, lse); });
  refuses(fwd, "out must be [4, 5, 10] like q with v's width",  // v of its own width needs out of that width
          [&] { be_->attention_fwd(Q, K, t({B, S, D + 2}), 0.5f, spec, O, lse); });
  refuses(fwd, "k and v must be [B / r, S, D] and [B / r, S, Dv]",
          [&] { be_->attention_fwd(Q, K, t({B, S + 1, D + 2}), 0.5f, spec, O, lse); });
  refuses(fwd, "k and v must be [B / r, S, D] and [B / r, S, Dv]",  // 3 key/value batches do not divide 4 query batches
          [&] { be_->attention_fwd(Q, t({3, S, D}), t({3, S, D}), 0.5f, spec, O, lse); });
  refuses(fwd, "k and v must be [B / r, S, D] and [B / r, S, Dv]", [&] { be_->attention_fwd(Q, Q0, Q0, 0.5f, spec, O, lse); });
  refuses(fwd, "out must be [4, 5, 8]", [&] { be_->attention_fwd(Q, K, V, 0.5f, spec, t({B, S, D - 1}), lse); });
  refuses(fwd, "lse has 16 elements", [&] { be_->attention_fwd(Q, K, V, 0.5f, spec, O, t({B, S - 1})); });
  refuses(fwd, "lse must be fp32, got bf16", [&] { be_->attention_fwd(Q, K, V, 0.5f, spec, O, t({B, S}, bf16)); });
  refuses(fwd, "dropout spec describes 80 elements, expected 100",
          [&] { be_->attention_fwd(Q, K, V, 0.5f, make_spec(0.1f, B, S, S, 0, S - 1, 0), O, lse); });
  refuses(fwd, "dropout probability",
          [&] { be_->attention_fwd(Q, K, V, 0.5f, make_spec(-1.f, B, S, S, 0, S, 0), O, lse); });
  refuses(fwd, "q must be a float tensor", [&] { be_->attention_fwd(t({B, S, D}, u8), K, V, 0.5f, spec, O, lse); });
  refuses(fwd, "k [4, 5, 8] is on", [&] { be_->attention_fwd(Q, elsewhere({B, S, D}), V, 0.5f, spec, O, lse); });

  const char* bwd = "attention_bwd";
  refuses(bwd, "dk must be [2, 5, 8] like k",
          [&] { be_->attention_bwd(Q, K2, V2, O, DO, lse, 0.5f, spec, DQ, DK, DV2); });
  refuses(bwd, "dv must be [4, 5, 8] like v",
          [&] { be_->attention_bwd(Q, K, V, O, DO, lse, 0.5f, spec, DQ, DK, t({B, S + 1, D})); });
  refuses(bwd, "dq must be [4, 5, 8] like q",
          [&] { be_->attention_bwd(Q, K, V, O, DO, lse, 0.5f, spec, t({B, S, D + 1}), DK, DV); });
  refuses(bwd, "dout must be [4, 5, 8] like q",
          [&] { be_->attention_bwd(Q, K, V, O, t({B + 1, S, D}), lse, 0.5f, spec, DQ, DK, DV); });
  refuses(bwd, "lse must be fp32", [&] { be_->attention_bwd(Q, K, V, O, DO, t({B, S}, bf16), 0.5f, spec, DQ, DK, DV); });
  refuses(bwd, "k and v must be [B / r, S, D] and [B / r, S, Dv]",
          [&] { be_->attention_bwd(Q, t({3, S, D}), t({3, S, D}), O, DO, lse, 0.5f, spec, DQ, t({3, S, D}), t({3, S, D})); });
}

TEST_P(BackendContract, RmsNorm) {
  const int64_t M = 4, H = 6;
  Tensor X = t({M, H}), W = t({H}), Y = t({M, H}), rstd = t({M}), DY = t({M, H}), DX = t({M, H}), DW = t({H});
  accepts([&] { be_->rmsnorm_fwd(X, W, 1e-5f, Y, rstd); }, "rmsnorm_fwd");
  accepts([&] { be_->rmsnorm_bwd(DY, X, W, rstd, DX, DW); }, "rmsnorm_bwd");

  refuses("rmsnorm_fwd", "must end in the 5 elements of weight", [&] { be_->rmsnorm_fwd(X, t({5}), 1e-5f, Y, rstd); });
  refuses("rmsnorm_fwd", "rstd has 3 elements", [&] { be_->rmsnorm_fwd(X, W, 1e-5f, Y, t({3})); });
  refuses("rmsnorm_fwd", "rstd must be fp32, got bf16", [&] { be_->rmsnorm_fwd(X, W, 1e-5f, Y, t({M}, bf16)); });
  refuses("rmsnorm_fwd", "eps must be positive", [&] { be_->rmsnorm_fwd(X, W, 0.f, Y, rstd); });
  refuses("rmsnorm_fwd", "y must be a float tensor", [&] { be_->rmsnorm_fwd(X, W, 1e-5f, t({M, H}, u8), rstd); });
  refuses("rmsnorm_bwd", "dweight has 7 elements", [&] { be_->rmsnorm_bwd(DY, X, W, rstd, DX, t({7})); });
  refuses("rmsnorm_bwd", "dy has 18 elements", [&] { be_->rmsnorm_bwd(t({3, H}), X, W, rstd, DX, DW); });
}

TEST_P(BackendContract, Rope) {
  Tensor X = t({1, 2, 3, 6}), Y = t({1, 2, 3, 6});
  accepts([&] { be_->rope_fwd(X, 10000.0, 6, Y); }, "rope_fwd");
  accepts([&] { be_->rope_bwd(Y, 10000.0, 6, Y); }, "rope_bwd in place");
  accepts([&] { be_->rope_fwd(X, 10000.0, 2, Y); }, "rope_fwd on the first 2 of 6 dims");
  accepts([&] { be_->rope_bwd(Y, 10000.0, 4, Y); }, "rope_bwd on the first 4 of 6 dims, in place");
  accepts([&] { be_->rope_fwd(t({1, 2, 3, 5}), 10000.0, 4, t({30})); }, "rope_fwd on 4 dims of an odd head size");

  refuses("rope_fwd", "x must be [B, NH, S, D]", [&] { be_->rope_fwd(t({2, 3, 4}), 10000.0, 4, t({2, 3, 4})); });
  refuses("rope_fwd", "rotary_dim must be even and in [2, D = 5], got 5",
          [&] { be_->rope_fwd(t({1, 2, 3, 5}), 10000.0, 5, t({30})); });
  refuses("rope_fwd", "rotary_dim must be even and in [2, D = 6], got 3", [&] { be_->rope_fwd(X, 10000.0, 3, Y); });
  refuses("rope_fwd", "rotary_dim must be even and in [2, D = 6], got 8", [&] { be_->rope_fwd(X, 10000.0, 8, Y); });
  refuses("rope_fwd", "rotary_dim must be even and in [2, D = 6], got 0", [&] { be_->rope_fwd(X, 10000.0, 0, Y); });
  refuses("rope_fwd", "rotary_dim must be even and in [2, D = 6], got -2", [&] { be_->rope_fwd(X, 10000.0, -2, Y); });
  refuses("rope_fwd", "y has 23 elements", [&] { be_->rope_fwd(X, 10000.0, 6, t({23})); });
  refuses("rope_fwd", "theta must be positive", [&] { be_->rope_fwd(X, 0.0, 6, Y); });
  refuses("rope_bwd", "dy must be [B, NH, S, D]", [&] { be_->rope_bwd(t({36}), 10000.0, 6, Y); });
  refuses("rope_bwd", "rotary_dim must be even and in [2, D = 6], got 7", [&] { be_->rope_bwd(Y, 10000.0, 7, X); });
  refuses("rope_bwd", "dx must be a float tensor", [&] { be_->rope_bwd(X, 10000.0, 6, t({1, 2, 3, 6}, u8)); });
}

TEST_P(BackendContract, Swiglu) {
  Tensor X = t({3, 8}), Y = t({3, 4}), DX = t({3, 8});
  accepts([&] { be_->swiglu_fwd(X, Y); }, "swiglu_fwd");
  accepts([&] { be_->swiglu_bwd(Y, X, DX); }, "swiglu_bwd");

  refuses("swiglu_fwd", "x must be [..., 2N] = [gate | up] for y", [&] { be_->swiglu_fwd(X, t({3, 5})); });
  refuses("swiglu_fwd", "x must be [..., 2N] = [gate | up] for y", [&] { be_->swiglu_fwd(X, t({2, 4})); });  // rows
  refuses("swiglu_fwd", "x must be [..., 2N] = [gate | up] for y", [&] { be_->swiglu_fwd(t({3, 0}), t({3, 0})); });
  refuses("swiglu_fwd", "y must be a float tensor", [&] { be_->swiglu_fwd(X, t({3, 4}, u8)); });
  refuses("swiglu_bwd", "for dy", [&] { be_->swiglu_bwd(t({3, 3}), X, DX); });
  refuses("swiglu_bwd", "dx has 21 elements", [&] { be_->swiglu_bwd(Y, X, t({3, 7})); });
}

TEST_P(BackendContract, HeadLayout) {
  const int64_t S = 3, B = 2, W = 10, NH = 2, D = 4;
  Tensor wide = t({S, B, W}), heads = t({B, NH, S, D});
  accepts([&] { be_->split_heads(wide, 2, heads); }, "split_heads at column 2");
  accepts([&] { be_->merge_heads(heads, 0, wide); }, "merge_heads at column 0");

  refuses("split_heads", "at column 3 do not fit", [&] { be_->split_heads(wide, 3, heads); });
  refuses("split_heads", "at column -1 do not fit", [&] { be_->split_heads(wide, -1, heads); });
  refuses("split_heads", "do not fit", [&] { be_->split_heads(wide, 0, t({B + 1, NH, S, D})); });
  refuses("split_heads", "expected [S, B, W] and [B, NH, S, D]", [&] { be_->split_heads(wide, 0, t({B, NH, S * D})); });
  refuses("split_heads", "dtypes differ", [&] { be_->split_heads(wide, 0, t({B, NH, S, D}, bf16)); });
  refuses("merge_heads", "do not fit", [&] { be_->merge_heads(t({B, NH, S + 1, D}), 0, wide); });
  refuses("merge_heads", "dst [3, 2, 10] is on", [&] { be_->merge_heads(heads, 0, elsewhere({S, B, W})); });
}

std::vector<std::string> backends_of_this_build() {
#if ACTBENCH_TEST_CUDA
  return {"cpu", "meta", "cuda"};
#else
  return {"cpu", "meta"};
#endif
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendContract, ::testing::ValuesIn(backends_of_this_build()),
                         [](const ::testing::TestParamInfo<std::string>& backend) { return backend.param; });

}  // namespace
