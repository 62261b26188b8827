#include "data/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr size_t kLlmcHeaderInts = 256;

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern, const char* key) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrFormat("%s = \"%s\": no such file (check the path, or use a glob such as data/*.bin)", key, pattern));
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::Status ReadBytes(const std::string& path, std::vector<uint16_t>& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open data file ", path));
  std::vector<char> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (char c : buf) out.push_back(static_cast<uint8_t>(c));
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadLlmcShard(const std::string& path, std::vector<uint16_t>& out) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open token shard ", path));
  const size_t size = static_cast<size_t>(f.tellg());
  f.seekg(0);
  int32_t header[kLlmcHeaderInts];
  if (size < sizeof(header) || !f.read(reinterpret_cast<char*>(header), sizeof(header))) {
    return absl::DataLossError(absl::StrFormat("token shard %s is %d bytes, shorter than the 1024-byte llm.c header",
                                               path, size));
  }
  if (header[0] != kLlmcMagic) {
    return absl::DataLossError(absl::StrFormat(
        "token shard %s: magic %d, expected %d: not an llm.c token file (use data.source = \"bytes\" for raw text)",
        path, header[0], kLlmcMagic));
  }
  if (header[1] != kLlmcVersion) {
    return absl::DataLossError(
        absl::StrFormat("token shard %s: version %d, this build reads version %d", path, header[1], kLlmcVersion));
  }
  const size_t count = static_cast<uint32_t>(header[2]);
  if (size != sizeof(header) + 2 * count) {
    return absl::DataLossError(absl::StrFormat(
        "token shard %s: header announces %d tokens (%d bytes) but the file has %d bytes: truncated or corrupt", path,
        count, sizeof(header) + 2 * count, size));
  }
  const size_t old = out.size();
  out.resize(old + count);
  f.read(reinterpret_cast<char*>(out.data() + old), static_cast<std::streamsize>(2 * count));
  return absl::OkStatus();
}

absl::Status WriteLlmcShard(const std::string& path, const std::vector<uint16_t>& tokens) {
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header), sizeof(header));
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * tokens.size()));
  if (!f) return absl::InternalError(absl::StrCat("cannot write token shard ", path));
  return absl::OkStatus();
}

void TokenDataset::Finish() {
  max_token_ = 0;
  for (uint16_t t : train_) max_token_ = std::max<int>(max_token_, t);
  for (uint16_t t : val_) max_token_ = std::max<int>(max_token_, t);
}

absl::StatusOr<TokenDataset> TokenDataset::BuiltIn(const MarkovSpec& spec, size_t train_tokens, size_t val_tokens) {
  LH_ASSIGN_OR_RETURN(MarkovSource src, MarkovSource::Create(spec));
  TokenDataset d;
  auto to16 = [](const std::vector<uint8_t>& b) { return std::vector<uint16_t>(b.begin(), b.end()); };
  d.train_ = to16(src.Generate(train_tokens, 0));
  d.val_ = to16(src.Generate(val_tokens, 1));
  d.description_ = absl::StrFormat("built-in Markov corpus (order %d, alphabet %d, branching %d, seed %d)", spec.order,
                                   spec.alphabet, spec.branching, spec.seed);
  d.source_ = std::move(src);
  d.Finish();
  return d;
}

absl::StatusOr<TokenDataset> TokenDataset::FromFiles(const std::string& pattern, const std::string& val_pattern,
                                                     double val_fraction, bool llmc) {
  auto read = [&](const std::string& pat, const char* key, std::vector<uint16_t>& out) -> absl::Status {
    LH_ASSIGN_OR_RETURN(std::vector<std::string> files, Glob(pat, key));
    for (const std::string& f : files) LH_RETURN_IF_ERROR(llmc ? ReadLlmcShard(f, out) : ReadBytes(f, out));
    return absl::OkStatus();
  };
  TokenDataset d;
  LH_RETURN_IF_ERROR(read(pattern, "data.path", d.train_));
  if (!val_pattern.empty()) {
    LH_RETURN_IF_ERROR(read(val_pattern, "data.val_path", d.val_));
  } else {
    const size_t n_val = static_cast<size_t>(static_cast<double>(d.train_.size()) * val_fraction);
    d.val_.assign(d.train_.end() - static_cast<long>(n_val), d.train_.end());
    d.train_.resize(d.train_.size() - n_val);
  }
  d.description_ = absl::StrFormat("%s %s (%d train / %d val tokens)", llmc ? "llm.c shards" : "bytes of", pattern,
                                   d.train_.size(), d.val_.size());
  d.Finish();
  return d;
}

absl::StatusOr<TokenDataset> TokenDataset::Bytes(const std::string& pattern, const std::string& val_pattern,
                                                 double val_fraction) {
  return FromFiles(pattern, val_pattern, val_fraction, false);
}

absl::StatusOr<TokenDataset> TokenDataset::LlmcShards(const std::string& pattern, const std::string& val_pattern,
                                                      double val_fraction) {
  return FromFiles(pattern, val_pattern, val_fraction, true);
}

}  // namespace longhaul
