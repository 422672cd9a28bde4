// Checkpoint save/load over safetensors + metadata.json, atomic by temp directory and rename.
#include "megatron/training/checkpointing.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/safetensors.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kMetadataFile = "metadata.json";

// fsync a file or directory by path (directories make renames durable).
void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  MG_CHECK(fd >= 0, "cannot open '" << p.string() << "' to sync: " << std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  MG_CHECK(rc == 0, "fsync of '" << p.string() << "' failed: " << std::strerror(errno));
}

// Writes `text` to `path` through a temporary file and a rename.
void write_file_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MG_CHECK(f, "cannot create '" << tmp.string() << "'");
    f << text;
    f.flush();
    MG_CHECK(f, "write to '" << tmp.string() << "' failed");
  }
  fsync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  MG_CHECK(!ec,
           "cannot rename '" << tmp.string() << "' to '" << path.string() << "': " << ec.message());
}

// Numbers are doubles holding exact counters: dump with round-trip precision (nlohmann does).
json state_dict_scalars(const optimizer::StateDict& sd) {
  json j = {{"numbers", json::object()}, {"strings", json::object()}};
  for (const auto& [k, v] : sd.numbers) {
    MG_CHECK(std::isfinite(v), "state value '" << k << "' = " << v << " is not finite");
    j["numbers"][k] = v;
  }
  for (const auto& [k, v] : sd.strings) j["strings"][k] = v;
  return j;
}

optimizer::StateDict scalars_to_state_dict(const json& j, const std::string& where) {
  optimizer::StateDict sd;
  MG_CHECK(j.is_object() && j.contains("numbers") && j.contains("strings"),
           where << ": expected an object with 'numbers' and 'strings'");
  for (auto it = j["numbers"].begin(); it != j["numbers"].end(); ++it) {
    MG_CHECK(it.value().is_number(), where << ": '" << it.key() << "' is not a number");
    sd.numbers[it.key()] = it.value().get<double>();
  }
  for (auto it = j["strings"].begin(); it != j["strings"].end(); ++it) {
    MG_CHECK(it.value().is_string(), where << ": '" << it.key() << "' is not a string");
    sd.strings[it.key()] = it.value().get<std::string>();
  }
  return sd;
}

json tensor_records(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  json j = json::object();
  for (const auto& [name, t] : tensors)
    j[name] = {{"dtype", dist_checkpointing::safetensors_dtype(t.dtype())},
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

int tp_size_of(const CheckpointRanks& r) {
  return r.tp_group ? r.tp_group->size() : 1;
}
int tp_rank_of(const CheckpointRanks& r) {
  return tp_size_of(r) > 1 ? r.tp_group->rank() : -1;
}
int dp_size_of(const CheckpointRanks& r) {
  return r.group ? r.group->size() : 1;
}
comm::ProcessGroupPtr world_of(const CheckpointRanks& r) {
  return r.world ? r.world : r.group;
}

std::string layout_str(int tp, int dp, bool sharded) {
  std::ostringstream s;
  s << "TP " << tp << " x DP " << dp << (sharded ? " (distributed optimizer)" : "");
  return s.str();
}

}  // namespace

std::string checkpoint_dir(const std::string& root, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return (fs::path(root) / name).string();
}

void save_checkpoint(const std::string& root, const std::vector<transformer::Parameter>& params,
                     const CheckpointState& state, const CheckpointRanks& ranks) {
  MG_CHECK(state.iteration >= 0, "save_checkpoint: iteration " << state.iteration << " < 0");
  const comm::ProcessGroupPtr world = world_of(ranks);
  const bool writer = !world || world->rank() == 0;  // temp dir, metadata.json, renames
  const bool dp_writer = !ranks.group || ranks.group->rank() == 0;  // this TP rank's shared files
  const int tp_size = tp_size_of(ranks), tp_rank = tp_rank_of(ranks);
  auto barrier = [&] {
    if (world) world->barrier();
  };
  std::error_code ec;
  const fs::path final_dir = checkpoint_dir(root, state.iteration);
  // One temporary directory for all ranks: rank 0's pid names it.
  std::string tmp_tag = std::to_string(::getpid());
  if (world && world->size() > 1) {
    Tensor pid = Tensor::from_vector(std::vector<int64_t>{::getpid()}, {1}, DType::i64);
    world->broadcast(pid, 0)->wait();
    tmp_tag = std::to_string(pid.to_vector<int64_t>()[0]);
  }
  const fs::path tmp_dir = final_dir.string() + ".tmp." + tmp_tag;
  if (writer) {
    fs::create_directories(root, ec);
    MG_CHECK(!ec, "cannot create checkpoint directory '" << root << "': " << ec.message());
    fs::remove_all(tmp_dir, ec);
    fs::create_directories(tmp_dir, ec);
    MG_CHECK(!ec, "cannot create '" << tmp_dir.string() << "': " << ec.message());
  }
  barrier();

  json meta = {{"format", kCheckpointFormat},
               {"format_version", kCheckpointFormatVersion},
               {"checkpoint_version", 3.0},
               {"iteration", state.iteration},
               {"consumed_train_samples", state.consumed_train_samples},
               {"consumed_valid_samples", state.consumed_valid_samples},
               {"num_floating_point_operations_so_far", state.floating_point_operations_so_far},
               {"args", state.args},
               {"extra", state.extra},
               {"tensor_parallel_size", tp_size},
               {"data_parallel_size", dp_size_of(ranks)},
               {"files", json::object()}};

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
    dist_checkpointing::save_safetensors((tmp_dir / model_file(tp_rank)).string(), model,
                                         {{"format", kCheckpointFormat}});
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
      dist_checkpointing::save_safetensors((tmp_dir / optimizer_shard_file(rank, tp_rank)).string(),
                                           opt, file_meta);
      meta["optimizer_shards"] = size;
      for (int t = tp_size > 1 ? 0 : -1; t < (tp_size > 1 ? tp_size : 0); ++t)
        for (int r = 0; r < size; ++r) meta["files"][optimizer_shard_file(r, t)] = json::object();
      meta["files"][optimizer_shard_file(rank, tp_rank)] = tensor_records(opt);
    } else {
      if (dp_writer)
        dist_checkpointing::save_safetensors((tmp_dir / optimizer_file(tp_rank)).string(), opt,
                                             file_meta);
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
  write_file_atomic(tmp_dir / kMetadataFile, meta.dump(2));
  fsync_path(tmp_dir);

  // Replace an existing checkpoint of this iteration: move it aside, move the new one in.
  const fs::path old_dir = final_dir.string() + ".old." + std::to_string(::getpid());
  const bool had_old = fs::exists(final_dir);
  if (had_old) {
    fs::rename(final_dir, old_dir, ec);
    MG_CHECK(!ec, "cannot move aside '" << final_dir.string() << "': " << ec.message());
  }
  fs::rename(tmp_dir, final_dir, ec);
  MG_CHECK(!ec, "cannot rename '" << tmp_dir.string() << "' to '" << final_dir.string()
                                  << "': " << ec.message());
  fsync_path(root);
  write_file_atomic(fs::path(root) / kTrackerFile, std::to_string(state.iteration));
  fsync_path(root);
  if (had_old) fs::remove_all(old_dir, ec);
  barrier();
}

std::optional<int64_t> read_latest_iteration(const std::string& root) {
  const fs::path tracker = fs::path(root) / kTrackerFile;
  if (!fs::exists(tracker)) return std::nullopt;
  std::ifstream f(tracker);
  MG_CHECK(f, "cannot read '" << tracker.string() << "'");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
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
           "'" << tracker.string() << "' should hold an iteration number or 'release', holds '" << s
               << "'");
  return it;
}

CheckpointState load_checkpoint(const std::string& root,
                                std::vector<transformer::Parameter>& params,
                                const LoadOptions& options, const CheckpointRanks& ranks) {
  std::optional<int64_t> iteration = options.iteration;
  bool release = false;
  if (!iteration) {
    iteration = read_latest_iteration(root);
    MG_CHECK(iteration.has_value(),
             "no checkpoint under '" << root << "': " << kTrackerFile << " is missing");
    release = *iteration == 0 && fs::exists(fs::path(root) / "release");
  }
  const fs::path dir =
      release ? fs::path(root) / "release" : fs::path(checkpoint_dir(root, *iteration));
  MG_CHECK(fs::is_directory(dir),
           "checkpoint directory '" << dir.string() << "' does not exist (tracker names iteration "
                                    << *iteration << ")");
  const fs::path meta_path = dir / kMetadataFile;
  MG_CHECK(fs::exists(meta_path),
           "checkpoint '" << dir.string() << "' is incomplete: metadata.json is missing");
  json meta;
  {
    std::ifstream f(meta_path);
    try {
      meta = json::parse(f);
    } catch (const json::exception& e) {
      MG_THROW("checkpoint metadata '" << meta_path.string() << "' is corrupt: " << e.what());
    }
  }
  const std::string where = meta_path.string();
  MG_CHECK(meta.is_object() && meta.value("format", "") == kCheckpointFormat,
           "'" << where << "' is not a " << kCheckpointFormat << " checkpoint");
  MG_CHECK(meta.value("format_version", 0) == kCheckpointFormatVersion,
           "'" << where << "' has format_version " << meta.value("format_version", 0)
               << ", this build reads " << kCheckpointFormatVersion);
  try {
    CheckpointState st;
    st.iteration = meta.at("iteration").get<int64_t>();
    st.consumed_train_samples = meta.at("consumed_train_samples").get<int64_t>();
    st.consumed_valid_samples = meta.at("consumed_valid_samples").get<int64_t>();
    st.floating_point_operations_so_far =
        meta.at("num_floating_point_operations_so_far").get<double>();
    st.args = meta.value("args", json::object());
    st.extra = meta.value("extra", json::object());

    // Layout: the same TP size (and DP size under the distributed optimizer, checked below).
    const int tp_size = tp_size_of(ranks), tp_rank = tp_rank_of(ranks);
    const int saved_tp = meta.value("tensor_parallel_size", 1);
    const int saved_dp = meta.value("data_parallel_size", dp_size_of(ranks));
    MG_CHECK(saved_tp == tp_size,
             "checkpoint '" << dir.string() << "' was saved with layout "
                            << layout_str(saved_tp, saved_dp, meta.value("optimizer_shards", 0) > 0)
                            << "; this run has "
                            << layout_str(tp_size, dp_size_of(ranks), ranks.optimizer_sharded)
                            << " (resharding is not supported: load it with the same "
                               "--tensor-model-parallel-size)");
    // Model: every parameter present with its (local) shape, nothing else in the file.
    const std::string model_path = (dir / model_file(tp_rank)).string();
    dist_checkpointing::SafetensorsFile model(model_path);
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
        MG_CHECK(g == mine, "checkpoint '" << dir.string() << "': parameter '" << p.name
                                           << "' has global shape " << shape_str(g)
                                           << ", the model has " << shape_str(mine));
      }

    for (auto& p : params) p.param.copy_(model.tensor(p.name));

    if (options.load_optimizer && meta.contains("optimizer")) {
      optimizer::StateDict sd = scalars_to_state_dict(meta["optimizer"], where + " optimizer");
      const int rank = ranks.group ? ranks.group->rank() : 0;
      const int size = ranks.group ? ranks.group->size() : 1;
      const int shards = meta.value("optimizer_shards", 0);
      std::string opt_path = (dir / kOptimizerFile).string();
      if (shards > 0) {
        MG_CHECK(
            ranks.optimizer_sharded && shards == size,
            "checkpoint '" << dir.string() << "' holds distributed-optimizer state of " << shards
                           << " data-parallel ranks (layout " << layout_str(saved_tp, shards, true)
                           << "); this run has " << size
                           << (ranks.optimizer_sharded ? ""
                                                       : " without --use-distributed-optimizer")
                           << " (layout " << layout_str(tp_size, size, ranks.optimizer_sharded)
                           << "; load it with the same layout, or pass --no-load-optim)");
        opt_path = (dir / optimizer_shard_file(rank, tp_rank)).string();
      } else {
        opt_path = (dir / optimizer_file(tp_rank)).string();
      }
      dist_checkpointing::SafetensorsFile opt(opt_path);
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

}  // namespace mg::training
