#include "cpu/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace longhaul::cpu {
namespace {

struct Blas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_sgemv) sgemv = nullptr;
  char* (*corename)() = nullptr;
};

const char* CoreTypeForThisCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;  // let OpenBLAS decide
}

const Blas& Load() {
  static const Blas blas = [] {
    if (const char* core = CoreTypeForThisCpu(); core != nullptr) setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/0);
    // The library CMake found, then whatever the loader finds (a bundle carried with its libraries).
    void* h = dlopen(LONGHAUL_OPENBLAS_PATH, RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_GLOBAL);
    Blas b;
    if (h != nullptr) {
      b.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(h, "cblas_sgemm"));
      b.sgemv = reinterpret_cast<decltype(&cblas_sgemv)>(dlsym(h, "cblas_sgemv"));
      b.corename = reinterpret_cast<char* (*)()>(dlsym(h, "openblas_get_corename"));
    }
    if (b.sgemm == nullptr || b.sgemv == nullptr) {
      std::fprintf(stderr,
                   "longhaul: error: cannot load OpenBLAS (%s, libopenblas.so.0): %s; install libopenblas-openmp-dev "
                   "(bash deploy/setup.sh does)\n",
                   LONGHAUL_OPENBLAS_PATH, dlerror());
      std::exit(1);
    }
    return b;
  }();
  return blas;
}

}  // namespace

void Sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc) {
  Load().sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
               A, lda, B, ldb, beta, C, ldc);
}

void SgemvTrans(int M, int N, float alpha, const float* A, int lda, const float* x, float beta, float* y) {
  Load().sgemv(CblasRowMajor, CblasTrans, M, N, alpha, A, lda, x, 1, beta, y, 1);
}

const char* BlasCoreName() {
  const Blas& b = Load();
  return b.corename != nullptr ? b.corename() : "unknown";
}

}  // namespace longhaul::cpu
