#pragma once
// CUDA kernels of the GPT model, each forward beside its backward, templated on the compute type
// T (float, __nv_bfloat16, __half). Arithmetic is fp32 inside every kernel; activations and the
// compute copies of the weights are stored in T; master weights, parameter gradients, the
// residual stream's gradient and the optimizer state are fp32. Shapes follow runtime/cpu/ops.h.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace longhaul::cuda {

template <typename T>
__device__ __forceinline__ float ToF(T x) { return static_cast<float>(x); }
template <typename T>
__device__ __forceinline__ T FromF(float x) { return static_cast<T>(x); }

// cuBLAS data type of T.
template <typename T> constexpr cudaDataType_t kDataType = CUDA_R_32F;
template <> constexpr cudaDataType_t kDataType<__nv_bfloat16> = CUDA_R_16BF;
template <> constexpr cudaDataType_t kDataType<__half> = CUDA_R_16F;

// ---- Linear (cuBLAS, fp32 accumulation; row-major expressed through column-major calls) ----
// out (N, OC) [T] = inp (N, IC) [T] · w (OC, IC)^T [T] (+ bias (OC) [fp32]); accumulate adds to out.
template <typename T>
void LinearForward(cublasHandle_t h, cudaStream_t s, T* out, const T* inp, const T* w, const float* bias, int N, int IC,
                   int OC, bool accumulate);
// Column sums (bias and LayerNorm parameter gradients) reduce rows in this many fixed chunks
// through a scratch of kRowChunks floats per column and sum: deterministic, and every SM busy.
constexpr int kRowChunks = 32;
// dinp (N, IC) [T] = dout · w (skipped if null); dw (OC, IC) [fp32] += dout^T · inp;
// dbias (OC) [fp32] += Σ_n dout (skipped if null), through `scratch` (kRowChunks · OC floats).
template <typename T>
void LinearBackward(cublasHandle_t h, cudaStream_t s, T* dinp, float* dw, float* dbias, float* scratch, const T* dout,
                    const T* inp, const T* w, int N, int IC, int OC);
// logits (N, V) [fp32] = inp (N, C) [T] · w (V, C)^T [T]: the head keeps full precision for the loss.
// Rows of logits are `ld` apart (CudaLogitsStride: 16-byte aligned rows for cuBLAS).
template <typename T>
void HeadForward(cublasHandle_t h, float* logits, const T* inp, const T* w, int N, int C, int V, int ld);
// dinp (N, C) [T] = dlogits (N, V; rows ld apart) · w (skipped if null); dw (V, C) [fp32] +=
// dlogits^T · inp: a linear layer's backward without bias, its output gradient's rows ld apart
// (LinearBackward is this with ld = OC).
template <typename T>
void HeadBackward(cublasHandle_t h, T* dinp, float* dw, const T* dlogits, const T* inp, const T* w, int N, int C, int V,
                  int ld);

// ---- LayerNorm ------------------------------------------------------------------------------
template <typename T>
void LayerNormForward(cudaStream_t s, T* out, float* mean, float* rstd, const T* inp, const float* w, const float* b,
                      int N, int C);
// dinp (N, C) [fp32] += ...; dw, db [fp32] += ..., reduced over rows in a fixed order through
// `scratch` (2 · kRowChunks · C floats), so a run repeats bit for bit.
template <typename T>
void LayerNormBackward(cudaStream_t s, float* dinp, float* dw, float* db, const T* dout, const T* inp, const float* w,
                       const float* mean, const float* rstd, float* scratch, int N, int C);

// ---- GELU (tanh) ----------------------------------------------------------------------------
// out (N, OC) = GELU(inp + bias): the preceding projection's bias is added here instead of in a
// pass of its own, so inp holds the pre-bias values, which the backward reads.
template <typename T>
void GeluForward(cudaStream_t s, T* out, const T* inp, const float* bias, int N, int OC);
// dinout (N, OC) *= GELU'(inp + bias)
template <typename T>
void GeluBackward(cudaStream_t s, T* dinout, const T* inp, const float* bias, int N, int OC);

// ---- Embedding ------------------------------------------------------------------------------
// out (B, T, C)[..., first:first + width] = wte[tokens[b, t]] + wpe[t], tables of `width` columns
// (the host's EmbeddingForward).
template <typename T>
void EmbeddingForward(cudaStream_t s, T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                      int first, int width);
// A micro-batch's positions grouped by token, built on the host (the tokens are known there):
// `order` (N) lists positions by (token, position); distinct token u is tokens[u] and owns
// order[starts[u] .. starts[u+1]). Device pointers.
struct TokenGroups {
  const int* order = nullptr;
  const int* starts = nullptr;
  const int* tokens = nullptr;
  int distinct = 0;
};
// dwte, dwpe [fp32] += ..., without atomics: each row adds its positions in position order, as
// the CPU backend does, so a run repeats bit for bit.
void EmbeddingBackward(cudaStream_t s, float* dwte, float* dwpe, const float* dout, const TokenGroups& groups, int B,
                       int Tn, int C);

// ---- Attention ------------------------------------------------------------------------------
// qkv (B, T, 3C) -> q, k, v (B, NH, T, hs) each; y (B, NH, T, hs) -> out (B, T, C).
template <typename T>
void SplitHeads(cudaStream_t s, T* q, T* k, T* v, const T* qkv, int B, int Tn, int C, int NH);
template <typename T>
void MergeHeads(cudaStream_t s, T* out, const T* y, int B, int Tn, int C, int NH);
template <typename T>
void SplitHeadsBackward(cudaStream_t s, T* dqkv, const T* dq, const T* dk, const T* dv, int B, int Tn, int C, int NH);
template <typename T>
void MergeHeadsBackward(cudaStream_t s, T* dy, const T* dout, int B, int Tn, int C, int NH);
// In place over scores (B·NH, T, T): scale, mask (key j visible to query i iff j <= max(i, prefix-1)),
// softmax over visible keys, zeros elsewhere. prefix (B) may be null.
template <typename T>
void MaskedSoftmaxForward(cudaStream_t s, T* att, const int* prefix, float scale, int B, int NH, int Tn);
// datt (B·NH, T, T) in place: d scores = scale · P ⊙ (dP - Σ P dP).
template <typename T>
void MaskedSoftmaxBackward(cudaStream_t s, T* datt, const T* att, const int* prefix, float scale, int B, int NH, int Tn);
// Batched GEMMs of attention over B·NH heads (row-major, fp32 accumulation):
// c[i] (M, N) = alpha · op(a[i]) · op(b[i]) + beta · c[i]
template <typename T>
void BatchedGemm(cublasHandle_t h, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* a,
                 long stride_a, const T* b, long stride_b, float beta, T* c, long stride_c, int batch);

// ---- Loss -----------------------------------------------------------------------------------
// logits (N, V; rows ld apart) [fp32] -> probabilities in place; losses (N) [fp32].
void CrossEntropyForward(cudaStream_t s, float* logits, float* losses, const int* targets, int N, int V, int ld);
// probs (N, V) [fp32] -> dlogits (N, V) [T] = (p - onehot) · weight · scale / Σ weights; rows of
// both ld apart.
template <typename T>
void CrossEntropyBackward(cudaStream_t s, T* dlogits, const float* probs, const int* targets, const float* weights,
                          float scale_over_weight_sum, int N, int V, int ld);

// ---- Elementwise and optimizer ----------------------------------------------------------------
template <typename T>
void Cast(cudaStream_t s, T* out, const float* in, long n);
template <typename T>
void CastToFloat(cudaStream_t s, float* out, const T* in, long n);
// out = a + b (n elements)
template <typename T>
void Add(cudaStream_t s, T* out, const T* a, const T* b, long n);
// Σ x² into *out (partial sums in doubles per block, then one pass: deterministic for a given
// launch); `partial` holds kNormPartials.
constexpr int kNormPartials = 1024;
void SquaredNorm(cudaStream_t s, double* partial, double* out, const float* x, long n);
void Scale(cudaStream_t s, float* x, float factor, long n);
// AdamW as torch.optim.AdamW on the gradients g · grad_scale (the clipping factor, folded in
// instead of a pass of its own); decay (n) flags elements that take weight decay. With `compute`
// not null the updated parameters are also written there in T (a stage's compute copy), in the
// same pass.
template <typename T>
void AdamW(cudaStream_t s, float* p, T* compute, const float* g, float grad_scale, float* m, float* v,
           const uint8_t* decay, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step, long n);
// optim/nesterov.h's NesterovStep: m = momentum·m + g; p -= lr·(g + momentum·m).
void Nesterov(cudaStream_t s, float* p, const float* g, float* m, float lr, float momentum, long n);

}  // namespace longhaul::cuda
