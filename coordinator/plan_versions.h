#pragma once
// The plan the job runs and the few versions before it. A worker's connection made under one
// version may close, and be reported, after the next began: the places of a recent version stay
// known, so a report of one names the worker that held it then. Not locked: the coordinator's job
// (job.h) calls it under its own lock.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "longhaul.pb.h"

namespace longhaul {

class PlanVersions {
 public:
  // How many versions stay known, the running one among them.
  static constexpr size_t kRecent = 4;

  // `slots`: the config's stages x replicas; `run_dir_token`: the run directory's identity, which
  // every plan a worker receives carries (proto::Plan::run_dir_token).
  PlanVersions(int slots, std::string run_dir_token);

  // The running plan (version 0 before the first).
  const proto::Plan& current() const { return plan_; }
  uint64_t version() const { return plan_.version(); }
  // `plan` replaces the running one.
  void Adopt(proto::Plan plan);
  // The plan of `version` where it is one of the kRecent newest, else null.
  const proto::Plan* Find(uint64_t version) const;
  // The running plan as a worker it places receives it.
  proto::Plan ToSend() const;
  // Slot k = replica * stages + stage of the running plan is run by worker worker_of_slot()[k]
  // (-1: none; a shrunk plan leaves slots empty).
  const std::vector<int>& worker_of_slot() const { return worker_of_slot_; }

 private:
  const int slots_;
  const std::string run_dir_token_;
  proto::Plan plan_;
  std::map<uint64_t, proto::Plan> recent_;  // by version, plan_ among them
  std::vector<int> worker_of_slot_;
};

}  // namespace longhaul
