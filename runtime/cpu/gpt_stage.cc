#include "cpu/gpt_stage.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "cpu/blas.h"
#include "cpu/denormals.h"
#include "cpu/ops.h"
#include "util/status_macros.h"

namespace longhaul {

// Everything one block keeps from forward for its backward. N = B·T rows.
struct GptStage::BlockActs {
  std::vector<float> ln1, ln1_mean, ln1_rstd;  // (N, C), (N), (N)
  std::vector<float> qkv;                      // (N, 3C)
  std::vector<float> att;                      // (B, NH, T, T) softmax probabilities
  std::vector<float> atty;                     // (N, C) attention output before projection
  std::vector<float> res2;                     // (N, C) x + attention branch
  std::vector<float> ln2, ln2_mean, ln2_rstd;  // (N, C), (N), (N)
  std::vector<float> fch, fch_gelu;            // (N, 4C) MLP hidden before and after GELU
  std::vector<float> out;                      // (N, C) res2 + MLP branch

  BlockActs(int B, int T, int C, int NH) {
    const size_t N = static_cast<size_t>(B) * T;
    ln1.resize(N * C), ln1_mean.resize(N), ln1_rstd.resize(N);
    qkv.resize(N * 3 * C);
    att.resize(static_cast<size_t>(B) * NH * T * T);
    atty.resize(N * C), res2.resize(N * C);
    ln2.resize(N * C), ln2_mean.resize(N), ln2_rstd.resize(N);
    fch.resize(N * 4 * C), fch_gelu.resize(N * 4 * C);
    out.resize(N * C);
  }
};

struct GptStage::Activations {
  std::vector<float> x0;                 // (N, C) stage input: embedding output or received activations
  std::vector<BlockActs> blocks;         // per block, without recompute
  std::vector<std::vector<float>> outs;  // (N, C) per block output, with recompute
  std::vector<float> lnf, lnf_mean, lnf_rstd;  // (N, C), (N), (N) last stage
  std::vector<float> probs, losses;            // (N, V), (N) last stage
};

GptStage::GptStage(const ModelConfig& cfg, const StageSpec& spec, int B, int T, bool recompute)
    : cfg_(cfg), spec_(spec), layout_(cfg, spec), B_(B), T_(T), recompute_(recompute),
      subspace_(layout_.SubspaceRuns()) {}

GptStage::~GptStage() = default;

absl::StatusOr<std::unique_ptr<GptStage>> GptStage::Create(const ModelConfig& cfg, const StageSpec& spec, int B,
                                                           int T, bool recompute) {
  LH_RETURN_IF_ERROR(cfg.Validate());
  LH_RETURN_IF_ERROR(spec.Validate(cfg));
  LH_RETURN_IF_ERROR(cpu::LoadBlas());
  cpu::FlushDenormals();
  if (B <= 0) return absl::InvalidArgumentError("micro-batch size must be positive");
  if (T <= 0 || T > cfg.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence length %d is longer than the position table (model.max_seq_len = %d): raise model.max_seq_len "
        "or lower train.seq_len",
        T, cfg.max_seq_len));
  }
  std::unique_ptr<GptStage> s(new GptStage(cfg, spec, B, T, recompute));
  const size_t N = static_cast<size_t>(B) * T, C = cfg.d_model;
  s->params_.assign(s->layout_.total(), 0.0f);
  s->grads_.assign(s->layout_.total(), 0.0f);
  if (recompute && spec.end_block > spec.first_block) s->recompute_acts_ = std::make_unique<BlockActs>(B, T, C, cfg.n_head);
  s->g_resid_.resize(N * C);
  s->g_ln_.resize(N * C);
  s->g_atty_.resize(N * C);
  s->g_qkv_.resize(N * 3 * C);
  s->g_fch_.resize(N * 4 * C);
  s->attn_scratch_.resize(cpu::AttentionScratchFloats(T));
  return s;
}

void GptStage::InitParams(uint64_t seed) {
  InitGpt2Params(cfg_, layout_, seed, params_.data());
  DrawFixedEmbedding(seed);
}

void GptStage::ZeroGrads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void GptStage::ActivationsDeleter::operator()(Activations* a) const { delete a; }

GptStage::ActivationsPtr GptStage::NewActivations() const {
  ActivationsPtr a(new Activations());
  const size_t N = static_cast<size_t>(B_) * T_, C = cfg_.d_model;
  a->x0.resize(N * C);
  const int nblocks = spec_.end_block - spec_.first_block;
  if (recompute_) {
    a->outs.assign(nblocks, std::vector<float>(N * C));
  } else {
    for (int i = 0; i < nblocks; ++i) a->blocks.emplace_back(B_, T_, C, cfg_.n_head);
  }
  if (spec_.has_head) {
    a->lnf.resize(N * C), a->lnf_mean.resize(N), a->lnf_rstd.resize(N);
    a->probs.resize(N * cfg_.vocab_size), a->losses.resize(N);
  }
  return a;
}

const float* GptStage::BlockInput(const Activations& act, int layer) const {
  if (layer == spec_.first_block) return act.x0.data();
  const int prev = layer - 1 - spec_.first_block;
  return recompute_ ? act.outs[prev].data() : act.blocks[prev].out.data();
}

const float* GptStage::Output(const Activations& act) const {
  return BlockInput(act, spec_.end_block);
}

const float* GptStage::Probs(const Activations& act) const { return act.probs.data(); }

bool GptStage::BlockForward(int layer, const float* x, BlockActs& a, const int* prefix) {
  const BlockTensors& w = layout_.block(layer);
  const int N = B_ * T_, C = cfg_.d_model;
  cpu::LayerNormForward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, P(w.ln1_w), P(w.ln1_b), N, C);
  cpu::LinearForward(a.qkv.data(), a.ln1.data(), P(w.qkv_w), P(w.qkv_b), N, C, 3 * C, false);
  cpu::AttentionForward(a.atty.data(), a.att.data(), a.qkv.data(), prefix, B_, T_, C, cfg_.n_head);
  std::memcpy(a.res2.data(), x, sizeof(float) * N * C);
  cpu::LinearForward(a.res2.data(), a.atty.data(), P(w.attn_proj_w), P(w.attn_proj_b), N, C, C, true);
  if (!ForwardNeeds(layout_.BlockRange(layer).second)) return false;
  cpu::LayerNormForward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), P(w.ln2_w), P(w.ln2_b), N,
                        C);
  cpu::LinearForward(a.fch.data(), a.ln2.data(), P(w.fc_w), P(w.fc_b), N, C, 4 * C, false);
  cpu::GeluForward(a.fch_gelu.data(), a.fch.data(), static_cast<long>(N) * 4 * C);
  std::memcpy(a.out.data(), a.res2.data(), sizeof(float) * N * C);
  cpu::LinearForward(a.out.data(), a.fch_gelu.data(), P(w.fc_proj_w), P(w.fc_proj_b), N, 4 * C, C, true);
  return true;
}

bool GptStage::BlockBackward(int layer, const float* x, const BlockActs& a, const int* prefix) {
  const BlockTensors& w = layout_.block(layer);
  const int N = B_ * T_, C = cfg_.d_model;
  float* g = g_resid_.data();  // ∂L/∂out, which is also ∂L/∂res2 through the skip connection
  // MLP branch: out = res2 + fc_proj(gelu(fc(ln2(res2))))
  cpu::LinearBackward(g_fch_.data(), G(w.fc_proj_w), G(w.fc_proj_b), g, a.fch_gelu.data(), P(w.fc_proj_w), N, 4 * C, C);
  cpu::GeluBackward(g_fch_.data(), a.fch.data(), static_cast<long>(N) * 4 * C);
  cpu::LinearBackward(g_ln_.data(), G(w.fc_w), G(w.fc_b), g_fch_.data(), a.ln2.data(), P(w.fc_w), N, C, 4 * C);
  cpu::LayerNormBackward(g, G(w.ln2_w), G(w.ln2_b), g_ln_.data(), a.res2.data(), P(w.ln2_w), a.ln2_mean.data(),
                         a.ln2_rstd.data(), N, C);
  if (!BackwardDone(Offset(w.ln2_w))) return false;
  // Attention branch: res2 = x + attn_proj(attention(qkv(ln1(x))))
  cpu::LinearBackward(g_atty_.data(), G(w.attn_proj_w), G(w.attn_proj_b), g, a.atty.data(), P(w.attn_proj_w), N, C,
                      C);
  cpu::AttentionBackward(g_qkv_.data(), attn_scratch_.data(), g_atty_.data(), a.qkv.data(), a.att.data(), prefix, B_,
                         T_, C, cfg_.n_head);
  cpu::LinearBackward(g_ln_.data(), G(w.qkv_w), G(w.qkv_b), g_qkv_.data(), a.ln1.data(), P(w.qkv_w), N, C, 3 * C);
  cpu::LayerNormBackward(g, G(w.ln1_w), G(w.ln1_b), g_ln_.data(), x, P(w.ln1_w), a.ln1_mean.data(), a.ln1_rstd.data(),
                         N, C);
  return true;
}

float GptStage::Forward(Activations& act, const MicroBatch& mb, const float* input) {
  const int N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab_size;
  const int* prefix = cfg_.attention == AttentionMask::kPrefixLm ? mb.prefix_len.data() : nullptr;
  if (spec_.has_embedding) {
    if (!ForwardNeeds(Offset(layout_.wpe()) + layout_.tensors()[layout_.wpe()].size)) return 0.0f;
    cpu::EmbeddingForward(act.x0.data(), mb.tokens.data(), P(layout_.wte()), P(layout_.wpe()), B_, T_, C, 0, C);
  } else {
    std::memcpy(act.x0.data(), input, sizeof(float) * N * C);
    // A subspace model's boundary carried the first k coordinates; the rest are the fixed
    // embedding's, as the first stage wrote them.
    if (!fixed_.empty()) {
      cpu::EmbeddingForward(act.x0.data(), mb.tokens.data(), fixed_.wte().data(), fixed_.wpe().data(), B_, T_, C,
                            fixed_.from(), fixed_.width());
    }
  }
  for (int l = spec_.first_block; l < spec_.end_block; ++l) {
    const int i = l - spec_.first_block;
    if (!ForwardNeeds(layout_.BlockRange(l).second)) return 0.0f;
    if (recompute_) {
      if (!BlockForward(l, BlockInput(act, l), *recompute_acts_, prefix)) return 0.0f;
      act.outs[i] = recompute_acts_->out;
    } else if (!BlockForward(l, BlockInput(act, l), act.blocks[i], prefix)) {
      return 0.0f;
    }
  }
  if (!spec_.has_head) return 0.0f;
  if (!ForwardNeeds(num_params())) return 0.0f;
  const float* x = BlockInput(act, spec_.end_block);
  cpu::LayerNormForward(act.lnf.data(), act.lnf_mean.data(), act.lnf_rstd.data(), x, P(layout_.lnf_w()),
                        P(layout_.lnf_b()), N, C);
  cpu::LinearForward(act.probs.data(), act.lnf.data(), HeadWeight(), nullptr, N, C, V, false);
  return cpu::CrossEntropyForward(act.probs.data(), act.losses.data(), mb.targets.data(), mb.loss_weight.data(), N, V);
}

const float* GptStage::Backward(Activations& act, const MicroBatch& mb, const float* grad_out, float loss_scale) {
  const int N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab_size;
  const int* prefix = cfg_.attention == AttentionMask::kPrefixLm ? mb.prefix_len.data() : nullptr;
  unmasked_end_ = grads_.size();
  if (spec_.has_head) {
    const float* x = BlockInput(act, spec_.end_block);
    float* dlogits = act.probs.data();
    cpu::CrossEntropyBackward(dlogits, mb.targets.data(), mb.loss_weight.data(), loss_scale, N, V);
    cpu::LinearBackward(g_ln_.data(), HeadGrad(), nullptr, dlogits, act.lnf.data(), HeadWeight(), N, C, V);
    std::fill(g_resid_.begin(), g_resid_.end(), 0.0f);
    cpu::LayerNormBackward(g_resid_.data(), G(layout_.lnf_w()), G(layout_.lnf_b()), g_ln_.data(), x,
                           P(layout_.lnf_w()), act.lnf_mean.data(), act.lnf_rstd.data(), N, C);
    if (!BackwardDone(Offset(layout_.lnf_w()))) return nullptr;
  } else {
    std::memcpy(g_resid_.data(), grad_out, sizeof(float) * N * C);
  }
  for (int l = spec_.end_block - 1; l >= spec_.first_block; --l) {
    const float* x = BlockInput(act, l);
    const bool done = recompute_ ? BlockForward(l, x, *recompute_acts_, prefix) &&
                                       BlockBackward(l, x, *recompute_acts_, prefix)
                                 : BlockBackward(l, x, act.blocks[l - spec_.first_block], prefix);
    if (!done || !BackwardDone(layout_.BlockRange(l).first)) return nullptr;
  }
  if (!spec_.has_embedding) return g_resid_.data();
  cpu::EmbeddingBackward(G(layout_.wte()), G(layout_.wpe()), g_resid_.data(), mb.tokens.data(), B_, T_, C);
  BackwardDone(0);  // the last contribution: nothing is left to give up
  return nullptr;
}

double AccumulateGradients(GptStage& stage, GptStage::Activations& act, const std::vector<MicroBatch>& micro_batches) {
  stage.ZeroGrads();
  const float scale = 1.0f / static_cast<float>(micro_batches.size());
  double loss = 0;
  for (const MicroBatch& mb : micro_batches) {
    loss += stage.Forward(act, mb, nullptr) * scale;
    stage.Backward(act, mb, nullptr, scale);
  }
  return loss;
}

}  // namespace longhaul
