#pragma once
// GPT-2's LayerNorm epsilon: the CPU and CUDA kernels compute with it (as a float, the same bits
// as 1e-5f), and Hugging Face GPT-2 checkpoints are read and written against it.
namespace longhaul {

inline constexpr double kLayerNormEpsilon = 1e-5;

}  // namespace longhaul
