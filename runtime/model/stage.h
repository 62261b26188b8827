#pragma once
// One pipeline stage of the GPT model on some backend: a contiguous range of blocks, plus the
// embeddings on the first stage and the final LayerNorm, head and loss on the last. Every backend
// lays its parameters and gradients out by the same ParamLayout and hands them over as flat fp32
// host buffers, so the parameter servers, checkpoints and transport never ask which one computed.
//
// A stage keeps `slots()` micro-batches between their forward and their backward (a schedule asks
// for as many as it needs); boundary tensors, (B, T, C) fp32, enter and leave through host memory.
//
// In one process (one stage, one replica) the stage is the only parameter server of its own
// parameters: AttachOptimizer gives it AdamW moments where the parameters live (device memory for
// CUDA), so a step never moves the model across the bus. In a cluster the parameter-server shards
// (runtime/ps) step instead, and a stage holds no moments.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/micro_batch.h"
#include "model/exchange_hooks.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "optim/optimizer_settings.h"

namespace longhaul {

class Stage {
 public:
  virtual ~Stage() = default;

  virtual const ParamLayout& layout() const = 0;
  virtual const StageSpec& spec() const = 0;
  // Backend, device or threads, precision: for progress lines.
  virtual std::string Describe() const = 0;
  virtual int slots() const = 0;
  // Forward and Backward return once their work is queued (a device backend): Output and
  // InputGrad wait for it, so whoever asks for them after queuing the next micro-batch's compute
  // overlaps the copy with that compute.
  virtual bool queues_work() const { return false; }
  // Waits until everything queued has run (a device backend; on the CPU the work is done when
  // each call returns). Benchmarks time whole steps with it.
  virtual absl::Status Synchronize() { return absl::OkStatus(); }
  // Makes every later Forward and Backward call `hooks` between blocks (null: stop); false where
  // the backend cannot: one that queues its work has no block boundary on the caller's thread,
  // and its exchange waits for whole iterations instead. `hooks` must outlive the stage's use of it.
  virtual bool SetExchangeHooks(const ExchangeHooks* /*hooks*/) { return false; }
  size_t num_params() const { return layout().total(); }
  // Makes the stage put its boundaries in low rank itself where `acts` (its output; its input on
  // the way in) or `grads` (its input gradient; its output gradient on the way in) has a rank: a
  // device backend, so that the factors cross the bus instead of the tensor. That direction's
  // Forward input, Output, Backward grad_out and InputGrad then hold its sent() floats, and each
  // micro-batch's directions come from LowRankSeed (model/low_rank_method.h). False where the
  // backend leaves it to its caller, which puts the host's copy in low rank (cpu/low_rank.h).
  virtual bool EncodeLowRank(const BoundaryShape& /*acts*/, const BoundaryShape& /*grads*/) { return false; }
  // Shared directions (BoundaryShape::shared) where the stage puts its boundaries in low rank
  // itself, before each Forward: whether its input brings the directions it and the iteration's
  // later inputs come in (`arrive`: an iteration's first micro-batch, each of an evaluation's;
  // its sent(true) floats), and whether its output draws new ones (`draw`, likewise), which
  // `round` (n floats, in place) rounds as the link will send them, so both ends hold the same.
  virtual void NextDirections(bool /*arrive*/, bool /*draw*/, std::function<void(float*, size_t)> /*round*/) {}

  virtual absl::Status ZeroGrads() = 0;
  // Forward of micro-batch `mb` into activation slot `slot`; `input` is the previous stage's output
  // (null on the first stage). Returns the micro-batch's weighted mean loss on the last stage, else 0.
  virtual absl::StatusOr<float> Forward(int slot, const MicroBatch& mb, const float* input) = 0;
  // The (B, T, C) output of the slot's forward on a non-last stage, valid until the next Forward
  // into that slot.
  virtual absl::StatusOr<const float*> Output(int slot) = 0;
  // Backward of the micro-batch in `slot`, adding its parameter gradients: the last stage starts
  // from `scale` times its loss, the others from `grad_out` (B, T, C), which already carries it.
  virtual absl::Status Backward(int slot, const MicroBatch& mb, const float* grad_out, float scale) = 0;
  // The gradient of the stage's input (B, T, C) from the slot's backward on a non-first stage,
  // valid until the next Backward into that slot.
  virtual absl::StatusOr<const float*> InputGrad(int slot) = 0;
  // The (B, T, V) softmax of the slot's last forward, copied into `host`, on the last stage
  // (sampling reads it).
  virtual absl::Status DownloadProbs(int slot, float* host) = 0;

  // The flat parameters and gradients, in host memory, valid until the stage next changes them.
  virtual absl::StatusOr<const float*> Params() = 0;
  virtual absl::StatusOr<const float*> Grads() = 0;
  // Overwrites parameters [begin, begin + n) of the flat buffer.
  virtual absl::Status SetParams(size_t begin, const float* values, size_t n) = 0;

  // Makes the stage step its own parameters: allocates zeroed AdamW moments.
  virtual absl::Status AttachOptimizer(const OptimizerSettings& settings) = 0;
  // Clips the gradients' global norm and applies AdamW at the scheduled rate of optimizer step
  // `step` (0-based). Under fp16 loss scaling an overflowing step is skipped and says so.
  virtual absl::StatusOr<OptimizerStepResult> Step(int64_t step) = 0;
  // The AdamW moments laid out by layout(), for checkpoints.
  virtual absl::Status GetOptimizerState(float* m, float* v) = 0;
  virtual absl::Status SetOptimizerState(const float* m, const float* v) = 0;
};

}  // namespace longhaul
