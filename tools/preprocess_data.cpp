// preprocess_data: Megatron's tools/preprocess_data.py in C++. JSONL in, one indexed dataset
// (`<output-prefix>_<key>_document.{bin,idx}`, FORMATS.md section 1) per --json-keys key out.
//
//   preprocess_data --input in.jsonl[.gz|.zst] --output-prefix out --tokenizer-type ...
//                   --workers W [--json-keys text ...] [--append-eod] [--partitions P
//                   [--keep-sequential-samples]] [--log-interval N] [--skip-bad-lines]
//
// A malformed line (not JSON, not an object, a missing key) stops the run naming file:line; with
// --skip-bad-lines it is left out of every key's output, counted, and the first one reported.
//
// Pipeline (bounded memory, input order kept): one reader thread cuts the input into chunks of
// lines (at most kChunkLines lines or about kChunkBytes bytes), W worker threads parse and tokenize
// whole chunks, and the main thread writes finished chunks strictly in chunk order. At most
// 2W + 2 chunks are in flight (read but not yet written), so memory is a few MB per worker
// whatever the input size (plus the longest single line). Outputs appear only when complete:
// the builders stream to temporaries and finalize renames them into place.
//
// GPT2BPETokenizer: a literal "<|endoftext|>" in the text becomes the EOD token, as Megatron-LM's
// default tokenizer system does; --legacy-tokenizer encodes it as plain text (its legacy system).
//
// Per-document encoding as FORMATS.md 2.2: a key's value is one string (one sentence) or a list of
// strings (pre-split sentences); sentences with no tokens are dropped; --append-eod adds eod to
// the last sentence of a non-empty document; an empty document is a boundary with no sequence.
//
// Partitions (P > 1, FORMATS.md 2.3): --input is a glob; the matched files (sorted by name) are
// split line by line into P plain JSONL files round-robin (or in contiguous blocks of
// ceil(lines / P) with --keep-sequential-samples), each partition is encoded into
// `<output-prefix>_<i>_<key>_document`, and those are merged with add_index in partition order.
// As in Megatron the intermediate files are kept. Deviations from Megatron: the partition inputs
// are written as `<output-prefix>_<i>.jsonl` (Megatron writes `<input stem>_<i><ext>` next to the
// input, which may be read-only and which the same glob matches again); they are rewritten on every
// run (Megatron reuses existing ones); partitions run one after another with W workers each
// (Megatron: P processes of W/P workers; the output is the same); blank lines are skipped
// (Megatron fails on them); .gz and .zst are accepted with any partition count.
//
// Not supported yet: --split-sentences (needs a sentence splitter), tokenizers other than those of
// build_tokenizer.h, --find-optimal-num-workers, --max-documents.
#include <glob.h>
#include <zlib.h>
#include <zstd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/tokenizers/build_tokenizer.h"

namespace {

using mg::datasets::IndexedDatasetBuilder;
using mg::tokenizers::Tokenizer;

constexpr std::size_t kChunkLines = 256;
constexpr std::size_t kChunkBytes = 256 << 10;
constexpr std::size_t kReadBuffer = 1 << 20;

struct Args {
  std::string input;
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool split_sentences = false;
  bool append_eod = false;
  int workers = 0;
  int partitions = 1;
  bool keep_sequential_samples = false;
  int64_t log_interval = 1000;
  bool skip_bad_lines = false;  // count and report malformed lines instead of stopping
  bool allow_empty = false;     // --allow-empty: an input without tokens writes an empty dataset
  mg::tokenizers::TokenizerArgs tokenizer;

  void validate() const {
    MG_CHECK(!split_sentences,
             "--split-sentences is not supported yet: needs a sentence splitter (NLTK punkt); "
             "split the text beforehand and pass each key as a JSON list of sentences");
    MG_CHECK(workers >= 1, "--workers " << workers << " must be at least 1");
    MG_CHECK(partitions >= 1, "--partitions " << partitions << " must be at least 1");
    MG_CHECK(workers % partitions == 0, "--workers " << workers << " must be divisible by "
                                                     << "--partitions " << partitions);
    MG_CHECK(log_interval >= 1, "--log-interval " << log_interval << " must be at least 1");
    MG_CHECK(!json_keys.empty(), "--json-keys needs at least one key");
    for (std::size_t i = 0; i < json_keys.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        MG_CHECK(json_keys[i] != json_keys[j],
                 "--json-keys lists '" << json_keys[i] << "' twice (each key is one output)");
    tokenizer.validate();
  }
};

// ---- Input: plain, gzip or zstd bytes, cut into lines ------------------------------------------

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; returns 0 only at the end of the input. Throws on I/O or format errors.
  virtual std::size_t read(char* buf, std::size_t n) = 0;
};

class PlainSource final : public ByteSource {
 public:
  explicit PlainSource(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "rb")) {
    MG_CHECK(f_, "cannot open input '" << path << "'");
  }
  ~PlainSource() override { std::fclose(f_); }
  std::size_t read(char* buf, std::size_t n) override {
    const std::size_t got = std::fread(buf, 1, n, f_);
    MG_CHECK(got > 0 || !std::ferror(f_), "read error on input '" << path_ << "'");
    return got;
  }

 private:
  std::string path_;
  FILE* f_;
};

class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    MG_CHECK(f_, "cannot open gzip input '" << path << "'");
    gzbuffer(f_, 1 << 18);
  }
  ~GzipSource() override { gzclose(f_); }
  std::size_t read(char* buf, std::size_t n) override {
    const int got = gzread(f_, buf, static_cast<unsigned>(std::min<std::size_t>(n, 1 << 30)));
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f_, &err);
      MG_THROW("gzip input '" << path_ << "' is corrupt or truncated: " << msg);
    }
    return static_cast<std::size_t>(got);
  }

 private:
  std::string path_;
  gzFile f_;
};

class ZstdSource final : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path)
      : path_(path), file_(path), in_buf_(ZSTD_DStreamInSize()), dctx_(ZSTD_createDCtx()) {
    MG_CHECK(dctx_, "cannot create a zstd decompression context");
  }
  ~ZstdSource() override { ZSTD_freeDCtx(dctx_); }
  std::size_t read(char* buf, std::size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size) {
        in_ = {in_buf_.data(), file_.read(in_buf_.data(), in_buf_.size()), 0};
        if (in_.size == 0) {
          MG_CHECK(last_ret_ == 0, "zstd input '" << path_ << "' is truncated");
          return 0;
        }
      }
      last_ret_ = ZSTD_decompressStream(dctx_, &out, &in_);
      MG_CHECK(!ZSTD_isError(last_ret_),
               "zstd input '" << path_ << "' is corrupt: " << ZSTD_getErrorName(last_ret_));
    }
    return out.pos;
  }

 private:
  std::string path_;
  PlainSource file_;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  ZSTD_DCtx* dctx_;
  std::size_t last_ret_ = 0;
};

std::unique_ptr<ByteSource> open_source(const std::string& path) {
  if (path.ends_with(".gz")) return std::make_unique<GzipSource>(path);
  if (path.ends_with(".zst")) return std::make_unique<ZstdSource>(path);
  return std::make_unique<PlainSource>(path);
}

// Lines of a source without their '\n' (a final line without one is still a line).
class LineReader {
 public:
  explicit LineReader(const std::string& path) : src_(open_source(path)), buf_(kReadBuffer) {}
  bool next(std::string& line) {
    line.clear();
    for (;;) {
      if (pos_ == end_) {
        if (eof_) return !line.empty();
        end_ = src_->read(buf_.data(), buf_.size());
        pos_ = 0;
        if (end_ == 0) {
          eof_ = true;
          return !line.empty();
        }
      }
      const char* begin = buf_.data() + pos_;
      const char* nl = static_cast<const char*>(std::memchr(begin, '\n', end_ - pos_));
      if (nl) {
        line.append(begin, nl);
        pos_ += static_cast<std::size_t>(nl - begin) + 1;
        return true;
      }
      line.append(begin, end_ - pos_);
      pos_ = end_;
    }
  }

 private:
  std::unique_ptr<ByteSource> src_;
  std::vector<char> buf_;
  std::size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
};

bool is_blank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

// ---- Encoding ---------------------------------------------------------------------------------

struct Chunk {
  uint64_t seq = 0;
  std::vector<std::string> lines;
  std::vector<uint64_t> line_numbers;  // 1-based, in the input file
  std::size_t bytes = 0;
};

// One chunk's documents for one key: all tokens, every kept sentence's length, and per document
// how many sentences it kept (0 for an empty document).
struct KeyOutput {
  std::vector<int32_t> tokens;
  std::vector<int64_t> sentence_lengths;
  std::vector<uint32_t> doc_sentences;
};

struct EncodedChunk {
  std::vector<KeyOutput> keys;
  std::size_t bytes = 0;
  std::size_t docs = 0;
  std::size_t tokens = 0;
  std::size_t skipped = 0;  // bad lines left out under --skip-bad-lines
  std::string first_skip;   // the first one's message ("file:line: why")
  std::exception_ptr error;
};

// One line's output for every key, staged so that a bad line adds nothing to any key.
struct LineOutput {
  std::vector<KeyOutput> keys;
  std::size_t tokens = 0;
};

// Megatron-LM's default GPT-2 tokenizer (megatron.core.tokenizers, over HF's GPT2Tokenizer)
// splits a literal "<|endoftext|>" in the text out as the EOD token; its legacy one
// (--legacy-tokenizer) encodes those characters as plain text. `literal_eod` selects the first.
std::vector<int32_t> tokenize_text(const Tokenizer& tok, const std::string& s, bool literal_eod) {
  if (!literal_eod) return tok.tokenize(s);
  static const std::string kEod = "<|endoftext|>";
  std::vector<int32_t> out;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t f = s.find(kEod, pos);
    const std::string piece = s.substr(pos, f == std::string::npos ? std::string::npos : f - pos);
    if (!piece.empty()) {
      const std::vector<int32_t> ids = tok.tokenize(piece);
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (f == std::string::npos) break;
    out.push_back(static_cast<int32_t>(tok.eod()));
    pos = f + kEod.size();
  }
  return out;
}

// Parses and tokenizes line `l` of the chunk; throws mg::Error naming file and line when the line
// is malformed (not JSON, not an object, a missing key, a non-string value, a tokenizer error).
LineOutput encode_line(const Chunk& chunk, std::size_t l, const std::vector<std::string>& keys,
                       const Tokenizer& tok, bool append_eod, bool literal_eod,
                       const std::string& input) {
  LineOutput out;
  out.keys.resize(keys.size());
  {
    const uint64_t line_no = chunk.line_numbers[l];
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(chunk.lines[l]);
    } catch (const nlohmann::json::exception& e) {
      MG_THROW(input << ":" << line_no << ": not valid JSON: " << e.what());
    }
    MG_CHECK(doc.is_object(),
             input << ":" << line_no << ": expected a JSON object, got a " << doc.type_name());
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const auto it = doc.find(keys[k]);
      MG_CHECK(it != doc.end(),
               input << ":" << line_no << ": key '" << keys[k] << "' is missing (--json-keys)");
      std::vector<const std::string*> sentences;
      if (it->is_string()) {
        sentences.push_back(it->get_ptr<const std::string*>());
      } else {
        MG_CHECK(it->is_array(), input << ":" << line_no << ": key '" << keys[k]
                                       << "' must be a string or a list of strings, got a "
                                       << it->type_name());
        for (const auto& s : *it) {
          MG_CHECK(s.is_string(), input << ":" << line_no << ": key '" << keys[k]
                                        << "' holds a list with a " << s.type_name()
                                        << "; only strings are sentences");
          sentences.push_back(s.get_ptr<const std::string*>());
        }
      }
      KeyOutput& ko = out.keys[k];
      uint32_t kept = 0;
      for (const std::string* s : sentences) {
        std::vector<int32_t> ids;
        try {
          ids = tokenize_text(tok, *s, literal_eod);
        } catch (const mg::Error& e) {
          MG_THROW(input << ":" << line_no << ": key '" << keys[k] << "': " << e.message());
        }
        if (ids.empty()) continue;
        ko.tokens.insert(ko.tokens.end(), ids.begin(), ids.end());
        ko.sentence_lengths.push_back(static_cast<int64_t>(ids.size()));
        out.tokens += ids.size();
        ++kept;
      }
      if (append_eod && kept > 0) {
        ko.tokens.push_back(tok.eod());
        ++ko.sentence_lengths.back();
        ++out.tokens;
      }
      ko.doc_sentences.push_back(kept);
    }
  }
  return out;
}

EncodedChunk encode_chunk(const Chunk& chunk, const std::vector<std::string>& keys,
                          const Tokenizer& tok, bool append_eod, bool literal_eod,
                          bool skip_bad_lines, const std::string& input) {
  EncodedChunk out;
  out.keys.resize(keys.size());
  out.bytes = chunk.bytes;
  for (std::size_t l = 0; l < chunk.lines.size(); ++l) {
    LineOutput line;
    try {
      line = encode_line(chunk, l, keys, tok, append_eod, literal_eod, input);
    } catch (const mg::Error& e) {
      if (!skip_bad_lines) throw;
      if (out.skipped++ == 0) out.first_skip = e.message();
      continue;
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      KeyOutput& dst = out.keys[k];
      KeyOutput& src = line.keys[k];
      dst.tokens.insert(dst.tokens.end(), src.tokens.begin(), src.tokens.end());
      dst.sentence_lengths.insert(dst.sentence_lengths.end(), src.sentence_lengths.begin(),
                                  src.sentence_lengths.end());
      dst.doc_sentences.insert(dst.doc_sentences.end(), src.doc_sentences.begin(),
                               src.doc_sentences.end());
    }
    out.tokens += line.tokens;
    ++out.docs;
  }
  return out;
}

// Progress on stderr every --log-interval documents (Megatron prints docs and MB/s).
class Progress {
 public:
  explicit Progress(int64_t interval) : interval_(interval) {}
  void add(std::size_t docs, std::size_t bytes, std::size_t tokens) {
    const uint64_t before = docs_ / static_cast<uint64_t>(interval_);
    docs_ += docs;
    bytes_ += bytes;
    tokens_ += tokens;
    if (docs_ / static_cast<uint64_t>(interval_) != before) print("Processed");
  }
  uint64_t docs() const { return docs_; }
  uint64_t tokens() const { return tokens_; }
  void print(const char* what) const {
    const double s = std::max(1e-9, std::chrono::duration<double>(Clock::now() - start_).count());
    std::fprintf(stderr,
                 "%s %llu documents (%.1f docs/s, %.2f MB/s, %.0f tokens/s), %llu tokens, "
                 "elapsed %.2f s\n",
                 what, static_cast<unsigned long long>(docs_), docs_ / s, bytes_ / s / 1e6,
                 tokens_ / s, static_cast<unsigned long long>(tokens_), s);
  }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t interval_;
  Clock::time_point start_ = Clock::now();
  uint64_t docs_ = 0, bytes_ = 0, tokens_ = 0;
};

// Reader -> workers -> in-order writer (see the top of the file). All state under one mutex.
class Pipeline {
 public:
  // toks: one tokenizer per worker (GPT2BPETokenizer's piece cache is behind a mutex, so a shared
  // instance makes two workers slower than one).
  Pipeline(const Args& args, const std::vector<std::unique_ptr<Tokenizer>>& toks)
      : args_(args), toks_(toks) {}

  std::size_t skipped() const { return skipped_; }
  const std::string& first_skip() const { return first_skip_; }

  void run(const std::string& input, std::vector<std::unique_ptr<IndexedDatasetBuilder>>& builders,
           Progress& progress) {
    input_ = input;
    max_in_flight_ = 2 * static_cast<std::size_t>(args_.workers) + 2;
    std::vector<std::thread> threads;
    // Joins every thread on any exit; abort_ first so that blocked threads wake and leave.
    struct Joiner {
      Pipeline* p;
      std::vector<std::thread>* t;
      ~Joiner() {
        p->stop();
        for (auto& th : *t) th.join();
      }
    } joiner{this, &threads};
    threads.emplace_back([this] { reader(); });
    for (int w = 0; w < args_.workers; ++w)
      threads.emplace_back([this, w] { worker(*toks_[static_cast<std::size_t>(w)]); });

    for (uint64_t next = 0;; ++next) {
      EncodedChunk enc;
      {
        std::unique_lock lk(m_);
        result_cv_.wait(lk, [&] {
          return results_.count(next) || reader_error_ || (reader_done_ && next == total_chunks_);
        });
        if (results_.count(next)) {
          enc = std::move(results_[next]);
          results_.erase(next);
        } else if (reader_error_) {
          std::rethrow_exception(reader_error_);
        } else {
          return;
        }
      }
      if (enc.error) std::rethrow_exception(enc.error);
      for (std::size_t k = 0; k < builders.size(); ++k) write_key(enc.keys[k], *builders[k]);
      progress.add(enc.docs, enc.bytes, enc.tokens);
      if (enc.skipped > 0) {
        if (skipped_ == 0) first_skip_ = enc.first_skip;
        skipped_ += enc.skipped;
      }
      {
        std::lock_guard lk(m_);
        --in_flight_;
      }
      space_cv_.notify_one();
    }
  }

 private:
  static void write_key(const KeyOutput& ko, IndexedDatasetBuilder& b) {
    std::size_t tok = 0, sent = 0;
    for (const uint32_t n : ko.doc_sentences) {
      for (uint32_t s = 0; s < n; ++s, ++sent) {
        const auto len = static_cast<std::size_t>(ko.sentence_lengths[sent]);
        b.add_item(std::span<const int32_t>(ko.tokens.data() + tok, len));
        tok += len;
      }
      b.end_document();
    }
  }

  void stop() {
    {
      std::lock_guard lk(m_);
      abort_ = true;
    }
    work_cv_.notify_all();
    space_cv_.notify_all();
    result_cv_.notify_all();
  }

  // Returns false when the pipeline is aborting.
  bool push(Chunk&& c) {
    std::unique_lock lk(m_);
    space_cv_.wait(lk, [&] { return abort_ || in_flight_ < max_in_flight_; });
    if (abort_) return false;
    ++in_flight_;
    work_.push_back(std::move(c));
    work_cv_.notify_one();
    return true;
  }

  void reader() {
    try {
      LineReader lines(input_);
      Chunk chunk;
      uint64_t seq = 0, line_no = 0;
      std::string line;
      while (lines.next(line)) {
        ++line_no;
        if (is_blank(line)) continue;
        chunk.bytes += line.size() + 1;
        chunk.line_numbers.push_back(line_no);
        chunk.lines.push_back(std::move(line));
        if (chunk.lines.size() >= kChunkLines || chunk.bytes >= kChunkBytes) {
          chunk.seq = seq++;
          if (!push(std::move(chunk))) return;
          chunk = Chunk{};
        }
      }
      if (!chunk.lines.empty()) {
        chunk.seq = seq++;
        if (!push(std::move(chunk))) return;
      }
      std::lock_guard lk(m_);
      reader_done_ = true;
      total_chunks_ = seq;
    } catch (...) {
      std::lock_guard lk(m_);
      reader_error_ = std::current_exception();
    }
    work_cv_.notify_all();
    result_cv_.notify_all();
  }

  void worker(const Tokenizer& tok) {
    for (;;) {
      Chunk c;
      {
        std::unique_lock lk(m_);
        work_cv_.wait(lk,
                      [&] { return abort_ || !work_.empty() || reader_done_ || reader_error_; });
        if (abort_ || work_.empty()) return;
        c = std::move(work_.front());
        work_.pop_front();
      }
      EncodedChunk enc;
      try {
        enc = encode_chunk(c, args_.json_keys, tok, args_.append_eod,
                           args_.tokenizer.tokenizer_type == "GPT2BPETokenizer" &&
                               !args_.tokenizer.legacy_tokenizer,
                           args_.skip_bad_lines, input_);
      } catch (...) {
        enc = EncodedChunk{};
        enc.error = std::current_exception();
      }
      {
        std::lock_guard lk(m_);
        results_.emplace(c.seq, std::move(enc));
      }
      result_cv_.notify_one();
    }
  }

  const Args& args_;
  const std::vector<std::unique_ptr<Tokenizer>>& toks_;
  std::size_t skipped_ = 0;  // bad lines left out (--skip-bad-lines), in input order
  std::string first_skip_;
  std::string input_;
  std::size_t max_in_flight_ = 0;

  std::mutex m_;
  std::condition_variable work_cv_, space_cv_, result_cv_;
  std::deque<Chunk> work_;
  std::map<uint64_t, EncodedChunk> results_;
  std::size_t in_flight_ = 0;
  bool reader_done_ = false;
  bool abort_ = false;
  uint64_t total_chunks_ = 0;
  std::exception_ptr reader_error_;
};

std::string dataset_prefix(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

// An input without a single token is an error (nothing is written) unless --allow-empty.
void check_not_empty(const Args& args, const std::string& what, uint64_t tokens) {
  MG_CHECK(tokens > 0 || args.allow_empty,
           what << " holds no token to write: refusing to write an empty dataset to "
                << args.output_prefix
                << "_<key>_document.{bin,idx} (check --input and --json-keys; --allow-empty "
                   "writes it anyway)");
}

// Encodes one JSONL file into `<output_prefix>_<key>_document` for every key; returns the tokens
// written. check_empty: refuse an input without tokens (check_not_empty) before writing.
uint64_t encode_file(const Args& args, const std::vector<std::unique_ptr<Tokenizer>>& toks,
                     const std::string& input, const std::string& output_prefix, bool check_empty) {
  const Tokenizer& tok = *toks.front();
  std::fprintf(stderr, "Opening %s\n", input.c_str());
  const auto dtype = mg::datasets::optimal_token_dtype(tok.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& key : args.json_keys)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(
        mg::datasets::get_bin_path(dataset_prefix(output_prefix, key)), dtype));
  Progress progress(args.log_interval);
  Pipeline pipeline(args, toks);
  pipeline.run(input, builders, progress);
  if (check_empty)
    check_not_empty(args,
                    "--input '" + input + "' (" + std::to_string(progress.docs()) + " documents)",
                    progress.tokens());
  for (std::size_t k = 0; k < builders.size(); ++k)
    builders[k]->finalize(
        mg::datasets::get_idx_path(dataset_prefix(output_prefix, args.json_keys[k])));
  progress.print("Done:");
  if (pipeline.skipped() > 0)
    std::fprintf(stderr, "Skipped %zu bad line(s) (--skip-bad-lines); the first: %s\n",
                 pipeline.skipped(), pipeline.first_skip().c_str());
  return progress.tokens();
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  MG_CHECK(!files.empty(), "--input '" << pattern << "' matches no file");
  std::sort(files.begin(), files.end());
  return files;
}

// Splits every line of the glob's files into P partition files; returns their paths.
std::vector<std::string> split_partitions(const Args& args) {
  const std::vector<std::string> files = expand_glob(args.input);
  const auto p = static_cast<uint64_t>(args.partitions);
  uint64_t per_partition = 0;
  if (args.keep_sequential_samples) {
    uint64_t total = 0;
    std::string line;
    for (const auto& f : files)
      for (LineReader r(f); r.next(line);) ++total;
    per_partition = std::max<uint64_t>(1, (total + p - 1) / p);
  }
  std::vector<std::string> paths;
  std::vector<std::FILE*> outs;
  struct Closer {
    std::vector<std::FILE*>* o;
    ~Closer() {
      for (auto* f : *o) std::fclose(f);
    }
  } closer{&outs};
  for (uint64_t i = 0; i < p; ++i) {
    paths.push_back(args.output_prefix + "_" + std::to_string(i) + ".jsonl");
    outs.push_back(std::fopen(paths.back().c_str(), "wb"));
    MG_CHECK(outs.back(), "cannot create partition file '" << paths.back() << "'");
  }
  uint64_t count = 0;
  std::string line;
  for (const auto& f : files) {
    std::fprintf(stderr, "Splitting %s into %llu partitions\n", f.c_str(),
                 static_cast<unsigned long long>(p));
    for (LineReader r(f); r.next(line); ++count) {
      const uint64_t idx = args.keep_sequential_samples ? count / per_partition : count % p;
      std::FILE* out = outs[idx];
      MG_CHECK(std::fwrite(line.data(), 1, line.size(), out) == line.size() &&
                   std::fputc('\n', out) != EOF,
               "write error on partition file '" << paths[idx] << "'");
    }
  }
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const int rc = std::fclose(outs[i]);
    outs[i] = nullptr;
    MG_CHECK(rc == 0, "write error on partition file '" << paths[i] << "'");
  }
  outs.clear();
  return paths;
}

void run(const Args& args) {
  args.validate();
  // One tokenizer per worker, built concurrently (GPT-2: ~0.1 s each).
  std::vector<std::unique_ptr<Tokenizer>> toks(static_cast<std::size_t>(args.workers));
  toks[0] = mg::tokenizers::build_tokenizer(args.tokenizer);  // errors surface here, once
  {
    std::vector<std::thread> builders;
    std::vector<std::exception_ptr> errors(toks.size());
    for (std::size_t w = 1; w < toks.size(); ++w)
      builders.emplace_back([&, w] {
        try {
          toks[w] = mg::tokenizers::build_tokenizer(args.tokenizer);
        } catch (...) {
          errors[w] = std::current_exception();
        }
      });
    for (auto& t : builders) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  const Tokenizer* tok = toks[0].get();
  std::fprintf(stderr, "Tokenizer %s, vocab size %lld, eod %d, dtype %s\n", tok->name().c_str(),
               static_cast<long long>(tok->vocab_size()), tok->eod(),
               std::string(mg::datasets::index_dtype_name(
                               mg::datasets::optimal_token_dtype(tok->vocab_size())))
                   .c_str());
  if (args.partitions == 1) {
    encode_file(args, toks, args.input, args.output_prefix, true);
    return;
  }
  const std::vector<std::string> parts = split_partitions(args);
  uint64_t tokens = 0;
  for (std::size_t i = 0; i < parts.size(); ++i)
    tokens +=
        encode_file(args, toks, parts[i], args.output_prefix + "_" + std::to_string(i), false);
  check_not_empty(
      args, "--input '" + args.input + "' (all " + std::to_string(parts.size()) + " partitions)",
      tokens);
  const auto dtype = mg::datasets::optimal_token_dtype(tok->vocab_size());
  for (const auto& key : args.json_keys) {
    const std::string out = dataset_prefix(args.output_prefix, key);
    IndexedDatasetBuilder builder(mg::datasets::get_bin_path(out), dtype);
    for (std::size_t i = 0; i < parts.size(); ++i)
      builder.add_index(dataset_prefix(args.output_prefix + "_" + std::to_string(i), key));
    builder.finalize(mg::datasets::get_idx_path(out));
    std::fprintf(stderr, "Merged %zu partitions into %s\n", parts.size(), out.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenize JSONL into Megatron indexed datasets (tools/preprocess_data.py)"};
  Args args;
  std::optional<int64_t> vocab_size;
  app.add_option("--input", args.input,
                 "JSONL file (.gz/.zst by extension); a glob when "
                 "--partitions > 1")
      ->required();
  app.add_option("--output-prefix", args.output_prefix, "Writes <prefix>_<key>_document.{bin,idx}")
      ->required();
  app.add_option("--json-keys", args.json_keys, "Keys to extract from each JSON line")
      ->capture_default_str();
  app.add_flag("--split-sentences", args.split_sentences, "Split documents into sentences");
  app.add_flag("--append-eod", args.append_eod, "Append an eod token to each non-empty document");
  app.add_option("--workers", args.workers, "Tokenizer threads")->required();
  app.add_option("--partitions", args.partitions, "Split the input into this many partitions")
      ->capture_default_str();
  app.add_flag("--keep-sequential-samples", args.keep_sequential_samples,
               "Partition in contiguous blocks instead of round-robin");
  app.add_option("--log-interval", args.log_interval, "Documents between progress lines")
      ->capture_default_str();
  app.add_flag("--skip-bad-lines", args.skip_bad_lines,
               "Leave out malformed JSON lines and lines missing a key (counted and reported) "
               "instead of stopping at the first one");
  app.add_flag("--allow-empty", args.allow_empty,
               "Write an empty dataset when the input holds no token (default: an error)");
  app.add_option("--tokenizer-type", args.tokenizer.tokenizer_type,
                 "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, "
                 "GPTSentencePieceTokenizer, Llama2Tokenizer or NullTokenizer")
      ->required();
  app.add_option("--tokenizer-model", args.tokenizer.tokenizer_model,
                 "HF tokenizer.json (or its directory), or SentencePiece .model");
  bool hf_no_special = false;
  app.add_flag("--tokenizer-hf-no-include-special-tokens", hf_no_special,
               "HuggingFaceTokenizer: do not add the post-processor's special tokens (BOS)");
  app.add_option("--vocab-file", args.tokenizer.vocab_file, "Vocabulary (GPT-2: vocab.json)");
  app.add_option("--merge-file", args.tokenizer.merge_file, "BPE merges (GPT-2: merges.txt)");
  app.add_option("--vocab-size", vocab_size, "NullTokenizer vocabulary size (eod = this)");
  app.add_flag("--legacy-tokenizer", args.tokenizer.legacy_tokenizer,
               "Megatron-LM's legacy tokenizer system: GPT2BPETokenizer encodes a literal "
               "<|endoftext|> as text (default: as the EOD token, like Megatron-LM's default)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  args.tokenizer.vocab_size = vocab_size;
  args.tokenizer.tokenizer_hf_include_special_tokens = !hf_no_special;
  try {
    run(args);
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "preprocess_data: error: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preprocess_data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
