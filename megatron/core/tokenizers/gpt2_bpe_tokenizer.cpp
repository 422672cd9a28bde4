// GPT2BPETokenizer implementation: file parsing, the PCRE2 pre-tokenizer and the BPE merge loop.
// The merge loop is the reference algorithm (lowest-rank pair, merge all its occurrences in one
// left-to-right pass, repeat), on interned symbol ids instead of strings. It is quadratic in the
// length of one pre-token piece, as the reference is; pieces are words, and results are cached.
// A priority queue would be faster on huge pieces but must defer pairs created during a pass to
// the next pass to stay exact, so it is not worth the risk here.
#include "megatron/core/tokenizers/gpt2_bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::tokenizers {

namespace {

// The legacy GPT-2 pre-tokenizer pattern (gpt2_tokenization.py / OpenAI encoder.py).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kEndOfText = "<|endoftext|>";

// bytes_to_unicode(): printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves, the
// remaining 68 bytes, in increasing order, to 256, 257, ...
struct ByteMap {
  uint32_t to_cp[256];
  int16_t from_cp[256 + 68];
  ByteMap() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    for (auto& v : from_cp) v = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = printable(b) ? static_cast<uint32_t>(b) : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

void append_utf8(uint32_t cp, std::string& out) {
  // Only code points below 0x800 occur in the byte map.
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Byte-level string (UTF-8 of byte-map code points) -> raw bytes; false if it holds anything else.
bool byte_level_to_bytes(const std::string& token, std::string& out) {
  const auto& m = byte_map();
  out.clear();
  for (size_t i = 0; i < token.size();) {
    const auto c0 = static_cast<uint8_t>(token[i]);
    uint32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size() &&
               (static_cast<uint8_t>(token[i + 1]) & 0xC0) == 0x80) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<uint8_t>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp >= std::size(m.from_cp) || m.from_cp[cp] < 0) return false;
    out.push_back(static_cast<char>(m.from_cp[cp]));
  }
  return true;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  MG_CHECK(in.good(), "GPT2BPETokenizer: cannot open " << what << " '" << path << "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  MG_CHECK(!in.bad(), "GPT2BPETokenizer: error reading " << what << " '" << path << "'");
  return ss.str();
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
};

}  // namespace

namespace detail {
struct Pcre2Regex {
  pcre2_code* code = nullptr;
  Pcre2Regex() {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    MG_CHECK(code != nullptr, "GPT2BPETokenizer: pcre2_compile failed at offset "
                                  << err_off << ": " << pcre2_message(err));
    // JIT is an optimisation only: without it (unsupported platform) pcre2_match interprets.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~Pcre2Regex() { pcre2_code_free(code); }
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;
};
}  // namespace detail

uint32_t gpt2_byte_to_unicode(uint8_t b) {
  return byte_map().to_cp[b];
}

int32_t GPT2BPETokenizer::intern(const std::string& s) {
  auto [it, inserted] = symbol_ids_.try_emplace(s, static_cast<int32_t>(symbol_vocab_id_.size()));
  if (inserted) symbol_vocab_id_.push_back(0);  // unknown to the vocab until proven otherwise
  return it->second;
}

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merges_file)
    : regex_(std::make_unique<detail::Pcre2Regex>()) {
  // ---- vocab.json: {"token": id, ...}
  nlohmann::json vocab;
  {
    const std::string text = read_file(vocab_file, "vocab file");
    try {
      vocab = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      MG_THROW("GPT2BPETokenizer: vocab file '" << vocab_file
                                                << "' is not valid JSON: " << e.what());
    }
  }
  MG_CHECK(vocab.is_object(), "GPT2BPETokenizer: vocab file '"
                                  << vocab_file << "' must hold a JSON object {token: id}, got a "
                                  << vocab.type_name());
  MG_CHECK(!vocab.empty(), "GPT2BPETokenizer: vocab file '" << vocab_file << "' is empty");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    MG_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX,
             "GPT2BPETokenizer: vocab file '" << vocab_file << "': token '" << token << "' has id "
                                              << id.dump()
                                              << ", expected an integer in [0, 2^31-1)");
    max_id = std::max(max_id, id.get<int64_t>());
  }
  vocab_size_ = static_cast<int64_t>(vocab.size());
  id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  undecodable_.assign(static_cast<size_t>(max_id + 1), 1);
  const auto& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(bm.to_cp[b], s);
    byte_symbol_[b] = intern(s);
  }
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    symbol_vocab_id_[static_cast<size_t>(intern(token))] = id;
    undecodable_[static_cast<size_t>(id)] = byte_level_to_bytes(token, id_bytes_[id]) ? 0 : 1;
  }
  auto eod_it = vocab.find(kEndOfText);
  MG_CHECK(eod_it != vocab.end(), "GPT2BPETokenizer: vocab file '" << vocab_file << "' has no '"
                                                                   << kEndOfText << "' token");
  eod_ = eod_it->get<int32_t>();

  // ---- merges.txt: "#version: 0.2" header, then "left right" per line; rank = line order.
  const std::string text = read_file(merges_file, "merges file");
  size_t pos = 0;
  int64_t line_no = 0;
  int32_t rank = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line_no == 1 && line.starts_with("#version")) continue;
    const size_t sp = line.find(' ');
    MG_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                 line.find(' ', sp + 1) == std::string_view::npos,
             "GPT2BPETokenizer: merges file '" << merges_file << "' line " << line_no
                                               << ": expected 'left right', got '" << line << "'");
    const std::string left(line.substr(0, sp)), right(line.substr(sp + 1));
    for (const auto* part : {&left, &right}) {
      MG_CHECK(vocab.contains(*part), "GPT2BPETokenizer: merges file '"
                                          << merges_file << "' line " << line_no << ": symbol '"
                                          << *part << "' of merge '" << line
                                          << "' is not in the vocab file '" << vocab_file << "'");
    }
    const int32_t l = intern(left), r = intern(right), result = intern(left + right);
    // As the reference's dict(zip(merges, range(...))): a repeated merge keeps its last rank.
    merges_[(static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r)] = Merge{rank, result};
    ++rank;
  }
  num_merges_ = rank;
}

GPT2BPETokenizer::~GPT2BPETokenizer() = default;

void GPT2BPETokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> word, next;
  word.reserve(piece.size());
  for (char c : piece) word.push_back(byte_symbol_[static_cast<uint8_t>(c)]);
  while (word.size() > 1) {
    int32_t best_rank = INT32_MAX, first = -1, second = -1, merged = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it =
          merges_.find((static_cast<uint64_t>(word[i]) << 32) | static_cast<uint32_t>(word[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        first = word[i];
        second = word[i + 1];
        merged = it->second.result;
      }
    }
    if (merged < 0) break;
    next.clear();
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        next.push_back(merged);
        i += 2;
      } else {
        next.push_back(word[i]);
        i += 1;
      }
    }
    word.swap(next);
  }
  for (int32_t s : word) out.push_back(symbol_vocab_id_[static_cast<size_t>(s)]);
}

void GPT2BPETokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t begin = out.size();
  bpe(piece, out);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.try_emplace(std::string(piece), out.begin() + static_cast<std::ptrdiff_t>(begin),
                     out.end());
}

std::vector<int32_t> GPT2BPETokenizer::tokenize(std::string_view text) const {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  ids.reserve(text.size() / 3);
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(regex_->code, nullptr));
  MG_CHECK(md != nullptr, "GPT2BPETokenizer::tokenize: out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The first call validates the whole subject as UTF-8; later calls skip that (else quadratic).
  uint32_t options = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc =
        pcre2_match(regex_->code, subject, text.size(), offset, options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
      MG_THROW("GPT2BPETokenizer::tokenize: input is not valid UTF-8 at byte "
               << pcre2_get_startchar(md.get()) << " of " << text.size() << ": "
               << pcre2_message(rc));
    }
    MG_CHECK(rc >= 0, "GPT2BPETokenizer::tokenize: pcre2_match failed at byte "
                          << offset << ": " << pcre2_message(rc));
    MG_CHECK(ov[1] > ov[0], "GPT2BPETokenizer::tokenize: empty pre-token match at byte " << ov[0]);
    encode_piece(text.substr(ov[0], ov[1] - ov[0]), ids);
    offset = ov[1];
    options = PCRE2_NO_UTF_CHECK;
  }
  return ids;
}

std::string GPT2BPETokenizer::detokenize(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    MG_CHECK(id >= 0 && static_cast<size_t>(id) < id_bytes_.size() &&
                 !undecodable_[static_cast<size_t>(id)],
             "GPT2BPETokenizer::detokenize: id " << id << " at position " << i
                                                 << " is not a decodable token of this vocabulary"
                                                 << " (size " << vocab_size_ << ")");
    out += id_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace mg::tokenizers
