#pragma once
// Four dropout words from one Philox call. philox_word(seed, layer, site, index) evaluates
// Philox4x32-10 at counter index / 4 and keeps word index % 4; a thread that owns four
// consecutive canonical indices starting at a multiple of 4 gets all four words from one
// call here, bit for bit the same as four philox_word calls (the GPU kernels rely on it and
// test_gpu_ops checks it on the host).
#include <cstdint>

#include "runtime/philox.hpp"

namespace actbench {

ACTBENCH_HD Philox4 philox_words4(uint64_t seed, uint32_t layer, uint32_t site, uint64_t block) {
  Philox4 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), layer, site}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

}  // namespace actbench
