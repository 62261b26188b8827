#include "coordinator/progress.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace longhaul {

Progress::Progress(int64_t start, std::string resume_name, int64_t end)
    : start_(start), resume_name_(std::move(resume_name)), end_(end), completed_through_(-1) {}

absl::Status Progress::CheckNew(int id, int64_t it) const {
  if (it <= completed_through_) {
    return absl::AlreadyExistsError(
        absl::StrFormat("iteration %d is complete: worker %d reported it already", it + 1, id));
  }
  const auto rec = reports_.find(it);
  if (rec != reports_.end() && rec->second.count(id) > 0) {
    return absl::AlreadyExistsError(absl::StrFormat("worker %d already reported iteration %d", id, it + 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Progress::Add(const proto::IterationReport& report, int workers) {
  if (absl::Status st = CheckNew(report.worker_id(), report.iteration()); !st.ok()) return st;
  std::map<int, proto::IterationReport>& rec = reports_[report.iteration()];
  rec.emplace(report.worker_id(), report);
  return static_cast<int>(rec.size()) == workers;
}

std::map<int, proto::IterationReport> Progress::Complete(int64_t it) {
  completed_through_ = it;
  std::map<int, proto::IterationReport> done = std::move(reports_[it]);
  reports_.erase(it);
  return done;
}

int64_t Progress::Rollback(int64_t step, const std::string& name) {
  // What reports_ holds is past completed_through_ (a report of a completed one is refused).
  const int64_t highest = reports_.empty() ? completed_through_ : reports_.rbegin()->first;
  const int64_t reached = std::max(start_, highest + 1);
  redone_ += std::max<int64_t>(0, reached - step);
  start_ = step;
  resume_name_ = name;
  return reached;
}

void Progress::Restart() {
  reports_.erase(reports_.lower_bound(start_), reports_.end());
  completed_through_ = std::min(completed_through_, start_ - 1);
}

}  // namespace longhaul
