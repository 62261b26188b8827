#include "util/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/hash.h"

namespace longhaul {
namespace {

// Bitwise reference (the definition of CRC-32C).
uint32_t Reference(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32c(0, s.data(), s.size()), 0xe3069283u);  // the standard check value
}

TEST(Crc32c, InterleavedPathAndPiecesAgreeWithTheDefinition) {
  Rng rng(5);
  for (size_t n : {size_t{0}, size_t{7}, size_t{16384}, size_t{16385}, size_t{100003}, size_t{1} << 20}) {
    std::vector<uint8_t> buf(n);
    for (uint8_t& b : buf) b = static_cast<uint8_t>(rng.Next());
    const uint32_t want = Reference(buf.data(), n);
    EXPECT_EQ(Crc32c(0, buf.data(), n), want) << n;
    // Extending over pieces gives the same as one pass (how chunks are checksummed).
    const size_t cut = n / 3;
    EXPECT_EQ(Crc32c(Crc32c(0, buf.data(), cut), buf.data() + cut, n - cut), want) << n;
  }
}

}  // namespace
}  // namespace longhaul
