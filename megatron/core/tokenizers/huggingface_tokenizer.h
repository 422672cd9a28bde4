// HuggingFaceTokenizer: Megatron's --tokenizer-type HuggingFaceTokenizer for a `tokenizer.json`
// (the file format of the HF `tokenizers` library; FORMATS.md section 2.4), encoding as
// `tokenizer(text).input_ids` does: added tokens are split out first (non-normalized ones on the
// raw text, normalized ones after the normalizer, leftmost-longest, honouring lstrip/rstrip/
// single_word), each remaining piece is normalized and pre-tokenized, the model encodes every
// pre-token, and the post-processor adds its special tokens (e.g. Llama's BOS) unless
// add_special_tokens is false (Megatron's --tokenizer-hf-no-include-special-tokens).
// Supported components: models BPE, Unigram, WordPiece, WordLevel (hf/model.h); normalizers,
// pre-tokenizers and decoders in hf/components.h; post-processors TemplateProcessing, ByteLevel,
// RobertaProcessing, BertProcessing and Sequence. Anything else is rejected when loading, naming
// it. eod() is the eos token: "eos_token" of tokenizer_config.json beside tokenizer.json when there
// is one (as AutoTokenizer reads it), else the first of </s>, <|endoftext|>, <|end_of_text|>,
// <eos>, <|im_end|>, [SEP] (BERT-style vocabularies) in the vocabulary; neither is an error.
// vocab_size() counts the distinct tokens of the model vocabulary and the added tokens
// (transformers' len(tokenizer)). detokenize() is `tokenizers`' decode(ids,
// skip_special_tokens=False) (what transformers' decode() does before clean_up_tokenization_spaces,
// which is not applied): special tokens are kept; bytes that are not valid UTF-8 are returned as
// they are where HF would put U+FFFD. Invariants: immutable after construction except the BPE piece
// cache (mutex), so tokenize() and detokenize() may be called from several threads. Does not: read
// tokenizer_config.json beyond eos_token (add_bos_token, chat templates), truncate or pad
// (transformers turns both off for a plain call), or accept invalid UTF-8 input (throws naming the
// byte offset).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "megatron/core/tokenizers/tokenizer.h"

namespace mg::tokenizers {

namespace hf {
class Model;
class Normalizer;
class PreTokenizer;
class Decoder;
struct Piece;
}  // namespace hf

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  // path: a tokenizer.json file, or a directory holding one (a HF model directory).
  explicit HuggingFaceTokenizer(const std::string& path, bool add_special_tokens = true);
  ~HuggingFaceTokenizer() override;
  HuggingFaceTokenizer(const HuggingFaceTokenizer&) = delete;
  HuggingFaceTokenizer& operator=(const HuggingFaceTokenizer&) = delete;

  std::vector<int32_t> tokenize(std::string_view text) const override;
  std::string detokenize(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "HuggingFaceTokenizer"; }

  // tokenize() with or without the post-processor's special tokens, whatever the constructor said.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Id of a token (added tokens first, then the model vocabulary), or -1.
  int32_t token_to_id(std::string_view token) const;

 private:
  struct AddedToken {
    std::string content;  // as in tokenizer.json (what detokenize() gives back)
    std::string match;    // what is searched for: content, normalized for normalized tokens
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
  };
  struct Segment {  // a piece of input, or an added token already resolved to its id
    std::string text;
    std::size_t offset;
    int32_t id;  // -1: text to normalize / encode
  };
  // Tokens matched on the raw text (normalized = false) or on normalized text, and which first
  // bytes can start one of them.
  struct AddedSet {
    std::vector<const AddedToken*> tokens;
    bool first_byte[256] = {};
  };
  // Splits seg at the added tokens of set (HF's AddedVocabulary::find_matches); empty text
  // segments are dropped.
  void split_added(const AddedSet& set, Segment seg, std::vector<Segment>& out) const;

  std::string file_;
  std::unique_ptr<hf::Model> model_;
  std::unique_ptr<hf::Normalizer> normalizer_;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<hf::Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, std::string> added_by_id_;
  AddedSet raw_added_, normalized_added_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // post-processor ids around a single sequence
  bool add_special_tokens_;
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1;
};

}  // namespace mg::tokenizers
