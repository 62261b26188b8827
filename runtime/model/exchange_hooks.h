#pragma once
// Where a stage's forward and backward meet the data-parallel exchange block by block, so that
// the exchange overlaps compute: the next iteration's forward starts on the first blocks while the
// last blocks' parameters are still on their way, and the last micro-batch's backward hands the
// last blocks' gradients to the network while it computes the first blocks'. Offsets are floats
// in the stage's flat, layer-major buffer (param_layout.h): forward reads it front to back, and
// backward finishes it back to front. A hook that returns false ends the forward or backward
// there, its results left unfinished: the iteration is being given up (a newer plan version, a
// failed exchange), and on a recovery's critical path the rest of a micro-batch's compute would
// keep a worker in the old version that long.
#include <cstddef>
#include <functional>

namespace longhaul {

struct ExchangeHooks {
  // Before a forward reads parameters [0, end): returns once they hold their new values.
  std::function<bool(size_t end)> before_forward;
  // After a backward has added its last contribution to the gradients [begin, end of the stage).
  std::function<bool(size_t begin)> after_backward;
};

}  // namespace longhaul
