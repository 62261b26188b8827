#pragma once
// AdamW over a flat parameter buffer (decoupled weight decay, bias correction), matching
// torch.optim.AdamW. The moments share the parameters' offset table, so a parameter server can
// own any contiguous shard of all three.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace longhaul {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

class AdamW {
 public:
  // Covers floats [begin, begin + decay.size()) of a flat buffer, decay[i] saying whether weight
  // decay applies to float begin + i (the model's layout says: ParamLayout::DecayFlags).
  AdamW(const AdamWConfig& cfg, std::vector<uint8_t> decay, size_t begin = 0);

  // One update of params[begin, end) with grads of the same range; `step` counts from 1.
  void Step(float* params, const float* grads, float lr, int64_t step);

  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }

 private:
  AdamWConfig cfg_;
  size_t begin_, end_;
  std::vector<float> m_, v_;
  std::vector<uint8_t> decay_;  // per element of the range: weight decay applies
};

}  // namespace longhaul
