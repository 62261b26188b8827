#include "util/crc32c.h"

#include <cstring>
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace longhaul {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // Castagnoli, reflected

// a·b modulo the polynomial, bit-reflected (as zlib's multmodp).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8·n) modulo the polynomial: the operator that appends n zero bytes to a CRC.
uint32_t ShiftOperator(size_t n) {
  static const auto table = [] {
    struct T { uint32_t v[64]; } t;
    t.v[0] = 1u << 30;  // x^1
    for (int i = 1; i < 64; ++i) t.v[i] = MultModP(t.v[i - 1], t.v[i - 1]);
    return t;
  }();
  uint32_t p = 1u << 31;  // x^0
  for (unsigned k = 3; n != 0; n >>= 1, ++k)
    if (n & 1) p = MultModP(table.v[k & 63], p);
  return p;
}

// CRC of A followed by B, from crc(A), crc(B) and |B| (zlib's crc32_combine).
uint32_t Combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
  return MultModP(ShiftOperator(len_b), crc_a) ^ crc_b;
}

uint32_t Serial(uint32_t crc, const uint8_t* p, size_t n) {
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
      for (int k = 0; k < 8; ++k) x = (x >> 1) ^ (kPoly & (0u - (x & 1u)));
      t.v[i] = x;
    }
    return t;
  }();
  for (; n > 0; --n, ++p) c = table.v[(c ^ *p) & 0xff] ^ (c >> 8);
#endif
  return ~c;
}

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__SSE4_2__)
  // The crc32 instruction has a latency of 3 cycles and a throughput of 1: three independent
  // streams over thirds of the buffer keep it busy, then the thirds are combined.
  constexpr size_t kMinInterleaved = 1 << 14;
  if (n >= kMinInterleaved) {
    const size_t third = (n / 3) & ~size_t{7};
    const uint8_t *a = p, *b = p + third, *c = p + 2 * third;
    uint64_t ca = ~crc, cb = ~0u, cc = ~0u;
    for (size_t i = 0; i < third; i += 8) {
      uint64_t va, vb, vc;
      std::memcpy(&va, a + i, 8);
      std::memcpy(&vb, b + i, 8);
      std::memcpy(&vc, c + i, 8);
      ca = _mm_crc32_u64(ca, va);
      cb = _mm_crc32_u64(cb, vb);
      cc = _mm_crc32_u64(cc, vc);
    }
    uint32_t r = Combine(~static_cast<uint32_t>(ca), ~static_cast<uint32_t>(cb), third);
    r = Combine(r, ~static_cast<uint32_t>(cc), third);
    return Serial(r, p + 3 * third, n - 3 * third);
  }
#endif
  return Serial(crc, p, n);
}

}  // namespace longhaul
