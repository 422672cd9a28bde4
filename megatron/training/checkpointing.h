// Checkpoints (Megatron's megatron/training/checkpointing.py): save and load the model, optimizer,
// LR scheduler, RNG and data position of a run in a directory per iteration, in one of two formats
// (--ckpt-format):
//
// "sharded" (default; Megatron's torch_dist idea over safetensors,
// megatron/core/dist_checkpointing/):
//   <root>/latest_checkpointed_iteration.txt   "100" (no newline), or "release"
//   <root>/iter_0000100/rank_00003.safetensors  the pieces world rank 3 is the main replica of
//   <root>/iter_0000100/metadata.json           written last: format "megatron-cpp-sharded", the
//        index key -> {dtype, global_shape, pieces: [{file, tensor, offset, shape, flat}]}, the run
//        state (iteration, consumed samples, FLOPs, optimizer and scheduler numbers and strings,
//        grad scaler, RNG of every rank), the layout it was saved with, the flags given
// Every parameter is described as ShardedTensors (sharded_tensor.h) in the FULL tensor's
// coordinates: key = Megatron-Core's name, global shape, box = this TP rank's offset and shape
// (linear_fc1's stride-2 [gate; up] shard = 2 boxes, QKV in Megatron's grouped layout, so the
// stored tensors do not depend on TP), decoder.layers.<global index> names (independent of PP).
// Optimizer state is stored the same way, in parameter space: "optimizer.state.{exp_avg,
// exp_avg_sq,fp32_param,momentum_buffer}.<param>"; under the distributed optimizer each DP rank
// writes the flat pieces it owns (a flat range inside the param's TP box), so the stored state
// is the same whatever the DP size or whether the optimizer was distributed.
// Save: the ranks exchange their piece descriptions; for identical pieces (DP replicas, TP-
// replicated norms) the lowest world rank is the main replica and the only writer; a pipeline
// stage's replica of another stage's parameter (the last stage's tied word embedding,
// Parameter::shared) is not saved, only loaded. Load: every rank maps the files (mmap) and copies
// only the intersections of the stored pieces with the boxes it needs, so any TP / PP / DP /
// virtual pipeline layout (distributed optimizer on or off) loads any other. Vocabulary padding:
// the padded vocabulary grows with TP; when it differs (and the real vocabulary size, recorded in
// metadata.json, equals the loading model's), the real rows are copied and the padding rows keep
// their initial values (their optimizer moments 0); any other shape difference is an error. A model
// key the checkpoint lacks, a dtype or (other) shape mismatch, a checkpoint key no rank uses
// (another model), a truncated or missing rank file: errors naming the file and key.
//
// "legacy" (the previous same-layout format, still loadable; chosen with --ckpt-format legacy):
//   model.safetensors / model_tp_XX.safetensors, optimizer[_tp_XX][_rank_N].safetensors, and a
//   metadata.json of format "megatron-cpp-safetensors"; loads only with the same TP size (and DP
//   size under the distributed optimizer): an error naming both layouts otherwise.
//
// Both: everything is written (and fsynced) into <root>/iter_0000100.tmp.<pid>/, renamed to
// iter_0000100/ only when complete (metadata.json written last), then the tracker file is
// replaced by rename. A crash at any point (a rank killed mid-save) leaves the previous tracker
// and checkpoint intact; a directory without metadata.json is never treated as a checkpoint.
// Barriers over `world` order it (temp dir before writes, all writes before metadata.json, the
// tracker before anyone returns).
// Async save (SaveOptions::async, --async-save; sharded only): the pieces are copied to host
// memory, a background thread writes this rank's file, and the finalisation (barrier,
// metadata.json, renames) runs in finalize_async_save(), which the next save and the end of
// training call (collectives stay on the calling thread).
// Not done: torch_dist interop (reading Megatron's .distcp files).
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
inline constexpr const char* kShardedCheckpointFormat = "megatron-cpp-sharded";
inline constexpr int kShardedCheckpointFormatVersion = 1;

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
};

// The ranks taking part in a save or load (data parallel). Default: this process alone.
struct CheckpointRanks {
  comm::ProcessGroupPtr group;     // null: single process (the data-parallel group)
  comm::ProcessGroupPtr tp_group;  // null or size 1: no tensor parallelism
  comm::ProcessGroupPtr world;     // all ranks (barriers, temp dir); null: `group`
  comm::ProcessGroupPtr pp_group;  // null or size 1: no pipeline parallelism (recorded only)
  bool optimizer_sharded = false;  // --use-distributed-optimizer: one optimizer file per rank
};

// <root>/iter_0000100 (Megatron's iter_%07d).
std::string checkpoint_dir(const std::string& root, int64_t iteration);

// Writes iteration `state.iteration` atomically (see the file comment). Parameters are saved
// under their names with their global shapes. An existing checkpoint of the same iteration is
// replaced.
// A pending async save of this process is finalised first.
CheckpointIOStats save_checkpoint(const std::string& root,
                                  const std::vector<transformer::Parameter>& params,
                                  const CheckpointState& state, const CheckpointRanks& ranks = {},
                                  const SaveOptions& options = {});

// Waits for this process's pending async save (if any) and finalises it (collective over the
// ranks of that save: every rank calls it). Returns false when nothing was pending.
bool finalize_async_save();

// The iteration named by <root>/latest_checkpointed_iteration.txt: nullopt when the tracker file
// is absent; 0 for "release". A malformed tracker throws showing its content.
std::optional<int64_t> read_latest_iteration(const std::string& root);

struct LoadOptions {
  bool load_optimizer = true;  // false: --no-load-optim / --finetune
  bool load_rng = true;        // false: --no-load-rng / --finetune
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

// Loads the checkpoint under `root` into `params` (copying into the existing tensors; every
// parameter must be present with its global shape, and the checkpoint must hold nothing else that
// no rank uses). Collective over `ranks.world` for the sharded format. Returns the state;
// optimizer/scheduler/rng are nullopt when not requested or not saved. Throws naming the directory,
// file and tensor when anything is missing or corrupt.
CheckpointState load_checkpoint(const std::string& root,
                                std::vector<transformer::Parameter>& params,
                                const LoadOptions& options = {}, const CheckpointRanks& ranks = {});

}  // namespace mg::training
