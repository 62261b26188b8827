#pragma once
// Test helper: a device buffer of n elements of E, freed at scope end, with copies to and from
// host vectors checked by the test that uses it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace longhaul::testing {

template <typename E>
struct DeviceBuffer {
  E* p = nullptr;
  size_t n;
  explicit DeviceBuffer(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(E)), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  void Put(const std::vector<E>& h) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(E), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<E> Get() const {
    std::vector<E> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(E), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

}  // namespace longhaul::testing
