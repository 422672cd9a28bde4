// DistributedDataParallelConfig: Megatron-Core's DDP options
// (megatron/core/distributed/distributed_data_parallel_config.py), with the flag names of
// megatron/training/arguments.py in the comments. A plain struct; validate() throws naming values.
#pragma once

#include <cstdint>
#include <optional>

namespace mg::distributed {

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
  // overlap_grad_reduce (Megatron's rule).
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

  void validate() const;
};

}  // namespace mg::distributed
