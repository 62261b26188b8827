#pragma once
// Prometheus's text exposition format (version 0.0.4), what a Prometheus server scrapes: each
// family's HELP and TYPE lines, then its samples, `name{label="value",...} number`.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace longhaul {

class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // Starts a family; `type` is "gauge" or "counter" (whose name ends in _total).
  void Family(absl::string_view name, absl::string_view type, absl::string_view help);
  // A sample of the family begun last; label values are escaped as the format asks.
  void Sample(const Labels& labels, double value);
  const std::string& text() const { return text_; }

 private:
  std::string text_, family_;
};

}  // namespace longhaul
