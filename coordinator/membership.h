#pragma once
// Who is in the job: admission (the same protocol, the same job, a free slot), what each worker's
// backend measured, liveness (when each worker was last heard from) and who has finished. Not locked: the coordinator's service calls it
// under its own lock, and time comes in as an argument so tests need no clock.
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul.pb.h"
#include "metrics/timeline.h"

namespace longhaul {

class Membership {
 public:
  using Clock = std::chrono::steady_clock;

  // A job of `expected` workers and at most `spares` more waiting to take a lost one's place; one
  // silent for longer than `dead_after_s` is dead, so is a suspect silent for longer than
  // `suspect_silent_s` since it was suspected, and one whose lifeline to the coordinator closed
  // and that is silent for longer than `cut_off_silent_s` since.
  Membership(std::string job_id, int expected, int spares, double dead_after_s, double suspect_silent_s,
             double cut_off_silent_s);

  // The new worker's id: the slot it asks for, else the lowest id never given (so 0, 1, ... in
  // registration order; a lost worker's id is never given again, so a late message of the lost
  // process cannot pass for its successor's); or why it is refused: another protocol version or
  // job (FailedPrecondition), every slot and spare taken (ResourceExhausted), a slot out of range
  // (InvalidArgument) or taken (AlreadyExists).
  absl::StatusOr<int> Register(const proto::RegisterRequest& req, Clock::time_point now);
  // What registered worker `id` measured of its backend (InvalidArgument for times no device
  // takes: negative, NaN, an hour or more).
  absl::Status SetProfile(int id, const proto::ComputeProfile& compute);
  // The job's first `expected` workers (ids below it) registered and reported their profiles: the
  // first plan can be made.
  bool profiled() const;
  const proto::ComputeProfile& profile(int id) const { return *workers_.at(id).profile; }
  bool HasProfile(int id) const { return workers_.at(id).profile.has_value(); }
  // What registered worker `id` measured towards every worker at another address (workers at one
  // address share a machine and talk for free, unless a dial map routes them through an emulated
  // link, when they may be reported too). InvalidArgument for a report that misses such a worker,
  // repeats one, names itself or an unknown one, or holds times and rates no link has.
  absl::Status SetLinks(int id, const proto::LinkReport& report);
  // The first `expected` workers reported their links, their cards' probes done.
  bool linked() const;
  // The first `expected` workers reported their links, at least those measured all at once: the
  // barrier before the cards' probes.
  bool links_measured() const;
  // Worker `from`'s measurement towards worker `to`, where it reported one.
  std::optional<proto::LinkMeasurement> link(int from, int to) const;
  // Worker `id`'s card as its probes saw it, bytes/s; 0: none seen (or not reported).
  double egress(int id) const;
  // Both registered with one host in their tensor addresses.
  bool SameHost(int a, int b) const;
  // NotFound for an id no worker registered with (ids come from the network), FailedPrecondition
  // for a lost one's.
  absl::Status Check(int id) const;
  void Heard(int id, Clock::time_point now);
  // When worker `id` was last heard from.
  Clock::time_point last_seen(int id) const { return workers_.at(id).last_seen; }
  // The worker finished (or failed); `timeline` is its trace file, if it wrote one (path empty: none).
  void Done(int id, const TraceFile& timeline);

  int expected() const { return expected_; }
  // Workers registered and not lost.
  int registered() const;
  // Ids [0, expected) are registered.
  bool full() const;
  // Of the workers not lost, those done.
  int done() const;
  // Worker `id` is dead: it leaves every count and check, and its id is never given again.
  void Lose(int id);
  // Worker `reporter` saw evidence that worker `id` is gone (SuspectReport). A heartbeat after
  // this makes the silence count from there: a slow worker is not a dead one. A suspicion a
  // heartbeat answered gives way to the next one.
  void Suspect(int id, int reporter, Clock::time_point now);
  // Worker `id`'s lifeline to the coordinator closed (a killed process's sockets close at once);
  // one that opens again (a reconnect) ends that. Cut off and suspected, with no heartbeat and no
  // reconnect since either, it is lost after a fifth of the cut-off's grace: a live process may
  // lose one connection, but its lifeline and a connection to a peer both closed by its kernel is a
  // process that ended (the wait leaves a live one whose connections a middlebox reset the time to
  // reconnect).
  void CutOff(int id, Clock::time_point now);
  void Reconnected(int id);
  // The coordinator reached worker `id`'s tensor address (ProbePort): a refusal there later is the
  // port's own answer, not a firewall's.
  void Reachable(int id) { workers_.at(id).reachable = true; }
  bool reachable(int id) const { return workers_.at(id).reachable; }
  // Worker `id`'s tensor address refused a connection: nothing listens there. Cut off or suspected,
  // with no heartbeat and no reconnect since, it is lost at once: its process ended, which the
  // host's kernel says in one round trip where the wait above only guesses.
  void Refused(int id, Clock::time_point now) { workers_.at(id).refused = now; }
  static constexpr int kCutOff = -2;  // Lost::reporter of a worker lost by its closed lifeline
  struct Lost {
    int id = -1;
    double silent_s = 0;  // since it was last heard from, or since it was suspected or cut off
    int reporter = -1;    // who suspected it, where that is why it is lost (kCutOff: its lifeline)
    int also_reporter = -1;  // with kCutOff: the worker that saw a connection from it close too
    bool refused = false;    // its tensor address refused a connection after that (Refused)
  };
  // A worker not lost, not done and silent past its limit at `now`.
  std::optional<Lost> Silent(Clock::time_point now) const;
  const proto::RegisterRequest& registration(int id) const { return workers_.at(id).reg; }
  // Of the workers not lost.
  std::map<int, proto::RegisterRequest> registrations() const;
  // Counts registrations, losses and restores: registrations() may differ from when it was less.
  uint64_t changes() const { return changes_; }
  // The slots of the first plan no worker holds yet.
  std::vector<int> Unfilled() const;
  // Every worker ever registered, lost ones too, for the job state file.
  std::vector<proto::WorkerRecord> Records() const;
  // A worker of the job state file, heard from `now` (it has dead_after_s to be heard again).
  void Restore(const proto::WorkerRecord& record, Clock::time_point now);
  // The trace files the finished workers reported, by worker id.
  std::map<int, TraceFile> timelines() const;

 private:
  struct Worker {
    proto::RegisterRequest reg;
    Clock::time_point last_seen;
    bool done = false;
    TraceFile timeline;
    std::optional<proto::ComputeProfile> profile;
    std::map<int, proto::LinkMeasurement> links;  // by peer at another address
    double egress_bytes_per_s = 0;
    bool links_reported = false;
    bool card_to_come = false;  // its report so far is the links all at once (LinkReport.card_to_come)
    std::optional<std::pair<Clock::time_point, int>> suspected;  // when, and by whom
    bool lost = false;
    std::optional<Clock::time_point> cut_off;  // its lifeline closed then
    bool reachable = false;
    std::optional<Clock::time_point> refused;  // its tensor address refused a connection then
  };
  // The first `expected` workers registered and each has `done`.
  bool EveryExpected(const std::function<bool(const Worker&)>& done) const;
  const std::string job_id_;
  const int expected_, spares_;
  const double dead_after_s_, suspect_silent_s_, cut_off_silent_s_;
  std::map<int, Worker> workers_;
  uint64_t changes_ = 0;
};

}  // namespace longhaul
