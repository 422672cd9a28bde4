// Tests of HuggingFaceTokenizer (megatron/core/tokenizers/huggingface_tokenizer.h): exact ids and
// decoded text against the PyPI `tokenizers` library on the tokenizers that
// tests/fixtures/hf_tokenizers/gen_hf_tokenizers.py trains (byte-level BPE in the GPT-2, Llama-3
// and Qwen2 layouts; byte-fallback BPE in the Llama-2 and Mistral layouts; Metaspace BPE; Unigram
// with byte fallback, with fused unk, and behind a sentencepiece Precompiled normalizer; BERT
// WordPiece cased and uncased; end-of-word-suffix BPE; WordLevel), on test strings and held-out
// Brown lines, with and without the post-processor's special tokens; eod and vocabulary size; that
// edits to a tokenizer.json change the result where they should (so the golden comparison can
// fail); thread safety; and the error messages for bad files and inputs.
#include "megatron/core/tokenizers/huggingface_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/tokenizers/hf/text.h"
#include "tests/unit/test_util.h"

namespace {

using mg::tokenizers::HuggingFaceTokenizer;
using nlohmann::json;
using Ids = std::vector<int32_t>;
namespace fs = std::filesystem;

const std::string kDir = std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers";
const std::vector<std::string> kNames = {"gpt2_bytelevel",
                                         "llama2_sentencepiece_bpe",
                                         "metaspace",
                                         "llama3_bytelevel",
                                         "qwen2_nfc",
                                         "mistral_bpe_metaspace",
                                         "unigram_byte_fallback",
                                         "unigram_whitespace",
                                         "bert_wordpiece",
                                         "wordpiece_cased",
                                         "t5_precompiled",
                                         "openai_gpt_suffix",
                                         "wordlevel"};

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

const json& expected(const std::string& name) {
  static std::map<std::string, json> cache;
  auto it = cache.find(name);
  if (it == cache.end())
    it = cache.emplace(name, read_json(kDir + "/expected_" + name + ".json")).first;
  return it->second;
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

// A scratch directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("mg_hf_tok_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    const auto p = (path_ / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

class HfGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGolden, IdsAndDecodedTextEqualTokenizersLibrary) {
  const std::string name = GetParam();
  const HuggingFaceTokenizer tok(kDir + "/" + name + "/tokenizer.json");
  const json& exp = expected(name);
  ASSERT_GE(exp.at("cases").size(), 30u) << "fixture expected_" << name << ".json not read";
  for (const auto& c : exp.at("cases")) {
    const auto text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<Ids>();
    const auto ids_ns = c.at("ids_no_special").get<Ids>();
    EXPECT_EQ(tok.tokenize(text), ids) << name << ": '" << text << "'";
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/false), ids_ns)
        << name << ": '" << text << "'";
    EXPECT_EQ(tok.detokenize(ids), c.at("decoded").get<std::string>())
        << name << ": '" << text << "'";
    EXPECT_EQ(tok.detokenize(ids_ns), c.at("decoded_no_special").get<std::string>())
        << name << ": '" << text << "'";
  }
}

// The lines of brown_heldout.jsonl, Brown documents none of the fixture tokenizers was trained on.
const std::vector<std::string>& heldout_lines() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    std::ifstream in(kDir + "/brown_heldout.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto text = json::parse(line).at("text").get<std::string>();
      std::size_t b = 0;
      for (std::size_t e; (e = text.find('\n', b)) != std::string::npos; b = e + 1)
        out.push_back(text.substr(b, e - b));
      out.push_back(text.substr(b));
    }
    return out;
  }();
  return lines;
}

TEST_P(HfGolden, HeldOutBrownLinesEqualTokenizersLibrary) {
  const std::string name = GetParam();
  const HuggingFaceTokenizer tok(kDir + "/" + name);
  const json& corpus = expected(name).at("corpus");
  const auto& lines = heldout_lines();
  ASSERT_EQ(corpus.size(), lines.size()) << "expected_" << name << ".json vs brown_heldout.jsonl";
  ASSERT_GE(lines.size(), 200u);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto ids = corpus[i].at("ids").get<Ids>();
    EXPECT_EQ(tok.encode(lines[i], /*add_special_tokens=*/false), ids)
        << name << " line " << i << ": '" << lines[i] << "'";
    EXPECT_EQ(tok.detokenize(ids), corpus[i].value("decoded", lines[i]))
        << name << " line " << i << ": '" << lines[i] << "'";
  }
}

TEST_P(HfGolden, VocabSizeAndEod) {
  const std::string name = GetParam();
  const HuggingFaceTokenizer tok(kDir + "/" + name);  // a directory works as AutoTokenizer's
  EXPECT_EQ(tok.vocab_size(), expected(name).at("vocab_size_with_added").get<int64_t>());
  EXPECT_EQ(tok.eod(), expected(name).at("eos_id").get<int32_t>());
  EXPECT_EQ(tok.name(), "HuggingFaceTokenizer");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfGolden, ::testing::ValuesIn(kNames),
                         [](const auto& info) { return info.param; });

TEST(HuggingFaceTokenizer, SpecialTokensAddedAsTheTemplateSays) {
  // Llama-2 style prepends <s> (id 1); metaspace wraps in <s> ... </s>; Qwen2 style adds nothing.
  const HuggingFaceTokenizer llama2(kDir + "/llama2_sentencepiece_bpe");
  const HuggingFaceTokenizer meta(kDir + "/metaspace");
  const HuggingFaceTokenizer qwen(kDir + "/qwen2_nfc");
  const Ids a = llama2.tokenize("Hello"), b = meta.tokenize("Hello"), c = qwen.tokenize("Hello");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.front(), 1);
  EXPECT_EQ(b.front(), 1);
  EXPECT_EQ(b.back(), 2);
  EXPECT_EQ(qwen.encode("Hello", false), c);
  EXPECT_EQ(llama2.tokenize(""), Ids{1});
  EXPECT_EQ(llama2.encode("", false), Ids{});
  // --tokenizer-hf-no-include-special-tokens through build_tokenizer.
  mg::tokenizers::TokenizerArgs args;
  args.tokenizer_type = "HuggingFaceTokenizer";
  args.tokenizer_model = kDir + "/llama2_sentencepiece_bpe/tokenizer.json";
  args.tokenizer_hf_include_special_tokens = false;
  EXPECT_EQ(mg::tokenizers::build_tokenizer(args)->tokenize("Hello"),
            llama2.encode("Hello", false));
  args.tokenizer_hf_include_special_tokens = true;
  EXPECT_EQ(mg::tokenizers::build_tokenizer(args)->tokenize("Hello"), a);
}

TEST(HuggingFaceTokenizer, IgnoreMergesFindsAWholeWordNoMergeReaches) {
  // The fixture's Llama-3-style vocabulary holds "Ġxyzzy", which no merge sequence builds.
  TempDir dir;
  json j = read_json(kDir + "/llama3_bytelevel/tokenizer.json");
  const auto xyzzy = j["model"]["vocab"]["\u0120xyzzy"].get<int32_t>();
  const HuggingFaceTokenizer with(kDir + "/llama3_bytelevel/tokenizer.json");
  EXPECT_EQ(with.encode(" xyzzy", false), Ids{xyzzy});
  j["model"]["ignore_merges"] = false;
  const HuggingFaceTokenizer without(dir.write("tokenizer.json", j.dump()));
  const Ids ids = without.encode(" xyzzy", false);
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(without.detokenize(ids), " xyzzy");
}

TEST(HuggingFaceTokenizer, OlderFileLayoutsGiveTheSameIds) {
  // tokenizers < 0.20 wrote merges as "left right" strings; < 0.14 wrote Metaspace's
  // add_prefix_space instead of prepend_scheme.
  TempDir dir;
  json j = read_json(kDir + "/gpt2_bytelevel/tokenizer.json");
  for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const HuggingFaceTokenizer strings(dir.write("tokenizer.json", j.dump()));
  const HuggingFaceTokenizer pairs(kDir + "/gpt2_bytelevel/tokenizer.json");
  json m = read_json(kDir + "/metaspace/tokenizer.json");
  for (auto* part : {&m["pre_tokenizer"], &m["decoder"]}) {
    part->erase("prepend_scheme");
    (*part)["add_prefix_space"] = true;
  }
  std::filesystem::create_directories(dir.path() + "/old_metaspace");
  const HuggingFaceTokenizer old_meta(dir.write("old_metaspace/tokenizer.json", m.dump()));
  const HuggingFaceTokenizer meta(kDir + "/metaspace");
  for (const auto& c : expected("gpt2_bytelevel").at("cases")) {
    const auto text = c.at("text").get<std::string>();
    EXPECT_EQ(strings.tokenize(text), pairs.tokenize(text)) << text;
    // add_prefix_space = always: differs from "first" only after a special token.
    if (text.find("<s>") == std::string::npos && text.find("</s>") == std::string::npos &&
        text.find("<unk>") == std::string::npos) {
      EXPECT_EQ(old_meta.tokenize(text), meta.tokenize(text)) << text;
    }
  }
}

TEST(HuggingFaceTokenizer, NormalizerAndPreTokenizerChangeTheIds) {
  // Without NFC the decomposed "é" of the Qwen2-style fixture encodes differently; without the
  // Split regex the digits are no longer single pieces. Shows the golden test would notice.
  TempDir dir;
  json j = read_json(kDir + "/qwen2_nfc/tokenizer.json");
  const HuggingFaceTokenizer nfc(kDir + "/qwen2_nfc/tokenizer.json");
  j["normalizer"] = nullptr;
  const HuggingFaceTokenizer raw(dir.write("tokenizer.json", j.dump()));
  const std::string decomposed = "cafe\u0301";
  EXPECT_NE(nfc.tokenize(decomposed), raw.tokenize(decomposed));
  EXPECT_EQ(nfc.tokenize(decomposed), nfc.tokenize("caf\u00e9"));
  EXPECT_EQ(nfc.detokenize(nfc.tokenize(decomposed)), "caf\u00e9");
}

TEST(HuggingFaceTokenizer, ByteLevelRoundTripsAnyText) {
  const std::vector<std::string> texts = {"x\xC3\xA9\xF0\x9F\x98\x80 \t\n  y", "\x01\x02",
                                          "a  b   ", "<|endoftext|> plain"};
  for (const auto& name : {"gpt2_bytelevel", "llama3_bytelevel", "qwen2_nfc"}) {
    const HuggingFaceTokenizer tok(kDir + "/" + name);
    for (const auto& t : texts) EXPECT_EQ(tok.detokenize(tok.encode(t, false)), t) << name;
  }
}

TEST(HuggingFaceTokenizer, AddedTokenOptions) {
  // gpt2_bytelevel: "<mask>" is special with lstrip (eats the spaces before it); "Fulton County"
  // is a normalized, non-special added token.
  const HuggingFaceTokenizer tok(kDir + "/gpt2_bytelevel");
  const int32_t mask = tok.token_to_id("<mask>"), fc = tok.token_to_id("Fulton County");
  ASSERT_GE(mask, 0);
  ASSERT_GE(fc, 0);
  EXPECT_EQ(tok.tokenize("a   <mask>"), (Ids{tok.tokenize("a")[0], mask}));
  const Ids ids = tok.tokenize("the Fulton County jury");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), fc), 1);
  EXPECT_EQ(tok.tokenize("<|endoftext|>"), Ids{tok.eod()});
}

TEST(HuggingFaceTokenizer, UnigramByteFallbackUnkAndScores) {
  // unigram_byte_fallback: an emoji has no piece, so it becomes its UTF-8 bytes as <0xXX> pieces;
  // without byte_fallback an unknown run is one fused <unk>; without unk_id it is an error; and
  // the Viterbi path follows the scores.
  TempDir dir;
  const HuggingFaceTokenizer tok(kDir + "/unigram_byte_fallback");
  const int32_t unk = tok.token_to_id("<unk>");
  Ids bytes;
  for (const char* b : {"<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "<0x91>", "<0x8D>"})
    bytes.push_back(tok.token_to_id(b));
  ASSERT_GE(unk, 0);
  const Ids ids = tok.encode("\xF0\x9F\x98\x80\xF0\x9F\x91\x8D", false);  // 😀👍
  ASSERT_GE(ids.size(), 8u);
  const Ids tail(ids.end() - 8, ids.end());
  EXPECT_EQ(tail,
            (Ids{bytes[0], bytes[1], bytes[2], bytes[3], bytes[0], bytes[1], bytes[4], bytes[5]}));
  // The Metaspace decoder drops the ▁ it prepended.
  EXPECT_EQ(tok.detokenize(ids), "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D");

  json j = read_json(kDir + "/unigram_byte_fallback/tokenizer.json");
  j["model"]["byte_fallback"] = false;
  const HuggingFaceTokenizer no_bytes(dir.write("tokenizer.json", j.dump()));
  const Ids unk_ids = no_bytes.encode("\xF0\x9F\x98\x80\xF0\x9F\x91\x8D", false);
  EXPECT_EQ(std::count(unk_ids.begin(), unk_ids.end(), unk), 1) << "one fused <unk>";
  EXPECT_EQ(unk_ids.back(), unk);

  j["model"]["unk_id"] = nullptr;
  const HuggingFaceTokenizer no_unk(dir.write("tokenizer.json", j.dump()));
  EXPECT_EQ(no_unk.encode("Hello", false), tok.encode("Hello", false));
  const auto msg = mg::test::error_message([&] { no_unk.encode("a \xF0\x9F\x98\x80", false); });
  EXPECT_CONTAINS(msg, "the Unigram model cannot encode '\xF0\x9F\x98\x80'");
  EXPECT_CONTAINS(msg, "has no unk_id");

  // Multi-character pieces made very unlikely: every word falls apart into characters.
  j = read_json(kDir + "/unigram_byte_fallback/tokenizer.json");
  for (auto& piece : j["model"]["vocab"]) {
    const auto s = piece[0].get<std::string>();
    if (mg::tokenizers::hf::utf8_error_offset(s) == std::string::npos && s.size() > 1 &&
        s != "\u2581" && s[0] != '<')
      piece[1] = -1000.0;
  }
  const HuggingFaceTokenizer chars(dir.write("tokenizer.json", j.dump()));
  EXPECT_LT(tok.encode("investigation", false).size(), 6u);
  EXPECT_EQ(chars.encode("investigation", false).size(), 14u);  // ▁ and 13 letters
  EXPECT_EQ(chars.detokenize(chars.encode("investigation", false)), "investigation");

  j["model"]["unk_id"] = 100000;
  const auto bad = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(bad); }),
                  "unk_id 100000 is not an id of its vocabulary of");
}

TEST(HuggingFaceTokenizer, WordPieceLongWordsPrefixAndUnk) {
  // bert_wordpiece: max_input_chars_per_word 20 turns a 34-character word into one [UNK]; with
  // the default 100 it is split into ##-prefixed sub-words that decode back to the word.
  TempDir dir;
  const HuggingFaceTokenizer tok(kDir + "/bert_wordpiece");
  const int32_t unk = tok.token_to_id("[UNK]"), sep = tok.token_to_id("[SEP]");
  const std::string word = "supercalifragilisticexpialidocious";
  EXPECT_EQ(tok.encode(word, false), Ids{unk});
  EXPECT_EQ(tok.eod(), sep);  // no eos_token in tokenizer_config.json: [SEP], as BERT ends texts
  json j = read_json(kDir + "/bert_wordpiece/tokenizer.json");
  j["model"]["max_input_chars_per_word"] = 100;
  const HuggingFaceTokenizer longer(dir.write("tokenizer.json", j.dump()));
  const Ids ids = longer.encode(word, false);
  EXPECT_GT(ids.size(), 3u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), unk), 0);
  EXPECT_EQ(longer.detokenize(ids), word);
  // A word with a character outside the vocabulary is one [UNK] as a whole.
  EXPECT_EQ(tok.encode("jury\xE2\x98\x83", false), Ids{unk});  // jury☃
  j["model"]["unk_token"] = "[NOPE]";
  const HuggingFaceTokenizer no_unk(dir.write("tokenizer.json", j.dump()));
  EXPECT_CONTAINS(mg::test::error_message([&] { no_unk.encode("jury\xE2\x98\x83", false); }),
                  "cannot encode 'jury\xE2\x98\x83' and its unk_token '[NOPE]' is not in the "
                  "vocabulary");
}

TEST(HuggingFaceTokenizer, ConcurrentTokenizeEqualsSequential) {
  // BPE (piece cache), Unigram behind Precompiled (per-thread ICU grapheme iterator), WordPiece.
  for (const char* name : {"llama3_bytelevel", "t5_precompiled", "bert_wordpiece"}) {
    const HuggingFaceTokenizer tok(kDir + "/" + name);
    std::vector<std::string> texts;
    for (const auto& c : expected(name).at("cases")) texts.push_back(c.at("text"));
    std::vector<Ids> want;
    for (const auto& t : texts) want.push_back(tok.tokenize(t));
    std::vector<std::thread> threads;
    std::vector<int> bad(4, 0);
    for (int w = 0; w < 4; ++w) {
      threads.emplace_back([&, w] {
        for (int rep = 0; rep < 10; ++rep)
          for (size_t i = 0; i < texts.size(); ++i) bad[w] += tok.tokenize(texts[i]) != want[i];
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad, std::vector<int>(4, 0)) << name;
  }
}

TEST(HuggingFaceTokenizer, UnsupportedComponentsNameThemselvesAndTheSupportedOnes) {
  TempDir dir;
  const json base = read_json(kDir + "/gpt2_bytelevel/tokenizer.json");
  struct Case {
    const char* key;
    json value;
    const char* want;
  };
  const std::vector<Case> cases = {
      {"pre_tokenizer", json{{"type", "UnicodeScripts"}},
       "pre_tokenizer type 'UnicodeScripts' is not supported (supported: ByteLevel, Metaspace"},
      {"normalizer", json{{"type", "ByteLevel"}},
       "normalizer type 'ByteLevel' is not supported (supported: NFC, NFD"},
      {"decoder", json{{"type", "CTC"}},
       "decoder type 'CTC' is not supported (supported: ByteLevel, Metaspace"},
      {"post_processor", json{{"type", "Foo"}},
       "post_processor type 'Foo' is not supported (supported: TemplateProcessing"},
  };
  for (const auto& c : cases) {
    json j = base;
    j[c.key] = c.value;
    const auto path = dir.write("tokenizer.json", j.dump());
    const auto msg = mg::test::error_message([&] { HuggingFaceTokenizer t(path); });
    EXPECT_CONTAINS(msg, c.want);
    EXPECT_CONTAINS(msg, path);
  }
  json j = base;
  j["model"] = json{{"type", "Sentencepiece"}, {"vocab", json::array()}};
  const auto path = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(path); }),
                  "model type 'Sentencepiece' is not supported (supported: BPE, Unigram, "
                  "WordPiece, WordLevel)");
  j = base;
  j["model"] = json{{"type", "Unigram"},
                    {"unk_id", 0},
                    {"vocab", json::array({json::array({"<unk>", 0.0}), json::array({"a", "x"})})}};
  const auto path5 = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(path5); }),
                  "model Unigram: vocab entry 1 [\"a\",\"x\"] is not [\"piece\", score]");
  j["model"] = json{{"type", "WordPiece"}, {"vocab", json::array()}};
  const auto path6 = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(path6); }),
                  "model WordPiece has no \"vocab\" object {token: id}");
  j = base;
  j["model"]["dropout"] = 0.1;
  const auto path2 = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(path2); }),
                  "BPE dropout 0.1");
  j = base;
  j["pre_tokenizer"] = json{{"type", "Split"},
                            {"pattern", {{"Regex", "(unclosed"}}},
                            {"behavior", "Isolated"},
                            {"invert", false}};
  const auto path3 = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(path3); }),
                  "regex '(unclosed' does not compile");
  j = base;
  j["pre_tokenizer"] =
      json{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Fancy"}};
  const auto path4 = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(path4); }),
                  "behavior 'Fancy' is not one of Removed, Isolated");
}

TEST(HuggingFaceTokenizer, BadFilesAndInputsAreClearErrors) {
  TempDir dir;
  EXPECT_CONTAINS(mg::test::error_message([] { HuggingFaceTokenizer t("/nonexistent/tok.json"); }),
                  "cannot open tokenizer file '/nonexistent/tok.json'");
  const auto bad = dir.write("tokenizer.json", "{not json");
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(bad); }),
                  "is not valid JSON");
  const auto nomodel = dir.write("tokenizer.json", "{\"version\": \"1.0\"}");
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(nomodel); }),
                  "is not a tokenizer.json (no \"model\")");

  // A merge naming a token outside the vocabulary.
  json j = read_json(kDir + "/gpt2_bytelevel/tokenizer.json");
  j["model"]["merges"].push_back(json::array({"\u0120t", "zzzz_missing"}));
  const auto badmerge = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(badmerge); }),
                  "uses a token missing from the vocabulary");

  // No eos: no tokenizer_config.json and no known eos name.
  j = read_json(kDir + "/qwen2_nfc/tokenizer.json");
  j["added_tokens"] = json::array();
  const auto noeos = dir.write("tokenizer.json", j.dump());
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(noeos); }), "no eos token");
  // An eos_token in tokenizer_config.json that is not a token.
  j = read_json(kDir + "/qwen2_nfc/tokenizer.json");
  const auto path = dir.write("tokenizer.json", j.dump());
  dir.write("tokenizer_config.json", R"({"eos_token": "<nope>"})");
  EXPECT_CONTAINS(mg::test::error_message([&] { HuggingFaceTokenizer t(path); }),
                  "eos_token '<nope>'");

  const HuggingFaceTokenizer tok(kDir + "/gpt2_bytelevel");
  EXPECT_CONTAINS(mg::test::error_message([&] { tok.tokenize("ok \xC3( bad"); }),
                  "input is not valid UTF-8 at byte 3");
  const int32_t ids[] = {5, 100000};
  EXPECT_CONTAINS(mg::test::error_message([&] { tok.detokenize(ids); }),
                  "id 100000 at position 1 is not a token of");
}

}  // namespace
