#include "coordinator/joining.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "coordinator/communication.h"
#include "coordinator/planning.h"
#include "coordinator/recovery.h"
#include "layout/plan_layout.h"
#include "metrics/flops.h"
#include "metrics/timeline.h"
#include "transport/link_connections.h"
#include "transport/wire_plan.h"

namespace longhaul {
namespace {

using Clock = std::chrono::steady_clock;

// The workers the first plan places (ids below stages x replicas; any more that registered before
// it wait as spares).
std::map<int, proto::RegisterRequest> FirstWorkers(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::map<int, proto::RegisterRequest> first = job.members.registrations();
  first.erase(first.lower_bound(job.expected), first.end());
  return first;
}

// What the first workers measured of their links (members.linked()): worker w is host w, a link's
// one-way delay half the round trip its sender measured, its card's egress where its probes saw
// one; workers at one address talk for free.
NetworkCost MeasuredNetwork(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::vector<std::vector<LinkCost>> links(job.expected, std::vector<LinkCost>(job.expected));
  std::vector<double> egress(job.expected);
  for (int a = 0; a < job.expected; ++a) {
    egress[a] = job.members.egress(a);
    for (int b = 0; b < job.expected; ++b)
      if (const std::optional<proto::LinkMeasurement> m = job.members.link(a, b)) {
        links[a][b] = MeasuredLink(m->round_trip_s(), m->bytes_per_s());
      }
  }
  NetworkCost network = NetworkCost::FromMatrix(std::move(links));
  network.SetCards(std::move(egress), {});
  return network;
}

nlohmann::json MeasuredCardsJson(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  nlohmann::json out = nlohmann::json::array();
  for (int a = 0; a < job.expected; ++a)
    if (job.members.egress(a) > 0) out.push_back({{"worker", a}, {"egress_mbit_per_s", 8e-6 * job.members.egress(a)}});
  return out;
}

nlohmann::json MeasuredLinksJson(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  nlohmann::json out = nlohmann::json::array();
  for (int a = 0; a < job.expected; ++a)
    for (int b = 0; b < job.expected; ++b)
      if (const std::optional<proto::LinkMeasurement> m = job.members.link(a, b)) {
        out.push_back({{"from", a}, {"to", b}, {"round_trip_ms", 1e3 * m->round_trip_s()},
                       {"mbit_per_s", 8e-6 * m->bytes_per_s()}});
      }
  return out;
}

// The job's config from now on cuts the model as `cut`: the plan carries it to the workers, whose
// stages and checkpoints follow it.
absl::Status AdoptCut(Job& job, const std::vector<int>& cut) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const std::vector<int> was = job.cfg.Cut();
  absl::StatusOr<JobConfig> cfg = job.cfg.WithCut(cut);
  if (!cfg.ok()) return cfg.status();
  job.cfg = *std::move(cfg);
  std::cout << absl::StrFormat("coordinator: the search cuts the model [%s] blocks per stage, not [%s]\n",
                               absl::StrJoin(cut, ", "), absl::StrJoin(was, ", "));
  return absl::OkStatus();
}

// The placement search for the first workers running `cfg`, on the links the job knows.
absl::StatusOr<SlotSearch> SearchFirstSlots(const Job& job, const JobConfig& cfg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::map<int, proto::ComputeProfile> profiles;
  for (const auto& [id, reg] : FirstWorkers(job)) profiles[id] = job.members.profile(id);
  // A cut the config pins, or a checkpoint's (resume keeps the layout), stands.
  const bool keep_cut = !cfg.cluster.stage_layers.empty() || job.progress.start() > 0;
  return SearchSlots(cfg, FirstWorkers(job), profiles, *job.network, keep_cut);
}

// cluster.communication = "auto" on a job's start (job.penalties): the communication keys of the
// setting fastest to the same loss on the links the job knows become the job's config, which the
// plan carries to the workers; where no links are known the config's own stand. For cluster.json.
nlohmann::json ChooseFirstCommunication(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  if (!job.penalties) return nullptr;
  if (!job.network) {
    const std::string why = "no links known (give the coordinator --scenario, or set cluster.link_probe = \"on\")";
    std::cout << "coordinator: communication as configured: " << why << "\n";
    return {{"chosen", nullptr}, {"why", why}};
  }
  absl::StatusOr<CommunicationChoice> choice = ChooseCommunication(
      job.cfg, *job.penalties, [&job](const JobConfig& c) {
        job.mu.AssertHeld();  // ChooseCommunication calls it here, under the lock
        return SearchFirstSlots(job, c);
      });
  if (!choice.ok()) {
    std::cout << "coordinator: communication as configured: " << choice.status().message() << "\n";
    return {{"chosen", nullptr}, {"why", choice.status().message()}};
  }
  const CommunicationCandidate& c = choice->candidates[choice->chosen];
  std::cout << absl::StrFormat("coordinator: communication by time to the same loss (cluster.communication = \"auto\"): "
                               "%s, penalty %+.3f: predicted %.3f s per iteration, %.0f tokens/s, %.0f effective\n",
                               c.name, c.penalty, c.iteration_s, c.tokens_per_s, c.effective);
  for (const CommunicationCandidate& o : choice->candidates) {
    if (&o == &c) continue;
    std::cout << "  " << o.name << ": "
              << (o.why_not.empty() ? absl::StrFormat("%.0f effective tokens/s", o.effective) : o.why_not) << "\n";
  }
  std::cout << std::flush;
  nlohmann::json record = choice->Json();
  job.cfg = std::move(choice->cfg);
  return record;
}

// Where the first plan puts each worker and shard, and how that was decided, for cluster.json.
struct FirstPlacement {
  std::vector<int> worker_of_slot;  // slot k = replica * stages + stage runs worker_of_slot[k]
  std::vector<std::vector<int>> shard_owner;  // the search's (empty: shard k on replica k)
  nlohmann::json record;
};

// Which worker runs which slot: the placement search where the links are known (the scenario's,
// worker w on host w, or the measured), else registration order. Every first worker registered
// and profiled.
FirstPlacement Place(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  FirstPlacement out{RegistrationOrder(job.cfg), {}, {{"how", "registration"}}};
  std::string why;
  if (!job.cfg.cluster.search_placement) {
    why = "cluster.placement = \"registration\"";
  } else if (!job.network) {
    why = job.probing ? "every worker is at one address: no link between them to plan with"
                      : "no links known (give the coordinator --scenario, or set cluster.link_probe = \"on\")";
  } else if (!job.cfg.cluster.stage_backends.empty()) {
    why = "cluster.stage_backends pins a device to each stage";
  } else {
    const Clock::time_point t0 = Clock::now();
    const absl::StatusOr<SlotSearch> found = SearchFirstSlots(job, job.cfg);
    if (!found.ok()) {
      why = absl::StrCat("the search failed: ", found.status().message());
    } else {
      out.worker_of_slot = found->worker_of_slot;
      out.shard_owner = found->shard_owner;
      absl::Status cut = absl::OkStatus();
      if (found->blocks_per_stage != job.cfg.Cut()) cut = AdoptCut(job, found->blocks_per_stage);
      if (!cut.ok()) {
        why = absl::StrCat("the search's cut is no valid config: ", cut.message());
        out.worker_of_slot = RegistrationOrder(job.cfg);
        out.shard_owner.clear();
      }
    }
    if (found.ok() && why.empty()) {
      out.record = {{"how", "search"},
                    {"predicted_iteration_seconds", found->predicted_s},
                    {"registration_order_predicted_iteration_seconds", found->registration_order_s},
                    {"simulations", found->simulations},
                    {"blocks_per_stage", job.cfg.Cut()},
                    {"shard_owner", out.shard_owner}};
      std::cout << absl::StrFormat("coordinator: placement by search (%d simulations, %.0f ms): predicted %.3f s per "
                                   "iteration, registration order %.3f s (%.2fx)%s\n",
                                   found->simulations, 1e3 * std::chrono::duration<double>(Clock::now() - t0).count(),
                                   found->predicted_s, found->registration_order_s,
                                   found->registration_order_s / found->predicted_s,
                                   found->searched ? ""
                                                   : absl::StrFormat("; registration order and the config's cut "
                                                                     "stand (nothing %.0f%% faster)",
                                                                     100 * kPlacementMinGain));
      if (!found->why_not.empty()) {
        std::cout << "coordinator: warning: no placement fits the memory the workers reported: " << found->why_not
                  << "; their own checks will say what to change\n";
      }
    }
  }
  if (!why.empty()) {
    out.record["why"] = why;
    std::cout << "coordinator: placement in registration order: " << why << "\n";
  }
  out.record["worker_of_slot"] = out.worker_of_slot;
  return out;
}

// The wires and connections of the first plan, for cluster.json and the plan's line.
struct WireRecord {
  nlohmann::json wire, connections;
  std::string wire_line, connections_line;
};
WireRecord WireRecordOf(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const proto::Plan& plan = job.plans.current();
  const WirePlan wires = WiresOf(plan);
  nlohmann::json narrow = nlohmann::json::array();
  for (const auto& [pair, dtype] : wires.links) {
    narrow.push_back({{"from", pair.first}, {"to", pair.second}, {"dtype", WireDtypeName(dtype)}});
  }
  WireRecord out;
  out.wire_line = DescribeWires(wires);
  out.wire = {{"configured", WireDtypeName(job.cfg.transport.wire_dtype)},
              {"default", WireDtypeName(wires.default_dtype)},
              {"params", WireDtypeName(wires.params_dtype)},
              {"pushes", WireDtypeName(wires.push_dtype)},
              {"params_change", WireDtypeName(wires.change_dtype)},
              {"links", narrow}};
  // Links split over several connections: their rate x round trip exceeds one connection's window.
  nlohmann::json split = nlohmann::json::array();
  int most = 1;
  for (const auto& [pair, n] : LinkConnectionsOf(plan)) {
    split.push_back({{"from", pair.first}, {"to", pair.second}, {"connections", n}});
    most = std::max(most, n);
  }
  out.connections_line = job.cfg.transport.connections > 0
                             ? absl::StrFormat("%d per link (transport.connections)", job.cfg.transport.connections)
                             : "1 per link";
  if (!split.empty()) {
    out.connections_line = absl::StrFormat(
        "up to %d on %d links whose rate x round trip exceeds a connection's window, else 1", most, split.size());
  }
  out.connections = {{"configured", job.cfg.transport.connections}, {"links", split}};
  return out;
}

// Version 1, once every first worker registered and profiled (and reported its links, where the
// job probes them).
void MakeFirstPlan(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const nlohmann::json communication = ChooseFirstCommunication(job);
  const FirstPlacement placed = Place(job);
  job.log.SetPlacement(placed.record);
  job.NotePlan(MakePlan(job.cfg, FirstWorkers(job),
                        {job.progress.start(), job.progress.resume_name(), job.progress.end()}, placed.worker_of_slot,
                        job.network ? &*job.network : nullptr, placed.shard_owner));
  if (job.network) job.metrics.SetLinks(*job.network, job.links);
  const WireRecord wires = WireRecordOf(job);
  job.cluster_record = {{"job_id", job.cfg.cluster.job_id},
                        {"placement", placed.record},
                        {"wire", wires.wire},
                        {"connections", wires.connections}};
  if (!communication.is_null()) job.cluster_record["communication"] = communication;
  if (job.members.linked()) {
    job.cluster_record["links"] = MeasuredLinksJson(job);
    if (nlohmann::json cards = MeasuredCardsJson(job); !cards.empty()) job.cluster_record["cards"] = std::move(cards);
  }
  std::cout << absl::StrFormat("coordinator: plan v1: %d stages x %d replicas, %s schedule, %s parameter servers "
                               "(%d shards), wire %s, connections %s\n"
                               "  iteration time = stage 0 replica 0's; TFLOPs/worker = %s / iteration time / %d "
                               "workers; floor = entropy of the data (nats/token)\n",
                               job.cfg.cluster.stages, job.cfg.cluster.replicas, ScheduleName(job.cfg.cluster.schedule),
                               job.cfg.cluster.central_ps ? "central" : "sharded", job.plans.current().shards_size(),
                               wires.wire_line, wires.connections_line, FlopsFormulaName(job.cfg.train.recompute),
                               job.expected)
            << std::flush;
  job.WriteState();
  job.cv.SignalAll();
}

}  // namespace

absl::Status Register(Job& job, const proto::RegisterRequest& req, proto::RegisterReply& reply) {
  const absl::StatusOr<int> registered = job.members.Register(req, Clock::now());
  if (!registered.ok()) return registered.status();
  const int id = *registered;
  const bool spare = job.plans.version() > 0 || id >= job.expected;
  std::cout << (spare ? absl::StrFormat("coordinator: worker %d registered from %s (%s, pid %d) as a spare\n", id,
                                        req.address(), req.host(), req.pid())
                      : absl::StrFormat("coordinator: worker %d registered from %s (%s, pid %d), %d/%d\n", id,
                                        req.address(), req.host(), req.pid(), id + 1, job.expected))
            << std::flush;
  reply.set_worker_id(id);
  reply.set_heartbeat_s(job.cfg.cluster.heartbeat_s);
  reply.set_dead_after_s(job.cfg.cluster.dead_after_s);
  reply.set_config_toml(job.cfg.toml_text);
  reply.set_probe_links(job.probing && !spare);
  if (job.plans.version() > 0) job.WriteState();
  return absl::OkStatus();
}

absl::Status TakeProfile(Job& job, const proto::ProfileReport& req) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  if (AssignmentOf(job.plans.current(), req.worker_id()) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("worker %d reports a profile after the plan was made", req.worker_id()));
  }
  job.members.Heard(req.worker_id(), Clock::now());
  if (absl::Status st = job.members.SetProfile(req.worker_id(), req.compute()); !st.ok()) return st;
  if (job.plans.version() == 0 && job.members.profiled() && !job.probing) MakeFirstPlan(job);
  if (job.plans.version() > 0) job.WriteState();
  if (!job.recovery.vacant.empty()) FillVacancies(job);  // a spare some lost worker's place waited for
  job.cv.SignalAll();  // Peers waits for every profile
  return absl::OkStatus();
}

absl::Status TakeLinks(Job& job, const proto::LinkReport& req) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  if (!job.probing || job.plans.version() > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d reports links %s", req.worker_id(),
        job.probing ? "after the plan was made" : "where the job probes none"));
  }
  job.members.Heard(req.worker_id(), Clock::now());
  if (absl::Status st = job.members.SetLinks(req.worker_id(), req); !st.ok()) return st;
  job.cv.SignalAll();  // Peers with after_links waits for every worker's links
  if (job.members.profiled() && job.members.linked()) {
    // Workers that all share one address measured nothing: the links stay as they were (a
    // scenario's, or unknown, when registration order and the config's cut stand rather than a
    // search steered by the noise between equal workers).
    if (!MeasuredLinksJson(job).empty()) {
      job.network = MeasuredNetwork(job);
      job.links = "the links the workers measured";
    }
    MakeFirstPlan(job);
  }
  return absl::OkStatus();
}

absl::Status Peers(Job& job, const proto::PeersRequest& req, proto::Peers& peers) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  job.members.Heard(req.worker_id(), Clock::now());
  if (!job.WaitFor(absl::Seconds(5), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
        return (job.members.profiled() && (!req.after_links() || job.members.links_measured())) ||
               !job.abort.empty();
      })) {
    return absl::NotFoundError(req.after_links() ? "not every worker has reported its links"
                                                 : "not every worker has registered and reported its profile");
  }
  if (!job.abort.empty()) return absl::AbortedError(job.abort);
  for (const auto& [id, reg] : job.members.registrations()) {
    proto::Peer* p = peers.add_peers();
    p->set_worker_id(id);
    p->set_address(reg.address());
    p->set_public_key(reg.public_key());
  }
  return absl::OkStatus();
}

absl::Status PlanFor(Job& job, const proto::PlanRequest& req, proto::Plan& plan) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  job.members.Heard(req.worker_id(), Clock::now());
  auto placed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    return job.plans.version() > req.known_version() && AssignmentOf(job.plans.current(), req.worker_id());
  };
  job.WaitFor(absl::Seconds(5), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    return placed() || job.finished || !job.abort.empty();
  });
  if (!job.abort.empty()) return absl::AbortedError(job.abort);
  if (placed()) {
    plan = job.plans.ToSend();
    return absl::OkStatus();
  }
  if (job.finished) return absl::OutOfRangeError("the job finished");
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;  // lost while it waited
  return absl::NotFoundError(job.plans.version() == 0 ? "no plan yet: waiting for workers"
                                                      : "no place for this worker yet");
}

absl::Status Ready(Job& job, const proto::ReadyRequest& req, proto::ReadyReply& reply) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  const uint64_t version = job.plans.version();
  if (req.plan_version() != version) {
    return absl::FailedPreconditionError(absl::StrFormat("worker %d is ready for plan version %d; the plan is version %d",
                                                         req.worker_id(), req.plan_version(), version));
  }
  // The barrier counts the plan's workers: a spare's word would open it early, or never.
  if (AssignmentOf(job.plans.current(), req.worker_id()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("worker %d has no place in plan version %d to be ready for", req.worker_id(), version));
  }
  job.ready.insert(req.worker_id());
  job.cv.SignalAll();
  if (!job.WaitFor(absl::Seconds(5), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
        return static_cast<int>(job.ready.size()) == job.plans.current().assignments_size() || !job.abort.empty() ||
               job.plans.version() != version;
      })) {
    return absl::DeadlineExceededError("waiting for every worker to install the plan");
  }
  if (job.plans.version() != version) {
    return absl::FailedPreconditionError(
        absl::StrFormat("plan version %d replaced version %d", job.plans.version(), version));
  }
  reply.set_abort(!job.abort.empty());
  reply.set_reason(job.abort);
  return absl::OkStatus();
}

absl::Status Heartbeat(Job& job, const proto::HeartbeatRequest& req, proto::HeartbeatReply& reply) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  job.members.Heard(req.worker_id(), Clock::now());
  reply.set_abort(!job.abort.empty());
  reply.set_reason(job.abort);
  reply.set_plan_version(job.plans.version());
  reply.set_coordinator_boot_id(job.boot_id);
  reply.set_coordinator_clock_us(Timeline::NowMicros());
  return absl::OkStatus();
}

std::string UnfilledSlots(const Job& job) {
  return absl::StrCat("not yet worker ids ", absl::StrJoin(job.members.Unfilled(), ", "),
                      ": start each with `longhaul worker --coordinator <this host>:<port>`");
}

}  // namespace longhaul
