// A checkpoint's model, rebuilt from the flags it was trained with: what text generation, HF
// export and evaluation tools need (Megatron's get_model + load_checkpoint for inference).
//
// A checkpoint's metadata.json records the flags of the run ("args": flag -> values, as given,
// YAML first). checkpoint_arguments() turns them back into Megatron's command line, removes the
// flags that `overrides` gives again (the command line of the tool wins, e.g. a tokenizer path on
// another machine), drops --yaml-cfg (its flags are already in the record), and adds placeholders
// for the training-only flags parse_args requires (--micro-batch-size, --lr, --train-iters) when
// the record lacks them. load_model_from_checkpoint() then builds the tokenizer and a GPTModel of
// that config (vocabulary from the tokenizer, padded as in training, or the checkpoint's recorded
// real vocabulary when that is larger than the tokenizer's) and loads the parameters (no
// optimizer, no RNG).
// With CheckpointRanks::tp_group the model is built tensor-parallel over that group (generate under
// mpirun); with CheckpointRanks::ep_group the routed experts are spread over that group (expert
// parallelism; `group` is then the data-parallel group the EP ranks come from). Built forward-only
// (GPTModelParallel::inference_only). Not done: pipeline stages (one rank holds every layer).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/tokenizers/tokenizer.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpointing.h"

namespace mg::training {

// The metadata.json of the checkpoint under `root` (the tracker's iteration, or `iteration`).
// Throws naming the path when there is no checkpoint.
nlohmann::json read_checkpoint_metadata(const std::string& root,
                                        std::optional<int64_t> iteration = std::nullopt);

// The recorded flags of the checkpoint as a command line, with `overrides` applied (see above).
std::vector<std::string> checkpoint_command_line(const nlohmann::json& metadata,
                                                 const std::vector<std::string>& overrides);

struct CheckpointModel {
  Arguments args;
  std::unique_ptr<tokenizers::Tokenizer> tokenizer;
  std::unique_ptr<models::GPTModel> model;
  CheckpointState state;  // iteration, args, extra (no optimizer / RNG)
};

// Builds the model of the checkpoint under `root` on `device` with `ops` and loads its weights.
// `ranks.tp_group` (size > 1): every rank of that group calls this and builds its tensor-parallel
// shard of the model (vocab-parallel logits); the other groups are passed to load_checkpoint.
CheckpointModel load_model_from_checkpoint(const std::string& root, const ops::OpTable& ops,
                                           Device device,
                                           const std::vector<std::string>& overrides = {},
                                           std::optional<int64_t> iteration = std::nullopt,
                                           const CheckpointRanks& ranks = {});

}  // namespace mg::training
