// Text primitives of the tokenizer.json pipeline (see text.h): UTF-8, PCRE2, ICU.
#include "megatron/core/tokenizers/hf/text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "megatron/core/common/error.h"

namespace mg::tokenizers::hf {

std::size_t utf8_error_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1Fu, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0Fu, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07u, min = 0x10000;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

uint32_t utf8_decode(std::string_view s, std::size_t i, std::size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  len = utf8_len(c);
  if (len == 1) return c;
  uint32_t cp = c & (0x7Fu >> len);
  for (std::size_t k = 1; k < len; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  return cp;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_whitespace(uint32_t cp) {
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool is_word_char(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp | 0x20) - 'a' < 26 || cp == '_';
  const int32_t mask = U_GET_GC_MASK(c);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL) ||
         (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

bool is_punctuation(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_P_MASK) != 0;
}

bool is_mark(uint32_t cp) {
  return cp >= 0x300 && (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_M_MASK) != 0;
}

bool is_other_char(uint32_t cp) {
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) &
          (U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CO_MASK | U_GC_CS_MASK)) != 0;
}

namespace {

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

std::u16string to_utf16(std::string_view s) {
  std::u16string out(s.size() + 1, u'\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &len,
                s.data(), static_cast<int32_t>(s.size()), &err);
  MG_CHECK(U_SUCCESS(err), "HuggingFaceTokenizer: UTF-8 to UTF-16 failed: " << u_errorName(err));
  out.resize(static_cast<std::size_t>(len));
  return out;
}

std::string to_utf8(const UChar* s, int32_t n) {
  std::string out(static_cast<std::size_t>(n) * 3 + 1, '\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len, s, n, &err);
  MG_CHECK(U_SUCCESS(err), "HuggingFaceTokenizer: UTF-16 to UTF-8 failed: " << u_errorName(err));
  out.resize(static_cast<std::size_t>(len));
  return out;
}

}  // namespace

void unicode_normalize(std::string& text, NormalizationForm form) {
  if (is_ascii(text)) return;  // ASCII is invariant under every normalization form
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case NormalizationForm::nfc:
      n = unorm2_getNFCInstance(&err);
      break;
    case NormalizationForm::nfd:
      n = unorm2_getNFDInstance(&err);
      break;
    case NormalizationForm::nfkc:
      n = unorm2_getNFKCInstance(&err);
      break;
    case NormalizationForm::nfkd:
      n = unorm2_getNFKDInstance(&err);
      break;
  }
  MG_CHECK(U_SUCCESS(err),
           "HuggingFaceTokenizer: ICU normalizer unavailable: " << u_errorName(err));
  const std::u16string src = to_utf16(text);
  const auto* usrc = reinterpret_cast<const UChar*>(src.data());
  const auto n_src = static_cast<int32_t>(src.size());
  if (unorm2_isNormalized(n, usrc, n_src, &err) && U_SUCCESS(err)) return;
  err = U_ZERO_ERROR;
  // NFKD may expand a code point to 18; retry with the size ICU asks for.
  std::u16string dst(src.size() * 3 + 16, u'\0');
  int32_t len = unorm2_normalize(n, usrc, n_src, reinterpret_cast<UChar*>(dst.data()),
                                 static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    dst.assign(static_cast<std::size_t>(len) + 1, u'\0');
    len = unorm2_normalize(n, usrc, n_src, reinterpret_cast<UChar*>(dst.data()),
                           static_cast<int32_t>(dst.size()), &err);
  }
  MG_CHECK(U_SUCCESS(err), "HuggingFaceTokenizer: ICU normalization failed: " << u_errorName(err));
  text = to_utf8(reinterpret_cast<const UChar*>(dst.data()), len);
}

void unicode_lowercase(std::string& text) {
  if (is_ascii(text)) {
    for (char& c : text)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return;
  }
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    std::size_t len;
    const uint32_t cp = utf8_decode(text, i, len);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    } else {
      // One code point at a time: full (one-to-many) mappings without context, as Rust's
      // char::to_lowercase (a lone capital sigma maps to σ).
      UChar src[2], dst[8];
      int32_t n_src = 0;
      U16_APPEND_UNSAFE(src, n_src, static_cast<UChar32>(cp));
      UErrorCode err = U_ZERO_ERROR;
      const int32_t n = u_strToLower(dst, 8, src, n_src, "", &err);
      MG_CHECK(U_SUCCESS(err), "HuggingFaceTokenizer: ICU lowercase failed: " << u_errorName(err));
      out += to_utf8(dst, n);
    }
    i += len;
  }
  text.swap(out);
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& what)
    : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    MG_THROW("HuggingFaceTokenizer: " << what << ": regex '" << pattern
                                      << "' does not compile with PCRE2 (offset " << err_off
                                      << "): " << reinterpret_cast<const char*>(buf));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // optional: interprets without JIT
}

Regex::~Regex() = default;

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if (text.empty()) return out;
  struct Free {
    void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
  };
  std::unique_ptr<pcre2_match_data, Free> md(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr));
  MG_CHECK(md != nullptr, "HuggingFaceTokenizer: out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                               md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MG_CHECK(rc >= 0, "HuggingFaceTokenizer: pcre2_match failed at byte " << offset << " (code "
                                                                          << rc << ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[1] == ov[0]) {  // empty match: skip it, resume after the next character
      if (ov[0] >= text.size()) break;
      offset = ov[0] + utf8_len(static_cast<unsigned char>(text[ov[0]]));
      continue;
    }
    out.emplace_back(ov[0], ov[1]);
    offset = ov[1];
  }
  return out;
}

}  // namespace mg::tokenizers::hf
