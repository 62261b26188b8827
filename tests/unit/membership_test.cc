// Who is in the job: admission refuses another protocol, another job and a full job with the fix
// named; ids follow registration order unless a launcher asks for slots; a worker silent past the
// limit is named with its silence, a finished one never is.
#include "coordinator/membership.h"

#include <gtest/gtest.h>

#include <cmath>

#include "transport/tensor_transport.h"

namespace longhaul {
namespace {

using Clock = Membership::Clock;

proto::RegisterRequest Request(const std::string& job, uint32_t version = kProtocolVersion) {
  proto::RegisterRequest r;
  r.set_job_id(job);
  r.set_protocol_version(version);
  r.set_address("127.0.0.1:1");
  return r;
}

TEST(Membership, AdmitsInOrderAndRefusesStrangersAndLatecomers) {
  Membership m("job", 2, 5);
  const Clock::time_point t0 = Clock::now();
  auto wrong_version = m.Register(Request("job", kProtocolVersion + 1), t0);
  EXPECT_EQ(wrong_version.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_version.status().message().find("run the same longhaul build everywhere"), std::string::npos);
  auto wrong_job = m.Register(Request("other"), t0);
  EXPECT_EQ(wrong_job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_job.status().message().find("job 'other'"), std::string::npos);
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

TEST(Membership, ALauncherMayPlaceWorkersInSlots) {
  Membership m("job", 3, 5);
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
  Membership m("job", 2, 5);
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
  proto::ComputeProfile ok;
  ok.set_block_forward_s(0.01);
  ASSERT_TRUE(m.SetProfile(0, ok).ok());
  EXPECT_FALSE(m.profiled());
  ASSERT_TRUE(m.SetProfile(1, ok).ok());
  EXPECT_TRUE(m.profiled());
  EXPECT_EQ(m.profile(1).block_forward_s(), 0.01);
}

TEST(Membership, TheSilentAreNamedAndTheFinishedAreNot) {
  Membership m("job", 2, 5);
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  ASSERT_TRUE(m.Register(Request("job"), t0).ok());
  EXPECT_FALSE(m.Silent(t0 + std::chrono::seconds(4)).has_value());
  m.Heard(0, t0 + std::chrono::seconds(4));
  const auto silent = m.Silent(t0 + std::chrono::seconds(6));
  ASSERT_TRUE(silent.has_value());
  EXPECT_EQ(silent->first, 1);
  EXPECT_NEAR(silent->second, 6, 1e-6);
  m.Done(1, "/tmp/w1.json");
  EXPECT_FALSE(m.Silent(t0 + std::chrono::seconds(6)).has_value());
  EXPECT_EQ(m.done(), 1);
  EXPECT_EQ(m.timelines(), std::vector<std::string>{"/tmp/w1.json"});
  EXPECT_TRUE(m.Silent(t0 + std::chrono::seconds(10)).has_value());  // worker 0, heard at 4 s
}

}  // namespace
}  // namespace longhaul
