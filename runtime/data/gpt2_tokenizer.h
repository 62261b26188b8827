#pragma once
// GPT-2's byte-level BPE tokenizer, from the vocab.json and merges.txt of a Hugging Face GPT-2
// directory (or any vocabulary and merges made the same way).
//
// Text is split by GPT-2's pattern ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
// \s+(?!\S)|\s+), each piece's bytes are merged pairwise by rank (the lowest-ranked adjacent pair
// first, all its occurrences at once) until no pair has a rank, and each resulting byte string is
// its vocabulary id. vocab.json and merges.txt spell bytes as GPT-2's printable stand-ins (byte b
// as the character bytes_to_unicode gives it); this class works on the raw bytes. Bytes that are
// not UTF-8 are kept and tokenised as symbols of their own, so decoding gives back every byte.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace longhaul {

// The pieces GPT-2's pattern splits `text` into, in order; together they are the whole text.
std::vector<std::string_view> SplitGpt2(std::string_view text);

class Gpt2Tokenizer {
 public:
  // Reads dir/vocab.json and dir/merges.txt; errors name the file, the line and what is wrong.
  static absl::StatusOr<Gpt2Tokenizer> Load(const std::string& dir);

  std::vector<int> Encode(std::string_view text) const;
  // The bytes of the tokens (which may end inside a UTF-8 character); ids outside the vocabulary
  // are refused.
  absl::StatusOr<std::string> Decode(const std::vector<int>& ids) const;
  // One more than the largest id.
  int vocab_size() const { return static_cast<int>(bytes_of_.size()); }
  // The id of "<|endoftext|>", which separates documents, where the vocabulary has it.
  std::optional<int> end_of_text() const { return end_of_text_; }

 private:
  std::vector<int> EncodePiece(std::string_view piece) const;

  absl::flat_hash_map<std::string, int> id_of_;
  std::vector<std::string> bytes_of_;  // by id
  absl::flat_hash_map<std::pair<std::string, std::string>, int> rank_;
  std::optional<int> end_of_text_;
};

}  // namespace longhaul
