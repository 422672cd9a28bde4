// Prefill + decode loop with a KV cache (text_generation.h).
#include "megatron/core/inference/text_generation.h"

#include <algorithm>
#include <chrono>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor_parallel/mappings.h"

namespace mg::inference {

double GenerationResult::tokens_per_second() const {
  const double t = prefill_seconds + decode_seconds;
  return t > 0.0 ? static_cast<double>(tokens.size()) / t : 0.0;
}

namespace {

// The real-vocabulary logits of the last position of `logits` [S, 1, V_pad] as host f32; with
// tensor parallelism the vocab-parallel shards are gathered first (every rank gets the same row,
// so every rank samples the same token).
std::vector<float> last_row(const models::GPTModel& model, Tensor logits, int64_t vocab) {
  comm::ProcessGroup* tp = model.parallel().tp_group;
  if (tp && tp->size() > 1)
    logits = tensor_parallel::gather_from_tensor_model_parallel_region(logits, *tp);
  const int64_t s = logits.size(0), vp = logits.size(2);
  MG_CHECK(vp >= vocab, "generate: the model returns "
                            << vp << " logits per token, fewer than the vocabulary " << vocab);
  const Tensor row = logits.view({s, vp}).slice(s - 1, 1).to(Device::cpu()).to(DType::f32);
  const float* d = row.data<float>();
  return std::vector<float>(d, d + vocab);
}

}  // namespace

GenerationResult generate(models::GPTModel& model, const std::vector<int32_t>& prompt,
                          const GenerationOptions& o) {
  MG_CHECK(!prompt.empty(), "generate: the prompt is empty (give at least one token)");
  MG_CHECK(o.max_new_tokens >= 0, "--max-new-tokens " << o.max_new_tokens << " must be >= 0");
  const auto& c = model.config();
  int64_t cap = o.max_sequence_length;
  const bool learned =
      c.position_embedding_type == transformer::PositionEmbeddingType::learned_absolute;
  if (cap == 0) cap = static_cast<int64_t>(prompt.size()) + o.max_new_tokens;
  if (learned) cap = std::min(cap, c.max_position_embeddings);
  MG_CHECK(static_cast<int64_t>(prompt.size()) <= cap,
           "generate: the prompt has "
               << prompt.size() << " tokens, more than the "
               << (learned ? "model's max_position_embeddings " : "maximum sequence length ")
               << cap);
  MG_CHECK(o.sample_vocab >= 0 && o.sample_vocab <= model.vocab_size(),
           "generate: sample_vocab " << o.sample_vocab << " is outside [0, the model's vocabulary "
                                     << model.vocab_size() << "]");
  const int64_t vocab = o.sample_vocab > 0 ? o.sample_vocab : model.vocab_size();
  for (std::size_t i = 0; i < prompt.size(); ++i)
    MG_CHECK(prompt[i] >= 0 && prompt[i] < vocab,
             "generate: prompt token " << prompt[i] << " at " << i
                                       << " is outside the vocabulary [0, " << vocab << ")");
  Sampler sampler(o.sampling);
  GenerationResult r;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::optional<StaticInferenceContext> ic;
  if (o.use_kv_cache) ic.emplace(1, cap);
  std::vector<int32_t> seq = prompt;
  auto next_logits = [&](bool first) -> std::vector<float> {
    if (!o.use_kv_cache) {
      models::GPTBatch b;
      b.tokens = Tensor::from_vector(seq, {1, static_cast<int64_t>(seq.size())}, DType::i32);
      return last_row(model, model.logits(b), vocab);
    }
    // Prefill: the whole prompt; then the last sampled token.
    const std::vector<int32_t> next = first ? seq : std::vector<int32_t>{seq.back()};
    const Tensor t = Tensor::from_vector(next, {1, static_cast<int64_t>(next.size())}, DType::i32);
    return last_row(model, model.infer(t, *ic), vocab);
  };
  auto t_first = t0;
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    if (static_cast<int64_t>(seq.size()) >= cap) {
      r.stop_reason = "max-sequence-length";
      break;
    }
    const std::vector<float> logits = next_logits(i == 0);
    const auto tok = static_cast<int32_t>(sampler.sample(logits));
    if (i == 0) t_first = clock::now();
    seq.push_back(tok);
    r.tokens.push_back(tok);
    if (o.on_token) o.on_token(tok);
    if (o.eod && tok == *o.eod) {
      r.stop_reason = "eod";
      break;
    }
  }
  if (r.stop_reason.empty()) r.stop_reason = "max-new-tokens";
  const auto t1 = clock::now();
  if (r.tokens.empty()) t_first = t1;
  r.prefill_seconds = std::chrono::duration<double>(t_first - t0).count();
  r.decode_seconds = std::chrono::duration<double>(t1 - t_first).count();
  return r;
}

}  // namespace mg::inference
