// The pluggable stages of a tokenizer.json (HF `tokenizers`) pipeline, each built from its JSON:
//   normalizer     text -> text, applied to each piece of input between added tokens
//   pre_tokenizer  pieces -> smaller pieces (the model encodes each piece independently)
//   decoder        token strings -> strings, concatenated into the decoded text
// Each factory accepts the component types below and rejects any other with an error naming the
// type and listing the supported ones (kSupported*). A JSON null means "no such stage" (nullptr).
// Semantics follow tokenizers 0.21 (normalizer.rs, pre_tokenizers/*.rs, decoders/*.rs); offsets
// are not tracked except whether a piece starts at byte 0 of the input (Metaspace "first").
// Invariants: components are immutable after construction and thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace mg::tokenizers::hf {

inline constexpr const char* kSupportedNormalizers =
    "NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, BertNormalizer, Precompiled, Nmt, "
    "Prepend, Replace, Sequence";
inline constexpr const char* kSupportedPreTokenizers =
    "ByteLevel, Metaspace, Split, Digits, WhitespaceSplit, Whitespace, BertPreTokenizer, "
    "Punctuation, CharDelimiterSplit, Sequence";
inline constexpr const char* kSupportedDecoders =
    "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, WordPiece, BPEDecoder, Sequence";

// A piece of input text during pre-tokenization. offset: byte offset in the input where the piece
// starts (0 only for the first piece of the input), used by Metaspace's prepend_scheme "first".
struct Piece {
  std::string text;
  std::size_t offset = 0;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces pieces by their sub-pieces; empty pieces are dropped (as HF's PreTokenizedString).
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF's decode_chain: token strings in, strings out (joined by the caller).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j);

// GPT-2's bytes_to_unicode map as UTF-8 strings (ByteLevel pre-tokenizer), and its inverse.
const std::string& byte_level_char(unsigned char b);
// Appends the bytes a byte-level token stands for; false (out untouched) if a character of token
// is outside the map.
bool byte_level_decode(const std::string& token, std::string& out);

}  // namespace mg::tokenizers::hf
