#include "config/job_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

// Each value a key must not take is refused naming the key, the value and what it must be.
TEST(JobConfig, ValuesOutOfRangeAreRefusedWithTheKeyAndTheFix) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train.grad_clip=-1", "train.grad_clip = -1: must be >= 0 (0 disables clipping)"},
      {"train.weight_decay=-0.1", "train.weight_decay = -0.1: must be >= 0"},
      {"train.eps=0", "train.eps = 0: must be > 0"},
      {"train.beta1=1", "train.beta1 = 1: must be in [0, 1)"},
      {"train.beta2=-0.5", "train.beta2 = -0.5: must be in [0, 1)"},
      {"train.lr=0", "train.lr = 0: must be > 0"},
      {"train.lr=nan", "train.lr = nan: must be a finite number"},
      {"train.min_lr=-1e-4", "train.min_lr = -0.0001: must be >= 0"},
      {"train.min_lr=0.1", "train.min_lr = 0.1 is above train.lr = 0.001"},
      {"train.weight_decay=2000", "would flip the sign of every decayed weight"},
      {"train.warmup_steps=-1", "train.warmup_steps = -1: must be >= 0"},
      {"train.steps=0", "train.steps = 0: must be >= 1"},
      {"train.micro_batch_size=0", "train.micro_batch_size = 0: must be >= 1"},
      {"train.micro_batches=-2", "train.micro_batches = -2: must be >= 1"},
      {"train.seq_len=0", "train.seq_len = 0: must be >= 1"},
      {"train.micro_batch_size=100000000", "train.micro_batch_size x train.seq_len = 100000000 x 64 tokens per "
                                           "micro-batch: at most 2147483647"},
      {"train.seed=-1", "train.seed = -1: must be >= 0"},
      {"train.threads=-1", "train.threads = -1: must be in [0, 1024] (0 uses every core)"},
      {"train.log_every=0", "train.log_every = 0: must be >= 1"},
      {"train.eval_every=-1", "train.eval_every = -1: must be >= 0 (0 disables evaluation)"},
      {"train.eval_batches=0", "train.eval_batches = 0: must be >= 1"},
      {"train.checkpoint_every=-5", "train.checkpoint_every = -5: must be >= 0 (0: only at the end)"},
      {"train.out_dir=\"\"", "train.out_dir must not be empty"},
      {"train.backend=cuda:99999999999", "train.backend = \"cuda:99999999999\": use \"cpu\" or \"cuda:N\""},
      {"model.d_model=1099511627776", "model.d_model = 1099511627776: must be in [-2147483648, 2147483647]"},
      {"model.vocab_size=0", "model.vocab_size = 0: must be a positive integer"},
      {"data.seed=-3", "data.seed = -3: must be >= 0"},
      {"data.alphabet=65", "data.alphabet = 65: must be in [2, 64]"},
      {"data.order=0", "data.order = 0: must be at least 1"},
      {"data.branching=0", "data.branching = 0: must be in [1, data.alphabet = 24]"},
      {"data.train_tokens=0", "data.train_tokens = 0: must be >= 1"},
      {"data.val_tokens=-1", "data.val_tokens = -1: must be >= 0"},
      {"data.val_fraction=1", "data.val_fraction = 1: must be in [0, 1)"},
      {"cluster.stages=0", "cluster.stages = 0: must be in [1, 65536]"},
      {"cluster.replicas=100000", "cluster.replicas = 100000: must be in [1, 65536]"},
      {"cluster.stage_backends=[\"cpu\", \"cuda:0\"]", "cluster.stage_backends has 2 entries for cluster.stages = 1"},
      {"cluster.stage_backends=[\"gpu\"]", "cluster.stage_backends = [..., \"gpu\", ...]: an entry = \"gpu\": use \"cpu\" or \"cuda:N\""},
      {"cluster.stage_backends=[3]", "cluster.stage_backends must be an array of strings"},
      {"cluster.heartbeat_s=0", "cluster.heartbeat_s = 0: must be in (0, 1e+07]"},
      {"cluster.dead_after_s=1e9", "cluster.dead_after_s = 1e+09: must be in (0, 1e+07]"},
      {"cluster.dead_after_s=0.5", "cluster.dead_after_s = 0.5 must be longer than cluster.heartbeat_s = 1"},
      {"cluster.stage_layers=[5000000000]", "cluster.stage_layers = 5000000000: must be in"},
      {"transport.chunk_mib=0", "transport.chunk_mib = 0: must be in [1, 16]"},
      {"transport.connections=65", "transport.connections = 65: must be in [0, 64] (0: per link, from its rate x round trip)"},
      {"transport.timeout_s=-1", "transport.timeout_s = -1: must be in (0, 86400]"},
      {"transport.timeout_s=1e9", "transport.timeout_s = 1e+09: must be in (0, 86400]"},
      {"cluster.job_id=\"" + std::string(257, 'j') + "\"", "cluster.job_id is 257 bytes; give it 1 to 256"},
      {"cluster.job_id=\"\"", "cluster.job_id is 0 bytes; give it 1 to 256"},
      {"transport.congestion_control=\"BBR!\"", "transport.congestion_control = \"BBR!\" is not a kernel congestion"},
      {"cluster.link_probe=\"sometimes\"", "cluster.link_probe = \"sometimes\": use \"auto\", \"on\" or \"off\""},
      {"cluster.communication=\"sometimes\"", "cluster.communication = \"sometimes\": use \"fixed\""},
      {"train.local_steps=0", "train.local_steps = 0: must be >= 1 (1 exchanges every iteration)"},
      {"train.outer_lr=0", "train.outer_lr = 0: must be in (0, 10]"},
      {"train.outer_momentum=1", "train.outer_momentum = 1: must be in [0, 1)"},
      {"train.overlap_outer=true", "train.overlap_outer = true with train.local_steps = 1: an overlapped exchange "
                                   "lands train.overlap_steps = 2 iterations after its push, within the next round, "
                                   "which needs train.local_steps >= 3"},
      {"train.overlap_steps=3", "train.overlap_steps = 3 with train.overlap_outer = false: it says how long"},
      {"train.overlap_steps=1", "train.overlap_steps = 1: must be >= 2"},
      {"train.overlap_mix=0.5", "train.overlap_mix = 0.5 with train.overlap_outer = false: it says how an overlapped"},
      {"train.overlap_mix=1", "train.overlap_mix = 1: must be in [0, 1)"},
      {"transport.boundary_rank_divisor=0", "transport.boundary_rank_divisor = 0: must be >= 1 (1: boundaries sent"},
      {"transport.gradient_rank_divisor=-1",
       "transport.gradient_rank_divisor = -1: must be >= 0 (0: as transport.boundary_rank_divisor)"},
  };
  // Checkpoints are where the replicas exchange.
  EXPECT_NE(Error("", {"train.local_steps=4", "train.checkpoint_every=10"})
                .find("train.checkpoint_every = 10 is not a multiple of train.local_steps = 4: checkpoints are taken "
                      "where the replicas exchange; set train.checkpoint_every to 12"),
            std::string::npos);
  for (const auto& [set, want] : cases) {
    const std::string e = Error("", {set});
    EXPECT_NE(e.find("job.toml: "), std::string::npos) << set << ": " << e;
    EXPECT_NE(e.find(want), std::string::npos) << set << ": " << e;
  }
}

// A boundary's rank must leave it a direction and send fewer floats than the tensor (rows 2 x 16,
// 64 columns: rank 16 sends 16 x 96 of 2048, rank 32 would send 3072); the error names the key.
TEST(JobConfig, ALowRankBoundaryMustSendFewerFloatsThanTheTensor) {
  const std::string small = "[model]\nd_model = 64\nn_head = 2\n[train]\nseq_len = 16\nmicro_batch_size = 2\n";
  auto ok = ParseJobConfig(small + "[transport]\nboundary_rank_divisor = 4\ngradient_rank_divisor = 8\n", "job.toml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->boundary(false).sent(), 16u * (32 + 64));
  EXPECT_EQ(ok->boundary(true).sent(), 8u * (32 + 64));
  EXPECT_NE(Error(small, {"transport.boundary_rank_divisor=2"})
                .find("transport.boundary_rank_divisor = 2: rank 32 of a boundary's 32 x 64 floats sends 3072 floats, "
                      "no fewer than the tensor's 2048; use a larger divisor, or 1 to send boundaries whole"),
            std::string::npos);
  EXPECT_NE(Error(small, {"transport.gradient_rank_divisor=65"})
                .find("transport.gradient_rank_divisor = 65 leaves no rank of the 64 columns a boundary carries: use a "
                      "divisor of at most 64, or 1 to send boundaries whole"),
            std::string::npos);
}

// Shared directions need boundaries in low rank, and their gradients take the activations' rank:
// coordinates of 16 directions for each of the 32 tokens both ways, the directions padded once.
TEST(JobConfig, SharedDirectionsNeedARankAndGiveTheGradientsTheirs) {
  const std::string small = "[model]\nd_model = 64\nn_head = 2\n[train]\nseq_len = 16\nmicro_batch_size = 2\n";
  auto ok = ParseJobConfig(small + "[transport]\nboundary_rank_divisor = 4\nshared_directions = true\n", "job.toml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->boundary(false).sent(), 16u * 32);
  EXPECT_EQ(ok->boundary(false).sent(true), 16u * 32 + 4096);
  EXPECT_EQ(ok->boundary(true).sent(), 16u * 32);
  EXPECT_NE(Error(small, {"transport.shared_directions=true"})
                .find("transport.shared_directions = true needs boundaries in low rank: set "
                      "transport.boundary_rank_divisor > 1"),
            std::string::npos);
  EXPECT_NE(Error(small, {"transport.shared_directions=true", "transport.boundary_rank_divisor=4",
                          "transport.gradient_rank_divisor=8"})
                .find("transport.gradient_rank_divisor = 8 with transport.shared_directions: the gradients travel in "
                      "their activations' directions"),
            std::string::npos);
}

// The wire is "auto" unless the config names one; on its fast links a GPU job sends bf16, a CPU
// job fp32 (the slow links are wire_plan_test's).
TEST(JobConfig, TheWireIsAutoAndAGpuJobsFastLinksCarryBf16) {
  auto parse = [](const std::vector<std::string>& overrides) {
    auto c = ParseJobConfig("", "job.toml", overrides);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::make_pair(c->transport.wire_dtype, c->FastWire()) : std::make_pair(WireDtype::kF32, WireDtype::kF32);
  };
  EXPECT_EQ(parse({}), std::make_pair(WireDtype::kAuto, WireDtype::kF32));
  EXPECT_EQ(parse({"train.backend=cuda:0"}), std::make_pair(WireDtype::kAuto, WireDtype::kBf16));
  EXPECT_EQ(parse({"cluster.stages=2", "cluster.stage_backends=[\"cpu\", \"cuda:1\"]"}),
            std::make_pair(WireDtype::kAuto, WireDtype::kBf16));
  EXPECT_EQ(parse({"train.backend=cuda:0", "transport.wire_dtype=fp32"}).first, WireDtype::kF32);
}

// An exchange overlapped 3 steps (rounds of 4, a checkpoint after step 8, 16 steps): pushed after
// iteration 3, it is under way in 4 to 6 and lands (and is evaluated) in 6; the checkpoint's round
// and the last stay synchronous, and nothing is under way in their rounds.
TEST(JobConfig, AnOverlappedExchangeIsUnderWayUntilItLands) {
  auto c = ParseJobConfig("", "job.toml",
                          {"train.local_steps=4", "train.overlap_outer=true", "train.overlap_steps=3", "train.steps=16",
                           "train.checkpoint_every=8", "train.eval_every=4"});
  ASSERT_TRUE(c.ok()) << c.status();
  const TrainConfig& t = c->train;
  std::vector<int64_t> overlapped, evaluated;
  std::vector<std::optional<int64_t>> under;
  for (int64_t it = 0; it < 16; ++it) {
    if (t.OverlapsAfter(it, 16)) overlapped.push_back(it);
    if (t.EvaluatesIn(it, 16)) evaluated.push_back(it);
    under.push_back(t.OverlappedUnder(it, 16));
  }
  EXPECT_EQ(overlapped, (std::vector<int64_t>{3, 11}));
  EXPECT_EQ(evaluated, (std::vector<int64_t>{6, 7, 14, 15}));
  for (int64_t it = 0; it < 16; ++it) {
    const bool travels = (it >= 4 && it <= 6) || (it >= 12 && it <= 14);
    EXPECT_EQ(under[it], travels ? std::optional<int64_t>(it < 8 ? 3 : 11) : std::nullopt) << "iteration " << it;
  }
  EXPECT_NE(Error("", {"train.local_steps=4", "train.overlap_outer=true", "train.overlap_steps=4"})
                .find("needs train.local_steps >= 5"),
            std::string::npos);
}

// topk and int1h are the data-parallel exchange's alone: the boundaries' keys (activations,
// gradients) refuse them, naming the key that takes them; a boundary gradient takes any other dtype.
TEST(JobConfig, TopKAndInt1hAreTheExchangesAndNotTheBoundaries) {
  EXPECT_NE(Error("", {"transport.wire_dtype=topk"}).find("transport.exchange_dtype = \"topk\""), std::string::npos);
  EXPECT_NE(Error("", {"transport.gradient_dtype=topk"}).find("transport.gradient_dtype = \"topk\": top-k"),
            std::string::npos);
  EXPECT_NE(Error("", {"transport.wire_dtype=int1h"}).find("transport.exchange_dtype = \"int1h\""), std::string::npos);
  EXPECT_NE(Error("", {"transport.gradient_dtype=int1h"}).find("transport.gradient_dtype = \"int1h\": int1h sends"),
            std::string::npos);
  auto h = ParseJobConfig("", "job.toml", {"transport.exchange_dtype=int1h", "train.local_steps=4"});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->transport.exchange_dtype, WireDtype::kInt1H);
  auto g = ParseJobConfig("", "job.toml", {"transport.gradient_dtype=int2"});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->transport.gradient_dtype, WireDtype::kInt2);
  auto c = ParseJobConfig("", "job.toml", {"transport.exchange_dtype=topk", "train.local_steps=4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->transport.exchange_dtype, WireDtype::kTopK);
  EXPECT_NE(Error("", {"transport.exchange_dtype=int5"}).find("transport.exchange_dtype = \"int5\": use"),
            std::string::npos);
}

TEST(JobConfig, WorkersAreBounded) {
  EXPECT_NE(Error("", {"cluster.stages=2", "cluster.replicas=40000"})
                .find("cluster.stages x cluster.replicas = 2 x 40000 workers: at most 65536"),
            std::string::npos);
}

// Replicas may share the batch unevenly: each runs its own micro-batches, numbered replica after
// replica, and every micro-batch weighs the same (to the bit as before where the shares are equal).
TEST(JobConfig, ReplicasShareTheBatchAsTheListSays) {
  auto even = ParseJobConfig("", "job.toml", {"cluster.replicas=4", "train.micro_batches=3"});
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_EQ(even->GlobalMicroBatches(), 12);
  EXPECT_EQ(even->FirstMicroBatchOf(2), 6);
  EXPECT_EQ(even->MicroBatchWeight(), 1.0f / 3.0f);
  auto uneven = ParseJobConfig("", "job.toml",
                               {"cluster.replicas=3", "train.micro_batches=3", "cluster.replica_micro_batches=[3, 2, 2]"});
  ASSERT_TRUE(uneven.ok()) << uneven.status();
  EXPECT_EQ(uneven->GlobalMicroBatches(), 7);
  EXPECT_EQ(uneven->MicroBatchesOf(1), 2);
  EXPECT_EQ(uneven->FirstMicroBatchOf(1), 3);
  EXPECT_EQ(uneven->FirstMicroBatchOf(2), 5);
  EXPECT_EQ(uneven->MicroBatchWeight(), 3.0f / 7.0f);
  EXPECT_EQ(uneven->tokens_per_step(), 7LL * uneven->train.micro_batch_size * uneven->train.seq_len);
  EXPECT_EQ(uneven->as_json["cluster"]["replica_micro_batches"], nlohmann::json({3, 2, 2}));
  EXPECT_NE(Error("", {"cluster.replicas=3", "cluster.replica_micro_batches=[1, 1]"})
                .find("cluster.replica_micro_batches has 2 entries for cluster.replicas = 3"),
            std::string::npos);
  EXPECT_NE(Error("", {"cluster.replicas=2", "cluster.replica_micro_batches=[1, 0]"})
                .find("cluster.replica_micro_batches entries must be >= 1"),
            std::string::npos);
  EXPECT_NE(Error("", {"cluster.replicas=2", "train.micro_batches=2", "cluster.replica_micro_batches=[3, 2]"})
                .find("set train.micro_batches = 3, the most any replica runs"),
            std::string::npos);
}

TEST(JobConfig, EffectiveConfigHoldsEveryKeyWithItsResolvedDefault) {
  auto c = ParseJobConfig("[cluster]\nstages = 2\n", "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  size_t keys = 0;
  for (auto& [section, values] : c->as_json.items()) keys += values.size();
  EXPECT_EQ(keys, ConfigKeys().size());
  for (const ConfigKey& k : ConfigKeys()) EXPECT_TRUE(c->as_json[k.section].contains(k.key)) << k.name();
  EXPECT_EQ(c->as_json["cluster"]["stage_layers"], nlohmann::json({2, 2}));
  EXPECT_EQ(c->as_json["train"]["lr"], 0.001);  // a float field is recorded by its shortest decimal
  EXPECT_EQ(c->as_json["train"]["backend"], "cpu");
}

// docs/config.md's table of config keys lists every key with its resume rule.
TEST(JobConfig, DocsListEveryKeyWithItsResumeRule) {
  std::ifstream f(std::string(LONGHAUL_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(f.good()) << "cannot read docs/config.md";
  std::stringstream page;
  page << f.rdbuf();
  std::map<std::string, std::string> rows;  // key -> its row of the table
  std::string line;
  while (std::getline(page, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    for (size_t at = line.find('`'); at != std::string::npos && at < line.find(" | "); at = line.find('`', at + 1)) {
      const size_t end = line.find('`', at + 1);
      rows[line.substr(at + 1, end - at - 1)] = line;
      at = end;
    }
  }
  for (const ConfigKey& k : ConfigKeys()) {
    ASSERT_TRUE(rows.count(k.name())) << k.name() << " is missing from docs/config.md's config keys";
    EXPECT_NE(rows[k.name()].find(absl::StrCat("| ", ResumeRuleName(k.resume), " |")), std::string::npos)
        << k.name() << " should be marked \"" << ResumeRuleName(k.resume) << "\" in docs/config.md: " << rows[k.name()];
  }
}

TEST(JobConfig, StopAtMustBeAStepOfTheRun) {
  auto c = ParseJobConfig("[train]\nsteps = 50\n", "job.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(CheckStopAt(1, *c).ok());
  EXPECT_TRUE(CheckStopAt(50, *c).ok());
  for (int64_t bad : {-3, 0, 51}) {
    absl::Status s = CheckStopAt(bad, *c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(absl::StrCat("--stop-at ", bad, ": must be a step of the run, between 1 and "
                                            "train.steps = 50")),
              std::string::npos)
        << s;
  }
}

}  // namespace
}  // namespace longhaul
