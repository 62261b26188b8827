#include "worker/stage_keeper.h"

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace longhaul {

std::string StageKeeper::Key(int stage, int device, int slots, const std::string& config_toml) {
  return absl::StrCat(stage, " ", device, " ", slots, "\n", config_toml);
}

void StageKeeper::AddWarm(const std::string& key, std::unique_ptr<Stage> stage) { warm_[key] = std::move(stage); }

absl::StatusOr<bool> StageKeeper::Take(const std::string& key, bool reuse, const StageRequest& request,
                                       bool free_in_background) {
  if (stage_ && reuse && key == key_) return true;
  stage_.reset();
  auto warm = warm_.find(key);
  if (reuse && warm != warm_.end()) stage_ = std::move(warm->second);
  RetireWarm(free_in_background);
  if (!stage_) {
    LH_ASSIGN_OR_RETURN(stage_, MakeStage(request));
  }
  key_ = key;
  snapshot_step_ = -1;
  return false;
}

void StageKeeper::RetireWarm(bool free_in_background) {
  if (warm_.empty()) return;
  if (free_in_background) {
    freeing_ = std::async(std::launch::async, [stages = std::move(warm_)]() mutable { stages.clear(); });
  }
  warm_.clear();
}

void StageKeeper::Snapshot(int64_t step, const float* params) {
  snapshot_.assign(params, params + stage_->num_params());
  snapshot_step_ = step;
}

absl::StatusOr<bool> StageKeeper::Restore(int64_t step) {
  if (snapshot_step_ != step) return false;
  LH_RETURN_IF_ERROR(stage_->SetParams(0, snapshot_.data(), snapshot_.size()));
  return true;
}

}  // namespace longhaul
