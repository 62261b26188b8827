#include "metrics/loss_curve.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/atomic_file.h"

namespace longhaul {
namespace {

constexpr double W = 800, H = 480, L = 70, R = 20, T = 30, Bm = 50;

// An x-axis tick: steps and seconds as they are, token counts in thousands or millions.
std::string Tick(double v, double xmax) {
  if (xmax >= 1e6) return absl::StrFormat("%.1fM", v / 1e6);
  if (xmax >= 1e4) return absl::StrFormat("%.0fk", v / 1e3);
  return xmax >= 5 ? absl::StrFormat("%.0f", v) : absl::StrFormat("%.2f", v);
}

// One panel, its plot area at x offset `left`; `index` names its clip path.
std::string Panel(const CurvePanel& panel, double left, int index) {
  double xmax = 1, ymin = panel.reference >= 0 ? panel.reference : 1e30, ymax = 0;
  for (const CurveSeries& s : panel.series)
    for (const LossPoint& p : s.points) {
      xmax = std::max(xmax, p.step);
      ymin = std::min(ymin, p.loss);
      ymax = std::max(ymax, p.loss);
    }
  if (panel.y_top >= 0) ymax = std::min(ymax, panel.y_top);
  if (ymin > ymax) ymin = 0, ymax = 1;
  const double pad = 0.05 * (ymax - ymin + 1e-9);
  ymin -= pad, ymax += pad;
  auto X = [&](double s) { return left + L + (W - L - R) * s / xmax; };
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
  std::string svg = absl::StrFormat(
      "<clipPath id=\"plot%d\"><rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\"/></clipPath>\n", index,
      left + L, T, W - L - R, H - T - Bm);
  absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n",
                                        left + L, H - Bm, left + W - R, H - Bm));
  absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n",
                                        left + L, T, left + L, H - Bm));
  for (int i = 0; i <= 5; ++i) {
    const double v = ymin + (ymax - ymin) * i / 5, s = xmax * i / 5;
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n",
                                          left + L - 6, Y(v) + 4, v));
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", X(s),
                                          H - Bm + 18, Tick(s, xmax)));
  }
  absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n",
                                        left + (W + L) / 2, H - 10, panel.x_label));
  absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.0f\" y=\"18\">%s</text>\n", left + L, panel.title));
  if (panel.reference >= 0) {
    absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"gray\" "
                                          "stroke-dasharray=\"6,4\"/>\n",
                                          left + L, Y(panel.reference), left + W - R, Y(panel.reference)));
  }
  int listed = 0;
  for (const CurveSeries& s : panel.series) {
    std::string d;
    for (const LossPoint& p : thin(s.points)) absl::StrAppend(&d, absl::StrFormat("%.1f,%.1f ", X(p.step), Y(p.loss)));
    absl::StrAppend(&svg, absl::StrFormat("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s "
                                          "clip-path=\"url(#plot%d)\" points=\"%s\"/>\n",
                                          s.color, s.dashed ? " stroke-dasharray=\"5,3\"" : "", index, d));
    if (s.label.empty()) continue;
    const double y = T + 14 + 16 * listed++;
    absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
                                          "stroke-width=\"2\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                                          left + W - R - 200, y - 4, left + W - R - 180, y - 4, s.color,
                                          left + W - R - 174, y, s.label));
  }
  return svg;
}

}  // namespace

absl::Status WriteCurvesSvg(const std::string& path, const std::vector<CurvePanel>& panels) {
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      W * static_cast<double>(std::max<size_t>(1, panels.size())), H);
  for (size_t i = 0; i < panels.size(); ++i) absl::StrAppend(&svg, Panel(panels[i], W * i, static_cast<int>(i)));
  absl::StrAppend(&svg, "</svg>\n");
  return WriteFileAtomically(path, svg);
}

absl::Status WriteLossCurveSvg(const std::string& path, const std::vector<LossPoint>& train,
                               const std::vector<LossPoint>& val, double floor) {
  CurvePanel panel;
  panel.title =
      absl::StrCat("loss (nats/token): train (blue), val (orange)", floor >= 0 ? ", entropy floor (dashed)" : "");
  panel.series = {{"", "#1f77b4", false, train}, {"", "#ff7f0e", false, val}};
  panel.reference = floor;
  return WriteCurvesSvg(path, {panel});
}

}  // namespace longhaul
