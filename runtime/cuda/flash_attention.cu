#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/flash_attention.cuh"

namespace longhaul::cuda {
namespace {

// Four warps per block; each owns 16 rows of the tile its block works on.
constexpr int kWarps = 4, kThreads = 32 * kWarps, kRows = 16 * kWarps;
// Elements added to each row of a shared tile: a fragment load's 32 lanes then hit 32 banks.
constexpr int kPad = 8;

// d (16x8, fp32) += a (16x16, row-major) · b (16x8, column-major) on the tensor cores. Fragment
// layout (PTX ISA, mma.m16n8k16), g = lane / 4, t = lane % 4: a[0] holds row g, columns 2t and
// 2t+1; a[1] row g+8; a[2] and a[3] the same rows at columns 2t+8, 2t+9. b0 holds k = 2t, 2t+1
// of column g, b1 k = 2t+8, 2t+9. d[0], d[1]: row g, columns 2t, 2t+1; d[2], d[3]: row g+8.
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, the first in the low half (the lower column of a fragment register).
template <typename T>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  }
  return r;
}

// The 16x8 accumulators of two neighbouring column tiles, rounded to T, as the A fragment of
// their 16x16 block: the register reuse that keeps probabilities out of memory.
template <typename T>
__device__ __forceinline__ void ToA(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = Pack<T>(lo[0], lo[1]), a[1] = Pack<T>(lo[2], lo[3]), a[2] = Pack<T>(hi[0], hi[1]), a[3] = Pack<T>(hi[2], hi[3]);
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements from shared memory, lane l giving the address of row l % 8
// of matrix l / 8; r[i] receives row lane / 4, columns 2 (lane % 4) and +1 of matrix i, or with
// kTrans those of its transpose.
template <bool kTrans>
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const void* row) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  }
}

// R rows of K elements in shared memory, K contiguous, each row 16-byte aligned.
template <typename T, int R, int K>
struct Tile {
  static constexpr int kLd = K + kPad, kElems = R * kLd;
  T* p;
  // The A fragment of rows r0..r0+15 and columns k0..k0+15.
  __device__ void A(uint32_t (&a)[4], int r0, int k0) const {
    const int l = threadIdx.x % 32, m = l / 8;
    LoadMatrices<false>(a, p + (r0 + l % 8 + m % 2 * 8) * kLd + k0 + m / 2 * 8);
  }
  // B = this tile transposed (its rows are the product's columns): the B fragments of columns
  // n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2], b[3]) over k0..k0+15.
  __device__ void BTransposed(uint32_t (&b)[4], int n0, int k0) const {
    const int l = threadIdx.x % 32, m = l / 8;
    LoadMatrices<false>(b, p + (n0 + l % 8 + m / 2 * 8) * kLd + k0 + m % 2 * 8);
  }
  // B = this tile (its rows are the product's k): the B fragments over rows k0..k0+15 of columns
  // n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2], b[3]).
  __device__ void B(uint32_t (&b)[4], int k0, int n0) const {
    const int l = threadIdx.x % 32, m = l / 8;
    LoadMatrices<true>(b, p + (k0 + l % 8 + m % 2 * 8) * kLd + n0 + m / 2 * 8);
  }
  // The i-th of a run of such tiles laid out one after another (double buffers).
  __device__ Tile Next(int i) const { return Tile{p + i * kElems}; }
};

// Starts copying rows row0 .. row0+R-1 of one head's (n, hs) slice, its rows `ld` elements apart,
// into `dst` without waiting (cp.async, 16 bytes a thread); zeros past row n and column hs. The
// copies join the thread's next commit group.
template <typename T, int R, int HS>
__device__ void LoadAsync(const Tile<T, R, HS>& dst, const T* src, long ld, int row0, int n, int hs) {
  for (int i = threadIdx.x; i < R * (HS / 8); i += kThreads) {
    const int r = i / (HS / 8), c = i % (HS / 8) * 8;
    const bool in = row0 + r < n && c < hs;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst.p + r * dst.kLd + c)),
                 "l"(in ? src + (row0 + r) * ld + c : src), "r"(in ? 16 : 0));
  }
}
__device__ __forceinline__ void CommitLoads() { asm volatile("cp.async.commit_group;\n"); }
// Waits until at most `kPending` of this thread's commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void WaitLoads() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Where one (batch, head) pair's tensors start: q, k, v rows 3C apart, out and dout rows C apart.
struct Head {
  int b, h, bh, prefix;
  long qkv, out;  // element offsets of (b, 0, h·hs) in qkv and in out
  __device__ Head(const int* prefixes, int Tn, int C, int NH, int hs)
      : b(blockIdx.y / NH), h(blockIdx.y % NH), bh(blockIdx.y), prefix(prefixes != nullptr ? prefixes[b] : 0),
        qkv(static_cast<long>(b) * Tn * 3 * C + h * hs), out(static_cast<long>(b) * Tn * C + h * hs) {}
  __device__ bool Visible(int query, int key) const { return key <= max(query, prefix - 1); }
  // One past the last key a query in [q0, q0 + rows) can see.
  __device__ int KeysEnd(int q0, int rows, int Tn) const { return min(Tn, max(q0 + rows, prefix)); }
};

// Shared memory of one block: the tiles laid out one after another.
template <typename T>
struct SharedCursor {
  unsigned char* at;
  template <int R, int K>
  __device__ Tile<T, R, K> Take() {
    Tile<T, R, K> t{reinterpret_cast<T*>(at)};
    at += sizeof(T) * Tile<T, R, K>::kElems;
    return t;
  }
};

// Forward: a block takes kRows queries of one head (the longest rows first) and walks the keys
// they can see, 64 at a time, keeping a running max and sum per row (the online softmax); the
// next keys and values load while the current ones are used. Scores are in base 2:
// s · scale · log2(e).
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) FlashForwardKernel(T* out, float* lse, const T* qkv, const int* prefix,
                                                               int Tn, int C, int NH, int hs, float scale_log2) {
  constexpr int kKeys = 64;
  extern __shared__ __align__(16) unsigned char smem[];
  SharedCursor<T> cur{smem};
  const auto q = cur.template Take<kRows, HS>();
  const auto k = cur.template Take<kKeys, HS>();  // two buffers each
  cur.template Take<kKeys, HS>();
  const auto v = cur.template Take<kKeys, HS>();
  cur.template Take<kKeys, HS>();
  const Head hd(prefix, Tn, C, NH, hs);
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows, r0 = warp * 16;
  const long ld = 3L * C;
  const T* qs = qkv + hd.qkv;
  const int tiles = (hd.KeysEnd(q0, kRows, Tn) + kKeys - 1) / kKeys;
  LoadAsync(q, qs, ld, q0, Tn, hs);
  LoadAsync(k, qs + C, ld, 0, Tn, hs);
  LoadAsync(v, qs + 2 * C, ld, 0, Tn, hs);
  CommitLoads();
  uint32_t qa[HS / 16][4];  // this warp's 16 query rows (16, HS) as A fragments
  const int rows[2] = {q0 + r0 + g, q0 + r0 + g + 8};
  float o[HS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  for (int i = 0; i < tiles; ++i) {
    const int k0 = i * kKeys;
    if (i + 1 < tiles) {
      LoadAsync(k.Next((i + 1) % 2), qs + C, ld, k0 + kKeys, Tn, hs);
      LoadAsync(v.Next((i + 1) % 2), qs + 2 * C, ld, k0 + kKeys, Tn, hs);
      CommitLoads();
      WaitLoads<1>();
    } else {
      WaitLoads<0>();
    }
    __syncthreads();
    if (i == 0)
      for (int kk = 0; kk < HS / 16; ++kk) q.A(qa[kk], r0, kk * 16);
    const auto kb = k.Next(i % 2), vb = v.Next(i % 2);
    float s[kKeys / 8][4] = {};  // scores (16 rows, 64 keys)
    for (int kk = 0; kk < HS / 16; ++kk) {
      for (int n = 0; n < kKeys / 16; ++n) {
        uint32_t b[4];
        kb.BTransposed(b, n * 16, kk * 16);
        Mma<T>(s[2 * n], qa[kk], b[0], b[1]);
        Mma<T>(s[2 * n + 1], qa[kk], b[2], b[3]);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < kKeys / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * t + (e & 1);
        s[n][e] = key < Tn && hd.Visible(rows[e / 2], key) ? s[n][e] * scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
      }
    }
    float ref[2];
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      ref[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row that has seen no key yet
      const float alpha = exp2f(m[r] - ref[r]);
      m[r] = m_new, l[r] *= alpha;
      for (int n = 0; n < HS / 8; ++n) o[n][2 * r] *= alpha, o[n][2 * r + 1] *= alpha;
    }
    // l sums this lane's share of each row; the four lanes of a row add theirs at the end.
    for (int n = 0; n < kKeys / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - ref[e / 2]);
        l[e / 2] += s[n][e];
      }
    }
    for (int kc = 0; kc < kKeys / 16; ++kc) {
      uint32_t pa[4];
      ToA<T>(pa, s[2 * kc], s[2 * kc + 1]);
      for (int n = 0; n < HS / 16; ++n) {
        uint32_t b[4];
        vb.B(b, kc * 16, n * 16);
        Mma<T>(o[2 * n], pa, b[0], b[1]);
        Mma<T>(o[2 * n + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next loads fill it
  }
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    if (rows[r] >= Tn) continue;
    const float inv = 1.0f / l[r];
    T* y = out + hd.out + static_cast<long>(rows[r]) * C;
    for (int n = 0; n < HS / 8; ++n) {
      const int d = n * 8 + 2 * t;
      if (d < hs) *reinterpret_cast<uint32_t*>(y + d) = Pack<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (t == 0) lse[static_cast<long>(hd.bh) * Tn + rows[r]] = m[r] + log2f(l[r]);
  }
}

// delta (B, NH, T) = Σ_d dout · out per query: the softmax backward's row term. One warp a row.
template <typename T>
__global__ void FlashDeltaKernel(float* delta, const T* dout, const T* out, int B, int Tn, int C, int NH) {
  const long row = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  if (row >= static_cast<long>(B) * NH * Tn) return;
  const int lane = threadIdx.x % 32, hs = C / NH, t = row % Tn, h = row / Tn % NH, b = row / Tn / NH;
  const long at = (static_cast<long>(b) * Tn + t) * C + h * hs;
  float sum = 0.0f;
  for (int d = lane; d < hs; d += 32) sum += static_cast<float>(dout[at + d]) * static_cast<float>(out[at + d]);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
  if (lane == 0) delta[row] = sum;
}

// Backward for keys and values: a block takes kRows keys of one head and walks the queries that
// can see them, 32 at a time (the next ones loading meanwhile), working in the transposed frame
// (rows are keys) so dK and dV stay in its registers: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
// dK += dS^T Q.
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) FlashBackwardKvKernel(T* dqkv, const T* dout, const T* qkv,
                                                                  const float* lse, const float* delta,
                                                                  const int* prefix, int Tn, int C, int NH, int hs,
                                                                  float scale_log2, float scale) {
  constexpr int kQueries = 32;
  extern __shared__ __align__(16) unsigned char smem[];
  SharedCursor<T> cur{smem};
  const auto k = cur.template Take<kRows, HS>();
  const auto v = cur.template Take<kRows, HS>();
  const auto q = cur.template Take<kQueries, HS>();  // two buffers each
  cur.template Take<kQueries, HS>();
  const auto dO = cur.template Take<kQueries, HS>();
  cur.template Take<kQueries, HS>();
  const Head hd(prefix, Tn, C, NH, hs);
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int k0 = blockIdx.x * kRows, r0 = warp * 16;
  const long ld = 3L * C;
  const T* qs = qkv + hd.qkv;
  const T* dos = dout + hd.out;
  const float* lq = lse + static_cast<long>(hd.bh) * Tn;
  const float* dl = delta + static_cast<long>(hd.bh) * Tn;
  // Keys below the prefix are seen by every query; others only by the queries at or after them.
  const int first = k0 < hd.prefix ? 0 : k0, tiles = (Tn - first + kQueries - 1) / kQueries;
  LoadAsync(k, qs + C, ld, k0, Tn, hs);
  LoadAsync(v, qs + 2 * C, ld, k0, Tn, hs);
  LoadAsync(q, qs, ld, first, Tn, hs);
  LoadAsync(dO, dos, C, first, Tn, hs);
  CommitLoads();
  const int keys[2] = {k0 + r0 + g, k0 + r0 + g + 8};
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  for (int i = 0; i < tiles; ++i) {
    const int q0 = first + i * kQueries;
    if (i + 1 < tiles) {
      LoadAsync(q.Next((i + 1) % 2), qs, ld, q0 + kQueries, Tn, hs);
      LoadAsync(dO.Next((i + 1) % 2), dos, C, q0 + kQueries, Tn, hs);
      CommitLoads();
      WaitLoads<1>();
    } else {
      WaitLoads<0>();
    }
    __syncthreads();
    const auto qb = q.Next(i % 2), db = dO.Next(i % 2);
    float st[kQueries / 8][4] = {}, dpt[kQueries / 8][4] = {};  // (16 keys, 32 queries)
    for (int kk = 0; kk < HS / 16; ++kk) {
      uint32_t ka[4], va[4];
      k.A(ka, r0, kk * 16);
      v.A(va, r0, kk * 16);
      for (int n = 0; n < kQueries / 16; ++n) {
        uint32_t b[4];
        qb.BTransposed(b, n * 16, kk * 16);
        Mma<T>(st[2 * n], ka, b[0], b[1]);
        Mma<T>(st[2 * n + 1], ka, b[2], b[3]);
        db.BTransposed(b, n * 16, kk * 16);
        Mma<T>(dpt[2 * n], va, b[0], b[1]);
        Mma<T>(dpt[2 * n + 1], va, b[2], b[3]);
      }
    }
    for (int n = 0; n < kQueries / 8; ++n) {
      for (int e = 0; e < 2; ++e) {
        const int query = q0 + n * 8 + 2 * t + e;
        const bool in = query < Tn;
        const float lse_q = in ? lq[query] : 0.0f, delta_q = in ? dl[query] : 0.0f;
        for (int r = 0; r < 2; ++r) {
          const int key = keys[r];
          float& sv = st[n][2 * r + e];
          float& dv_ = dpt[n][2 * r + e];
          const float p = in && key < Tn && hd.Visible(query, key) ? exp2f(sv * scale_log2 - lse_q) : 0.0f;
          sv = p;
          dv_ = p * (dv_ - delta_q);
        }
      }
    }
    for (int kc = 0; kc < kQueries / 16; ++kc) {
      uint32_t pa[4], da[4];
      ToA<T>(pa, st[2 * kc], st[2 * kc + 1]);
      ToA<T>(da, dpt[2 * kc], dpt[2 * kc + 1]);
      for (int n = 0; n < HS / 16; ++n) {
        uint32_t b[4];
        db.B(b, kc * 16, n * 16);
        Mma<T>(dv[2 * n], pa, b[0], b[1]);
        Mma<T>(dv[2 * n + 1], pa, b[2], b[3]);
        qb.B(b, kc * 16, n * 16);
        Mma<T>(dk[2 * n], da, b[0], b[1]);
        Mma<T>(dk[2 * n + 1], da, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next loads fill it
  }
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= Tn) continue;
    T* row = dqkv + hd.qkv + keys[r] * ld;
    for (int n = 0; n < HS / 8; ++n) {
      const int d = n * 8 + 2 * t;
      if (d >= hs) continue;
      *reinterpret_cast<uint32_t*>(row + C + d) = Pack<T>(dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(row + 2 * C + d) = Pack<T>(dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

// Backward for queries: a block takes kRows queries of one head and walks the keys they see, 32
// at a time (the next ones loading meanwhile): S = Q K^T, dP = dO V^T, dQ += dS K.
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) FlashBackwardQKernel(T* dqkv, const T* dout, const T* qkv,
                                                                 const float* lse, const float* delta,
                                                                 const int* prefix, int Tn, int C, int NH, int hs,
                                                                 float scale_log2, float scale) {
  constexpr int kKeys = 32;
  extern __shared__ __align__(16) unsigned char smem[];
  SharedCursor<T> cur{smem};
  const auto q = cur.template Take<kRows, HS>();
  const auto dO = cur.template Take<kRows, HS>();
  const auto k = cur.template Take<kKeys, HS>();  // two buffers each
  cur.template Take<kKeys, HS>();
  const auto v = cur.template Take<kKeys, HS>();
  cur.template Take<kKeys, HS>();
  const Head hd(prefix, Tn, C, NH, hs);
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows, r0 = warp * 16;
  const long ld = 3L * C;
  const T* qs = qkv + hd.qkv;
  const int tiles = (hd.KeysEnd(q0, kRows, Tn) + kKeys - 1) / kKeys;
  LoadAsync(q, qs, ld, q0, Tn, hs);
  LoadAsync(dO, dout + hd.out, C, q0, Tn, hs);
  LoadAsync(k, qs + C, ld, 0, Tn, hs);
  LoadAsync(v, qs + 2 * C, ld, 0, Tn, hs);
  CommitLoads();
  const int rows[2] = {q0 + r0 + g, q0 + r0 + g + 8};
  float lr[2], dr[2];
  for (int r = 0; r < 2; ++r) {
    const long at = static_cast<long>(hd.bh) * Tn + rows[r];
    lr[r] = rows[r] < Tn ? lse[at] : 0.0f;
    dr[r] = rows[r] < Tn ? delta[at] : 0.0f;
  }
  float dqa[HS / 8][4] = {};
  for (int i = 0; i < tiles; ++i) {
    const int k0 = i * kKeys;
    if (i + 1 < tiles) {
      LoadAsync(k.Next((i + 1) % 2), qs + C, ld, k0 + kKeys, Tn, hs);
      LoadAsync(v.Next((i + 1) % 2), qs + 2 * C, ld, k0 + kKeys, Tn, hs);
      CommitLoads();
      WaitLoads<1>();
    } else {
      WaitLoads<0>();
    }
    __syncthreads();
    const auto kb = k.Next(i % 2), vb = v.Next(i % 2);
    float s[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};  // (16 queries, 32 keys)
    for (int kk = 0; kk < HS / 16; ++kk) {
      uint32_t qa[4], da[4];
      q.A(qa, r0, kk * 16);
      dO.A(da, r0, kk * 16);
      for (int n = 0; n < kKeys / 16; ++n) {
        uint32_t b[4];
        kb.BTransposed(b, n * 16, kk * 16);
        Mma<T>(s[2 * n], qa, b[0], b[1]);
        Mma<T>(s[2 * n + 1], qa, b[2], b[3]);
        vb.BTransposed(b, n * 16, kk * 16);
        Mma<T>(dp[2 * n], da, b[0], b[1]);
        Mma<T>(dp[2 * n + 1], da, b[2], b[3]);
      }
    }
    for (int n = 0; n < kKeys / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, key = k0 + n * 8 + 2 * t + (e & 1);
        const float p = rows[r] < Tn && key < Tn && hd.Visible(rows[r], key) ? exp2f(s[n][e] * scale_log2 - lr[r])
                                                                              : 0.0f;
        s[n][e] = p * (dp[n][e] - dr[r]);
      }
    }
    for (int kc = 0; kc < kKeys / 16; ++kc) {
      uint32_t da[4];
      ToA<T>(da, s[2 * kc], s[2 * kc + 1]);
      for (int n = 0; n < HS / 16; ++n) {
        uint32_t b[4];
        kb.B(b, kc * 16, n * 16);
        Mma<T>(dqa[2 * n], da, b[0], b[1]);
        Mma<T>(dqa[2 * n + 1], da, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next loads fill it
  }
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= Tn) continue;
    T* row = dqkv + hd.qkv + rows[r] * ld;
    for (int n = 0; n < HS / 8; ++n) {
      const int d = n * 8 + 2 * t;
      if (d < hs) *reinterpret_cast<uint32_t*>(row + d) = Pack<T>(dqa[n][2 * r] * scale, dqa[n][2 * r + 1] * scale);
    }
  }
}

// Launches `kernel` on a grid of (query or key tiles, B · NH heads) with `smem` bytes of shared
// memory; above 48 KiB a kernel must opt in, which costs a microsecond on the host.
template <typename Kernel, typename... Args>
void Launch(Kernel kernel, size_t smem, cudaStream_t s, int B, int Tn, int NH, Args... args) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const dim3 grid((Tn + kRows - 1) / kRows, B * NH);
  kernel<<<grid, kThreads, smem, s>>>(args...);
}

// Bytes of a shared tile of `rows` rows of `cols` elements.
template <typename T>
constexpr size_t TileBytes(int rows, int cols) {
  return sizeof(T) * static_cast<size_t>(rows) * (cols + kPad);
}

template <typename T, int HS>
struct Forward {
  static void Run(cudaStream_t s, T* out, float* lse, const T* qkv, const int* prefix, int B, int Tn, int C, int NH,
                  float scale_log2, float) {
    const size_t smem = TileBytes<T>(kRows, HS) + 4 * TileBytes<T>(64, HS);
    Launch(FlashForwardKernel<T, HS>, smem, s, B, Tn, NH, out, lse, qkv, prefix, Tn, C, NH, C / NH, scale_log2);
  }
};

template <typename T, int HS>
struct Backward {
  static void Run(cudaStream_t s, T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta,
                  const int* prefix, int B, int Tn, int C, int NH, float scale_log2, float scale) {
    const size_t kv = 2 * TileBytes<T>(kRows, HS) + 4 * TileBytes<T>(32, HS);
    Launch(FlashBackwardKvKernel<T, HS>, kv, s, B, Tn, NH, dqkv, dout, qkv, lse, delta, prefix, Tn, C, NH, C / NH,
              scale_log2, scale);
    const size_t q = 2 * TileBytes<T>(kRows, HS) + 4 * TileBytes<T>(32, HS);
    Launch(FlashBackwardQKernel<T, HS>, q, s, B, Tn, NH, dqkv, dout, qkv, lse, delta, prefix, Tn, C, NH, C / NH,
              scale_log2, scale);
  }
};

// Op<T, HS>::Run(args...) with the head size hs rounded up to a tile width, and the softmax
// scale 1/sqrt(hs) (also in base 2) as the last two arguments.
template <template <typename, int> class Op, typename T, typename... Args>
void ByTileWidth(int hs, Args... args) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const float scale_log2 = static_cast<float>(scale * M_LOG2E), scale_f = static_cast<float>(scale);
  if (hs <= 16) {
    Op<T, 16>::Run(args..., scale_log2, scale_f);
  } else if (hs <= 32) {
    Op<T, 32>::Run(args..., scale_log2, scale_f);
  } else if (hs <= 64) {
    Op<T, 64>::Run(args..., scale_log2, scale_f);
  } else {
    Op<T, 128>::Run(args..., scale_log2, scale_f);
  }
}

}  // namespace

template <typename T>
void FlashAttentionForward(cudaStream_t s, T* out, float* lse, const T* qkv, const int* prefix, int B, int Tn, int C,
                           int NH) {
  ByTileWidth<Forward, T>(C / NH, s, out, lse, qkv, prefix, B, Tn, C, NH);
}

template <typename T>
void FlashAttentionBackward(cudaStream_t s, T* dqkv, float* delta, const T* dout, const T* out, const T* qkv,
                            const float* lse, const int* prefix, int B, int Tn, int C, int NH) {
  const long rows = static_cast<long>(B) * NH * Tn;
  FlashDeltaKernel<<<static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0, s>>>(delta, dout, out, B, Tn, C, NH);
  ByTileWidth<Backward, T>(C / NH, s, dqkv, dout, qkv, lse, static_cast<const float*>(delta), prefix, B, Tn, C, NH);
}

#define LONGHAUL_FLASH(T)                                                                                          \
  template void FlashAttentionForward<T>(cudaStream_t, T*, float*, const T*, const int*, int, int, int, int);   \
  template void FlashAttentionBackward<T>(cudaStream_t, T*, float*, const T*, const T*, const T*, const float*, \
                                          const int*, int, int, int, int);
LONGHAUL_FLASH(__nv_bfloat16)
LONGHAUL_FLASH(__half)
#undef LONGHAUL_FLASH

}  // namespace longhaul::cuda
