#pragma once
// A network scenario: sites and the one-way delay, jitter and rate between every pair of sites.
// Hosts (workers, the coordinator) are placed on sites round-robin, or by an explicit list.
//
// File format (TOML):
//   description = "..."
//   delays_are = "one-way"            # or "round-trip": then every delay is halved on load
//   sites = ["us-east", "eu-west"]
//   delay_ms = [[0.1, 40], [40, 0.1]] # site x site; the diagonal applies within a site
//   rate_mbit = [[10000, 1000], [1000, 10000]]
//   jitter_ms = [[0, 2], [2, 0]]      # optional, same shape
//   loss = 0.0                        # optional, probability per packet, every link
//   placement = [0, 1, 0, 1]          # optional site of host i; default round-robin
//   nic_gbps = 10                     # optional: each host's network card, both directions;
//                                     # a number for every host or one per site
//   egress_gbps = [10, 5]             # optional, same forms: one direction only (over nic_gbps)
//   ingress_gbps = 25
//
// A pair's rate_mbit is what one pair can reach alone (a provider's per-flow cap goes there: see
// docs/scenarios.md); a host's card is shared by every pair it sends to (egress) or receives from
// (ingress) at once, so a host that talks to seven peers gets its card's rate in all, not seven
// times the pair's.
//
// netem/ emulates a scenario's links and the planner prices them (plan/cost_model.h), so it sits in
// runtime/ below the planner; it keeps netem's namespace, whose scenario files (netem/scenarios/)
// it reads.
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul::netem {

struct Link {
  double delay_ms = 0;   // one-way
  double jitter_ms = 0;  // delays vary by up to ± this, kept monotone per pair (no reordering)
  double rate_mbit = 0;  // 0: unlimited
  double loss = 0;
};

struct Scenario {
  std::string name, description;
  std::vector<std::string> sites;
  std::vector<std::vector<double>> delay_ms, jitter_ms, rate_mbit;  // one-way, site x site
  double loss = 0;
  std::vector<int> placement;
  std::vector<double> egress_mbit, ingress_mbit;  // [site]: the hosts' cards; empty or 0: unlimited

  int SiteOf(int host) const;
  // The link from host `from` to host `to`.
  Link Between(int from, int to) const;
  // Host `host`'s card, in Mbit/s; 0: unlimited.
  double EgressMbit(int host) const;
  double IngressMbit(int host) const;
  bool HasCards() const { return !egress_mbit.empty() || !ingress_mbit.empty(); }
};

absl::StatusOr<Scenario> ParseScenario(const std::string& toml_text, const std::string& name);
absl::StatusOr<Scenario> LoadScenario(const std::string& path);

}  // namespace longhaul::netem
