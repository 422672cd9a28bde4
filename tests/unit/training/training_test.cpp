// The training loop end to end on the CPU: exact resume (N iterations == N/2 + save + load + N/2,
// bit for bit, with dropout on), the loss falling on real English text below what token
// frequencies alone can give, NaN iterations counted and handled as Megatron does, and the log.
#include "megatron/training/training.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/training_log.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mg_training_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::vector<std::string> tiny_mock(int64_t iters) {
  return {"--num-layers",
          "2",
          "--hidden-size",
          "32",
          "--num-attention-heads",
          "4",
          "--seq-length",
          "32",
          "--micro-batch-size",
          "2",
          "--global-batch-size",
          "4",
          "--train-iters",
          std::to_string(iters),
          "--lr",
          "3e-3",
          "--lr-warmup-iters",
          "2",
          "--lr-decay-style",
          "cosine",
          "--min-lr",
          "1e-4",
          "--mock-data",
          "--vocab-size",
          "128",
          "--eval-interval",
          "3",
          "--eval-iters",
          "1",
          "--log-interval",
          "1",
          "--hidden-dropout",
          "0.1",
          "--attention-dropout",
          "0.1"};
}

PretrainResult run(std::vector<std::string> flags, std::vector<std::string> extra,
                   std::string* log_out = nullptr, const PretrainHooks& hooks = {}) {
  flags.insert(flags.end(), extra.begin(), extra.end());
  std::ostringstream log;
  PretrainResult r = pretrain(parse_args(flags), log, hooks);
  if (log_out) *log_out = log.str();
  return r;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// fp32, bf16 (fp32 master weights in the optimizer state) and fp16 (the grad scaler's state).
class ResumeTest : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ResumeTest, IsBitExact) {
  test::ensure_runtime();
  const std::vector<std::string> precision = GetParam();
  auto flags = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), precision.begin(), precision.end());
    return extra;
  };
  const auto full_dir = temp_dir("full"), split_dir = temp_dir("split");
  PretrainResult full = run(tiny_mock(8), flags({"--save", full_dir}));
  ASSERT_EQ(full.train_losses.size(), 8u);
  PretrainResult first = run(tiny_mock(8), flags({"--save", split_dir, "--exit-interval", "4"}));
  EXPECT_EQ(first.exit_reason, "exit-interval");
  ASSERT_EQ(first.train_losses.size(), 4u);
  PretrainResult second = run(tiny_mock(8), flags({"--save", split_dir, "--load", split_dir}));
  ASSERT_EQ(second.train_losses.size(), 4u);
  EXPECT_EQ(second.iteration, 8);
  EXPECT_EQ(second.consumed_train_samples, 32);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(first.train_losses[i], full.train_losses[i]) << "iteration " << i + 1;
    EXPECT_EQ(second.train_losses[i], full.train_losses[i + 4]) << "iteration " << i + 5;
    EXPECT_EQ(second.grad_norms[i], full.grad_norms[i + 4]) << "iteration " << i + 5;
  }
  EXPECT_EQ(second.valid_loss, full.valid_loss);
  // The final weights and optimizer state are identical to the byte.
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(file_bytes(full_dir + "/iter_0000008/" + f),
              file_bytes(split_dir + "/iter_0000008/" + f))
        << f;
  // The losses moved (the test would pass trivially on a frozen model otherwise).
  EXPECT_NE(full.train_losses[0], full.train_losses[7]);
}

INSTANTIATE_TEST_SUITE_P(
    Training, ResumeTest,
    ::testing::Values(std::vector<std::string>{}, std::vector<std::string>{"--bf16"},
                      std::vector<std::string>{"--fp16", "--initial-loss-scale", "4096"}));

TEST(Training, FinetuneAndNoLoadOptimStartFresh) {
  test::ensure_runtime();
  const auto dir = temp_dir("finetune");
  run(tiny_mock(4), {"--save", dir});
  PretrainResult ft = run(tiny_mock(3), {"--load", dir, "--finetune"});
  EXPECT_EQ(ft.iteration, 3);  // started at 0
  PretrainResult fresh = run(tiny_mock(3), {});
  EXPECT_NE(ft.train_losses[0], fresh.train_losses[0]);  // but from the trained weights
  std::string log;
  PretrainResult missing = run(tiny_mock(3), {"--load", temp_dir("nothing")}, &log);
  EXPECT_NE(log.find("will start from random"), std::string::npos);
  EXPECT_EQ(missing.train_losses[0], fresh.train_losses[0]);
}

// Byte-level tokens of real English text (the Brown corpus slice committed as a fixture), written
// as a Megatron indexed dataset; returns the prefix and the unigram entropy in nats.
std::pair<std::string, double> brown_bytes_dataset() {
  const std::string dir = temp_dir("brown");
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers/brown_slice.jsonl");
  std::string line;
  datasets::IndexedDatasetBuilder b(dir + "/brown.bin");
  std::map<int64_t, double> counts;
  double total = 0;
  while (std::getline(in, line)) {
    // One document per paragraph, so that the 95/5 split has documents on both sides.
    std::istringstream paragraphs(nlohmann::json::parse(line)["text"].get<std::string>());
    std::string text;
    while (std::getline(paragraphs, text)) {
      std::vector<int64_t> ids;
      for (unsigned char c : text) ids.push_back(c);
      ids.push_back(256);  // eod of NullTokenizer --vocab-size 256
      for (auto v : ids) counts[v] += 1, total += 1;
      b.add_item(std::span<const int64_t>(ids));
      b.end_document();
    }
  }
  b.finalize(dir + "/brown.idx");
  double h = 0;
  for (const auto& [id, c] : counts) h -= c / total * std::log(c / total);
  return {dir + "/brown", h};
}

// The loss on real text must fall from ln(V_pad) = ln(384) to clearly below the unigram entropy
// H1 of the bytes (3.11 nats for this text): a model that only learned token frequencies cannot go
// below H1, so beating it by 0.4 nats (0.35 on held-out text) shows the model uses context.
// Measured on the CPU: train ~2.55, validation ~2.65 after 300 iterations (a few seconds).
// Untied output weights: a tied 64-wide embedding learns byte bigrams much more slowly.
TEST(Training, LossFallsOnRealText) {
  test::ensure_runtime();
  auto [prefix, h1] = brown_bytes_dataset();
  const std::string flags =
      "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
      "--micro-batch-size 16 --train-iters 300 --lr 1e-2 --min-lr 1e-3 --lr-decay-style cosine "
      "--lr-warmup-iters 10 --hidden-dropout 0 --attention-dropout 0 "
      "--untie-embeddings-and-output-weights --split 95,5,0 --tokenizer-type NullTokenizer "
      "--vocab-size 256 --eval-interval 1000 --eval-iters 4 --log-interval 50";
  PretrainResult r = run(datasets::split_words(flags),
                         {"--data-path", prefix, "--data-cache-path", temp_dir("brown_cache")});
  double last = 0;
  for (std::size_t i = r.train_losses.size() - 20; i < r.train_losses.size(); ++i)
    last += r.train_losses[i] / 20;
  EXPECT_NEAR(r.train_losses[0], std::log(384.0), 0.1);
  EXPECT_LT(last, h1 - 0.4) << "unigram entropy " << h1;
  ASSERT_TRUE(r.valid_loss.has_value());
  EXPECT_LT(*r.valid_loss, h1 - 0.35) << "unigram entropy " << h1;
}

TEST(Training, NaNLossStopsFp32RunsWithAClearMessage) {
  test::ensure_runtime();
  PretrainHooks hooks;
  hooks.after_forward_backward = [](int64_t it, double& loss, models::LanguageModule&) {
    if (it == 2) loss = std::nan("");
  };
  auto e = test::error_message([&] { run(tiny_mock(5), {}, nullptr, hooks); });
  EXPECT_NE(e.find("lm loss is nan at iteration 3"), std::string::npos) << e;
  std::string log;
  PretrainResult r = run(tiny_mock(5), {"--no-check-for-nan-in-loss-and-grad"}, &log, hooks);
  EXPECT_EQ(r.nan_iters, 1);
  EXPECT_EQ(r.skipped_iters, 1);
  EXPECT_EQ(r.iteration, 5);
  EXPECT_NE(log.find("number of skipped iterations:   1 | number of nan iterations:   1 |"),
            std::string::npos)
      << log;
}

TEST(Training, NaNUnderFp16IsSkippedByTheLossScaler) {
  test::ensure_runtime();
  PretrainHooks hooks;
  hooks.after_forward_backward = [](int64_t it, double& loss, models::LanguageModule& m) {
    if (it != 2) return;
    loss = std::nan("");
    m.buffer().grads.copy_(Tensor::from_vector(
        std::vector<float>(static_cast<std::size_t>(m.buffer().grads.numel()), std::nanf("")),
        m.buffer().grads.shape()));
  };
  PretrainResult r = run(tiny_mock(5), {"--fp16", "--initial-loss-scale", "1024"}, nullptr, hooks);
  EXPECT_EQ(r.nan_iters, 1);
  EXPECT_EQ(r.skipped_iters, 1);
  for (std::size_t i = 3; i < r.train_losses.size(); ++i)
    EXPECT_TRUE(std::isfinite(r.train_losses[i])) << i;  // the weights stayed finite
}

TEST(Training, ExitDurationSavesAndStops) {
  test::ensure_runtime();
  const auto dir = temp_dir("duration");
  PretrainResult r = run(tiny_mock(8), {"--exit-duration-in-mins", "1e-9", "--save", dir});
  EXPECT_EQ(r.exit_reason, "exit-duration");
  EXPECT_EQ(r.iteration, 1);
  EXPECT_EQ(r.saved_iteration, 1);
  EXPECT_EQ(read_latest_iteration(dir), 1);
}

// --log-params-norm: Megatron's calc_params_l2_norm in the log line, " params norm: %.3f |" after
// the grad norm; equal to the L2 norm of every weight of the checkpoint saved at that iteration.
TEST(Training, LogParamsNormIsTheWeightsL2Norm) {
  test::ensure_runtime();
  const auto dir = temp_dir("params_norm");
  std::string log;
  run(tiny_mock(3), {"--log-params-norm", "--save", dir}, &log);
  std::vector<double> logged;
  for (std::size_t p = log.find("params norm: "); p != std::string::npos;
       p = log.find("params norm: ", p + 1))
    logged.push_back(std::stod(log.substr(p + 13)));
  ASSERT_EQ(logged.size(), 3u) << log;
  EXPECT_LT(log.find("grad norm: "), log.find("params norm: "));
  // The sharded checkpoint of one rank: the model's weights, then the optimizer state.
  dist_checkpointing::SafetensorsFile f(dir + "/iter_0000003/rank_00000.safetensors");
  double sq = 0.0;
  int weights = 0;
  for (const auto& name : f.names()) {
    if (!name.starts_with("decoder.") && !name.starts_with("embedding.") &&
        !name.starts_with("output_layer."))
      continue;
    ++weights;
    for (float v : f.tensor(name).to(DType::f32).to_vector<float>())
      sq += static_cast<double>(v) * v;
  }
  EXPECT_GE(weights, 20);
  EXPECT_NEAR(logged.back(), std::sqrt(sq), 0.0005) << log;
  EXPECT_NE(logged.front(), logged.back());  // the weights moved
  run(tiny_mock(3), {}, &log);
  EXPECT_EQ(log.find("params norm"), std::string::npos);
}

// A --data-cache-path folder written by Megatron-Core 0.16.1 (tests/fixtures/megatron_core/
// cache_gpt2, the real GPT-2 tokenizer identity of Megatron-LM's default tokenizer system) for
// this blend is used by pretrain_gpt as it is: no index file is added or rewritten.
TEST(Training, ReusesTheDataCacheMegatronCoreWrote) {
  test::ensure_runtime();
  const fs::path dir = temp_dir("megatron_cache");
  const fs::path fx = fs::path(MG_TEST_FIXTURES_DIR);
  for (const char* name : {"corpus_a", "corpus_b"})
    for (const char* ext : {".bin", ".idx"})
      fs::copy_file(fx / "megatron_core" / (std::string(name) + ext),
                    dir / (std::string(name) + ext));
  for (const char* f : {"gpt2-vocab.json", "gpt2-merges.txt"})
    fs::copy_file(fx / "gpt2" / f, dir / f);
  fs::copy(fx / "megatron_core" / "cache_gpt2", dir / "cache");
  auto listing = [&] {
    std::map<std::string, fs::file_time_type> m;
    for (const auto& e : fs::directory_iterator(dir / "cache"))
      if (!e.path().string().ends_with(".lock"))
        m[e.path().filename().string()] = e.last_write_time();
    return m;
  };
  const auto before = listing();
  const fs::path old = fs::current_path();
  fs::current_path(dir);
  const std::vector<std::string> flags = {"--num-layers",
                                          "1",
                                          "--hidden-size",
                                          "32",
                                          "--num-attention-heads",
                                          "2",
                                          "--seq-length",
                                          "32",
                                          "--micro-batch-size",
                                          "2",
                                          "--global-batch-size",
                                          "4",
                                          "--train-iters",
                                          "4",
                                          "--eval-interval",
                                          "2",
                                          "--eval-iters",
                                          "1",
                                          "--lr",
                                          "1e-3",
                                          "--seed",
                                          "1234",
                                          "--data-path",
                                          "0.3",
                                          "corpus_a",
                                          "0.7",
                                          "corpus_b",
                                          "--split",
                                          "90,8,2",
                                          "--data-cache-path",
                                          "cache",
                                          "--tokenizer-type",
                                          "GPT2BPETokenizer",
                                          "--vocab-file",
                                          "gpt2-vocab.json",
                                          "--merge-file",
                                          "gpt2-merges.txt",
                                          "--log-interval",
                                          "2"};
  std::string log;
  PretrainResult r = run(flags, {}, &log);
  EXPECT_EQ(r.iteration, 4);
  EXPECT_EQ(listing(), before) << "pretrain_gpt rebuilt Megatron-Core's cache\n" << log;
  // --legacy-tokenizer records another identity: other file names, so new files appear.
  run(flags, {"--legacy-tokenizer"});
  EXPECT_GT(listing().size(), before.size());
  fs::current_path(old);
}

// Megatron-LM leaves from train() (sys.exit) on --exit-interval / --exit-duration-in-mins: no
// final validation, no test. A run that reaches --train-iters runs both.
TEST(Training, ExitIntervalSkipsFinalValidationAndTest) {
  test::ensure_runtime();
  std::string log;
  PretrainResult full = run(tiny_mock(4), {}, &log);
  ASSERT_TRUE(full.test_loss.has_value()) << log;
  EXPECT_NE(log.find("on validation set"), std::string::npos) << log;
  PretrainResult stopped = run(tiny_mock(8), {"--exit-interval", "4"}, &log);
  EXPECT_EQ(stopped.exit_reason, "exit-interval");
  EXPECT_EQ(stopped.iteration, 4);
  EXPECT_FALSE(stopped.test_loss.has_value());
  EXPECT_EQ(log.find("on validation set"), std::string::npos) << log;
  EXPECT_EQ(log.find("test loss"), std::string::npos) << log;
  EXPECT_NE(log.find("skipping the final validation and test"), std::string::npos) << log;
  PretrainResult timed = run(tiny_mock(8), {"--exit-duration-in-mins", "1e-9"}, &log);
  EXPECT_EQ(timed.exit_reason, "exit-duration");
  EXPECT_FALSE(timed.test_loss.has_value());
}

TEST(Training, LogLineHasMegatronsFields) {
  test::ensure_runtime();
  std::string log;
  run(tiny_mock(3), {}, &log);
  for (const char* field :
       {"] iteration        3/       3 |", " consumed samples:           12 |",
        " elapsed time per iteration (ms): ", " throughput per GPU (TFLOP/s/GPU): ",
        " tokens per second per GPU: ", " MFU: ", " learning rate: ", " global batch size:     4 |",
        " lm loss: ", " loss scale: 1.0 |", " grad norm: ", " number of skipped iterations:   0 |",
        " number of nan iterations:   0 |", " mem allocated (MB): ", " > number of parameters: ",
        "op table (", " validation loss at iteration 3 | lm loss value: ", "lm loss PPL: "})
    EXPECT_NE(log.find(field), std::string::npos) << field << "\n" << log;
}

TEST(TrainingLog, ThroughputAndMfuArithmetic) {
  IntervalStats s;
  s.iteration = 10;
  s.train_iters = 100;
  s.elapsed_ms_per_iter = 100.0;
  s.flops_per_iter = 98.9e12;  // 989 TFLOP/s over 0.1 s: 100% of an H100 at world size 1
  s.tokens_per_iter = 4096;
  s.world_size = 2;
  s.peak_tflops = 989.0;
  s.global_batch_size = 8;
  const std::string l = format_training_log(s);
  EXPECT_NE(l.find("throughput per GPU (TFLOP/s/GPU): 494.5 |"), std::string::npos) << l;
  EXPECT_NE(l.find("tokens per second per GPU: 20480.0 |"), std::string::npos) << l;
  EXPECT_NE(l.find("MFU: 50.00% |"), std::string::npos) << l;
  EXPECT_EQ(default_peak_tflops("NVIDIA H100 80GB HBM3"), 989.0);
  EXPECT_FALSE(default_peak_tflops("AMD EPYC").has_value());
  const std::string e = format_evaluation("validation loss at iteration 10", 2.0);
  EXPECT_NE(e.find("lm loss value: 2.000000E+00 | lm loss PPL: 7.389056E+00 |"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace mg::training
