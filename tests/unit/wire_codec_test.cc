// The wire formats' CUDA twins (cuda/wire_codec.cuh) against the CPU's EncodeWire and DecodeWire:
// byte for byte the same encoding and bit for bit the same decoding, for every format a boundary
// takes, rounded to the nearest and stochastically, at sizes that end inside a block, a byte
// and a 3-bit group, with blocks of zeros, NaN, infinities and subnormals. Needs a GPU: without
// one each test skips, saying why.
#include "cuda/wire_codec.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cuda/cuda_stage.h"
#include "tests/support/device_buffer.h"

namespace longhaul {
namespace {

using testing::DeviceBuffer;

// n values, mostly Gaussian, with a block of zeros, one holding a NaN, one an infinity, one of
// subnormals and one with an outlier, where n reaches them.
std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  auto block = [&](size_t b) { return b * kInt2Block < n ? std::min(n, (b + 1) * kInt2Block) : b * kInt2Block; };
  for (size_t i = 1 * kInt2Block; i < block(1); ++i) x[i] = 0;
  if (3 * kInt2Block < n) x[3 * kInt2Block + 5] = std::numeric_limits<float>::quiet_NaN();
  if (4 * kInt2Block < n) x[4 * kInt2Block + 7] = -std::numeric_limits<float>::infinity();
  for (size_t i = 5 * kInt2Block; i < block(5); ++i) x[i] *= 1e-40f;
  if (6 * kInt2Block < n) x[6 * kInt2Block + 9] = 1e4f;
  return x;
}

size_t FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (a[i] != b[i]) return i;
  return a.size() == b.size() ? std::string::npos : std::min(a.size(), b.size());
}

class WireCodecCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "the wire formats' CUDA twins need a GPU: " << why;
  }
};

// Every boundary format, both roundings: the device's bytes are the CPU's, and decoding them on
// the device gives the CPU's floats, NaNs included.
TEST_F(WireCodecCuda, EncodesAndDecodesAsTheCpuByteForByte) {
  const WireDtype formats[] = {WireDtype::kF32,  WireDtype::kF16,  WireDtype::kBf16, WireDtype::kInt8,
                               WireDtype::kInt4, WireDtype::kInt3, WireDtype::kInt2, WireDtype::kInt3H,
                               WireDtype::kInt2H, WireDtype::kInt1H};
  for (size_t n : {size_t{1}, size_t{3}, size_t{127}, size_t{128}, size_t{129}, size_t{515}, size_t{4133},
                   size_t{(1 << 20) + 3}}) {
    const std::vector<float> x = Values(n, static_cast<uint32_t>(n));
    DeviceBuffer<float> in(n);
    in.Put(x);
    for (WireDtype d : formats) {
      for (bool stochastic : {false, true}) {
        if (stochastic && !IsLossy(d)) continue;
        SCOPED_TRACE(std::string(WireDtypeName(d)) + (stochastic ? " stochastic" : " nearest") + ", n " +
                     std::to_string(n));
        const StochasticRounding sr{0x5eed1234u + n, 4096 * 7};
        std::vector<uint8_t> want(WireBytes(n, d));
        EncodeWire(x.data(), n, d, want.data(), stochastic ? &sr : nullptr);
        DeviceBuffer<uint8_t> wire(want.size());
        ASSERT_TRUE(cuda::EncodeWire(nullptr, in.p, n, d, wire.p, stochastic ? &sr : nullptr).ok());
        const std::vector<uint8_t> got = wire.Get();
        const size_t at = FirstDifference(want, got);
        ASSERT_EQ(at, std::string::npos) << "first different byte " << at << " of " << want.size();

        std::vector<float> cpu(n);
        DecodeWire(want.data(), n, d, cpu.data());
        DeviceBuffer<float> decoded(n);
        ASSERT_TRUE(cuda::DecodeWire(nullptr, wire.p, n, d, decoded.p).ok());
        const std::vector<float> gpu = decoded.Get();
        std::vector<uint8_t> cpu_bytes(4 * n), gpu_bytes(4 * n);  // as bytes: NaN equals NaN
        std::memcpy(cpu_bytes.data(), cpu.data(), 4 * n);
        std::memcpy(gpu_bytes.data(), gpu.data(), 4 * n);
        const size_t bad = FirstDifference(cpu_bytes, gpu_bytes);
        ASSERT_EQ(bad, std::string::npos) << "value " << bad / 4 << " decodes differently";
      }
    }
  }
}

// topk is the exchange's, encoded on the host: the device refuses it, saying so.
TEST_F(WireCodecCuda, RefusesTopK) {
  DeviceBuffer<float> in(4096);
  DeviceBuffer<uint8_t> out(4 * 4096);
  const absl::Status s = cuda::EncodeWire(nullptr, in.p, 4096, WireDtype::kTopK, out.p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("host"), std::string::npos) << s;
  EXPECT_FALSE(cuda::DecodeWire(nullptr, out.p, 4096, WireDtype::kTopK, in.p).ok());
}

}  // namespace
}  // namespace longhaul
