// The boundaries' low-rank codec: what it sends, what arrives, and what it does with zeros and
// non-finite values.
#include "cpu/low_rank.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/blas.h"
#include "util/hash.h"

namespace longhaul::cpu {
namespace {

constexpr size_t kRows = 96, kCols = 64, kRank = 8;

std::vector<float> Random(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

// (rows × cols) = (rows × r) · (r × cols)
std::vector<float> Product(const std::vector<float>& u, const std::vector<float>& v, size_t rows, size_t r,
                           size_t cols) {
  std::vector<float> a(rows * cols);
  Sgemm(false, false, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(r), 1.0f, u.data(),
        static_cast<int>(r), v.data(), static_cast<int>(cols), 0.0f, a.data(), static_cast<int>(cols));
  return a;
}

double SquaredDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

std::vector<float> RoundTrip(const std::vector<float>& a, size_t rank, uint64_t seed, std::vector<float>* sent = nullptr) {
  LowRankCodec codec;
  std::vector<float> wire(LowRankFloats(kRows, kCols, rank)), back(a.size());
  EXPECT_TRUE(codec.Encode(a.data(), kRows, kCols, rank, seed, wire.data()).ok());
  EXPECT_TRUE(LowRankCodec::Decode(wire.data(), kRows, kCols, rank, back.data()).ok());
  if (sent != nullptr) *sent = wire;
  return back;
}

// A tensor of rank r arrives as it left, up to rounding, whatever the seed.
TEST(LowRank, ATensorOfTheRankArrivesWhole) {
  ASSERT_TRUE(LoadBlas().ok());
  const std::vector<float> a = Product(Random(kRows * kRank, 1), Random(kRank * kCols, 2), kRows, kRank, kCols);
  for (uint64_t seed : {7u, 8u}) {
    const std::vector<float> back = RoundTrip(a, kRank, seed);
    EXPECT_LT(SquaredDistance(a, back), 1e-8 * SquaredDistance(a, std::vector<float>(a.size(), 0.0f))) << seed;
  }
}

// On a falling spectrum (singular values 0.8^i) what arrives is within twice the best rank-r
// error (the sum of the dropped singular values squared), and the rows of Q^T are orthonormal.
TEST(LowRank, AFallingSpectrumLosesLittleMoreThanTheBestRankCould) {
  ASSERT_TRUE(LoadBlas().ok());
  // U (rows × cols) and V (cols × cols) with orthonormal columns: Q^T's rows of a full-rank tensor.
  std::vector<float> u_t, v_t;
  {
    std::vector<float> sent;
    RoundTrip(Random(kRows * kCols, 3), kCols - 1, 9, &sent);  // rank cols - 1 < rows: an orthonormal basis
    u_t.assign(sent.begin(), sent.begin() + (kCols - 1) * kRows);
    std::vector<float> square = Random(kCols * kCols, 4), v_sent;
    LowRankCodec codec;
    v_sent.resize(LowRankFloats(kCols, kCols, kCols - 1));
    ASSERT_TRUE(codec.Encode(square.data(), kCols, kCols, kCols - 1, 10, v_sent.data()).ok());
    v_t.assign(v_sent.begin(), v_sent.begin() + (kCols - 1) * kCols);
  }
  const size_t n = kCols - 1;
  std::vector<float> a(kRows * kCols, 0.0f);
  double dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    const double s = std::pow(0.8, static_cast<double>(i));
    if (i >= kRank) dropped += s * s;
    for (size_t r = 0; r < kRows; ++r)
      for (size_t c = 0; c < kCols; ++c) a[r * kCols + c] += static_cast<float>(s * u_t[i * kRows + r] * v_t[i * kCols + c]);
  }
  std::vector<float> sent;
  const std::vector<float> back = RoundTrip(a, kRank, 11, &sent);
  EXPECT_LT(SquaredDistance(a, back), 2 * dropped);
  EXPECT_GT(SquaredDistance(a, back), 0.99 * dropped) << "no rank-r tensor comes closer than the best";
  for (size_t i = 0; i < kRank; ++i)
    for (size_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (size_t k = 0; k < kRows; ++k) dot += static_cast<double>(sent[i * kRows + k]) * sent[j * kRows + k];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << ", " << j;
    }
}

// The same tensor and seed send the same floats (a recovery's resend is the first send); another
// seed draws other directions.
TEST(LowRank, TheSameTensorAndSeedSendTheSameFloats) {
  ASSERT_TRUE(LoadBlas().ok());
  const std::vector<float> a = Random(kRows * kCols, 5);
  std::vector<float> first, again, other;
  RoundTrip(a, kRank, 12, &first);
  RoundTrip(a, kRank, 12, &again);
  RoundTrip(a, kRank, 13, &other);
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
}

// Zeros (or a tensor of lower rank than r) send zeros for the directions they lack, never NaN; a
// NaN in the tensor reaches what arrives, so a non-finite activation still stops the step.
TEST(LowRank, ZerosArriveAsZerosAndANanArrives) {
  ASSERT_TRUE(LoadBlas().ok());
  const std::vector<float> zeros(kRows * kCols, 0.0f);
  std::vector<float> sent;
  EXPECT_EQ(RoundTrip(zeros, kRank, 14, &sent), zeros);
  EXPECT_EQ(sent, std::vector<float>(sent.size(), 0.0f));
  const std::vector<float> rank_two = Product(Random(kRows * 2, 6), Random(2 * kCols, 7), kRows, 2, kCols);
  const std::vector<float> back = RoundTrip(rank_two, kRank, 15);
  for (float x : back) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LT(SquaredDistance(rank_two, back), 1e-8 * SquaredDistance(rank_two, zeros));
  std::vector<float> a = Random(kRows * kCols, 8);
  a[kCols * 5 + 3] = std::nanf("");
  const std::vector<float> with_nan = RoundTrip(a, kRank, 16);
  EXPECT_TRUE(std::any_of(with_nan.begin(), with_nan.end(), [](float x) { return std::isnan(x); }));
}

// Shared directions: a tensor whose rows lie in the directions another tensor of them found
// arrives as it left through its coordinates alone, and a gradient taken into them comes back as
// the gradient of that projection, G · D^T · D.
TEST(LowRank, SharedDirectionsCarryTheirSpanAndTheProjectionsGradient) {
  ASSERT_TRUE(LoadBlas().ok());
  const std::vector<float> basis = Random(kRank * kCols, 2);  // the rows' span
  const std::vector<float> first = Product(Random(kRows * kRank, 1), basis, kRows, kRank, kCols);
  const std::vector<float> later = Product(Random(kRows * kRank, 3), basis, kRows, kRank, kCols);
  LowRankCodec codec;
  std::vector<float> d(kRank * kCols), coords(kRank * kRows), back(kRows * kCols);
  ASSERT_TRUE(codec.Directions(first.data(), kRows, kCols, kRank, 7, d.data()).ok());
  ASSERT_TRUE(LowRankCodec::Project(later.data(), kRows, kCols, kRank, d.data(), coords.data()).ok());
  ASSERT_TRUE(LowRankCodec::Decode(coords.data(), d.data(), kRows, kCols, kRank, back.data()).ok());
  EXPECT_LT(SquaredDistance(later, back), 1e-8 * SquaredDistance(later, std::vector<float>(later.size(), 0.0f)));
  // The directions' rows are orthonormal.
  for (size_t i = 0; i < kRank; ++i) {
    for (size_t j = 0; j < kRank; ++j) {
      double dot = 0;
      for (size_t c = 0; c < kCols; ++c) dot += static_cast<double>(d[i * kCols + c]) * d[j * kCols + c];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << ", " << j;
    }
  }
  // A gradient of any rank: what arrives is G · D^T · D, its part in the directions.
  const std::vector<float> g = Random(kRows * kCols, 4);
  ASSERT_TRUE(LowRankCodec::Project(g.data(), kRows, kCols, kRank, d.data(), coords.data()).ok());
  ASSERT_TRUE(LowRankCodec::Decode(coords.data(), d.data(), kRows, kCols, kRank, back.data()).ok());
  std::vector<float> gdt(kRows * kRank), expected(kRows * kCols);
  Sgemm(false, true, kRows, kRank, kCols, 1.0f, g.data(), kCols, d.data(), kCols, 0.0f, gdt.data(), kRank);
  Sgemm(false, false, kRows, kCols, kRank, 1.0f, gdt.data(), kRank, d.data(), kCols, 0.0f, expected.data(), kCols);
  EXPECT_LT(SquaredDistance(expected, back), 1e-10 * SquaredDistance(g, std::vector<float>(g.size(), 0.0f)));
  EXPECT_GT(SquaredDistance(g, back), 0.5 * SquaredDistance(g, std::vector<float>(g.size(), 0.0f)))
      << "rank 8 of 64 columns keeps an eighth of a random gradient";
}

}  // namespace
}  // namespace longhaul::cpu
