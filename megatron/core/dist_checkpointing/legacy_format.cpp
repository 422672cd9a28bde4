// The legacy same-layout checkpoint format (legacy_format.h): one model file per TP rank, one
// optimizer file per TP rank (or per rank under the distributed optimizer), metadata.json last.
// All I/O through the Storage of the SaveTarget / the caller.
#include "megatron/core/dist_checkpointing/legacy_format.h"

#include <cstdio>
#include <map>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/safetensors.h"

namespace mg::dist_checkpointing {
namespace {

using nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";

json tensor_records(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  json j = json::object();
  for (const auto& [name, t] : tensors)
    j[name] = {{"dtype", safetensors_dtype(t.dtype())},
               {"global_shape", t.shape()},
               {"global_offset", std::vector<int64_t>(t.shape().size(), 0)}};
  return j;
}

// TP rank or -1 (no tensor parallelism: the TP 1 file names).
std::string optimizer_shard_file(int rank, int tp_rank = -1) {
  char name[64];
  if (tp_rank < 0)
    std::snprintf(name, sizeof(name), "optimizer_rank_%05d.safetensors", rank);
  else
    std::snprintf(name, sizeof(name), "optimizer_tp_%02d_rank_%05d.safetensors", tp_rank, rank);
  return name;
}

std::string model_file(int tp_rank) {
  if (tp_rank < 0) return kModelFile;
  char name[48];
  std::snprintf(name, sizeof(name), "model_tp_%02d.safetensors", tp_rank);
  return name;
}

std::string optimizer_file(int tp_rank) {
  if (tp_rank < 0) return kOptimizerFile;
  char name[48];
  std::snprintf(name, sizeof(name), "optimizer_tp_%02d.safetensors", tp_rank);
  return name;
}

}  // namespace

void save_legacy(const SaveTarget& target, const std::vector<transformer::Parameter>& params,
                 const CheckpointState& state, const CheckpointRanks& ranks) {
  const comm::ProcessGroupPtr world = world_of(ranks);
  const bool writer = !world || world->rank() == 0;  // temp dir, metadata.json, renames
  const bool dp_writer = !ranks.group || ranks.group->rank() == 0;  // this TP rank's shared files
  const int tp_size = tp_size_of(ranks), tp_rank = tp_rank_of(ranks);
  auto barrier = [&] {
    if (world) world->barrier();
  };
  Storage& storage = *target.storage;
  const std::string tmp_dir = staged_dir(target, world, writer);
  barrier();

  json meta = run_state_json(kCheckpointFormat, kCheckpointFormatVersion, state);
  meta["tensor_parallel_size"] = tp_size;
  meta["data_parallel_size"] = dp_size_of(ranks);
  meta["files"] = json::object();

  std::vector<std::pair<std::string, Tensor>> model;
  json param_meta = json::object();
  for (const auto& p : params) {
    param_meta[p.name] = {
        {"global_shape", p.global_shape.empty() ? p.param.shape() : p.global_shape},
        {"tensor_parallel_dim", p.tensor_parallel_dim}};
    MG_CHECK(tp_size > 1 || p.param.shape() == p.global_shape || p.global_shape.empty(),
             "save_checkpoint: parameter '"
                 << p.name << "' is a shard " << shape_str(p.param.shape()) << " of "
                 << shape_str(p.global_shape) << "; sharded checkpoints are not supported yet");
    model.emplace_back(p.name, p.param);
  }
  meta["parameters"] = param_meta;
  if (dp_writer)
    save_safetensors(storage, join_path(tmp_dir, model_file(tp_rank)), model,
                     {{"format", kCheckpointFormat}}, target.checksums);
  for (int t = 0; tp_size > 1 && t < tp_size; ++t) meta["files"][model_file(t)] = json::object();
  meta["files"][model_file(tp_rank)] = tensor_records(model);  // world rank 0's (local shapes)

  if (state.optimizer) {
    std::vector<std::pair<std::string, Tensor>> opt(state.optimizer->tensors.begin(),
                                                    state.optimizer->tensors.end());
    // The state's strings (shard ranges) travel in every optimizer file's metadata as well: they
    // may differ per rank, metadata.json holds world rank 0's.
    std::map<std::string, std::string> file_meta = {{"format", kCheckpointFormat}};
    if (ranks.optimizer_sharded || tp_size > 1)
      for (const auto& [k, v] : state.optimizer->strings) file_meta[k] = v;
    if (ranks.optimizer_sharded) {
      // Every rank its own shard; the shard's ranges travel in the file's metadata.
      const int rank = ranks.group ? ranks.group->rank() : 0;
      const int size = ranks.group ? ranks.group->size() : 1;
      save_safetensors(storage, join_path(tmp_dir, optimizer_shard_file(rank, tp_rank)), opt,
                       file_meta, target.checksums);
      meta["optimizer_shards"] = size;
      for (int t = tp_size > 1 ? 0 : -1; t < (tp_size > 1 ? tp_size : 0); ++t)
        for (int r = 0; r < size; ++r) meta["files"][optimizer_shard_file(r, t)] = json::object();
      meta["files"][optimizer_shard_file(rank, tp_rank)] = tensor_records(opt);
    } else {
      if (dp_writer)
        save_safetensors(storage, join_path(tmp_dir, optimizer_file(tp_rank)), opt, file_meta,
                         target.checksums);
      for (int t = 0; tp_size > 1 && t < tp_size; ++t)
        meta["files"][optimizer_file(t)] = json::object();
      meta["files"][optimizer_file(tp_rank)] = tensor_records(opt);
    }
    meta["optimizer"] = state_dict_scalars(*state.optimizer);
  }
  if (state.scheduler) meta["opt_param_scheduler"] = state_dict_scalars(*state.scheduler);
  if (state.rng) meta["rng_state"] = *state.rng;

  barrier();  // every rank's files are written (save_safetensors fsyncs) before metadata.json
  if (!writer) {
    barrier();  // rank 0 has renamed the directory and replaced the tracker
    return;
  }
  // metadata.json last: its presence marks the directory complete (as Megatron's torch_dist).
  commit_checkpoint(target, tmp_dir, meta.dump(2));
  barrier();
}

CheckpointState load_legacy(const Storage& storage, const std::string& dir,
                            const std::string& meta_path, const json& meta,
                            std::vector<transformer::Parameter>& params, const LoadOptions& options,
                            const CheckpointRanks& ranks) {
  const std::string& where = meta_path;
  MG_CHECK(meta.is_object() && meta.value("format", "") == kCheckpointFormat,
           "'" << where << "' is not a " << kCheckpointFormat << " checkpoint");
  MG_CHECK(meta.value("format_version", 0) == kCheckpointFormatVersion,
           "'" << where << "' has format_version " << meta.value("format_version", 0)
               << ", this build reads " << kCheckpointFormatVersion);
  try {
    CheckpointState st;
    st.format = "legacy";
    read_run_state(meta, st);

    // Layout: the same TP size (and DP size under the distributed optimizer, checked below).
    const int tp_size = tp_size_of(ranks), tp_rank = tp_rank_of(ranks);
    const int saved_tp = meta.value("tensor_parallel_size", 1);
    const int saved_dp = meta.value("data_parallel_size", dp_size_of(ranks));
    MG_CHECK(saved_tp == tp_size,
             "checkpoint '" << dir << "' was saved with layout "
                            << layout_str(saved_tp, saved_dp, meta.value("optimizer_shards", 0) > 0)
                            << "; this run has "
                            << layout_str(tp_size, dp_size_of(ranks), ranks.optimizer_sharded)
                            << " (resharding is not supported: load it with the same "
                               "--tensor-model-parallel-size)");
    // Model: every parameter present with its (local) shape, nothing else in the file.
    const std::string model_path = join_path(dir, model_file(tp_rank));
    SafetensorsFile model(storage, model_path, options.verify_checksums);
    for (auto& p : params) {
      MG_CHECK(model.contains(p.name), "checkpoint '" << model_path << "' has no tensor '" << p.name
                                                      << "' that the model needs");
      const auto& e = model.entry(p.name);
      MG_CHECK(e.shape == p.param.shape(), "checkpoint '" << model_path << "': tensor '" << p.name
                                                          << "' has shape " << shape_str(e.shape)
                                                          << ", the model has "
                                                          << shape_str(p.param.shape()));
    }
    for (const auto& n : model.names()) {
      bool known = false;
      for (const auto& p : params) known = known || p.name == n;
      MG_CHECK(known, "checkpoint '" << model_path << "' has tensor '" << n
                                     << "' that the model does not (a different architecture?)");
    }
    // Under TP the local shapes matched; the global ones must too.
    if (tp_size > 1 && meta.contains("parameters"))
      for (const auto& p : params) {
        const auto& pm = meta["parameters"];
        if (!pm.contains(p.name)) continue;
        const Shape g = pm[p.name].at("global_shape").get<Shape>();
        const Shape mine = p.global_shape.empty() ? p.param.shape() : p.global_shape;
        MG_CHECK(g == mine, "checkpoint '" << dir << "': parameter '" << p.name
                                           << "' has global shape " << shape_str(g)
                                           << ", the model has " << shape_str(mine));
      }

    for (auto& p : params) p.param.copy_(model.tensor(p.name));

    if (options.load_optimizer && meta.contains("optimizer")) {
      optimizer::StateDict sd = scalars_to_state_dict(meta["optimizer"], where + " optimizer");
      const int rank = ranks.group ? ranks.group->rank() : 0;
      const int size = ranks.group ? ranks.group->size() : 1;
      const int shards = meta.value("optimizer_shards", 0);
      std::string opt_path = join_path(dir, kOptimizerFile);
      if (shards > 0) {
        MG_CHECK(
            ranks.optimizer_sharded && shards == size,
            "checkpoint '" << dir << "' holds distributed-optimizer state of " << shards
                           << " data-parallel ranks (layout " << layout_str(saved_tp, shards, true)
                           << "); this run has " << size
                           << (ranks.optimizer_sharded ? ""
                                                       : " without --use-distributed-optimizer")
                           << " (layout " << layout_str(tp_size, size, ranks.optimizer_sharded)
                           << "; load it with the same layout, or pass --no-load-optim)");
        opt_path = join_path(dir, optimizer_shard_file(rank, tp_rank));
      } else {
        opt_path = join_path(dir, optimizer_file(tp_rank));
      }
      SafetensorsFile opt(storage, opt_path, options.verify_checksums);
      for (const auto& n : opt.names()) sd.tensors[n] = opt.tensor(n);
      if (shards > 0 || tp_size > 1)  // this rank's ranges (rank 0's were in metadata.json)
        for (const auto& [k, v] : opt.metadata())
          if (k != "format" && sd.strings.count(k)) sd.strings[k] = v;
      if (shards > 0) sd.numbers["shard.rank"] = rank;
      st.optimizer = std::move(sd);
    }
    if (options.load_optimizer && meta.contains("opt_param_scheduler"))
      st.scheduler = scalars_to_state_dict(meta["opt_param_scheduler"], where + " scheduler");
    if (options.load_rng && meta.contains("rng_state")) st.rng = meta["rng_state"];
    return st;
  } catch (const json::exception& e) {
    MG_THROW("checkpoint metadata '" << where << "' is malformed: " << e.what());
  }
}

}  // namespace mg::dist_checkpointing
