#pragma once
// cluster.communication = "auto": the coordinator chooses how the job communicates (the
// CommunicationKeys(): local steps and the outer step, the wire and exchange dtypes) among the
// settings of a convergence penalties file, as `longhaul plan` ranks them: each setting's config
// priced on the workers' measured compute and the links the coordinator knows (its placement
// search's predicted iteration time), charged the setting's measured penalty, so the choice is the
// one fastest to the same loss: effective tokens/s = tokens/s / (1 + max(penalty, 0)). The job's
// layout and global batch stay the config's; a setting that would change them (a larger batch) is
// not a candidate, nor one the bench measured without a pipeline boundary where a lossy wire would
// cross one, nor one whose config does not load (train.checkpoint_every not a multiple of its
// local steps, say: the reason is recorded).
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "coordinator/planning.h"
#include "plan/convergence_penalty.h"

namespace longhaul {

struct CommunicationCandidate {
  std::string name;     // the setting's, as the penalties file names it
  double penalty = 0;   // as measured (a negative one is counted as 0)
  double iteration_s = 0, tokens_per_s = 0, effective = 0;
  std::string why_not;  // empty where it was priced

  nlohmann::json Json() const;
};

struct CommunicationChoice {
  JobConfig cfg;     // the job's config with the chosen setting's keys
  std::vector<CommunicationCandidate> candidates;  // in the file's order
  int chosen = 0;    // index into candidates
  std::vector<std::string> overrides;  // the keys that make cfg from the job's

  nlohmann::json Json() const;
};

// Prices a candidate config: the placement search's result for it.
using PriceConfig = std::function<absl::StatusOr<SlotSearch>(const JobConfig&)>;

// The candidate of `table` fastest to the same loss for `job`, priced by `price`; ties go to the
// one earlier in the file (the exact path first). FailedPrecondition where no setting can be
// priced, naming each one's reason.
absl::StatusOr<CommunicationChoice> ChooseCommunication(const JobConfig& job, const PenaltyTable& table,
                                                        const PriceConfig& price);

}  // namespace longhaul
