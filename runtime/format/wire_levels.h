#pragma once
// The per-value steps of the wire formats (wire_dtype.h): a block's scale, the level a value
// rounds to, its bits and what they decode to. The CPU encoders (wire_dtype.cc) and their CUDA
// twins (cuda/wire_codec.cu) both call these, so a tensor encoded on a GPU is byte for byte the
// one its CPU peers would encode: a recovery that moves a stage between the two repeats the run.
// Every float operation here is one IEEE operation (a division, a product, a sum whose product
// is exact), which the host and the device round alike whether or not they fuse it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "format/wire_dtype.h"
#include "util/hash.h"

#if defined(__CUDACC__)
#define LH_HOST_DEVICE __host__ __device__
#else
#define LH_HOST_DEVICE
#endif

namespace longhaul::wire {

LH_HOST_DEVICE inline size_t Blocks(size_t n) { return (n + kScaleBlock - 1) / kScaleBlock; }
LH_HOST_DEVICE inline size_t Int2Blocks(size_t n) { return (n + kInt2Block - 1) / kInt2Block; }
template <int kBits>
LH_HOST_DEVICE inline size_t PackedBytes(size_t n) {
  return (kBits * n + 7) / 8;
}

// lo <= x <= hi, for an x that is no NaN (comparisons the compiler keeps inline; fminf and fmaxf
// order NaNs and cost a call each on the host).
LH_HOST_DEVICE inline float Clamp(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

// Neither NaN nor an infinity.
LH_HOST_DEVICE inline bool Finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// x (in steps of the levels) rounded stochastically: up with probability x - floor(x), drawn for
// value `i` of the part (wire_dtype.h). The 24-bit draw times 2^-24 is exact.
LH_HOST_DEVICE inline float StochasticLevel(float x, const StochasticRounding& sr, size_t i) {
  const uint64_t bits = SplitMix64(sr.seed ^ SplitMix64(sr.offset + i));
  return floorf(x + static_cast<float>(bits >> 40) * 0x1.0p-24f);
}

// int8, int4 and int3: Q = 2^(b-1) - 1 levels either side of zero.
template <int kBits>
LH_HOST_DEVICE constexpr float Levels() {
  return static_cast<float>((1 << (kBits - 1)) - 1);
}
// A block's scale from its largest magnitude: NaN where it holds a non-finite value.
template <int kBits>
LH_HOST_DEVICE inline float QuantizedScale(float most, bool finite) {
  return finite ? most / Levels<kBits>() : NAN;
}
// The kBits bits of x in a block of `scale` > 0: round(x / scale) in [-Q, Q], two's complement.
// x / scale, not x · (1 / scale): the reciprocal of a subnormal scale overflows.
template <int kBits>
LH_HOST_DEVICE inline uint32_t QuantizedBits(float x, float scale, const StochasticRounding* sr, size_t i) {
  constexpr float q = Levels<kBits>();
  const float level = sr ? StochasticLevel(x / scale, *sr, i) : rintf(x / scale);
  return static_cast<uint32_t>(static_cast<int32_t>(Clamp(level, -q, q))) & ((1u << kBits) - 1);
}
// What bits of a block of `scale` decode to: the sign extended through the int; a NaN scale's
// block is NaN throughout, a zero scale's zeros.
template <int kBits>
LH_HOST_DEVICE inline float QuantizedValue(uint32_t bits, float scale) {
  constexpr uint32_t sign = 1u << (kBits - 1);
  const int v = static_cast<int>(bits ^ sign) - static_cast<int>(sign);
  return Finite(scale) ? scale * static_cast<float>(v) : scale;
}

// int2: a block's sum of squares, value by value in order (the product of two floats is exact in
// a double, so only the order could change the sum, and it is fixed).
LH_HOST_DEVICE inline double AddSquare(double squares, float x) {
  return squares + static_cast<double>(x) * static_cast<double>(x);
}
// The block's root mean square: NaN where it holds a non-finite value.
LH_HOST_DEVICE inline float Int2Scale(double squares, size_t count, bool finite) {
  return finite ? static_cast<float>(sqrt(squares / static_cast<double>(count))) : NAN;
}
// The level x / scale + 1.5 in [0, 3] (within 1.5 root mean squares) rounds to; nearest:
// (-inf, -1) -> 0, [-1, 0) -> 1, [0, 1) -> 2, [1, inf) -> 3.
LH_HOST_DEVICE inline uint32_t Int2Bits(float x, float scale, const StochasticRounding* sr, size_t i) {
  const float t = x / scale;
  return static_cast<uint32_t>(Clamp(sr ? StochasticLevel(t + 1.5f, *sr, i) : floorf(t + 2.0f), 0.0f, 3.0f));
}
// A block of zeros (scale 0) decodes to zeros whatever its bits; a NaN scale to NaN.
LH_HOST_DEVICE inline float Int2Value(uint32_t bits, float scale) {
  return Finite(scale) ? scale * (static_cast<float>(bits) - 1.5f) : scale;
}

// Value i of a stream of kBits-bit values, packed from the lowest bit of the first byte up: at
// bits kBits·i to kBits·i + kBits - 1 (within a byte for 8, 4 and 2 bits; across two for 3).
template <int kBits>
LH_HOST_DEVICE inline uint32_t GetBits(const uint8_t* values, size_t i) {
  const size_t bit = kBits * i;
  uint32_t word = values[bit / 8];
  if (bit % 8 + kBits > 8) word |= static_cast<uint32_t>(values[bit / 8 + 1]) << 8;
  return (word >> (bit % 8)) & ((1u << kBits) - 1);
}

// bf16 by rounding to the nearest even; a NaN stays a NaN.
LH_HOST_DEVICE inline uint16_t ToBf16(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
LH_HOST_DEVICE inline float FromBf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  memcpy(&x, &bits, 4);
  return x;
}

}  // namespace longhaul::wire
