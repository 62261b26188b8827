// Hugging Face GPT-2 checkpoints in and out. The fixture (tests/reference/hf_gpt2.py make-fixture)
// is a small GPT-2 saved as the Hub's gpt2 is (no "transformer." prefix, the attention mask
// buffers, a tied head) with the logits PyTorch computes for 20 tokens: imported, longhaul's
// model gives the same distribution; exported again, every tensor is bitwise the file's.
#include "checkpoint/hf_gpt2.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "cpu/gpt_stage.h"
#include "util/files.h"
#include "worker/stage_factory.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

const std::string kFixture = std::string(LONGHAUL_FIXTURES) + "/hf_gpt2";

fs::path TempDir(const std::string& what) {
  const fs::path d = fs::path(::testing::TempDir()) / ("hf_gpt2_" + std::to_string(::getpid()) + "_" + what);
  fs::remove_all(d);
  return d;
}

std::vector<float> Imported(const ModelConfig& cfg, const std::string& dir = kFixture) {
  const ParamLayout whole(cfg, StageSpec::Whole(cfg));
  std::vector<float> params(whole.total());
  const absl::Status s = ImportHfGpt2(dir, cfg, whole, params.data());
  EXPECT_TRUE(s.ok()) << s;
  return params;
}

// longhaul's (T, V) probabilities of `tokens` under the whole model `params`.
std::vector<float> Probabilities(const ModelConfig& cfg, const std::vector<float>& params, const std::vector<int>& tokens) {
  const int T = static_cast<int>(tokens.size());
  auto stage = GptStage::Create(cfg, StageSpec::Whole(cfg), 1, T, false);
  EXPECT_TRUE(stage.ok()) << stage.status();
  std::copy(params.begin(), params.end(), (*stage)->params());
  MicroBatch mb;
  mb.B = 1, mb.T = T, mb.tokens = tokens;
  mb.targets.assign(T, 0);
  mb.loss_weight.assign(T, 1.0f);
  mb.prefix_len.assign(1, 0);
  auto act = (*stage)->NewActivations();
  (*stage)->Forward(*act, mb, nullptr);
  const float* probs = (*stage)->Probs(*act);
  return std::vector<float>(probs, probs + static_cast<size_t>(T) * cfg.vocab_size);
}

// The largest difference of softmax(logits), rows of V, from `probs`.
double LargestDifference(const std::vector<double>& logits, const std::vector<float>& probs, int V) {
  double worst = 0;
  for (size_t row = 0; row * V < logits.size(); ++row) {
    const double* l = &logits[row * V];
    const double top = *std::max_element(l, l + V);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - top);
    for (int v = 0; v < V; ++v) worst = std::max(worst, std::abs(std::exp(l[v] - top) / sum - probs[row * V + v]));
  }
  return worst;
}

TEST(HfGpt2, TheImportedModelGivesPyTorchsDistribution) {
  const absl::StatusOr<ModelConfig> cfg = ReadHfGpt2Config(kFixture);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->tied_head);
  EXPECT_EQ(cfg->n_layer, 2);
  const std::vector<float> params = Imported(*cfg);
  const absl::StatusOr<Safetensors> ref = ReadSafetensors(kFixture + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<int> tokens;
  for (float t : ref->tensors.at("tokens").data) tokens.push_back(static_cast<int>(t));
  const std::vector<float>& logits = ref->tensors.at("logits").data;
  const double worst = LargestDifference(std::vector<double>(logits.begin(), logits.end()),
                                         Probabilities(*cfg, params, tokens), cfg->vocab_size);
  std::cout << "largest difference of a probability from PyTorch's (float64): " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
}

TEST(HfGpt2, AnExportedImportHoldsTheFilesTensorsBitwise) {
  const ModelConfig cfg = *ReadHfGpt2Config(kFixture);
  const std::vector<float> params = Imported(cfg);
  const fs::path out = TempDir("export");
  ASSERT_TRUE(ExportHfGpt2(cfg, params.data(), out.string()).ok());
  const Safetensors original = *ReadSafetensors(kFixture + "/model.safetensors");
  const absl::StatusOr<Safetensors> exported = ReadSafetensors((out / "model.safetensors").string());
  ASSERT_TRUE(exported.ok()) << exported.status();
  size_t compared = 0;
  for (const auto& [name, t] : original.tensors) {
    if (absl::EndsWith(name, ".attn.bias")) continue;  // a mask buffer, not a parameter
    auto it = exported->tensors.find("transformer." + name);
    ASSERT_NE(it, exported->tensors.end()) << name;
    EXPECT_EQ(it->second.shape, t.shape) << name;
    ASSERT_EQ(it->second.data.size(), t.data.size()) << name;
    EXPECT_EQ(std::memcmp(it->second.data.data(), t.data.data(), t.data.size() * sizeof(float)), 0) << name;
    ++compared;
  }
  EXPECT_EQ(exported->tensors.size(), compared) << "a tied head writes no lm_head.weight";
  const absl::StatusOr<ModelConfig> again = ReadHfGpt2Config(out.string());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->vocab_size, cfg.vocab_size);
  EXPECT_EQ(again->max_seq_len, cfg.max_seq_len);
  EXPECT_EQ(again->d_model, cfg.d_model);
  EXPECT_TRUE(again->tied_head);
}

TEST(HfGpt2, AnUntiedHeadStartsFromTheEmbeddingAndIsExportedAsItsOwn) {
  ModelConfig cfg = *ReadHfGpt2Config(kFixture);
  cfg.tied_head = false;
  const ParamLayout whole(cfg, StageSpec::Whole(cfg));
  std::vector<float> params = Imported(cfg);
  const ParamTensor& wte = whole.tensors()[whole.wte()];
  const ParamTensor& head = whole.tensors()[whole.lm_head()];
  EXPECT_TRUE(std::equal(params.begin() + wte.offset, params.begin() + wte.offset + wte.size,
                         params.begin() + head.offset));
  params[head.offset] += 1.0f;  // trained apart
  const fs::path out = TempDir("untied");
  ASSERT_TRUE(ExportHfGpt2(cfg, params.data(), out.string()).ok());
  EXPECT_FALSE(ReadHfGpt2Config(out.string())->tied_head);
  EXPECT_EQ(Imported(cfg, out.string()), params);
  ModelConfig tied = cfg;
  tied.tied_head = true;
  std::vector<float> unused(ParamLayout(tied, StageSpec::Whole(tied)).total());
  const absl::Status s = ImportHfGpt2(out.string(), tied, ParamLayout(tied, StageSpec::Whole(tied)), unused.data());
  EXPECT_NE(s.message().find("--set model.tied_head=false"), std::string::npos) << s;
}

// A subspace model is a GPT-2 with zeros where its constraint puts them: it exports as one, which
// a plain config imports bitwise; a GPT-2 into a subspace config is refused with the fix.
TEST(HfGpt2, ASubspaceModelExportsAsTheGpt2ItIsAndNoneIsImportedIntoOne) {
  ModelConfig cfg = *ReadHfGpt2Config(kFixture);
  cfg.subspace_divisor = 2;
  const ParamLayout whole(cfg, StageSpec::Whole(cfg));
  std::vector<float> params(whole.total());
  InitGpt2Params(cfg, whole, 7, params.data());
  const fs::path out = TempDir("subspace");
  ASSERT_TRUE(ExportHfGpt2(cfg, params.data(), out.string()).ok());
  ModelConfig plain = cfg;
  plain.subspace_divisor = 1;
  EXPECT_EQ(Imported(plain, out.string()), params);
  const absl::Status s = ImportHfGpt2(out.string(), cfg, whole, params.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--set model.subspace_divisor=1"), std::string::npos) << s;
}

TEST(HfGpt2, ACheckpointOfAnotherShapeOrAnotherGpt2IsRefusedWithTheFix) {
  ModelConfig cfg = *ReadHfGpt2Config(kFixture);
  cfg.n_layer = 3, cfg.max_seq_len = 64;
  std::vector<float> params(ParamLayout(cfg, StageSpec::Whole(cfg)).total());
  absl::Status s = ImportHfGpt2(kFixture, cfg, ParamLayout(cfg, StageSpec::Whole(cfg)), params.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part : {"model.n_layer = 2 (the config has 3)", "--set model.n_layer=2", "--set model.max_seq_len=24"})
    EXPECT_NE(s.message().find(part), std::string::npos) << part << "\n" << s;

  const fs::path other = TempDir("relu");
  fs::create_directories(other);
  fs::copy_file(kFixture + "/model.safetensors", other / "model.safetensors");
  std::ofstream(other / "config.json") << R"({"model_type": "gpt2", "vocab_size": 64, "n_positions": 24, "n_embd": 32,
      "n_layer": 2, "n_head": 4, "activation_function": "relu"})";
  s = ReadHfGpt2Config(other.string()).status();
  EXPECT_NE(s.message().find("activation_function is \"relu\""), std::string::npos) << s;
  std::ofstream(other / "config.json") << "[1, 2]";
  EXPECT_EQ(ReadHfGpt2Config(other.string()).status().code(), absl::StatusCode::kInvalidArgument);
  // A key of another type than GPT-2's is named, never thrown.
  for (const auto& [key, value, says] :
       {std::tuple{"tie_word_embeddings", "\"yes\"", "not a boolean"}, {"layer_norm_epsilon", "\"1e-5\"", "not a number"},
        {"activation_function", "7", "not a string"}, {"n_inner", "[1]", "not an integer"}}) {
    std::ofstream(other / "config.json") << R"({"vocab_size": 64, "n_positions": 24, "n_embd": 32, "n_layer": 2,
        "n_head": 4, ")" << key << "\": " << value << "}";
    s = ReadHfGpt2Config(other.string()).status();
    EXPECT_NE(s.message().find(absl::StrCat(key, " is ", value, ", ", says)), std::string::npos) << s;
  }
  std::ofstream(other / "config.json") << R"({"vocab_size": 64, "n_positions": 24, "n_embd": 30, "n_layer": 2, "n_head": 4})";
  s = ReadHfGpt2Config(other.string()).status();
  EXPECT_NE(s.message().find("n_embd = 30 is not divisible by n_head = 4"), std::string::npos) << s;

  // A file lacking a tensor, and one whose tensor has another shape.
  const ModelConfig good = *ReadHfGpt2Config(kFixture);
  Safetensors st = *ReadSafetensors(kFixture + "/model.safetensors");
  fs::copy_file(kFixture + "/config.json", other / "config.json", fs::copy_options::overwrite_existing);
  auto write_without = [&](const std::string& drop, const std::string& reshape) {
    std::vector<TensorView> views;
    for (const auto& [name, t] : st.tensors) {
      if (name == drop) continue;
      std::vector<int64_t> shape = t.shape;
      if (name == reshape) std::swap(shape[0], shape[1]);
      views.push_back({name, shape, t.data.data()});
    }
    ASSERT_TRUE(WriteSafetensors((other / "model.safetensors").string(), views, {}).ok());
  };
  std::vector<float> buf(ParamLayout(good, StageSpec::Whole(good)).total());
  write_without("h.1.mlp.c_fc.weight", "");
  s = ImportHfGpt2(other.string(), good, ParamLayout(good, StageSpec::Whole(good)), buf.data());
  EXPECT_NE(s.message().find("has no tensor transformer.h.1.mlp.c_fc.weight"), std::string::npos) << s;
  write_without("", "h.0.attn.c_proj.weight");
  EXPECT_TRUE(ImportHfGpt2(other.string(), good, ParamLayout(good, StageSpec::Whole(good)), buf.data()).ok())
      << "a square matrix's shape reads the same either way";
  write_without("", "h.0.mlp.c_fc.weight");
  s = ImportHfGpt2(other.string(), good, ParamLayout(good, StageSpec::Whole(good)), buf.data());
  EXPECT_NE(s.message().find("has shape [128, 32], GPT-2's of this config is [32, 128]"), std::string::npos) << s;
  // An untied file must hold its head.
  write_without("", "");
  std::ofstream(other / "config.json") << R"({"vocab_size": 64, "n_positions": 24, "n_embd": 32, "n_layer": 2,
      "n_head": 4, "tie_word_embeddings": false})";
  ModelConfig untied = good;
  untied.tied_head = false;
  std::vector<float> untied_buf(ParamLayout(untied, StageSpec::Whole(untied)).total());
  s = ImportHfGpt2(other.string(), untied, ParamLayout(untied, StageSpec::Whole(untied)), untied_buf.data());
  EXPECT_NE(s.message().find("has no tensor lm_head.weight"), std::string::npos) << s;
}

// An exported longhaul model (untied, GPT-2 initialised, four layers) loaded by PyTorch gives
// longhaul's distribution: transformers' GPT2LMHeadModel where installed, else the reference
// loader tests/reference/hf_gpt2.py. Skipped without Debian's python3-torch.
TEST(HfGpt2, PyTorchLoadsAnExportWithLonghaulsDistribution) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs Debian's python3-torch (bash deploy/setup.sh --with-torch)";
  }
  ModelConfig cfg;
  cfg.vocab_size = 80, cfg.max_seq_len = 16, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  const ParamLayout whole(cfg, StageSpec::Whole(cfg));
  std::vector<float> params(whole.total());
  InitGpt2Params(cfg, whole, 11, params.data());
  for (size_t i = 0; i < params.size(); ++i) params[i] += 0.05f * std::sin(0.37f * static_cast<float>(i));  // trained
  const fs::path out = TempDir("torch");
  ASSERT_TRUE(ExportHfGpt2(cfg, params.data(), out.string()).ok());
  const std::vector<int> tokens = {3, 79, 0, 41, 41, 7, 12, 64, 5, 33, 2, 70};
  std::string list;
  for (int t : tokens) list += (list.empty() ? "" : ",") + std::to_string(t);
  const std::string json_path = (out / "logits.json").string();
  const std::string cmd = "/usr/bin/python3 " + std::string(LONGHAUL_SOURCE_DIR) + "/tests/reference/hf_gpt2.py logits " +
                          out.string() + " --tokens " + list + " > " + json_path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json ref = nlohmann::json::parse(*ReadWholeFile(json_path));
  std::vector<double> logits;
  for (const nlohmann::json& row : ref["logits"]) {
    ASSERT_EQ(static_cast<int>(row.size()), cfg.vocab_size);
    for (double l : row.get<std::vector<double>>()) logits.push_back(l);
  }
  ASSERT_EQ(logits.size(), tokens.size() * cfg.vocab_size);
  const double worst = LargestDifference(logits, Probabilities(cfg, params, tokens), cfg.vocab_size);
  std::cout << ref["loader"].get<std::string>() << " on the export: largest difference of a probability from "
            << "longhaul's " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
}

// train.init_from reaches every stage of any cut: a later stage holds the whole import's tensors
// of its blocks and head.
TEST(HfGpt2, InitFromStartsAnyStageFromTheCheckpoint) {
  JobConfig cfg;
  cfg.model = *ReadHfGpt2Config(kFixture);
  cfg.model.tied_head = false;
  cfg.cluster.stages = 2;
  cfg.train.seq_len = 8;
  cfg.train.init_from = kFixture;
  const std::vector<float> whole_params = Imported(cfg.model);
  const ParamLayout whole(cfg.model, StageSpec::Whole(cfg.model));
  auto stage = MakeStage(StageRequestFor(cfg, 1, -1, 1));
  ASSERT_TRUE(stage.ok()) << stage.status();
  const float* params = *(*stage)->Params();
  for (const ParamTensor& t : (*stage)->layout().tensors()) {
    const ParamTensor& w = whole.tensors()[whole.Find(t.name)];
    EXPECT_TRUE(std::equal(params + t.offset, params + t.offset + t.size, whole_params.begin() + w.offset)) << t.name;
  }
  cfg.train.init_from = "/nonexistent";
  const absl::Status s = MakeStage(StageRequestFor(cfg, 1, -1, 1)).status();
  EXPECT_NE(s.message().find("train.init_from = \"/nonexistent\""), std::string::npos) << s;
}

}  // namespace
}  // namespace longhaul
