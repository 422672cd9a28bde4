// The Unigram model of a tokenizer.json ("model": {"type": "Unigram", "unk_id": 0,
// "vocab": [["<unk>", 0.0], ["▁the", -3.2], ...], "byte_fallback": false}), encoding one piece as
// tokenizers 0.21's models/unigram/model.rs (encode_optimized, sentencepiece's unigram_model.cc):
//   1. Viterbi over byte positions: every vocabulary piece that starts at a character boundary
//      (a trie's common-prefix search, shortest first) offers an edge weighted by its score; where
//      no single-character piece exists, an unk edge of (lowest score - 10) covers one character.
//      Ties keep the path found first (a strictly higher score replaces it).
//   2. Back-tracking, consecutive unk characters are fused into one string (Unigram always fuses).
//   3. Each string becomes the id of the piece spelled the same; a string that is no piece (a fused
//      unknown run) becomes its <0xXX> byte pieces when byte_fallback is on and all of them exist,
//      else unk_id.
// Any vocabulary string can match input text, "<unk>" and "<0x41>" included, as in HF.
// Errors: an unknown character with no unk_id (HF's MissingUnkId) throws naming it.
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/hf/model.h"
#include "megatron/core/tokenizers/hf/text.h"

namespace mg::tokenizers::hf {

using nlohmann::json;

namespace {

constexpr double kUnkPenalty = 10.0;  // HF's K_UNK_PENALTY

class UnigramModel final : public Model {
 public:
  UnigramModel(const json& model, const std::string& file) : file_(file) {
    const std::string where = "HuggingFaceTokenizer: '" + file + "' model Unigram";
    auto vit = model.find("vocab");
    MG_CHECK(vit != model.end() && vit->is_array(),
             where << " has no \"vocab\" array of [piece, score] pairs");
    pieces_.reserve(vit->size());
    scores_.reserve(vit->size());
    double min_score = std::numeric_limits<double>::infinity();
    for (const auto& entry : *vit) {
      MG_CHECK(
          entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_number(),
          where << ": vocab entry " << pieces_.size() << " " << entry.dump().substr(0, 200)
                << " is not [\"piece\", score]");
      const auto id = static_cast<int32_t>(pieces_.size());
      pieces_.push_back(entry[0].get<std::string>());
      scores_.push_back(entry[1].get<double>());
      min_score = std::min(min_score, scores_.back());
      ids_[pieces_.back()] = id;  // a repeated piece keeps its last id, as HF's HashMap insert
    }
    unk_score_ = min_score - kUnkPenalty;
    if (auto it = model.find("unk_id"); it != model.end() && !it->is_null()) {
      MG_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0 &&
                   it->get<int64_t>() < static_cast<int64_t>(pieces_.size()),
               where << ": unk_id " << it->dump() << " is not an id of its vocabulary of "
                     << pieces_.size() << " pieces");
      unk_id_ = it->get<int32_t>();
    }
    if (auto it = model.find("byte_fallback"); it != model.end() && !it->is_null())
      byte_fallback_ = it->get<bool>();
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      byte_ids_[b] = token_to_id(name);
    }
    // Trie over the bytes of every piece; a node's id is that of the piece ending there.
    nodes_.push_back(-1);
    for (const auto& [piece, id] : ids_) {
      uint32_t node = 0;
      for (char c : piece) {
        const uint64_t key = edge_key(node, c);
        auto e = edges_.find(key);
        if (e == edges_.end()) {
          e = edges_.emplace(key, static_cast<uint32_t>(nodes_.size())).first;
          nodes_.push_back(-1);
        }
        node = e->second;
      }
      nodes_[node] = id;
    }
  }

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const override {
    if (piece.empty()) return;
    for (const std::string& s : viterbi(piece)) {
      if (const int32_t id = token_to_id(s); id >= 0) {
        out.push_back(id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          for (char c : s) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
          continue;
        }
      }
      out.push_back(require_unk(s));
    }
  }

  int32_t token_to_id(std::string_view token) const override {
    auto it = ids_.find(std::string(token));
    return it == ids_.end() ? -1 : it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size()) return nullptr;
    return &pieces_[static_cast<std::size_t>(id)];
  }
  std::size_t vocab_size() const override { return pieces_.size(); }

 private:
  static uint64_t edge_key(uint32_t node, char c) {
    return (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }

  int32_t require_unk(std::string_view what) const {
    MG_CHECK(unk_id_ >= 0, "HuggingFaceTokenizer: '"
                               << file_ << "': the Unigram model cannot encode '" << what
                               << "' (no piece covers it) and has no unk_id"
                               << (byte_fallback_ ? " or byte pieces for it" : ""));
    return unk_id_;
  }

  // The best segmentation of text as strings (unknown runs fused).
  std::vector<std::string> viterbi(std::string_view text) const {
    struct Node {
      int32_t id = -1;
      double score = 0;
      std::size_t start = std::string_view::npos;  // npos: not reached yet
    };
    const std::size_t n = text.size();
    std::vector<Node> best(n + 1);
    for (std::size_t start = 0; start < n;) {
      const double base = best[start].score;
      const std::size_t char_len = utf8_len(static_cast<unsigned char>(text[start]));
      bool single_char_piece = false;
      uint32_t node = 0;
      for (std::size_t end = start; end < n;) {
        auto e = edges_.find(edge_key(node, text[end]));
        if (e == edges_.end()) break;
        node = e->second;
        ++end;
        const int32_t id = nodes_[node];
        if (id < 0) continue;
        const double score = base + scores_[static_cast<std::size_t>(id)];
        Node& target = best[end];
        if (target.start == std::string_view::npos || score > target.score)
          target = Node{id, score, start};
        if (end - start == char_len) single_char_piece = true;
      }
      if (!single_char_piece) {
        Node& target = best[start + char_len];
        const double score = base + unk_score_;
        if (target.start == std::string_view::npos || score > target.score)
          target = Node{require_unk(text.substr(start, char_len)), score, start};
      }
      start += char_len;
    }
    std::vector<std::string> rev;
    std::string unk_run;  // characters of consecutive unk nodes, back to front
    std::vector<std::string_view> unk_parts;
    auto flush = [&] {
      if (unk_parts.empty()) return;
      unk_run.clear();
      for (auto it = unk_parts.rbegin(); it != unk_parts.rend(); ++it) unk_run.append(*it);
      rev.push_back(unk_run);
      unk_parts.clear();
    };
    for (std::size_t end = n; end > 0;) {
      const Node& node = best[end];
      const std::string_view s = text.substr(node.start, end - node.start);
      if (unk_id_ >= 0 && node.id == unk_id_) {
        unk_parts.push_back(s);
      } else {
        flush();
        rev.emplace_back(s);
      }
      end = node.start;
    }
    flush();
    return {rev.rbegin(), rev.rend()};
  }

  std::string file_;
  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<int32_t> nodes_;                    // trie node -> piece id or -1
  std::unordered_map<uint64_t, uint32_t> edges_;  // (node << 8 | byte) -> child node
  double unk_score_ = 0;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  int32_t byte_ids_[256] = {};
};

}  // namespace

std::unique_ptr<Model> make_unigram_model(const json& model, const std::string& file) {
  return std::make_unique<UnigramModel>(model, file);
}

}  // namespace mg::tokenizers::hf
