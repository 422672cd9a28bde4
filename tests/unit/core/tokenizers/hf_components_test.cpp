// Tests of the tokenizer.json stages one at a time (megatron/core/tokenizers/hf/components.h)
// against the PyPI `tokenizers` library: tests/fixtures/hf_tokenizers/expected_components.json
// holds, for configurations the fixture tokenizers do not all use (every Split behaviour with and
// without invert, Metaspace schemes, ByteLevel with a prefix space, Digits, WhitespaceSplit, the
// four normalization forms, Lowercase, Strip, Prepend, regex Replace, BertNormalizer settings,
// StripAccents, Nmt, Precompiled, BertPreTokenizer, Whitespace, Punctuation, CharDelimiterSplit,
// WordPiece and BPE decoders), what pre_tokenize_str / normalize_str / decode answer on the golden
// test strings. Also the documented ByteFallback difference (invalid UTF-8 kept as bytes), the
// Precompiled normalizer's grapheme rule and the text helpers.
#include "megatron/core/tokenizers/hf/components.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/hf/text.h"
#include "tests/unit/test_util.h"

namespace {

namespace hf = mg::tokenizers::hf;
using nlohmann::json;

const json& expected() {
  static const auto* j = [] {
    std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers/expected_components.json");
    return new json(json::parse(in));
  }();
  return *j;
}

TEST(HfComponents, PreTokenizersEqualTokenizersLibrary) {
  const auto& all = expected().at("pre_tokenizers");
  ASSERT_GE(all.size(), 20u);
  for (const auto& e : all) {
    const auto pre = hf::make_pre_tokenizer(e.at("config"));
    for (const auto& c : e.at("cases")) {
      std::vector<hf::Piece> pieces{{c.at("input").get<std::string>(), 0}};
      pre->pre_tokenize(pieces);
      std::vector<std::string> got;
      for (const auto& p : pieces) got.push_back(p.text);
      EXPECT_EQ(got, c.at("pieces").get<std::vector<std::string>>())
          << e.at("config").dump() << " on '" << c.at("input").get<std::string>() << "'";
    }
  }
}

TEST(HfComponents, NormalizersEqualTokenizersLibrary) {
  const auto& all = expected().at("normalizers");
  ASSERT_GE(all.size(), 10u);
  for (const auto& e : all) {
    const auto norm = hf::make_normalizer(e.at("config"));
    for (const auto& c : e.at("cases")) {
      std::string text = c.at("input").get<std::string>();
      norm->normalize(text);
      EXPECT_EQ(text, c.at("output").get<std::string>())
          << e.at("config").dump() << " on '" << c.at("input").get<std::string>() << "'";
    }
  }
}

TEST(HfComponents, DecodersEqualTokenizersLibrary) {
  const auto& all = expected().at("decoders");
  ASSERT_GE(all.size(), 6u);
  for (const auto& e : all) {
    const auto dec = hf::make_decoder(e.at("config"));
    for (const auto& c : e.at("cases")) {
      auto tokens = c.at("tokens").get<std::vector<std::string>>();
      dec->decode_chain(tokens);
      std::string got;
      for (const auto& t : tokens) got += t;
      EXPECT_EQ(got, c.at("output").get<std::string>()) << e.at("config").dump();
    }
  }
}

TEST(HfComponents, ByteFallbackKeepsInvalidBytes) {
  // HF gives one U+FFFD per byte of an invalid run; Tokenizer::detokenize returns the bytes.
  const auto dec = hf::make_decoder(json{{"type", "ByteFallback"}});
  std::vector<std::string> tokens = {"a", "<0xE4>", "<0xBD>", "<0xA0>", "<0xFF>", "b", "<0x41>"};
  dec->decode_chain(tokens);
  EXPECT_EQ(tokens, (std::vector<std::string>{"a", "\xE4\xBD\xA0\xFF", "b", "A"}));
}

TEST(HfComponents, TextHelpers) {
  EXPECT_EQ(hf::utf8_error_offset("ok \xC3\xA9"), std::string::npos);
  EXPECT_EQ(hf::utf8_error_offset("ab\xC3"), 2u);
  EXPECT_EQ(hf::utf8_error_offset("\xED\xA0\x80"), 0u);  // a surrogate
  EXPECT_EQ(hf::utf8_error_offset("x\xC0\xAF"), 1u);     // overlong
  EXPECT_TRUE(hf::is_whitespace(0x3000));
  EXPECT_FALSE(hf::is_whitespace(0x200B));
  const hf::Regex re(R"(\p{N}{1,3})", "test");
  EXPECT_EQ(re.find_all("a12345b٣"),
            (std::vector<std::pair<std::size_t, std::size_t>>{{1, 4}, {4, 6}, {7, 9}}));
  EXPECT_TRUE(hf::Regex("x*", "test").find_all("ab").empty());  // empty matches are skipped
}

TEST(HfComponents, BadConfigsAreClearErrors) {
  EXPECT_NE(mg::test::error_message([] {
              hf::make_pre_tokenizer(json{{"type", "Metaspace"}, {"replacement", "ab"}});
            }).find("replacement must be one character, got 'ab'"),
            std::string::npos);
  EXPECT_NE(mg::test::error_message([] {
              hf::make_normalizer(
                  json{{"type", "Replace"}, {"pattern", {{"Glob", "*"}}}, {"content", ""}});
            }).find("pattern must be {\"String\": ...} or {\"Regex\": ...}"),
            std::string::npos);
  EXPECT_NE(mg::test::error_message([] {
              hf::make_decoder(json{{"kind", "Fuse"}});
            }).find("decoder must be an object with a \"type\""),
            std::string::npos);
  EXPECT_NE(
      mg::test::error_message([] {
        hf::make_pre_tokenizer(json{
            {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "sometimes"}});
      }).find("prepend_scheme 'sometimes' is not one of always, first, never"),
      std::string::npos);
  EXPECT_NE(mg::test::error_message([] {
              hf::make_pre_tokenizer(json{{"type", "Punctuation"}, {"behavior", "Sometimes"}});
            }).find("behavior 'Sometimes' is not one of Removed, Isolated"),
            std::string::npos);
  EXPECT_NE(mg::test::error_message([] {
              hf::make_normalizer(json{{"type", "Precompiled"}, {"precompiled_charsmap", "*%$"}});
            }).find("precompiled_charsmap is not base64 (3 characters)"),
            std::string::npos);
  // Valid base64 ("AQAAAA==": 1 as u32) but no room for the trie it declares.
  EXPECT_NE(
      mg::test::error_message([] {
        hf::make_normalizer(json{{"type", "Precompiled"}, {"precompiled_charsmap", "AQAAAA=="}});
      }).find("precompiled_charsmap of 4 bytes does not hold a trie (declared size 1)"),
      std::string::npos);
}

TEST(HfComponents, PrecompiledReplacesWholeGraphemesByTheirShortestKey) {
  // The t5_precompiled charsmap (sentencepiece nmt_nfkc): "ﬁ" -> "fi", fullwidth -> ASCII,
  // U+00A0 -> ' '; "e" + U+0301 is one grapheme composed to "é"; text without a rule is kept.
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) +
                   "/hf_tokenizers/t5_precompiled/tokenizer.json");
  const json t5 = json::parse(in);
  const auto norm = hf::make_normalizer(t5.at("normalizer").at("normalizers").at(0));
  ASSERT_EQ(t5["normalizer"]["normalizers"][0]["type"], "Precompiled");
  auto run = [&](std::string s) {
    norm->normalize(s);
    return s;
  };
  EXPECT_EQ(run("\uFB01x \uFF21\uFF22"), "fix AB");
  EXPECT_EQ(run("a\u00A0b"), "a b");
  EXPECT_EQ(run("cafe\u0301"), "caf\u00E9");
  EXPECT_EQ(run("plain text"), "plain text");
  EXPECT_EQ(run(""), "");
}

}  // namespace
