// NullTokenizer: Megatron's synthetic tokenizer for benchmarks and pre-tokenized data. The "text"
// is already token ids written as decimal integers separated by spaces; tokenize() parses them.
// Invariants (as megatron/core/tokenizers/text/libraries/null_tokenizer.py): constructed with
// --vocab-size V, eod() is V (one past the given vocabulary) and vocab_size() is V + 1, so the eod
// id always fits the vocabulary. Every id must lie in [0, V]; anything else throws, naming it.
// Differences from Megatron, all on inputs Megatron rejects or crashes on: any run of ASCII
// whitespace separates ids (Megatron splits on single spaces and int() strips the rest), and an
// empty or all-blank text is an empty document (Megatron raises ValueError on int('')).
// Does not: detokenize to anything but the same space-separated integers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/tokenizers/tokenizer.h"

namespace mg::tokenizers {

class NullTokenizer final : public Tokenizer {
 public:
  // vocab_size: Megatron's --vocab-size, the vocabulary without eod; must be in [1, 2^31 - 1).
  explicit NullTokenizer(int64_t vocab_size);

  // Thread-safe (no state).
  std::vector<int32_t> tokenize(std::string_view text) const override;
  std::string detokenize(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_without_eod_ + 1; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_size_without_eod_); }
  std::string name() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_without_eod_;
};

}  // namespace mg::tokenizers
