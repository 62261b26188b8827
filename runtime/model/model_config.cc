#include "model/model_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {

const char* AttentionMaskName(AttentionMask m) {
  return m == AttentionMask::kCausal ? "causal" : "prefix_lm";
}

absl::StatusOr<AttentionMask> ParseAttentionMask(const std::string& name) {
  if (name == "causal") return AttentionMask::kCausal;
  if (name == "prefix_lm") return AttentionMask::kPrefixLm;
  return absl::InvalidArgumentError(absl::StrCat("model.attention = \"", name, "\": use \"causal\" or \"prefix_lm\""));
}

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return absl::InvalidArgumentError(absl::StrCat("train.precision = \"", name, "\": use \"fp32\", \"bf16\" or \"fp16\""));
}

const char* PrecisionName(Precision p) {
  return p == Precision::kFp32 ? "fp32" : (p == Precision::kBf16 ? "bf16" : "fp16");
}

absl::Status ModelConfig::Validate() const {
  auto positive = [](const char* key, int v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat("model.%s = %d: must be a positive integer", key, v));
  };
  for (auto [k, v] : {std::pair{"vocab_size", vocab_size}, {"max_seq_len", max_seq_len},
                      {"n_layer", n_layer}, {"n_head", n_head}, {"d_model", d_model}}) {
    if (auto s = positive(k, v); !s.ok()) return s;
  }
  if (d_model % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model.d_model = %d is not divisible by model.n_head = %d: choose n_head among the divisors of d_model "
        "(for example %d)",
        d_model, n_head, d_model % 64 == 0 ? d_model / 64 : 1));
  }
  if (subspace_divisor < 1 || d_model % subspace_divisor != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model.subspace_divisor = %d does not divide model.d_model = %d: use 1 (no subspace) or a divisor of "
        "d_model such as 2, 4 or 8",
        subspace_divisor, d_model));
  }
  return absl::OkStatus();
}

void BoundaryShape::Keep(const float* full, float* sent) const {
  for (size_t r = 0; r < rows; ++r) std::copy_n(full + r * width, kept, sent + r * kept);
}

void BoundaryShape::Restore(const float* sent, float* full) const {
  for (size_t r = 0; r < rows; ++r) {
    std::copy_n(sent + r * kept, kept, full + r * width);
    std::fill_n(full + r * width + kept, width - kept, 0.0f);
  }
}

StageSpec StageSpec::Even(const ModelConfig& cfg, int index, int num_stages) {
  int base = cfg.n_layer / num_stages, extra = cfg.n_layer % num_stages;
  int first = index * base + std::min(index, extra);
  int count = base + (index < extra ? 1 : 0);
  return {first, first + count, index == 0, index == num_stages - 1};
}

StageSpec StageSpec::OfCut(const std::vector<int>& blocks_per_stage, int index) {
  int first = 0;
  for (int s = 0; s < index; ++s) first += blocks_per_stage[s];
  return {first, first + blocks_per_stage[index], index == 0, index == static_cast<int>(blocks_per_stage.size()) - 1};
}

absl::Status StageSpec::Validate(const ModelConfig& cfg) const {
  if (first_block < 0 || end_block < first_block || end_block > cfg.n_layer) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stage blocks [%d, %d) do not fit a model of %d layers", first_block, end_block, cfg.n_layer));
  }
  if (cfg.tied_head && has_head != has_embedding) {
    return absl::InvalidArgumentError(
        "model.tied_head = true needs the embedding and the head in the same stage; set tied_head = false "
        "for a multi-stage pipeline");
  }
  return absl::OkStatus();
}

}  // namespace longhaul
