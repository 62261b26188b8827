#include "format/wire_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "format/wire_levels.h"
#include "longhaul.pb.h"
#include "util/parallel_copy.h"

namespace longhaul {

namespace {

using wire::BlockCount;
using wire::GetBits;
using wire::PackedBytes;

// m codes of kBits bits (codes holds room for m rounded up to 8) packed from the lowest bit of
// out's first byte up (wire_levels.h's GetBits reads them): eight codes make kBits whole bytes.
template <int kBits>
void PackCodes(uint8_t* codes, size_t m, uint8_t* out) {
  const size_t bytes = PackedBytes<kBits>(m);
  for (size_t k = m; k % 8 != 0; ++k) codes[k] = 0;
  for (size_t k = 0, o = 0; k < m; k += 8, o += kBits) {
    uint64_t word = 0;
    for (int j = 0; j < 8; ++j) word |= static_cast<uint64_t>(codes[k + j]) << (kBits * j);
    for (int j = 0; j < kBits && o + j < bytes; ++j) out[o + j] = static_cast<uint8_t>(word >> (8 * j));
  }
}

// Blocks are independent and each one's packed values whole bytes, so the cores share a large
// tensor's blocks: a push of a stage's shards (a GPT-3 XL stage's are 100M values and more) is
// encoded on the thread that computes, which waits for it. A boundary tensor's part (a MiB on the
// wire, 4M values at most) stays on its connection's thread alone, beside the compute.
constexpr size_t kParallelValues = size_t{1} << 23;

// What a block of m values (of kN-value blocks) quantizes: in the rotated dtypes (kRotated) a whole
// block rotated into `rotated`, else the values themselves.
template <size_t kN, bool kRotated>
const float* BlockValues(const float* block, size_t m, float* rotated) {
  if constexpr (kRotated) {
    if (m == kN) {
      wire::RotateBlock<kN>(block, rotated);
      return rotated;
    }
  }
  return block;
}
// A decoded block of m values rotated back where BlockValues rotated it.
template <size_t kN, bool kRotated>
void RotateBack(float* block, size_t m) {
  if constexpr (kRotated) {
    if (m == kN) wire::UnrotateBlock<kN>(block);
  }
}

// The block formats (wire_levels.h's AbsMax for int8, int4 and int3, Rms for int2, Sign for
// int1h; rotated for int3h, int2h and int1h): the blocks' scales, then their values' codes. A
// block's codes fill whole bytes (128 values of 8, 4, 3 or 2 bits, 512 of int2's, 1024 of
// int1h's), so each block writes its own.
template <class F, bool kRotated>
void EncodeBlocks(const float* in, size_t n, void* out, const StochasticRounding* sr) {
  auto* scales = static_cast<uint8_t*>(out);  // may be unaligned: a part's encoding sits at any byte
  const size_t count = BlockCount<F::kBlock>(n);
  auto* values = static_cast<uint8_t*>(out) + 4 * count;
  const long blocks = static_cast<long>(count);
#pragma omp parallel for schedule(static) if (n > kParallelValues)
  for (long b = 0; b < blocks; ++b) {
    const size_t lo = static_cast<size_t>(b) * F::kBlock, m = std::min(n - lo, F::kBlock);
    uint8_t* bytes = values + lo / 8 * F::kBits;
    float rotated[F::kBlock];
    const float* x = BlockValues<F::kBlock, kRotated>(in + lo, m, rotated);
    const float scale = F::Scale(x, m);
    std::memcpy(scales + 4 * b, &scale, 4);
    if (!(scale > 0)) {  // zeros, or a NaN scale: the codes are 0
      std::fill(bytes, bytes + PackedBytes<F::kBits>(m), uint8_t{0});
      continue;
    }
    // Two loops, not a test per value: each of them the vector units take whole. int8's codes are
    // its bytes.
    uint8_t codes[F::kBlock];
    uint8_t* to = F::kBits == 8 ? bytes : codes;
    if (sr) {
      for (size_t k = 0; k < m; ++k) to[k] = static_cast<uint8_t>(F::Bits(x[k], scale, sr, lo + k));
    } else {
      for (size_t k = 0; k < m; ++k) to[k] = static_cast<uint8_t>(F::Bits(x[k], scale, nullptr, lo + k));
    }
    if constexpr (F::kBits != 8) PackCodes<F::kBits>(codes, m, bytes);
  }
}

template <class F, bool kRotated>
void DecodeBlocks(const void* in, size_t n, float* out) {
  const auto* scales = static_cast<const uint8_t*>(in);
  const size_t count = BlockCount<F::kBlock>(n);
  const auto* values = static_cast<const uint8_t*>(in) + 4 * count;
  const long blocks = static_cast<long>(count);
#pragma omp parallel for schedule(static) if (n > kParallelValues)
  for (long b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, scales + 4 * b, 4);
    const size_t lo = static_cast<size_t>(b) * F::kBlock, hi = std::min(n, lo + F::kBlock);
    for (size_t i = lo; i < hi; ++i) out[i] = F::Value(GetBits<F::kBits>(values, i), scale);
    RotateBack<F::kBlock, kRotated>(out + lo, hi - lo);
  }
}

// Values topk keeps of a chunk of c.
size_t TopKKept(size_t c) { return (c + kTopKOneIn - 1) / kTopKOneIn; }

// topk (wire_dtype.h): chunk by chunk, the kept values' offsets, then their bf16 values. Every
// chunk's place in the encoding is known beforehand, so the cores share the chunks of a large
// tensor (the choice is the costly part: several times int8's work a value).
void EncodeTopK(const float* in, size_t n, void* out) {
  const long chunks = static_cast<long>((n + kWirePiece - 1) / kWirePiece);
#pragma omp parallel for schedule(static) if (chunks > 64)
  for (long chunk = 0; chunk < chunks; ++chunk) {
    const size_t lo = static_cast<size_t>(chunk) * kWirePiece;
    const size_t c = std::min(kWirePiece, n - lo), k = TopKKept(c);
    // May be unaligned: a part's encoding sits at any byte.
    uint8_t* bytes = static_cast<uint8_t*>(out) + 4 * TopKKept(kWirePiece) * static_cast<size_t>(chunk);
    uint16_t order[kWirePiece];
    float magnitude[kWirePiece];  // each once, not at every comparison
    const float* x = in + lo;
    // A non-finite magnitude ranks above every finite one; equal magnitudes go to the lower offset.
    for (size_t i = 0; i < c; ++i) {
      const float a = std::fabs(x[i]);
      magnitude[i] = std::isfinite(a) ? a : std::numeric_limits<float>::infinity();
      order[i] = static_cast<uint16_t>(i);
    }
    std::nth_element(order, order + (k - 1), order + c, [&](uint16_t a, uint16_t b) {
      return magnitude[a] > magnitude[b] || (magnitude[a] == magnitude[b] && a < b);
    });
    std::sort(order, order + k);
    for (size_t j = 0; j < k; ++j) {
      const uint16_t value = wire::ToBf16(x[order[j]]);
      std::memcpy(bytes + 2 * j, &order[j], 2);
      std::memcpy(bytes + 2 * (k + j), &value, 2);
    }
  }
}

void DecodeTopK(const void* in, size_t n, float* out) {
  const auto* bytes = static_cast<const uint8_t*>(in);
  std::fill(out, out + n, 0.0f);
  for (size_t lo = 0; lo < n; lo += kWirePiece) {
    const size_t c = std::min(kWirePiece, n - lo), k = TopKKept(c);
    for (size_t j = 0; j < k; ++j) {
      uint16_t offset, value;
      std::memcpy(&offset, bytes + 2 * j, 2);
      std::memcpy(&value, bytes + 2 * (k + j), 2);
      if (offset < c) out[lo + offset] = wire::FromBf16(value);
    }
    bytes += 4 * k;
  }
}

}  // namespace

size_t WireBytes(size_t n, WireDtype d) {
  switch (d) {
    case WireDtype::kAuto:  // resolved before anything is sent (wire_plan.h); fp32 is the most it takes
    case WireDtype::kF32: return 4 * n;
    case WireDtype::kF16:
    case WireDtype::kBf16: return 2 * n;
    case WireDtype::kInt8: return PackedBytes<8>(n) + 4 * BlockCount<kScaleBlock>(n);
    case WireDtype::kInt4: return PackedBytes<4>(n) + 4 * BlockCount<kScaleBlock>(n);
    case WireDtype::kInt3:
    case WireDtype::kInt3H: return PackedBytes<3>(n) + 4 * BlockCount<kScaleBlock>(n);
    case WireDtype::kTopK: return 4 * (n / kWirePiece * TopKKept(kWirePiece) + TopKKept(n % kWirePiece));
    case WireDtype::kInt2:
    case WireDtype::kInt2H: return PackedBytes<2>(n) + 4 * BlockCount<kInt2Block>(n);
    case WireDtype::kInt1H: return PackedBytes<1>(n) + 4 * BlockCount<kInt1Block>(n);
  }
  return 4 * n;
}

WireDtype WireDtypeFor(WireDtype job, int kind) {
  return IsLossy(job) && kind == proto::PARAMS ? WireDtype::kBf16 : job;
}

absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name, const std::string& key) {
  if (name == "fp32") return WireDtype::kF32;
  if (name == "fp16") return WireDtype::kF16;
  if (name == "bf16") return WireDtype::kBf16;
  if (name == "int8") return WireDtype::kInt8;
  if (name == "int4") return WireDtype::kInt4;
  if (name == "int3") return WireDtype::kInt3;
  if (name == "int2") return WireDtype::kInt2;
  if (name == "int3h") return WireDtype::kInt3H;
  if (name == "int2h") return WireDtype::kInt2H;
  if (name == "int1h") return WireDtype::kInt1H;
  if (name == "topk") return WireDtype::kTopK;
  if (name == "auto") return WireDtype::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(key, " = \"", name,
                                                 "\": use \"auto\", \"fp32\", \"fp16\", \"bf16\", \"int8\", \"int4\", \"int3\", \"int2\", \"int3h\", \"int2h\", \"int1h\" or \"topk\""));
}

const char* WireDtypeName(WireDtype d) {
  switch (d) {
    case WireDtype::kF32: return "fp32";
    case WireDtype::kF16: return "fp16";
    case WireDtype::kBf16: return "bf16";
    case WireDtype::kInt8: return "int8";
    case WireDtype::kInt4: return "int4";
    case WireDtype::kInt3: return "int3";
    case WireDtype::kInt2: return "int2";
    case WireDtype::kInt3H: return "int3h";
    case WireDtype::kInt2H: return "int2h";
    case WireDtype::kInt1H: return "int1h";
    case WireDtype::kTopK: return "topk";
    case WireDtype::kAuto: return "auto";
  }
  return "?";
}

void EncodeWire(const float* in, size_t n, WireDtype d, void* out, const StochasticRounding* sr) {
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
      for (size_t i = 0; i < n; ++i) o[i] = wire::ToBf16(in[i]);
      return;
    }
    case WireDtype::kInt8:
      EncodeBlocks<wire::AbsMax<8>, false>(in, n, out, sr);
      return;
    case WireDtype::kInt4:
      EncodeBlocks<wire::AbsMax<4>, false>(in, n, out, sr);
      return;
    case WireDtype::kInt3:
      EncodeBlocks<wire::AbsMax<3>, false>(in, n, out, sr);
      return;
    case WireDtype::kInt3H:
      EncodeBlocks<wire::AbsMax<3>, true>(in, n, out, sr);
      return;
    case WireDtype::kInt2:
      EncodeBlocks<wire::Rms, false>(in, n, out, sr);
      return;
    case WireDtype::kInt2H:
      EncodeBlocks<wire::Rms, true>(in, n, out, sr);
      return;
    case WireDtype::kInt1H:
      EncodeBlocks<wire::Sign, true>(in, n, out, sr);
      return;
    case WireDtype::kTopK:
      EncodeTopK(in, n, out);
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
      for (size_t i = 0; i < n; ++i) out[i] = wire::FromBf16(p[i]);
      return;
    }
    case WireDtype::kInt8:
      DecodeBlocks<wire::AbsMax<8>, false>(in, n, out);
      return;
    case WireDtype::kInt4:
      DecodeBlocks<wire::AbsMax<4>, false>(in, n, out);
      return;
    case WireDtype::kInt3:
      DecodeBlocks<wire::AbsMax<3>, false>(in, n, out);
      return;
    case WireDtype::kInt3H:
      DecodeBlocks<wire::AbsMax<3>, true>(in, n, out);
      return;
    case WireDtype::kInt2:
      DecodeBlocks<wire::Rms, false>(in, n, out);
      return;
    case WireDtype::kInt2H:
      DecodeBlocks<wire::Rms, true>(in, n, out);
      return;
    case WireDtype::kInt1H:
      DecodeBlocks<wire::Sign, true>(in, n, out);
      return;
    case WireDtype::kTopK:
      DecodeTopK(in, n, out);
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
