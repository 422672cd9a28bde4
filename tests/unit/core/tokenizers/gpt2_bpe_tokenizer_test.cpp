// Tests of GPT2BPETokenizer (megatron/core/tokenizers/gpt2_bpe_tokenizer.h): exact ids on the
// reference encodings of tests/fixtures/gpt2 (from gpt-3-encoder 1.1.4, OpenAI's encoder), round
// trips, pre-tokenizer properties on edge cases (the pattern splits text into independently encoded
// pieces, so tokenize(a + b) == tokenize(a) + tokenize(b) exactly where the pattern splits), merge
// ranks and unknown symbols on a tiny hand-built vocabulary, and bad-file error messages.
#include "megatron/core/tokenizers/gpt2_bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "megatron/core/common/error.h"
#include "tests/unit/test_util.h"

namespace {

using mg::tokenizers::GPT2BPETokenizer;
using Ids = std::vector<int32_t>;

const std::string kDir = std::string(MG_TEST_FIXTURES_DIR) + "/gpt2";

// One tokenizer for the whole file: loading 50k merges costs ~0.1 s.
const GPT2BPETokenizer& gpt2() {
  static const auto* tok =
      new GPT2BPETokenizer(kDir + "/gpt2-vocab.json", kDir + "/gpt2-merges.txt");
  return *tok;
}

struct Reference {
  std::string text;
  Ids ids;
};
const std::vector<Reference>& references() {
  static const auto* refs = [] {
    auto* out = new std::vector<Reference>();
    std::ifstream in(kDir + "/reference_encodings.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      out->push_back({j.at("text").get<std::string>(), j.at("ids").get<Ids>()});
    }
    return out;
  }();
  return *refs;
}

Ids concat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(GPT2BPETokenizer, MatchesEveryReferenceEncoding) {
  const auto& refs = references();
  ASSERT_EQ(refs.size(), 59u) << "fixture reference_encodings.jsonl not read completely";
  for (size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(gpt2().tokenize(refs[i].text), refs[i].ids)
        << "line " << i + 1 << ": " << refs[i].text.substr(0, 80);
  }
}

TEST(GPT2BPETokenizer, RoundTripsEveryReferenceText) {
  for (const auto& r : references()) {
    EXPECT_EQ(gpt2().detokenize(gpt2().tokenize(r.text)), r.text);
    EXPECT_EQ(gpt2().detokenize(r.ids), r.text);
  }
}

TEST(GPT2BPETokenizer, EodVocabSizeAndName) {
  EXPECT_EQ(gpt2().eod(), 50256);
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().num_merges(), 50000);
  EXPECT_EQ(gpt2().name(), "GPT2BPETokenizer");
  EXPECT_EQ(gpt2().detokenize(Ids{gpt2().eod()}), "<|endoftext|>");
  const mg::tokenizers::Tokenizer& base = gpt2();  // usable through the interface
  EXPECT_EQ(base.tokenize("Hello world"), (Ids{15496, 995}));
}

TEST(GPT2BPETokenizer, EndOfTextInTextIsOrdinaryText) {
  const auto& t = gpt2();
  const Ids ids = t.tokenize("a<|endoftext|>b");
  for (int32_t id : ids) EXPECT_NE(id, t.eod());
  EXPECT_EQ(ids, concat({t.tokenize("a"), t.tokenize("<|"), t.tokenize("endoftext"),
                         t.tokenize("|>"), t.tokenize("b")}));
  EXPECT_EQ(t.detokenize(ids), "a<|endoftext|>b");
}

TEST(GPT2BPETokenizer, EmptyAndWhitespaceOnly) {
  const auto& t = gpt2();
  EXPECT_TRUE(t.tokenize("").empty());
  EXPECT_EQ(t.detokenize(Ids{}), "");
  // GPT-2 has no multi-space tokens (the reference's "x" + 50 spaces + "y" gives 49 x 220).
  for (size_t n : {1, 2, 3, 7, 31}) {
    const std::string spaces(n, ' ');
    EXPECT_EQ(t.tokenize(spaces), Ids(n, 220)) << n << " spaces";
  }
  EXPECT_EQ(t.detokenize(t.tokenize(" \t\n \n\n\t ")), " \t\n \n\n\t ");
}

TEST(GPT2BPETokenizer, CarriageReturnNewlineSplitsAsThePatternSays) {
  const auto& t = gpt2();
  // "\r\n" before a letter: \s+(?!\S) takes "\r", \s+ then takes "\n"; at the end it is one piece.
  EXPECT_EQ(t.tokenize("a\r\nb\r\n"), concat({t.tokenize("a"), t.tokenize("\r"), t.tokenize("\n"),
                                              t.tokenize("b"), t.tokenize("\r\n")}));
  EXPECT_EQ(t.detokenize(t.tokenize("line1\r\nline2\r\n\r\n")), "line1\r\nline2\r\n\r\n");
}

TEST(GPT2BPETokenizer, UnicodeWhitespaceLettersAndMarks) {
  const auto& t = gpt2();
  // U+3000 (ideographic space) is \s only under PCRE2_UCP: " \u3000" must not be one punctuation
  // piece.
  EXPECT_EQ(t.tokenize("a \u3000b"),
            concat({t.tokenize("a"), t.tokenize(" "), t.tokenize("\u3000"), t.tokenize("b")}));
  // A combining acute (Mn) is neither \p{L} nor \p{N}: it ends the letter run.
  EXPECT_EQ(t.tokenize("cafe\u0301s"),
            concat({t.tokenize("cafe"), t.tokenize("\u0301"), t.tokenize("s")}));
  for (const char* s :
       {"\u6f22\u5b57\u304b\u306a\u30ab\u30ca \ud55c\uad6d\uc5b4", "e\u0301\u0300\u0323",
        "\U0001F600\U0001F469\u200D\U0001F52C \U0001F1EF\U0001F1F5"}) {
    EXPECT_EQ(t.detokenize(t.tokenize(s)), s);
  }
}

TEST(GPT2BPETokenizer, PartialUtf8TokensDecodeToRawBytes) {
  const auto& t = gpt2();
  const std::string emoji = "\U0001F600";  // 4 bytes, split over several byte-level tokens
  const Ids ids = t.tokenize(emoji);
  ASSERT_GT(ids.size(), 1u);
  std::string joined;
  for (int32_t id : ids) joined += t.detokenize(Ids{id});
  EXPECT_EQ(joined, emoji);
  EXPECT_EQ(t.detokenize(Ids{ids[0]}), emoji.substr(0, t.detokenize(Ids{ids[0]}).size()));
  EXPECT_LT(t.detokenize(Ids{ids[0]}).size(), emoji.size());
}

TEST(GPT2BPETokenizer, VeryLongWords) {
  const auto& t = gpt2();
  std::string letters;
  uint32_t state = 12345;
  for (int i = 0; i < 3001; ++i) {
    state = state * 1664525u + 1013904223u;
    letters.push_back(static_cast<char>('a' + (state >> 24) % 26));
  }
  for (const std::string& word : {std::string(4099, 'a'), letters, " " + letters}) {
    const Ids ids = t.tokenize(word);
    EXPECT_LT(ids.size(), word.size());
    for (int32_t id : ids) EXPECT_TRUE(id > 0 && id < t.vocab_size());
    EXPECT_EQ(t.detokenize(ids), word);
    EXPECT_EQ(t.tokenize(word), ids);  // cached result equals the first
  }
}

TEST(GPT2BPETokenizer, ConcurrentCallsAgreeWithSerial) {
  const auto& refs = references();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = static_cast<size_t>(w); i < refs.size(); i += 2) {
        if (gpt2().tokenize(refs[i].text) != refs[i].ids) ++mismatches[static_cast<size_t>(w)];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(GPT2BPETokenizer, InvalidInputsThrow) {
  const auto& t = gpt2();
  const std::string msg =
      mg::test::error_message([&] { t.tokenize(std::string("ok \xff\xfe", 5)); });
  EXPECT_CONTAINS(msg, "not valid UTF-8 at byte 3");
  EXPECT_CONTAINS(mg::test::error_message([&] {
                    t.detokenize(Ids{15496, 50257});
                  }),
                  "id 50257 at position 1");
  EXPECT_CONTAINS(mg::test::error_message([&] { t.detokenize(Ids{-1}); }), "id -1");
}

TEST(GPT2BPETokenizer, ByteToUnicodeTable) {
  using mg::tokenizers::gpt2_byte_to_unicode;
  EXPECT_EQ(gpt2_byte_to_unicode('!'), static_cast<uint32_t>('!'));
  EXPECT_EQ(gpt2_byte_to_unicode(0xFF), 0xFFu);
  EXPECT_EQ(gpt2_byte_to_unicode(0), 256u);
  EXPECT_EQ(gpt2_byte_to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(gpt2_byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(gpt2_byte_to_unicode(0xAD), 323u);    // soft hyphen: the last of the 68 remapped
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) seen.insert(gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
  EXPECT_EQ(seen.size(), 256u);
}

// ---- Tiny hand-built vocabularies (temporary files) -----------------------------------------

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

class TinyVocab : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() /
        ("mg_gpt2_tok_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // The 256 byte tokens with id = byte, then merge results, then <|endoftext|>.
    for (int b = 0; b < 256; ++b) vocab_[utf8(mg::tokenizers::gpt2_byte_to_unicode(b))] = b;
    vocab_["el"] = 256;
    vocab_["he"] = 257;
    vocab_["hel"] = 258;  // reachable only through "he" + "l", which "e l" (lower rank) pre-empts
    vocab_["<|endoftext|>"] = 259;
    vocab_["ab"] = 260;
    vocab_["aba"] = 261;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content) {
    const auto p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  std::string vocab_file() { return write("vocab.json", vocab_.dump()); }

  std::filesystem::path dir_;
  nlohmann::json vocab_;
};

TEST_F(TinyVocab, MergesApplyInRankOrderAndUnknownIsZero) {
  // "e l" ranks before "h e", so "hel" -> h + el -> hel; "l o" makes "lo", absent from the vocab.
  GPT2BPETokenizer t(vocab_file(), write("merges.txt", "#version: 0.2\ne l\r\nh e\n\nh el\nl o\n"));
  EXPECT_EQ(t.num_merges(), 4);
  EXPECT_EQ(t.vocab_size(), 262);
  EXPECT_EQ(t.eod(), 259);
  EXPECT_EQ(t.tokenize("hel"), (Ids{258}));
  EXPECT_EQ(t.tokenize("he"), (Ids{257}));
  EXPECT_EQ(t.tokenize("hex"), (Ids{257, 'x'}));
  EXPECT_EQ(t.tokenize("lo"), (Ids{0}));
  EXPECT_EQ(t.tokenize("a b"), (Ids{'a', ' ', 'b'}));  // no "Ġ b" merge: byte tokens
}

TEST_F(TinyVocab, RankOrderDecidesBetweenOverlappingPairs) {
  // With "h e" first, "hel" -> he + l, and no "he l" merge exists.
  GPT2BPETokenizer t(vocab_file(), write("merges.txt", "h e\ne l\nh el\n"));
  EXPECT_EQ(t.tokenize("hel"), (Ids{257, 'l'}));
  EXPECT_EQ(t.tokenize("hehe"), (Ids{257, 257}));
}

TEST_F(TinyVocab, OnePassMergesEveryOccurrenceBeforeLowerRanksItCreates) {
  // "ab a" ranks first but no (ab, a) pair exists until "a b" merges; the reference then merges
  // every "a b" in the same pass, so "abab" -> ab ab, never aba b.
  GPT2BPETokenizer t(vocab_file(), write("merges.txt", "ab a\na b\n"));
  EXPECT_EQ(t.tokenize("abab"), (Ids{260, 260}));
  EXPECT_EQ(t.tokenize("aba"), (Ids{261}));
}

TEST_F(TinyVocab, BadFilesNameTheFileAndLine) {
  const std::string good_merges = write("merges.txt", "#version: 0.2\ne l\n");
  const std::string missing = (dir_ / "nope.json").string();
  auto msg = mg::test::error_message([&] { GPT2BPETokenizer t(missing, good_merges); });
  EXPECT_CONTAINS(msg, "cannot open vocab file");
  EXPECT_CONTAINS(msg, missing);
  msg = mg::test::error_message([&] { GPT2BPETokenizer t(vocab_file(), missing); });
  EXPECT_CONTAINS(msg, "cannot open merges file");

  const std::string bad_json = write("bad.json", "{\"a\": 1, ");
  msg = mg::test::error_message([&] { GPT2BPETokenizer t(bad_json, good_merges); });
  EXPECT_CONTAINS(msg, "is not valid JSON");
  EXPECT_CONTAINS(msg, bad_json);
  msg = mg::test::error_message(
      [&] { GPT2BPETokenizer t(write("arr.json", "[1, 2]"), good_merges); });
  EXPECT_CONTAINS(msg, "must hold a JSON object");
  msg = mg::test::error_message(
      [&] { GPT2BPETokenizer t(write("str.json", "{\"a\": \"x\"}"), good_merges); });
  EXPECT_CONTAINS(msg, "token 'a' has id \"x\"");
  vocab_.erase("<|endoftext|>");
  msg = mg::test::error_message([&] { GPT2BPETokenizer t(vocab_file(), good_merges); });
  EXPECT_CONTAINS(msg, "no '<|endoftext|>' token");
  vocab_["<|endoftext|>"] = 259;

  msg = mg::test::error_message(
      [&] { GPT2BPETokenizer t(vocab_file(), write("m1.txt", "#version: 0.2\ne l\nq zz\n")); });
  EXPECT_CONTAINS(msg, "line 3: symbol 'zz' of merge 'q zz' is not in the vocab file");
  msg = mg::test::error_message(
      [&] { GPT2BPETokenizer t(vocab_file(), write("m2.txt", "#version: 0.2\ne l\nhel\n")); });
  EXPECT_CONTAINS(msg, "m2.txt' line 3: expected 'left right', got 'hel'");
  msg = mg::test::error_message(
      [&] { GPT2BPETokenizer t(vocab_file(), write("m3.txt", "e l x\n")); });
  EXPECT_CONTAINS(msg, "line 1: expected 'left right'");
}

}  // namespace
