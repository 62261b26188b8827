#include <cfloat>

#include "cuda/cuda_ops.cuh"

#include "cuda/cublas_api.h"
#include "model/layer_norm.h"

namespace longhaul::cuda {
namespace {

constexpr int kThreads = 256;
inline int Blocks(long n, int threads = kThreads) { return static_cast<int>((n + threads - 1) / threads); }

struct SumOp {
  template <typename V>
  __device__ V operator()(V a, V b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename V, typename Op>
__device__ __forceinline__ V WarpReduce(V v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) { return WarpReduce(v, SumOp{}); }

// Reduction over a block of kThreads threads; every thread gets the result.
template <typename V, typename Op>
__device__ V BlockReduce(V v, V identity, Op op) {
  __shared__ V part[kThreads / 32];
  __shared__ V total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpReduce(v, op);
  __syncthreads();  // the shared slots may still be read by a previous reduction
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : identity;
  if (warp == 0) v = WarpReduce(v, op);
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  return total;
}
__device__ float BlockSum(float v) { return BlockReduce(v, 0.0f, SumOp{}); }
__device__ float BlockMax(float v) { return BlockReduce(v, -FLT_MAX, MaxOp{}); }

// Row-major C (M, N) = alpha · op(A) · op(B) + beta · C through column-major cuBLAS (C^T = B^T A^T).
void Gemm(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const void* A, cudaDataType_t at,
          int lda, const void* B, cudaDataType_t bt, int ldb, float beta, void* C, cudaDataType_t ct, int ldc) {
  LoadedCublas().gemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, bt, ldb,
                      A, at, lda, &beta, C, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// Element-wise passes over a row-major (N, OC) matrix put columns on threads and rows on blocks:
// no division per element, and each warp touches one row's consecutive elements.
constexpr int kMaxGridRows = 65535;
dim3 RowsGrid(int N, int OC) { return dim3((OC + kThreads - 1) / kThreads, min(N, kMaxGridRows)); }

template <typename T>
__global__ void AddBiasKernel(T* out, const float* bias, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const float b = bias[c];
  for (long r = blockIdx.y; r < N; r += gridDim.y) out[r * OC + c] = FromF<T>(ToF(out[r * OC + c]) + b);
}

// Rows are reduced in kRowChunks fixed chunks, then the chunks' partial sums in chunk order: every
// SM has work, no atomics, and a run repeats bit for bit. Partial Σ over one chunk of rows, per
// column, of the kSums values terms(n, c) yields: 32 columns per block, the chunk's rows split
// over 8 thread rows and added in a fixed order; partial (kSums, kRowChunks, C).
template <int kSums, typename Terms>
__global__ void ColumnPartialKernel(float* partial, Terms terms, int N, int C) {
  __shared__ float acc[kSums][8][33];
  const int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
  const int rows = (N + kRowChunks - 1) / kRowChunks, begin = chunk * rows, end = min(N, begin + rows);
  float a[kSums] = {};
  if (c < C) {
    for (int n = begin + threadIdx.y; n < end; n += 8) {
      float v[kSums];
      terms(n, c, v);
      for (int k = 0; k < kSums; ++k) a[k] += v[k];
    }
  }
  for (int k = 0; k < kSums; ++k) acc[k][threadIdx.y][threadIdx.x] = a[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 0; k < kSums; ++k) {
      for (int y = 1; y < 8; ++y) a[k] += acc[k][y][threadIdx.x];
      partial[(static_cast<long>(k) * kRowChunks + chunk) * C + c] = a[k];
    }
  }
}
// out_k[c] += Σ over chunks of partial[k][chunk][c], chunk by chunk, for each k with out_k given.
template <int kSums>
__global__ void ColumnSumOfPartialsKernel(float* out0, float* out1, const float* partial, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* outs[2] = {out0, out1};
  for (int k = 0; k < kSums; ++k) {
    float a = outs[k][c];
    for (int chunk = 0; chunk < kRowChunks; ++chunk) a += partial[(static_cast<long>(k) * kRowChunks + chunk) * C + c];
    outs[k][c] = a;
  }
}
template <int kSums, typename Terms>
void ColumnSums(cudaStream_t s, float* out0, float* out1, float* scratch, Terms terms, int N, int C) {
  ColumnPartialKernel<kSums><<<dim3((C + 31) / 32, kRowChunks), dim3(32, 8), 0, s>>>(scratch, terms, N, C);
  ColumnSumOfPartialsKernel<kSums><<<Blocks(C), kThreads, 0, s>>>(out0, out1, scratch, C);
}

template <typename T>
struct Element {
  const T* x;
  int C;
  __device__ void operator()(int n, int c, float (&v)[1]) const { v[0] = ToF(x[static_cast<long>(n) * C + c]); }
};

}  // namespace

// ---- Linear -----------------------------------------------------------------------------------

template <typename T>
void LinearForward(cublasHandle_t h, cudaStream_t s, T* out, const T* inp, const T* w, const float* bias, int N, int IC,
                   int OC, bool accumulate) {
  Gemm(h, false, true, N, OC, IC, 1.0f, inp, kDataType<T>, IC, w, kDataType<T>, IC, accumulate ? 1.0f : 0.0f, out,
       kDataType<T>, OC);
  if (bias != nullptr) AddBiasKernel<<<RowsGrid(N, OC), kThreads, 0, s>>>(out, bias, N, OC);
}

template <typename T>
void HeadBackward(cublasHandle_t h, T* dinp, float* dw, const T* dlogits, const T* inp, const T* w, int N, int C, int V,
                  int ld) {
  if (dinp != nullptr) {
    Gemm(h, false, false, N, C, V, 1.0f, dlogits, kDataType<T>, ld, w, kDataType<T>, C, 0.0f, dinp, kDataType<T>, C);
  }
  Gemm(h, true, false, V, C, N, 1.0f, dlogits, kDataType<T>, ld, inp, kDataType<T>, C, 1.0f, dw, CUDA_R_32F, C);
}

template <typename T>
void LinearBackward(cublasHandle_t h, cudaStream_t s, T* dinp, float* dw, float* dbias, float* scratch, const T* dout,
                    const T* inp, const T* w, int N, int IC, int OC) {
  HeadBackward(h, dinp, dw, dout, inp, w, N, IC, OC, OC);
  if (dbias != nullptr) ColumnSums<1>(s, dbias, nullptr, scratch, Element<T>{dout, OC}, N, OC);
}

template <typename T>
void HeadForward(cublasHandle_t h, float* logits, const T* inp, const T* w, int N, int C, int V, int ld) {
  Gemm(h, false, true, N, V, C, 1.0f, inp, kDataType<T>, C, w, kDataType<T>, C, 0.0f, logits, CUDA_R_32F, ld);
}


// ---- LayerNorm --------------------------------------------------------------------------------

namespace {
constexpr float kLayerNormEps = static_cast<float>(kLayerNormEpsilon);

// One warp per row.
template <typename T>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp, const float* w, const float* b,
                                       int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + static_cast<long>(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += ToF(x[c]);
  const float m = WarpSum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = ToF(x[c]) - m;
    v += d * d;
  }
  const float r = rsqrtf(WarpSum(v) / C + kLayerNormEps);
  T* y = out + static_cast<long>(row) * C;
  for (int c = lane; c < C; c += 32) y[c] = FromF<T>((ToF(x[c]) - m) * r * w[c] + b[c]);
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

template <typename T>
__global__ void LayerNormBackwardKernel(float* dinp, const T* dout, const T* inp, const float* w, const float* mean,
                                        const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + static_cast<long>(row) * C;
  const T* dy = dout + static_cast<long>(row) * C;
  const float m = mean[row], r = rstd[row];
  float dmean = 0.0f, dnorm_mean = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (ToF(x[c]) - m) * r, g = w[c] * ToF(dy[c]);
    dmean += g;
    dnorm_mean += g * xhat;
  }
  dmean = WarpSum(dmean) / C;
  dnorm_mean = WarpSum(dnorm_mean) / C;
  float* dx = dinp + static_cast<long>(row) * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (ToF(x[c]) - m) * r, g = ToF(dy[c]);
    dx[c] += (w[c] * g - dmean - xhat * dnorm_mean) * r;
  }
}

// The two terms of LayerNorm's parameter gradients per (row, column): dy·x̂ and dy.
template <typename T>
struct LayerNormParamTerms {
  const T* dout;
  const T* inp;
  const float* mean;
  const float* rstd;
  int C;
  __device__ void operator()(int n, int c, float (&v)[2]) const {
    const long i = static_cast<long>(n) * C + c;
    v[1] = ToF(dout[i]);
    v[0] = v[1] * (ToF(inp[i]) - mean[n]) * rstd[n];
  }
};
}  // namespace

template <typename T>
void LayerNormForward(cudaStream_t s, T* out, float* mean, float* rstd, const T* inp, const float* w, const float* b,
                      int N, int C) {
  LayerNormForwardKernel<<<Blocks(N, kThreads / 32), kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
}

template <typename T>
void LayerNormBackward(cudaStream_t s, float* dinp, float* dw, float* db, const T* dout, const T* inp, const float* w,
                       const float* mean, const float* rstd, float* scratch, int N, int C) {
  LayerNormBackwardKernel<<<Blocks(N, kThreads / 32), kThreads, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
  ColumnSums<2>(s, dw, db, scratch, LayerNormParamTerms<T>{dout, inp, mean, rstd, C}, N, C);
}

// ---- GELU -------------------------------------------------------------------------------------

namespace {
constexpr float kGeluScale = 0.7978845608028654f, kGeluCube = 0.044715f;

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, const float* bias, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const float b = bias[c];
  for (long r = blockIdx.y; r < N; r += gridDim.y) {
    const float x = ToF(inp[r * OC + c]) + b;
    out[r * OC + c] = FromF<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCube * x * x * x))));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(T* dinout, const T* inp, const float* bias, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const float b = bias[c];
  for (long r = blockIdx.y; r < N; r += gridDim.y) {
    const float x = ToF(inp[r * OC + c]) + b;
    const float t = tanhf(kGeluScale * (x + kGeluCube * x * x * x));
    const float dt = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    dinout[r * OC + c] = FromF<T>(ToF(dinout[r * OC + c]) * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt));
  }
}
}  // namespace

template <typename T>
void GeluForward(cudaStream_t s, T* out, const T* inp, const float* bias, int N, int OC) {
  GeluForwardKernel<<<RowsGrid(N, OC), kThreads, 0, s>>>(out, inp, bias, N, OC);
}
template <typename T>
void GeluBackward(cudaStream_t s, T* dinout, const T* inp, const float* bias, int N, int OC) {
  GeluBackwardKernel<<<RowsGrid(N, OC), kThreads, 0, s>>>(dinout, inp, bias, N, OC);
}

// ---- Embedding --------------------------------------------------------------------------------

namespace {
template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const int* tokens, const T* wte, const T* wpe, int BT, int Tn, int C,
                                       int first, int width) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<long>(BT) * width) return;
  const int bt = static_cast<int>(i / width), c = static_cast<int>(i % width);
  out[static_cast<long>(bt) * C + first + c] = FromF<T>(ToF(wte[static_cast<long>(tokens[bt]) * width + c]) +
                                                        ToF(wpe[static_cast<long>(bt % Tn) * width + c]));
}
// One block row per distinct token: its positions' gradients added in position order, as the
// CPU backend adds them.
__global__ void TokenEmbeddingBackwardKernel(float* dwte, const float* dout, const int* order, const int* starts,
                                             const int* uniq, int C) {
  const int u = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* dst = dwte + static_cast<long>(uniq[u]) * C + c;
  float acc = *dst;
  for (int k = starts[u]; k < starts[u + 1]; ++k) acc += dout[static_cast<long>(order[k]) * C + c];
  *dst = acc;
}

__global__ void PositionEmbeddingBackwardKernel(float* dwpe, const float* dout, int B, int Tn, int C) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<long>(Tn) * C) return;
  float acc = dwpe[i];
  for (int b = 0; b < B; ++b) acc += dout[static_cast<long>(b) * Tn * C + i];
  dwpe[i] = acc;
}
}  // namespace

template <typename T>
void EmbeddingForward(cudaStream_t s, T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                      int first, int width) {
  EmbeddingForwardKernel<<<Blocks(static_cast<long>(B) * Tn * width), kThreads, 0, s>>>(out, tokens, wte, wpe, B * Tn,
                                                                                       Tn, C, first, width);
}
void EmbeddingBackward(cudaStream_t s, float* dwte, float* dwpe, const float* dout, const TokenGroups& groups, int B,
                       int Tn, int C) {
  if (groups.distinct > 0) {
    TokenEmbeddingBackwardKernel<<<dim3(groups.distinct, Blocks(C)), kThreads, 0, s>>>(dwte, dout, groups.order,
                                                                                       groups.starts, groups.tokens, C);
  }
  PositionEmbeddingBackwardKernel<<<Blocks(static_cast<long>(Tn) * C), kThreads, 0, s>>>(dwpe, dout, B, Tn, C);
}

// ---- Attention --------------------------------------------------------------------------------

namespace {
// i indexes (b, h, t, e) of the per-head layout; backward swaps source and destination.
template <typename T, bool kToHeads>
__global__ void PermuteQkvKernel(T* q, T* k, T* v, T* qkv, int B, int Tn, int C, int NH) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  const int hs = C / NH;
  if (i >= static_cast<long>(B) * NH * Tn * hs) return;
  const int e = i % hs, t = (i / hs) % Tn, h = (i / (static_cast<long>(hs) * Tn)) % NH,
            b = i / (static_cast<long>(hs) * Tn * NH);
  const long src = (static_cast<long>(b) * Tn + t) * 3 * C + h * hs + e;
  if (kToHeads) {
    q[i] = qkv[src], k[i] = qkv[src + C], v[i] = qkv[src + 2 * C];
  } else {
    qkv[src] = q[i], qkv[src + C] = k[i], qkv[src + 2 * C] = v[i];
  }
}
template <typename T, bool kToHeads>
__global__ void PermuteOutKernel(T* heads, T* merged, int B, int Tn, int C, int NH) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  const int hs = C / NH;
  if (i >= static_cast<long>(B) * NH * Tn * hs) return;
  const int e = i % hs, t = (i / hs) % Tn, h = (i / (static_cast<long>(hs) * Tn)) % NH,
            b = i / (static_cast<long>(hs) * Tn * NH);
  const long m = (static_cast<long>(b) * Tn + t) * C + h * hs + e;
  if (kToHeads) {
    heads[i] = merged[m];
  } else {
    merged[m] = heads[i];
  }
}

// One block per row of scores.
template <typename T>
__global__ void MaskedSoftmaxForwardKernel(T* att, const int* prefix, float scale, int NH, int Tn) {
  const long row = blockIdx.x;
  const int i = row % Tn, b = row / (static_cast<long>(Tn) * NH);
  const int last = max(i, (prefix != nullptr ? prefix[b] : 0) - 1);
  T* x = att + row * Tn;
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j <= last; j += blockDim.x) mx = fmaxf(mx, ToF(x[j]) * scale);
  mx = BlockMax(mx);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= last; j += blockDim.x) sum += __expf(ToF(x[j]) * scale - mx);
  sum = BlockSum(sum);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < Tn; j += blockDim.x)
    x[j] = FromF<T>(j <= last ? __expf(ToF(x[j]) * scale - mx) * inv : 0.0f);
}

template <typename T>
__global__ void MaskedSoftmaxBackwardKernel(T* datt, const T* att, const int* prefix, float scale, int NH, int Tn) {
  const long row = blockIdx.x;
  const int i = row % Tn, b = row / (static_cast<long>(Tn) * NH);
  const int last = max(i, (prefix != nullptr ? prefix[b] : 0) - 1);
  T* d = datt + row * Tn;
  const T* p = att + row * Tn;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= last; j += blockDim.x) dot += ToF(p[j]) * ToF(d[j]);
  dot = BlockSum(dot);
  for (int j = threadIdx.x; j < Tn; j += blockDim.x)
    d[j] = FromF<T>(j <= last ? scale * ToF(p[j]) * (ToF(d[j]) - dot) : 0.0f);
}
}  // namespace

template <typename T>
void SplitHeads(cudaStream_t s, T* q, T* k, T* v, const T* qkv, int B, int Tn, int C, int NH) {
  PermuteQkvKernel<T, true><<<Blocks(static_cast<long>(B) * Tn * C), kThreads, 0, s>>>(q, k, v, const_cast<T*>(qkv), B, Tn,
                                                                                       C, NH);
}
template <typename T>
void SplitHeadsBackward(cudaStream_t s, T* dqkv, const T* dq, const T* dk, const T* dv, int B, int Tn, int C, int NH) {
  PermuteQkvKernel<T, false><<<Blocks(static_cast<long>(B) * Tn * C), kThreads, 0, s>>>(
      const_cast<T*>(dq), const_cast<T*>(dk), const_cast<T*>(dv), dqkv, B, Tn, C, NH);
}
template <typename T>
void MergeHeads(cudaStream_t s, T* out, const T* y, int B, int Tn, int C, int NH) {
  PermuteOutKernel<T, false><<<Blocks(static_cast<long>(B) * Tn * C), kThreads, 0, s>>>(const_cast<T*>(y), out, B, Tn, C,
                                                                                        NH);
}
template <typename T>
void MergeHeadsBackward(cudaStream_t s, T* dy, const T* dout, int B, int Tn, int C, int NH) {
  PermuteOutKernel<T, true><<<Blocks(static_cast<long>(B) * Tn * C), kThreads, 0, s>>>(dy, const_cast<T*>(dout), B, Tn, C,
                                                                                       NH);
}
template <typename T>
void MaskedSoftmaxForward(cudaStream_t s, T* att, const int* prefix, float scale, int B, int NH, int Tn) {
  MaskedSoftmaxForwardKernel<<<static_cast<unsigned>(static_cast<long>(B) * NH * Tn), kThreads, 0, s>>>(att, prefix, scale,
                                                                                                       NH, Tn);
}
template <typename T>
void MaskedSoftmaxBackward(cudaStream_t s, T* datt, const T* att, const int* prefix, float scale, int B, int NH,
                           int Tn) {
  MaskedSoftmaxBackwardKernel<<<static_cast<unsigned>(static_cast<long>(B) * NH * Tn), kThreads, 0, s>>>(datt, att, prefix,
                                                                                                        scale, NH, Tn);
}

template <typename T>
void BatchedGemm(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const T* a, long stride_a,
                 const T* b, long stride_b, float beta, T* c, long stride_c, int batch) {
  const int lda = ta ? M : K, ldb = tb ? K : N;
  LoadedCublas().gemm_strided_batched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                                      &alpha, b, kDataType<T>, ldb, stride_b, a, kDataType<T>, lda, stride_a, &beta,
                                      c, kDataType<T>, N, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// ---- Loss -------------------------------------------------------------------------------------

namespace {
__global__ void CrossEntropyForwardKernel(float* logits, float* losses, const int* targets, int V, int ld) {
  float* x = logits + static_cast<long>(blockIdx.x) * ld;
  float mx = -FLT_MAX;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
  mx = BlockMax(mx);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - mx);
  sum = BlockSum(sum);
  const float target_logit = x[targets[blockIdx.x]] - mx;
  __syncthreads();  // every thread read the target's logit before it is overwritten
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) - target_logit;
  const float inv = 1.0f / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) x[v] = expf(x[v] - mx) * inv;
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(T* dlogits, const float* probs, const int* targets, const float* weights,
                                           float scale, int V, int ld) {
  const long row = blockIdx.x;
  const float g = weights[row] * scale;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = probs[row * ld + v];
    dlogits[row * ld + v] = FromF<T>((p - (v == targets[row] ? 1.0f : 0.0f)) * g);
  }
}
}  // namespace

void CrossEntropyForward(cudaStream_t s, float* logits, float* losses, const int* targets, int N, int V, int ld) {
  CrossEntropyForwardKernel<<<N, kThreads, 0, s>>>(logits, losses, targets, V, ld);
}
template <typename T>
void CrossEntropyBackward(cudaStream_t s, T* dlogits, const float* probs, const int* targets, const float* weights,
                          float scale_over_weight_sum, int N, int V, int ld) {
  CrossEntropyBackwardKernel<<<N, kThreads, 0, s>>>(dlogits, probs, targets, weights, scale_over_weight_sum, V, ld);
}

// ---- Elementwise and optimizer ----------------------------------------------------------------

namespace {
template <typename T>
__global__ void CastKernel(T* out, const float* in, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = FromF<T>(in[i]);
}
template <typename T>
__global__ void CastToFloatKernel(float* out, const T* in, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = ToF(in[i]);
}
template <typename T>
__global__ void AddKernel(T* out, const T* a, const T* b, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = FromF<T>(ToF(a[i]) + ToF(b[i]));
}
// In doubles, as the CPU's SquaredNorm: which elements share a block's sum follows a shard's size
// and offset, which a pipeline cut anew changes, and a float sum's rounding then moved the clip
// factor by an ulp (a GPU re-cut ran bitwise for 40 steps, then parted at the first clipped step).
__global__ void SquaresKernel(double* partial, const float* x, long n) {
  double s = 0.0;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  s = BlockReduce(s, 0.0, SumOp{});
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void SumPartialsKernel(double* out, const double* partial, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += partial[i];
    *out = s;
  }
}
__global__ void ScaleKernel(float* x, float f, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= f;
}
template <typename T>
__global__ void AdamWKernel(float* p, T* compute, const float* g, float grad_scale, float* m, float* v,
                            const uint8_t* decay, float b1, float b2, float eps, float decay_factor, float step_size,
                            float bc2_sqrt, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i] * grad_scale;
  const float mi = m[i] = b1 * m[i] + (1.0f - b1) * gi;
  const float vi = v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
  const float pi = decay[i] ? p[i] * decay_factor : p[i];
  const float updated = p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
  if (compute != nullptr) compute[i] = FromF<T>(updated);
}
__global__ void NesterovKernel(float* p, const float* g, float* m, float lr, float momentum, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float mi = m[i] = momentum * m[i] + g[i];
  p[i] -= lr * (g[i] + momentum * mi);
}
}  // namespace

template <typename T>
void Cast(cudaStream_t s, T* out, const float* in, long n) {
  CastKernel<<<Blocks(n), kThreads, 0, s>>>(out, in, n);
}
template <typename T>
void CastToFloat(cudaStream_t s, float* out, const T* in, long n) {
  CastToFloatKernel<<<Blocks(n), kThreads, 0, s>>>(out, in, n);
}
template <typename T>
void Add(cudaStream_t s, T* out, const T* a, const T* b, long n) {
  AddKernel<<<Blocks(n), kThreads, 0, s>>>(out, a, b, n);
}
void SquaredNorm(cudaStream_t s, double* partial, double* out, const float* x, long n) {
  SquaresKernel<<<kNormPartials, kThreads, 0, s>>>(partial, x, n);
  SumPartialsKernel<<<1, 32, 0, s>>>(out, partial, kNormPartials);
}
void Scale(cudaStream_t s, float* x, float factor, long n) { ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(x, factor, n); }
template <typename T>
void AdamW(cudaStream_t s, float* p, T* compute, const float* g, float grad_scale, float* m, float* v,
           const uint8_t* decay, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step, long n) {
  const float bc1 = 1.0f - powf(beta1, static_cast<float>(step));
  const float bc2_sqrt = sqrtf(1.0f - powf(beta2, static_cast<float>(step)));
  AdamWKernel<<<Blocks(n), kThreads, 0, s>>>(p, compute, g, grad_scale, m, v, decay, beta1, beta2, eps,
                                             1.0f - lr * weight_decay, lr / bc1, bc2_sqrt, n);
}
void Nesterov(cudaStream_t s, float* p, const float* g, float* m, float lr, float momentum, long n) {
  NesterovKernel<<<Blocks(n), kThreads, 0, s>>>(p, g, m, lr, momentum, n);
}

// ---- Instantiations ---------------------------------------------------------------------------

#define LH_INSTANTIATE(T)                                                                                            \
  template void LinearForward<T>(cublasHandle_t, cudaStream_t, T*, const T*, const T*, const float*, int, int, int,  \
                                 bool);                                                                              \
  template void LinearBackward<T>(cublasHandle_t, cudaStream_t, T*, float*, float*, float*, const T*, const T*,      \
                                  const T*, int, int, int);                                                          \
  template void HeadForward<T>(cublasHandle_t, float*, const T*, const T*, int, int, int, int);                      \
  template void HeadBackward<T>(cublasHandle_t, T*, float*, const T*, const T*, const T*, int, int, int, int);       \
  template void LayerNormForward<T>(cudaStream_t, T*, float*, float*, const T*, const float*, const float*, int, int); \
  template void LayerNormBackward<T>(cudaStream_t, float*, float*, float*, const T*, const T*, const float*,         \
                                     const float*, const float*, float*, int, int);                                  \
  template void GeluForward<T>(cudaStream_t, T*, const T*, const float*, int, int);                                  \
  template void GeluBackward<T>(cudaStream_t, T*, const T*, const float*, int, int);                                 \
  template void EmbeddingForward<T>(cudaStream_t, T*, const int*, const T*, const T*, int, int, int, int, int);      \
  template void SplitHeads<T>(cudaStream_t, T*, T*, T*, const T*, int, int, int, int);                               \
  template void MergeHeads<T>(cudaStream_t, T*, const T*, int, int, int, int);                                       \
  template void SplitHeadsBackward<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, int, int);          \
  template void MergeHeadsBackward<T>(cudaStream_t, T*, const T*, int, int, int, int);                               \
  template void MaskedSoftmaxForward<T>(cudaStream_t, T*, const int*, float, int, int, int);                         \
  template void MaskedSoftmaxBackward<T>(cudaStream_t, T*, const T*, const int*, float, int, int, int);              \
  template void BatchedGemm<T>(cublasHandle_t, bool, bool, int, int, int, float, const T*, long, const T*, long,      \
                               float, T*, long, int);                                                                \
  template void CrossEntropyBackward<T>(cudaStream_t, T*, const float*, const int*, const float*, float, int, int,   \
                                        int);                                                                        \
  template void Cast<T>(cudaStream_t, T*, const float*, long);                                                       \
  template void CastToFloat<T>(cudaStream_t, float*, const T*, long);                                                \
  template void Add<T>(cudaStream_t, T*, const T*, const T*, long);                                                  \
  template void AdamW<T>(cudaStream_t, float*, T*, const float*, float, float*, float*, const uint8_t*, float, float, \
                         float, float, float, int64_t, long);

LH_INSTANTIATE(float)
LH_INSTANTIATE(__nv_bfloat16)
LH_INSTANTIATE(__half)

}  // namespace longhaul::cuda
