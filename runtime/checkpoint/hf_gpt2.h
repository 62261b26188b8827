#pragma once
// Hugging Face GPT-2 checkpoints: a directory holding model.safetensors and config.json, as
// transformers' GPT2LMHeadModel saves and loads them.
//
// Its tensors are longhaul's under the same names behind "transformer." (files saved by other
// tools may lack the prefix), except that GPT-2's Conv1D stores the four matrices of a block
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) as (in, out) where longhaul's are (out, in); the
// head is tied to wte unless config.json says tie_word_embeddings = false, when lm_head.weight is
// its own. The attention mask buffers some files carry (attn.bias, attn.masked_bias) are not
// parameters and are ignored.
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace longhaul {

// The model shape config.json describes. A config whose GPT-2 differs from longhaul's in what
// the shape cannot say (another activation, LayerNorm epsilon or MLP width, scaled attention
// turned off) is refused with the key that differs.
absl::StatusOr<ModelConfig> ReadHfGpt2Config(const std::string& dir);

// Fills the tensors of `layout` (a stage's, or the whole model's) from the checkpoint in `dir`,
// whose shape must be `cfg`'s: the error names every key that differs and the --set that fixes
// it. A tied file starts an untied config's head from its wte; an untied file must hold
// lm_head.weight.
absl::Status ImportHfGpt2(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout, float* params);

// Writes the whole model (`params` laid out by ParamLayout(cfg, StageSpec::Whole(cfg))) into
// out_dir as model.safetensors and config.json.
absl::Status ExportHfGpt2(const ModelConfig& cfg, const float* params, const std::string& out_dir);

}  // namespace longhaul
