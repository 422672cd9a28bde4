// convert_checkpoint: HuggingFace <-> Megatron-CPP checkpoints (Megatron's tools/checkpoint/
// convert.py with the llama_mistral / mixtral_hf loaders and the HF saver, in one binary).
//
//   convert_checkpoint import --hf-dir D --save S [--tp N --pp M --ep E]
//                             [--make-vocab-size-divisible-by K]
//   convert_checkpoint export --load S --hf-dir D [--max-shard-size 5GB] [--tokenizer-... flags]
//   Megatron Bridge's spelling too: import --hf-model-path D --output-path S --tp N --pp M;
//   export --checkpoint-path S --output-path D.
//
// import: a HuggingFace directory (config.json + model.safetensors, or the shards named by
// model.safetensors.index.json) of a LLaMA (Llama 3.x RoPE scaling included), Mistral, Qwen2,
// Qwen3, GPT-2, Mixtral, Qwen2-MoE or Qwen3-MoE model becomes a checkpoint under S (iteration 0,
// tracker "0") holding every parameter by its Megatron-Core name with its global shape
// (FORMATS.md §6):
//   q/k/v_proj -> linear_qkv in Megatron's grouped GQA layout (§6.2; biases too, Qwen2),
//   q_norm / k_norm -> self_attention.q_layernorm / k_layernorm (Qwen3),
//   gate_proj ⊕ up_proj -> linear_fc1 [gate; up] (§6.3), for the experts too (Mixtral's w1 ⊕ w3,
//   w2), the router (gate) -> mlp.router.weight, Qwen2-MoE's shared expert and its gate ->
//   mlp.shared_experts.*, GPT-2's Conv1D [in, out] transposed and its fused c_attn regrouped per
//   head, the vocabulary rows padded with zeros to a multiple of --make-vocab-size-divisible-by x
//   TP (Megatron's rule), tied heads left tied (no output_layer.weight), untied lm_head ->
//   output_layer.weight.
// Checkpoints are layout-independent (global tensors, experts by global index), so one import
// serves every --tp/--pp/--ep: those flags are validated against the model (heads, query groups,
// layers, experts) and written, with the other flags that train this model (RoPE scaling, MoE
// routing), to S/model_args.yaml (for --yaml-cfg) and to the checkpoint's recorded args. The
// original config.json and the tokenizer / generation files are kept in the checkpoint
// ("extra": hf_model_type, hf_config, hf_files), which training carries into its checkpoints.
// export: the checkpoint's model (rebuilt from its recorded flags, any layout its loader accepts)
// back to a HuggingFace directory that transformers loads: the same tensor names, dtypes and
// values (bit for bit after an import), the padding rows dropped, config.json and the kept files
// from the import (or config.json made from the model's flags for a model trained here).
// Refused with a message naming the field: RoPE scaling other than linear / llama3 / yarn,
// sliding-window attention shorter than the positions, Llama attention/MLP biases, activations
// other than SiLU (LLaMA family) or GELU (GPT-2), router jitter, GPT-2's
// scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/error.h"
#include "megatron/core/common/progress.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/rope_scaling.h"
#include "megatron/runtime.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_model.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/model_provider.h"

namespace fs = std::filesystem;
using mg::Shape;
using mg::Tensor;
using nlohmann::json;
namespace st = mg::dist_checkpointing;

namespace {

// ---- HF directory reading -----------------------------------------------------------------------

struct HfTensors {
  std::vector<std::unique_ptr<st::SafetensorsFile>> files;
  std::map<std::string, const st::SafetensorsFile*> where;
  std::set<std::string> used;

  explicit HfTensors(const std::string& dir) {
    const auto storage = st::storage_for(dir);
    const std::string single = st::join_path(dir, "model.safetensors"),
                      index = st::join_path(dir, "model.safetensors.index.json");
    if (storage->exists(index)) {
      json j;
      try {
        j = json::parse(storage->read_object(index));
      } catch (const json::exception& e) {
        MG_THROW("'" << index << "' is not valid JSON: " << e.what());
      }
      MG_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
               "'" << index << "' has no \"weight_map\" object");
      std::map<std::string, const st::SafetensorsFile*> by_file;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        const std::string file = it.value().get<std::string>();
        if (!by_file.count(file)) {
          const std::string p = st::join_path(dir, file);
          MG_CHECK(storage->exists(p), "shard '" << p << "' named by '" << index << "' for tensor '"
                                                 << it.key() << "' is missing");
          files.push_back(std::make_unique<st::SafetensorsFile>(*storage, p));
          by_file[file] = files.back().get();
        }
        MG_CHECK(by_file[file]->contains(it.key()), "tensor '" << it.key() << "' is not in shard '"
                                                               << st::join_path(dir, file)
                                                               << "' as the index says");
        where[it.key()] = by_file[file];
      }
    } else {
      MG_CHECK(storage->exists(single), "'" << dir
                                            << "' has neither model.safetensors nor "
                                               "model.safetensors.index.json (only safetensors "
                                               "checkpoints are read; convert .bin files first)");
      files.push_back(std::make_unique<st::SafetensorsFile>(*storage, single));
      for (const auto& n : files.back()->names()) where[n] = files.back().get();
    }
  }
  bool has(const std::string& name) const { return where.count(name) != 0; }
  Tensor get(const std::string& name, const Shape& shape) {
    auto it = where.find(name);
    MG_CHECK(it != where.end(), "the HuggingFace checkpoint has no tensor '" << name << "'");
    Tensor t = it->second->tensor(name);
    // Import guard: a NaN/inf in the HF weights would be imported and generate garbage.
    if (mg::is_floating(t.dtype())) {
      const std::vector<double> v = t.to_vector<double>();
      std::size_t bad = 0, first = 0;
      for (std::size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]) && bad++ == 0) first = i;
      MG_CHECK(bad == 0, "HuggingFace tensor '" << name << "' in '" << it->second->path()
                                                << "' holds " << bad << " NaN/inf value(s) (the "
                                                << "first at flat index " << first
                                                << "): the checkpoint is corrupt; nothing was "
                                                   "imported");
    }
    MG_CHECK(t.shape() == shape, "HuggingFace tensor '" << name << "' has shape "
                                                        << mg::shape_str(t.shape()) << ", expected "
                                                        << mg::shape_str(shape)
                                                        << " from config.json");
    used.insert(name);
    return t;
  }
};

// ---- host tensor helpers (byte copies: conversions are exact) ----------------------------------

// [R, C] -> [C, R].
Tensor transpose2d(const Tensor& t) {
  MG_CHECK(t.dim() == 2, "transpose2d: " << t.str());
  const int64_t r = t.size(0), c = t.size(1);
  const std::size_t es = mg::dtype_size(t.dtype());
  Tensor out = Tensor::empty({c, r}, t.dtype());
  const auto* src = static_cast<const unsigned char*>(t.raw_data());
  auto* dst = static_cast<unsigned char*>(out.raw_data());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) std::memcpy(dst + (j * r + i) * es, src + (i * c + j) * es, es);
  return out;
}

// Concatenation along dim 0 (same trailing shape and dtype).
Tensor cat0(const std::vector<Tensor>& parts) {
  Shape s = parts.at(0).shape();
  int64_t rows = 0;
  for (const auto& p : parts) rows += p.size(0);
  s[0] = rows;
  Tensor out = Tensor::empty(s, parts[0].dtype());
  int64_t at = 0;
  for (const auto& p : parts) {
    out.slice(at, p.size(0)).copy_(p);
    at += p.size(0);
  }
  return out;
}

// HF q [NH HD, ..], k, v [NG HD, ..] -> Megatron's grouped [(NH + 2 NG) HD, ..] (FORMATS.md §6.2).
Tensor group_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t nh, int64_t ng,
                 int64_t hd) {
  const int64_t qpg = nh / ng;
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < ng; ++g) {
    parts.push_back(q.slice(g * qpg * hd, qpg * hd));
    parts.push_back(k.slice(g * hd, hd));
    parts.push_back(v.slice(g * hd, hd));
  }
  return cat0(parts);
}

// The inverse: grouped -> q, k, v.
void ungroup_qkv(const Tensor& w, int64_t nh, int64_t ng, int64_t hd, Tensor& q, Tensor& k,
                 Tensor& v) {
  const int64_t qpg = nh / ng;
  std::vector<Tensor> qs, ks, vs;
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t base = g * (qpg + 2) * hd;
    qs.push_back(w.slice(base, qpg * hd));
    ks.push_back(w.slice(base + qpg * hd, hd));
    vs.push_back(w.slice(base + (qpg + 1) * hd, hd));
  }
  q = cat0(qs);
  k = cat0(ks);
  v = cat0(vs);
}

// Rows [0, V) of t, zero rows up to `rows`.
Tensor pad_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  Tensor out = Tensor::zeros(s, t.dtype());
  out.slice(0, t.size(0)).copy_(t);
  return out;
}

// ---- the model families ------------------------------------------------------------------------

enum class Family { llama, qwen2, mistral, gpt2, qwen3, mixtral, qwen2_moe, qwen3_moe };

// What each model_type is: its HF architecture and the features it has.
struct FamilyInfo {
  const char* model_type;
  Family family;
  const char* architecture;
  bool qkv_bias, qk_norm, moe;
};
constexpr FamilyInfo kFamilies[] = {
    {"llama", Family::llama, "LlamaForCausalLM", false, false, false},
    {"mistral", Family::mistral, "MistralForCausalLM", false, false, false},
    {"qwen2", Family::qwen2, "Qwen2ForCausalLM", true, false, false},
    {"gpt2", Family::gpt2, "GPT2LMHeadModel", false, false, false},
    {"qwen3", Family::qwen3, "Qwen3ForCausalLM", false, true, false},
    {"mixtral", Family::mixtral, "MixtralForCausalLM", false, false, true},
    {"qwen2_moe", Family::qwen2_moe, "Qwen2MoeForCausalLM", true, false, true},
    {"qwen3_moe", Family::qwen3_moe, "Qwen3MoeForCausalLM", false, true, true},
};

const FamilyInfo* family_info(const std::string& model_type) {
  for (const auto& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

std::string supported_types() {
  std::string s;
  for (const auto& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.model_type);
  return s;
}

struct HfModel {
  Family family = Family::llama;
  std::string model_type;
  int64_t layers = 0, hidden = 0, ffn = 0, heads = 0, groups = 0, head_dim = 0, vocab = 0;
  int64_t max_positions = 0;
  double eps = 1e-5, rope_theta = 10000.0;
  bool tied = false, qkv_bias = false, qk_norm = false, exact_gelu = false;
  double hidden_dropout = 0.0, attention_dropout = 0.0;
  mg::DType dtype = mg::DType::f32;
  mg::ops::RopeScaling rope_scaling;
  // Mixture of experts (mixtral, qwen2_moe, qwen3_moe).
  int64_t experts = 0, topk = 0, moe_ffn = 0, shared_ffn = 0;
  bool shared_gate = false, pre_softmax = false;
  std::vector<int> moe_layers;  // per layer: 1 = MoE
  double aux_loss_coeff = 0.0;
  bool moe() const { return experts > 0; }
  bool is_moe_layer(int64_t l) const { return moe() && moe_layers[static_cast<std::size_t>(l)]; }
};

template <typename T>
T need(const json& c, const char* key, const std::string& where) {
  MG_CHECK(c.contains(key) && !c[key].is_null(), where << ": config.json has no \"" << key << "\"");
  return c[key].get<T>();
}

// The JSON types of the config.json fields read here: a wrong one is an error naming the key
// (nlohmann's own type errors name none).
void check_config_types(const json& c, const std::string& where) {
  enum class Kind { integer, number, boolean, string, object };
  static const std::vector<std::pair<const char*, Kind>> kFields = {
      {"model_type", Kind::string},
      {"torch_dtype", Kind::string},
      {"dtype", Kind::string},
      {"vocab_size", Kind::integer},
      {"n_layer", Kind::integer},
      {"n_embd", Kind::integer},
      {"n_head", Kind::integer},
      {"n_inner", Kind::integer},
      {"n_positions", Kind::integer},
      {"num_hidden_layers", Kind::integer},
      {"hidden_size", Kind::integer},
      {"intermediate_size", Kind::integer},
      {"num_attention_heads", Kind::integer},
      {"num_key_value_heads", Kind::integer},
      {"head_dim", Kind::integer},
      {"max_position_embeddings", Kind::integer},
      {"sliding_window", Kind::integer},
      {"layer_norm_epsilon", Kind::number},
      {"rms_norm_eps", Kind::number},
      {"rope_theta", Kind::number},
      {"resid_pdrop", Kind::number},
      {"attn_pdrop", Kind::number},
      {"attention_dropout", Kind::number},
      {"tie_word_embeddings", Kind::boolean},
      {"attention_bias", Kind::boolean},
      {"mlp_bias", Kind::boolean},
      {"use_sliding_window", Kind::boolean},
      {"scale_attn_weights", Kind::boolean},
      {"scale_attn_by_inverse_layer_idx", Kind::boolean},
      {"reorder_and_upcast_attn", Kind::boolean},
      {"activation_function", Kind::string},
      {"hidden_act", Kind::string},
      {"rope_parameters", Kind::object},
      {"rope_scaling", Kind::object}};
  auto check = [&](const json& obj, const std::string& prefix) {
    for (const auto& [key, kind] : kFields) {
      if (!obj.contains(key) || obj[key].is_null()) continue;
      const json& v = obj[key];
      const bool ok = kind == Kind::integer   ? v.is_number_integer()
                      : kind == Kind::number  ? v.is_number()
                      : kind == Kind::boolean ? v.is_boolean()
                      : kind == Kind::string  ? v.is_string()
                                              : v.is_object();
      static constexpr const char* kNames[] = {"an integer", "a number", "true or false",
                                               "a string", "an object"};
      MG_CHECK(ok, where << ": \"" << prefix << key << "\" is " << v.dump() << " (a "
                         << v.type_name() << "), expected " << kNames[static_cast<int>(kind)]);
    }
  };
  check(c, "");
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    check(c["rope_parameters"], "rope_parameters.");
    const json& r = c["rope_parameters"];
    MG_CHECK(!r.contains("rope_type") || r["rope_type"].is_string(),
             where << ": \"rope_parameters.rope_type\" is " << r["rope_type"].dump()
                   << ", expected a string");
  }
}

double number_or(const json& c, const char* key, double dflt) {
  return c.contains(key) && !c[key].is_null() ? c[key].get<double>() : dflt;
}

// rope_theta and the scaling: transformers 5's "rope_parameters" or 4's "rope_theta" +
// "rope_scaling" ({"rope_type" or "type": ...}); each scaling as transformers computes it
// (modeling_rope_utils), in Megatron's terms.
void parse_rope(const json& c, HfModel& m, const std::string& where) {
  json rope = json::object();
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object())
    rope = c["rope_parameters"];
  else if (c.contains("rope_scaling") && c["rope_scaling"].is_object())
    rope = c["rope_scaling"];
  m.rope_theta = number_or(rope, "rope_theta", number_or(c, "rope_theta", 10000.0));
  m.rope_scaling = mg::ops::rope_scaling_from_hf(rope, m.max_positions, where);
}

HfModel parse_hf_config(const json& c, const std::string& where) {
  check_config_types(c, where);
  HfModel m;
  m.model_type = c.value("model_type", "");
  const FamilyInfo* info = family_info(m.model_type);
  MG_CHECK(info, where << ": model_type '" << m.model_type
                       << "' is not supported (supported: " << supported_types() << ")");
  m.family = info->family;
  const std::string dt = c.value("torch_dtype", c.value("dtype", "float32"));
  if (dt == "bfloat16")
    m.dtype = mg::DType::bf16;
  else if (dt == "float16")
    m.dtype = mg::DType::f16;
  else
    m.dtype = mg::DType::f32;
  m.vocab = need<int64_t>(c, "vocab_size", where);
  if (m.family == Family::gpt2) {
    m.layers = need<int64_t>(c, "n_layer", where);
    m.hidden = need<int64_t>(c, "n_embd", where);
    m.heads = need<int64_t>(c, "n_head", where);
    m.groups = m.heads;
    m.head_dim = m.hidden / m.heads;
    m.ffn = c.contains("n_inner") && !c["n_inner"].is_null() ? c["n_inner"].get<int64_t>()
                                                             : 4 * m.hidden;
    m.max_positions = need<int64_t>(c, "n_positions", where);
    m.eps = c.value("layer_norm_epsilon", 1e-5);
    m.tied = c.value("tie_word_embeddings", true);
    const std::string act = c.value("activation_function", "gelu_new");
    MG_CHECK(act == "gelu_new" || act == "gelu" || act == "gelu_pytorch_tanh",
             where << ": GPT-2 activation_function '" << act
                   << "' is not supported (gelu_new, gelu_pytorch_tanh, gelu)");
    m.exact_gelu = act == "gelu";
    MG_CHECK(!c.value("scale_attn_by_inverse_layer_idx", false) &&
                 !c.value("reorder_and_upcast_attn", false),
             where << ": GPT-2 scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are "
                      "not supported");
    MG_CHECK(c.value("scale_attn_weights", true),
             where << ": GPT-2 scale_attn_weights false is not supported");
    m.hidden_dropout = c.value("resid_pdrop", 0.1);
    m.attention_dropout = c.value("attn_pdrop", 0.1);
    return m;
  }
  m.layers = need<int64_t>(c, "num_hidden_layers", where);
  m.hidden = need<int64_t>(c, "hidden_size", where);
  m.ffn = need<int64_t>(c, "intermediate_size", where);
  m.heads = need<int64_t>(c, "num_attention_heads", where);
  m.groups = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                 ? c["num_key_value_heads"].get<int64_t>()
                 : m.heads;
  m.head_dim = c.contains("head_dim") && !c["head_dim"].is_null() ? c["head_dim"].get<int64_t>()
                                                                  : m.hidden / m.heads;
  m.max_positions = need<int64_t>(c, "max_position_embeddings", where);
  m.eps = c.value("rms_norm_eps", 1e-6);
  m.tied = c.value("tie_word_embeddings", false);
  m.qkv_bias = info->qkv_bias;
  m.qk_norm = info->qk_norm;
  const std::string act = c.value("hidden_act", "silu");
  MG_CHECK(act == "silu", where << ": hidden_act '" << act << "' is not supported (silu: SwiGLU)");
  parse_rope(c, m, where);
  MG_CHECK(!c.value("attention_bias", false),
           where << ": attention_bias true (biases on q/k/v/o) is not supported");
  MG_CHECK(!c.value("mlp_bias", false), where << ": mlp_bias true is not supported");
  const bool sliding = m.family == Family::mistral || m.family == Family::mixtral ||
                       c.value("use_sliding_window", false);
  if (sliding && c.contains("sliding_window") && !c["sliding_window"].is_null())
    MG_CHECK(c["sliding_window"].get<int64_t>() >= m.max_positions,
             where << ": sliding_window " << c["sliding_window"].get<int64_t>()
                   << " < max_position_embeddings " << m.max_positions
                   << ": sliding-window attention is not supported");
  m.attention_dropout = c.value("attention_dropout", 0.0);
  if (info->moe) {
    const bool mixtral = m.family == Family::mixtral;
    // Mixtral and transformers 5 say num_local_experts, Qwen's hub configs num_experts.
    m.experts = need<int64_t>(c,
                              c.contains("num_local_experts") && !c["num_local_experts"].is_null()
                                  ? "num_local_experts"
                                  : "num_experts",
                              where);
    m.topk = need<int64_t>(c, "num_experts_per_tok", where);
    m.moe_ffn = mixtral ? m.ffn : need<int64_t>(c, "moe_intermediate_size", where);
    // Mixtral renormalises the top-k probabilities (= softmax over the top k logits, Megatron's
    // default); Qwen's norm_topk_prob false keeps the full softmax's (--moe-router-pre-softmax).
    m.pre_softmax = !mixtral && !c.value("norm_topk_prob", m.family == Family::qwen3_moe);
    if (m.family == Family::qwen2_moe) {
      m.shared_ffn = need<int64_t>(c, "shared_expert_intermediate_size", where);
      m.shared_gate = m.shared_ffn > 0;
    }
    // Which layers are MoE: transformers' decoder_sparse_step and mlp_only_layers.
    const int64_t step = mixtral ? 1 : c.value("decoder_sparse_step", int64_t{1});
    MG_CHECK(step >= 1, where << ": decoder_sparse_step " << step << " must be >= 1");
    std::set<int64_t> dense;
    if (c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array())
      for (const auto& v : c["mlp_only_layers"]) dense.insert(v.get<int64_t>());
    for (int64_t l = 0; l < m.layers; ++l)
      m.moe_layers.push_back(!dense.count(l) && (l + 1) % step == 0 ? 1 : 0);
    // The aux loss is part of HF's training loss only with output_router_logits.
    if (c.value("output_router_logits", false))
      m.aux_loss_coeff = c.value("router_aux_loss_coef", 0.001);
    MG_CHECK(c.value("router_jitter_noise", 0.0) == 0.0,
             where << ": router_jitter_noise " << c.value("router_jitter_noise", 0.0)
                   << " is not supported (0)");
  }
  return m;
}

std::string num(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

// Megatron's flags that build (and train) this model; (flag, values) pairs in order.
std::vector<std::pair<std::string, std::vector<std::string>>> model_flags(const HfModel& m,
                                                                          int64_t divisible_by,
                                                                          int tp, int pp) {
  std::vector<std::pair<std::string, std::vector<std::string>>> f;
  auto add = [&f](const std::string& k, std::vector<std::string> v = {}) {
    f.emplace_back(k, std::move(v));
  };
  add("--num-layers", {std::to_string(m.layers)});
  add("--hidden-size", {std::to_string(m.hidden)});
  add("--ffn-hidden-size", {std::to_string(m.ffn)});
  add("--num-attention-heads", {std::to_string(m.heads)});
  if (m.head_dim * m.heads != m.hidden) add("--kv-channels", {std::to_string(m.head_dim)});
  if (m.groups != m.heads) {
    add("--group-query-attention");
    add("--num-query-groups", {std::to_string(m.groups)});
  }
  add("--max-position-embeddings", {std::to_string(m.max_positions)});
  add("--seq-length", {std::to_string(std::min<int64_t>(m.max_positions, 4096))});
  add("--norm-epsilon", {num(m.eps)});
  if (m.family == Family::gpt2) {
    add("--normalization", {"LayerNorm"});
    add("--position-embedding-type", {"learned_absolute"});
    if (m.exact_gelu) add("--no-bias-gelu-fusion");
  } else {
    add("--normalization", {"RMSNorm"});
    add("--swiglu");
    add("--disable-bias-linear");
    if (m.qkv_bias) add("--add-qkv-bias");
    if (m.qk_norm) add("--qk-layernorm");
    const auto& r = m.rope_scaling;
    using mg::ops::RopeScalingType;
    add("--position-embedding-type", {r.type == RopeScalingType::yarn ? "yarn" : "rope"});
    add("--rotary-base", {num(m.rope_theta)});
    if (r.type == RopeScalingType::linear)
      add("--rotary-seq-len-interpolation-factor", {num(r.factor)});
    if (r.type == RopeScalingType::llama3) {
      add("--use-rope-scaling");
      add("--rope-scaling-factor", {num(r.factor)});
      add("--rope-scaling-low-freq-factor", {num(r.low_freq_factor)});
      add("--rope-scaling-high-freq-factor", {num(r.high_freq_factor)});
      add("--rope-scaling-original-max-position-embeddings",
          {std::to_string(r.original_max_position_embeddings)});
    }
    if (r.type == RopeScalingType::yarn) {
      add("--yarn-rotary-scaling-factor", {num(r.factor)});
      add("--yarn-original-max-position-embeddings",
          {std::to_string(r.original_max_position_embeddings)});
      add("--yarn-beta-fast", {num(r.beta_fast)});
      add("--yarn-beta-slow", {num(r.beta_slow)});
      add("--yarn-mscale", {num(r.mscale)});
      add("--yarn-mscale-all-dim", {num(r.mscale_all_dim)});
      if (!r.correction_range_round_to_int) add("--no-yarn-correction-range-round-to-int");
    }
    if (m.moe()) {
      add("--num-experts", {std::to_string(m.experts)});
      add("--moe-router-topk", {std::to_string(m.topk)});
      add("--moe-ffn-hidden-size", {std::to_string(m.moe_ffn)});
      if (m.pre_softmax) add("--moe-router-pre-softmax");
      if (m.shared_ffn > 0)
        add("--moe-shared-expert-intermediate-size", {std::to_string(m.shared_ffn)});
      if (m.shared_gate) add("--moe-shared-expert-gate");
      bool all = true;
      std::string pattern = "[";
      for (std::size_t l = 0; l < m.moe_layers.size(); ++l) {
        all = all && m.moe_layers[l] == 1;
        pattern += (l ? "," : "") + std::to_string(m.moe_layers[l]);
      }
      if (!all) add("--moe-layer-freq", {pattern + "]"});
      add("--moe-aux-loss-coeff", {num(m.aux_loss_coeff)});
    }
  }
  if (!m.tied) add("--untie-embeddings-and-output-weights");
  add("--hidden-dropout", {num(m.hidden_dropout)});
  add("--attention-dropout", {num(m.attention_dropout)});
  add("--make-vocab-size-divisible-by", {std::to_string(divisible_by)});
  if (m.dtype == mg::DType::bf16) add("--bf16");
  if (m.dtype == mg::DType::f16) add("--fp16");
  // No tokenizer travels with the weights: ids 0..V-1 (NullTokenizer's eod is its last id).
  add("--tokenizer-type", {"NullTokenizer"});
  add("--vocab-size", {std::to_string(m.vocab - 1)});
  (void)tp;
  (void)pp;
  return f;
}

// The pre-MLP norm of layer l: fused into linear_fc1 (dense, TE naming) or separate (MoE).
std::string norm2_name(const mg::models::GPTModel& model, int64_t l) {
  const std::string q = "decoder.layers." + std::to_string(l) + ".";
  for (const auto& p : model.parameters())
    if (p.name == q + "pre_mlp_layernorm.weight") return p.name;
  return q + "mlp.linear_fc1.layer_norm_weight";
}

// HF names of an MoE layer's router and experts (which: 0 gate, 1 up, 2 down) under the layer's
// prefix p.
struct HfMoeNames {
  std::string router, experts;
  bool mixtral = false;
  std::string expert(int64_t e, int which) const {
    static const char* kMixtral[] = {"w1", "w3", "w2"};
    static const char* kQwen[] = {"gate_proj", "up_proj", "down_proj"};
    return experts + std::to_string(e) + "." + (mixtral ? kMixtral[which] : kQwen[which]) +
           ".weight";
  }
};
HfMoeNames hf_moe_names(const HfModel& m, const std::string& p) {
  HfMoeNames n;
  n.mixtral = m.family == Family::mixtral;
  const std::string block = p + (n.mixtral ? "block_sparse_moe." : "mlp.");
  n.router = block + "gate.weight";
  n.experts = block + "experts.";
  return n;
}

// HF files kept with an import and written back by export.
constexpr const char* kHfSideFiles[] = {"tokenizer.json",
                                        "tokenizer_config.json",
                                        "special_tokens_map.json",
                                        "tokenizer.model",
                                        "vocab.json",
                                        "merges.txt",
                                        "added_tokens.json",
                                        "vocab.txt",
                                        "chat_template.jinja",
                                        "generation_config.json"};

// ---- import ------------------------------------------------------------------------------------

struct ImportOptions {
  std::string hf_dir, save;
  int tp = 1, pp = 1, ep = 1;
  int64_t divisible_by = 128;
};

void run_import(const ImportOptions& o) {
  const std::string& dir = o.hf_dir;
  const auto hf_storage = st::storage_for(dir);
  const std::string cfg_path = st::join_path(dir, "config.json");
  MG_CHECK(hf_storage->exists(cfg_path), "--hf-dir '" << o.hf_dir << "' has no config.json");
  json cfg;
  try {
    cfg = json::parse(hf_storage->read_object(cfg_path));
  } catch (const json::exception& e) {
    MG_THROW("'" << cfg_path << "' is not valid JSON: " << e.what());
  }
  const HfModel m = parse_hf_config(cfg, cfg_path);
  MG_CHECK(o.tp >= 1 && o.pp >= 1, "--tp " << o.tp << " and --pp " << o.pp << " must be >= 1");
  MG_CHECK(m.heads % o.tp == 0 && m.groups % o.tp == 0,
           "--tp " << o.tp << " must divide the attention heads (" << m.heads
                   << ") and the KV heads (" << m.groups << ")");
  MG_CHECK(m.layers % o.pp == 0,
           "--pp " << o.pp << " must divide the number of layers (" << m.layers << ")");
  MG_CHECK(o.ep >= 1 && (o.ep == 1 || m.moe()),
           "--ep " << o.ep << ": expert parallelism needs an MoE model (model_type '"
                   << m.model_type << "' has no experts)");
  MG_CHECK(!m.moe() || m.experts % o.ep == 0,
           "--ep " << o.ep << " must divide the number of experts (" << m.experts << ")");
  MG_CHECK(o.divisible_by >= 1,
           "--make-vocab-size-divisible-by must be >= 1, got " << o.divisible_by);

  // The model exactly as pretrain_gpt builds it from these flags.
  const auto flags = model_flags(m, o.divisible_by, o.tp, o.pp);
  std::vector<std::string> cmd;
  json args_json = json::object();
  for (const auto& [k, v] : flags) {
    cmd.push_back(k);
    cmd.insert(cmd.end(), v.begin(), v.end());
    args_json[k] = v;
  }
  const mg::training::Arguments args = mg::training::parse_args(
      mg::training::checkpoint_command_line(json{{"args", args_json}}, {}));
  mg::RuntimeOptions ro;
  ro.platform = "cpu";
  mg::Runtime& rt = mg::init(ro);
  const auto built = mg::training::model_provider(args.model, m.vocab, *rt.ops, mg::Device::cpu());
  mg::models::GPTModel& model = *built;
  // Stored with the single-rank padding; a loader with TP > 1 pads its own rows (checkpoints are
  // layout-independent).
  const int64_t v_pad = model.padded_vocab_size();

  HfTensors hf(dir);
  const bool gpt2 = m.family == Family::gpt2;
  const std::string pre = gpt2 ? (hf.has("transformer.wte.weight") ? "transformer." : "")
                               : (hf.has("model.embed_tokens.weight") ? "model." : "");
  const int64_t h = m.hidden, hd = m.head_dim, nh = m.heads, ng = m.groups, f = m.ffn;
  std::map<std::string, Tensor> out;  // Megatron name -> tensor (model dtype)
  auto put = [&out](const std::string& name, const Tensor& t) { out[name] = t; };
  if (gpt2) {
    put("embedding.word_embeddings.weight",
        pad_rows(hf.get(pre + "wte.weight", {m.vocab, h}), v_pad));
    put("embedding.position_embeddings.weight", hf.get(pre + "wpe.weight", {m.max_positions, h}));
    mg::Progress progress("importing the HuggingFace layers", m.layers);
    for (int64_t l = 0; l < m.layers; ++l) {
      progress.update(l);
      const std::string p = pre + "h." + std::to_string(l) + ".";
      const std::string q = "decoder.layers." + std::to_string(l) + ".";
      put(q + "self_attention.linear_qkv.layer_norm_weight", hf.get(p + "ln_1.weight", {h}));
      put(q + "self_attention.linear_qkv.layer_norm_bias", hf.get(p + "ln_1.bias", {h}));
      // Conv1D c_attn [H, 3H]: columns [q | k | v] -> rows, grouped per head.
      const Tensor w = transpose2d(hf.get(p + "attn.c_attn.weight", {h, 3 * h}));
      put(q + "self_attention.linear_qkv.weight",
          group_qkv(w.slice(0, h), w.slice(h, h), w.slice(2 * h, h), nh, ng, hd));
      const Tensor b = hf.get(p + "attn.c_attn.bias", {3 * h});
      put(q + "self_attention.linear_qkv.bias",
          group_qkv(b.slice(0, h), b.slice(h, h), b.slice(2 * h, h), nh, ng, hd));
      put(q + "self_attention.linear_proj.weight",
          transpose2d(hf.get(p + "attn.c_proj.weight", {h, h})));
      put(q + "self_attention.linear_proj.bias", hf.get(p + "attn.c_proj.bias", {h}));
      put(q + "mlp.linear_fc1.layer_norm_weight", hf.get(p + "ln_2.weight", {h}));
      put(q + "mlp.linear_fc1.layer_norm_bias", hf.get(p + "ln_2.bias", {h}));
      put(q + "mlp.linear_fc1.weight", transpose2d(hf.get(p + "mlp.c_fc.weight", {h, f})));
      put(q + "mlp.linear_fc1.bias", hf.get(p + "mlp.c_fc.bias", {f}));
      put(q + "mlp.linear_fc2.weight", transpose2d(hf.get(p + "mlp.c_proj.weight", {f, h})));
      put(q + "mlp.linear_fc2.bias", hf.get(p + "mlp.c_proj.bias", {h}));
      for (const char* buf : {"attn.bias", "attn.masked_bias"})  // old causal-mask buffers
        if (hf.has(p + buf)) hf.used.insert(p + buf);
    }
    put("decoder.final_layernorm.weight", hf.get(pre + "ln_f.weight", {h}));
    put("decoder.final_layernorm.bias", hf.get(pre + "ln_f.bias", {h}));
    if (!m.tied)
      put("output_layer.weight", pad_rows(hf.get("lm_head.weight", {m.vocab, h}), v_pad));
    else if (hf.has("lm_head.weight"))
      hf.used.insert("lm_head.weight");  // a tied copy
  } else {
    put("embedding.word_embeddings.weight",
        pad_rows(hf.get(pre + "embed_tokens.weight", {m.vocab, h}), v_pad));
    mg::Progress progress("importing the HuggingFace layers", m.layers);
    for (int64_t l = 0; l < m.layers; ++l) {
      progress.update(l);
      const std::string p = pre + "layers." + std::to_string(l) + ".";
      const std::string q = "decoder.layers." + std::to_string(l) + ".";
      put(q + "self_attention.linear_qkv.layer_norm_weight",
          hf.get(p + "input_layernorm.weight", {h}));
      put(q + "self_attention.linear_qkv.weight",
          group_qkv(hf.get(p + "self_attn.q_proj.weight", {nh * hd, h}),
                    hf.get(p + "self_attn.k_proj.weight", {ng * hd, h}),
                    hf.get(p + "self_attn.v_proj.weight", {ng * hd, h}), nh, ng, hd));
      if (m.qkv_bias)
        put(q + "self_attention.linear_qkv.bias",
            group_qkv(hf.get(p + "self_attn.q_proj.bias", {nh * hd}),
                      hf.get(p + "self_attn.k_proj.bias", {ng * hd}),
                      hf.get(p + "self_attn.v_proj.bias", {ng * hd}), nh, ng, hd));
      put(q + "self_attention.linear_proj.weight",
          hf.get(p + "self_attn.o_proj.weight", {h, nh * hd}));
      if (m.qk_norm) {
        put(q + "self_attention.q_layernorm.weight", hf.get(p + "self_attn.q_norm.weight", {hd}));
        put(q + "self_attention.k_layernorm.weight", hf.get(p + "self_attn.k_norm.weight", {hd}));
      }
      put(norm2_name(model, l), hf.get(p + "post_attention_layernorm.weight", {h}));
      if (!m.is_moe_layer(l)) {
        put(q + "mlp.linear_fc1.weight", cat0({hf.get(p + "mlp.gate_proj.weight", {f, h}),
                                               hf.get(p + "mlp.up_proj.weight", {f, h})}));
        put(q + "mlp.linear_fc2.weight", hf.get(p + "mlp.down_proj.weight", {h, f}));
      } else {
        const HfMoeNames n = hf_moe_names(m, p);
        const int64_t fe = m.moe_ffn;
        put(q + "mlp.router.weight", hf.get(n.router, {m.experts, h}));
        for (int64_t e = 0; e < m.experts; ++e) {
          const std::string x = q + "mlp.experts.local_experts." + std::to_string(e) + ".";
          put(x + "linear_fc1.weight",
              cat0({hf.get(n.expert(e, 0), {fe, h}), hf.get(n.expert(e, 1), {fe, h})}));
          put(x + "linear_fc2.weight", hf.get(n.expert(e, 2), {h, fe}));
        }
        if (m.shared_ffn > 0) {
          const int64_t fs = m.shared_ffn;
          put(q + "mlp.shared_experts.linear_fc1.weight",
              cat0({hf.get(p + "mlp.shared_expert.gate_proj.weight", {fs, h}),
                    hf.get(p + "mlp.shared_expert.up_proj.weight", {fs, h})}));
          put(q + "mlp.shared_experts.linear_fc2.weight",
              hf.get(p + "mlp.shared_expert.down_proj.weight", {h, fs}));
        }
        if (m.shared_gate)
          put(q + "mlp.shared_experts.gate_weight",
              hf.get(p + "mlp.shared_expert_gate.weight", {1, h}));
      }
      if (hf.has(p + "self_attn.rotary_emb.inv_freq"))
        hf.used.insert(p + "self_attn.rotary_emb.inv_freq");
    }
    put("decoder.final_layernorm.weight", hf.get(pre + "norm.weight", {h}));
    if (!m.tied)
      put("output_layer.weight", pad_rows(hf.get("lm_head.weight", {m.vocab, h}), v_pad));
    else if (hf.has("lm_head.weight"))
      hf.used.insert("lm_head.weight");
  }
  // Every HF tensor must have been used: an unknown one means a model this converter misreads.
  for (const auto& [name, file] : hf.where)
    MG_CHECK(hf.used.count(name), "HuggingFace tensor '"
                                      << name << "' (in " << file->path()
                                      << ") has no Megatron counterpart for model_type '"
                                      << m.model_type << "'; refusing a partial conversion");

  // Into the model's parameters (dtype kept; shapes checked), then saved.
  std::vector<mg::transformer::Parameter>& params = model.parameters();
  MG_CHECK(params.size() == out.size(),
           "internal: " << params.size() << " parameters, " << out.size() << " converted tensors");
  for (auto& p : params) {
    auto it = out.find(p.name);
    MG_CHECK(it != out.end(), "internal: no converted tensor for parameter '" << p.name << "'");
    const Tensor& t = it->second;
    MG_CHECK(t.shape() == p.param.shape(),
             "internal: '" << p.name << "' converted to " << mg::shape_str(t.shape())
                           << ", parameter is " << mg::shape_str(p.param.shape()));
    MG_CHECK(t.dtype() == p.param.dtype(), "HuggingFace tensor for '"
                                               << p.name << "' is " << mg::dtype_name(t.dtype())
                                               << " but config.json says "
                                               << mg::dtype_name(p.param.dtype()));
    p.param.copy_(t);
  }
  mg::training::CheckpointState state;
  state.iteration = 0;
  state.vocab_size = m.vocab;  // lets a layout with another vocabulary padding load it
  state.args = args_json;
  state.extra = json{{"hf_model_type", m.model_type}, {"hf_config", cfg}};
  // The files besides the weights (tokenizer, generation config) travel in the checkpoint's
  // record, through training and resharding, to the export: text as a string, other bytes as
  // a JSON binary value.
  json files = json::object();
  for (const char* name : kHfSideFiles) {
    const std::string path = st::join_path(dir, name);
    if (!hf_storage->exists(path)) continue;
    const std::string bytes = hf_storage->read_object(path);
    try {
      json probe = bytes;
      (void)probe.dump();  // throws on invalid UTF-8
      files[name] = bytes;
    } catch (const json::exception&) {
      files[name] = json::binary(std::vector<std::uint8_t>(bytes.begin(), bytes.end()));
    }
  }
  if (!files.empty()) state.extra["hf_files"] = files;
  mg::training::save_checkpoint(o.save, params, state);

  // The flags that train this model, for --yaml-cfg.
  const std::string yaml_path = st::join_path(o.save, "model_args.yaml");
  std::ostringstream y;
  y << "# Megatron flags of the model imported from " << fs::absolute(dir).string() << "\n"
    << "# (convert_checkpoint import); train or generate with --yaml-cfg this file --load "
    << o.save << "\n";
  auto layout = flags;  // the layout to train with (not part of the model's record)
  if (o.tp > 1) layout.push_back({"--tensor-model-parallel-size", {std::to_string(o.tp)}});
  if (o.pp > 1) layout.push_back({"--pipeline-model-parallel-size", {std::to_string(o.pp)}});
  if (o.ep > 1) layout.push_back({"--expert-model-parallel-size", {std::to_string(o.ep)}});
  if (o.tp > 1 && m.moe()) layout.push_back({"--sequence-parallel", {}});  // Megatron's MoE rule
  for (const auto& [k, v] : layout) {
    y << k.substr(2) << ":";
    if (v.empty())
      y << " true\n";
    else
      y << " " << v[0] << "\n";
  }
  st::storage_for(o.save)->write_object(yaml_path, y.str());
  std::cout << "imported " << m.model_type << " (" << m.layers << " layers, hidden " << h
            << ", heads " << nh << "/" << ng << ", vocab " << m.vocab << " padded to "
            << model.padded_vocab_size() << ", " << (m.tied ? "tied" : "untied") << ", "
            << mg::dtype_name(m.dtype) << ", " << model.num_parameters() << " parameters) from "
            << o.hf_dir << " to " << o.save << "\n"
            << "flags: " << yaml_path << "\n";
}

// ---- export ------------------------------------------------------------------------------------

struct ExportOptions {
  std::string load, hf_dir;
  std::string max_shard_size = "5GB";
  std::vector<std::string> overrides;
};

int64_t parse_size(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  MG_CHECK(i > 0, "--max-shard-size '" << s << "' is not a size like 5GB, 200MB or 1000000");
  const double v = std::stod(s.substr(0, i));
  const std::string unit = s.substr(i);
  const std::map<std::string, double> units = {
      {"", 1.0},   {"B", 1.0},      {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  auto it = units.find(unit);
  MG_CHECK(it != units.end(), "--max-shard-size '" << s << "': unknown unit '" << unit
                                                   << "' (B, KB, MB, GB, KiB, MiB, GiB)");
  return static_cast<int64_t>(v * it->second);
}

// The rope fields of a made config.json (transformers 5's "rope_parameters").
json hf_rope_parameters(const mg::transformer::TransformerConfig& c) {
  using mg::ops::RopeScalingType;
  const auto& r = c.rope_scaling;
  json j = {{"rope_theta", c.rotary_base}, {"rope_type", "default"}};
  if (r.type == RopeScalingType::none) return j;
  j["rope_type"] = mg::ops::to_string(r.type);
  j["factor"] = r.factor;
  if (r.type == RopeScalingType::llama3) {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  }
  if (r.type == RopeScalingType::yarn) {
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    j["truncate"] = r.correction_range_round_to_int;
    if (r.mscale_all_dim != 0.0) {
      j["mscale"] = r.mscale;
      j["mscale_all_dim"] = r.mscale_all_dim;
    }
  }
  return j;
}

// config.json for a model trained here (no imported original): the family's fields from the
// model's config.
json make_hf_config(const mg::transformer::TransformerConfig& c, int64_t vocab,
                    const std::string& model_type) {
  const std::string dt = c.params_dtype == mg::DType::bf16  ? "bfloat16"
                         : c.params_dtype == mg::DType::f16 ? "float16"
                                                            : "float32";
  if (model_type == "gpt2")
    return json{{"architectures", {"GPT2LMHeadModel"}},
                {"model_type", "gpt2"},
                {"activation_function", c.bias_activation_fusion ? "gelu_new" : "gelu"},
                {"n_embd", c.hidden_size},
                {"n_layer", c.num_layers},
                {"n_head", c.num_attention_heads},
                {"n_inner", c.ffn_hidden_size},
                {"n_positions", c.max_position_embeddings},
                {"layer_norm_epsilon", c.norm_epsilon},
                {"vocab_size", vocab},
                {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
                {"resid_pdrop", c.hidden_dropout},
                {"embd_pdrop", c.hidden_dropout},
                {"attn_pdrop", c.attention_dropout},
                {"bos_token_id", vocab - 1},
                {"eos_token_id", vocab - 1},
                {"torch_dtype", dt}};
  const FamilyInfo* info = family_info(model_type);
  MG_CHECK(info, "export: model_type '" << model_type << "' is not one of " << supported_types());
  json j = {{"architectures", {info->architecture}},
            {"model_type", model_type},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_hidden_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_query_groups},
            {"head_dim", c.kv_channels},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.norm_epsilon},
            {"rope_parameters", hf_rope_parameters(c)},
            {"vocab_size", vocab},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"attention_dropout", c.attention_dropout},
            {"torch_dtype", dt}};
  if (model_type == "qwen2" || model_type == "qwen3" || model_type == "qwen2_moe" ||
      model_type == "qwen3_moe")
    j["use_sliding_window"] = false;
  if (model_type == "mistral" || model_type == "mixtral") j["sliding_window"] = nullptr;
  if (info->moe) {
    const bool mixtral = model_type == "mixtral";
    j[mixtral ? "num_local_experts" : "num_experts"] = c.num_moe_experts;
    if (mixtral) j["intermediate_size"] = c.expert_ffn_hidden_size();  // Mixtral's is the experts'

    j["num_experts_per_tok"] = c.moe_router_topk;
    if (!mixtral) {
      j["moe_intermediate_size"] = c.expert_ffn_hidden_size();
      j["norm_topk_prob"] = !c.moe_router_pre_softmax;
      j["decoder_sparse_step"] = 1;
      json dense = json::array();
      for (int64_t l = 0; l < c.num_layers; ++l)
        if (!c.is_moe_layer(l)) dense.push_back(l);
      j["mlp_only_layers"] = dense;
    }
    if (model_type == "qwen2_moe")
      j["shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size;
    j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
    j["output_router_logits"] = c.moe_aux_loss_coeff > 0.0;
  }
  return j;
}

// A file kept by import (string or JSON binary, possibly re-read as {"bytes": [...]}) as bytes.
std::string side_file_bytes(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_binary()) return std::string(v.get_binary().begin(), v.get_binary().end());
  MG_CHECK(v.is_object() && v.contains("bytes") && v["bytes"].is_array(),
           "export: a kept HF file is neither text nor bytes: " << v.dump().substr(0, 80));
  std::string out;
  for (const auto& b : v["bytes"]) out.push_back(static_cast<char>(b.get<int>()));
  return out;
}

bool every_layer_moe(const mg::transformer::TransformerConfig& c) {
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l)) return false;
  return true;
}

void run_export(const ExportOptions& o) {
  mg::RuntimeOptions ro;
  ro.platform = "cpu";
  mg::Runtime& rt = mg::init(ro);
  mg::training::CheckpointModel cm =
      mg::training::load_model_from_checkpoint(o.load, *rt.ops, mg::Device::cpu(), o.overrides);
  const mg::transformer::TransformerConfig& c = cm.model->config();
  using mg::transformer::Activation;
  using mg::transformer::Normalization;
  using mg::transformer::PositionEmbeddingType;
  std::string model_type = cm.state.extra.value("hf_model_type", "");
  const bool gpt2_like =
      c.normalization == Normalization::layernorm && c.activation == Activation::gelu &&
      c.position_embedding_type == PositionEmbeddingType::learned_absolute && c.add_bias_linear;
  const bool llama_like = c.normalization == Normalization::rmsnorm &&
                          c.activation == Activation::swiglu &&
                          c.position_embedding_type == PositionEmbeddingType::rope &&
                          !c.add_bias_linear && c.rotary_percent == 1.0 && !c.rotary_interleaved;
  const bool moe = c.num_moe_experts > 0;
  if (model_type.empty()) {  // trained here: the family its features name
    if (gpt2_like)
      model_type = "gpt2";
    else if (moe)
      model_type = c.moe_shared_expert_intermediate_size > 0 ? "qwen2_moe"
                   : c.qk_layernorm                          ? "qwen3_moe"
                                                             : "mixtral";
    else
      model_type = c.qk_layernorm ? "qwen3" : c.add_qkv_bias ? "qwen2" : "llama";
  }
  MG_CHECK(!c.apply_layernorm_1p,
           "export: --apply-layernorm-1p models have no HuggingFace equivalent");
  const FamilyInfo* info = family_info(model_type);
  MG_CHECK(info, "export: the checkpoint's hf_model_type '" << model_type << "' is not one of "
                                                            << supported_types());
  if (model_type == "gpt2") {
    MG_CHECK(gpt2_like && !c.qk_layernorm && !moe,
             "export: the checkpoint's model is not GPT-2-shaped (LayerNorm, GELU, "
             "learned positions, biases)");
  } else {
    const bool shared_ok = model_type == "qwen2_moe" ? c.moe_shared_expert_intermediate_size > 0 &&
                                                           c.moe_shared_expert_gate
                                                     : c.moe_shared_expert_intermediate_size == 0;
    MG_CHECK(
        llama_like && info->qkv_bias == c.add_qkv_bias && info->qk_norm == c.qk_layernorm &&
            info->moe == moe && (!moe || shared_ok) &&
            (!moe || model_type != "mixtral" || !c.moe_router_pre_softmax) &&
            (model_type != "mixtral" || every_layer_moe(c)) &&
            (!moe || c.moe_router_score_function == mg::transformer::MoeScoreFunction::softmax),
        "export: the checkpoint's model is not "
            << model_type << "-shaped (RMSNorm, SwiGLU, rotate-half RoPE, no linear biases"
            << (info->qkv_bias ? ", qkv bias" : ", no qkv bias")
            << (info->qk_norm ? ", q/k norm" : ", no q/k norm")
            << (info->moe ? ", softmax-routed experts" : ", no experts")
            << (model_type == "mixtral" ? " in every layer, top-k renormalised" : "")
            << (model_type == "qwen2_moe" ? " with a gated shared expert" : "") << ")");
  }
  const int64_t vocab = cm.model->vocab_size();
  const int64_t hd = c.kv_channels, nh = c.num_attention_heads, ng = c.num_query_groups;
  auto param = [&cm](const std::string& name) {
    return cm.model->parameter(name).param.to(mg::Device::cpu());
  };
  std::vector<std::pair<std::string, Tensor>> out;
  auto put = [&out](const std::string& name, const Tensor& t) { out.emplace_back(name, t); };
  const bool gpt2 = model_type == "gpt2";
  if (gpt2) {
    put("transformer.wte.weight",
        param("embedding.word_embeddings.weight").slice(0, vocab).clone());
    put("transformer.wpe.weight", param("embedding.position_embeddings.weight"));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      const std::string q = "decoder.layers." + std::to_string(l) + ".";
      put(p + "ln_1.weight", param(q + "self_attention.linear_qkv.layer_norm_weight"));
      put(p + "ln_1.bias", param(q + "self_attention.linear_qkv.layer_norm_bias"));
      Tensor wq, wk, wv, bq, bk, bv;
      ungroup_qkv(param(q + "self_attention.linear_qkv.weight"), nh, ng, hd, wq, wk, wv);
      ungroup_qkv(param(q + "self_attention.linear_qkv.bias"), nh, ng, hd, bq, bk, bv);
      put(p + "attn.c_attn.weight", transpose2d(cat0({wq, wk, wv})));
      put(p + "attn.c_attn.bias", cat0({bq, bk, bv}));
      put(p + "attn.c_proj.weight", transpose2d(param(q + "self_attention.linear_proj.weight")));
      put(p + "attn.c_proj.bias", param(q + "self_attention.linear_proj.bias"));
      put(p + "ln_2.weight", param(q + "mlp.linear_fc1.layer_norm_weight"));
      put(p + "ln_2.bias", param(q + "mlp.linear_fc1.layer_norm_bias"));
      put(p + "mlp.c_fc.weight", transpose2d(param(q + "mlp.linear_fc1.weight")));
      put(p + "mlp.c_fc.bias", param(q + "mlp.linear_fc1.bias"));
      put(p + "mlp.c_proj.weight", transpose2d(param(q + "mlp.linear_fc2.weight")));
      put(p + "mlp.c_proj.bias", param(q + "mlp.linear_fc2.bias"));
    }
    put("transformer.ln_f.weight", param("decoder.final_layernorm.weight"));
    put("transformer.ln_f.bias", param("decoder.final_layernorm.bias"));
  } else {
    put("model.embed_tokens.weight",
        param("embedding.word_embeddings.weight").slice(0, vocab).clone());
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::string q = "decoder.layers." + std::to_string(l) + ".";
      put(p + "input_layernorm.weight", param(q + "self_attention.linear_qkv.layer_norm_weight"));
      Tensor wq, wk, wv;
      ungroup_qkv(param(q + "self_attention.linear_qkv.weight"), nh, ng, hd, wq, wk, wv);
      put(p + "self_attn.q_proj.weight", wq);
      put(p + "self_attn.k_proj.weight", wk);
      put(p + "self_attn.v_proj.weight", wv);
      if (c.add_qkv_bias) {
        Tensor bq, bk, bv;
        ungroup_qkv(param(q + "self_attention.linear_qkv.bias"), nh, ng, hd, bq, bk, bv);
        put(p + "self_attn.q_proj.bias", bq);
        put(p + "self_attn.k_proj.bias", bk);
        put(p + "self_attn.v_proj.bias", bv);
      }
      put(p + "self_attn.o_proj.weight", param(q + "self_attention.linear_proj.weight"));
      if (c.qk_layernorm) {
        put(p + "self_attn.q_norm.weight", param(q + "self_attention.q_layernorm.weight"));
        put(p + "self_attn.k_norm.weight", param(q + "self_attention.k_layernorm.weight"));
      }
      put(p + "post_attention_layernorm.weight", param(norm2_name(*cm.model, l)));
      if (!c.is_moe_layer(l)) {
        const Tensor fc1 = param(q + "mlp.linear_fc1.weight");
        const int64_t f = c.ffn_hidden_size;
        put(p + "mlp.gate_proj.weight", fc1.slice(0, f).clone());
        put(p + "mlp.up_proj.weight", fc1.slice(f, f).clone());
        put(p + "mlp.down_proj.weight", param(q + "mlp.linear_fc2.weight"));
        continue;
      }
      HfModel hm;
      hm.family = info->family;
      const HfMoeNames n = hf_moe_names(hm, p);
      const int64_t fe = c.expert_ffn_hidden_size();
      put(n.router, param(q + "mlp.router.weight"));
      for (int64_t e = 0; e < c.num_moe_experts; ++e) {
        const std::string x = q + "mlp.experts.local_experts." + std::to_string(e) + ".";
        const Tensor fc1 = param(x + "linear_fc1.weight");
        put(n.expert(e, 0), fc1.slice(0, fe).clone());
        put(n.expert(e, 1), fc1.slice(fe, fe).clone());
        put(n.expert(e, 2), param(x + "linear_fc2.weight"));
      }
      if (c.moe_shared_expert_intermediate_size > 0) {
        const int64_t fs = c.moe_shared_expert_intermediate_size;
        const Tensor fc1 = param(q + "mlp.shared_experts.linear_fc1.weight");
        put(p + "mlp.shared_expert.gate_proj.weight", fc1.slice(0, fs).clone());
        put(p + "mlp.shared_expert.up_proj.weight", fc1.slice(fs, fs).clone());
        put(p + "mlp.shared_expert.down_proj.weight",
            param(q + "mlp.shared_experts.linear_fc2.weight"));
        put(p + "mlp.shared_expert_gate.weight", param(q + "mlp.shared_experts.gate_weight"));
      }
    }
    put("model.norm.weight", param("decoder.final_layernorm.weight"));
  }
  if (c.untie_embeddings_and_output_weights)
    put("lm_head.weight", param("output_layer.weight").slice(0, vocab).clone());

  // config.json: the imported original (shapes re-stated from the model), or made here.
  json cfg = cm.state.extra.contains("hf_config") ? cm.state.extra["hf_config"]
                                                  : make_hf_config(c, vocab, model_type);
  cfg["vocab_size"] = vocab;
  const auto out_storage = st::storage_for(o.hf_dir);  // writes create the directory
  out_storage->write_object(st::join_path(o.hf_dir, "config.json"), cfg.dump(2) + "\n");
  if (cm.state.extra.contains("hf_files"))
    for (auto it = cm.state.extra["hf_files"].begin(); it != cm.state.extra["hf_files"].end(); ++it)
      out_storage->write_object(st::join_path(o.hf_dir, it.key()), side_file_bytes(it.value()));
  // Shards per huggingface_hub's rule (FORMATS.md §7.6): in order, a new shard when the next
  // tensor would pass the limit.
  const int64_t limit = parse_size(o.max_shard_size);
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  int64_t cur = 0, total = 0;
  for (auto& e : out) {
    const auto nb = static_cast<int64_t>(e.second.nbytes());
    if (cur > 0 && cur + nb > limit) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(e);
    cur += nb;
    total += nb;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  for (const char* stale : {"model.safetensors", "model.safetensors.index.json"})
    out_storage->remove(st::join_path(o.hf_dir, stale));
  if (shards.size() == 1) {
    st::save_safetensors(*out_storage, st::join_path(o.hf_dir, "model.safetensors"), shards[0],
                         meta);
  } else {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
    char name[64];
    for (std::size_t i = 0; i < shards.size(); ++i) {
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      st::save_safetensors(*out_storage, st::join_path(o.hf_dir, name), shards[i], meta);
      for (const auto& e : shards[i]) index["weight_map"][e.first] = name;
    }
    out_storage->write_object(st::join_path(o.hf_dir, "model.safetensors.index.json"),
                              index.dump(2) + "\n");
  }
  std::cout << "exported " << model_type << " (" << out.size() << " tensors, " << total
            << " bytes, vocab " << vocab << ", " << shards.size() << " file"
            << (shards.size() > 1 ? "s" : "") << ") from " << o.load << " (iteration "
            << cm.state.iteration << ") to " << o.hf_dir << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  mg::set_progress_sink(&std::cerr);  // progress lines of long imports and loads
  CLI::App app{"convert_checkpoint: HuggingFace <-> Megatron-CPP checkpoints"};
  app.require_subcommand(1);
  ImportOptions io;
  CLI::App* imp = app.add_subcommand(
      "import", "HuggingFace directory (" + supported_types() + ") -> Megatron checkpoint");
  imp->add_option("--hf-dir,--hf-model-path", io.hf_dir,
                  "HuggingFace model directory (config.json, safetensors)")
      ->required();
  imp->add_option("--save,--output-path", io.save, "checkpoint directory to write")->required();
  imp->add_option("--tp,--tensor-model-parallel-size", io.tp,
                  "tensor-parallel size to train with (validated, recorded, pads the vocab)");
  imp->add_option("--pp,--pipeline-model-parallel-size", io.pp,
                  "pipeline-parallel size to train with (validated, recorded)");
  imp->add_option("--ep,--expert-model-parallel-size", io.ep,
                  "expert-parallel size to train with (validated, recorded; MoE models)");
  imp->add_option("--make-vocab-size-divisible-by", io.divisible_by,
                  "pad the vocabulary to a multiple of this x TP (128)");
  ExportOptions eo;
  CLI::App* exp = app.add_subcommand("export", "Megatron checkpoint -> HuggingFace directory");
  exp->add_option("--load,--checkpoint-path", eo.load, "checkpoint directory to read")->required();
  exp->add_option("--hf-dir,--output-path", eo.hf_dir, "HuggingFace directory to write")
      ->required();
  exp->add_option("--max-shard-size", eo.max_shard_size,
                  "largest safetensors file before sharding with an index (5GB)");
  exp->add_option(
      "--tokenizer-model",
      [&eo](const std::vector<std::string>& v) {
        eo.overrides.push_back("--tokenizer-model");
        eo.overrides.push_back(v.at(0));
        return true;
      },
      "override the tokenizer path the checkpoint records");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*imp) run_import(io);
    if (*exp) run_export(eo);
  } catch (const std::exception& e) {
    std::cerr << "convert_checkpoint: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
