// parallelize: DDP (and the distributed optimizer's shard) attached to a built model
// (parallelize.h).
#include "megatron/core/distributed/parallelize.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

namespace mg::distributed {

DataParallelModel parallelize(models::LanguageModule& model,
                              const DistributedDataParallelConfig& config,
                              comm::ProcessGroupPtr dp_group,
                              comm::ProcessGroupPtr expert_dp_group) {
  DataParallelModel out;
  DistributedDataParallelConfig c = config;
  if (c.shards_grads() && !c.bucket_size) {
    // Megatron FSDP gathers and reduces per module: without --ddp-bucket-size a bucket holds
    // about one unit of the model (LanguageModule::param_units: a layer, the head, the
    // embeddings), the median unit's size (a layer's in a GPT; the embeddings get their own).
    std::vector<int64_t> units;
    for (const auto& u : model.param_units()) {
      int64_t n = 0;
      for (std::size_t i : u) n += model.parameters().at(i).param.numel();
      if (n > 0) units.push_back(n);
    }
    if (!units.empty()) {
      std::sort(units.begin(), units.end());
      c.bucket_size = units[units.size() / 2];
    }
  }
  std::vector<fp8::ParamRun> fp8_params;  // --fp8-param-gather: gathered as FP8 bytes
  if (fp8::Fp8State* f = model.fp8_state(); f && f->param_gather()) fp8_params = f->param_runs();
  out.ddp =
      std::make_unique<DistributedDataParallel>(c, model.parameters(), model.buffer(), model.ops(),
                                                dp_group, std::move(expert_dp_group), fp8_params);
  DistributedDataParallel* ddp = out.ddp.get();  // stable: owned by the unique_ptr
  if (config.overlap_grad_reduce)
    model.set_grad_ready_hook([ddp](std::size_t i) { ddp->param_grad_ready(i); });
  // ZeRO-2/3: gradient memory backed just before the backward writes it (lazy gradient commit).
  if (c.shards_grads() && model.set_grad_write_hook(
                              [ddp](std::span<const std::size_t> idx) { ddp->prepare_grads(idx); }))
    ddp->enable_lazy_grad_commit();
  if (config.use_distributed_optimizer) {
    optimizer::ShardOptions shard;
    shard.ranges = ddp->optimizer_shard_ranges();
    shard.group = std::move(dp_group);
    shard.expert_group = ddp->expert_data_parallel_group();
    // --overlap-param-gather: the all-gathers run during the next forward, each bucket waited for
    // by the model's param-use hook just before its parameters are first used.
    // ZeRO-3: start_param_sync only discards (and prefetches); the modules gather what they use.
    const bool wait_gather = !config.overlap_param_gather && !config.shards_params();
    shard.gather_params = [ddp, wait_gather] {
      ddp->start_param_sync();
      if (wait_gather) ddp->finish_param_sync();
    };
    if (config.shards_params()) {  // ZeRO-3: gather before each use, free after
      model.set_param_use_hook([ddp](std::span<const std::size_t> idx) { ddp->use_params(idx); });
      model.set_param_release_hook(
          [ddp](std::span<const std::size_t> idx) { ddp->release_params(idx); });
    } else if (config.overlap_param_gather) {
      model.set_param_use_hook(
          [ddp](std::span<const std::size_t> idx) { ddp->wait_param_gather(idx); });
    }
    out.optimizer_shard = std::move(shard);
  }
  return out;
}

}  // namespace mg::distributed
