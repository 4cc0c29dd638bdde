#pragma once
// Philox4x32-10 counter-based RNG (Salmon et al., SC'11) for host and device.
// Dropout masks and parameter initialisation are keyed so that a value depends only on
// (seed, layer, site, index in the canonical unsharded tensor): the same mask for every
// t, with or without sequence parallelism, on CPU and GPU, and on recomputation.
#include <cstdint>

#if defined(__CUDACC__)
#define ACTBENCH_HD __host__ __device__ __forceinline__
#else
#define ACTBENCH_HD inline
#endif

namespace actbench {

struct Philox4 {
  uint32_t v[4];
};

ACTBENCH_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// 10 rounds, constants from the Random123 reference.
ACTBENCH_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, ctr.v[0], hi0, lo0);
    philox_mulhilo(kM1, ctr.v[2], hi1, lo1);
    Philox4 next;
    next.v[0] = hi1 ^ ctr.v[1] ^ k0;
    next.v[1] = lo1;
    next.v[2] = hi0 ^ ctr.v[3] ^ k1;
    next.v[3] = lo0;
    ctr = next;
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// Stream identifiers: the fourth counter word separates dropout sites from init streams.
enum DropoutSite : uint32_t { kSiteAttnProbs = 0, kSiteAttnOut = 1, kSiteMlpOut = 2 };
constexpr uint32_t kInitStreamBase = 0x1000u;  // + tensor id

// Word `lane` (0..3) of a Philox output by selects, not by indexing: an array indexed with a
// value known only at run time lives in local memory on the GPU (a spill per element).
ACTBENCH_HD uint32_t philox_lane(const Philox4& out, uint32_t lane) {
  const uint32_t low = (lane & 1u) ? out.v[1] : out.v[0];
  const uint32_t high = (lane & 1u) ? out.v[3] : out.v[2];
  return (lane & 2u) ? high : low;
}

// The 32-bit random word for element `index` of stream (seed, layer, stream).
// Four consecutive elements share one Philox call (counter = index / 4).
ACTBENCH_HD uint32_t philox_word(uint64_t seed, uint32_t layer, uint32_t stream, uint64_t index) {
  uint64_t block = index >> 2;
  Philox4 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), layer, stream}};
  Philox4 out = philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return philox_lane(out, static_cast<uint32_t>(index & 3u));
}

// Dropout keeps an element iff its word >= threshold, threshold = round(p * 2^32).
ACTBENCH_HD uint32_t dropout_threshold(float p) {
  double t = static_cast<double>(p) * 4294967296.0;
  if (t >= 4294967295.0) return 0xFFFFFFFFu;
  return static_cast<uint32_t>(t);
}

// Uniform float in [-1, 1) from the init stream of tensor `tensor_id`.
ACTBENCH_HD float philox_uniform_pm1(uint64_t seed, uint32_t layer, uint32_t tensor_id, uint64_t index) {
  uint32_t w = philox_word(seed, layer, kInitStreamBase + tensor_id, index);
  return static_cast<float>(w >> 8) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits
}

}  // namespace actbench
