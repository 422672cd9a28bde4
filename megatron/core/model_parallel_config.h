// ModelParallelConfig (Megatron-Core's megatron/core/model_parallel_config.py): the parallel layout
// a run asks for, one plain struct with its checks, instead of loose fields of the arguments. The
// flags are Megatron's; parse_args fills it, initialize_model_parallel (training/initialize.h)
// turns it into process groups, model_provider into this rank's share of the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "megatron/core/transformer/transformer_config.h"

namespace mg {

struct ModelParallelConfig {
  // --tensor-model-parallel-size (world size must divide by it; heads and query groups too) and
  // --sequence-parallel (needs TP > 1: at TP 1 validate() switches it off, as Megatron does, and
  // sequence_parallel_disabled records it for the log).
  int32_t tensor_model_parallel_size = 1;
  bool sequence_parallel = false;
  bool sequence_parallel_disabled = false;
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
  // Expert parallelism (MoE, --num-experts): --expert-model-parallel-size EP spreads the experts
  // over EP ranks carved out of the data-parallel ones; --expert-tensor-parallel-size ETP (default
  // TP) splits each expert's linear_fc1 (column) and linear_fc2 (row) over the expert-TP group of
  // Megatron's expert grid (ETP x EP x expert-DP x PP, parallel_state.h).
  int32_t expert_model_parallel_size = 1;
  std::optional<int64_t> expert_tensor_parallel_size;

  // Megatron's validate_args for these flags against the model (heads, query groups, sequence
  // length, experts, layers): throws naming the flags and values.
  // Switches sequence_parallel off at TP 1 (sequence_parallel_disabled = true). The pipeline
  // layout's virtual size comes from `virtual_pipeline_size` (0: none given) or
  // num_layers_per_virtual_pipeline_stage and is stored in virtual_pipeline_model_parallel_size.
  void validate(const transformer::TransformerConfig& model, int virtual_pipeline_size);
};

}  // namespace mg
