// Throughput of GPT2BPETokenizer on real English: the texts of tests/fixtures/gpt2/
// reference_encodings.jsonl (40 Brown-corpus documents of 3,000 characters plus tricky strings,
// ~120 KB), repeated to ~1 MB. Reports bytes/s (input UTF-8) and tokens/s (ids produced).
//   Tokenize/warm: steady state of a preprocessing run (the per-piece cache holds every word).
//   Tokenize/cold: one copy (~120 KB) with a fresh tokenizer per iteration (load excluded from
//                  timing): every distinct piece goes through the BPE merge loop once.
// Set MG_GPT2_FIXTURES to read another directory with the same three files.
//   HuggingFace/<name>/warm: HuggingFaceTokenizer on the same text, with the tokenizer.json files
//   of
//                  tests/fixtures/hf_tokenizers (small trained vocabularies, so more tokens per
//                  byte than GPT-2): Llama-3-style Split + ByteLevel, Llama-2-style byte fallback,
//                  T5-style Unigram behind a Precompiled normalizer, BERT WordPiece.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/core/tokenizers/huggingface_tokenizer.h"

namespace {

using mg::tokenizers::GPT2BPETokenizer;

std::string fixture_dir() {
  if (const char* env = std::getenv("MG_GPT2_FIXTURES")) return env;
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "tests/fixtures/gpt2")
      .string();
}

std::unique_ptr<GPT2BPETokenizer> load() {
  const std::string dir = fixture_dir();
  return std::make_unique<GPT2BPETokenizer>(dir + "/gpt2-vocab.json", dir + "/gpt2-merges.txt");
}

// One copy of the fixture's texts (~120 KB, mostly distinct words).
const std::string& corpus_once() {
  static const std::string text = [] {
    std::string one;
    std::ifstream in(fixture_dir() + "/reference_encodings.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) one += nlohmann::json::parse(line).at("text").get<std::string>() + "\n";
    }
    return one;
  }();
  return text;
}

// corpus_once() repeated to ~1 MB.
const std::string& corpus() {
  static const std::string text = [] {
    std::string all;
    while (all.size() < (size_t{1} << 20)) all += corpus_once();
    return all;
  }();
  return text;
}

void set_rates(benchmark::State& state, size_t bytes, size_t tokens) {
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(tokens);
}

void BM_TokenizeWarm(benchmark::State& state) {
  const auto tok = load();
  const std::string& text = corpus();
  size_t tokens = tok->tokenize(text).size();  // fills the cache
  for (auto _ : state) {
    auto ids = tok->tokenize(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  set_rates(state, text.size(), tokens);
}
BENCHMARK(BM_TokenizeWarm)->Name("Tokenize/warm")->Unit(benchmark::kMillisecond);

void BM_TokenizeCold(benchmark::State& state) {
  const std::string& text = corpus_once();
  size_t tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = load();
    state.ResumeTiming();
    auto ids = tok->tokenize(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  set_rates(state, text.size(), tokens);
}
BENCHMARK(BM_TokenizeCold)->Name("Tokenize/cold")->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_Detokenize(benchmark::State& state) {
  const auto tok = load();
  const std::string& text = corpus();
  const auto ids = tok->tokenize(text);
  for (auto _ : state) {
    auto out = tok->detokenize(ids);
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, text.size(), ids.size());
}
BENCHMARK(BM_Detokenize)->Name("Detokenize")->Unit(benchmark::kMillisecond);

void BM_HuggingFaceWarm(benchmark::State& state, const char* name) {
  const auto dir =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "tests/fixtures/hf_tokenizers";
  const mg::tokenizers::HuggingFaceTokenizer tok((dir / name).string());
  const std::string& text = corpus();
  size_t tokens = tok.tokenize(text).size();  // fills the cache
  for (auto _ : state) {
    auto ids = tok.tokenize(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  set_rates(state, text.size(), tokens);
}
BENCHMARK_CAPTURE(BM_HuggingFaceWarm, llama3, "llama3_bytelevel")
    ->Name("HuggingFace/llama3_bytelevel/warm")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_HuggingFaceWarm, llama2, "llama2_sentencepiece_bpe")
    ->Name("HuggingFace/llama2_sentencepiece_bpe/warm")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_HuggingFaceWarm, t5, "t5_precompiled")
    ->Name("HuggingFace/t5_precompiled/warm")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_HuggingFaceWarm, bert, "bert_wordpiece")
    ->Name("HuggingFace/bert_wordpiece/warm")
    ->Unit(benchmark::kMillisecond);

void BM_Load(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(load().get());
}
BENCHMARK(BM_Load)->Name("Load")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
