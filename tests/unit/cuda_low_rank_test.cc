// The low-rank codec's CUDA twin (cuda/low_rank.cuh) against the CPU's (cpu/low_rank.h): the same
// directions and layout, so either end of a link may be a CPU or a GPU worker; what arrives within
// rounding of the CPU's; orthonormal Q; zeros and a NaN as there. Needs a GPU: without one each
// test skips, saying why.
#include "cuda/low_rank.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cpu/blas.h"
#include "cpu/low_rank.h"
#include "cuda/cublas_api.h"
#include "cuda/cuda_stage.h"
#include "tests/support/device_buffer.h"
#include "util/hash.h"

namespace longhaul {
namespace {

using testing::DeviceBuffer;

// Rows and ranks across a panel of the device's Cholesky factorisation (64 columns) and past it.
constexpr size_t kRows = 300, kCols = 192;

std::vector<float> Random(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

// (rows × cols) = (rows × r) · diag(0.97^i) · (r × cols): a falling spectrum.
std::vector<float> Falling(size_t r, uint64_t seed) {
  std::vector<float> u = Random(kRows * r, seed), v = Random(r * kCols, seed + 1);
  for (size_t i = 0; i < r; ++i)
    for (size_t c = 0; c < kCols; ++c) v[i * kCols + c] *= static_cast<float>(std::pow(0.97, double(i)));
  std::vector<float> a(kRows * kCols);
  cpu::Sgemm(false, false, int(kRows), int(kCols), int(r), 1.0f, u.data(), int(r), v.data(), int(kCols), 0.0f,
             a.data(), int(kCols));
  return a;
}

double SquaredDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return s;
}

class LowRankCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "the low-rank codec's CUDA twin needs a GPU: " << why;
    ASSERT_TRUE(cpu::LoadBlas().ok());
    const absl::StatusOr<const Cublas*> cublas = LoadCublas();
    ASSERT_TRUE(cublas.ok()) << cublas.status();
    ASSERT_EQ((*cublas)->create(&blas_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (blas_ != nullptr) LoadedCublas().destroy(blas_);
  }

  // What the device sends for `a` at `rank`, and what it multiplies back out of that.
  std::vector<float> Encode(const std::vector<float>& a, size_t rank, uint64_t seed, std::vector<float>* back) {
    DeviceBuffer<float> in(a.size()), sent(cpu::LowRankFloats(kRows, kCols, rank)), out(a.size());
    in.Put(a);
    cuda::LowRankCodec codec;
    EXPECT_TRUE(codec.Encode(blas_, nullptr, in.p, kRows, kCols, rank, seed, sent.p).ok());
    EXPECT_TRUE(cuda::LowRankCodec::Decode(blas_, sent.p, kRows, kCols, rank, out.p).ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    *back = out.Get();
    return sent.Get();
  }

  cublasHandle_t blas_ = nullptr;
};

// The same seed draws the same directions on both: the factors agree within rounding, Q's rows are
// orthonormal, and each side multiplies out the other's factors as its own.
TEST_F(LowRankCuda, SendsWhatTheCpuSendsWithinRounding) {
  for (size_t rank : {size_t{16}, size_t{80}}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::vector<float> a = Falling(kCols, 21);
    std::vector<float> back;
    const std::vector<float> sent = Encode(a, rank, 22, &back);
    std::vector<float> want(sent.size()), cpu_back(a.size());
    cpu::LowRankCodec codec;
    ASSERT_TRUE(codec.Encode(a.data(), kRows, kCols, rank, 22, want.data()).ok());
    EXPECT_LT(SquaredDistance(sent, want), 1e-6 * SquaredDistance(want, std::vector<float>(want.size(), 0.0f)));
    ASSERT_TRUE(cpu::LowRankCodec::Decode(sent.data(), kRows, kCols, rank, cpu_back.data()).ok());
    EXPECT_LT(SquaredDistance(back, cpu_back), 1e-8 * SquaredDistance(a, std::vector<float>(a.size(), 0.0f)));
    for (size_t i = 0; i < rank; ++i)
      for (size_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (size_t k = 0; k < kRows; ++k) dot += double(sent[i * kRows + k]) * sent[j * kRows + k];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << ", " << j;
      }
  }
}

// A tensor of lower rank than asked arrives whole with zeros for the directions it lacks, zeros
// send zeros, and a NaN reaches what arrives.
TEST_F(LowRankCuda, ZerosArriveAsZerosAndANanArrives) {
  std::vector<float> back;
  const std::vector<float> rank_three = Falling(3, 23);
  Encode(rank_three, 80, 24, &back);
  for (float x : back) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LT(SquaredDistance(rank_three, back), 1e-8 * SquaredDistance(rank_three, std::vector<float>(back.size(), 0)));
  const std::vector<float> zeros(kRows * kCols, 0.0f);
  const std::vector<float> sent = Encode(zeros, 16, 25, &back);
  EXPECT_EQ(sent, std::vector<float>(sent.size(), 0.0f));
  EXPECT_EQ(back, zeros);
  std::vector<float> a = Random(kRows * kCols, 26);
  a[kCols * 5 + 3] = std::nanf("");
  Encode(a, 16, 27, &back);
  EXPECT_TRUE(std::any_of(back.begin(), back.end(), [](float x) { return std::isnan(x); }));
}

// Shared directions: the device draws the CPU's directions within rounding, and a tensor's
// coordinates in them multiply back out as the CPU's do.
TEST_F(LowRankCuda, SharedDirectionsAreTheCpusWithinRounding) {
  constexpr size_t kRank = 40;
  const std::vector<float> a = Falling(kRank + 20, 5), g = Random(kRows * kCols, 9);
  cpu::LowRankCodec cpu_codec;
  std::vector<float> d_cpu(kRank * kCols), coords_cpu(kRank * kRows), back_cpu(a.size());
  ASSERT_TRUE(cpu_codec.Directions(a.data(), kRows, kCols, kRank, 3, d_cpu.data()).ok());
  ASSERT_TRUE(cpu::LowRankCodec::Project(g.data(), kRows, kCols, kRank, d_cpu.data(), coords_cpu.data()).ok());
  ASSERT_TRUE(cpu::LowRankCodec::Decode(coords_cpu.data(), d_cpu.data(), kRows, kCols, kRank, back_cpu.data()).ok());

  DeviceBuffer<float> in(a.size()), grad(g.size()), d(kRank * kCols), coords(kRank * kRows), out(a.size());
  in.Put(a), grad.Put(g);
  cuda::LowRankCodec codec;
  ASSERT_TRUE(codec.Directions(blas_, nullptr, in.p, kRows, kCols, kRank, 3, d.p).ok());
  ASSERT_TRUE(cuda::LowRankCodec::Project(blas_, grad.p, kRows, kCols, kRank, d.p, coords.p).ok());
  ASSERT_TRUE(cuda::LowRankCodec::Decode(blas_, coords.p, d.p, kRows, kCols, kRank, out.p).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LT(SquaredDistance(d.Get(), d_cpu), 1e-6 * kRank) << "the directions";
  EXPECT_LT(SquaredDistance(out.Get(), back_cpu), 1e-6 * SquaredDistance(back_cpu, std::vector<float>(a.size())))
      << "the gradient in them";
}

}  // namespace
}  // namespace longhaul
