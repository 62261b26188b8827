// Wire encodings: sizes, the error each allows, NaN kept a NaN, int8's blocks, and which dtype
// each kind of tensor travels in.
#include "format/wire_dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
  for (WireDtype d : {WireDtype::kF32, WireDtype::kF16, WireDtype::kBf16, WireDtype::kInt8}) {
    auto parsed = ParseWireDtype(WireDtypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
  auto bad = ParseWireDtype("int4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"int8\""), std::string::npos) << bad.status();
}

TEST(WireDtype, Int8ErrsAtMostHalfAStepOfItsBlocksLargestValue) {
  const std::vector<float> x = Wavy(1000);
  const std::vector<float> y = Through(x, WireDtype::kInt8);
  for (size_t b = 0; b * kInt8Block < x.size(); ++b) {
    float most = 0;
    for (size_t i = b * kInt8Block; i < std::min(x.size(), (b + 1) * kInt8Block); ++i) most = std::max(most, std::fabs(x[i]));
    for (size_t i = b * kInt8Block; i < std::min(x.size(), (b + 1) * kInt8Block); ++i) {
      ASSERT_LE(std::fabs(y[i] - x[i]), most / 127 / 2 * (1 + 1e-5)) << i;
    }
  }
  // Each block is scaled on its own: a block of tiny values keeps its precision beside huge ones.
  std::vector<float> mixed(256, 1e-6f);
  for (size_t i = 128; i < 256; ++i) mixed[i] = 1e6f;
  const std::vector<float> m = Through(mixed, WireDtype::kInt8);
  EXPECT_NEAR(m[0], 1e-6f, 1e-8f);
  EXPECT_NEAR(m[200], 1e6f, 1.0f);
}

TEST(WireDtype, ZerosStayZerosAndANonFiniteValuePoisonsItsBlockOnly) {
  std::vector<float> x(300, 0.0f);
  EXPECT_EQ(Through(x, WireDtype::kInt8), x);
  x[5] = std::numeric_limits<float>::infinity();
  x[200] = 1.5f;
  const std::vector<float> y = Through(x, WireDtype::kInt8);
  for (size_t i = 0; i < 128; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;  // the step sees a NaN norm
  EXPECT_FLOAT_EQ(y[200], 1.5f);
  EXPECT_EQ(y[201], 0.0f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Through(x, WireDtype::kBf16)[5]));
  EXPECT_TRUE(std::isnan(Through(x, WireDtype::kInt8)[5]));
}

// In place and into another buffer, and over enough pieces that the cores share them.
TEST(WireDtype, RoundThroughWireIsEncodeThenDecode) {
  for (size_t n : {3 * kWirePiece + 77, 70 * kWirePiece + 77}) {
    const std::vector<float> x = Wavy(n);
    for (WireDtype d : {WireDtype::kF32, WireDtype::kF16, WireDtype::kBf16, WireDtype::kInt8}) {
      std::vector<float> own = x, other(n, -1.0f);
      RoundThroughWire(own.data(), own.data(), n, d);
      EXPECT_EQ(own, Through(x, d)) << WireDtypeName(d) << ", in place, " << n;
      RoundThroughWire(x.data(), other.data(), n, d);
      EXPECT_EQ(other, own) << WireDtypeName(d) << ", into another buffer, " << n;
    }
  }
}

TEST(WireDtype, ParametersNeverTravelInInt8) {
  EXPECT_EQ(WireDtypeFor(WireDtype::kInt8, proto::PARAMS), WireDtype::kBf16);
  for (int kind : {proto::ACTIVATION, proto::GRADIENT, proto::GRAD_PUSH}) {
    EXPECT_EQ(WireDtypeFor(WireDtype::kInt8, kind), WireDtype::kInt8);
  }
  EXPECT_EQ(WireDtypeFor(WireDtype::kF32, proto::PARAMS), WireDtype::kF32);
  EXPECT_EQ(WireDtypeFor(WireDtype::kBf16, proto::PARAMS), WireDtype::kBf16);
}

}  // namespace
}  // namespace longhaul
