#include "schedule/schedule.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace longhaul {

absl::StatusOr<ScheduleKind> ParseSchedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  return absl::InvalidArgumentError(absl::StrCat("cluster.schedule = \"", name, "\": use \"gpipe\" or \"1f1b\""));
}

const char* ScheduleName(ScheduleKind k) { return k == ScheduleKind::kGpipe ? "gpipe" : "1f1b"; }

std::vector<Instr> MakeSchedule(ScheduleKind kind, int stages, int stage, int micro, bool hosts_shards,
                                IterationEnd end, int overlap_steps) {
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<Instr> s;
  auto forward = [&](int m) {
    if (!first) s.push_back({Op::kRecvAct, m});
    s.push_back({Op::kForward, m});
    if (!last) s.push_back({Op::kSendAct, m});
  };
  auto backward = [&](int m) {
    if (!last) s.push_back({Op::kRecvGrad, m});
    s.push_back({Op::kBackward, m});
    if (!first) s.push_back({Op::kSendGrad, m});
  };
  if (kind == ScheduleKind::kGpipe) {
    for (int m = 0; m < micro; ++m) forward(m);
    for (int m = 0; m < micro; ++m) backward(m);
  } else {
    // Warm-up forwards fill the pipeline below this stage, then one forward, one backward.
    const int warmup = std::min(micro, stages - stage - 1);
    int f = 0, b = 0;
    for (; f < warmup; ++f) forward(f);
    while (f < micro) {
      forward(f++);
      backward(b++);
    }
    while (b < micro) backward(b++);
  }
  if (end != IterationEnd::kExchange) s.push_back({Op::kLocalStep});
  switch (end) {
    case IterationEnd::kLocalStep:
    case IterationEnd::kLocalStepInFlight:
      return s;
    case IterationEnd::kLocalStepThenPush:
      s.push_back({Op::kPushGrads});
      return s;
    case IterationEnd::kLocalStepThenOuterStep:
      if (hosts_shards) {
        s.push_back({Op::kReduceNorm, -1, OuterStepDelay(overlap_steps)});
        s.push_back({Op::kStep, -1, OuterStepDelay(overlap_steps)});
      }
      return s;
    case IterationEnd::kLocalStepThenLand:
      s.push_back({Op::kPullParams, -1, overlap_steps});
      return s;
    case IterationEnd::kExchange:
    case IterationEnd::kLocalStepThenExchange:
      break;
  }
  s.push_back({Op::kPushGrads});
  if (hosts_shards) {
    s.push_back({Op::kReduceNorm});
    s.push_back({Op::kStep});
  }
  s.push_back({Op::kPullParams});
  return s;
}

int ActivationSlots(ScheduleKind kind, int stages, int stage, int micro) {
  return kind == ScheduleKind::kGpipe ? micro : std::min(micro, stages - stage);
}

std::string ToString(const std::vector<Instr>& s) {
  static const char* names[] = {"RecvAct",   "Forward",    "SendAct", "RecvGrad",  "Backward",  "SendGrad",
                                "PushGrads", "ReduceNorm", "Step",    "PullParams", "LocalStep"};
  std::string out;
  for (const Instr& i : s) {
    if (!out.empty()) out += " ";
    absl::StrAppend(&out, names[static_cast<int>(i.op)]);
    if (i.micro >= 0) absl::StrAppend(&out, "(", i.micro, ")");
    if (i.back > 0) absl::StrAppend(&out, "(it-", i.back, ")");
  }
  return out;
}

}  // namespace longhaul
