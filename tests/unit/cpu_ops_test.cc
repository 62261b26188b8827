// Each CPU op against a naive double-precision reference (forward) and central finite differences
// of L = Σ r ⊙ out for a fixed random r (backward).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "cpu/ops.h"
#include "util/hash.h"

namespace longhaul::cpu {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal()) * scale;
  return v;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks analytic gradient `grad` of L(x) = Σ r ⊙ f(x) against central differences at `samples`
// entries of x. Tolerance: fp32 forward noise divided by the step, relative to the gradient scale.
void CheckGradient(std::vector<float>& x, const std::vector<float>& grad,
                   const std::function<double()>& loss, int samples, const char* what) {
  double scale = 0;
  for (float g : grad) scale = std::max(scale, std::abs(static_cast<double>(g)));
  Rng pick(99);
  for (int s = 0; s < samples; ++s) {
    const size_t i = pick.Next() % x.size();
    const float keep = x[i], h = 1e-2f;
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    const double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(grad[i], fd, 5e-3 * scale + 1e-4) << what << " entry " << i;
  }
}

TEST(CpuOps, LinearMatchesNaiveAndGradients) {
  const int N = 5, IC = 7, OC = 3;
  auto x = Random(N * IC, 1), w = Random(OC * IC, 2), b = Random(OC, 3), r = Random(N * OC, 4);
  std::vector<float> y(N * OC);
  LinearForward(y.data(), x.data(), w.data(), b.data(), N, IC, OC, false);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double ref = b[o];
      for (int i = 0; i < IC; ++i) ref += static_cast<double>(x[n * IC + i]) * w[o * IC + i];
      EXPECT_NEAR(y[n * OC + o], ref, 1e-5);
    }
  // accumulate = true adds onto what is there (the fused residual)
  std::vector<float> y2(N * OC, 1.0f);
  LinearForward(y2.data(), x.data(), w.data(), b.data(), N, IC, OC, true);
  for (int i = 0; i < N * OC; ++i) EXPECT_NEAR(y2[i], y[i] + 1.0f, 1e-5);

  std::vector<float> dx(N * IC), dw(OC * IC, 0.0f), db(OC, 0.0f);
  LinearBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, IC, OC);
  auto loss = [&] {
    LinearForward(y.data(), x.data(), w.data(), b.data(), N, IC, OC, false);
    return Dot(y, r);
  };
  CheckGradient(x, dx, loss, 20, "dx");
  CheckGradient(w, dw, loss, 20, "dw");
  CheckGradient(b, db, loss, 3, "db");
}

TEST(CpuOps, LayerNormGradients) {
  const int N = 6, C = 40;
  auto x = Random(N * C, 5, 2.0f), w = Random(C, 6), b = Random(C, 7), r = Random(N * C, 8);
  std::vector<float> y(N * C), mean(N), rstd(N);
  LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double s = 1.0 / std::sqrt(v / C + 1e-5);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(y[n * C + c], (x[n * C + c] - m) * s * w[c] + b[c], 1e-5);
  }
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  LayerNormBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  auto loss = [&] {
    LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return Dot(y, r);
  };
  CheckGradient(x, dx, loss, 30, "dx");
  CheckGradient(w, dw, loss, 10, "dw");
  CheckGradient(b, db, loss, 10, "db");
}

TEST(CpuOps, GeluMatchesTanhFormulaAndGradient) {
  auto x = Random(300, 9, 2.0f), r = Random(300, 10);
  std::vector<float> y(300);
  GeluForward(y.data(), x.data(), 300);
  for (int i = 0; i < 300; ++i) {
    const double v = x[i];
    EXPECT_NEAR(y[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-5);
  }
  std::vector<float> g = r;
  GeluBackward(g.data(), x.data(), 300);
  CheckGradient(x, g, [&] { GeluForward(y.data(), x.data(), 300); return Dot(y, r); }, 30, "dx");
}

TEST(CpuOps, EmbeddingScattersRepeatedTokens) {
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<int> tok = {1, 1, 4, 0, 1, 2};
  auto wte = Random(V * C, 11), wpe = Random(T * C, 12), dout = Random(B * T * C, 13);
  std::vector<float> out(B * T * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  EmbeddingForward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 0, C);
  EXPECT_FLOAT_EQ(out[(1 * T + 2) * C + 3], wte[2 * C + 3] + wpe[2 * C + 3]);
  EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  // token 1 appears at (0,0), (0,1), (1,1)
  EXPECT_NEAR(dwte[1 * C + 2], dout[0 * C + 2] + dout[1 * C + 2] + dout[4 * C + 2], 1e-6);
  EXPECT_NEAR(dwpe[1 * C + 0], dout[1 * C + 0] + dout[4 * C + 0], 1e-6);
  EXPECT_EQ(dwte[3 * C], 0.0f);  // token 3 never appears
}

// Naive attention in double with explicit masks, for T spanning several row blocks.
std::vector<double> NaiveAttention(const std::vector<float>& qkv, const std::vector<int>& prefix, int B, int T, int C,
                                   int NH) {
  const int hs = C / NH;
  std::vector<double> out(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const int last = std::max(i, prefix[b] - 1);
        std::vector<double> s(last + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= last; ++j) {
          double d = 0;
          for (int e = 0; e < hs; ++e)
            d += static_cast<double>(qkv[(b * T + i) * 3 * C + h * hs + e]) * qkv[(b * T + j) * 3 * C + C + h * hs + e];
          s[j] = d / std::sqrt(hs);
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= last; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= last; ++j)
          for (int e = 0; e < hs; ++e)
            out[(b * T + i) * C + h * hs + e] += s[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + e];
      }
  return out;
}

TEST(CpuOps, AttentionCausalAndPrefixAcrossRowBlocks) {
  const int B = 3, T = 150, C = 16, NH = 2;  // 150 rows: three row blocks, the last one partial
  const std::vector<int> prefix = {0, 70, 149};
  auto qkv = Random(static_cast<size_t>(B) * T * 3 * C, 14), r = Random(static_cast<size_t>(B) * T * C, 15);
  std::vector<float> out(B * T * C), att(static_cast<size_t>(B) * NH * T * T);
  AttentionForward(out.data(), att.data(), qkv.data(), prefix.data(), B, T, C, NH);
  const std::vector<double> ref = NaiveAttention(qkv, prefix, B, T, C, NH);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;

  std::vector<float> dqkv(qkv.size()), scratch(AttentionScratchFloats(T));
  AttentionBackward(dqkv.data(), scratch.data(), r.data(), qkv.data(), att.data(), prefix.data(), B, T, C, NH);
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), prefix.data(), B, T, C, NH);
    return Dot(out, r);
  };
  CheckGradient(qkv, dqkv, loss, 60, "dqkv");
}

TEST(CpuOps, AttentionWithoutPrefixIsCausal) {
  const int B = 1, T = 70, C = 8, NH = 2;
  auto qkv = Random(static_cast<size_t>(B) * T * 3 * C, 16);
  std::vector<float> a(B * T * C), b(B * T * C), att(static_cast<size_t>(B) * NH * T * T);
  const std::vector<int> zero = {0};
  AttentionForward(a.data(), att.data(), qkv.data(), nullptr, B, T, C, NH);
  AttentionForward(b.data(), att.data(), qkv.data(), zero.data(), B, T, C, NH);
  EXPECT_EQ(a, b);
  // Changing the last token's key and value leaves every earlier output untouched.
  qkv[(T - 1) * 3 * C + C] += 5.0f;
  qkv[(T - 1) * 3 * C + 2 * C] += 5.0f;
  AttentionForward(b.data(), att.data(), qkv.data(), nullptr, B, T, C, NH);
  for (int i = 0; i < (T - 1) * C; ++i) ASSERT_EQ(a[i], b[i]) << i;
}

TEST(CpuOps, CrossEntropyWeightsAndGradient) {
  const int N = 4, V = 9;
  auto logits = Random(N * V, 17, 3.0f);
  const std::vector<int> tgt = {0, 8, 3, 3};
  const std::vector<float> w = {1, 0, 1, 1};
  std::vector<float> probs = logits, losses(N);
  const float loss = CrossEntropyForward(probs.data(), losses.data(), tgt.data(), w.data(), N, V);
  double ref = 0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[n * V + v]));
    for (int v = 0; v < V; ++v) s += std::exp(logits[n * V + v] - mx);
    const double nll = std::log(s) - (logits[n * V + tgt[n]] - mx);
    EXPECT_NEAR(losses[n], nll, 1e-5);
    ref += w[n] * nll;
  }
  EXPECT_NEAR(loss, ref / 3.0, 1e-5);
  std::vector<float> d = probs;
  CrossEntropyBackward(d.data(), tgt.data(), w.data(), 1.0f, N, V);
  for (int v = 0; v < V; ++v) EXPECT_EQ(d[1 * V + v], 0.0f);  // masked row has no gradient
  std::vector<float> lg = logits;
  CheckGradient(lg, d, [&] {
    std::vector<float> p = lg, l(N);
    return static_cast<double>(CrossEntropyForward(p.data(), l.data(), tgt.data(), w.data(), N, V));
  }, 20, "dlogits");
}

}  // namespace
}  // namespace longhaul::cpu
