// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}), as tokenizers 0.21's
// models/bpe/model.rs encodes one pre-tokenized piece:
//   1. ignore_merges: a piece that is itself in the vocabulary is that one token;
//   2. else each character (continuing_subword_prefix on all but the first, end_of_word_suffix on
//      the last) is looked up; a missing one becomes its <0xXX> byte tokens (byte_fallback), else
//      unk_token (consecutive ones fused when fuse_unk), else it is dropped;
//   3. merges are applied lowest rank first, leftmost first among equal ranks (HF's priority queue
//      over pair positions; a merge's rank is its index in "merges").
// Merges may be "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs.
// Invariants: immutable after construction except a bounded piece cache behind a mutex, so
// tokenize() may be called from several threads. Does not: BPE dropout (a non-zero dropout is
// rejected, since it makes encoding random).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "megatron/core/tokenizers/hf/model.h"

namespace mg::tokenizers::hf {

class BpeModel final : public Model {
 public:
  // The piece cache holds at most kMaxCacheEntries pieces (emptied when full), each shorter than
  // kMaxCachedPieceBytes, so it stays under ~20 MB.
  static constexpr std::size_t kMaxCacheEntries = std::size_t{1} << 16;
  static constexpr std::size_t kMaxCachedPieceBytes = 256;

  // model: the "model" object of tokenizer.json; file names it in errors.
  BpeModel(const nlohmann::json& model, const std::string& file);

  // Appends the ids of one piece (already normalized and pre-tokenized) to out.
  void tokenize(std::string_view piece, std::vector<int32_t>& out) const override;

  int32_t token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int32_t id) const override;
  std::size_t vocab_size() const override { return vocab_.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  void merge_word(std::string_view piece, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // key (left id << 32) | right id
  int32_t unk_id_ = -1;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256] = {};  // id of "<0xXX>", or -1

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> cache_;
};

}  // namespace mg::tokenizers::hf
