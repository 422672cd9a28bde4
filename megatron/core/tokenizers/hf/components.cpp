// Normalizers, pre-tokenizers and decoders of tokenizer.json (see components.h), each a small class
// mirroring the `tokenizers` 0.21 Rust implementation of the same name.
#include "megatron/core/tokenizers/hf/components.h"

#include <openssl/evp.h>
#include <unicode/ubrk.h>
#include <unicode/utext.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/gpt2_bpe_tokenizer.h"
#include "megatron/core/tokenizers/hf/text.h"

namespace mg::tokenizers::hf {

using nlohmann::json;

namespace {

// ---------------------------------------------------------------- JSON helpers

std::string type_of(const json& j, const char* stage) {
  MG_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
           "HuggingFaceTokenizer: tokenizer.json " << stage << " must be an object with a \"type\""
                                                   << ", got " << j.dump().substr(0, 200));
  return j["type"].get<std::string>();
}

template <typename T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

std::string get_string(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  MG_CHECK(it != j.end() && it->is_string(),
           "HuggingFaceTokenizer: " << what << " needs a string \"" << key << "\", got "
                                    << j.dump().substr(0, 200));
  return it->get<std::string>();
}

uint32_t single_char(const std::string& s, const std::string& what) {
  std::size_t len = 0;
  MG_CHECK(!s.empty() && utf8_error_offset(s) == std::string::npos,
           "HuggingFaceTokenizer: " << what << " must be one character, got '" << s << "'");
  const uint32_t cp = utf8_decode(s, 0, len);
  MG_CHECK(len == s.size(),
           "HuggingFaceTokenizer: " << what << " must be one character, got '" << s << "'");
  return cp;
}

// A Replace/Split pattern: {"String": "..."} (literal) or {"Regex": "..."}.
class Pattern {
 public:
  Pattern(const json& j, const std::string& what) {
    MG_CHECK(j.is_object() && j.size() == 1 && (j.contains("String") || j.contains("Regex")),
             "HuggingFaceTokenizer: " << what << " pattern must be {\"String\": ...} or "
                                      << "{\"Regex\": ...}, got " << j.dump().substr(0, 200));
    if (j.contains("String")) {
      literal_ = j["String"].get<std::string>();
    } else {
      regex_ = std::make_unique<Regex>(j["Regex"].get<std::string>(), what);
    }
  }
  // Non-overlapping matches, left to right.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const {
    if (regex_) return regex_->find_all(text);
    std::vector<std::pair<std::size_t, std::size_t>> out;
    if (literal_.empty()) return out;
    for (std::size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size()))
      out.emplace_back(pos, pos + literal_.size());
    return out;
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

std::string replace_all(const std::string& text, const Pattern& pattern, const std::string& with) {
  const auto matches = pattern.find_all(text);
  if (matches.empty()) return text;
  std::string out;
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    out.append(text, prev, b - prev);
    out += with;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  return out;
}

// Rust's str::replace: non-overlapping occurrences of from, left to right.
std::string replace_literal(const std::string& text, std::string_view from, std::string_view to) {
  std::string out;
  std::size_t prev = 0;
  for (std::size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, prev)) {
    out.append(text, prev, pos - prev);
    out += to;
    prev = pos + from.size();
  }
  if (prev == 0) return text;
  out.append(text, prev, std::string::npos);
  return out;
}

// ---------------------------------------------------------------- normalizers

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalizationForm f) : form_(f) {}
  void normalize(std::string& text) const override { unicode_normalize(text, form_); }

 private:
  NormalizationForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { unicode_lowercase(text); }
};

class StripNormalizer final : public Normalizer {
 public:
  explicit StripNormalizer(const json& j)
      : left_(get_or(j, "strip_left", true)), right_(get_or(j, "strip_right", true)) {}
  void normalize(std::string& text) const override {
    std::size_t b = 0, e = text.size();
    if (left_) {
      while (b < e) {
        std::size_t len;
        if (!is_whitespace(utf8_decode(text, b, len))) break;
        b += len;
      }
    }
    if (right_) {
      while (e > b) {
        std::size_t s = e - 1;
        while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        std::size_t len;
        if (!is_whitespace(utf8_decode(text, s, len))) break;
        e = s;
      }
    }
    text = text.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(const json& j)
      : prepend_(get_string(j, "prepend", "normalizer Prepend")) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  explicit ReplaceNormalizer(const json& j)
      : pattern_(j.at("pattern"), "normalizer Replace"),
        content_(get_string(j, "content", "normalizer Replace")) {}
  void normalize(std::string& text) const override { text = replace_all(text, pattern_, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

// Keeps the code points for which keep(cp) is true.
template <typename Keep>
void filter_chars(std::string& text, Keep keep) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    std::size_t len;
    if (keep(utf8_decode(text, i, len))) out.append(text, i, len);
    i += len;
  }
  text.swap(out);
}

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    filter_chars(text, [](uint32_t cp) { return !is_mark(cp); });
  }
};

// BERT's BasicTokenizer cleaning (normalizers/bert.rs), in this order: clean_text drops NUL, U+FFFD
// and control characters (Cc/Cf/Co/Cs but tab, newline, CR) and maps whitespace to ' ';
// handle_chinese_chars puts spaces around CJK ideographs; strip_accents (null: as lowercase) is NFD
// then dropping marks; lowercase.
class BertNormalizer final : public Normalizer {
 public:
  explicit BertNormalizer(const json& j)
      : clean_text_(get_or(j, "clean_text", true)),
        chinese_(get_or(j, "handle_chinese_chars", true)),
        lowercase_(get_or(j, "lowercase", true)),
        strip_accents_(get_or(j, "strip_accents", lowercase_)) {}
  void normalize(std::string& text) const override {
    if (clean_text_ || chinese_) {
      std::string out;
      out.reserve(text.size());
      for (std::size_t i = 0; i < text.size();) {
        std::size_t len;
        const uint32_t cp = utf8_decode(text, i, len);
        const bool tab_nl_cr = cp == '\t' || cp == '\n' || cp == '\r';
        if (clean_text_ && (cp == 0 || cp == 0xFFFD || (!tab_nl_cr && is_other_char(cp)))) {
          // dropped
        } else if (clean_text_ && (tab_nl_cr || is_whitespace(cp))) {
          out.push_back(' ');
        } else if (chinese_ && is_chinese_char(cp)) {
          out.push_back(' ');
          out.append(text, i, len);
          out.push_back(' ');
        } else {
          out.append(text, i, len);
        }
        i += len;
      }
      text.swap(out);
    }
    if (strip_accents_) {
      unicode_normalize(text, NormalizationForm::nfd);
      filter_chars(text, [](uint32_t cp) { return !is_mark(cp); });
    }
    if (lowercase_) unicode_lowercase(text);
  }

 private:
  // BERT's CJK Unified Ideographs blocks (not all CJK: no kana, hangul or punctuation).
  static bool is_chinese_char(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
  }
  bool clean_text_, chinese_, lowercase_, strip_accents_;
};

// Marian / NMT cleaning (normalizers/unicode.rs Nmt): some ASCII control characters dropped, a few
// separators and zero-width characters (and U+2581, U+FEFF, U+FFFD) mapped to ' '.
class NmtNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
      std::size_t len;
      const uint32_t c = utf8_decode(text, i, len);
      const bool drop = (c >= 0x01 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) ||
                        c == 0x7F || c == 0x8F || c == 0x9F;
      const bool space = c == 0x09 || c == 0x0A || c == 0x0C || c == 0x0D || c == 0x1680 ||
                         (c >= 0x200B && c <= 0x200F) || c == 0x2028 || c == 0x2029 ||
                         c == 0x2581 || c == 0xFEFF || c == 0xFFFD;
      if (space)
        out.push_back(' ');
      else if (!drop)
        out.append(text, i, len);
      i += len;
    }
    text.swap(out);
  }
};

// A sentencepiece normalization rule set (the precompiled_charsmap of a .model, base64 in
// tokenizer.json): [u32 little-endian trie size][Darts-clone double-array trie of u32 units]
// [NUL-separated replacement strings]; a trie value is the offset of a replacement. As HF's
// normalizers/precompiled.rs: the text is cut into extended grapheme clusters (ICU); a cluster
// shorter than 6 bytes whose bytes start with a key is replaced as a whole by the replacement of
// the SHORTEST such key; otherwise each character is replaced the same way, or kept.
class PrecompiledNormalizer final : public Normalizer {
 public:
  explicit PrecompiledNormalizer(const json& j) {
    const std::string b64 = get_string(j, "precompiled_charsmap", "normalizer Precompiled");
    std::string bytes(b64.size() / 4 * 3 + 3, '\0');
    const int n = b64.empty() ? -1
                              : EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes.data()),
                                                reinterpret_cast<const unsigned char*>(b64.data()),
                                                static_cast<int>(b64.size()));
    MG_CHECK(n >= 0 && b64.size() % 4 == 0,
             "HuggingFaceTokenizer: normalizer Precompiled: precompiled_charsmap is not base64 ("
                 << b64.size() << " characters)");
    std::size_t size = static_cast<std::size_t>(n);
    for (std::size_t k = b64.size(); k > 0 && b64[k - 1] == '=' && size > 0; --k) --size;
    bytes.resize(size);
    uint32_t trie_bytes = 0;
    if (bytes.size() >= 4) std::memcpy(&trie_bytes, bytes.data(), 4);  // little-endian hosts
    MG_CHECK(bytes.size() >= 4 && trie_bytes >= 4 && trie_bytes % 4 == 0 &&
                 trie_bytes <= bytes.size() - 4,
             "HuggingFaceTokenizer: normalizer Precompiled: precompiled_charsmap of "
                 << bytes.size() << " bytes does not hold a trie (declared size " << trie_bytes
                 << ")");
    units_.resize(trie_bytes / 4);
    std::memcpy(units_.data(), bytes.data() + 4, trie_bytes);
    replacements_ = bytes.substr(4 + trie_bytes);
    MG_CHECK(utf8_error_offset(replacements_) == std::string::npos,
             "HuggingFaceTokenizer: normalizer Precompiled: the replacement strings of "
             "precompiled_charsmap are not UTF-8");
  }

  void normalize(std::string& text) const override {
    if (text.empty()) return;
    std::string out;
    out.reserve(text.size());
    for_each_grapheme(text, [&](std::size_t b, std::size_t e) {
      const std::string_view g(text.data() + b, e - b);
      if (g.size() < 6) {
        if (auto r = transform(g)) {
          out += *r;
          return;
        }
      }
      for (std::size_t i = 0; i < g.size();) {
        const std::size_t len = utf8_len(static_cast<unsigned char>(g[i]));
        const std::string_view c = g.substr(i, len);
        if (auto r = transform(c))
          out += *r;
        else
          out += c;
        i += len;
      }
    });
    text.swap(out);
  }

 private:
  // The replacement of the shortest key that is a prefix of s (Darts-clone common prefix search).
  std::optional<std::string_view> transform(std::string_view s) const {
    auto unit = [&](std::size_t pos) -> std::optional<uint32_t> {
      if (pos >= units_.size()) return std::nullopt;
      return units_[pos];
    };
    auto offset = [](uint32_t u) -> std::size_t { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    std::size_t pos = 0;
    pos ^= offset(units_[0]);
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == 0) break;
      pos ^= c;
      const auto u = unit(pos);
      if (!u || (*u & ((1u << 31) | 0xFFu)) != c) return std::nullopt;
      pos ^= offset(*u);
      if ((*u >> 8) & 1u) {
        const auto leaf = unit(pos);
        if (!leaf) return std::nullopt;
        const std::size_t at = *leaf & ((1u << 31) - 1);
        if (at > replacements_.size()) return std::nullopt;
        const std::size_t end = replacements_.find('\0', at);
        return std::string_view(replacements_)
            .substr(at, end == std::string::npos ? end : end - at);
      }
    }
    return std::nullopt;
  }

  // Calls f(begin, end) for each extended grapheme cluster of valid UTF-8 text (byte offsets).
  template <typename F>
  static void for_each_grapheme(const std::string& text, F f) {
    struct Close {
      void operator()(UBreakIterator* b) const { ubrk_close(b); }
      void operator()(UText* t) const { utext_close(t); }
    };
    thread_local std::unique_ptr<UBreakIterator, Close> breaker;
    UErrorCode err = U_ZERO_ERROR;
    if (!breaker) {
      breaker.reset(ubrk_open(UBRK_CHARACTER, "", nullptr, 0, &err));
      MG_CHECK(U_SUCCESS(err),
               "HuggingFaceTokenizer: ICU grapheme iterator unavailable: " << u_errorName(err));
    }
    std::unique_ptr<UText, Close> ut(
        utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &err));
    ubrk_setUText(breaker.get(), ut.get(), &err);
    MG_CHECK(U_SUCCESS(err),
             "HuggingFaceTokenizer: ICU grapheme iteration failed: " << u_errorName(err));
    int32_t b = ubrk_first(breaker.get());
    for (int32_t e = ubrk_next(breaker.get()); e != UBRK_DONE; b = e, e = ubrk_next(breaker.get()))
      f(static_cast<std::size_t>(b), static_cast<std::size_t>(e));
  }

  std::vector<uint32_t> units_;
  std::string replacements_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(const json& j) {
    for (const auto& n : j.at("normalizers")) parts_.push_back(make_normalizer(n));
  }
  void normalize(std::string& text) const override {
    for (const auto& p : parts_)
      if (p) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---------------------------------------------------------------- pre-tokenizers

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

SplitBehavior parse_behavior(const std::string& s) {
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  MG_THROW("HuggingFaceTokenizer: pre_tokenizer Split behavior '"
           << s << "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
           << "Contiguous");
}

struct Span {
  std::size_t begin, end;
  bool is_match;
};

// Matches -> spans covering the whole text (HF's Pattern::find_matches), optionally inverted.
std::vector<Span> cover(std::size_t n, const std::vector<std::pair<std::size_t, std::size_t>>& m,
                        bool invert) {
  std::vector<Span> out;
  if (n == 0) return {{0, 0, invert}};
  std::size_t prev = 0;
  for (auto [b, e] : m) {
    if (prev != b) out.push_back({prev, b, invert});
    out.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != n) out.push_back({prev, n, invert});
  return out;
}

// NormalizedString::split: spans -> kept pieces, appended to out (empty ones dropped).
void split_piece(const Piece& p, const std::vector<Span>& spans, SplitBehavior behavior,
                 std::vector<Piece>& out) {
  std::vector<Span> kept;  // is_match here means "remove"
  switch (behavior) {
    case SplitBehavior::isolated:
      for (auto s : spans) kept.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::removed:
      kept = spans;
      break;
    case SplitBehavior::contiguous: {
      bool prev_match = false;
      for (auto s : spans) {
        if (s.is_match == prev_match && !kept.empty())
          kept.back().end = s.end;
        else
          kept.push_back({s.begin, s.end, false});
        prev_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_previous: {
      bool prev_match = false;
      for (auto s : spans) {
        if (s.is_match && !prev_match && !kept.empty())
          kept.back().end = s.end;
        else
          kept.push_back({s.begin, s.end, false});
        prev_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool prev_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !prev_match && !kept.empty())
          kept.back().begin = it->begin;
        else
          kept.push_back({it->begin, it->end, false});
        prev_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (auto s : kept) {
    if (s.is_match || s.end == s.begin) continue;
    out.push_back({p.text.substr(s.begin, s.end - s.begin), p.offset + s.begin});
  }
}

// Matches of single characters satisfying pred (HF's `impl Pattern for Fn(char) -> bool`).
template <typename Pred>
std::vector<std::pair<std::size_t, std::size_t>> char_matches(std::string_view text, Pred pred) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t len;
    if (pred(utf8_decode(text, i, len))) out.emplace_back(i, i + len);
    i += len;
  }
  return out;
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  explicit SplitPreTokenizer(const json& j)
      : pattern_(j.at("pattern"), "pre_tokenizer Split"),
        behavior_(parse_behavior(get_string(j, "behavior", "pre_tokenizer Split"))),
        invert_(get_or(j, "invert", false)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces)
      split_piece(p, cover(p.text.size(), pattern_.find_all(p.text), invert_), behavior_, out);
    pieces.swap(out);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(const json& j) : individual_(get_or(j, "individual_digits", false)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces)
      split_piece(p, cover(p.text.size(), char_matches(p.text, is_numeric), false),
                  individual_ ? SplitBehavior::isolated : SplitBehavior::contiguous, out);
    pieces.swap(out);
  }

 private:
  bool individual_;
};

class WhitespaceSplitPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces)
      split_piece(p, cover(p.text.size(), char_matches(p.text, is_whitespace), false),
                  SplitBehavior::removed, out);
    pieces.swap(out);
  }
};

// Splits at one delimiter character, which is removed.
class CharDelimiterSplitPreTokenizer final : public PreTokenizer {
 public:
  explicit CharDelimiterSplitPreTokenizer(const json& j)
      : delimiter_(single_char(get_string(j, "delimiter", "pre_tokenizer CharDelimiterSplit"),
                               "pre_tokenizer CharDelimiterSplit delimiter")) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    const uint32_t d = delimiter_;
    for (const auto& p : pieces)
      split_piece(
          p, cover(p.text.size(), char_matches(p.text, [d](uint32_t c) { return c == d; }), false),
          SplitBehavior::removed, out);
    pieces.swap(out);
  }

 private:
  uint32_t delimiter_;
};

// BERT's BasicTokenizer split: whitespace removed, then every punctuation character isolated.
class BertPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> words, out;
    for (const auto& p : pieces)
      split_piece(p, cover(p.text.size(), char_matches(p.text, is_whitespace), false),
                  SplitBehavior::removed, words);
    for (const auto& p : words)
      split_piece(p, cover(p.text.size(), char_matches(p.text, is_punctuation), false),
                  SplitBehavior::isolated, out);
    pieces.swap(out);
  }
};

class PunctuationPreTokenizer final : public PreTokenizer {
 public:
  explicit PunctuationPreTokenizer(const json& j)
      : behavior_(parse_behavior(get_or<std::string>(j, "behavior", "Isolated"))) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces)
      split_piece(p, cover(p.text.size(), char_matches(p.text, is_punctuation), false), behavior_,
                  out);
    pieces.swap(out);
  }

 private:
  SplitBehavior behavior_;
};

// The regex \w+|[^\w\s]+ (Oniguruma): maximal runs of word characters and maximal runs of
// characters that are neither word nor whitespace; whitespace is dropped.
class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces) {
      const std::string& t = p.text;
      int run_kind = 0;  // 0: whitespace / none, 1: word run, 2: other run
      std::size_t run_start = 0;
      for (std::size_t i = 0; i <= t.size();) {
        std::size_t len = 0;
        int kind = 0;
        if (i < t.size()) {
          const uint32_t cp = utf8_decode(t, i, len);
          kind = is_word_char(cp) ? 1 : is_whitespace(cp) ? 0 : 2;
        }
        if (kind != run_kind) {
          if (run_kind != 0)
            out.push_back({t.substr(run_start, i - run_start), p.offset + run_start});
          run_kind = kind;
          run_start = i;
        }
        if (i == t.size()) break;
        i += len;
      }
    }
    pieces.swap(out);
  }
};

// GPT-2's pre-tokenization pattern, used by ByteLevel when use_regex is true.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  explicit ByteLevelPreTokenizer(const json& j)
      : add_prefix_space_(get_or(j, "add_prefix_space", true)),
        use_regex_(get_or(j, "use_regex", true)) {
    if (use_regex_) regex_ = std::make_unique<Regex>(kByteLevelPattern, "pre_tokenizer ByteLevel");
    for (int b = 0; b < 256; ++b) {
      const std::string& c = byte_level_char(static_cast<unsigned char>(b));
      map_[b].len = static_cast<uint8_t>(c.size());
      map_[b].bytes[0] = c[0];
      map_[b].bytes[1] = c.size() > 1 ? c[1] : '\0';
    }
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (auto& p : pieces) {
      if (add_prefix_space_ && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, 1, ' ');
      if (use_regex_)
        split_piece(p, cover(p.text.size(), regex_->find_all(p.text), false),
                    SplitBehavior::isolated, out);
      else if (!p.text.empty())
        out.push_back(std::move(p));
    }
    std::string mapped;
    for (auto& p : out) {
      mapped.resize(p.text.size() * 2);  // a byte maps to one or two UTF-8 bytes
      char* o = mapped.data();
      for (char c : p.text) {
        const Mapped& m = map_[static_cast<unsigned char>(c)];
        o[0] = m.bytes[0];
        o[1] = m.bytes[1];
        o += m.len;
      }
      mapped.resize(static_cast<std::size_t>(o - mapped.data()));
      p.text.swap(mapped);
    }
    pieces.swap(out);
  }

 private:
  struct Mapped {
    char bytes[2];
    uint8_t len;
  };
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> regex_;
  Mapped map_[256];
};

enum class PrependScheme { always, first, never };

PrependScheme parse_prepend_scheme(const json& j, const char* what) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const auto s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::always;
    if (s == "first") return PrependScheme::first;
    if (s == "never") return PrependScheme::never;
    MG_THROW("HuggingFaceTokenizer: " << what << " prepend_scheme '" << s
                                      << "' is not one of always, first, never");
  }
  // Files from tokenizers < 0.14 carry add_prefix_space instead.
  return get_or(j, "add_prefix_space", true) ? PrependScheme::always : PrependScheme::never;
}

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  explicit MetaspacePreTokenizer(const json& j)
      : replacement_(get_string(j, "replacement", "pre_tokenizer Metaspace")),
        scheme_(parse_prepend_scheme(j, "pre_tokenizer Metaspace")),
        split_(get_or(j, "split", true)),
        space_(json{{"String", " "}}, "pre_tokenizer Metaspace"),
        meta_(json{{"String", replacement_}}, "pre_tokenizer Metaspace") {
    single_char(replacement_, "pre_tokenizer Metaspace replacement");
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (auto& p : pieces) {
      p.text = replace_all(p.text, space_, replacement_);
      const bool prepend =
          !p.text.empty() && !p.text.starts_with(replacement_) &&
          (scheme_ == PrependScheme::always || (scheme_ == PrependScheme::first && p.offset == 0));
      if (prepend) p.text.insert(0, replacement_);
      if (split_)
        split_piece(p, cover(p.text.size(), meta_.find_all(p.text), false),
                    SplitBehavior::merged_with_next, out);
      else if (!p.text.empty())
        out.push_back(std::move(p));
    }
    pieces.swap(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Pattern space_, meta_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(const json& j) {
    for (const auto& p : j.at("pretokenizers")) parts_.push_back(make_pre_tokenizer(p));
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_)
      if (p) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// ---------------------------------------------------------------- decoders

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string out;
    for (const auto& t : tokens)
      if (!byte_level_decode(t, out)) out += t;  // as HF: a token outside the map stays as is
    tokens.assign(1, std::move(out));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(const json& j)
      : replacement_(get_string(j, "replacement", "decoder Metaspace")),
        scheme_(parse_prepend_scheme(j, "decoder Metaspace")),
        meta_(json{{"String", replacement_}}, "decoder Metaspace") {
    single_char(replacement_, "decoder Metaspace replacement");
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      // Every replacement character becomes a space, except in the first token (when a prefix
      // was prepended), where they are all dropped.
      const std::string with = (i == 0 && scheme_ != PrependScheme::never) ? "" : " ";
      tokens[i] = replace_all(tokens[i], meta_, with);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  Pattern meta_;
};

class ReplaceDecoder final : public Decoder {
 public:
  explicit ReplaceDecoder(const json& j)
      : pattern_(j.at("pattern"), "decoder Replace"),
        content_(get_string(j, "content", "decoder Replace")) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = replace_all(t, pattern_, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xAB>" -> 0xAB.
std::optional<unsigned char> byte_token(const std::string& t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

class ByteFallbackDecoder final : public Decoder {
 public:
  // Runs of <0xXX> tokens become their bytes. HF replaces a run that is not valid UTF-8 by one
  // U+FFFD per byte; here the bytes are kept (Tokenizer::detokenize's contract).
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool in_run = false;
    for (auto& t : tokens) {
      if (auto b = byte_token(t)) {
        bytes.push_back(static_cast<char>(*b));
        in_run = true;
        continue;
      }
      if (in_run) out.push_back(std::move(bytes)), bytes.clear(), in_run = false;
      out.push_back(std::move(t));
    }
    if (in_run) out.push_back(std::move(bytes));
    tokens.swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string out;
    for (const auto& t : tokens) out += t;
    tokens.assign(1, std::move(out));
  }
};

class StripDecoder final : public Decoder {
 public:
  explicit StripDecoder(const json& j)
      : content_(single_char(get_string(j, "content", "decoder Strip"), "decoder Strip content")),
        start_(get_or<std::size_t>(j, "start", 0)),
        stop_(get_or<std::size_t>(j, "stop", 0)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<std::size_t, uint32_t>> chars;  // (byte offset, code point)
      for (std::size_t i = 0; i < t.size();) {
        std::size_t len;
        chars.emplace_back(i, utf8_decode(t, i, len));
        i += len;
      }
      std::size_t first = 0, last = chars.size();  // kept chars [first, last)
      while (first < start_ && first < chars.size() && chars[first].second == content_) ++first;
      for (std::size_t k = 0; k < stop_ && last > first && chars[last - 1].second == content_; ++k)
        --last;
      const std::size_t b = first < chars.size() ? chars[first].first : t.size();
      const std::size_t e = last < chars.size() ? chars[last].first : t.size();
      t = t.substr(b, e > b ? e - b : 0);
    }
  }

 private:
  uint32_t content_;
  std::size_t start_, stop_;
};

// BERT's sub-word joining (decoders/wordpiece.rs): after the first token, a token starting with
// prefix loses it, any other gets a leading space; cleanup then undoes BERT's spacing around
// punctuation and English contractions in each token.
class WordPieceDecoder final : public Decoder {
 public:
  explicit WordPieceDecoder(const json& j)
      : prefix_(get_or<std::string>(j, "prefix", "##")), cleanup_(get_or(j, "cleanup", true)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    static const std::pair<const char*, const char*> kCleanup[] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (!prefix_.empty() && t.starts_with(prefix_))
          t.erase(0, prefix_.size());
        else
          t.insert(0, 1, ' ');
      }
      if (cleanup_) {
        for (const auto& [from, to] : kCleanup) t = replace_literal(t, from, to);
      }
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

// The end-of-word suffix of a BPE vocabulary (openai-gpt, CLIP: "</w>") becomes a space, except in
// the last token, where it is dropped (decoders/bpe.rs).
class BpeDecoder final : public Decoder {
 public:
  explicit BpeDecoder(const json& j) : suffix_(get_or<std::string>(j, "suffix", "</w>")) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty()) return;  // Rust's str::replace("") would insert between characters
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = replace_literal(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
  }

 private:
  std::string suffix_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(const json& j) {
    for (const auto& d : j.at("decoders")) parts_.push_back(make_decoder(d));
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_)
      if (p) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

struct ByteLevelTables {
  std::string to_char[256];
  int16_t from_cp[324];
  ByteLevelTables() {
    for (auto& v : from_cp) v = -1;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
      append_utf8(cp, to_char[b]);
      from_cp[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) {
  return byte_level_tables().to_char[b];
}

bool byte_level_decode(const std::string& token, std::string& out) {
  const auto& t = byte_level_tables();
  const std::size_t start = out.size();
  for (std::size_t i = 0; i < token.size();) {
    std::size_t len;
    const uint32_t cp = utf8_decode(token, i, len);
    if (cp >= std::size(t.from_cp) || t.from_cp[cp] < 0) {
      out.resize(start);
      return false;
    }
    out.push_back(static_cast<char>(t.from_cp[cp]));
    i += len;
  }
  return true;
}

std::unique_ptr<Normalizer> make_normalizer(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "normalizer");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::nfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::nfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::nfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::nfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") return std::make_unique<StripNormalizer>(j);
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "BertNormalizer") return std::make_unique<BertNormalizer>(j);
  if (type == "Precompiled") return std::make_unique<PrecompiledNormalizer>(j);
  if (type == "Nmt") return std::make_unique<NmtNormalizer>();
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(j);
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(j);
  if (type == "Sequence") return std::make_unique<SequenceNormalizer>(j);
  MG_THROW("HuggingFaceTokenizer: normalizer type '"
           << type << "' is not supported (supported: " << kSupportedNormalizers << ")");
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "pre_tokenizer");
  if (type == "ByteLevel") return std::make_unique<ByteLevelPreTokenizer>(j);
  if (type == "Metaspace") return std::make_unique<MetaspacePreTokenizer>(j);
  if (type == "Split") return std::make_unique<SplitPreTokenizer>(j);
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(j);
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "CharDelimiterSplit") return std::make_unique<CharDelimiterSplitPreTokenizer>(j);
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "Punctuation") return std::make_unique<PunctuationPreTokenizer>(j);
  if (type == "Sequence") return std::make_unique<SequencePreTokenizer>(j);
  MG_THROW("HuggingFaceTokenizer: pre_tokenizer type '"
           << type << "' is not supported (supported: " << kSupportedPreTokenizers << ")");
}

std::unique_ptr<Decoder> make_decoder(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(j);
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(j);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(j);
  if (type == "WordPiece") return std::make_unique<WordPieceDecoder>(j);
  if (type == "BPEDecoder") return std::make_unique<BpeDecoder>(j);
  if (type == "Sequence") return std::make_unique<SequenceDecoder>(j);
  MG_THROW("HuggingFaceTokenizer: decoder type '"
           << type << "' is not supported (supported: " << kSupportedDecoders << ")");
}

}  // namespace mg::tokenizers::hf
