// Megatron's model_provider (pretrain_gpt.py): the one place a model is built from the flags, for
// a given parallel layout. Training (pretrain), checkpoint_model (generate, evaluation tools) and
// the HuggingFace converter all call it, so a model is built the same way everywhere: the config
// from --num-layers/--hidden-size/..., the decoder block spec (get_gpt_decoder_block_spec: TE
// naming, dense or MoE MLP per layer from --moe-layer-freq), this rank's tensor / sequence / expert
// / context parallel groups and pipeline chunks. Weights are left uninitialised (init_weights or a
// load). A new model family adds its builder here, behind the same call.
#pragma once

#include <cstdint>
#include <memory>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/ops.h"
#include "megatron/training/arguments.h"
#include "megatron/training/initialize.h"

namespace mg::training {

// This rank's share of the model under `ps` (TP/SP, EP, CP from the flags; the pipeline chunks of
// its stage).
models::GPTModelParallel model_parallel_options(const Arguments& args, const ParallelState& ps);

// The GPT model of `config` with the real vocabulary `vocab_size` (padded as Megatron pads it for
// the TP size), on `device`, running `ops`. `parallel` defaults to one rank holding everything.
std::unique_ptr<models::GPTModel> model_provider(const transformer::TransformerConfig& config,
                                                 int64_t vocab_size, const ops::OpTable& ops,
                                                 Device device,
                                                 const models::GPTModelParallel& parallel = {});

}  // namespace mg::training
