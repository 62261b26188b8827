#pragma once
// Pipeline schedules as data: the list of instructions one worker runs in one whole iteration,
// the parameter-server exchange included. The worker's executor runs it; the planner's simulator
// runs the same list to predict the iteration time.
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul {

// The parameter-server part of an iteration: every worker pushes its gradient of each shard to
// the shard's host (PushGrads); a host takes every replica's push of each shard it hosts, sums
// them in replica order and has the global norm reduced over every shard of every stage
// (ReduceNorm), steps its shards one by one and sends each one's parameters to every replica of
// its stage as soon as it is stepped (Step); every worker then waits for its stage's parameters
// (PullParams). Where a stage's backend lets the exchange in between its blocks
// (model/exchange_hooks.h), the last Backward pushes each shard as soon as its gradients are
// complete, and PullParams may leave the parameters to the next iteration's first Forward.
// With local updates (train.local_steps) a worker steps its own stage instead (LocalStep), and on
// the iterations that exchange it pushes the change since the last exchange, which the hosts
// average and step with the outer optimizer. Overlapped (train.overlap_outer), that exchange
// spreads over three iterations, each running its own compute as well: the round's last pushes,
// the next one's hosts step the shards with those pushes, and the one after pulls the new
// parameters (their ops serve the iteration `back` before their own).
enum class Op {
  kRecvAct,
  kForward,
  kSendAct,
  kRecvGrad,
  kBackward,
  kSendGrad,
  kPushGrads,
  kReduceNorm,
  kStep,
  kPullParams,
  kLocalStep
};

struct Instr {
  Op op;
  int micro = -1;  // micro-batch, for the per-micro-batch ops
  int back = 0;    // an overlapped exchange's ReduceNorm, Step and PullParams: of iteration it - back
  bool operator==(const Instr& o) const { return op == o.op && micro == o.micro && back == o.back; }
};

enum class ScheduleKind { kGpipe, k1F1B };

// What follows an iteration's backwards: the exchange with the parameter servers (synchronous),
// the worker's own step alone (an iteration between exchanges of local updates), or its own step
// and then the exchange (the iteration that ends each round of local updates). Overlapped, its own
// step and then a part of the exchange: the push (the round's last iteration), the hosts' outer
// step of the pushes of OuterStepDelay iterations before (back that), nothing while the pushes or
// parameters travel (kLocalStepInFlight: the exchange's sends are not waited for), the pull of the
// parameters stepped train.overlap_steps iterations before (back that), which the worker merges
// with what it stepped since.
enum class IterationEnd {
  kExchange, kLocalStep, kLocalStepThenExchange, kLocalStepThenPush, kLocalStepThenOuterStep, kLocalStepInFlight,
  kLocalStepThenLand
};

// The iterations after an overlapped exchange's push that its hosts step it, of the
// `overlap_steps` before it lands: half of them, rounded up, so the pushes (of replicas an
// iteration or two behind, over the link's delay) and the parameters coming back each travel
// under about half. 1 for 2.
constexpr int OuterStepDelay(int overlap_steps) { return (overlap_steps + 1) / 2; }

absl::StatusOr<ScheduleKind> ParseSchedule(const std::string& name);
const char* ScheduleName(ScheduleKind k);

// Instructions of a worker of stage `stage` of `stages` for `micro` micro-batches. Receives and
// sends are implied by the stage's position (none before the first stage's forward, none after
// the last's); ReduceNorm and Step only where the worker hosts parameter-server shards.
// Backwards run in ascending micro-batch order in both schedules, so parameter gradients sum in
// the same order as in one process.
// kLocalStepThenOuterStep steps the pushes of OuterStepDelay(`overlap_steps`) iterations before,
// kLocalStepThenLand pulls the parameters of `overlap_steps` iterations before.
std::vector<Instr> MakeSchedule(ScheduleKind kind, int stages, int stage, int micro, bool hosts_shards,
                                IterationEnd end = IterationEnd::kExchange, int overlap_steps = 2);

// Micro-batches whose activations a stage holds at once under the schedule (GPipe: all of them;
// 1F1B: at most stages - stage).
int ActivationSlots(ScheduleKind kind, int stages, int stage, int micro);

std::string ToString(const std::vector<Instr>& s);

}  // namespace longhaul
