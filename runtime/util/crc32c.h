#pragma once
// CRC-32C (Castagnoli) of tensor parts on the wire and of trace files. Uses the SSE4.2 instruction
// where the build targets it (several GB/s, so checking every tensor costs little next to the
// network).
#include <cstddef>
#include <cstdint>

namespace longhaul {

// Extends `crc` (0 to start) over n bytes.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace longhaul
