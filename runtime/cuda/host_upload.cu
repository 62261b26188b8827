#include "cuda/host_upload.cuh"

#include <algorithm>

#include "absl/status/status.h"

#include "util/parallel_copy.h"

namespace longhaul::cuda {

absl::Status HostUploader::Init(size_t half_bytes) {
  half_bytes_ = (half_bytes + 15) / 16 * 16;
  LH_RETURN_IF_ERROR(halves_.Alloc(2 * half_bytes_ / sizeof(float)));
  for (Event& e : free_) LH_RETURN_IF_ERROR(e.Create());
  return absl::OkStatus();
}

absl::Status HostUploader::Upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  char* half[2] = {reinterpret_cast<char*>(halves_.p), reinterpret_cast<char*>(halves_.p) + half_bytes_};
  for (size_t off = 0, i = 0; off < bytes; off += half_bytes_, ++i) {
    const size_t n = std::min(half_bytes_, bytes - off);
    LH_CUDA(cudaEventSynchronize(free_[i % 2].e), "staging buffer");
    ParallelCopy(half[i % 2], static_cast<const char*>(src) + off, n);
    LH_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + off, half[i % 2], n, cudaMemcpyHostToDevice, stream), "upload");
    LH_CUDA(cudaEventRecord(free_[i % 2].e, stream), "record");
  }
  return absl::OkStatus();
}

}  // namespace longhaul::cuda
