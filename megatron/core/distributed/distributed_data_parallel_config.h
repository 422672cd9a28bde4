// DistributedDataParallelConfig: Megatron-Core's DDP options
// (megatron/core/distributed/distributed_data_parallel_config.py), with the flag names of
// megatron/training/arguments.py in the comments. A plain struct; validate() throws naming values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mg::distributed {

// Megatron FSDP's --data-parallel-sharding-strategy: what is sharded over the data-parallel
// (dp-cp) group. no_shard = DDP; optim = ZeRO-1 (the distributed optimizer); optim_grads = ZeRO-2
// (also each rank keeps only its gradient shard between steps); optim_grads_params = ZeRO-3 (also
// the parameters: each bucket is all-gathered just before a module uses it in forward or backward
// and freed after).
enum class ShardingStrategy { no_shard, optim, optim_grads, optim_grads_params };
const char* to_string(ShardingStrategy s);
// Parses Megatron's spelling; an unknown one is an error listing the four.
ShardingStrategy parse_sharding_strategy(const std::string& s);

struct DistributedDataParallelConfig {
  // --accumulate-allreduce-grads-in-fp32. This build always accumulates main_grad in f32 under
  // bf16/fp16 (TransformerConfig::grad_dtype) and reduces the buffer in its own dtype, so the
  // option is recorded for Megatron compatibility and changes nothing.
  bool grad_reduce_in_fp32 = false;
  // --overlap-grad-reduce: launch a bucket's collective as soon as every gradient in it is final
  // during the last micro-batch's backward (needs the model's grad-ready hook); else all buckets
  // are reduced in finish_grad_sync().
  bool overlap_grad_reduce = false;
  // --use-distributed-optimizer: reduce-scatter each bucket (each rank keeps its 1/DP chunk) and
  // all-gather the updated parameters after the optimizer step (ZeRO-1).
  bool use_distributed_optimizer = false;
  // --overlap-param-gather: after the distributed optimizer's step, every bucket's parameter
  // all-gather is launched asynchronously and each is waited for only when the next forward first
  // uses one of its parameters (the model's param-use hook). Needs use_distributed_optimizer and
  // overlap_grad_reduce (Megatron's rule). Under FSDP optim_grads_params: while a bucket is in use
  // the next one's all-gather is already in flight (prefetch).
  bool overlap_param_gather = false;
  // --ddp-bucket-size (elements). Unset: Megatron's max(40M, 1M * dp) with overlap, else one
  // bucket holding the whole buffer.
  std::optional<int64_t> bucket_size;
  // Average with the collective's avg op instead of scaling grads by 1/dp before a sum.
  bool average_in_collective = false;
  // --check-for-nan-in-loss-and-grad: the local grad norm of each bucket must be finite before
  // it is communicated (an error naming the rank and bucket otherwise).
  bool check_for_nan_in_grad = false;
  // Megatron's calculate_per_token_loss: no 1/dp scaling (the loop divides by the global token
  // count after the reduction).
  bool calculate_per_token_loss = false;
  // --use-megatron-fsdp (or --use-torch-fsdp2, the same engine here) with
  // --data-parallel-sharding-strategy. Anything but no_shard also sets use_distributed_optimizer
  // (the optimizer state is sharded in every FSDP strategy above no_shard).
  bool use_megatron_fsdp = false;
  ShardingStrategy sharding_strategy = ShardingStrategy::no_shard;

  // Gradients / parameters sharded between steps (ZeRO-2 and ZeRO-3 / ZeRO-3 only).
  bool shards_grads() const {
    return use_megatron_fsdp && (sharding_strategy == ShardingStrategy::optim_grads ||
                                 sharding_strategy == ShardingStrategy::optim_grads_params);
  }
  bool shards_params() const {
    return use_megatron_fsdp && sharding_strategy == ShardingStrategy::optim_grads_params;
  }

  void validate() const;
};

}  // namespace mg::distributed
