#include "worker/coordinator_client.h"

#include <cmath>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/job_config.h"

namespace longhaul {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace

CoordinatorClient::CoordinatorClient(std::string address, const JobSecret& secret, const TlsFiles& tls,
                                     double connect_timeout_s,
                                     std::function<void(const std::string&, uint64_t)> on_stop,
                                     std::shared_ptr<const WorkerKey> key,
                                     std::function<void(const std::vector<proto::Peer>&)> on_members)
    : address_(std::move(address)),
      public_key_(key ? key->public_key() : std::string()),
      connect_timeout_s_(connect_timeout_s),
      on_stop_(std::move(on_stop)),
      on_members_(std::move(on_members)) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CoordinatorChannel(address_, secret, tls, args, std::move(key));
  if (!channel.ok()) {
    channel_status_ = channel.status();
    return;
  }
  channel_ = *std::move(channel);
  stub_ = proto::Coordinator::NewStub(channel_);
}

CoordinatorClient::~CoordinatorClient() {
  {
    absl::MutexLock lock(&lifeline_mu_);
    stop_ = true;
    if (lifeline_ctx_) lifeline_ctx_->TryCancel();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  if (lifeline_.joinable()) lifeline_.join();
}

void CoordinatorClient::HeardOfPlan(uint64_t version) {
  absl::MutexLock lock(&news_mu_);
  newest_plan_ = std::max<uint64_t>(newest_plan_, version);
  const uint64_t running = plan_version_;
  if (running == 0 || version <= running || version <= replaced_) return;
  replaced_ = version;
  on_stop_(absl::StrFormat("plan version %d replaces version %d", version, running), version);
}

void CoordinatorClient::HoldLifeline() {
  proto::LifelineRequest req;
  req.set_worker_id(id_);
  while (true) {
    // Replaced by this thread alone, so the call may use it without the lock; the destructor
    // cancels it under the lock.
    grpc::ClientContext* ctx;
    {
      absl::MutexLock lock(&lifeline_mu_);
      if (stop_) return;
      lifeline_ctx_ = std::make_unique<grpc::ClientContext>();
      lifeline_ctx_->set_wait_for_ready(true);  // through a coordinator's restart
      ctx = lifeline_ctx_.get();
    }
    const auto held = Clock::now();
    std::unique_ptr<grpc::ClientReader<proto::LifelineNews>> reader = stub_->Lifeline(ctx, req);
    proto::LifelineNews news;
    while (reader->Read(&news)) {
      if (news.members_size() > 0) {
        std::vector<proto::Peer> members(news.members().begin(), news.members().end());
        // Kept before the observer hears: whoever it wakes finds them with TakeMembers.
        {
          absl::MutexLock lock(&members_mu_);
          members_ = members;
        }
        if (on_members_) on_members_(members);
      }
      if (news.has_plan()) {
        absl::MutexLock lock(&news_mu_);
        if (!news_plan_ || news_plan_->version() < news.plan().version()) news_plan_ = std::move(*news.mutable_plan());
      }
      HeardOfPlan(news.plan_version());
    }
    (void)reader->Finish();
    // A lifeline held a while and then lost (its connection reset) is held again at once: the
    // coordinator loses this worker if it is not back within cluster.lifeline_grace_s. One refused
    // at once (the job ended) is asked again a moment later, not in a spin.
    if (Clock::now() - held > std::chrono::seconds(1)) continue;
    for (int i = 0; i < 4 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::optional<std::vector<proto::Peer>> CoordinatorClient::TakeMembers() {
  absl::MutexLock lock(&members_mu_);
  return std::exchange(members_, std::nullopt);
}

std::chrono::system_clock::time_point CoordinatorClient::Deadline() const {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
}

absl::StatusOr<proto::RegisterReply> CoordinatorClient::Register(proto::RegisterRequest req) {
  if (!channel_status_.ok()) return channel_status_;
  req.set_public_key(public_key_);
  proto::RegisterReply reply;
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);  // keep trying while the coordinator starts
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s_ * 1000)));
  grpc::Status st = stub_->Register(&ctx, req, &reply);
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot reach the coordinator at %s after %.0f s: is it running, and is --coordinator right?", address_,
        connect_timeout_s_));
  }
  if (!st.ok()) return FromGrpc(st, absl::StrCat("the coordinator at ", address_, " refused this worker"));
  // Deadlines and periods are made of them: a zero would spin, a NaN or a huge one overflow.
  auto sane = [](double s) { return std::isfinite(s) && s > 0 && s <= kLongestSeconds; };
  if (!sane(reply.heartbeat_s()) || !sane(reply.dead_after_s()) || reply.dead_after_s() <= reply.heartbeat_s()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the coordinator at %s gave a heartbeat every %g s and a worker lost after %g s of silence: it is no longhaul "
        "coordinator of this build; run one longhaul version on every host",
        address_, reply.heartbeat_s(), reply.dead_after_s()));
  }
  id_ = reply.worker_id();
  dead_after_s_ = reply.dead_after_s();
  heartbeat_ = std::thread([this, period = reply.heartbeat_s(), dead_after = reply.dead_after_s()] {
    Heartbeat(period, dead_after);
  });
  lifeline_ = std::thread([this] { HoldLifeline(); });
  return reply;
}

template <typename Request>
absl::Status CoordinatorClient::Report(
    grpc::Status (proto::Coordinator::Stub::*rpc)(grpc::ClientContext*, const Request&, proto::Empty*),
    const Request& req, const char* what) {
  proto::Empty empty;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  grpc::Status st = (stub_.get()->*rpc)(&ctx, req, &empty);
  return st.ok() ? absl::OkStatus() : FromGrpc(st, what);
}

absl::Status CoordinatorClient::ReportProfile(const proto::ComputeProfile& compute) {
  proto::ProfileReport report;
  report.set_worker_id(id_);
  *report.mutable_compute() = compute;
  return Report(&proto::Coordinator::Stub::ReportProfile, report,
                "reporting this worker's compute profile to the coordinator");
}

std::chrono::system_clock::time_point CoordinatorClient::PollDeadline() const {
  // Long polls (the plan, the start barrier) ask again after half the job's silence limit; the
  // coordinator answers sooner when it has news.
  return std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(dead_after_s_ * 500));
}

template <typename Request, typename Reply>
absl::StatusOr<Reply> CoordinatorClient::LongPoll(
    grpc::Status (proto::Coordinator::Stub::*rpc)(grpc::ClientContext*, const Request&, Reply*), const Request& req,
    const std::string& waiting_for, double max_wait_s) {
  const auto give_up = max_wait_s > 0 ? std::chrono::system_clock::now() +
                                            std::chrono::milliseconds(static_cast<int64_t>(max_wait_s * 1000))
                                      : std::chrono::system_clock::time_point::max();
  // A coordinator restarted from its job state is back at the same address within the job's
  // silence limit; one unreachable for longer is gone.
  auto reachable_since = std::chrono::system_clock::now();
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::min(PollDeadline(), give_up));
    ctx.set_wait_for_ready(true);  // through a reconnect's backoff, to the deadline
    Reply reply;
    grpc::Status st = (stub_.get()->*rpc)(&ctx, req, &reply);
    if (st.ok()) return reply;
    if (st.error_code() == grpc::StatusCode::ABORTED) return absl::AbortedError(st.error_message());
    if (st.error_code() == grpc::StatusCode::OUT_OF_RANGE) return absl::OutOfRangeError(st.error_message());
    const auto now = std::chrono::system_clock::now();
    const bool unreachable = st.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!unreachable) reachable_since = now;
    const bool not_yet = st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                         st.error_code() == grpc::StatusCode::NOT_FOUND ||
                         (unreachable && now - reachable_since < std::chrono::milliseconds(
                                                                    static_cast<int64_t>(dead_after_s_ * 1000)));
    if (!not_yet) return FromGrpc(st, absl::StrCat("waiting for ", waiting_for, " from ", address_));
    if (now >= give_up) {
      return absl::UnavailableError(absl::StrFormat("waited %.0f s for %s from %s in vain: %s", max_wait_s,
                                                    waiting_for, address_, st.error_message()));
    }
    // An unreachable coordinator answers at once: ask again after a moment, not in a spin.
    if (unreachable) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

absl::StatusOr<proto::Plan> CoordinatorClient::AwaitPlan(uint64_t known_version, double max_wait_s) {
  {
    absl::MutexLock lock(&news_mu_);
    if (news_plan_ && news_plan_->version() > known_version && news_plan_->version() >= newest_plan_) {
      return *std::exchange(news_plan_, std::nullopt);
    }
    news_plan_.reset();
  }
  proto::PlanRequest req;
  req.set_worker_id(id_);
  req.set_known_version(known_version);
  absl::StatusOr<proto::Plan> plan =
      LongPoll(&proto::Coordinator::Stub::GetPlan, req, "a plan with a place for this worker", max_wait_s);
  // A newer plan without a place for this worker (it straggled, and a spare took its place): it
  // waits as a spare now, as long as it takes.
  if (absl::IsUnavailable(plan.status()) && max_wait_s > 0 && newest_plan_ > known_version) {
    plan = LongPoll(&proto::Coordinator::Stub::GetPlan, req, "a plan with a place for this worker");
  }
  return plan;
}

absl::StatusOr<proto::Peers> CoordinatorClient::AwaitPeers(bool after_links) {
  proto::PeersRequest req;
  req.set_worker_id(id_);
  req.set_after_links(after_links);
  return LongPoll(&proto::Coordinator::Stub::GetPeers, req,
                  after_links ? "every worker to report its links" : "every worker to register");
}

absl::Status CoordinatorClient::ReportLinks(const proto::LinkReport& report) {
  return Report(&proto::Coordinator::Stub::ReportLinks, report, "reporting this worker's links to the coordinator");
}

absl::Status CoordinatorClient::AwaitStart(uint64_t version) {
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(PollDeadline());
    proto::ReadyRequest req;
    req.set_worker_id(id_);
    req.set_plan_version(version);
    proto::ReadyReply reply;
    grpc::Status st = stub_->Ready(&ctx, req, &reply);
    if (st.ok()) return reply.abort() ? absl::AbortedError(reply.reason()) : absl::OkStatus();
    if (st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return FromGrpc(st, absl::StrCat("waiting at ", address_, " for every worker to start"));
    }
  }
}

void CoordinatorClient::Heartbeat(double period_s, double dead_after_s) {
  auto last_ok = Clock::now();
  bool outage = false;    // on_stop was called for the silence since last_ok
  const auto period = std::chrono::milliseconds(static_cast<int64_t>(period_s * 1000));
  while (!stop_) {
    grpc::ClientContext ctx;
    // One period of patience per call, so silence is noticed within dead_after_s.
    ctx.set_deadline(std::chrono::system_clock::now() + std::max(period, std::chrono::milliseconds(100)));
    proto::HeartbeatRequest req;
    req.set_worker_id(id_);
    req.set_iteration(iteration_);
    proto::HeartbeatReply reply;
    const int64_t sent_us = Timeline::NowMicros();
    grpc::Status st = stub_->Heartbeat(&ctx, req, &reply);
    if (st.ok()) {
      last_ok = Clock::now();
      outage = false;
      if (!boot_id_.empty() && reply.coordinator_boot_id() == boot_id_) {
        coordinator_clock_.SameKernel();
      } else if (reply.coordinator_clock_us() != 0) {
        coordinator_clock_.Sample(sent_us, reply.coordinator_clock_us(), Timeline::NowMicros());
      }
      if (reply.abort()) {
        job_stopped_ = true;
        return on_stop_(absl::StrCat("the coordinator stopped the job: ", reply.reason()), 0);
      }
      HeardOfPlan(reply.plan_version());
    } else if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // This worker was declared lost: its place is another's now.
      job_stopped_ = true;
      return on_stop_(absl::StrCat("the coordinator refused this worker: ", st.error_message()), 0);
    } else if (!outage && std::chrono::duration<double>(Clock::now() - last_ok).count() > dead_after_s) {
      // The heartbeats go on: a coordinator restarted from its job state file knows this worker.
      outage = true;
      on_stop_(absl::StrFormat("lost the coordinator at %s (no answer for %.0f s): %s", address_, dead_after_s,
                               st.error_message()),
               0);
    }
    for (auto slept = std::chrono::milliseconds(0); slept < period && !stop_; slept += std::chrono::milliseconds(50)) {
      std::this_thread::sleep_for(std::min(std::chrono::milliseconds(50), period - slept));
    }
  }
}

absl::Status CoordinatorClient::ReportIteration(const proto::IterationReport& report) {
  return Report(&proto::Coordinator::Stub::ReportIteration, report, "reporting to the coordinator");
}

absl::Status CoordinatorClient::ReportCheckpoint(const proto::CheckpointReport& report) {
  return Report(&proto::Coordinator::Stub::ReportCheckpoint, report, "reporting a checkpoint to the coordinator");
}

absl::Status CoordinatorClient::ShipCheckpoint(proto::CheckpointChunk chunk) {
  chunk.set_worker_id(id_);
  return Report(&proto::Coordinator::Stub::ShipCheckpoint, chunk, "shipping a checkpoint piece to the coordinator");
}

absl::StatusOr<proto::CheckpointChunk> CoordinatorClient::FetchCheckpoint(proto::CheckpointFetch fetch) {
  fetch.set_worker_id(id_);
  proto::CheckpointChunk chunk;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  grpc::Status st = stub_->FetchCheckpoint(&ctx, fetch, &chunk);
  if (!st.ok()) return FromGrpc(st, "fetching a checkpoint piece from the coordinator");
  return chunk;
}

absl::Status CoordinatorClient::ReportSuspect(int stage, int replica, const std::string& failure,
                                              uint64_t plan_version) {
  proto::SuspectReport report;
  report.set_worker_id(id_);
  report.set_stage(stage);
  report.set_replica(replica);
  report.set_failure(failure);
  report.set_plan_version(plan_version);
  return Report(&proto::Coordinator::Stub::ReportSuspect, report,
                failure.empty() ? "reporting a peer that left to the coordinator"
                                : "reporting this worker's failed plan version to the coordinator");
}

absl::Status CoordinatorClient::ShipTimeline(proto::TimelineChunk chunk) {
  chunk.set_worker_id(id_);
  return Report(&proto::Coordinator::Stub::ShipTimeline, chunk, "shipping this worker's timeline to the coordinator");
}

void CoordinatorClient::ReportDone(const proto::DoneReport& report) {
  if (id_ < 0) return;
  proto::Empty empty;
  grpc::ClientContext ctx;
  // No longer than the coordinator would wait for this worker's heartbeat.
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(dead_after_s_ * 1000)));
  stub_->ReportDone(&ctx, report, &empty);
}

}  // namespace longhaul
