#pragma once
// Device and pinned host buffers and events that free themselves, and the CUDA error as a Status,
// for the CUDA backend's .cu files.
#include <cuda_runtime.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace longhaul::cuda {

inline absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorString(e)));
}
#define LH_CUDA(expr, what) LH_RETURN_IF_ERROR(::longhaul::cuda::Check((expr), what))

template <typename U>
struct DeviceArray {
  U* p = nullptr;
  size_t n = 0;
  absl::Status Alloc(size_t count) {
    n = count;
    return count == 0 ? absl::OkStatus() : Check(cudaMalloc(&p, count * sizeof(U)), "cudaMalloc");
  }
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p(std::exchange(o.p, nullptr)), n(o.n) {}
  ~DeviceArray() {
    if (p != nullptr) cudaFree(p);
  }
};

// Page-locked host memory: copies from it run asynchronously and at full bus speed.
struct PinnedArray {
  float* p = nullptr;
  absl::Status Alloc(size_t count) {
    return Check(cudaMallocHost(reinterpret_cast<void**>(&p), count * sizeof(float)), "cudaMallocHost");
  }
  PinnedArray() = default;
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray(PinnedArray&& o) noexcept : p(std::exchange(o.p, nullptr)) {}
  ~PinnedArray() {
    if (p != nullptr) cudaFreeHost(p);
  }
};

// A copy on `stream`, waited for: what set-up, checkpoints and downloads for people need.
inline absl::Status CopySync(cudaStream_t stream, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                             const char* what) {
  LH_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream), what);
  return Check(cudaStreamSynchronize(stream), what);
}

struct Event {
  cudaEvent_t e = nullptr;
  absl::Status Create() { return Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); }
  Event() = default;
  Event(const Event&) = delete;
  Event(Event&& o) noexcept : e(std::exchange(o.e, nullptr)) {}
  ~Event() {
    if (e != nullptr) cudaEventDestroy(e);
  }
};

}  // namespace longhaul::cuda
