// The executor runs a schedule against a Stage and a Channel. Two stages, each in its own thread
// and joined by an in-memory channel, give bitwise the whole model's loss and gradients under
// GPipe and 1F1B, also when the stages queue their work as a device does (and then each result is
// asked for only after the next compute is queued); a channel's error ends the iteration with it,
// and a stopped version's between two blocks;
// the exchange overlaps compute through a CPU stage's hooks and computes the same; a replica of
// several groups (a shrunk layout's) pushes each as the replica it stands for would; a stage that
// puts its boundaries in low rank itself runs bitwise as when the executor does it on the host.
#include "worker/executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cpu/cpu_stage.h"
#include "cpu/low_rank.h"
#include "data/batch_sampler.h"
#include "model/low_rank_method.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

ModelConfig Cfg() {
  ModelConfig c;
  c.vocab_size = 40, c.max_seq_len = 20, c.n_layer = 4, c.n_head = 2, c.d_model = 16;
  return c;
}

constexpr int B = 2, T = 12, M = 3;

// Iteration `it`'s M micro-batches of a token stream (i * mul + i / div) % 40.
std::vector<MicroBatch> Sampled(const ModelConfig& cfg, int mul, int div, int64_t it) {
  std::vector<uint16_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * mul + i / div) % 40);
  BatchSampler sampler({B, T, 5, cfg.attention}, tokens);
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < M; ++m) mbs.push_back(sampler.Sample(it, m));
  return mbs;
}

BoundaryShape Boundary(const ModelConfig& cfg) {
  return {static_cast<size_t>(B) * T, cfg.d_model, cfg.residual_width()};
}

// Boundary tensors between the stages of one replica, in memory.
class Wires {
 public:
  using Key = std::tuple<int, int64_t, int, int>;  // kind, iteration, micro-batch, receiving stage
  void Put(Key key, std::vector<float> t) {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_.insert(t.size());
    held_[key] = std::move(t);
    cv_.notify_all();
  }
  std::vector<float> Take(Key key) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_.count(key) > 0; });
    std::vector<float> t = std::move(held_[key]);
    held_.erase(key);
    return t;
  }
  // The sizes of every tensor put.
  std::set<size_t> sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes_;
  }

 private:
  std::mutex mu_;
  std::set<size_t> sizes_;
  std::condition_variable cv_;
  std::map<Key, std::vector<float>> held_;
};

// One stage's channel: tensors go through the wires; pushed gradients are kept for the test and
// the parameters stay as they are.
class MemoryChannel final : public Channel {
 public:
  MemoryChannel(Wires& wires, int stage, size_t params) : wires_(wires), stage_(stage), params_(params) {}
  absl::StatusOr<std::vector<float>> Receive(proto::TensorKind kind, int64_t it, int micro, double*) override {
    return wires_.Take({kind, it, micro, stage_});
  }
  void Recycle(std::vector<float>) override {}
  void Send(proto::TensorKind kind, int64_t it, int micro, const float* data, size_t n) override {
    wires_.Put({kind, it, micro, kind == proto::ACTIVATION ? stage_ + 1 : stage_ - 1}, std::vector<float>(data, data + n));
  }
  absl::Status PushGradients(int64_t, Stage& stage, size_t, int group) override {
    LH_ASSIGN_OR_RETURN(const float* grads, stage.Grads());
    pushed[group].assign(grads, grads + params_);
    return absl::OkStatus();
  }
  absl::Status ReduceNorm(int64_t, double*) override { return absl::OkStatus(); }
  absl::StatusOr<OptimizerStepResult> Step(int64_t) override { return OptimizerStepResult{}; }
  absl::Status PullParameters(int64_t, Stage&, double*, size_t) override { return absl::OkStatus(); }
  absl::Status Flush(int64_t) override { return absl::OkStatus(); }

  std::map<int, std::vector<float>> pushed;  // by group

 private:
  Wires& wires_;
  const int stage_;
  const size_t params_;
};

// Another stage's calls, each passed on: what the doubles below change a few of.
class ForwardingStage : public Stage {
 public:
  explicit ForwardingStage(std::unique_ptr<Stage> inner) : inner_(std::move(inner)) {}
  const ParamLayout& layout() const override { return inner_->layout(); }
  const StageSpec& spec() const override { return inner_->spec(); }
  std::string Describe() const override { return inner_->Describe(); }
  int slots() const override { return inner_->slots(); }
  absl::Status ZeroGrads() override { return inner_->ZeroGrads(); }
  absl::StatusOr<float> Forward(int slot, const MicroBatch& mb, const float* input) override {
    return inner_->Forward(slot, mb, input);
  }
  absl::StatusOr<const float*> Output(int slot) override { return inner_->Output(slot); }
  absl::Status Backward(int slot, const MicroBatch& mb, const float* grad_out, float scale) override {
    return inner_->Backward(slot, mb, grad_out, scale);
  }
  absl::StatusOr<const float*> InputGrad(int slot) override { return inner_->InputGrad(slot); }
  absl::Status DownloadProbs(int slot, float* host) override { return inner_->DownloadProbs(slot, host); }
  absl::StatusOr<const float*> Params() override { return inner_->Params(); }
  absl::StatusOr<const float*> Grads() override { return inner_->Grads(); }
  absl::Status SetParams(size_t begin, const float* values, size_t n) override {
    return inner_->SetParams(begin, values, n);
  }
  absl::Status AttachOptimizer(const OptimizerSettings& s) override { return inner_->AttachOptimizer(s); }
  absl::StatusOr<OptimizerStepResult> Step(int64_t step) override { return inner_->Step(step); }
  absl::Status GetOptimizerState(float* m, float* v) override { return inner_->GetOptimizerState(m, v); }
  absl::Status SetOptimizerState(const float* m, const float* v) override { return inner_->SetOptimizerState(m, v); }

 private:
  std::unique_ptr<Stage> inner_;
};

// A stage as a device backend looks to the executor: its results are asked for separately
// (queues_work), and the order of its calls is kept.
class QueuingStage final : public ForwardingStage {
 public:
  using ForwardingStage::ForwardingStage;
  bool queues_work() const override { return true; }
  absl::StatusOr<float> Forward(int slot, const MicroBatch& mb, const float* input) override {
    calls.push_back(absl::StrCat("F", slot));
    return ForwardingStage::Forward(slot, mb, input);
  }
  absl::StatusOr<const float*> Output(int slot) override {
    calls.push_back(absl::StrCat("O", slot));
    return ForwardingStage::Output(slot);
  }
  absl::Status Backward(int slot, const MicroBatch& mb, const float* grad_out, float scale) override {
    calls.push_back(absl::StrCat("B", slot));
    return ForwardingStage::Backward(slot, mb, grad_out, scale);
  }
  absl::StatusOr<const float*> InputGrad(int slot) override {
    calls.push_back(absl::StrCat("G", slot));
    return ForwardingStage::InputGrad(slot);
  }

  std::vector<std::string> calls;
};

// A stage that puts its boundaries in low rank itself, as a GPU stage does on its device
// (Stage::EncodeLowRank), here with the host's codec: its factors are then the host path's.
class EncodingStage final : public ForwardingStage {
 public:
  using ForwardingStage::ForwardingStage;
  bool EncodeLowRank(const BoundaryShape& acts, const BoundaryShape& grads) override {
    acts_ = acts, grads_ = grads;
    return true;
  }
  // Shared directions as the GPU stage keeps them: those its output draws, those its input brings.
  void NextDirections(bool arrive, bool draw, std::function<void(float*, size_t)> round) override {
    arrive_ = arrive && !spec().has_embedding, draw_ = draw && !spec().has_head;
    round_ = std::move(round);
  }
  absl::StatusOr<float> Forward(int slot, const MicroBatch& mb, const float* input) override {
    mbs_[slot] = mb, draws_[slot] = draw_;
    return ForwardingStage::Forward(slot, mb, input == nullptr ? nullptr : Decoded(acts_, input, false));
  }
  absl::StatusOr<const float*> Output(int slot) override {
    LH_ASSIGN_OR_RETURN(const float* full, ForwardingStage::Output(slot));
    return Encoded(acts_, full, LowRankSeed(mbs_[slot], false), outputs_[slot], false, draws_[slot]);
  }
  absl::Status Backward(int slot, const MicroBatch& mb, const float* grad_out, float scale) override {
    mbs_[slot] = mb;
    return ForwardingStage::Backward(slot, mb, grad_out == nullptr ? nullptr : Decoded(grads_, grad_out, true), scale);
  }
  absl::StatusOr<const float*> InputGrad(int slot) override {
    LH_ASSIGN_OR_RETURN(const float* full, ForwardingStage::InputGrad(slot));
    return Encoded(grads_, full, LowRankSeed(mbs_[slot], true), input_grads_[slot], true, false);
  }

 private:
  const float* Decoded(const BoundaryShape& b, const float* sent, bool gradient) {
    decoded_.resize(b.floats());
    if (!b.shared) {
      EXPECT_TRUE(cpu::LowRankCodec::Decode(sent, b.rows, b.kept, b.rank, decoded_.data()).ok());
      return decoded_.data();
    }
    const size_t D = b.directions();
    const bool brings = !gradient && arrive_;
    if (brings) received_.assign(sent, sent + D);
    EXPECT_TRUE(cpu::LowRankCodec::Decode(sent + (brings ? D : 0), (gradient ? sent_ : received_).data(), b.rows,
                                          b.kept, b.rank, decoded_.data())
                    .ok());
    return decoded_.data();
  }
  absl::StatusOr<const float*> Encoded(const BoundaryShape& b, const float* full, uint64_t seed,
                                       std::vector<float>& out, bool gradient, bool draws) {
    out.resize(b.sent(draws));
    if (!b.shared) {
      LH_RETURN_IF_ERROR(codec_.Encode(full, b.rows, b.kept, b.rank, seed, out.data()));
      return out.data();
    }
    const size_t D = b.directions();
    if (draws) {
      sent_.assign(D, 0.0f);
      LH_RETURN_IF_ERROR(codec_.Directions(full, b.rows, b.kept, b.rank, seed, sent_.data()));
      round_(sent_.data(), D);
      std::copy(sent_.begin(), sent_.end(), out.begin());
    }
    LH_RETURN_IF_ERROR(cpu::LowRankCodec::Project(full, b.rows, b.kept, b.rank, (gradient ? received_ : sent_).data(),
                                                  out.data() + (draws ? D : 0)));
    return out.data();
  }

  BoundaryShape acts_, grads_;
  bool arrive_ = false, draw_ = false;
  std::map<int, bool> draws_;  // by slot: whether its output draws directions
  std::function<void(float*, size_t)> round_;
  std::vector<float> sent_, received_;
  std::map<int, MicroBatch> mbs_;  // by slot: the last micro-batch through it
  std::map<int, std::vector<float>> outputs_, input_grads_;
  std::vector<float> decoded_;
  cpu::LowRankCodec codec_;
};

// Two stages of `cfg`, each in its own thread over in-memory wires, through one iteration of `mbs`,
// their boundaries shaped as `acts` and `grads` say and each stage made what `wrap` makes it.
struct TwoStages {
  Wires wires;
  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<std::unique_ptr<MemoryChannel>> channels;
  std::vector<absl::StatusOr<IterationResult>> results{2, absl::UnknownError("not run")};

  TwoStages(const ModelConfig& cfg, ScheduleKind kind, const std::vector<MicroBatch>& mbs, BoundaryShape acts,
            BoundaryShape grads, const std::function<std::unique_ptr<Stage>(std::unique_ptr<Stage>)>& wrap) {
    for (int s = 0; s < 2; ++s) {
      auto st = CpuStage::Create(cfg, StageSpec::Even(cfg, s, 2), B, T, s == 1, ActivationSlots(kind, 2, s, M), 11);
      EXPECT_TRUE(st.ok()) << st.status();
      if (!st.ok()) return;
      channels.push_back(std::make_unique<MemoryChannel>(wires, s, (*st)->num_params()));
      stages.push_back(wrap(std::move(*st)));
    }
    Timeline timeline;
    std::vector<std::thread> threads;
    for (int s = 0; s < 2; ++s) {
      threads.emplace_back([&, s] {
        Executor ex(*stages[s], *channels[s], timeline, MakeSchedule(kind, 2, s, M, false), s, 2, M, M, 1.0f / M,
                    acts, grads);
        results[s] = ex.Run(0, mbs);
      });
    }
    for (std::thread& t : threads) t.join();
  }
};

// (schedule, whether the stages queue their work, model.subspace_divisor)
class ExecutorTest : public ::testing::TestWithParam<std::tuple<ScheduleKind, bool, int>> {};

// A subspace model's boundaries carry only its kept columns, and still lose nothing.
TEST_P(ExecutorTest, TwoStagesInMemoryGiveTheWholeModelBitwise) {
  const auto [kind, queued, divisor] = GetParam();
  ModelConfig cfg = Cfg();
  cfg.subspace_divisor = divisor;
  const std::vector<MicroBatch> mbs = Sampled(cfg, 7, 13, 0);

  // The reference: the whole model, micro-batches one after another, backwards ascending.
  auto whole = CpuStage::Create(cfg, StageSpec::Whole(cfg), B, T, false, 1, 11);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE((*whole)->ZeroGrads().ok());
  double loss = 0;
  for (const MicroBatch& mb : mbs) {
    loss += *(*whole)->Forward(0, mb, nullptr) / M;
    ASSERT_TRUE((*whole)->Backward(0, mb, nullptr, 1.0f / M).ok());
  }
  const float* whole_grads = *(*whole)->Grads();

  TwoStages run(cfg, kind, mbs, Boundary(cfg), Boundary(cfg), [&](std::unique_ptr<Stage> st) -> std::unique_ptr<Stage> {
    if (queued) return std::make_unique<QueuingStage>(std::move(st));
    return st;
  });
  const auto& stages = run.stages;
  const auto& channels = run.channels;
  const auto& results = run.results;
  EXPECT_EQ(run.wires.sizes(), std::set<size_t>{static_cast<size_t>(B) * T * cfg.d_model / divisor});
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[1]->loss, loss);
  EXPECT_EQ(results[0]->loss, 0);
  EXPECT_GT(results[0]->compute_seconds, 0);
  size_t offset = 0;
  for (int s = 0; s < 2; ++s) {
    const std::vector<float>& pushed = channels[s]->pushed[0];
    ASSERT_EQ(channels[s]->pushed.size(), 1u) << "one group";
    ASSERT_EQ(pushed.size(), stages[s]->num_params());
    EXPECT_TRUE(std::equal(pushed.begin(), pushed.end(), whole_grads + offset))
        << "stage " << s << "'s gradients differ from the whole model's";
    offset += stages[s]->num_params();
  }
  EXPECT_EQ(offset, (*whole)->num_params());
  if (queued && kind == ScheduleKind::kGpipe) {
    // The first stage asks for each output only once the next forward is queued, so the copy of
    // one micro-batch overlaps the compute of the next; the last stage's input gradients likewise.
    EXPECT_EQ(absl::StrJoin(static_cast<QueuingStage&>(*stages[0]).calls, " "), "F0 F1 O0 F2 O1 O2 B0 B1 B2");
    EXPECT_EQ(absl::StrJoin(static_cast<QueuingStage&>(*stages[1]).calls, " "), "F0 F1 F2 B0 B1 G0 B2 G1 G2");
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, ExecutorTest,
                         ::testing::Combine(::testing::Values(ScheduleKind::kGpipe, ScheduleKind::k1F1B),
                                            ::testing::Bool(), ::testing::Values(1, 4)),
                         [](const auto& info) {
                           return std::string(ScheduleName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_Queued" : "_Immediate") +
                                  (std::get<2>(info.param) > 1 ? "_Subspace" : "");
                         });

// A stage that puts its boundaries in low rank itself (a GPU stage, on its device) is handed the
// factors it sends and receives as they are: the same floats cross the wires (the factors' count
// only) and the run ends bitwise as when the executor puts them in low rank on the host.
TEST(Executor, AStageThatPutsItsBoundariesInLowRankItselfRunsAsTheHostPath) {
  const ModelConfig cfg = Cfg();
  const std::vector<MicroBatch> mbs = Sampled(cfg, 7, 13, 3);
  BoundaryShape acts = Boundary(cfg), grads = Boundary(cfg);
  acts.rank = 4, grads.rank = 8;
  const ScheduleKind kind = ScheduleKind::k1F1B;
  TwoStages host(cfg, kind, mbs, acts, grads, [](std::unique_ptr<Stage> st) { return st; });
  TwoStages itself(cfg, kind, mbs, acts, grads, [](std::unique_ptr<Stage> st) -> std::unique_ptr<Stage> {
    return std::make_unique<EncodingStage>(std::move(st));
  });
  for (TwoStages* run : {&host, &itself}) {
    ASSERT_TRUE(run->results[0].ok()) << run->results[0].status();
    ASSERT_TRUE(run->results[1].ok()) << run->results[1].status();
    EXPECT_EQ(run->wires.sizes(), (std::set<size_t>{acts.sent(), grads.sent()}));
  }
  EXPECT_EQ(itself.results[1]->loss, host.results[1]->loss);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(itself.channels[s]->pushed, host.channels[s]->pushed) << "stage " << s;
}

// Shared directions (transport.shared_directions): the first micro-batch's activations carry the
// iteration's directions before their coordinates, the others and every gradient their
// coordinates only. At full rank the directions span everything, so the run is the whole
// boundary's up to rounding, which it is only if each end multiplies out in the right directions:
// activations in the ones they came with, gradients in those their activations went in.
TEST(Executor, SharedDirectionsAtFullRankGiveTheWholeBoundarysRun) {
  const ModelConfig cfg = Cfg();
  const std::vector<MicroBatch> mbs = Sampled(cfg, 7, 13, 3);
  const BoundaryShape whole = Boundary(cfg);
  BoundaryShape shared = whole;
  shared.rank = cfg.d_model, shared.shared = true;
  const auto as_is = [](std::unique_ptr<Stage> st) { return st; };
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B}) {
    TwoStages exact(cfg, kind, mbs, whole, whole, as_is);
    TwoStages run(cfg, kind, mbs, shared, shared, as_is);
    for (TwoStages* r : {&exact, &run}) {
      ASSERT_TRUE(r->results[0].ok()) << r->results[0].status();
      ASSERT_TRUE(r->results[1].ok()) << r->results[1].status();
    }
    EXPECT_EQ(run.wires.sizes(), (std::set<size_t>{shared.sent(true), shared.sent()}));
    EXPECT_EQ(shared.sent(true), shared.sent() + kDirectionsPiece) << "16 x 16 directions, padded";
    EXPECT_NEAR(run.results[1]->loss, exact.results[1]->loss, 1e-5);
    for (int s = 0; s < 2; ++s) {
      const std::vector<float>&a = run.channels[s]->pushed.at(0), &b = exact.channels[s]->pushed.at(0);
      ASSERT_EQ(a.size(), b.size());
      double diff = 0, norm = 0;
      for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
      EXPECT_LT(diff, 1e-8 * norm) << "stage " << s << "'s gradients";
    }
  }
  // At rank 4 what crosses is lossy: the first stage's gradients are no longer the exact path's.
  shared.rank = 4;
  TwoStages exact(cfg, ScheduleKind::k1F1B, mbs, whole, whole, as_is);
  TwoStages lossy(cfg, ScheduleKind::k1F1B, mbs, shared, shared, as_is);
  ASSERT_TRUE(lossy.results[0].ok()) << lossy.results[0].status();
  EXPECT_NE(lossy.channels[0]->pushed, exact.channels[0]->pushed);
}

// A stage that puts its boundaries in shared directions itself (a GPU stage) hears which forward
// brings and which draws them, and runs as the host path does: the same sizes on the wires and the
// same run, bitwise, under both schedules.
TEST(Executor, AStageThatPutsItsBoundariesInSharedDirectionsItselfRunsAsTheHostPath) {
  const ModelConfig cfg = Cfg();
  const std::vector<MicroBatch> mbs = Sampled(cfg, 5, 7, 2);
  BoundaryShape shared = Boundary(cfg);
  shared.rank = 4, shared.shared = true;
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B}) {
    TwoStages host(cfg, kind, mbs, shared, shared, [](std::unique_ptr<Stage> st) { return st; });
    TwoStages itself(cfg, kind, mbs, shared, shared, [](std::unique_ptr<Stage> st) -> std::unique_ptr<Stage> {
      return std::make_unique<EncodingStage>(std::move(st));
    });
    for (TwoStages* run : {&host, &itself}) {
      ASSERT_TRUE(run->results[0].ok()) << run->results[0].status();
      ASSERT_TRUE(run->results[1].ok()) << run->results[1].status();
      EXPECT_EQ(run->wires.sizes(), (std::set<size_t>{shared.sent(true), shared.sent()}));
    }
    EXPECT_EQ(itself.results[1]->loss, host.results[1]->loss);
    for (int s = 0; s < 2; ++s) EXPECT_EQ(itself.channels[s]->pushed, host.channels[s]->pushed) << "stage " << s;
  }
}

// A shrunk layout's replica runs two of the job's replicas' micro-batches: it pushes each group's
// mean gradient on its own, bitwise what each replica it stands for pushes, under both schedules.
TEST(Executor, AReplicaOfTwoGroupsPushesWhatTheTwoReplicasItStandsForPush) {
  const ModelConfig cfg = Cfg();
  std::vector<uint16_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 3 + i / 11) % 40);
  constexpr int kGroup = 2;
  BatchSampler sampler({B, T, 5, cfg.attention}, tokens);
  const BoundaryShape boundary = Boundary(cfg);
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B}) {
    Wires wires;
    Timeline timeline;
    // The job's replicas 0 and 1, each 2 micro-batches.
    std::vector<std::vector<float>> want;
    double loss = 0;
    for (int r = 0; r < 2; ++r) {
      auto st = CpuStage::Create(cfg, StageSpec::Whole(cfg), B, T, false, kGroup, 11);
      ASSERT_TRUE(st.ok()) << st.status();
      MemoryChannel channel(wires, 0, (*st)->num_params());
      Executor ex(**st, channel, timeline, MakeSchedule(kind, 1, 0, kGroup, false), 0, 1, kGroup, kGroup, 1.0f / kGroup, boundary, boundary);
      auto got = ex.Run(0, {sampler.Sample(0, r * kGroup), sampler.Sample(0, r * kGroup + 1)});
      ASSERT_TRUE(got.ok()) << got.status();
      loss += got->loss / 2;
      want.push_back(channel.pushed.at(0));
    }
    // One replica of 4 micro-batches (global 0..3), in groups of 2.
    auto st = CpuStage::Create(cfg, StageSpec::Whole(cfg), B, T, false, 2 * kGroup, 11);
    ASSERT_TRUE(st.ok()) << st.status();
    MemoryChannel channel(wires, 0, (*st)->num_params());
    Executor ex(**st, channel, timeline, MakeSchedule(kind, 1, 0, 2 * kGroup, false), 0, 1, 2 * kGroup, kGroup,
                1.0f / kGroup, boundary, boundary);
    std::vector<MicroBatch> mbs;
    for (int m = 0; m < 2 * kGroup; ++m) mbs.push_back(sampler.Sample(0, m));
    auto got = ex.Run(0, mbs);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(channel.pushed.size(), 2u) << ScheduleName(kind);
    EXPECT_EQ(channel.pushed.at(0), want[0]) << ScheduleName(kind) << ": the first group's gradients";
    EXPECT_EQ(channel.pushed.at(1), want[1]) << ScheduleName(kind) << ": the second group's, from zero";
    EXPECT_NEAR(got->loss, loss, 1e-6 * loss);
  }
  // A schedule whose micro-batches are not whole groups is refused.
  auto st = CpuStage::Create(cfg, StageSpec::Whole(cfg), B, T, false, 3, 11);
  ASSERT_TRUE(st.ok());
  Wires wires;
  Timeline timeline;
  MemoryChannel channel(wires, 0, (*st)->num_params());
  Executor ex(**st, channel, timeline, MakeSchedule(ScheduleKind::kGpipe, 1, 0, 3, false), 0, 1, 3, kGroup, 1.0f / kGroup, boundary, boundary);
  std::vector<MicroBatch> three;
  for (int m = 0; m < 3; ++m) three.push_back(sampler.Sample(0, m));
  EXPECT_EQ(ex.Run(0, three).status().code(), absl::StatusCode::kInvalidArgument);
}

// One stage's channel to three parameter-server shards: it keeps what each push carried and when,
// and a pull writes `next` into the shards it is asked for.
class ShardChannel final : public Channel {
 public:
  ShardChannel(const ParamLayout& layout, std::vector<float> next) : next_(std::move(next)) {
    for (auto [first, end] : layout.SplitIntoShards(3)) shards_.push_back(layout.Range(first, end));
  }
  absl::StatusOr<std::vector<float>> Receive(proto::TensorKind, int64_t, int, double*) override {
    return absl::InternalError("one stage receives nothing");
  }
  void Recycle(std::vector<float>) override {}
  void Send(proto::TensorKind, int64_t, int, const float*, size_t) override {}
  absl::Status PushGradients(int64_t it, Stage& stage, size_t from, int) override {
    LH_ASSIGN_OR_RETURN(const float* grads, stage.Grads());
    for (size_t k = 0; k < shards_.size(); ++k) {
      const auto [begin, end] = shards_[k];
      if (begin < from || pushes.count({it, k}) > 0) continue;
      pushes[{it, k}] = {from, std::vector<float>(grads + begin, grads + end)};
    }
    return absl::OkStatus();
  }
  absl::Status ReduceNorm(int64_t, double*) override { return absl::OkStatus(); }
  absl::StatusOr<OptimizerStepResult> Step(int64_t) override { return OptimizerStepResult{}; }
  absl::Status PullParameters(int64_t it, Stage& stage, double*, size_t upto) override {
    for (size_t k = 0; k < shards_.size(); ++k) {
      const auto [begin, end] = shards_[k];
      if (begin >= upto || pulled.count({it, k}) > 0) continue;
      pulled[{it, k}] = upto;
      LH_RETURN_IF_ERROR(stage.SetParams(begin, next_.data() + begin, end - begin));
    }
    return absl::OkStatus();
  }
  absl::Status Flush(int64_t) override { return absl::OkStatus(); }

  std::vector<std::pair<size_t, size_t>> shards_;  // [begin, end) floats
  std::map<std::pair<int64_t, size_t>, std::pair<size_t, std::vector<float>>> pushes;  // (it, shard): (from, grads)
  std::map<std::pair<int64_t, size_t>, size_t> pulled;                                 // (it, shard): upto

 private:
  std::vector<float> next_;
};

// With a CPU stage's hooks the last backward pushes each shard as soon as its gradients are
// complete (the last shards first), and a deferred pull lands shard by shard inside the next
// iteration's first forward, which then computes exactly what it computes after a whole pull.
// Without overlap every push waits for PushGrads and every pull for PullParams.
TEST(Executor, OverlapPushesCompleteShardsEarlyAndPullsInsideTheNextForward) {
  const ModelConfig cfg = Cfg();
  std::vector<uint16_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 5 + i / 7) % 40);
  BatchSampler sampler({B, T, 5, cfg.attention}, tokens);
  auto batches = [&](int64_t it) {
    std::vector<MicroBatch> mbs;
    for (int m = 0; m < M; ++m) mbs.push_back(sampler.Sample(it, m));
    return mbs;
  };
  auto stage = CpuStage::Create(cfg, StageSpec::Whole(cfg), B, T, false, M, 11);
  ASSERT_TRUE(stage.ok()) << stage.status();
  const size_t n = (*stage)->num_params();
  std::vector<float> next(n);
  for (size_t i = 0; i < n; ++i) next[i] = 0.02f * std::sin(0.37f * static_cast<float>(i));
  // What iteration 1 computes on `next`, pulled whole before it starts.
  auto reference = CpuStage::Create(cfg, StageSpec::Whole(cfg), B, T, false, M, 11);
  ASSERT_TRUE(reference.ok());
  ASSERT_TRUE((*reference)->SetParams(0, next.data(), n).ok());
  Timeline timeline;
  ShardChannel ref_channel((*reference)->layout(), next);
  Executor ref(**reference, ref_channel, timeline, MakeSchedule(ScheduleKind::kGpipe, 1, 0, M, false), 0, 1, M, M, 1.0f / M, BoundaryShape{}, BoundaryShape{});
  ref.SetOverlap(false);
  auto want = ref.Run(1, batches(1));
  ASSERT_TRUE(want.ok()) << want.status();

  ShardChannel channel((*stage)->layout(), next);
  Executor ex(**stage, channel, timeline, MakeSchedule(ScheduleKind::kGpipe, 1, 0, M, false), 0, 1, M, M, 1.0f / M, BoundaryShape{}, BoundaryShape{});
  const std::vector<float> init(*(*stage)->Params(), *(*stage)->Params() + n);
  auto first = ex.Run(0, batches(0), IterationEnd::kExchange, /*defer_pull=*/true);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(ex.pull_pending(), 0);
  EXPECT_TRUE(std::equal(init.begin(), init.end(), *(*stage)->Params())) << "nothing pulled yet";
  const float* grads = *(*stage)->Grads();
  for (size_t k = 0; k < 3; ++k) {
    const auto& [from, pushed] = channel.pushes.at({0, k});
    const auto [begin, end] = channel.shards_[k];
    EXPECT_TRUE(std::equal(pushed.begin(), pushed.end(), grads + begin)) << "shard " << k << " pushed incomplete";
    EXPECT_EQ(from > 0, k > 0) << "shard " << k << " left during the backward (from " << from << ")";
  }
  EXPECT_GT(channel.pushes.at({0, 1}).first, 0u);

  auto second = ex.Run(1, batches(1), IterationEnd::kExchange, /*defer_pull=*/false);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(ex.pull_pending(), -1);
  EXPECT_LT(channel.pulled.at({0, 0}), n) << "the first shard was pulled when the embedding asked for it";
  EXPECT_EQ(second->loss, want->loss) << "the forward read every shard's new parameters";
  EXPECT_EQ(channel.pushes.at({1, 2}).second, ref_channel.pushes.at({1, 2}).second);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(ref_channel.pushes.at({1, k}).first, 0u) << "without overlap";
}

// A channel whose receives fail, as a stopped job's do; with `stop_after_sends`, it says it was
// stopped once that many tensors went out, with `stop_at_check`, from its Stopped's that-th call.
class ClosedChannel final : public Channel {
 public:
  absl::StatusOr<std::vector<float>> Receive(proto::TensorKind, int64_t, int, double*) override {
    return absl::AbortedError("stopped: the coordinator stopped the job");
  }
  void Recycle(std::vector<float>) override {}
  void Send(proto::TensorKind, int64_t, int, const float*, size_t) override { ++sends; }
  absl::Status Stopped() override {
    ++checks;
    return (stop_after_sends >= 0 && sends >= stop_after_sends) || (stop_at_check > 0 && checks >= stop_at_check)
               ? absl::AbortedError("stopped: plan version 3 is out")
               : absl::OkStatus();
  }
  int sends = 0, stop_after_sends = -1, checks = 0, stop_at_check = -1;
  absl::Status PushGradients(int64_t, Stage&, size_t, int) override { return absl::OkStatus(); }
  absl::Status ReduceNorm(int64_t, double*) override { return absl::OkStatus(); }
  absl::StatusOr<OptimizerStepResult> Step(int64_t) override { return OptimizerStepResult{}; }
  absl::Status PullParameters(int64_t, Stage&, double*, size_t) override { return absl::OkStatus(); }
  absl::Status Flush(int64_t) override { return absl::OkStatus(); }
};

TEST(Executor, AChannelErrorEndsTheIterationWithIt) {
  const ModelConfig cfg = Cfg();
  auto st = CpuStage::Create(cfg, StageSpec::Even(cfg, 1, 2), B, T, false, 1, 11);
  ASSERT_TRUE(st.ok());
  ClosedChannel channel;
  Timeline timeline;
  Executor ex(**st, channel, timeline, MakeSchedule(ScheduleKind::k1F1B, 2, 1, 1, false), 1, 2, 1, 1, 1.0f,
              Boundary(cfg), Boundary(cfg));
  std::vector<uint16_t> tokens(500, 3);
  BatchSampler sampler({B, T, 5, cfg.attention}, tokens);
  auto r = ex.Run(0, {sampler.Sample(0, 0)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("the coordinator stopped the job"), std::string::npos);
  EXPECT_EQ(ex.Run(0, {}).status().code(), absl::StatusCode::kInvalidArgument) << "no micro-batches";
}

// GPipe's first stage of two, over M micro-batches, runs an iteration against `channel`, which
// stops it: the iteration's error.
absl::Status RunFirstStageUntilStopped(ClosedChannel& channel) {
  const ModelConfig cfg = Cfg();
  auto st = CpuStage::Create(cfg, StageSpec::Even(cfg, 0, 2), B, T, false, M, 11);
  if (!st.ok()) return st.status();
  Timeline timeline;
  Executor ex(**st, channel, timeline, MakeSchedule(ScheduleKind::kGpipe, 2, 0, M, false), 0, 2, M, M, 1.0f / M,
              Boundary(cfg), Boundary(cfg));
  std::vector<uint16_t> tokens(500, 3);
  BatchSampler sampler({B, T, 5, cfg.attention}, tokens);
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < M; ++m) mbs.push_back(sampler.Sample(0, m));
  return ex.Run(0, mbs).status();
}

// GPipe's first stage runs its 3 forwards back to back: stopped after the first went out, it
// computes no second one.
TEST(Executor, AStoppedVersionComputesNothingMore) {
  ClosedChannel channel;
  channel.stop_after_sends = 1;
  const absl::Status s = RunFirstStageUntilStopped(channel);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("plan version 3 is out"), std::string::npos) << s;
  EXPECT_EQ(channel.sends, 1);
}

// A stage with hooks asks between its blocks too: stopped while its first forward computes (the
// third check: before the forward, before the embeddings, before the first block), it gives up
// that forward, and nothing goes out.
TEST(Executor, AVersionStoppedMidForwardGivesItUpBetweenBlocks) {
  ClosedChannel channel;
  channel.stop_at_check = 3;
  const absl::Status s = RunFirstStageUntilStopped(channel);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("plan version 3 is out"), std::string::npos) << s;
  EXPECT_EQ(channel.checks, 3);
  EXPECT_EQ(channel.sends, 0);
}

}  // namespace
}  // namespace longhaul
