// SentencePieceTokenizer: Megatron's --tokenizer-type SentencePieceTokenizer,
// GPTSentencePieceTokenizer and Llama2Tokenizer on a SentencePiece .model file (--tokenizer-model),
// through libsentencepiece. In Megatron HEAD (megatron/core/tokenizers/utils/build_tokenizer.py)
// all three names build the same sentencepiece library tokenizer (non-legacy), so here they share
// one class and differ only in name():
//   tokenize(text)   = SentencePieceProcessor.encode_as_ids(text): no BOS or EOS added
//   detokenize(ids)  = decode_ids(ids)
//   vocab_size()     = get_piece_size();  eod() = eos_id() (the model must define an eos piece)
// bos(), eos(), pad() and unk() are the model's ids (-1 when the model has none), as
// SentencePieceProcessor reports them.
// Differences from Megatron: the legacy (pre-HEAD) Llama2Tokenizer prepended BOS and the legacy
// SentencePieceTokenizer added <CLS>/<SEP>/<EOD>/<MASK> tokens; HEAD does neither, and neither is
// reproduced. --tokenizer-sentencepiece-legacy and --special-tokens are not supported.
// Invariants: immutable after construction; libsentencepiece's Encode/Decode are const, so
// tokenize() and detokenize() may be called from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/tokenizers/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mg::tokenizers {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // model_file: a serialized SentencePiece ModelProto (.model). type_name: the --tokenizer-type
  // it was built for (SentencePieceTokenizer, GPTSentencePieceTokenizer or Llama2Tokenizer).
  explicit SentencePieceTokenizer(const std::string& model_file,
                                  std::string type_name = "SentencePieceTokenizer");
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::vector<int32_t> tokenize(std::string_view text) const override;
  std::string detokenize(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eos_; }
  std::string name() const override { return name_; }

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string file_, name_;
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1, unk_ = -1;
};

}  // namespace mg::tokenizers
