// cuBLAS is loaded when a CUDA stage first needs it, not when a process starts: a binary linked
// with the CUDA backend (this test is one) has no libcublas mapped until LoadCublas, every function
// the backend calls resolves from the toolkit's library (no GPU needed for that), and a missing
// library is an error naming what was tried and the fix.
#include "cuda/cublas_api.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "absl/status/statusor.h"

namespace longhaul {
namespace {

TEST(CublasApi, LoadedOnFirstUseOnlyWithEveryFunction) {
  EXPECT_EQ(dlopen("libcublas.so.13", RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "libcublas was mapped before LoadCublas: something links it again, and every process pays its start-up";
  EXPECT_EQ(dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_NOLOAD), nullptr) << "libcublasLt was mapped before LoadCublas";
  if (!std::filesystem::exists(LONGHAUL_CUBLAS_PATH)) {
    GTEST_SKIP() << "no cuBLAS at " << LONGHAUL_CUBLAS_PATH << " (the toolkit this build found is gone)";
  }
  const absl::StatusOr<const Cublas*> cublas = LoadCublas();
  ASSERT_TRUE(cublas.ok()) << cublas.status();
  EXPECT_NE((*cublas)->create, nullptr);
  EXPECT_NE((*cublas)->destroy, nullptr);
  EXPECT_NE((*cublas)->set_stream, nullptr);
  EXPECT_NE((*cublas)->gemm, nullptr);
  EXPECT_NE((*cublas)->gemm_strided_batched, nullptr);
  EXPECT_EQ(&LoadedCublas(), *cublas);
  EXPECT_NE(dlopen("libcublas.so.13", RTLD_NOW | RTLD_NOLOAD), nullptr) << "LoadCublas mapped it";
}

TEST(CublasApi, AMissingLibraryIsAnErrorNamingItAndTheFix) {
  const absl::StatusOr<Cublas> cublas = OpenCublas({"/nonexistent/libcublas.so.13"});
  ASSERT_EQ(cublas.status().code(), absl::StatusCode::kFailedPrecondition) << cublas.status();
  const std::string m(cublas.status().message());
  EXPECT_NE(m.find("cannot load cuBLAS: tried /nonexistent/libcublas.so.13 ("), std::string::npos) << m;
  EXPECT_NE(m.find("LD_LIBRARY_PATH"), std::string::npos) << m;
}

}  // namespace
}  // namespace longhaul
