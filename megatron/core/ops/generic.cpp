// Default grad_norm and clip_grad_norm, composed from the l2_norm_sq and multi_tensor_scale ops of
// the platform that holds the gradients. Single process: the distributed issue adds the reductions
// over the data/model-parallel groups (counting every parameter exactly once).
#include "megatron/core/ops/generic.h"

#include <cmath>
#include <map>
#include <vector>

#include "megatron/core/ops/ops.h"
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

double generic_grad_norm(std::span<const Tensor> grads) {
  double sum_sq = 0.0;
  for (auto& [key, list] : group_by_device(grads)) {
    const Device dev = device_of(key);
    Tensor out = Tensor::empty({1}, DType::f64, dev);
    plugin::ops_for(dev).l2_norm_sq(out, list);
    sum_sq += out.to_vector<double>()[0];
  }
  return std::sqrt(sum_sq);
}

double generic_clip_grad_norm(std::span<Tensor> grads, double max_norm) {
  MG_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got " << max_norm);
  if (grads.empty()) return 0.0;
  // Through the resolved table, so an overridden grad_norm is honoured.
  const std::span<const Tensor> all(grads.data(), grads.size());
  const double norm = plugin::ops_for(grads.front().device()).grad_norm(all);
  const double coeff = max_norm / (norm + 1.0e-6);  // Megatron's clip_grad_norm_fp32
  if (coeff < 1.0) {
    for (auto& [key, list] : group_by_device(grads)) {
      Tensor none;
      plugin::ops_for(device_of(key)).multi_tensor_scale(list, coeff, none);
    }
  }
  return norm;
}

}  // namespace

void register_generic(plugin::Registry& r) {
  using plugin::Priority;
  r.register_op<OpId::grad_norm>(plugin::kGenericPlatform, &generic_grad_norm, "generic:l2_norm_sq",
                                 Priority::generic);
  r.register_op<OpId::clip_grad_norm>(plugin::kGenericPlatform, &generic_clip_grad_norm,
                                      "generic:grad_norm+multi_tensor_scale", Priority::generic);
}

}  // namespace mg::ops
