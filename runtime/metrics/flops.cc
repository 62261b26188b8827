#include "metrics/flops.h"

#include "absl/strings/str_format.h"

namespace longhaul {

double ModelFlopsPerIteration(const ModelConfig& cfg, int64_t sequences, int seq_len, bool recompute) {
  return cfg.n_layer * BlockFlops(cfg, sequences, seq_len, recompute) + HeadFlops(cfg, sequences, seq_len);
}

double BlockFlops(const ModelConfig& cfg, int64_t sequences, int seq_len, bool recompute) {
  const double B = static_cast<double>(sequences), s = seq_len, h = cfg.d_model;
  return (recompute ? 96.0 : 72.0) * B * s * h * h * (1.0 + s / (6.0 * h));
}

double HeadFlops(const ModelConfig& cfg, int64_t sequences, int seq_len) {
  return 6.0 * static_cast<double>(sequences) * seq_len * cfg.d_model * cfg.vocab_size;
}

const char* FlopsFormulaName(bool recompute) {
  return recompute ? "96·B·s·l·h²·(1+s/6h+V/16lh)" : "72·B·s·l·h²·(1+s/6h+V/12lh)";
}

double DaysFor100BTokens(double tokens_per_second) {
  return tokens_per_second > 0 ? 100e9 / tokens_per_second / 86400.0 : 0.0;
}

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm%02ds", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

}  // namespace longhaul
