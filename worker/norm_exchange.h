#pragma once
// The global gradient norm for clipping, reduced by the parameter-server hosts among themselves:
// each sends Σ g² of every shard it hosts to every other host (one NORM tensor per host and
// iteration) and adds all of them up in (stage, shard) order, so every host reaches the same norm
// bit for bit one link latency after the last host's partials left, where a reduction at the
// coordinator cost a round trip through the coordinator's host.
#include <map>
#include <utility>
#include <vector>

#include "longhaul.pb.h"

namespace longhaul {

// Σ g² of the replica-averaged gradient of shard `shard` of stage `stage`.
struct ShardSquares {
  int stage = 0, shard = 0;
  double sum_squares = 0;
};

// A worker that hosts shards: the one at (stage, replica), its shards of that stage in the plan's
// order (the order its NORM tensor carries them in).
struct NormHost {
  int stage = 0, replica = 0;
  std::vector<int> shards;
};

// Every host of the plan, in the order of their first shards in the plan.
std::vector<NormHost> NormHosts(const proto::Plan& plan);

// Partials as a tensor: each double as the two floats of its bit pattern, sent on an fp32 wire,
// so it arrives bit for bit. DecodeSquares takes a size the admission checked to be even.
std::vector<float> EncodeSquares(const std::vector<double>& sums);
std::vector<double> DecodeSquares(const std::vector<float>& floats);

// √ of every shard's Σ g², added in (stage, shard) order.
double GlobalNorm(const std::map<std::pair<int, int>, double>& squares);

}  // namespace longhaul
