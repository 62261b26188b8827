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

// The blocks of kBlock values that n values make, a shorter last one included.
template <size_t kBlock>
LH_HOST_DEVICE inline size_t BlockCount(size_t n) {
  return (n + kBlock - 1) / kBlock;
}
template <int kBits>
LH_HOST_DEVICE inline size_t PackedBytes(size_t n) {
  return (kBits * n + 7) / 8;
}

// lo <= x <= hi, for an x that is no NaN (comparisons the compiler keeps inline; fminf and fmaxf
// order NaNs and cost a call each on the host).
LH_HOST_DEVICE inline float Clamp(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

// Neither NaN nor an infinity.
template <class T>
LH_HOST_DEVICE inline bool Finite(T x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// floor(y) for |y| < 2^31 (every level a block's values round to) by a conversion to int, which
// the host's vector units do where floorf would be a call per value.
LH_HOST_DEVICE inline float Floor(float y) {
  const int i = static_cast<int>(y);
  return static_cast<float>(i - (y < static_cast<float>(i) ? 1 : 0));
}

// x (in steps of the levels) rounded stochastically: up with probability x - floor(x), drawn for
// value `i` of the part (wire_dtype.h) by MurmurHash3's 32-bit finalizer (a bijection with full
// avalanche) of its place in the tensor keyed by the seed: distinct places (of the first 2^32)
// draw from distinct words, and 32-bit multiplies are what the host's vector units do eight at a
// time. The 24-bit draw times 2^-24 is exact.
LH_HOST_DEVICE inline float StochasticLevel(float x, const StochasticRounding& sr, size_t i) {
  uint32_t h = static_cast<uint32_t>(sr.offset + i) ^ static_cast<uint32_t>(sr.seed ^ (sr.seed >> 32));
  h = (h ^ (h >> 16)) * 0x85ebca6bu;
  h = (h ^ (h >> 13)) * 0xc2b2ae35u;
  h ^= h >> 16;
  return Floor(x + static_cast<float>(h >> 8) * 0x1.0p-24f);
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

// take(i % 8, x[i]) for each of m values in order, eight at a time: a block's scale kept in eight
// lanes, which the host's vector units take at once.
template <class Take>
LH_HOST_DEVICE inline void InLanes(const float* x, size_t m, Take take) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    for (size_t k = 0; k < 8; ++k) take(k, x[i + k]);
  }
  for (size_t k = 0; i + k < m; ++k) take(k, x[i + k]);
}

// The sum of f(x) over a block's m values, in doubles (the product of two floats is exact in
// one) in eight running sums (InLanes), then the sums in pairs: a fixed order, so the same bits on
// the host and on the device.
template <class F>
LH_HOST_DEVICE inline double LaneSum(const float* x, size_t m, F f) {
  double sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  InLanes(x, m, [&](size_t k, float v) { sums[k] += f(static_cast<double>(v)); });
  return ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
}
// int2: a block's root mean square; NaN where the block holds a non-finite value.
LH_HOST_DEVICE inline float Int2Scale(const float* x, size_t m) {
  const double squares = LaneSum(x, m, [](double d) { return d * d; });
  // A float's square is finite in a double, and 2^32 of them too: the sum is infinite or NaN only
  // where a value is.
  return Finite(squares) ? static_cast<float>(sqrt(squares / static_cast<double>(m))) : NAN;
}
// The level x / scale + 1.5 in [0, 3] (within 1.5 root mean squares) rounds to; nearest:
// (-inf, -1) -> 0, [-1, 0) -> 1, [0, 1) -> 2, [1, inf) -> 3.
LH_HOST_DEVICE inline uint32_t Int2Bits(float x, float scale, const StochasticRounding* sr, size_t i) {
  const float t = x / scale;
  return static_cast<uint32_t>(Clamp(sr ? StochasticLevel(t + 1.5f, *sr, i) : Floor(t + 2.0f), 0.0f, 3.0f));
}
// A block of zeros (scale 0) decodes to zeros whatever its bits; a NaN scale to NaN.
LH_HOST_DEVICE inline float Int2Value(uint32_t bits, float scale) {
  return Finite(scale) ? scale * (static_cast<float>(bits) - 1.5f) : scale;
}

// The block formats as one interface: a block's length, its scale from its m values, each value's
// bits and what bits decode to. int8, int4 and int3 (absmax):
template <int kBits_>
struct AbsMax {
  static constexpr int kBits = kBits_;
  static constexpr size_t kBlock = kScaleBlock;
  // The largest magnitude in eight running maxima (InLanes; a maximum is the same in any order),
  // and beside them sums of 0·x, which stay 0 unless x is a NaN or an infinity.
  LH_HOST_DEVICE static float Scale(const float* x, size_t m) {
    float most[8] = {0, 0, 0, 0, 0, 0, 0, 0}, poison[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    InLanes(x, m, [&](size_t k, float v) {
      const float a = fabsf(v);
      poison[k] += 0.0f * a;
      most[k] = a > most[k] ? a : most[k];
    });
    float largest = 0, finite = 0;
    for (size_t k = 0; k < 8; ++k) largest = most[k] > largest ? most[k] : largest, finite += poison[k];
    return QuantizedScale<kBits>(largest, finite == 0);
  }
  LH_HOST_DEVICE static uint32_t Bits(float x, float scale, const StochasticRounding* sr, size_t i) {
    return QuantizedBits<kBits>(x, scale, sr, i);
  }
  LH_HOST_DEVICE static float Value(uint32_t bits, float scale) { return QuantizedValue<kBits>(bits, scale); }
};
// int2 (root mean square):
struct Rms {
  static constexpr int kBits = 2;
  static constexpr size_t kBlock = kInt2Block;
  LH_HOST_DEVICE static float Scale(const float* x, size_t m) { return Int2Scale(x, m); }
  LH_HOST_DEVICE static uint32_t Bits(float x, float scale, const StochasticRounding* sr, size_t i) {
    return Int2Bits(x, scale, sr, i);
  }
  LH_HOST_DEVICE static float Value(uint32_t bits, float scale) { return Int2Value(bits, scale); }
};
// int1h (each value's sign at the block's root mean square s, so a decoded block keeps its norm):
// 1 where x >= 0; stochastically, 1 with probability (x / s + 1) / 2 within [-s, s]. A block of
// zeros (scale 0) decodes to zeros, a NaN scale's to NaN. Behind error feedback the norm matters
// more than the squared error: the error-optimal s = mean |x| shrinks every round's step to 2 / pi
// of it along the block, and the convergence bench pays for that lag (docs/benchmarks.md).
struct Sign {
  static constexpr int kBits = 1;
  static constexpr size_t kBlock = kInt1Block;
  LH_HOST_DEVICE static float Scale(const float* x, size_t m) { return Int2Scale(x, m); }
  LH_HOST_DEVICE static uint32_t Bits(float x, float scale, const StochasticRounding* sr, size_t i) {
    if (!sr) return x >= 0 ? 1u : 0u;
    return static_cast<uint32_t>(Clamp(StochasticLevel((x / scale + 1.0f) * 0.5f, *sr, i), 0.0f, 1.0f));
  }
  LH_HOST_DEVICE static float Value(uint32_t bits, float scale) {
    return Finite(scale) ? (bits ? scale : -scale) : scale;
  }
};

// int3h, int2h and int1h: a whole block of kN values (a power of two) is encoded as y = H·D·x / kN,
// with D the diagonal of RotationFlips' signs and H the kN × kN Hadamard matrix of ±1, and decoded
// as D·H·y (H·H = kN·I). x / kN first (exact but for values under 2^-117, which lose bits, alike
// on the host and the device), so no partial sum exceeds the block's largest magnitude and none
// overflows; then the butterflies, each an IEEE sum or difference in one fixed order, so the host
// and the device round alike.
// Value i's sign in D: whether frac(i·φ) >= 1/2, an irregular pattern that a multiply gives (and
// vectorizes), so no structured block (a constant, a Hadamard row) comes out of H·D as one spike.
LH_HOST_DEVICE inline bool RotationFlips(size_t i) { return (static_cast<uint32_t>(i) * 0x9E3779B9u) >> 31; }
// The stages h = 1, 2, 4 eight values at a time, written out, then the wider ones, whose pairs
// the vector units take eight at a time; every value meets the stages in the same order either way.
template <size_t kN>
LH_HOST_DEVICE inline void Butterflies(float* t) {
  static_assert(kN % 8 == 0 && (kN & (kN - 1)) == 0, "a power of two from 8");
  for (size_t g = 0; g < kN; g += 8) {
    float* v = t + g;
    const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
    const float a4 = v[4] + v[5], a5 = v[4] - v[5], a6 = v[6] + v[7], a7 = v[6] - v[7];
    const float b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
    const float b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
    v[0] = b0 + b4, v[1] = b1 + b5, v[2] = b2 + b6, v[3] = b3 + b7;
    v[4] = b0 - b4, v[5] = b1 - b5, v[6] = b2 - b6, v[7] = b3 - b7;
  }
  for (size_t h = 8; h < kN; h *= 2) {
    for (size_t lo = 0; lo < kN; lo += 2 * h) {
      for (size_t j = lo; j < lo + h; ++j) {
        const float a = t[j], b = t[j + h];
        t[j] = a + b;
        t[j + h] = a - b;
      }
    }
  }
}
template <size_t kN>
LH_HOST_DEVICE inline void RotateBlock(const float* x, float* y) {
  constexpr float kInverse = 1.0f / static_cast<float>(kN);
  for (size_t i = 0; i < kN; ++i) y[i] = x[i] * (RotationFlips(i) ? -kInverse : kInverse);
  Butterflies<kN>(y);
}
template <size_t kN>
LH_HOST_DEVICE inline void UnrotateBlock(float* x) {
  Butterflies<kN>(x);
  for (size_t i = 0; i < kN; ++i) x[i] = RotationFlips(i) ? -x[i] : x[i];
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
