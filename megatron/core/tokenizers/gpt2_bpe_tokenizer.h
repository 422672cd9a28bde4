// GPT2BPETokenizer: OpenAI's byte-level BPE exactly as Megatron's legacy gpt2_tokenization.py (and
// HEAD's HF "gpt2" tokenizer, which gives the same ids) encodes text. FORMATS.md section 2.4.
//   1. Pre-tokenize with 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (PCRE2, UTF + UCP, JIT when available).
//   2. Map each piece's UTF-8 bytes through bytes_to_unicode.
//   3. BPE: repeatedly merge every occurrence (left to right, non-overlapping) of the adjacent pair
//      with the lowest rank; a merge's rank is its line order in merges.txt.
//   4. Look each symbol up in vocab.json; an unknown symbol becomes id 0 (as the legacy code).
// "<|endoftext|>" inside the text is ordinary text, as in GPT-2's legacy encoder; eod() is its id.
// Invariants: immutable after construction except the per-piece cache, which is guarded by a mutex,
// so tokenize()/detokenize() may be called concurrently on one instance. The cache is bounded: it
// is emptied when it reaches kMaxCacheEntries pieces. Does not: handle added/special tokens, apply
// errors='replace' when decoding (raw bytes are returned), or accept invalid UTF-8 input (throws,
// naming the byte offset).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "megatron/core/tokenizers/tokenizer.h"

namespace mg::tokenizers {

namespace detail {
struct Pcre2Regex;  // owns pcre2_code (and its JIT code); defined in the .cpp
// Lets the cache be probed with a string_view (no allocation on a hit).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
}  // namespace detail

class GPT2BPETokenizer final : public Tokenizer {
 public:
  static constexpr size_t kMaxCacheEntries = size_t{1} << 18;

  // vocab_file: vocab.json (token -> id); merges_file: merges.txt ("#version" header, then one
  // "left right" pair per line). Throws mg::Error naming the file (and line) on any problem.
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merges_file);
  ~GPT2BPETokenizer() override;
  GPT2BPETokenizer(const GPT2BPETokenizer&) = delete;
  GPT2BPETokenizer& operator=(const GPT2BPETokenizer&) = delete;

  std::vector<int32_t> tokenize(std::string_view text) const override;
  std::string detokenize(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }

  // Number of merges read (ranks 0 .. num_merges()-1).
  int64_t num_merges() const { return num_merges_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol id of left+right
  };
  // Interns a byte-level string as a symbol id (construction only).
  int32_t intern(const std::string& s);
  // BPE of one pre-token piece (raw UTF-8 bytes) appended to out as vocab ids.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::unique_ptr<detail::Pcre2Regex> regex_;
  // Symbols: every byte-level string that can occur during BPE (256 single bytes + merge parts and
  // results), interned so a pair is two ints. symbol_vocab_id_[s] is s's vocab id, or 0 if absent.
  std::unordered_map<std::string, int32_t> symbol_ids_;
  std::vector<int32_t> symbol_vocab_id_;
  int32_t byte_symbol_[256] = {};
  std::unordered_map<uint64_t, Merge> merges_;  // key (left << 32) | right
  // id -> raw bytes (byte-level string decoded through the inverse byte map); undecodable_[id] is
  // set for ids absent from the vocabulary or whose token has characters outside the byte map.
  std::vector<std::string> id_bytes_;
  std::vector<uint8_t> undecodable_;
  int64_t vocab_size_ = 0;
  int64_t num_merges_ = 0;
  int32_t eod_ = -1;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, detail::StringHash, std::equal_to<>>
      cache_;
};

// bytes_to_unicode(): byte b -> the code point GPT-2 uses for it (printable Latin-1 bytes map to
// themselves, the other 68 to 256..323). Exposed for tests.
uint32_t gpt2_byte_to_unicode(uint8_t b);

}  // namespace mg::tokenizers
