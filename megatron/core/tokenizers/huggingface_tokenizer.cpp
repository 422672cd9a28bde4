// HuggingFaceTokenizer (see huggingface_tokenizer.h): loading tokenizer.json and
// tokenizer_config.json, added-token splitting, the encode pipeline, post-processor ids, decoding.
#include "megatron/core/tokenizers/huggingface_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/hf/components.h"
#include "megatron/core/tokenizers/hf/model.h"
#include "megatron/core/tokenizers/hf/text.h"

namespace mg::tokenizers {

using nlohmann::json;

namespace {

constexpr const char* kSupportedPostProcessors =
    "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence";
constexpr const char* kEosFallback[] = {"</s>",  "<|endoftext|>", "<|end_of_text|>",
                                        "<eos>", "<|im_end|>",    "[SEP]"};

json read_json(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  MG_CHECK(in.good(), "HuggingFaceTokenizer: cannot open " << what << " '" << path << "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    MG_THROW("HuggingFaceTokenizer: " << what << " '" << path
                                      << "' is not valid JSON: " << e.what());
  }
}

// A component's own error, prefixed with the file it came from.
[[noreturn]] void rethrow_with_file(const std::string& file, const std::string& message) {
  constexpr std::string_view kPrefix = "HuggingFaceTokenizer: ";
  std::string_view m = message;
  if (m.starts_with(kPrefix)) m.remove_prefix(kPrefix.size());
  if (m.starts_with("'" + file + "'")) MG_THROW(kPrefix << m);  // already names the file
  MG_THROW("HuggingFaceTokenizer: '" << file << "': " << m);
}

// Whitespace run ending at end (start of it), and starting at begin (end of it).
std::size_t whitespace_start_before(const std::string& s, std::size_t end) {
  while (end > 0) {
    std::size_t b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    std::size_t len;
    if (!hf::is_whitespace(hf::utf8_decode(s, b, len))) break;
    end = b;
  }
  return end;
}
std::size_t whitespace_end_after(const std::string& s, std::size_t begin) {
  while (begin < s.size()) {
    std::size_t len;
    if (!hf::is_whitespace(hf::utf8_decode(s, begin, len))) break;
    begin += len;
  }
  return begin;
}
bool word_char_before(const std::string& s, std::size_t end) {
  if (end == 0) return false;
  std::size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  std::size_t len;
  return hf::is_word_char(hf::utf8_decode(s, b, len));
}
bool word_char_at(const std::string& s, std::size_t begin) {
  std::size_t len;
  return begin < s.size() && hf::is_word_char(hf::utf8_decode(s, begin, len));
}

// Post-processor -> the ids it puts before and after a single sequence.
void post_processor_ids(const json& j, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (j.is_null()) return;
  MG_CHECK(j.is_object() && j.contains("type"),
           "post_processor must be an object with a \"type\", got " << j.dump().substr(0, 200));
  const auto type = j["type"].get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) {
      std::vector<int32_t> pre, suf;
      post_processor_ids(p, pre, suf);
      prefix.insert(prefix.begin(), pre.begin(), pre.end());  // a later processor wraps
      suffix.insert(suffix.end(), suf.begin(), suf.end());
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    // {"cls": ["<s>", 0], "sep": ["</s>", 2]}: cls A sep.
    prefix.push_back(j.at("cls").at(1).get<int32_t>());
    suffix.insert(suffix.begin(), j.at("sep").at(1).get<int32_t>());
    return;
  }
  if (type == "TemplateProcessing") {
    const json& specials = j.at("special_tokens");
    std::vector<int32_t> pre, suf;
    int sequences = 0;
    for (const auto& item : j.at("single")) {
      if (item.contains("Sequence")) {
        const auto id = item["Sequence"].at("id").get<std::string>();
        MG_CHECK(id == "A", "post_processor TemplateProcessing: the single template uses sequence '"
                                << id << "'; only A exists for one sequence");
        ++sequences;
        continue;
      }
      MG_CHECK(item.contains("SpecialToken"), "post_processor TemplateProcessing: template item "
                                                  << item.dump() << " is neither Sequence nor "
                                                  << "SpecialToken");
      const auto name = item["SpecialToken"].at("id").get<std::string>();
      MG_CHECK(specials.contains(name), "post_processor TemplateProcessing: special token '"
                                            << name << "' is not in its special_tokens");
      auto& dst = sequences == 0 ? pre : suf;
      for (const auto& id : specials[name].at("ids")) dst.push_back(id.get<int32_t>());
    }
    MG_CHECK(sequences == 1,
             "post_processor TemplateProcessing: the single template must hold $A "
             "once, holds it "
                 << sequences << " times");
    prefix.insert(prefix.begin(), pre.begin(), pre.end());
    suffix.insert(suffix.end(), suf.begin(), suf.end());
    return;
  }
  MG_THROW("post_processor type '"
           << type << "' is not supported (supported: " << kSupportedPostProcessors << ")");
}

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path, bool add_special_tokens)
    : add_special_tokens_(add_special_tokens) {
  namespace fs = std::filesystem;
  std::error_code ec;
  file_ = fs::is_directory(path, ec) ? (fs::path(path) / "tokenizer.json").string() : path;
  MG_CHECK(!path.empty(),
           "HuggingFaceTokenizer: --tokenizer-model is empty; give a tokenizer.json "
           "file or a directory holding one");
  const json root = read_json(file_, "tokenizer file");
  MG_CHECK(root.is_object() && root.contains("model"),
           "HuggingFaceTokenizer: '" << file_ << "' is not a tokenizer.json (no \"model\")");
  try {
    model_ = hf::make_model(root["model"], file_);
    normalizer_ = hf::make_normalizer(root.value("normalizer", json()));
    pre_tokenizer_ = hf::make_pre_tokenizer(root.value("pre_tokenizer", json()));
    decoder_ = hf::make_decoder(root.value("decoder", json()));
    post_processor_ids(root.value("post_processor", json()), prefix_ids_, suffix_ids_);

    for (const auto& t : root.value("added_tokens", json::array())) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      a.id = t.at("id").get<int32_t>();
      a.single_word = t.value("single_word", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.special = t.value("special", false);
      a.normalized = t.value("normalized", !a.special);
      a.match = a.content;
      if (a.normalized && normalizer_) normalizer_->normalize(a.match);
      added_.push_back(std::move(a));
    }
  } catch (const Error& e) {
    rethrow_with_file(file_, e.message());
  } catch (const json::exception& e) {
    MG_THROW("HuggingFaceTokenizer: '" << file_ << "' is malformed: " << e.what());
  }
  std::unordered_set<std::string_view> added_not_in_model;
  for (const auto& a : added_) {
    added_by_id_[a.id] = a.content;
    if (model_->token_to_id(a.content) < 0) added_not_in_model.insert(a.content);
    if (a.match.empty()) continue;
    AddedSet& set = a.normalized ? normalized_added_ : raw_added_;
    set.tokens.push_back(&a);
    set.first_byte[static_cast<unsigned char>(a.match[0])] = true;
  }
  vocab_size_ = static_cast<int64_t>(model_->vocab_size() + added_not_in_model.size());

  // eod = eos_token, from tokenizer_config.json as AutoTokenizer reads it, else a known name.
  const fs::path config = fs::path(file_).parent_path() / "tokenizer_config.json";
  std::string eos;
  if (fs::exists(config, ec)) {
    const json cfg = read_json(config.string(), "tokenizer config");
    if (cfg.is_object() && cfg.contains("eos_token")) {
      const json& e = cfg["eos_token"];
      if (e.is_string()) eos = e.get<std::string>();
      if (e.is_object() && e.contains("content")) eos = e["content"].get<std::string>();
    }
    if (!eos.empty()) {
      eod_ = token_to_id(eos);
      MG_CHECK(eod_ >= 0, "HuggingFaceTokenizer: eos_token '" << eos << "' of '" << config.string()
                                                              << "' is not a token of '" << file_
                                                              << "'");
    }
  }
  if (eos.empty()) {
    for (const char* name : kEosFallback) {
      if ((eod_ = token_to_id(name)) >= 0) break;
    }
    MG_CHECK(eod_ >= 0, "HuggingFaceTokenizer: no eos token for '"
                            << file_ << "': no tokenizer_config.json with an eos_token beside it, "
                            << "and none of </s>, <|endoftext|>, <|end_of_text|>, <eos>, "
                            << "<|im_end|>, [SEP] is in the vocabulary");
  }
}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

int32_t HuggingFaceTokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : added_)
    if (a.content == token) return a.id;
  return model_->token_to_id(token);
}

void HuggingFaceTokenizer::split_added(const AddedSet& set, Segment seg,
                                       std::vector<Segment>& out) const {
  if (seg.text.empty()) return;
  if (set.tokens.empty()) {
    out.push_back(std::move(seg));
    return;
  }
  const std::string& s = seg.text;
  auto emit_text = [&](std::size_t b, std::size_t e) {
    if (e > b) out.push_back({s.substr(b, e - b), seg.offset + b, -1});
  };
  std::size_t start_offset = 0;
  for (std::size_t i = 0; i < s.size();) {
    const AddedToken* best = nullptr;
    if (set.first_byte[static_cast<unsigned char>(s[i])]) {
      for (const AddedToken* a : set.tokens) {
        if ((!best || a->match.size() > best->match.size()) &&
            s.compare(i, a->match.size(), a->match) == 0)
          best = a;
      }
    }
    if (!best) {
      ++i;
      continue;
    }
    std::size_t start = i, stop = i + best->match.size();
    i = stop;  // the search resumes after the match, whatever is done with it below
    if (best->single_word && (word_char_before(s, start) || word_char_at(s, stop))) continue;
    if (best->lstrip) start = std::max(whitespace_start_before(s, start), start_offset);
    if (best->rstrip) stop = whitespace_end_after(s, stop);
    emit_text(start_offset, start);
    out.push_back({std::string(), seg.offset + start, best->id});
    start_offset = stop;
  }
  emit_text(start_offset, s.size());
}

std::vector<int32_t> HuggingFaceTokenizer::tokenize(std::string_view text) const {
  return encode(text, add_special_tokens_);
}

std::vector<int32_t> HuggingFaceTokenizer::encode(std::string_view text,
                                                  bool add_special_tokens) const {
  if (const std::size_t bad = hf::utf8_error_offset(text); bad != std::string_view::npos) {
    MG_THROW("HuggingFaceTokenizer::tokenize: input is not valid UTF-8 at byte " << bad << " of "
                                                                                 << text.size());
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  std::vector<Segment> raw, segments;
  split_added(raw_added_, {std::string(text), 0, -1}, raw);
  for (auto& seg : raw) {
    if (seg.id >= 0) {
      segments.push_back(std::move(seg));
      continue;
    }
    if (normalizer_) normalizer_->normalize(seg.text);
    split_added(normalized_added_, std::move(seg), segments);
  }
  std::vector<hf::Piece> pieces;
  for (auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({std::move(seg.text), seg.offset});
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    for (const auto& p : pieces) model_->tokenize(p.text, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string HuggingFaceTokenizer::detokenize(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (auto it = added_by_id_.find(ids[i]); it != added_by_id_.end()) {
      tokens.push_back(it->second);
    } else if (const std::string* t = model_->id_to_token(ids[i])) {
      tokens.push_back(*t);
    } else {
      MG_THROW("HuggingFaceTokenizer::detokenize: id " << ids[i] << " at position " << i
                                                       << " is not a token of '" << file_
                                                       << "' (vocab size " << vocab_size_ << ")");
    }
  }
  std::string out;
  if (!decoder_) {  // HF joins the tokens with spaces when there is no decoder
    for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  decoder_->decode_chain(tokens);
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace mg::tokenizers
