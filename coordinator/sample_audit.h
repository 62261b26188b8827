#pragma once
// The coordinator's audit that each committed step ran every sample once on every stage, whatever
// workers came and went: each worker's global micro-batch indices of each iteration
// (IterationReport.micro_batches), kept as the run directory's samples.csv, one row per report
// (step, the stages of the plan that ran it, stage, replica, worker, the indices separated by
// spaces), appended as iterations complete. A re-cut pipeline runs later steps on fewer stages.
// A replan rolls back the steps it redoes, here too, so the file holds what the final parameters
// saw; a coordinator restarted from its job state reads it back.
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul.pb.h"

namespace longhaul {

class SampleAudit {
 public:
  // The audit of a job of `micro_batches` global micro-batches per step, from `path` up to step
  // `keep_through` (later rows are dropped; no file starts empty).
  static absl::StatusOr<SampleAudit> Open(const std::string& path, int micro_batches, int64_t keep_through);

  // (stage, micro-batch) pairs a step did not run, or ran more than once.
  struct Count {
    int64_t lost = 0, repeated = 0;
  };
  // Every worker's report of iteration `it` (by worker id) under a plan of `stages` stages,
  // appended; what the step lacked or repeated. The error is the file's.
  absl::StatusOr<Count> Record(int64_t it, int stages, const std::map<int, proto::IterationReport>& reports);
  // Forgets the steps after `step`, in the file too.
  absl::Status Rewind(int64_t step);

  struct Totals {
    int64_t steps = 0, lost = 0, repeated = 0;
  };
  Totals totals() const;
  const std::string& path() const { return path_; }

 private:
  struct Row {
    int stages = 1, stage = 0, replica = 0, worker = 0;
    std::vector<int64_t> micro_batches;
  };
  Count CountOf(const std::vector<Row>& rows) const;
  static std::string Format(int64_t step, const Row& row);
  absl::Status Rewrite();

  std::string path_;
  int micro_batches_ = 1;
  std::map<int64_t, std::vector<Row>> steps_;  // by step (iteration + 1)
  std::map<int64_t, Count> counts_;
  std::ofstream out_;
};

}  // namespace longhaul
