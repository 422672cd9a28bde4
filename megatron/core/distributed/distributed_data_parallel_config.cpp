// DistributedDataParallelConfig::validate (distributed_data_parallel_config.h).
#include "megatron/core/distributed/distributed_data_parallel_config.h"

#include "megatron/core/common/error.h"

namespace mg::distributed {

void DistributedDataParallelConfig::validate() const {
  MG_CHECK(!bucket_size || *bucket_size > 0,
           "--ddp-bucket-size must be > 0 elements, got " << *bucket_size);
  MG_CHECK(!overlap_param_gather || use_distributed_optimizer,
           "--overlap-param-gather needs --use-distributed-optimizer (without it every rank "
           "updates all parameters and there is nothing to gather)");
  MG_CHECK(!overlap_param_gather || overlap_grad_reduce,
           "--overlap-param-gather needs --overlap-grad-reduce (Megatron's rule)");
}

}  // namespace mg::distributed
