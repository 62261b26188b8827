#pragma once
// One pipeline stage of a GPT model on the CPU: a contiguous range of pre-LayerNorm blocks, plus
// the embeddings if it is the first stage and the final LayerNorm, LM head and loss if it is the
// last. A stage holding everything is the whole model.
//
// Parameters and gradients live in two flat buffers laid out by ParamLayout. Activations of each
// in-flight micro-batch live in an Activations object the caller owns, so a pipeline schedule can
// keep several micro-batches between their forward and backward.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/exchange_hooks.h"
#include "model/micro_batch.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace longhaul {

class GptStage {
 public:
  struct Activations;
  struct ActivationsDeleter {
    void operator()(Activations* a) const;
  };
  using ActivationsPtr = std::unique_ptr<Activations, ActivationsDeleter>;

  // B = micro-batch size, T = sequence length. recompute keeps only block inputs between forward
  // and backward and recomputes each block inside backward.
  static absl::StatusOr<std::unique_ptr<GptStage>> Create(const ModelConfig& cfg, const StageSpec& spec, int B, int T,
                                                          bool recompute);
  ~GptStage();

  const ModelConfig& config() const { return cfg_; }
  const StageSpec& spec() const { return spec_; }
  const ParamLayout& layout() const { return layout_; }
  int B() const { return B_; }
  int T() const { return T_; }

  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  size_t num_params() const { return params_.size(); }
  // A subspace model's fixed embedding (InitParams); empty without one.
  const FixedEmbedding& fixed_embedding() const { return fixed_; }

  // GPT-2 initialisation (InitGpt2Params), and a subspace model's fixed embedding drawn from the
  // same seed (DrawFixedEmbedding: a stage after the first writes its columns of the input from
  // it, and a stage whose parameters are set puts its values back).
  void InitParams(uint64_t seed);
  void DrawFixedEmbedding(uint64_t seed) { fixed_ = FixedEmbedding(cfg_, seed); }
  void ZeroGrads();

  ActivationsPtr NewActivations() const;

  // Runs the stage on one micro-batch. The first stage reads mb.tokens; the others read input
  // (B, T, C). Returns the micro-batch's weighted mean loss on the last stage, else 0 (and 0
  // where a hook gave it up).
  float Forward(Activations& act, const MicroBatch& mb, const float* input);
  // (B, T, C) output of a non-last stage, valid until the next Forward on act.
  const float* Output(const Activations& act) const;
  // (B, T, V) softmax probabilities of the last stage, valid until Backward on act.
  const float* Probs(const Activations& act) const;

  // Accumulates parameter gradients of one micro-batch. The last stage starts from
  // loss_scale · its loss (grad_out unused); the others from grad_out (B, T, C). Returns the
  // gradient of the stage input (B, T, C), valid until the next Backward, or null for the first
  // stage and where a hook gave it up.
  const float* Backward(Activations& act, const MicroBatch& mb, const float* grad_out, float loss_scale);

  // Called between blocks, and between a block's attention and MLP halves (a stop is heard within
  // half a block: a whole one is on a recovery's critical path), by
  // every later Forward and Backward (with recompute, a Backward's forward of a block asks
  // before_forward halfway too); null: none. Must outlive the stage (or be unset first).
  void SetExchangeHooks(const ExchangeHooks* hooks) { hooks_ = hooks; }

 private:
  struct BlockActs;
  GptStage(const ModelConfig& cfg, const StageSpec& spec, int B, int T, bool recompute);

  // False: a hook gave the block up halfway (its results unfinished).
  bool BlockForward(int layer, const float* x, BlockActs& a, const int* prefix);
  // g_resid (N, C): ∂L/∂block output on entry, ∂L/∂block input on exit.
  bool BlockBackward(int layer, const float* x, const BlockActs& a, const int* prefix);
  const float* BlockInput(const Activations& act, int layer) const;
  // Float offset of tensor `tensor` in the buffers.
  size_t Offset(int tensor) const { return layout_.tensors()[tensor].offset; }
  // False: a hook gave up the forward or backward under way.
  bool ForwardNeeds(size_t end) const {
    return hooks_ == nullptr || !hooks_->before_forward || hooks_->before_forward(end);
  }
  // Gradients from `begin` on are complete: a subspace model's held floats' are zeroed before
  // the hook may push them.
  bool BackwardDone(size_t begin) {
    if (!subspace_.empty()) ZeroRuns(ClipRuns(subspace_, begin, unmasked_end_), grads_.data());
    unmasked_end_ = begin;
    return hooks_ == nullptr || !hooks_->after_backward || hooks_->after_backward(begin);
  }

  const float* P(int tensor) const { return params_.data() + layout_.tensors()[tensor].offset; }
  float* G(int tensor) { return grads_.data() + layout_.tensors()[tensor].offset; }
  const float* HeadWeight() const { return P(cfg_.tied_head ? layout_.wte() : layout_.lm_head()); }
  float* HeadGrad() { return G(cfg_.tied_head ? layout_.wte() : layout_.lm_head()); }

  ModelConfig cfg_;
  StageSpec spec_;
  ParamLayout layout_;
  int B_, T_;
  bool recompute_;
  std::vector<float> params_, grads_;
  std::vector<StridedRun> subspace_;  // what a subspace model holds (ParamLayout::SubspaceRuns)
  FixedEmbedding fixed_;
  size_t unmasked_end_ = 0;  // a backward's gradients from here on have had subspace_ zeroed
  const ExchangeHooks* hooks_ = nullptr;

  // Backward scratch shared by all micro-batches (one backward runs at a time).
  std::unique_ptr<BlockActs> recompute_acts_;
  std::vector<float> g_resid_, g_ln_, g_atty_, g_qkv_, g_fch_, attn_scratch_;
};

// The gradients' half of one optimizer step in a single process, for the tests and benchmarks:
// zeroes the gradients, runs forward and backward of every micro-batch (each scaled by 1/M) and
// returns the mean micro-batch loss. The stage must hold the whole model.
double AccumulateGradients(GptStage& stage, GptStage::Activations& act, const std::vector<MicroBatch>& micro_batches);

}  // namespace longhaul
