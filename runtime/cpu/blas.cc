#include "cpu/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>

#include "absl/status/statusor.h"
#include "util/dynamic_library.h"
#include "util/status_macros.h"

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

// The first of `libraries` that loads and has the functions.
absl::StatusOr<Blas> Open(const std::vector<std::string>& libraries) {
  if (const char* core = CoreTypeForThisCpu(); core != nullptr) setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/0);
  LH_ASSIGN_OR_RETURN(const LoadedLibrary lib,
                      LoadFirst("OpenBLAS", libraries, {"cblas_sgemm", "cblas_sgemv"},
                                "install libopenblas0-openmp (or libopenblas-openmp-dev to build; bash deploy/setup.sh "
                                "does)"));
  Blas b;
  b.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(lib.symbols[0]);
  b.sgemv = reinterpret_cast<decltype(&cblas_sgemv)>(lib.symbols[1]);
  b.corename = reinterpret_cast<char* (*)()>(dlsym(lib.handle, "openblas_get_corename"));
  return b;
}

// The library CMake found, then whatever the loader finds (a bundle carried with its libraries).
const absl::StatusOr<Blas>& Loaded() {
  static const auto* blas = new absl::StatusOr<Blas>(Open({LONGHAUL_OPENBLAS_PATH, "libopenblas.so.0"}));
  return *blas;
}

}  // namespace

absl::Status LoadBlas() { return Loaded().status(); }

absl::Status CheckBlasLibraries(const std::vector<std::string>& libraries) { return Open(libraries).status(); }

void Sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc) {
  Loaded()->sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
               A, lda, B, ldb, beta, C, ldc);
}

void SgemvTrans(int M, int N, float alpha, const float* A, int lda, const float* x, float beta, float* y) {
  Loaded()->sgemv(CblasRowMajor, CblasTrans, M, N, alpha, A, lda, x, 1, beta, y, 1);
}

const char* BlasCoreName() {
  if (!Loaded().ok()) return "unavailable";
  return Loaded()->corename != nullptr ? Loaded()->corename() : "unknown";
}

}  // namespace longhaul::cpu
