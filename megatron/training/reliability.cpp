// The training loop's guards (reliability.h).
#include "megatron/training/reliability.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "megatron/training/checkpoint_model.h"

namespace mg::training {
namespace {

bool host_finite(const Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !is_floating(t.dtype())) return true;
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

bool all_finite(const ops::OpTable& ops, std::span<const Tensor> xs) {
  std::vector<Tensor> fl;
  for (const Tensor& t : xs)
    if (t.defined() && t.numel() > 0 && is_floating(t.dtype())) fl.push_back(t);
  if (fl.empty()) return true;
  Tensor out = Tensor::empty({1}, DType::f64, fl.front().device());
  ops.l2_norm_sq(out, fl);
  return std::isfinite(out.to_vector<double>()[0]);
}

std::optional<std::string> first_nonfinite_parameter(const std::vector<transformer::Parameter>& ps,
                                                     bool grads) {
  for (const auto& p : ps)
    if (!host_finite(grads ? p.main_grad : p.param)) return p.name;
  return std::nullopt;
}

std::optional<std::string> first_nonfinite_state(const optimizer::StateDict& sd) {
  for (const auto& [k, t] : sd.tensors)
    if (!host_finite(t)) return k;
  return std::nullopt;
}

std::vector<std::string> checkpoint_model_mismatches(const nlohmann::json& metadata,
                                                     const Arguments& current, int64_t vocab_size) {
  std::vector<std::string> out;
  if (metadata.contains("vocab_size") && metadata["vocab_size"].is_number_integer() &&
      vocab_size > 0) {
    const int64_t v = metadata["vocab_size"].get<int64_t>();
    if (v != vocab_size)
      out.push_back("vocabulary (--vocab-size / the tokenizer): the checkpoint has " +
                    std::to_string(v) + " tokens, this run " + std::to_string(vocab_size));
  }
  if (!metadata.contains("args") || !metadata["args"].is_object() || metadata["args"].empty())
    return out;
  Arguments saved;
  try {
    saved = parse_args(checkpoint_command_line(metadata, {}));
  } catch (const Error& e) {
    MG_THROW("cannot compare the checkpoint's recorded flags with this run's: they do not parse ("
             << e.message() << ")");
  }
  const transformer::TransformerConfig& a = saved.model;
  const transformer::TransformerConfig& b = current.model;
  auto cmp = [&](const char* flag, const auto& x, const auto& y) {
    if (x == y) return;
    std::ostringstream s;
    s << flag << ": the checkpoint has " << x << ", this run " << y;
    out.push_back(s.str());
  };
  using transformer::to_string;
  cmp("--num-layers", a.num_layers, b.num_layers);
  cmp("--hidden-size", a.hidden_size, b.hidden_size);
  cmp("--ffn-hidden-size", a.ffn_hidden_size, b.ffn_hidden_size);
  cmp("--num-attention-heads", a.num_attention_heads, b.num_attention_heads);
  cmp("--num-query-groups", a.num_query_groups, b.num_query_groups);
  cmp("--kv-channels", a.kv_channels, b.kv_channels);
  cmp("--normalization", to_string(a.normalization), to_string(b.normalization));
  cmp("--apply-layernorm-1p", a.apply_layernorm_1p, b.apply_layernorm_1p);
  cmp("--swiglu / --squared-relu (activation)", to_string(a.activation), to_string(b.activation));
  cmp("--no-bias-gelu-fusion (gelu's tanh form)", a.bias_activation_fusion,
      b.bias_activation_fusion);
  cmp("--disable-bias-linear (add_bias_linear)", a.add_bias_linear, b.add_bias_linear);
  cmp("--add-qkv-bias", a.add_qkv_bias, b.add_qkv_bias);
  cmp("--qk-layernorm", a.qk_layernorm, b.qk_layernorm);
  cmp("--position-embedding-type", to_string(a.position_embedding_type),
      to_string(b.position_embedding_type));
  if (a.position_embedding_type == transformer::PositionEmbeddingType::rope &&
      b.position_embedding_type == transformer::PositionEmbeddingType::rope) {
    cmp("--rotary-base", a.rotary_base, b.rotary_base);
    cmp("--rotary-percent", a.rotary_percent, b.rotary_percent);
    cmp("--rotary-interleaved", a.rotary_interleaved, b.rotary_interleaved);
  }
  cmp("--untie-embeddings-and-output-weights", a.untie_embeddings_and_output_weights,
      b.untie_embeddings_and_output_weights);
  cmp("--num-experts", a.num_moe_experts, b.num_moe_experts);
  if (a.num_moe_experts > 0 && b.num_moe_experts > 0) {
    cmp("--moe-router-topk", a.moe_router_topk, b.moe_router_topk);
    cmp("--moe-ffn-hidden-size", a.expert_ffn_hidden_size(), b.expert_ffn_hidden_size());
    cmp("--moe-shared-expert-intermediate-size", a.moe_shared_expert_intermediate_size,
        b.moe_shared_expert_intermediate_size);
  }
  return out;
}

int local_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                        "MPI_LOCALNRANKS"}) {
    const char* s = std::getenv(v);
    if (!s || !*s) continue;
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);
    if (end && *end == '\0' && n >= 1) return static_cast<int>(n);
  }
  return 1;
}

AvailableMemory available_memory(const plugin::Platform& platform, int device) {
  AvailableMemory a;
  const double total = static_cast<double>(platform.capabilities(device).total_memory_bytes);
  std::ostringstream what;
  if (platform.device_type() == DeviceType::cpu) {
    const int n = local_world_size();
    a.bytes = total / n;
    what << "host memory " << format_bytes(total);
    if (n > 1) what << " / " << n << " ranks on this node = " << format_bytes(a.bytes);
  } else {
    a.bytes = total;
    what << "device " << platform.name() << ":" << device << " memory " << format_bytes(total);
  }
  a.what = what.str();
  return a;
}

}  // namespace mg::training
