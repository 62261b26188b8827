#include "config/job_config.h"

#include <gtest/gtest.h>

namespace longhaul {
namespace {

std::string Error(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  auto c = ParseJobConfig(toml, "job.toml", overrides);
  EXPECT_FALSE(c.ok()) << toml;
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(JobConfig, DefaultsAndValues) {
  auto c = ParseJobConfig("[model]\nd_model = 64\nn_head = 2\nattention = \"prefix_lm\"\n[train]\nlr = 1e-3\nmin_lr = 0\n",
                          "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.d_model, 64);
  EXPECT_EQ(c->model.attention, AttentionMask::kPrefixLm);
  EXPECT_EQ(c->train.seq_len, 64);
  EXPECT_FLOAT_EQ(c->train.lr, 1e-3f);
  EXPECT_EQ(c->data.source, DataSource::kBuiltin);
  EXPECT_EQ(c->as_json["model"]["attention"], "prefix_lm");
}

TEST(JobConfig, OverridesApplyOnTop) {
  auto c = ParseJobConfig("[train]\nsteps = 5\n", "job.toml", {"train.steps=7", "train.out_dir=/tmp/x", "model.tied_head=true"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.steps, 7);
  EXPECT_EQ(c->train.out_dir, "/tmp/x");
  EXPECT_TRUE(c->model.tied_head);
  EXPECT_NE(Error("", {"steps=3"}).find("section.key=value"), std::string::npos);
}

TEST(JobConfig, LlmcDefaultsToGpt2Vocabulary) {
  auto c = ParseJobConfig("[data]\nsource = \"llmc\"\npath = \"x*.bin\"\n", "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.vocab_size, 50257);
}

TEST(JobConfig, EachMistakeGetsOneClearMessage) {
  EXPECT_NE(Error("[model]\nd_model = 100\nn_head = 3\n").find("d_model = 100 is not divisible by model.n_head = 3"),
            std::string::npos);
  EXPECT_NE(Error("[model]\nmax_seq_len = 32\n[train]\nseq_len = 64\n").find("longer than the position table"),
            std::string::npos);
  EXPECT_NE(Error("[train]\nlrr = 1\n").find("unknown key train.lrr"), std::string::npos);
  EXPECT_NE(Error("[trian]\n").find("unknown section [trian]"), std::string::npos);
  EXPECT_NE(Error("[train]\nsteps = \"many\"\n").find("train.steps must be an integer"), std::string::npos);
  EXPECT_NE(Error("[model]\nattention = \"sliding\"\n").find("use \"causal\" or \"prefix_lm\""), std::string::npos);
  EXPECT_NE(Error("[data]\nsource = \"bytes\"\n").find("data.path is required"), std::string::npos);
  EXPECT_NE(Error("[train\n").find("TOML syntax error"), std::string::npos);
  EXPECT_EQ(LoadJobConfig("/nonexistent/job.toml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace longhaul
