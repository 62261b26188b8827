#pragma once
// Writes the loss curve of a run as an SVG that any browser opens: training loss per step,
// validation loss where measured, and the data's entropy floor when it is known.
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace longhaul {

struct LossPoint {
  double step;
  double loss;
};

absl::Status WriteLossCurveSvg(const std::string& path, const std::vector<LossPoint>& train,
                               const std::vector<LossPoint>& val, double floor /* < 0: unknown */);

}  // namespace longhaul
