#pragma once
// One pipeline stage of the GPT model on some backend: a contiguous range of blocks, plus the
// embeddings on the first stage and the final LayerNorm, head and loss on the last. Every backend
// lays its parameters and gradients out by the same ParamLayout and hands them over as flat fp32
// host buffers, so the parameter servers, checkpoints and transport never ask which one computed.
//
// A stage keeps `slots()` micro-batches between their forward and their backward (a schedule asks
// for as many as it needs); boundary tensors, (B, T, C) fp32, enter and leave through host memory.
#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "data/micro_batch.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace longhaul {

class Stage {
 public:
  virtual ~Stage() = default;

  virtual const ParamLayout& layout() const = 0;
  virtual const StageSpec& spec() const = 0;
  // Backend, device or threads, precision: for progress lines.
  virtual std::string Describe() const = 0;
  virtual int slots() const = 0;
  size_t num_params() const { return layout().total(); }

  virtual absl::Status ZeroGrads() = 0;
  // Forward of micro-batch `mb` into activation slot `slot`; `input` is the previous stage's output
  // (null on the first stage). Returns the micro-batch's weighted mean loss on the last stage, else 0.
  virtual absl::StatusOr<float> Forward(int slot, const MicroBatch& mb, const float* input) = 0;
  // The (B, T, C) output of the slot's forward on a non-last stage, valid until the next Forward
  // into that slot.
  virtual absl::StatusOr<const float*> Output(int slot) = 0;
  // Backward of the micro-batch in `slot`, adding its parameter gradients scaled by `scale`; the
  // last stage starts from its loss, the others from `grad_out` (B, T, C). Returns the gradient of
  // the stage's input (B, T, C), valid until the next Backward, or null on the first stage.
  virtual absl::StatusOr<const float*> Backward(int slot, const MicroBatch& mb, const float* grad_out,
                                                float scale) = 0;

  // The flat parameters and gradients, in host memory, valid until the stage next changes them.
  virtual absl::StatusOr<const float*> Params() = 0;
  virtual absl::StatusOr<const float*> Grads() = 0;
  // Overwrites parameters [begin, begin + n) of the flat buffer.
  virtual absl::Status SetParams(size_t begin, const float* values, size_t n) = 0;
};

}  // namespace longhaul
