// Wire encodings: sizes, the error each allows, NaN kept a NaN, the quantized dtypes' blocks,
// int4's nibbles, int3's packing, int2's levels, the rotated dtypes' gain, topk's choice per chunk and its safety against
// any bytes, and which dtype each kind of tensor travels in.
#include "format/wire_dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "longhaul.pb.h"

namespace longhaul {
namespace {

std::vector<float> Wavy(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(0.37 * i) * std::exp(std::sin(0.01 * i) * 6);  // spans e^-6..e^6
  return x;
}

std::vector<float> Through(std::vector<float> x, WireDtype d) {
  std::vector<uint8_t> wire(WireBytes(x.size(), d));
  EncodeWire(x.data(), x.size(), d, wire.data());
  DecodeWire(wire.data(), x.size(), d, x.data());
  return x;
}

TEST(WireDtype, SizesAndNames) {
  EXPECT_EQ(WireBytes(1000, WireDtype::kF32), 4000u);
  EXPECT_EQ(WireBytes(1000, WireDtype::kBf16), 2000u);
  EXPECT_EQ(WireBytes(1000, WireDtype::kF16), 2000u);
  EXPECT_EQ(WireBytes(1000, WireDtype::kInt8), 1000u + 4 * 8);  // 8 blocks of 128 (the last 104)
  EXPECT_EQ(WireBytes(0, WireDtype::kInt8), 0u);
  EXPECT_EQ(WireBytes(1001, WireDtype::kInt4), 501u + 4 * 8);  // two values a byte, 8 scales
  EXPECT_EQ(WireBytes(2 * 4096, WireDtype::kTopK), 2 * 128 * 4u);  // 1 bit a value
  EXPECT_EQ(WireBytes(4096 + 33, WireDtype::kTopK), (128 + 2) * 4u);
  EXPECT_EQ(WireBytes(1025, WireDtype::kInt2), 257u + 4 * 3);  // four values a byte, 3 scales of 512
  EXPECT_EQ(WireBytes(1025, WireDtype::kInt3), 385u + 4 * 9);  // 3075 bits, 9 scales of 128
  for (WireDtype d : {WireDtype::kF32, WireDtype::kF16, WireDtype::kBf16, WireDtype::kInt8, WireDtype::kInt4,
                      WireDtype::kInt3, WireDtype::kInt2, WireDtype::kTopK, WireDtype::kInt3H, WireDtype::kInt2H,
                      WireDtype::kInt1H}) {
    auto parsed = ParseWireDtype(WireDtypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
    EXPECT_TRUE(IsWireDtype(static_cast<int>(d)));
  }
  EXPECT_EQ(WireBytes(1025, WireDtype::kInt3H), WireBytes(1025, WireDtype::kInt3));
  EXPECT_EQ(WireBytes(1025, WireDtype::kInt2H), WireBytes(1025, WireDtype::kInt2));
  EXPECT_EQ(WireBytes(2049, WireDtype::kInt1H), 257u + 4 * 3);  // eight values a byte, 3 scales of 1024
  // int1h's 1.03 bits a value: 8x fewer bytes than int8's 8.25.
  EXPECT_EQ(WireBytes(1 << 20, WireDtype::kInt8), 8 * WireBytes(1 << 20, WireDtype::kInt1H));
  EXPECT_FALSE(IsWireDtype(12));
  EXPECT_FALSE(IsWireDtype(0));
  auto bad = ParseWireDtype("int5");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"int3\", \"int2\""), std::string::npos) << bad.status();
}

// Each quantized dtype errs at most half a step (its block's largest magnitude / Q) per value, and
// scales each block on its own: a block of tiny values keeps its precision beside huge ones.
TEST(WireDtype, QuantizedDtypesErrAtMostHalfAStepOfTheirBlocksLargestValue) {
  for (auto [d, q] : {std::pair{WireDtype::kInt8, 127.0f}, std::pair{WireDtype::kInt4, 7.0f},
                      std::pair{WireDtype::kInt3, 3.0f}}) {
    const std::vector<float> x = Wavy(1001);  // an odd count: int4's last byte holds one value
    const std::vector<float> y = Through(x, d);
    for (size_t b = 0; b * kScaleBlock < x.size(); ++b) {
      const size_t lo = b * kScaleBlock, hi = std::min(x.size(), lo + kScaleBlock);
      float most = 0;
      for (size_t i = lo; i < hi; ++i) most = std::max(most, std::fabs(x[i]));
      for (size_t i = lo; i < hi; ++i) ASSERT_LE(std::fabs(y[i] - x[i]), most / q / 2 * (1 + 1e-5)) << i;
      // The block's largest value and its sign come back exactly (up to the scale's rounding).
      for (size_t i = lo; i < hi; ++i) {
        if (std::fabs(x[i]) == most) {
          EXPECT_NEAR(y[i], x[i], most * 1e-6f) << WireDtypeName(d) << " " << i;
        }
      }
    }
    std::vector<float> mixed(256, 1e-6f);
    for (size_t i = 128; i < 256; ++i) mixed[i] = i % 2 ? 1e6f : -1e6f;
    const std::vector<float> m = Through(mixed, d);
    EXPECT_NEAR(m[0], 1e-6f, 1e-8f) << WireDtypeName(d);
    EXPECT_NEAR(m[200], -1e6f, 1.0f) << WireDtypeName(d);
    EXPECT_NEAR(m[201], 1e6f, 1.0f) << WireDtypeName(d);
  }
}

// int4's nibbles: every level from -7 to 7 at each of a byte's two places.
TEST(WireDtype, Int4CarriesEveryLevelInEitherNibble) {
  std::vector<float> x(kScaleBlock, 0.0f);
  for (size_t i = 0; i < 30; ++i) x[i] = static_cast<float>(static_cast<int>(i / 2) - 7);  // -7..7, twice
  x[31] = 7.0f;  // the block's scale: 1
  const std::vector<float> y = Through(x, WireDtype::kInt4);
  EXPECT_EQ(y, x);
}

// int2's four levels sit at ±0.5 and ±1.5 of its block's root mean square: a block of ±1 and ±3
// in equal numbers (root mean square √5) decodes to those levels, each value to its nearest, the
// ones past 2 root mean squares clipped; blocks scale on their own.
TEST(WireDtype, Int2LevelsAreHalvesOfItsBlocksRootMeanSquare) {
  std::vector<float> x(2 * kInt2Block);
  const float levels[4] = {-3.0f, -1.0f, 1.0f, 3.0f};
  for (size_t i = 0; i < kInt2Block; ++i) x[i] = levels[i % 4];
  for (size_t i = kInt2Block; i < x.size(); ++i) x[i] = 1e-3f * levels[(i / 3) % 4];
  const std::vector<float> y = Through(x, WireDtype::kInt2);
  const float r = std::sqrt(5.0f);
  for (size_t i = 0; i < kInt2Block; ++i) {
    const float want = x[i] > 0 ? (x[i] >= r ? 1.5f * r : 0.5f * r) : (x[i] < -r ? -1.5f * r : -0.5f * r);
    ASSERT_NEAR(y[i], want, 1e-5f) << i;
  }
  for (size_t i = kInt2Block; i < x.size(); ++i) ASSERT_EQ(y[i] > 0, x[i] > 0) << i;
  // On Gaussian values its error is near the best four levels': a mean square error under 0.125 of the values' own.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> g(64 * kInt2Block);
  for (float& v : g) v = normal(rng);
  const std::vector<float> h = Through(g, WireDtype::kInt2);
  double err = 0, power = 0;
  for (size_t i = 0; i < g.size(); ++i) err += (h[i] - g[i]) * (h[i] - g[i]), power += g[i] * g[i];
  EXPECT_LT(err / power, 0.125);
}

// int3's seven levels -3..3, each in every position of the 3-byte groups of eight values (codes
// straddling a byte boundary among them), come back exactly where the block's scale is 1.
TEST(WireDtype, Int3CarriesEveryLevelAcrossByteBoundaries) {
  std::vector<float> x(kScaleBlock + 5, 0.0f);  // a block and a short one
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>((i * 3) % 7) - 3);
  x[0] = 3.0f, x[kScaleBlock] = -3.0f;  // each block's scale: 1
  EXPECT_EQ(Through(x, WireDtype::kInt3), x);
}

// Stochastic rounding is unbiased where nearest rounding is not: a block of values 0.3 of a step
// above a level decodes, rounded to the nearest, all to that level, and stochastically to a mean
// within a few hundredths of a step of the values; the draws depend only on (seed, offset + i), so
// a tensor encoded in two parts decodes as the whole does, and another seed gives other bytes.
TEST(WireDtype, StochasticRoundingIsUnbiasedAndTheSameHoweverATensorIsCut) {
  for (WireDtype d : {WireDtype::kInt8, WireDtype::kInt4, WireDtype::kInt3, WireDtype::kInt2}) {
    SCOPED_TRACE(WireDtypeName(d));
    const size_t n = 4 * kInt2Block;
    // int8, int4 and int3: blocks whose scale makes a step 1 (one value at Q), the rest 0.3 above
    // a level; int2: values all alike, so each is its block's root mean square, a step, halfway
    // between the levels at 0.5 and 1.5 of it.
    std::vector<float> x(n, 2.3f);
    float step = 1;
    if (d == WireDtype::kInt2) {
      x.assign(n, 0.2f);
      step = 0.2f;
    } else {
      const float q = d == WireDtype::kInt8 ? 127.0f : d == WireDtype::kInt4 ? 7.0f : 3.0f;
      for (size_t b = 0; b < n; b += kScaleBlock) x[b] = q;
    }
    std::vector<uint8_t> whole(WireBytes(n, d)), parts(WireBytes(n, d)), other(WireBytes(n, d));
    const StochasticRounding sr{42, 0};
    EncodeWire(x.data(), n, d, whole.data(), &sr);
    const size_t cut = 2 * kInt2Block;  // a multiple of every block, as the transport cuts parts
    const StochasticRounding first{42, 0}, second{42, cut};
    EncodeWire(x.data(), cut, d, parts.data(), &first);
    EncodeWire(x.data() + cut, n - cut, d, parts.data() + WireBytes(cut, d), &second);
    const StochasticRounding reseeded{43, 0};
    EncodeWire(x.data(), n, d, other.data(), &reseeded);
    EXPECT_NE(other, whole);

    std::vector<float> y(n), from_parts(n);
    DecodeWire(whole.data(), n, d, y.data());
    DecodeWire(parts.data(), cut, d, from_parts.data());
    DecodeWire(parts.data() + WireBytes(cut, d), n - cut, d, from_parts.data() + cut);
    EXPECT_EQ(from_parts, y);
    const std::vector<float> nearest = Through(x, d);
    double sum = 0, nearest_sum = 0, count = 0;
    for (size_t i = 0; i < n; ++i) {
      if (x[i] != x[1]) continue;  // the values, not the ones that set a block's scale
      sum += y[i], nearest_sum += nearest[i], ++count;
    }
    EXPECT_NEAR(sum / count, x[1], 0.03 * step);
    EXPECT_GT(std::abs(nearest_sum / count - x[1]), 0.25 * step);
  }
}

// A block's large values rotated over the whole block (int3h, int2h) leave the others levels of
// their own: on Gaussian blocks with one channel in 128 forty times the rest (as a transformer's
// residual stream has), the rotated dtypes err at most half the unrotated ones' mean square; a
// block of zeros stays zeros, and a last block shorter than a whole one travels unrotated, as the
// unrotated dtype carries it.
TEST(WireDtype, RotatedDtypesSpreadABlocksLargeValuesOverItsLevels) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(64 * kInt2Block + 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % kScaleBlock == 7 ? 40.0f : 1.0f);
  for (auto [plain, rotated] : {std::pair{WireDtype::kInt3, WireDtype::kInt3H},
                                std::pair{WireDtype::kInt2, WireDtype::kInt2H}}) {
    SCOPED_TRACE(WireDtypeName(rotated));
    const std::vector<float> p = Through(x, plain), r = Through(x, rotated);
    const size_t whole = x.size() - 5;
    double plain_err = 0, rotated_err = 0, power = 0;
    for (size_t i = 0; i < whole; ++i) {
      plain_err += (p[i] - x[i]) * (p[i] - x[i]);
      rotated_err += (r[i] - x[i]) * (r[i] - x[i]);
      power += x[i] * x[i];
    }
    std::cout << WireDtypeName(plain) << " " << plain_err / power << ", " << WireDtypeName(rotated) << " "
              << rotated_err / power << " of the values' mean square\n";
    EXPECT_LT(rotated_err, plain_err / 2);
    for (size_t i = whole; i < x.size(); ++i) EXPECT_EQ(r[i], p[i]) << "the unrotated last block, value " << i;
    const std::vector<float> zeros(kInt2Block + 3, 0.0f);
    EXPECT_EQ(Through(zeros, rotated), zeros);
  }
}

// int1h sends each rotated value's sign at its block's root mean square: every whole block
// decodes to the norm it had (the rotation keeps norms), with the error two levels at that scale
// make of Gaussian blocks (2 - 2 sqrt(2 / pi) = 0.40 of their mean square), and no more where one
// channel in 128 is forty times the rest (the rotation spreads it: unrotated, those values alone
// would keep nearly all their error, 0.9 of the whole); a last block shorter than a whole one
// travels unrotated, its signs at its own root mean square, and a block of zeros stays zeros.
TEST(WireDtype, Int1hKeepsEachRotatedValuesSignAndItsBlocksNorm) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float outlier : {1.0f, 40.0f}) {
    std::vector<float> x(32 * kInt1Block + 9);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % kScaleBlock == 7 ? outlier : 1.0f);
    const std::vector<float> y = Through(x, WireDtype::kInt1H);
    const size_t whole = x.size() - 9;
    double err = 0, power = 0;
    for (size_t lo = 0; lo < whole; lo += kInt1Block) {
      double block = 0, decoded = 0;
      for (size_t i = lo; i < lo + kInt1Block; ++i) {
        err += (y[i] - x[i]) * (y[i] - x[i]), block += x[i] * x[i], decoded += y[i] * y[i];
      }
      EXPECT_NEAR(decoded / block, 1.0, 1e-4) << "block at " << lo;
      power += block;
    }
    std::cout << "int1h, one channel in 128 x" << outlier << ": " << err / power << " of the values' mean square\n";
    const double gaussian = 2 - 2 * std::sqrt(2 / M_PI);
    if (outlier == 1.0f) {
      EXPECT_NEAR(err / power, gaussian, 0.01);
    }
    EXPECT_LT(err / power, gaussian + 0.01);
    double tail = 0;
    for (size_t i = whole; i < x.size(); ++i) tail += x[i] * x[i];
    tail = std::sqrt(tail / 9);
    for (size_t i = whole; i < x.size(); ++i) EXPECT_FLOAT_EQ(y[i], x[i] >= 0 ? tail : -tail) << i;
  }
  const std::vector<float> zeros(kInt1Block + 3, 0.0f);
  EXPECT_EQ(Through(zeros, WireDtype::kInt1H), zeros);
}

TEST(WireDtype, ZerosStayZerosAndANonFiniteValuePoisonsItsBlockOnly) {
  for (WireDtype d : {WireDtype::kInt8, WireDtype::kInt4, WireDtype::kInt3, WireDtype::kInt2, WireDtype::kInt3H,
                      WireDtype::kInt2H, WireDtype::kInt1H}) {
    SCOPED_TRACE(WireDtypeName(d));
    // int2's levels are halves of its blocks' root mean square, int1h's that root mean square
    const bool rms = d == WireDtype::kInt2 || d == WireDtype::kInt2H || d == WireDtype::kInt1H;
    const bool rotated = d == WireDtype::kInt3H || d == WireDtype::kInt2H || d == WireDtype::kInt1H;
    const size_t block = d == WireDtype::kInt1H ? kInt1Block : rms ? kInt2Block : kScaleBlock;
    std::vector<float> x(block + 172, 0.0f);
    EXPECT_EQ(Through(x, d), x);
    x[5] = std::numeric_limits<float>::infinity();
    x[block + 72] = 1.5f;
    const std::vector<float> y = Through(x, d);
    for (size_t i = 0; i < block; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;  // the step sees a NaN norm
    if (!rms) {
      EXPECT_NEAR(y[block + 72], 1.5f, rotated ? 1e-5f : 0.0f);  // rotated: back through the butterflies
    }
    EXPECT_GT(y[block + 72], 0.0f);
    EXPECT_TRUE(std::isfinite(y[block + 73]));
    x[5] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(Through(x, d)[5]));
  }
  std::vector<float> x(3, 0.0f);
  x[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Through(x, WireDtype::kBf16)[1]));
}

// In place and into another buffer, and over enough pieces that the cores share them.
TEST(WireDtype, RoundThroughWireIsEncodeThenDecode) {
  for (size_t n : {3 * kWirePiece + 77, 70 * kWirePiece + 77}) {
    const std::vector<float> x = Wavy(n);
    for (WireDtype d : {WireDtype::kF32, WireDtype::kF16, WireDtype::kBf16, WireDtype::kInt8, WireDtype::kInt4,
                        WireDtype::kInt3, WireDtype::kInt2, WireDtype::kTopK, WireDtype::kInt3H,
                        WireDtype::kInt2H, WireDtype::kInt1H}) {
      std::vector<float> own = x, other(n, -1.0f);
      RoundThroughWire(own.data(), own.data(), n, d);
      EXPECT_EQ(own, Through(x, d)) << WireDtypeName(d) << ", in place, " << n;
      RoundThroughWire(x.data(), other.data(), n, d);
      EXPECT_EQ(other, own) << WireDtypeName(d) << ", into another buffer, " << n;
    }
  }
}

// topk keeps exactly each chunk's ceil(c / 32) largest magnitudes (ties to the lower offset), in
// bf16, and zeros the rest; a NaN is kept, so a non-finite gradient still stops the step.
TEST(WireDtype, TopKKeepsEachChunksLargestAndNothingElse) {
  const size_t n = 2 * kWirePiece + 100;  // two whole chunks and one of 100 (4 kept)
  std::vector<float> x = Wavy(n);
  for (size_t i = 0; i < 40; ++i) x[kWirePiece + i] = 1000.0f;  // 40 ties in the second chunk
  x[7] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> y = Through(x, WireDtype::kTopK);
  for (size_t lo = 0; lo < n; lo += kWirePiece) {
    const size_t c = std::min(kWirePiece, n - lo), k = (c + 31) / 32;
    std::vector<size_t> order(c);
    for (size_t i = 0; i < c; ++i) order[i] = i;
    auto key = [&](size_t i) { return std::isnan(x[lo + i]) ? INFINITY : std::fabs(x[lo + i]); };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
    std::vector<bool> kept(c, false);
    for (size_t j = 0; j < k; ++j) kept[order[j]] = true;
    size_t nonzero = 0;
    for (size_t i = 0; i < c; ++i) {
      const float want = kept[i] ? Through({x[lo + i]}, WireDtype::kBf16)[0] : 0.0f;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(y[lo + i])) << lo + i;
      } else {
        EXPECT_EQ(y[lo + i], want) << "value " << lo + i << (kept[i] ? " (kept)" : "");
      }
      nonzero += y[lo + i] != 0.0f;
    }
    EXPECT_EQ(nonzero, k) << "chunk at " << lo;
  }
}

// Whatever bytes a peer sends as topk, decoding writes only within the tensor: an offset past its
// chunk is ignored.
TEST(WireDtype, TopKDecodesAnyBytesWithinTheTensor) {
  std::mt19937 rng(5);
  for (size_t n : {size_t{1}, size_t{100}, kWirePiece + 3}) {
    std::vector<uint8_t> wire(WireBytes(n, WireDtype::kTopK));
    for (int trial = 0; trial < 50; ++trial) {
      for (uint8_t& b : wire) b = static_cast<uint8_t>(rng());
      std::vector<float> out(n + 64, 12345.0f);  // a guard band past the tensor
      DecodeWire(wire.data(), n, WireDtype::kTopK, out.data());
      for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], 12345.0f) << "wrote past the tensor, n " << n;
    }
  }
}

TEST(WireDtype, ParametersNeverTravelQuantized) {
  for (WireDtype d : {WireDtype::kInt8, WireDtype::kInt4, WireDtype::kInt3, WireDtype::kInt2, WireDtype::kTopK,
                      WireDtype::kInt3H, WireDtype::kInt2H, WireDtype::kInt1H}) {
    EXPECT_EQ(WireDtypeFor(d, proto::PARAMS), WireDtype::kBf16);
    for (int kind : {proto::ACTIVATION, proto::GRADIENT, proto::GRAD_PUSH}) EXPECT_EQ(WireDtypeFor(d, kind), d);
  }
  EXPECT_EQ(WireDtypeFor(WireDtype::kF32, proto::PARAMS), WireDtype::kF32);
  EXPECT_EQ(WireDtypeFor(WireDtype::kBf16, proto::PARAMS), WireDtype::kBf16);
}

}  // namespace
}  // namespace longhaul
