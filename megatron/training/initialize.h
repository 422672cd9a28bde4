// The first stage of a run (Megatron's initialize_megatron +
// parallel_state.initialize_model_parallel): the run's communicator (--distributed-backend,
// --distributed-timeout-minutes), Megatron's process groups for the layout the flags ask for
// (parallel_state.h's RankGenerator), the pipeline layer layout, and the flags that depend on the
// world size (Megatron's validate_args: the data-parallel size, the default global batch = mbs x
// dp, its divisibility).
//
// One object per run, owned by the caller: no process-wide communicator. Creating one is a
// collective over the world (every rank calls it with the same flags). MPI itself is initialised
// once per process (comm/mpi_backend.cpp); each run gets its own duplicate of the world.
// Groups of size 1 are left null where the trainer treats "absent" and "one rank" alike (tp, pp,
// cp, embedding), so a single-rank run creates no communication.
#pragma once

#include <memory>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/pipeline_parallel/layer_layout.h"
#include "megatron/training/arguments.h"

namespace mg::training {

struct ParallelState {
  // Declared first: the groups below are views of this communicator and go before it.
  std::unique_ptr<comm::Communicator> communicator;
  parallel_state::ParallelDims dims;  // resolved against the world size
  comm::ProcessGroupPtr world;
  // The data-parallel group of gradients and loss sums: dp-cp (the pure dp group without CP).
  comm::ProcessGroupPtr dp;
  // Context parallelism: the CP group and the pure data-parallel group the data iterator follows
  // (both null without CP).
  comm::ProcessGroupPtr cp, data;
  comm::ProcessGroupPtr tp;  // null without tensor parallelism
  comm::ProcessGroupPtr pp;  // null without pipeline parallelism
  // Pipelining with tied embeddings: the first and last stage of this pipeline (null elsewhere).
  comm::ProcessGroupPtr embedding;
  // MoE with expert parallelism (or TP): the expert-model-parallel group, the expert
  // data-parallel group (DDP of expert params) and the expert tp-ep-pp group (grad norm); null
  // otherwise.
  comm::ProcessGroupPtr ep, expert_dp, expert_mp;
  // MoE with TP (+ SP) and CP: the tp-cp group, the aux losses' sequence partition (null
  // otherwise).
  comm::ProcessGroupPtr tp_cp;
  comm::ProcessGroupPtr expert_tp;  // --expert-tensor-parallel-size > 1: the expert-TP group
  // FP8 delayed scaling: Megatron's amax reduction group, tp-dp-cp (tp-cp with --tp-only-amax-red);
  // null without FP8 or when it is this rank alone.
  comm::ProcessGroupPtr amax;
  // --moe-router-enable-expert-bias: Megatron's tp-dp-cp group, over which the tokens per expert
  // that move the expert bias are summed; null otherwise or when it is this rank alone.
  comm::ProcessGroupPtr expert_bias;
  pipeline_parallel::PipelineLayout layout;

  // The data iterator's group: the pure data-parallel ranks (dp without CP).
  const comm::ProcessGroupPtr& data_iterator_group() const { return data ? data : dp; }
};

// Creates the communicator and every group of the layout in `args` (throws naming the sizes when
// they do not divide the world).
ParallelState initialize_model_parallel(const Arguments& args);

// `args` completed for this layout: training.data_parallel_size, the default global batch size
// (mbs x dp, unless --global-batch-size was given) and its check, the scheduler's global batch, the
// DDP bucket NaN check and per-token loss switch; the interleaved schedule's micro-batch rule.
Arguments complete_arguments(const Arguments& args, const ParallelState& ps);

}  // namespace mg::training
