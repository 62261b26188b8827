#include "cuda/wire_codec.cuh"

#include <cuda_fp16.h>

#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/cuda_memory.cuh"
#include "format/wire_levels.h"
#include "util/status_macros.h"

namespace longhaul::cuda {
namespace {

constexpr int kThreads = 256;
unsigned Grid(size_t work) { return static_cast<unsigned>((work + kThreads - 1) / kThreads); }

__device__ size_t Index() { return blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; }

// The block formats' steps, the CPU's own (format/wire_levels.h).
template <int kBits>
using Quantized = wire::AbsMax<kBits>;
using Int2 = wire::Rms;
using Int1 = wire::Sign;

// One warp per block of kScaleBlock values: its largest magnitude (a maximum, the same in any
// order) and whether every value is finite.
template <int kBits>
__global__ void QuantizedScales(const float* in, size_t n, float* scales) {
  const size_t b = Index() / 32;
  if (b >= wire::BlockCount<kScaleBlock>(n)) return;  // the whole warp: b is the warp's
  const int lane = threadIdx.x % 32;
  const size_t lo = b * kScaleBlock, hi = min(n, lo + kScaleBlock);
  float most = 0;
  bool finite = true;
  for (size_t i = lo + lane; i < hi; i += 32) {
    const float a = fabsf(in[i]);
    finite = finite && wire::Finite(a);
    if (a > most) most = a;
  }
  for (int offset = 16; offset > 0; offset /= 2) most = fmaxf(most, __shfl_xor_sync(~0u, most, offset));
  finite = __all_sync(~0u, finite);
  if (lane == 0) scales[b] = wire::QuantizedScale<kBits>(most, finite);
}

// int2 and int1h (root mean squares): one thread per block, its sum of squares in the CPU's order,
// so the scale is its bits too.
template <class F>
__global__ void SummedScales(const float* in, size_t n, float* scales) {
  const size_t b = Index();
  if (b >= wire::BlockCount<F::kBlock>(n)) return;
  const size_t lo = b * F::kBlock;
  scales[b] = F::Scale(in + lo, min(n - lo, F::kBlock));
}

// One thread per byte of the packed values: the bits of every value that reaches into it (a
// 3-bit value may straddle two bytes; each byte takes its own part). A block whose scale is 0 or
// NaN keeps zeros.
template <class F>
__global__ void PackValues(const float* in, size_t n, const float* scales, uint8_t* values, bool stochastic,
                           StochasticRounding sr) {
  const size_t j = Index();
  if (j >= wire::PackedBytes<F::kBits>(n)) return;
  const size_t first = 8 * j / F::kBits, last = min(n - 1, (8 * j + 7) / F::kBits);
  uint32_t byte = 0;
  for (size_t i = first; i <= last; ++i) {
    const float scale = scales[i / F::kBlock];
    if (!(scale > 0)) continue;
    const uint32_t v = F::Bits(in[i], scale, stochastic ? &sr : nullptr, i);
    const long long shift = static_cast<long long>(F::kBits * i) - static_cast<long long>(8 * j);
    byte |= shift >= 0 ? v << shift : v >> -shift;
  }
  values[j] = static_cast<uint8_t>(byte);
}

template <class F>
__global__ void UnpackValues(const float* scales, const uint8_t* values, size_t n, float* out) {
  const size_t i = Index();
  if (i < n) out[i] = F::Value(wire::GetBits<F::kBits>(values, i), scales[i / F::kBlock]);
}

__global__ void ToHalf(const float* in, size_t n, __half* out) {
  const size_t i = Index();
  if (i < n) out[i] = __float2half_rn(in[i]);
}
__global__ void FromHalf(const __half* in, size_t n, float* out) {
  const size_t i = Index();
  if (i < n) out[i] = __half2float(in[i]);
}
__global__ void ToBf16(const float* in, size_t n, uint16_t* out) {
  const size_t i = Index();
  if (i < n) out[i] = wire::ToBf16(in[i]);
}
__global__ void FromBf16(const uint16_t* in, size_t n, float* out) {
  const size_t i = Index();
  if (i < n) out[i] = wire::FromBf16(in[i]);
}

// int3h, int2h and int1h: one thread per block of kN values, rotated (or back) where whole by
// wire_levels.h's steps, in the CPU's order of operations; a shorter last block is copied.
template <size_t kN>
__global__ void RotateBlocks(const float* in, size_t n, float* out) {
  const size_t lo = Index() * kN;
  if (lo >= n) return;
  if (n - lo >= kN) {
    wire::RotateBlock<kN>(in + lo, out + lo);
  } else {
    for (size_t i = lo; i < n; ++i) out[i] = in[i];
  }
}
template <size_t kN>
__global__ void RotateBlocksBack(float* x, size_t n) {
  const size_t lo = Index() * kN;
  if (lo + kN <= n) wire::UnrotateBlock<kN>(x + lo);
}

// The scales (fp32, one per block), then the packed values (wire_dtype.h).
template <class F>
void Encode(cudaStream_t s, const float* in, size_t n, void* out, const StochasticRounding* sr) {
  const size_t blocks = wire::BlockCount<F::kBlock>(n);
  auto* scales = static_cast<float*>(out);
  auto* values = static_cast<uint8_t*>(out) + 4 * blocks;
  if constexpr (std::is_same_v<F, Int2> || std::is_same_v<F, Int1>) {
    SummedScales<F><<<Grid(blocks), kThreads, 0, s>>>(in, n, scales);
  } else {
    QuantizedScales<F::kBits><<<Grid(32 * blocks), kThreads, 0, s>>>(in, n, scales);
  }
  PackValues<F><<<Grid(wire::PackedBytes<F::kBits>(n)), kThreads, 0, s>>>(in, n, scales, values, sr != nullptr,
                                                                           sr ? *sr : StochasticRounding{});
}

template <class F>
void Decode(cudaStream_t s, const void* in, size_t n, float* out) {
  const size_t blocks = wire::BlockCount<F::kBlock>(n);
  UnpackValues<F><<<Grid(n), kThreads, 0, s>>>(static_cast<const float*>(in),
                                               static_cast<const uint8_t*>(in) + 4 * blocks, n, out);
}

// The rotated dtypes: F's encoding of the blocks rotated, in a stream-ordered scratch tensor.
template <class F>
absl::Status EncodeRotated(cudaStream_t s, const float* in, size_t n, void* out, const StochasticRounding* sr) {
  float* rotated = nullptr;
  LH_RETURN_IF_ERROR(Check(cudaMallocAsync(&rotated, 4 * n, s), "EncodeWire"));
  RotateBlocks<F::kBlock><<<Grid(wire::BlockCount<F::kBlock>(n)), kThreads, 0, s>>>(in, n, rotated);
  Encode<F>(s, rotated, n, out, sr);
  return Check(cudaFreeAsync(rotated, s), "EncodeWire");
}
template <class F>
void DecodeRotated(cudaStream_t s, const void* in, size_t n, float* out) {
  Decode<F>(s, in, n, out);
  if (n >= F::kBlock) RotateBlocksBack<F::kBlock><<<Grid(n / F::kBlock), kThreads, 0, s>>>(out, n);
}

absl::Status Refused(WireDtype d) {
  return absl::InvalidArgumentError(absl::StrCat(
      WireDtypeName(d), " has no device encoding: it is the data-parallel exchange's, which the shards encode on the host"));
}

}  // namespace

absl::Status EncodeWire(cudaStream_t s, const float* in, size_t n, WireDtype d, void* out,
                        const StochasticRounding* sr) {
  if (n == 0 && d != WireDtype::kTopK) return absl::OkStatus();
  switch (d) {
    case WireDtype::kAuto:
    case WireDtype::kF32:
      return Check(cudaMemcpyAsync(out, in, 4 * n, cudaMemcpyDeviceToDevice, s), "EncodeWire");
    case WireDtype::kF16: ToHalf<<<Grid(n), kThreads, 0, s>>>(in, n, static_cast<__half*>(out)); break;
    case WireDtype::kBf16: ToBf16<<<Grid(n), kThreads, 0, s>>>(in, n, static_cast<uint16_t*>(out)); break;
    case WireDtype::kInt8: Encode<Quantized<8>>(s, in, n, out, sr); break;
    case WireDtype::kInt4: Encode<Quantized<4>>(s, in, n, out, sr); break;
    case WireDtype::kInt3: Encode<Quantized<3>>(s, in, n, out, sr); break;
    case WireDtype::kInt2: Encode<Int2>(s, in, n, out, sr); break;
    case WireDtype::kInt3H: LH_RETURN_IF_ERROR(EncodeRotated<Quantized<3>>(s, in, n, out, sr)); break;
    case WireDtype::kInt2H: LH_RETURN_IF_ERROR(EncodeRotated<Int2>(s, in, n, out, sr)); break;
    case WireDtype::kInt1H: LH_RETURN_IF_ERROR(EncodeRotated<Int1>(s, in, n, out, sr)); break;
    case WireDtype::kTopK: return Refused(d);
  }
  return Check(cudaGetLastError(), "EncodeWire");
}

absl::Status DecodeWire(cudaStream_t s, const void* in, size_t n, WireDtype d, float* out) {
  if (n == 0 && d != WireDtype::kTopK) return absl::OkStatus();
  switch (d) {
    case WireDtype::kAuto:
    case WireDtype::kF32:
      return Check(cudaMemcpyAsync(out, in, 4 * n, cudaMemcpyDeviceToDevice, s), "DecodeWire");
    case WireDtype::kF16: FromHalf<<<Grid(n), kThreads, 0, s>>>(static_cast<const __half*>(in), n, out); break;
    case WireDtype::kBf16: FromBf16<<<Grid(n), kThreads, 0, s>>>(static_cast<const uint16_t*>(in), n, out); break;
    case WireDtype::kInt8: Decode<Quantized<8>>(s, in, n, out); break;
    case WireDtype::kInt4: Decode<Quantized<4>>(s, in, n, out); break;
    case WireDtype::kInt3: Decode<Quantized<3>>(s, in, n, out); break;
    case WireDtype::kInt2: Decode<Int2>(s, in, n, out); break;
    case WireDtype::kInt3H: DecodeRotated<Quantized<3>>(s, in, n, out); break;
    case WireDtype::kInt2H: DecodeRotated<Int2>(s, in, n, out); break;
    case WireDtype::kInt1H: DecodeRotated<Int1>(s, in, n, out); break;
    case WireDtype::kTopK: return Refused(d);
  }
  return Check(cudaGetLastError(), "DecodeWire");
}

}  // namespace longhaul::cuda
