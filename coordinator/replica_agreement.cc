#include "coordinator/replica_agreement.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_format.h"

namespace longhaul {

std::optional<int64_t> ReplicaAgreement::LastReported(int id) const {
  const auto it = last_.find(id);
  if (it == last_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> ReplicaAgreement::Add(const proto::IterationReport& r, int stages, int replicas,
                                                 int workers) {
  std::optional<std::string> disagreement;
  for (const proto::ParamsCrc& p : r.params()) {
    int64_t& last = last_[r.worker_id()];
    last = std::max(last, p.iteration());
    auto [first, inserted] = first_.emplace(std::pair(r.stage(), p.iteration()), std::pair(r.replica(), p.crc32c()));
    if (!inserted && first->second.second != p.crc32c() && !disagreement) {
      disagreement = absl::StrFormat(
          "after iteration %d, replica %d of stage %d holds parameters with CRC-32C %08x and replica %d %08x: the "
          "replicas no longer train the same model (a bug: please report it with the config)",
          p.iteration() + 1, first->second.first, r.stage(), first->second.second, r.replica(), p.crc32c());
    }
    if (++in_[p.iteration()] == workers) {
      if (replicas > 1) checked_.insert(p.iteration());
      in_.erase(p.iteration());
      for (int s = 0; s < stages; ++s) first_.erase({s, p.iteration()});
    }
  }
  return disagreement;
}

void ReplicaAgreement::Rewind(int64_t start) {
  first_.clear();
  in_.clear();
  last_.clear();
  checked_.erase(checked_.lower_bound(start), checked_.end());
}

void ReplicaAgreement::Settle(int64_t step) {
  const auto settled = checked_.lower_bound(step);
  settled_ += std::distance(checked_.begin(), settled);
  checked_.erase(checked_.begin(), settled);
}

}  // namespace longhaul
