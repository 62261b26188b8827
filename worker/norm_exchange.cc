#include "worker/norm_exchange.h"

#include <cmath>
#include <cstring>

namespace longhaul {

std::vector<NormHost> NormHosts(const proto::Plan& plan) {
  std::vector<NormHost> hosts;
  for (const proto::ShardPlacement& sp : plan.shards()) {
    auto it = hosts.begin();
    while (it != hosts.end() && (it->stage != sp.stage() || it->replica != sp.owner_replica())) ++it;
    if (it == hosts.end()) it = hosts.insert(hosts.end(), NormHost{sp.stage(), sp.owner_replica(), {}});
    it->shards.push_back(sp.shard());
  }
  return hosts;
}

std::vector<float> EncodeSquares(const std::vector<double>& sums) {
  std::vector<float> floats(2 * sums.size());
  std::memcpy(floats.data(), sums.data(), sums.size() * sizeof(double));
  return floats;
}

std::vector<double> DecodeSquares(const std::vector<float>& floats) {
  std::vector<double> sums(floats.size() / 2);
  std::memcpy(sums.data(), floats.data(), sums.size() * sizeof(double));
  return sums;
}

double GlobalNorm(const std::map<std::pair<int, int>, double>& squares) {
  double sum = 0;
  for (const auto& [key, v] : squares) sum += v;
  return std::sqrt(sum);
}

}  // namespace longhaul
