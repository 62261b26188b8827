// The flash-style attention kernels (cuda/flash_attention.cuh) against attention computed in
// doubles from the same rounded inputs: causal and prefix-LM masks, head sizes that fill a tile
// and ones that do not, sequences that are not a multiple of the tile; every element of dqkv
// written, and a second run bit-identical. Needs a GPU: without one each test skips, saying why.
#include "cuda/flash_attention.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_stage.h"
#include "tests/support/device_buffer.h"

namespace longhaul {
namespace {

struct Shape {
  int B, T, NH, hs;
  std::vector<int> prefix;  // empty: causal
};

template <typename E>
using Buffer = testing::DeviceBuffer<E>;

// What the kernels return, as floats.
struct Result {
  std::vector<float> out, dqkv;
};

// Attention in doubles: out (B, T, C) and dqkv (B, T, 3C) from qkv and dout (values as rounded).
Result Reference(const Shape& sh, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int C = sh.NH * sh.hs, T = sh.T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(sh.hs));
  Result r{std::vector<float>(static_cast<size_t>(sh.B) * T * C), std::vector<float>(static_cast<size_t>(sh.B) * T * 3 * C)};
  auto at = [&](int b, int t, int part, int h) { return (static_cast<size_t>(b) * T + t) * 3 * C + part * C + h * sh.hs; };
  for (int b = 0; b < sh.B; ++b) {
    const int prefix = sh.prefix.empty() ? 0 : sh.prefix[b];
    for (int h = 0; h < sh.NH; ++h) {
      std::vector<double> P(static_cast<size_t>(T) * T, 0.0), dS(static_cast<size_t>(T) * T, 0.0);
      for (int i = 0; i < T; ++i) {
        const int last = std::max(i, prefix - 1);
        double mx = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          double s = 0;
          for (int d = 0; d < sh.hs; ++d) s += qkv[at(b, i, 0, h) + d] * static_cast<double>(qkv[at(b, j, 1, h) + d]);
          P[i * T + j] = s * scale;
          mx = std::max(mx, s * scale);
        }
        double sum = 0;
        for (int j = 0; j <= last; ++j) sum += P[i * T + j] = std::exp(P[i * T + j] - mx);
        for (int j = 0; j <= last; ++j) P[i * T + j] /= sum;
        const size_t o = (static_cast<size_t>(b) * T + i) * C + h * sh.hs;
        for (int d = 0; d < sh.hs; ++d) {
          double y = 0;
          for (int j = 0; j <= last; ++j) y += P[i * T + j] * qkv[at(b, j, 2, h) + d];
          r.out[o + d] = static_cast<float>(y);
        }
        double D = 0;
        for (int j = 0; j <= last; ++j) {
          double dp = 0;
          for (int d = 0; d < sh.hs; ++d) dp += dout[o + d] * static_cast<double>(qkv[at(b, j, 2, h) + d]);
          dS[i * T + j] = dp;
          D += P[i * T + j] * dp;
        }
        for (int j = 0; j <= last; ++j) dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - D) * scale;
      }
      for (int i = 0; i < T; ++i) {
        for (int d = 0; d < sh.hs; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j < T; ++j) {
            dq += dS[i * T + j] * qkv[at(b, j, 1, h) + d];
            dk += dS[j * T + i] * qkv[at(b, j, 0, h) + d];
            dv += P[j * T + i] * dout[(static_cast<size_t>(b) * T + j) * C + h * sh.hs + d];
          }
          r.dqkv[at(b, i, 0, h) + d] = static_cast<float>(dq);
          r.dqkv[at(b, i, 1, h) + d] = static_cast<float>(dk);
          r.dqkv[at(b, i, 2, h) + d] = static_cast<float>(dv);
        }
      }
    }
  }
  return r;
}

// ‖a - b‖ / ‖b‖
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]), den += b[i] * static_cast<double>(b[i]);
  return std::sqrt(num / den);
}

template <typename E>
std::vector<E> Round(const std::vector<float>& x) {
  std::vector<E> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = static_cast<E>(x[i]);
  return r;
}
template <typename E>
std::vector<float> Widen(const std::vector<E>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = static_cast<float>(x[i]);
  return r;
}

// Forward and backward on the GPU; dqkv starts as NaN so an element left unwritten shows.
template <typename E>
Result RunKernels(const Shape& sh, const std::vector<E>& qkv, const std::vector<E>& dout) {
  const size_t N = static_cast<size_t>(sh.B) * sh.T, C = static_cast<size_t>(sh.NH) * sh.hs, rows = N * sh.NH;
  Buffer<E> d_qkv(N * 3 * C), d_dout(N * C), d_out(N * C), d_dqkv(N * 3 * C);
  Buffer<float> lse(rows), delta(rows);
  Buffer<int> prefix(sh.B);
  d_qkv.Put(qkv);
  d_dout.Put(dout);
  if (!sh.prefix.empty()) prefix.Put(sh.prefix);
  EXPECT_EQ(cudaMemset(d_dqkv.p, 0xff, N * 3 * C * sizeof(E)), cudaSuccess);  // NaN in bf16 and fp16
  const int* pre = sh.prefix.empty() ? nullptr : prefix.p;
  cuda::FlashAttentionForward<E>(nullptr, d_out.p, lse.p, d_qkv.p, pre, sh.B, sh.T, static_cast<int>(C), sh.NH);
  cuda::FlashAttentionBackward<E>(nullptr, d_dqkv.p, delta.p, d_dout.p, d_out.p, d_qkv.p, lse.p, pre, sh.B, sh.T,
                                  static_cast<int>(C), sh.NH);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return {Widen(d_out.Get()), Widen(d_dqkv.Get())};
}

template <typename E>
void CheckAgainstDoubles(double tolerance, const char* name) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "flash attention needs a GPU: " << why;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& sh : {Shape{2, 70, 3, 24, {}}, Shape{2, 130, 2, 64, {17, 100}}, Shape{1, 200, 2, 128, {}},
                          Shape{2, 16, 4, 8, {5, 0}}, Shape{1, 64, 1, 128, {64}}}) {
    const size_t N = static_cast<size_t>(sh.B) * sh.T, C = static_cast<size_t>(sh.NH) * sh.hs;
    std::vector<float> qkv(N * 3 * C), dout(N * C);
    for (float& x : qkv) x = 1.5f * normal(rng);  // sharp enough that the softmax is not near uniform
    for (float& x : dout) x = normal(rng);
    const std::vector<E> qkv_t = Round<E>(qkv), dout_t = Round<E>(dout);
    const Result ref = Reference(sh, Widen(qkv_t), Widen(dout_t));
    const Result got = RunKernels(sh, qkv_t, dout_t);
    const std::string what = std::string(name) + " B " + std::to_string(sh.B) + " T " + std::to_string(sh.T) + " heads " +
                             std::to_string(sh.NH) + " x " + std::to_string(sh.hs) + (sh.prefix.empty() ? " causal" : " prefix-LM");
    EXPECT_LT(RelativeError(got.out, ref.out), tolerance) << what << ": out";
    for (int part = 0; part < 3; ++part) {
      std::vector<float> g, r;
      for (size_t n = 0; n < N; ++n) {
        g.insert(g.end(), got.dqkv.begin() + (n * 3 + part) * C, got.dqkv.begin() + (n * 3 + part + 1) * C);
        r.insert(r.end(), ref.dqkv.begin() + (n * 3 + part) * C, ref.dqkv.begin() + (n * 3 + part + 1) * C);
      }
      EXPECT_LT(RelativeError(g, r), tolerance) << what << ": d" << "qkv"[part];
    }
    const Result again = RunKernels(sh, qkv_t, dout_t);
    EXPECT_EQ(std::memcmp(got.out.data(), again.out.data(), got.out.size() * 4), 0) << what << ": a second forward";
    EXPECT_EQ(std::memcmp(got.dqkv.data(), again.dqkv.data(), got.dqkv.size() * 4), 0) << what << ": a second backward";
  }
}

// bf16 keeps 8 significant bits, fp16 11; the probabilities are rounded once before P·V.
TEST(FlashAttention, Bf16MatchesAttentionInDoubles) { CheckAgainstDoubles<__nv_bfloat16>(2e-2, "bf16"); }
TEST(FlashAttention, Fp16MatchesAttentionInDoubles) { CheckAgainstDoubles<__half>(4e-3, "fp16"); }

}  // namespace
}  // namespace longhaul
