#include "checkpoint/hf_gpt2.h"

#include <cmath>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "model/layer_norm.h"
#include "util/atomic_file.h"
#include "util/status_macros.h"
#include "util/bounded_json.h"
#include "util/files.h"

namespace longhaul {
namespace {

namespace fs = std::filesystem;

// The Conv1D weights, stored (in, out).
bool IsConv1D(const std::string& name) {
  for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (absl::EndsWith(name, suffix)) return true;
  return false;
}

std::string HfName(const std::string& name) { return name == "lm_head.weight" ? name : "transformer." + name; }

// (rows, cols) into (cols, rows).
std::vector<float> Transposed(const float* src, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = src[r * cols + c];
  return out;
}

std::string ShapeText(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace

absl::StatusOr<ModelConfig> ReadHfGpt2Config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  LH_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  const nlohmann::json j = ParseBoundedJson(text);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object: not a Hugging Face config.json"));
  }
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (j.contains("model_type") && j["model_type"] != "gpt2") {
    return bad(absl::StrCat("model_type is ", j["model_type"].dump(), "; longhaul reads GPT-2 checkpoints (\"gpt2\")"));
  }
  ModelConfig c;
  auto positive = [&](const char* key, int* out) -> absl::Status {
    if (!j.contains(key)) return bad(absl::StrCat("no ", key));
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1 || j[key].get<int64_t>() > (1 << 24)) {
      return bad(absl::StrCat(key, " is ", j[key].dump(), ", not a positive count"));
    }
    *out = static_cast<int>(j[key].get<int64_t>());
    return absl::OkStatus();
  };
  LH_RETURN_IF_ERROR(positive("vocab_size", &c.vocab_size));
  LH_RETURN_IF_ERROR(positive("n_positions", &c.max_seq_len));
  LH_RETURN_IF_ERROR(positive("n_layer", &c.n_layer));
  LH_RETURN_IF_ERROR(positive("n_head", &c.n_head));
  LH_RETURN_IF_ERROR(positive("n_embd", &c.d_model));
  // An optional key: null or absent is its default; another type than GPT-2's is an error, not a throw.
  using Is = bool (nlohmann::json::*)() const noexcept;
  auto optional = [&](const char* key, Is is, const char* type) -> absl::StatusOr<const nlohmann::json*> {
    if (!j.contains(key) || j[key].is_null()) return nullptr;
    if (!(j[key].*is)()) return bad(absl::StrCat(key, " is ", j[key].dump(), ", not ", type));
    return &j[key];
  };
  LH_ASSIGN_OR_RETURN(const nlohmann::json* tie, optional("tie_word_embeddings", &nlohmann::json::is_boolean, "a boolean"));
  c.tied_head = tie == nullptr || tie->get<bool>();
  // What longhaul's GPT-2 fixes and a config could change.
  LH_ASSIGN_OR_RETURN(const nlohmann::json* act, optional("activation_function", &nlohmann::json::is_string, "a string"));
  const std::string activation = act != nullptr ? act->get<std::string>() : "gelu_new";
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    return bad(absl::StrCat("activation_function is \"", activation,
                            "\"; longhaul's GPT-2 uses the tanh GELU (\"gelu_new\")"));
  }
  LH_ASSIGN_OR_RETURN(const nlohmann::json* eps_key, optional("layer_norm_epsilon", &nlohmann::json::is_number, "a number"));
  const double eps = eps_key != nullptr ? eps_key->get<double>() : kLayerNormEpsilon;
  if (std::abs(eps - kLayerNormEpsilon) > 1e-12) {
    return bad(absl::StrFormat("layer_norm_epsilon is %g; longhaul's LayerNorm uses %g", eps, kLayerNormEpsilon));
  }
  LH_ASSIGN_OR_RETURN(const nlohmann::json* inner, optional("n_inner", &nlohmann::json::is_number_integer, "an integer"));
  if (inner != nullptr && inner->get<int64_t>() != 4 * static_cast<int64_t>(c.d_model)) {
    return bad(absl::StrCat("n_inner is ", inner->dump(), "; longhaul's MLP is 4 x n_embd wide"));
  }
  LH_ASSIGN_OR_RETURN(const nlohmann::json* scaled, optional("scale_attn_weights", &nlohmann::json::is_boolean, "a boolean"));
  LH_ASSIGN_OR_RETURN(const nlohmann::json* by_layer,
                      optional("scale_attn_by_inverse_layer_idx", &nlohmann::json::is_boolean, "a boolean"));
  if ((scaled != nullptr && !scaled->get<bool>()) || (by_layer != nullptr && by_layer->get<bool>())) {
    return bad("attention scores scaled other than by 1/sqrt(head size); longhaul scales them by that alone");
  }
  if (c.d_model % c.n_head != 0) {
    return bad(absl::StrFormat("n_embd = %d is not divisible by n_head = %d", c.d_model, c.n_head));
  }
  return c;
}

absl::Status ImportHfGpt2(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout, float* params) {
  LH_ASSIGN_OR_RETURN(const ModelConfig file, ReadHfGpt2Config(dir));
  std::vector<std::string> differ, fixes;
  auto compare = [&](const char* key, int was, int is) {
    if (was == is) return;
    differ.push_back(absl::StrFormat("%s = %d (the config has %d)", key, was, is));
    fixes.push_back(absl::StrFormat("--set %s=%d", key, was));
  };
  compare("model.vocab_size", file.vocab_size, cfg.vocab_size);
  compare("model.max_seq_len", file.max_seq_len, cfg.max_seq_len);
  compare("model.n_layer", file.n_layer, cfg.n_layer);
  compare("model.n_head", file.n_head, cfg.n_head);
  compare("model.d_model", file.d_model, cfg.d_model);
  // A GPT-2 trained without a subspace would change where its residual stream is cut to one.
  compare("model.subspace_divisor", file.subspace_divisor, cfg.subspace_divisor);
  if (cfg.tied_head && !file.tied_head) {
    differ.push_back("an untied head (the config ties it)");
    fixes.push_back("--set model.tied_head=false");
  }
  if (!differ.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("the GPT-2 checkpoint in ", dir, " has ",
                                                      absl::StrJoin(differ, ", "), ": start it with ",
                                                      absl::StrJoin(fixes, " ")));
  }
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  LH_ASSIGN_OR_RETURN(const Safetensors st, ReadSafetensors(path));
  auto find = [&](const std::string& name) -> const LoadedTensor* {
    for (const std::string& key : {HfName(name), name}) {
      auto it = st.tensors.find(key);
      if (it != st.tensors.end()) return &it->second;
    }
    return nullptr;
  };
  for (const ParamTensor& t : layout.tensors()) {
    const LoadedTensor* src = find(t.name);
    // A tied file's head is its embedding; an untied one's must be there.
    if (src == nullptr && t.name == "lm_head.weight" && file.tied_head) src = find("wte.weight");
    if (src == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " has no tensor ", HfName(t.name), ": not a GPT-2 checkpoint, or one saved incompletely"));
    }
    const bool conv = IsConv1D(t.name);
    const std::vector<int64_t> want = conv ? std::vector<int64_t>{t.shape[1], t.shape[0]} : t.shape;
    if (src->shape != want) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": tensor ", HfName(t.name), " has shape ",
                                                        ShapeText(src->shape), ", GPT-2's of this config is ",
                                                        ShapeText(want)));
    }
    if (conv) {
      const std::vector<float> w = Transposed(src->data.data(), want[0], want[1]);
      std::copy(w.begin(), w.end(), params + t.offset);
    } else {
      std::copy(src->data.begin(), src->data.end(), params + t.offset);
    }
  }
  return absl::OkStatus();
}

absl::Status ExportHfGpt2(const ModelConfig& cfg, const float* params, const std::string& out_dir) {
  const ParamLayout whole(cfg, StageSpec::Whole(cfg));
  std::vector<std::vector<float>> transposed;
  transposed.reserve(whole.tensors().size());
  std::vector<TensorView> views;
  for (const ParamTensor& t : whole.tensors()) {
    if (IsConv1D(t.name)) {
      transposed.push_back(Transposed(params + t.offset, t.shape[0], t.shape[1]));
      views.push_back({HfName(t.name), {t.shape[1], t.shape[0]}, transposed.back().data()});
    } else {
      views.push_back({HfName(t.name), t.shape, params + t.offset});
    }
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  LH_RETURN_IF_ERROR(
      WriteSafetensors((fs::path(out_dir) / "model.safetensors").string(), views, {{"format", "pt"}}).status());
  nlohmann::ordered_json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", cfg.vocab_size},
      {"n_positions", cfg.max_seq_len},
      {"n_ctx", cfg.max_seq_len},
      {"n_embd", cfg.d_model},
      {"n_layer", cfg.n_layer},
      {"n_head", cfg.n_head},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", kLayerNormEpsilon},
      {"initializer_range", 0.02},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", cfg.tied_head},
      {"torch_dtype", "float32"}};
  // GPT-2's <|endoftext|>, where the vocabulary is GPT-2's; others name no special token.
  if (cfg.vocab_size == 50257) config["bos_token_id"] = config["eos_token_id"] = 50256;
  return WriteFileAtomically((fs::path(out_dir) / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace longhaul
