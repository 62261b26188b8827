#pragma once
// Token streams to train on: the built-in Markov corpus, any byte-level file, or token shards in
// the llm.c format (header of 256 int32: magic 20240520, version 1, token count; then uint16
// tokens), so GPT-2-tokenised data made by other tools can be used.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/markov_source.h"

namespace longhaul {

class TokenDataset {
 public:
  // train_tokens and val_tokens bytes from independent streams of the source.
  static absl::StatusOr<TokenDataset> BuiltIn(const MarkovSpec& spec, size_t train_tokens, size_t val_tokens);
  // Every byte of the files matching `pattern` (a glob), in sorted order, is a token (vocab 256).
  // Validation is `val_pattern`'s files when given, else the last val_fraction of the tokens.
  static absl::StatusOr<TokenDataset> Bytes(const std::string& pattern, const std::string& val_pattern,
                                            double val_fraction);
  // llm.c token shards matching `pattern`.
  static absl::StatusOr<TokenDataset> LlmcShards(const std::string& pattern, const std::string& val_pattern,
                                                 double val_fraction);

  const std::vector<uint16_t>& train() const { return train_; }
  const std::vector<uint16_t>& val() const { return val_; }
  int max_token() const { return max_token_; }
  // The source when this is the built-in corpus (its entropy gives the loss floor).
  const std::optional<MarkovSource>& source() const { return source_; }
  std::string description() const { return description_; }

 private:
  static absl::StatusOr<TokenDataset> FromFiles(const std::string& pattern, const std::string& val_pattern,
                                                double val_fraction, bool llmc);
  void Finish();

  std::vector<uint16_t> train_, val_;
  int max_token_ = 0;
  std::optional<MarkovSource> source_;
  std::string description_;
};

// Reads one llm.c shard, checking magic, version, and that the file holds the tokens its header
// announces; errors name the file.
absl::Status ReadLlmcShard(const std::string& path, std::vector<uint16_t>& out);
// Writes one llm.c shard (used by tests and by tools that convert data).
absl::Status WriteLlmcShard(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace longhaul
