// DistributedDataParallelConfig::validate (distributed_data_parallel_config.h).
#include "megatron/core/distributed/distributed_data_parallel_config.h"

#include "megatron/core/common/error.h"

namespace mg::distributed {

void DistributedDataParallelConfig::validate() const {
  MG_CHECK(!bucket_size || *bucket_size > 0,
           "--ddp-bucket-size must be > 0 elements, got " << *bucket_size);
}

}  // namespace mg::distributed
