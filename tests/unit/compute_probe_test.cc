// The compute probe times one block and the head of the job's micro-batch on the CPU backend, each
// time positive and finite (how they compare is left to the printout: on a shared machine a busy
// neighbour once made a block 6x slower than the same block a moment before); a model whose one
// block cannot fit this machine is refused before anything is built.
#include "worker/compute_probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "absl/status/statusor.h"

namespace longhaul {
namespace {

JobConfig Config(const std::vector<std::string>& overrides) {
  auto c = ParseJobConfig("[model]\nn_layer = 2\nd_model = 64\nn_head = 4\nmax_seq_len = 32\n[train]\nseq_len = 32\n"
                          "micro_batch_size = 4\n",
                          "job.toml", overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(ComputeProbe, TimesABlockAndTheHeadOnTheCpu) {
  for (int vocab : {256, 8192}) {
    const absl::StatusOr<proto::ComputeProfile> p = MeasureCompute(Config({"model.vocab_size=" + std::to_string(vocab)}), -1);
    ASSERT_TRUE(p.ok()) << p.status();
    std::cout << "vocabulary " << vocab << ": block " << p->block_forward_s() * 1e3 << " + "
              << p->block_backward_s() * 1e3 << " ms, head " << p->head_forward_s() * 1e3 << " + "
              << p->head_backward_s() * 1e3 << " ms\n";
    for (double t : {p->block_forward_s(), p->block_backward_s(), p->head_forward_s(), p->head_backward_s()}) {
      EXPECT_TRUE(std::isfinite(t));
      EXPECT_GT(t, 0);
      EXPECT_LT(t, 10);
    }
  }
}

TEST(ComputeProbe, ABlockTooBigForThisMachineIsRefusedBeforeItIsBuilt) {
  const absl::StatusOr<proto::ComputeProfile> p = MeasureCompute(Config({"model.d_model=65536", "model.n_head=16"}), -1);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  EXPECT_NE(p.status().message().find("timing one block and the head"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace longhaul
