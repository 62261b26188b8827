#pragma once
// The wire formats (format/wire_dtype.h) encoded and decoded on the device: the CUDA twins of
// EncodeWire and DecodeWire, byte for byte the CPU's encoding (both call format/wire_levels.h's
// per-value steps), so that a GPU stage can shrink a boundary tensor before it crosses the bus
// and a slow link, and its CPU peers read it as their own. topk is the data-parallel exchange's,
// encoded by the shards on the host: asked for here, it is refused.
#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "format/wire_dtype.h"

namespace longhaul::cuda {

// out (device, 4-byte aligned) receives WireBytes(n, d) bytes of in's n floats (device), queued on
// `stream`; rounded to the nearest level, or stochastically by `sr` (read when the call is made).
absl::Status EncodeWire(cudaStream_t stream, const float* in, size_t n, WireDtype d, void* out,
                        const StochasticRounding* sr = nullptr);
// out (device) receives the n floats of in's encoding (device, 4-byte aligned), queued on `stream`.
absl::Status DecodeWire(cudaStream_t stream, const void* in, size_t n, WireDtype d, float* out);

}  // namespace longhaul::cuda
