// Model FLOPs per training step, Megatron's current formula (megatron/training/training.py
// num_floating_point_operations, core >= 0.12; dense models, no MoE/MLA/MTP):
//
//   flops = B * S * ( 12 L H F g                                   MLP: fc1 + fc2, g = 3/2 for
//   SwiGLU
//                   + 12 L H^2 (1 + NG/NH + S/(2H)) (NH*HD/H)       QKV + proj + causal core
//                   attention
//                   + 6 H V_pad )                                  logits
//
// 12 = 3 (forward, dgrad, wgrad) * 2 (two GEMMs of that size) * 2 (FLOPs per multiply-add). The
// core-attention term counts QK^T and PV with the causal halving (S/2 keys per query on average);
// llm.c and torchtitan count it without the halving. The embedding lookup, norms, activations and
// softmax are not counted.
#pragma once

#include <cstdint>

#include "megatron/core/transformer/transformer_config.h"

namespace mg::models {

// FLOPs of one training step (forward + backward) over batch_size sequences of config.seq_length
// tokens. `config` must be finalized.
double num_floating_point_operations(const transformer::TransformerConfig& config,
                                     int64_t padded_vocab_size, int64_t batch_size);

}  // namespace mg::models
