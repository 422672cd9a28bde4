// What a checkpoint save or load is given and returns, for every format (legacy_format.h,
// sharded_format.h): the run state besides the parameters, the ranks taking part, the options,
// the I/O statistics, and the format names recorded in metadata.json. Plain data, no behaviour.
// megatron/training/checkpointing.h re-exports these under mg::training (Megatron's API names).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/optimizer/state_dict.h"

namespace mg::dist_checkpointing {

inline constexpr const char* kCheckpointFormat = "megatron-cpp-safetensors";  // "legacy"
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kShardedCheckpointFormat = "megatron-cpp-sharded";
inline constexpr int kShardedCheckpointFormatVersion = 1;
inline constexpr const char* kMetadataFile = "metadata.json";

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
  // The real (unpadded) vocabulary size, 0: unknown. Sharded save records it; a load may then
  // change the vocabulary padding (LoadOptions::vocab_size equal to it).
  int64_t vocab_size = 0;
  std::string format;  // load: the checkpoint's format ("sharded" or "legacy")
  // load: bytes this rank read from the files and the seconds the load took
  double io_bytes = 0.0, io_seconds = 0.0;
};

// What one save wrote (this rank; `total_bytes`: all ranks' pieces) and how long it took.
struct CheckpointIOStats {
  double bytes = 0.0, total_bytes = 0.0, seconds = 0.0;
  bool async = false;  // the file write continues in the background
};

// --ckpt-format and --async-save.
struct SaveOptions {
  std::string format = "sharded";  // "sharded" | "legacy"
  bool async = false;              // sharded only
  bool checksums = true;           // per-tensor XXH3-64 in every file (--no-ckpt-checksum: off)
};

// The ranks taking part in a save or load (data parallel). Default: this process alone.
struct CheckpointRanks {
  comm::ProcessGroupPtr group;     // null: single process (the data-parallel group)
  comm::ProcessGroupPtr tp_group;  // null or size 1: no tensor parallelism
  comm::ProcessGroupPtr world;     // all ranks (barriers, temp dir); null: `group`
  comm::ProcessGroupPtr pp_group;  // null or size 1: no pipeline parallelism (recorded only)
  comm::ProcessGroupPtr ep_group;  // load_model_from_checkpoint: the experts' EP group (or null)
  bool optimizer_sharded = false;  // --use-distributed-optimizer: one optimizer file per rank
};

struct LoadOptions {
  bool load_optimizer = true;  // false: --no-load-optim / --finetune
  bool load_rng = true;        // false: --no-load-rng / --finetune
  // Verify the files' per-tensor checksums where present (--no-ckpt-checksum: skip).
  bool verify_checksums = true;
  // The iteration to load; nullopt -> the tracker's.
  std::optional<int64_t> iteration;
  // --ckpt-format / --auto-detect-ckpt-format: a checkpoint of another format is an error unless
  // auto-detecting.
  std::string format = "sharded";
  bool auto_detect_format = true;
  // The model's real vocabulary size (0: unknown). When it equals the checkpoint's, the padded
  // vocabulary rows (word_embeddings / output_layer dim 0) may differ: rows [0, vocab_size) are
  // read, the padding rows keep their current values (optimizer moments 0).
  int64_t vocab_size = 0;
  // Sharded format: the optimizer's current state_dict() (its keys, shapes and, under the
  // distributed optimizer, "shard.ranges") to fill from the parameter-space state; without it
  // the per-parameter keys of `params` are returned (no distributed optimizer).
  std::optional<optimizer::StateDict> optimizer_template;
};

}  // namespace mg::dist_checkpointing
