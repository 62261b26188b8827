#include "transport/crc32c.h"

#include <cstring>
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace longhaul {

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
#else
  static const auto table = [] {
    struct T { uint32_t v[256]; } t;
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t x = i;
      for (int k = 0; k < 8; ++k) x = (x >> 1) ^ (0x82f63b78u & (0u - (x & 1u)));
      t.v[i] = x;
    }
    return t;
  }();
  for (; n > 0; --n, ++p) c = table.v[(c ^ *p) & 0xff] ^ (c >> 8);
#endif
  return ~c;
}

}  // namespace longhaul
