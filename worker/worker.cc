#include "worker/worker.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/run_model.h"
#include "config/job_config.h"
#include "checkpoint/resume_check.h"
#include "data/batch_sampler.h"
#include "layout/plan_layout.h"
#include "metrics/timeline.h"
#include "schedule/schedule.h"
#include "util/crc32c.h"
#include "transport/link_connections.h"
#include "transport/tensor_transport.h"
#include "util/files.h"
#include "util/status_macros.h"
#include "worker/checkpoint_courier.h"
#include "worker/compute_probe.h"
#include "worker/coordinator_client.h"
#include "worker/executor.h"
#include "worker/job_setup.h"
#include "worker/link_probe.h"
#include "worker/network_channel.h"
#include "worker/peer_directory.h"
#include "worker/stage_factory.h"
#include "worker/stage_keeper.h"
#include "worker/ps_host.h"
#include "worker/tensor_admission.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// A failure while a set-up brings in the checkpoint its plan resumes from carries that checkpoint's
// name as a payload: the failure is the worker's own (a file corrupt, truncated or missing), which
// no lost peer explains, whatever its code says of the reader that met it (DataLoss,
// FailedPrecondition, a fetch's), and the coordinator, told the name, checks that checkpoint.
constexpr char kResumedCheckpointPayload[] = "longhaul/resumed_checkpoint";

absl::Status InResumedCheckpoint(absl::Status s, const std::string& name) {
  if (!s.ok()) s.SetPayload(kResumedCheckpointPayload, absl::Cord(name));
  return s;
}

// The checkpoint a failure came in bringing in (InResumedCheckpoint), if it came there.
std::optional<std::string> ResumedCheckpointOf(const absl::Status& s) {
  const absl::optional<absl::Cord> name = s.GetPayload(kResumedCheckpointPayload);
  if (!name) return std::nullopt;
  return std::string(*name);
}

// One worker: its parts (coordinator client, tensor server, peer directory, parameter-server
// host, executor) put together, and the loop over iterations.
//
// Threads: the worker's own (Run: the join, every set-up and iteration) owns every field but those
// named here. Others reach in: the coordinator client's heartbeat and lifeline threads call Stop,
// and the lifeline thread tells admission_ (which locks itself) of the members;
// a send's thread calls SendFailed (the peers' failure observer) and a connection thread of the
// tensor server reports a peer that left; both read running_, an atomic, and call client_ (which
// is thread-safe) or Stop. stop_mu_ guards what Stop reads and changes. The checkpoint reads of a
// set-up (Prefetch, FetchPieces) run Fetch on threads of their own while the worker's thread waits
// for them: trusted_mu_ guards the trusted pieces, fetched_ is an atomic, and cfg_ and plan_ stay
// unchanged meanwhile. The checkpoint shipper's thread runs Deliver's reports, which use client_
// and what they captured by value.
class Worker {
 public:
  // `key`: this worker's identity (transport/identity.h), with which it signs every call and
  // tensor connection.
  Worker(const WorkerOptions& opt, JobSecret secret, std::shared_ptr<const WorkerKey> key)
      : opt_(opt),
        secret_(std::move(secret)),
        key_(std::move(key)),
        client_(opt.coordinator, secret_, opt.tls, opt.connect_timeout_s,
                [this](const std::string& why, uint64_t newer_plan) { Stop(why, newer_plan); }, key_,
                [this](const std::vector<proto::Peer>& members) { admission_.SetMembers(members); }) {}
  Worker(const Worker&) = delete;

  absl::Status Run() ABSL_LOCKS_EXCLUDED(stop_mu_);

 private:
  absl::Status Join();
  // Measures the links to every other worker and reports them (link_probe.h).
  absl::Status ProbeLinks(const JobConfig& cfg);
  // The job's data, loaded once for the config's data section and vocabulary.
  absl::Status LoadData(const JobConfig& cfg);
  TransportOptions TransportFor(const JobConfig& cfg, const std::string& job_id) const ABSL_LOCKS_EXCLUDED(stop_mu_);
  // Where the lifeline told of the workers not lost, opens connections to the new ones among them
  // (ClientPool::Warm): a recovery's first tensors between a spare and the others, and a plan's
  // first, then find them open.
  void WarmClients(const JobConfig& cfg);
  // The groups of this replica whose pushes carry error feedback, each with the job replica it
  // stands for: the plan's streams (wire_plan.h FeedbackStreams), which the coordinator counts
  // towards a complete checkpoint.
  std::vector<std::pair<int, int>> FeedbackGroups() const;
  // Sets plan_ up, in phases: the previous version's parts go (TearDown), its version is
  // installed, its config read, this worker's place in it taken, the links to its peers opened,
  // the samplers, stage and exchange (channel and parameter-server host) built, the stage's
  // shards given their state, the stage's own optimizer state and the residuals resumed, and the
  // executor built. A failure in the three phases that bring in the resumed checkpoint is marked
  // as one there (InResumed).
  absl::Status Setup();
  // What the version before leaves the next: the iteration whose parameters its stage held (-1:
  // none, or a pull part way) and the shards it hosted.
  struct Leftovers {
    int64_t held = -1;
    std::vector<PsHost::Hosted> hosted;
  };
  // Every part of the previous plan goes but the stage, the data and the links' clients, which the
  // next set-up may keep, and the hosted shards, which it hands back.
  Leftovers TearDown();
  // The mailbox, the sends' canceller, the heartbeats and the tensor server move to plan_.
  void InstallVersion() ABSL_LOCKS_EXCLUDED(stop_mu_);
  // cfg_ from plan_ (with --out-dir), and whether this worker shares the coordinator's run
  // directory or fetches checkpoint pieces from it.
  absl::Status ReadConfig();
  // This worker's place in plan_ (s_, r_, M_), checked against its memory; its device.
  absl::StatusOr<int> TakePlace();
  // What each peer may send (the mailbox's window, the admission), and peers_ with its links open.
  void OpenLinks() ABSL_LOCKS_EXCLUDED(stop_mu_);
  // A send of this version failed to the worker of (stage, replica): the version ends at once, as
  // that peer waits for the tensor and this worker would hear of it only at its next Flush.
  void SendFailed(int stage, int replica, const absl::Status& s) ABSL_LOCKS_EXCLUDED(stop_mu_);
  // sampler_ and this replica's validation micro-batches.
  absl::Status SetUpSamplers();
  // The stage (stages_): the one of the version before where plan_ leaves it as it was (true), else
  // a spare's warm one, else one built.
  absl::StatusOr<bool> SetUpStage(int device);
  // channel_ and ps_host_.
  void BuildExchange();
  // Every shard of the stage at the start of plan_ (SetUpShard), the stage holding the start's
  // parameters after it. `kept`: SetUpStage kept the stage; `left`: TearDown's.
  absl::Status SetUpShards(int device, bool kept, Leftovers& left);
  // Where a version's shards take their state from.
  struct ShardSources {
    std::vector<PsHost::Hosted>* hosted = nullptr;  // the version before's, where its stage is kept
    bool holds = false;              // the stage holds the start's parameters already
    const float* initial = nullptr;  // the stage's initial parameters, for a version that resumes nothing
    std::optional<std::vector<CheckpointPiece>> pieces;  // the resumed step's shard files, read once
  };
  // Brings shard `sp` to the start of plan_, whatever the source of its state: the shard this
  // worker hosted and last stepped in the iteration before the start, the stage's initial
  // parameters, or the resumed checkpoint's files. Its parameters go into the stage where it does
  // not hold them; the shard goes to the host where this replica owns it.
  absl::Status SetUpShard(const proto::ShardPlacement& sp, int device, ShardSources& from);
  // The hosted shard of `from` that is `sp` (its `n` floats from `begin`) as stepped in the
  // iteration before plan_'s start; null where there is none.
  std::unique_ptr<PsShard> TakeHosted(ShardSources& from, const proto::ShardPlacement& sp, size_t begin, size_t n);
  // With local updates, the stage's own AdamW state from the resumed checkpoint.
  absl::Status ResumeStageOptimizer();
  // The error-feedback residuals of this replica's groups from the resumed checkpoint.
  absl::Status ResumeResiduals();
  void BuildExecutor();
  // The executor's deferred pull of iteration `it` completed: its CRC goes into the next report,
  // and the parameters into the stage's snapshot where a checkpoint follows `it`.
  void PulledDeferred(int64_t it);
  // plan_'s shards of this worker's stage.
  std::vector<proto::ShardPlacement> StageShards() const;
  // The resumed checkpoint's pieces, by the layout that wrote it: the shards' (an empty
  // `stage_root`), else those under each stage's `stage_root(stage)`.
  absl::StatusOr<std::vector<CheckpointPiece>> ResumedPieces(const std::function<std::string(int)>& stage_root) const;
  std::string CheckpointsDir() const { return (fs::path(cfg_.train.out_dir) / "checkpoints").string(); }
  bool Resumed() const { return !plan_.resume_checkpoint().empty(); }
  bool LocalUpdates() const { return cfg_.train.local_steps > 1; }
  // How iteration `it` ends: its exchange, its local step, or with it a part of an overlapped
  // exchange (schedule.h).
  IterationEnd EndOf(int64_t it) const;
  LrSchedule LearningRates() const {
    const TrainConfig& tc = cfg_.train;
    return LrSchedule{tc.lr, tc.min_lr, tc.warmup_steps, tc.steps};
  }
  // plan_ from its start barrier to its last iteration, or to a failure.
  absl::Status RunPlan() ABSL_LOCKS_EXCLUDED(stop_mu_);
  absl::Status RunIteration(int64_t it);
  int64_t WindowIterations() const { return Mailbox::WindowIterations(cfg_.train.local_steps); }
  // A spare builds, while it waits, the stage of every place of the job's own layout, each run once
  // forward and backward so that its memory is touched and its kernels loaded; a resumed version
  // that places it takes the one it needs (Setup): building it is then off the recovery's path, and
  // its first iteration computes at full pace, not paying for first touches and kernel loads.
  void WarmSpareStages(const JobConfig& cfg, const std::string& config_toml);
  // Whether every stage of cfg_ lives in host memory, where a spare's warm stages are freed on a
  // thread of their own (StageKeeper::Take).
  bool StagesOnHost() const;
  // Every hosted shard's checkpoint of `step`, and with local updates the stage's own AdamW state.
  absl::Status Checkpoint(int64_t step);
  // Reports step `step` of a checkpoint piece this worker wrote (`report`, may be empty) in the
  // background; where this worker does not share the coordinator's run directory, ships it there
  // first (checkpoint_courier.h). OK, or the shipper's first failure so far.
  absl::Status Deliver(const std::string& piece_root, int64_t step, std::function<absl::Status()> report)
      ABSL_LOCKS_EXCLUDED(trusted_mu_);
  // A piece of the resumed checkpoint from the coordinator (its state.json alone where
  // `layout_only`), unless this worker, which does not share the coordinator's run directory,
  // wrote or fetched it itself (NotFound where it is not there).
  absl::Status Fetch(const std::string& step_dir, bool layout_only) ABSL_LOCKS_EXCLUDED(trusted_mu_);
  // Every piece of the resumed checkpoint the set-up may read (with `params`, the stage's shards),
  // fetched in two rounds at most: this place's own pieces and the layout's state.json at once,
  // then whatever else holds the stage's tensors (a cut anew).
  absl::Status Prefetch(bool params);
  // Ends every receive and send at once, with `reason` as their error; where `newer_plan` is set,
  // only if this worker runs an older plan than that (it may have moved to it already).
  void Stop(const std::string& reason, uint64_t newer_plan = 0) ABSL_LOCKS_EXCLUDED(stop_mu_);
  // A failure a lost peer may explain (a closed connection, a receive or report that could not
  // complete): the coordinator may answer it with a new plan. One in bringing in the resumed
  // checkpoint is this worker's own, but where it could not reach the coordinator that keeps the
  // checkpoint's pieces, or was told that a newer plan replaced its own (Aborted).
  static bool PeerMayExplain(const absl::Status& s) {
    const bool unreached = absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s) ||
                           absl::IsCancelled(s);
    return unreached || (!ResumedCheckpointOf(s) && (absl::IsDataLoss(s) || absl::IsFailedPrecondition(s)));
  }
  // `s`, where the phase that failed brings in the checkpoint plan_ resumes from, marked as a
  // failure there (InResumedCheckpoint).
  absl::Status InResumed(absl::Status s) const {
    return Resumed() ? InResumedCheckpoint(std::move(s), plan_.resume_checkpoint()) : s;
  }
  // The stage stages_ holds: from SetUpStage on.
  Stage& stage() const { return *stages_.stage(); }
  // This worker's label in what it prints: what it knows of itself, its id once it registered and
  // its place once a plan gave it one.
  std::string Who() const {
    if (client_.worker_id() < 0) return "[worker]";
    if (s_ < 0) return absl::StrFormat("[worker %d]", client_.worker_id());
    return absl::StrFormat("[worker %d s%d r%d]", client_.worker_id(), s_, r_);
  }
  void SetThreads(const JobConfig& cfg) const {
    omp_set_num_threads(opt_.threads > 0 ? opt_.threads : (cfg.train.threads > 0 ? cfg.train.threads : omp_get_num_procs()));
  }
  // --backend, else the device the config gives stage `stage` (-1: before the plan, train.backend).
  absl::StatusOr<int> Device(const JobConfig& cfg, int stage) const {
    if (!opt_.backend.empty()) return ParseBackend(opt_.backend, "--backend");
    return stage < 0 ? cfg.train.backend_device : cfg.DeviceOf(stage);
  }

  WorkerOptions opt_;
  const JobSecret secret_;
  const std::shared_ptr<const WorkerKey> key_;
  // Members go in reverse order: the server before the mailbox and admission it uses, the client
  // (whose heartbeat thread may call Stop until it is joined) before the mailbox and canceller.
  // While the iterations run, a peer's connection that closes is evidence of its death
  // (TensorServer::SetSenderLeftObserver); before and after, peers come and go.
  std::atomic<bool> running_{false};
  Mailbox mailbox_;
  PlanAdmission admission_;
  // Guards canceller_'s replacement and the installed plan version against Stop, and what Stop
  // leaves for the worker's thread.
  mutable absl::Mutex stop_mu_;
  uint64_t installed_ ABSL_GUARDED_BY(stop_mu_) = 0;  // the plan version the mailbox and canceller serve
  std::shared_ptr<SendCanceller> canceller_ ABSL_GUARDED_BY(stop_mu_) = std::make_shared<SendCanceller>();
  // When a newer plan version stopped the one running.
  Clock::time_point heard_of_plan_ ABSL_GUARDED_BY(stop_mu_);
  // The peer (stage, replica) a send of this version failed to first, where one did.
  std::optional<std::pair<int, int>> failed_link_ ABSL_GUARDED_BY(stop_mu_);
  CoordinatorClient client_;
  CheckpointShipper shipper_{client_};
  std::unique_ptr<TensorServer> server_;
  proto::Plan plan_;
  JobConfig cfg_;
  // Whether train.out_dir (or --out-dir) is the coordinator's run directory (proto::Plan::run_dir_token).
  bool shares_run_dir_ = true;
  std::atomic<int> fetched_{0};  // pieces Fetch brought in this version's set-up (several at once)
  // Fetch, for the checkpoint readers; none where this worker shares the run directory, whose
  // every piece is there already.
  FetchPiece fetch_;
  // Step directories of pieces this process wrote or fetched, where it does not share the
  // coordinator's run directory: any other on its disk may be another job's, left there.
  absl::Mutex trusted_mu_;
  std::set<std::string> trusted_ ABSL_GUARDED_BY(trusted_mu_);        // whole pieces
  std::set<std::string> trusted_state_ ABSL_GUARDED_BY(trusted_mu_);  // pieces whose state.json alone
  int s_ = -1, r_ = -1, M_ = 1;  // this worker's place (-1: none yet) and its micro-batches
  int64_t end_ = 0;  // the iteration this run stops before
  std::optional<TokenDataset> data_;
  std::string data_key_;  // what data_ was loaded for: LoadDataset's keys of the config
  std::unique_ptr<BatchSampler> sampler_;
  std::vector<MicroBatch> val_mbs_;  // this replica's share of the validation micro-batches
  StageKeeper stages_;  // the stage, kept across versions, and a spare's warm ones
  ClientPool clients_;  // outlives each version's peers_, whose clients they are
  std::vector<proto::Peer> members_;  // the workers not lost, as the lifeline last told
  std::unique_ptr<PeerDirectory> peers_;
  std::unique_ptr<NetworkChannel> channel_;
  std::unique_ptr<PsHost> ps_host_;
  std::map<std::string, std::string> dial_map_;  // --dial-map: a peer's address -> where to dial it
  std::unique_ptr<Executor> executor_;
  // The CRC of the parameters a deferred pull completed, for the next report.
  std::optional<proto::ParamsCrc> pulled_crc_;
  Timeline timeline_;
};

void Worker::Stop(const std::string& reason, uint64_t newer_plan) {
  absl::MutexLock lock(&stop_mu_);
  if (newer_plan > 0 && installed_ >= newer_plan) return;
  if (newer_plan > 0) heard_of_plan_ = Clock::now(), admission_.Expect(newer_plan);
  admission_.Leave();
  mailbox_.Close(reason);
  canceller_->Cancel(reason);
}

absl::Status Worker::Join() {
  if (!opt_.dial_map.empty()) {
    LH_ASSIGN_OR_RETURN(dial_map_, PeerDirectory::ReadDialMap(opt_.dial_map));
  }
  LH_ASSIGN_OR_RETURN(server_, TensorServer::Start(opt_.listen, opt_.job_id.empty() ? "?" : opt_.job_id, &mailbox_,
                                                   &admission_, secret_, key_));
  proto::RegisterRequest req;
  req.set_job_id(opt_.job_id);
  req.set_protocol_version(kProtocolVersion);
  req.set_address(server_->address());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  req.set_host(host);
  req.set_backend(opt_.backend);
  req.set_pid(getpid());
  if (opt_.slot >= 0) req.set_slot(opt_.slot);
  const SocketBufferLimits limits = ReadSocketBufferLimits();
  req.set_tcp_send_buffer_max(limits.send_max);
  req.set_tcp_receive_buffer_max(limits.receive_max);
  LH_ASSIGN_OR_RETURN(const proto::RegisterReply reply, client_.Register(req));
  LH_ASSIGN_OR_RETURN(const JobConfig cfg, ParseJobConfig(reply.config_toml(), "the job config from the coordinator"));
  // Peers probe this worker's links once every worker has reported its profile (GetPeers).
  server_->SetJobId(cfg.cluster.job_id);
  server_->SetWorkerId(client_.worker_id());
  admission_.SetConnections(cfg.transport.connections);
  server_->SetPartTimeout(std::chrono::milliseconds(static_cast<int64_t>(cfg.transport.timeout_s * 1000)));
  SetThreads(cfg);
  LH_ASSIGN_OR_RETURN(const int device, Device(cfg, -1));
  const absl::StatusOr<proto::ComputeProfile> measured = MeasureCompute(cfg, device);
  proto::ComputeProfile compute;  // zeros, where the probe could not run: priced as free
  if (measured.ok()) {
    compute = *measured;
    std::cout << absl::StrFormat("%s timed on %s: a block %.2f + %.2f ms, the head %.2f + %.2f ms (forward + "
                                 "backward, one micro-batch)\n",
                                 Who(), BackendName(device), 1e3 * compute.block_forward_s(),
                                 1e3 * compute.block_backward_s(), 1e3 * compute.head_forward_s(),
                                 1e3 * compute.head_backward_s())
              << std::flush;
  } else if (absl::IsResourceExhausted(measured.status())) {
    // The plan goes on; this worker's own stage check, once it has one, names the fix.
    std::cout << absl::StrFormat("%s not timed: %s\n", Who(), measured.status().message());
  } else {
    return measured.status();
  }
  // What the placement search may cut a stage to fit.
  compute.set_memory_bytes(DeviceMemoryAvailable(device));
  LH_RETURN_IF_ERROR(client_.ReportProfile(compute));
  if (reply.probe_links()) LH_RETURN_IF_ERROR(ProbeLinks(cfg));
  // While the plan is made, or, for a spare, before its place comes: not on a recovery's path.
  LH_RETURN_IF_ERROR(LoadData(cfg));
  if (client_.worker_id() >= cfg.cluster.stages * cfg.cluster.replicas) {
    WarmSpareStages(cfg, reply.config_toml());
    std::cout << absl::StrFormat("%s a spare: waits for a lost worker's place (%d of %d stages built)\n", Who(),
                                 stages_.warm_stages(), cfg.cluster.stages)
              << std::flush;
  }
  WarmClients(cfg);
  LH_ASSIGN_OR_RETURN(plan_, client_.AwaitPlan(0));
  admission_.Expect(plan_.version());
  return absl::OkStatus();
}

absl::Status Worker::LoadData(const JobConfig& cfg) {
  // Every plan version of a job keeps its data, a pipeline cut anew too (its config differs in
  // the cut only): building the corpus again would weigh on every re-cut's set-up.
  const std::string key = absl::StrCat(cfg.as_json.at("data").dump(), " vocab ", cfg.model.vocab_size);
  if (data_ && data_key_ == key) return absl::OkStatus();
  LH_ASSIGN_OR_RETURN(TokenDataset data, LoadDataset(cfg));
  data_ = std::move(data);
  data_key_ = key;
  return absl::OkStatus();
}

void Worker::WarmSpareStages(const JobConfig& cfg, const std::string& config_toml) {
  const int P = cfg.cluster.stages, M = cfg.train.micro_batches;
  const SamplerConfig sampling{cfg.train.micro_batch_size, cfg.train.seq_len, cfg.train.seed, cfg.model.attention};
  BatchSampler sampler(sampling, data_->train());
  if (!sampler.Check("training").ok()) return;
  const MicroBatch mb = sampler.Sample(0, 0);
  const std::vector<float> zeros(cfg.boundary(false).floats(), 0.0f);
  for (int s = 0; s < P; ++s) {
    const absl::StatusOr<int> device = Device(cfg, s);
    // A stage that does not fit next to the ones built is left to the set-up, which names why.
    if (!device.ok() || !CheckWorkerMemory(cfg, nullptr, s, 0, omp_get_max_threads(), *device).ok()) continue;
    StageRequest request = StageRequestFor(cfg, s, *device, ActivationSlots(cfg.cluster.schedule, P, s, M));
    request.init = false;
    request.init_from.clear();
    absl::StatusOr<std::unique_ptr<Stage>> stage = MakeStage(request);
    if (!stage.ok()) continue;
    bool warmed = true;
    for (int slot = 0; slot < (*stage)->slots() && warmed; ++slot) {
      warmed = (*stage)->Forward(slot, mb, s == 0 ? nullptr : zeros.data()).ok() &&
               (*stage)->Backward(slot, mb, s == P - 1 ? nullptr : zeros.data(), 1.0f).ok();
    }
    if (warmed) stages_.AddWarm(StageKeeper::Key(s, *device, request.slots, config_toml), *std::move(stage));
  }
}

bool Worker::StagesOnHost() const {
  bool on_host = true;
  for (int s = 0; s < cfg_.cluster.stages; ++s) on_host = on_host && Device(cfg_, s).value_or(0) < 0;
  return on_host;
}

void Worker::WarmClients(const JobConfig& cfg) {
  std::optional<std::vector<proto::Peer>> news = client_.TakeMembers();
  if (!news) return;
  members_ = *std::move(news);
  const TransportOptions transport = TransportFor(cfg, cfg.cluster.job_id);
  for (const proto::Peer& p : members_)
    if (p.worker_id() != client_.worker_id())
      clients_.Warm({p.worker_id(), p.public_key()}, PeerDirectory::Dial(dial_map_, p.address()), transport);
}

std::vector<std::pair<int, int>> Worker::FeedbackGroups() const {
  const int groups = GroupsPerReplica(plan_, cfg_);
  const std::set<std::pair<int, int>> streams = FeedbackStreams(plan_, cfg_);
  std::vector<std::pair<int, int>> feedback;
  for (int g = 0; g < groups; ++g)
    if (streams.count({s_, r_ * groups + g})) feedback.emplace_back(g, r_ * groups + g);
  return feedback;
}

TransportOptions Worker::TransportFor(const JobConfig& cfg, const std::string& job_id) const {
  TransportOptions transport;
  transport.job_id = job_id;
  transport.secret = secret_;
  transport.worker_id = client_.worker_id();
  transport.key = key_;
  transport.chunk_bytes = static_cast<size_t>(cfg.transport.chunk_mib) << 20;
  // The plan may split a link over more (PeerDirectory); link probes use one.
  transport.connections = std::max(1, cfg.transport.connections);
  transport.congestion_control = cfg.transport.congestion_control;
  transport.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.transport.timeout_s * 1000));
  absl::MutexLock lock(&stop_mu_);
  transport.canceller = canceller_;
  return transport;
}

absl::Status Worker::ProbeLinks(const JobConfig& cfg) {
  LH_ASSIGN_OR_RETURN(const proto::Peers peers, client_.AwaitPeers());
  TransportOptions transport = TransportFor(cfg, cfg.cluster.job_id);
  // Workers at this worker's own address share its machine: no link to measure, unless the dial
  // map leads to them another way (an emulated link's proxy). Probes go where tensors will.
  const std::string here = HostOf(server_->address());
  // Each worker starts from the one after it in the job's list, round to the one before: probing
  // in step, worker s sends to s + k at the k-th, so each host receives one probe at a time and a
  // link alone reads its own rate, not a share of its receiver's card.
  const int n = peers.peers_size();
  int self = 0;
  for (int i = 0; i < n; ++i) {
    if (peers.peers(i).worker_id() == client_.worker_id()) self = i;
  }
  std::vector<proto::Peer> others;
  for (int k = 1; k <= n; ++k) {
    proto::Peer p = peers.peers((self + k) % n);
    auto via = dial_map_.find(p.address());
    if (p.worker_id() == client_.worker_id() || (via == dial_map_.end() && HostOf(p.address()) == here)) continue;
    if (via != dial_map_.end()) p.set_address(via->second);
    others.push_back(p);
  }
  // The links all at once reported, every other worker's awaited: none probes them while this one
  // times its peers alone.
  auto barrier = [&](const std::vector<proto::LinkMeasurement>& links) -> absl::Status {
    proto::LinkReport measured;
    measured.set_worker_id(client_.worker_id());
    measured.set_card_to_come(true);
    for (const proto::LinkMeasurement& m : links) *measured.add_links() = m;
    LH_RETURN_IF_ERROR(client_.ReportLinks(measured));
    return client_.AwaitPeers(/*after_links=*/true).status();
  };
  LH_ASSIGN_OR_RETURN(const LinkProbeResult probed, longhaul::ProbeLinks(others, transport, {}, barrier));
  proto::LinkReport report;
  report.set_worker_id(client_.worker_id());
  report.set_egress_bytes_per_s(probed.egress_bytes_per_s);
  if (probed.egress_bytes_per_s > 0) {
    std::cout << absl::StrFormat("%s sends %.0f Mbit/s to all its peers at once, less than its links alone: its "
                                 "network card\n",
                                 Who(), probed.egress_bytes_per_s * 8e-6)
              << std::flush;
  }
  for (const proto::LinkMeasurement& m : probed.links) {
    std::cout << absl::StrFormat("%s link to worker %d: round trip %.2f ms, %.0f Mbit/s\n", Who(), m.to_worker(),
                                 1e3 * m.round_trip_s(), m.bytes_per_s() * 8e-6)
              << std::flush;
    *report.add_links() = m;
  }
  return client_.ReportLinks(report);
}

absl::Status Worker::Setup() {
  Leftovers left = TearDown();
  InstallVersion();
  LH_RETURN_IF_ERROR(ReadConfig());
  LH_ASSIGN_OR_RETURN(const int device, TakePlace());
  OpenLinks();
  LH_RETURN_IF_ERROR(SetUpSamplers());
  LH_ASSIGN_OR_RETURN(const bool kept, SetUpStage(device));
  BuildExchange();
  LH_RETURN_IF_ERROR(InResumed(SetUpShards(device, kept, left)));
  LH_RETURN_IF_ERROR(InResumed(ResumeStageOptimizer()));
  LH_RETURN_IF_ERROR(InResumed(ResumeResiduals()));
  BuildExecutor();
  std::cout << absl::StrFormat("%s blocks [%d, %d) of %d, %d parameters, listening at %s, %s\n", Who(),
                               stage().spec().first_block, stage().spec().end_block, cfg_.model.n_layer,
                               stage().num_params(), server_->address(), stage().Describe())
            << std::flush;
  return absl::OkStatus();
}

Worker::Leftovers Worker::TearDown() {
  // What the stage and the hosted shards hold, before the channel and the host that know go.
  Leftovers left;
  left.held = channel_ ? channel_->held() : -1;
  // A replaced version's pieces yet to ship count for nothing: the coordinator goes back to a step
  // whose every piece it holds.
  shipper_.Drop();
  executor_.reset();
  if (ps_host_) left.hosted = ps_host_->Release();
  ps_host_.reset();
  channel_.reset();
  peers_.reset();
  sampler_.reset();
  pulled_crc_.reset();
  return left;
}

void Worker::InstallVersion() {
  {
    absl::MutexLock lock(&stop_mu_);
    installed_ = plan_.version();
    client_.SetPlanVersion(installed_);
    mailbox_.Reopen(installed_);
    canceller_ = std::make_shared<SendCanceller>();
  }
  server_->SetJobId(plan_.job_id());
  server_->SetSenderLeftObserver([this](const TensorServer::Sender& sender) {
    // Best effort: the heartbeats find a dead worker without it, only later. The version names
    // which plan's place it was: a connection of the version before may close after this one began.
    if (running_) (void)client_.ReportSuspect(sender.stage, sender.replica, "", sender.plan_version);
  });
}

absl::Status Worker::ReadConfig() {
  LH_ASSIGN_OR_RETURN(cfg_, ParseJobConfig(plan_.config_toml(), "the job config from the coordinator"));
  if (!opt_.out_dir.empty()) cfg_.train.out_dir = opt_.out_dir;
  const absl::StatusOr<std::string> token = ReadWholeFile((fs::path(cfg_.train.out_dir) / kRunDirIdFile).string());
  shares_run_dir_ = plan_.run_dir_token().empty() || (token.ok() && *token == plan_.run_dir_token());
  fetch_ = shares_run_dir_ ? FetchPiece()
                           : FetchPiece([this](const std::string& step_dir, bool layout_only) {
                               return Fetch(step_dir, layout_only);
                             });
  fetched_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<int> Worker::TakePlace() {
  LH_RETURN_IF_ERROR(CheckPlanLayout(plan_, cfg_));
  const proto::Assignment* mine = AssignmentOf(plan_, client_.worker_id());
  if (mine == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan version %d has no place for worker %d, which the coordinator sent it: run one longhaul version on every "
        "host",
        plan_.version(), client_.worker_id()));
  }
  s_ = mine->stage(), r_ = mine->replica();
  M_ = ReplicaMicroBatches(plan_, cfg_, r_);
  SetThreads(cfg_);
  LH_ASSIGN_OR_RETURN(const int device, Device(cfg_, s_));
  LH_RETURN_IF_ERROR(CheckWorkerMemory(cfg_, &plan_, s_, r_, omp_get_max_threads(), device));
  client_.SetTimeout(cfg_.transport.timeout_s);
  return device;
}

void Worker::OpenLinks() {
  const TransportOptions transport = TransportFor(cfg_, plan_.job_id());
  // Tensors of the initial parameter broadcast (iteration start - 1) onwards; then the plan says
  // what each peer may send.
  mailbox_.SetWindow(plan_.start_iteration() - 1, WindowIterations());
  admission_.SetPlan(plan_, cfg_, s_, r_);
  // The links open (a round trip or two each) while the stage is built and the others set up:
  // opened after, a spare's first sends would wait for those round trips.
  std::set<int> known;
  for (const proto::Assignment& a : plan_.assignments()) known.insert(a.worker_id());
  for (const proto::Peer& p : members_) known.insert(p.worker_id());
  clients_.KeepOnly(known);
  peers_ = std::make_unique<PeerDirectory>(plan_, s_, r_, transport, dial_map_, &clients_);
  {
    absl::MutexLock lock(&stop_mu_);
    failed_link_.reset();
  }
  peers_->SetFailureObserver(
      [this](int stage, int replica, const absl::Status& s) { SendFailed(stage, replica, s); });
  peers_->OpenLinks();
}

void Worker::SendFailed(int stage, int replica, const absl::Status& s) {
  if (!running_) return;
  {
    absl::MutexLock lock(&stop_mu_);
    if (!failed_link_) failed_link_ = {stage, replica};
  }
  Stop(std::string(s.message()));
}

absl::Status Worker::SetUpSamplers() {
  LH_RETURN_IF_ERROR(LoadData(cfg_));
  const SamplerConfig sampling{cfg_.train.micro_batch_size, cfg_.train.seq_len, cfg_.train.seed, cfg_.model.attention};
  sampler_ = std::make_unique<BatchSampler>(sampling, data_->train());
  LH_RETURN_IF_ERROR(sampler_->Check("training"));
  val_mbs_.clear();
  const int D = plan_.replicas();
  if (cfg_.train.EvalShare(D, r_) > 0) {
    BatchSampler val(sampling, data_->val());
    LH_RETURN_IF_ERROR(val.Check("validation"));
    for (int i = r_; i < cfg_.train.eval_batches; i += D) val_mbs_.push_back(val.Sample(0, i));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Worker::SetUpStage(int device) {
  StageRequest request =
      StageRequestFor(cfg_, s_, device, ActivationSlots(cfg_.cluster.schedule, plan_.stages(), s_, M_));
  const bool local_updates = LocalUpdates(), resumed = Resumed();
  request.optimizer = local_updates;
  // Only the hosts of the stage's shards start from its initial parameters, and only where no
  // checkpoint does: the others' come from the shards' broadcast (and a spare elsewhere may lack
  // the directory).
  if (HostedPsFloats(cfg_, s_, r_, &plan_) == 0 || resumed) request.init_from.clear();
  // A resumed version's stage takes every parameter from the checkpoint: drawing the initial ones
  // first would be work thrown away on a recovery's path.
  if (resumed) request.init = false;
  // A stage kept has the parameters it pulled last where they are the checkpoint's, else the
  // checkpoint's files' (SetUpShards), and its gradients are zeroed every iteration; a stage that
  // steps itself (local updates) holds more, and is rebuilt. So is one whose version starts over
  // from the initial parameters (no checkpoint yet): its own are trained, and its shards start from
  // them. A spare's warm stage serves alike: a start from the seed's or init_from's parameters, or
  // one that steps itself, is built with what it needs.
  LH_ASSIGN_OR_RETURN(const bool kept,
                      stages_.Take(StageKeeper::Key(s_, device, request.slots, plan_.config_toml()),
                                   resumed && !local_updates, request, StagesOnHost()));
  // Between exchanges the stage steps itself; its clipping norm is its own, which spares the
  // replica's stages a round of their own every iteration.
  if (local_updates) {
    LH_RETURN_IF_ERROR(stage().AttachOptimizer({cfg_.train.adamw, LearningRates(), cfg_.train.grad_clip}));
  }
  return kept;
}

void Worker::BuildExchange() {
  const TrainConfig& tc = cfg_.train;
  const int groups = GroupsPerReplica(plan_, cfg_);
  channel_ = std::make_unique<NetworkChannel>(s_, r_, groups, StageShards(), NormHosts(plan_), stage().layout(),
                                              mailbox_, *peers_, timeline_);
  if (LocalUpdates()) channel_->PushChanges();
  channel_->MixLandings(tc.overlap_mix);
  const WirePlan wires = WiresOf(plan_);
  // Over a lossy exchange, an exchange's parameters travel as their change (wire_plan.h).
  auto whole = [wires, start = plan_.start_iteration()](int64_t it) { return ParamsTravelWhole(wires, it, start); };
  if (LocalUpdates() && wires.change_dtype != WireDtype::kAuto) channel_->PullChanges(whole);
  NetworkChannel* channel = channel_.get();
  PsLinks links{
      [channel](int64_t it, int replica, int group, int shard) { return channel->TakePush(it, replica, group, shard); },
      [this](std::vector<float> buffer) { mailbox_.Recycle(std::move(buffer)); },
      [channel](int64_t it, const std::vector<ShardSquares>& own) { return channel->ReduceNormAmongHosts(it, own); },
      [channel](int64_t it, int replica, int shard, const float* data, size_t n, WireDtype dtype) {
        channel->SendParams(it, replica, shard, data, n, dtype);
      }};
  ps_host_ = std::make_unique<PsHost>(
      client_.worker_id(), s_, plan_.replicas(), groups, LearningRates(), tc.grad_clip,
      OuterOptimizer{LocalUpdates(), tc.outer_lr, tc.outer_momentum,
                     LocalUpdates() ? wires.change_dtype : WireDtype::kAuto, whole},
      std::move(links));
  channel_->SetPsHost(ps_host_.get());
}

absl::Status Worker::SetUpShards(int device, bool kept, Leftovers& left) {
  ShardSources from;
  LH_ASSIGN_OR_RETURN(from.initial, stage().Params());
  // A resumed version broadcasts no parameters: every stage already holds the checkpoint's, kept
  // from the version before where it pulled exactly those, else read from the shards' files. The
  // broadcast would cost a recovery round trips on slow links, most of them opening the links to
  // the spare; survivors hold them nearly always, as the checkpoint is written after the step.
  // Likewise a shard this worker hosted and last stepped in the iteration before the start holds
  // the checkpoint's state: it stays, rather than being read again from its files.
  const int64_t start = plan_.start_iteration();
  if (kept) from.hosted = &left.hosted;
  from.holds = kept && left.held == start - 1;
  // A survivor that ran past the checkpoint takes the parameters it pulled for it back from its
  // snapshot: nothing to read from the shards' files, or to fetch where they are elsewhere.
  if (kept && !from.holds) {
    LH_ASSIGN_OR_RETURN(from.holds, stages_.Restore(start));
  }
  // On a disk of its own, the loads below find their pieces here already: fetched as each load
  // needs them, each would wait a round trip of its own to the coordinator.
  if (Resumed() && !shares_run_dir_) LH_RETURN_IF_ERROR(Prefetch(!from.holds));
  for (const proto::ShardPlacement& sp : StageShards()) LH_RETURN_IF_ERROR(SetUpShard(sp, device, from));
  if (Resumed()) {
    LH_ASSIGN_OR_RETURN(const float* params, stage().Params());
    channel_->Held(start - 1, params);
  }
  return absl::OkStatus();
}

absl::Status Worker::SetUpShard(const proto::ShardPlacement& sp, int device, ShardSources& from) {
  const bool owns = sp.owner_replica() == r_, resumed = Resumed();
  const int64_t stepped = plan_.start_iteration() - 1;
  const auto [begin, end] = stage().layout().Range(sp.first_tensor(), sp.end_tensor());
  const size_t n = end - begin;
  if (std::unique_ptr<PsShard> same = owns ? TakeHosted(from, sp, begin, n) : nullptr) {
    if (!from.holds) {
      LH_ASSIGN_OR_RETURN(const float* params, same->Params());
      LH_RETURN_IF_ERROR(channel_->PlaceShard(stage(), begin, params, n));
    }
    ps_host_->Add(std::move(same), stepped);
    return absl::OkStatus();
  }
  if (!owns && (!resumed || from.holds)) return absl::OkStatus();
  // The shard, holding `params` and the moments (none for a fresh one). It captures by value: a
  // pending shard is made after this set-up returned.
  auto make_shard = [device, adamw = cfg_.train.adamw, layout = &stage().layout(), stage = s_, sp,
                     replicas = cfg_.cluster.replicas](const float* params, const float* m,
                                                       const float* v) -> absl::StatusOr<std::unique_ptr<PsShard>> {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<PsShard> shard, MakePsShard(device, adamw, *layout, stage, sp.shard(),
                                                                    sp.first_tensor(), sp.end_tensor(), replicas));
    LH_RETURN_IF_ERROR(shard->SetState(params, m, v));
    return shard;
  };
  if (!resumed) {  // the stage's initial parameters
    LH_ASSIGN_OR_RETURN(std::unique_ptr<PsShard> shard, make_shard(from.initial + begin, nullptr, nullptr));
    ps_host_->Add(std::move(shard), stepped);
    return absl::OkStatus();
  }
  if (!from.pieces) {
    LH_ASSIGN_OR_RETURN(from.pieces, ResumedPieces({}));
    LH_RETURN_IF_ERROR(CheckCheckpointResumable(CheckpointStateDir(CheckpointsDir(), plan_.resume_checkpoint()), cfg_));
  }
  const ParamLayout slice = stage().layout().Slice(sp.first_tensor(), sp.end_tensor());
  std::vector<float> params(n);
  LH_RETURN_IF_ERROR(LoadFromPieces(*from.pieces, slice, params.data(), nullptr, nullptr, false, fetch_));
  if (!from.holds) LH_RETURN_IF_ERROR(channel_->PlaceShard(stage(), begin, params.data(), n));
  if (!owns) return absl::OkStatus();
  // The shard's moments, two thirds of what it reads, are read on a thread of their own while
  // the first forwards compute, and the shard is made at the first exchange, the first moment it
  // is needed: read and made here, they would lengthen the set-up a recovery waits for. Their
  // pieces are here already: the parameters' read above fetched them whole where they were not.
  using Moments = absl::StatusOr<std::vector<float>>;  // m, then v
  std::shared_future<Moments> moments =
      std::async(std::launch::async, [pieces = *from.pieces, slice, n]() -> Moments {
        std::vector<float> mv(2 * n);
        LH_RETURN_IF_ERROR(LoadFromPieces(pieces, slice, nullptr, mv.data(), mv.data() + n));
        return mv;
      }).share();
  ps_host_->AddPending(
      [moments, params = std::move(params), make_shard, shard = sp.shard(),
       name = plan_.resume_checkpoint()]() -> absl::StatusOr<std::unique_ptr<PsShard>> {
        const Moments& mv = moments.get();
        if (!mv.ok()) {
          return InResumedCheckpoint(
              absl::Status(mv.status().code(), absl::StrFormat("shard %d's AdamW moments from the checkpoint: %s",
                                                               shard, mv.status().message())),
              name);
        }
        return make_shard(params.data(), mv->data(), mv->data() + params.size());
      },
      stepped);
  return absl::OkStatus();
}

std::unique_ptr<PsShard> Worker::TakeHosted(ShardSources& from, const proto::ShardPlacement& sp, size_t begin,
                                            size_t n) {
  if (from.hosted == nullptr) return nullptr;
  for (PsHost::Hosted& h : *from.hosted) {
    if (h.shard && h.shard->shard() == sp.shard() && h.shard->begin() == begin && h.shard->size() == n &&
        h.stepped == plan_.start_iteration() - 1) {
      return std::move(h.shard);
    }
  }
  return nullptr;
}

absl::Status Worker::ResumeStageOptimizer() {
  if (!LocalUpdates() || !Resumed()) return absl::OkStatus();
  const std::string checkpoints = CheckpointsDir();
  LH_ASSIGN_OR_RETURN(const std::vector<CheckpointPiece> pieces,
                      ResumedPieces([&](int s) { return LocalCheckpointRoot(checkpoints, s, r_); }));
  std::vector<float> params(stage().num_params()), m(params.size()), v(params.size());
  LH_RETURN_IF_ERROR(LoadFromPieces(pieces, stage().layout(), params.data(), m.data(), v.data(), false, fetch_));
  return stage().SetOptimizerState(m.data(), v.data());
}

absl::Status Worker::ResumeResiduals() {
  // Every worker goes back to the checkpoint's residuals, a survivor's own too. One written
  // before residuals were kept has none: its quantized pushes start without, as they used to. A version
  // that starts over from the initial parameters has none to go back to.
  if (!Resumed()) return absl::OkStatus();
  const std::string checkpoints = CheckpointsDir();
  for (const auto& [g, job_replica] : FeedbackGroups()) {
    LH_ASSIGN_OR_RETURN(const std::vector<CheckpointPiece> pieces,
                        ResumedPieces([&checkpoints, job = job_replica](int s) {
                          return ResidualCheckpointRoot(checkpoints, s, job);
                        }));
    std::vector<float> residuals(stage().num_params());
    LH_RETURN_IF_ERROR(LoadFromPieces(pieces, stage().layout(), residuals.data(), nullptr, nullptr, true, fetch_));
    std::error_code ec;
    if (std::none_of(pieces.begin(), pieces.end(), [&](const CheckpointPiece& p) { return fs::exists(p.dir, ec); })) {
      std::cout << absl::StrFormat("%s: %s holds no error-feedback residuals: quantized pushes start without\n", Who(),
                                   plan_.resume_checkpoint());
      continue;
    }
    channel_->SetResiduals(g, residuals.data());
  }
  return absl::OkStatus();
}

void Worker::BuildExecutor() {
  const int P = plan_.stages();
  const bool hosts = !ps_host_->shards().empty();
  executor_ = std::make_unique<Executor>(
      stage(), *channel_, timeline_,
      MakeSchedule(cfg_.cluster.schedule, P, s_, M_, hosts,
                   LocalUpdates() ? IterationEnd::kLocalStepThenExchange : IterationEnd::kExchange),
      s_, P, M_, M_ / GroupsPerReplica(plan_, cfg_), cfg_.MicroBatchWeight(), cfg_.boundary(false),
      cfg_.boundary(true));
  executor_->SetOverlap(cfg_.cluster.overlap_exchange);
  executor_->SetOnDeferredPull([this](int64_t it) { PulledDeferred(it); });
  if (!LocalUpdates()) return;
  for (const IterationEnd end : {IterationEnd::kLocalStep, IterationEnd::kLocalStepThenPush,
                                 IterationEnd::kLocalStepThenOuterStep, IterationEnd::kLocalStepInFlight,
                                 IterationEnd::kLocalStepThenLand}) {
    executor_->SetSchedule(end, MakeSchedule(cfg_.cluster.schedule, P, s_, M_, hosts, end, cfg_.train.overlap_steps));
  }
}

IterationEnd Worker::EndOf(int64_t it) const {
  const TrainConfig& t = cfg_.train;
  if (!LocalUpdates()) return IterationEnd::kExchange;
  if (t.OverlapsAfter(it, end_)) return IterationEnd::kLocalStepThenPush;
  if (const std::optional<int64_t> pushed = t.OverlappedUnder(it, end_)) {
    if (it == *pushed + OuterStepDelay(t.overlap_steps)) return IterationEnd::kLocalStepThenOuterStep;
    return it == *pushed + t.overlap_steps ? IterationEnd::kLocalStepThenLand : IterationEnd::kLocalStepInFlight;
  }
  return t.ExchangesAfter(it, end_) ? IterationEnd::kLocalStepThenExchange : IterationEnd::kLocalStep;
}

void Worker::PulledDeferred(int64_t it) {
  const absl::StatusOr<const float*> params = stage().Params();
  if (!params.ok()) return;
  pulled_crc_.emplace();
  pulled_crc_->set_iteration(it);
  pulled_crc_->set_crc32c(Crc32c(0, *params, stage().num_params() * sizeof(float)));
  if (cfg_.train.CheckpointsAfter(it, end_)) stages_.Snapshot(it + 1, *params);
}

std::vector<proto::ShardPlacement> Worker::StageShards() const {
  std::vector<proto::ShardPlacement> shards;
  for (const proto::ShardPlacement& sp : plan_.shards())
    if (sp.stage() == s_) shards.push_back(sp);
  return shards;
}

absl::StatusOr<std::vector<CheckpointPiece>> Worker::ResumedPieces(
    const std::function<std::string(int)>& stage_root) const {
  return CheckpointPieces(CheckpointsDir(), plan_.resume_checkpoint(), stage_root, fetch_);
}

absl::Status Worker::RunIteration(int64_t it) {
  const auto t_start = Clock::now();
  std::vector<MicroBatch> mbs;
  const int64_t first = FirstGlobalMicroBatch(plan_, cfg_, r_);
  for (int m = 0; m < M_; ++m) mbs.push_back(sampler_->Sample(it, first + m));
  // In step (no local updates) the new parameters may arrive while the next iteration computes,
  // unless nothing follows. A checkpoint does not wait for them: it writes the shards' own state,
  // stepped already (the stage's parameters are read only with local updates, which never defer).
  const bool defer_pull = !LocalUpdates() && it + 1 < end_;
  const IterationEnd ends = EndOf(it);
  const bool landed = ends == IterationEnd::kLocalStepThenLand;
  LH_ASSIGN_OR_RETURN(const IterationResult result, executor_->Run(it, mbs, ends, defer_pull));
  double val_loss_sum = 0;
  const bool evaluate = cfg_.train.EvaluatesIn(it, end_) && !val_mbs_.empty();
  if (evaluate && landed) {
    // On the parameters the exchange brought, as the replicas share them, not on what this one
    // stepped since.
    LH_ASSIGN_OR_RETURN(const float* own, stage().Params());
    const std::vector<float> stepped(own, own + stage().num_params());
    LH_RETURN_IF_ERROR(stage().SetParams(0, channel_->pulled().data(), stepped.size()));
    absl::StatusOr<double> sum = executor_->Evaluate(it, val_mbs_);
    LH_RETURN_IF_ERROR(stage().SetParams(0, stepped.data(), stepped.size()));
    if (!sum.ok()) return sum.status();
    val_loss_sum = *sum;
  } else if (evaluate) {
    LH_ASSIGN_OR_RETURN(val_loss_sum, executor_->Evaluate(it, val_mbs_));
  }
  double floor = -1;
  if (s_ == plan_.stages() - 1) {
    floor = 0;
    for (const MicroBatch& mb : mbs) floor += EntropyFloor(*data_, mb) / M_;
  }
  LH_ASSIGN_OR_RETURN(const float* params, stage().Params());
  proto::IterationReport rep;
  if (pulled_crc_) *rep.add_params() = *pulled_crc_;
  pulled_crc_.reset();
  // Replicas between the exchanges of local updates hold their own parameters; where an overlapped
  // exchange lands, they share the parameters it brought.
  if (landed) {
    proto::ParamsCrc* brought = rep.add_params();
    brought->set_iteration(it - cfg_.train.overlap_steps);
    brought->set_crc32c(Crc32c(0, channel_->pulled().data(), channel_->pulled().size() * sizeof(float)));
  } else if (executor_->pull_pending() != it && cfg_.train.ExchangesAfter(it, end_) &&
             ends != IterationEnd::kLocalStepThenPush) {
    proto::ParamsCrc* now = rep.add_params();
    now->set_iteration(it);
    now->set_crc32c(Crc32c(0, params, stage().num_params() * sizeof(float)));
  }
  rep.set_worker_id(client_.worker_id());
  rep.set_plan_version(plan_.version());
  for (const MicroBatch& mb : mbs) rep.add_micro_batches(mb.global_index);
  rep.set_stage(s_);
  rep.set_replica(r_);
  rep.set_iteration(it);
  rep.set_loss(result.loss);
  rep.set_floor(floor);
  if (evaluate && s_ == plan_.stages() - 1) {
    rep.set_val_loss_sum(val_loss_sum);
    rep.set_val_batches(static_cast<int>(val_mbs_.size()));
  }
  rep.set_seconds(std::chrono::duration<double>(Clock::now() - t_start).count());
  // Differences of rounded clocks: an iteration of waits alone may sum a hair below zero.
  rep.set_compute_seconds(std::max(0.0, result.compute_seconds));
  rep.set_step_seconds(result.step_seconds);
  rep.set_wait_seconds(std::max(0.0, result.wait_seconds));
  rep.set_lr(result.step.lr);
  rep.set_grad_norm(result.step.grad_norm);
  for (const auto& [to, bytes] : peers_->TakeSentBytes()) {
    proto::LinkBytes* link = rep.add_sent();
    link->set_stage(to.first);
    link->set_replica(to.second);
    link->set_bytes(bytes);
  }
  rep.set_refused(server_->refused());
  return client_.ReportIteration(rep);
}

absl::Status Worker::Deliver(const std::string& piece_root, int64_t step, std::function<absl::Status()> report) {
  const std::string step_dir = (fs::path(piece_root) / CheckpointName(step)).string();
  if (!shares_run_dir_) {
    absl::MutexLock lock(&trusted_mu_);
    trusted_.insert(step_dir);
  }
  // Reports go through the shipper too, shipping or not: on a slow link to the coordinator each
  // would take a round trip from the iterations.
  shipper_.Ship(shares_run_dir_ ? "" : step_dir, step, plan_.version(),
                [report = std::move(report), checkpoints = fs::path(piece_root).parent_path().string(), step,
                 keep = cfg_.train.keep_checkpoints, own = !shares_run_dir_] {
                  if (report) LH_RETURN_IF_ERROR(report());
                  // The coordinator holds the piece now: this disk keeps train.keep_checkpoints of
                  // it, as the coordinator's does (a resume fetches what is gone).
                  return own ? PruneCheckpoints(checkpoints, step, keep) : absl::OkStatus();
                });
  return shipper_.Error();
}

absl::Status Worker::Fetch(const std::string& step_dir, bool layout_only) {
  std::error_code ec;
  {
    absl::MutexLock lock(&trusted_mu_);
    const bool trusted = trusted_.count(step_dir) > 0 || (layout_only && trusted_state_.count(step_dir) > 0);
    if (trusted && fs::exists(fs::path(step_dir) / "state.json", ec)) return absl::OkStatus();
  }
  // No file of a piece holds more than the whole model and its two moments.
  const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
  LH_ASSIGN_OR_RETURN(const uint64_t most, MaxCheckpointFileBytes("optimizer.safetensors", whole.total(),
                                                                  whole.tensors().size(), true));
  const absl::Status fetched = FetchCheckpointPiece(client_, step_dir, plan_.version(), most, layout_only);
  // What the coordinator does not have is no piece of this run, whatever lies here.
  if (absl::IsNotFound(fetched)) fs::remove_all(step_dir, ec);
  LH_RETURN_IF_ERROR(fetched);
  absl::MutexLock lock(&trusted_mu_);
  (layout_only ? trusted_state_ : trusted_).insert(step_dir);
  if (!layout_only) ++fetched_;
  return absl::OkStatus();
}

absl::Status Worker::Prefetch(bool params) {
  // First round: the pieces this place writes under the plan's own layout (nearly always the
  // checkpoint's), and the state.json that records the checkpoint's layout where none of them is
  // the first shard's, at once.
  const std::string checkpoints = CheckpointsDir();
  const std::string& name = plan_.resume_checkpoint();
  std::map<std::string, bool> first;  // step directory -> its state.json alone
  if (params) {
    for (const proto::ShardPlacement& sp : plan_.shards())
      if (sp.stage() == s_) first[(fs::path(ShardCheckpointRoot(checkpoints, s_, sp.shard())) / name).string()] = false;
  }
  for (const auto& [g, job_replica] : FeedbackGroups()) {
    first[(fs::path(ResidualCheckpointRoot(checkpoints, s_, job_replica)) / name).string()] = false;
  }
  first.emplace((fs::path(ShardCheckpointRoot(checkpoints, 0, 0)) / name).string(), true);
  std::vector<std::future<absl::Status>> fetched;
  for (const auto& [dir, layout_only] : first) fetched.push_back(std::async(std::launch::async, fetch_, dir, layout_only));
  absl::Status round;
  for (auto& f : fetched) {
    if (absl::Status st = f.get(); !absl::IsNotFound(st)) round.Update(st);
  }
  LH_RETURN_IF_ERROR(round);
  // Then whatever else holds this stage's tensors by the checkpoint's own layout (a cut anew).
  std::vector<std::function<std::string(int)>> roots;
  if (params) roots.emplace_back();  // the shards'
  for (const auto& [g, job_replica] : FeedbackGroups()) {
    roots.emplace_back([&checkpoints, job = job_replica](int s) { return ResidualCheckpointRoot(checkpoints, s, job); });
  }
  if (LocalUpdates()) {
    roots.emplace_back([&checkpoints, this](int s) { return LocalCheckpointRoot(checkpoints, s, r_); });
  }
  std::vector<CheckpointPiece> pieces;
  for (const auto& root : roots) {
    LH_ASSIGN_OR_RETURN(std::vector<CheckpointPiece> some, ResumedPieces(root));
    pieces.insert(pieces.end(), some.begin(), some.end());
  }
  return FetchPieces(pieces, ParamLayout(cfg_.model, cfg_.Stage(s_)), fetch_);
}

absl::Status Worker::Checkpoint(int64_t step) {
  const std::string root = CheckpointsDir();
  // The stage's own AdamW state first: the shards' reports make the step one to resume from.
  if (LocalUpdates()) {
    LH_ASSIGN_OR_RETURN(const float* params, stage().Params());
    std::vector<float> m(stage().num_params()), v(m.size());
    LH_RETURN_IF_ERROR(stage().GetOptimizerState(m.data(), v.data()));
    const std::string local_root = LocalCheckpointRoot(root, s_, r_);
    LH_RETURN_IF_ERROR(SaveCheckpoint(local_root, {step, cfg_.as_json}, stage().layout(), params, m.data(), v.data()));
    LH_RETURN_IF_ERROR(Deliver(local_root, step, {}));
  }
  auto report = [this, step](proto::CheckpointReport rep) {
    rep.set_worker_id(client_.worker_id());
    rep.set_plan_version(plan_.version());
    const std::string piece_root = rep.directory();
    return Deliver(piece_root, step, [this, rep = std::move(rep)] { return client_.ReportCheckpoint(rep); });
  };
  // The error-feedback residuals of quantized pushes, one file per job replica this replica stands
  // for: a run that goes back to this step resumes them (else a quantized run would not be bitwise).
  for (const auto& [g, job_replica] : FeedbackGroups()) {
    const std::string residual_root = ResidualCheckpointRoot(root, s_, job_replica);
    const std::vector<float> residuals = channel_->Residuals(g);
    LH_RETURN_IF_ERROR(SaveCheckpoint(residual_root, {step, cfg_.as_json}, stage().layout(), residuals.data(), nullptr,
                                      nullptr));
    proto::CheckpointReport rep;
    rep.set_stage(s_);
    rep.set_step(step);
    rep.set_directory(residual_root);
    rep.set_residual_replica(job_replica + 1);
    LH_RETURN_IF_ERROR(report(rep));
  }
  return ps_host_->Checkpoint(step, root, cfg_.as_json, report);
}

absl::Status Worker::RunPlan() {
  const auto t0 = Clock::now();
  absl::Status status = Setup();
  const auto set_up = Clock::now();
  const int64_t start = plan_.start_iteration();
  const bool broadcast = !Resumed();
  // A resumed version starts each worker once it is set up, without waiting for the others: its
  // tensors to a worker still setting up wait in that worker's server until the version is there
  // (PlanAdmission::Ahead). The barrier made every recovery wait for its slowest worker's set-up
  // and a round trip to the coordinator, where only the tensors' own chain need wait. A broadcast
  // has every worker wait for all the others, so that none misses the parameters.
  if (status.ok() && broadcast) status = client_.AwaitStart(plan_.version());
  const auto started = Clock::now();
  if (status.ok() && broadcast) {
    // Every replica starts from the PS shards' parameters: the same init (a resumed version's
    // stages hold the checkpoint's already).
    status = ps_host_->Broadcast(start - 1);
    double waited = 0;
    if (status.ok()) status = channel_->PullParameters(start - 1, stage(), &waited, SIZE_MAX);
    if (status.ok()) status = channel_->Flush(start - 1);
  }
  if (status.ok() && (plan_.version() > 1 || !broadcast)) {
    // Where a recovery's (or a resume's) stall goes, past the detection.
    auto s = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    Clock::time_point heard;
    {
      absl::MutexLock lock(&stop_mu_);
      heard = std::exchange(heard_of_plan_, Clock::time_point{});  // not a later version's news
    }
    const std::string left = heard == Clock::time_point{}
                                 ? std::string()
                                 : absl::StrFormat("left the version before %.3f s after hearing of this one, ",
                                                   s(t0 - heard));
    const std::string barrier =
        broadcast ? absl::StrFormat(", every worker ready %.3f s later, parameters in %.3f s more", s(started - set_up),
                                    s(Clock::now() - started))
                  : std::string();
    const std::string fetched =
        fetched_ > 0 ? absl::StrFormat(" (%d checkpoint pieces fetched from the coordinator)", fetched_.load()) : "";
    std::cout << absl::StrFormat("%s plan version %d: %sset up in %.3f s%s%s\n", Who(), plan_.version(), left,
                                 s(set_up - t0), fetched, barrier)
              << std::flush;
  }
  end_ = RunEnd(plan_, cfg_);
  running_ = true;
  int64_t it = start;
  for (; status.ok() && it < end_; ++it) {
    client_.SetIteration(it);
    WarmClients(cfg_);
    // The previous iteration's parameters too, while they are still to be pulled; an overlapped
    // exchange's pushes and parameters, from its push until it lands.
    const std::optional<int64_t> pushed = cfg_.train.OverlappedUnder(it, end_);
    const int64_t behind = pushed ? it - *pushed : executor_->pull_pending() >= 0 ? 1 : 0;
    mailbox_.SetWindow(it - behind, WindowIterations() + behind);
    status = RunIteration(it);
    if (status.ok() && cfg_.train.CheckpointsAfter(it, end_)) status = Checkpoint(it + 1);
    if (status.ok()) status = shipper_.Error();
  }
  // The run's last checkpoint is whole at the coordinator before this worker says it is done.
  if (status.ok()) status = shipper_.Flush();
  running_ = false;
  // A failed iteration may leave sends in flight: end them before their clients go.
  if (!status.ok()) Stop(std::string(status.message()));
  // The last iteration's sends report a failure only once acknowledged.
  if (!channel_) return status;
  absl::Status drained = channel_->Drain();
  return status.ok() ? drained : status;
}

absl::Status Worker::Run() {
  absl::Status status = Join();
  if (absl::IsOutOfRange(status)) {
    std::cout << absl::StrFormat("%s the job finished without needing this spare\n", Who());
    proto::DoneReport done;
    done.set_worker_id(client_.worker_id());
    done.set_ok(true);
    client_.ReportDone(done);
    return absl::OkStatus();
  }
  while (status.ok()) {
    status = RunPlan();
    // After the last iteration the coordinator says the job finished, once every worker's is in
    // (or sends every worker back, where one was lost before); after a failure a lost peer may
    // explain, it sends the next plan within the silence that loses a worker, or stops the job.
    if (!status.ok() && (!PeerMayExplain(status) || client_.job_stopped())) break;
    // Failed on its own, not stopped by a newer version: where nobody was lost (a link broke
    // between live workers), the coordinator starts the layout again on this report.
    if (!status.ok() && client_.newest_plan() <= plan_.version()) {
      std::pair<int, int> link{s_, r_};
      {
        absl::MutexLock lock(&stop_mu_);
        if (failed_link_) link = *failed_link_;
      }
      (void)client_.ReportSuspect(link.first, link.second, std::string(status.message()), plan_.version());
    }
    const double wait_s = status.ok() ? 0 : 2 * cfg_.cluster.dead_after_s;
    absl::StatusOr<proto::Plan> next = client_.AwaitPlan(plan_.version(), wait_s);
    if (absl::IsOutOfRange(next.status()) && !status.ok()) {
      // Replaced (its place went to a spare while it straggled) and the job finished without it.
      std::cout << absl::StrFormat("%s the job finished under a plan without this worker\n", Who()) << std::flush;
      status = absl::OkStatus();
    }
    if (!next.ok()) {
      if (!absl::IsOutOfRange(next.status())) {
        status = status.ok() ? next.status()
                             : absl::Status(status.code(), absl::StrCat(status.message(), "; and no next plan came: ",
                                                                        next.status().message()));
      }
      break;
    }
    std::cout << absl::StrFormat("%s plan version %d replaces version %d%s: back to step %d\n", Who(), next->version(),
                                 plan_.version(), status.ok() ? "" : absl::StrCat(" (", status.message(), ")"),
                                 next->start_iteration())
              << std::flush;
    plan_ = *std::move(next);
    admission_.Expect(plan_.version());
    status = absl::OkStatus();
  }
  proto::DoneReport done;
  if (!cfg_.train.out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(fs::path(cfg_.train.out_dir) / "timeline", ec);
    // On the coordinator's clock, which this one shares on one kernel; on another, within half the
    // shortest heartbeat round trip.
    const ClockOffset& clock = client_.coordinator_clock();
    const absl::StatusOr<TraceFile> trace = timeline_.Write(
        (fs::path(cfg_.train.out_dir) / "timeline" / absl::StrFormat("worker_%d.json", client_.worker_id())).string(),
        client_.worker_id(), absl::StrFormat("worker %d (stage %d, replica %d)", client_.worker_id(), s_, r_),
        clock.offset_us().value_or(0));
    if (trace.ok()) {
      done.set_timeline_bytes(trace->bytes);
      done.set_timeline_crc32c(trace->crc32c);
      // A worker that shares the run directory wrote it where the coordinator looks for it.
      if (!shares_run_dir_) {
        if (const absl::Status shipped = ShipTimelineFile(client_, *trace); !shipped.ok()) {
          std::cout << absl::StrFormat("%s timeline not shipped (%s); it is at %s\n", Who(), shipped.message(),
                                       trace->path);
        } else if (clock.error_us() > 0) {
          std::cout << absl::StrFormat("%s timeline shipped to the coordinator, on its clock within %.1f ms\n", Who(),
                                       clock.error_us() / 1e3);
        }
      }
    }
  }
  done.set_worker_id(client_.worker_id());
  done.set_ok(status.ok());
  done.set_error(std::string(status.message()));
  if (const std::optional<std::string> name = ResumedCheckpointOf(status)) done.set_resumed_checkpoint(*name);
  client_.ReportDone(done);
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(Who(), " ", status.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(const WorkerOptions& opt) {
  LH_ASSIGN_OR_RETURN(JobSecret secret, JobSecret::FromFlagOrEnv(opt.secret_file));
  LH_ASSIGN_OR_RETURN(WorkerKey key, WorkerKey::Generate());
  Worker w(opt, std::move(secret), std::make_shared<const WorkerKey>(std::move(key)));
  return w.Run();
}

}  // namespace longhaul
