// Autoregressive generation over a GPTModel with a KV cache (Megatron-Core's
// TextGenerationController for one prompt, static batching of one sequence).
//
//   prefill: the prompt's tokens in one GPTModel::infer call (StaticInferenceContext), the next
//   token sampled from the last position's logits; then one infer call per new token. Stops after
//   max_new_tokens, at `eod` (when set; the eod token is returned as the last token), or when the
//   next position would pass max_sequence_length (the model's position table / the caller's cap).
// use_kv_cache = false recomputes the whole prefix with GPTModel::logits() for every token (the
// reference the cache is tested against, and slower: O(n^2) tokens of work).
// Only the real vocabulary [0, V) is sampled (the padding rows' logits are ignored). Tensor
// parallelism: every rank of the model's TP group calls generate; the vocab-parallel logits are
// all-gathered, so every rank samples the same tokens. The whole model on each rank (no pipeline
// stages).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/inference/sampling.h"
#include "megatron/core/models/gpt/gpt_model.h"

namespace mg::inference {

struct GenerationOptions {
  SamplingParams sampling;
  int64_t max_new_tokens = 64;      // --max-new-tokens
  std::optional<int32_t> eod;       // stop after generating this id
  int64_t max_sequence_length = 0;  // prompt + new tokens cap; 0 -> the model's
                                    // max_position_embeddings (learned) or prompt + max_new_tokens
  // Sample only ids in [0, sample_vocab) (a tokenizer smaller than the model's vocabulary);
  // 0 -> the model's vocabulary.
  int64_t sample_vocab = 0;
  bool use_kv_cache = true;
  // Called with each new token as soon as it is sampled (streaming output); may be empty.
  std::function<void(int32_t token)> on_token;
};

struct GenerationResult {
  std::vector<int32_t> tokens;   // the generated tokens (not the prompt)
  std::string stop_reason;       // "eod", "max-new-tokens", "max-sequence-length"
  double prefill_seconds = 0.0;  // prompt forward + first token
  double decode_seconds = 0.0;   // the other tokens
  // Tokens per second over the whole generation (prefill included).
  double tokens_per_second() const;
};

GenerationResult generate(models::GPTModel& model, const std::vector<int32_t>& prompt,
                          const GenerationOptions& options);

}  // namespace mg::inference
