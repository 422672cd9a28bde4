// The rotary embedding's frequencies under RopeScaling (op_args.h), shared by the CPU and CUDA
// kernels and by tests: equal to transformers' ROPE_INIT_FUNCTIONS (default, linear, llama3, yarn)
// and Megatron-Core's RotaryEmbedding / YarnRotaryEmbedding, in f64.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/ops/op_args.h"

namespace mg::ops {

// inv_freq[i], i < rot/2, for the pair turning by pos * inv_freq[i]. Unscaled: base^(-2i/rot)
// (bit-identical to the kernels before scaling existed).
std::vector<double> rope_inv_freq(double base, int64_t rot, const RopeScaling& s);

// The factor multiplying cos and sin (YaRN's mscale ratio; 1 otherwise).
double rope_attention_scaling(const RopeScaling& s);

// Throws naming the value when `s` is not usable (factor <= 0, high <= low frequency factor, ...).
void validate_rope_scaling(const RopeScaling& s, const std::string& where);

std::string to_string(RopeScalingType t);

// A HuggingFace config's rope dict (transformers 5's "rope_parameters" or 4's "rope_scaling":
// "rope_type" or "type", "factor", ...) as transformers computes it (modeling_rope_utils):
// default -> none, linear, llama3, yarn (no factor: max_position_embeddings / the original
// context; the attention factor is mscale / mscale_all_dim when both are non-zero, else
// 0.1 ln(factor) + 1). Other types and inconsistent fields throw naming `where`.
RopeScaling rope_scaling_from_hf(const nlohmann::json& rope, int64_t max_position_embeddings,
                                 const std::string& where);

}  // namespace mg::ops
