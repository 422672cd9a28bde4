// MegatronOptimizer checkpoints: state_dict / load_state_dict (the keys are documented in
// optimizer.h). The byte layout is what checkpoints on disk hold: the "optimizer" string is the
// --optimizer name (adam | sgd), unsharded state per parameter name, sharded state as flat shards
// with the layout they cover.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer/optimizer_state.h"

namespace mg::optimizer {

namespace {

constexpr const char* kStatePrefix = "optimizer.state.";

std::string ranges_str(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::string out;
  for (const auto& [a, b] : ranges) {  // "a:b,c:d" (appended piecewise: GCC 12's -Wrestrict)
    if (!out.empty()) out += ',';
    out += std::to_string(a);
    out += ':';
    out += std::to_string(b);
  }
  return out;
}

// --optimizer-cpu-offload, sharded: a shard's state is the host flat (positions [0, split)) then
// the device flat; the checkpoint holds it whole (a host copy), as without offload.
Tensor whole_shard(const Tensor& host, const Tensor& device, int64_t split) {
  if (split == 0) return device;
  Tensor out = Tensor::empty({split + device.numel()}, device.dtype());
  out.slice(0, split).copy_(host);
  out.slice(split, device.numel()).copy_(device);
  return out;
}

}  // namespace

StateDict MegatronOptimizer::state_dict() const {
  const State& s = *state_;
  StateDict sd;
  sd.strings["optimizer"] = std::string(optimizer_type_name(type_));
  sd.numbers["step"] = static_cast<double>(step_);
  if (shard_) {
    const std::string prefix = "optimizer.shard.";
    if (type_ == OptimizerType::adam) {
      sd.tensors[prefix + "exp_avg"] = whole_shard(s.host_exp_avg_flat, s.exp_avg_flat, s.split);
      sd.tensors[prefix + "exp_avg_sq"] =
          whole_shard(s.host_exp_avg_sq_flat, s.exp_avg_sq_flat, s.split);
    } else if (s.momentum_initialized) {
      sd.tensors[prefix + "momentum_buffer"] =
          whole_shard(s.host_momentum_flat, s.momentum_flat, s.split);
    }
    if (s.separate_master)
      sd.tensors[prefix + "fp32_param"] = whole_shard(s.host_master_flat, s.master_flat, s.split);
    sd.strings["shard.ranges"] = ranges_str(shard_->ranges);
    sd.numbers["shard.rank"] = shard_->group->rank();
    sd.numbers["shard.size"] = shard_->group->size();
  } else {
    for (const Piece& pc : s.pieces) {
      const std::string& name = params_[pc.param].name;
      if (type_ == OptimizerType::adam) {
        sd.tensors[kStatePrefix + std::string("exp_avg.") + name] = pc.exp_avg;
        sd.tensors[kStatePrefix + std::string("exp_avg_sq.") + name] = pc.exp_avg_sq;
      } else if (s.momentum_initialized) {
        sd.tensors[kStatePrefix + std::string("momentum_buffer.") + name] = pc.momentum;
      }
      if (s.separate_master)
        sd.tensors[kStatePrefix + std::string("fp32_param.") + name] = pc.master;
    }
  }
  if (scaler_) sd.merge("grad_scaler.", scaler_->state_dict());
  return sd;
}

void MegatronOptimizer::load_state_dict(const StateDict& sd) {
  State& s = *state_;
  if (sd.has_string("optimizer"))
    MG_CHECK(sd.string("optimizer") == optimizer_type_name(type_),
             "optimizer: the checkpoint holds " << sd.string("optimizer")
                                                << " state but this run uses --optimizer "
                                                << optimizer_type_name(type_));
  const double step = sd.number("step");
  MG_CHECK(step >= 0 && step == std::floor(step),
           "optimizer: checkpoint step must be a whole number >= 0, got " << step);
  const bool has_momentum = type_ == OptimizerType::sgd && step > 0 && config_.sgd_momentum != 0.0;
  auto copy_in = [&](const std::string& key, Tensor& dst) {
    MG_CHECK(sd.has_tensor(key), "optimizer: the checkpoint has no '"
                                     << key
                                     << "' (load the model without optimizer state: "
                                        "--no-load-optim / --finetune)");
    const Tensor& src = sd.tensor(key);
    MG_CHECK(src.shape() == dst.shape(), "optimizer: checkpoint '"
                                             << key << "' has shape " << shape_str(src.shape())
                                             << ", the model has " << shape_str(dst.shape()));
    dst.copy_(src);
  };
  if (shard_) {
    const bool was_sharded = sd.has_string("shard.ranges");
    MG_CHECK(was_sharded,
             "optimizer: the checkpoint holds unsharded optimizer state but this run "
             "uses --use-distributed-optimizer (resharding is not supported yet)");
    const std::string mine = ranges_str(shard_->ranges);
    MG_CHECK(sd.string("shard.ranges") == mine && sd.number("shard.size") == shard_->group->size(),
             "optimizer: the checkpoint's shard of data-parallel rank "
                 << sd.number("shard.rank") << " of " << sd.number("shard.size") << " covers "
                 << sd.string("shard.ranges") << " but this rank " << shard_->group->rank()
                 << " of " << shard_->group->size() << " owns " << mine
                 << " (load with the same data-parallel size and --ddp-bucket-size)");
    const std::string prefix = "optimizer.shard.";
    // Offloaded: the shard's first `split` elements go to the host flat, the rest to the device.
    auto copy_in_shard = [&](const std::string& key, Tensor& host, Tensor& device) {
      if (s.split == 0) return copy_in(key, device);
      Tensor whole = Tensor::empty({s.split + device.numel()}, device.dtype());
      copy_in(key, whole);
      host.copy_(whole.slice(0, s.split));
      device.copy_(whole.slice(s.split, device.numel()));
    };
    if (type_ == OptimizerType::adam) {
      copy_in_shard(prefix + "exp_avg", s.host_exp_avg_flat, s.exp_avg_flat);
      copy_in_shard(prefix + "exp_avg_sq", s.host_exp_avg_sq_flat, s.exp_avg_sq_flat);
    } else if (has_momentum) {
      copy_in_shard(prefix + "momentum_buffer", s.host_momentum_flat, s.momentum_flat);
    }
    if (s.separate_master) copy_in_shard(prefix + "fp32_param", s.host_master_flat, s.master_flat);
  } else {
    MG_CHECK(!sd.has_string("shard.ranges"),
             "optimizer: the checkpoint holds distributed-optimizer shards ("
                 << sd.string("shard.ranges")
                 << "); load it with --use-distributed-optimizer and the same layout");
    for (Piece& pc : s.pieces) {
      const std::string& name = params_[pc.param].name;
      if (type_ == OptimizerType::adam) {
        copy_in(kStatePrefix + std::string("exp_avg.") + name, pc.exp_avg);
        copy_in(kStatePrefix + std::string("exp_avg_sq.") + name, pc.exp_avg_sq);
      } else if (has_momentum) {
        copy_in(kStatePrefix + std::string("momentum_buffer.") + name, pc.momentum);
      }
      if (s.separate_master) copy_in(kStatePrefix + std::string("fp32_param.") + name, pc.master);
    }
  }
  // Offloaded pieces of an f32/f64 model: their host masters from the (just loaded) model.
  if (!s.separate_master)
    for (Piece& pc : s.pieces)
      if (pc.on_host) pc.master.copy_(pc.model_param);
  s.momentum_initialized = has_momentum;
  step_ = static_cast<int64_t>(step);
  // Megatron: a checkpoint without scaler state keeps the current scaler; scaler state without a
  // scaler here is ignored.
  const StateDict scaler_sd = sd.sub("grad_scaler.");
  if (scaler_ && !scaler_sd.empty()) scaler_->load_state_dict(scaler_sd);
}

}  // namespace mg::optimizer
