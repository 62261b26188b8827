// End-to-end training in one process: learning reaches the entropy floor of the built-in corpus,
// and an interrupted run resumed from its checkpoint reproduces the uninterrupted one bitwise.
#include "worker/local_trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace longhaul {
namespace {
namespace fs = std::filesystem;

std::string OutDir(const char* name) {
  fs::path d = fs::path(::testing::TempDir()) / (std::string(name) + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

JobConfig Config(const std::string& toml, const std::vector<std::string>& overrides) {
  auto c = ParseJobConfig(toml, "test.toml", overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

constexpr char kSmall[] = R"(
[model]
n_layer = 2
d_model = 64
n_head = 4
max_seq_len = 32
[data]
alphabet = 12
order = 2
branching = 3
train_tokens = 400000
[train]
seq_len = 32
micro_batch_size = 16
micro_batches = 2
lr = 1e-2
min_lr = 1e-3
warmup_steps = 20
weight_decay = 0.0
log_every = 50
eval_every = 0
threads = 2
)";

TEST(LocalTrainer, LossReachesTheEntropyFloor) {
  JobConfig cfg = Config(kSmall, {"train.steps=400", "train.eval_every=400", "train.eval_batches=16",
                                  "train.out_dir=" + OutDir("converge")});
  auto t = LocalTrainer::Create(cfg);
  ASSERT_TRUE(t.ok()) << t.status();
  std::ostringstream log;
  ASSERT_TRUE((*t)->Run(log).ok()) << log.str();
  const MetricsRow& last = (*t)->history().back();
  ASSERT_GT(last.floor, 0);
  // Starting from ln(256) = 5.5 nats, the validation loss (16 micro-batches, 8192 targets) must end
  // within 0.08 nats of what a perfect model of the source scores.
  EXPECT_LT(last.val_loss, last.floor + 0.08) << log.str();
  EXPECT_GT(last.val_loss, last.floor - 0.05) << "below the floor: the floor or the loss is wrong";
  EXPECT_LT((*t)->history().front().loss, 6.0);
  EXPECT_TRUE(fs::exists(fs::path(cfg.train.out_dir) / "loss.svg"));
  EXPECT_TRUE(fs::exists(fs::path(cfg.train.out_dir) / "metrics.csv"));
}

TEST(LocalTrainer, ResumeReproducesTheUninterruptedRunBitwise) {
  const std::vector<std::string> common = {"train.steps=8", "train.micro_batch_size=4", "train.log_every=1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return Config(kSmall, extra);
  };
  std::ostringstream log;
  const std::string full_dir = OutDir("full"), split_dir = OutDir("split");
  auto full = LocalTrainer::Create(with({"train.out_dir=" + full_dir}));
  ASSERT_TRUE(full.ok());
  ASSERT_TRUE((*full)->Run(log).ok());

  auto first = LocalTrainer::Create(with({"train.out_dir=" + split_dir}));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Run(log, 4).ok());
  EXPECT_EQ((*first)->step(), 4);
  const std::string csv = (fs::path(split_dir) / "metrics.csv").string();
  auto first_rows = ReadMetrics(csv);
  ASSERT_TRUE(first_rows.ok()) << first_rows.status();
  ASSERT_EQ(first_rows->size(), 4u);

  auto second = LocalTrainer::Create(with({"train.out_dir=" + split_dir, "train.resume=true"}));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->step(), 4);
  ASSERT_TRUE((*second)->Run(log).ok());

  const auto& a = (*full)->history();
  const auto& b = (*second)->history();  // steps 1-4 read back from metrics.csv, 5-8 trained
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 4; i < 8; ++i) EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
  // Steps 1-4 come back from metrics.csv (6 significant digits) field by field.
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(b[i].loss, a[i].loss, 1e-5) << "step " << i + 1;
    EXPECT_NEAR(b[i].lr, a[i].lr, 1e-5 * a[i].lr) << "step " << i + 1;
    EXPECT_NEAR(b[i].grad_norm, a[i].grad_norm, 1e-5) << "step " << i + 1;
    EXPECT_FALSE(b[i].skipped);
  }
  // metrics.csv holds the whole history: the first run's rows as it wrote them, then the resumed
  // run's, each with the columns of one schema.
  auto rows = ReadMetrics(csv);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ((*rows)[i].step, static_cast<int64_t>(i + 1));
    EXPECT_GT((*rows)[i].tokens_per_s, 0) << "step " << i + 1;
    EXPECT_NEAR((*rows)[i].loss, a[i].loss, 1e-6) << "step " << i + 1;
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ((*rows)[i], (*first_rows)[i]) << "step " << i + 1;
  auto sa = (*full)->GetState();
  auto sb = (*second)->GetState();
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sa->params, sb->params);
  EXPECT_EQ(sa->m, sb->m);
  EXPECT_EQ(sa->v, sb->v);
}

TEST(LocalTrainer, ResumeRefusesADifferentConfig) {
  const std::string dir = OutDir("mismatch");
  std::ostringstream log;
  auto t = LocalTrainer::Create(Config(kSmall, {"train.steps=2", "train.out_dir=" + dir}));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Run(log).ok());
  auto other = LocalTrainer::Create(
      Config(kSmall, {"train.steps=4", "train.out_dir=" + dir, "train.resume=true", "train.seed=9"}));
  EXPECT_NE(other.status().message().find("train.seed"), std::string::npos) << other.status();
}

TEST(LocalTrainer, ResumeOverAMalformedMetricsFileIsAClearError) {
  const std::string dir = OutDir("malformed_metrics");
  std::ostringstream log;
  auto t = LocalTrainer::Create(Config(kSmall, {"train.steps=6", "train.out_dir=" + dir}));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Run(log, /*stop_at=*/3).ok());
  const std::string csv = (fs::path(dir) / "metrics.csv").string();
  std::ofstream(csv, std::ios::app) << "4,not a loss,,,,,,,0\n";
  auto resumed = LocalTrainer::Create(Config(kSmall, {"train.steps=6", "train.out_dir=" + dir, "train.resume=true"}));
  ASSERT_FALSE(resumed.ok());
  EXPECT_NE(resumed.status().message().find(csv + " line 5: 'not a loss' is not a value of column loss"),
            std::string::npos)
      << resumed.status();
}

TEST(LocalTrainer, FileThatIsNotATokenShardIsRefused) {
  auto t = LocalTrainer::Create(
      Config("[data]\nsource = \"llmc\"\npath = \"" + std::string(LONGHAUL_FIXTURES) + "/*.safetensors\"\n", {}));
  EXPECT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("magic"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace longhaul
