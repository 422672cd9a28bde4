// The data-parallel wrapping of a built model (torchtitan's `parallelize` step; Megatron's
// get_model wrapping the model in DistributedDataParallel): the model is built plain by
// model_provider, then this stage attaches DDP to its gradient buffer, installs DDP's hooks into
// the model (--overlap-grad-reduce's grad-ready hook, --overlap-param-gather's param-use hook) and,
// under --use-distributed-optimizer, describes the optimizer's ZeRO-1 shard. Megatron FSDP
// (--use-megatron-fsdp) is a branch here: ZeRO-3 installs DDP's use_params / release_params as
// the model's param-use / param-release hooks, and FSDP's default bucket is one model unit.
//
// Invariants: nothing here changes the numbers (one rank: DDP communicates and scales nothing).
// The returned object must outlive the model's use of the hooks (the trainer holds both).
#pragma once

#include <memory>
#include <optional>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/models/common/language_module.h"
#include "megatron/core/optimizer/optimizer.h"

namespace mg::distributed {

struct DataParallelModel {
  std::unique_ptr<DistributedDataParallel> ddp;
  // --use-distributed-optimizer: this rank's ranges of the flat buffer and the all-gather of the
  // updated weights after a step (for MegatronOptimizer); nullopt otherwise.
  std::optional<optimizer::ShardOptions> optimizer_shard;
};

// dp_group: the data-parallel group (dp-cp with context parallelism); expert_dp_group: the
// expert-data-parallel group of MoE (null: experts are ordinary parameters).
DataParallelModel parallelize(models::LanguageModule& model,
                              const DistributedDataParallelConfig& config,
                              comm::ProcessGroupPtr dp_group,
                              comm::ProcessGroupPtr expert_dp_group = nullptr);

}  // namespace mg::distributed
