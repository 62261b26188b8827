#pragma once
// What the plan lets each peer send one worker (stage s, replica r): the boundary activations of
// the previous stage of its replica, the boundary gradients of the next, its stage's other
// replicas' gradient pushes for the shards it hosts, the parameters of its stage's other shards
// from their hosts, and where it hosts shards the other hosts' norm partials; each of a size the
// plan fixes, in the plan's wire dtype, under the plan's version; with local updates, pushes and
// parameters only on the iterations that exchange. Which iterations are accepted is the Mailbox's
// window. Before the plan, only link probes of bounded size (worker/link_probe.h).
//
// Who may connect: the workers of the plan and those the coordinator's news names as the job's
// members (spares among them), each by the key it registered; a worker neither has any longer
// was lost, and is refused. Each tensor must come from the place the plan gives the worker that
// proved it sent it: a worker speaks for no other's place. A member's share of this worker's
// connections: its clients open one set per link (the one kept from the coordinator's news, of
// transport.connections, and the plan's, of the plan's connections for the link), twice that and
// two more, for connections that close while their successors open.
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "config/job_config.h"
#include "longhaul.pb.h"
#include "transport/tensor_transport.h"
#include "transport/wire_plan.h"

namespace longhaul {

// Thread-safe: the tensor server's connection threads ask while the worker sets a plan, the
// coordinator client's lifeline thread sets the members, and whichever thread stops a version
// (Worker::Stop) calls Expect and Leave; mu_ guards every field.
class PlanAdmission : public TensorAdmission {
 public:
  // Refuses everything but link probes until SetPlan, and link probes from then on.
  PlanAdmission() = default;

  // The plan this worker runs, as stage `stage` of replica `replica`, under config `cfg`.
  void SetPlan(const proto::Plan& plan, const JobConfig& cfg, int stage, int replica) ABSL_LOCKS_EXCLUDED(mu_);
  // The job's workers not lost, with their keys, as the coordinator's news last told.
  void SetMembers(const std::vector<proto::Peer>& members) ABSL_LOCKS_EXCLUDED(mu_);
  // The job's transport.connections (0: the plan's per link), known at registration: a member's
  // share before the plan, and where the plan gives a link no count of its own.
  void SetConnections(int transport_connections) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Member(int worker, absl::string_view public_key) const override ABSL_LOCKS_EXCLUDED(mu_);
  Share ShareOf(int worker) const override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& header, int sender) const override
      ABSL_LOCKS_EXCLUDED(mu_);
  // A version newer than the one set: a resumed version has no start barrier (Worker::RunPlan),
  // so a peer that set it up sooner sends before this worker has. One this worker heard of
  // (Expect) is waited for as long as its set-up takes; another only kUnheardPatience, as a peer
  // may hear of a version a moment sooner, and a crafted one must not hold a connection for long.
  bool Ahead(const proto::TensorHeader& header, std::chrono::steady_clock::duration waited) const override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Plan `version` is coming: the coordinator published it.
  void Expect(uint64_t version) ABSL_LOCKS_EXCLUDED(mu_);
  // This worker gave up the version it runs (it failed, or a newer one is coming): its tensors
  // still under way are of no use.
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);
  // Of a version older than the one set or expected, or of one left: a peer's send from just
  // before it moved on, or from before this worker gave the version up.
  bool Stale(const proto::TensorHeader& header) const override ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr std::chrono::seconds kUnheardPatience{1};

 private:
  struct Expected {
    uint64_t elements = 0;
    int micro_batches = 1;  // micro-batch indices [0, micro_batches)
    // The plan's for each micro-batch index of this tensor from this peer (wire_plan.h); one where
    // they are alike.
    std::vector<WireDtype> dtypes = {WireDtype::kF32};
    // Micro-batch 0's where it differs (shared directions travel with an iteration's first
    // activation, model/model_config.h); 0: `elements`.
    uint64_t first_elements = 0;
  };
  using Source = std::tuple<int, int, int, int>;  // kind, from stage, from replica, shard

  mutable absl::Mutex mu_;
  bool have_plan_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t plan_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t expected_version_ ABSL_GUARDED_BY(mu_) = 0;  // the newest Expect'ed
  uint64_t left_version_ ABSL_GUARDED_BY(mu_) = 0;      // the newest version Leave gave up
  int stage_ ABSL_GUARDED_BY(mu_) = 0;
  int replica_ ABSL_GUARDED_BY(mu_) = 0;
  int self_ ABSL_GUARDED_BY(mu_) = -1;  // this worker's id in the plan
  std::map<std::pair<int, int>, int> places_ ABSL_GUARDED_BY(mu_);  // (stage, replica) -> worker, the plan's
  std::map<int, std::string> placed_ ABSL_GUARDED_BY(mu_);   // worker -> key, the plan's
  std::map<int, std::string> members_ ABSL_GUARDED_BY(mu_);  // worker -> key, the news's
  // Every worker ever placed or a member: one that is neither now was lost.
  std::set<int> known_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> links_ ABSL_GUARDED_BY(mu_);  // worker -> the plan's connections from it to this one
  int connections_ ABSL_GUARDED_BY(mu_) = 1;       // per link where the plan gives none (transport.connections)
  std::map<Source, Expected> expected_ ABSL_GUARDED_BY(mu_);
  // With local updates, pushes and parameters travel only on the iterations that exchange (and
  // parameters on the one before the run's first, the initial broadcast).
  TrainConfig train_ ABSL_GUARDED_BY(mu_);
  int64_t start_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t end_ ABSL_GUARDED_BY(mu_) = 0;
  WirePlan wires_ ABSL_GUARDED_BY(mu_);  // PARAMS: whole or as their change (ParamsTravelWhole)
};

}  // namespace longhaul
