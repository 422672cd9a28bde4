// OptimizerConfig: Megatron-Core's OptimizerConfig (megatron/core/optimizer/optimizer_config.py),
// the fields the single-process optimizer uses, with Megatron's names and defaults.
//
// Precision: fp16 -> Float16 optimizer with a dynamic loss scaler (or a constant one when
// loss_scale is set); bf16 -> Float16 optimizer with fp32 master weights and no scaler (a constant
// one when loss_scale is set); neither -> FP32 optimizer (params are their own master weights).
// Not here: distributed-optimizer and precision-aware-optimizer options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "megatron/core/tensor/dtype.h"

namespace mg::optimizer {

// The update rule (--optimizer): Adam(W) through the adamw_step op, or torch's SGD with momentum.
enum class OptimizerType : uint8_t { adam, sgd };
// "adam" | "sgd" (exactly, as the flag and the checkpoint's "optimizer" entry spell them); anything
// else throws naming the value and the valid ones.
OptimizerType parse_optimizer_type(std::string_view name);
std::string_view optimizer_type_name(OptimizerType type);

struct OptimizerConfig {
  std::string optimizer = "adam";  // --optimizer: adam | sgd (type() parses it)
  std::optional<double> lr;        // --lr (the scheduler's max_lr; step() takes the current lr)
  std::optional<double> min_lr;    // --min-lr
  double weight_decay = 0.01;      // --weight-decay

  bool fp16 = false;                         // --fp16
  bool bf16 = false;                         // --bf16
  DType params_dtype = DType::f32;           // f16 with fp16, bf16 with bf16 (Megatron derives it)
  std::optional<double> loss_scale;          // --loss-scale: static scale; unset -> dynamic (fp16)
  double initial_loss_scale = 4294967296.0;  // --initial-loss-scale, 2^32
  double min_loss_scale = 1.0;               // --min-loss-scale
  int64_t loss_scale_window = 1000;          // --loss-scale-window (growth interval)
  int64_t hysteresis = 2;                    // --hysteresis

  double adam_beta1 = 0.9;             // --adam-beta1
  double adam_beta2 = 0.999;           // --adam-beta2
  double adam_eps = 1e-8;              // --adam-eps
  bool decoupled_weight_decay = true;  // AdamW (Megatron's default); false: L2 added to the grad
  double sgd_momentum = 0.9;           // --sgd-momentum

  double clip_grad = 1.0;              // --clip-grad (0 disables clipping)
  bool log_num_zeros_in_grad = false;  // --log-num-zeros-in-grad
  // --optimizer-cpu-offload / --optimizer-offload-fraction (Megatron's): master weights and
  // moments (that fraction of them) in host memory, the update on the host (optimizer.h). On the
  // CPU platform they are there already: the identity (the trainer says so).
  bool optimizer_cpu_offload = false;
  double optimizer_offload_fraction = 1.0;
  // --overlap-cpu-optimizer-d2h-h2d: the gradient and weight copies of the offloaded part run on
  // threads of their own, pipelined with the host update (same results).
  bool overlap_cpu_optimizer_d2h_h2d = false;
  // Tests only (no flag): run the offload engine although the buffers are host memory (the
  // copies are then memcpy), to compare it with the normal optimizer on the CPU platform.
  bool offload_engine_on_host = false;

  OptimizerType type() const { return parse_optimizer_type(optimizer); }

  // Throws naming the offending values: unknown optimizer, fp16 with bf16, params_dtype not
  // matching the flags, betas outside [0, 1), negative eps / weight decay / clip, bad scaler args.
  void validate() const;
};

}  // namespace mg::optimizer
