// The WordPiece and WordLevel models of a tokenizer.json, as tokenizers 0.21's
// models/wordpiece/mod.rs and models/wordlevel/mod.rs encode one piece:
//   WordPiece  {"unk_token": "[UNK]", "continuing_subword_prefix": "##",
//              "max_input_chars_per_word": 100, "vocab": {token: id}}: a piece longer than
//              max_input_chars_per_word characters is one unk; else greedy longest-match-first
//              from the left, every sub-word after the first looked up with the prefix; if some
//              position has no match the whole piece is one unk (BERT's behaviour).
//   WordLevel  {"vocab": {token: id}, "unk_token": "<unk>"}: the piece's id, else unk.
// Errors: a piece that needs the unk token when the vocabulary lacks it (HF's MissingUnkToken)
// throws naming the piece and the token.
#include <climits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/hf/model.h"
#include "megatron/core/tokenizers/hf/text.h"

namespace mg::tokenizers::hf {

using nlohmann::json;

namespace {

// A {token: id} vocabulary with its inverse.
class Vocab {
 public:
  Vocab(const json& model, const std::string& where) {
    auto vit = model.find("vocab");
    MG_CHECK(vit != model.end() && vit->is_object(),
             where << " has no \"vocab\" object {token: id}");
    int64_t max_id = -1;
    for (const auto& [token, id] : vit->items()) {
      MG_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX,
               where << ": token '" << token << "' has id " << id.dump()
                     << ", expected an integer in [0, 2^31-1)");
      ids_[token] = id.get<int32_t>();
      max_id = std::max(max_id, id.get<int64_t>());
    }
    tokens_.resize(static_cast<std::size_t>(max_id + 1));
    has_.assign(static_cast<std::size_t>(max_id + 1), 0);
    for (const auto& [token, id] : ids_) {
      tokens_[static_cast<std::size_t>(id)] = token;
      has_[static_cast<std::size_t>(id)] = 1;
    }
  }
  int32_t find(const std::string& token) const {
    auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }
  const std::string* token(int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= has_.size() || !has_[id]) return nullptr;
    return &tokens_[static_cast<std::size_t>(id)];
  }
  std::size_t size() const { return ids_.size(); }

 private:
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> tokens_;
  std::vector<uint8_t> has_;
};

std::string string_or(const json& j, const char* key, const char* fallback) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? std::string(fallback) : it->get<std::string>();
}

class WordPieceModel final : public Model {
 public:
  WordPieceModel(const json& model, const std::string& file)
      : where_("HuggingFaceTokenizer: '" + file + "' model WordPiece"),
        vocab_(model, where_),
        unk_token_(string_or(model, "unk_token", "[UNK]")),
        prefix_(string_or(model, "continuing_subword_prefix", "##")) {
    if (auto it = model.find("max_input_chars_per_word"); it != model.end() && !it->is_null()) {
      MG_CHECK(it->is_number_unsigned(), where_ << ": max_input_chars_per_word " << it->dump()
                                                << " is not a non-negative integer");
      max_chars_ = it->get<std::size_t>();
    }
    unk_id_ = vocab_.find(unk_token_);
  }

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const override {
    if (piece.empty()) return;
    std::size_t chars = 0;
    for (std::size_t i = 0; i < piece.size(); i += utf8_len(static_cast<unsigned char>(piece[i])))
      ++chars;
    if (chars > max_chars_) {
      out.push_back(unk(piece));
      return;
    }
    const std::size_t begin = out.size();
    std::string sub;
    for (std::size_t start = 0; start < piece.size();) {
      int32_t found = -1;
      std::size_t end = piece.size();
      while (end > start) {
        sub.assign(start > 0 ? prefix_ : std::string());
        sub.append(piece.substr(start, end - start));
        if ((found = vocab_.find(sub)) >= 0) break;
        // Back off by the last character.
        std::size_t b = end - 1;
        while (b > start && (static_cast<unsigned char>(piece[b]) & 0xC0) == 0x80) --b;
        end = b;
      }
      if (found < 0) {  // no sub-word at start: the whole piece is unknown
        out.resize(begin);
        out.push_back(unk(piece));
        return;
      }
      out.push_back(found);
      start = end;
    }
  }

  int32_t token_to_id(std::string_view token) const override {
    return vocab_.find(std::string(token));
  }
  const std::string* id_to_token(int32_t id) const override { return vocab_.token(id); }
  std::size_t vocab_size() const override { return vocab_.size(); }

 private:
  int32_t unk(std::string_view piece) const {
    MG_CHECK(unk_id_ >= 0, where_ << ": cannot encode '" << piece << "' and its unk_token '"
                                  << unk_token_ << "' is not in the vocabulary");
    return unk_id_;
  }

  std::string where_;
  Vocab vocab_;
  std::string unk_token_, prefix_;
  std::size_t max_chars_ = 100;
  int32_t unk_id_ = -1;
};

class WordLevelModel final : public Model {
 public:
  WordLevelModel(const json& model, const std::string& file)
      : where_("HuggingFaceTokenizer: '" + file + "' model WordLevel"),
        vocab_(model, where_),
        unk_token_(string_or(model, "unk_token", "<unk>")),
        unk_id_(vocab_.find(unk_token_)) {}

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const override {
    if (piece.empty()) return;
    if (const int32_t id = vocab_.find(std::string(piece)); id >= 0) {
      out.push_back(id);
      return;
    }
    MG_CHECK(unk_id_ >= 0, where_ << ": '" << piece << "' is not in the vocabulary and its "
                                  << "unk_token '" << unk_token_ << "' is not either");
    out.push_back(unk_id_);
  }
  int32_t token_to_id(std::string_view token) const override {
    return vocab_.find(std::string(token));
  }
  const std::string* id_to_token(int32_t id) const override { return vocab_.token(id); }
  std::size_t vocab_size() const override { return vocab_.size(); }

 private:
  std::string where_;
  Vocab vocab_;
  std::string unk_token_;
  int32_t unk_id_;
};

}  // namespace

std::unique_ptr<Model> make_wordpiece_model(const json& model, const std::string& file) {
  return std::make_unique<WordPieceModel>(model, file);
}
std::unique_ptr<Model> make_wordlevel_model(const json& model, const std::string& file) {
  return std::make_unique<WordLevelModel>(model, file);
}

}  // namespace mg::tokenizers::hf
