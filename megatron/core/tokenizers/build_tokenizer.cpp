// build_tokenizer: picks and constructs a Tokenizer from Megatron's flags (see build_tokenizer.h).
#include "megatron/core/tokenizers/build_tokenizer.h"

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/core/tokenizers/null_tokenizer.h"

namespace mg::tokenizers {

namespace {
constexpr const char* kSupported = "GPT2BPETokenizer, NullTokenizer";
}

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
  return std::make_unique<NullTokenizer>(*args.vocab_size);
}

}  // namespace mg::tokenizers
