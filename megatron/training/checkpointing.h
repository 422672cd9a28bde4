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
// Both: everything is written (and fsynced) into a staged directory (locally
// <root>/iter_0000100.tmp.<pid>/), committed as iter_0000100/ only when complete (metadata.json
// written last), then the tracker file is replaced atomically. A crash at any point (a rank killed
// mid-save) leaves the previous tracker and checkpoint intact; a directory without metadata.json
// is never treated as a checkpoint. Barriers over `world` order it (staged dir before writes, all
// writes before metadata.json, the tracker before anyone returns).
// Async save (SaveOptions::async, --async-save; sharded only): the pieces are copied to host
// memory, a background thread writes this rank's file, and the finalisation (barrier,
// metadata.json, commit) runs in AsyncCheckpointSaver::finalize() of the saver the caller owns and
// passes to save_checkpoint; the next save with that saver and the end of training call it
// (collectives stay on the calling thread).
// Where the code is (as Megatron's training/checkpointing.py over
// megatron/core/dist_checkpointing): this file is the glue (iteration directories, the tracker,
// format selection and detection); the formats, the async saver and all I/O (the Storage interface,
// storage.h: local paths now, an msc:// URL is refused until object storage is built) are in
// megatron/core/dist_checkpointing/. Not done: torch_dist interop (reading Megatron's .distcp
// files).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/dist_checkpointing/async_save.h"
#include "megatron/core/dist_checkpointing/checkpoint_types.h"
#include "megatron/core/transformer/parameter.h"

namespace mg::training {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
using dist_checkpointing::kCheckpointFormat;
using dist_checkpointing::kCheckpointFormatVersion;
using dist_checkpointing::kShardedCheckpointFormat;
using dist_checkpointing::kShardedCheckpointFormatVersion;

using dist_checkpointing::AsyncCheckpointSaver;
using dist_checkpointing::CheckpointIOStats;
using dist_checkpointing::CheckpointRanks;
using dist_checkpointing::CheckpointState;
using dist_checkpointing::LoadOptions;
using dist_checkpointing::SaveOptions;

// <root>/iter_0000100 (Megatron's iter_%07d).
std::string checkpoint_dir(const std::string& root, int64_t iteration);

// Writes iteration `state.iteration` atomically (see the file comment). Parameters are saved
// under their names with their global shapes. An existing checkpoint of the same iteration is
// replaced. `async_saver`: the caller's async saver; its pending save is finalised first, and
// SaveOptions::async needs one (the save is then left pending in it).
CheckpointIOStats save_checkpoint(const std::string& root,
                                  const std::vector<transformer::Parameter>& params,
                                  const CheckpointState& state, const CheckpointRanks& ranks = {},
                                  const SaveOptions& options = {},
                                  AsyncCheckpointSaver* async_saver = nullptr);

// The iteration named by <root>/latest_checkpointed_iteration.txt: nullopt when the tracker file
// is absent; 0 for "release". A malformed tracker throws showing its content.
std::optional<int64_t> read_latest_iteration(const std::string& root);

// Loads the checkpoint under `root` into `params` (copying into the existing tensors; every
// parameter must be present with its global shape, and the checkpoint must hold nothing else that
// no rank uses). Collective over `ranks.world` for the sharded format. Returns the state;
// optimizer/scheduler/rng are nullopt when not requested or not saved. Throws naming the directory,
// file and tensor when anything is missing or corrupt.
CheckpointState load_checkpoint(const std::string& root,
                                std::vector<transformer::Parameter>& params,
                                const LoadOptions& options = {}, const CheckpointRanks& ranks = {});

// The directory of the checkpoint load_checkpoint(root, ..., {.iteration = iteration}) reads
// (the tracker's iteration when nullopt; <root>/release for a "release" tracker with that dir).
std::string resolve_checkpoint_dir(const std::string& root, std::optional<int64_t> iteration);

}  // namespace mg::training
