#include "metrics/loss_curve.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/atomic_file.h"

namespace longhaul {

absl::Status WriteLossCurveSvg(const std::string& path, const std::vector<LossPoint>& train,
                               const std::vector<LossPoint>& val, double floor) {
  constexpr double W = 800, H = 480, L = 70, R = 20, T = 30, Bm = 50;
  double xmax = 1, ymin = floor >= 0 ? floor : 1e30, ymax = 0;
  for (const auto* s : {&train, &val})
    for (const LossPoint& p : *s) {
      xmax = std::max(xmax, p.step);
      ymin = std::min(ymin, p.loss);
      ymax = std::max(ymax, p.loss);
    }
  if (ymin > ymax) ymin = 0, ymax = 1;
  const double pad = 0.05 * (ymax - ymin + 1e-9);
  ymin -= pad, ymax += pad;
  auto X = [&](double s) { return L + (W - L - R) * s / xmax; };
  auto Y = [&](double v) { return T + (H - T - Bm) * (ymax - v) / (ymax - ymin); };
  // The curve is redrawn at every progress line of runs of any length: past a few points per pixel
  // column, keep each column's lowest and highest point (in step order), which draws the same
  // picture at a bounded size.
  auto thin = [&](const std::vector<LossPoint>& pts) {
    if (pts.size() <= 2 * (W - L - R)) return pts;
    std::vector<LossPoint> kept;
    for (size_t i = 0; i < pts.size();) {
      const int column = static_cast<int>(X(pts[i].step));
      LossPoint lo = pts[i], hi = pts[i];
      for (++i; i < pts.size() && static_cast<int>(X(pts[i].step)) == column; ++i) {
        if (pts[i].loss < lo.loss) lo = pts[i];
        if (pts[i].loss > hi.loss) hi = pts[i];
      }
      if (lo.step > hi.step) std::swap(lo, hi);
      kept.push_back(lo);
      if (hi.step != lo.step) kept.push_back(hi);
    }
    return kept;
  };
  auto polyline = [&](const std::vector<LossPoint>& pts, const char* color) {
    std::string d;
    for (const LossPoint& p : thin(pts)) absl::StrAppend(&d, absl::StrFormat("%.1f,%.1f ", X(p.step), Y(p.loss)));
    return absl::StrFormat("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", color, d);
  };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      W, H);
  absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L,
                                        H - Bm, W - R, H - Bm));
  absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T,
                                        L, H - Bm));
  for (int i = 0; i <= 5; ++i) {
    const double v = ymin + (ymax - ymin) * i / 5, s = xmax * i / 5;
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n", L - 6, Y(v) + 4, v));
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", X(s),
                                          H - Bm + 18, s));
  }
  absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n", (W + L) / 2, H - 10));
  absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.0f\" y=\"18\">loss (nats/token): train (blue), val (orange)%s</text>\n",
                                        L, floor >= 0 ? ", entropy floor (dashed)" : ""));
  if (floor >= 0) {
    absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"gray\" "
                                          "stroke-dasharray=\"6,4\"/>\n",
                                          L, Y(floor), W - R, Y(floor)));
  }
  absl::StrAppend(&svg, polyline(train, "#1f77b4"), polyline(val, "#ff7f0e"), "</svg>\n");
  return WriteFileAtomically(path, svg);
}

}  // namespace longhaul
