// A parameter-server shard sums replicas' gradients in replica order; gradients that come out of
// order or with the wrong size (they arrive over the network) are errors, in Release builds too.
#include "ps/ps_shard.h"

#include <gtest/gtest.h>

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
  PsShard shard(AdamWConfig{}, layout, 0, 0, 0, 3, 2);
  ASSERT_TRUE(shard.AddReplicaGradient(0, std::vector<float>(shard.size(), 1.0f)).ok());
  ASSERT_TRUE(shard.AddReplicaGradient(1, std::vector<float>(shard.size(), 3.0f)).ok());
  auto norm = shard.AveragedSquaredNorm();
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_DOUBLE_EQ(*norm, 4.0 * shard.size());  // every element averages to 2
}

TEST(PsShard, WrongOrderOrSizeIsAnErrorNotAnAssert) {
  const ModelConfig m = Model();
  const ParamLayout layout(m, StageSpec::Whole(m));
  PsShard shard(AdamWConfig{}, layout, 1, 2, 0, 3, 2);
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

}  // namespace
}  // namespace longhaul
