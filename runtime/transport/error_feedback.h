#pragma once
// Error feedback for a lossy wire dtype (as in CocktailSGD, after Seide et al.'s 1-bit SGD): each
// send carries the tensor plus what earlier sends of the same stream lost to rounding, and keeps
// what this one loses. Over iterations the receiver gets the sum of the tensors up to one
// rounding, where plain int8 or int4 would drop every update smaller than half a step of its block,
// step after step. For data-parallel gradient pushes, one stream per shard.
#include <cstddef>
#include <vector>

#include "format/wire_dtype.h"

namespace longhaul {

class ErrorFeedback {
 public:
  explicit ErrorFeedback(WireDtype dtype) : dtype_(dtype) {}
  // `g` plus the residual, as it should be sent (valid until the next call); the residual becomes
  // what the wire dtype's rounding of it loses. A stream whose length changes starts afresh.
  // `rounded`, where given, receives what the receiver will read: the sent values as the wire
  // dtype rounds them (n floats).
  const float* Apply(const float* g, size_t n, float* rounded = nullptr);
  const std::vector<float>& residual() const { return residual_; }
  // The residual as a checkpoint kept it: the stream goes on as it would have from there.
  void SetResidual(const float* r, size_t n) { residual_.assign(r, r + n); }
  WireDtype dtype() const { return dtype_; }

 private:
  WireDtype dtype_;
  std::vector<float> residual_, out_;
};

}  // namespace longhaul
