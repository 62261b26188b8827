#pragma once
// How far the running plan has come: the iteration it started from (the run's start, or the last
// complete checkpoint a new version went back to), the workers' reports of iterations not yet
// complete, and the last complete one. Iterations complete in order (each worker reports its own in
// order), so nothing of a completed one is kept. Not locked: the coordinator's job (job.h) calls
// it under its own lock.
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul.pb.h"

namespace longhaul {

class Progress {
 public:
  // A run from iteration `start` (resumed from checkpoint `resume_name`, empty: the initial
  // parameters) to `end`, exclusive.
  Progress(int64_t start, std::string resume_name, int64_t end);

  int64_t start() const { return start_; }
  const std::string& resume_name() const { return resume_name_; }
  int64_t end() const { return end_; }
  // Every iteration up to this one is complete (start() - 1 at most after a rollback).
  int64_t completed_through() const { return completed_through_; }
  // Iterations begun and then rolled back, over the whole job.
  int64_t redone() const { return redone_; }
  void set_redone(int64_t redone) { redone_ = redone; }

  // Records `report`; whether `workers` have now reported its iteration. AlreadyExists where the
  // iteration is complete or its worker reported it already.
  absl::StatusOr<bool> Add(const proto::IterationReport& report, int workers);
  // Whether worker `id` may still report iteration `it` (neither complete nor reported by it).
  absl::Status CheckNew(int id, int64_t it) const;
  // Iteration `it` is complete (Add said so): its reports, by worker, which leave the record.
  std::map<int, proto::IterationReport> Complete(int64_t it);
  // The run goes back to the last complete checkpoint, step `step` named `name`: the iteration
  // reached before it (every one below it begun), counted as redone.
  int64_t Rollback(int64_t step, const std::string& name);
  // A new plan version runs from start(): what it redoes is forgotten.
  void Restart();

 private:
  int64_t start_;
  std::string resume_name_;
  const int64_t end_;
  std::map<int64_t, std::map<int, proto::IterationReport>> reports_;  // by iteration, then worker
  int64_t completed_through_;
  int64_t redone_ = 0;
};

}  // namespace longhaul
