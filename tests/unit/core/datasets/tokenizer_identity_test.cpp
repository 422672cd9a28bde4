// The tokenizer identity in --data-cache-path descriptions (megatron_tokenizer_identifiers) equals
// what Megatron-Core 0.16.1 records, for every --tokenizer-type this build has, with Megatron-LM's
// default tokenizer system and with --legacy-tokenizer (tests/fixtures/megatron_core/
// tokenizer_identities.json, written by gen_tokenizer_cache.py). And a cache folder Megatron-Core
// wrote for a blend with the real GPT-2 identity is found and read by our builder: no file is
// added or rewritten.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/dataset_cache.h"

namespace mg::datasets {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(MG_TEST_FIXTURES_DIR) / "megatron_core";

json identities() {
  std::ifstream in(kFixtures / "tokenizer_identities.json");
  return json::parse(in);
}

tokenizers::TokenizerArgs args_for(const std::string& type, const json& flags, bool legacy) {
  tokenizers::TokenizerArgs t;
  t.tokenizer_type = type;
  t.vocab_file = flags.value("vocab_file", "");
  t.merge_file = flags.value("merge_file", "");
  t.tokenizer_model = flags.value("tokenizer_model", "");
  if (flags.contains("vocab_size")) t.vocab_size = flags["vocab_size"].get<int64_t>();
  t.legacy_tokenizer = legacy;
  return t;
}

TEST(TokenizerIdentity, EqualsMegatronCoresForEveryTypeAndSystem) {
  const json j = identities();
  ASSERT_EQ(j["megatron_core"], "0.16.1");
  int checked = 0;
  for (const char* system : {"default", "legacy"})
    for (const auto& [type, flags] : j["flags"].items()) {
      const auto got =
          megatron_tokenizer_identifiers(args_for(type, flags, std::string(system) == "legacy"))
              .dumps(4);
      EXPECT_EQ(got, j[system][type].get<std::string>()) << system << " " << type;
      ++checked;
    }
  EXPECT_EQ(checked, 12);
  // The two systems never share a cache (the class differs).
  const auto gpt2 = args_for("GPT2BPETokenizer", j["flags"]["GPT2BPETokenizer"], false);
  auto legacy = gpt2;
  legacy.legacy_tokenizer = true;
  EXPECT_NE(megatron_tokenizer_identifiers(gpt2).dumps(4),
            megatron_tokenizer_identifiers(legacy).dumps(4));
}

// pretrain_gpt's data config for --data-path 0.3 corpus_a 0.7 corpus_b --split 90,8,2
// --seq-length 32 --seed 1234 --train-iters 4 --global-batch-size 4 --eval-interval 2
// --eval-iters 1 (sizes 16, 12, 4) and a GPT-2 tokenizer.
DataConfig blend_config(const std::string& cache, bool legacy) {
  DataConfig c;
  c.data_path = {"0.3", "corpus_a", "0.7", "corpus_b"};
  c.split = "90,8,2";
  c.seq_length = 32;
  c.seed = 1234;
  c.data_cache_path = cache;
  c.eod_id = 50256;
  c.vocab_size = 50257;
  tokenizers::TokenizerArgs t;
  t.tokenizer_type = "GPT2BPETokenizer";
  t.vocab_file = "gpt2-vocab.json";
  t.merge_file = "gpt2-merges.txt";
  t.legacy_tokenizer = legacy;
  c.tokenizer_identifiers = megatron_tokenizer_identifiers(t);
  return c;
}

std::map<std::string, fs::file_time_type> listing(const fs::path& dir) {
  std::map<std::string, fs::file_time_type> m;
  for (const auto& e : fs::directory_iterator(dir))
    if (!e.path().string().ends_with(".lock"))
      m[e.path().filename().string()] = e.last_write_time();
  return m;
}

class MegatronCache : public ::testing::TestWithParam<bool> {};

TEST_P(MegatronCache, BlendCacheWrittenByMegatronCoreIsReused) {
  const bool legacy = GetParam();
  const fs::path dir = fs::temp_directory_path() /
                       ("mg_tokcache_" + std::to_string(::getpid()) + (legacy ? "_l" : "_d"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* name : {"corpus_a", "corpus_b"})
    for (const char* ext : {".bin", ".idx"})
      fs::copy_file(kFixtures / (std::string(name) + ext), dir / (std::string(name) + ext));
  const fs::path cache = dir / "cache";
  fs::copy(kFixtures / (legacy ? "cache_gpt2_legacy" : "cache_gpt2"), cache);
  const auto before = listing(cache);
  ASSERT_GE(before.size(), 10u);
  const fs::path old = fs::current_path();
  fs::current_path(dir);
  const std::array<std::optional<int64_t>, 3> sizes{16, 12, 4};
  const DatasetSplits splits =
      BlendedMegatronDatasetBuilder(blend_config("cache", legacy), sizes).build();
  EXPECT_EQ(listing(cache), before) << "a Megatron-Core cache file was added or rewritten";
  EXPECT_GE(splits[0]->size(), 16);
  // The other system's identity names other files: the same folder then gains new ones.
  BlendedMegatronDatasetBuilder(blend_config("cache", !legacy), sizes).build();
  EXPECT_GT(listing(cache).size(), before.size());
  fs::current_path(old);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Systems, MegatronCache, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "legacy" : "default"; });

}  // namespace
}  // namespace mg::datasets
