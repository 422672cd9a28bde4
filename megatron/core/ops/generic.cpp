// Default grad_norm and clip_grad_norm (Megatron's get_grad_norm_fp32 and clip_grad_norm_fp32),
// composed from the l2_norm_sq and multi_tensor_scale ops of the platform that holds the gradients,
// and the all-reduces over the parallel groups GradNormArgs names (sums of squares as host f64
// scalars, in the order the args give). Which gradients count on which rank is the caller's choice
// (the optimizer's grads_for_norm); these functions only sum, reduce and scale.
#include "megatron/core/ops/generic.h"

#include <cmath>
#include <map>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/ops/validate.h"
#include "megatron/plugin/registry.h"

namespace mg::ops {

namespace {

// Non-empty tensors grouped by device, so each platform handles its own with one multi-tensor call.
std::map<std::pair<int, int>, std::vector<Tensor>> group_by_device(std::span<const Tensor> ts) {
  std::map<std::pair<int, int>, std::vector<Tensor>> by_device;
  for (const auto& t : ts)
    if (t.defined() && t.numel() > 0)
      by_device[{static_cast<int>(t.device().type), t.device().index}].push_back(t);
  return by_device;
}

Device device_of(const std::pair<int, int>& key) {
  return Device{static_cast<DeviceType>(key.first), key.second};
}

// This rank's sum of squares of `ts` (f64), one l2_norm_sq per device.
double local_sum_sq(std::span<const Tensor> ts) {
  double sum_sq = 0.0;
  for (auto& [key, list] : group_by_device(ts)) {
    const Device dev = device_of(key);
    Tensor out = Tensor::empty({1}, DType::f64, dev);
    plugin::ops_for(dev).l2_norm_sq(out, list);
    sum_sq += host_read<double>(out, HostSync::grad_norm)[0];
  }
  return sum_sq;
}

// The sum of a host scalar over `group` (identity without one, or with one rank).
double sum_over(comm::ProcessGroup* group, double x) {
  if (!group || group->size() == 1) return x;
  Tensor t = Tensor::from_vector(std::vector<double>{x}, {1}, DType::f64);
  group->all_reduce(t, comm::ReduceOp::sum)->wait();
  return t.to_vector<double>()[0];
}

double generic_grad_norm(std::span<const Tensor> grads, const GradNormArgs& args) {
  double sum_sq = local_sum_sq(grads);
  const double expert_sq = sum_over(
      args.expert_group, sum_over(args.expert_shard_group, local_sum_sq(args.expert_grads)));
  for (comm::ProcessGroup* g : args.groups) sum_sq = sum_over(g, sum_sq);
  return std::sqrt(sum_sq + expert_sq);  // + 0.0 without experts: exact
}

double generic_clip_grad_norm(std::span<Tensor> grads, std::span<const Tensor> grads_for_norm,
                              double max_norm, const GradNormArgs& args) {
  MG_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got " << max_norm);
  // Through the device's resolved table, so an overridden grad_norm is honoured.
  const double norm = plugin::ops_for(args.device).grad_norm(grads_for_norm, args);
  const double coeff = max_norm / (norm + 1.0e-6);  // Megatron's clip_grad_norm_fp32
  if (coeff < 1.0) {
    for (auto& [key, list] : group_by_device(grads)) {
      Tensor none;
      plugin::ops_for(device_of(key)).multi_tensor_scale(list, coeff, none);
    }
  }
  return norm;
}

// Every tensor defined and on `device` (the composed ops check the rest).
class OnDeviceOf final : public Placement {
 public:
  explicit OnDeviceOf(Device d) : d_(d) {}
  void check(const char* op, const char* name, const Tensor& t) const override {
    check_defined(op, name, t);
    MG_CHECK(t.device() == d_,
             op << ": " << name << " is on " << t.device().str() << ", x on " << d_.str());
  }

 private:
  Device d_;
};

}  // namespace

// The FP8 casts fused with SwiGLU, as the two ops: the operand written in x's dtype, then cast.
void generic_fp8_swiglu_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& x,
                                       const Tensor& scale) {
  const GemmDims d = validate_fp8_swiglu_cast_transpose(
      OnDeviceOf(x.device()), "fp8_swiglu_cast_transpose", q, qt, amax, Tensor(), x, scale);
  const OpTable& t = plugin::ops_for(x.device());
  Tensor y = Tensor::empty({d.m, d.n}, x.dtype(), x.device());
  t.swiglu_fwd(y, x);
  t.fp8_cast_transpose(q, qt, amax, y, scale);
}

void generic_fp8_dswiglu_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& dy,
                                        const Tensor& x, const Tensor& scale) {
  const GemmDims d = validate_fp8_swiglu_cast_transpose(
      OnDeviceOf(x.device()), "fp8_dswiglu_cast_transpose", q, qt, amax, dy, x, scale);
  const OpTable& t = plugin::ops_for(x.device());
  Tensor dx = Tensor::empty({d.m, d.n}, x.dtype(), x.device());
  t.swiglu_bwd(dx, dy, x);
  t.fp8_cast_transpose(q, qt, amax, dx, scale);
}

void generic_fp8_norm_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, Tensor& sum, Tensor& mean,
                                     Tensor& rstd, const Tensor& x, const Tensor& bias,
                                     const Tensor& residual, const Tensor& gamma,
                                     const Tensor& beta, const Tensor& scale,
                                     const DropoutArgs& dropout, const NormArgs& args,
                                     NormKind kind) {
  const GemmDims d =
      validate_fp8_norm_cast_transpose(OnDeviceOf(x.device()), q, qt, amax, sum, mean, rstd, x,
                                       bias, residual, gamma, beta, scale, dropout, args, kind);
  const OpTable& t = plugin::ops_for(x.device());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (residual.defined())
    t.bias_dropout_add_norm_fwd(y, sum, mean, rstd, x, bias, residual, gamma, beta, dropout, args,
                                kind);
  else if (kind == NormKind::layernorm)
    t.layernorm_fwd(y, mean, rstd, x, gamma, beta, args);
  else
    t.rmsnorm_fwd(y, rstd, x, gamma, args);
  t.fp8_cast_transpose(q, qt, amax, y.view({d.m, d.n}), scale);
}

void register_generic(plugin::Registry& r) {
  using plugin::Priority;
  r.register_op<OpId::grad_norm>(plugin::kGenericPlatform, &generic_grad_norm,
                                 "generic:l2_norm_sq+all_reduce", Priority::generic);
  r.register_op<OpId::clip_grad_norm>(plugin::kGenericPlatform, &generic_clip_grad_norm,
                                      "generic:grad_norm+multi_tensor_scale", Priority::generic);
  r.register_op<OpId::fp8_swiglu_cast_transpose>(
      plugin::kGenericPlatform, &generic_fp8_swiglu_cast_transpose,
      "generic:swiglu_fwd+fp8_cast_transpose", Priority::generic);
  r.register_op<OpId::fp8_dswiglu_cast_transpose>(
      plugin::kGenericPlatform, &generic_fp8_dswiglu_cast_transpose,
      "generic:swiglu_bwd+fp8_cast_transpose", Priority::generic);
  r.register_op<OpId::fp8_norm_cast_transpose>(
      plugin::kGenericPlatform, &generic_fp8_norm_cast_transpose, "generic:norm+fp8_cast_transpose",
      Priority::generic);
}

}  // namespace mg::ops
