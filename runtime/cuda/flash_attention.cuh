#pragma once
// Causal and prefix-LM attention in the flash style (FlashAttention-2's tiling) for bf16 and fp16
// compute: scores and probabilities live in registers a tile at a time, the softmax statistics
// in fp32, and no (T, T) matrix is ever in memory; the backward recomputes the probabilities
// from the forward's log-sum-exp. Queries, keys and values are read straight from the QKV
// projection's output and the result written in the merged (B, T, C) layout, so no head
// permutation runs either. No kernel uses atomics: dK and dV are summed by the key tile's own
// block, dQ in a pass of its own, so a run repeats bit for bit. Which configs it serves:
// CudaFlashAttention in model/memory_estimate.h (head size a multiple of 8, at most 128).
#include <cuda_runtime.h>

namespace longhaul::cuda {

// qkv (B, T, 3C) [T] -> out (B, T, C) [T]; lse (B, NH, T) [fp32]: each query's log-sum-exp of
// its scaled scores in base 2, for the backward. Key j is visible to query i iff
// j <= max(i, prefix[b] - 1); prefix (B) may be null (causal).
template <typename T>
void FlashAttentionForward(cudaStream_t s, T* out, float* lse, const T* qkv, const int* prefix, int B, int Tn, int C,
                           int NH);
// dout (B, T, C) [T] -> dqkv (B, T, 3C) [T], every element written. out and lse are the
// forward's; delta (B, NH, T) [fp32] is scratch (each query's Σ dout · out).
template <typename T>
void FlashAttentionBackward(cudaStream_t s, T* dqkv, float* delta, const T* dout, const T* out, const T* qkv,
                            const float* lse, const int* prefix, int B, int Tn, int C, int NH);

}  // namespace longhaul::cuda
