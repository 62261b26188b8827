#pragma once
// How a worker joins the job: it registers, reports what its backend measured (and, where the job
// probes them, its links), learns its peers, receives the plan that places it, and waits at the
// plan's start barrier; its heartbeats keep it in. Once every first worker is in, the first plan is
// made: the placement search where the links are known, else registration order. Each function is
// what one call of the coordinator's service does, with the job's lock held.
#include <string>

#include "absl/status/status.h"
#include "coordinator/job.h"
#include "longhaul.pb.h"

namespace longhaul {

absl::Status Register(Job& job, const proto::RegisterRequest& req, proto::RegisterReply& reply)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
absl::Status TakeProfile(Job& job, const proto::ProfileReport& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
absl::Status TakeLinks(Job& job, const proto::LinkReport& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// Every registered worker, once every first worker reported its profile: each has set its tensor
// server's job id by then, and no compute probe runs beside the link probes; with after_links,
// once every first worker reported its links too (the barrier between the probes' phases).
// NotFound after a wait of 5 s.
absl::Status Peers(Job& job, const proto::PeersRequest& req, proto::Peers& peers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// The plan, once a version newer than the one the worker knows places it; NotFound after a wait
// of 5 s, OutOfRange once the job finished.
absl::Status PlanFor(Job& job, const proto::PlanRequest& req, proto::Plan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// The start barrier of the running plan: returns once every worker it places is ready (or the job
// stops); DeadlineExceeded after 5 s.
absl::Status Ready(Job& job, const proto::ReadyRequest& req, proto::ReadyReply& reply)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
absl::Status Heartbeat(Job& job, const proto::HeartbeatRequest& req, proto::HeartbeatReply& reply)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// The first worker ids nobody has registered as yet, and how to start them.
std::string UnfilledSlots(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

}  // namespace longhaul
