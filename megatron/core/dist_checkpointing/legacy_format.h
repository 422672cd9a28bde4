// The legacy same-layout checkpoint format (--ckpt-format legacy, metadata.json format
// "megatron-cpp-safetensors"): model.safetensors / model_tp_XX.safetensors,
// optimizer[_tp_XX][_rank_N].safetensors; loads only with the same TP size (and DP size under the
// distributed optimizer). Kept loadable for old checkpoints; new features go to the sharded format.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/dist_checkpointing/checkpoint_types.h"
#include "megatron/core/dist_checkpointing/format_common.h"
#include "megatron/core/transformer/parameter.h"

namespace mg::dist_checkpointing {

// Writes the checkpoint into a staged directory and commits it (collective over the world).
void save_legacy(const SaveTarget& target, const std::vector<transformer::Parameter>& params,
                 const CheckpointState& state, const CheckpointRanks& ranks);

// Loads checkpoint directory `dir` whose parsed metadata.json (at `meta_path`) is `meta`.
CheckpointState load_legacy(const Storage& storage, const std::string& dir,
                            const std::string& meta_path, const nlohmann::json& meta,
                            std::vector<transformer::Parameter>& params, const LoadOptions& options,
                            const CheckpointRanks& ranks);

}  // namespace mg::dist_checkpointing
