#pragma once
// The coordinator's gRPC service, a thin layer: each call is verified (the job secret, and the
// signature of the worker it speaks for: rpc_auth.h), then one function of the job's rooms runs
// with the job's lock held (joining.h, reports.h, supervisor.h), and its status goes back as the
// call's. Files shipped and fetched are read and written outside the lock.
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/job.h"
#include "longhaul.grpc.pb.h"
#include "transport/rpc_auth.h"

namespace longhaul {

class Service final : public proto::Coordinator::Service {
 public:
  // `verifier` and `job` outlive the service.
  Service(RpcVerifier& verifier, Job& job) : verifier_(verifier), job_(job) {}

  grpc::Status Register(grpc::ServerContext* ctx, const proto::RegisterRequest* req, proto::RegisterReply* reply) override;
  grpc::Status ReportProfile(grpc::ServerContext* ctx, const proto::ProfileReport* req, proto::Empty*) override;
  grpc::Status GetPeers(grpc::ServerContext* ctx, const proto::PeersRequest* req, proto::Peers* peers) override;
  grpc::Status ReportLinks(grpc::ServerContext* ctx, const proto::LinkReport* req, proto::Empty*) override;
  grpc::Status GetPlan(grpc::ServerContext* ctx, const proto::PlanRequest* req, proto::Plan* plan) override;
  grpc::Status Ready(grpc::ServerContext* ctx, const proto::ReadyRequest* req, proto::ReadyReply* reply) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override;
  grpc::Status ReportIteration(grpc::ServerContext* ctx, const proto::IterationReport* req, proto::Empty*) override;
  grpc::Status ReportCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointReport* req, proto::Empty*) override;
  grpc::Status ShipCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointChunk* req, proto::Empty*) override;
  grpc::Status ShipTimeline(grpc::ServerContext* ctx, const proto::TimelineChunk* req, proto::Empty*) override;
  grpc::Status FetchCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointFetch* req,
                               proto::CheckpointChunk* reply) override;
  grpc::Status ReportSuspect(grpc::ServerContext* ctx, const proto::SuspectReport* req, proto::Empty*) override;
  // Held for the worker's life, one server thread each (supervisor.h ServeLifeline).
  grpc::Status Lifeline(grpc::ServerContext* ctx, const proto::LifelineRequest* req,
                        grpc::ServerWriter<proto::LifelineNews>* news) override;
  grpc::Status ReportDone(grpc::ServerContext* ctx, const proto::DoneReport* req, proto::Empty*) override;

 private:
  // The secret's check of `request`, then with the job's lock held the caller's (Caller), then
  // `call`.
  template <typename Request>
  grpc::Status Serve(absl::string_view method, const grpc::ServerContext& ctx, const Request& request,
                     const std::function<absl::Status()>& call) ABSL_LOCKS_EXCLUDED(job_.mu);
  // The call is signed by the worker it speaks for: one registered and not lost (its credential
  // goes with it), whose registered key signed it; a registration, by the key it registers.
  template <typename Request>
  grpc::Status Caller(absl::string_view method, const grpc::ServerContext& ctx, const Request& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu);
  grpc::Status Caller(absl::string_view method, const grpc::ServerContext& ctx, const proto::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu);

  RpcVerifier& verifier_;
  Job& job_;
};

}  // namespace longhaul
