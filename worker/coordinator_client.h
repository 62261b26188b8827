#pragma once
// A worker's side of the control plane: registration, its compute profile, the plan, the start barrier, heartbeats
// (on a thread of their own from registration on: a worker waiting for its plan is alive), the
// global gradient norm, and iteration, checkpoint and done reports. Every deadline derives from
// what the coordinator sends at registration (the job's heartbeat period and dead_after_s) or from
// transport.timeout_s; none is hard-coded.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "longhaul.grpc.pb.h"
#include "metrics/timeline.h"
#include "transport/rpc_auth.h"

namespace longhaul {

// Threads: the worker's own calls; the heartbeat thread and the lifeline thread (from Register on),
// which call on_stop and hear of plans (HeardOfPlan, news_mu_) and members (on_members, without a
// lock of this client's held; members_mu_); and any
// thread that reports (the checkpoint shipper's, the tensor server's). Fields without a mutex are
// atomics, or set before the threads start (the constructor; Register: id_, dead_after_s_) and
// only read after; coordinator_clock_ locks itself.
class CoordinatorClient {
 public:
  // `on_stop` is called from the heartbeat thread with the reason when the coordinator stops the
  // job or has not answered for the job's dead_after_s (once per silence; newer_plan 0), or has a plan newer than the
  // one this worker runs (SetPlanVersion; once per version, which newer_plan names), the latter with news_mu_
  // held: it must not call back into this client. Every call is signed with `secret` and, where
  // given, this worker's `key`, whose public key Register registers; over TLS where `tls` names
  // files (rpc_auth.h). `on_members`, where given, is called from the lifeline thread with the
  // workers not lost (and their keys) as each news of them arrives: whom this worker's tensor
  // port admits.
  CoordinatorClient(std::string address, const JobSecret& secret, const TlsFiles& tls, double connect_timeout_s,
                    std::function<void(const std::string& reason, uint64_t newer_plan)> on_stop,
                    std::shared_ptr<const WorkerKey> key = nullptr,
                    std::function<void(const std::vector<proto::Peer>&)> on_members = {});
  ~CoordinatorClient() ABSL_LOCKS_EXCLUDED(lifeline_mu_);  // ends the heartbeats
  CoordinatorClient(const CoordinatorClient&) = delete;

  const std::string& address() const { return address_; }
  int worker_id() const { return id_; }

  // Registers (retrying for the connect timeout while the coordinator starts) and starts the
  // heartbeats; the reply carries the worker id and the job config.
  absl::StatusOr<proto::RegisterReply> Register(proto::RegisterRequest req);
  // What this worker's backend measured (compute_probe.h); the plan waits for every worker's.
  absl::Status ReportProfile(const proto::ComputeProfile& compute);
  // A plan newer than `known_version` with a place for this worker: waits as long as it takes
  // (every worker to register; a spare, a lost worker's place), or at most `max_wait_s` where that
  // is positive (Unavailable past it). OutOfRange: the job finished without one. One the lifeline
  // brought is taken without asking, unless a newer version was heard of since (one that does not
  // place this worker: the coordinator is asked, and answers when a plan places it).
  absl::StatusOr<proto::Plan> AwaitPlan(uint64_t known_version, double max_wait_s = 0) ABSL_LOCKS_EXCLUDED(news_mu_);
  // The plan version this worker runs: a heartbeat that sees a newer one calls on_stop.
  void SetPlanVersion(uint64_t version) { plan_version_ = version; }
  // The coordinator stopped the job or refused this worker: no plan will come.
  bool job_stopped() const { return job_stopped_; }
  // Waits as long as it takes for every worker to register, and with `after_links` for every
  // worker to report its links; their addresses (link_probe.h).
  absl::StatusOr<proto::Peers> AwaitPeers(bool after_links = false);
  // What this worker measured of its links; the plan waits for every worker's where it asked.
  absl::Status ReportLinks(const proto::LinkReport& report);
  // Says this worker installed plan `version` and waits until every worker has.
  absl::Status AwaitStart(uint64_t version);
  // The workers not lost, with their tensor addresses, where the lifeline brought news of them
  // since the last call.
  std::optional<std::vector<proto::Peer>> TakeMembers() ABSL_LOCKS_EXCLUDED(members_mu_);
  // What the heartbeats report as the iteration under way.
  void SetIteration(int64_t it) { iteration_ = it; }
  // Deadlines of the calls below: transport.timeout_s, once the plan is known.
  void SetTimeout(double seconds) { timeout_s_ = seconds; }

  absl::Status ReportIteration(const proto::IterationReport& report);
  absl::Status ReportCheckpoint(const proto::CheckpointReport& report);
  // A part of a checkpoint piece's file into the coordinator's run directory, and one out of it
  // (checkpoint_courier.h); the worker id is filled in.
  absl::Status ShipCheckpoint(proto::CheckpointChunk chunk);
  absl::StatusOr<proto::CheckpointChunk> FetchCheckpoint(proto::CheckpointFetch fetch);
  // A part of this worker's timeline file into the coordinator's run directory
  // (checkpoint_courier.h ShipTimelineFile); the worker id is filled in.
  absl::Status ShipTimeline(proto::TimelineChunk chunk);
  // Best effort: the coordinator may be gone already.
  void ReportDone(const proto::DoneReport& report);
  // From this process's monotonic clock to the coordinator's, from the heartbeats' round trips.
  const ClockOffset& coordinator_clock() const { return coordinator_clock_; }
  // The worker of (stage, replica) under plan version `plan_version` closed its connection to this
  // one mid-run (SuspectReport); or, with a `failure`, this worker's plan version `plan_version`
  // failed with it, last on a link to that worker (or where none is known, this worker's own place).
  absl::Status ReportSuspect(int stage, int replica, const std::string& failure, uint64_t plan_version);
  // The newest plan version the heartbeats or the lifeline brought.
  uint64_t newest_plan() const { return newest_plan_; }

 private:
  void Heartbeat(double period_s, double dead_after_s);
  // Holds the Lifeline call open (again after each end) until this client ends.
  void HoldLifeline() ABSL_LOCKS_EXCLUDED(lifeline_mu_, members_mu_, news_mu_);
  // The heartbeats or the lifeline heard of plan `version`: on_stop once for a newer one than runs.
  void HeardOfPlan(uint64_t version) ABSL_LOCKS_EXCLUDED(news_mu_);
  std::chrono::system_clock::time_point Deadline() const;
  std::chrono::system_clock::time_point PollDeadline() const;
  // One report the coordinator answers with Empty, within the call deadline; errors say `what`.
  template <typename Request>
  absl::Status Report(grpc::Status (proto::Coordinator::Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                                     proto::Empty*),
                      const Request& req, const char* what);
  // Asks again while the coordinator answers "not yet" (NOT_FOUND) or the poll times out.
  // At most `max_wait_s` where that is positive.
  template <typename Request, typename Reply>
  absl::StatusOr<Reply> LongPoll(grpc::Status (proto::Coordinator::Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                                               Reply*),
                                 const Request& req, const std::string& waiting_for, double max_wait_s = 0);

  std::string address_;
  const std::string public_key_;  // this worker's, registered (empty: none, a test's client)
  double connect_timeout_s_, dead_after_s_ = 20;
  std::atomic<double> timeout_s_{120};  // set by the worker's thread, read by every caller's
  std::function<void(const std::string&, uint64_t)> on_stop_;
  std::function<void(const std::vector<proto::Peer>&)> on_members_;
  absl::Status channel_status_;  // why no channel could be made (a TLS file), returned by Register
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
  int id_ = -1;
  std::atomic<int64_t> iteration_{0};
  const std::string boot_id_ = BootId();
  ClockOffset coordinator_clock_;
  std::atomic<uint64_t> plan_version_{0};
  // The newest plan version heard of: raised under news_mu_ (HeardOfPlan, from two threads), read
  // without it.
  std::atomic<uint64_t> newest_plan_{0};
  absl::Mutex news_mu_;
  uint64_t replaced_ ABSL_GUARDED_BY(news_mu_) = 0;  // the newest plan version on_stop was called for
  // The newest plan the lifeline brought, until AwaitPlan takes it.
  std::optional<proto::Plan> news_plan_ ABSL_GUARDED_BY(news_mu_);
  std::atomic<bool> job_stopped_{false};
  // The client ends: set under lifeline_mu_, so that a lifeline call made after it is never made.
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
  absl::Mutex lifeline_mu_;  // the lifeline call's replacement against its cancellation at the end
  std::unique_ptr<grpc::ClientContext> lifeline_ctx_ ABSL_GUARDED_BY(lifeline_mu_);
  absl::Mutex members_mu_;
  std::optional<std::vector<proto::Peer>> members_ ABSL_GUARDED_BY(members_mu_);  // the lifeline's news, until TakeMembers
  std::thread lifeline_;
};

}  // namespace longhaul
