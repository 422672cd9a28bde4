// Golden tests against Megatron-Core 0.16.1 itself (tests/fixtures/megatron_core, written by
// gen_megatron_fixtures.py): the .bin/.idx its IndexedDatasetBuilder wrote, and, for six builder
// cases (single prefix with the reset flags, x = 0 with kept partial validation samples, weighted
// and unweighted blends, per-split blends, mock data), its dataset lengths, description MD5s,
// samples (tokens, labels, loss_mask, position_ids, attention mask) and every --data-cache-path
// file byte for byte. Each case runs in a scratch folder holding copies of the corpora, because
// the descriptions (and so the cache file names) hold the prefixes as given, relative.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/dataset_cache.h"
#include "megatron/core/datasets/indexed_dataset.h"

namespace mg::datasets {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(MG_TEST_FIXTURES_DIR) / "megatron_core";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << p;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const json& fixture() {
  static const json j = json::parse(read_file(kFixtures / "cases.json"));
  return j;
}

// A scratch folder with copies of the corpora, made the working directory for the test's life.
class ScratchDir {
 public:
  ScratchDir() {
    dir_ = fs::temp_directory_path() /
           ("mg_golden_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* name : {"corpus_a", "corpus_b", "corpus_c"})
      for (const char* ext : {".bin", ".idx"})
        fs::copy_file(kFixtures / (std::string(name) + ext), dir_ / (std::string(name) + ext));
    old_ = fs::current_path();
    fs::current_path(dir_);
  }
  ~ScratchDir() {
    fs::current_path(old_);
    fs::remove_all(dir_);
  }
  const fs::path& path() const { return dir_; }

 private:
  fs::path dir_, old_;
};

std::vector<std::string> blend_words(const json& blend) {
  // [[prefixes], weights|null] -> "w1 p1 w2 p2" or "p1 p2" words.
  std::vector<std::string> out;
  const json& prefixes = blend[0];
  const json& weights = blend[1];
  for (std::size_t i = 0; i < prefixes.size(); ++i) {
    if (!weights.is_null()) {
      std::ostringstream w;
      w << weights[i].get<double>();
      out.push_back(w.str());
    }
    out.push_back(prefixes[i].get<std::string>());
  }
  return out;
}

DataConfig config_for(const json& c, const std::string& cache_dir) {
  const json& f = fixture();
  DataConfig cfg;
  if (c.contains("blend")) cfg.data_path = blend_words(c["blend"]);
  if (c.contains("blend_per_split")) {
    std::vector<std::string>* dst[3] = {&cfg.train_data_path, &cfg.valid_data_path,
                                        &cfg.test_data_path};
    for (int i = 0; i < 3; ++i)
      if (!c["blend_per_split"][i].is_null()) *dst[i] = blend_words(c["blend_per_split"][i]);
  }
  if (c.contains("split")) cfg.split = c["split"].get<std::string>();
  cfg.mock = c.value("mock", false);
  cfg.seq_length = c["seq"].get<int32_t>();
  cfg.seed = c["seed"].get<uint32_t>();
  cfg.data_cache_path = cache_dir;
  cfg.reset_position_ids = c.value("reset_position_ids", false);
  cfg.reset_attention_mask = c.value("reset_attention_mask", false);
  cfg.eod_mask_loss = c.value("eod_mask_loss", false);
  cfg.add_extra_token_to_sequence = c.value("add_extra_token_to_sequence", true);
  cfg.drop_last_partial_validation_sequence =
      c.value("drop_last_partial_validation_sequence", true);
  cfg.eod_id = f["eod"].get<int64_t>();
  cfg.pad_id = f["pad"].get<int64_t>();
  cfg.vocab_size = f["vocab_size"].get<int64_t>();
  cfg.tokenizer_identifiers = legacy_tokenizer_identifiers(
      f["tokenizer_identifiers"]["class"].get<std::string>(),
      {f["tokenizer_identifiers"]["tokenizer_path"][0].get<std::string>(),
       f["tokenizer_identifiers"]["tokenizer_path"][1].get<std::string>()});
  return cfg;
}

std::array<std::optional<int64_t>, 3> sizes_for(const json& c) {
  std::array<std::optional<int64_t>, 3> s;
  for (std::size_t i = 0; i < 3; ++i)
    if (!c["sizes"][i].is_null()) s[i] = c["sizes"][i].get<int64_t>();
  return s;
}

const json& find_case(const std::string& name) {
  for (const json& c : fixture()["cases"])
    if (c["name"] == name) return c;
  throw std::runtime_error("no fixture case " + name);
}

// Samples, lengths and hashes of every split equal Megatron's.
void expect_splits_match(const json& c, const DatasetSplits& got) {
  const std::string name = c["name"];
  for (std::size_t i = 0; i < 3; ++i) {
    const json& want = c["splits"][i];
    SCOPED_TRACE(name + " split " + std::to_string(i));
    if (want.is_null()) {
      EXPECT_EQ(got[i], nullptr);
      continue;
    }
    ASSERT_NE(got[i], nullptr);
    EXPECT_EQ(got[i]->class_name(), want["class"].get<std::string>());
    EXPECT_EQ(got[i]->size(), want["length"].get<int64_t>());
    EXPECT_EQ(got[i]->unique_description_hash(), want["hash"].get<std::string>());
    for (const json& s : want["samples"]) {
      const int64_t k = s["index"];
      SCOPED_TRACE("sample " + std::to_string(k));
      const GPTSample g = got[i]->get(k);
      EXPECT_EQ(g.tokens, s["tokens"].get<std::vector<int64_t>>());
      EXPECT_EQ(g.labels, s["labels"].get<std::vector<int64_t>>());
      EXPECT_EQ(g.position_ids, s["position_ids"].get<std::vector<int64_t>>());
      EXPECT_EQ(g.loss_mask, s["loss_mask"].get<std::vector<float>>());
      // Megatron's [1, S, S] mask (True = masked) from causal + doc_ids.
      const auto rows = s["attention_mask"].get<std::vector<std::string>>();
      const std::size_t S = g.tokens.size();
      ASSERT_EQ(rows.size(), S);
      const bool reset = c.value("reset_attention_mask", false);
      ASSERT_EQ(g.doc_ids.size(), reset ? S : 0u);
      for (std::size_t q = 0; q < S; ++q) {
        std::string mine(S, '0');
        for (std::size_t kk = 0; kk < S; ++kk)
          if (kk > q || (reset && g.doc_ids[q] != g.doc_ids[kk])) mine[kk] = '1';
        ASSERT_EQ(mine, rows[q]) << "attention mask row " << q;
      }
    }
  }
}

// The cache folder Megatron wrote and ours hold the same files with the same bytes.
void expect_cache_matches(const std::string& name, const fs::path& ours, bool descriptions_only) {
  const fs::path theirs = kFixtures / "cache" / name;
  std::set<std::string> want, got;
  for (const auto& e : fs::directory_iterator(theirs)) want.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(ours)) {
    const std::string f = e.path().filename().string();
    if (f.ends_with(".lock")) continue;
    if (descriptions_only && !f.ends_with("-description.txt")) continue;
    got.insert(f);
  }
  EXPECT_EQ(got, want) << "cache file names differ for " << name;
  for (const std::string& f : want) {
    if (!got.count(f)) continue;
    EXPECT_EQ(read_file(ours / f), read_file(theirs / f)) << name << ": " << f << " differs";
  }
}

class MegatronGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MegatronGolden, SplitsSamplesAndCacheFilesMatchMegatron) {
  ScratchDir scratch;
  const json& c = find_case(GetParam());
  const fs::path cache = scratch.path() / "cache";
  const DataConfig cfg = config_for(c, cache.string());
  const DatasetSplits got = BlendedMegatronDatasetBuilder(cfg, sizes_for(c)).build();
  expect_splits_match(c, got);
  expect_cache_matches(GetParam(), cache, c.value("mock", false));
}

INSTANTIATE_TEST_SUITE_P(Cases, MegatronGolden,
                         ::testing::Values("single_resets", "single_x0_keep_partial",
                                           "weighted_blend", "unweighted_blend", "per_split",
                                           "mock"));

TEST(MegatronGoldenCache, LoadsTheCacheMegatronWrote) {
  // Megatron's own cache files, with their indices made different from what a build gives: a hit
  // must read them (never rebuild), proving the reader takes Python-written caches.
  ScratchDir scratch;
  const json& c = find_case("single_resets");
  const fs::path cache = scratch.path() / "cache";
  fs::copy(kFixtures / "cache" / "single_resets", cache);
  // Reverse the train shuffle index in place (same length, same dtype).
  fs::path shuffle;
  for (const auto& e : fs::directory_iterator(cache))
    if (e.path().string().ends_with("GPTDataset-train-shuffle_index.npy")) shuffle = e.path();
  ASSERT_FALSE(shuffle.empty());
  NpyArray a = read_npy(shuffle.string());
  std::vector<int64_t> v = a.to_int64();
  std::vector<int64_t> rev(v.rbegin(), v.rend());
  {
    std::ofstream out(shuffle, std::ios::binary | std::ios::trunc);
    out << npy_bytes(make_npy(a.descr, a.shape, rev));
  }
  const DatasetSplits fresh = BlendedMegatronDatasetBuilder(
                                  config_for(c, (scratch.path() / "other").string()), sizes_for(c))
                                  .build();
  const DatasetSplits cached =
      BlendedMegatronDatasetBuilder(config_for(c, cache.string()), sizes_for(c)).build();
  ASSERT_EQ(fresh[0]->size(), cached[0]->size());
  const int64_t n = fresh[0]->size();
  EXPECT_EQ(cached[0]->get(0).tokens, fresh[0]->get(n - 1).tokens);
  EXPECT_EQ(cached[0]->get(n - 1).tokens, fresh[0]->get(0).tokens);
}

TEST(MegatronGoldenCache, CorruptCacheIsAClearError) {
  ScratchDir scratch;
  const json& c = find_case("single_resets");
  const fs::path cache = scratch.path() / "cache";
  fs::copy(kFixtures / "cache" / "single_resets", cache);
  for (const auto& e : fs::directory_iterator(cache))
    if (e.path().string().ends_with("GPTDataset-train-sample_index.npy")) {
      const std::string bytes = read_file(e.path());
      std::ofstream out(e.path(), std::ios::binary | std::ios::trunc);
      out << bytes.substr(0, bytes.size() - 5);  // truncated data
    }
  try {
    BlendedMegatronDatasetBuilder(config_for(c, cache.string()), sizes_for(c)).build();
    FAIL() << "a truncated sample_index.npy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample_index.npy"), std::string::npos) << e.what();
  }
}

TEST(MegatronGoldenIndexed, OurBuilderRewritesMegatronsFilesByteForByte) {
  ScratchDir scratch;
  for (const char* name : {"corpus_a", "corpus_b", "corpus_c"}) {
    SCOPED_TRACE(name);
    const IndexedDataset in(name);
    const std::string out_prefix = std::string("rewritten_") + name;
    IndexedDatasetBuilder b(get_bin_path(out_prefix), in.dtype());
    const auto& docs = in.document_indices();
    for (std::size_t d = 0; d + 1 < docs.size(); ++d) {
      for (int64_t s = docs[d]; s < docs[d + 1]; ++s) {
        const std::vector<int64_t> t = in.get(static_cast<std::size_t>(s));
        b.add_item(std::span<const int64_t>(t));
      }
      b.end_document();
    }
    b.finalize(get_idx_path(out_prefix));
    EXPECT_EQ(read_file(get_bin_path(out_prefix)),
              read_file(kFixtures / (std::string(name) + ".bin")));
    EXPECT_EQ(read_file(get_idx_path(out_prefix)),
              read_file(kFixtures / (std::string(name) + ".idx")));
  }
}

TEST(MegatronGoldenDescription, HashOfTheFormatsExample) {
  // FORMATS.md §3.10's example description hashes to a0d8db35289c9b213db5af8a857d35cd.
  PyJson split_matrix = PyJson::array({PyJson::array({PyJson(int64_t{0}), PyJson(0.99)}),
                                       PyJson::array({PyJson(0.99), PyJson(1.0)}), PyJson()});
  PyJson d = PyJson::object(
      {{"class", PyJson("GPTDataset")},
       {"dataset_path", PyJson("/data/corpus_text_document")},
       {"num_samples", PyJson(int64_t{1024000})},
       {"index_split", PyJson("train")},
       {"random_seed", PyJson(int64_t{1234})},
       {"sequence_length", PyJson(int64_t{2048})},
       {"split", PyJson("99,1,0")},
       {"split_matrix", split_matrix},
       {"tokenizer",
        PyJson::object(
            {{"class",
              PyJson("megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText")},
             {"tokenizer_path", PyJson("gpt2")}})}});
  EXPECT_EQ(md5_hex(d.dumps(4)), "a0d8db35289c9b213db5af8a857d35cd");
}

}  // namespace
}  // namespace mg::datasets
