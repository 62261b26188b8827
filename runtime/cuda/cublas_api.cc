#include "cuda/cublas_api.h"

#include <type_traits>

#include "util/dynamic_library.h"
#include "util/status_macros.h"

namespace longhaul {

// The function types above are cuBLAS's: each names an overload the header declares (unevaluated,
// so nothing links against libcublas).
static_assert(std::is_same_v<decltype(static_cast<Cublas::GemmEx>(&cublasGemmEx)), Cublas::GemmEx>);
static_assert(std::is_same_v<decltype(static_cast<Cublas::GemmStridedBatchedEx>(&cublasGemmStridedBatchedEx)),
                             Cublas::GemmStridedBatchedEx>);

absl::StatusOr<Cublas> OpenCublas(const std::vector<std::string>& libraries) {
  LH_ASSIGN_OR_RETURN(
      const LoadedLibrary lib,
      LoadFirst("cuBLAS", libraries,
                {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasGemmEx",
                 "cublasGemmStridedBatchedEx", "cublasDtrsm_v2"},
                "install the CUDA toolkit's cuBLAS (it lives in /usr/local/cuda/lib64), or add its directory to "
                "LD_LIBRARY_PATH"));
  Cublas c;
  c.create = reinterpret_cast<decltype(c.create)>(lib.symbols[0]);
  c.destroy = reinterpret_cast<decltype(c.destroy)>(lib.symbols[1]);
  c.set_stream = reinterpret_cast<decltype(c.set_stream)>(lib.symbols[2]);
  c.gemm = reinterpret_cast<Cublas::GemmEx>(lib.symbols[3]);
  c.gemm_strided_batched = reinterpret_cast<Cublas::GemmStridedBatchedEx>(lib.symbols[4]);
  c.trsm = reinterpret_cast<decltype(c.trsm)>(lib.symbols[5]);
  return c;
}

namespace {
const absl::StatusOr<Cublas>& Loaded() {
  static const auto* cublas = new absl::StatusOr<Cublas>(OpenCublas({LONGHAUL_CUBLAS_PATH, "libcublas.so.13"}));
  return *cublas;
}
}  // namespace

absl::StatusOr<const Cublas*> LoadCublas() {
  if (!Loaded().ok()) return Loaded().status();
  return &*Loaded();
}

const Cublas& LoadedCublas() { return *Loaded(); }

}  // namespace longhaul
