// Text primitives of the tokenizer.json pipeline: UTF-8 walking, a PCRE2 regex with HF's
// find-all semantics (Oniguruma in the `tokenizers` library; the patterns in use — \p{L}, \p{N},
// \s, look-ahead, (?i:...) — mean the same in PCRE2 with UTF + UCP), Unicode normalization forms
// and case mapping through ICU, and Rust's char::is_whitespace (Unicode White_Space).
// Character classes come from the ICU of the system (Unicode 15 on Debian 12); the Rust crates
// and Oniguruma behind `tokenizers` may hold an older or newer Unicode, so code points assigned or
// re-categorised since can differ (no common character does).
// Invariants: every function takes valid UTF-8 (HuggingFaceTokenizer validates its input once);
// Regex is immutable after construction and may be used from several threads.
// Does not: validate UTF-8 (except utf8_error_offset), or handle patterns with anchors that differ
// between Oniguruma's Ruby syntax and PCRE2 (^/$ are per-line in Ruby; no HF model uses them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mg::tokenizers::hf {

// Byte offset of the first invalid UTF-8 sequence in s, or npos when s is valid.
std::size_t utf8_error_offset(std::string_view s);
// Length in bytes of the UTF-8 sequence starting with lead byte c (1 for a stray byte).
inline std::size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}
// The code point at s[i] (valid UTF-8); sets len to its byte length.
uint32_t utf8_decode(std::string_view s, std::size_t i, std::size_t& len);
void append_utf8(uint32_t cp, std::string& out);
// Unicode White_Space (Rust's char::is_whitespace).
bool is_whitespace(uint32_t cp);
// General category N (Rust's char::is_numeric).
bool is_numeric(uint32_t cp);
// Letters, digits, marks or '_' (the \w of Rust's regex, used by AddedToken single_word; also
// Oniguruma's \w, used by the Whitespace pre-tokenizer): Alphabetic, M, Nd, Pc, Join_Control.
bool is_word_char(uint32_t cp);
// ASCII punctuation (Rust's is_ascii_punctuation, symbols like $+<=>^`|~ included) or general
// category P: the punctuation of BertPreTokenizer and the Punctuation pre-tokenizer.
bool is_punctuation(uint32_t cp);
// General category M (what the `unicode_categories` crate behind HF's StripAccents and
// BertNormalizer calls is_mark_nonspacing: its table holds Mc and Me too).
bool is_mark(uint32_t cp);
// Cc, Cf, Co or Cs (the crate's is_other, which holds no unassigned code point): what
// BertNormalizer's clean_text removes, except tab, newline and carriage return.
bool is_other_char(uint32_t cp);

enum class NormalizationForm { nfc, nfd, nfkc, nfkd };
// Normalizes valid UTF-8 text (ICU; ASCII-only text is returned unchanged without a copy).
void unicode_normalize(std::string& text, NormalizationForm form);
// Rust's char::to_lowercase applied to each code point (full mappings, no context).
void unicode_lowercase(std::string& text);

// A compiled PCRE2 pattern (UTF, UCP, JIT when available).
class Regex {
 public:
  // what names the component for errors, e.g. "pre_tokenizer Split".
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches [begin, end) left to right, as Oniguruma's find_iter: an empty match
  // is skipped and the search resumes one character later.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mg::tokenizers::hf
