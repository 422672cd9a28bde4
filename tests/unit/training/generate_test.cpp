// Text generation from a tiny trained model (tools/generate.cpp, megatron/core/inference/): train
// a few iterations with pretrain (mock data), then greedy generation is deterministic (two runs of
// the generate binary print the same tokens), equals generation without the KV cache, and a seeded
// sampled run repeats exactly; the stop at --max-new-tokens is reported with tokens/s.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "megatron/core/inference/text_generation.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_model.h"
#include "megatron/training/training.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mg_generate_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

int run(const std::string& cmd, std::string* out) {
  const std::string log = temp_dir("cmdlog") + "/out.txt";
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream s;
  s << f.rdbuf();
  *out = s.str();
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string line_with(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l))
    if (l.rfind(prefix, 0) == 0) return l;
  return "";
}

const std::string& trained_checkpoint() {
  static const std::string dir = [] {
    const std::string d = temp_dir("ckpt");
    const std::vector<std::string> flags = {"--num-layers",
                                            "2",
                                            "--hidden-size",
                                            "32",
                                            "--num-attention-heads",
                                            "4",
                                            "--group-query-attention",
                                            "--num-query-groups",
                                            "2",
                                            "--normalization",
                                            "RMSNorm",
                                            "--swiglu",
                                            "--disable-bias-linear",
                                            "--position-embedding-type",
                                            "rope",
                                            "--seq-length",
                                            "32",
                                            "--micro-batch-size",
                                            "4",
                                            "--train-iters",
                                            "20",
                                            "--lr",
                                            "1e-2",
                                            "--mock-data",
                                            "--vocab-size",
                                            "60",
                                            "--eval-iters",
                                            "0",
                                            "--log-interval",
                                            "10",
                                            "--hidden-dropout",
                                            "0",
                                            "--attention-dropout",
                                            "0",
                                            "--save",
                                            d,
                                            "--save-interval",
                                            "20"};
    std::ostringstream log;
    pretrain(parse_args(flags), log);
    return d;
  }();
  return dir;
}

TEST(Generate, GreedyFromATrainedModelIsDeterministic) {
  const std::string ckpt = trained_checkpoint();
  const std::string cmd = std::string(MG_BIN_DIR) + "/generate --load " + ckpt +
                          " --prompt '3 4 5 6' --max-new-tokens 12 --greedy --ignore-eod "
                          "--print-tokens --platform cpu";
  std::string a, b, c;
  ASSERT_EQ(run(cmd, &a), 0) << a;
  ASSERT_EQ(run(cmd, &b), 0) << b;
  ASSERT_EQ(run(cmd + " --no-kv-cache", &c), 0) << c;
  const std::string ta = line_with(a, "generated tokens:");
  ASSERT_FALSE(ta.empty()) << a;
  EXPECT_EQ(std::count(ta.begin(), ta.end(), ' '), 13) << ta;  // 12 ids
  EXPECT_EQ(ta, line_with(b, "generated tokens:"));
  EXPECT_EQ(ta, line_with(c, "generated tokens:")) << "KV cache vs recomputation";
  EXPECT_NE(line_with(a, "generated 12 tokens (stop: max-new-tokens)").find("tokens/s"),
            std::string::npos)
      << a;
}

TEST(Generate, SeededSamplingRepeatsAndCacheMatchesRecompute) {
  const std::string ckpt = trained_checkpoint();
  test::ensure_runtime();
  CheckpointModel cm = load_model_from_checkpoint(ckpt, test::ops_on("cpu"), Device::cpu());
  EXPECT_EQ(cm.state.iteration, 20);
  inference::GenerationOptions o;
  o.sampling.temperature = 0.8;
  o.sampling.top_k = 10;
  o.sampling.top_p = 0.95;
  o.sampling.seed = 11;
  o.max_new_tokens = 16;
  const auto r1 = inference::generate(*cm.model, {7, 8, 9}, o);
  const auto r2 = inference::generate(*cm.model, {7, 8, 9}, o);
  o.use_kv_cache = false;
  const auto r3 = inference::generate(*cm.model, {7, 8, 9}, o);
  EXPECT_EQ(r1.tokens.size(), 16u);
  EXPECT_EQ(r1.tokens, r2.tokens);
  EXPECT_EQ(r1.tokens, r3.tokens);
  std::string log;
  EXPECT_NE(run(std::string(MG_BIN_DIR) + "/generate --load " + ckpt +
                    " --prompt 1 --temperature 0 --platform cpu",
                &log),
            0);
  EXPECT_NE(log.find("--temperature 0 must be > 0"), std::string::npos) << log;
}

TEST(Generate, TokenizerSmallerThanTheCheckpointVocabulary) {
  // A model trained with 1101 ids, generated with an 805-token HF tokenizer (as Qwen2's 151936
  // embedding rows for 151665 tokens): the model keeps the checkpoint's vocabulary, sampling only
  // the tokenizer's ids.
  const std::string d = temp_dir("bigvocab");
  const std::vector<std::string> flags = {"--num-layers",
                                          "1",
                                          "--hidden-size",
                                          "16",
                                          "--num-attention-heads",
                                          "2",
                                          "--seq-length",
                                          "16",
                                          "--micro-batch-size",
                                          "2",
                                          "--train-iters",
                                          "2",
                                          "--lr",
                                          "1e-3",
                                          "--mock-data",
                                          "--vocab-size",
                                          "1100",
                                          "--eval-iters",
                                          "0",
                                          "--save",
                                          d,
                                          "--save-interval",
                                          "2"};
  std::ostringstream log;
  pretrain(parse_args(flags), log);
  const std::string tok =
      std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers/gpt2_bytelevel/tokenizer.json";
  test::ensure_runtime();
  CheckpointModel cm = load_model_from_checkpoint(
      d, test::ops_on("cpu"), Device::cpu(),
      {"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok});
  EXPECT_EQ(cm.model->vocab_size(), 1101);
  const int64_t v = cm.tokenizer->vocab_size();
  EXPECT_LT(v, 1101);
  inference::GenerationOptions o;
  o.sampling.temperature = 5.0;  // flat: ids past the tokenizer would show up if allowed
  o.sample_vocab = v;
  o.max_new_tokens = 200;
  o.max_sequence_length = 16;
  o.sampling.seed = 3;
  int drawn = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    o.sampling.seed = seed;
    for (int32_t t : inference::generate(*cm.model, cm.tokenizer->tokenize("the"), o).tokens) {
      EXPECT_LT(t, v);
      ++drawn;
    }
  }
  EXPECT_GT(drawn, 100);
  std::string out;
  ASSERT_EQ(run(std::string(MG_BIN_DIR) + "/generate --load " + d +
                    " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + tok +
                    " --prompt 'the' --max-new-tokens 5 --platform cpu",
                &out),
            0)
      << out;
}

}  // namespace
}  // namespace mg::training
