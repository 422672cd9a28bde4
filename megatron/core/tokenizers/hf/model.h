// The "model" stage of a tokenizer.json (HF `tokenizers`): one pre-tokenized, normalized piece ->
// token ids. make_model() builds one from its JSON object by "type":
//   BPE        bpe_model.h (GPT-2 / Llama-3 byte-level, Llama-2 / Mistral byte fallback)
//   Unigram    unigram_model.cpp: sentencepiece's Viterbi over scored pieces (T5, ALBERT, XLNet)
//   WordPiece  wordpiece_model.cpp: BERT's greedy longest-match-first with a subword prefix
//   WordLevel  wordpiece_model.cpp: a whole-piece lookup
// Anything else is rejected naming the type and kSupportedModels. Semantics follow tokenizers 0.21
// (models/*/model.rs). Invariants: a model is immutable after construction (BPE keeps a piece
// cache behind a mutex), so tokenize() may be called from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace mg::tokenizers::hf {

inline constexpr const char* kSupportedModels = "BPE, Unigram, WordPiece, WordLevel";

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one piece (already normalized and pre-tokenized) to out.
  virtual void tokenize(std::string_view piece, std::vector<int32_t>& out) const = 0;
  // Vocabulary id of token, or -1.
  virtual int32_t token_to_id(std::string_view token) const = 0;
  // The token of id, or nullptr when id is not in the vocabulary.
  virtual const std::string* id_to_token(int32_t id) const = 0;
  // Tokens in the vocabulary (HF's get_vocab_size without added tokens).
  virtual std::size_t vocab_size() const = 0;
};

// model: the "model" object of tokenizer.json (a missing "type" means BPE, as tokenizers reads
// files written before the field existed); file names it in errors.
std::unique_ptr<Model> make_model(const nlohmann::json& model, const std::string& file);

std::unique_ptr<Model> make_unigram_model(const nlohmann::json& model, const std::string& file);
std::unique_ptr<Model> make_wordpiece_model(const nlohmann::json& model, const std::string& file);
std::unique_ptr<Model> make_wordlevel_model(const nlohmann::json& model, const std::string& file);

}  // namespace mg::tokenizers::hf
