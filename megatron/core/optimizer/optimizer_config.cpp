// OptimizerConfig::validate (Megatron's argument checks for the optimizer, with the values) and the
// --optimizer names.
#include "megatron/core/optimizer/optimizer_config.h"

#include <cmath>

#include "megatron/core/common/error.h"

namespace mg::optimizer {

OptimizerType parse_optimizer_type(std::string_view name) {
  for (OptimizerType t : {OptimizerType::adam, OptimizerType::sgd})
    if (name == optimizer_type_name(t)) return t;
  MG_THROW("OptimizerConfig: optimizer '" << name << "' is not supported; valid values: adam, sgd");
}

std::string_view optimizer_type_name(OptimizerType type) {
  switch (type) {
    case OptimizerType::adam:
      return "adam";
    case OptimizerType::sgd:
      return "sgd";
  }
  MG_THROW("optimizer_type_name: unknown OptimizerType " << static_cast<int>(type));
}

void OptimizerConfig::validate() const {
  (void)type();  // throws on an unknown --optimizer
  MG_CHECK(!(fp16 && bf16), "OptimizerConfig: fp16 and bf16 are both set; choose one");
  const DType want = fp16 ? DType::f16 : bf16 ? DType::bf16 : params_dtype;
  MG_CHECK(params_dtype == want, "OptimizerConfig: params_dtype "
                                     << dtype_name(params_dtype) << " does not match "
                                     << (fp16 ? "fp16" : "bf16") << " (expected "
                                     << dtype_name(want) << ")");
  MG_CHECK(params_dtype == DType::f32 || params_dtype == DType::f64 || fp16 || bf16,
           "OptimizerConfig: params_dtype " << dtype_name(params_dtype)
                                            << " needs fp16/bf16 set, or must be f32/f64");
  if (lr)
    MG_CHECK(*lr >= 0.0 && std::isfinite(*lr), "OptimizerConfig: lr must be >= 0, got " << *lr);
  if (min_lr) {
    MG_CHECK(*min_lr >= 0.0, "OptimizerConfig: min_lr must be >= 0, got " << *min_lr);
    if (lr)
      MG_CHECK(*min_lr <= *lr,
               "OptimizerConfig: min_lr " << *min_lr << " is larger than lr " << *lr);
  }
  MG_CHECK(weight_decay >= 0.0, "OptimizerConfig: weight_decay must be >= 0, got " << weight_decay);
  MG_CHECK(adam_beta1 >= 0.0 && adam_beta1 < 1.0,
           "OptimizerConfig: adam_beta1 must be in [0, 1), got " << adam_beta1);
  MG_CHECK(adam_beta2 >= 0.0 && adam_beta2 < 1.0,
           "OptimizerConfig: adam_beta2 must be in [0, 1), got " << adam_beta2);
  MG_CHECK(adam_eps >= 0.0, "OptimizerConfig: adam_eps must be >= 0, got " << adam_eps);
  MG_CHECK(sgd_momentum >= 0.0, "OptimizerConfig: sgd_momentum must be >= 0, got " << sgd_momentum);
  MG_CHECK(clip_grad >= 0.0, "OptimizerConfig: clip_grad must be >= 0, got " << clip_grad);
  if (loss_scale)
    MG_CHECK(*loss_scale > 0.0 && std::isfinite(*loss_scale),
             "OptimizerConfig: loss_scale must be > 0, got " << *loss_scale);
  MG_CHECK(min_loss_scale > 0.0,
           "OptimizerConfig: min_loss_scale must be > 0, got " << min_loss_scale);
  MG_CHECK(min_loss_scale <= initial_loss_scale,
           "OptimizerConfig: min_loss_scale " << min_loss_scale << " is larger than "
                                              << "initial_loss_scale " << initial_loss_scale);
  MG_CHECK(loss_scale_window > 0,
           "OptimizerConfig: loss_scale_window must be > 0, got " << loss_scale_window);
  MG_CHECK(hysteresis > 0, "OptimizerConfig: hysteresis must be > 0, got " << hysteresis);
  MG_CHECK(optimizer_offload_fraction >= 0.0 && optimizer_offload_fraction <= 1.0,
           "--optimizer-offload-fraction must be in [0, 1], got " << optimizer_offload_fraction);
  MG_CHECK(!overlap_cpu_optimizer_d2h_h2d || optimizer_cpu_offload,
           "--overlap-cpu-optimizer-d2h-h2d overlaps the copies of --optimizer-cpu-offload; pass "
           "that too, or drop it");
}

}  // namespace mg::optimizer
