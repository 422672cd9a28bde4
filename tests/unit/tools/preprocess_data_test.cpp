// preprocess_data end to end: runs the built binary (MG_BIN_DIR) on small JSONL files written here
// and decodes the outputs with IndexedDataset. The expected ids come from GPT2BPETokenizer (or the
// integers themselves for NullTokenizer; HuggingFaceTokenizer and SentencePieceTokenizer on the
// tests/fixtures/hf_tokenizers files) applied to each text in input order, with eod appended to
// non-empty documents under --append-eod; empty documents are boundaries without a sequence
// (FORMATS.md 2.2). Also: --workers 1 and 2 give byte-identical files, .gz and .zst inputs equal
// plain ones, partitions merge in round-robin / sequential-block order (FORMATS.md 2.3), and bad
// input or flags fail with one `preprocess_data: error:` line and exit status 1.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/core/tokenizers/huggingface_tokenizer.h"
#include "megatron/core/tokenizers/sentencepiece_tokenizer.h"
#include "tests/unit/test_util.h"

namespace {

namespace fs = std::filesystem;

mg::test::CommandResult run(const std::string& cmd) {
  return mg::test::run_command(cmd);
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Escapes a string as a JSON string literal (the texts here have quotes, newlines and unicode).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

const std::string kGpt2 = std::string(MG_TEST_FIXTURES_DIR) + "/gpt2/";
const std::string kGpt2Flags = " --tokenizer-type GPT2BPETokenizer --vocab-file " + kGpt2 +
                               "gpt2-vocab.json --merge-file " + kGpt2 + "gpt2-merges.txt";

class PreprocessData : public ::testing::Test {
 protected:
  void SetUp() override {
    binary_ = std::string(MG_BIN_DIR) + "/preprocess_data";
    ASSERT_TRUE(fs::exists(binary_)) << binary_ << " is not built (cmake --build ... --target "
                                     << "preprocess_data)";
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("mg_preprocess_test_" + std::to_string(rd()));
    fs::create_directories(dir_);
    // Documents: plain, unicode, empty text, quotes and newlines; a second key "title".
    texts_ = {"Hello world",
              "Ünïcødé: 日本語のテキスト, emoji 🙂 and café.",
              "",
              "She said \"it's done\".\n\nNew paragraph   with  spaces.",
              "Numbers 12345 and symbols #$%^&*()",
              "a",
              "The last document, ending without a newline"};
    for (std::size_t i = 0; i < texts_.size(); ++i) titles_.push_back("Title " + std::to_string(i));
    titles_[5] = "";
    // Repeat so that the input spans several chunks and workers (documents stay distinct).
    for (int rep = 1; rep < 120; ++rep)
      for (std::size_t i = 0; i < 7; ++i) {
        texts_.push_back(texts_[i] + (texts_[i].empty() ? "" : " #" + std::to_string(rep)));
        titles_.push_back(titles_[i]);
      }
    std::ofstream f(dir_ / "in.jsonl", std::ios::binary);
    for (std::size_t i = 0; i < texts_.size(); ++i)
      f << "{\"title\": " << json_string(titles_[i]) << ", \"text\": " << json_string(texts_[i])
        << ", \"id\": " << i << "}\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  mg::test::CommandResult preprocess(const std::string& flags) const {
    return run(binary_ + " --log-interval 100000 " + flags);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Expected documents (ids per document, input order) for `texts`.
  static std::vector<std::vector<int64_t>> expected(const std::vector<std::string>& texts,
                                                    bool append_eod) {
    static const mg::tokenizers::GPT2BPETokenizer tok(kGpt2 + "gpt2-vocab.json",
                                                      kGpt2 + "gpt2-merges.txt");
    std::vector<std::vector<int64_t>> docs;
    for (const auto& t : texts) {
      const auto ids = tok.tokenize(t);
      std::vector<int64_t> d(ids.begin(), ids.end());
      if (append_eod && !d.empty()) d.push_back(tok.eod());
      docs.push_back(d);
    }
    return docs;
  }

  // Decodes a dataset: one entry per document (empty for a document without sequences). Checks
  // that every document has at most one sequence (no sentence splitting) and no empty sequence.
  static std::vector<std::vector<int64_t>> decode(const std::string& prefix) {
    mg::datasets::IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), mg::datasets::IndexDType::uint16);
    std::vector<std::vector<int64_t>> docs;
    const auto& di = ds.document_indices();
    for (std::size_t d = 0; d + 1 < di.size(); ++d) {
      EXPECT_LE(di[d + 1] - di[d], 1) << "document " << d;
      std::vector<int64_t> doc;
      for (auto s = di[d]; s < di[d + 1]; ++s) {
        const auto seq = ds.get(static_cast<std::size_t>(s));
        EXPECT_FALSE(seq.empty()) << "sequence " << s;
        doc.insert(doc.end(), seq.begin(), seq.end());
      }
      docs.push_back(doc);
    }
    return docs;
  }

  std::string binary_;
  fs::path dir_;
  std::vector<std::string> texts_, titles_;
};

// Megatron-LM's default GPT-2 tokenizer turns a literal <|endoftext|> into the EOD token (id
// 50256); --legacy-tokenizer encodes the characters as text, as Megatron's legacy system does.
TEST_F(PreprocessData, LiteralEndOfTextIsEodUnlessLegacy) {
  {
    std::ofstream f(dir_ / "eot.jsonl", std::ios::binary);
    f << "{\"text\": \"first doc<|endoftext|>second doc <|endoftext|><|endoftext|>\"}\n";
  }
  static const mg::tokenizers::GPT2BPETokenizer tok(kGpt2 + "gpt2-vocab.json",
                                                    kGpt2 + "gpt2-merges.txt");
  ASSERT_EQ(tok.eod(), 50256);
  auto r = preprocess("--input " + path("eot.jsonl") + " --output-prefix " + path("eot") +
                      kGpt2Flags + " --workers 1");
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<int64_t> want;
  for (const char* piece : {"first doc", "second doc "}) {
    for (int32_t id : tok.tokenize(piece)) want.push_back(id);
    want.push_back(50256);
  }
  want.push_back(50256);
  EXPECT_EQ(decode(path("eot_text_document")), std::vector<std::vector<int64_t>>{want});
  r = preprocess("--input " + path("eot.jsonl") + " --output-prefix " + path("legacy") +
                 kGpt2Flags + " --workers 1 --legacy-tokenizer");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto legacy = tok.tokenize("first doc<|endoftext|>second doc <|endoftext|><|endoftext|>");
  EXPECT_EQ(decode(path("legacy_text_document")),
            (std::vector<std::vector<int64_t>>{{legacy.begin(), legacy.end()}}));
  EXPECT_EQ(std::count(legacy.begin(), legacy.end(), 50256), 0);  // plain text, not EOD
}

TEST_F(PreprocessData, Gpt2TwoKeysInInputOrderAndWorkerCountDoesNotMatter) {
  const std::string in = " --input " + path("in.jsonl") + " --json-keys text title" + kGpt2Flags;
  auto r1 = preprocess(in + " --append-eod --workers 1 --output-prefix " + path("w1"));
  ASSERT_EQ(r1.status, 0) << r1.output;
  auto r2 = preprocess(in + " --append-eod --workers 2 --output-prefix " + path("w2"));
  ASSERT_EQ(r2.status, 0) << r2.output;

  EXPECT_EQ(decode(path("w1_text_document")), expected(texts_, true));
  EXPECT_EQ(decode(path("w1_title_document")), expected(titles_, true));
  for (const char* f :
       {"_text_document.bin", "_text_document.idx", "_title_document.bin", "_title_document.idx"})
    EXPECT_EQ(read_file(path(std::string("w1") + f)), read_file(path(std::string("w2") + f))) << f;

  // Without --append-eod: the tokens alone; the empty text is still a document.
  auto r3 = preprocess(in + " --workers 2 --output-prefix " + path("noeod"));
  ASSERT_EQ(r3.status, 0) << r3.output;
  const auto docs = decode(path("noeod_text_document"));
  EXPECT_EQ(docs, expected(texts_, false));
  EXPECT_EQ(docs.size(), texts_.size());
  EXPECT_TRUE(docs[2].empty());
}

TEST_F(PreprocessData, CompressedInputsEqualPlain) {
  const std::string flags = kGpt2Flags + " --append-eod --workers 2";
  ASSERT_EQ(
      preprocess(" --input " + path("in.jsonl") + flags + " --output-prefix " + path("p")).status,
      0);
  ASSERT_EQ(run("gzip -c " + path("in.jsonl") + " > " + path("in.jsonl.gz")).status, 0);
  auto rg = preprocess(" --input " + path("in.jsonl.gz") + flags + " --output-prefix " + path("g"));
  ASSERT_EQ(rg.status, 0) << rg.output;
  EXPECT_EQ(read_file(path("p_text_document.bin")), read_file(path("g_text_document.bin")));
  EXPECT_EQ(read_file(path("p_text_document.idx")), read_file(path("g_text_document.idx")));
  // zstd is installed by scripts/install_deps.sh.
  ASSERT_EQ(run("zstd -q -c " + path("in.jsonl") + " > " + path("in.jsonl.zst")).status, 0);
  auto rz =
      preprocess(" --input " + path("in.jsonl.zst") + flags + " --output-prefix " + path("z"));
  ASSERT_EQ(rz.status, 0) << rz.output;
  EXPECT_EQ(read_file(path("p_text_document.bin")), read_file(path("z_text_document.bin")));
  EXPECT_EQ(read_file(path("p_text_document.idx")), read_file(path("z_text_document.idx")));
  // A truncated .gz fails cleanly and leaves no output.
  const std::string gz = read_file(path("in.jsonl.gz"));
  std::ofstream(path("cut.jsonl.gz"), std::ios::binary) << gz.substr(0, gz.size() / 2);
  auto rc =
      preprocess(" --input " + path("cut.jsonl.gz") + flags + " --output-prefix " + path("cut"));
  EXPECT_EQ(rc.status, 1) << rc.output;
  EXPECT_NE(rc.output.find("preprocess_data: error:"), std::string::npos) << rc.output;
  EXPECT_FALSE(fs::exists(path("cut_text_document.idx")));
  EXPECT_FALSE(fs::exists(path("cut_text_document.bin")));
}

TEST_F(PreprocessData, PartitionsRoundRobinAndSequential) {
  // Two input files matched by a glob (sorted by name): the first 400 documents, then the rest.
  {
    std::ifstream all(path("in.jsonl"));
    std::ofstream a(path("part_a.jsonl")), b(path("part_b.jsonl"));
    std::string line;
    for (int i = 0; std::getline(all, line); ++i) (i < 400 ? a : b) << line << "\n";
  }
  const std::size_t n = texts_.size();
  const std::string flags =
      " --input '" + path("part_*.jsonl") + "'" + kGpt2Flags + " --append-eod";

  auto rr = preprocess(flags + " --partitions 2 --workers 2 --output-prefix " + path("rr"));
  ASSERT_EQ(rr.status, 0) << rr.output;
  // Round-robin: partition 0 holds lines 0, 2, 4, ..., partition 1 lines 1, 3, ...
  std::vector<std::string> order;
  for (std::size_t i = 0; i < n; i += 2) order.push_back(texts_[i]);
  for (std::size_t i = 1; i < n; i += 2) order.push_back(texts_[i]);
  EXPECT_EQ(decode(path("rr_text_document")), expected(order, true));
  // The per-partition datasets are kept, as Megatron keeps them.
  EXPECT_TRUE(mg::datasets::IndexedDataset::exists(path("rr_0_text_document")));
  EXPECT_TRUE(mg::datasets::IndexedDataset::exists(path("rr_1_text_document")));

  // Sequential blocks of ceil(n / 2) lines: the merged order is the input order.
  auto rs = preprocess(flags +
                       " --partitions 2 --workers 4 --keep-sequential-samples "
                       "--output-prefix " +
                       path("seq"));
  ASSERT_EQ(rs.status, 0) << rs.output;
  EXPECT_EQ(decode(path("seq_text_document")), expected(texts_, true));
  mg::datasets::IndexedDataset p0(path("seq_0_text_document"));
  EXPECT_EQ(p0.document_count(), (n + 1) / 2);

  auto bad = preprocess(flags + " --partitions 3 --workers 2 --output-prefix " + path("bad"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("must be divisible by --partitions 3"), std::string::npos)
      << bad.output;
}

TEST_F(PreprocessData, NullTokenizer) {
  std::ofstream(path("ids.jsonl")) << "{\"text\": \"1 2 3\"}\n{\"text\": \"\"}\n"
                                      "{\"text\": \"  70000 0\\n5 \"}\n";
  auto r = run(binary_ + " --input " + path("ids.jsonl") +
               " --tokenizer-type NullTokenizer --vocab-size 70000 --append-eod --workers 2 "
               "--output-prefix " +
               path("null"));
  ASSERT_EQ(r.status, 0) << r.output;
  mg::datasets::IndexedDataset ds(path("null_text_document"));
  // vocab_size() = 70001 >= 65500, so int32; eod = 70000.
  EXPECT_EQ(ds.dtype(), mg::datasets::IndexDType::int32);
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(ds.get(0), (std::vector<int64_t>{1, 2, 3, 70000}));
  EXPECT_EQ(ds.get(1), (std::vector<int64_t>{70000, 0, 5, 70000}));

  std::ofstream(path("bad_ids.jsonl")) << "{\"text\": \"1 2\"}\n{\"text\": \"1 x2\"}\n";
  auto bad = run(binary_ + " --input " + path("bad_ids.jsonl") +
                 " --tokenizer-type NullTokenizer --vocab-size 10 --workers 1 --output-prefix " +
                 path("bad"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("bad_ids.jsonl:2: key 'text': NullTokenizer: 'x2'"), std::string::npos)
      << bad.output;
}

// HuggingFaceTokenizer (Llama-3-style tokenizer.json: BOS prepended by its post-processor; a
// Unigram and a WordPiece tokenizer.json directory) and SentencePieceTokenizer: the datasets hold
// what the tokenizer classes give, plus eod.
TEST_F(PreprocessData, HuggingFaceAndSentencePieceTokenizers) {
  const std::string fx = std::string(MG_TEST_FIXTURES_DIR) + "/hf_tokenizers/";
  const mg::tokenizers::HuggingFaceTokenizer hf(fx + "llama3_bytelevel/tokenizer.json");
  const mg::tokenizers::SentencePieceTokenizer sp(fx + "spm_unigram.model", "Llama2Tokenizer");
  const mg::tokenizers::HuggingFaceTokenizer unigram(fx + "unigram_byte_fallback");
  const mg::tokenizers::HuggingFaceTokenizer wordpiece(fx + "bert_wordpiece");
  struct Case {
    std::string flags, prefix;
    const mg::tokenizers::Tokenizer* tok;
  };
  const std::vector<Case> cases = {
      {" --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + fx +
           "llama3_bytelevel/tokenizer.json",
       "hf", &hf},
      {" --tokenizer-type Llama2Tokenizer --tokenizer-model " + fx + "spm_unigram.model", "sp",
       &sp},
      // tokenizer.json directories (tokenizer_config.json beside it): Unigram, WordPiece.
      {" --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + fx + "unigram_byte_fallback",
       "unigram", &unigram},
      {" --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + fx + "bert_wordpiece",
       "wordpiece", &wordpiece},
  };
  for (const auto& c : cases) {
    auto r = preprocess("--input " + path("in.jsonl") + " --append-eod --workers 2" + c.flags +
                        " --output-prefix " + path(c.prefix));
    ASSERT_EQ(r.status, 0) << r.output;
    std::vector<std::vector<int64_t>> want;
    for (const auto& t : texts_) {
      const auto ids = c.tok->tokenize(t);
      std::vector<int64_t> d(ids.begin(), ids.end());
      if (!d.empty()) d.push_back(c.tok->eod());
      want.push_back(d);
    }
    EXPECT_EQ(decode(path(c.prefix + "_text_document")), want) << c.flags;
  }
  // Every document of the Llama-3-style tokenizer starts with <|begin_of_text|>, even an empty
  // text (as tokenizer("").input_ids); the SentencePiece one adds nothing to an empty text.
  EXPECT_EQ(hf.tokenize(""), std::vector<int32_t>{hf.token_to_id("<|begin_of_text|>")});
  EXPECT_TRUE(sp.tokenize("").empty());
}

TEST_F(PreprocessData, ErrorsAreOneClearLine) {
  const std::string in = " --input " + path("in.jsonl") + " --output-prefix " + path("e");
  auto expect_error = [&](const std::string& flags, const std::string& needle) {
    auto r = run(binary_ + flags);
    EXPECT_EQ(r.status, 1) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find("preprocess_data: error: " + needle), std::string::npos)
        << flags << "\n"
        << r.output;
    EXPECT_FALSE(fs::exists(path("e_text_document.idx")));
  };
  // A key missing on line 3 (the others have it).
  std::ofstream(path("missing.jsonl")) << "{\"text\": \"a\", \"k\": \"b\"}\n{\"text\": \"a\", "
                                          "\"k\": \"b\"}\n{\"text\": \"c\"}\n";
  expect_error(" --input " + path("missing.jsonl") + " --output-prefix " + path("e") +
                   " --json-keys text k --workers 2" + kGpt2Flags,
               path("missing.jsonl") + ":3: key 'k' is missing");
  std::ofstream(path("broken.jsonl")) << "{\"text\": \"a\"}\n{\"text\": \n";
  expect_error(" --input " + path("broken.jsonl") + " --output-prefix " + path("e") +
                   " --workers 1" + kGpt2Flags,
               path("broken.jsonl") + ":2: not valid JSON");
  expect_error(in + " --workers 1 --tokenizer-type GPT2BPETokenizer --vocab-file " + kGpt2 +
                   "gpt2-vocab.json",
               "build_tokenizer: --tokenizer-type GPT2BPETokenizer needs --merge-file");
  expect_error(in + " --workers 1 --tokenizer-type NullTokenizer",
               "build_tokenizer: --tokenizer-type NullTokenizer needs --vocab-size");
  expect_error(in + " --workers 1 --tokenizer-type TikTokenizer",
               "build_tokenizer: --tokenizer-type 'TikTokenizer' is not supported");
  expect_error(in + " --workers 1 --tokenizer-type HuggingFaceTokenizer",
               "build_tokenizer: --tokenizer-type HuggingFaceTokenizer needs --tokenizer-model");
  expect_error(in + " --workers 1 --tokenizer-type SentencePieceTokenizer --tokenizer-model " +
                   path("in.jsonl"),
               "SentencePieceTokenizer: cannot load SentencePiece model");
  expect_error(in + " --workers 1 --tokenizer-type GPT2BPETokenizer --vocab-file /nonexistent "
                    "--merge-file /nonexistent",
               "");
  expect_error(in + " --workers 1 --split-sentences" + kGpt2Flags,
               "--split-sentences is not supported yet: needs a sentence splitter");
  expect_error(" --input " + path("absent.jsonl") + " --output-prefix " + path("e") +
                   " --workers 1" + kGpt2Flags,
               "cannot open input");
}

}  // namespace

// --skip-bad-lines: a line with a missing key and a broken JSON line are counted, reported with
// the first one's file:line, and leave nothing in any key's output: the result equals the same
// input without those lines.
TEST_F(PreprocessData, SkipBadLinesCountsReportsAndLeavesThemOut) {
  std::ofstream(path("bad.jsonl")) << "{\"text\": \"first good\", \"k\": \"one\"}\n"
                                      "{\"text\": \"only text, no k\"}\n"
                                      "{\"text\": \"broken\n"
                                      "{\"text\": \"second good\", \"k\": \"two\"}\n";
  std::ofstream(path("good.jsonl")) << "{\"text\": \"first good\", \"k\": \"one\"}\n"
                                       "{\"text\": \"second good\", \"k\": \"two\"}\n";
  const std::string common = " --json-keys text k --append-eod" + kGpt2Flags;
  auto r = run(binary_ + " --input " + path("bad.jsonl") + " --output-prefix " + path("s") +
               " --workers 2 --skip-bad-lines" + common);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Skipped 2 bad line(s) (--skip-bad-lines); the first: " +
                          path("bad.jsonl") + ":2: key 'k' is missing"),
            std::string::npos)
      << r.output;
  auto g = run(binary_ + " --input " + path("good.jsonl") + " --output-prefix " + path("g") +
               " --workers 1" + common);
  ASSERT_EQ(g.status, 0) << g.output;
  EXPECT_EQ(g.output.find("Skipped"), std::string::npos) << g.output;
  for (const char* key : {"text", "k"})
    for (const char* ext : {".bin", ".idx"}) {
      const std::string f = std::string("_") + key + "_document" + ext;
      EXPECT_EQ(read_file(path("s" + f)), read_file(path("g" + f))) << f;
    }
  // Without the flag the same input stops at line 2.
  auto e = run(binary_ + " --input " + path("bad.jsonl") + " --output-prefix " + path("e") +
               " --workers 2" + common);
  EXPECT_EQ(e.status, 1) << e.output;
  EXPECT_NE(e.output.find(path("bad.jsonl") + ":2: key 'k' is missing"), std::string::npos)
      << e.output;
}
