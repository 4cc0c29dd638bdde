#pragma once
// A typed buffer on the simulated device for the simulator's own tests: zero-filled, or filled
// with one value, or copied from a host vector; get() copies it back. Every fill is a host write,
// so the race checker never takes these buffers for memory no thread wrote.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace cudasim_tests {

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : Dev(std::vector<T>(count)) {}
  Dev(size_t count, T fill) : Dev(std::vector<T>(count, fill)) {}
  explicit Dev(const std::vector<T>& v) : n(v.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

}  // namespace cudasim_tests
