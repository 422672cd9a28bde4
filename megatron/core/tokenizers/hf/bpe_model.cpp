// BpeModel (see bpe_model.h): vocabulary and merge parsing, the per-character word construction
// and HF's priority-queue merge loop (models/bpe/word.rs, merge_all without dropout).
#include "megatron/core/tokenizers/hf/bpe_model.h"

#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/hf/text.h"

namespace mg::tokenizers::hf {

using nlohmann::json;

namespace {
std::string opt_string(const json& m, const char* key) {
  auto it = m.find(key);
  return (it == m.end() || it->is_null()) ? std::string() : it->get<std::string>();
}
bool opt_bool(const json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && !it->is_null() && it->get<bool>();
}
}  // namespace

BpeModel::BpeModel(const json& model, const std::string& file) {
  const std::string where = "HuggingFaceTokenizer: '" + file + "' model";
  MG_CHECK(model.contains("vocab") && model["vocab"].is_object(),
           where << " has no \"vocab\" object {token: id}");
  MG_CHECK(model.contains("merges") && model["merges"].is_array(),
           where << " has no \"merges\" array");
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    MG_CHECK(it->get<double>() == 0.0, where << " has BPE dropout " << it->dump()
                                             << "; only null or 0 (deterministic) is supported");
  }
  int64_t max_id = -1;
  for (const auto& [token, id] : model["vocab"].items()) {
    MG_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX,
             where << ": token '" << token << "' has id " << id.dump()
                   << ", expected an integer in [0, 2^31-1)");
    vocab_.emplace(token, id.get<int32_t>());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  id_to_token_.resize(static_cast<std::size_t>(max_id + 1));
  has_id_.assign(static_cast<std::size_t>(max_id + 1), 0);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[static_cast<std::size_t>(id)] = token;
    has_id_[static_cast<std::size_t>(id)] = 1;
  }

  continuing_subword_prefix_ = opt_string(model, "continuing_subword_prefix");
  end_of_word_suffix_ = opt_string(model, "end_of_word_suffix");
  fuse_unk_ = opt_bool(model, "fuse_unk");
  byte_fallback_ = opt_bool(model, "byte_fallback");
  ignore_merges_ = opt_bool(model, "ignore_merges");
  if (const std::string unk = opt_string(model, "unk_token"); !unk.empty()) {
    unk_id_ = token_to_id(unk);
    MG_CHECK(unk_id_ >= 0, where << ": unk_token '" << unk << "' is not in the vocabulary");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
  }

  const std::size_t prefix_len = continuing_subword_prefix_.size();
  int32_t rank = 0;
  for (const auto& m : model["merges"]) {
    std::string left, right;
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      const std::size_t sp = s.find(' ');
      MG_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
               where << ": merge " << rank << " '" << s << "' is not 'left right'");
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else {
      MG_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               where << ": merge " << rank << " " << m.dump() << " is not [\"left\", \"right\"]");
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    }
    const int32_t l = token_to_id(left), r = token_to_id(right);
    MG_CHECK(l >= 0 && r >= 0, where << ": merge " << rank << " ('" << left << "', '" << right
                                     << "') uses a token missing from the vocabulary");
    const std::string merged =
        left + (right.size() >= prefix_len ? right.substr(prefix_len) : std::string());
    const int32_t result = token_to_id(merged);
    MG_CHECK(result >= 0, where << ": merge " << rank << " ('" << left << "', '" << right
                                << "') makes '" << merged << "', which is not in the vocabulary");
    // As HF's HashMap collect: a repeated pair keeps its last rank.
    merges_[(static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r)] = Merge{rank, result};
    ++rank;
  }
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= has_id_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[static_cast<std::size_t>(id)];
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, false});
    if (n > 0) symbols[static_cast<std::size_t>(n - 1)].next = n;
  };
  int32_t pending_unk = -1;  // an unknown run not yet added (HF's `unk`)
  std::string s;
  for (std::size_t i = 0; i < w.size();) {
    const std::size_t len = utf8_len(static_cast<unsigned char>(w[i]));
    const bool is_first = i == 0, is_last = i + len >= w.size();
    s.assign(w.substr(i, len));
    if (!is_first && !continuing_subword_prefix_.empty()) s.insert(0, continuing_subword_prefix_);
    if (is_last && !end_of_word_suffix_.empty()) s += end_of_word_suffix_;
    i += len;
    const int32_t id = token_to_id(s);
    if (id >= 0) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {  // as HF: a pending unk is not flushed first
        for (char c : s) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  // Lowest rank first, then leftmost position.
  struct Candidate {
    int32_t rank, pos, result;
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;  // max-heap of the smallest
    }
  };
  auto lookup = [&](int32_t a, int32_t b) -> const Merge* {
    auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<Candidate> queue;
  for (std::size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const Merge* m = lookup(symbols[k].id, symbols[k + 1].id))
      queue.push({m->rank, static_cast<int32_t>(k), m->result});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<std::size_t>(top.pos)];
    if (cur.removed || cur.next < 0) continue;
    const Symbol right = symbols[static_cast<std::size_t>(cur.next)];
    const Merge* m = lookup(cur.id, right.id);
    if (m == nullptr || m->result != top.result) continue;  // expired entry
    cur.id = top.result;
    symbols[static_cast<std::size_t>(cur.next)].removed = true;
    cur.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* pm = lookup(symbols[static_cast<std::size_t>(cur.prev)].id, cur.id))
        queue.push({pm->rank, cur.prev, pm->result});
    }
    if (cur.next >= 0) {
      if (const Merge* nm = lookup(cur.id, symbols[static_cast<std::size_t>(cur.next)].id))
        queue.push({nm->rank, top.pos, nm->result});
    }
  }
  for (const auto& sym : symbols)
    if (!sym.removed) out.push_back(sym.id);
}

void BpeModel::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const int32_t id = token_to_id(piece); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t begin = out.size();
  merge_word(piece, out);
  // Long pieces (a whole document when there is no pre-tokenizer) are not cached, as in HF.
  if (piece.size() >= kMaxCachedPieceBytes) return;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.try_emplace(std::string(piece), out.begin() + static_cast<std::ptrdiff_t>(begin),
                     out.end());
}

}  // namespace mg::tokenizers::hf
