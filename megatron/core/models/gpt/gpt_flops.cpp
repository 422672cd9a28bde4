// Megatron's training FLOP count (gpt_flops.h).
#include "megatron/core/models/gpt/gpt_flops.h"

#include "megatron/core/common/error.h"

namespace mg::models {

double num_floating_point_operations(const transformer::TransformerConfig& c,
                                     int64_t padded_vocab_size, int64_t batch_size) {
  MG_CHECK(c.kv_channels > 0 && c.num_query_groups > 0 && c.ffn_hidden_size > 0,
           "num_floating_point_operations needs a finalized TransformerConfig");
  const double L = static_cast<double>(c.num_layers), H = static_cast<double>(c.hidden_size);
  const double F = static_cast<double>(c.ffn_hidden_size), S = static_cast<double>(c.seq_length);
  const double nh = static_cast<double>(c.num_attention_heads);
  const double ng = static_cast<double>(c.num_query_groups);
  const double V = static_cast<double>(padded_vocab_size);
  const double gated = c.activation == transformer::Activation::swiglu ? 1.5 : 1.0;
  const double query_ratio = static_cast<double>(c.query_projection_size()) / H;
  const double expansion = 3.0 * 2.0 * 2.0;
  const double mlp = expansion * L * H * F * gated;
  const double attn = expansion * L * H * H * ((1.0 + ng / nh + S / H / 2.0) * query_ratio);
  const double logits = 3.0 * 2.0 * H * V;
  return static_cast<double>(batch_size) * S * (mlp + attn + logits);
}

}  // namespace mg::models
