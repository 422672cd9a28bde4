// build_tokenizer: picks and constructs a Tokenizer from Megatron's flags (see build_tokenizer.h).
#include "megatron/core/tokenizers/build_tokenizer.h"

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/core/tokenizers/huggingface_tokenizer.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/core/tokenizers/sentencepiece_tokenizer.h"

namespace mg::tokenizers {

namespace {
constexpr const char* kSupported =
    "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, "
    "Llama2Tokenizer, NullTokenizer";
bool is_sentencepiece(const std::string& type) {
  return type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" ||
         type == "Llama2Tokenizer";
}
}  // namespace

void TokenizerArgs::validate() const {
  MG_CHECK(!tokenizer_type.empty(),
           "build_tokenizer: --tokenizer-type is required (supported: " << kSupported << ")");
  if (tokenizer_type == "GPT2BPETokenizer") {
    MG_CHECK(!vocab_file.empty(),
             "build_tokenizer: --tokenizer-type GPT2BPETokenizer needs "
             "--vocab-file (vocab.json)");
    MG_CHECK(!merge_file.empty(),
             "build_tokenizer: --tokenizer-type GPT2BPETokenizer needs "
             "--merge-file (merges.txt)");
  } else if (tokenizer_type == "HuggingFaceTokenizer") {
    MG_CHECK(!tokenizer_model.empty(),
             "build_tokenizer: --tokenizer-type HuggingFaceTokenizer needs --tokenizer-model "
             "(a tokenizer.json file or a directory holding one)");
  } else if (is_sentencepiece(tokenizer_type)) {
    MG_CHECK(!tokenizer_model.empty(), "build_tokenizer: --tokenizer-type "
                                           << tokenizer_type
                                           << " needs --tokenizer-model (a SentencePiece .model)");
  } else if (tokenizer_type == "NullTokenizer") {
    MG_CHECK(vocab_size.has_value(),
             "build_tokenizer: --tokenizer-type NullTokenizer needs --vocab-size");
  } else {
    MG_THROW("build_tokenizer: --tokenizer-type '"
             << tokenizer_type << "' is not supported (supported: " << kSupported << ")");
  }
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerArgs& args) {
  args.validate();
  if (args.tokenizer_type == "GPT2BPETokenizer")
    return std::make_unique<GPT2BPETokenizer>(args.vocab_file, args.merge_file);
  if (args.tokenizer_type == "HuggingFaceTokenizer")
    return std::make_unique<HuggingFaceTokenizer>(args.tokenizer_model,
                                                  args.tokenizer_hf_include_special_tokens);
  if (is_sentencepiece(args.tokenizer_type))
    return std::make_unique<SentencePieceTokenizer>(args.tokenizer_model, args.tokenizer_type);
  return std::make_unique<NullTokenizer>(*args.vocab_size);
}

}  // namespace mg::tokenizers
