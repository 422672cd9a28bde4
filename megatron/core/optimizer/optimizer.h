// MegatronOptimizer: Megatron's Float16OptimizerWithFloat16Params (bf16 / fp16 models: fp32 master
// weights) and FP32Optimizer (f32 / f64 models: the params are their own master weights) over the
// flat ParamAndGradBuffer, with Adam(W) through the `adamw_step` op or SGD with momentum
// (OptimizerType).
//
// One step (Megatron's order), each part its own function:
//   unscale_and_check_for_nan  [with a scaler] main_grads *= 1/loss_scale, found-inf maxed over
//                              the groups; the scaler updates; fp16 overflow -> skip (params,
//                              state and step count untouched)
//   get_grad_norm /            the pre-clip norm of every parameter counted once
//   clip_grad_norm             (Megatron's get_main_grads_for_grad_norm), through the op table's
//                              grad_norm slot, or its clip_grad_norm slot when clip_grad > 0
//                              (clip_grads.cpp)
//   count_zeros                [--log-num-zeros-in-grad] (clip_grads.cpp)
//   adam_update / sgd_update   per param group with lr * lr_mult, weight_decay * wd_mult
//   copy_main_params_to_model_params  (SGD; adamw_step writes the model weights itself), then the
//                              distributed optimizer's all-gather of the weights
// The caller then calls zero_grad() before the next backward, and multiplies its loss by
// loss_scale() before backward.
//
// Invariants: master weights, exp_avg, exp_avg_sq (and SGD momentum) are flat buffers of the
// buffer's length on the buffer's device, viewed at each Parameter's buffer_offset, so ZeRO later
// is offset arithmetic. Param groups follow Megatron's _get_param_groups: one group per distinct
// (wd_mult, lr_mult), wd_mult = 0 for no_weight_decay params (biases, norm weights).
// Distributed optimizer (ZeRO-1, ShardOptions): the optimizer owns only some element ranges of the
// flat buffer (this DP rank's chunk of every DDP bucket, megatron/core/distributed/); master
// weights and moments exist for those ranges only (one flat shard buffer, viewed per piece = a
// parameter's intersection with an owned range); unscale / found-inf, the grad norm and the zero
// count are reduced over the shard group so every element is counted exactly once; after a
// successful step `gather_params` all-gathers the updated model weights. Without ShardOptions
// every parameter is one piece and nothing is communicated (the grads are already all-reduced).
// Model parallelism (GradStatsGroups): the same statistics also reduce over TP, PP and the expert
// group. The grad norm always goes through the op table's slots, whatever the layout, so a
// plugin's override applies at scale (ops::GradNormArgs carries the groups).
// Checkpoints: optimizer_state_dict.cpp (the same keys and shapes with CPU offload).
// CPU offload (--optimizer-cpu-offload, --optimizer-offload-fraction f; Megatron's
// HybridDeviceOptimizer): with the buffers on a device, whole pieces in buffer order are taken
// for the host while fewer than f of this rank's optimizer elements are there; their master
// weights (also for f32 models), moments / momentum live in pinned host memory. Each step, after
// unscale / found-inf / grad norm / clipping / zero count on the device gradients (unchanged), the
// host pieces' gradients are copied to the host, stepped with the CPU platform's kernels (the same
// adamw_step arithmetic, vectorised and threaded) while the device steps its own pieces, and the
// updated weights copied back in the model dtype (--overlap-cpu-optimizer-d2h-h2d: the copies on
// threads of their own, pipelined run by run with the host update). With the buffers on the host
// it is the identity (the state is in host memory already), unless
// OptimizerConfig::offload_engine_on_host (tests).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/timer_hook.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/optimizer/grad_scaler.h"
#include "megatron/core/optimizer/optimizer_config.h"
#include "megatron/core/optimizer/state_dict.h"
#include "megatron/core/transformer/parameter.h"

namespace mg::optimizer {

struct ParamGroup {
  std::vector<std::size_t> params;  // indices into the Parameter vector, in its order
  double wd_mult = 1.0;             // 0 for the no-weight-decay group
  double lr_mult = 1.0;
  // What the last step() used: lr * lr_mult, weight_decay * wd_mult (for logging).
  double lr = 0.0;
  double weight_decay = 0.0;
};

// Megatron's no_weight_decay_cond / scale_lr_cond hooks. Defaults: wd_mult = 0 when
// Parameter::no_weight_decay, else 1; lr_mult = 1.
struct ParamGroupOptions {
  std::function<double(const transformer::Parameter&)> wd_mult;
  std::function<double(const transformer::Parameter&)> lr_mult;
};

struct StepResult {
  bool success = false;    // false: the step was skipped (fp16 overflow, or a non-finite grad
                           // norm in any precision); count it as skipped
  bool found_inf = false;  // some gradient was inf/nan (any precision); the step is then never
                           // applied (Megatron applies it in bf16/fp32; the loop stops or skips)
  // Global L2 norm of the unscaled gradients before clipping, also computed when clip_grad is 0
  // (Megatron then reports 0 / None); 0 when skipped (Megatron: None).
  double grad_norm = 0.0;
  std::optional<int64_t> num_zeros_in_grad;  // with config.log_num_zeros_in_grad
};

// The model-parallel groups the gradient statistics (grad norm, zero count, fp16's found-inf)
// reduce over, Megatron's grad_stats_parallel_group split by role. Null or size 1: that parallelism
// is off.
struct GradStatsGroups {
  // Tensor parallelism: each parameter counted once (PITFALLS #5): TP-sharded params
  // (tensor_parallel_dim >= 0) on every TP rank, replicated ones on TP rank 0 only. Their grads
  // must already be identical over TP (tensor_parallel::all_reduce_sequence_parallel_grads).
  comm::ProcessGroupPtr tp = nullptr;
  // Pipeline parallelism: each stage holds different parameters; Parameter::shared replicas (the
  // last stage's copy of the tied word embedding) are not counted (PITFALLS #4).
  comm::ProcessGroupPtr pp = nullptr;
  // Expert parallelism: the group whose ranks hold different experts (Megatron's expert
  // tensor-model-pipeline group, "tp-ep-pp" of the expert layout). The grad norm sums the squares
  // of expert parameters (Parameter::is_expert) over it, apart from the dense ones, and fp16's
  // found-inf is maxed over it. Null / size 1: experts count as dense parameters.
  comm::ProcessGroupPtr expert = nullptr;
};

// ZeRO-1 sharding of the optimizer state (see the file comment).
struct ShardOptions {
  // Disjoint [start, end) element ranges of the flat buffer this rank steps, ascending.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  comm::ProcessGroupPtr group;  // the ranks whose ranges partition the buffer (dp-cp)
  // Expert groups (EP, or TP with whole experts): the expert data-parallel group whose ranks
  // partition the expert buckets (null: expert parameters are not sharded apart). The grad norm
  // and zero count of expert pieces sum over it before the expert group.
  comm::ProcessGroupPtr expert_group;
  std::function<void()> gather_params;  // after a successful step: all-gather the model weights
  // --fp8-param-gather: after a successful step, before gather_params, this rank's master shards
  // (master_shards()) cast to the FP8 parameters (Megatron's quantize_param_shard).
  std::function<void()> quantize_params;
};

class MegatronOptimizer {
 public:
  // `params` and `buffer` must outlive the optimizer; every param / main_grad must be a view of
  // buffer.params / buffer.grads at its buffer_offset (checked, naming the parameter).
  // config.validate() is called; params_dtype must equal the buffer's dtype.
  MegatronOptimizer(const OptimizerConfig& config, std::vector<transformer::Parameter>& params,
                    transformer::ParamAndGradBuffer& buffer, const ops::OpTable& ops,
                    const ParamGroupOptions& groups = {}, std::optional<ShardOptions> shard = {},
                    GradStatsGroups grad_stats = {});
  ~MegatronOptimizer();
  MegatronOptimizer(const MegatronOptimizer&) = delete;
  MegatronOptimizer& operator=(const MegatronOptimizer&) = delete;

  // One optimizer step with the scheduler's current lr and weight decay (the loop calls
  // OptimizerParamScheduler::step(increment) after this, as Megatron's train_step does).
  StepResult step(double lr, double weight_decay);
  // Megatron's level-1 optimizer timers inside step(): optimizer-unscale-and-check-inf,
  // optimizer-clip-main-grad, optimizer-count-zeros, optimizer-inner-step,
  // optimizer-copy-main-to-model-params, params-all-gather (common/timer_hook.h); null: none.
  void set_timers(TimerHook* timers) { timers_ = timers; }
  // Zeroes the flat gradient buffer (all main_grads).
  void zero_grad();

  // The factor the loss is multiplied by before backward: the scaler's scale, else 1.
  float loss_scale() const;
  GradScaler* grad_scaler() { return scaler_.get(); }  // nullptr for bf16/fp32 without --loss-scale
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  int64_t num_steps() const { return step_; }  // successful steps so far (Adam's step count)
  const OptimizerConfig& config() const { return config_; }
  OptimizerType type() const { return type_; }
  // Master weights of parameter i (the param itself for f32/f64 models); not with ShardOptions.
  Tensor master_param(std::size_t i) const;
  bool sharded() const { return shard_.has_value(); }
  // This rank's master weights piece by piece (its shard under the distributed optimizer): the
  // parameter index, the flat-buffer offset and the 1-D master (the model param itself for f32 /
  // f64 models). --fp8-param-gather casts them to the FP8 parameters. Not with CPU offload.
  struct MasterShard {
    std::size_t param = 0;
    int64_t offset = 0;
    Tensor master;
  };
  std::vector<MasterShard> master_shards() const;
  // Megatron's calc_params_l2_norm (--log-params-norm): the L2 norm of the master weights (the
  // fp32 main params of a bf16/fp16 model), each parameter counted once over all ranks by the
  // grad norm's rule (distributed-optimizer shards summed, TP-replicated weights on TP rank 0, the
  // tied embedding's pipeline replica nowhere, routed experts over the expert group), through the
  // grad_norm op. A collective over the grad-stats groups: every rank calls it.
  double params_norm() const;
  // Bytes of optimizer state this rank holds in device memory (separate master weights and
  // moments / momentum); the whole state on the CPU platform.
  int64_t state_bytes() const;
  // --optimizer-cpu-offload: bytes of host memory the offloaded state takes (masters, moments,
  // and the gradient / model-weight staging), and the optimizer elements offloaded (0: off).
  int64_t host_state_bytes() const;
  int64_t offloaded_numel() const;
  // Tensors "optimizer.state.{exp_avg,exp_avg_sq,fp32_param,momentum_buffer}.<param name>"
  // (fp32_param only when the master weights are separate; views of live state, see
  // state_dict.h); sharded: the flat shards "optimizer.shard.{exp_avg,...}" instead, with string
  // "shard.ranges" and numbers "shard.rank" / "shard.size" (a load checks the same layout);
  // numbers "step", "grad_scaler.{scale,growth_tracker,hysteresis_tracker}"
  // (when there is a scaler), string "optimizer" (adam | sgd).
  StateDict state_dict() const;
  // Copies every entry back (converting dtype/device); missing or mis-shaped entries throw naming
  // the key. A checkpoint without grad_scaler.* keeps the current scaler (Megatron warns so).
  void load_state_dict(const StateDict& sd);
  // master <- model params (after the model was loaded without optimizer state: --no-load-optim,
  // --finetune). No-op when the params are their own master weights.
  void reload_model_params();

 private:
  struct State;
  // The parts of step(), in its order (Megatron's names).
  bool unscale_and_check_for_nan();  // needs a scaler; true: some grad is inf/nan on some rank
  double get_grad_norm();            // the op table's grad_norm (clip_grads.cpp)
  double clip_grad_norm(double max_norm);  // clip_grad_norm: clips, returns the pre-clip norm
  int64_t count_zeros() const;             // Megatron's count_zeros_fp32 (clip_grads.cpp)
  void adam_update(const ParamGroup& g, std::span<const std::size_t> pieces, int64_t step);
  void sgd_update(const ParamGroup& g, std::span<const std::size_t> pieces);
  void copy_main_params_to_model_params();
  // --optimizer-cpu-offload (State::offload_runs): device -> host gradients, host -> device
  // weights (the masters when from_master, else the model-dtype staging Adam wrote).
  void offload_grads_to_host();
  void copy_offloaded_params_to_device(bool from_master);
  // One param group's update over some of its pieces (adam_update / sgd_update).
  using UpdateFn = std::function<void(std::size_t group, std::span<const std::size_t> pieces)>;
  // --overlap-cpu-optimizer-d2h-h2d: the copies pipelined with the host update, run by run.
  void step_offloaded_overlapped(const UpdateFn& update);
  // Construction: Megatron's get_main_grads_for_grad_norm into State (clip_grads.cpp).
  void select_main_grads_for_grad_norm();
  ops::GradNormArgs grad_norm_args() const;
  // The expert data-parallel group when expert pieces are sharded over it (else null), and
  // whether a parameter's statistics are gathered apart from the dense ones (a routed expert
  // with an expert group, or sharded over the expert data-parallel group).
  comm::ProcessGroup* expert_shard_group() const;
  bool experts_apart(const transformer::Parameter& p) const;
  // A host scalar reduced over the grad-stats groups (shards, TP, PP, in that order).
  double reduce_over_grad_stats_groups(double x, comm::ReduceOp op) const;

  OptimizerConfig config_;
  OptimizerType type_;
  std::vector<transformer::Parameter>& params_;
  transformer::ParamAndGradBuffer& buffer_;
  const ops::OpTable& ops_;
  std::unique_ptr<GradScaler> scaler_;
  std::vector<ParamGroup> groups_;
  std::unique_ptr<State> state_;
  std::optional<ShardOptions> shard_;
  // GradStatsGroups, each kept only when of size > 1 (else null).
  comm::ProcessGroupPtr tp_, pp_, expert_;
  // The shard group, TP, PP (those of size > 1), in the order every reduction over them runs.
  std::vector<comm::ProcessGroup*> grad_stats_groups_;
  int64_t step_ = 0;
  TimerHook* timers_ = nullptr;  // set_timers
};

}  // namespace mg::optimizer
