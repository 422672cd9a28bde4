// pretrain_gpt as a user runs it: --help, one clear error line (exit 1) for a bad flag or
// conflicting flags before any work, and a short mock-data run with its Megatron log lines.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

const std::string kBin = std::string(MG_BIN_DIR) + "/pretrain_gpt";
const std::string kTiny =
    " --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16"
    " --micro-batch-size 2 --train-iters 2 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer"
    " --vocab-size 64 --eval-iters 1 --log-interval 1";

TEST(PretrainGpt, Help) {
  auto r = test::run_command(kBin + " --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--num-layers"), std::string::npos);
}

TEST(PretrainGpt, BadFlagsGiveOneLineBeforeAnyWork) {
  auto r = test::run_command(kBin + kTiny + " --hiden-size 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "pretrain_gpt: error: unrecognized argument --hiden-size; did you mean "
            "--hidden-size?\n");
  r = test::run_command(kBin + kTiny + " --bf16 --fp16");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "pretrain_gpt: error: --fp16 and --bf16 conflict; give only one of them\n");
}

TEST(PretrainGpt, TrainsOnMockData) {
  auto r = test::run_command(kBin + kTiny);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("] iteration        2/       2 | consumed samples:            4 |"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("test loss at iteration 2 on test set"), std::string::npos);
}

// A Unigram and a WordPiece tokenizer.json (HF model directories) through the whole pipeline:
// preprocess_data tokenizes the Brown slice with them, pretrain_gpt builds the same tokenizer
// (its vocabulary, padded to a multiple of 128, sizes the model) and trains on the data.
TEST(PretrainGpt, TrainsOnDataFromHuggingFaceUnigramAndWordPieceTokenizers) {
  namespace fs = std::filesystem;
  const std::string fx = std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers/";
  const fs::path dir =
      fs::temp_directory_path() / ("mg_pretrain_hf_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Case {
    std::string name;
    int vocab, padded;
  };
  for (const Case& c :
       {Case{"unigram_byte_fallback", 958, 1024}, Case{"bert_wordpiece", 900, 1024}}) {
    const std::string tok =
        " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + fx + c.name;
    const std::string prefix = (dir / c.name).string();
    auto p = test::run_command(std::string(MG_BIN_DIR) + "/preprocess_data --input " + fx +
                               "brown_slice.jsonl --output-prefix " + prefix +
                               " --append-eod --workers 1" + tok);
    ASSERT_EQ(p.status, 0) << p.output;
    auto r = test::run_command(
        kBin +
        " --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32"
        " --micro-batch-size 2 --train-iters 3 --lr 1e-3 --eval-iters 1 --eval-interval 3"
        " --log-interval 1 --split 90,10,0 --data-path " +
        prefix + "_text_document --data-cache-path " + (dir / "cache").string() + tok);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("tokenizer: HuggingFaceTokenizer, vocab " + std::to_string(c.vocab) +
                            " (padded " + std::to_string(c.padded)),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("] iteration        3/       3 |"), std::string::npos) << r.output;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mg::training
