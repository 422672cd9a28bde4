// MegatronOptimizer's gradient statistics, Megatron's optimizer/clip_grads.py: which gradients the
// norm counts on this rank (get_main_grads_for_grad_norm), the norm and the clipping through the op
// table's grad_norm / clip_grad_norm slots (their generic implementations, get_grad_norm_fp32 and
// clip_grad_norm_fp32, are in megatron/core/ops/generic.cpp), and count_zeros_fp32.
//
// Every parameter is counted exactly once over all ranks: the distributed optimizer's pieces
// partition the buffer over the shard group; TP-sharded parameters count on every TP rank and
// TP-replicated ones on TP rank 0 only; the pipeline's replica of the tied embedding
// (Parameter::shared) nowhere; routed experts under expert parallelism apart, over the expert
// group. The slots are called on every layout, one rank or many, so a platform's or plugin's
// override always applies; the groups travel in ops::GradNormArgs.
#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer/optimizer_state.h"

namespace mg::optimizer {

namespace {

// TP-replicated parameters are counted on TP rank 0 only (their grads are equal over TP).
bool counted_on_this_tp_rank(const transformer::Parameter& p, const comm::ProcessGroup* tp) {
  return !tp || p.tensor_parallel_dim >= 0 || tp->rank() == 0;
}

// Expert parameters replicated over the expert-TP group (linear_fc2.bias under ETP) count on ETP
// rank 0 only.
bool counted_on_this_etp_rank(const transformer::Parameter& p) {
  return p.tensor_parallel_dim >= 0 || p.expert_tp_rank == 0;
}

}  // namespace

comm::ProcessGroup* MegatronOptimizer::expert_shard_group() const {
  return shard_ && shard_->expert_group && shard_->expert_group->size() > 1
             ? shard_->expert_group.get()
             : nullptr;
}

bool MegatronOptimizer::experts_apart(const transformer::Parameter& p) const {
  return p.is_expert && (expert_ || expert_shard_group());
}

void MegatronOptimizer::select_main_grads_for_grad_norm() {
  State& s = *state_;
  for (const Piece& pc : s.pieces) {
    const transformer::Parameter& p = params_[pc.param];
    if (pc.grad.numel() == 0 || p.shared) continue;
    if (experts_apart(p)) {
      if (counted_on_this_etp_rank(p)) s.expert_grads_for_norm.push_back(pc.grad);
    } else if (counted_on_this_tp_rank(p, tp_.get())) {
      s.grads_for_norm.push_back(pc.grad);
    }
  }
}

ops::GradNormArgs MegatronOptimizer::grad_norm_args() const {
  ops::GradNormArgs args;
  args.groups = grad_stats_groups_;
  args.expert_grads = state_->expert_grads_for_norm;
  args.expert_group = expert_.get();
  args.expert_shard_group = expert_shard_group();
  args.device = buffer_.grads.device();
  return args;
}

double MegatronOptimizer::get_grad_norm() {
  return ops_.grad_norm(state_->grads_for_norm, grad_norm_args());
}

double MegatronOptimizer::clip_grad_norm(double max_norm) {
  State& s = *state_;
  return ops_.clip_grad_norm(s.grads, s.grads_for_norm, max_norm, grad_norm_args());
}

double MegatronOptimizer::params_norm() const {
  const State& s = *state_;
  std::vector<Tensor> dense, expert;
  for (const Piece& pc : s.pieces) {
    const transformer::Parameter& p = params_[pc.param];
    if (pc.master.numel() == 0 || p.shared) continue;
    // Offloaded masters: the model weights are the same values for f32/f64 models; separate
    // (f32) masters are copied to the device for the norm (transient, with --log-params-norm).
    Tensor master = pc.master;
    if (pc.on_host)
      master = s.separate_master ? pc.master.to(buffer_.params.device()) : pc.model_param;
    if (experts_apart(p)) {
      if (counted_on_this_etp_rank(p)) expert.push_back(master);
    } else if (counted_on_this_tp_rank(p, tp_.get()))
      dense.push_back(master);
  }
  ops::GradNormArgs args = grad_norm_args();
  args.expert_grads = expert;
  return ops_.grad_norm(dense, args);
}

// Megatron's count_zeros_fp32: every parameter once (TP-replicated ones on TP rank 0, replicas of
// the tied embedding nowhere), summed over the shards, TP and PP; routed experts held apart (as
// for the grad norm) summed over the expert shard group and the expert group. Counted after
// clipping (a scale keeps zeros zero).
int64_t MegatronOptimizer::count_zeros() const {
  const State& s = *state_;
  int64_t zeros = 0, expert_zeros = 0;
  for (const Piece& pc : s.pieces) {
    const transformer::Parameter& p = params_[pc.param];
    if (pc.grad.numel() == 0 || p.shared) continue;
    const bool apart = experts_apart(p);
    if (!apart && !counted_on_this_tp_rank(p, tp_.get())) continue;
    int64_t& n = apart ? expert_zeros : zeros;
    for (float v : host_read<float>(pc.grad, HostSync::num_zeros)) n += v == 0.0f;
  }
  double experts = static_cast<double>(expert_zeros);
  for (comm::ProcessGroup* g : {expert_shard_group(), expert_.get()})
    if (g) experts = detail::all_reduce_scalar(g, experts, comm::ReduceOp::sum);
  return static_cast<int64_t>(
      reduce_over_grad_stats_groups(static_cast<double>(zeros), comm::ReduceOp::sum) + experts);
}

}  // namespace mg::optimizer
