// build_tokenizer: Megatron's tokenizer factory (megatron/core/tokenizers/utils/build_tokenizer.py,
// FORMATS.md section 2.4), from the standard tokenizer flags. Supported --tokenizer-type values:
//   GPT2BPETokenizer  needs --vocab-file (vocab.json) and --merge-file (merges.txt)
//   HuggingFaceTokenizer  needs --tokenizer-model (tokenizer.json or its directory); special tokens
//                     of the post-processor (e.g. BOS) are added unless
//                     --tokenizer-hf-no-include-special-tokens (huggingface_tokenizer.h)
//   SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer  need --tokenizer-model
//                     (.model); one behaviour for the three, as in Megatron HEAD
//                     (sentencepiece_tokenizer.h)
//   NullTokenizer     needs --vocab-size V; eod = V, vocab_size() = V + 1 (see null_tokenizer.h)
// Any other type (tiktoken, BERT, multimodal) is rejected with a message naming the supported
// ones. Flags a type does not use are ignored, as in Megatron. Does not pad the
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
  std::string tokenizer_type;                       // --tokenizer-type
  std::string tokenizer_model;                      // --tokenizer-model
  std::string vocab_file;                           // --vocab-file
  std::string merge_file;                           // --merge-file
  std::optional<int64_t> vocab_size;                // --vocab-size
  bool tokenizer_hf_include_special_tokens = true;  // not --tokenizer-hf-no-include-special-tokens
  // --legacy-tokenizer: Megatron-LM's legacy tokenizer classes (megatron/training/tokenizer) rather
  // than megatron.core.tokenizers. The tokens are the same; the identity recorded in
  // --data-cache-path descriptions differs (tokenizer_identifiers()).
  bool legacy_tokenizer = false;

  // Throws mg::Error naming the missing or unsupported flag.
  void validate() const;
};

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerArgs& args);

}  // namespace mg::tokenizers
