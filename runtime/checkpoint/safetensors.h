#pragma once
// The safetensors format (8-byte little-endian header length, JSON header, raw data), fp32 only,
// so model parameters can be read by other tools (Python's safetensors, PyTorch).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
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

// A file's header, checked: every tensor F32, its shape and its bytes [begin, end) of the data
// section (which starts at data_start) within the file's size.
struct SafetensorsEntry {
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;
};
struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  size_t data_start = 0;
};

// Writes the file and returns its CRC-32 (zlib polynomial) over every byte written.
absl::StatusOr<uint32_t> WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                                          const std::map<std::string, std::string>& metadata);
// The JSON header's length from a file's first 8 bytes (little-endian).
uint64_t SafetensorsHeaderLength(std::string_view head);
// Parses the header of a file of `file_size` bytes from its first bytes, `head` (the 8-byte length
// and at least that much JSON); `path` only names it in errors.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const std::string& path, std::string_view head,
                                                          size_t file_size);
// Parses a file already in memory; `path` only names it in errors.
absl::StatusOr<Safetensors> ParseSafetensors(const std::string& path, const std::string& bytes);
absl::StatusOr<Safetensors> ReadSafetensors(const std::string& path);

uint32_t Crc32(const std::string& bytes);
// The CRC-32 of the bytes before (`crc`, 0 for none) followed by data[0, n).
uint32_t Crc32Update(uint32_t crc, const void* data, size_t n);

}  // namespace longhaul
