// Saving the sharded format (sharded_format.h): every rank describes its pieces (parameters and
// optimizer state in the full tensors' coordinates), the descriptions are exchanged, the lowest
// world rank holding a region is its only writer, each rank writes its rank file into the staged
// directory, and world rank 0 writes metadata.json and commits (async_save.h: finalize_save), now
// or, with an AsyncCheckpointSaver, after a background write.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/dist_checkpointing/sharded_format.h"

namespace mg::dist_checkpointing {
namespace {

using nlohmann::json;
using namespace detail;
using Clock = std::chrono::steady_clock;

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

std::string piece_name(const std::string& key, std::size_t j) {
  return key + "#" + std::to_string(j);
}

}  // namespace

CheckpointIOStats save_sharded(const SaveTarget& target,
                               const std::vector<transformer::Parameter>& params,
                               const CheckpointState& state, const CheckpointRanks& ranks,
                               AsyncCheckpointSaver* async) {
  const auto t0 = Clock::now();
  const comm::ProcessGroupPtr world = world_of(ranks);
  const int rank = world ? world->rank() : 0;
  const int world_size = world ? world->size() : 1;
  auto ps = std::make_unique<PendingSave>();
  ps->world = world;
  ps->rank0 = rank == 0;
  ps->target = target;

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

  // The staged directory (world rank 0's process tag names it), then every rank writes its file.
  ps->staged = staged_dir(target, world, ps->rank0);
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
  const std::string path = join_path(ps->staged, rank_file(rank));
  Storage& storage = *target.storage;
  const std::map<std::string, std::string> file_meta = {{"format", kShardedCheckpointFormat}};
  CheckpointIOStats stats;
  stats.bytes = bytes;
  stats.total_bytes = total_bytes;
  stats.async = async != nullptr;
  if (async) {
    PendingSave* raw = ps.get();
    raw->writer = std::thread(
        [raw, &storage, path, tensors = std::move(tensors), file_meta, sums = target.checksums] {
          try {
            if (!tensors.empty()) save_safetensors(storage, path, tensors, file_meta, sums);
          } catch (...) {
            raw->error = std::current_exception();
          }
        });
    async->start(std::move(ps));
  } else {
    try {
      if (!tensors.empty()) save_safetensors(storage, path, tensors, file_meta, target.checksums);
    } catch (...) {
      ps->error = std::current_exception();
    }
    maybe_inject_fault(rank, state.iteration);
    finalize_save(*ps);
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

}  // namespace mg::dist_checkpointing
