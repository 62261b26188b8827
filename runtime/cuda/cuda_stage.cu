#include "cuda/cuda_stage.h"

#include <cublas_v2.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/cuda_ops.cuh"
#include "model/memory_estimate.h"
#include "optim/grad_clip.h"

namespace longhaul {

int CudaDeviceCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = absl::StrCat("no usable CUDA driver or device: ", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0) *why = "no CUDA device";
  return n;
}

namespace {

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorString(e)));
}
#define LH_RETURN_IF(expr)                       \
  do {                                           \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)
#define LH_CUDA(expr, what)                                \
  do {                                                     \
    if (absl::Status s_ = Check((expr), what); !s_.ok()) return s_; \
  } while (0)

template <typename U>
struct DeviceArray {
  U* p = nullptr;
  size_t n = 0;
  absl::Status Alloc(size_t count) {
    n = count;
    return count == 0 ? absl::OkStatus() : Check(cudaMalloc(&p, count * sizeof(U)), "cudaMalloc");
  }
  ~DeviceArray() {
    if (p != nullptr) cudaFree(p);
  }
};

template <typename T>
class Stage final : public CudaStage {
 public:
  Stage(const ModelConfig& cfg, const StageSpec& spec, int B, int Tn, Precision precision)
      : cfg_(cfg), spec_(spec), layout_(cfg, spec), B_(B), T_(Tn), precision_(precision) {}
  ~Stage() override {
    if (blas_ != nullptr) cublasDestroy(blas_);
  }

  absl::Status Init(int device) {
    LH_CUDA(cudaSetDevice(device), "cudaSetDevice");
    LH_RETURN_IF(CheckDeviceMemory(device));
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
    const size_t P = layout_.total(), N = static_cast<size_t>(B_) * T_, C = cfg_.d_model, V = cfg_.vocab_size;
    const size_t nb = spec_.end_block - spec_.first_block, NH = cfg_.n_head;
    for (auto* a : {&params_, &grads_, &m_, &v_}) LH_RETURN_IF(a->Alloc(P));
    LH_RETURN_IF(decay_.Alloc(P));
    std::vector<uint8_t> decay(P, 0);
    for (const ParamTensor& t : layout_.tensors())
      if (t.decay) std::fill(decay.begin() + t.offset, decay.begin() + t.offset + t.size, 1);
    LH_CUDA(cudaMemcpy(decay_.p, decay.data(), P, cudaMemcpyHostToDevice), "upload decay flags");
    LH_CUDA(cudaMemset(m_.p, 0, P * 4), "zero moments");
    LH_CUDA(cudaMemset(v_.p, 0, P * 4), "zero moments");
    if (!std::is_same_v<T, float>) LH_RETURN_IF(weights_.Alloc(P));
    blocks_.resize(nb);
    for (BlockActs& a : blocks_) {
      for (auto* x : {&a.ln1, &a.atty, &a.res2, &a.ln2, &a.out}) LH_RETURN_IF(x->Alloc(N * C));
      LH_RETURN_IF(a.qkv.Alloc(N * 3 * C));
      for (auto* x : {&a.q, &a.k, &a.v, &a.y}) LH_RETURN_IF(x->Alloc(N * C));
      LH_RETURN_IF(a.att.Alloc(static_cast<size_t>(B_) * NH * T_ * T_));
      for (auto* x : {&a.fch, &a.fch_gelu}) LH_RETURN_IF(x->Alloc(N * 4 * C));
      for (auto* x : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2}) LH_RETURN_IF(x->Alloc(N));
    }
    LH_RETURN_IF(x0_.Alloc(N * C));
    LH_RETURN_IF(boundary_.Alloc(N * C));
    LH_RETURN_IF(g_.Alloc(N * C));
    for (auto* x : {&gT_, &g_ln_, &g_atty_, &dq_, &dk_, &dv_, &dy_}) LH_RETURN_IF(x->Alloc(N * C));
    LH_RETURN_IF(g_qkv_.Alloc(N * 3 * C));
    LH_RETURN_IF(g_fch_.Alloc(N * 4 * C));
    LH_RETURN_IF(datt_.Alloc(static_cast<size_t>(B_) * NH * T_ * T_));
    for (auto* x : {&tokens_, &targets_, &prefix_}) LH_RETURN_IF(x->Alloc(N));
    LH_RETURN_IF(weight_.Alloc(N));
    if (spec_.has_head) {
      LH_RETURN_IF(lnf_.Alloc(N * C));
      for (auto* x : {&meanf_, &rstdf_, &losses_}) LH_RETURN_IF(x->Alloc(N));
      LH_RETURN_IF(logits_.Alloc(N * V));
      LH_RETURN_IF(dlogits_.Alloc(N * V));
    }
    LH_RETURN_IF(norm_partial_.Alloc(1024));
    LH_RETURN_IF(norm_.Alloc(1));
    return ZeroGrads();
  }

  // Refuses before allocating when the device's free memory cannot hold the stage.
  absl::Status CheckDeviceMemory(int device) const {
    size_t free_bytes = 0, total_bytes = 0;
    LH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    StageMemoryRequest req;
    req.model = cfg_;
    req.spec = spec_;
    req.B = B_;
    req.T = T_;
    req.backend = Backend::kCuda;
    req.precision = precision_;
    const MemoryEstimate need = EstimateStage(req);
    if (need.total() <= static_cast<double>(free_bytes)) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "the stage needs about ", need.ToString(), " of device memory but cuda:", device, " has ",
        FormatBytes(static_cast<double>(free_bytes)), " free of ", FormatBytes(static_cast<double>(total_bytes)),
        ": lower train.micro_batch_size or train.seq_len, compute in train.precision = \"bf16\", or use a smaller "
        "model"));
  }

  const ParamLayout& layout() const override { return layout_; }
  size_t num_params() const override { return layout_.total(); }
  Precision precision() const override { return precision_; }

  absl::Status InitParams(uint64_t seed) override {
    std::vector<float> host(layout_.total());
    InitGpt2Params(cfg_, layout_, seed, host.data());
    return UploadParams(host.data());
  }
  absl::Status UploadParams(const float* host) override {
    LH_CUDA(cudaMemcpy(params_.p, host, params_.n * 4, cudaMemcpyHostToDevice), "upload parameters");
    RefreshWeights();
    return Check(cudaDeviceSynchronize(), "upload parameters");
  }
  absl::Status DownloadParams(float* host) override {
    return Check(cudaMemcpy(host, params_.p, params_.n * 4, cudaMemcpyDeviceToHost), "download parameters");
  }
  absl::Status DownloadGrads(float* host) override {
    LH_CUDA(cudaMemcpy(host, grads_.p, grads_.n * 4, cudaMemcpyDeviceToHost), "download gradients");
    if (loss_scale_ != 1.0f)
      for (size_t i = 0; i < grads_.n; ++i) host[i] /= loss_scale_;
    return absl::OkStatus();
  }
  absl::Status DownloadProbs(float* host) override {
    return Check(cudaMemcpy(host, logits_.p, logits_.n * 4, cudaMemcpyDeviceToHost), "download probabilities");
  }
  absl::Status ZeroGrads() override { return Check(cudaMemset(grads_.p, 0, grads_.n * 4), "zero gradients"); }
  absl::Status DownloadOptimizerState(float* m, float* v) override {
    LH_CUDA(cudaMemcpy(m, m_.p, m_.n * 4, cudaMemcpyDeviceToHost), "download moments");
    return Check(cudaMemcpy(v, v_.p, v_.n * 4, cudaMemcpyDeviceToHost), "download moments");
  }
  absl::Status UploadOptimizerState(const float* m, const float* v) override {
    LH_CUDA(cudaMemcpy(m_.p, m, m_.n * 4, cudaMemcpyHostToDevice), "upload moments");
    return Check(cudaMemcpy(v_.p, v, v_.n * 4, cudaMemcpyHostToDevice), "upload moments");
  }

  absl::StatusOr<float> Forward(const MicroBatch& mb, const float* host_input, float* host_output) override {
    const int N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab_size;
    LH_RETURN_IF(UploadBatch(mb));
    const int* prefix = cfg_.attention == AttentionMask::kPrefixLm ? prefix_.p : nullptr;
    if (spec_.has_embedding) {
      cuda::EmbeddingForward(0, x0_.p, tokens_.p, W(layout_.wte()), W(layout_.wpe()), B_, T_, C);
    } else {
      LH_CUDA(cudaMemcpy(boundary_.p, host_input, static_cast<size_t>(N) * C * 4, cudaMemcpyHostToDevice), "input");
      cuda::Cast(0, x0_.p, boundary_.p, static_cast<long>(N) * C);
    }
    for (int l = spec_.first_block; l < spec_.end_block; ++l) BlockForward(l, BlockInput(l), blocks_[l - spec_.first_block], prefix);
    const T* x = BlockInput(spec_.end_block);
    float loss = 0.0f;
    if (spec_.has_head) {
      cuda::LayerNormForward(0, lnf_.p, meanf_.p, rstdf_.p, x, P(layout_.lnf_w()), P(layout_.lnf_b()), N, C);
      cuda::HeadForward(blas_, logits_.p, lnf_.p, HeadW(), N, C, V);
      cuda::CrossEntropyForward(0, logits_.p, losses_.p, targets_.p, N, V);
      std::vector<float> losses(N);
      LH_CUDA(cudaMemcpy(losses.data(), losses_.p, N * 4, cudaMemcpyDeviceToHost), "losses");
      double num = 0, den = 0;
      for (int n = 0; n < N; ++n) num += static_cast<double>(mb.loss_weight[n]) * losses[n], den += mb.loss_weight[n];
      loss = den > 0 ? static_cast<float>(num / den) : 0.0f;
    } else {
      cuda::CastToFloat(0, boundary_.p, x, static_cast<long>(N) * C);
      LH_CUDA(cudaMemcpy(host_output, boundary_.p, static_cast<size_t>(N) * C * 4, cudaMemcpyDeviceToHost), "output");
    }
    LH_CUDA(cudaGetLastError(), "forward");
    return loss;
  }

  absl::Status Backward(const MicroBatch& mb, const float* host_grad_out, float loss_scale, float* host_grad_in) override {
    const int N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab_size;
    const int* prefix = cfg_.attention == AttentionMask::kPrefixLm ? prefix_.p : nullptr;
    if (spec_.has_head) {
      double wsum = 0;
      for (float w : mb.loss_weight) wsum += w;
      const float scale = wsum > 0 ? static_cast<float>(loss_scale * loss_scale_ / wsum) : 0.0f;
      cuda::CrossEntropyBackward(0, dlogits_.p, logits_.p, targets_.p, weight_.p, scale, N, V);
      cuda::LinearBackward(blas_, 0, g_ln_.p, HeadG(), static_cast<float*>(nullptr), dlogits_.p, lnf_.p, HeadW(), N, C, V);
      LH_CUDA(cudaMemset(g_.p, 0, static_cast<size_t>(N) * C * 4), "zero residual gradient");
      cuda::LayerNormBackward(0, g_.p, G(layout_.lnf_w()), G(layout_.lnf_b()), g_ln_.p, BlockInput(spec_.end_block),
                              P(layout_.lnf_w()), meanf_.p, rstdf_.p, N, C);
    } else {
      LH_CUDA(cudaMemcpy(g_.p, host_grad_out, static_cast<size_t>(N) * C * 4, cudaMemcpyHostToDevice), "grad out");
      if (loss_scale_ != 1.0f) cuda::Scale(0, g_.p, loss_scale_, static_cast<long>(N) * C);
    }
    for (int l = spec_.end_block - 1; l >= spec_.first_block; --l)
      BlockBackward(l, BlockInput(l), blocks_[l - spec_.first_block], prefix);
    if (spec_.has_embedding) {
      cuda::EmbeddingBackward(0, G(layout_.wte()), G(layout_.wpe()), g_.p, tokens_.p, B_, T_, C);
    } else {
      if (loss_scale_ != 1.0f) cuda::Scale(0, g_.p, 1.0f / loss_scale_, static_cast<long>(N) * C);
      LH_CUDA(cudaMemcpy(host_grad_in, g_.p, static_cast<size_t>(N) * C * 4, cudaMemcpyDeviceToHost), "grad in");
    }
    return Check(cudaGetLastError(), "backward");
  }

  absl::StatusOr<CudaStepResult> Step(const AdamWConfig& adamw, const LrSchedule& schedule, float grad_clip,
                                      int64_t step) override {
    const long P = static_cast<long>(params_.n);
    cuda::SquaredNorm(0, norm_partial_.p, norm_.p, grads_.p, P);
    double sumsq = 0;
    LH_CUDA(cudaMemcpy(&sumsq, norm_.p, sizeof(double), cudaMemcpyDeviceToHost), "gradient norm");
    CudaStepResult r;
    r.grad_norm = std::sqrt(sumsq) / loss_scale_;
    r.lr = schedule.At(step);
    if (!std::isfinite(r.grad_norm)) {
      if (precision_ != Precision::kFp16) {
        return absl::InternalError(absl::StrFormat("step %d: gradient norm is not finite: lower train.lr", step + 1));
      }
      loss_scale_ = std::max(1.0f, loss_scale_ / 2);  // overflow: skip the update, lower the scale
      good_steps_ = 0;
      r.skipped = true;
      r.loss_scale = loss_scale_;
      return r;
    }
    const float factor = ClipFactor(r.grad_norm, grad_clip) / loss_scale_;
    if (factor != 1.0f) cuda::Scale(0, grads_.p, factor, P);
    cuda::AdamW(0, params_.p, grads_.p, m_.p, v_.p, decay_.p, r.lr, adamw.beta1, adamw.beta2, adamw.eps,
                adamw.weight_decay, step + 1, P);
    RefreshWeights();
    if (precision_ == Precision::kFp16 && ++good_steps_ % kGrowthInterval == 0) loss_scale_ *= 2;
    r.loss_scale = loss_scale_;
    LH_CUDA(cudaDeviceSynchronize(), "optimizer step");
    return r;
  }

 private:
  struct BlockActs {
    DeviceArray<T> ln1, qkv, q, k, v, att, y, atty, res2, ln2, fch, fch_gelu, out;
    DeviceArray<float> mean1, rstd1, mean2, rstd2;
  };

  const float* P(int t) const { return params_.p + layout_.tensors()[t].offset; }
  float* G(int t) { return grads_.p + layout_.tensors()[t].offset; }
  const T* W(int t) const {
    const size_t off = layout_.tensors()[t].offset;
    if constexpr (std::is_same_v<T, float>) {
      return params_.p + off;
    } else {
      return weights_.p + off;
    }
  }
  const T* HeadW() const { return W(cfg_.tied_head ? layout_.wte() : layout_.lm_head()); }
  float* HeadG() { return G(cfg_.tied_head ? layout_.wte() : layout_.lm_head()); }
  const T* BlockInput(int l) const {
    return l == spec_.first_block ? x0_.p : blocks_[l - 1 - spec_.first_block].out.p;
  }
  void RefreshWeights() {
    if constexpr (!std::is_same_v<T, float>) cuda::Cast(0, weights_.p, params_.p, static_cast<long>(params_.n));
  }

  absl::Status UploadBatch(const MicroBatch& mb) {
    const size_t N = static_cast<size_t>(B_) * T_;
    LH_CUDA(cudaMemcpy(tokens_.p, mb.tokens.data(), N * 4, cudaMemcpyHostToDevice), "tokens");
    LH_CUDA(cudaMemcpy(targets_.p, mb.targets.data(), N * 4, cudaMemcpyHostToDevice), "targets");
    LH_CUDA(cudaMemcpy(weight_.p, mb.loss_weight.data(), N * 4, cudaMemcpyHostToDevice), "loss weights");
    return Check(cudaMemcpy(prefix_.p, mb.prefix_len.data(), B_ * 4, cudaMemcpyHostToDevice), "prefix lengths");
  }

  void Attention(BlockActs& a, const int* prefix) {
    const int C = cfg_.d_model, NH = cfg_.n_head, hs = C / NH, BH = B_ * NH;
    const long sh = static_cast<long>(T_) * hs, st = static_cast<long>(T_) * T_;
    cuda::SplitHeads(0, a.q.p, a.k.p, a.v.p, a.qkv.p, B_, T_, C, NH);
    cuda::BatchedGemm(blas_, false, true, T_, T_, hs, 1.0f, a.q.p, sh, a.k.p, sh, 0.0f, a.att.p, st, BH);
    cuda::MaskedSoftmaxForward(0, a.att.p, prefix, 1.0f / std::sqrt(static_cast<float>(hs)), B_, NH, T_);
    cuda::BatchedGemm(blas_, false, false, T_, hs, T_, 1.0f, a.att.p, st, a.v.p, sh, 0.0f, a.y.p, sh, BH);
    cuda::MergeHeads(0, a.atty.p, a.y.p, B_, T_, C, NH);
  }

  void AttentionBackward(BlockActs& a, const int* prefix) {
    const int C = cfg_.d_model, NH = cfg_.n_head, hs = C / NH, BH = B_ * NH;
    const long sh = static_cast<long>(T_) * hs, st = static_cast<long>(T_) * T_;
    cuda::MergeHeadsBackward(0, dy_.p, g_atty_.p, B_, T_, C, NH);
    cuda::BatchedGemm(blas_, false, true, T_, T_, hs, 1.0f, dy_.p, sh, a.v.p, sh, 0.0f, datt_.p, st, BH);
    cuda::BatchedGemm(blas_, true, false, T_, hs, T_, 1.0f, a.att.p, st, dy_.p, sh, 0.0f, dv_.p, sh, BH);
    cuda::MaskedSoftmaxBackward(0, datt_.p, a.att.p, prefix, 1.0f / std::sqrt(static_cast<float>(hs)), B_, NH, T_);
    cuda::BatchedGemm(blas_, false, false, T_, hs, T_, 1.0f, datt_.p, st, a.k.p, sh, 0.0f, dq_.p, sh, BH);
    cuda::BatchedGemm(blas_, true, false, T_, hs, T_, 1.0f, datt_.p, st, a.q.p, sh, 0.0f, dk_.p, sh, BH);
    cuda::SplitHeadsBackward(0, g_qkv_.p, dq_.p, dk_.p, dv_.p, B_, T_, C, NH);
  }

  void BlockForward(int l, const T* x, BlockActs& a, const int* prefix) {
    const BlockTensors& w = layout_.block(l);
    const int N = B_ * T_, C = cfg_.d_model;
    cuda::LayerNormForward(0, a.ln1.p, a.mean1.p, a.rstd1.p, x, P(w.ln1_w), P(w.ln1_b), N, C);
    cuda::LinearForward(blas_, 0, a.qkv.p, a.ln1.p, W(w.qkv_w), P(w.qkv_b), N, C, 3 * C, false);
    Attention(a, prefix);
    cudaMemcpyAsync(a.res2.p, x, static_cast<size_t>(N) * C * sizeof(T), cudaMemcpyDeviceToDevice, 0);
    cuda::LinearForward(blas_, 0, a.res2.p, a.atty.p, W(w.attn_proj_w), P(w.attn_proj_b), N, C, C, true);
    cuda::LayerNormForward(0, a.ln2.p, a.mean2.p, a.rstd2.p, a.res2.p, P(w.ln2_w), P(w.ln2_b), N, C);
    cuda::LinearForward(blas_, 0, a.fch.p, a.ln2.p, W(w.fc_w), P(w.fc_b), N, C, 4 * C, false);
    cuda::GeluForward(0, a.fch_gelu.p, a.fch.p, static_cast<long>(N) * 4 * C);
    cudaMemcpyAsync(a.out.p, a.res2.p, static_cast<size_t>(N) * C * sizeof(T), cudaMemcpyDeviceToDevice, 0);
    cuda::LinearForward(blas_, 0, a.out.p, a.fch_gelu.p, W(w.fc_proj_w), P(w.fc_proj_b), N, 4 * C, C, true);
  }

  // g_ (N, C) fp32: ∂L/∂block output on entry, ∂L/∂block input on exit.
  void BlockBackward(int l, const T* x, BlockActs& a, const int* prefix) {
    const BlockTensors& w = layout_.block(l);
    const int N = B_ * T_, C = cfg_.d_model;
    const long NC = static_cast<long>(N) * C;
    cuda::Cast(0, gT_.p, g_.p, NC);
    cuda::LinearBackward(blas_, 0, g_fch_.p, G(w.fc_proj_w), G(w.fc_proj_b), gT_.p, a.fch_gelu.p, W(w.fc_proj_w), N,
                         4 * C, C);
    cuda::GeluBackward(0, g_fch_.p, a.fch.p, static_cast<long>(N) * 4 * C);
    cuda::LinearBackward(blas_, 0, g_ln_.p, G(w.fc_w), G(w.fc_b), g_fch_.p, a.ln2.p, W(w.fc_w), N, C, 4 * C);
    cuda::LayerNormBackward(0, g_.p, G(w.ln2_w), G(w.ln2_b), g_ln_.p, a.res2.p, P(w.ln2_w), a.mean2.p, a.rstd2.p, N, C);
    cuda::Cast(0, gT_.p, g_.p, NC);
    cuda::LinearBackward(blas_, 0, g_atty_.p, G(w.attn_proj_w), G(w.attn_proj_b), gT_.p, a.atty.p, W(w.attn_proj_w), N,
                         C, C);
    AttentionBackward(a, prefix);
    cuda::LinearBackward(blas_, 0, g_ln_.p, G(w.qkv_w), G(w.qkv_b), g_qkv_.p, a.ln1.p, W(w.qkv_w), N, C, 3 * C);
    cuda::LayerNormBackward(0, g_.p, G(w.ln1_w), G(w.ln1_b), g_ln_.p, x, P(w.ln1_w), a.mean1.p, a.rstd1.p, N, C);
  }

  ModelConfig cfg_;
  StageSpec spec_;
  ParamLayout layout_;
  int B_, T_;
  Precision precision_;
  cublasHandle_t blas_ = nullptr;
  float loss_scale_ = std::is_same_v<T, __half> ? 65536.0f : 1.0f;
  int64_t good_steps_ = 0;

  DeviceArray<float> params_, grads_, m_, v_;
  DeviceArray<uint8_t> decay_;
  DeviceArray<T> weights_;  // compute copy of params_ (not allocated for fp32)
  std::vector<BlockActs> blocks_;
  DeviceArray<T> x0_, gT_, g_ln_, g_atty_, g_qkv_, g_fch_, dq_, dk_, dv_, dy_, datt_, lnf_, dlogits_;
  DeviceArray<float> boundary_, g_, meanf_, rstdf_, logits_, losses_, weight_, norm_partial_;
  DeviceArray<double> norm_;
  DeviceArray<int> tokens_, targets_, prefix_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<CudaStage>> Make(const ModelConfig& cfg, const StageSpec& spec, int B, int Tn,
                                                Precision precision, int device) {
  auto stage = std::make_unique<Stage<T>>(cfg, spec, B, Tn, precision);
  if (absl::Status st = stage->Init(device); !st.ok()) return st;
  return std::unique_ptr<CudaStage>(std::move(stage));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaStage>> CudaStage::Create(const ModelConfig& cfg, const StageSpec& spec, int B, int T,
                                                             Precision precision, int device) {
  if (absl::Status s = cfg.Validate(); !s.ok()) return s;
  if (absl::Status s = spec.Validate(cfg); !s.ok()) return s;
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (device < 0 || device >= devices) {
    return absl::FailedPreconditionError(
        devices == 0 ? absl::StrCat("backend cuda:", device, " asked for, but ", why, "; use train.backend = \"cpu\"")
                     : absl::StrFormat("backend cuda:%d asked for, but this machine has %d CUDA devices", device,
                                       devices));
  }
  switch (precision) {
    case Precision::kFp32:
      return Make<float>(cfg, spec, B, T, precision, device);
    case Precision::kBf16:
      return Make<__nv_bfloat16>(cfg, spec, B, T, precision, device);
    case Precision::kFp16:
      return Make<__half>(cfg, spec, B, T, precision, device);
  }
  return absl::InvalidArgumentError("unknown precision");
}

}  // namespace longhaul
