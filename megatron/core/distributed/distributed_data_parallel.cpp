// Bucketed gradient reduction and parameter gathering over the data-parallel group
// (distributed_data_parallel.h).
#include "megatron/core/distributed/distributed_data_parallel.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/common/error.h"

namespace mg::distributed {

struct DistributedDataParallel::BucketState {
  int pending = 0;  // params not yet ready in this backward
  bool launched = false;
  comm::WorkPtr work;
  Tensor rs_out;              // [shard_size] reduce-scatter output (distributed optimizer)
  Tensor staging;             // [dp * shard_size] zero-padded copy, only for an uneven bucket
  Tensor gather_in;           // [shard_size] params chunk for the all-gather
  Tensor gather_staging;      // [dp * shard_size] params, only for an uneven bucket
  comm::WorkPtr gather_work;  // the bucket's parameter all-gather while in flight
};

DistributedDataParallel::DistributedDataParallel(const DistributedDataParallelConfig& config,
                                                 std::vector<transformer::Parameter>& params,
                                                 transformer::ParamAndGradBuffer& buffer,
                                                 const ops::OpTable& ops,
                                                 comm::ProcessGroupPtr dp_group,
                                                 comm::ProcessGroupPtr expert_dp_group)
    : config_(config), params_(params), buffer_(buffer), ops_(ops), dp_group_(std::move(dp_group)) {
  config_.validate();
  MG_CHECK(dp_group_, "DistributedDataParallel: no data-parallel group");
  MG_CHECK(buffer_.grads.defined() && buffer_.grads.dim() == 1 &&
               buffer_.params.numel() == buffer_.grads.numel(),
           "DistributedDataParallel: the flat buffers must be 1-D and of one length");
  const int dp = dp_group_->size();
  int64_t bucket_size = 0;  // 0: one bucket
  if (config_.bucket_size)
    bucket_size = *config_.bucket_size;
  else if (config_.overlap_grad_reduce)
    bucket_size = std::max<int64_t>(40000000, int64_t{1000000} * dp);  // Megatron's default
  bool any_expert = false;
  for (const auto& p : params_) any_expert |= p.is_expert;
  if (any_expert && expert_dp_group && expert_dp_group->ranks() != dp_group_->ranks())
    expert_dp_group_ = std::move(expert_dp_group);
  if (!expert_dp_group_) {
    buckets_ = build_buckets(params_, buffer_.grads.numel(), bucket_size, dp,
                             config_.use_distributed_optimizer);
  } else {
    MG_CHECK(!config_.use_distributed_optimizer,
             "--use-distributed-optimizer with expert parameters reduced over an expert "
             "data-parallel group of "
                 << expert_dp_group_->size() << " ranks (data-parallel group " << dp
                 << ") is not supported yet; drop --use-distributed-optimizer");
    // Runs of expert / dense parameters in buffer order, each bucketed on its own.
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i].param.numel() > 0) order.push_back(i);
    std::sort(order.begin(), order.end(), [this](std::size_t a, std::size_t b) {
      return params_[a].buffer_offset < params_[b].buffer_offset;
    });
    std::size_t i = 0;
    while (i < order.size()) {
      const bool expert = params_[order[i]].is_expert;
      const int64_t lo = params_[order[i]].buffer_offset;
      std::size_t j = i;
      while (j < order.size() && params_[order[j]].is_expert == expert) ++j;
      const transformer::Parameter& last = params_[order[j - 1]];
      const int64_t hi = last.buffer_offset + last.param.numel();
      for (GradBucket& b :
           build_buckets(params_, buffer_.grads.numel(), bucket_size, dp, false, lo, hi)) {
        b.expert = expert;
        buckets_.push_back(std::move(b));
      }
      i = j;
    }
  }
  state_.resize(buckets_.size());
  buckets_of_param_.resize(params_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t i : buckets_[b].params) buckets_of_param_[i].push_back(b);
  param_ready_.assign(params_.size(), false);
  reset_readiness();
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& s : state_)
    for (comm::WorkPtr* w : {&s.work, &s.gather_work})
      if (*w) {
        try {
          (*w)->wait();
        } catch (...) {  // a destructor must not throw; the error surfaced elsewhere
        }
      }
}

void DistributedDataParallel::reset_readiness() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    state_[b].pending = static_cast<int>(buckets_[b].params.size());
    state_[b].launched = false;
  }
  std::fill(param_ready_.begin(), param_ready_.end(), false);
}

void DistributedDataParallel::param_grad_ready(std::size_t i) {
  if (!is_last_microbatch_ || !config_.overlap_grad_reduce) return;
  MG_CHECK(i < params_.size(), "DistributedDataParallel: grad-ready for parameter index "
                                   << i << " of " << params_.size());
  MG_CHECK(!param_ready_[i], "DistributedDataParallel: the gradient of '"
                                 << params_[i].name
                                 << "' was reported ready twice in one backward");
  param_ready_[i] = true;
  for (std::size_t b : buckets_of_param_[i]) {
    BucketState& s = state_[b];
    MG_CHECK(!s.launched, "DistributedDataParallel: bucket " << b << " was launched before '"
                                                             << params_[i].name << "' was ready");
    if (--s.pending == 0) {
      launch(b);
      ++launched_in_backward_;
    }
  }
}

void DistributedDataParallel::launch(std::size_t bi) {
  const GradBucket& b = buckets_[bi];
  BucketState& s = state_[bi];
  s.launched = true;
  Tensor grads = buffer_.grads.slice(b.start, b.numel());
  const int dp = dp_group_->size();
  if (config_.check_for_nan_in_grad) {
    Tensor out = Tensor::empty({1}, DType::f64, grads.device());
    ops_.l2_norm_sq(out, std::span<const Tensor>(&grads, 1));
    const double norm = std::sqrt(out.to_vector<double>()[0]);
    MG_CHECK(std::isfinite(norm),
             "Rank " << dp_group_->ranks()[dp_group_->rank()] << ": found NaN in local grad norm ("
                     << norm << ") of bucket " << bi << " (elements [" << b.start << ", " << b.end
                     << "), first param '" << params_[b.params.front()].name
                     << "') in backward pass before data-parallel "
                        "communication collective");
  }
  if (b.expert) {  // Megatron: expert grads scaled by 1/dp, summed over the expert-DP group
    if (dp > 1 && !config_.calculate_per_token_loss) {
      Tensor none;
      ops_.multi_tensor_scale(std::span<Tensor>(&grads, 1), 1.0 / dp, none);
    }
    if (expert_dp_group_->size() > 1) s.work = expert_dp_group_->all_reduce(grads);
    return;
  }
  if (dp == 1) return;  // nothing to reduce, and 1/dp = 1
  comm::ReduceOp op = comm::ReduceOp::sum;
  if (!config_.calculate_per_token_loss) {
    if (config_.average_in_collective) {
      op = comm::ReduceOp::avg;
    } else {
      Tensor none;
      ops_.multi_tensor_scale(std::span<Tensor>(&grads, 1), 1.0 / dp, none);
    }
  }
  if (!config_.use_distributed_optimizer) {
    s.work = dp_group_->all_reduce(grads, op);
    return;
  }
  if (!s.rs_out.defined()) s.rs_out = Tensor::empty({b.shard_size}, grads.dtype(), grads.device());
  if (b.padded_numel(dp) == b.numel()) {
    s.work = dp_group_->reduce_scatter(s.rs_out, grads, op);
  } else {
    if (!s.staging.defined())
      s.staging = Tensor::zeros({b.padded_numel(dp)}, grads.dtype(), grads.device());
    Tensor head = s.staging.slice(0, b.numel());
    head.copy_(grads);
    s.work = dp_group_->reduce_scatter(s.rs_out, s.staging, op);
  }
}

void DistributedDataParallel::start_grad_sync() {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (!state_[b].launched) {
      launch(b);
      ++launched_after_backward_;
    }
}

void DistributedDataParallel::finish_grad_sync() {
  start_grad_sync();
  const int rank = dp_group_->rank();
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    BucketState& s = state_[bi];
    if (!s.work) continue;
    s.work->wait();
    s.work.reset();
    if (config_.use_distributed_optimizer) {
      const auto [lo, hi] = buckets_[bi].shard_range(rank);
      if (hi > lo) {
        Tensor dst = buffer_.grads.slice(lo, hi - lo);
        dst.copy_(s.rs_out.slice(0, hi - lo));
      }
    }
  }
  reset_readiness();
}

void DistributedDataParallel::zero_grad_buffer() {
  for (auto& s : state_)
    if (s.work) s.work->wait(), s.work.reset();
  buffer_.grads.zero_();
  reset_readiness();
}

std::vector<std::pair<int64_t, int64_t>> DistributedDataParallel::optimizer_shard_ranges() const {
  MG_CHECK(config_.use_distributed_optimizer,
           "DistributedDataParallel: shard ranges exist only with --use-distributed-optimizer");
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& b : buckets_) {
    const auto r = b.shard_range(dp_group_->rank());
    if (r.second > r.first) out.push_back(r);
  }
  return out;
}

void DistributedDataParallel::start_param_sync() {
  MG_CHECK(config_.use_distributed_optimizer,
           "DistributedDataParallel: param sync exists only with --use-distributed-optimizer");
  const int dp = dp_group_->size();
  if (dp == 1) return;
  finish_param_sync();  // a previous gather still in flight completes first
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    const GradBucket& b = buckets_[bi];
    BucketState& s = state_[bi];
    const Tensor& params = buffer_.params;
    if (!s.gather_in.defined())
      s.gather_in = Tensor::zeros({b.shard_size}, params.dtype(), params.device());
    const auto [lo, hi] = b.shard_range(dp_group_->rank());
    if (hi > lo) {
      Tensor head = s.gather_in.slice(0, hi - lo);
      head.copy_(params.slice(lo, hi - lo));
    }
    if (b.padded_numel(dp) == b.numel()) {
      Tensor out = params.slice(b.start, b.numel());
      s.gather_work = dp_group_->all_gather(out, s.gather_in);
    } else {
      if (!s.gather_staging.defined())
        s.gather_staging = Tensor::empty({b.padded_numel(dp)}, params.dtype(), params.device());
      s.gather_work = dp_group_->all_gather(s.gather_staging, s.gather_in);
    }
    ++gathers_pending_;
  }
}

void DistributedDataParallel::finish_gather(std::size_t bi) {
  BucketState& s = state_[bi];
  if (!s.gather_work) return;
  comm::WorkPtr w = std::move(s.gather_work);
  --gathers_pending_;
  w->wait();
  const GradBucket& b = buckets_[bi];
  if (b.padded_numel(dp_group_->size()) == b.numel()) return;
  Tensor dst = buffer_.params.slice(b.start, b.numel());
  dst.copy_(s.gather_staging.slice(0, b.numel()));
}

void DistributedDataParallel::finish_param_sync() {
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) finish_gather(bi);
}

void DistributedDataParallel::wait_param_gather(std::span<const std::size_t> param_indices) {
  if (gathers_pending_ == 0) return;
  for (std::size_t i : param_indices) {
    MG_CHECK(i < buckets_of_param_.size(), "DistributedDataParallel::wait_param_gather: parameter "
                                               << i << " of " << buckets_of_param_.size());
    for (std::size_t bi : buckets_of_param_[i]) finish_gather(bi);
  }
}

}  // namespace mg::distributed
