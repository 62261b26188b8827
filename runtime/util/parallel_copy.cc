#include "util/parallel_copy.h"

#include <algorithm>
#include <cstring>

namespace longhaul {

void ParallelCopy(void* dst, const void* src, size_t bytes) {
  // Pieces of at least 1 MiB: below that a thread's start costs more than it copies.
  constexpr size_t kPiece = 1 << 20;
  const long pieces = static_cast<long>((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) if (pieces > 1)
  for (long i = 0; i < pieces; ++i) {
    const size_t at = static_cast<size_t>(i) * kPiece;
    std::memcpy(static_cast<char*>(dst) + at, static_cast<const char*>(src) + at, std::min(kPiece, bytes - at));
  }
}

}  // namespace longhaul
