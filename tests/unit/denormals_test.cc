// Subnormal floats are computed as zero after FlushDenormals, on the calling thread and on every
// OpenMP thread (x86 only: elsewhere the call changes nothing and the test has nothing to check).
#include "cpu/denormals.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <limits>
#include <vector>

namespace longhaul::cpu {
namespace {

// A subnormal operand (read as zero under denormals-are-zero) and a product that underflows to a
// subnormal (written as zero under flush-to-zero). volatile: computed at run time.
bool ComputesSubnormalsAsZero() {
  volatile float tiny = std::numeric_limits<float>::min() / 4;  // subnormal
  volatile float small = 1e-30f, smaller = 1e-10f;
  volatile float read = tiny * 1.0f;
  volatile float written = small * smaller;  // 1e-40: subnormal
  return read == 0.0f && written == 0.0f;
}

TEST(Denormals, FlushedOnThisThreadAndEveryOpenMpThread) {
#if defined(__x86_64__) || defined(__i386__)
  omp_set_num_threads(4);
  FlushDenormals();
  EXPECT_TRUE(ComputesSubnormalsAsZero());
  std::vector<int> flushed(4, -1);
#pragma omp parallel num_threads(4)
  flushed[omp_get_thread_num()] = ComputesSubnormalsAsZero() ? 1 : 0;
  for (int t = 0; t < 4; ++t) EXPECT_EQ(flushed[t], 1) << "OpenMP thread " << t;
#else
  GTEST_SKIP() << "flush-to-zero is set on x86 only";
#endif
}

}  // namespace
}  // namespace longhaul::cpu
