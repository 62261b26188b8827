#pragma once
// CPU kernels of the GPT model: each op's forward and backward side by side, llm.c style.
//
// Conventions: N = B*T rows; C = d_model; all buffers row-major fp32. Backward functions
// accumulate into parameter gradients (+=) so micro-batches sum without extra passes; what they do
// to input gradients is stated per function. Matmuls go through BLAS (OpenBLAS, OpenMP build);
// elementwise work is split over OpenMP threads with static schedules, and every reduction runs in
// a fixed order, so results are bitwise reproducible for a given thread count.

namespace longhaul::cpu {

// ---- Linear: y = x W^T + b (W stored (OC, IC) like torch.nn.Linear) -------------------------
// out (N, OC) = inp (N, IC) · w (OC, IC)^T + bias (OC); bias may be null.
// With accumulate, out += instead of =, which fuses a residual add into the matmul.
void LinearForward(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC,
                   bool accumulate);
// dinp (N, IC) = dout (N, OC) · w (OC, IC)      (overwritten; skipped when dinp is null)
// dw   (OC, IC) += dout^T · inp (N, IC)
// dbias (OC) += Σ_n dout[n, :]                    (skipped when dbias is null)
void LinearBackward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int N,
                    int IC, int OC);

// ---- LayerNorm (eps 1e-5, as torch.nn.LayerNorm) --------------------------------------------
// out (N, C) = (inp - mean) · rstd · w + b; mean (N) and rstd (N) are saved for backward.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                      int C);
// dinp (N, C) += ∂L/∂inp;  dw (C) += Σ_n dout·x̂;  db (C) += Σ_n dout.
void LayerNormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                       const float* mean, const float* rstd, int N, int C);

// ---- GELU, tanh approximation (torch.nn.GELU(approximate="tanh")) ------------------------------
// out (n) = gelu(inp (n))
void GeluForward(float* out, const float* inp, long n);
// dinout (n): on entry ∂L/∂out, on exit ∂L/∂inp; inp (n) is the forward input.
void GeluBackward(float* dinout, const float* inp, long n);

// ---- Token + position embedding ---------------------------------------------------------------
// out (B, T, C)[..., first:first + width] = wte[tokens[b, t]] + wpe[t], the tables (V, width) and
// (T, width): the whole embedding (first 0, width C), or a subspace model's fixed columns.
void EmbeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int first,
                      int width);
// dwte (V, C) += scatter of dout by token; dwpe (T, C) += Σ_b dout[b]
void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C);

// ---- Multi-head self-attention core (after the qkv projection, before the output projection) ---
// Key j is visible to query i of sample b iff j <= max(i, prefix[b] - 1): causal when prefix is
// null or 0, bidirectional inside a prefix-LM prefix.
// qkv (B, T, 3C) = [q | k | v]; out (B, T, C); att (B, NH, T, T) keeps the softmax probabilities
// (entries right of each row's visible range are left unwritten and never read).
void AttentionForward(float* out, float* att, const float* qkv, const int* prefix, int B, int T, int C, int NH);
// dqkv (B, T, 3C) is overwritten. scratch needs AttentionScratchFloats(T) floats.
void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                       const int* prefix, int B, int T, int C, int NH);
long AttentionScratchFloats(int T);

// ---- Softmax cross-entropy over the vocabulary, with per-position loss weights ---------------
// logits_to_probs (N, V): logits in, softmax probabilities out. losses (N) = -log p[target].
// Returns Σ_n weight[n]·losses[n] / Σ_n weight[n] (0 when every weight is 0).
float CrossEntropyForward(float* logits_to_probs, float* losses, const int* targets, const float* weights, int N,
                          int V);
// probs_to_dlogits (N, V): probabilities in, ∂L/∂logits out, where L = scale · the forward's
// weighted mean.
void CrossEntropyBackward(float* probs_to_dlogits, const int* targets, const float* weights, float scale, int N,
                          int V);

}  // namespace longhaul::cpu
