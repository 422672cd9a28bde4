// NullTokenizer: parses space-separated decimal ids (see null_tokenizer.h for the contract).
#include "megatron/core/tokenizers/null_tokenizer.h"

#include <charconv>
#include <limits>

#include "megatron/core/common/error.h"

namespace mg::tokenizers {

namespace {
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
}  // namespace

NullTokenizer::NullTokenizer(int64_t vocab_size) : vocab_size_without_eod_(vocab_size) {
  MG_CHECK(vocab_size >= 1 && vocab_size < std::numeric_limits<int32_t>::max(),
           "NullTokenizer: --vocab-size " << vocab_size << " must be in [1, "
                                          << std::numeric_limits<int32_t>::max() - 1 << "]");
}

std::vector<int32_t> NullTokenizer::tokenize(std::string_view text) const {
  std::vector<int32_t> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (i == text.size()) break;
    std::size_t end = i;
    while (end < text.size() && !is_space(text[end])) ++end;
    const std::string_view word = text.substr(i, end - i);
    // from_chars rejects a leading '+', which Python's int() accepts; skip it for parity.
    const std::string_view digits = word.starts_with('+') ? word.substr(1) : word;
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    MG_CHECK(ec == std::errc() && ptr == digits.data() + digits.size() && !digits.empty(),
             "NullTokenizer: '" << word << "' at byte " << i << " is not an integer token id");
    MG_CHECK(v >= 0 && v <= vocab_size_without_eod_,
             "NullTokenizer: token id " << v << " at byte " << i << " is outside [0, "
                                        << vocab_size_without_eod_ << "] (--vocab-size "
                                        << vocab_size_without_eod_ << ", eod "
                                        << vocab_size_without_eod_ << ")");
    ids.push_back(static_cast<int32_t>(v));
    i = end;
  }
  return ids;
}

std::string NullTokenizer::detokenize(std::span<const int32_t> ids) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace mg::tokenizers
