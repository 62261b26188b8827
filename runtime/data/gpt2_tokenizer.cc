#include "data/gpt2_tokenizer.h"

#include <climits>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/files.h"
#include "data/unicode_classes.h"
#include "util/status_macros.h"
#include "util/bounded_json.h"

namespace longhaul {
namespace {

namespace fs = std::filesystem;

struct CodePoint {
  uint32_t c;
  size_t at, len;  // its bytes in the text
};

// Text as code points; a byte that does not start a well-formed UTF-8 character stands alone as
// U+FFFD (neither letter, number nor space), its byte kept.
std::vector<CodePoint> DecodeUtf8(std::string_view s) {
  std::vector<CodePoint> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    uint32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const auto cb = static_cast<unsigned char>(s[i + k]);
      ok = (cb >> 6) == 0x2;
      c = (c << 6) | (cb & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    static constexpr uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && c >= kLeast[len] && !(c >= 0xD800 && c <= 0xDFFF) && c <= 0x10FFFF;
    if (!ok) {
      out.push_back({0xFFFD, i, 1});
      ++i;
      continue;
    }
    out.push_back({c, i, len});
    i += len;
  }
  return out;
}

enum class Class { kLetter, kNumber, kSpace, kOther };

Class ClassOf(uint32_t c) {
  if (IsWhiteSpace(c)) return Class::kSpace;
  if (IsLetter(c)) return Class::kLetter;
  if (IsNumber(c)) return Class::kNumber;
  return Class::kOther;
}

// GPT-2's stand-in characters for bytes: the printable Latin-1 bytes stand for themselves, the
// other 68 for U+0100 onwards in byte order (bytes_to_unicode in GPT-2's encoder.py).
std::vector<uint32_t> ByteStandIns() {
  std::vector<uint32_t> of(256, 0);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    of[b] = printable ? b : next++;
  }
  return of;
}

// A vocab.json or merges.txt token (stand-in characters) as the bytes it stands for.
absl::StatusOr<std::string> TokenBytes(std::string_view token) {
  static const absl::flat_hash_map<uint32_t, char> byte_of = [] {
    absl::flat_hash_map<uint32_t, char> m;
    const std::vector<uint32_t> of = ByteStandIns();
    for (int b = 0; b < 256; ++b) m[of[b]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  for (const CodePoint& cp : DecodeUtf8(token)) {
    auto it = byte_of.find(cp.c);
    if (it == byte_of.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token \"%s\" holds U+%04X, which stands for no byte: not a byte-level BPE vocabulary like GPT-2's",
          absl::CHexEscape(std::string(token)), cp.c));
    }
    out.push_back(it->second);
  }
  return out;
}

}  // namespace

std::vector<std::string_view> SplitGpt2(std::string_view text) {
  const std::vector<CodePoint> cps = DecodeUtf8(text);
  const size_t n = cps.size();
  std::vector<std::string_view> pieces;
  auto emit = [&](size_t from, size_t to) {  // code points [from, to)
    const size_t begin = cps[from].at, end = cps[to - 1].at + cps[to - 1].len;
    pieces.push_back(text.substr(begin, end - begin));
  };
  auto cls = [&](size_t k) { return ClassOf(cps[k].c); };
  for (size_t i = 0; i < n;) {
    // 's 't 're 've 'm 'll 'd, lower case only, as the pattern spells them.
    if (cps[i].c == '\'') {
      size_t matched = 0;
      for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        bool ok = i + suffix.size() < n;
        for (size_t k = 0; ok && k < suffix.size(); ++k) ok = cps[i + 1 + k].c == static_cast<uint32_t>(suffix[k]);
        if (ok) {
          matched = suffix.size();
          break;
        }
      }
      if (matched > 0) {
        emit(i, i + 1 + matched);
        i += 1 + matched;
        continue;
      }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    const bool spaced = cps[i].c == ' ' && i + 1 < n && cls(i + 1) != Class::kSpace;
    const size_t start = spaced ? i + 1 : i;
    const Class run = cls(start);
    if (run != Class::kSpace) {
      size_t k = start;
      while (k < n && cls(k) == run) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // `\s+(?!\S)`: white space up to, not including, the last before a non-space; else `\s+`.
    size_t k = i;
    while (k < n && cls(k) == Class::kSpace) ++k;
    const size_t end = k < n && k - i >= 2 ? k - 1 : k;
    emit(i, end);
    i = end;
  }
  return pieces;
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::Load(const std::string& dir) {
  Gpt2Tokenizer t;
  const std::string vocab_path = (fs::path(dir) / "vocab.json").string();
  LH_ASSIGN_OR_RETURN(const std::string vocab_text, ReadWholeFile(vocab_path));
  const nlohmann::json vocab = ParseBoundedJson(vocab_text);
  if (vocab.is_discarded() || !vocab.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(vocab_path, " is not a JSON object of token: id"));
  }
  if (vocab.size() > (1u << 24)) return absl::InvalidArgumentError(absl::StrCat(vocab_path, " has too many tokens"));
  t.bytes_of_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(vocab.size()) ||
        seen[id.get<int64_t>()]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: token \"%s\" has id %s; the ids must be 0 to %d, each once", vocab_path, absl::CHexEscape(token),
          id.dump(), vocab.size() - 1));
    }
    absl::StatusOr<std::string> bytes = TokenBytes(token);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": ", bytes.status().message()));
    const int i = static_cast<int>(id.get<int64_t>());
    seen[i] = true;
    t.bytes_of_[i] = *bytes;
    t.id_of_[*bytes] = i;
    if (token == "<|endoftext|>") t.end_of_text_ = i;
  }
  for (int b = 0; b < 256; ++b) {
    if (!t.id_of_.contains(std::string(1, static_cast<char>(b)))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has no token for byte 0x%02X: a byte-level vocabulary has all 256", vocab_path, b));
    }
  }
  const std::string merges_path = (fs::path(dir) / "merges.txt").string();
  std::ifstream merges(merges_path);
  if (!merges) return absl::NotFoundError(absl::StrCat("cannot open ", merges_path));
  std::string line;
  for (int number = 1; std::getline(merges, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // written on Windows
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s line %d is \"%s\", not two tokens and one space", merges_path, number, line));
    }
    absl::StatusOr<std::string> a = TokenBytes(line.substr(0, space)), b = TokenBytes(line.substr(space + 1));
    if (!a.ok() || !b.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s line %d: %s", merges_path, number, (a.ok() ? b : a).status().message()));
    }
    if (!t.id_of_.contains(*a) || !t.id_of_.contains(*b) || !t.id_of_.contains(*a + *b)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s line %d merges \"%s\": it or its parts are not in vocab.json; are the two files of one tokenizer?",
          merges_path, number, line));
    }
    t.rank_.try_emplace(std::pair(*a, *b), static_cast<int>(t.rank_.size()));
  }
  return t;
}

std::vector<int> Gpt2Tokenizer::EncodePiece(std::string_view piece) const {
  std::vector<std::string> symbols;
  for (char c : piece) symbols.emplace_back(1, c);
  while (symbols.size() > 1) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = rank_.find(std::pair(symbols[i], symbols[i + 1]));
      if (it != rank_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT_MAX) break;
    // Every occurrence of the pair, left to right.
    const std::string first = symbols[at], second = symbols[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(symbols[i++]));
      }
    }
    symbols.swap(merged);
  }
  std::vector<int> ids;
  for (const std::string& s : symbols) ids.push_back(id_of_.at(s));  // Load checked every merge's result
  return ids;
}

std::vector<int> Gpt2Tokenizer::Encode(std::string_view text) const {
  absl::flat_hash_map<std::string_view, std::vector<int>> cache;
  std::vector<int> ids;
  for (std::string_view piece : SplitGpt2(text)) {
    auto it = cache.find(piece);
    if (it == cache.end()) it = cache.emplace(piece, EncodePiece(piece)).first;
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  return ids;
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d is outside the tokenizer's vocabulary of %d", id, vocab_size()));
    }
    out += bytes_of_[id];
  }
  return out;
}

}  // namespace longhaul
