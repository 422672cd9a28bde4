// The tokenizer interface the data pipeline programs against (Megatron's MegatronTokenizer, reduced
// to what preprocessing and training need): text -> ids, ids -> text, vocabulary size, end-of-
// document id, and a name for logs. Implementations are immutable after construction, so one
// instance may be shared; each states whether tokenize() may be called from several threads.
// Does not: pad the vocabulary for the model (that is ceil(V / (divisible_by * TP)) * ..., done by
// the model config), append EOS (the caller appends eod()), or choose an implementation
// (build_tokenizer.h does). BOS is added only where Megatron's tokenizer adds it
// (HuggingFaceTokenizer, through the tokenizer.json post-processor).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mg::tokenizers {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // UTF-8 text -> token ids (no special tokens added).
  virtual std::vector<int32_t> tokenize(std::string_view text) const = 0;
  // Token ids -> bytes. Bytes of a partial UTF-8 sequence are kept as they are, not replaced.
  virtual std::string detokenize(std::span<const int32_t> ids) const = 0;
  // Number of tokens in the vocabulary (unpadded; GPT-2: 50257).
  virtual int64_t vocab_size() const = 0;
  // End-of-document id appended after each document by preprocessing (GPT-2: 50256).
  virtual int32_t eod() const = 0;
  // Megatron's --tokenizer-type name, e.g. "GPT2BPETokenizer".
  virtual std::string name() const = 0;
};

}  // namespace mg::tokenizers
