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

struct MegatronOptimizer::State {
  bool separate_master = false;  // bf16/fp16 model: f32 master weights of their own
  Tensor master_flat;            // [P] f32 (or the params buffer itself)
  Tensor exp_avg_flat, exp_avg_sq_flat, momentum_flat;
  bool momentum_initialized = false;  // torch SGD creates the buffer on the first step
  std::vector<Tensor> master, exp_avg, exp_avg_sq, momentum, grads;  // per Parameter
  Tensor found_inf;                                                  // [1] f32
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
                                     const ops::OpTable& ops, const ParamGroupOptions& group_opts)
    : config_(config),
      params_(params),
      buffer_(buffer),
      ops_(ops),
      state_(std::make_unique<State>()) {
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

  // Master weights and optimizer state: flat buffers beside the model's, viewed per parameter.
  State& s = *state_;
  const Device dev = buffer_.params.device();
  const int64_t n = buffer_.params.numel();
  s.separate_master = config_.params_dtype == DType::bf16 || config_.params_dtype == DType::f16;
  const DType master_dtype = s.separate_master ? DType::f32 : config_.params_dtype;
  if (s.separate_master) {
    s.master_flat = Tensor::empty({n}, DType::f32, dev);
    s.master_flat.copy_(buffer_.params);
  } else {
    s.master_flat = buffer_.params;
  }
  if (config_.optimizer == "adam") {
    s.exp_avg_flat = Tensor::zeros({n}, master_dtype, dev);
    s.exp_avg_sq_flat = Tensor::zeros({n}, master_dtype, dev);
  } else {
    s.momentum_flat = Tensor::zeros({n}, master_dtype, dev);
  }
  for (const Parameter& p : params_) {
    const Shape& shape = p.param.shape();
    s.master.push_back(view_of(s.master_flat, p.buffer_offset, shape));
    s.grads.push_back(p.main_grad);
    if (s.exp_avg_flat.defined()) {
      s.exp_avg.push_back(view_of(s.exp_avg_flat, p.buffer_offset, shape));
      s.exp_avg_sq.push_back(view_of(s.exp_avg_sq_flat, p.buffer_offset, shape));
    }
    if (s.momentum_flat.defined())
      s.momentum.push_back(view_of(s.momentum_flat, p.buffer_offset, shape));
  }
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
  return state_->master[i];
}

void MegatronOptimizer::zero_grad() {
  buffer_.grads.zero_();
}

StepResult MegatronOptimizer::step(double lr, double weight_decay) {
  MG_CHECK(lr >= 0.0 && std::isfinite(lr), "optimizer.step: lr must be >= 0, got " << lr);
  MG_CHECK(weight_decay >= 0.0, "optimizer.step: weight_decay must be >= 0, got " << weight_decay);
  State& s = *state_;
  StepResult r;
  std::vector<Tensor> grads;
  for (const Tensor& g : s.grads)
    if (g.numel() > 0) grads.push_back(g);

  // Unscale and check for inf/nan (Megatron's prepare_grads): only with a scaler, and then an
  // overflow skips the step whatever the precision.
  if (scaler_) {
    ops_.fill(s.found_inf, 0.0);
    ops_.multi_tensor_scale(grads, static_cast<double>(scaler_->inv_scale()), s.found_inf);
    const bool found_inf = s.found_inf.to_vector<float>()[0] > 0.0f;
    scaler_->update(found_inf);
    if (found_inf) {
      r.found_inf = true;
      return r;  // skipped: params, state and step count untouched
    }
  }

  // Pre-clip norm over every parameter once; computed even without clipping, for the log.
  const std::span<const Tensor> cgrads(grads.data(), grads.size());
  r.grad_norm = config_.clip_grad > 0.0 ? ops_.clip_grad_norm(grads, config_.clip_grad)
                                        : ops_.grad_norm(cgrads);
  r.found_inf = any_nonfinite(r.grad_norm);
  if (config_.log_num_zeros_in_grad) {
    int64_t zeros = 0;
    for (const Tensor& g : grads)
      for (float v : g.to_vector<float>()) zeros += v == 0.0f;
    r.num_zeros_in_grad = zeros;
  }

  const int64_t step = step_ + 1;
  for (ParamGroup& g : groups_) {
    g.lr = lr * g.lr_mult;
    g.weight_decay = weight_decay * g.wd_mult;
    if (config_.optimizer == "adam") {
      std::vector<ops::AdamParam> list;
      for (std::size_t i : g.params) {
        if (s.master[i].numel() == 0) continue;
        list.push_back({s.master[i], s.grads[i], s.exp_avg[i], s.exp_avg_sq[i],
                        s.separate_master ? params_[i].param : Tensor()});
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
      std::vector<Tensor> bufs;
      for (std::size_t i : g.params) {
        if (s.master[i].numel() == 0) continue;
        Tensor& grad = s.grads[i];
        if (g.weight_decay != 0.0) ops_.axpy(grad, s.master[i], static_cast<float>(g.weight_decay));
        if (momentum != 0.0) {
          Tensor& buf = s.momentum[i];
          if (!s.momentum_initialized) {
            buf.copy_(grad);
          } else {
            std::vector<Tensor> one{buf};
            Tensor none;
            ops_.multi_tensor_scale(one, momentum, none);
            ops_.axpy(buf, grad, 1.0f);
          }
          ops_.axpy(s.master[i], buf, static_cast<float>(-g.lr));
        } else {
          ops_.axpy(s.master[i], grad, static_cast<float>(-g.lr));
        }
      }
    }
  }
  if (config_.optimizer == "sgd") {
    s.momentum_initialized = config_.sgd_momentum != 0.0;
    if (s.separate_master) buffer_.params.copy_(s.master_flat);  // master -> model
  }
  step_ = step;
  r.success = true;
  return r;
}

StateDict MegatronOptimizer::state_dict() const {
  const State& s = *state_;
  StateDict sd;
  sd.strings["optimizer"] = config_.optimizer;
  sd.numbers["step"] = static_cast<double>(step_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    if (config_.optimizer == "adam") {
      sd.tensors[kStatePrefix + std::string("exp_avg.") + name] = s.exp_avg[i];
      sd.tensors[kStatePrefix + std::string("exp_avg_sq.") + name] = s.exp_avg_sq[i];
    } else if (s.momentum_initialized) {
      sd.tensors[kStatePrefix + std::string("momentum_buffer.") + name] = s.momentum[i];
    }
    if (s.separate_master)
      sd.tensors[kStatePrefix + std::string("fp32_param.") + name] = s.master[i];
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
  auto load = [&](const std::string& kind, std::size_t i, Tensor& dst) {
    const std::string key = kStatePrefix + kind + "." + params_[i].name;
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
  const bool has_momentum = config_.optimizer == "sgd" && step > 0 && config_.sgd_momentum != 0.0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (config_.optimizer == "adam") {
      load("exp_avg", i, s.exp_avg[i]);
      load("exp_avg_sq", i, s.exp_avg_sq[i]);
    } else if (has_momentum) {
      load("momentum_buffer", i, s.momentum[i]);
    }
    if (s.separate_master) load("fp32_param", i, s.master[i]);
  }
  s.momentum_initialized = has_momentum;
  step_ = static_cast<int64_t>(step);
  // Megatron: a checkpoint without scaler state keeps the current scaler; scaler state without a
  // scaler here is ignored.
  const StateDict scaler_sd = sd.sub("grad_scaler.");
  if (scaler_ && !scaler_sd.empty()) scaler_->load_state_dict(scaler_sd);
}

void MegatronOptimizer::reload_model_params() {
  if (state_->separate_master) state_->master_flat.copy_(buffer_.params);
}

}  // namespace mg::optimizer
