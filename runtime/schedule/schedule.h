#pragma once
// Pipeline schedules as data: the list of instructions one stage runs in one iteration. The
// worker's executor runs it; a cost model can run the same list to predict iteration time.
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul {

enum class Op { kRecvAct, kForward, kSendAct, kRecvGrad, kBackward, kSendGrad, kPushGrads, kPullParams };

struct Instr {
  Op op;
  int micro = -1;  // micro-batch, for the per-micro-batch ops
  bool operator==(const Instr& o) const { return op == o.op && micro == o.micro; }
};

enum class ScheduleKind { kGpipe, k1F1B };

absl::StatusOr<ScheduleKind> ParseSchedule(const std::string& name);
const char* ScheduleName(ScheduleKind k);

// Instructions of stage `stage` of `stages` for `micro` micro-batches. Receives and sends are
// implied by the stage's position (none before the first stage's forward, none after the last's).
// Backwards run in ascending micro-batch order in both schedules, so parameter gradients sum in
// the same order as in one process.
std::vector<Instr> MakeSchedule(ScheduleKind kind, int stages, int stage, int micro);

// Micro-batches whose activations a stage holds at once under the schedule (GPipe: all of them;
// 1F1B: at most stages - stage).
int ActivationSlots(ScheduleKind kind, int stages, int stage, int micro);

std::string ToString(const std::vector<Instr>& s);

}  // namespace longhaul
