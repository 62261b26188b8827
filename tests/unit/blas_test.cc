// Loading OpenBLAS: a missing library is an error naming what was tried and the package, not an
// exit.
#include "cpu/blas.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace longhaul::cpu {
namespace {

TEST(Blas, LoadsHere) {
  ASSERT_TRUE(LoadBlas().ok()) << LoadBlas();
  EXPECT_STRNE(BlasCoreName(), "unavailable");
}

TEST(Blas, AMissingLibraryIsAnErrorNamingItAndThePackage) {
  absl::Status s = CheckBlasLibraries({"/nonexistent/libopenblas.so.0", "libz.so.1"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(s.message());
  EXPECT_NE(m.find("cannot load OpenBLAS: tried /nonexistent/libopenblas.so.0 ("), std::string::npos) << m;
  EXPECT_NE(m.find("libz.so.1 (loads, but has no cblas_sgemm/cblas_sgemv)"), std::string::npos) << m;
  EXPECT_NE(m.find("install libopenblas0-openmp (or libopenblas-openmp-dev to build"), std::string::npos) << m;
  EXPECT_TRUE(LoadBlas().ok()) << "a failed check leaves the loaded library alone";
}

}  // namespace
}  // namespace longhaul::cpu
