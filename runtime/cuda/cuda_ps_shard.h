#pragma once
// A parameter-server shard on a GPU: its fp32 master parameters, the replicas' summed gradient and
// the AdamW moments stay in device memory, so a GPU worker's share of the optimizer runs at the
// device's memory bandwidth and its host holds only the copy of the parameters it broadcasts.
// Gradients are added in replica order, as in host memory, so the sum is the same.
#include <memory>

#include "absl/status/statusor.h"
#include "optim/adamw.h"
#include "ps/ps_shard.h"

namespace longhaul {

absl::StatusOr<std::unique_ptr<PsShard>> MakeCudaPsShard(const AdamWConfig& adamw, const ParamLayout& stage_layout,
                                                         int stage, int shard, int first_tensor, int end_tensor,
                                                         int replicas, int device);

}  // namespace longhaul
