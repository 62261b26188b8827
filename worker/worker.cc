#include "worker/worker.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "config/job_config.h"
#include "config/resume_check.h"
#include "data/batch_sampler.h"
#include "longhaul.grpc.pb.h"
#include "metrics/timeline.h"
#include "model/gpt_stage.h"
#include "schedule/schedule.h"
#include "transport/crc32c.h"
#include "transport/tensor_transport.h"
#include "util/status_macros.h"
#include "worker/job_setup.h"
#include "worker/ps_shard.h"
#include "worker/tensor_admission.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

class Worker {
 public:
  explicit Worker(const WorkerOptions& opt) : opt_(opt) {}
  ~Worker() {
    stop_heartbeat_ = true;
    if (heartbeat_.joinable()) heartbeat_.join();
  }
  Worker(const Worker&) = delete;

  absl::Status Run();

 private:
  absl::Status Join();
  absl::Status Setup();
  // Returns once every worker of the plan has set it up, so none is sent a tensor it would refuse.
  absl::Status AwaitStart();
  absl::Status RunIteration(int64_t it);
  absl::Status ServeShards(int64_t it, double* grad_norm, float* lr);
  absl::Status BroadcastParams(int64_t it);
  absl::Status PullParams(int64_t it);
  absl::Status Checkpoint(int64_t step);
  void Heartbeat(double period_s, double dead_after_s);
  // Ends every receive and send at once, with `reason` as their error.
  void Stop(const std::string& reason);

  TensorClient& Peer(const std::string& address);
  std::string AddressOf(int stage, int replica) const;
  absl::StatusOr<std::vector<float>> Take(int kind, int64_t it, int micro, int from_stage, int from_replica,
                                          int shard);
  void Send(int kind, int64_t it, int micro, int shard, const std::string& to, const float* data, size_t n);
  // Delivers a tensor this worker sends itself, rounded through the wire dtype as a peer receives
  // it: otherwise the replicas' parameters drift apart whenever the wire is not fp32.
  void SendToSelf(int kind, int64_t it, int shard, const float* data, size_t n);
  absl::Status FinishSends(int64_t it);
  std::string Who() const { return absl::StrFormat("[worker %d s%d r%d]", id_, s_, r_); }

  WorkerOptions opt_;
  // The server, destroyed first, uses the mailbox and the admission.
  Mailbox mailbox_;
  PlanAdmission admission_;
  std::shared_ptr<SendCanceller> canceller_ = std::make_shared<SendCanceller>();
  std::unique_ptr<TensorServer> server_;
  std::shared_ptr<grpc::Channel> coord_channel_;
  std::unique_ptr<proto::Coordinator::Stub> coord_;
  proto::Plan plan_;
  JobConfig cfg_;
  int id_ = -1, s_ = 0, r_ = 0, P_ = 1, D_ = 1, M_ = 1;
  std::optional<TokenDataset> data_;
  std::unique_ptr<BatchSampler> sampler_;
  std::unique_ptr<GptStage> stage_;
  std::vector<GptStage::ActivationsPtr> acts_;
  std::vector<Instr> schedule_;
  std::vector<proto::ShardPlacement> my_stage_shards_;
  std::vector<std::unique_ptr<PsShard>> owned_;
  LrSchedule lr_;
  TransportOptions transport_;
  std::map<std::string, std::unique_ptr<TensorClient>> peers_;
  std::map<std::string, std::string> dial_map_;  // peer address -> address to dial instead
  std::vector<std::shared_ptr<SendOp>> in_flight_;
  std::vector<std::pair<std::string, int>> in_flight_names_;
  Timeline timeline_;
  double wait_seconds_ = 0, compute_seconds_ = 0;

  std::thread heartbeat_;
  std::atomic<bool> stop_heartbeat_{false};
  std::atomic<int64_t> iteration_{0};
};

std::string Worker::AddressOf(int stage, int replica) const {
  for (const proto::Assignment& a : plan_.assignments())
    if (a.stage() == stage && a.replica() == replica) return a.address();
  return "";
}

TensorClient& Worker::Peer(const std::string& address) {
  auto& c = peers_[address];
  if (!c) {
    auto via = dial_map_.find(address);
    c = std::make_unique<TensorClient>(via == dial_map_.end() ? address : via->second, transport_);
  }
  return *c;
}

absl::StatusOr<std::vector<float>> Worker::Take(int kind, int64_t it, int micro, int from_stage, int from_replica,
                                                int shard) {
  const int64_t t0 = Timeline::NowMicros();
  auto got = mailbox_.Take({kind, it, micro, from_stage, from_replica, shard}, transport_.timeout);
  const int64_t t1 = Timeline::NowMicros();
  wait_seconds_ += (t1 - t0) * 1e-6;
  static const char* names[] = {"?", "wait act", "wait grad", "wait grad push", "wait params"};
  if (t1 - t0 > 20) timeline_.Add(names[kind], kind >= proto::GRAD_PUSH ? Track::kParams : Track::kCompute, t0, t1, it,
                                  kind <= proto::GRADIENT ? micro : -1);
  if (!got.ok()) {
    return absl::Status(got.status().code(), absl::StrCat(got.status().message(), " [peer ",
                                                          AddressOf(from_stage, from_replica), "]"));
  }
  return got;
}

void Worker::Send(int kind, int64_t it, int micro, int shard, const std::string& to, const float* data, size_t n) {
  proto::TensorHeader h;
  h.set_plan_version(plan_.version());
  h.set_kind(static_cast<proto::TensorKind>(kind));
  h.set_iteration(it);
  h.set_micro_batch(micro);
  h.set_from_stage(s_);
  h.set_from_replica(r_);
  h.set_shard(shard);
  static const char* names[] = {"?", "send act", "send grad", "push grads", "send params"};
  in_flight_.push_back(Peer(to).Send(h, data, n));
  in_flight_names_.emplace_back(names[kind], micro);
}

void Worker::SendToSelf(int kind, int64_t it, int shard, const float* data, size_t n) {
  std::vector<float> own = mailbox_.Acquire(n);
  std::copy(data, data + n, own.begin());
  RoundThroughWire(own.data(), n, transport_.dtype);
  mailbox_.Put({kind, it, 0, s_, r_, shard}, std::move(own));
}

absl::Status Worker::FinishSends(int64_t it) {
  absl::Status first;
  for (size_t i = 0; i < in_flight_.size(); ++i) {
    absl::Status s = in_flight_[i]->Wait();
    if (!s.ok() && first.ok()) first = s;
    const int64_t end = Timeline::NowMicros();
    const int64_t start = end - static_cast<int64_t>(in_flight_[i]->seconds() * 1e6);
    timeline_.Add(in_flight_names_[i].first, Track::kSend, start, end, it, in_flight_names_[i].second);
  }
  in_flight_.clear();
  in_flight_names_.clear();
  return first;
}

absl::Status Worker::Join() {
  if (!opt_.dial_map.empty()) {
    std::ifstream f(opt_.dial_map);
    if (!f) return absl::NotFoundError(absl::StrCat("cannot open --dial-map ", opt_.dial_map));
    std::string from, to;
    while (f >> from >> to) dial_map_[from] = to;
  }
  LH_ASSIGN_OR_RETURN(server_, TensorServer::Start(opt_.listen, opt_.job_id.empty() ? "?" : opt_.job_id, &mailbox_,
                                                   &admission_));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  coord_channel_ = grpc::CreateCustomChannel(opt_.coordinator, grpc::InsecureChannelCredentials(), args);
  coord_ = proto::Coordinator::NewStub(coord_channel_);

  proto::RegisterRequest req;
  req.set_job_id(opt_.job_id);
  req.set_protocol_version(kProtocolVersion);
  req.set_address(server_->address());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  req.set_host(host);
  req.set_backend("cpu");
  req.set_pid(getpid());
  proto::RegisterReply reply;
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);  // keep trying while the coordinator starts
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(opt_.connect_timeout_s * 1000)));
  grpc::Status st = coord_->Register(&ctx, req, &reply);
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot reach the coordinator at %s after %.0f s: is it running, and is --coordinator right?",
        opt_.coordinator, opt_.connect_timeout_s));
  }
  if (!st.ok()) return FromGrpc(st, absl::StrCat("the coordinator at ", opt_.coordinator, " refused this worker"));
  id_ = reply.worker_id();
  // A worker waiting for its plan is alive: it says so from now on.
  heartbeat_ = std::thread([this, period = reply.heartbeat_s(), dead_after = reply.dead_after_s()] {
    Heartbeat(period, dead_after);
  });

  // The plan comes once every worker has registered.
  while (true) {
    grpc::ClientContext pctx;
    pctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PlanRequest preq;
    preq.set_worker_id(id_);
    grpc::Status ps = coord_->GetPlan(&pctx, preq, &plan_);
    if (ps.ok()) break;
    if (ps.error_code() == grpc::StatusCode::ABORTED) return absl::AbortedError(ps.error_message());
    if (ps.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED && ps.error_code() != grpc::StatusCode::NOT_FOUND) {
      return FromGrpc(ps, absl::StrCat("waiting for the plan from ", opt_.coordinator));
    }
  }
  return absl::OkStatus();
}

absl::Status Worker::Setup() {
  LH_ASSIGN_OR_RETURN(cfg_, ParseJobConfig(plan_.config_toml(), "the job config from the coordinator"));
  server_->SetJobId(plan_.job_id());
  for (const proto::Assignment& a : plan_.assignments())
    if (a.worker_id() == id_) s_ = a.stage(), r_ = a.replica();
  P_ = plan_.stages(), D_ = plan_.replicas(), M_ = cfg_.train.micro_batches;
  omp_set_num_threads(opt_.threads > 0 ? opt_.threads : (cfg_.train.threads > 0 ? cfg_.train.threads : omp_get_num_procs()));
  LH_RETURN_IF_ERROR(CheckWorkerMemory(cfg_, s_, r_, omp_get_max_threads()));
  transport_.job_id = plan_.job_id();
  transport_.dtype = cfg_.transport.wire_dtype;
  transport_.chunk_bytes = static_cast<size_t>(cfg_.transport.chunk_mib) << 20;
  transport_.connections = cfg_.transport.connections;
  transport_.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg_.transport.timeout_s * 1000));
  transport_.canceller = canceller_;
  // Tensors of the initial parameter broadcast (iteration start - 1) onwards; then the plan says
  // what each peer may send.
  mailbox_.SetWindow(plan_.start_iteration() - 1);
  admission_.SetPlan(plan_, cfg_, s_, r_);

  LH_ASSIGN_OR_RETURN(TokenDataset data, LoadDataset(cfg_));
  data_ = std::move(data);
  sampler_ = std::make_unique<BatchSampler>(
      SamplerConfig{cfg_.train.micro_batch_size, cfg_.train.seq_len, cfg_.train.seed, cfg_.model.attention, M_},
      data_->train());
  LH_RETURN_IF_ERROR(sampler_->Check("training"));
  LH_ASSIGN_OR_RETURN(stage_, GptStage::Create(cfg_.model, cfg_.Stage(s_), cfg_.train.micro_batch_size,
                                               cfg_.train.seq_len, cfg_.train.recompute));
  stage_->InitParams(cfg_.train.seed);
  for (int i = 0; i < ActivationSlots(cfg_.cluster.schedule, P_, s_, M_); ++i) acts_.push_back(stage_->NewActivations());
  schedule_ = MakeSchedule(cfg_.cluster.schedule, P_, s_, M_);
  lr_ = {cfg_.train.lr, cfg_.train.min_lr, cfg_.train.warmup_steps, cfg_.train.steps};

  for (const proto::ShardPlacement& sp : plan_.shards()) {
    if (sp.stage() != s_) continue;
    my_stage_shards_.push_back(sp);
    if (sp.owner_replica() != r_) continue;
    auto shard = std::make_unique<PsShard>(cfg_.train.adamw, stage_->layout(), s_, sp.shard(), sp.first_tensor(),
                                           sp.end_tensor(), D_);
    std::copy(stage_->params() + shard->begin(), stage_->params() + shard->begin() + shard->size(),
              shard->params().begin());
    if (!plan_.resume_checkpoint().empty()) {
      const std::string dir = (fs::path(cfg_.train.out_dir) / "checkpoints" /
                               absl::StrFormat("stage_%d_shard_%d", s_, sp.shard()) / plan_.resume_checkpoint())
                                  .string();
      LH_RETURN_IF_ERROR(CheckCheckpointResumable(dir, cfg_));
      LH_RETURN_IF_ERROR(LoadCheckpoint(dir, shard->layout(), shard->params().data(), shard->adamw().m().data(),
                                        shard->adamw().v().data())
                             .status());
    }
    owned_.push_back(std::move(shard));
  }
  std::cout << absl::StrFormat("%s blocks [%d, %d) of %d, %d parameters, listening at %s, %d threads\n", Who(),
                               stage_->spec().first_block, stage_->spec().end_block, cfg_.model.n_layer,
                               stage_->num_params(), server_->address(), omp_get_max_threads())
            << std::flush;
  return absl::OkStatus();
}

absl::Status Worker::AwaitStart() {
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::ReadyRequest req;
    req.set_worker_id(id_);
    req.set_plan_version(plan_.version());
    proto::ReadyReply reply;
    grpc::Status st = coord_->Ready(&ctx, req, &reply);
    if (st.ok()) return reply.abort() ? absl::AbortedError(reply.reason()) : absl::OkStatus();
    if (st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return FromGrpc(st, absl::StrCat("waiting at ", opt_.coordinator, " for every worker to start"));
    }
  }
}

void Worker::Stop(const std::string& reason) {
  mailbox_.Close(reason);
  canceller_->Cancel(reason);
}

void Worker::Heartbeat(double period_s, double dead_after_s) {
  auto last_ok = Clock::now();
  while (!stop_heartbeat_) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    proto::HeartbeatRequest req;
    req.set_worker_id(id_);
    req.set_iteration(iteration_);
    proto::HeartbeatReply reply;
    grpc::Status st = coord_->Heartbeat(&ctx, req, &reply);
    if (st.ok()) {
      last_ok = Clock::now();
      if (reply.abort()) {
        Stop(absl::StrCat("the coordinator stopped the job: ", reply.reason()));
        return;
      }
    } else if (std::chrono::duration<double>(Clock::now() - last_ok).count() > dead_after_s) {
      Stop(absl::StrFormat("lost the coordinator at %s (no answer for %.0f s): %s", opt_.coordinator, dead_after_s,
                           st.error_message()));
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(period_s * 1000)));
  }
}

absl::Status Worker::BroadcastParams(int64_t it) {
  for (auto& shard : owned_) {
    for (int rep = 0; rep < D_; ++rep) {
      if (rep == r_) {
        SendToSelf(proto::PARAMS, it, shard->shard(), shard->params().data(), shard->size());
      } else {
        Send(proto::PARAMS, it, 0, shard->shard(), AddressOf(s_, rep), shard->params().data(), shard->size());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Worker::PullParams(int64_t it) {
  const int64_t t0 = Timeline::NowMicros();
  for (const proto::ShardPlacement& sp : my_stage_shards_) {
    LH_ASSIGN_OR_RETURN(std::vector<float> p, Take(proto::PARAMS, it, 0, s_, sp.owner_replica(), sp.shard()));
    std::copy(p.begin(), p.end(), stage_->params() + stage_->layout().Range(sp.first_tensor(), sp.end_tensor()).first);
    mailbox_.Recycle(std::move(p));
  }
  timeline_.Add("pull params", Track::kParams, t0, Timeline::NowMicros(), it);
  return absl::OkStatus();
}

absl::Status Worker::ServeShards(int64_t it, double* grad_norm, float* lr) {
  if (owned_.empty()) return absl::OkStatus();
  const int64_t t0 = Timeline::NowMicros();
  proto::NormReport report;
  report.set_worker_id(id_);
  report.set_iteration(it);
  for (auto& shard : owned_) {
    for (int rep = 0; rep < D_; ++rep) {
      LH_ASSIGN_OR_RETURN(std::vector<float> g, Take(proto::GRAD_PUSH, it, 0, s_, rep, shard->shard()));
      LH_RETURN_IF_ERROR(shard->AddReplicaGradient(rep, g));
      mailbox_.Recycle(std::move(g));
    }
    proto::ShardNorm* n = report.add_shards();
    n->set_stage(s_);
    n->set_shard(shard->shard());
    LH_ASSIGN_OR_RETURN(const double sum_squares, shard->AveragedSquaredNorm());
    n->set_sum_squares(sum_squares);
  }
  proto::NormReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + transport_.timeout);
  grpc::Status st = coord_->ReduceNorm(&ctx, report, &reply);
  if (!st.ok()) return FromGrpc(st, "reducing the gradient norm at the coordinator");
  if (reply.abort()) return absl::AbortedError(reply.reason());
  for (auto& shard : owned_) {
    OptimizerStepResult r = shard->Step(lr_, cfg_.train.grad_clip, it, reply.global_norm());
    *grad_norm = r.grad_norm;
    *lr = r.lr;
  }
  if (!std::isfinite(reply.global_norm())) {
    return absl::InternalError(absl::StrFormat(
        "iteration %d: gradient norm %g is not finite: lower train.lr or set train.grad_clip", it + 1,
        reply.global_norm()));
  }
  timeline_.Add("ps step", Track::kParams, t0, Timeline::NowMicros(), it);
  return BroadcastParams(it);
}

absl::Status Worker::RunIteration(int64_t it) {
  const auto t_start = Clock::now();
  wait_seconds_ = compute_seconds_ = 0;
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < M_; ++m) mbs.push_back(sampler_->Sample(it, r_, m));
  std::vector<std::vector<float>> inputs(M_), grads_in(M_), grads_out(M_);
  const size_t boundary = static_cast<size_t>(cfg_.train.micro_batch_size) * cfg_.train.seq_len * cfg_.model.d_model;
  const bool first = s_ == 0, last = s_ == P_ - 1;
  const int slots = static_cast<int>(acts_.size());
  double loss = 0, floor = 0, grad_norm = 0;
  float lr = 0;
  const float* input_grad = nullptr;
  stage_->ZeroGrads();
  for (const Instr& in : schedule_) {
    const int m = in.micro;
    switch (in.op) {
      case Op::kRecvAct: {
        LH_ASSIGN_OR_RETURN(inputs[m], Take(proto::ACTIVATION, it, m, s_ - 1, r_, 0));
        break;
      }
      case Op::kForward: {
        const int64_t t0 = Timeline::NowMicros();
        const float l = stage_->Forward(*acts_[m % slots], mbs[m], first ? nullptr : inputs[m].data());
        mailbox_.Recycle(std::move(inputs[m]));
        if (last) loss += l / M_, floor += EntropyFloor(*data_, mbs[m]) / M_;
        const int64_t t1 = Timeline::NowMicros();
        compute_seconds_ += (t1 - t0) * 1e-6;
        timeline_.Add(absl::StrCat("F", m), Track::kCompute, t0, t1, it, m);
        break;
      }
      case Op::kSendAct:
        Send(proto::ACTIVATION, it, m, 0, AddressOf(s_ + 1, r_), stage_->Output(*acts_[m % slots]), boundary);
        break;
      case Op::kRecvGrad: {
        LH_ASSIGN_OR_RETURN(grads_in[m], Take(proto::GRADIENT, it, m, s_ + 1, r_, 0));
        break;
      }
      case Op::kBackward: {
        const int64_t t0 = Timeline::NowMicros();
        // Valid until the next backward; the schedule sends it before that.
        input_grad = stage_->Backward(*acts_[m % slots], mbs[m], last ? nullptr : grads_in[m].data(),
                                      1.0f / static_cast<float>(M_));
        mailbox_.Recycle(std::move(grads_in[m]));
        const int64_t t1 = Timeline::NowMicros();
        compute_seconds_ += (t1 - t0) * 1e-6;
        timeline_.Add(absl::StrCat("B", m), Track::kCompute, t0, t1, it, m);
        break;
      }
      case Op::kSendGrad:
        // fp32 sends read the buffer in place until acknowledged, and the next backward reuses
        // the stage's: give this gradient its own until the iteration's sends are done.
        grads_out[m] = mailbox_.Acquire(boundary);
        std::copy(input_grad, input_grad + boundary, grads_out[m].begin());
        Send(proto::GRADIENT, it, m, 0, AddressOf(s_ - 1, r_), grads_out[m].data(), boundary);
        break;
      case Op::kPushGrads:
        for (const proto::ShardPlacement& sp : my_stage_shards_) {
          const auto [begin, end] = stage_->layout().Range(sp.first_tensor(), sp.end_tensor());
          if (sp.owner_replica() == r_) {
            SendToSelf(proto::GRAD_PUSH, it, sp.shard(), stage_->grads() + begin, end - begin);
          } else {
            Send(proto::GRAD_PUSH, it, 0, sp.shard(), AddressOf(s_, sp.owner_replica()), stage_->grads() + begin,
                 end - begin);
          }
        }
        break;
      case Op::kPullParams:
        LH_RETURN_IF_ERROR(ServeShards(it, &grad_norm, &lr));
        LH_RETURN_IF_ERROR(PullParams(it));
        break;
    }
  }
  LH_RETURN_IF_ERROR(FinishSends(it));
  for (std::vector<float>& g : grads_out) mailbox_.Recycle(std::move(g));
  proto::IterationReport rep;
  rep.set_worker_id(id_);
  rep.set_stage(s_);
  rep.set_replica(r_);
  rep.set_iteration(it);
  rep.set_loss(loss);
  rep.set_floor(last ? floor : -1);
  rep.set_seconds(std::chrono::duration<double>(Clock::now() - t_start).count());
  rep.set_compute_seconds(compute_seconds_);
  rep.set_wait_seconds(wait_seconds_);
  rep.set_lr(lr);
  rep.set_grad_norm(grad_norm);
  rep.set_params_crc32c(Crc32c(0, stage_->params(), stage_->num_params() * sizeof(float)));
  proto::Empty empty;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Status st = coord_->ReportIteration(&ctx, rep, &empty);
  if (!st.ok()) return FromGrpc(st, "reporting to the coordinator");
  return absl::OkStatus();
}

absl::Status Worker::Checkpoint(int64_t step) {
  for (auto& shard : owned_) {
    const std::string root =
        (fs::path(cfg_.train.out_dir) / "checkpoints" / absl::StrFormat("stage_%d_shard_%d", s_, shard->shard())).string();
    LH_RETURN_IF_ERROR(SaveCheckpoint(root, {step, cfg_.as_json}, shard->layout(), shard->params().data(),
                                      shard->adamw().m().data(), shard->adamw().v().data()));
    proto::CheckpointReport rep;
    rep.set_stage(s_);
    rep.set_shard(shard->shard());
    rep.set_step(step);
    rep.set_directory(root);
    rep.set_worker_id(id_);
    proto::Empty empty;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status st = coord_->ReportCheckpoint(&ctx, rep, &empty);
    if (!st.ok()) return FromGrpc(st, "reporting a checkpoint to the coordinator");
  }
  return absl::OkStatus();
}

absl::Status Worker::Run() {
  LH_RETURN_IF_ERROR(Join());
  absl::Status status = Setup();
  if (status.ok()) status = AwaitStart();
  const int64_t start = plan_.start_iteration();
  if (status.ok()) {
    // Every replica starts from the PS shards' parameters: the same init, or the checkpoint.
    status = BroadcastParams(start - 1);
    if (status.ok()) status = PullParams(start - 1);
    if (status.ok()) status = FinishSends(start - 1);
  }
  const int64_t end = plan_.stop_iteration() > 0 ? plan_.stop_iteration() : cfg_.train.steps;
  for (int64_t it = start; status.ok() && it < end; ++it) {
    iteration_ = it;
    mailbox_.SetWindow(it);
    status = RunIteration(it);
    const int64_t step = it + 1;
    const bool due = (cfg_.train.checkpoint_every > 0 && step % cfg_.train.checkpoint_every == 0) || step == end;
    if (status.ok() && due) status = Checkpoint(step);
  }
  // A failed iteration may leave sends in flight: end them before their clients go.
  if (!status.ok()) Stop(std::string(status.message()));
  FinishSends(iteration_).IgnoreError();
  std::string trace;
  if (!cfg_.train.out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(fs::path(cfg_.train.out_dir) / "timeline", ec);
    trace = (fs::path(cfg_.train.out_dir) / "timeline" / absl::StrFormat("worker_%d.json", id_)).string();
    if (!timeline_.Write(trace, id_, absl::StrFormat("worker %d (stage %d, replica %d)", id_, s_, r_)).ok()) trace.clear();
  }
  if (coord_ && id_ >= 0) {
    proto::DoneReport done;
    done.set_worker_id(id_);
    done.set_ok(status.ok());
    done.set_error(std::string(status.message()));
    done.set_timeline_file(trace);
    proto::Empty empty;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    coord_->ReportDone(&ctx, done, &empty);
  }
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(Who(), " ", status.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(const WorkerOptions& opt) {
  Worker w(opt);
  return w.Run();
}

}  // namespace longhaul
