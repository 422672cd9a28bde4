// Helpers both halves of the sharded format use (sharded_format.h, namespace detail): a
// parameter's TP boxes, the distributed optimizer's shard layout, the state key names.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/sharded_format.h"

namespace mg::dist_checkpointing::detail {

std::string rank_file(int rank) {
  char name[48];
  std::snprintf(name, sizeof(name), "rank_%05d.safetensors", rank);
  return name;
}

Shape global_of(const transformer::Parameter& p) {
  return p.global_shape.empty() ? p.param.shape() : p.global_shape;
}

std::vector<Box> boxes_of(const transformer::Parameter& p, const CheckpointRanks& r) {
  const int tp = tp_size_of(r);
  // An expert parameter is sharded over the expert-TP group, whose rank it records.
  const tensor_parallel::Partition part =
      p.is_expert ? tensor_parallel::Partition{p.tensor_parallel_dim, p.partition_stride,
                                               p.expert_tp_rank, p.expert_tp_size}
                  : tensor_parallel::Partition{p.tensor_parallel_dim, p.partition_stride,
                                               tp > 1 ? r.tp_group->rank() : 0, tp};
  const Shape g = global_of(p);
  const Shape expect = tensor_parallel::local_shape(g, part);
  MG_CHECK(expect == p.param.shape(), "checkpoint: parameter '"
                                          << p.name << "' has shape " << shape_str(p.param.shape())
                                          << " but its global shape " << shape_str(g) << " over TP "
                                          << part.size << " gives " << shape_str(expect)
                                          << " (CheckpointRanks::tp_group missing?)");
  return partition_boxes(g, part);
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

bool split_state_key(const std::string& key, std::string& kind, std::string& name) {
  if (key.rfind(kStatePrefix, 0) != 0) return false;
  const std::string rest = key.substr(std::strlen(kStatePrefix));
  const auto dot = rest.find('.');
  if (dot == std::string::npos) return false;
  kind = rest.substr(0, dot);
  name = rest.substr(dot + 1);
  return true;
}

}  // namespace mg::dist_checkpointing::detail
