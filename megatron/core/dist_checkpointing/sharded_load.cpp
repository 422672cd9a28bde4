// Loading the sharded format (sharded_format.h): a reader over metadata.json's index maps the
// rank files it needs (through the Storage) and copies only the intersections of the stored
// pieces with the boxes this rank needs, so any layout loads any other; vocabulary padding may
// differ when both record the same real vocabulary; keys the checkpoint has that no rank uses are
// an error (collective check).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include "megatron/core/common/error.h"
#include "megatron/core/common/progress.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/dist_checkpointing/sharded_format.h"

namespace mg::dist_checkpointing {
namespace {

using nlohmann::json;
using namespace detail;
using Clock = std::chrono::steady_clock;

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
  ShardedReader(const Storage& storage, std::string dir, const json& index, bool verify)
      : storage_(storage), dir_(std::move(dir)), verify_(verify) {
    for (auto it = index.begin(); it != index.end(); ++it) {
      IndexEntry e;
      e.dtype = dtype_from_safetensors(it.value().at("dtype").get<std::string>());
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
             "checkpoint '" << dir_ << "': tensor '" << key << "' is stored as "
                            << safetensors_dtype(e.dtype) << ", the run has "
                            << safetensors_dtype(dst.dtype())
                            << " (a dtype mismatch: load it with the same --bf16/--fp16 setting)");
    const std::size_t es = dtype_size(e.dtype);
    int64_t copied = 0;
    for (const auto& sp : e.pieces) {
      if (box_overlap(sp.t.global_offset, sp.t.local_shape, offset, shape) == 0) continue;
      const auto& f = file(sp.file, key);
      MG_CHECK(f.contains(sp.tensor), "checkpoint file '" << f.path() << "' lacks '" << sp.tensor
                                                          << "' that metadata.json lists for '"
                                                          << key << "' (corrupt checkpoint)");
      const auto& en = f.entry(sp.tensor);
      MG_CHECK(en.dtype == safetensors_dtype(e.dtype) && shape_numel(en.shape) == sp.t.numel(),
               "checkpoint file '" << f.path() << "': '" << sp.tensor << "' is " << en.dtype << " "
                                   << shape_str(en.shape) << ", metadata.json says "
                                   << safetensors_dtype(e.dtype) << " with " << sp.t.numel()
                                   << " elements (corrupt checkpoint)");
      // A piece needed whole is read ahead in one go rather than page by page.
      if (sp.t.whole_box() && box_overlap(sp.t.global_offset, sp.t.local_shape, offset, shape) ==
                                  shape_numel(sp.t.local_shape))
        f.prefetch(sp.tensor);
      const int64_t n = copy_overlap(sp.t, f.bytes(sp.tensor).data(), offset, shape,
                                     static_cast<std::byte*>(dst.raw_data()), es);
      copied += n;
      bytes_ += static_cast<double>(n) * static_cast<double>(es);
    }
    return copied;
  }

 private:
  const SafetensorsFile& file(const std::string& name, const std::string& key) {
    auto it = files_.find(name);
    if (it != files_.end()) return *it->second;
    const std::string p = join_path(dir_, name);
    MG_CHECK(storage_.exists(p), "checkpoint '" << dir_ << "' is missing shard file '" << name
                                                << "' (it holds pieces of '" << key << "')");
    auto f = std::make_unique<SafetensorsFile>(storage_, p, verify_);
    return *files_.emplace(name, std::move(f)).first->second;
  }
  const Storage& storage_;
  std::string dir_;
  std::map<std::string, IndexEntry> entries_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  double bytes_ = 0;
  bool verify_ = true;
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
void read_local(ShardedReader& reader, const std::string& dir, const std::string& key,
                const Shape& global, const std::vector<Box>& boxes, Tensor& local,
                int64_t vocab = 0) {
  const IndexEntry* e = reader.find(key);
  MG_CHECK(e, "checkpoint '" << dir << "' has no tensor '" << key
                             << "' that the model needs (a checkpoint of another model?)");
  bool padded = false;
  if (e->global_shape != global) {
    padded = vocab > 0 && is_vocab_key(key) && e->global_shape.size() == global.size() &&
             !global.empty() && e->global_shape[0] >= vocab && global[0] >= vocab;
    for (std::size_t i = 1; padded && i < global.size(); ++i)
      padded = e->global_shape[i] == global[i];
    MG_CHECK(padded, "checkpoint '"
                         << dir << "': tensor '" << key << "' has shape "
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
    MG_CHECK(got == bn, "checkpoint '" << dir << "': tensor '" << key << "' is stored "
                                       << "only in part (" << got << " of the " << bn
                                       << " elements at offset " << shape_str(b.offset) << " shape "
                                       << shape_str(shape) << ")");
  }
}

// A host copy staged in pinned memory of the tensor's platform (a plain clone for host tensors).
Tensor host_copy(const Tensor& t) {
  return t.is_host() ? t.clone() : t.to_pinned_host();
}

}  // namespace

CheckpointState load_sharded(const Storage& storage, const std::string& dir,
                             const std::string& meta_path, const json& meta,
                             std::vector<transformer::Parameter>& params,
                             const LoadOptions& options, const CheckpointRanks& ranks) {
  const auto t0 = Clock::now();
  const std::string& where = meta_path;
  MG_CHECK(meta.value("format_version", 0) == kShardedCheckpointFormatVersion,
           "'" << where << "' has format_version " << meta.value("format_version", 0)
               << ", this build reads " << kShardedCheckpointFormatVersion);
  const comm::ProcessGroupPtr world = world_of(ranks);
  CheckpointState st;
  st.format = "sharded";
  try {
    read_run_state(meta, st);
  } catch (const json::exception& e) {
    MG_THROW("checkpoint metadata '" << where << "' is malformed: " << e.what());
  }
  std::unique_ptr<ShardedReader> reader_ptr;
  try {
    reader_ptr =
        std::make_unique<ShardedReader>(storage, dir, meta.at("index"), options.verify_checksums);
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
    Progress progress("loading the tensors of " + dir, static_cast<int64_t>(params.size()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i];
      Tensor h = host_copy(p.param);
      read_local(reader, dir, p.name, global_of(p), boxes_of(p, ranks), h, vocab);
      staged.emplace_back(i, std::move(h));
      progress.update(static_cast<int64_t>(i + 1));
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
           "load_checkpoint: another rank failed to load '" << dir << "' (see its error)");
  for (std::size_t k = 0; k < model_keys.size(); ++k)
    MG_CHECK(u[k] != 0, "checkpoint '" << dir << "' has tensor '" << model_keys[k]
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

}  // namespace mg::dist_checkpointing
