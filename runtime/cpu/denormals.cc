#include "cpu/denormals.h"

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

namespace longhaul::cpu {
namespace {

void FlushOnThisThread() {
#if defined(__x86_64__) || defined(__i386__)
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
#endif
}

}  // namespace

void FlushDenormals() {
  FlushOnThisThread();
  // The pool's threads exist already where an earlier parallel region made them.
#pragma omp parallel
  FlushOnThisThread();
}

}  // namespace longhaul::cpu
