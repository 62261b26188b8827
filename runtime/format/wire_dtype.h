#pragma once
// Conversion between fp32 tensors and their wire encoding (fp32, fp16, bf16, int8, int4, int3,
// int2, the rotated int3h, int2h and int1h, or topk, little-endian), chosen by
// transport.wire_dtype whatever the sender computes in.
//
// int8, int4 and int3 (the quantized dtypes): blocks of kScaleBlock values from the start of what
// is encoded; the encoding is every block's fp32 scale (its largest magnitude / Q, Q = 127 for
// int8, 7 for int4, 3 for int3), then every value as round(x / scale) in [-Q, Q], two's complement
// in 8, 4 or 3 bits, packed from the lowest bit of the first byte up (value i at bits b·i to
// b·i + b - 1: int8 a byte each, int4 two per byte, the earlier in the low nibble; int3 eight per
// three bytes). A block of zeros has scale 0; a block holding a NaN or an infinity decodes to NaN
// throughout, so a non-finite gradient still stops the step. The error is at most half a step,
// scale / 2, of the block's largest magnitude: 0.4% for int8, 7% for int4, 17% for int3, which is
// why a quantized push carries error feedback (transport/error_feedback.h). Parameters never
// travel quantized (WireDtypeFor): a model computing with 8-bit weights is another model.
//
// int2: blocks of kInt2Block values, each its fp32 scale (the block's root mean square), then
// every value as 2 bits v, four per byte (the earliest in the lowest bits), decoding to
// (v - 1.5) x scale: levels at ±0.5 and ±1.5 root mean squares, near the best four a Gaussian
// block can have, where an absmax scale would round most of a block with one outlier to its
// smallest level. Values beyond 2 root mean squares clip to the outer level. Zeros and non-finite
// values as int8's. 2.06 bits a value: 15.5x fewer bytes than fp32.
//
// topk: per chunk of kWirePiece values from the start of what is encoded (the last chunk may be
// shorter, c values), its ceil(c / kTopKOneIn) largest magnitudes (ties to the lower offset; a NaN
// or an infinity counts as the largest, so a non-finite gradient still stops the step), as their
// uint16 offsets in the chunk in ascending order, then their values in bf16; the other values
// decode as 0. One value in 32 at 32 bits is 1 bit per value. It is for the data-parallel
// exchange only (transport.exchange_dtype), whose error feedback sends what a round leaves out in
// a later one; a pipeline boundary cannot lose 31 values in 32. Decoding writes only within the
// chunk: an offset past it is ignored, whatever a peer sends.
//
// int3h and int2h: int3 and int2 of the blocks rotated. Each whole block (int3h's 128 values,
// int2h's 512) is encoded as int3's (int2's) encoding of y = H·D·x / 128 (/ 512), with H the
// Hadamard matrix of ±1 and D a fixed diagonal of signs (format/wire_levels.h), and decodes to
// D·H·y; a last block shorter than that travels unrotated. The rotation spreads a block's few
// large values over all its values, so the few levels serve every value: an absmax scale no
// longer rounds the rest to zero, and int2's levels meet the near-Gaussian block they were chosen
// for. As many bytes as the unrotated dtype. A boundary's gradients stand int3h where int3 costs
// them convergence, and the outer exchange int2h better than int2 (docs/benchmarks.md).
//
// int1h: blocks of kInt1Block values rotated as int2h's (a shorter last block unrotated), each
// its fp32 scale (the root mean square of its rotated values), then every rotated value's sign
// as one bit, eight per byte (the earliest in the lowest bit), 1 decoding to +scale and 0 to -scale.
// 1.03 bits a value: 8x fewer bytes than int8, 31x fewer than fp32. Like topk it is for the
// data-parallel exchange only, whose error feedback sends a round's error in the next; a pipeline
// boundary's tensors cannot lose that much.
//
// A format is chosen by the config (transport.wire_dtype), sent and admitted by the transport and
// priced by the planner's simulator: it sits below all three.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace longhaul {

// kAuto is a config's choice only (transport/wire_plan.h resolves it per link), never on the wire.
enum class WireDtype : uint8_t {
  kAuto = 0, kF32 = 1, kF16 = 2, kBf16 = 3, kInt8 = 4, kInt4 = 5, kTopK = 6, kInt2 = 7, kInt3 = 8,
  kInt3H = 9, kInt2H = 10, kInt1H = 11
};

inline constexpr size_t kScaleBlock = 128;
inline constexpr size_t kInt2Block = 512;
inline constexpr size_t kInt1Block = 1024;
// A tensor split into parts (over connections) is cut at multiples of this many values, so that
// the quantized dtypes' blocks (and int4's bytes) fall where they would in the whole tensor.
inline constexpr size_t kWirePiece = 4096;
// topk keeps one value in this many of each chunk (of kWirePiece values).
inline constexpr size_t kTopKOneIn = 32;

// Whether `value` (a header's proto::WireDtype, from the network) names a dtype tensors travel in.
inline bool IsWireDtype(int value) {
  return value >= static_cast<int>(WireDtype::kF32) && value <= static_cast<int>(WireDtype::kInt1H);
}
// int4, int3 and int2, rotated or not: so few levels that a boundary's gradient in them rounds
// stochastically (tensor_transport.cc), lest its error lean the same way step after step.
inline bool FewLevels(WireDtype d) {
  return d == WireDtype::kInt4 || d == WireDtype::kInt3 || d == WireDtype::kInt2 || d == WireDtype::kInt3H ||
         d == WireDtype::kInt2H;
}
// The data-parallel exchange's alone, never a pipeline boundary's.
inline bool ExchangeOnly(WireDtype d) { return d == WireDtype::kTopK || d == WireDtype::kInt1H; }
// int8, the few-level dtypes, int1h and topk: lossy enough that pushes carry error feedback.
inline bool IsLossy(WireDtype d) { return d == WireDtype::kInt8 || ExchangeOnly(d) || FewLevels(d); }
// Bytes of n values encoded in d.
size_t WireBytes(size_t n, WireDtype d);
// What tensors of `kind` (proto::TensorKind) travel in where the job's wire dtype is `job`:
// parameters go in bf16 where the job's is lossy, everything else in the job's.
WireDtype WireDtypeFor(WireDtype job, int kind);
// `name` as the config key `key` gives it (the key names the problem where it is not one).
absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name, const std::string& key = "transport.wire_dtype");
const char* WireDtypeName(WireDtype d);

// Stochastic rounding (the quantized dtypes): a value rounds to the level above it with
// probability its distance above the level below (in steps), so its expected decoding is the
// value itself within the levels' range. The draw for value i of a part is a hash of (seed,
// offset + i), with offset the part's first value in its tensor: the same bits however a tensor
// is cut into parts, and the same again when a recovery sends the tensor anew.
struct StochasticRounding {
  uint64_t seed = 0;
  size_t offset = 0;
};

// out receives WireBytes(n, d) bytes; rounded to the nearest level, or stochastically by `sr`.
void EncodeWire(const float* in, size_t n, WireDtype d, void* out, const StochasticRounding* sr = nullptr);
void DecodeWire(const void* in, size_t n, WireDtype d, float* out);
// out = what the n floats of `in` become after EncodeWire and DecodeWire (out may be in): a
// tensor a process hands to itself must be rounded as its peers receive it, or replicas drift
// apart. Out of place it is the copy as well, in one pass.
void RoundThroughWire(const float* in, float* out, size_t n, WireDtype d);

}  // namespace longhaul
