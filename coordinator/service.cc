#include "coordinator/service.h"

#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

#include "coordinator/checkpoint_index.h"
#include "coordinator/joining.h"
#include "coordinator/reports.h"
#include "coordinator/supervisor.h"

namespace longhaul {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

template <typename Request>
grpc::Status Service::Serve(absl::string_view method, const grpc::ServerContext& ctx, const Request& request,
                            const std::function<absl::Status()>& call) {
  if (grpc::Status st = verifier_.Check(ctx, method, request); !st.ok()) return st;
  absl::MutexLock lock(&job_.mu);
  if (grpc::Status st = Caller(method, ctx, request); !st.ok()) return st;
  return ToGrpc(call());
}

template <typename Request>
grpc::Status Service::Caller(absl::string_view method, const grpc::ServerContext& ctx, const Request& request) {
  const int id = request.worker_id();
  if (absl::Status st = job_.members.Check(id); !st.ok()) return ToGrpc(st);
  return verifier_.CheckWorker(ctx, method, request, id, job_.members.registration(id).public_key());
}

grpc::Status Service::Caller(absl::string_view method, const grpc::ServerContext& ctx,
                             const proto::RegisterRequest& request) {
  return verifier_.CheckWorker(ctx, method, request, -1, request.public_key());
}

grpc::Status Service::Register(grpc::ServerContext* ctx, const proto::RegisterRequest* req,
                               proto::RegisterReply* reply) {
  return Serve("Register", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return longhaul::Register(job_, *req, *reply); });
}

grpc::Status Service::ReportProfile(grpc::ServerContext* ctx, const proto::ProfileReport* req, proto::Empty*) {
  return Serve("ReportProfile", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return TakeProfile(job_, *req); });
}

grpc::Status Service::GetPeers(grpc::ServerContext* ctx, const proto::PeersRequest* req, proto::Peers* peers) {
  return Serve("GetPeers", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return Peers(job_, *req, *peers); });
}

grpc::Status Service::ReportLinks(grpc::ServerContext* ctx, const proto::LinkReport* req, proto::Empty*) {
  return Serve("ReportLinks", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return TakeLinks(job_, *req); });
}

grpc::Status Service::GetPlan(grpc::ServerContext* ctx, const proto::PlanRequest* req, proto::Plan* plan) {
  return Serve("GetPlan", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return PlanFor(job_, *req, *plan); });
}

grpc::Status Service::Ready(grpc::ServerContext* ctx, const proto::ReadyRequest* req, proto::ReadyReply* reply) {
  return Serve("Ready", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return longhaul::Ready(job_, *req, *reply); });
}

grpc::Status Service::Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                                proto::HeartbeatReply* reply) {
  return Serve("Heartbeat", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return longhaul::Heartbeat(job_, *req, *reply); });
}

grpc::Status Service::ReportIteration(grpc::ServerContext* ctx, const proto::IterationReport* req, proto::Empty*) {
  return Serve("ReportIteration", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return TakeIterationReport(job_, *req); });
}

grpc::Status Service::ReportCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointReport* req, proto::Empty*) {
  return Serve("ReportCheckpoint", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return TakeCheckpointReport(job_, *req); });
}

grpc::Status Service::ReportSuspect(grpc::ServerContext* ctx, const proto::SuspectReport* req, proto::Empty*) {
  return Serve("ReportSuspect", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return TakeSuspect(job_, *req); });
}

grpc::Status Service::Lifeline(grpc::ServerContext* ctx, const proto::LifelineRequest* req,
                               grpc::ServerWriter<proto::LifelineNews>* news) {
  return Serve("Lifeline", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return ServeLifeline(
      job_, req->worker_id(), [ctx] { return ctx->IsCancelled(); },
      [news](const proto::LifelineNews& n) { return news->Write(n); }); });
}

grpc::Status Service::ReportDone(grpc::ServerContext* ctx, const proto::DoneReport* req, proto::Empty*) {
  return Serve("ReportDone", *ctx, *req, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) { return TakeDone(job_, *req); });
}

// The three file calls check under the lock (Serve) and read or write outside it: other files'
// parts, most of them, go on meanwhile. Into keeps where the file is.
namespace {
absl::Status Into(absl::StatusOr<std::string> path, std::string& out) {
  if (path.ok()) out = *std::move(path);
  return path.status();
}
}  // namespace

grpc::Status Service::ShipCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointChunk* req, proto::Empty*) {
  std::string path;
  if (grpc::Status st = Serve("ShipCheckpoint", *ctx, *req,
                              [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) {
                                return Into(ShippedPartPath(job_, *req), path);
                              });
      !st.ok()) {
    return st;
  }
  return ToGrpc(ReceivePart(path, req->file_bytes(), req->offset(), req->data()));
}

grpc::Status Service::ShipTimeline(grpc::ServerContext* ctx, const proto::TimelineChunk* req, proto::Empty*) {
  std::string path;
  if (grpc::Status st = Serve("ShipTimeline", *ctx, *req,
                              [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) {
                                return Into(TimelinePartPath(job_, *req), path);
                              });
      !st.ok()) {
    return st;
  }
  return ToGrpc(ReceivePart(path, req->file_bytes(), req->offset(), req->data()));
}

grpc::Status Service::FetchCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointFetch* req,
                                      proto::CheckpointChunk* reply) {
  std::string path;
  if (grpc::Status st = Serve("FetchCheckpoint", *ctx, *req,
                              [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu) {
                                return Into(FetchedPartPath(job_, *req, *reply), path);
                              });
      !st.ok()) {
    return st;
  }
  absl::StatusOr<FilePart> part = ReadPart(path, req->offset());
  if (!part.ok()) return ToGrpc(part.status());
  reply->set_piece(req->piece());
  reply->set_file(req->file());
  reply->set_file_bytes(part->file_bytes);
  reply->set_offset(req->offset());
  reply->set_data(std::move(part->data));
  return grpc::Status::OK;
}

}  // namespace longhaul
