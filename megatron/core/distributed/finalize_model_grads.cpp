// finalize_model_grads: every post-backward gradient step, in order (finalize_model_grads.h).
#include "megatron/core/distributed/finalize_model_grads.h"

#include <span>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor_parallel/layers.h"

namespace mg::distributed {

models::LossSums reduce_loss_sums(const models::LossSums& local, comm::ProcessGroup* dp_group) {
  if (!dp_group || dp_group->size() == 1) return local;
  Tensor t =
      Tensor::from_vector(std::vector<double>{local.loss_sum, local.num_tokens}, {2}, DType::f64);
  dp_group->all_reduce(t, comm::ReduceOp::sum)->wait();
  const auto v = t.to_vector<double>();
  return {v[0], v[1], nullptr};
}

models::LossSums finalize_model_grads(models::LanguageModule& model,
                                      const FinalizeModelGradsConfig& config,
                                      const models::LossSums& local) {
  // 1. Tied embeddings over the pipeline (before the data-parallel reduce: PITFALLS #4).
  if (config.embedding_group && config.embedding_group->size() > 1) {
    transformer::Parameter* shared = model.shared_embedding_or_output_weight();
    MG_CHECK(shared != nullptr,
             "finalize_model_grads: this rank is in the embedding group but "
             "holds no word embedding or tied output weight");
    Tensor g = shared->main_grad;
    ScopedTimer t(config.timers, "embedding-grads-all-reduce", 1);
    config.embedding_group->all_reduce(g, comm::ReduceOp::sum)->wait();
  }
  // 2. The data-parallel reduction (the pipelined schedules launched none during backward).
  if (config.ddp) {
    ScopedTimer t(config.timers, "all-grads-sync", 1);
    config.ddp->set_is_last_microbatch(true);
    config.ddp->finish_grad_sync();
  }
  // 3. Sequence parallelism: replicated parameters' partial grads summed over TP.
  if (config.sequence_parallel && config.tp_group && config.tp_group->size() > 1) {
    ScopedTimer t(config.timers, "layernorm-grads-all-reduce", 1);
    if (config.ddp && config.ddp->config().shards_grads()) {
      // FSDP on a device: their discarded ranges may have given their memory back.
      std::vector<std::size_t> sp;
      const auto& ps = model.parameters();
      for (std::size_t i = 0; i < ps.size(); ++i)
        if (ps[i].sequence_parallel) sp.push_back(i);
      config.ddp->commit_grads_of(sp);
    }
    tensor_parallel::all_reduce_sequence_parallel_grads(model.parameters(), *config.tp_group);
  }
  // 4. The global batch's loss sums.
  const models::LossSums global = reduce_loss_sums(local, config.dp_group);
  // 5. Per-token loss: the objective is the token mean of the global batch.
  if (config.calculate_per_token_loss) {
    MG_CHECK(global.num_tokens > 0.0,
             "calculate_per_token_loss: the global batch has no unmasked token");
    Tensor none;
    if (config.ddp && config.ddp->config().shards_grads()) {
      // FSDP: only this rank's shards (the rest is discarded: zeros, or no memory on a device).
      std::vector<Tensor> shards;
      for (const auto& [lo, hi] : config.ddp->optimizer_shard_ranges())
        shards.push_back(model.buffer().grads.slice(lo, hi - lo));
      if (!shards.empty()) model.ops().multi_tensor_scale(shards, 1.0 / global.num_tokens, none);
    } else {
      Tensor grads = model.buffer().grads;
      model.ops().multi_tensor_scale(std::span<Tensor>(&grads, 1), 1.0 / global.num_tokens, none);
    }
  }
  return global;
}

}  // namespace mg::distributed
