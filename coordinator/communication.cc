#include "coordinator/communication.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace longhaul {

nlohmann::json CommunicationCandidate::Json() const {
  nlohmann::json j = {{"setting", name}, {"penalty", penalty}};
  if (!why_not.empty()) {
    j["why_not"] = why_not;
  } else {
    j.update({{"predicted_iteration_seconds", iteration_s}, {"tokens_per_s", tokens_per_s}, {"effective", effective}});
  }
  return j;
}

nlohmann::json CommunicationChoice::Json() const {
  nlohmann::json all = nlohmann::json::array();
  for (const CommunicationCandidate& c : candidates) all.push_back(c.Json());
  return {{"chosen", candidates[chosen].name}, {"set", overrides}, {"candidates", std::move(all)}};
}

absl::StatusOr<CommunicationChoice> ChooseCommunication(const JobConfig& job, const PenaltyTable& table,
                                                        const PriceConfig& price) {
  CommunicationChoice out;
  int best = -1;
  for (const SettingPenalty& p : table.settings) {
    CommunicationCandidate c;
    c.name = p.name, c.penalty = p.penalty;
    const std::vector<std::string> overrides = SettingOverrides(job, p);
    const std::vector<std::string> beyond = KeysBeyondCommunication(p);
    absl::StatusOr<JobConfig> cfg = ParseJobConfig(job.toml_text, job.source_path, overrides);
    if (!p.choosable) {
      c.why_not = "it never reached the exact path's loss in the bench";
    } else if (!beyond.empty()) {
      c.why_not = absl::StrCat("it sets ", absl::StrJoin(beyond, ", "), ", which cluster.communication = \"auto\" keeps");
    } else if (!cfg.ok()) {
      c.why_not = std::string(cfg.status().message());
    } else if (cfg->cluster.stages > 1 && BoundaryUnmeasured(p, cfg->transport)) {
      c.why_not = kBoundaryUnmeasured;
    } else if (absl::StatusOr<SlotSearch> slots = price(*cfg); !slots.ok()) {
      c.why_not = absl::StrCat("not priced: ", slots.status().message());
    } else if (slots->predicted_s <= 0) {
      c.why_not = "the search predicted no iteration time";
    } else {
      c.iteration_s = slots->predicted_s;
      c.tokens_per_s = static_cast<double>(cfg->tokens_per_step()) / c.iteration_s;
      c.effective = c.tokens_per_s / (1 + std::max(0.0, p.penalty));
      if (best < 0 || c.effective > out.candidates[best].effective) {
        best = static_cast<int>(out.candidates.size());
        out.cfg = *std::move(cfg);
        out.overrides = overrides;
      }
    }
    out.candidates.push_back(std::move(c));
  }
  if (best < 0) {
    std::vector<std::string> why;
    for (const CommunicationCandidate& c : out.candidates) why.push_back(absl::StrCat(c.name, ": ", c.why_not));
    return absl::FailedPreconditionError(
        absl::StrCat("cluster.communication = \"auto\": no setting of the penalties file can run this job (",
                     absl::StrJoin(why, "; "), ")"));
  }
  out.chosen = best;
  return out;
}

}  // namespace longhaul
