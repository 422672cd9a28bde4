// MegatronOptimizer: construction (the checks, param groups, pieces and flat state buffers), the
// step as its sequence of parts, and the parts that are not about gradient statistics: unscale and
// found-inf, the Adam / SGD updates, the master -> model copy. The grad norm and zero count are in
// clip_grads.cpp, checkpoints in optimizer_state_dict.cpp. Everything device-side goes through the
// op table (multi_tensor_scale, grad_norm / clip_grad_norm, adamw_step, axpy, fill) or Tensor
// copies, so the same code runs on every platform; the only host reads per step are the found-inf
// flag and the grad norm.
#include "megatron/core/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/core/optimizer/optimizer_state.h"
#include "megatron/plugin/registry.h"

namespace mg::optimizer {

using transformer::Parameter;

namespace {

// A 1-D flat buffer's [offset, offset + numel) as a tensor of `shape`.
Tensor view_of(const Tensor& flat, int64_t offset, const Shape& shape) {
  return flat.slice(offset, shape_numel(shape)).view(shape);
}

// `t` must be the view of `flat` at element `offset`.
void check_view(const Parameter& p, const char* field, const Tensor& t, const Tensor& flat,
                const char* flat_name) {
  MG_CHECK(t.defined(), "optimizer: parameter '" << p.name << "' has no " << field);
  MG_CHECK(t.shares_storage_with(flat) && t.dtype() == flat.dtype(),
           "optimizer: parameter '" << p.name << "' " << field << " " << t.str()
                                    << " is not a view of the flat buffer " << flat_name << " "
                                    << flat.str());
  const auto esize = static_cast<int64_t>(dtype_size(flat.dtype()));
  const auto rel =
      static_cast<int64_t>(t.offset_bytes()) - static_cast<int64_t>(flat.offset_bytes());
  MG_CHECK(rel == p.buffer_offset * esize && p.buffer_offset >= 0 &&
               p.buffer_offset + t.numel() <= flat.numel(),
           "optimizer: parameter '" << p.name << "' " << field << " sits at element " << rel / esize
                                    << " of " << flat_name << " (numel " << flat.numel()
                                    << "), but its buffer_offset is " << p.buffer_offset
                                    << " and numel " << t.numel());
}

Piece make_piece(std::size_t param, int64_t offset, Tensor grad, Tensor model_param) {
  Piece pc;
  pc.param = param;
  pc.offset = offset;
  pc.grad = std::move(grad);
  pc.model_param = std::move(model_param);
  return pc;
}

// The group when it has more than one rank, else null (a size-1 group reduces nothing).
comm::ProcessGroupPtr if_parallel(comm::ProcessGroupPtr g) {
  return g && g->size() > 1 ? std::move(g) : nullptr;
}

}  // namespace

namespace detail {

double all_reduce_scalar(comm::ProcessGroup* group, double x, comm::ReduceOp op) {
  if (!group || group->size() == 1) return x;
  Tensor t = Tensor::from_vector(std::vector<double>{x}, {1}, DType::f64);
  group->all_reduce(t, op)->wait();
  return t.to_vector<double>()[0];
}

}  // namespace detail

MegatronOptimizer::MegatronOptimizer(const OptimizerConfig& config, std::vector<Parameter>& params,
                                     transformer::ParamAndGradBuffer& buffer,
                                     const ops::OpTable& ops, const ParamGroupOptions& group_opts,
                                     std::optional<ShardOptions> shard, GradStatsGroups grad_stats)
    : config_(config),
      type_(config.type()),
      params_(params),
      buffer_(buffer),
      ops_(ops),
      state_(std::make_unique<State>()),
      shard_(std::move(shard)),
      tp_(if_parallel(std::move(grad_stats.tp))),
      pp_(if_parallel(std::move(grad_stats.pp))),
      expert_(if_parallel(std::move(grad_stats.expert))) {
  config_.validate();
  MG_CHECK(buffer_.params.defined() && buffer_.grads.defined() && buffer_.params.dim() == 1 &&
               buffer_.grads.dim() == 1 && buffer_.params.numel() == buffer_.grads.numel(),
           "optimizer: the flat buffers must be 1-D and of one length, got params "
               << (buffer_.params.defined() ? buffer_.params.str() : "undefined") << " and grads "
               << (buffer_.grads.defined() ? buffer_.grads.str() : "undefined"));
  MG_CHECK(buffer_.params.dtype() == config_.params_dtype, "optimizer: the parameter buffer is "
                                                               << dtype_name(buffer_.params.dtype())
                                                               << " but params_dtype is "
                                                               << dtype_name(config_.params_dtype));
  MG_CHECK(buffer_.params.device() == buffer_.grads.device(),
           "optimizer: params on " << buffer_.params.device() << " but grads on "
                                   << buffer_.grads.device());
  // Each Parameter exactly once: unique names, disjoint ranges (a tied weight listed twice would
  // be stepped twice and counted twice in the grad norm).
  std::set<std::string> names;
  std::vector<std::pair<int64_t, std::size_t>> ranges;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    MG_CHECK(names.insert(p.name).second,
             "optimizer: parameter name '" << p.name << "' appears twice");
    check_view(p, "param", p.param, buffer_.params, "params");
    check_view(p, "main_grad", p.main_grad, buffer_.grads, "grads");
    MG_CHECK(p.param.shape() == p.main_grad.shape(),
             "optimizer: parameter '" << p.name << "' param " << shape_str(p.param.shape())
                                      << " and main_grad " << shape_str(p.main_grad.shape())
                                      << " differ in shape");
    ranges.push_back({p.buffer_offset, i});
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    const Parameter& a = params_[ranges[k - 1].second];
    const Parameter& b = params_[ranges[k].second];
    MG_CHECK(a.buffer_offset + a.param.numel() <= b.buffer_offset,
             "optimizer: parameters '" << a.name << "' [" << a.buffer_offset << ", "
                                       << a.buffer_offset + a.param.numel() << ") and '" << b.name
                                       << "' [" << b.buffer_offset << ", "
                                       << b.buffer_offset + b.param.numel() << ") overlap");
  }

  // Param groups: one per distinct (wd_mult, lr_mult), in order of first appearance.
  std::map<std::pair<double, double>, std::size_t> group_of;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    const double wd_mult =
        group_opts.wd_mult ? group_opts.wd_mult(p) : (p.no_weight_decay ? 0.0 : 1.0);
    const double lr_mult = group_opts.lr_mult ? group_opts.lr_mult(p) : 1.0;
    MG_CHECK(wd_mult >= 0.0 && lr_mult >= 0.0,
             "optimizer: parameter '" << p.name << "' has wd_mult " << wd_mult << " and lr_mult "
                                      << lr_mult << "; both must be >= 0");
    auto [it, fresh] = group_of.try_emplace({wd_mult, lr_mult}, groups_.size());
    if (fresh) {
      ParamGroup g;
      g.wd_mult = wd_mult;
      g.lr_mult = lr_mult;
      groups_.push_back(g);
    }
    groups_[it->second].params.push_back(i);
  }

  // Master weights and optimizer state: flat buffers beside the model's, viewed per piece.
  State& s = *state_;
  const Device dev = buffer_.params.device();
  s.separate_master = config_.params_dtype == DType::bf16 || config_.params_dtype == DType::f16;
  const DType master_dtype = s.separate_master ? DType::f32 : config_.params_dtype;
  if (!shard_) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      s.pieces.push_back(
          make_piece(i, params_[i].buffer_offset, params_[i].main_grad, params_[i].param));
  } else {
    const int64_t total = buffer_.params.numel();
    int64_t prev_end = 0;
    for (const auto& [a, b] : shard_->ranges) {
      MG_CHECK(a >= prev_end && a <= b && b <= total,
               "optimizer: shard ranges must be ascending, disjoint and within [0, "
                   << total << "), got [" << a << ", " << b << ") after " << prev_end);
      prev_end = b;
    }
    MG_CHECK(shard_->group, "optimizer: ShardOptions needs the shard group");
    // Pieces in buffer order (ranges ascending, params by offset within each range).
    std::vector<std::size_t> order(params_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      return params_[x].buffer_offset < params_[y].buffer_offset;
    });
    for (const auto& [a, b] : shard_->ranges)
      for (std::size_t i : order) {
        const Parameter& p = params_[i];
        const int64_t lo = std::max(a, p.buffer_offset);
        const int64_t hi = std::min(b, p.buffer_offset + p.param.numel());
        if (lo >= hi) continue;
        s.pieces.push_back(
            make_piece(i, lo, buffer_.grads.slice(lo, hi - lo), buffer_.params.slice(lo, hi - lo)));
      }
  }
  // Piece k sits at element `pos[k]` of the state buffers (the flat buffer offset unsharded).
  std::vector<int64_t> pos;
  int64_t n = buffer_.params.numel();
  if (shard_) {
    n = 0;
    for (const Piece& pc : s.pieces) pos.push_back(n), n += pc.grad.numel();
  } else {
    for (const Piece& pc : s.pieces) pos.push_back(pc.offset);
  }
  // --optimizer-cpu-offload: Megatron's HybridDeviceOptimizer takes whole parameters (here:
  // pieces) for the host while fewer than `fraction` of this rank's optimizer elements are there,
  // in buffer order; they are the positions [0, split) of the state buffers.
  s.offload = config_.optimizer_cpu_offload && config_.optimizer_offload_fraction > 0.0 &&
              (!dev.is_host() || config_.offload_engine_on_host);
  if (s.offload) {
    std::vector<std::size_t> by_pos(s.pieces.size());
    for (std::size_t k = 0; k < by_pos.size(); ++k) by_pos[k] = k;
    std::sort(by_pos.begin(), by_pos.end(),
              [&](std::size_t x, std::size_t y) { return pos[x] < pos[y]; });
    int64_t total = 0;
    for (const Piece& pc : s.pieces) total += pc.grad.numel();
    const double threshold = config_.optimizer_offload_fraction * static_cast<double>(total);
    for (std::size_t k : by_pos) {
      Piece& pc = s.pieces[k];
      if (pc.grad.numel() == 0) continue;
      if (static_cast<double>(s.host_numel) >= threshold) break;
      pc.on_host = true;
      s.host_numel += pc.grad.numel();
      s.split = pos[k] + pc.grad.numel();
    }
    s.host_ops = &plugin::ops_for(Device::cpu());
  }
  const int64_t split = s.split;
  const int64_t dn = n - split;  // device state: positions [split, n)
  if (s.separate_master) {
    s.master_flat = Tensor::empty({dn}, DType::f32, dev);
    if (!shard_) s.master_flat.copy_(buffer_.params.slice(split, dn));
  } else if (!shard_) {
    s.master_flat = split == 0 ? buffer_.params : buffer_.params.slice(split, dn);
  }
  if (type_ == OptimizerType::adam) {
    s.exp_avg_flat = Tensor::zeros({dn}, master_dtype, dev);
    s.exp_avg_sq_flat = Tensor::zeros({dn}, master_dtype, dev);
  } else {
    s.momentum_flat = Tensor::zeros({dn}, master_dtype, dev);
  }
  if (s.offload) {
    // Host memory pinned for the copies (the CPU platform's is ordinary host memory).
    auto host_zeros = [&](DType dt) {
      Tensor t = Tensor::empty_pinned({split}, dt, dev);
      t.zero_();
      return t;
    };
    s.host_master_flat = host_zeros(master_dtype);
    if (type_ == OptimizerType::adam) {
      s.host_exp_avg_flat = host_zeros(master_dtype);
      s.host_exp_avg_sq_flat = host_zeros(master_dtype);
    } else {
      s.host_momentum_flat = host_zeros(master_dtype);
    }
    s.host_grad_flat = host_zeros(buffer_.grads.dtype());
    if (s.separate_master) s.host_model_flat = host_zeros(buffer_.params.dtype());
  }
  for (std::size_t k = 0; k < s.pieces.size(); ++k) {
    Piece& pc = s.pieces[k];
    const Shape shape = pc.grad.shape();
    if (pc.on_host) {
      pc.master = view_of(s.host_master_flat, pos[k], shape);
      pc.master.copy_(pc.model_param);
      pc.host_grad = view_of(s.host_grad_flat, pos[k], shape);
      if (s.separate_master) pc.host_model = view_of(s.host_model_flat, pos[k], shape);
      if (s.host_exp_avg_flat.defined()) {
        pc.exp_avg = view_of(s.host_exp_avg_flat, pos[k], shape);
        pc.exp_avg_sq = view_of(s.host_exp_avg_sq_flat, pos[k], shape);
      }
      if (s.host_momentum_flat.defined())
        pc.momentum = view_of(s.host_momentum_flat, pos[k], shape);
      continue;
    }
    const int64_t at = pos[k] - split;
    if (s.separate_master || !shard_)
      pc.master = view_of(s.master_flat, at, shape);
    else
      pc.master = pc.model_param;  // f32/f64 model sharded: the params are their own master
    if (shard_ && s.separate_master) pc.master.copy_(pc.model_param);
    if (s.exp_avg_flat.defined()) {
      pc.exp_avg = view_of(s.exp_avg_flat, at, shape);
      pc.exp_avg_sq = view_of(s.exp_avg_sq_flat, at, shape);
    }
    if (s.momentum_flat.defined()) pc.momentum = view_of(s.momentum_flat, at, shape);
  }
  // The copies of the host pieces: runs adjacent both in the state buffers and the flat buffer.
  std::vector<std::size_t> run_of_piece;
  if (s.offload) {
    std::vector<std::size_t> host;
    for (std::size_t k = 0; k < s.pieces.size(); ++k)
      if (s.pieces[k].on_host) host.push_back(k);
    std::sort(host.begin(), host.end(),
              [&](std::size_t x, std::size_t y) { return pos[x] < pos[y]; });
    run_of_piece.assign(s.pieces.size(), 0);
    int64_t run_pos = 0, run_offset = 0, run_numel = 0;
    auto close_run = [&] {
      if (run_numel == 0) return;
      OffloadRun r;
      r.device_grad = buffer_.grads.slice(run_offset, run_numel);
      r.host_grad = s.host_grad_flat.slice(run_pos, run_numel);
      r.device_param = buffer_.params.slice(run_offset, run_numel);
      r.host_master = s.host_master_flat.slice(run_pos, run_numel);
      if (s.separate_master) r.host_model = s.host_model_flat.slice(run_pos, run_numel);
      s.offload_runs.push_back(std::move(r));
    };
    for (std::size_t k : host) {
      const Piece& pc = s.pieces[k];
      if (run_numel > 0 && pos[k] == run_pos + run_numel && pc.offset == run_offset + run_numel) {
        run_numel += pc.grad.numel();
      } else {
        close_run();
        run_pos = pos[k], run_offset = pc.offset, run_numel = pc.grad.numel();
      }
      run_of_piece[k] = s.offload_runs.size();  // the run being built
    }
    close_run();
  }
  std::vector<std::size_t> group_of_param(params_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i : groups_[g].params) group_of_param[i] = g;
  s.group_pieces.resize(groups_.size());
  for (std::size_t k = 0; k < s.pieces.size(); ++k)
    s.group_pieces[group_of_param[s.pieces[k].param]].push_back(k);
  if (s.offload) {  // the same split per offload run, and the device pieces apart
    s.device_group_pieces.resize(groups_.size());
    for (OffloadRun& r : s.offload_runs) r.group_pieces.resize(groups_.size());
    for (std::size_t g = 0; g < groups_.size(); ++g)
      for (std::size_t k : s.group_pieces[g]) {
        if (s.pieces[k].on_host)
          s.offload_runs[run_of_piece[k]].group_pieces[g].push_back(k);
        else
          s.device_group_pieces[g].push_back(k);
      }
  }
  s.found_inf = Tensor::zeros({1}, DType::f32, dev);
  scaler_ = make_grad_scaler(config_);

  // The groups every gradient statistic reduces over, in Megatron's order; then the gradients.
  if (shard_ && shard_->group->size() > 1) grad_stats_groups_.push_back(shard_->group.get());
  for (const comm::ProcessGroupPtr& g : {tp_, pp_})
    if (g) grad_stats_groups_.push_back(g.get());
  for (const Piece& pc : s.pieces)
    if (pc.grad.numel() > 0) s.grads.push_back(pc.grad);
  select_main_grads_for_grad_norm();
}

MegatronOptimizer::~MegatronOptimizer() = default;

float MegatronOptimizer::loss_scale() const {
  return scaler_ ? scaler_->scale() : 1.0f;
}

Tensor MegatronOptimizer::master_param(std::size_t i) const {
  MG_CHECK(i < params_.size(),
           "optimizer: master_param(" << i << ") of " << params_.size() << " parameters");
  MG_CHECK(!shard_, "optimizer: master_param(" << i
                                               << ") of a sharded (distributed) optimizer; its "
                                                  "master weights are per-rank pieces");
  return state_->pieces[i].master;
}

int64_t MegatronOptimizer::state_bytes() const {
  const State& s = *state_;
  int64_t bytes = 0;
  for (const Tensor* t : {&s.exp_avg_flat, &s.exp_avg_sq_flat, &s.momentum_flat})
    if (t->defined()) bytes += t->numel() * static_cast<int64_t>(dtype_size(t->dtype()));
  if (s.separate_master)
    bytes += s.master_flat.numel() * static_cast<int64_t>(dtype_size(s.master_flat.dtype()));
  return bytes;
}

int64_t MegatronOptimizer::host_state_bytes() const {
  const State& s = *state_;
  int64_t bytes = 0;
  for (const Tensor* t : {&s.host_master_flat, &s.host_exp_avg_flat, &s.host_exp_avg_sq_flat,
                          &s.host_momentum_flat, &s.host_grad_flat, &s.host_model_flat})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

int64_t MegatronOptimizer::offloaded_numel() const {
  return state_->host_numel;
}

void MegatronOptimizer::zero_grad() {
  buffer_.grads.zero_();
}

// ---- the step ----

StepResult MegatronOptimizer::step(double lr, double weight_decay) {
  MG_CHECK(lr >= 0.0 && std::isfinite(lr), "optimizer.step: lr must be >= 0, got " << lr);
  MG_CHECK(weight_decay >= 0.0, "optimizer.step: weight_decay must be >= 0, got " << weight_decay);
  StepResult r;
  // Megatron's prepare_grads: only with a scaler, and then an overflow skips the step whatever the
  // precision.
  if (scaler_) {
    bool found_inf = false;
    {
      ScopedTimer t(timers_, "optimizer-unscale-and-check-inf", 1);
      found_inf = unscale_and_check_for_nan();
    }
    scaler_->update(found_inf);
    if (found_inf) {
      r.found_inf = true;
      return r;  // skipped: params, state and step count untouched
    }
  }
  // The pre-clip norm, computed even without clipping (for the log).
  {
    ScopedTimer t(timers_, "optimizer-clip-main-grad", 1);
    r.grad_norm = config_.clip_grad > 0.0 ? clip_grad_norm(config_.clip_grad) : get_grad_norm();
  }
  r.found_inf = !std::isfinite(r.grad_norm);
  // A non-finite norm (every rank sees the same global value) is never applied: the step is
  // skipped, params, state and step count untouched (Megatron would apply it in bf16/fp32).
  if (r.found_inf) return r;
  if (config_.log_num_zeros_in_grad) {
    ScopedTimer t(timers_, "optimizer-count-zeros", 1);
    r.num_zeros_in_grad = count_zeros();
  }

  const int64_t step = step_ + 1;
  std::optional<ScopedTimer> inner(std::in_place, timers_, "optimizer-inner-step", 1);
  for (ParamGroup& g : groups_) {
    g.lr = lr * g.lr_mult;
    g.weight_decay = weight_decay * g.wd_mult;
  }
  const UpdateFn update = [&](std::size_t gi, std::span<const std::size_t> pieces) {
    switch (type_) {
      case OptimizerType::adam:
        adam_update(groups_[gi], pieces, step);
        break;
      case OptimizerType::sgd:
        sgd_update(groups_[gi], pieces);
        break;
    }
  };
  if (state_->offload && config_.overlap_cpu_optimizer_d2h_h2d) {
    step_offloaded_overlapped(update);
  } else {
    if (state_->offload) offload_grads_to_host();
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) update(gi, state_->group_pieces[gi]);
    // The host pieces' updated weights (Adam: the model-dtype staging it wrote) to the device.
    if (state_->offload) copy_offloaded_params_to_device(type_ == OptimizerType::sgd);
  }
  inner.reset();
  if (type_ == OptimizerType::sgd) {
    state_->momentum_initialized = config_.sgd_momentum != 0.0;
    ScopedTimer t(timers_, "optimizer-copy-main-to-model-params", 1);
    copy_main_params_to_model_params();  // adamw_step wrote the model weights itself
  }
  if (shard_ && shard_->quantize_params) {
    ScopedTimer t(timers_, "optimizer-copy-main-to-model-params", 1);
    shard_->quantize_params();
  }
  if (shard_ && shard_->gather_params) {
    ScopedTimer t(timers_, "params-all-gather", 1);
    shard_->gather_params();
  }
  step_ = step;
  r.success = true;
  return r;
}

double MegatronOptimizer::reduce_over_grad_stats_groups(double x, comm::ReduceOp op) const {
  for (comm::ProcessGroup* g : grad_stats_groups_) x = detail::all_reduce_scalar(g, x, op);
  return x;
}

// Megatron's _unscale_main_grads_and_check_for_nan: every main_grad *= 1/loss_scale in place
// (multi_tensor_scale flags inf/nan results); found-inf is the max over the shards, TP, PP and the
// expert group, so every rank takes the same decision.
bool MegatronOptimizer::unscale_and_check_for_nan() {
  State& s = *state_;
  ops_.fill(s.found_inf, 0.0);
  if (!s.grads.empty())
    ops_.multi_tensor_scale(s.grads, static_cast<double>(scaler_->inv_scale()), s.found_inf);
  const double local_inf = host_read<float>(s.found_inf, HostSync::found_inf)[0] > 0.0f ? 1.0 : 0.0;
  const double any_inf = detail::all_reduce_scalar(
      expert_.get(), reduce_over_grad_stats_groups(local_inf, comm::ReduceOp::max),
      comm::ReduceOp::max);
  return any_inf > 0.0;
}

// --optimizer-cpu-offload: the host pieces' gradients (unscaled and clipped on the device) into
// their host staging, one copy per run.
void MegatronOptimizer::offload_grads_to_host() {
  for (OffloadRun& r : state_->offload_runs) r.host_grad.copy_(r.device_grad);
}

// --optimizer-cpu-offload: the host pieces' updated weights to the model's, one copy per run: the
// model-dtype staging adamw_step wrote (Adam with separate master weights), else the masters
// (converted on the host, as SGD's copy_main_params_to_model_params does).
void MegatronOptimizer::copy_offloaded_params_to_device(bool from_master) {
  for (OffloadRun& r : state_->offload_runs)
    r.device_param.copy_(!from_master && r.host_model.defined() ? r.host_model : r.host_master);
}

// --overlap-cpu-optimizer-d2h-h2d: the offloaded update as a pipeline over the runs. One thread
// copies the runs' gradients to the host in turn, another copies each updated run's weights back,
// and this thread steps the device pieces (asynchronous on a GPU) and then each run as soon as its
// gradients are there: run r's update overlaps run r+1's gradient copy and run r-1's weight copy.
// Each element is updated by the same kernel arithmetic as without the overlap.
void MegatronOptimizer::step_offloaded_overlapped(const UpdateFn& update) {
  State& s = *state_;
  const Device dev = buffer_.params.device();
  plugin::Platform& platform = plugin::global_registry().platform(dev.type);
  // The clipped gradients must be complete before another thread's stream reads them.
  platform.synchronize(dev.index);
  const std::size_t runs = s.offload_runs.size();
  const bool from_master = type_ == OptimizerType::sgd || !s.separate_master;
  std::mutex mu;
  std::condition_variable cv;
  std::size_t copied_in = 0, updated = 0;
  bool abort = false;
  std::exception_ptr error;
  auto fail = [&](std::exception_ptr e) {
    std::lock_guard lock(mu);
    if (!error) error = e;
    abort = true;
    cv.notify_all();
  };
  std::thread d2h([&] {
    try {
      platform.set_device(dev.index);
      for (std::size_t r = 0; r < runs; ++r) {
        {
          std::lock_guard lock(mu);
          if (abort) return;
        }
        OffloadRun& run = s.offload_runs[r];
        run.host_grad.copy_(run.device_grad);
        std::lock_guard lock(mu);
        ++copied_in;
        cv.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  });
  std::thread h2d([&] {
    try {
      platform.set_device(dev.index);
      for (std::size_t r = 0; r < runs; ++r) {
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return updated > r || abort; });
          if (abort) return;
        }
        OffloadRun& run = s.offload_runs[r];
        run.device_param.copy_(!from_master && run.host_model.defined() ? run.host_model
                                                                        : run.host_master);
      }
    } catch (...) {
      fail(std::current_exception());
    }
  });
  try {
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) update(gi, s.device_group_pieces[gi]);
    for (std::size_t r = 0; r < runs; ++r) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return copied_in > r || abort; });
        if (abort) break;
      }
      for (std::size_t gi = 0; gi < groups_.size(); ++gi)
        update(gi, s.offload_runs[r].group_pieces[gi]);
      std::lock_guard lock(mu);
      ++updated;
      cv.notify_all();
    }
  } catch (...) {
    fail(std::current_exception());
  }
  d2h.join();
  h2d.join();
  if (error) std::rethrow_exception(error);
}

// Adam / AdamW (apex FusedAdam, bias correction) over one param group's pieces: one adamw_step
// call, which also writes the bf16/fp16 model weights from the f32 master weights. Offloaded
// pieces: a second call through the CPU platform's op table on their host state (the device's
// call is asynchronous on a GPU, so the two updates overlap), writing the host staging.
void MegatronOptimizer::adam_update(const ParamGroup& g, std::span<const std::size_t> pieces,
                                    int64_t step) {
  State& s = *state_;
  std::vector<ops::AdamParam> list, host_list;
  for (std::size_t k : pieces) {
    Piece& pc = s.pieces[k];
    if (pc.master.numel() == 0) continue;
    if (pc.on_host)
      host_list.push_back({pc.master, pc.host_grad, pc.exp_avg, pc.exp_avg_sq, pc.host_model});
    else
      list.push_back({pc.master, pc.grad, pc.exp_avg, pc.exp_avg_sq,
                      s.separate_master ? pc.model_param : Tensor()});
  }
  ops::AdamArgs a;
  a.lr = static_cast<float>(g.lr);
  a.beta1 = static_cast<float>(config_.adam_beta1);
  a.beta2 = static_cast<float>(config_.adam_beta2);
  a.eps = static_cast<float>(config_.adam_eps);
  a.weight_decay = static_cast<float>(g.weight_decay);
  a.step = step;
  a.bias_correction = true;
  a.decoupled_weight_decay = config_.decoupled_weight_decay;
  if (!list.empty()) ops_.adamw_step(list, a);
  if (!host_list.empty()) s.host_ops->adamw_step(host_list, a);
}

// torch.optim.SGD (dampening 0, no nesterov) over one param group's pieces: d = g + wd p; buf = d
// on the first step, else momentum * buf + d; p -= lr * buf. The decay term is added to main_grad
// in place (the loop zeroes the gradients before the next backward anyway). Updates the master
// weights only (copy_main_params_to_model_params follows).
void MegatronOptimizer::sgd_update(const ParamGroup& g, std::span<const std::size_t> pieces) {
  State& s = *state_;
  const double momentum = config_.sgd_momentum;
  for (std::size_t k : pieces) {
    Piece& pc = s.pieces[k];
    if (pc.master.numel() == 0) continue;
    // Offloaded pieces: their host state and gradient copy, through the CPU platform's kernels.
    const ops::OpTable& o = pc.on_host ? *s.host_ops : ops_;
    Tensor& grad = pc.on_host ? pc.host_grad : pc.grad;
    if (g.weight_decay != 0.0) o.axpy(grad, pc.master, static_cast<float>(g.weight_decay));
    if (momentum != 0.0) {
      Tensor& buf = pc.momentum;
      if (!s.momentum_initialized) {
        buf.copy_(grad);
      } else {
        std::vector<Tensor> one{buf};
        Tensor none;
        o.multi_tensor_scale(one, momentum, none);
        o.axpy(buf, grad, 1.0f);
      }
      o.axpy(pc.master, buf, static_cast<float>(-g.lr));
    } else {
      o.axpy(pc.master, grad, static_cast<float>(-g.lr));
    }
  }
}

// Megatron's _copy_main_params_to_model_params: the f32 master weights rounded into the bf16/fp16
// model weights (this rank's pieces when sharded; gather_params then spreads them). No-op when the
// params are their own master weights.
// Offloaded pieces were copied by the step already (copy_offloaded_params_to_device).
void MegatronOptimizer::copy_main_params_to_model_params() {
  State& s = *state_;
  if (!s.separate_master) return;
  if (!shard_) {
    buffer_.params.slice(s.split, buffer_.params.numel() - s.split).copy_(s.master_flat);
  } else {
    for (Piece& pc : s.pieces)
      if (!pc.on_host) pc.model_param.copy_(pc.master);
  }
}

std::vector<MegatronOptimizer::MasterShard> MegatronOptimizer::master_shards() const {
  std::vector<MasterShard> out;
  for (const Piece& pc : state_->pieces) {
    MG_CHECK(!pc.on_host, "optimizer::master_shards: parameter '"
                              << params_[pc.param].name
                              << "' has its master weights offloaded to the host");
    const Tensor& m = pc.master.defined() ? pc.master : pc.model_param;
    out.push_back(MasterShard{pc.param, pc.offset, m.view({m.numel()})});
  }
  return out;
}

// Offloaded pieces keep master copies of their own in host memory even for f32/f64 models, so
// they are refreshed from the model here too.
void MegatronOptimizer::reload_model_params() {
  State& s = *state_;
  for (Piece& pc : s.pieces)
    if (pc.on_host) pc.master.copy_(pc.model_param);
  if (!s.separate_master) return;
  if (!shard_) {
    s.master_flat.copy_(buffer_.params.slice(s.split, buffer_.params.numel() - s.split));
  } else {
    for (Piece& pc : s.pieces)
      if (!pc.on_host) pc.master.copy_(pc.model_param);
  }
}

}  // namespace mg::optimizer
