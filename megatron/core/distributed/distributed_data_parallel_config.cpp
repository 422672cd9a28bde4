// DistributedDataParallelConfig::validate (distributed_data_parallel_config.h).
#include "megatron/core/distributed/distributed_data_parallel_config.h"

#include "megatron/core/common/error.h"

namespace mg::distributed {

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::no_shard:
      return "no_shard";
    case ShardingStrategy::optim:
      return "optim";
    case ShardingStrategy::optim_grads:
      return "optim_grads";
    case ShardingStrategy::optim_grads_params:
      return "optim_grads_params";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& s) {
  for (ShardingStrategy v : {ShardingStrategy::no_shard, ShardingStrategy::optim,
                             ShardingStrategy::optim_grads, ShardingStrategy::optim_grads_params})
    if (s == to_string(v)) return v;
  MG_THROW("--data-parallel-sharding-strategy '"
           << s << "' is not one of no_shard, optim, optim_grads, optim_grads_params");
}

void DistributedDataParallelConfig::validate() const {
  MG_CHECK(!bucket_size || *bucket_size > 0,
           "--ddp-bucket-size must be > 0 elements, got " << *bucket_size);
  MG_CHECK(!overlap_param_gather || use_distributed_optimizer,
           "--overlap-param-gather needs --use-distributed-optimizer (without it every rank "
           "updates all parameters and there is nothing to gather)");
  MG_CHECK(!overlap_param_gather || overlap_grad_reduce,
           "--overlap-param-gather needs --overlap-grad-reduce (Megatron's rule)");
  MG_CHECK(use_megatron_fsdp || sharding_strategy == ShardingStrategy::no_shard,
           "--data-parallel-sharding-strategy " << to_string(sharding_strategy)
                                                << " needs --use-megatron-fsdp");
  MG_CHECK(!use_megatron_fsdp || sharding_strategy == ShardingStrategy::no_shard ||
               use_distributed_optimizer,
           "--data-parallel-sharding-strategy " << to_string(sharding_strategy)
                                                << " shards the optimizer state: it needs "
                                                   "use_distributed_optimizer");
}

}  // namespace mg::distributed
