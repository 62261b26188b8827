#include "coordinator/plan_versions.h"

#include <utility>

namespace longhaul {

PlanVersions::PlanVersions(int slots, std::string run_dir_token)
    : slots_(slots), run_dir_token_(std::move(run_dir_token)) {}

void PlanVersions::Adopt(proto::Plan plan) {
  plan_ = std::move(plan);
  worker_of_slot_.assign(slots_, -1);
  for (const proto::Assignment& a : plan_.assignments())
    worker_of_slot_[a.replica() * plan_.stages() + a.stage()] = a.worker_id();
  recent_[plan_.version()] = plan_;
  while (recent_.size() > kRecent) recent_.erase(recent_.begin());
}

const proto::Plan* PlanVersions::Find(uint64_t version) const {
  const auto it = recent_.find(version);
  return it == recent_.end() ? nullptr : &it->second;
}

proto::Plan PlanVersions::ToSend() const {
  proto::Plan plan = plan_;
  plan.set_run_dir_token(run_dir_token_);
  return plan;
}

}  // namespace longhaul
