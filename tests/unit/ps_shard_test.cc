// A parameter-server shard sums replicas' gradients in replica order; gradients that come out of
// order or with the wrong size (they arrive over the network) are errors, in Release builds too.
#include "ps/ps_shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace longhaul {
namespace {

ModelConfig Model() {
  ModelConfig m;
  m.vocab_size = 8, m.max_seq_len = 4, m.n_layer = 2, m.n_head = 1, m.d_model = 4;
  return m;
}

TEST(PsShard, AveragesReplicasInOrder) {
  const ModelConfig m = Model();
  const ParamLayout layout(m, StageSpec::Whole(m));
  HostPsShard shard(AdamWConfig{}, layout, 0, 0, 0, 3, 2);
  ASSERT_TRUE(shard.AddReplicaGradient(0, std::vector<float>(shard.size(), 1.0f)).ok());
  ASSERT_TRUE(shard.AddReplicaGradient(1, std::vector<float>(shard.size(), 3.0f)).ok());
  auto norm = shard.AveragedSquaredNorm();
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_DOUBLE_EQ(*norm, 4.0 * shard.size());  // every element averages to 2
}

TEST(PsShard, WrongOrderOrSizeIsAnErrorNotAnAssert) {
  const ModelConfig m = Model();
  const ParamLayout layout(m, StageSpec::Whole(m));
  HostPsShard shard(AdamWConfig{}, layout, 1, 2, 0, 3, 2);
  absl::Status s = shard.AddReplicaGradient(1, std::vector<float>(shard.size()));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("stage 1 shard 2: replica 1's gradient came where replica 0's was due"),
            std::string::npos)
      << s;
  s = shard.AddReplicaGradient(0, std::vector<float>(shard.size() + 5));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(absl::StrCat("replica 0 pushed ", shard.size() + 5, " gradient values, the shard holds ",
                                          shard.size())),
            std::string::npos)
      << s;
  ASSERT_TRUE(shard.AddReplicaGradient(0, std::vector<float>(shard.size())).ok());
  EXPECT_EQ(shard.AveragedSquaredNorm().status().code(), absl::StatusCode::kFailedPrecondition)
      << "replica 1 is still missing";
}

TEST(PsShard, StateRoundTripsAndANewRunStartsWithZeroMoments) {
  const ModelConfig m = Model();
  const ParamLayout layout(m, StageSpec::Whole(m));
  HostPsShard shard(AdamWConfig{}, layout, 0, 0, 0, 3, 1);
  const size_t n = shard.size();
  std::vector<float> p(n), mm(n), v(n);
  for (size_t i = 0; i < n; ++i) p[i] = 0.5f + i, mm[i] = 0.25f * i, v[i] = 1.0f + i;
  ASSERT_TRUE(shard.SetState(p.data(), mm.data(), v.data()).ok());
  std::vector<float> gp(n), gm(n), gv(n);
  ASSERT_TRUE(shard.GetState(gp.data(), gm.data(), gv.data()).ok());
  EXPECT_EQ(gp, p);
  EXPECT_EQ(gm, mm);
  EXPECT_EQ(gv, v);
  EXPECT_EQ(std::vector<float>(*shard.Params(), *shard.Params() + n), p);
  ASSERT_TRUE(shard.SetState(p.data(), nullptr, nullptr).ok());
  ASSERT_TRUE(shard.GetState(gp.data(), gm.data(), gv.data()).ok());
  EXPECT_EQ(gm, std::vector<float>(n, 0.0f));
  EXPECT_EQ(gv, std::vector<float>(n, 0.0f));
  // A step with a gradient that is not finite leaves the parameters alone.
  ASSERT_TRUE(shard.AddReplicaGradient(0, std::vector<float>(n, NAN)).ok());
  ASSERT_TRUE(shard.AveragedSquaredNorm().ok());
  auto r = shard.Step(LrSchedule{1e-2f, 1e-3f, 0, 10}, 1.0f, 0, NAN);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::vector<float>(*shard.Params(), *shard.Params() + n), p);
}

}  // namespace
}  // namespace longhaul
