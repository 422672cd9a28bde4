// Checkpoint glue (checkpointing.h), as Megatron's training/checkpointing.py over core
// dist_checkpointing: iteration directory names, the tracker file, format selection on save and
// detection on load. The formats and every byte of I/O are in megatron/core/dist_checkpointing/.
#include "megatron/training/checkpointing.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/legacy_format.h"
#include "megatron/core/dist_checkpointing/sharded_format.h"
#include "megatron/core/dist_checkpointing/storage.h"

namespace mg::training {

namespace dc = dist_checkpointing;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string checkpoint_dir(const std::string& root, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return dc::join_path(root, name);
}

CheckpointIOStats save_checkpoint(const std::string& root,
                                  const std::vector<transformer::Parameter>& params,
                                  const CheckpointState& state, const CheckpointRanks& ranks,
                                  const SaveOptions& options, AsyncCheckpointSaver* async_saver) {
  MG_CHECK(state.iteration >= 0, "save_checkpoint: iteration " << state.iteration << " < 0");
  MG_CHECK(options.format == "sharded" || options.format == "legacy",
           "--ckpt-format " << options.format << " is not supported (valid: sharded, legacy)");
  MG_CHECK(!options.async || async_saver,
           "save_checkpoint: SaveOptions::async needs the caller's AsyncCheckpointSaver");
  if (async_saver) async_saver->finalize();
  dc::SaveTarget target;
  target.storage = dc::storage_for(root);
  target.final_dir = checkpoint_dir(root, state.iteration);
  target.tracker = dc::join_path(root, kTrackerFile);
  target.tracker_text = std::to_string(state.iteration);
  target.iteration = state.iteration;
  target.checksums = options.checksums;
  if (options.format == "legacy") {
    MG_CHECK(!options.async, "--async-save needs --ckpt-format sharded");
    MG_CHECK(!ranks.pp_group || ranks.pp_group->size() == 1,
             "--ckpt-format legacy does not support pipeline parallelism (use sharded)");
    const auto t0 = Clock::now();
    dc::save_legacy(target, params, state, ranks);
    CheckpointIOStats s;
    for (const auto& p : params) s.bytes += static_cast<double>(p.param.nbytes());
    s.total_bytes = s.bytes;
    s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return s;
  }
  return dc::save_sharded(target, params, state, ranks, options.async ? async_saver : nullptr);
}

std::optional<int64_t> read_latest_iteration(const std::string& root) {
  const auto storage = dist_checkpointing::storage_for(root);
  const std::string tracker = dist_checkpointing::join_path(root, kTrackerFile);
  if (!storage->exists(tracker)) return std::nullopt;
  std::string s = storage->read_object(tracker);
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  if (s == "release") return 0;
  int64_t it = -1;
  std::size_t used = 0;
  try {
    it = std::stoll(s, &used);
  } catch (...) {
    used = 0;
  }
  MG_CHECK(used == s.size() && !s.empty() && it >= 0,
           "'" << tracker << "' should hold an iteration number or 'release', holds '" << s << "'");
  return it;
}

namespace {

// The directory to load; sets `iteration` from the tracker when it is nullopt.
std::string dir_to_load(const std::string& root, std::optional<int64_t>& iteration) {
  if (iteration) return checkpoint_dir(root, *iteration);
  iteration = read_latest_iteration(root);
  MG_CHECK(iteration.has_value(),
           "no checkpoint under '" << root << "': " << kTrackerFile << " is missing");
  const std::string release = dc::join_path(root, "release");
  if (*iteration == 0 && dc::storage_for(root)->exists(release)) return release;
  return checkpoint_dir(root, *iteration);
}

}  // namespace

std::string resolve_checkpoint_dir(const std::string& root, std::optional<int64_t> iteration) {
  return dir_to_load(root, iteration);
}

CheckpointState load_checkpoint(const std::string& root,
                                std::vector<transformer::Parameter>& params,
                                const LoadOptions& options, const CheckpointRanks& ranks) {
  const auto storage = dc::storage_for(root);
  std::optional<int64_t> iteration = options.iteration;
  const std::string dir = dir_to_load(root, iteration);
  MG_CHECK(storage->is_directory(dir), "checkpoint directory '"
                                           << dir
                                           << "' does not exist (tracker names "
                                              "iteration "
                                           << *iteration << ")");
  const std::string meta_path = dc::join_path(dir, dc::kMetadataFile);
  MG_CHECK(storage->exists(meta_path),
           "checkpoint '" << dir << "' is incomplete: metadata.json is missing");
  json meta;
  try {
    meta = json::parse(storage->read_object(meta_path));
  } catch (const json::exception& e) {
    MG_THROW("checkpoint metadata '" << meta_path << "' is corrupt: " << e.what());
  }
  const std::string format = meta.is_object() ? meta.value("format", "") : "";
  const std::string kind = format == kShardedCheckpointFormat ? "sharded"
                           : format == kCheckpointFormat      ? "legacy"
                                                              : "";
  MG_CHECK(!kind.empty(), "'" << meta_path << "' is not a Megatron-CPP checkpoint (format '"
                              << format << "'; expected " << kShardedCheckpointFormat << " or "
                              << kCheckpointFormat << ")");
  MG_CHECK(options.auto_detect_format || kind == options.format,
           "checkpoint '" << dir << "' is in the " << kind
                          << " format but this run has --ckpt-format " << options.format
                          << " (pass --ckpt-format " << kind << " or --auto-detect-ckpt-format)");
  if (kind == "legacy")
    return dc::load_legacy(*storage, dir, meta_path, meta, params, options, ranks);
  return dc::load_sharded(*storage, dir, meta_path, meta, params, options, ranks);
}

}  // namespace mg::training
