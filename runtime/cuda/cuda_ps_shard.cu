#include "cuda/cuda_ps_shard.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/cuda_memory.cuh"
#include "cuda/cuda_ops.cuh"
#include "cuda/host_upload.cuh"
#include "optim/grad_clip.h"

namespace longhaul {
namespace {

using cuda::Check;
using cuda::CopySync;
using cuda::DeviceArray;
using cuda::PinnedArray;

class CudaPsShard final : public PsShard {
 public:
  CudaPsShard(const AdamWConfig& adamw, const ParamLayout& stage_layout, int stage, int shard, int first_tensor,
              int end_tensor, int replicas, int device)
      : PsShard(stage_layout, stage, shard, first_tensor, end_tensor, replicas), adamw_(adamw), device_(device) {}
  ~CudaPsShard() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  absl::Status Init() {
    LH_CUDA(cudaSetDevice(device_), "cudaSetDevice");
    LH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    const size_t n = size();
    for (auto* a : {&params_, &grads_, &incoming_, &m_, &v_}) LH_RETURN_IF_ERROR(a->Alloc(n));
    LH_RETURN_IF_ERROR(decay_.Alloc(n));
    LH_RETURN_IF_ERROR(norm_partial_.Alloc(cuda::kNormPartials));
    LH_RETURN_IF_ERROR(norm_.Alloc(1));
    LH_RETURN_IF_ERROR(host_params_.Alloc(n));
    LH_RETURN_IF_ERROR(uploader_.Init(std::min<size_t>(16 << 20, 4 * n)));
    const std::vector<uint8_t> decay = layout().DecayFlags(0, n);
    return CopySync(stream_, decay_.p, decay.data(), n, cudaMemcpyHostToDevice, "upload decay flags");
  }

  absl::StatusOr<const float*> Params() override { return host_params_.p; }

  absl::Status GetState(float* params, float* m, float* v) override {
    const size_t bytes = size() * 4;
    LH_RETURN_IF_ERROR(CopySync(stream_, params, params_.p, bytes, cudaMemcpyDeviceToHost, "download parameters"));
    LH_RETURN_IF_ERROR(CopySync(stream_, m, m_.p, bytes, cudaMemcpyDeviceToHost, "download moments"));
    return CopySync(stream_, v, v_.p, bytes, cudaMemcpyDeviceToHost, "download moments");
  }

  absl::Status SetState(const float* params, const float* m, const float* v) override {
    const size_t bytes = size() * 4;
    LH_RETURN_IF_ERROR(uploader_.Upload(params_.p, params, bytes, stream_));
    for (auto [from, to] : {std::pair{m, &m_}, std::pair{v, &v_}}) {
      if (from == nullptr) {
        LH_CUDA(cudaMemsetAsync(to->p, 0, bytes, stream_), "zero moments");
      } else {
        LH_RETURN_IF_ERROR(uploader_.Upload(to->p, from, bytes, stream_));
      }
    }
    return RefreshHostParams();  // waits for the uploads
  }

  absl::Status SetParams(const float* params) override {
    LH_RETURN_IF_ERROR(uploader_.Upload(params_.p, params, size() * 4, stream_));
    return RefreshHostParams();  // waits for the upload
  }

  absl::Status GetSecondMoment(float* v) override {
    return CopySync(stream_, v, v_.p, size() * 4, cudaMemcpyDeviceToHost, "download moments");
  }

  absl::Status SetSecondMoment(const float* v) override {
    LH_RETURN_IF_ERROR(uploader_.Upload(v_.p, v, size() * 4, stream_));
    LH_CUDA(cudaStreamSynchronize(stream_), "upload moments");
    return absl::OkStatus();
  }

 private:
  // The host copy the broadcast sends, after every change.
  absl::Status RefreshHostParams() {
    return CopySync(stream_, host_params_.p, params_.p, size() * 4, cudaMemcpyDeviceToHost, "download parameters");
  }

  absl::Status Accumulate(bool first, const std::vector<float>& grad) override {
    // Returns once `grad` is staged, so the caller may reuse it at once.
    LH_RETURN_IF_ERROR(uploader_.Upload(first ? grads_.p : incoming_.p, grad.data(), size() * 4, stream_));
    if (!first) cuda::Add(stream_, grads_.p, grads_.p, incoming_.p, static_cast<long>(size()));
    return Check(cudaGetLastError(), "sum gradients");
  }

  absl::StatusOr<double> AverageAndSquaredNorm(float scale) override {
    const long n = static_cast<long>(size());
    cuda::Scale(stream_, grads_.p, scale, n);
    cuda::SquaredNorm(stream_, norm_partial_.p, norm_.p, grads_.p, n);
    double sum = 0;
    LH_RETURN_IF_ERROR(CopySync(stream_, &sum, norm_.p, sizeof(double), cudaMemcpyDeviceToHost, "gradient norm"));
    return sum;
  }

  absl::StatusOr<OptimizerStepResult> Apply(const LrSchedule& schedule, float grad_clip, int64_t step,
                                            double global_norm) override {
    OptimizerStepResult r;
    r.grad_norm = global_norm;
    if (!std::isfinite(global_norm)) return r;  // as in host memory: no update
    const long n = static_cast<long>(size());
    r.lr = schedule.At(step);
    cuda::AdamW(stream_, params_.p, static_cast<float*>(nullptr), grads_.p, ClipFactor(global_norm, grad_clip), m_.p,
                v_.p, decay_.p, r.lr, adamw_.beta1, adamw_.beta2, adamw_.eps, adamw_.weight_decay, step + 1, n);
    LH_CUDA(cudaGetLastError(), "AdamW");
    LH_RETURN_IF_ERROR(RefreshHostParams());
    return r;
  }

  absl::Status ApplyOuter(float lr, float momentum) override {
    cuda::Nesterov(stream_, params_.p, grads_.p, m_.p, lr, momentum, static_cast<long>(size()));
    LH_CUDA(cudaGetLastError(), "Nesterov step");
    return RefreshHostParams();
  }

  const AdamWConfig adamw_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  DeviceArray<float> params_, grads_, incoming_, m_, v_;
  DeviceArray<uint8_t> decay_;
  DeviceArray<double> norm_partial_, norm_;
  PinnedArray host_params_;
  cuda::HostUploader uploader_;  // gradients and state from the host
};

}  // namespace

absl::StatusOr<std::unique_ptr<PsShard>> MakeCudaPsShard(const AdamWConfig& adamw, const ParamLayout& stage_layout,
                                                         int stage, int shard, int first_tensor, int end_tensor,
                                                         int replicas, int device) {
  auto s = std::make_unique<CudaPsShard>(adamw, stage_layout, stage, shard, first_tensor, end_tensor, replicas, device);
  if (absl::Status st = s->Init(); !st.ok()) return st;
  return std::unique_ptr<PsShard>(std::move(s));
}

}  // namespace longhaul
