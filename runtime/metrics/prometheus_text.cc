#include "metrics/prometheus_text.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {
namespace {

std::string Escape(absl::string_view v, bool help) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && !help) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

}  // namespace

void PrometheusText::Family(absl::string_view name, absl::string_view type, absl::string_view help) {
  family_ = std::string(name);
  absl::StrAppend(&text_, "# HELP ", name, " ", Escape(help, true), "\n# TYPE ", name, " ", type, "\n");
}

void PrometheusText::Sample(const Labels& labels, double value) {
  text_ += family_;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&text_, i > 0 ? "," : "", labels[i].first, "=\"", Escape(labels[i].second, false), "\"");
    }
    text_ += '}';
  }
  absl::StrAppend(&text_, " ", Number(value), "\n");
}

}  // namespace longhaul
