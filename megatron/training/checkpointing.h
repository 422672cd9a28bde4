// Checkpoints (Megatron's megatron/training/checkpointing.py, single process): save and load the
// model, optimizer, LR scheduler, RNG and data position of a run in a directory per iteration.
//
//   <root>/latest_checkpointed_iteration.txt   "100" (no newline), or "release"
//   <root>/iter_0000100/model.safetensors       parameters by Megatron-Core name, model dtype
//   <root>/iter_0000100/optimizer.safetensors   optimizer state tensors (absent: --no-save-optim)
//   <root>/iter_0000100/metadata.json           written last: format, iteration, consumed samples,
//        FLOPs so far, every tensor's file, dtype, global shape and offset, the optimizer's and
//        scheduler's numbers and strings (grad scaler included), the RNG state, the flags given
//
// Atomicity: everything is written (and fsynced) into <root>/iter_0000100.tmp.<pid>/, renamed to
// iter_0000100/ only when complete, and then the tracker file is replaced by rename. A crash at
// any point leaves the previous tracker and checkpoint intact; a directory without metadata.json
// is never treated as a checkpoint. Loading validates every file (safetensors strictly, shapes
// against the model) and names the file and tensor in every error.
//
// Data parallel (CheckpointRanks with a group): every rank of the group calls save/load with the
// same state. Rank 0 writes the shared files (model, replicated optimizer state, metadata) and does
// the renames; under the distributed optimizer each rank also writes its own shard
//   <root>/iter_0000100/optimizer_rank_00003.safetensors   (flat shards + their ranges)
// Barriers order it: the temporary directory exists before anyone writes, every rank has written
// (and fsynced) before metadata.json and the rename, and no rank returns before the tracker names
// the new checkpoint. A sharded checkpoint loads only with the same data-parallel size and
// buckets (an error naming both layouts otherwise).
//
// Tensor parallel (CheckpointRanks::tp_group of size > 1; `group` is then the DP group and
// `world` all ranks): data-parallel rank 0 of every TP rank writes its model shard, and the
// optimizer files are per TP rank as well
//   <root>/iter_0000100/model_tp_01.safetensors                  (TP rank 1's local parameters)
//   <root>/iter_0000100/optimizer_tp_01.safetensors              (replicated optimizer)
//   <root>/iter_0000100/optimizer_tp_01_rank_00003.safetensors   (distributed optimizer)
// World rank 0 makes the temporary directory, writes metadata.json (with the TP and DP sizes and
// every parameter's global shape and partitioned dim) and does the renames; the barriers are over
// the world. TP 1 keeps model.safetensors / optimizer[_rank_N].safetensors. A TP checkpoint loads
// only with the same TP size (and DP size under the distributed optimizer): an error naming both
// layouts otherwise.
// Not done: PP layouts, resharding across TP/DP sizes, async save, torch_dist interop.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/optimizer/state_dict.h"
#include "megatron/core/transformer/parameter.h"

namespace mg::training {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kCheckpointFormat = "megatron-cpp-safetensors";
inline constexpr int kCheckpointFormatVersion = 1;

// What a checkpoint holds besides the model parameters.
struct CheckpointState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;  // the training data position (all DP ranks)
  int64_t consumed_valid_samples = 0;
  double floating_point_operations_so_far = 0.0;
  std::optional<optimizer::StateDict> optimizer;    // MegatronOptimizer::state_dict()
  std::optional<optimizer::StateDict> scheduler;    // OptimizerParamScheduler::state_dict()
  std::optional<nlohmann::json> rng;                // the loop's RNG state
  nlohmann::json args = nlohmann::json::object();   // the flags as given
  nlohmann::json extra = nlohmann::json::object();  // anything else the caller keeps
};

// The ranks taking part in a save or load (data parallel). Default: this process alone.
struct CheckpointRanks {
  comm::ProcessGroupPtr group;     // null: single process (the data-parallel group)
  comm::ProcessGroupPtr tp_group;  // null or size 1: no tensor parallelism
  comm::ProcessGroupPtr world;     // all ranks (barriers, temp dir); null: `group`
  bool optimizer_sharded = false;  // --use-distributed-optimizer: one optimizer file per rank
};

// <root>/iter_0000100 (Megatron's iter_%07d).
std::string checkpoint_dir(const std::string& root, int64_t iteration);

// Writes iteration `state.iteration` atomically (see the file comment). Parameters are saved
// under their names with their global shapes. An existing checkpoint of the same iteration is
// replaced.
void save_checkpoint(const std::string& root, const std::vector<transformer::Parameter>& params,
                     const CheckpointState& state, const CheckpointRanks& ranks = {});

// The iteration named by <root>/latest_checkpointed_iteration.txt: nullopt when the tracker file
// is absent; 0 for "release". A malformed tracker throws showing its content.
std::optional<int64_t> read_latest_iteration(const std::string& root);

struct LoadOptions {
  bool load_optimizer = true;  // false: --no-load-optim / --finetune
  bool load_rng = true;        // false: --no-load-rng / --finetune
  // The iteration to load; nullopt -> the tracker's.
  std::optional<int64_t> iteration;
};

// Loads the checkpoint under `root` into `params` (copying and converting into the existing
// tensors; every parameter must be present with its global shape, and the checkpoint must hold
// nothing else). Returns the state; optimizer/scheduler/rng are nullopt when not requested or not
// saved. Throws naming the directory, file and tensor when anything is missing or corrupt.
CheckpointState load_checkpoint(const std::string& root,
                                std::vector<transformer::Parameter>& params,
                                const LoadOptions& options = {}, const CheckpointRanks& ranks = {});

}  // namespace mg::training
