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
// Not here: tokenizer-dependent data checks (DataConfig::validate runs once the tokenizer gave
// eod/vocab; see training.h), the checks that need the world size (initialize.h).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/distributed/distributed_data_parallel_config.h"
#include "megatron/core/model_parallel_config.h"
#include "megatron/core/optimizer/optimizer_config.h"
#include "megatron/core/optimizer/optimizer_param_scheduler.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/transformer/transformer_config.h"
#include "megatron/training/config.h"
#include "megatron/training/monitoring_config.h"

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
  // TensorBoard, timers, --exit-signal-handler, stragglers (monitoring_config.h)
  MonitoringConfig monitoring;
  // --use-distributed-optimizer, --overlap-grad-reduce, --ddp-bucket-size,
  // --accumulate-allreduce-grads-in-fp32, --ddp-average-in-collective
  distributed::DistributedDataParallelConfig ddp;
  // --use-torch-fsdp2: the FSDP engine of --use-megatron-fsdp with optim_grads_params (noted at
  // start-up).
  bool use_torch_fsdp2 = false;
  std::string platform;  // --platform: cuda | musa | txda | cpu; "" -> MG_PLATFORM, else auto
  // --deterministic-mode (Megatron's): deterministic kernels only and bit-identical reruns; with
  // NCCL it needs NCCL_ALGO (Tree, Ring, CollnetDirect, CollnetChain or ^NVLS). It picks the
  // run's op table (mg::init resolves one without non-deterministic providers; runtime.h).
  bool deterministic_mode = false;
  // --attention-backend (Megatron's AttnBackend; default auto): which attention_fwd/bwd providers
  // the run prefers (training.cpp attention_backend_providers): fused = cuDNN fused attention
  // ("cuda:cudnn"; an error where the platform has none), auto = cuDNN where the build and the
  // platform have it (each call it does not serve falls back to ours), local = our kernels,
  // unfused = our one-row-per-block reference kernel ("cuda:attention-rows"; on the CPU its only
  // kernel). flash is refused at parse time (no FlashAttention library here).
  std::string attention_backend = "auto";
  // --distributed-backend: nccl | mpi | single; "" -> comm::init_communicator's choice (MPI under
  // mpirun/srun, else one rank; the training loop may prefer nccl on CUDA).
  std::string distributed_backend;
  // --distributed-timeout-minutes: how long Work::wait waits for a collective before it throws
  // (and the job aborts); Megatron's default 10.
  int32_t distributed_timeout_minutes = 10;
  // The parallel layout: --tensor-model-parallel-size, --sequence-parallel, --pipeline-model-
  // parallel-size (+ virtual and uneven stages), --context-parallel-size, --cp-comm-type,
  // --expert-model-parallel-size, --expert-tensor-parallel-size (model_parallel_config.h).
  ModelParallelConfig parallel;

  bool help = false;      // --help / -h: print help_text and exit 0
  std::string help_text;  // every flag, one per line
  // Start-up lines for rank 0 (pretrain prints them before any work): each flag given more than
  // once with both values (the last applies), and each accepted flag that has no effect here.
  std::vector<std::string> notices;
  // The flags as given (YAML first, then the command line), for the checkpoint's record.
  std::vector<std::pair<std::string, std::vector<std::string>>> given;
};

Arguments parse_args(const std::vector<std::string>& args);
Arguments parse_args(int argc, char** argv);  // skips argv[0]

}  // namespace mg::training
