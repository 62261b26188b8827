// Who is in the job: admission refuses another protocol, another job and a full job with the fix
// named; ids follow registration order unless a launcher asks for slots; a worker silent past the
// limit is named with its silence, a finished one never is.
#include "coordinator/membership.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "transport/identity.h"
#include "transport/tensor_transport.h"

namespace longhaul {
namespace {

using Clock = Membership::Clock;

proto::RegisterRequest Request(const std::string& job, uint32_t version = kProtocolVersion) {
  proto::RegisterRequest r;
  r.set_job_id(job);
  r.set_protocol_version(version);
  r.set_address("127.0.0.1:1");
  r.set_public_key(std::string(kPublicKeyBytes, 'k'));
  return r;
}

// Three workers registered at t0; a silence of 20 s loses a worker, 2 s a suspected one, 0.5 s one
// cut off. at(s) is s seconds after t0.
class ThreeWorkers : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  }
  Clock::time_point at(double s) const { return t0 + std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

  Membership m{"job", 3, 0, 20, 2, 0.5};
  const Clock::time_point t0 = Clock::now();
};

TEST(Membership, AdmitsInOrderAndRefusesStrangersAndLatecomers) {
  Membership m("job", 2, 0, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  auto wrong_version = m.Register(Request("job", kProtocolVersion + 1), t0);
  EXPECT_EQ(wrong_version.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_version.status().message().find("run the same longhaul build everywhere"), std::string::npos);
  auto wrong_job = m.Register(Request("other"), t0);
  EXPECT_EQ(wrong_job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_job.status().message().find("job 'other'"), std::string::npos);
  proto::RegisterRequest keyless = Request("job");
  keyless.clear_public_key();
  const absl::Status no_key = m.Register(keyless, t0).status();
  EXPECT_EQ(no_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_key.message().find("public key of 0 bytes (an Ed25519 key has 32): run the same longhaul build"),
            std::string::npos)
      << no_key;
  EXPECT_EQ(*m.Register(Request("job"), t0), 0);
  EXPECT_FALSE(m.full());
  EXPECT_EQ(*m.Register(Request(""), t0), 1);  // a worker that names no job joins any
  EXPECT_TRUE(m.full());
  EXPECT_EQ(m.Register(Request("job"), t0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m.registrations().size(), 2u);
  EXPECT_TRUE(m.Check(1).ok());
  EXPECT_EQ(m.Check(2).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.Check(-1).code(), absl::StatusCode::kNotFound);
}

// What a registration carries is kept for the job's life and sent again in every plan: sizes are
// bounded and the tensor address must be host:port.
TEST(Membership, ARegistrationsTextIsBoundedAndItsAddressHostAndPort) {
  Membership m("job", 2, 0, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  struct Bad {
    proto::RegisterRequest req;
    const char* says;
  };
  std::vector<Bad> bad(4, {Request("job"), ""});
  bad[0].req.set_address("127.0.0.1:" + std::string(4 << 20, '1'));
  bad[0].says = "a worker's address of 4194314 bytes (at most 255)";
  bad[1].req.set_host(std::string(1000, 'h'));
  bad[1].says = "a worker's host of 1000 bytes";
  bad[2].req.set_backend(std::string(300, 'b'));
  bad[2].says = "a worker's backend of 300 bytes";
  bad[3].req.set_address("nowhere");
  bad[3].says = "a worker's tensor address 'nowhere' is not host:port";
  for (const Bad& b : bad) {
    const absl::StatusOr<int> id = m.Register(b.req, t0);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << b.says;
    EXPECT_NE(id.status().message().find(b.says), std::string::npos) << id.status();
  }
  EXPECT_EQ(m.registrations().size(), 0u);
}

TEST(Membership, ALauncherMayPlaceWorkersInSlots) {
  Membership m("job", 3, 0, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  proto::RegisterRequest r = Request("job");
  r.set_slot(2);
  EXPECT_EQ(*m.Register(r, t0), 2);
  EXPECT_EQ(m.Register(r, t0).status().code(), absl::StatusCode::kAlreadyExists);
  r.set_slot(3);
  auto out = m.Register(r, t0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("slots 0 to 2"), std::string::npos) << out.status();
  EXPECT_EQ(m.Unfilled(), (std::vector<int>{0, 1}));
  EXPECT_EQ(*m.Register(Request("job"), t0), 0);  // the lowest free slot
  EXPECT_EQ(*m.Register(Request("job"), t0), 1);
  EXPECT_TRUE(m.full());
  EXPECT_TRUE(m.Unfilled().empty());
}

TEST(Membership, ThePlanWaitsForSaneProfilesFromEveryWorker) {
  Membership m("job", 2, 0, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  for (double bad : {-1.0, std::nan(""), 1e9}) {
    proto::ComputeProfile c;
    c.set_head_backward_s(bad);
    const absl::Status st = m.SetProfile(1, c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("compute time"), std::string::npos) << st;
  }
  for (double bad : {-1.0, std::nan(""), 1e17}) {
    proto::ComputeProfile c;
    c.set_memory_bytes(bad);
    const absl::Status st = m.SetProfile(1, c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("bytes of memory"), std::string::npos) << st;
  }
  proto::ComputeProfile ok;
  ok.set_block_forward_s(0.01);
  ASSERT_TRUE(m.SetProfile(0, ok).ok());
  EXPECT_FALSE(m.profiled());
  ASSERT_TRUE(m.SetProfile(1, ok).ok());
  EXPECT_TRUE(m.profiled());
  EXPECT_EQ(m.profile(1).block_forward_s(), 0.01);
}

proto::LinkReport Links(int from, std::vector<std::tuple<int, double, double>> links) {
  proto::LinkReport r;
  r.set_worker_id(from);
  for (auto [to, rtt, rate] : links) {
    proto::LinkMeasurement* m = r.add_links();
    m->set_to_worker(to);
    m->set_round_trip_s(rtt);
    m->set_bytes_per_s(rate);
  }
  return r;
}

TEST(Membership, LinkReportsCoverEveryWorkerAtAnotherAddressWithSaneFigures) {
  Membership m("job", 3, 0, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  for (const char* address : {"10.0.0.1:7071", "10.0.0.2:7071", "10.0.0.2:7072"}) {
    proto::RegisterRequest r = Request("job");
    r.set_address(address);
    ASSERT_TRUE(m.Register(r, t0).ok());
  }
  EXPECT_TRUE(m.SameHost(1, 2));
  struct Bad {
    proto::LinkReport report;
    const char* says;
  };
  std::vector<Bad> bad = {
      {Links(0, {{1, 0.1, 1e8}}), "no link to worker 2, which is at another address"},
      {Links(0, {{1, 0.1, 1e8}, {1, 0.1, 1e8}}), "twice"},
      {Links(0, {{0, 0.1, 1e8}, {1, 0.1, 1e8}, {2, 0.1, 1e8}}), "itself"},
      {Links(0, {{1, 0.1, 1e8}, {7, 0.1, 1e8}}), "no such worker"},
      {Links(0, {{1, -0.1, 1e8}, {2, 0.1, 1e8}}), "round trips must be positive"},
      {Links(0, {{1, 0.1, std::nan("")}, {2, 0.1, 1e8}}), "rates positive and finite"},
      {Links(0, {{1, 0.1, 1e8}, {2, 1e5, 1e8}}), "under an hour"},
  };
  proto::LinkReport negative_card = Links(0, {{1, 0.1, 1e8}, {2, 0.1, 1e8}}), nan_card = negative_card;
  negative_card.set_egress_bytes_per_s(-1);
  nan_card.set_egress_bytes_per_s(std::nan(""));
  bad.push_back({negative_card, "reports an egress of -1 bytes/s"});
  bad.push_back({nan_card, "must be 0 (no card seen) or positive and finite"});
  for (const Bad& b : bad) {
    const absl::Status st = m.SetLinks(b.report.worker_id(), b.report);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << b.says;
    EXPECT_NE(st.message().find(b.says), std::string::npos) << st;
  }
  EXPECT_FALSE(m.linked());
  proto::LinkReport carded = Links(0, {{1, 0.1, 1e8}, {2, 0.2, 2e8}});
  carded.set_egress_bytes_per_s(1.5e8);
  ASSERT_TRUE(m.SetLinks(0, carded).ok());
  EXPECT_EQ(m.egress(0), 1.5e8);
  ASSERT_TRUE(m.SetLinks(1, Links(1, {{0, 0.1, 1e8}, {2, 0.05, 1e9}})).ok()) << "a dial map may route to a neighbour";
  EXPECT_FALSE(m.linked());
  ASSERT_TRUE(m.SetLinks(2, Links(2, {{0, 0.3, 3e8}})).ok());
  EXPECT_TRUE(m.linked());
  EXPECT_EQ(m.link(0, 2)->bytes_per_s(), 2e8);
  EXPECT_FALSE(m.link(2, 1).has_value()) << "workers at one address need report no link between them";
  EXPECT_EQ(m.link(1, 2)->round_trip_s(), 0.05);
}

// The barrier between the link probes' phases: links all at once from every worker release the
// cards' probes, and the plan waits for the reports that follow them.
TEST(Membership, LinksAllAtOnceReleaseTheCardProbesAndTheirReportsTheLinks) {
  Membership m("job", 2, 0, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  for (const char* address : {"10.0.0.1:7071", "10.0.0.2:7071"}) {
    proto::RegisterRequest r = Request("job");
    r.set_address(address);
    ASSERT_TRUE(m.Register(r, t0).ok());
  }
  proto::LinkReport first = Links(0, {{1, 0.1, 1e8}});
  first.set_card_to_come(true);
  ASSERT_TRUE(m.SetLinks(0, first).ok());
  EXPECT_FALSE(m.links_measured()) << "worker 1 has reported nothing";
  ASSERT_TRUE(m.SetLinks(1, Links(1, {{0, 0.1, 1e8}})).ok());
  EXPECT_TRUE(m.links_measured());
  EXPECT_FALSE(m.linked()) << "worker 0's card probe is still to come";
  proto::LinkReport after = Links(0, {{1, 0.1, 3e8}});
  after.set_egress_bytes_per_s(2e8);
  ASSERT_TRUE(m.SetLinks(0, after).ok());
  EXPECT_TRUE(m.linked());
  EXPECT_EQ(m.link(0, 1)->bytes_per_s(), 3e8) << "the second report replaces the first";
  EXPECT_EQ(m.egress(0), 2e8);
}

TEST(Membership, TheSilentAreNamedAndTheFinishedAreNot) {
  Membership m("job", 2, 0, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  EXPECT_FALSE(m.Silent(t0 + std::chrono::seconds(4)).has_value());
  m.Heard(0, t0 + std::chrono::seconds(4));
  const auto silent = m.Silent(t0 + std::chrono::seconds(6));
  ASSERT_TRUE(silent.has_value());
  EXPECT_EQ(silent->id, 1);
  EXPECT_NEAR(silent->silent_s, 6, 1e-6);
  EXPECT_EQ(silent->reporter, -1) << "nobody suspected it: its silence alone";
  m.Done(1, {"/tmp/w1.json", 120, 7});
  EXPECT_FALSE(m.Silent(t0 + std::chrono::seconds(6)).has_value());
  EXPECT_EQ(m.done(), 1);
  EXPECT_EQ(m.timelines(), (std::map<int, TraceFile>{{1, {"/tmp/w1.json", 120, 7}}}));
  EXPECT_TRUE(m.Silent(t0 + std::chrono::seconds(10)).has_value());  // worker 0, heard at 4 s
}

// A worker another saw leave (a connection from it closed) is dead after the shorter silence, counted
// from the suspicion, or from a heartbeat after it: a slow worker keeps its heartbeats and lives.
TEST_F(ThreeWorkers, ASuspectIsLostAfterAShortSilenceUnlessItIsHeardFrom) {
  for (int i = 0; i < 3; ++i) m.Heard(i, at(9));
  m.Suspect(2, 0, at(10));
  m.Suspect(1, 0, at(10));
  m.Suspect(2, 1, at(11));  // the first suspicion stands
  EXPECT_FALSE(m.Silent(at(11.9)).has_value());
  for (double t = 10.5; t < 16; t += 1) m.Heard(1, at(t));  // slow, not dead
  const auto lost = m.Silent(at(12.1));
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->id, 2);
  EXPECT_EQ(lost->reporter, 0);
  EXPECT_NEAR(lost->silent_s, 2.1, 1e-6);
  m.Done(2, {});
  EXPECT_FALSE(m.Silent(at(16)).has_value()) << "worker 1 heard at 15.5 s; worker 2 finished";
  const auto late = m.Silent(at(17.6));
  ASSERT_TRUE(late.has_value()) << "worker 1 silent since 15.5 s, suspected";
  EXPECT_EQ(late->id, 1);
}

// Spares register beyond the plan's workers up to cluster.spares; a lost worker leaves every count
// and check, its id is never given again (a late message of the lost process cannot pass for its
// successor's), and the job state file's records bring the same members back.
TEST(Membership, SparesWaitBeyondThePlanAndALostWorkersIdIsNeverGivenAgain) {
  Membership m("job", 2, 1, 5, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*m.Register(Request("job"), t0), i);
  const absl::Status full = m.Register(Request("job"), t0).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("cluster.spares"), std::string::npos) << full;
  EXPECT_TRUE(m.full());
  proto::ComputeProfile profile;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(m.SetProfile(i, profile).ok());
  EXPECT_TRUE(m.profiled()) << "the spare's profile is not needed for the first plan";
  EXPECT_FALSE(m.HasProfile(2));

  m.Lose(1);
  EXPECT_EQ(m.registered(), 2);
  const absl::Status lost = m.Check(1);
  EXPECT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lost.message().find("declared lost"), std::string::npos) << lost;
  EXPECT_EQ(m.registrations().count(1), 0u);
  EXPECT_FALSE(m.Silent(t0 + std::chrono::seconds(4)).has_value());
  EXPECT_EQ(*m.Register(Request("job"), t0), 3) << "id 1 is the lost worker's";

  Membership again("job", 2, 1, 5, 2, 0.5);
  for (const proto::WorkerRecord& r : m.Records()) again.Restore(r, t0);
  EXPECT_EQ(again.registered(), 3);
  EXPECT_EQ(again.Check(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(again.HasProfile(0));
  EXPECT_EQ(again.Register(Request("job"), t0).status().code(), absl::StatusCode::kResourceExhausted)
      << "two workers and a spare again";
}

// A worker whose lifeline to the coordinator closed is lost after the shortest silence, counted
// from the close or from a heartbeat after it; one that reconnects is not.
TEST(Membership, AWorkerCutOffIsLostAfterAHalfSecondOfSilenceUnlessItReconnects) {
  Membership m("job", 2, 0, 20, 2, 0.5);
  const Clock::time_point t0 = Clock::now();
  auto at = [&](double s) { return t0 + std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  m.CutOff(0, at(1));
  m.CutOff(1, at(1));
  m.Heard(1, at(1.3));
  m.Reconnected(1);
  EXPECT_FALSE(m.Silent(at(1.4)).has_value());
  const auto lost = m.Silent(at(1.6));
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->id, 0);
  EXPECT_EQ(lost->reporter, Membership::kCutOff);
  m.Lose(0);
  EXPECT_FALSE(m.Silent(at(5)).has_value()) << "worker 1 reconnected: only dead_after_s loses it";
}

// A closed lifeline and a closed connection to a peer, with no heartbeat or reconnect since either,
// are a process that ended: lost a fifth of the cut-off's grace (here 0.1 s) after the later of
// the two, whichever came first. Either alone, or a heartbeat after them, is not enough; a
// suspicion a heartbeat answered gives way to a later one.
TEST_F(ThreeWorkers, ACutOffWorkerThatAPeerSawLeaveIsLostAtOnce) {
  for (int i = 0; i < 3; ++i) m.Heard(i, at(1));
  m.Suspect(0, 1, at(2));  // a plan version's change closes connections of live workers
  m.Heard(0, at(2.5));
  m.CutOff(0, at(3));
  EXPECT_FALSE(m.Silent(at(3.01)).has_value()) << "the suspicion was answered by a heartbeat";
  m.Suspect(0, 2, at(3.005));
  EXPECT_FALSE(m.Silent(at(3.1)).has_value()) << "within the time a live worker needs to reconnect";
  const auto lost = m.Silent(at(3.2));
  ASSERT_TRUE(lost.has_value()) << "a fresh suspicion after the heartbeat, and the lifeline closed";
  EXPECT_EQ(lost->id, 0);
  EXPECT_EQ(lost->reporter, Membership::kCutOff);
  EXPECT_EQ(lost->also_reporter, 2);
  EXPECT_NEAR(lost->silent_s, 0.195, 1e-6);
  m.Lose(0);

  m.Suspect(1, 2, at(4));
  EXPECT_FALSE(m.Silent(at(4.2)).has_value()) << "suspected alone: suspect_silent_s applies";
  m.CutOff(1, at(4.1));
  const auto both = m.Silent(at(4.25));
  ASSERT_TRUE(both.has_value()) << "suspected first, cut off after";
  EXPECT_EQ(both->id, 1);
  EXPECT_EQ(both->also_reporter, 2);
  m.Lose(1);

  m.CutOff(2, at(5));
  m.Heard(2, at(5.1));
  m.Suspect(2, 1, at(5.2));
  EXPECT_FALSE(m.Silent(at(5.35)).has_value()) << "heard after its lifeline closed: the cut-off's grace applies";
  m.Reconnected(2);
  m.Suspect(2, 0, at(5.5));
  EXPECT_FALSE(m.Silent(at(5.9)).has_value()) << "its lifeline is held again";
}

// A refusal at the worker's tensor port after a closed lifeline or a peer's report, with no heartbeat
// since the evidence, is a process that ended: lost at once, with the silence counted from the
// first evidence. Before any evidence, or answered by a heartbeat, it is not enough.
TEST_F(ThreeWorkers, AWorkerWhosePortRefusesAfterItsLifelineOrAPeerSawItGoIsLostAtOnce) {
  for (int i = 0; i < 3; ++i) m.Heard(i, at(1)), m.Reachable(i);

  m.Refused(0, at(1.5));
  m.CutOff(0, at(2));
  EXPECT_FALSE(m.Silent(at(2.01)).has_value()) << "refused before the evidence: a probe of an earlier question";
  m.Refused(0, at(2.004));
  const auto cut = m.Silent(at(2.005));
  ASSERT_TRUE(cut.has_value()) << "lifeline closed, then the port refused";
  EXPECT_EQ(cut->id, 0);
  EXPECT_EQ(cut->reporter, Membership::kCutOff);
  EXPECT_EQ(cut->also_reporter, -1);
  EXPECT_TRUE(cut->refused);
  EXPECT_NEAR(cut->silent_s, 0.005, 1e-6);
  m.Lose(0);

  m.Suspect(1, 2, at(3));
  m.Refused(1, at(3.002));
  const auto seen = m.Silent(at(3.003));
  ASSERT_TRUE(seen.has_value()) << "a peer saw it go, then the port refused";
  EXPECT_EQ(seen->reporter, 2);
  EXPECT_TRUE(seen->refused);
  m.Lose(1);

  m.CutOff(2, at(4));
  m.Refused(2, at(4.001));
  m.Heard(2, at(4.002));
  EXPECT_FALSE(m.Silent(at(4.003)).has_value()) << "a heartbeat after the refusal: something else answers there";
}

}  // namespace
}  // namespace longhaul
