#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/files.h"
#include "util/status_macros.h"
#include "util/bounded_json.h"

namespace longhaul {

uint32_t Crc32Update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  // zlib takes a uInt length: at most 1 GiB at a time.
  for (size_t at = 0; at < n; at += size_t{1} << 30) {
    crc = static_cast<uint32_t>(crc32(crc, p + at, static_cast<uInt>(std::min(n - at, size_t{1} << 30))));
  }
  return crc;
}

uint32_t Crc32(const std::string& bytes) { return Crc32Update(0, bytes.data(), bytes.size()); }

namespace {

// write(2) until done: a regular file may take less than asked (a signal, a full disk).
bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, data, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    data += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

absl::StatusOr<uint32_t> WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<size_t> bytes;  // [tensor]
  size_t offset = 0;
  for (const TensorView& t : tensors) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    bytes.push_back(4 * n);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes.back()}}};
    offset += bytes.back();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // align the data to 8 bytes, as the format recommends
  std::string head;
  const uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) head.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  head += json;
  // Straight from the tensors, over the file's old bytes where it has some: no copy of the data,
  // and an existing file's cached pages are reused (SaveCheckpoint hands it a pruned checkpoint's
  // files); ftruncate cuts what is left over.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", path, " for writing: ", std::strerror(errno),
                                            " (no permission, or no such directory?)"));
  }
  uint32_t crc = 0;
  auto put = [&](const char* data, size_t n) {
    crc = Crc32Update(crc, data, n);
    return WriteAll(fd, data, n);
  };
  bool ok = put(head.data(), head.size());
  for (size_t i = 0; i < tensors.size(); ++i) ok = ok && put(reinterpret_cast<const char*>(tensors[i].data), bytes[i]);
  ok = ok && ::ftruncate(fd, static_cast<off_t>(head.size() + offset)) == 0;
  int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(err), " (disk full or no permission?)"));
  }
  return crc;
}

uint64_t SafetensorsHeaderLength(std::string_view head) {
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(static_cast<uint8_t>(head[i])) << (8 * i);
  return len;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const std::string& path, std::string_view head,
                                                          size_t file_size) {
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("safetensors file ", path, " is truncated or corrupt: ", why));
  };
  if (head.size() < 8 || file_size < 8) return corrupt(absl::StrFormat("only %d bytes", std::min(head.size(), file_size)));
  const uint64_t len = SafetensorsHeaderLength(head);
  if (len > file_size - 8) return corrupt(absl::StrFormat("header of %d bytes in a %d-byte file", len, file_size));
  if (len > head.size() - 8) return corrupt(absl::StrFormat("header of %d bytes, %d read", len, head.size() - 8));
  nlohmann::json header = ParseBoundedJson(head.substr(8, len));
  if (header.is_discarded() || !header.is_object()) return corrupt("header is not valid JSON");
  SafetensorsHeader out;
  out.data_start = 8 + len;
  const size_t data_size = file_size - out.data_start;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, v] : entry.items())
        if (v.is_string()) out.metadata[k] = v.get<std::string>();
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      return corrupt(absl::StrCat("entry ", name, " lacks dtype, shape or data_offsets"));
    }
    if (entry["dtype"] != "F32") {
      return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, ": tensor ", name, " has dtype ",
                                                     entry["dtype"].dump(), "; longhaul reads F32 only"));
    }
    const nlohmann::json &shape = entry["shape"], &offsets = entry["data_offsets"];
    if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return corrupt(absl::StrCat("entry ", name, ": shape or data_offsets is not an array of sizes"));
    }
    SafetensorsEntry t;
    // Sizes are bounded by the data section before they are multiplied, so n cannot overflow.
    size_t n = 1;
    for (const nlohmann::json& d : shape) {
      if (!d.is_number_unsigned() || (d.get<uint64_t>() > 0 && n > data_size / d.get<uint64_t>())) {
        return corrupt(absl::StrCat("entry ", name, " has shape ", shape.dump(), ", not sizes that fit the file"));
      }
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
      n *= static_cast<size_t>(t.shape.back());
    }
    t.begin = offsets[0].get<uint64_t>(), t.end = offsets[1].get<uint64_t>();
    if (t.end < t.begin || t.end > data_size || t.end - t.begin != 4 * n) {
      return corrupt(absl::StrFormat("tensor %s spans bytes [%d, %d) of a %d-byte data section", name, t.begin, t.end,
                                     data_size));
    }
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

absl::StatusOr<Safetensors> ParseSafetensors(const std::string& path, const std::string& bytes) {
  LH_ASSIGN_OR_RETURN(const SafetensorsHeader header, ParseSafetensorsHeader(path, bytes, bytes.size()));
  Safetensors st;
  st.metadata = header.metadata;
  for (const auto& [name, entry] : header.tensors) {
    LoadedTensor t;
    t.shape = entry.shape;
    t.data.resize((entry.end - entry.begin) / 4);
    std::memcpy(t.data.data(), bytes.data() + header.data_start + entry.begin, entry.end - entry.begin);
    st.tensors.emplace(name, std::move(t));
  }
  return st;
}

absl::StatusOr<Safetensors> ReadSafetensors(const std::string& path) {
  LH_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  return ParseSafetensors(path, bytes);
}

}  // namespace longhaul
