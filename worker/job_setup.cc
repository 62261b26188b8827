#include "worker/job_setup.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace longhaul {

absl::StatusOr<TokenDataset> LoadDataset(const JobConfig& cfg) {
  const DataConfig& d = cfg.data;
  absl::StatusOr<TokenDataset> data;
  switch (d.source) {
    case DataSource::kBuiltin:
      data = TokenDataset::BuiltIn(d.markov, d.train_tokens, d.val_tokens);
      break;
    case DataSource::kBytes:
      data = TokenDataset::Bytes(d.path, d.val_path, d.val_fraction);
      break;
    case DataSource::kLlmc:
      data = TokenDataset::LlmcShards(d.path, d.val_path, d.val_fraction);
      break;
  }
  if (!data.ok()) return data.status();
  if (data->max_token() >= cfg.model.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the data holds token id %d but model.vocab_size = %d: raise model.vocab_size to at least %d",
        data->max_token(), cfg.model.vocab_size, data->max_token() + 1));
  }
  return data;
}

double EntropyFloor(const TokenDataset& data, const MicroBatch& mb) {
  if (!data.source()) return -1;
  double num = 0, den = 0;
  for (int b = 0; b < mb.B; ++b)
    for (int t = 0; t < mb.T; ++t) {
      const float w = mb.loss_weight[b * mb.T + t];
      num += w * data.source()->PositionFloor(t);
      den += w;
    }
  return den > 0 ? num / den : 0;
}

}  // namespace longhaul
