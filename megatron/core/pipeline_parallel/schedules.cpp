// The no-pipelining forward-backward schedule (schedules.h).
#include "megatron/core/pipeline_parallel/schedules.h"

#include <span>

#include "megatron/core/common/error.h"

namespace mg::pipeline_parallel {

ForwardBackwardResult forward_backward_no_pipelining(models::GPTModel& model,
                                                     const NextBatchFn& next_batch,
                                                     int64_t num_microbatches,
                                                     const ForwardBackwardConfig& config,
                                                     const models::StepRng& rng) {
  MG_CHECK(num_microbatches >= 1, "num_microbatches must be >= 1, got " << num_microbatches);
  ForwardBackwardResult r;
  models::GPTForwardState state;
  for (int64_t i = 0; i < num_microbatches; ++i) {
    const models::GPTBatch batch = next_batch();
    const models::StepRng mb_rng{rng.seed, rng.iteration, i};
    const models::LossSums sums = model.forward(batch, state, mb_rng, !config.forward_only);
    r.microbatches.push_back(sums);
    r.loss_sum += sums.loss_sum;
    r.num_tokens += sums.num_tokens;
    if (config.forward_only) {
      state.clear();
      continue;
    }
    // Megatron: output_tensor = loss_sum (per-token) or loss_sum / num_tokens / num_microbatches,
    // times the loss scale, is what backward starts from.
    double dloss = config.loss_scale;
    if (!config.calculate_per_token_loss) {
      MG_CHECK(sums.num_tokens > 0.0, "micro-batch " << i << " has no unmasked token (loss_mask "
                                                     << "sums to 0): its mean loss is undefined");
      dloss /= sums.num_tokens * static_cast<double>(num_microbatches);
    }
    if (config.set_is_last_microbatch) config.set_is_last_microbatch(i == num_microbatches - 1);
    model.backward(state, dloss);
  }
  r.lm_loss = r.num_tokens > 0.0 ? r.loss_sum / r.num_tokens : 0.0;
  if (!config.forward_only && config.calculate_per_token_loss && config.finalize_per_token_grads) {
    MG_CHECK(r.num_tokens > 0.0, "calculate_per_token_loss: the batch has no unmasked token");
    Tensor grads = model.buffer().grads;
    Tensor none;
    model.ops().multi_tensor_scale(std::span<Tensor>(&grads, 1), 1.0 / r.num_tokens, none);
  }
  return r;
}

}  // namespace mg::pipeline_parallel
