// The pieces every checkpoint format shares (format_common.h).
#include "megatron/core/dist_checkpointing/format_common.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "megatron/core/common/error.h"

namespace mg::dist_checkpointing {

using nlohmann::json;

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

std::string staged_dir(const SaveTarget& target, const comm::ProcessGroupPtr& world, bool create) {
  // One staged directory for all ranks: rank 0's tag names it (a process tag is a number).
  std::string tag = target.storage->process_tag();
  if (world && world->size() > 1) {
    Tensor t = Tensor::from_vector(std::vector<int64_t>{std::stoll(tag)}, {1}, DType::i64);
    world->broadcast(t, 0)->wait();
    tag = std::to_string(t.to_vector<int64_t>()[0]);
  }
  if (create) return target.storage->begin_staging(target.final_dir, tag);
  return target.storage->staged_name(target.final_dir, tag);
}

void commit_checkpoint(const SaveTarget& target, const std::string& staged,
                       const std::string& meta_text) {
  Storage& s = *target.storage;
  s.write_object(join_path(staged, kMetadataFile), meta_text);
  s.commit_staging(staged, target.final_dir);
  s.replace(target.tracker, target.tracker_text);
}

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

void read_run_state(const json& meta, CheckpointState& st) {
  st.iteration = meta.at("iteration").get<int64_t>();
  st.consumed_train_samples = meta.at("consumed_train_samples").get<int64_t>();
  st.consumed_valid_samples = meta.at("consumed_valid_samples").get<int64_t>();
  st.floating_point_operations_so_far =
      meta.at("num_floating_point_operations_so_far").get<double>();
  st.args = meta.value("args", json::object());
  st.extra = meta.value("extra", json::object());
}

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

}  // namespace mg::dist_checkpointing
