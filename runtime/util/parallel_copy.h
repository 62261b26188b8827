#pragma once
// memcpy split over the OpenMP threads: one core moves a few GB/s out of memory it has not
// touched lately, which is slower than the PCIe link a GPU stage feeds from a pinned buffer.
#include <cstddef>

namespace longhaul {

void ParallelCopy(void* dst, const void* src, size_t bytes);

}  // namespace longhaul
