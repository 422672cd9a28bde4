// Megatron's command-line flags (megatron/training/arguments.py), parsed straight into the
// component configs: TransformerConfig, OptimizerConfig + SchedulerArgs, DataConfig, TokenizerArgs,
// and the loop's TrainingConfig / CheckpointConfig / LoggingConfig.
//
// parse_args does what Megatron's parse_args + validate_args do for these flags, before any work:
// --yaml-cfg first (a YAML map of the same flags; the command line overrides it), then the command
// line; then the flag-level defaults (global batch = mbs * dp; --swiglu's FFN size
// int(4H * 2/3 / 64) * 64; num_query_groups = heads without --group-query-attention;
// --lr-decay-iters = train iters); then the checks: conflicting flags (both --fp16 and --bf16, both
// --train-iters and --train-samples, both warmup forms, --swiglu with --squared-relu, --mock-data
// with a data path, ...) and every component's validate(). Errors name the flags and values.
// Not here: the parallel-layout flags beyond --tensor-model-parallel-size / --sequence-parallel
// (context parallelism and expert tensor parallelism arrive with later issues), fp8,
// tokenizer-dependent data checks (DataConfig::validate runs once the tokenizer gave eod/vocab; see
// training.h).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/distributed/distributed_data_parallel_config.h"
#include "megatron/core/optimizer/optimizer_config.h"
#include "megatron/core/optimizer/optimizer_param_scheduler.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/transformer/transformer_config.h"
#include "megatron/training/config.h"

namespace mg::training {

struct Arguments {
  transformer::TransformerConfig model;  // finalized
  optimizer::OptimizerConfig optimizer;
  optimizer::SchedulerArgs scheduler;
  datasets::DataConfig data;  // eod_id / vocab_size / pad_id filled from the tokenizer later
  tokenizers::TokenizerArgs tokenizer;
  TrainingConfig training;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  // --use-distributed-optimizer, --overlap-grad-reduce, --ddp-bucket-size,
  // --accumulate-allreduce-grads-in-fp32, --ddp-average-in-collective
  distributed::DistributedDataParallelConfig ddp;
  std::string platform;  // --platform: cuda | musa | txda | cpu; "" -> MG_PLATFORM, else auto
  // --deterministic-mode (Megatron's): deterministic kernels only and bit-identical reruns; with
  // NCCL it needs NCCL_ALGO (Tree, Ring, CollnetDirect, CollnetChain or ^NVLS). Published to the
  // platforms as plugin::deterministic_mode() (docs/architecture.md lists what it covers).
  bool deterministic_mode = false;
  // --distributed-backend: nccl | mpi | single; "" -> comm::init_communicator's choice (MPI under
  // mpirun/srun, else one rank; the training loop may prefer nccl on CUDA).
  std::string distributed_backend;
  // --distributed-timeout-minutes: how long Work::wait waits for a collective before it throws
  // (and the job aborts); Megatron's default 10.
  int32_t distributed_timeout_minutes = 10;
  // --tensor-model-parallel-size (world size must divide by it; heads and query groups too) and
  // --sequence-parallel (needs TP > 1: at TP 1 it is switched off, as Megatron does, and
  // sequence_parallel_disabled records it for the log).
  int32_t tensor_model_parallel_size = 1;
  bool sequence_parallel = false;
  bool sequence_parallel_disabled = false;
  // Expert parallelism (MoE, --num-experts): --expert-model-parallel-size EP spreads the experts
  // over EP ranks carved out of the data-parallel ones; --expert-tensor-parallel-size (default
  // TP) must be 1 here.
  int32_t expert_model_parallel_size = 1;
  std::optional<int64_t> expert_tensor_parallel_size;
  // Pipeline parallelism: --pipeline-model-parallel-size (layers split evenly, or unevenly with
  // --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers) and interleaving
  // with --virtual-pipeline-model-parallel-size or --num-layers-per-virtual-pipeline-stage
  // (mutually exclusive; parse_args resolves virtual_pipeline_model_parallel_size from either,
  // 1 = no interleaving). Validated by pipeline_parallel::make_pipeline_layout.
  int32_t pipeline_model_parallel_size = 1;
  int32_t virtual_pipeline_model_parallel_size = 1;
  std::optional<int64_t> num_layers_per_virtual_pipeline_stage;
  std::optional<int64_t> decoder_first_pipeline_num_layers;
  std::optional<int64_t> decoder_last_pipeline_num_layers;
  // Context parallelism: --context-parallel-size CP cuts each sequence into 2 CP chunks (rank r
  // keeps chunks r and 2 CP - 1 - r; --seq-length must divide by 2 CP) and --cp-comm-type p2p |
  // a2a | allgather picks how core attention crosses the CP group (transformer/context_parallel.h;
  // a2a splits heads, so each TP rank's heads and query groups must divide by CP).
  int32_t context_parallel_size = 1;
  std::string cp_comm_type = "p2p";

  bool help = false;      // --help / -h: print help_text and exit 0
  std::string help_text;  // every flag, one per line
  // The flags as given (YAML first, then the command line), for the checkpoint's record.
  std::vector<std::pair<std::string, std::vector<std::string>>> given;
};

Arguments parse_args(const std::vector<std::string>& args);
Arguments parse_args(int argc, char** argv);  // skips argv[0]

}  // namespace mg::training
