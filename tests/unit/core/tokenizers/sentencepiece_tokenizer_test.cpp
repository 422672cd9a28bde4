// Tests of SentencePieceTokenizer (megatron/core/tokenizers/sentencepiece_tokenizer.h): exact ids
// and decoded text against the PyPI `sentencepiece` package on the unigram model that
// tests/fixtures/hf_tokenizers/gen_hf_tokenizers.py trains (byte fallback, pad id 3); special ids;
// the three --tokenizer-type names of build_tokenizer; NullTokenizer's detokenize; errors.
#include "megatron/core/tokenizers/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "tests/unit/test_util.h"

namespace {

using mg::tokenizers::SentencePieceTokenizer;
using Ids = std::vector<int32_t>;

const std::string kDir = std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers";
const std::string kModel = kDir + "/spm_unigram.model";

const nlohmann::json& expected() {
  static const auto* j = [] {
    std::ifstream in(kDir + "/expected_spm_unigram.json");
    return new nlohmann::json(nlohmann::json::parse(in));
  }();
  return *j;
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(SentencePieceTokenizer, IdsAndDecodedTextEqualSentencepiecePackage) {
  const SentencePieceTokenizer tok(kModel);
  const auto& cases = expected().at("cases");
  ASSERT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    const auto text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<Ids>();
    EXPECT_EQ(tok.tokenize(text), ids) << "'" << text << "'";
    EXPECT_EQ(tok.detokenize(ids), c.at("decoded").get<std::string>()) << "'" << text << "'";
  }
}

TEST(SentencePieceTokenizer, SpecialIdsAndVocabSize) {
  const SentencePieceTokenizer tok(kModel);
  EXPECT_EQ(tok.vocab_size(), expected().at("vocab_size").get<int64_t>());
  EXPECT_EQ(tok.bos(), expected().at("bos_id").get<int32_t>());
  EXPECT_EQ(tok.eos(), expected().at("eos_id").get<int32_t>());
  EXPECT_EQ(tok.pad(), expected().at("pad_id").get<int32_t>());
  EXPECT_EQ(tok.pad(), 3);
  EXPECT_EQ(tok.unk(), expected().at("unk_id").get<int32_t>());
  EXPECT_EQ(tok.eod(), tok.eos());
  // No BOS/EOS added: HEAD's encode_as_ids.
  const Ids ids = tok.tokenize("Hello");
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids.front(), tok.bos());
  EXPECT_NE(ids.back(), tok.eos());
}

TEST(SentencePieceTokenizer, BuildTokenizerNamesShareOneBehaviour) {
  mg::tokenizers::TokenizerArgs args;
  args.tokenizer_model = kModel;
  const SentencePieceTokenizer ref(kModel);
  for (const char* type :
       {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    args.tokenizer_type = type;
    const auto tok = mg::tokenizers::build_tokenizer(args);
    EXPECT_EQ(tok->name(), type);
    EXPECT_EQ(tok->tokenize("The jury said"), ref.tokenize("The jury said"));
    EXPECT_EQ(tok->eod(), ref.eos());
  }
  args.tokenizer_model.clear();
  EXPECT_CONTAINS(mg::test::error_message([&] { args.validate(); }),
                  "--tokenizer-type Llama2Tokenizer needs --tokenizer-model");
  args.tokenizer_type = "TikTokenizer";
  EXPECT_CONTAINS(mg::test::error_message([&] { args.validate(); }),
                  "'TikTokenizer' is not supported (supported: GPT2BPETokenizer, "
                  "HuggingFaceTokenizer, SentencePieceTokenizer");
}

TEST(SentencePieceTokenizer, Errors) {
  EXPECT_CONTAINS(mg::test::error_message([] { SentencePieceTokenizer t("/nonexistent.model"); }),
                  "SentencePieceTokenizer: cannot load SentencePiece model '/nonexistent.model'");
  // A tokenizer.json is not a .model.
  const std::string json_file = kDir + "/qwen2_nfc/tokenizer.json";
  EXPECT_CONTAINS(
      mg::test::error_message([&] { SentencePieceTokenizer t(json_file, "Llama2Tokenizer"); }),
      "Llama2Tokenizer: cannot load SentencePiece model");
  const SentencePieceTokenizer tok(kModel);
  const int32_t ids[] = {4, -2};
  EXPECT_CONTAINS(mg::test::error_message([&] { tok.detokenize(ids); }),
                  "id -2 at position 1 is outside the vocabulary [0, 600)");
}

TEST(NullTokenizer, DetokenizeJoinsIdsWithSpaces) {
  const mg::tokenizers::NullTokenizer tok(100);
  const Ids ids = tok.tokenize("  7 0\t100 42 ");
  EXPECT_EQ(ids, (Ids{7, 0, 100, 42}));
  EXPECT_EQ(tok.detokenize(ids), "7 0 100 42");
  EXPECT_EQ(tok.detokenize(Ids{}), "");
}

}  // namespace
