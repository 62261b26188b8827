#pragma once
// The median of a sample of timings (the upper one of an even count): a busy machine only ever
// adds time, so the middle of repeated measurements says more than their mean.
#include <algorithm>
#include <vector>

namespace longhaul {

// `v` must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace longhaul
