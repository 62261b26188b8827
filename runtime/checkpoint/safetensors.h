#pragma once
// The safetensors format (8-byte little-endian header length, JSON header, raw data), fp32 only,
// so model parameters can be read by other tools (Python's safetensors, PyTorch).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul {

struct TensorView {  // a tensor to write; data is not owned
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

struct LoadedTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct Safetensors {
  std::map<std::string, LoadedTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes the file and returns its CRC-32 (zlib polynomial) over every byte written.
absl::StatusOr<uint32_t> WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                                          const std::map<std::string, std::string>& metadata);
// Parses a file already in memory; `path` only names it in errors.
absl::StatusOr<Safetensors> ParseSafetensors(const std::string& path, const std::string& bytes);
absl::StatusOr<Safetensors> ReadSafetensors(const std::string& path);

absl::StatusOr<std::string> ReadWholeFile(const std::string& path);
uint32_t Crc32(const std::string& bytes);

}  // namespace longhaul
