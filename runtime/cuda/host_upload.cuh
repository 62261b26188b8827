#pragma once
// Copies from pageable host memory (a caller's vectors) to the device at the bus's rate. A plain
// cudaMemcpy from pageable memory goes through the driver's own staging at a fraction of it: on
// an H200, a GPT-3 XL stage's 134 MB boundary tensor took longer to upload than its two blocks
// took to compute. Here every core copies into one of two pinned halves while the copy engine
// drains the other.
#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"

#include "cuda/cuda_memory.cuh"

namespace longhaul::cuda {

class HostUploader {
 public:
  // Halves of at most `half_bytes` each (smaller uploads take less).
  absl::Status Init(size_t half_bytes);
  // dst (device) <- src (host), queued on `stream`; src may be reused once this returns. Returns
  // early only when the halves are free: a host wait on the copies two halves back.
  absl::Status Upload(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  PinnedArray halves_;  // floats; used as bytes
  size_t half_bytes_ = 0;
  Event free_[2];
};

}  // namespace longhaul::cuda
