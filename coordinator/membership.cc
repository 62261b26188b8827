#include "coordinator/membership.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "transport/identity.h"
#include "transport/socket_io.h"
#include "transport/tensor_transport.h"

namespace longhaul {

namespace {
constexpr size_t kMaxRegistrationText = 255;
}  // namespace

Membership::Membership(std::string job_id, int expected, int spares, double dead_after_s, double suspect_silent_s,
                       double cut_off_silent_s)
    : job_id_(std::move(job_id)), expected_(expected), spares_(spares), dead_after_s_(dead_after_s),
      suspect_silent_s_(suspect_silent_s), cut_off_silent_s_(cut_off_silent_s) {}

absl::StatusOr<int> Membership::Register(const proto::RegisterRequest& req, Clock::time_point now) {
  if (req.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker speaks protocol version %d, this coordinator %d: run the same longhaul build everywhere",
        req.protocol_version(), kProtocolVersion));
  }
  if (!req.job_id().empty() && req.job_id() != job_id_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("worker wants job '%s' but this coordinator runs job '%s'", req.job_id(), job_id_));
  }
  if (req.public_key().size() != kPublicKeyBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a worker's public key of %d bytes (an Ed25519 key has %d): run the same longhaul build everywhere",
        req.public_key().size(), kPublicKeyBytes));
  }
  // Kept for the job's life and sent again in every plan and lifeline's news.
  for (const auto& [field, value] : {std::pair{"address", &req.address()}, std::pair{"host", &req.host()},
                                     std::pair{"backend", &req.backend()}}) {
    if (value->size() > kMaxRegistrationText) {
      return absl::InvalidArgumentError(absl::StrFormat("a worker's %s of %d bytes (at most %d)", field,
                                                        value->size(), kMaxRegistrationText));
    }
  }
  if (!SplitHostPort(req.address()).ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a worker's tensor address '%s' is not host:port", absl::CHexEscape(req.address())));
  }
  if (registered() >= expected_ + spares_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job '%s' already has its %d workers and %d spares (cluster.spares)", job_id_, expected_, spares_));
  }
  int id = 0;
  if (req.has_slot()) {
    id = req.slot();
    if (id < 0 || id >= expected_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker asks for slot %d but job '%s' has slots 0 to %d: check the launcher's --slot", id, job_id_,
          expected_ - 1));
    }
    if (workers_.count(id)) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "worker asks for slot %d, which the worker at %s already holds: give each worker its own --slot", id,
          workers_.at(id).reg.address()));
    }
  } else {
    while (workers_.count(id)) ++id;
  }
  Worker& w = workers_[id] = Worker();
  w.reg = req;
  w.last_seen = now;
  ++changes_;
  return id;
}

absl::Status Membership::SetProfile(int id, const proto::ComputeProfile& c) {
  for (double t : {c.block_forward_s(), c.block_backward_s(), c.head_forward_s(), c.head_backward_s()}) {
    // An hour for one micro-batch of one block is no device a job can use; NaN fails this too.
    if (!(t >= 0 && t < 3600)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker %d reports a compute time of %g s: times must be finite, non-negative and under an hour "
          "(a damaged or foreign client?)",
          id, t));
    }
  }
  // Some petabytes is no machine either.
  if (!(c.memory_bytes() >= 0 && c.memory_bytes() < 1e16)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker %d reports %g bytes of memory: a damaged or foreign client?", id, c.memory_bytes()));
  }
  workers_.at(id).profile = c;
  return absl::OkStatus();
}

bool Membership::SameHost(int a, int b) const {
  return HostOf(workers_.at(a).reg.address()) == HostOf(workers_.at(b).reg.address());
}

absl::Status Membership::SetLinks(int id, const proto::LinkReport& report) {
  std::map<int, proto::LinkMeasurement> links;
  for (const proto::LinkMeasurement& m : report.links()) {
    const int to = m.to_worker();
    if (to == id || !workers_.count(to) || links.count(to)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker %d reports a link to worker %d: %s", id, to,
          to == id ? "itself" : (!workers_.count(to) ? "no such worker registered" : "twice")));
    }
    // NaN fails both checks too.
    if (!(m.round_trip_s() > 0 && m.round_trip_s() < 3600) || !(m.bytes_per_s() > 0 && m.bytes_per_s() < 1e13)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker %d reports a link to worker %d of %g s round trip and %g bytes/s: round trips must be positive and "
          "under an hour, rates positive and finite (a damaged or foreign client?)",
          id, to, m.round_trip_s(), m.bytes_per_s()));
    }
    links[to] = m;
  }
  for (const auto& [other, w] : workers_) {
    if (other < expected_ && other != id && !SameHost(id, other) && !links.count(other)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("worker %d reports no link to worker %d, which is at another address", id, other));
    }
  }
  if (!(report.egress_bytes_per_s() >= 0 && report.egress_bytes_per_s() < 1e13)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker %d reports an egress of %g bytes/s: it must be 0 (no card seen) or positive and finite (a damaged or "
        "foreign client?)",
        id, report.egress_bytes_per_s()));
  }
  Worker& w = workers_.at(id);
  w.links = std::move(links);
  w.egress_bytes_per_s = report.egress_bytes_per_s();
  w.links_reported = true;
  w.card_to_come = report.card_to_come();
  return absl::OkStatus();
}

bool Membership::EveryExpected(const std::function<bool(const Worker&)>& done) const {
  return full() && std::all_of(workers_.begin(), workers_.end(),
                               [&](const auto& w) { return w.first >= expected_ || done(w.second); });
}

bool Membership::linked() const {
  return EveryExpected([](const Worker& w) { return w.links_reported && !w.card_to_come; });
}

bool Membership::links_measured() const {
  return EveryExpected([](const Worker& w) { return w.links_reported; });
}

double Membership::egress(int id) const { return workers_.at(id).egress_bytes_per_s; }

std::optional<proto::LinkMeasurement> Membership::link(int from, int to) const {
  const auto& links = workers_.at(from).links;
  auto it = links.find(to);
  return it == links.end() ? std::nullopt : std::optional<proto::LinkMeasurement>(it->second);
}

bool Membership::profiled() const {
  return EveryExpected([](const Worker& w) { return w.profile.has_value(); });
}

bool Membership::full() const {
  return std::count_if(workers_.begin(), workers_.end(), [&](const auto& w) { return w.first < expected_; }) ==
         expected_;
}

int Membership::registered() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const auto& w) { return !w.second.lost; }));
}

absl::Status Membership::Check(int id) const {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrFormat("no worker %d has registered with job '%s'", id, job_id_));
  }
  if (it->second.lost) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d of job '%s' was declared lost and its place given to another; a process that was only cut off "
        "must start again to join as a spare",
        id, job_id_));
  }
  return absl::OkStatus();
}

void Membership::Lose(int id) {
  workers_.at(id).lost = true;
  ++changes_;
}

void Membership::CutOff(int id, Clock::time_point now) { workers_.at(id).cut_off = now; }

void Membership::Reconnected(int id) { workers_.at(id).cut_off.reset(); }

void Membership::Heard(int id, Clock::time_point now) { workers_.at(id).last_seen = now; }

void Membership::Done(int id, const TraceFile& timeline) {
  Worker& w = workers_.at(id);
  w.done = true;
  w.timeline = timeline;
}

int Membership::done() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const auto& w) { return w.second.done && !w.second.lost; }));
}

void Membership::Suspect(int id, int reporter, Clock::time_point now) {
  Worker& w = workers_.at(id);
  if (!w.suspected || w.suspected->first <= w.last_seen) w.suspected = std::make_pair(now, reporter);
}

std::optional<Membership::Lost> Membership::Silent(Clock::time_point now) const {
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  for (const auto& [id, w] : workers_) {
    if (w.done || w.lost) continue;
    if (const double silent = seconds(now - w.last_seen); silent > dead_after_s_) return Lost{id, silent};
    // Evidence since its last sign of life, and its port's refusal after the first of it.
    const bool cut_off = w.cut_off && *w.cut_off > w.last_seen;
    const bool suspected = w.suspected && w.suspected->first > w.last_seen;
    if (w.refused && (cut_off || suspected)) {
      const Clock::time_point first = cut_off && suspected ? std::min(*w.cut_off, w.suspected->first)
                                      : cut_off            ? *w.cut_off
                                                           : w.suspected->first;
      if (first <= *w.refused) {
        Lost lost{id, seconds(now - first), cut_off ? kCutOff : w.suspected->second};
        if (cut_off && suspected) lost.also_reporter = w.suspected->second;
        lost.refused = true;
        return lost;
      }
    }
    if (w.cut_off && w.suspected && w.last_seen < std::min(*w.cut_off, w.suspected->first)) {
      const double since = seconds(now - std::max(*w.cut_off, w.suspected->first));
      if (since > cut_off_silent_s_ / 5) return Lost{id, since, kCutOff, w.suspected->second};
    }
    if (w.cut_off) {
      const double since = seconds(now - std::max(w.last_seen, *w.cut_off));
      if (since > cut_off_silent_s_) return Lost{id, since, kCutOff};
    }
    if (!w.suspected) continue;
    const double since = seconds(now - std::max(w.last_seen, w.suspected->first));
    if (since > suspect_silent_s_) return Lost{id, since, w.suspected->second};
  }
  return std::nullopt;
}

std::map<int, proto::RegisterRequest> Membership::registrations() const {
  std::map<int, proto::RegisterRequest> r;
  for (const auto& [id, w] : workers_)
    if (!w.lost) r[id] = w.reg;
  return r;
}

std::vector<int> Membership::Unfilled() const {
  std::vector<int> free;
  for (int id = 0; id < expected_; ++id)
    if (!workers_.count(id)) free.push_back(id);
  return free;
}

std::vector<proto::WorkerRecord> Membership::Records() const {
  std::vector<proto::WorkerRecord> out;
  for (const auto& [id, w] : workers_) {
    proto::WorkerRecord& r = out.emplace_back();
    r.set_id(id);
    *r.mutable_registration() = w.reg;
    if (w.profile) *r.mutable_profile() = *w.profile;
    r.set_lost(w.lost);
  }
  return out;
}

void Membership::Restore(const proto::WorkerRecord& record, Clock::time_point now) {
  Worker& w = workers_[record.id()] = Worker();
  w.reg = record.registration();
  w.last_seen = now;
  if (record.has_profile()) w.profile = record.profile();
  w.lost = record.lost();
  ++changes_;
}

std::map<int, TraceFile> Membership::timelines() const {
  std::map<int, TraceFile> t;
  for (const auto& [id, w] : workers_)
    if (!w.timeline.path.empty()) t[id] = w.timeline;
  return t;
}

}  // namespace longhaul
