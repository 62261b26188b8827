#pragma once
// Writes loss curves as an SVG that any browser opens: one or more panels side by side, each with
// its own axes, a legend of its labelled curves, and an optional dashed reference line (an entropy
// floor, a target loss). A run's loss.svg is one panel: training loss per step, validation loss
// where measured, and the data's entropy floor when it is known.
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace longhaul {

struct LossPoint {
  double step;  // the x coordinate: a step, tokens, seconds
  double loss;
};

struct CurveSeries {
  std::string label;  // in the panel's legend; empty: not listed
  std::string color;  // an SVG color
  bool dashed = false;
  std::vector<LossPoint> points;  // in increasing x
};

struct CurvePanel {
  std::string title;             // above the plot
  std::string x_label = "step";  // below it
  std::vector<CurveSeries> series;
  double reference = -1;  // a dashed gray line at this loss; < 0: none
  double y_top = -1;      // the highest loss shown (curves above it are cut off); < 0: the highest point
};

// Panels left to right, in one file.
absl::Status WriteCurvesSvg(const std::string& path, const std::vector<CurvePanel>& panels);

absl::Status WriteLossCurveSvg(const std::string& path, const std::vector<LossPoint>& train,
                               const std::vector<LossPoint>& val, double floor /* < 0: unknown */);

}  // namespace longhaul
