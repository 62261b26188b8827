#pragma once
// Every replica of a stage must hold the same parameters after a step; a difference means the
// replicas train different models. A worker's iteration report carries the CRC of the steps whose
// parameters it holds complete since its last report (one may come a report late,
// IterationReport.params): each is compared with the first replica's of the same stage and step,
// and a step counts as checked once every worker's is in. Not locked: the coordinator's job
// (job.h) calls it under its own lock.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "longhaul.pb.h"

namespace longhaul {

class ReplicaAgreement {
 public:
  // The last step whose parameters worker `id` reported, if any since the plan version began.
  std::optional<int64_t> LastReported(int id) const;
  // Takes `report`'s CRCs (a report of a worker of `stages` x `replicas` with `workers` in all);
  // the first disagreement among them, said for people, if any.
  std::optional<std::string> Add(const proto::IterationReport& report, int stages, int replicas, int workers);
  // A new plan version goes back to iteration `start`: the comparisons under way are dropped, and
  // the checks of the iterations it redoes.
  void Rewind(int64_t start);
  // No rollback goes before `step` (a complete checkpoint): the checks of earlier iterations count
  // for good.
  void Settle(int64_t step);
  // Iterations whose replicas were checked to agree.
  int64_t checked() const { return settled_ + static_cast<int64_t>(checked_.size()); }

 private:
  // By (stage, iteration): the first replica's CRC reported; by iteration: how many workers' are in.
  std::map<std::pair<int, int64_t>, std::pair<int, uint32_t>> first_;
  std::map<int64_t, int> in_;
  std::map<int, int64_t> last_;  // by worker: the last step whose parameters it reported
  std::set<int64_t> checked_;    // iterations checked, not yet settled
  int64_t settled_ = 0;          // iterations checked before the last settled step
};

}  // namespace longhaul
