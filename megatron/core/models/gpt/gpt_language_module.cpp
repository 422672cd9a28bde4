// GPTModel's LanguageModule calls (models/common/language_module.h): the model-independent state
// and the tied embedding, forwarded to the GPT-typed members of gpt_model.cpp.
#include <memory>

#include "megatron/core/common/error.h"
#include "megatron/core/models/gpt/gpt_model.h"

namespace mg::models {
namespace {

GPTForwardState& gpt_state(ForwardState& state) {
  auto* s = dynamic_cast<GPTForwardState*>(&state);
  MG_CHECK(s != nullptr,
           "GPTModel: the forward state was not made by a GPTModel "
           "(use GPTModel::new_forward_state)");
  return *s;
}

}  // namespace

std::unique_ptr<ForwardState> GPTModel::new_forward_state() const {
  return std::make_unique<GPTForwardState>();
}

Tensor GPTModel::forward_chunk(int v, const Batch& batch, const Tensor& input, ForwardState& state,
                               const StepRng& rng, bool training, LossSums* sums) {
  return forward_chunk(v, batch, input, gpt_state(state), rng, training, sums);
}

Tensor GPTModel::backward_chunk(ForwardState& state, const Tensor& output_grad, double dloss) {
  return backward_chunk(gpt_state(state), output_grad, dloss);
}

transformer::Parameter* GPTModel::shared_embedding_or_output_weight() {
  // The first stage's word embedding, or the last stage's tied copy of it (same name).
  for (auto& p : parameters())
    if (p.name == "embedding.word_embeddings.weight") return &p;
  return nullptr;
}

}  // namespace mg::models
