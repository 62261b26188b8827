#pragma once
// The supervisor: it notices lost workers and ends the job. Its senses are the workers' heartbeats
// (Membership's silence), each worker's lifeline (a call held open for the worker's life, whose end
// a killed process's kernel reports at once), the peers' reports of connections that closed
// mid-run, and the coordinator's own dials of a suspect's tensor port, whose refusal says that
// nothing listens there any more. Its loop loses the silent, fills vacant places, restarts a failed
// version (recovery.h), and once the job finished or stopped writes the run's records.
#include <chrono>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/job.h"
#include "longhaul.pb.h"
#include "transport/socket_io.h"

namespace longhaul {

// How often a lifeline looks whether its call ended: a closed lifeline's detection waits for it.
inline constexpr std::chrono::milliseconds kLifelinePoll{10};

// Runs until every worker is done, or the job fails or is interrupted; then writes the run's
// records, whatever ended it (metrics.csv is already complete: it grows with every iteration), and
// removes the job state. The job's failure, or OK.
absl::Status Supervise(Job& job) ABSL_LOCKS_EXCLUDED(job.mu);

// Worker `id`'s lifeline: held until the worker goes (`cancelled()`: its process's connection
// closed), the job ends or the worker holds a newer one, handing `write` each new plan version and
// membership; a worker whose lifeline closes is cut off (Membership::CutOff). Aborted where a
// newer lifeline of the worker replaced this one. `write` runs without the lock.
absl::Status ServeLifeline(Job& job, int id, const std::function<bool()>& cancelled,
                           const std::function<bool(const proto::LifelineNews&)>& write)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// A worker of the plan saw a connection from a peer close mid-run (and where it says so, its
// version failed): the peer, found in the plan version the connection was of, is suspected and its
// port dialled; nobody is lost by the report alone. A worker without a place in that version had
// no connection of it to report.
absl::Status TakeSuspect(Job& job, const proto::SuspectReport& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// Evidence came that workers `ids` may be gone: where the coordinator reached a worker's tensor
// address before, a refusal there now (nothing listens) loses it at once (Membership::Refused).
// The dials go out together (over slow links one after another would cost a round trip each) and
// leave the lock for at most cluster.lifeline_grace_s: a host that vanished answers nothing, and
// the other rules lose its worker. The ports' answers, of the workers dialled.
std::map<int, PortAnswer> ProbeGone(Job& job, const std::vector<int>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

}  // namespace longhaul
