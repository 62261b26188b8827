#include "cpu/ops.h"

#include "cpu/blas.h"
#include "model/layer_norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/blas.h"

namespace longhaul::cpu {
namespace {

constexpr float kLayerNormEps = static_cast<float>(kLayerNormEpsilon);
// Rows per attention block: keys right of a block's last visible column are skipped entirely,
// which halves the causal attention work.
constexpr int kAttnRowBlock = 64;

// Column sums need a vector of ones for sgemv; grown on demand, shared read-only.
const float* Ones(int n) {
  static thread_local std::vector<float> ones;
  if (static_cast<int>(ones.size()) < n) ones.assign(n, 1.0f);
  return ones.data();
}

}  // namespace

// ---- Linear -----------------------------------------------------------------------------------

void LinearForward(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC,
                   bool accumulate) {
  float beta = accumulate ? 1.0f : 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      float* row = out + static_cast<long>(n) * OC;
      if (accumulate) {
        for (int o = 0; o < OC; ++o) row[o] += bias[o];
      } else {
        std::memcpy(row, bias, sizeof(float) * OC);
      }
    }
    beta = 1.0f;
  }
  Sgemm(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
}

void LinearBackward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int N,
                    int IC, int OC) {
  if (dinp != nullptr) {
    Sgemm(false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, dinp, IC);
  }
  Sgemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
  if (dbias != nullptr) {
    SgemvTrans(N, OC, 1.0f, dout, OC, Ones(N), 1.0f, dbias);
  }
}

// ---- LayerNorm --------------------------------------------------------------------------------

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                      int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    float* y = out + static_cast<long>(n) * C;
    float m = 0.0f;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    float s = 1.0f / std::sqrt(v / C + kLayerNormEps);
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void LayerNormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                       const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* dy = dout + static_cast<long>(n) * C;
    float* dx = dinp + static_cast<long>(n) * C;
    const float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      float dnorm = w[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      float xhat = (x[c] - m) * s;
      dx[c] += (w[c] * dy[c] - dnorm_mean - xhat * dnorm_norm_mean) * s;
    }
  }
  // Parameter gradients reduce over rows; splitting by columns keeps the order fixed.
  constexpr int kCols = 16;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kCols) {
    const int c1 = std::min(C, c0 + kCols);
    float aw[kCols] = {}, ab[kCols] = {};
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<long>(n) * C;
      const float* dy = dout + static_cast<long>(n) * C;
      const float m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        aw[c - c0] += dy[c] * (x[c] - m) * s;
        ab[c - c0] += dy[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dw[c] += aw[c - c0];
      db[c] += ab[c - c0];
    }
  }
}

// ---- GELU -------------------------------------------------------------------------------------

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;
}  // namespace

void GeluForward(float* out, const float* inp, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCube * x * x * x)));
  }
}

void GeluBackward(float* dinout, const float* inp, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) {
    float x = inp[i];
    float t = std::tanh(kGeluScale * (x + kGeluCube * x * x * x));
    float dt = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    dinout[i] *= 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt;
  }
}

// ---- Embedding --------------------------------------------------------------------------------

void EmbeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int first,
                      int width) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; ++bt) {
    const float* e = wte + static_cast<long>(tokens[bt]) * width;
    const float* p = wpe + static_cast<long>(bt % T) * width;
    float* y = out + static_cast<long>(bt) * C + first;
    for (int c = 0; c < width; ++c) y[c] = e[c] + p[c];
  }
}

void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) {
  // Repeated tokens scatter into the same row, so split by columns and walk rows in order.
  constexpr int kCols = 16;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kCols) {
    const int c1 = std::min(C, c0 + kCols);
    for (int bt = 0; bt < B * T; ++bt) {
      const float* dy = dout + static_cast<long>(bt) * C;
      float* de = dwte + static_cast<long>(tokens[bt]) * C;
      float* dp = dwpe + static_cast<long>(bt % T) * C;
      for (int c = c0; c < c1; ++c) {
        de[c] += dy[c];
        dp[c] += dy[c];
      }
    }
  }
}

// ---- Attention --------------------------------------------------------------------------------

namespace {

// Last key visible to query i.
inline int LastVisible(int i, int prefix) { return std::max(i, prefix - 1); }

// Keys a block of query rows [i0, i1) needs: every row's visible range ends at or before this.
inline int BlockCols(int i1, int prefix, int T) { return std::min(T, std::max(i1, prefix)); }

// Where head h of sample b lives: its q, k, v columns in (B, T, 3C) and its output columns in
// (B, T, C), both with row strides of the full width.
struct HeadSlice {
  long qkv_offset;  // of q; k and v follow at +C and +2C
  long out_offset;
  int prefix;
  HeadSlice(int bh, int NH, int T, int C, const int* prefix_len)
      : qkv_offset(static_cast<long>(bh / NH) * T * 3 * C + (bh % NH) * (C / NH)),
        out_offset(static_cast<long>(bh / NH) * T * C + (bh % NH) * (C / NH)),
        prefix(prefix_len != nullptr ? prefix_len[bh / NH] : 0) {}
};

}  // namespace

long AttentionScratchFloats(int T) { return static_cast<long>(omp_get_max_threads()) * T * T; }

void AttentionForward(float* out, float* att, const float* qkv, const int* prefix, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const HeadSlice head(bh, NH, T, C, prefix);
    const int p = head.prefix;
    const float* q = qkv + head.qkv_offset;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + static_cast<long>(bh) * T * T;
    float* y = out + head.out_offset;
    for (int i0 = 0; i0 < T; i0 += kAttnRowBlock) {
      const int i1 = std::min(T, i0 + kAttnRowBlock), rows = i1 - i0, cols = BlockCols(i1, p, T);
      float* ab = a + static_cast<long>(i0) * T;
      // scores (rows, cols) = scale · q[i0:i1] · k[0:cols]^T
      Sgemm(false, true, rows, cols, hs, scale, q + static_cast<long>(i0) * C3, C3, k, C3, 0.0f, ab, T);
      for (int i = i0; i < i1; ++i) {
        float* row = a + static_cast<long>(i) * T;
        const int last = LastVisible(i, p);
        float mx = row[0];
        for (int j = 1; j <= last; ++j) mx = std::max(mx, row[j]);
        float sum = 0.0f;
        for (int j = 0; j <= last; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j <= last; ++j) row[j] *= inv;
        for (int j = last + 1; j < cols; ++j) row[j] = 0.0f;
      }
      // y[i0:i1] (rows, hs) = probs (rows, cols) · v[0:cols]
      Sgemm(false, false, rows, hs, cols, 1.0f, ab, T, v, C3, 0.0f, y + static_cast<long>(i0) * C, C);
    }
  }
}

void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                       const int* prefix, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const HeadSlice head(bh, NH, T, C, prefix);
    const int p = head.prefix;
    const float* q = qkv + head.qkv_offset;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + head.qkv_offset;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* a = att + static_cast<long>(bh) * T * T;
    const float* dy = dout + head.out_offset;
    float* ds = scratch + static_cast<long>(omp_get_thread_num()) * T * T;  // dprobs, then dscores
    for (int t = 0; t < T; ++t) {
      std::memset(dk + static_cast<long>(t) * C3, 0, sizeof(float) * hs);
      std::memset(dv + static_cast<long>(t) * C3, 0, sizeof(float) * hs);
    }
    for (int i0 = 0; i0 < T; i0 += kAttnRowBlock) {
      const int i1 = std::min(T, i0 + kAttnRowBlock), rows = i1 - i0, cols = BlockCols(i1, p, T);
      const float* ab = a + static_cast<long>(i0) * T;
      const float* dyb = dy + static_cast<long>(i0) * C;
      float* dsb = ds + static_cast<long>(i0) * T;
      // dprobs (rows, cols) = dy[i0:i1] · v[0:cols]^T
      Sgemm(false, true, rows, cols, hs, 1.0f, dyb, C, v, C3, 0.0f, dsb, T);
      // dv[0:cols] += probs^T (cols, rows) · dy[i0:i1]
      Sgemm(true, false, cols, hs, rows, 1.0f, ab, T, dyb, C, 1.0f, dv, C3);
      // softmax backward, with the score scale folded in
      for (int i = i0; i < i1; ++i) {
        const float* pr = a + static_cast<long>(i) * T;
        float* d = ds + static_cast<long>(i) * T;
        const int last = LastVisible(i, p);
        float dot = 0.0f;
        for (int j = 0; j <= last; ++j) dot += pr[j] * d[j];
        for (int j = 0; j <= last; ++j) d[j] = pr[j] * (d[j] - dot) * scale;
        for (int j = last + 1; j < cols; ++j) d[j] = 0.0f;
      }
      // dq[i0:i1] (rows, hs) = dscores (rows, cols) · k[0:cols]
      Sgemm(false, false, rows, hs, cols, 1.0f, dsb, T, k, C3, 0.0f, dq + static_cast<long>(i0) * C3, C3);
      // dk[0:cols] += dscores^T (cols, rows) · q[i0:i1]
      Sgemm(true, false, cols, hs, rows, 1.0f, dsb, T, q + static_cast<long>(i0) * C3, C3, 1.0f, dk, C3);
    }
  }
}

// ---- Cross-entropy ----------------------------------------------------------------------------

float CrossEntropyForward(float* logits_to_probs, float* losses, const int* targets, const float* weights, int N,
                          int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* row = logits_to_probs + static_cast<long>(n) * V;
    float mx = row[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, row[v]);
    // -log p taken from the logit, not the rounded probability, so a tiny p stays finite.
    const float target_logit = row[targets[n]] - mx;
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) {
      row[v] = std::exp(row[v] - mx);
      sum += row[v];
    }
    const float inv = 1.0f / sum;
    for (int v = 0; v < V; ++v) row[v] *= inv;
    losses[n] = std::log(sum) - target_logit;
  }
  double wsum = 0.0, lsum = 0.0;
  for (int n = 0; n < N; ++n) {
    wsum += weights[n];
    lsum += static_cast<double>(weights[n]) * losses[n];
  }
  return wsum > 0.0 ? static_cast<float>(lsum / wsum) : 0.0f;
}

void CrossEntropyBackward(float* probs_to_dlogits, const int* targets, const float* weights, float scale, int N,
                          int V) {
  double wsum = 0.0;
  for (int n = 0; n < N; ++n) wsum += weights[n];
  const float norm = wsum > 0.0 ? static_cast<float>(scale / wsum) : 0.0f;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* row = probs_to_dlogits + static_cast<long>(n) * V;
    const float g = weights[n] * norm;
    for (int v = 0; v < V; ++v) row[v] *= g;
    row[targets[n]] -= g;
  }
}

}  // namespace longhaul::cpu
