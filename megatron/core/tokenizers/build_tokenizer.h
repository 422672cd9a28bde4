// build_tokenizer: Megatron's tokenizer factory (megatron/core/tokenizers/utils/build_tokenizer.py,
// FORMATS.md section 2.4), from the standard tokenizer flags. Supported --tokenizer-type values:
//   GPT2BPETokenizer  needs --vocab-file (vocab.json) and --merge-file (merges.txt)
//   NullTokenizer     needs --vocab-size V; eod = V, vocab_size() = V + 1 (see null_tokenizer.h)
// Any other type (SentencePiece, HuggingFace, tiktoken, BERT) is rejected with a message naming
// the supported ones. Flags a type does not use are ignored, as in Megatron. Does not pad the
// vocabulary (that belongs to the model config).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "megatron/core/tokenizers/tokenizer.h"

namespace mg::tokenizers {

// Megatron's tokenizer arguments, by their flag names.
struct TokenizerArgs {
  std::string tokenizer_type;         // --tokenizer-type
  std::string tokenizer_model;        // --tokenizer-model (unused by the supported types)
  std::string vocab_file;             // --vocab-file
  std::string merge_file;             // --merge-file
  std::optional<int64_t> vocab_size;  // --vocab-size

  // Throws mg::Error naming the missing or unsupported flag.
  void validate() const;
};

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerArgs& args);

}  // namespace mg::tokenizers
