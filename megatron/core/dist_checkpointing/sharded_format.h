// The sharded (resharding) checkpoint format (--ckpt-format sharded, metadata.json format
// "megatron-cpp-sharded"; megatron/training/checkpointing.h describes the layout): every rank
// writes rank_<world rank>.safetensors with the pieces it is the main replica of, world rank 0
// writes metadata.json (the index key -> pieces, the run state) last; a load copies the
// intersections of the stored pieces with the boxes each rank needs, so any TP / PP / DP layout
// loads any other. sharded_save.cpp writes, sharded_load.cpp reads; the helpers both need (piece
// boxes of a parameter, the distributed optimizer's flat shard layout, state key names) are in
// namespace detail here (sharded_common.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/dist_checkpointing/async_save.h"
#include "megatron/core/dist_checkpointing/checkpoint_types.h"
#include "megatron/core/dist_checkpointing/format_common.h"
#include "megatron/core/dist_checkpointing/sharded_tensor.h"
#include "megatron/core/transformer/parameter.h"

namespace mg::dist_checkpointing {

// Saves (collective over the world). With `async` the file write runs in the background and the
// save is handed to `async` for finalisation; otherwise it is finalised before returning.
CheckpointIOStats save_sharded(const SaveTarget& target,
                               const std::vector<transformer::Parameter>& params,
                               const CheckpointState& state, const CheckpointRanks& ranks,
                               AsyncCheckpointSaver* async);

// Loads checkpoint directory `dir` whose parsed metadata.json (at `meta_path`) is `meta`
// (collective over the world).
CheckpointState load_sharded(const Storage& storage, const std::string& dir,
                             const std::string& meta_path, const nlohmann::json& meta,
                             std::vector<transformer::Parameter>& params,
                             const LoadOptions& options, const CheckpointRanks& ranks);

namespace detail {

inline constexpr const char* kStatePrefix = "optimizer.state.";
inline constexpr const char* kShardPrefix = "optimizer.shard.";

// rank_00003.safetensors
std::string rank_file(int rank);
Shape global_of(const transformer::Parameter& p);
// The TP boxes of parameter p on this rank (its local shard's regions of the full tensor).
std::vector<Box> boxes_of(const transformer::Parameter& p, const CheckpointRanks& r);
// "a:b,c:d" -> {(a, b), (c, d)} (the distributed optimizer's shard.ranges).
std::vector<std::pair<int64_t, int64_t>> parse_ranges(const std::string& s);

// The distributed optimizer's flat shard layout: for each owned range in order, the parameters
// (by buffer offset) it intersects: (param index, [lo, hi) in the flat buffer, shard position).
struct ShardSlot {
  std::size_t param;
  int64_t lo, hi, pos;
};
std::vector<ShardSlot> shard_slots(const std::vector<transformer::Parameter>& params,
                                   const std::vector<std::pair<int64_t, int64_t>>& ranges);

// "optimizer.state.<kind>.<name>" -> (kind, name); false for other keys.
bool split_state_key(const std::string& key, std::string& kind, std::string& name);

}  // namespace detail
}  // namespace mg::dist_checkpointing
