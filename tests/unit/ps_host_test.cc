// The parameter-server host: it sums its replicas' pushes in replica order, reports Σ g² of the
// averaged gradient, steps with the global norm it is given (or, with local updates, the outer
// Nesterov step), sends the parameters to every replica, refuses a push of the wrong size and a
// norm that is not finite, checkpoints its shards, releases them to a new plan version's host, and
// makes a shard whose state a recovery still reads at its first exchange.
#include "worker/ps_host.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "checkpoint/checkpoint.h"
#include "optim/grad_clip.h"

namespace longhaul {
namespace {

ModelConfig Cfg() {
  ModelConfig c;
  c.vocab_size = 30, c.max_seq_len = 8, c.n_layer = 2, c.n_head = 2, c.d_model = 8;
  return c;
}

struct Fixture {
  ParamLayout layout{Cfg(), StageSpec::Even(Cfg(), 0, 2)};
  std::map<int, std::vector<float>> pushes;  // by the job's replica: replica x groups + group
  int groups = 1;                            // each replica's pushes
  std::vector<std::vector<ShardSquares>> reports;
  std::vector<std::pair<int, size_t>> sent;  // (replica, floats)
  std::optional<double> norm;                 // what the reduction answers instead of the real one

  PsLinks Links() {
    return {[this](int64_t, int replica, int group, int) -> absl::StatusOr<std::vector<float>> {
              return pushes.at(replica * groups + group);
            },
            [](std::vector<float>) {},
            [this](int64_t, const std::vector<ShardSquares>& own) -> absl::StatusOr<double> {
              reports.push_back(own);
              return norm ? *norm : std::sqrt(own[0].sum_squares);
            },
            [this](int64_t, int replica, int, const float*, size_t n, WireDtype) { sent.emplace_back(replica, n); }};
  }
  // Replicas 0 and 1 push sin(k·i − r) at float i of the stage.
  void WavePushes(float k) {
    for (int r = 0; r < 2; ++r) {
      pushes[r].resize(layout.total());
      for (size_t i = 0; i < pushes[r].size(); ++i) pushes[r][i] = std::sin(k * static_cast<float>(i) - r);
    }
  }
  std::vector<float> Init() const {
    std::vector<float> p(layout.total());
    for (size_t i = 0; i < p.size(); ++i) p[i] = 0.01f * static_cast<float>(i % 17);
    return p;
  }
  std::unique_ptr<PsShard> Shard() {
    auto shard =
        std::make_unique<HostPsShard>(AdamWConfig{}, layout, 0, 0, 0, static_cast<int>(layout.tensors().size()), 2);
    EXPECT_TRUE(shard->SetState(Init().data(), nullptr, nullptr).ok());
    return shard;
  }
};

const LrSchedule kSchedule{1e-2f, 1e-3f, 0, 10};

TEST(PsHost, SumsInReplicaOrderStepsWithTheGlobalNormAndSendsToEveryReplica) {
  Fixture f;
  const size_t n = f.layout.total();
  f.WavePushes(0.1f);
  PsHost host(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  host.Add(f.Shard());
  // What the host must compute, done by hand in the same order.
  std::vector<float> want = f.Init();
  std::vector<float> g = f.pushes[0];
  for (size_t i = 0; i < n; ++i) g[i] += f.pushes[1][i];
  Scale(g.data(), n, 0.5f);
  const double sum_squares = SquaredNorm(g.data(), n);
  AdamW adamw(AdamWConfig{}, f.layout.DecayFlags());
  ApplyOptimizerStepWithNorm(want.data(), g.data(), n, adamw, kSchedule, 1.0f, 0, std::sqrt(sum_squares));

  ASSERT_TRUE(host.ReduceNorm(0).ok());
  ASSERT_TRUE(f.sent.empty()) << "nothing sent before the step";
  auto step = host.Step(0);
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ(f.reports.size(), 1u);
  ASSERT_EQ(f.reports[0].size(), 1u);
  EXPECT_EQ(f.reports[0][0].stage, 0);
  EXPECT_EQ(f.reports[0][0].shard, 0);
  EXPECT_EQ(f.reports[0][0].sum_squares, sum_squares);
  const float* got = *host.shards()[0]->Params();
  EXPECT_EQ(std::vector<float>(got, got + n), want);
  EXPECT_NEAR(step->grad_norm, std::sqrt(sum_squares), 1e-9);
  EXPECT_GT(step->lr, 0);
  EXPECT_EQ(f.sent, (std::vector<std::pair<int, size_t>>{{0, n}, {1, n}}));
}

// A shrunk layout's one replica stands for the job's two: it pushes two groups, which the host
// sums as it sums two replicas' pushes, bit for bit, and the parameters go to that one replica.
TEST(PsHost, AReplicaOfTwoGroupsStepsAsTwoReplicasDo) {
  Fixture two, one;
  const size_t n = two.layout.total();
  two.WavePushes(0.3f);
  one.pushes = two.pushes;
  one.groups = 2;
  PsHost replicas(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, two.Links());
  PsHost groups(7, 0, 1, 2, kSchedule, 1.0f, OuterOptimizer{}, one.Links());
  replicas.Add(two.Shard());
  groups.Add(one.Shard());
  for (int64_t it = 0; it < 3; ++it) {
    ASSERT_TRUE(replicas.ReduceNorm(it).ok());
    ASSERT_TRUE(groups.ReduceNorm(it).ok());
    ASSERT_TRUE(replicas.Step(it).ok());
    ASSERT_TRUE(groups.Step(it).ok());
  }
  ASSERT_EQ(one.reports.size(), 3u);
  EXPECT_EQ(one.reports[2][0].sum_squares, two.reports[2][0].sum_squares);
  const float* a = *replicas.shards()[0]->Params();
  const float* b = *groups.shards()[0]->Params();
  EXPECT_EQ(std::vector<float>(a, a + n), std::vector<float>(b, b + n));
  EXPECT_EQ(one.sent, (std::vector<std::pair<int, size_t>>(3, {0, n})));
}

// A new plan version's host keeps a shard whose state is the checkpoint's: Release hands back each
// shard with the last iteration it stepped, and without the pushes of an iteration the version
// ended in, so the next iteration's replica 0 push is taken.
TEST(PsHost, ReleaseGivesEachShardWithTheIterationItLastSteppedAndDropsAPartialSum) {
  Fixture f;
  const size_t n = f.layout.total();
  for (int r = 0; r < 2; ++r) f.pushes[r].assign(n, 0.1f * static_cast<float>(r + 1));
  PsHost host(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  host.Add(f.Shard(), 4);
  ASSERT_TRUE(host.ReduceNorm(5).ok());
  ASSERT_TRUE(host.Step(5).ok());
  // Iteration 6 ends after replica 0's push.
  ASSERT_TRUE(host.shards()[0]->AddReplicaGradient(0, f.pushes[0]).ok());
  std::vector<PsHost::Hosted> held = host.Release();
  EXPECT_TRUE(host.shards().empty());
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].stepped, 5);
  EXPECT_TRUE(held[0].shard->AddReplicaGradient(0, f.pushes[0]).ok());

  PsHost unknown(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  unknown.Add(f.Shard());
  EXPECT_EQ(unknown.Release()[0].stepped, -1);
}

// Each shard's parameters leave as soon as it is stepped, before the next shard steps, in the
// stage's order: the next forward needs the first blocks first.
TEST(PsHost, SendsEachShardBeforeSteppingTheNext) {
  Fixture f;
  const int tensors = static_cast<int>(f.layout.tensors().size());
  const size_t cut = f.layout.Range(0, tensors / 2).second, n = f.layout.total();
  for (int r = 0; r < 2; ++r) f.pushes[r].assign(cut, 0.5f);
  PsHost* host_ptr = nullptr;
  std::vector<std::pair<int, bool>> sends;  // (shard, whether the second shard had stepped)
  PsLinks links = f.Links();
  links.take_push = [&](int64_t, int, int, int shard) -> absl::StatusOr<std::vector<float>> {
    return std::vector<float>(shard == 0 ? cut : n - cut, 0.5f);
  };
  links.send_params = [&](int64_t, int, int shard, const float*, size_t, WireDtype) {
    const float* second = *host_ptr->shards()[1]->Params();
    sends.emplace_back(shard, *second != f.Init()[cut]);
  };
  PsHost host(3, 0, 2, 1, kSchedule, 0.0f, OuterOptimizer{}, links);
  host_ptr = &host;
  const std::vector<float> init = f.Init();
  for (auto [first, end, owner_shard] : {std::tuple{0, tensors / 2, 0}, std::tuple{tensors / 2, tensors, 1}}) {
    auto shard = std::make_unique<HostPsShard>(AdamWConfig{}, f.layout, 0, owner_shard, first, end, 2);
    ASSERT_TRUE(shard->SetState(init.data() + f.layout.Range(first, end).first, nullptr, nullptr).ok());
    host.Add(std::move(shard));
  }
  ASSERT_TRUE(host.ReduceNorm(0).ok());
  ASSERT_TRUE(host.Step(0).ok());
  EXPECT_EQ(sends, (std::vector<std::pair<int, bool>>{{0, false}, {0, false}, {1, true}, {1, true}}));
}

// A recovery's shard whose moments are still being read is made at the host's first exchange, not
// before, in the place of the order it was added (its parameters go out before the next shard's),
// and then steps bit for bit as a shard added whole does.
TEST(PsHost, APendingShardIsMadeAtTheFirstExchangeInItsPlaceAndStepsAsAWholeOne) {
  Fixture whole_links, pending_links;
  const size_t n = whole_links.layout.total();
  whole_links.WavePushes(0.2f);
  pending_links.pushes = whole_links.pushes;
  PsHost whole(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, whole_links.Links());
  PsHost pending(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, pending_links.Links());
  whole.Add(whole_links.Shard());
  int made = 0;
  pending.AddPending(
      [&]() -> absl::StatusOr<std::unique_ptr<PsShard>> {
        ++made;
        return pending_links.Shard();
      },
      -1);
  ASSERT_EQ(pending.shards().size(), 1u);
  EXPECT_EQ(pending.shards()[0], nullptr);
  EXPECT_EQ(made, 0) << "made before the first exchange";
  for (int64_t it = 0; it < 2; ++it) {
    ASSERT_TRUE(whole.ReduceNorm(it).ok());
    ASSERT_TRUE(pending.ReduceNorm(it).ok());
    ASSERT_TRUE(whole.Step(it).ok());
    ASSERT_TRUE(pending.Step(it).ok());
  }
  EXPECT_EQ(made, 1);
  const float* a = *whole.shards()[0]->Params();
  const float* b = *pending.shards()[0]->Params();
  EXPECT_EQ(std::vector<float>(a, a + n), std::vector<float>(b, b + n));

  // The first of two shards pending, the second whole: the first is still sent first.
  Fixture f;
  const int tensors = static_cast<int>(f.layout.tensors().size());
  const size_t cut = f.layout.Range(0, tensors / 2).second;
  PsLinks links = f.Links();
  links.take_push = [&](int64_t, int, int, int shard) -> absl::StatusOr<std::vector<float>> {
    return std::vector<float>(shard == 0 ? cut : n - cut, 0.5f);
  };
  std::vector<int> sent;
  links.send_params = [&](int64_t, int, int shard, const float*, size_t, WireDtype) { sent.push_back(shard); };
  PsHost host(3, 0, 2, 1, kSchedule, 0.0f, OuterOptimizer{}, links);
  const std::vector<float> init = f.Init();
  auto half = [&](int first, int end, int shard) {
    auto s = std::make_unique<HostPsShard>(AdamWConfig{}, f.layout, 0, shard, first, end, 2);
    EXPECT_TRUE(s->SetState(init.data() + f.layout.Range(first, end).first, nullptr, nullptr).ok());
    return s;
  };
  host.AddPending([&]() -> absl::StatusOr<std::unique_ptr<PsShard>> { return half(0, tensors / 2, 0); }, -1);
  host.Add(half(tensors / 2, tensors, 1));
  ASSERT_TRUE(host.ReduceNorm(0).ok());
  ASSERT_TRUE(host.Step(0).ok());
  EXPECT_EQ(sent, (std::vector<int>{0, 0, 1, 1}));
}

// A version that ends before its first exchange drops a pending shard unmade (the next reads it
// again); one whose state cannot be read fails the exchange with the reader's error.
TEST(PsHost, AnUnmadePendingShardIsDroppedAndOneThatCannotBeMadeFailsTheExchange) {
  Fixture f;
  PsHost ended(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  ended.AddPending(
      [&]() -> absl::StatusOr<std::unique_ptr<PsShard>> {
        ADD_FAILURE() << "made by Release";
        return f.Shard();
      },
      4);
  EXPECT_TRUE(ended.Release().empty());
  EXPECT_TRUE(ended.shards().empty());

  PsHost unreadable(7, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  unreadable.AddPending(
      []() -> absl::StatusOr<std::unique_ptr<PsShard>> {
        return absl::DataLossError("optimizer.safetensors: checksum mismatch");
      },
      -1);
  const absl::Status s = unreadable.ReduceNorm(0);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), "optimizer.safetensors: checksum mismatch");
}

// Local updates: the pushes are the replicas' changes since the last exchange; their average
// moves the parameters by Nesterov momentum, with no norm reduced, and the momentum is kept (in the
// checkpoint's first moment) from one exchange to the next.
TEST(PsHost, LocalUpdatesStepTheAveragedChangeWithNesterovMomentum) {
  Fixture f;
  const size_t n = f.layout.total();
  PsHost host(1, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{true, 0.7f, 0.9f, WireDtype::kAuto, {}}, f.Links());
  host.Add(f.Shard());
  std::vector<float> want = f.Init(), momentum(n, 0.0f);
  for (int exchange = 0; exchange < 2; ++exchange) {
    for (int r = 0; r < 2; ++r) {
      f.pushes[r].resize(n);
      for (size_t i = 0; i < n; ++i) f.pushes[r][i] = 0.01f * std::cos(0.3f * static_cast<float>(i) + r + exchange);
    }
    for (size_t i = 0; i < n; ++i) {
      const float g = (f.pushes[0][i] + f.pushes[1][i]) * 0.5f;
      momentum[i] = 0.9f * momentum[i] + g;
      want[i] -= 0.7f * (g + 0.9f * momentum[i]);
    }
    ASSERT_TRUE(host.ReduceNorm(exchange).ok());
    auto step = host.Step(exchange);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_FLOAT_EQ(step->lr, 0.7f);
    EXPECT_GT(step->grad_norm, 0);
  }
  EXPECT_TRUE(f.reports.empty()) << "the outer step is not clipped: no norm is reduced";
  const PsShard& shard = *host.shards()[0];
  std::vector<float> params(n), m(n), v(n);
  ASSERT_TRUE(host.shards()[0]->GetState(params.data(), m.data(), v.data()).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(params[i], want[i], 1e-6f) << "parameter " << i;
    ASSERT_NEAR(m[i], momentum[i], 1e-7f) << "momentum " << i;
  }
  EXPECT_EQ(shard.size(), n);
}

// Local updates over int4 or topk: the host sends the replicas its parameters' change in that
// dtype with error feedback and holds what they then hold (its parameters before the step plus the
// change as they decode it); the residual lives in the shard's second-moment slot, so a host made
// anew from the shard's state (a checkpoint's) goes on bitwise as the first would have.
class LossyChange : public ::testing::TestWithParam<WireDtype> {};
TEST_P(LossyChange, LocalUpdatesSendTheChangeAndHoldWhatTheReplicasHold) {
  const WireDtype lossy = GetParam();
  Fixture f;
  const size_t n = f.layout.total();
  std::vector<std::vector<float>> received;  // what replica 1 decodes, per exchange
  std::vector<WireDtype> dtypes;
  PsLinks links = f.Links();
  links.send_params = [&](int64_t, int replica, int, const float* data, size_t count, WireDtype dtype) {
    if (replica != 1) return;
    received.emplace_back(count);
    RoundThroughWire(data, received.back().data(), count, dtype);
    dtypes.push_back(dtype);
  };
  const OuterOptimizer outer{true, 0.7f, 0.9f, lossy, [](int64_t it) { return it < 0; }};
  auto exchange = [&](PsHost& host, int it) {
    for (int r = 0; r < 2; ++r) {
      f.pushes[r].resize(n);
      for (size_t i = 0; i < n; ++i) f.pushes[r][i] = 0.01f * std::cos(0.3f * static_cast<float>(i) + r + it);
    }
    ASSERT_TRUE(host.ReduceNorm(it).ok());
    ASSERT_TRUE(host.Step(it).ok());
  };
  PsHost host(1, 0, 2, 1, kSchedule, 1.0f, outer, links);
  host.Add(f.Shard());
  std::vector<float> replica = f.Init();  // what replica 1 holds: the initial parameters, then + changes
  for (int it = 0; it < 3; ++it) {
    exchange(host, it);
    ASSERT_EQ(dtypes.back(), lossy);
    for (size_t i = 0; i < n; ++i) replica[i] += received.back()[i];
    const float* held = *host.shards()[0]->Params();
    ASSERT_EQ(std::vector<float>(held, held + n), replica) << "exchange " << it;
  }
  // A host made from the shard's state goes on as this one.
  std::vector<float> params(n), m(n), v(n);
  ASSERT_TRUE(host.shards()[0]->GetState(params.data(), m.data(), v.data()).ok());
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.0f) << "the residual is kept with the shard";
  auto copy = f.Shard();
  ASSERT_TRUE(copy->SetState(params.data(), m.data(), v.data()).ok());
  PsHost resumed(1, 0, 2, 1, kSchedule, 1.0f, outer, links);
  resumed.Add(std::move(copy));
  exchange(host, 3);
  const std::vector<float> original = received.back();
  exchange(resumed, 3);
  EXPECT_EQ(received.back(), original) << "the resumed host's change differs";
  EXPECT_EQ(std::vector<float>(*host.shards()[0]->Params(), *host.shards()[0]->Params() + n),
            std::vector<float>(*resumed.shards()[0]->Params(), *resumed.shards()[0]->Params() + n));
}
INSTANTIATE_TEST_SUITE_P(PsHost, LossyChange, ::testing::Values(WireDtype::kInt4, WireDtype::kTopK),
                         [](const ::testing::TestParamInfo<WireDtype>& p) { return WireDtypeName(p.param); });

TEST(PsHost, RefusesAPushOfTheWrongSizeAndANormThatIsNotFinite) {
  Fixture f;
  f.pushes[0].assign(f.layout.total(), 1.0f);
  f.pushes[1].assign(3, 1.0f);
  PsHost host(0, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  host.Add(f.Shard());
  EXPECT_EQ(host.ReduceNorm(0).code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status early = host.Step(0).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("before its gradient norm was reduced"), std::string::npos) << early;

  Fixture g;
  g.pushes[0].assign(g.layout.total(), 1.0f);
  g.pushes[1].assign(g.layout.total(), 1.0f);
  g.norm = std::nan("");
  PsHost nan_host(0, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, g.Links());
  nan_host.Add(g.Shard());
  const absl::Status s = nan_host.ReduceNorm(3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("iteration 4: gradient norm nan is not finite"), std::string::npos) << s;
  EXPECT_EQ(nan_host.Step(3).status().code(), absl::StatusCode::kFailedPrecondition) << "no step without a norm";
}

TEST(PsHost, HostingNoShardStepsNothing) {
  Fixture f;
  PsHost host(0, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  ASSERT_TRUE(host.ReduceNorm(0).ok());
  auto step = host.Step(0);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->lr, 0);
  EXPECT_TRUE(f.reports.empty());
}

TEST(PsHost, CheckpointsEveryShardAndReportsIt) {
  Fixture f;
  PsHost host(2, 0, 2, 1, kSchedule, 1.0f, OuterOptimizer{}, f.Links());
  host.Add(f.Shard());
  const std::string root = ::testing::TempDir() + "/ps_host_" + std::to_string(getpid());
  std::vector<proto::CheckpointReport> reports;
  ASSERT_TRUE(host.Checkpoint(5, root, nlohmann::json::object(), [&](const proto::CheckpointReport& r) {
                    reports.push_back(r);
                    return absl::OkStatus();
                  }).ok());
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].worker_id(), 2);
  EXPECT_EQ(reports[0].step(), 5);
  EXPECT_EQ(reports[0].directory(), ShardCheckpointRoot(root, 0, 0));
  const PsShard& shard = *host.shards()[0];
  std::vector<float> params(shard.size()), m(shard.size()), v(shard.size());
  auto loaded = LoadCheckpoint(reports[0].directory() + "/" + CheckpointName(5), shard.layout(), params.data(),
                               m.data(), v.data());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(params, f.Init());
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace longhaul
