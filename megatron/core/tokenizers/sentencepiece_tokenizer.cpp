// SentencePieceTokenizer (see sentencepiece_tokenizer.h): a thin wrapper over libsentencepiece's
// SentencePieceProcessor that turns its Status results into mg::Error messages.
#include "megatron/core/tokenizers/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "megatron/core/common/error.h"

namespace mg::tokenizers {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, std::string type_name)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()),
      file_(model_file),
      name_(std::move(type_name)) {
  MG_CHECK(!model_file.empty(),
           name_ << ": --tokenizer-model is empty; give a SentencePiece .model file");
  const auto status = sp_->Load(model_file);
  MG_CHECK(status.ok(), name_ << ": cannot load SentencePiece model '" << model_file
                              << "': " << status.ToString());
  vocab_size_ = sp_->GetPieceSize();
  bos_ = sp_->bos_id();
  eos_ = sp_->eos_id();
  pad_ = sp_->pad_id();
  unk_ = sp_->unk_id();
  MG_CHECK(eos_ >= 0 && eos_ < vocab_size_,
           name_ << ": SentencePiece model '" << model_file << "' has no eos piece (eos_id " << eos_
                 << "), which Megatron uses as the end-of-document token");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::tokenize(std::string_view text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(absl::string_view(text.data(), text.size()), &ids);
  MG_CHECK(status.ok(), name_ << "::tokenize: SentencePiece Encode failed on " << text.size()
                              << " bytes: " << status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::detokenize(std::span<const int32_t> ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  for (std::size_t i = 0; i < v.size(); ++i) {
    MG_CHECK(v[i] >= 0 && v[i] < vocab_size_,
             name_ << "::detokenize: id " << v[i] << " at position " << i
                   << " is outside the vocabulary [0, " << vocab_size_ << ") of '" << file_ << "'");
  }
  std::string out;
  const auto status = sp_->Decode(v, &out);
  MG_CHECK(status.ok(),
           name_ << "::detokenize: SentencePiece Decode failed: " << status.ToString());
  return out;
}

}  // namespace mg::tokenizers
