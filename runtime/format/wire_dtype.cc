#include "format/wire_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "longhaul.pb.h"
#include "util/parallel_copy.h"

namespace longhaul {

namespace {

size_t Blocks(size_t n) { return (n + kScaleBlock - 1) / kScaleBlock; }

// int8 and int4 (wire_dtype.h): the blocks' scales, then the values, each in [-Q, Q]. One template
// per dtype keeps the per-value loops free of a test for which.
template <bool kInt4>
void EncodeQuantized(const float* in, size_t n, void* out) {
  constexpr float q = kInt4 ? 7.0f : 127.0f;
  auto* scales = static_cast<uint8_t*>(out);  // may be unaligned: a part's encoding sits at any byte
  auto* values = static_cast<uint8_t*>(out) + 4 * Blocks(n);
  if (kInt4) std::fill(values, values + (n + 1) / 2, uint8_t{0});
  for (size_t b = 0; b * kScaleBlock < n; ++b) {
    const size_t lo = b * kScaleBlock, hi = std::min(n, lo + kScaleBlock);
    float most = 0;
    bool finite = true;
    for (size_t i = lo; i < hi; ++i) {
      const float a = std::fabs(in[i]);
      finite = finite && std::isfinite(a);
      most = std::max(most, a);
    }
    const float scale = finite ? most / q : std::numeric_limits<float>::quiet_NaN();
    std::memcpy(scales + 4 * b, &scale, 4);
    if (!(scale > 0)) {  // zeros, or a NaN scale: the values stay 0
      if (!kInt4) std::fill(values + lo, values + hi, uint8_t{0});
      continue;
    }
    for (size_t i = lo; i < hi; ++i) {
      // x / scale, not x · (1 / scale): the reciprocal of a subnormal scale overflows.
      const auto v = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(in[i] / scale), -q, q)));
      if (kInt4) {
        values[i / 2] |= static_cast<uint8_t>((v & 0xfu) << (4 * (i % 2)));
      } else {
        values[i] = v;
      }
    }
  }
}

template <bool kInt4>
void DecodeQuantized(const void* in, size_t n, float* out) {
  const auto* scales = static_cast<const uint8_t*>(in);
  const auto* values = static_cast<const uint8_t*>(in) + 4 * Blocks(n);
  for (size_t b = 0; b * kScaleBlock < n; ++b) {
    float scale;
    std::memcpy(&scale, scales + 4 * b, 4);
    const size_t lo = b * kScaleBlock, hi = std::min(n, lo + kScaleBlock);
    for (size_t i = lo; i < hi; ++i) {
      // A nibble's sign bit extends through the int: (v ^ 8) - 8.
      const int v = kInt4 ? (((values[i / 2] >> (4 * (i % 2))) & 0xf) ^ 8) - 8 : static_cast<int8_t>(values[i]);
      out[i] = std::isfinite(scale) ? scale * static_cast<float>(v) : scale;
    }
  }
}

}  // namespace

size_t WireBytes(size_t n, WireDtype d) {
  switch (d) {
    case WireDtype::kAuto:  // resolved before anything is sent (wire_plan.h); fp32 is the most it takes
    case WireDtype::kF32: return 4 * n;
    case WireDtype::kF16:
    case WireDtype::kBf16: return 2 * n;
    case WireDtype::kInt8: return n + 4 * Blocks(n);
    case WireDtype::kInt4: return (n + 1) / 2 + 4 * Blocks(n);
  }
  return 4 * n;
}

WireDtype WireDtypeFor(WireDtype job, int kind) {
  return IsQuantized(job) && kind == proto::PARAMS ? WireDtype::kBf16 : job;
}

absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name) {
  if (name == "fp32") return WireDtype::kF32;
  if (name == "fp16") return WireDtype::kF16;
  if (name == "bf16") return WireDtype::kBf16;
  if (name == "int8") return WireDtype::kInt8;
  if (name == "int4") return WireDtype::kInt4;
  if (name == "auto") return WireDtype::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "transport.wire_dtype = \"", name, "\": use \"auto\", \"fp32\", \"fp16\", \"bf16\", \"int8\" or \"int4\""));
}

const char* WireDtypeName(WireDtype d) {
  switch (d) {
    case WireDtype::kF32: return "fp32";
    case WireDtype::kF16: return "fp16";
    case WireDtype::kBf16: return "bf16";
    case WireDtype::kInt8: return "int8";
    case WireDtype::kInt4: return "int4";
    case WireDtype::kAuto: return "auto";
  }
  return "?";
}

void EncodeWire(const float* in, size_t n, WireDtype d, void* out) {
  switch (d) {
    case WireDtype::kAuto:
    case WireDtype::kF32:
      std::memcpy(out, in, 4 * n);
      return;
    case WireDtype::kF16: {
      auto* o = static_cast<_Float16*>(out);
#pragma omp simd
      for (size_t i = 0; i < n; ++i) o[i] = static_cast<_Float16>(in[i]);
      return;
    }
    case WireDtype::kBf16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &in[i], 4);
        if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu) != 0) {
          o[i] = static_cast<uint16_t>((bits >> 16) | 0x40);  // keep NaN a NaN
        } else {
          o[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // round to nearest even
        }
      }
      return;
    }
    case WireDtype::kInt8:
      EncodeQuantized<false>(in, n, out);
      return;
    case WireDtype::kInt4:
      EncodeQuantized<true>(in, n, out);
      return;
  }
}

void DecodeWire(const void* in, size_t n, WireDtype d, float* out) {
  switch (d) {
    case WireDtype::kAuto:
    case WireDtype::kF32:
      std::memcpy(out, in, 4 * n);
      return;
    case WireDtype::kF16: {
      const auto* p = static_cast<const _Float16*>(in);
#pragma omp simd
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
      return;
    }
    case WireDtype::kBf16: {
      const auto* p = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      return;
    }
    case WireDtype::kInt8:
      DecodeQuantized<false>(in, n, out);
      return;
    case WireDtype::kInt4:
      DecodeQuantized<true>(in, n, out);
      return;
  }
}

void RoundThroughWire(const float* in, float* out, size_t n, WireDtype d) {
  if (d == WireDtype::kF32 || d == WireDtype::kAuto) {
    if (in != out) ParallelCopy(out, in, n * sizeof(float));
    return;
  }
  // Pieces of kWirePiece values, a multiple of the quantized blocks, as the transport cuts its parts; they
  // are independent, so every core takes some (a GPU stage's own shards are hundreds of MB).
  const long pieces = static_cast<long>((n + kWirePiece - 1) / kWirePiece);
#pragma omp parallel for schedule(static) if (pieces > 64)
  for (long p = 0; p < pieces; ++p) {
    alignas(4) uint8_t wire[2 * kWirePiece];
    const size_t i = static_cast<size_t>(p) * kWirePiece, k = std::min<size_t>(kWirePiece, n - i);
    EncodeWire(in + i, k, d, wire);
    DecodeWire(wire, k, d, out + i);
  }
}

}  // namespace longhaul
