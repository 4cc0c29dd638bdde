// actbench's CUDA kernels (kernels/cuda/*.cu, compiled unchanged for the simulator) against
// the cpu backend's own ops, every kernel family, on shapes that are not powers of two, in
// fp32, bf16 and fp16. Inputs are bit-identical on both sides (the cpu tensor's storage is
// copied to the simulated device); outputs start as NaN on the device (fresh cudaMalloc
// memory is poisoned), so an element a kernel forgets to write fails. Dropout masks, the head
// layout and copy_rows compare bit for bit. Context parallelism's rows placed in a longer
// sequence (two chunks of it per rank) run through every op that takes them. Any simulator
// report (race, deadlock, divergence, bad shuffle, out-of-bounds, canary, unwritten shared
// memory) fails the test.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cudasim/sim.hpp"
#include "dropout_specs.hpp"
#include "kernels/backend.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "moe_routing_args.hpp"

using namespace actbench;
using namespace actbench::testing;

namespace {

struct Tol {
  double atol, rtol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::fp32: return {1e-5, 1e-5};
    case DType::fp16: return {2e-3, 2e-3};
    default: return {1e-2, 1e-2};
  }
}

// Rank i of C holds chunks i and 2C-1-i of c rows each (context parallelism's placement).
SeqPositions rank_positions(int64_t c, int64_t C, int64_t i) {
  return SeqPositions::chunks(c, i * c, (2 * C - 1 - i) * c);
}

// Rank i's rows of [mid_local, T, T] probabilities (heads 1.. of mid_local + 1): its [2c, T]
// rows of each head are two runs of the head's T * T elements.
DropoutSpec rank_rows_spec(float p, int64_t mid_local, int64_t c, int64_t C, int64_t i, int64_t T) {
  DropoutSpec spec = make_spec(p, 1, mid_local, mid_local + 1, 1, 2 * c * T, kSiteAttnProbs);
  spec.inner_global = T * T;
  spec.inner_positions = SeqPositions::chunks(c * T, i * c * T, (2 * C - 1 - i) * c * T);
  return spec;
}

#define SIM_CHECK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device buffer of the simulator.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// The same tensor on the cpu backend (c) and on the simulated device (g).
struct Both {
  Tensor c;
  std::shared_ptr<DeviceBuffer> g;
  void* dev() const { return g->ptr; }
  float* devf() const { return g->as<float>(); }
  uint8_t* devu8() const { return g->as<uint8_t>(); }
};

class SimKernels : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_backend();
    cudasim::take_reports();
    (void)cudaGetLastError();
  }
  void TearDown() override {
    cudasim::set_block_filter(nullptr);
    EXPECT_EQ(cudasim::report_count(), 0u) << cudasim::reports_text();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    cudasim::take_reports();
  }
  DType dt() const { return GetParam(); }

  std::vector<float> random_values(int64_t n, float lo, float hi) {
    std::mt19937 gen(next_seed_++);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(gen);
    return v;
  }
  // Device copy of the cpu tensor's storage bits.
  std::shared_ptr<DeviceBuffer> to_device(const Tensor& t) {
    auto g = std::make_shared<DeviceBuffer>(t.bytes());
    EXPECT_EQ(cudaMemcpy(g->ptr, t.data(), t.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    return g;
  }
  Both with_values(const Shape& shape, DType d, const std::vector<float>& host) {
    Tensor c = cpu_->empty(shape, d);
    cpu_->upload(host.data(), c);
    return Both{c, to_device(c)};
  }
  Both random(const Shape& shape, DType d, float lo = -1.f, float hi = 1.f) {
    return with_values(shape, d, random_values(shape_numel(shape), lo, hi));
  }
  // An output: NaN (u8: 171) on the cpu, fresh (NaN-poisoned) memory on the device.
  Both output(const Shape& shape, DType d) {
    const float poison = d == DType::u8 ? 171.f : std::numeric_limits<float>::quiet_NaN();
    Tensor c = cpu_->empty(shape, d);
    const std::vector<float> p(static_cast<size_t>(shape_numel(shape)), poison);
    cpu_->upload(p.data(), c);
    return Both{c, std::make_shared<DeviceBuffer>(c.bytes())};
  }
  // Elements [begin, end) of the device's values, widened like the cpu backend widens its own.
  std::vector<float> device_values(const Both& t, int64_t begin, int64_t end) {
    Tensor tmp = cpu_->empty({end - begin}, t.c.dtype());
    const size_t esz = t.c.element_size();
    EXPECT_EQ(cudaMemcpy(tmp.data(), static_cast<const char*>(t.dev()) + begin * esz, tmp.bytes(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return cpu_values(tmp);
  }
  std::vector<float> cpu_values(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    cpu_->download(t, v.data());
    return v;
  }

  // |sim - cpu| <= atol + rtol |cpu| over elements [begin, end) (all by default); NaN fails.
  void expect_close(const Both& t, Tol tol, const std::string& what, int64_t begin = 0, int64_t end = -1) {
    if (end < 0) end = t.c.numel();
    const std::vector<float> g = device_values(t, begin, end);
    const std::vector<float> c = cpu_values(t.c.view({t.c.numel()}).rows(begin, end));
    size_t worst_at = 0;
    double worst = -1;
    for (size_t i = 0; i < g.size(); ++i) {
      const double ref = c[i], got = g[i];
      // equal values are exact, infinities included (lse -inf of a row that sees no key)
      const double err = got == ref ? 0.0 : std::fabs(got - ref), bound = tol.atol + tol.rtol * std::fabs(ref);
      const double ratio = std::isnan(err) ? INFINITY : (err == 0 ? 0 : (bound > 0 ? err / bound : INFINITY));
      if (ratio > worst) {
        worst = ratio;
        worst_at = i;
      }
    }
    ASSERT_FALSE(g.empty()) << what;
    EXPECT_LE(worst, 1.0) << what << ": worst element " << begin + static_cast<int64_t>(worst_at) << ": sim "
                          << g[worst_at] << " cpu " << c[worst_at] << " (atol " << tol.atol << ", rtol " << tol.rtol
                          << ")";
  }
  void expect_bits_equal(const Both& t, const std::string& what) {
    std::vector<unsigned char> g(t.c.bytes());
    ASSERT_EQ(cudaMemcpy(g.data(), t.dev(), g.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    const unsigned char* c = static_cast<const unsigned char*>(t.c.data());
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i] != c[i] && diff++ == 0) first = i;
    EXPECT_EQ(diff, 0u) << what << ": " << diff << " bytes differ, the first at byte " << first;
  }
  std::string name(const std::string& what) const { return what + " " + dtype_name(dt()); }

  std::unique_ptr<Backend> cpu_;
  uint32_t next_seed_ = 1;
};

// ---- LayerNorm -----------------------------------------------------------------------------

TEST_P(SimKernels, LayerNormForwardBackward) {
  // 45 columns: the scalar path; 200: the 16-byte vector path; 150 rows: three column chunks.
  const std::pair<int64_t, int64_t> shapes[] = {{37, 45}, {13, 200}, {150, 24}};
  for (auto [rows, cols] : shapes) {
    const std::string what = name(std::to_string(rows) + "x" + std::to_string(cols));
    Both x = random({rows, cols}, dt(), -2.f, 3.f), w = random({cols}, dt(), 0.5f, 1.5f), b = random({cols}, dt());
    Both y = output({rows, cols}, dt()), mean = output({rows}, DType::fp32), rstd = output({rows}, DType::fp32);
    cuda::layernorm_fwd(dt(), x.dev(), w.dev(), b.dev(), 1e-5f, y.dev(), mean.devf(), rstd.devf(), rows, cols, nullptr);
    cpu_->layernorm_fwd(x.c, w.c, b.c, 1e-5f, y.c, mean.c, rstd.c);
    expect_close(y, tol_for(dt()), "layernorm_fwd y " + what);
    expect_close(mean, {1e-5, 1e-5}, "layernorm_fwd mean " + what);
    expect_close(rstd, {1e-5, 1e-5}, "layernorm_fwd rstd " + what);

    // Both read the same statistics (the cpu's): only the backward is compared.
    Both mean_ref = with_values({rows}, DType::fp32, cpu_values(mean.c));
    Both rstd_ref = with_values({rows}, DType::fp32, cpu_values(rstd.c));
    Both dy = random({rows, cols}, dt());
    Both dx = output({rows, cols}, dt()), dw = output({cols}, dt()), db = output({cols}, dt());
    DeviceBuffer ws(static_cast<size_t>(cuda::layernorm_bwd_workspace_floats(rows, cols)) * sizeof(float));
    cuda::layernorm_bwd(dt(), dy.dev(), x.dev(), w.dev(), mean_ref.devf(), rstd_ref.devf(), dx.dev(), dw.dev(),
                        db.dev(), ws.as<float>(), rows, cols, nullptr);
    cpu_->layernorm_bwd(dy.c, x.c, w.c, mean_ref.c, rstd_ref.c, dx.c, dw.c, db.c);
    Tol t = tol_for(dt());
    if (dt() == DType::fp32) t = {1e-4, 1e-5};  // dx cancels terms; dw/db sum many rows in another order
    expect_close(dx, t, "layernorm_bwd dx " + what);
    expect_close(dw, t, "layernorm_bwd dweight " + what);
    expect_close(db, t, "layernorm_bwd dbias " + what);
  }
}

// ---- causal softmax ------------------------------------------------------------------------

TEST_P(SimKernels, CausalSoftmaxForwardBackward) {
  // Register-cached rows of single elements (37, 300 columns: kItems 1, 2) and of 16-byte
  // packs (40: a pack holds the diagonal in most rows; 2064: 2 packs a thread in bf16/fp16, 4
  // in fp32, whose blocks of a few rows run: the first, the middle and the last two).
  struct Case {
    int64_t batch, s;
    std::vector<int64_t> rows;  // the rows that run and are compared; empty: all
  };
  const Case cases[] = {{3, 37, {}}, {1, 300, {}}, {2, 40, {}}, {1, 2064, {0, 1, 1035, 2062, 2063}}};
  for (const Case& k : cases) {
    const int64_t batch = k.batch, s = k.s;
    const std::string what = name("[" + std::to_string(batch) + ", " + std::to_string(s) + ", " + std::to_string(s) + "]");
    if (!k.rows.empty())
      cudasim::set_block_filter([&](uint64_t b) {
        for (int64_t r : k.rows)
          if (static_cast<uint64_t>(r) == b) return true;
        return false;
      });
    auto compare = [&](const Both& t, const std::string& op) {
      if (k.rows.empty()) return expect_close(t, tol_for(dt()), op + " " + what);
      for (int64_t r : k.rows) expect_close(t, tol_for(dt()), op + " " + what + " row " + std::to_string(r), r * s, (r + 1) * s);
    };
    Both scores = random({batch, s, s}, dt(), -4.f, 4.f), probs = output({batch, s, s}, dt());
    cuda::softmax_causal_fwd(dt(), scores.dev(), probs.dev(), batch * s, s, s, {}, nullptr);
    cpu_->softmax_causal_fwd(scores.c, probs.c);
    compare(probs, "softmax fwd");
    Both probs_ref = with_values({batch, s, s}, dt(), cpu_values(probs.c));
    Both dprobs = random({batch, s, s}, dt()), dscores = output({batch, s, s}, dt());
    cuda::softmax_causal_bwd(dt(), dprobs.dev(), probs_ref.dev(), dscores.dev(), batch * s, s, s, {}, nullptr);
    cpu_->softmax_causal_bwd(dprobs.c, probs_ref.c, dscores.c);
    compare(dscores, "softmax bwd");
    cudasim::set_block_filter(nullptr);
  }
}

TEST_P(SimKernels, CausalSoftmaxOfRowsPlacedInALongerSequence) {
  // [B, R, C] scores of R rows placed in a sequence of C columns: a context-parallel rank's two
  // chunks (c = 5, 10, 75 of T = 4c: element by element, 16-byte packs, two items a thread)
  // and one run at an offset; row i sees the columns up to its position.
  struct Case {
    int64_t R, C;
    SeqPositions rows;
  };
  const Case cases[] = {{10, 20, rank_positions(5, 2, 0)}, {10, 20, rank_positions(5, 2, 1)},
                        {20, 40, rank_positions(10, 2, 1)}, {150, 300, rank_positions(75, 2, 0)},
                        {7, 20, SeqPositions::run(13)}};
  const int64_t batch = 2;
  for (const Case& k : cases) {
    const std::string what = name("[" + std::to_string(batch) + ", " + std::to_string(k.R) + ", " +
                                  std::to_string(k.C) + "] from position " + std::to_string(k.rows.first));
    const Shape shape = {batch, k.R, k.C};
    Both scores = random(shape, dt(), -4.f, 4.f), probs = output(shape, dt());
    cuda::softmax_causal_fwd(dt(), scores.dev(), probs.dev(), batch * k.R, k.R, k.C, k.rows, nullptr);
    cpu_->softmax_causal_fwd(scores.c, probs.c, k.rows);
    expect_close(probs, tol_for(dt()), "softmax fwd " + what);
    Both probs_ref = with_values(shape, dt(), cpu_values(probs.c));
    Both dprobs = random(shape, dt()), dscores = output(shape, dt());
    cuda::softmax_causal_bwd(dt(), dprobs.dev(), probs_ref.dev(), dscores.dev(), batch * k.R, k.R, k.C, k.rows,
                             nullptr);
    cpu_->softmax_causal_bwd(dprobs.c, probs_ref.c, dscores.c, k.rows);
    expect_close(dscores, tol_for(dt()), "softmax bwd " + what);
  }
}

class SimLongRows : public SimKernels {};

TEST_P(SimLongRows, CausalSoftmax) {
  // S > 256 * 32 takes the online (long-row) kernels: 8193 element by element, 8196 in
  // 16-byte packs (4 fp32). The cpu computes all S rows; the simulator runs the blocks of a
  // few rows (the first, the middle, the two longest) and only those rows are compared. 67M
  // elements per tensor on the cpu: fp32 only (the dtype conversions are the same code as in
  // the short-row kernels, tested in every dtype).
  for (const int64_t s : {int64_t{8193}, int64_t{8196}}) {
    const std::vector<int64_t> rows = {0, 1, 4100, s - 2, s - 1};
    cudasim::set_block_filter([&](uint64_t b) {
      for (int64_t r : rows)
        if (static_cast<uint64_t>(r) == b) return true;
      return false;
    });
    auto fill = [&](const Tensor& t, uint32_t seed, float lo, float hi) {
      // Small-integer multiples of 1/64: exact in every dtype, so one float fills any storage.
      std::vector<float> row(static_cast<size_t>(s));
      for (int64_t r = 0; r < s; ++r) {
        for (int64_t j = 0; j < s; ++j) {
          uint32_t h = static_cast<uint32_t>(r * 2654435761u) ^ static_cast<uint32_t>(j * 40503u) ^ (seed * 97u);
          h ^= h >> 15;
          h *= 2246822519u;
          h ^= h >> 13;
          row[static_cast<size_t>(j)] = lo + (hi - lo) * static_cast<float>(h % 1024) / 1024.f;
        }
        cpu_->upload(row.data(), t.view({s, s}).rows(r, r + 1));
      }
    };
    Tensor scores_c = cpu_->empty({1, s, s}, dt());
    fill(scores_c, 1, -4.f, 4.f);
    Both scores{scores_c, to_device(scores_c)};
    Both probs{cpu_->empty({1, s, s}, dt()), std::make_shared<DeviceBuffer>(scores_c.bytes())};
    cuda::softmax_causal_fwd(dt(), scores.dev(), probs.dev(), s, s, s, {}, nullptr);
    cpu_->softmax_causal_fwd(scores.c, probs.c);
    for (int64_t r : rows) expect_close(probs, tol_for(dt()), name("softmax fwd long row " + std::to_string(r)), r * s, (r + 1) * s);
    scores = Both{};

    Tensor dprobs_c = cpu_->empty({1, s, s}, dt());
    fill(dprobs_c, 2, -1.f, 1.f);
    Both dprobs{dprobs_c, to_device(dprobs_c)};
    Both probs_ref{probs.c, to_device(probs.c)};
    probs = Both{};
    Both dscores{cpu_->empty({1, s, s}, dt()), std::make_shared<DeviceBuffer>(dprobs_c.bytes())};
    cuda::softmax_causal_bwd(dt(), dprobs.dev(), probs_ref.dev(), dscores.dev(), s, s, s, {}, nullptr);
    cpu_->softmax_causal_bwd(dprobs.c, probs_ref.c, dscores.c);
    for (int64_t r : rows)
      expect_close(dscores, tol_for(dt()), name("softmax bwd long row " + std::to_string(r)), r * s, (r + 1) * s);
    cudasim::set_block_filter(nullptr);
  }
}

// ---- dropout -------------------------------------------------------------------------------

TEST_P(SimKernels, DropoutMasksBitwiseEqual) {
  // inner 37: one Philox call per element; inner 36: groups of four; inner 40: 16-byte packs
  // (8 or 4 elements, one or two Philox calls); p = 0: no words drawn. dropout_bwd takes
  // 16-byte packs for every n (555 and 540: a tail of 3 or 4 elements in bf16/fp16).
  for (int64_t inner : {37, 36, 40})
    for (float p : {0.f, 0.1f, 0.5f}) {
      const DropoutSpec spec = make_spec(p, 3, 5, 11, 4, inner, kSiteAttnProbs);
      const Shape shape = {3, 5, inner};
      const std::string what = name("inner " + std::to_string(inner) + " p " + std::to_string(p));
      Both x = random(shape, dt()), y = output(shape, dt()), mask = output(shape, DType::u8);
      cuda::dropout_fwd(dt(), x.dev(), spec, y.dev(), mask.devu8(), nullptr);
      cpu_->dropout_fwd(x.c, spec, y.c, mask.c);
      expect_bits_equal(mask, "dropout mask " + what);
      expect_close(y, tol_for(dt()), "dropout y " + what);

      Both dy = random(shape, dt()), dx = output(shape, dt());
      cuda::dropout_bwd(dt(), dy.dev(), mask.devu8(), spec.scale(), dx.dev(), spec.numel(), nullptr);
      cpu_->dropout_bwd(dy.c, mask.c, p, dx.c);
      expect_close(dx, tol_for(dt()), "dropout_bwd " + what);
    }
}

TEST_P(SimKernels, DropoutOfRowsPlacedInALongerSequence) {
  // A rank's [2c, T] probability rows of 2 heads, whose inner elements are two runs of each
  // head's T * T: the canonical index jumps at the split. c * T = 64: 16-byte packs (runs start
  // at multiples of 8); 100: packs of 4 in bf16/fp16 (a run starts at 4 mod 8), 16-byte in fp32;
  // 36: groups of four; 39: one word per element. Masks bit for bit, through dropout_fwd and
  // bias + dropout + residual (rows of T columns: the cursor steps a row at a time across the
  // split).
  const std::pair<int64_t, int64_t> shapes[] = {{4, 16}, {5, 20}, {3, 12}, {3, 13}};
  for (auto [c, T] : shapes)
    for (int64_t rank : {0, 1})
      for (float p : {0.1f, 0.5f}) {
        const int64_t heads = 2, C = 2;
        const DropoutSpec spec = rank_rows_spec(p, heads, c, C, rank, T);
        const Shape shape = {heads, 2 * c, T};
        const std::string what = name("c " + std::to_string(c) + " T " + std::to_string(T) + " rank " +
                                      std::to_string(rank) + " p " + std::to_string(p));
        Both x = random(shape, dt()), y = output(shape, dt()), mask = output(shape, DType::u8);
        cuda::dropout_fwd(dt(), x.dev(), spec, y.dev(), mask.devu8(), nullptr);
        cpu_->dropout_fwd(x.c, spec, y.c, mask.c);
        expect_bits_equal(mask, "dropout mask " + what);
        expect_close(y, tol_for(dt()), "dropout y " + what);

        const int64_t rows = heads * 2 * c;
        Both xr = random({rows, T}, dt()), bias = random({T}, dt()), res = random({rows, T}, dt());
        Both out = output({rows, T}, dt()), mask_r = output({rows, T}, DType::u8);
        cuda::bias_dropout_residual_fwd(dt(), xr.dev(), bias.dev(), res.dev(), spec, out.dev(), mask_r.devu8(), rows,
                                        T, nullptr);
        cpu_->bias_dropout_residual_fwd(xr.c, bias.c, res.c, spec, out.c, mask_r.c);
        expect_bits_equal(mask_r, "bias_dropout_residual mask " + what);
        expect_close(out, tol_for(dt()), "bias_dropout_residual out " + what);

        Both out2 = output({rows, T}, dt()), mask2 = output({rows, T}, DType::u8);
        cuda::bias_dropout_residual_fwd(dt(), xr.dev(), nullptr, res.dev(), spec, out2.dev(), mask2.devu8(), 1,
                                        rows * T, nullptr);
        cpu_->bias_dropout_residual_fwd(xr.c, Tensor(), res.c, spec, out2.c, mask2.c);
        expect_bits_equal(mask2, "dropout_residual mask " + what);
        expect_close(out2, tol_for(dt()), "dropout_residual out " + what);
      }
}

// ---- GeLU ----------------------------------------------------------------------------------

TEST_P(SimKernels, GeluForwardBackward) {
  const Shape shape = {37, 123};
  Both x = random(shape, dt(), -5.f, 5.f), y = output(shape, dt());
  cuda::gelu_fwd(dt(), x.dev(), y.dev(), shape_numel(shape), nullptr);
  cpu_->gelu_fwd(x.c, y.c);
  expect_close(y, tol_for(dt()), name("gelu_fwd"));
  Both dy = random(shape, dt()), dx = output(shape, dt());
  cuda::gelu_bwd(dt(), dy.dev(), x.dev(), dx.dev(), shape_numel(shape), nullptr);
  cpu_->gelu_bwd(dy.c, x.c, dx.c);
  expect_close(dx, tol_for(dt()), name("gelu_bwd"));
}

// ---- residual path: bias + dropout + residual, bias add, column reductions, add, scale --------

TEST_P(SimKernels, BiasDropoutResidual) {
  // 56: 16-byte packs; 52: packs in fp32, groups of four element by element in bf16/fp16; 51:
  // one word per element
  for (int64_t cols : {56, 52, 51})
    for (float p : {0.f, 0.2f}) {
      const int64_t rows = 37;
      const DropoutSpec spec = make_spec(p, 1, rows, 3 * rows, rows, cols, kSiteMlpOut);
      const std::string what = name(std::to_string(rows) + "x" + std::to_string(cols) + " p " + std::to_string(p));
      Both x = random({rows, cols}, dt()), bias = random({cols}, dt()), res = random({rows, cols}, dt());
      Both out = output({rows, cols}, dt()), mask = output({rows, cols}, DType::u8);
      cuda::bias_dropout_residual_fwd(dt(), x.dev(), bias.dev(), res.dev(), spec, out.dev(), mask.devu8(), rows, cols,
                                      nullptr);
      cpu_->bias_dropout_residual_fwd(x.c, bias.c, res.c, spec, out.c, mask.c);
      expect_bits_equal(mask, "bias_dropout_residual mask " + what);
      expect_close(out, tol_for(dt()), "bias_dropout_residual out " + what);

      // Without a bias (the cuda backend passes the elements as one row).
      Both out2 = output({rows, cols}, dt()), mask2 = output({rows, cols}, DType::u8);
      cuda::bias_dropout_residual_fwd(dt(), x.dev(), nullptr, res.dev(), spec, out2.dev(), mask2.devu8(), 1,
                                      rows * cols, nullptr);
      cpu_->bias_dropout_residual_fwd(x.c, Tensor(), res.c, spec, out2.c, mask2.c);
      expect_bits_equal(mask2, "dropout_residual mask " + what);
      expect_close(out2, tol_for(dt()), "dropout_residual out " + what);
    }
}

TEST_P(SimKernels, AddBiasAndColumnReductions) {
  for (int64_t rows : {1, 111, 333})  // 333 rows: two chunks of the two-stage column sums
    for (int64_t cols : {45, 70, 72}) {  // 72: 16-byte packs
      const std::string what = name(std::to_string(rows) + "x" + std::to_string(cols));
      Both y = random({rows, cols}, dt()), bias = random({cols}, dt());
      cuda::add_bias(dt(), y.dev(), bias.dev(), rows, cols, nullptr);
      cpu_->add_bias(y.c, bias.c);
      expect_close(y, tol_for(dt()), "add_bias " + what);

      Both dy = random({rows, cols}, dt()), db = output({cols}, dt());
      DeviceBuffer ws(static_cast<size_t>(cuda::bias_grad_workspace_floats(rows, cols)) * sizeof(float));
      cuda::bias_grad(dt(), dy.dev(), db.dev(), ws.as<float>(), rows, cols, nullptr);
      cpu_->bias_grad(dy.c, db.c);
      Tol t = tol_for(dt());
      if (dt() == DType::fp32) t = {1e-4, 1e-5};  // sums of many terms in another order
      expect_close(db, t, "bias_grad " + what);
    }
}

TEST_P(SimKernels, AddInplaceAndScaleInplace) {
  const Shape shape = {29, 31};
  const int64_t n = shape_numel(shape);
  Both dst = random(shape, dt()), src = random(shape, dt());
  cuda::add_inplace(dt(), dst.dev(), src.dev(), n, nullptr);
  cpu_->add_inplace(dst.c, src.c);
  expect_close(dst, tol_for(dt()), name("add_inplace"));
  // From element 1: not 16-byte aligned, element by element.
  auto from_1 = [&](const Both& t) { return static_cast<char*>(t.dev()) + dtype_size(dt()); };
  Both dst1 = random(shape, dt()), src1 = random(shape, dt());
  cuda::add_inplace(dt(), from_1(dst1), from_1(src1), n - 1, nullptr);
  cpu_->add_inplace(dst1.c.view({n}).rows(1, n), src1.c.view({n}).rows(1, n));
  expect_close(dst1, tol_for(dt()), name("add_inplace from element 1"));
  Both c1 = random({n}, dt());
  cuda::scale_inplace(dt(), from_1(c1), 0.5f, n - 1, nullptr);
  Both a1 = random({n - 1, 0}, dt()), b1 = random({0, 1}, dt());
  cpu_->gemm(gemm_args(false, false, n - 1, 1, 0, 1, 1.f, 0.5f), a1.c, b1.c, c1.c.view({n}).rows(1, n).view({n - 1, 1}));
  expect_close(c1, tol_for(dt()), name("scale_inplace from element 1"));
  // scale_inplace is the GEMM with k = 0: C = beta C (beta = 0 writes zeros, whatever C held).
  for (float beta : {0.5f, -1.25f, 0.f}) {
    Both c = random({n}, dt());
    Both a = random({n, 0}, dt()), b = random({0, 1}, dt());
    cuda::scale_inplace(dt(), c.dev(), beta, n, nullptr);
    cpu_->gemm(gemm_args(false, false, n, 1, 0, 1, 1.f, beta), a.c, b.c, c.c.view({n, 1}));
    expect_close(c, tol_for(dt()), name("scale_inplace beta " + std::to_string(beta)));
  }
}

// ---- the llama family: RMSNorm, RoPE, SwiGLU -----------------------------------------------

TEST_P(SimKernels, RmsNormForwardBackward) {
  // 45: one partial warp per row; 200: one block-stride pass; 600: rows wider than the block
  // (256 threads), so each thread sums several columns; 150 rows: several column chunks of dweight.
  const std::pair<int64_t, int64_t> shapes[] = {{37, 45}, {13, 200}, {5, 600}, {150, 24}};
  for (auto [rows, cols] : shapes) {
    const std::string what = name(std::to_string(rows) + "x" + std::to_string(cols));
    Both x = random({rows, cols}, dt(), -2.f, 3.f), w = random({cols}, dt(), 0.5f, 1.5f);
    Both y = output({rows, cols}, dt()), rstd = output({rows}, DType::fp32);
    cuda::rmsnorm_fwd(dt(), x.dev(), w.dev(), 1e-5f, y.dev(), rstd.devf(), rows, cols, nullptr);
    cpu_->rmsnorm_fwd(x.c, w.c, 1e-5f, y.c, rstd.c);
    expect_close(y, tol_for(dt()), "rmsnorm_fwd y " + what);
    expect_close(rstd, {1e-5, 1e-5}, "rmsnorm_fwd rstd " + what);

    // Both read the cpu's rstd: only the backward is compared.
    Both rstd_ref = with_values({rows}, DType::fp32, cpu_values(rstd.c));
    Both dy = random({rows, cols}, dt());
    Both dx = output({rows, cols}, dt()), dw = output({cols}, dt());
    DeviceBuffer ws(static_cast<size_t>(cuda::rmsnorm_bwd_workspace_floats(rows, cols)) * sizeof(float));
    cuda::rmsnorm_bwd(dt(), dy.dev(), x.dev(), w.dev(), rstd_ref.devf(), dx.dev(), dw.dev(), ws.as<float>(), rows, cols,
                      nullptr);
    cpu_->rmsnorm_bwd(dy.c, x.c, w.c, rstd_ref.c, dx.c, dw.c);
    Tol t = tol_for(dt());
    if (dt() == DType::fp32) t = {1e-4, 1e-5};  // dx cancels terms; dweight sums many rows in another order
    expect_close(dx, t, "rmsnorm_bwd dx " + what);
    expect_close(dw, t, "rmsnorm_bwd dweight " + what);

    // dx may alias dy (the layer reuses the gradient buffer): same results in place.
    Both dy_inplace = with_values({rows, cols}, dt(), cpu_values(dy.c));
    Both dw2 = output({cols}, dt());
    cuda::rmsnorm_bwd(dt(), dy_inplace.dev(), x.dev(), w.dev(), rstd_ref.devf(), dy_inplace.dev(), dw2.dev(),
                      ws.as<float>(), rows, cols, nullptr);
    dy_inplace.c = dx.c;
    dw2.c = dw.c;
    expect_close(dy_inplace, t, "rmsnorm_bwd dx in place of dy " + what);
    expect_close(dw2, t, "rmsnorm_bwd dweight (dx in place of dy) " + what);
  }
}

TEST_P(SimKernels, RopeForwardAndInverse) {
  // D = 72 and 6 (even, not powers of two); S = 37 positions; theta 10^4 and llama-3's 5·10^5.
  struct Case {
    int64_t B, NH, S, D;
    double theta;
  };
  const Case cases[] = {{2, 3, 37, 72, 10000.0}, {3, 2, 11, 6, 500000.0}};
  for (const Case& cs : cases) {
    const std::string what = name("B=" + std::to_string(cs.B) + " NH=" + std::to_string(cs.NH) +
                                  " S=" + std::to_string(cs.S) + " D=" + std::to_string(cs.D));
    const Shape shape = {cs.B, cs.NH, cs.S, cs.D};
    const int64_t rows = cs.B * cs.NH * cs.S;
    Both x = random(shape, dt(), -2.f, 2.f), y = output(shape, dt());
    cuda::rope(dt(), x.dev(), y.dev(), rows, cs.S, cs.D, cs.D, cs.theta, /*inverse=*/false, {}, nullptr);
    cpu_->rope_fwd(x.c, cs.theta, cs.D, y.c);
    expect_close(y, tol_for(dt()), "rope_fwd " + what);
    // The inverse in place (dx = dy), as the backward runs it, on the same values on both sides.
    Both d = random(shape, dt(), -2.f, 2.f);
    cuda::rope(dt(), d.dev(), d.dev(), rows, cs.S, cs.D, cs.D, cs.theta, /*inverse=*/true, {}, nullptr);
    cpu_->rope_bwd(d.c, cs.theta, cs.D, d.c);
    expect_close(d, tol_for(dt()), "rope_bwd in place " + what);
  }
}

TEST_P(SimKernels, RopeOfRowsPlacedInALongerSequence) {
  // A context-parallel rank's two chunks of 18 rows in a sequence of 2 * 2 * 18, and of 5 rows in
  // one of 100000 positions (angles of 10^5 radians), the first 64 of 72 dims rotated.
  struct Case {
    int64_t c, C, rank, R;
  };
  const Case cases[] = {{18, 2, 1, 72}, {5, 10000, 3, 64}};
  for (const Case& cs : cases) {
    const int64_t B = 2, NH = 3, S = 2 * cs.c, D = 72;
    const SeqPositions pos = rank_positions(cs.c, cs.C, cs.rank);
    const std::string what = name("c=" + std::to_string(cs.c) + " C=" + std::to_string(cs.C) + " R=" +
                                  std::to_string(cs.R));
    const Shape shape = {B, NH, S, D};
    Both x = random(shape, dt(), -2.f, 2.f), y = output(shape, dt());
    cuda::rope(dt(), x.dev(), y.dev(), B * NH * S, S, D, cs.R, 500000.0, /*inverse=*/false, pos, nullptr);
    cpu_->rope_fwd(x.c, 500000.0, cs.R, y.c, pos);
    expect_close(y, tol_for(dt()), "rope_fwd " + what);
    Both d = random(shape, dt(), -2.f, 2.f);
    cuda::rope(dt(), d.dev(), d.dev(), B * NH * S, S, D, cs.R, 500000.0, /*inverse=*/true, pos, nullptr);
    cpu_->rope_bwd(d.c, 500000.0, cs.R, d.c, pos);
    expect_close(d, tol_for(dt()), "rope_bwd in place " + what);
  }
}

TEST_P(SimKernels, SwigluForwardBackward) {
  const int64_t M = 37, N = 45;
  Both x = random({M, 2 * N}, dt(), -4.f, 4.f), y = output({M, N}, dt());
  cuda::swiglu_fwd(dt(), x.dev(), y.dev(), M, N, nullptr);
  cpu_->swiglu_fwd(x.c, y.c);
  expect_close(y, tol_for(dt()), name("swiglu_fwd"));
  Both dy = random({M, N}, dt()), dx = output({M, 2 * N}, dt());
  cuda::swiglu_bwd(dt(), dy.dev(), x.dev(), dx.dev(), M, N, nullptr);
  cpu_->swiglu_bwd(dy.c, x.c, dx.c);
  expect_close(dx, tol_for(dt()), name("swiglu_bwd"));
}

// ---- mixture of experts (moe.cu) ------------------------------------------------------------


// Routing (a warp per token, choices by warp argmax, the aux loss's two-stage reduction) and
// its backward: DeepSeek-V3's sigmoid with groups and bias, and softmax top-3 of 40.
TEST_P(SimKernels, MoeRouteForwardBackward) {
  const int64_t T = 19;
  struct Case {
    MoeRouting r;
    int64_t E;
    bool bias;
  };
  for (const Case& c : {Case{moe_routing(MoeRouting::Score::sigmoid, 4, true, 2.5f, 4, 2), 48, true},
                        Case{moe_routing(MoeRouting::Score::softmax, 3, false, 1.f, 1, 1), 40, false}}) {
    const int64_t E = c.E, k = c.r.top_k;
    Both logits = random({T, E}, dt(), -3.f, 3.f), bias = random({E}, dt(), -0.2f, 0.2f);
    Both scores = output({T, E}, dt()), weight = output({T, k}, dt()), aux = output({1}, DType::fp32);
    Both index = with_values({T, k}, DType::i32, std::vector<float>(static_cast<size_t>(T * k), 12345.f));
    DeviceBuffer ws(static_cast<size_t>(cuda::moe_route_workspace_floats(T, E)) * sizeof(float));
    cuda::moe_route(dt(), logits.dev(), c.bias ? bias.dev() : nullptr, T, E, c.r, scores.dev(),
                    index.g->as<int32_t>(), weight.dev(), aux.devf(), ws.as<float>(), nullptr);
    cpu_->moe_route(logits.c, c.bias ? bias.c : Tensor(), c.r, scores.c, index.c, weight.c, aux.c);
    expect_bits_equal(index, name("moe_route topk_index"));
    expect_close(scores, tol_for(dt()), name("moe_route scores"));
    expect_close(weight, tol_for(dt()), name("moe_route topk_weight"));
    expect_close(aux, {1e-5, 1e-5}, name("moe_route aux_loss"));

    Both d_weight = random({T, k}, dt()), d_logits = output({T, E}, dt());
    cuda::moe_route_bwd(dt(), d_weight.dev(), scores.dev(), index.g->as<int32_t>(), T, E, c.r, d_logits.dev(),
                        nullptr);
    cpu_->moe_route_bwd(d_weight.c, scores.c, index.c, c.r, d_logits.c);
    expect_close(d_logits, tol_for(dt()), name("moe_route_bwd"));
  }
}

// The dispatch plan (three passes over chunks of 256 pairs: 600 pairs here), dropless and with
// capacity dropping, then permute (bit for bit) and the combine with both backwards.
TEST_P(SimKernels, MoeDispatchPermuteCombine) {
  const int64_t T = 300, k = 2, E = 7, h = 13;
  Both logits = random({T, E}, DType::fp32, -2.f, 2.f), scores = output({T, E}, DType::fp32);
  Both weights = output({T, k}, DType::fp32);
  Tensor index = cpu_->empty({T, k}, DType::i32);
  const MoeRouting r = moe_routing(MoeRouting::Score::softmax, k, true, 1.f, 1, 1);
  cpu_->moe_route(logits.c, Tensor(), r, scores.c, index, weights.c, Tensor());
  auto dev_index = to_device(index);
  for (int64_t capacity : {int64_t{-1}, moe_expert_capacity(T, k, E, 0.5)}) {
    const std::string cf = capacity < 0 ? " dropless" : " capacity " + std::to_string(capacity);
    auto i32 = [&](const Shape& shape) {
      return with_values(shape, DType::i32, std::vector<float>(static_cast<size_t>(shape_numel(shape)), 12345.f));
    };
    Both tpe = i32({E}), row_slot = i32({T * k}), slot_row = i32({T, k});
    DeviceBuffer ws(static_cast<size_t>(cuda::moe_dispatch_workspace_ints(T, k, E)) * sizeof(int32_t));
    cuda::moe_dispatch(dev_index->as<int32_t>(), T, k, E, capacity, tpe.g->as<int32_t>(), row_slot.g->as<int32_t>(),
                       slot_row.g->as<int32_t>(), ws.as<int32_t>(), nullptr);
    const MoeDispatch plan{tpe.c, row_slot.c, slot_row.c};
    cpu_->moe_dispatch(index, capacity < 0 ? std::nullopt : std::optional<double>(0.5), plan);
    expect_bits_equal(tpe, name("moe_dispatch tokens_per_expert" + cf));
    expect_bits_equal(row_slot, name("moe_dispatch row_slot" + cf));
    expect_bits_equal(slot_row, name("moe_dispatch slot_row" + cf));
    int64_t N = 0;
    for (float n : cpu_values(tpe.c)) N += static_cast<int64_t>(n);
    if (capacity >= 0) {
      EXPECT_LT(N, T * k) << "capacity 0.5 drops nothing: the case tests nothing";
    }

    Both x = random({T, h}, dt()), permuted = output({N, h}, dt());
    cuda::moe_permute(x.c.element_size(), x.dev(), row_slot.g->as<int32_t>(), N, T, k, h, permuted.dev(), nullptr);
    cpu_->moe_permute(x.c, plan, permuted.c);
    expect_bits_equal(permuted, name("moe_permute" + cf));

    Both d_perm = random({N, h}, dt()), dx = output({T, h}, dt());
    cuda::moe_permute_bwd(dt(), d_perm.dev(), slot_row.g->as<int32_t>(), N, T, k, h, dx.dev(), nullptr);
    cpu_->moe_permute_bwd(d_perm.c, plan, dx.c);
    expect_close(dx, tol_for(dt()), name("moe_permute_bwd" + cf));

    Both y = random({N, h}, dt()), w = random({T, k}, dt(), 0.f, 1.f), out = output({T, h}, dt());
    cuda::moe_unpermute(dt(), y.dev(), slot_row.g->as<int32_t>(), w.dev(), N, T, k, h, out.dev(), nullptr);
    cpu_->moe_unpermute(y.c, plan, w.c, out.c);
    expect_close(out, tol_for(dt()), name("moe_unpermute" + cf));

    Both d_out = random({T, h}, dt()), dy = output({N, h}, dt()), dw = output({T, k}, dt());
    cuda::moe_unpermute_bwd(dt(), d_out.dev(), y.dev(), slot_row.g->as<int32_t>(), w.dev(), N, T, k, h, dy.dev(),
                            dw.dev(), nullptr);
    cpu_->moe_unpermute_bwd(d_out.c, y.c, plan, w.c, dy.c, dw.c);
    expect_close(dy, tol_for(dt()), name("moe_unpermute_bwd dy" + cf));
    expect_close(dw, tol_for(dt()), name("moe_unpermute_bwd d_topk_weight" + cf));
  }
}

TEST_P(SimKernels, MoeWeightRowsForwardBackwardInPlaceToo) {
  // The routing weights into the experts' rows: widths of one block stride and several, and
  // backward in place (dx the x it reads), as the layer runs it.
  const int64_t N = 37;
  for (int64_t w : {int64_t{9}, int64_t{600}}) {
    const std::string wide = " w " + std::to_string(w);
    Both x = random({N, w}, dt()), p = random({N, 1}, dt(), 0.f, 1.f), y = output({N, w}, dt());
    cuda::moe_weight_rows(dt(), x.dev(), p.dev(), N, w, y.dev(), nullptr);
    cpu_->moe_weight_rows(x.c, p.c, y.c);
    expect_close(y, tol_for(dt()), name("moe_weight_rows" + wide));
    Both dy = random({N, w}, dt()), dx = output({N, w}, dt()), dp = output({N, 1}, dt());
    cuda::moe_weight_rows_bwd(dt(), dy.dev(), x.dev(), p.dev(), N, w, dx.dev(), dp.dev(), nullptr);
    cpu_->moe_weight_rows_bwd(dy.c, x.c, p.c, dx.c, dp.c);
    expect_close(dx, tol_for(dt()), name("moe_weight_rows_bwd dx" + wide));
    expect_close(dp, tol_for(dt()), name("moe_weight_rows_bwd d_weight" + wide));
    Both dp2 = output({N, 1}, dt());
    cuda::moe_weight_rows_bwd(dt(), dy.dev(), x.dev(), p.dev(), N, w, x.dev(), dp2.dev(), nullptr);
    cpu_->moe_weight_rows_bwd(dy.c, x.c, p.c, x.c, dp2.c);
    expect_close(x, tol_for(dt()), name("moe_weight_rows_bwd in place dx" + wide));
    expect_close(dp2, tol_for(dt()), name("moe_weight_rows_bwd in place d_weight" + wide));
  }
}

// ---- head layout ---------------------------------------------------------------------------

TEST_P(SimKernels, SplitAndMergeHeadsBitwise) {
  const int64_t S = 13, B = 3, NH = 5, D = 7, W = 2 * NH * D + 3, col_offset = NH * D;
  Both sbw = random({S, B, W}, dt()), heads = output({B, NH, S, D}, dt());
  cuda::split_heads(dt(), sbw.dev(), heads.dev(), S, B, W, NH, D, col_offset, nullptr);
  cpu_->split_heads(sbw.c, col_offset, heads.c);
  expect_bits_equal(heads, name("split_heads"));
  // Merge into a buffer whose other columns hold data that must survive.
  Both src = random({B, NH, S, D}, dt()), dst = random({S, B, W}, dt());
  cuda::merge_heads(dt(), src.dev(), dst.dev(), S, B, W, NH, D, col_offset, nullptr);
  cpu_->merge_heads(src.c, col_offset, dst.c);
  expect_bits_equal(dst, name("merge_heads"));
}

TEST_P(SimKernels, CopyRowsBitwise) {
  // Runs of rows between [O, Rs, W] and [O, Rd, W]; the rows of dst outside the run keep their
  // values. W = 8 (16-byte units in bf16/fp16, 32 in fp32), 7 (units of 2 or 4 bytes), 3; from
  // and to the first row and from the middle; u8 (masks) as well as this dtype.
  struct Case {
    int64_t O, Rs, Rd, W, src_row, dst_row, rows;
  };
  const Case cases[] = {{3, 10, 40, 8, 0, 30, 10}, {4, 9, 5, 7, 2, 0, 5}, {2, 33, 70, 3, 5, 37, 28}};
  for (const Case& k : cases)
    for (DType d : {dt(), DType::u8}) {
      const std::string what = name(std::string(dtype_name(d)) + " O=" + std::to_string(k.O) + " W=" +
                                    std::to_string(k.W) + " rows " + std::to_string(k.src_row) + "->" +
                                    std::to_string(k.dst_row));
      const float hi = d == DType::u8 ? 200.f : 1.f;
      Both src = random({k.O, k.Rs, k.W}, d, 0.f, hi), dst = random({k.O, k.Rd, k.W}, d, 0.f, hi);
      if (d == DType::u8) {  // whole bytes: the same on both sides
        for (const Both* t : {&src, &dst}) {
          std::vector<float> v = cpu_values(t->c);
          for (float& e : v) e = std::floor(e);
          cpu_->upload(v.data(), t->c);
          ASSERT_EQ(cudaMemcpy(t->dev(), t->c.data(), t->c.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
        }
      }
      cuda::copy_rows(src.dev(), k.Rs, k.src_row, dst.dev(), k.Rd, k.dst_row, k.rows, k.O,
                      k.W * static_cast<int64_t>(dtype_size(d)), nullptr);
      cpu_->copy_rows(src.c, k.src_row, dst.c, k.dst_row, k.rows);
      expect_bits_equal(dst, "copy_rows " + what);
    }
}

// ---- fused attention -----------------------------------------------------------------------

// Heads 2 .. 2+B of 7 (one tensor-parallel rank's), as the layer describes them.
DropoutSpec attention_spec(float p, int64_t B, int64_t S) { return make_spec(p, 1, B, 7, 2, S * S, kSiteAttnProbs); }

class SimAttention : public SimKernels {
 protected:
  // group > 1: grouped-query attention, k, v, dk, dv hold B / group batches. rows places the
  // S query and Sk key rows in a longer sequence (context parallelism); the backward of both
  // reads the cpu's out and lse (-inf in the rows that see no key).
  void check(int64_t B, int64_t S, int64_t D, const DropoutSpec& spec, int64_t group = 1,
             const AttentionRows& rows = {}, int64_t Sk = -1, const std::string& label = "") {
    if (Sk < 0) Sk = S;
    const Tol tol = dt() == DType::fp32 ? Tol{1e-4, 1e-4} : dt() == DType::fp16 ? Tol{5e-3, 5e-3} : Tol{2e-2, 2e-2};
    const std::string what = name("B=" + std::to_string(B) + " S=" + std::to_string(S) + " Sk=" + std::to_string(Sk) +
                                  " D=" + std::to_string(D) + " p=" + std::to_string(spec.p) +
                                  " inner=" + std::to_string(spec.inner) + " group=" + std::to_string(group) +
                                  (label.empty() ? "" : " " + label));
    const Shape shape = {B, S, D}, kv_shape = {B / group, Sk, D}, row_shape = {B, S};
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Both q = random(shape, dt(), -2.f, 2.f), k = random(kv_shape, dt(), -2.f, 2.f), v = random(kv_shape, dt());
    Both out = output(shape, dt()), lse = output(row_shape, DType::fp32);
    const cuda::AttentionShape dims{B, S, Sk, D, group, rows};
    cuda::attention_fwd(dt(), q.dev(), k.dev(), v.dev(), scale, spec, out.dev(), lse.devf(), dims, nullptr);
    cpu_->attention_fwd(q.c, k.c, v.c, scale, spec, out.c, lse.c, rows);
    expect_close(out, tol, "attention_fwd out " + what);
    expect_close(lse, {1e-4, 1e-5}, "attention_fwd lse " + what);
    // The backward of both reads the cpu's out and lse.
    Both out_ref = with_values(shape, dt(), cpu_values(out.c));
    Both lse_ref = with_values(row_shape, DType::fp32, cpu_values(lse.c));
    Both dout = random(shape, dt());
    Both dq = output(shape, dt()), dk = output(kv_shape, dt()), dv = output(kv_shape, dt());
    DeviceBuffer workspace(static_cast<size_t>(cuda::attention_bwd_workspace_floats(dt(), dims)) * sizeof(float));
    cuda::attention_bwd(dt(), q.dev(), k.dev(), v.dev(), out_ref.dev(), dout.dev(), lse_ref.devf(), scale, spec,
                        dq.dev(), dk.dev(), dv.dev(), workspace.as<float>(), dims, nullptr);
    cpu_->attention_bwd(q.c, k.c, v.c, out_ref.c, dout.c, lse_ref.c, scale, spec, dq.c, dk.c, dv.c, rows);
    expect_close(dq, tol, "attention_bwd dq " + what);
    expect_close(dk, tol, "attention_bwd dk " + what);
    expect_close(dv, tol, "attention_bwd dv " + what);
  }
};

// S = 70: a ragged second query tile of 64 and key tiles of 32 and 64.
TEST_P(SimAttention, HeadDim16) {
  for (float p : {0.f, 0.1f}) check(2, 70, 16, attention_spec(p, 2, 70));
}
TEST_P(SimAttention, HeadDim64) {
  for (float p : {0.f, 0.1f}) check(2, 70, 64, attention_spec(p, 2, 70));
}
TEST_P(SimAttention, HeadDim96) {
  for (float p : {0.f, 0.1f}) check(2, 70, 96, attention_spec(p, 2, 70));
}
TEST_P(SimAttention, HeadDim128) {
  for (float p : {0.f, 0.1f}) check(2, 70, 128, attention_spec(p, 2, 70));
}
TEST_P(SimAttention, HeadDim40AndAnyDropoutLayout) {
  // D = 40 runs padded to 64; a spec whose canonical offset changes inside one head's block
  // (rows of S elements, every other one canonical) takes the kernels' general dropout path.
  const int64_t B = 2, S = 45;
  check(B, S, 40, make_spec(0.2f, B * S, 1, 2, 1, S, kSiteAttnProbs));
}

// Grouped-query attention (llama): 2 and 4 query batches per key/value batch, dk and dv
// summed over the group's queries; S = 70 and 45 leave ragged tiles.
TEST_P(SimAttention, GroupedQueryGroup2HeadDim64) {
  for (float p : {0.f, 0.1f}) check(4, 70, 64, attention_spec(p, 4, 70), 2);
}
TEST_P(SimAttention, GroupedQueryGroup4HeadDim96) {
  for (float p : {0.f, 0.1f}) check(4, 45, 96, attention_spec(p, 4, 45), 4);
}

// Context parallelism (C = 2 ranks, chunks of c = 45 rows, T = 180): a rank's query chunks
// against its own keys, the other rank's (the ring: rank 0's first chunk sees none of rank
// 1's keys, rank 1's keys after its queries form a gap of key tiles), all keys (all-gather,
// Sk = 2 S), and one chunk of keys (Sk = 45 != S); GQA group 2, dropout indexed in [T, T].
TEST_P(SimAttention, ContextParallelRowsGroup2HeadDim64) {
  const int64_t B = 4, c = 45, C = 2, T = 2 * C * c, S = 2 * c;
  const SeqPositions rank0 = rank_positions(c, C, 0), rank1 = rank_positions(c, C, 1);
  struct Case {
    SeqPositions queries, keys;
    int64_t Sk;
    const char* label;
  };
  const Case cases[] = {{rank0, rank0, S, "rank 0 own keys"},
                        {rank0, rank1, S, "rank 0 rank 1's keys"},
                        {rank1, rank0, S, "rank 1 rank 0's keys"},
                        {rank1, SeqPositions{}, T, "rank 1 all keys"},
                        {rank0, SeqPositions::run(2 * c), c, "rank 0 chunk 2's keys"}};
  for (const Case& k : cases)
    for (float p : {0.f, 0.1f})
      check(B, S, 64, make_spec(p, 1, B, 7, 2, T * T, kSiteAttnProbs), 2, AttentionRows{k.queries, k.keys, T}, k.Sk,
            k.label);
}

// Ragged chunks (c = 37) with D = 40 and the general dropout path (a spec whose canonical
// offset changes inside a head's [T, T] block): rank 1's queries against rank 0's keys.
TEST_P(SimAttention, ContextParallelRowsHeadDim40AnyDropoutLayout) {
  const int64_t B = 2, c = 37, C = 2, T = 2 * C * c;
  check(B, 2 * c, 40, make_spec(0.2f, B * T, 1, 2, 1, T, kSiteAttnProbs), 1,
        AttentionRows{rank_positions(c, C, 1), rank_positions(c, C, 0), T}, 2 * c, "rank 1 rank 0's keys");
}

// ---- the tensor-core forward (attention_tc.cu: bf16 and fp16) -------------------------------

// The forward against the cpu backend, out within atol = rtol = 1e-2 (bf16) or 2e-3 (fp16):
// the kernel rounds P to T once before P·V (a relative error of 2^-9 in bf16, 2^-12 in fp16
// per probability, averaging out over the keys) and out once on store (the same again), the
// cpu works in double; lse in fp32 throughout (scores are exact products of T values summed
// in fp32), within 1e-4 + 1e-5·|lse|. With `backward`, the cuda backward then reads this
// forward's out and lse, as the backend runs it, against the cpu's backward of the cpu's
// forward (the backward's own tolerance, 2e-2 / 5e-3, as in SimAttention::check).
class SimAttentionTensorCore : public SimAttention {
 protected:
  struct Case {
    int64_t B, S, D, group = 1;
    float p = 0.f;
    AttentionRows rows = {};
    int64_t Sk = -1;
    std::string label = "";
  };
  void check_tc(const Case& c, bool backward) {
    const int64_t B = c.B, S = c.S, D = c.D, group = c.group, Sk = c.Sk < 0 ? c.S : c.Sk;
    const int64_t T = c.rows.total > 0 ? c.rows.total : S;
    const DropoutSpec spec = make_spec(c.p, 1, B, 7, 2, T * T, kSiteAttnProbs);
    const Tol fwd_tol = dt() == DType::fp16 ? Tol{2e-3, 2e-3} : Tol{1e-2, 1e-2};
    const Tol bwd_tol = dt() == DType::fp16 ? Tol{5e-3, 5e-3} : Tol{2e-2, 2e-2};
    const std::string what = name("B=" + std::to_string(B) + " S=" + std::to_string(S) + " Sk=" + std::to_string(Sk) +
                                  " D=" + std::to_string(D) + " group=" + std::to_string(group) +
                                  " p=" + std::to_string(c.p) + (c.label.empty() ? "" : " " + c.label));
    const Shape shape = {B, S, D}, kv_shape = {B / group, Sk, D}, row_shape = {B, S};
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Both q = random(shape, dt(), -2.f, 2.f), k = random(kv_shape, dt(), -2.f, 2.f), v = random(kv_shape, dt());
    Both out = output(shape, dt()), lse = output(row_shape, DType::fp32);
    const cuda::AttentionShape dims{B, S, Sk, D, group, c.rows};
    cuda::attention_fwd(dt(), q.dev(), k.dev(), v.dev(), scale, spec, out.dev(), lse.devf(), dims, nullptr);
    cpu_->attention_fwd(q.c, k.c, v.c, scale, spec, out.c, lse.c, c.rows);
    expect_close(out, fwd_tol, "attention_fwd out " + what);
    expect_close(lse, {1e-4, 1e-5}, "attention_fwd lse " + what);
    if (!backward) return;
    Both dout = random(shape, dt());
    Both dq = output(shape, dt()), dk = output(kv_shape, dt()), dv = output(kv_shape, dt());
    DeviceBuffer workspace(static_cast<size_t>(cuda::attention_bwd_workspace_floats(dt(), dims)) * sizeof(float));
    cuda::attention_bwd(dt(), q.dev(), k.dev(), v.dev(), out.dev(), dout.dev(), lse.devf(), scale, spec, dq.dev(),
                        dk.dev(), dv.dev(), workspace.as<float>(), dims, nullptr);
    cpu_->attention_bwd(q.c, k.c, v.c, out.c, dout.c, lse.c, scale, spec, dq.c, dk.c, dv.c, c.rows);
    expect_close(dq, bwd_tol, "attention_bwd dq " + what);
    expect_close(dk, bwd_tol, "attention_bwd dk " + what);
    expect_close(dv, bwd_tol, "attention_bwd dv " + what);
  }
  // Every sequence length around the tile of 64 (1, 63, 64, 65, 130, 257), GQA groups 1, 2,
  // 4 and dropout off and on, for head size D.
  void sweep(int64_t D) {
    for (int64_t S : {1, 63, 64, 65, 130, 257})
      for (int64_t group : {1, 2, 4})
        for (float p : {0.f, 0.1f}) check_tc({4, S, D, group, p}, false);
  }
  // The tensor-core backward for head size D: S around its query tiles (32 or 64 rows) and key
  // tiles (64), GQA groups 1, 2, 4 (dK and dV summed over the group), dropout off and on.
  void sweep_backward(int64_t D) {
    for (int64_t S : {1, 33, 70})
      for (int64_t group : {1, 2, 4})
        for (float p : {0.f, 0.1f}) check_tc({4, S, D, group, p}, true);
  }
};

TEST_P(SimAttentionTensorCore, HeadDim64) { sweep(64); }
TEST_P(SimAttentionTensorCore, BackwardHeadDim64) { sweep_backward(64); }
TEST_P(SimAttentionTensorCore, BackwardHeadDim96) { sweep_backward(96); }
TEST_P(SimAttentionTensorCore, BackwardHeadDim128) { sweep_backward(128); }
TEST_P(SimAttentionTensorCore, HeadDim96) { sweep(96); }
TEST_P(SimAttentionTensorCore, HeadDim128) { sweep(128); }

// Head sizes that are not a multiple of 8 (element loads and stores instead of 16-byte ones)
// and below 64 (zero padding): 45 runs in the 64 instantiation, 100 in the 128 one; forward
// and backward.
TEST_P(SimAttentionTensorCore, HeadDimsOfElementAccess) {
  for (int64_t D : {45, 100})
    for (float p : {0.f, 0.1f}) check_tc({2, 70, D, 1, p}, true);
}

// The backward reading the tensor-core forward's out and lse, each head size, ragged tiles.
TEST_P(SimAttentionTensorCore, BackwardFromItsForward) {
  check_tc({2, 130, 64, 1, 0.1f}, true);
  check_tc({4, 65, 96, 2, 0.f}, true);
  check_tc({4, 63, 128, 4, 0.1f}, true);
}

// Context parallelism (C = 2 ranks, chunks of c = 45 rows, T = 180): rank 1's queries against
// rank 0's keys (a gap of key tiles), rank 0's against all keys (Sk = 4c != S) and against one
// chunk (Sk = c), rank 0's first chunk against rank 1's keys (rows that see no key); D = 64,
// 96 and 128, dropout indexed in [T, T], the backward from this forward.
TEST_P(SimAttentionTensorCore, ContextParallelRows) {
  const int64_t c = 45, C = 2, T = 2 * C * c, S = 2 * c;
  const SeqPositions rank0 = rank_positions(c, C, 0), rank1 = rank_positions(c, C, 1);
  for (int64_t D : {64, 96, 128})
    for (float p : {0.f, 0.1f}) {
      check_tc({2, S, D, 2, p, AttentionRows{rank1, rank0, T}, S, "rank 1 rank 0's keys"}, true);
      check_tc({2, S, D, 1, p, AttentionRows{rank0, SeqPositions{}, T}, T, "rank 0 all keys"}, true);
      check_tc({2, S, D, 1, p, AttentionRows{rank0, SeqPositions::run(2 * c), T}, c, "rank 0 chunk 2's keys"}, true);
      check_tc({2, S, D, 2, p, AttentionRows{rank0, rank1, T}, S, "rank 0 rank 1's keys"}, true);
    }
}

// Two partial attentions merged: lse of -inf (a part that saw no key) in out's rows, in the
// part's and in both; D = 40 (16-byte packs) and 45 (element by element).
TEST_P(SimKernels, AttentionMerge) {
  for (int64_t D : {40, 45}) {
    const int64_t B = 3, S = 37, rows = B * S;
    const std::string what = name("D=" + std::to_string(D));
    std::vector<float> l = random_values(rows, -3.f, 3.f), lp = random_values(rows, -3.f, 3.f);
    for (int64_t r = 0; r < rows; r += 5) l[r] = -INFINITY;
    for (int64_t r = 0; r < rows; r += 7) lp[r] = -INFINITY;
    lp[3] = l[3] + 30.f;  // one part outweighs the other by e^30
    Both out = random({B, S, D}, dt(), -2.f, 2.f), part = random({B, S, D}, dt(), -2.f, 2.f);
    Both lse = with_values({B, S}, DType::fp32, l), lse_part = with_values({B, S}, DType::fp32, lp);
    cuda::attention_merge(dt(), out.dev(), lse.devf(), part.dev(), lse_part.devf(), rows, D, nullptr);
    cpu_->attention_merge(out.c, lse.c, part.c, lse_part.c);
    expect_close(out, tol_for(dt()), "attention_merge out " + what);
    expect_close(lse, {1e-5, 1e-5}, "attention_merge lse " + what);
  }
}

TEST(SimLimits, AttentionHeadDim128DoesNotFitSm86) {
  // 113 KiB of dynamic shared memory: within the opt-in limit of H100 (227 KiB) and A100
  // (163 KiB), beyond sm_86's 99 KiB, where the driver refuses the attribute and the launch.
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t B = 1, S = 8, D = 128;
  void *q, *out, *lse;
  ASSERT_EQ(cudaMalloc(&q, B * S * D * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, B * S * D * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, B * S * 4), cudaSuccess);
  std::vector<float> zeros(B * S * D, 0.f);
  ASSERT_EQ(cudaMemcpy(q, zeros.data(), zeros.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const DropoutSpec spec = attention_spec(0.f, B, S);
  for (auto model : {cudasim::DeviceModel::h100, cudasim::DeviceModel::a100, cudasim::DeviceModel::sm86}) {
    cudasim::set_device(model);
    bool threw = false;
    try {
      cuda::attention_fwd(DType::fp32, q, q, q, 1.f, spec, out, static_cast<float*>(lse), {B, S, S, D, 1, {}}, nullptr);
    } catch (const std::exception& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find("cudaFuncSetAttribute"), std::string::npos) << e.what();
    }
    EXPECT_EQ(threw, model == cudasim::DeviceModel::sm86) << cudasim::device_name(model);
    (void)cudaGetLastError();
  }
  cudasim::set_device(cudasim::DeviceModel::h100);
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  EXPECT_EQ(cudasim::report_count(), 0u) << cudasim::reports_text();
}

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); }
INSTANTIATE_TEST_SUITE_P(Dtypes, SimKernels, ::testing::Values(DType::fp32, DType::bf16, DType::fp16), dtype_param_name);
INSTANTIATE_TEST_SUITE_P(Fp32, SimLongRows, ::testing::Values(DType::fp32), dtype_param_name);
INSTANTIATE_TEST_SUITE_P(Dtypes, SimAttention, ::testing::Values(DType::fp32, DType::bf16, DType::fp16),
                         dtype_param_name);
INSTANTIATE_TEST_SUITE_P(Dtypes, SimAttentionTensorCore, ::testing::Values(DType::bf16, DType::fp16), dtype_param_name);

}  // namespace
