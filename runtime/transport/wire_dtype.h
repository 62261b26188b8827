#pragma once
// Conversion between fp32 tensors and their wire encoding (fp32, fp16 or bf16, little-endian),
// chosen by transport.wire_dtype whatever the sender computes in.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace longhaul {

enum class WireDtype : uint8_t { kF32 = 1, kF16 = 2, kBf16 = 3 };

size_t WireBytesPerElement(WireDtype d);
absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name);
const char* WireDtypeName(WireDtype d);

// out receives n · WireBytesPerElement(d) bytes.
void EncodeWire(const float* in, size_t n, WireDtype d, void* out);
void DecodeWire(const void* in, size_t n, WireDtype d, float* out);
// In place, what n floats become after EncodeWire and DecodeWire: a tensor a process hands to
// itself must be rounded as its peers receive it, or replicas drift apart.
void RoundThroughWire(float* data, size_t n, WireDtype d);

}  // namespace longhaul
