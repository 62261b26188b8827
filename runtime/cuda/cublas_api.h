#pragma once
// cuBLAS, loaded with dlopen by the first CUDA stage instead of linked. Linked, its cuBLASLt's
// static initialisers would run in every longhaul process, CPU workers, the coordinator and each
// command included, costing time and hundreds of megabytes resident before main, paid again by
// every restarted spare and in the teardown of every killed worker. Only the functions the CUDA backend calls, each typed by cuBLAS's own
// declaration (the overload the backend calls, where the header has several).
#include <cublas_api.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul {

struct Cublas {
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                  const void*, const void*, cudaDataType, int, long long int,
                                                  const void*, cudaDataType, int, long long int, const void*, void*,
                                                  cudaDataType, int, long long int, int, cublasComputeType_t,
                                                  cublasGemmAlgo_t);
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  GemmEx gemm = nullptr;
  GemmStridedBatchedEx gemm_strided_batched = nullptr;
  decltype(&cublasDtrsm_v2) trsm = nullptr;  // the low-rank codec's orthonormalisation (cuda/low_rank.cuh)
};

// The first of `libraries` with every function; FailedPrecondition naming each one tried and the fix.
absl::StatusOr<Cublas> OpenCublas(const std::vector<std::string>& libraries);
// cuBLAS as the build found it, then as the loader finds it (LD_LIBRARY_PATH: a packed bundle's
// `run` adds /usr/local/cuda/lib64), loaded once.
absl::StatusOr<const Cublas*> LoadCublas();
// REQUIRES: LoadCublas() succeeded (a cuBLAS handle exists only then).
const Cublas& LoadedCublas();

}  // namespace longhaul
