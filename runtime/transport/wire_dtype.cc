#include "transport/wire_dtype.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace longhaul {

size_t WireBytesPerElement(WireDtype d) { return d == WireDtype::kF32 ? 4 : 2; }

absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name) {
  if (name == "fp32") return WireDtype::kF32;
  if (name == "fp16") return WireDtype::kF16;
  if (name == "bf16") return WireDtype::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("transport.wire_dtype = \"", name, "\": use \"fp32\", \"fp16\" or \"bf16\""));
}

const char* WireDtypeName(WireDtype d) {
  switch (d) {
    case WireDtype::kF32: return "fp32";
    case WireDtype::kF16: return "fp16";
    case WireDtype::kBf16: return "bf16";
  }
  return "?";
}

void EncodeWire(const float* in, size_t n, WireDtype d, void* out) {
  switch (d) {
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
  }
}

void DecodeWire(const void* in, size_t n, WireDtype d, float* out) {
  switch (d) {
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
  }
}

void RoundThroughWire(float* data, size_t n, WireDtype d) {
  if (d == WireDtype::kF32) return;
  uint16_t wire[4096];
  for (size_t i = 0; i < n; i += 4096) {
    const size_t k = std::min<size_t>(4096, n - i);
    EncodeWire(data + i, k, d, wire);
    DecodeWire(wire, k, d, data + i);
  }
}

}  // namespace longhaul
