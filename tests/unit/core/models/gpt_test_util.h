// Shared set-up for the GPTModel tests: tiny GPT-2 / LLaMA / Qwen2 configs and random batches.
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/transformer/transformer_config.h"

namespace mg::test {

// Tiny GPT-2: LayerNorm, tanh GELU, learned positions, biases, tied; H 16, 4 heads, 2 layers.
inline transformer::TransformerConfig tiny_gpt2_config(DType dtype = DType::f32) {
  transformer::TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.max_position_embeddings = 12;
  c.make_vocab_size_divisible_by = 16;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  c.params_dtype = dtype;
  models::apply_gpt2_architecture(c);
  return c;
}

// Tiny LLaMA: RMSNorm, SwiGLU (F 24), RoPE, GQA (4 heads, 2 groups), no bias, untied.
inline transformer::TransformerConfig tiny_llama_config(DType dtype = DType::f32) {
  transformer::TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.seq_length = 8;
  c.make_vocab_size_divisible_by = 16;
  c.params_dtype = dtype;
  models::apply_llama_architecture(c);
  c.norm_epsilon = 1e-5;
  return c;
}

// Random [B, S] batch: tokens and labels in [0, vocab), a loss mask with some zeros.
inline models::GPTBatch random_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed,
                                     bool with_mask = true) {
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  std::vector<int64_t> tok(static_cast<std::size_t>(b * s)), lab(tok.size());
  std::vector<float> mask(tok.size());
  for (std::size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int64_t>(next() % static_cast<uint64_t>(vocab));
    lab[i] = static_cast<int64_t>(next() % static_cast<uint64_t>(vocab));
    mask[i] = with_mask && next() % 5 == 0 ? 0.0f : 1.0f;
  }
  models::GPTBatch batch;
  batch.tokens = Tensor::from_vector(tok, {b, s}, DType::i64);
  batch.labels = Tensor::from_vector(lab, {b, s}, DType::i64);
  batch.loss_mask = Tensor::from_vector(mask, {b, s}, DType::f32);
  return batch;
}

// Rows [start, start + len) of a [B, S] batch (micro-batch splits).
inline models::GPTBatch batch_rows(const models::GPTBatch& full, int64_t start, int64_t len) {
  models::GPTBatch b;
  b.tokens = full.tokens.slice(start, len);
  b.labels = full.labels.slice(start, len);
  b.loss_mask = full.loss_mask.slice(start, len);
  if (full.position_ids.defined()) b.position_ids = full.position_ids.slice(start, len);
  if (full.doc_ids.defined()) b.doc_ids = full.doc_ids.slice(start, len);
  return b;
}

}  // namespace mg::test
