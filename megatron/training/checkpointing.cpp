// Checkpoint save/load: the sharded (resharding) format and the legacy same-layout one, both atomic
// by temp directory and rename (checkpointing.h).
#include "megatron/training/checkpointing.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/dist_checkpointing/sharded_tensor.h"

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

// The run state every checkpoint format records in its metadata (Megatron's names).
json run_state_json(const char* format, int format_version, const CheckpointState& state) {
  return {{"format", format},
          {"format_version", format_version},
          {"checkpoint_version", 3.0},
          {"iteration", state.iteration},
          {"consumed_train_samples", state.consumed_train_samples},
          {"consumed_valid_samples", state.consumed_valid_samples},
          {"num_floating_point_operations_so_far", state.floating_point_operations_so_far},
          {"args", state.args},
          {"extra", state.extra}};
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

namespace {

// The previous same-layout format (--ckpt-format legacy).
void save_legacy(const std::string& root, const std::vector<transformer::Parameter>& params,
                 const CheckpointState& state, const CheckpointRanks& ranks) {
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

}  // namespace

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

namespace {

CheckpointState load_legacy(const fs::path& dir, const fs::path& meta_path, const json& meta,
                            std::vector<transformer::Parameter>& params, const LoadOptions& options,
                            const CheckpointRanks& ranks) {
  const std::string where = meta_path.string();
  MG_CHECK(meta.is_object() && meta.value("format", "") == kCheckpointFormat,
           "'" << where << "' is not a " << kCheckpointFormat << " checkpoint");
  MG_CHECK(meta.value("format_version", 0) == kCheckpointFormatVersion,
           "'" << where << "' has format_version " << meta.value("format_version", 0)
               << ", this build reads " << kCheckpointFormatVersion);
  try {
    CheckpointState st;
    st.format = "legacy";
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// The sharded format.
namespace {

using dist_checkpointing::Box;
using dist_checkpointing::ShardedTensor;
using Clock = std::chrono::steady_clock;

constexpr const char* kStatePrefix = "optimizer.state.";
constexpr const char* kShardPrefix = "optimizer.shard.";

std::string rank_file(int rank) {
  char name[48];
  std::snprintf(name, sizeof(name), "rank_%05d.safetensors", rank);
  return name;
}

Shape global_of(const transformer::Parameter& p) {
  return p.global_shape.empty() ? p.param.shape() : p.global_shape;
}

// The TP boxes of parameter p on this rank (its local shard's regions of the full tensor).
std::vector<Box> boxes_of(const transformer::Parameter& p, const CheckpointRanks& r) {
  const int tp = tp_size_of(r);
  const tensor_parallel::Partition part{p.tensor_parallel_dim, p.partition_stride,
                                        tp > 1 ? r.tp_group->rank() : 0, tp};
  const Shape g = global_of(p);
  const Shape expect = tensor_parallel::local_shape(g, part);
  MG_CHECK(expect == p.param.shape(), "checkpoint: parameter '"
                                          << p.name << "' has shape " << shape_str(p.param.shape())
                                          << " but its global shape " << shape_str(g) << " over TP "
                                          << tp << " gives " << shape_str(expect)
                                          << " (CheckpointRanks::tp_group missing?)");
  return dist_checkpointing::partition_boxes(g, part);
}

// Pieces of the local-shard elements [lo, hi) (`data` holds exactly them) under `key`.
void add_pieces(std::vector<ShardedTensor>& out, const std::string& key, const Shape& global,
                const std::vector<Box>& boxes, const Tensor& data, int64_t lo, int64_t hi) {
  for (const Box& b : boxes) {
    const int64_t bn = shape_numel(b.shape);
    const int64_t x = std::max(lo, b.local_start), y = std::min(hi, b.local_start + bn);
    if (x >= y) continue;
    ShardedTensor t;
    t.key = key;
    t.dtype = data.dtype();
    t.global_shape = global;
    t.global_offset = b.offset;
    t.local_shape = b.shape;
    t.flat_begin = x - b.local_start;
    t.flat_end = y - b.local_start;
    t.data = data.slice(x - lo, y - x);
    if (t.whole_box()) t.data = t.data.view(b.shape);
    out.push_back(std::move(t));
  }
}

std::vector<std::pair<int64_t, int64_t>> parse_ranges(const std::string& s) {
  std::vector<std::pair<int64_t, int64_t>> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto c = item.find(':');
    MG_CHECK(c != std::string::npos, "optimizer shard.ranges '" << s << "' is malformed");
    out.emplace_back(std::stoll(item.substr(0, c)), std::stoll(item.substr(c + 1)));
  }
  return out;
}

// The distributed optimizer's flat shard layout: for each owned range in order, the parameters
// (by buffer offset) it intersects: (param index, [lo, hi) in the flat buffer, shard position).
struct ShardSlot {
  std::size_t param;
  int64_t lo, hi, pos;
};
std::vector<ShardSlot> shard_slots(const std::vector<transformer::Parameter>& params,
                                   const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<std::size_t> order(params.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return params[x].buffer_offset < params[y].buffer_offset;
  });
  std::vector<ShardSlot> slots;
  int64_t pos = 0;
  for (const auto& [a, b] : ranges)
    for (std::size_t i : order) {
      const int64_t off = params[i].buffer_offset;
      const int64_t lo = std::max(a, off), hi = std::min(b, off + params[i].param.numel());
      if (lo >= hi) continue;
      slots.push_back({i, lo, hi, pos});
      pos += hi - lo;
    }
  return slots;
}

// "optimizer.state.<kind>.<name>" -> (kind, name); false for other keys.
bool split_state_key(const std::string& key, std::string& kind, std::string& name) {
  if (key.rfind(kStatePrefix, 0) != 0) return false;
  const std::string rest = key.substr(std::strlen(kStatePrefix));
  const auto dot = rest.find('.');
  if (dot == std::string::npos) return false;
  kind = rest.substr(0, dot);
  name = rest.substr(dot + 1);
  return true;
}

// Every piece this rank holds: the parameters and the optimizer state in parameter space.
std::vector<ShardedTensor> collect_pieces(const std::vector<transformer::Parameter>& params,
                                          const CheckpointState& state,
                                          const CheckpointRanks& ranks) {
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < params.size(); ++i) {
    MG_CHECK(by_name.emplace(params[i].name, i).second,
             "save_checkpoint: parameter '" << params[i].name << "' appears twice");
  }
  // A pipeline stage's replica of a parameter another stage owns (the tied word embedding on the
  // last stage, Parameter::shared) is not saved: its owner's pieces are the tensor (and its
  // distributed-optimizer ranges would differ from the owner's). Loads read it like any other.
  std::vector<ShardedTensor> out;
  for (const auto& p : params)
    if (!p.shared)
      add_pieces(out, p.name, global_of(p), boxes_of(p, ranks), p.param.view({p.param.numel()}), 0,
                 p.param.numel());
  if (!state.optimizer) return out;
  const auto& sd = *state.optimizer;
  for (const auto& [key, t] : sd.tensors) {
    std::string kind, name;
    if (split_state_key(key, kind, name) && by_name.count(name)) {
      const auto& p = params[by_name[name]];
      if (p.shared) continue;
      MG_CHECK(t.shape() == p.param.shape(), "save_checkpoint: optimizer state '"
                                                 << key << "' has shape " << shape_str(t.shape())
                                                 << ", its parameter "
                                                 << shape_str(p.param.shape()));
      add_pieces(out, key, global_of(p), boxes_of(p, ranks), t.view({t.numel()}), 0, t.numel());
    } else if (key.rfind(kShardPrefix, 0) == 0) {
      kind = key.substr(std::strlen(kShardPrefix));
      MG_CHECK(sd.has_string("shard.ranges"),
               "save_checkpoint: '" << key << "' without the optimizer's shard.ranges");
      const auto slots = shard_slots(params, parse_ranges(sd.string("shard.ranges")));
      int64_t total = 0;
      for (const auto& s : slots) {
        const auto& p = params[s.param];
        total = s.pos + (s.hi - s.lo);
        if (p.shared) continue;
        add_pieces(out, kStatePrefix + kind + "." + p.name, global_of(p), boxes_of(p, ranks),
                   t.slice(s.pos, s.hi - s.lo), s.lo - p.buffer_offset, s.hi - p.buffer_offset);
      }
      MG_CHECK(total == t.numel(), "save_checkpoint: optimizer shard '"
                                       << key << "' has " << t.numel()
                                       << " elements, its ranges cover " << total);
    } else {  // anything else: one replicated tensor
      add_pieces(out, key, t.shape(), {Box{Shape(t.shape().size(), 0), t.shape(), 0}},
                 t.view({t.numel()}), 0, t.numel());
    }
  }
  return out;
}

// Every rank's string, in rank order (collective over g).
std::vector<std::string> all_gather_strings(const comm::ProcessGroupPtr& g, const std::string& s) {
  if (!g || g->size() == 1) return {s};
  const int n = g->size();
  Tensor len =
      Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(s.size())}, {1}, DType::i64);
  Tensor lens = Tensor::empty({n}, DType::i64);
  g->all_gather(lens, len)->wait();
  const auto l = lens.to_vector<int64_t>();
  const int64_t m = std::max<int64_t>(1, *std::max_element(l.begin(), l.end()));
  Tensor mine = Tensor::zeros({m}, DType::u8);
  std::memcpy(mine.raw_data(), s.data(), s.size());
  Tensor all = Tensor::empty({m * n}, DType::u8);
  g->all_gather(all, mine)->wait();
  std::vector<std::string> out;
  const char* base = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) out.emplace_back(base + r * m, static_cast<std::size_t>(l[r]));
  return out;
}

// True on every rank when `failed` on any (collective over g).
bool any_rank(const comm::ProcessGroupPtr& g, bool failed) {
  if (!g || g->size() == 1) return failed;
  Tensor f = Tensor::from_vector(std::vector<int32_t>{failed ? 1 : 0}, {1}, DType::i32);
  g->all_reduce(f, comm::ReduceOp::max)->wait();
  return f.to_vector<int32_t>()[0] != 0;
}

std::string piece_name(const std::string& key, std::size_t j) {
  return key + "#" + std::to_string(j);
}

// A save in flight: the file being written by a background thread, and what finalising needs.
struct PendingSave {
  std::thread writer;
  std::exception_ptr error;
  comm::ProcessGroupPtr world;
  bool rank0 = true;
  fs::path root, tmp_dir, final_dir;
  int64_t iteration = 0;
  std::string meta_text;
  // Never finalised (the process is exiting without finalize_async_save): the file is completed,
  // the checkpoint is not made current (its temporary directory stays, never loaded).
  ~PendingSave() {
    if (writer.joinable()) writer.join();
  }
};
std::unique_ptr<PendingSave>& pending_save() {
  static std::unique_ptr<PendingSave> p;
  return p;
}

// Every rank: barrier on success; rank 0: metadata.json, renames, tracker. Throws on every rank
// when any rank failed to write its file.
void finalize_save(PendingSave& ps) {
  std::string err;
  if (ps.error) try {
      std::rethrow_exception(ps.error);
    } catch (const std::exception& e) {
      err = e.what();
    }
  const bool failed = any_rank(ps.world, !err.empty());
  if (failed) {
    std::error_code ec;
    if (ps.rank0) fs::remove_all(ps.tmp_dir, ec);
    MG_THROW("save_checkpoint: iteration "
             << ps.iteration << " was not saved (the previous "
             << "checkpoint stays the latest): " << (err.empty() ? "another rank failed" : err));
  }
  if (ps.rank0) {
    std::error_code ec;
    write_file_atomic(ps.tmp_dir / kMetadataFile, ps.meta_text);
    fsync_path(ps.tmp_dir);
    const fs::path old_dir = ps.final_dir.string() + ".old." + std::to_string(::getpid());
    const bool had_old = fs::exists(ps.final_dir);
    if (had_old) {
      fs::rename(ps.final_dir, old_dir, ec);
      MG_CHECK(!ec, "cannot move aside '" << ps.final_dir.string() << "': " << ec.message());
    }
    fs::rename(ps.tmp_dir, ps.final_dir, ec);
    MG_CHECK(!ec, "cannot rename '" << ps.tmp_dir.string() << "' to '" << ps.final_dir.string()
                                    << "': " << ec.message());
    fsync_path(ps.root);
    write_file_atomic(ps.root / kTrackerFile, std::to_string(ps.iteration));
    fsync_path(ps.root);
    if (had_old) fs::remove_all(old_dir, ec);
  }
  if (ps.world) ps.world->barrier();
}

// Test hook: MG_CHECKPOINT_FAULT_INJECT=<rank>:<iteration> kills that world rank (SIGKILL)
// after it wrote its file of that iteration and before metadata.json and the renames: a rank
// dying in the middle of a save (tests/unit/training/checkpoint_reshard.sh crash).
void maybe_inject_fault(int rank, int64_t iteration) {
  const char* env = std::getenv("MG_CHECKPOINT_FAULT_INJECT");
  if (!env) return;
  const std::string want = std::to_string(rank) + ":" + std::to_string(iteration);
  if (want != env) return;
  std::fprintf(stderr, "checkpoint fault injection: rank %d killed while saving iteration %lld\n",
               rank, static_cast<long long>(iteration));
  std::fflush(stderr);
  ::raise(SIGKILL);
}

CheckpointIOStats save_sharded(const std::string& root,
                               const std::vector<transformer::Parameter>& params,
                               const CheckpointState& state, const CheckpointRanks& ranks,
                               bool async) {
  const auto t0 = Clock::now();
  const comm::ProcessGroupPtr world = world_of(ranks);
  const int rank = world ? world->rank() : 0;
  const int world_size = world ? world->size() : 1;
  auto ps = std::make_unique<PendingSave>();
  ps->world = world;
  ps->rank0 = rank == 0;
  ps->root = root;
  ps->iteration = state.iteration;
  ps->final_dir = checkpoint_dir(root, state.iteration);

  // Every rank's pieces (and RNG), exchanged; the lowest rank holding a region writes it.
  std::vector<ShardedTensor> mine = collect_pieces(params, state, ranks);
  json desc = json::array();
  for (const auto& t : mine) desc.push_back(t.to_json());
  const json my_info = {{"pieces", desc}, {"rng", state.rng ? *state.rng : json()}};
  const auto infos = all_gather_strings(world, my_info.dump());
  json index = json::object();
  std::map<std::string, int> first;  // region -> main rank
  json rng_per_rank = json::array();
  std::vector<std::size_t> my_main;  // indices into `mine`
  double total_bytes = 0;
  for (int r = 0; r < world_size; ++r) {
    const json info = json::parse(infos[static_cast<std::size_t>(r)]);
    rng_per_rank.push_back(info["rng"]);
    const json& pieces = info["pieces"];
    for (std::size_t j = 0; j < pieces.size(); ++j) {
      const ShardedTensor t = ShardedTensor::from_json(pieces[j]);
      const std::string region = t.key + "|" + shape_str(t.global_offset) + "|" +
                                 shape_str(t.local_shape) + "|" + std::to_string(t.flat_begin) +
                                 ":" + std::to_string(t.flat_end);
      if (!first.emplace(region, r).second) continue;  // a replica
      if (r == rank) my_main.push_back(j);
      json& e = index[t.key];
      if (e.is_null()) {
        e = {{"dtype", pieces[j]["dtype"]},
             {"global_shape", t.global_shape},
             {"pieces", json::array()}};
      }
      MG_CHECK(e["dtype"] == pieces[j]["dtype"] && e["global_shape"] == json(t.global_shape),
               "save_checkpoint: ranks disagree on tensor '"
                   << t.key << "': " << e["dtype"].get<std::string>() << " "
                   << e["global_shape"].dump() << " vs rank " << r << "'s "
                   << pieces[j]["dtype"].get<std::string>() << " " << shape_str(t.global_shape));
      e["pieces"].push_back({{"file", rank_file(r)},
                             {"tensor", piece_name(t.key, j)},
                             {"offset", t.global_offset},
                             {"shape", t.local_shape},
                             {"flat", {t.flat_begin, t.flat_end}}});
      total_bytes += static_cast<double>(t.numel()) * static_cast<double>(dtype_size(t.dtype));
    }
  }
  // The main pieces of every key partition its global tensor.
  for (auto it = index.begin(); it != index.end(); ++it) {
    int64_t covered = 0;
    for (const auto& pc : it.value()["pieces"])
      covered += pc["flat"][1].get<int64_t>() - pc["flat"][0].get<int64_t>();
    const Shape g = it.value()["global_shape"].get<Shape>();
    MG_CHECK(covered == shape_numel(g),
             "save_checkpoint: the ranks' pieces of '"
                 << it.key() << "' cover " << covered << " of its " << shape_numel(g)
                 << " elements " << shape_str(g)
                 << " (overlapping or missing shards: inconsistent CheckpointRanks?)");
  }

  // Temporary directory (rank 0's pid names it), then every rank writes its file.
  std::string tmp_tag = std::to_string(::getpid());
  if (world && world_size > 1) {
    Tensor pid = Tensor::from_vector(std::vector<int64_t>{::getpid()}, {1}, DType::i64);
    world->broadcast(pid, 0)->wait();
    tmp_tag = std::to_string(pid.to_vector<int64_t>()[0]);
  }
  ps->tmp_dir = ps->final_dir.string() + ".tmp." + tmp_tag;
  if (ps->rank0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    MG_CHECK(!ec, "cannot create checkpoint directory '" << root << "': " << ec.message());
    fs::remove_all(ps->tmp_dir, ec);
    fs::create_directories(ps->tmp_dir, ec);
    MG_CHECK(!ec, "cannot create '" << ps->tmp_dir.string() << "': " << ec.message());
  }
  if (world) world->barrier();

  std::map<std::string, std::string> scal_strings;
  json meta = run_state_json(kShardedCheckpointFormat, kShardedCheckpointFormatVersion, state);
  meta["layout"] = {{"world_size", world_size},
                    {"tensor_model_parallel_size", tp_size_of(ranks)},
                    {"pipeline_model_parallel_size", ranks.pp_group ? ranks.pp_group->size() : 1},
                    {"data_parallel_size", dp_size_of(ranks)},
                    {"use_distributed_optimizer", ranks.optimizer_sharded}};
  meta["vocab_size"] = state.vocab_size;
  meta["index"] = index;
  if (state.optimizer) {
    optimizer::StateDict scal = *state.optimizer;
    scal.tensors.clear();
    scal.strings.erase("shard.ranges");  // layout-specific: the loader uses its own
    for (const char* k : {"shard.rank", "shard.size"}) scal.numbers.erase(k);
    meta["optimizer"] = state_dict_scalars(scal);
  }
  if (state.scheduler) meta["opt_param_scheduler"] = state_dict_scalars(*state.scheduler);
  if (state.rng) {
    meta["rng_state"] = *state.rng;
    meta["rng_state_per_rank"] = rng_per_rank;
  }
  if (ps->rank0) ps->meta_text = meta.dump(1);

  std::vector<std::pair<std::string, Tensor>> tensors;
  double bytes = 0;
  for (std::size_t j : my_main) {
    Tensor d = mine[j].data;
    // The device-to-host copy, into pinned staging memory of the device's platform.
    if (async) d = d.is_host() ? d.clone() : d.to_pinned_host();
    bytes += static_cast<double>(d.nbytes());
    tensors.emplace_back(piece_name(mine[j].key, j), std::move(d));
  }
  const std::string path = (ps->tmp_dir / rank_file(rank)).string();
  const std::map<std::string, std::string> file_meta = {{"format", kShardedCheckpointFormat}};
  CheckpointIOStats stats;
  stats.bytes = bytes;
  stats.total_bytes = total_bytes;
  stats.async = async;
  if (async) {
    PendingSave* raw = ps.get();
    raw->writer = std::thread([raw, path, tensors = std::move(tensors), file_meta] {
      try {
        if (!tensors.empty()) dist_checkpointing::save_safetensors(path, tensors, file_meta);
      } catch (...) {
        raw->error = std::current_exception();
      }
    });
    pending_save() = std::move(ps);
  } else {
    try {
      if (!tensors.empty()) dist_checkpointing::save_safetensors(path, tensors, file_meta);
    } catch (...) {
      ps->error = std::current_exception();
    }
    maybe_inject_fault(rank, state.iteration);
    finalize_save(*ps);
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

// ---- load

struct StoredPiece {
  ShardedTensor t;
  std::string file, tensor;
};
struct IndexEntry {
  DType dtype = DType::f32;
  Shape global_shape;
  std::vector<StoredPiece> pieces;
};

class ShardedReader {
 public:
  ShardedReader(fs::path dir, const json& index) : dir_(std::move(dir)) {
    for (auto it = index.begin(); it != index.end(); ++it) {
      IndexEntry e;
      e.dtype =
          dist_checkpointing::dtype_from_safetensors(it.value().at("dtype").get<std::string>());
      e.global_shape = it.value().at("global_shape").get<Shape>();
      for (const auto& pc : it.value().at("pieces")) {
        StoredPiece sp;
        sp.t.key = it.key();
        sp.t.dtype = e.dtype;
        sp.t.global_shape = e.global_shape;
        sp.t.global_offset = pc.at("offset").get<Shape>();
        sp.t.local_shape = pc.at("shape").get<Shape>();
        sp.t.flat_begin = pc.at("flat").at(0).get<int64_t>();
        sp.t.flat_end = pc.at("flat").at(1).get<int64_t>();
        sp.file = pc.at("file").get<std::string>();
        sp.tensor = pc.at("tensor").get<std::string>();
        e.pieces.push_back(std::move(sp));
      }
      entries_.emplace(it.key(), std::move(e));
    }
  }
  const std::map<std::string, IndexEntry>& entries() const { return entries_; }
  const IndexEntry* find(const std::string& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }
  double bytes_read() const { return bytes_; }

  // Copies the stored parts of `key` inside the box (offset, shape) into `dst` (row-major box,
  // host); returns the elements copied.
  int64_t read(const std::string& key, const Shape& offset, const Shape& shape, Tensor dst) {
    const IndexEntry& e = entries_.at(key);
    MG_CHECK(dst.is_host() && dst.numel() == shape_numel(shape), "ShardedReader: bad destination");
    MG_CHECK(dst.dtype() == e.dtype,
             "checkpoint '" << dir_.string() << "': tensor '" << key << "' is stored as "
                            << dist_checkpointing::safetensors_dtype(e.dtype) << ", the run has "
                            << dist_checkpointing::safetensors_dtype(dst.dtype())
                            << " (a dtype mismatch: load it with the same --bf16/--fp16 setting)");
    const std::size_t es = dtype_size(e.dtype);
    int64_t copied = 0;
    for (const auto& sp : e.pieces) {
      if (dist_checkpointing::box_overlap(sp.t.global_offset, sp.t.local_shape, offset, shape) == 0)
        continue;
      const auto& f = file(sp.file, key);
      MG_CHECK(f.contains(sp.tensor), "checkpoint file '" << f.path() << "' lacks '" << sp.tensor
                                                          << "' that metadata.json lists for '"
                                                          << key << "' (corrupt checkpoint)");
      const auto& en = f.entry(sp.tensor);
      MG_CHECK(en.dtype == dist_checkpointing::safetensors_dtype(e.dtype) &&
                   shape_numel(en.shape) == sp.t.numel(),
               "checkpoint file '" << f.path() << "': '" << sp.tensor << "' is " << en.dtype << " "
                                   << shape_str(en.shape) << ", metadata.json says "
                                   << dist_checkpointing::safetensors_dtype(e.dtype) << " with "
                                   << sp.t.numel() << " elements (corrupt checkpoint)");
      // A piece needed whole is read ahead in one go rather than page by page.
      if (sp.t.whole_box() &&
          dist_checkpointing::box_overlap(sp.t.global_offset, sp.t.local_shape, offset, shape) ==
              shape_numel(sp.t.local_shape))
        f.prefetch(sp.tensor);
      const int64_t n =
          dist_checkpointing::copy_overlap(sp.t, f.bytes(sp.tensor).data(), offset, shape,
                                           static_cast<std::byte*>(dst.raw_data()), es);
      copied += n;
      bytes_ += static_cast<double>(n) * static_cast<double>(es);
    }
    return copied;
  }

 private:
  const dist_checkpointing::SafetensorsFile& file(const std::string& name, const std::string& key) {
    auto it = files_.find(name);
    if (it != files_.end()) return *it->second;
    const fs::path p = dir_ / name;
    MG_CHECK(fs::exists(p), "checkpoint '" << dir_.string() << "' is missing shard file '" << name
                                           << "' (it holds pieces of '" << key << "')");
    auto f = std::make_unique<dist_checkpointing::SafetensorsFile>(p.string());
    return *files_.emplace(name, std::move(f)).first->second;
  }
  fs::path dir_;
  std::map<std::string, IndexEntry> entries_;
  std::map<std::string, std::unique_ptr<dist_checkpointing::SafetensorsFile>> files_;
  double bytes_ = 0;
};

// Keys whose dim 0 is the padded vocabulary (it grows with TP).
bool is_vocab_key(const std::string& key) {
  auto ends = [&](const std::string& s) {
    return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
  };
  return ends("word_embeddings.weight") || ends("output_layer.weight");
}

// Reads `key` into `local` (the rank's local shard, host, its boxes). Global shapes must match,
// except dim 0 of a vocabulary key when `vocab` (the real vocabulary, the same in the checkpoint
// and the model) > 0: then only rows [0, vocab) are read.
void read_local(ShardedReader& reader, const fs::path& dir, const std::string& key,
                const Shape& global, const std::vector<Box>& boxes, Tensor& local,
                int64_t vocab = 0) {
  const IndexEntry* e = reader.find(key);
  MG_CHECK(e, "checkpoint '" << dir.string() << "' has no tensor '" << key
                             << "' that the model needs (a checkpoint of another model?)");
  bool padded = false;
  if (e->global_shape != global) {
    padded = vocab > 0 && is_vocab_key(key) && e->global_shape.size() == global.size() &&
             !global.empty() && e->global_shape[0] >= vocab && global[0] >= vocab;
    for (std::size_t i = 1; padded && i < global.size(); ++i)
      padded = e->global_shape[i] == global[i];
    MG_CHECK(padded, "checkpoint '"
                         << dir.string() << "': tensor '" << key << "' has shape "
                         << shape_str(e->global_shape) << ", the model has " << shape_str(global)
                         << (is_vocab_key(key) ? " (the vocabulary padding may change only when "
                                                 "both record the same real vocabulary size)"
                                               : " (a checkpoint of another model?)"));
  }
  Tensor flat = local.view({local.numel()});
  for (const Box& b : boxes) {
    Shape shape = b.shape;
    if (padded) shape[0] = std::clamp<int64_t>(vocab - b.offset[0], 0, b.shape[0]);
    const int64_t bn = shape_numel(shape);
    if (bn == 0) continue;
    const int64_t got = reader.read(key, b.offset, shape, flat.slice(b.local_start, bn));
    MG_CHECK(got == bn, "checkpoint '" << dir.string() << "': tensor '" << key << "' is stored "
                                       << "only in part (" << got << " of the " << bn
                                       << " elements at offset " << shape_str(b.offset) << " shape "
                                       << shape_str(shape) << ")");
  }
}

// A host copy staged in pinned memory of the tensor's platform (a plain clone for host tensors).
Tensor host_copy(const Tensor& t) {
  return t.is_host() ? t.clone() : t.to_pinned_host();
}

CheckpointState load_sharded(const fs::path& dir, const fs::path& meta_path, const json& meta,
                             std::vector<transformer::Parameter>& params,
                             const LoadOptions& options, const CheckpointRanks& ranks) {
  const auto t0 = Clock::now();
  const std::string where = meta_path.string();
  MG_CHECK(meta.value("format_version", 0) == kShardedCheckpointFormatVersion,
           "'" << where << "' has format_version " << meta.value("format_version", 0)
               << ", this build reads " << kShardedCheckpointFormatVersion);
  const comm::ProcessGroupPtr world = world_of(ranks);
  CheckpointState st;
  st.format = "sharded";
  try {
    st.iteration = meta.at("iteration").get<int64_t>();
    st.consumed_train_samples = meta.at("consumed_train_samples").get<int64_t>();
    st.consumed_valid_samples = meta.at("consumed_valid_samples").get<int64_t>();
    st.floating_point_operations_so_far =
        meta.at("num_floating_point_operations_so_far").get<double>();
    st.args = meta.value("args", json::object());
    st.extra = meta.value("extra", json::object());
  } catch (const json::exception& e) {
    MG_THROW("checkpoint metadata '" << where << "' is malformed: " << e.what());
  }
  std::unique_ptr<ShardedReader> reader_ptr;
  try {
    reader_ptr = std::make_unique<ShardedReader>(dir, meta.at("index"));
  } catch (const json::exception& e) {
    MG_THROW("checkpoint metadata '" << where << "' has a malformed index: " << e.what());
  }
  ShardedReader& reader = *reader_ptr;
  st.vocab_size = meta.value("vocab_size", int64_t{0});
  const int64_t vocab =
      options.vocab_size > 0 && options.vocab_size == st.vocab_size ? st.vocab_size : 0;
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < params.size(); ++i) by_name[params[i].name] = i;

  // Model: every parameter, read into a host staging copy of its current values (padding rows
  // the checkpoint lacks keep them). Errors here are local; the key-use exchange below is
  // collective, so a rank that failed reports it there first.
  std::string err;
  std::vector<std::pair<std::size_t, Tensor>> staged;
  try {
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i];
      Tensor h = host_copy(p.param);
      read_local(reader, dir, p.name, global_of(p), boxes_of(p, ranks), h, vocab);
      staged.emplace_back(i, std::move(h));
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  // Checkpoint model keys that no rank uses: another model.
  std::vector<std::string> model_keys;
  for (const auto& [k, e] : reader.entries())
    if (k.rfind("optimizer.", 0) != 0) model_keys.push_back(k);
  Tensor used = Tensor::zeros({static_cast<int64_t>(model_keys.size()) + 1}, DType::i32);
  auto* u = static_cast<int32_t*>(used.raw_data());
  for (std::size_t k = 0; k < model_keys.size(); ++k) u[k] = by_name.count(model_keys[k]) ? 1 : 0;
  u[model_keys.size()] = err.empty() ? 0 : 1;
  if (world && world->size() > 1) world->all_reduce(used, comm::ReduceOp::max)->wait();
  u = static_cast<int32_t*>(used.raw_data());
  if (!err.empty()) MG_THROW(err);
  MG_CHECK(u[model_keys.size()] == 0,
           "load_checkpoint: another rank failed to load '" << dir.string() << "' (see its error)");
  for (std::size_t k = 0; k < model_keys.size(); ++k)
    MG_CHECK(u[k] != 0, "checkpoint '" << dir.string() << "' has tensor '" << model_keys[k]
                                       << "' that the model does not (a different architecture?)");
  for (auto& [i, h] : staged) params[i].param.copy_(h);

  if (options.load_optimizer && meta.contains("optimizer")) {
    optimizer::StateDict sd = scalars_to_state_dict(meta["optimizer"], where + " optimizer");
    // Reads the parameter-space state `key` of parameter i into a tensor of its local shape;
    // false when the checkpoint lacks it (fp32_param then comes from the loaded model).
    auto read_state = [&](const std::string& kind, std::size_t i, DType dtype, Tensor& out) {
      const auto& p = params[i];
      const std::string key = kStatePrefix + kind + "." + p.name;
      if (kind == "fp32_param")
        out = host_copy(p.param).to(dtype);
      else
        out = Tensor::zeros(p.param.shape(), dtype);
      if (!reader.find(key)) return kind == "fp32_param";
      read_local(reader, dir, key, global_of(p), boxes_of(p, ranks), out, vocab);
      return true;
    };
    if (options.optimizer_template) {
      const auto& tmpl = *options.optimizer_template;
      for (const auto& [key, t] : tmpl.tensors) {
        std::string kind, name;
        if (split_state_key(key, kind, name) && by_name.count(name)) {
          Tensor out;
          if (read_state(kind, by_name[name], t.dtype(), out)) sd.tensors[key] = out;
        } else if (key.rfind(kShardPrefix, 0) == 0) {
          kind = key.substr(std::strlen(kShardPrefix));
          Tensor out = Tensor::zeros(t.shape(), t.dtype());
          bool ok = true;
          std::map<std::size_t, Tensor> cache;
          for (const auto& s : shard_slots(params, parse_ranges(tmpl.string("shard.ranges")))) {
            auto it = cache.find(s.param);
            if (it == cache.end()) {
              Tensor full;
              ok = ok && read_state(kind, s.param, t.dtype(), full);
              if (!ok) break;
              it = cache.emplace(s.param, full).first;
            }
            const int64_t off = params[s.param].buffer_offset;
            out.slice(s.pos, s.hi - s.lo)
                .copy_(it->second.view({it->second.numel()}).slice(s.lo - off, s.hi - s.lo));
          }
          if (ok) sd.tensors[key] = out;
        } else if (reader.find(key)) {
          Tensor out = Tensor::zeros(t.shape(), t.dtype());
          read_local(reader, dir, key, t.shape(), {Box{Shape(t.dim(), 0), t.shape(), 0}}, out);
          sd.tensors[key] = out;
        }
      }
      for (const char* k : {"shard.ranges"})
        if (tmpl.has_string(k)) sd.strings[k] = tmpl.string(k);
      for (const char* k : {"shard.rank", "shard.size"})
        if (tmpl.has_number(k)) sd.numbers[k] = tmpl.number(k);
    } else {
      MG_CHECK(!ranks.optimizer_sharded,
               "load_checkpoint: the distributed optimizer needs LoadOptions::optimizer_template "
               "(the optimizer's state_dict())");
      for (const auto& [key, e] : reader.entries()) {
        std::string kind, name;
        if (split_state_key(key, kind, name) && by_name.count(name)) {
          Tensor out;
          if (read_state(kind, by_name[name], e.dtype, out)) sd.tensors[key] = out;
        } else if (key.rfind("optimizer.", 0) == 0 && !split_state_key(key, kind, name)) {
          Tensor out = Tensor::zeros(e.global_shape, e.dtype);
          read_local(reader, dir, key, e.global_shape,
                     {Box{Shape(e.global_shape.size(), 0), e.global_shape, 0}}, out);
          sd.tensors[key] = out;
        }
      }
    }
    st.optimizer = std::move(sd);
  }
  if (options.load_optimizer && meta.contains("opt_param_scheduler"))
    st.scheduler = scalars_to_state_dict(meta["opt_param_scheduler"], where + " scheduler");
  if (options.load_rng && meta.contains("rng_state")) {
    st.rng = meta["rng_state"];
    const int rank = world ? world->rank() : 0;
    const int size = world ? world->size() : 1;
    const json& per = meta.value("rng_state_per_rank", json::array());
    if (per.is_array() && static_cast<int>(per.size()) == size && !per[rank].is_null())
      st.rng = per[rank];
  }
  st.io_bytes = reader.bytes_read();
  st.io_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return st;
}

}  // namespace

bool finalize_async_save() {
  auto& p = pending_save();
  if (!p) return false;
  std::unique_ptr<PendingSave> ps = std::move(p);
  if (ps->writer.joinable()) ps->writer.join();
  finalize_save(*ps);
  return true;
}

CheckpointIOStats save_checkpoint(const std::string& root,
                                  const std::vector<transformer::Parameter>& params,
                                  const CheckpointState& state, const CheckpointRanks& ranks,
                                  const SaveOptions& options) {
  MG_CHECK(state.iteration >= 0, "save_checkpoint: iteration " << state.iteration << " < 0");
  MG_CHECK(options.format == "sharded" || options.format == "legacy",
           "--ckpt-format " << options.format << " is not supported (valid: sharded, legacy)");
  finalize_async_save();
  if (options.format == "legacy") {
    MG_CHECK(!options.async, "--async-save needs --ckpt-format sharded");
    MG_CHECK(!ranks.pp_group || ranks.pp_group->size() == 1,
             "--ckpt-format legacy does not support pipeline parallelism (use sharded)");
    const auto t0 = Clock::now();
    save_legacy(root, params, state, ranks);
    CheckpointIOStats s;
    for (const auto& p : params) s.bytes += static_cast<double>(p.param.nbytes());
    s.total_bytes = s.bytes;
    s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return s;
  }
  return save_sharded(root, params, state, ranks, options.async);
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
  const std::string format = meta.is_object() ? meta.value("format", "") : "";
  const std::string kind = format == kShardedCheckpointFormat ? "sharded"
                           : format == kCheckpointFormat      ? "legacy"
                                                              : "";
  MG_CHECK(!kind.empty(),
           "'" << meta_path.string() << "' is not a Megatron-CPP checkpoint (format '" << format
               << "'; expected " << kShardedCheckpointFormat << " or " << kCheckpointFormat << ")");
  MG_CHECK(options.auto_detect_format || kind == options.format,
           "checkpoint '" << dir.string() << "' is in the " << kind
                          << " format but this run has --ckpt-format " << options.format
                          << " (pass --ckpt-format " << kind << " or --auto-detect-ckpt-format)");
  if (kind == "legacy") return load_legacy(dir, meta_path, meta, params, options, ranks);
  return load_sharded(dir, meta_path, meta, params, options, ranks);
}

}  // namespace mg::training
