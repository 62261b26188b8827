#include "cuda/cuda_stage.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/cublas_api.h"
#include "cuda/cuda_memory.cuh"
#include "cuda/cuda_ops.cuh"
#include "cuda/flash_attention.cuh"
#include "cuda/host_upload.cuh"
#include "cuda/low_rank.cuh"
#include "model/low_rank_method.h"
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

absl::StatusOr<double> CudaFreeMemory(int device) {
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (device < 0 || device >= devices) {
    return absl::FailedPreconditionError(
        devices == 0 ? why
                     : absl::StrFormat("cuda:%d asked for, but this machine has %d CUDA devices", device, devices));
  }
  int was = 0;
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t e = cudaGetDevice(&was);
  if (e == cudaSuccess) e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_bytes, &total_bytes);
  cudaSetDevice(was);
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemGetInfo on cuda:", device, ": ", cudaGetErrorString(e)));
  }
  return static_cast<double>(free_bytes);
}

namespace {

using cuda::Check;
using cuda::CopySync;
using cuda::DeviceArray;
using cuda::Event;
using cuda::PinnedArray;

// Sizes of what attention keeps: in the flash style one log-sum-exp per query and head
// (`lse` elements), otherwise the heads split out and the (T, T) probabilities (`att`).
struct AttentionSizes {
  bool flash;
  size_t lse, att;
};

template <typename T>
struct BlockActs {
  DeviceArray<T> ln1, qkv, q, k, v, att, y, atty, res2, ln2, fch, fch_gelu, out;
  DeviceArray<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
  absl::Status Alloc(size_t N, size_t C, const AttentionSizes& a) {
    for (auto* x : {&ln1, &atty, &res2, &ln2, &out}) LH_RETURN_IF_ERROR(x->Alloc(N * C));
    if (a.flash) {
      LH_RETURN_IF_ERROR(lse.Alloc(a.lse));
    } else {
      for (auto* x : {&q, &k, &v, &y}) LH_RETURN_IF_ERROR(x->Alloc(N * C));
      LH_RETURN_IF_ERROR(att.Alloc(a.att));
    }
    LH_RETURN_IF_ERROR(qkv.Alloc(N * 3 * C));
    for (auto* x : {&fch, &fch_gelu}) LH_RETURN_IF_ERROR(x->Alloc(N * 4 * C));
    for (auto* x : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd}) LH_RETURN_IF_ERROR(x->Alloc(N));
    return absl::OkStatus();
  }
};

// What one micro-batch keeps between its forward and its backward.
template <typename T>
struct Slot {
  std::vector<BlockActs<T>> blocks;    // without recompute
  std::vector<DeviceArray<T>> inputs;  // with recompute: the input of blocks first+1 .. end (the last is the output)
  DeviceArray<T> x0, lnf;
  DeviceArray<float> lnf_mean, lnf_rstd, logits, weight;
  DeviceArray<int> tokens, targets, prefix, order, starts, distinct_tokens;
  int distinct = 0;
  PinnedArray output, input_grad;  // (B, T, C) fp32 on their way to the host
  Event output_copied, input_grad_copied;
  bool has_input_grad = false;
};

template <typename T>
class StageImpl final : public CudaStage {
 public:
  StageImpl(const ModelConfig& cfg, const StageSpec& spec, const Options& o)
      : cfg_(cfg),
        spec_(spec),
        layout_(cfg, spec),
        subspace_(layout_.SubspaceRuns()),
        o_(o),
        B_(o.B),
        T_(o.T),
        flash_(!std::is_same_v<T, float> && CudaFlashAttention(cfg, o.precision)),
        vocab_ld_(CudaLogitsStride(cfg)) {}
  ~StageImpl() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    if (blas_ != nullptr) LoadedCublas().destroy(blas_);
    for (cudaStream_t st : {stream_, copy_stream_})
      if (st != nullptr) cudaStreamDestroy(st);
  }

  absl::Status Init() {
    LH_CUDA(cudaSetDevice(o_.device), "cudaSetDevice");
    LH_RETURN_IF_ERROR(CheckDeviceMemory());
    cudaDeviceProp prop{};
    LH_CUDA(cudaGetDeviceProperties(&prop, o_.device), "cudaGetDeviceProperties");
    device_name_ = prop.name;
    LH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    LH_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    const absl::StatusOr<const Cublas*> cublas = LoadCublas();
    if (!cublas.ok()) return cublas.status();
    if ((*cublas)->create(&blas_) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
    if ((*cublas)->set_stream(blas_, stream_) != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError("cublasSetStream failed");
    }
    const size_t P = layout_.total(), N = static_cast<size_t>(B_) * T_, C = cfg_.d_model;
    const size_t nb = spec_.end_block - spec_.first_block, heads = static_cast<size_t>(B_) * cfg_.n_head;
    const AttentionSizes att{flash_, heads * T_, heads * T_ * T_};
    LH_RETURN_IF_ERROR(params_.Alloc(P));
    LH_RETURN_IF_ERROR(grads_.Alloc(P));
    if (!std::is_same_v<T, float>) LH_RETURN_IF_ERROR(weights_.Alloc(P));
    slots_.resize(o_.slots);
    for (Slot<T>& s : slots_) {
      if (o_.recompute) {
        s.inputs.resize(nb);
        for (DeviceArray<T>& x : s.inputs) LH_RETURN_IF_ERROR(x.Alloc(N * C));
      } else {
        s.blocks.resize(nb);
        for (BlockActs<T>& a : s.blocks) LH_RETURN_IF_ERROR(a.Alloc(N, C, att));
      }
      LH_RETURN_IF_ERROR(s.x0.Alloc(N * C));
      for (auto* x : {&s.tokens, &s.targets, &s.order, &s.starts, &s.distinct_tokens}) {
        LH_RETURN_IF_ERROR(x->Alloc(N + 1));
      }
      LH_RETURN_IF_ERROR(s.prefix.Alloc(B_));
      LH_RETURN_IF_ERROR(s.weight.Alloc(N));
      if (spec_.has_head) {
        LH_RETURN_IF_ERROR(s.lnf.Alloc(N * C));
        for (auto* x : {&s.lnf_mean, &s.lnf_rstd}) LH_RETURN_IF_ERROR(x->Alloc(N));
        LH_RETURN_IF_ERROR(s.logits.Alloc(N * vocab_ld_));
      } else {
        LH_RETURN_IF_ERROR(s.output.Alloc(N * C));
        LH_RETURN_IF_ERROR(s.output_copied.Create());
      }
      if (!spec_.has_embedding) {
        LH_RETURN_IF_ERROR(s.input_grad.Alloc(N * C));
        LH_RETURN_IF_ERROR(s.input_grad_copied.Create());
      }
    }
    if (o_.recompute && nb > 0) LH_RETURN_IF_ERROR(scratch_.Alloc(N, C, att));
    LH_RETURN_IF_ERROR(input_.Alloc(N * C));
    LH_RETURN_IF_ERROR(uploader_.Init(std::min(kUploadHalf, 4 * std::max(P, N * C))));
    for (Event* e : {&upload_done_, &upload_free_, &input_free_}) LH_RETURN_IF_ERROR(e->Create());
    LH_RETURN_IF_ERROR(boundary_.Alloc(N * C));
    LH_RETURN_IF_ERROR(g_resid_.Alloc(N * C));
    for (auto* x : {&gT_, &g_ln_, &g_atty_}) LH_RETURN_IF_ERROR(x->Alloc(N * C));
    if (flash_) {
      LH_RETURN_IF_ERROR(delta_.Alloc(att.lse));
    } else {
      for (auto* x : {&dq_, &dk_, &dv_, &dy_}) LH_RETURN_IF_ERROR(x->Alloc(N * C));
      LH_RETURN_IF_ERROR(datt_.Alloc(att.att));
    }
    LH_RETURN_IF_ERROR(g_qkv_.Alloc(N * 3 * C));
    LH_RETURN_IF_ERROR(g_fch_.Alloc(N * 4 * C));
    LH_RETURN_IF_ERROR(reduce_scratch_.Alloc(cuda::kRowChunks * 4 * C));  // the widest column sums: fc's bias
    if (spec_.has_head) {
      LH_RETURN_IF_ERROR(losses_.Alloc(N));
      LH_RETURN_IF_ERROR(losses_host_.Alloc(N));
      LH_RETURN_IF_ERROR(dlogits_.Alloc(N * vocab_ld_));
    }
    LH_RETURN_IF_ERROR(norm_partial_.Alloc(cuda::kNormPartials));
    LH_RETURN_IF_ERROR(norm_.Alloc(1));
    LH_RETURN_IF_ERROR(output_free_.Create());
    LH_RETURN_IF_ERROR(grad_free_.Create());
    if (cfg_.subspace_divisor > 1) {
      if (!o_.seed) {
        return absl::InvalidArgumentError("a subspace model's stage needs the seed its fixed embedding is drawn from");
      }
      fixed_ = FixedEmbedding(cfg_, *o_.seed);
      if (!spec_.has_embedding) {
        for (auto [table, dst] : {std::pair{&fixed_.wte(), &fixed_wte_}, {&fixed_.wpe(), &fixed_wpe_}}) {
          DeviceArray<float> staged;
          LH_RETURN_IF_ERROR(staged.Alloc(table->size()));
          LH_RETURN_IF_ERROR(dst->Alloc(table->size()));
          LH_RETURN_IF_ERROR(CopySync(stream_, staged.p, table->data(), table->size() * 4, cudaMemcpyHostToDevice,
                                      "upload the fixed embedding"));
          cuda::Cast(stream_, dst->p, staged.p, static_cast<long>(table->size()));
          LH_CUDA(cudaStreamSynchronize(stream_), "cast the fixed embedding");
        }
      }
    }
    if (o_.seed && o_.init) {
      std::vector<float> init(P);
      InitGpt2Params(cfg_, layout_, *o_.seed, init.data());
      LH_RETURN_IF_ERROR(SetParams(0, init.data(), P));
    }
    return ZeroGrads();
  }

  // Refuses before allocating when the device's free memory cannot hold the stage.
  absl::Status CheckDeviceMemory() const {
    size_t free_bytes = 0, total_bytes = 0;
    LH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    StageMemoryRequest req;
    req.model = cfg_;
    req.spec = spec_;
    req.B = B_;
    req.T = T_;
    req.recompute = o_.recompute;
    req.activation_slots = o_.slots;
    req.backend = Backend::kCuda;
    req.precision = o_.precision;
    req.optimizer = o_.optimizer;
    const MemoryEstimate need = EstimateStage(req);
    if (need.total() <= static_cast<double>(free_bytes)) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "the stage needs about ", need.ToString(), " of device memory but cuda:", o_.device, " has ",
        FormatBytes(static_cast<double>(free_bytes)), " free of ", FormatBytes(static_cast<double>(total_bytes)),
        ": lower train.micro_batch_size or train.seq_len, set train.recompute = true, compute in train.precision = "
        "\"bf16\", or use more stages"));
  }

  const ParamLayout& layout() const override { return layout_; }
  const StageSpec& spec() const override { return spec_; }
  std::string Describe() const override {
    return absl::StrFormat("cuda:%d (%s), %s, %d slot%s%s%s", o_.device, device_name_, PrecisionName(o_.precision),
                           o_.slots, o_.slots == 1 ? "" : "s", o_.recompute ? ", recompute" : "",
                           flash_ ? ", flash attention" : "");
  }
  int slots() const override { return o_.slots; }
  bool queues_work() const override { return true; }

  absl::Status ZeroGrads() override {
    return Check(cudaMemsetAsync(grads_.p, 0, grads_.n * 4, stream_), "zero gradients");
  }

  absl::StatusOr<float> Forward(int slot, const MicroBatch& mb, const float* input) override {
    LH_RETURN_IF_ERROR(CheckSlot(slot));
    Slot<T>& s = slots_[slot];
    const int N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab_size;
    const long NC = static_cast<long>(N) * C;
    LH_RETURN_IF_ERROR(UploadBatch(s, mb));
    if (spec_.has_embedding) {
      cuda::EmbeddingForward(stream_, s.x0.p, s.tokens.p, W(layout_.wte()), W(layout_.wpe()), B_, T_, C, 0, C);
    } else {
      // The next forward's input may arrive while this one computes.
      LH_RETURN_IF_ERROR(Arrive(low_rank_acts_, false, input, acts_in_, input_.p, &input_free_));
      cuda::Cast(stream_, s.x0.p, input_.p, NC);
      LH_CUDA(cudaEventRecord(input_free_.e, stream_), "record");
      // A subspace model's boundary carried the first k coordinates; the rest are the fixed
      // embedding's, as the first stage wrote them.
      if (!fixed_.empty()) {
        cuda::EmbeddingForward(stream_, s.x0.p, s.tokens.p, fixed_wte_.p, fixed_wpe_.p, B_, T_, C, fixed_.from(),
                               fixed_.width());
      }
    }
    const int* prefix = Prefix(s);
    for (int l = spec_.first_block; l < spec_.end_block; ++l) {
      BlockActs<T>& a = Acts(s, l);
      BlockForward(l, BlockInput(s, l), a, prefix, o_.recompute ? s.inputs[l - spec_.first_block].p : a.out.p);
    }
    const T* x = BlockInput(s, spec_.end_block);
    if (!spec_.has_head) {
      // boundary_ is free once the last output's copy to the host is done.
      LH_CUDA(cudaStreamWaitEvent(stream_, output_free_.e, 0), "wait for the output copy");
      cuda::CastToFloat(stream_, boundary_.p, x, NC);
      LH_RETURN_IF_ERROR(
          Leave(low_rank_acts_, false, boundary_.p, LowRankSeed(mb, false), acts_out_, s.output.p, s.output_copied,
                output_free_));
      return 0.0f;
    }
    cuda::LayerNormForward(stream_, s.lnf.p, s.lnf_mean.p, s.lnf_rstd.p, x, P(layout_.lnf_w()), P(layout_.lnf_b()), N,
                           C);
    cuda::HeadForward(blas_, s.logits.p, s.lnf.p, HeadWeight(), N, C, V, vocab_ld_);
    cuda::CrossEntropyForward(stream_, s.logits.p, losses_.p, s.targets.p, N, V, vocab_ld_);
    LH_CUDA(cudaMemcpyAsync(losses_host_.p, losses_.p, N * 4, cudaMemcpyDeviceToHost, stream_), "losses");
    LH_CUDA(cudaStreamSynchronize(stream_), "forward");
    double num = 0, den = 0;
    for (int n = 0; n < N; ++n) num += static_cast<double>(mb.loss_weight[n]) * losses_host_.p[n], den += mb.loss_weight[n];
    return den > 0 ? static_cast<float>(num / den) : 0.0f;
  }

  bool EncodeLowRank(const BoundaryShape& acts, const BoundaryShape& grads) override {
    // A subspace model's boundary is narrowed before it goes into low rank: left to the host.
    if (acts.narrowed() || grads.narrowed() || (!acts.low_rank() && !grads.low_rank())) return false;
    const size_t N = static_cast<size_t>(B_) * T_;
    if (acts.rows != N || grads.rows != N || acts.width != cfg_.d_model || grads.width != cfg_.d_model) return false;
    // What leaves goes through the slots' host buffers of N x C floats: shared directions padded
    // past them (a model too small to gain by them) are left to the host too.
    if (acts.sent(true) > N * cfg_.d_model) return false;
    low_rank_acts_ = acts, low_rank_grads_ = grads;
    return true;
  }

  void NextDirections(bool arrive, bool draw, std::function<void(float*, size_t)> round) override {
    arrive_ = arrive && !spec_.has_embedding, draw_ = draw && !spec_.has_head;
    round_ = std::move(round);
  }

  absl::StatusOr<const float*> Output(int slot) override {
    LH_RETURN_IF_ERROR(CheckSlot(slot));
    if (spec_.has_head) return absl::FailedPreconditionError("the last stage has no output to send");
    LH_CUDA(cudaEventSynchronize(slots_[slot].output_copied.e), "output copy");
    return slots_[slot].output.p;
  }

  absl::Status Backward(int slot, const MicroBatch& mb, const float* grad_out, float scale) override {
    LH_RETURN_IF_ERROR(CheckSlot(slot));
    Slot<T>& s = slots_[slot];
    const int N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab_size;
    const long NC = static_cast<long>(N) * C;
    // g_resid_ is free once the last input gradient's copy to the host is done.
    LH_CUDA(cudaStreamWaitEvent(stream_, grad_free_.e, 0), "wait for the gradient copy");
    if (spec_.has_head) {
      double wsum = 0;
      for (float w : mb.loss_weight) wsum += w;
      const float ce_scale = wsum > 0 ? static_cast<float>(scale * loss_scale_ / wsum) : 0.0f;
      cuda::CrossEntropyBackward(stream_, dlogits_.p, s.logits.p, s.targets.p, s.weight.p, ce_scale, N, V, vocab_ld_);
      cuda::HeadBackward(blas_, g_ln_.p, HeadGrad(), dlogits_.p, s.lnf.p, HeadWeight(), N, C, V, vocab_ld_);
      LH_CUDA(cudaMemsetAsync(g_resid_.p, 0, NC * 4, stream_), "zero residual gradient");
      cuda::LayerNormBackward(stream_, g_resid_.p, G(layout_.lnf_w()), G(layout_.lnf_b()), g_ln_.p,
                              BlockInput(s, spec_.end_block), P(layout_.lnf_w()), s.lnf_mean.p, s.lnf_rstd.p,
                              reduce_scratch_.p, N, C);
    } else {
      LH_RETURN_IF_ERROR(Arrive(low_rank_grads_, true, grad_out, grads_in_, g_resid_.p));
      if (loss_scale_ != 1.0f) cuda::Scale(stream_, g_resid_.p, loss_scale_, NC);
    }
    const int* prefix = Prefix(s);
    for (int l = spec_.end_block - 1; l >= spec_.first_block; --l) {
      BlockActs<T>& a = Acts(s, l);
      if (o_.recompute) BlockForward(l, BlockInput(s, l), a, prefix, nullptr);
      BlockBackward(l, BlockInput(s, l), a, prefix);
    }
    if (spec_.has_embedding) {
      const cuda::TokenGroups groups{s.order.p, s.starts.p, s.distinct_tokens.p, s.distinct};
      cuda::EmbeddingBackward(stream_, G(layout_.wte()), G(layout_.wpe()), g_resid_.p, groups, B_, T_, C);
      return Check(cudaGetLastError(), "backward");
    }
    // The input gradient leaves unscaled: the previous stage applies its own loss scale.
    if (loss_scale_ != 1.0f) cuda::Scale(stream_, g_resid_.p, 1.0f / loss_scale_, NC);
    s.has_input_grad = true;
    return Leave(low_rank_grads_, true, g_resid_.p, LowRankSeed(mb, true), grads_out_, s.input_grad.p,
                 s.input_grad_copied, grad_free_);
  }

  absl::StatusOr<const float*> InputGrad(int slot) override {
    LH_RETURN_IF_ERROR(CheckSlot(slot));
    if (spec_.has_embedding || !slots_[slot].has_input_grad) {
      return absl::FailedPreconditionError(absl::StrFormat("no input gradient in slot %d", slot));
    }
    LH_CUDA(cudaEventSynchronize(slots_[slot].input_grad_copied.e), "input gradient copy");
    return slots_[slot].input_grad.p;
  }

  absl::StatusOr<const float*> Params() override {
    if (params_host_.p == nullptr) LH_RETURN_IF_ERROR(params_host_.Alloc(params_.n));
    LH_RETURN_IF_ERROR(
        CopySync(stream_, params_host_.p, params_.p, params_.n * 4, cudaMemcpyDeviceToHost, "download parameters"));
    return params_host_.p;
  }
  absl::StatusOr<const float*> Grads() override {
    LH_RETURN_IF_ERROR(ZeroRuns(subspace_, grads_.p));
    if (grads_host_.p == nullptr) LH_RETURN_IF_ERROR(grads_host_.Alloc(grads_.n));
    LH_RETURN_IF_ERROR(
        CopySync(stream_, grads_host_.p, grads_.p, grads_.n * 4, cudaMemcpyDeviceToHost, "download gradients"));
    if (loss_scale_ != 1.0f)
      for (size_t i = 0; i < grads_.n; ++i) grads_host_.p[i] /= loss_scale_;
    return grads_host_.p;
  }
  absl::Status SetParams(size_t begin, const float* values, size_t n) override {
    if (begin > params_.n || n > params_.n - begin) {
      return absl::OutOfRangeError(absl::StrFormat("parameters [%d, +%d) of a stage of %d", begin, n, params_.n));
    }
    LH_RETURN_IF_ERROR(Upload(params_.p + begin, values, static_cast<long>(n)));
    // A lossy wire or a checkpoint may carry other values where a subspace model holds its own.
    LH_RETURN_IF_ERROR(ZeroRuns(ClipRuns(layout_.SubspaceZeroRuns(), begin, begin + n), params_.p));
    for (const FixedEmbedding::Copy& c : fixed_.Copies(layout_, begin, begin + n)) {
      const size_t width = c.to.length * 4;
      LH_CUDA(cudaMemcpy2DAsync(params_.p + c.to.offset, c.to.rows > 1 ? c.to.stride * 4 : width,
                                (c.position ? fixed_.wpe() : fixed_.wte()).data() + c.from,
                                c.to.rows > 1 ? c.from_stride * 4 : width, width, c.to.rows, cudaMemcpyHostToDevice,
                                stream_),
              "restore the fixed embedding");
    }
    RefreshWeights(begin, n);
    return Check(cudaGetLastError(), "upload parameters");
  }

  absl::Status AttachOptimizer(const OptimizerSettings& settings) override {
    optimizer_ = settings;
    const size_t P = params_.n;
    for (auto* a : {&m_, &v_}) {
      if (a->p == nullptr) LH_RETURN_IF_ERROR(a->Alloc(P));
      LH_CUDA(cudaMemsetAsync(a->p, 0, P * 4, stream_), "zero moments");
    }
    if (decay_.p == nullptr) LH_RETURN_IF_ERROR(decay_.Alloc(P));
    const std::vector<uint8_t> decay = layout_.DecayFlags();
    return CopySync(stream_, decay_.p, decay.data(), P, cudaMemcpyHostToDevice, "upload decay flags");
  }

  absl::StatusOr<OptimizerStepResult> Step(int64_t step) override {
    LH_RETURN_IF_ERROR(CheckOptimizer());
    LH_RETURN_IF_ERROR(ZeroRuns(subspace_, grads_.p));
    const long P = static_cast<long>(params_.n);
    cuda::SquaredNorm(stream_, norm_partial_.p, norm_.p, grads_.p, P);
    double sumsq = 0;
    LH_RETURN_IF_ERROR(CopySync(stream_, &sumsq, norm_.p, sizeof(double), cudaMemcpyDeviceToHost, "gradient norm"));
    OptimizerStepResult r;
    r.grad_norm = std::sqrt(sumsq) / loss_scale_;
    r.lr = optimizer_.schedule.At(step);
    if (!std::isfinite(r.grad_norm)) {
      if (o_.precision != Precision::kFp16) {
        return absl::InternalError(absl::StrFormat("step %d: gradient norm is not finite: lower train.lr", step + 1));
      }
      loss_scale_ = std::max(1.0f, loss_scale_ / 2);  // overflow: skip the update, lower the scale
      good_steps_ = 0;
      r.skipped = true;
      r.loss_scale = loss_scale_;
      return r;
    }
    const float factor = ClipFactor(r.grad_norm, optimizer_.grad_clip) / loss_scale_;
    const AdamWConfig& a = optimizer_.adamw;
    // The compute copy is refreshed in the same pass (fp32 has none: weights_ is not allocated).
    cuda::AdamW(stream_, params_.p, weights_.p, grads_.p, factor, m_.p, v_.p, decay_.p, r.lr, a.beta1, a.beta2, a.eps,
                a.weight_decay, step + 1, P);
    if (o_.precision == Precision::kFp16 && ++good_steps_ % kGrowthInterval == 0) loss_scale_ *= 2;
    r.loss_scale = loss_scale_;
    LH_CUDA(cudaStreamSynchronize(stream_), "optimizer step");
    return r;
  }

  absl::Status GetOptimizerState(float* m, float* v) override {
    LH_RETURN_IF_ERROR(CheckOptimizer());
    LH_RETURN_IF_ERROR(CopySync(stream_, m, m_.p, m_.n * 4, cudaMemcpyDeviceToHost, "download moments"));
    return CopySync(stream_, v, v_.p, v_.n * 4, cudaMemcpyDeviceToHost, "download moments");
  }
  absl::Status SetOptimizerState(const float* m, const float* v) override {
    LH_RETURN_IF_ERROR(CheckOptimizer());
    LH_RETURN_IF_ERROR(Upload(m_.p, m, static_cast<long>(m_.n)));
    return Upload(v_.p, v, static_cast<long>(v_.n));
  }

  absl::Status DownloadProbs(int slot, float* host) override {
    LH_RETURN_IF_ERROR(CheckSlot(slot));
    if (!spec_.has_head) return absl::FailedPreconditionError("only the last stage computes probabilities");
    const size_t V = cfg_.vocab_size;
    LH_CUDA(cudaMemcpy2DAsync(host, V * 4, slots_[slot].logits.p, vocab_ld_ * 4, V * 4, static_cast<size_t>(B_) * T_,
                              cudaMemcpyDeviceToHost, stream_),
            "download probabilities");
    return Check(cudaStreamSynchronize(stream_), "download probabilities");
  }
  absl::Status Synchronize() override {
    LH_CUDA(cudaStreamSynchronize(copy_stream_), "synchronize");
    return Check(cudaStreamSynchronize(stream_), "synchronize");
  }

 private:
  absl::Status CheckSlot(int slot) const {
    if (slot < 0 || slot >= o_.slots) {
      return absl::OutOfRangeError(absl::StrFormat("activation slot %d of a stage with %d", slot, o_.slots));
    }
    return absl::OkStatus();
  }
  absl::Status CheckOptimizer() const {
    if (m_.p == nullptr) return absl::FailedPreconditionError("the stage has no optimizer: call AttachOptimizer first");
    return absl::OkStatus();
  }

  // n floats of host memory into dst on the device, on the copy stream (HostUploader), before
  // anything queued on the compute stream after it. It starts once `free` has happened on the
  // compute stream (dst's last reader), or without one once everything queued there so far has.
  absl::Status Upload(float* dst, const float* src, long n, Event* free = nullptr) {
    if (free == nullptr) {
      free = &upload_free_;
      LH_CUDA(cudaEventRecord(free->e, stream_), "record");
    }
    LH_CUDA(cudaStreamWaitEvent(copy_stream_, free->e, 0), "wait for the compute stream");
    LH_RETURN_IF_ERROR(uploader_.Upload(dst, src, n * 4, copy_stream_));
    LH_CUDA(cudaEventRecord(upload_done_.e, copy_stream_), "record");
    return Check(cudaStreamWaitEvent(stream_, upload_done_.e, 0), "wait for the upload");
  }

  // A copy ordered after everything queued on the compute stream, waited for.
  // n floats from `src` (device) to pinned `dst` on the copy stream once the compute stream gets
  // there; `done` marks the copy's end for the host, `src_free` for the compute stream.
  absl::Status CopyToHost(float* dst, const float* src, long n, Event& done, Event& src_free) {
    LH_CUDA(cudaEventRecord(src_free.e, stream_), "record");
    LH_CUDA(cudaStreamWaitEvent(copy_stream_, src_free.e, 0), "wait");
    LH_CUDA(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToHost, copy_stream_), "copy to host");
    LH_CUDA(cudaEventRecord(done.e, copy_stream_), "record");
    LH_CUDA(cudaEventRecord(src_free.e, copy_stream_), "record");
    return Check(cudaGetLastError(), "forward or backward");
  }

  // A boundary tensor (fp32, on the device; `gradient`: the input gradient) to pinned `host` as
  // CopyToHost, or in low rank where `shape` has a rank (EncodeLowRank): its factors, put in
  // `factors` with `seed`'s directions; with shared directions its coordinates, an output that
  // draws them (NextDirections) after them.
  absl::Status Leave(const BoundaryShape& shape, bool gradient, const float* tensor, uint64_t seed,
                     DeviceArray<float>& factors, float* host, Event& done, Event& tensor_free) {
    const long NC = static_cast<long>(B_) * T_ * cfg_.d_model;
    if (!shape.low_rank()) return CopyToHost(host, tensor, NC, done, tensor_free);
    LH_RETURN_IF_ERROR(LowRankBuffers());
    if (!shape.shared) {
      LH_RETURN_IF_ERROR(
          low_rank_.Encode(blas_, stream_, tensor, shape.rows, shape.width, shape.rank, seed, factors.p));
      return CopyToHost(host, factors.p, static_cast<long>(shape.sent()), done, tensor_free);
    }
    const size_t D = shape.directions();
    const bool draws = !gradient && draw_;
    if (draws) {
      LH_RETURN_IF_ERROR(DrawDirections(shape, tensor, seed));
      LH_CUDA(cudaMemcpyAsync(factors.p, sent_dirs_.p, D * 4, cudaMemcpyDeviceToDevice, stream_), "directions");
    }
    LH_RETURN_IF_ERROR(cuda::LowRankCodec::Project(blas_, tensor, shape.rows, shape.width, shape.rank,
                                                   gradient ? received_dirs_.p : sent_dirs_.p,
                                                   factors.p + (draws ? D : 0)));
    return CopyToHost(host, factors.p, static_cast<long>(shape.sent(draws)), done, tensor_free);
  }
  // The output's shared directions from `tensor` into sent_dirs_, rounded as the link will send
  // them (through the host, once an iteration), so that both ends multiply by the same.
  absl::Status DrawDirections(const BoundaryShape& shape, const float* tensor, uint64_t seed) {
    const size_t D = shape.directions();
    LH_CUDA(cudaMemsetAsync(sent_dirs_.p, 0, D * 4, stream_), "zero the directions' padding");
    LH_RETURN_IF_ERROR(
        low_rank_.Directions(blas_, stream_, tensor, shape.rows, shape.width, shape.rank, seed, sent_dirs_.p));
    LH_CUDA(cudaMemcpyAsync(dirs_host_.p, sent_dirs_.p, D * 4, cudaMemcpyDeviceToHost, stream_), "directions out");
    LH_CUDA(cudaStreamSynchronize(stream_), "directions");
    if (round_) round_(dirs_host_.p, D);
    LH_CUDA(cudaMemcpyAsync(sent_dirs_.p, dirs_host_.p, D * 4, cudaMemcpyHostToDevice, stream_), "directions in");
    return absl::OkStatus();
  }
  // A boundary tensor from `host` into `tensor` (fp32, on the device) as Upload, or where `shape`
  // has a rank its factors, through `factors`, multiplied out; with shared directions its
  // coordinates, in those of the output (`gradient`) or those an input brings (NextDirections)
  // before its own.
  absl::Status Arrive(const BoundaryShape& shape, bool gradient, const float* host, DeviceArray<float>& factors,
                      float* tensor, Event* free = nullptr) {
    if (!shape.low_rank()) return Upload(tensor, host, static_cast<long>(B_) * T_ * cfg_.d_model, free);
    LH_RETURN_IF_ERROR(LowRankBuffers());
    const bool brings = shape.shared && !gradient && arrive_;
    LH_RETURN_IF_ERROR(Upload(factors.p, host, static_cast<long>(shape.sent(brings)), free));
    if (!shape.shared) return cuda::LowRankCodec::Decode(blas_, factors.p, shape.rows, shape.width, shape.rank, tensor);
    const size_t D = shape.directions();
    if (brings) {
      LH_CUDA(cudaMemcpyAsync(received_dirs_.p, factors.p, D * 4, cudaMemcpyDeviceToDevice, stream_), "directions");
    }
    return cuda::LowRankCodec::Decode(blas_, factors.p + (brings ? D : 0), gradient ? sent_dirs_.p : received_dirs_.p,
                                      shape.rows, shape.width, shape.rank, tensor);
  }
  // The factors' device buffers and the codec's scratch, once a boundary in low rank needs them.
  absl::Status LowRankBuffers() {
    if (low_rank_ready_) return absl::OkStatus();
    const size_t N = static_cast<size_t>(B_) * T_, C = cfg_.d_model;
    LH_RETURN_IF_ERROR(low_rank_.Init(N, C, std::max(low_rank_acts_.rank, low_rank_grads_.rank)));
    for (auto* x : {&acts_in_, &acts_out_}) {
      if (low_rank_acts_.low_rank()) LH_RETURN_IF_ERROR(x->Alloc(low_rank_acts_.sent(true)));
    }
    if (const size_t D = low_rank_acts_.directions(); D > 0) {
      for (auto* x : {&sent_dirs_, &received_dirs_}) LH_RETURN_IF_ERROR(x->Alloc(D));
      LH_RETURN_IF_ERROR(dirs_host_.Alloc(D));
    }
    for (auto* x : {&grads_in_, &grads_out_}) {
      if (low_rank_grads_.low_rank()) LH_RETURN_IF_ERROR(x->Alloc(low_rank_grads_.sent()));
    }
    low_rank_ready_ = true;
    return absl::OkStatus();
  }

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
  const T* HeadWeight() const { return W(cfg_.tied_head ? layout_.wte() : layout_.lm_head()); }
  float* HeadGrad() { return G(cfg_.tied_head ? layout_.wte() : layout_.lm_head()); }
  const int* Prefix(const Slot<T>& s) const {
    return cfg_.attention == AttentionMask::kPrefixLm ? s.prefix.p : nullptr;
  }
  // Block l's activations: the slot's own, or with recompute the one scratch set rebuilt per block.
  BlockActs<T>& Acts(Slot<T>& s, int l) { return o_.recompute ? scratch_ : s.blocks[l - spec_.first_block]; }
  // The input of block l (l = end_block: the stage's last block's output).
  const T* BlockInput(const Slot<T>& s, int l) const {
    if (l == spec_.first_block) return s.x0.p;
    const int i = l - 1 - spec_.first_block;
    return o_.recompute ? s.inputs[i].p : s.blocks[i].out.p;
  }
  void RefreshWeights(size_t begin, size_t n) {
    if constexpr (!std::is_same_v<T, float>) cuda::Cast(stream_, weights_.p + begin, params_.p + begin, static_cast<long>(n));
  }

  absl::Status UploadBatch(Slot<T>& s, const MicroBatch& mb) {
    const size_t N = static_cast<size_t>(B_) * T_;
    if (mb.tokens.size() != N || mb.targets.size() != N || mb.loss_weight.size() != N ||
        mb.prefix_len.size() != static_cast<size_t>(B_)) {
      return absl::InvalidArgumentError(absl::StrFormat("a micro-batch of %d tokens for a stage of %d x %d",
                                                        mb.tokens.size(), B_, T_));
    }
    // Pageable sources: each call returns once its source is staged, so `mb` may go right after.
    LH_CUDA(cudaMemcpyAsync(s.tokens.p, mb.tokens.data(), N * 4, cudaMemcpyHostToDevice, stream_), "tokens");
    LH_CUDA(cudaMemcpyAsync(s.targets.p, mb.targets.data(), N * 4, cudaMemcpyHostToDevice, stream_), "targets");
    LH_CUDA(cudaMemcpyAsync(s.weight.p, mb.loss_weight.data(), N * 4, cudaMemcpyHostToDevice, stream_), "weights");
    LH_CUDA(cudaMemcpyAsync(s.prefix.p, mb.prefix_len.data(), B_ * 4, cudaMemcpyHostToDevice, stream_), "prefixes");
    if (!spec_.has_embedding) return absl::OkStatus();
    // Positions grouped by token, for the embedding's backward without atomics.
    std::vector<int> order(N), starts, distinct;
    for (size_t i = 0; i < N; ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return mb.tokens[a] < mb.tokens[b]; });
    for (size_t k = 0; k < N; ++k) {
      if (k == 0 || mb.tokens[order[k]] != mb.tokens[order[k - 1]]) {
        starts.push_back(static_cast<int>(k));
        distinct.push_back(mb.tokens[order[k]]);
      }
    }
    starts.push_back(static_cast<int>(N));
    s.distinct = static_cast<int>(distinct.size());
    LH_CUDA(cudaMemcpyAsync(s.order.p, order.data(), N * 4, cudaMemcpyHostToDevice, stream_), "token order");
    LH_CUDA(cudaMemcpyAsync(s.starts.p, starts.data(), starts.size() * 4, cudaMemcpyHostToDevice, stream_), "tokens");
    return Check(cudaMemcpyAsync(s.distinct_tokens.p, distinct.data(), distinct.size() * 4, cudaMemcpyHostToDevice,
                                 stream_),
                 "distinct tokens");
  }

  // qkv (B, T, 3C) -> atty (B, T, C)
  void AttentionForward(BlockActs<T>& a, const int* prefix) {
    const int C = cfg_.d_model, NH = cfg_.n_head, hs = C / NH, BH = B_ * NH;
    if constexpr (!std::is_same_v<T, float>) {
      if (flash_) return cuda::FlashAttentionForward(stream_, a.atty.p, a.lse.p, a.qkv.p, prefix, B_, T_, C, NH);
    }
    const long sh = static_cast<long>(T_) * hs, st = static_cast<long>(T_) * T_;
    cuda::SplitHeads(stream_, a.q.p, a.k.p, a.v.p, a.qkv.p, B_, T_, C, NH);
    cuda::BatchedGemm(blas_, false, true, T_, T_, hs, 1.0f, a.q.p, sh, a.k.p, sh, 0.0f, a.att.p, st, BH);
    cuda::MaskedSoftmaxForward(stream_, a.att.p, prefix, 1.0f / std::sqrt(static_cast<float>(hs)), B_, NH, T_);
    cuda::BatchedGemm(blas_, false, false, T_, hs, T_, 1.0f, a.att.p, st, a.v.p, sh, 0.0f, a.y.p, sh, BH);
    cuda::MergeHeads(stream_, a.atty.p, a.y.p, B_, T_, C, NH);
  }

  // g_atty_ (B, T, C) -> g_qkv_ (B, T, 3C)
  void AttentionBackward(BlockActs<T>& a, const int* prefix) {
    const int C = cfg_.d_model, NH = cfg_.n_head, hs = C / NH, BH = B_ * NH;
    if constexpr (!std::is_same_v<T, float>) {
      if (flash_) {
        return cuda::FlashAttentionBackward(stream_, g_qkv_.p, delta_.p, g_atty_.p, a.atty.p, a.qkv.p, a.lse.p, prefix,
                                            B_, T_, C, NH);
      }
    }
    const long sh = static_cast<long>(T_) * hs, st = static_cast<long>(T_) * T_;
    cuda::MergeHeadsBackward(stream_, dy_.p, g_atty_.p, B_, T_, C, NH);
    cuda::BatchedGemm(blas_, false, true, T_, T_, hs, 1.0f, dy_.p, sh, a.v.p, sh, 0.0f, datt_.p, st, BH);
    cuda::BatchedGemm(blas_, true, false, T_, hs, T_, 1.0f, a.att.p, st, dy_.p, sh, 0.0f, dv_.p, sh, BH);
    cuda::MaskedSoftmaxBackward(stream_, datt_.p, a.att.p, prefix, 1.0f / std::sqrt(static_cast<float>(hs)), B_, NH, T_);
    cuda::BatchedGemm(blas_, false, false, T_, hs, T_, 1.0f, datt_.p, st, a.k.p, sh, 0.0f, dq_.p, sh, BH);
    cuda::BatchedGemm(blas_, true, false, T_, hs, T_, 1.0f, datt_.p, st, a.q.p, sh, 0.0f, dk_.p, sh, BH);
    cuda::SplitHeadsBackward(stream_, g_qkv_.p, dq_.p, dk_.p, dv_.p, B_, T_, C, NH);
  }

  // x (N, C) -> out (N, C), keeping what the backward needs in `a`. With `out` null (recompute in
  // backward) the block's last projection is skipped: the backward reads only what `a` keeps.
  void BlockForward(int l, const T* x, BlockActs<T>& a, const int* prefix, T* out) {
    const BlockTensors& w = layout_.block(l);
    const int N = B_ * T_, C = cfg_.d_model;
    cuda::LayerNormForward(stream_, a.ln1.p, a.ln1_mean.p, a.ln1_rstd.p, x, P(w.ln1_w), P(w.ln1_b), N, C);
    cuda::LinearForward(blas_, stream_, a.qkv.p, a.ln1.p, W(w.qkv_w), P(w.qkv_b), N, C, 3 * C, false);
    AttentionForward(a, prefix);
    cudaMemcpyAsync(a.res2.p, x, static_cast<size_t>(N) * C * sizeof(T), cudaMemcpyDeviceToDevice, stream_);
    cuda::LinearForward(blas_, stream_, a.res2.p, a.atty.p, W(w.attn_proj_w), P(w.attn_proj_b), N, C, C, true);
    cuda::LayerNormForward(stream_, a.ln2.p, a.ln2_mean.p, a.ln2_rstd.p, a.res2.p, P(w.ln2_w), P(w.ln2_b), N, C);
    // fch keeps the values before fc's bias, which the GELU adds.
    cuda::LinearForward(blas_, stream_, a.fch.p, a.ln2.p, W(w.fc_w), static_cast<const float*>(nullptr), N, C, 4 * C,
                        false);
    cuda::GeluForward(stream_, a.fch_gelu.p, a.fch.p, P(w.fc_b), N, 4 * C);
    if (out == nullptr) return;
    cudaMemcpyAsync(out, a.res2.p, static_cast<size_t>(N) * C * sizeof(T), cudaMemcpyDeviceToDevice, stream_);
    cuda::LinearForward(blas_, stream_, out, a.fch_gelu.p, W(w.fc_proj_w), P(w.fc_proj_b), N, 4 * C, C, true);
  }

  // g_resid_ (N, C) fp32: ∂L/∂block output on entry, ∂L/∂block input on exit.
  void BlockBackward(int l, const T* x, BlockActs<T>& a, const int* prefix) {
    const BlockTensors& w = layout_.block(l);
    const int N = B_ * T_, C = cfg_.d_model;
    const long NC = static_cast<long>(N) * C;
    cuda::Cast(stream_, gT_.p, g_resid_.p, NC);
    float* scratch = reduce_scratch_.p;
    cuda::LinearBackward(blas_, stream_, g_fch_.p, G(w.fc_proj_w), G(w.fc_proj_b), scratch, gT_.p, a.fch_gelu.p,
                         W(w.fc_proj_w), N, 4 * C, C);
    cuda::GeluBackward(stream_, g_fch_.p, a.fch.p, P(w.fc_b), N, 4 * C);
    cuda::LinearBackward(blas_, stream_, g_ln_.p, G(w.fc_w), G(w.fc_b), scratch, g_fch_.p, a.ln2.p, W(w.fc_w), N, C,
                         4 * C);
    cuda::LayerNormBackward(stream_, g_resid_.p, G(w.ln2_w), G(w.ln2_b), g_ln_.p, a.res2.p, P(w.ln2_w), a.ln2_mean.p,
                            a.ln2_rstd.p, scratch, N, C);
    cuda::Cast(stream_, gT_.p, g_resid_.p, NC);
    cuda::LinearBackward(blas_, stream_, g_atty_.p, G(w.attn_proj_w), G(w.attn_proj_b), scratch, gT_.p, a.atty.p,
                         W(w.attn_proj_w), N, C, C);
    AttentionBackward(a, prefix);
    cuda::LinearBackward(blas_, stream_, g_ln_.p, G(w.qkv_w), G(w.qkv_b), scratch, g_qkv_.p, a.ln1.p, W(w.qkv_w), N, C,
                         3 * C);
    cuda::LayerNormBackward(stream_, g_resid_.p, G(w.ln1_w), G(w.ln1_b), g_ln_.p, x, P(w.ln1_w), a.ln1_mean.p,
                            a.ln1_rstd.p, scratch, N, C);
  }

  // Zeroes `runs` of the device buffer `p`, on the compute stream (the host's ZeroRuns). A subspace
  // model's held floats' gradients are zeroed so where the gradients are read (Grads, Step), once
  // an iteration: no backward reads them, and this backend has no hooks that push during one.
  absl::Status ZeroRuns(const std::vector<StridedRun>& runs, float* p) {
    for (const StridedRun& r : runs) {
      const size_t width = r.length * sizeof(float), pitch = r.rows > 1 ? r.stride * sizeof(float) : width;
      LH_CUDA(cudaMemset2DAsync(p + r.offset, pitch, 0, width, r.rows, stream_), "zero a subspace model's held floats");
    }
    return absl::OkStatus();
  }

  ModelConfig cfg_;
  StageSpec spec_;
  ParamLayout layout_;
  std::vector<StridedRun> subspace_;  // what a subspace model holds (ParamLayout::SubspaceRuns)
  FixedEmbedding fixed_;              // its fixed embedding, and on a stage after the first in T:
  DeviceArray<T> fixed_wte_, fixed_wpe_;
  Options o_;
  int B_, T_;
  bool flash_;  // attention in the flash style (CudaFlashAttention)
  int vocab_ld_;  // row stride of the logits and their gradient (CudaLogitsStride)
  std::string device_name_;
  cudaStream_t stream_ = nullptr, copy_stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  OptimizerSettings optimizer_;
  float loss_scale_ = std::is_same_v<T, __half> ? 65536.0f : 1.0f;
  int64_t good_steps_ = 0;

  DeviceArray<float> params_, grads_, m_, v_;  // m_, v_ once an optimizer is attached
  DeviceArray<uint8_t> decay_;
  DeviceArray<T> weights_;  // compute copy of params_ (not allocated for fp32)
  PinnedArray params_host_, grads_host_;  // downloads for the host, pinned: at the bus's rate
  std::vector<Slot<T>> slots_;
  BlockActs<T> scratch_;  // with recompute
  DeviceArray<T> gT_, g_ln_, g_atty_, g_qkv_, g_fch_, dq_, dk_, dv_, dy_, datt_, dlogits_;
  DeviceArray<float> input_, boundary_, g_resid_, losses_, reduce_scratch_, delta_;  // boundary_: the output
  PinnedArray losses_host_;
  Event output_free_, grad_free_;  // boundary_ and g_resid_ may be written again
  // Uploads of boundary tensors and parameters from the host (Upload).
  static constexpr size_t kUploadHalf = 16 << 20;
  cuda::HostUploader uploader_;
  Event upload_done_, upload_free_, input_free_;  // input_free_: input_ was read
  DeviceArray<double> norm_partial_, norm_;
  // Boundaries the stage puts in low rank itself (EncodeLowRank; rank 0: whole), their factors on
  // the way in and out, and the codec.
  BoundaryShape low_rank_acts_, low_rank_grads_;
  DeviceArray<float> acts_in_, acts_out_, grads_in_, grads_out_;
  cuda::LowRankCodec low_rank_;
  bool low_rank_ready_ = false;
  // Shared directions (NextDirections): those the output goes in and those the input came in
  // (the input gradient goes back in them), each directions() floats; the drawn ones on their
  // way through the link's rounding; and what the next Forward does with them.
  DeviceArray<float> sent_dirs_, received_dirs_;
  PinnedArray dirs_host_;
  bool arrive_ = false, draw_ = false;
  std::function<void(float*, size_t)> round_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<CudaStage>> Make(const ModelConfig& cfg, const StageSpec& spec,
                                                const CudaStage::Options& o) {
  auto stage = std::make_unique<StageImpl<T>>(cfg, spec, o);
  if (absl::Status st = stage->Init(); !st.ok()) return st;
  return std::unique_ptr<CudaStage>(std::move(stage));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaStage>> CudaStage::Create(const ModelConfig& cfg, const StageSpec& spec,
                                                             const Options& o) {
  if (absl::Status s = cfg.Validate(); !s.ok()) return s;
  if (absl::Status s = spec.Validate(cfg); !s.ok()) return s;
  if (o.slots < 1) return absl::InvalidArgumentError(absl::StrFormat("a stage needs at least one slot, not %d", o.slots));
  const int device = o.device;
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (device < 0 || device >= devices) {
    return absl::FailedPreconditionError(
        devices == 0 ? absl::StrCat("backend cuda:", device, " asked for, but ", why, "; use the \"cpu\" backend (train.backend, cluster.stage_backends or worker --backend)")
                     : absl::StrFormat("backend cuda:%d asked for, but this machine has %d CUDA devices", device,
                                       devices));
  }
  switch (o.precision) {
    case Precision::kFp32:
      return Make<float>(cfg, spec, o);
    case Precision::kBf16:
      return Make<__nv_bfloat16>(cfg, spec, o);
    case Precision::kFp16:
      return Make<__half>(cfg, spec, o);
  }
  return absl::InvalidArgumentError("unknown precision");
}

}  // namespace longhaul
