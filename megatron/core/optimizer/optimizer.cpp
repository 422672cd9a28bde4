// MegatronOptimizer: mixed-precision (fp32 master) and fp32 optimizers over the flat parameter and
// gradient buffers. Everything device-side goes through the op table (multi_tensor_scale,
// grad_norm / clip_grad_norm, adamw_step, axpy, fill) or Tensor copies, so the same code runs on
// every platform; the only host reads per step are the found-inf flag and the grad norm.
#include "megatron/core/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "megatron/core/common/error.h"

namespace mg::optimizer {

using transformer::Parameter;

// A piece: a parameter, or (sharded) its intersection with one owned range as a 1-D view.
struct Piece {
  std::size_t param = 0;  // index into the Parameter vector
  int64_t offset = 0;     // element offset in the flat buffer
  Tensor master, grad, exp_avg, exp_avg_sq, momentum;
  Tensor model_param;  // the model weight piece (written by adamw_step when master is separate)
};

struct MegatronOptimizer::State {
  bool separate_master = false;  // bf16/fp16 model: f32 master weights of their own
  Tensor master_flat;            // [P] f32 (or the params buffer itself); sharded: [owned] f32
  Tensor exp_avg_flat, exp_avg_sq_flat, momentum_flat;  // [P] or sharded [owned]
  bool momentum_initialized = false;  // torch SGD creates the buffer on the first step
  std::vector<Piece> pieces;          // unsharded: one per Parameter, in order
  std::vector<std::vector<std::size_t>> group_pieces;  // per ParamGroup: indices into pieces
  Tensor found_inf;                                    // [1] f32
};

namespace {

constexpr const char* kStatePrefix = "optimizer.state.";

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

bool any_nonfinite(double x) {
  return !std::isfinite(x);
}

}  // namespace

MegatronOptimizer::MegatronOptimizer(const OptimizerConfig& config, std::vector<Parameter>& params,
                                     transformer::ParamAndGradBuffer& buffer,
                                     const ops::OpTable& ops, const ParamGroupOptions& group_opts,
                                     std::optional<ShardOptions> shard)
    : config_(config),
      params_(params),
      buffer_(buffer),
      ops_(ops),
      state_(std::make_unique<State>()),
      shard_(std::move(shard)) {
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
          {i, params_[i].buffer_offset, {}, params_[i].main_grad, {}, {}, {}, params_[i].param});
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
        s.pieces.push_back({i,
                            lo,
                            {},
                            buffer_.grads.slice(lo, hi - lo),
                            {},
                            {},
                            {},
                            buffer_.params.slice(lo, hi - lo)});
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
  if (s.separate_master) {
    s.master_flat = Tensor::empty({n}, DType::f32, dev);
    if (!shard_) s.master_flat.copy_(buffer_.params);
  } else if (!shard_) {
    s.master_flat = buffer_.params;
  }
  if (config_.optimizer == "adam") {
    s.exp_avg_flat = Tensor::zeros({n}, master_dtype, dev);
    s.exp_avg_sq_flat = Tensor::zeros({n}, master_dtype, dev);
  } else {
    s.momentum_flat = Tensor::zeros({n}, master_dtype, dev);
  }
  for (std::size_t k = 0; k < s.pieces.size(); ++k) {
    Piece& pc = s.pieces[k];
    const Shape shape = pc.grad.shape();
    if (s.separate_master || !shard_)
      pc.master = view_of(s.master_flat, pos[k], shape);
    else
      pc.master = pc.model_param;  // f32/f64 model sharded: the params are their own master
    if (shard_ && s.separate_master) pc.master.copy_(pc.model_param);
    if (s.exp_avg_flat.defined()) {
      pc.exp_avg = view_of(s.exp_avg_flat, pos[k], shape);
      pc.exp_avg_sq = view_of(s.exp_avg_sq_flat, pos[k], shape);
    }
    if (s.momentum_flat.defined()) pc.momentum = view_of(s.momentum_flat, pos[k], shape);
  }
  std::vector<std::size_t> group_of_param(params_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i : groups_[g].params) group_of_param[i] = g;
  s.group_pieces.resize(groups_.size());
  for (std::size_t k = 0; k < s.pieces.size(); ++k)
    s.group_pieces[group_of_param[s.pieces[k].param]].push_back(k);
  s.found_inf = Tensor::zeros({1}, DType::f32, dev);
  scaler_ = make_grad_scaler(config_);
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

void MegatronOptimizer::zero_grad() {
  buffer_.grads.zero_();
}

// Sum of a host value over the shard group (identity unsharded).
double MegatronOptimizer::reduce_over_shards(double x, comm::ReduceOp op) const {
  if (!shard_ || shard_->group->size() == 1) return x;
  Tensor t = Tensor::from_vector(std::vector<double>{x}, {1}, DType::f64);
  shard_->group->all_reduce(t, op)->wait();
  return t.to_vector<double>()[0];
}

double MegatronOptimizer::reduce_over_ep(double x, comm::ReduceOp op) const {
  if (!ep_ || ep_->size() == 1) return x;
  Tensor t = Tensor::from_vector(std::vector<double>{x}, {1}, DType::f64);
  ep_->all_reduce(t, op)->wait();
  return t.to_vector<double>()[0];
}

double MegatronOptimizer::reduce_over_tp(double x, comm::ReduceOp op) const {
  for (const comm::ProcessGroupPtr& g : {tp_, pp_}) {
    if (!g || g->size() == 1) continue;
    Tensor t = Tensor::from_vector(std::vector<double>{x}, {1}, DType::f64);
    g->all_reduce(t, op)->wait();
    x = t.to_vector<double>()[0];
  }
  return x;
}

StepResult MegatronOptimizer::step(double lr, double weight_decay) {
  MG_CHECK(lr >= 0.0 && std::isfinite(lr), "optimizer.step: lr must be >= 0, got " << lr);
  MG_CHECK(weight_decay >= 0.0, "optimizer.step: weight_decay must be >= 0, got " << weight_decay);
  State& s = *state_;
  StepResult r;
  std::vector<Tensor> grads;
  for (const Piece& pc : s.pieces)
    if (pc.grad.numel() > 0) grads.push_back(pc.grad);

  // Unscale and check for inf/nan (Megatron's prepare_grads): only with a scaler, and then an
  // overflow skips the step whatever the precision. Sharded: found-inf is the max over shards.
  if (scaler_) {
    ops_.fill(s.found_inf, 0.0);
    if (!grads.empty())
      ops_.multi_tensor_scale(grads, static_cast<double>(scaler_->inv_scale()), s.found_inf);
    const double local_inf = s.found_inf.to_vector<float>()[0] > 0.0f ? 1.0 : 0.0;
    const bool found_inf =
        reduce_over_ep(
            reduce_over_tp(reduce_over_shards(local_inf, comm::ReduceOp::max), comm::ReduceOp::max),
            comm::ReduceOp::max) > 0.0;
    scaler_->update(found_inf);
    if (found_inf) {
      r.found_inf = true;
      return r;  // skipped: params, state and step count untouched
    }
  }

  // Pre-clip norm over every parameter once; computed even without clipping, for the log.
  // Sharded and/or TP: each rank's sum of squares over its pieces, summed over the shard group
  // (the pieces of all ranks partition the buffer) and over TP, then Megatron's
  // clip_grad_norm_fp32 coefficient.
  const std::span<const Tensor> cgrads(grads.data(), grads.size());
  const bool tp = tp_ && tp_->size() > 1;
  const bool pp = pp_ && pp_->size() > 1;
  // Expert parallelism: expert params (is_expert) differ across the expert group's ranks; their
  // squares are summed over it, apart from the dense ones (Megatron's expert optimizer norm).
  const bool ep = ep_ && ep_->size() > 1;
  if (!shard_ && !tp && !pp && !ep) {
    r.grad_norm = config_.clip_grad > 0.0 ? ops_.clip_grad_norm(grads, config_.clip_grad)
                                          : ops_.grad_norm(cgrads);
  } else {
    // TP: replicated params counted on TP rank 0 only, then the sum over TP.
    std::vector<Tensor> counted;
    std::vector<Tensor> experts;
    for (const Piece& pc : s.pieces) {
      if (pc.grad.numel() == 0 || params_[pc.param].shared) continue;
      if (ep && params_[pc.param].is_expert)
        experts.push_back(pc.grad);
      else if (!tp || params_[pc.param].tensor_parallel_dim >= 0 || tp_->rank() == 0)
        counted.push_back(pc.grad);
    }
    auto sum_sq_of = [this](const std::vector<Tensor>& ts) {
      if (ts.empty()) return 0.0;
      Tensor out = Tensor::empty({1}, DType::f64, buffer_.grads.device());
      ops_.l2_norm_sq(out, std::span<const Tensor>(ts.data(), ts.size()));
      return out.to_vector<double>()[0];
    };
    const double sum_sq = sum_sq_of(counted);
    const double expert_sq = ep ? reduce_over_ep(sum_sq_of(experts), comm::ReduceOp::sum) : 0.0;
    r.grad_norm = std::sqrt(
        reduce_over_tp(reduce_over_shards(sum_sq, comm::ReduceOp::sum), comm::ReduceOp::sum) +
        expert_sq);
    if (config_.clip_grad > 0.0) {
      const double coeff = config_.clip_grad / (r.grad_norm + 1.0e-6);
      Tensor none;
      if (coeff < 1.0 && !grads.empty()) ops_.multi_tensor_scale(grads, coeff, none);
    }
  }
  r.found_inf = any_nonfinite(r.grad_norm);
  if (config_.log_num_zeros_in_grad) {
    // Megatron's count_zeros_fp32: every parameter once (TP-replicated ones on TP rank 0), summed
    // over the shards and over TP. Counted after clipping (a scale keeps zeros zero).
    int64_t zeros = 0;
    for (const Piece& pc : s.pieces) {
      if (pc.grad.numel() == 0 || params_[pc.param].shared ||
          (tp && params_[pc.param].tensor_parallel_dim < 0 && tp_->rank() != 0))
        continue;
      for (float v : pc.grad.to_vector<float>()) zeros += v == 0.0f;
    }
    r.num_zeros_in_grad = static_cast<int64_t>(reduce_over_tp(
        reduce_over_shards(static_cast<double>(zeros), comm::ReduceOp::sum), comm::ReduceOp::sum));
  }

  const int64_t step = step_ + 1;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup& g = groups_[gi];
    g.lr = lr * g.lr_mult;
    g.weight_decay = weight_decay * g.wd_mult;
    if (config_.optimizer == "adam") {
      std::vector<ops::AdamParam> list;
      for (std::size_t k : s.group_pieces[gi]) {
        Piece& pc = s.pieces[k];
        if (pc.master.numel() == 0) continue;
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
    } else {
      // torch.optim.SGD (dampening 0, no nesterov): d = g + wd p; buf = d on the first step, else
      // momentum * buf + d; p -= lr * buf. The decay term is added to main_grad in place (the
      // loop zeroes the gradients before the next backward anyway).
      const double momentum = config_.sgd_momentum;
      for (std::size_t k : s.group_pieces[gi]) {
        Piece& pc = s.pieces[k];
        if (pc.master.numel() == 0) continue;
        Tensor& grad = pc.grad;
        if (g.weight_decay != 0.0) ops_.axpy(grad, pc.master, static_cast<float>(g.weight_decay));
        if (momentum != 0.0) {
          Tensor& buf = pc.momentum;
          if (!s.momentum_initialized) {
            buf.copy_(grad);
          } else {
            std::vector<Tensor> one{buf};
            Tensor none;
            ops_.multi_tensor_scale(one, momentum, none);
            ops_.axpy(buf, grad, 1.0f);
          }
          ops_.axpy(pc.master, buf, static_cast<float>(-g.lr));
        } else {
          ops_.axpy(pc.master, grad, static_cast<float>(-g.lr));
        }
      }
    }
  }
  if (config_.optimizer == "sgd") {
    s.momentum_initialized = config_.sgd_momentum != 0.0;
    if (s.separate_master) {  // master -> model
      if (!shard_)
        buffer_.params.copy_(s.master_flat);
      else
        for (Piece& pc : s.pieces) pc.model_param.copy_(pc.master);
    }
  }
  if (shard_ && shard_->gather_params) shard_->gather_params();
  step_ = step;
  r.success = true;
  return r;
}

namespace {

std::string ranges_str(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::string out;
  for (const auto& [a, b] : ranges) {
    if (!out.empty()) out += ',';  // not "," + std::string&&: a bogus -Wrestrict in GCC 12 at -O3
    out += std::to_string(a) + ":" + std::to_string(b);
  }
  return out;
}

}  // namespace

StateDict MegatronOptimizer::state_dict() const {
  const State& s = *state_;
  StateDict sd;
  sd.strings["optimizer"] = config_.optimizer;
  sd.numbers["step"] = static_cast<double>(step_);
  if (shard_) {
    const std::string prefix = "optimizer.shard.";
    if (config_.optimizer == "adam") {
      sd.tensors[prefix + "exp_avg"] = s.exp_avg_flat;
      sd.tensors[prefix + "exp_avg_sq"] = s.exp_avg_sq_flat;
    } else if (s.momentum_initialized) {
      sd.tensors[prefix + "momentum_buffer"] = s.momentum_flat;
    }
    if (s.separate_master) sd.tensors[prefix + "fp32_param"] = s.master_flat;
    sd.strings["shard.ranges"] = ranges_str(shard_->ranges);
    sd.numbers["shard.rank"] = shard_->group->rank();
    sd.numbers["shard.size"] = shard_->group->size();
  } else {
    for (const Piece& pc : s.pieces) {
      const std::string& name = params_[pc.param].name;
      if (config_.optimizer == "adam") {
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
    MG_CHECK(sd.string("optimizer") == config_.optimizer,
             "optimizer: the checkpoint holds " << sd.string("optimizer")
                                                << " state but this run uses --optimizer "
                                                << config_.optimizer);
  const double step = sd.number("step");
  MG_CHECK(step >= 0 && step == std::floor(step),
           "optimizer: checkpoint step must be a whole number >= 0, got " << step);
  const bool has_momentum = config_.optimizer == "sgd" && step > 0 && config_.sgd_momentum != 0.0;
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
    if (config_.optimizer == "adam") {
      copy_in(prefix + "exp_avg", s.exp_avg_flat);
      copy_in(prefix + "exp_avg_sq", s.exp_avg_sq_flat);
    } else if (has_momentum) {
      copy_in(prefix + "momentum_buffer", s.momentum_flat);
    }
    if (s.separate_master) copy_in(prefix + "fp32_param", s.master_flat);
  } else {
    MG_CHECK(!sd.has_string("shard.ranges"),
             "optimizer: the checkpoint holds distributed-optimizer shards ("
                 << sd.string("shard.ranges")
                 << "); load it with --use-distributed-optimizer and the same layout");
    for (Piece& pc : s.pieces) {
      const std::string& name = params_[pc.param].name;
      if (config_.optimizer == "adam") {
        copy_in(kStatePrefix + std::string("exp_avg.") + name, pc.exp_avg);
        copy_in(kStatePrefix + std::string("exp_avg_sq.") + name, pc.exp_avg_sq);
      } else if (has_momentum) {
        copy_in(kStatePrefix + std::string("momentum_buffer.") + name, pc.momentum);
      }
      if (s.separate_master) copy_in(kStatePrefix + std::string("fp32_param.") + name, pc.master);
    }
  }
  s.momentum_initialized = has_momentum;
  step_ = static_cast<int64_t>(step);
  // Megatron: a checkpoint without scaler state keeps the current scaler; scaler state without a
  // scaler here is ignored.
  const StateDict scaler_sd = sd.sub("grad_scaler.");
  if (scaler_ && !scaler_sd.empty()) scaler_->load_state_dict(scaler_sd);
}

void MegatronOptimizer::reload_model_params() {
  State& s = *state_;
  if (!s.separate_master) return;
  if (!shard_) {
    s.master_flat.copy_(buffer_.params);
  } else {
    for (Piece& pc : s.pieces) pc.master.copy_(pc.model_param);
  }
}

}  // namespace mg::optimizer
