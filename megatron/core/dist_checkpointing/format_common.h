// What the checkpoint formats share (legacy_format.cpp, sharded_save.cpp, sharded_load.cpp,
// async_save.cpp): where a save goes (SaveTarget), the staged-directory protocol and its commit
// (metadata.json last, then the storage's atomic commit, then the tracker), the run-state fields
// of metadata.json, and the rank arithmetic of CheckpointRanks. No file I/O here beyond the
// Storage calls.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "megatron/core/dist_checkpointing/checkpoint_types.h"
#include "megatron/core/dist_checkpointing/storage.h"

namespace mg::dist_checkpointing {

// Where one save goes: `final_dir` (e.g. <root>/iter_0000100) is committed from a staged
// directory, then `tracker` (e.g. <root>/latest_checkpointed_iteration.txt) is replaced with
// `tracker_text`.
struct SaveTarget {
  std::shared_ptr<Storage> storage;
  std::string final_dir, tracker, tracker_text;
  int64_t iteration = 0;
  bool checksums = true;  // per-tensor checksums in the files (SaveOptions::checksums)
};

int tp_size_of(const CheckpointRanks& r);
int tp_rank_of(const CheckpointRanks& r);  // -1 without tensor parallelism
int dp_size_of(const CheckpointRanks& r);
comm::ProcessGroupPtr world_of(const CheckpointRanks& r);
std::string layout_str(int tp, int dp, bool sharded);

// The staged directory of a save, the same on every rank (world rank 0's process tag names it;
// collective over `world`). Only `create` (world rank 0) prepares it; the caller then barriers.
std::string staged_dir(const SaveTarget& target, const comm::ProcessGroupPtr& world, bool create);

// World rank 0, after every rank's files are durable: writes metadata.json (`meta_text`) into
// `staged` last (its presence marks the directory complete), commits it as the final directory
// and replaces the tracker.
void commit_checkpoint(const SaveTarget& target, const std::string& staged,
                       const std::string& meta_text);

// The run state every checkpoint format records in its metadata (Megatron's names).
nlohmann::json run_state_json(const char* format, int format_version, const CheckpointState& state);
// Its inverse for the counters, args and extra (throws nlohmann::json exceptions when malformed).
void read_run_state(const nlohmann::json& meta, CheckpointState& st);

// Numbers are doubles holding exact counters: dumped with round-trip precision (nlohmann does).
nlohmann::json state_dict_scalars(const optimizer::StateDict& sd);
optimizer::StateDict scalars_to_state_dict(const nlohmann::json& j, const std::string& where);

}  // namespace mg::dist_checkpointing
