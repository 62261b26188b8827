#pragma once
// What every training process does the same way, one process or many: load the data, check a
// checkpoint belongs to this job, and know the entropy floor of a micro-batch.
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "data/micro_batch.h"
#include "data/token_dataset.h"

namespace longhaul {

// Loads config.data and checks every token fits model.vocab_size.
absl::StatusOr<TokenDataset> LoadDataset(const JobConfig& cfg);

// Entropy floor (nats/token) of the positions the loss counts, or -1 when the data has no known
// source.
double EntropyFloor(const TokenDataset& data, const MicroBatch& mb);

}  // namespace longhaul
