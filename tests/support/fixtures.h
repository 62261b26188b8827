#pragma once
// The PyTorch parity fixtures of tests/reference/make_fixtures.py: initial weights, inputs,
// logits, loss, gradients and the losses of 10 AdamW steps, for the CPU and CUDA parity tests.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "model/micro_batch.h"
#include "model/model_config.h"

namespace longhaul::testing {

inline const std::vector<std::string>& FixtureNames() {
  static const std::vector<std::string> names = {"causal_untied", "causal_tied_lossmask", "prefix_untied",
                                                 "prefix_tied_lossmask"};
  return names;
}

struct Fixture {
  Safetensors st;
  nlohmann::json cfg;
  const std::vector<float>& T(const std::string& name) const { return st.tensors.at(name).data; }
};

// The fixtures' folder: $LONGHAUL_FIXTURES (set by deploy/pack.sh's runner), else the source tree's.
inline std::string FixtureDir() {
  const char* env = std::getenv("LONGHAUL_FIXTURES");
  return env != nullptr ? env : LONGHAUL_FIXTURES;
}

inline Fixture LoadFixture(const std::string& name) {
  auto st = ReadSafetensors(FixtureDir() + "/" + name + ".safetensors");
  EXPECT_TRUE(st.ok()) << st.status();
  return Fixture{*st, nlohmann::json::parse(st->metadata.at("config"))};
}

inline ModelConfig ModelOf(const nlohmann::json& c) {
  ModelConfig m;
  m.vocab_size = c["vocab_size"], m.max_seq_len = c["max_seq_len"], m.n_layer = c["n_layer"];
  m.n_head = c["n_head"], m.d_model = c["d_model"], m.tied_head = c["tied_head"];
  m.attention = c["attention"] == "prefix_lm" ? AttentionMask::kPrefixLm : AttentionMask::kCausal;
  return m;
}

inline std::vector<MicroBatch> MicroBatchesOf(const Fixture& f) {
  const int M = f.cfg["M"], B = f.cfg["B"], T = f.cfg["T"];
  std::vector<MicroBatch> out(M);
  for (int m = 0; m < M; ++m) {
    MicroBatch& mb = out[m];
    mb.B = B, mb.T = T;
    for (int i = 0; i < B * T; ++i) {
      mb.tokens.push_back(static_cast<int>(f.T("input.tokens")[m * B * T + i]));
      mb.targets.push_back(static_cast<int>(f.T("input.targets")[m * B * T + i]));
      mb.loss_weight.push_back(f.T("input.loss_weight")[m * B * T + i]);
    }
    for (int b = 0; b < B; ++b) mb.prefix_len.push_back(static_cast<int>(f.T("input.prefix_len")[m * B + b]));
  }
  return out;
}

// Softmax of the reference logits of micro-batch 0 against `probs`: the largest absolute error.
inline double MaxProbError(const Fixture& f, const float* probs) {
  const int B = f.cfg["B"], T = f.cfg["T"], V = f.cfg["vocab_size"];
  const std::vector<float>& logits = f.T("out.logits");
  double err = 0;
  for (int n = 0; n < B * T; ++n) {
    const float* l = logits.data() + static_cast<size_t>(n) * V;
    double mx = l[0], sum = 0;
    for (int v = 0; v < V; ++v) mx = std::max<double>(mx, l[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    for (int v = 0; v < V; ++v) err = std::max(err, std::abs(std::exp(l[v] - mx) / sum - probs[n * V + v]));
  }
  return err;
}

// Relative L2 error of `got` against the fixture's tensor `name`.
inline double RelativeError(const Fixture& f, const std::string& name, const float* got) {
  const std::vector<float>& ref = f.T(name);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = got[i] - ref[i];
    num += d * d, den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace longhaul::testing
