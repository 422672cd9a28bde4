// Bucketed gradient reduction and parameter gathering over the data-parallel group
// (distributed_data_parallel.h).
#include "megatron/core/distributed/distributed_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/plugin/registry.h"

namespace mg::distributed {

namespace {
plugin::Platform& platform_of(const Tensor& t) {
  return plugin::global_registry().platform(t.device().type);
}
}  // namespace

int64_t release_range(const Tensor& view) {
  if (view.numel() == 0) return 0;
  return static_cast<int64_t>(
      platform_of(view).decommit(view.raw_data(), view.nbytes(), view.device().index));
}

void commit_range(const Tensor& view) {
  if (view.numel() == 0) return;
  platform_of(view).commit(view.raw_data(), view.nbytes(), view.device().index);
}

struct DistributedDataParallel::BucketState {
  int pending = 0;  // params not yet ready in this backward
  bool launched = false;
  comm::WorkPtr work;
  // The collectives work in place, as Megatron's: the reduce-scatter's output is this rank's
  // chunk of its input, and the all-gather's input this rank's chunk of its output, so a bucket
  // keeps no shard-sized buffers of its own beside the flat buffers (it did until session 24:
  // two shards a bucket, 160/DP MB of a 20M-parameter f32 model, more than the distributed
  // optimizer saved at DP 2).
  Tensor reduced;             // view: where the reduce-scatter leaves this rank's reduced shard
  Tensor staging;             // [dp * shard_size] zero-padded copy, only for an uneven bucket
  Tensor gather_staging;      // [dp * shard_size] params, only for an uneven bucket
  comm::WorkPtr gather_work;  // the bucket's parameter all-gather while in flight
  // FSDP optim_grads_params: whether the whole bucket's params are there, and how many modules in
  // flight use them (use_params / release_params).
  bool params_resident = true;
  int uses = 0;
  // FSDP optim_grads / optim_grads_params: the grads outside this rank's chunk are discarded.
  bool grads_discarded = false;
  // Whether a discarded range may have given its memory back (decommit) and must be committed
  // before it is written again: the params (all-gather) and the grads (backward).
  bool params_decommitted = false, grads_decommitted = false;
  // FSDP with per-micro-batch reduce-scatters: the sum of this step's reduced shards so far.
  Tensor grad_acc;
  bool acc_valid = false;
  bool acc_released = false;  // host: grad_acc's pages given back by finish_grad_sync
  // While the sum lives in grad_acc, this rank's own range of the gradient buffer is given back
  // too (host, or a device with the lazy gradient commit): between micro-batches a bucket keeps
  // one shard, not two (take_back_own backs it again, reading as zeros).
  bool own_released = false;
};

DistributedDataParallel::DistributedDataParallel(const DistributedDataParallelConfig& config,
                                                 std::vector<transformer::Parameter>& params,
                                                 transformer::ParamAndGradBuffer& buffer,
                                                 const ops::OpTable& ops,
                                                 comm::ProcessGroupPtr dp_group,
                                                 comm::ProcessGroupPtr expert_dp_group,
                                                 std::vector<fp8::ParamRun> fp8_params)
    : config_(config),
      params_(params),
      buffer_(buffer),
      ops_(ops),
      dp_group_(std::move(dp_group)),
      fp8_runs_(std::move(fp8_params)) {
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
  MG_CHECK(fp8_runs_.empty() || config_.use_distributed_optimizer,
           "DistributedDataParallel: FP8 parameters (--fp8-param-gather) need the distributed "
           "optimizer");
  auto in_fp8 = [this](const transformer::Parameter& p) {
    for (const fp8::ParamRun& r : fp8_runs_)
      if (p.buffer_offset >= r.start && p.buffer_offset + p.param.numel() <= r.end) return true;
    return false;
  };
  if (!expert_dp_group_ && fp8_runs_.empty()) {
    buckets_ = build_buckets(params_, buffer_.grads.numel(), bucket_size, dp,
                             config_.use_distributed_optimizer);
  } else {
    // Runs of expert / dense (and FP8 / other) parameters in buffer order, each bucketed on its
    // own (under the distributed optimizer and FSDP: expert buckets sharded over the expert
    // data-parallel group).
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i].param.numel() > 0) order.push_back(i);
    std::sort(order.begin(), order.end(), [this](std::size_t a, std::size_t b) {
      return params_[a].buffer_offset < params_[b].buffer_offset;
    });
    std::size_t i = 0;
    while (i < order.size()) {
      const bool expert = params_[order[i]].is_expert && expert_dp_group_;
      const bool fp8 = in_fp8(params_[order[i]]);
      const int64_t lo = params_[order[i]].buffer_offset;
      std::size_t j = i;
      while (j < order.size() && (params_[order[j]].is_expert && expert_dp_group_) == expert &&
             in_fp8(params_[order[j]]) == fp8)
        ++j;
      const transformer::Parameter& last = params_[order[j - 1]];
      const int64_t hi = last.buffer_offset + last.param.numel();
      for (GradBucket& b : build_buckets(params_, buffer_.grads.numel(), bucket_size,
                                         expert ? expert_dp_group_->size() : dp,
                                         config_.use_distributed_optimizer, lo, hi)) {
        b.expert = expert;
        b.fp8 = fp8;
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
  resident_bytes_ = peak_resident_bytes_ =
      static_cast<int64_t>(buffer_.params.nbytes() + buffer_.grads.nbytes());
  for (const fp8::ParamRun& r : fp8_runs_) account(static_cast<int64_t>(r.data.nbytes()));
  MG_CHECK(!config_.shards_grads() || config_.use_distributed_optimizer,
           "DistributedDataParallel: FSDP " << to_string(config_.sharding_strategy)
                                            << " needs the distributed optimizer's buckets");
  if (config_.shards_grads())
    for (std::size_t b = 0; b < buckets_.size(); ++b) discard_grads(b);
  if (config_.shards_params())
    for (std::size_t b = 0; b < buckets_.size(); ++b) discard_params(b);
  peak_resident_bytes_ = resident_bytes_;  // the peak of training, not of the model's build
}

Tensor DistributedDataParallel::param_slice(std::size_t bi, int64_t lo, int64_t n) const {
  if (!buckets_[bi].fp8) return buffer_.params.slice(lo, n);
  for (const fp8::ParamRun& r : fp8_runs_)
    if (lo >= r.start && lo + n <= r.end) return r.data.slice(lo - r.start, n);
  MG_CHECK(false, "DistributedDataParallel: FP8 bucket " << bi << " elements [" << lo << ", "
                                                         << lo + n << ") outside the FP8 runs");
  return Tensor();
}

int64_t DistributedDataParallel::param_elem_size(std::size_t bi) const {
  return buckets_[bi].fp8 ? 1 : static_cast<int64_t>(dtype_size(buffer_.params.dtype()));
}

void DistributedDataParallel::account(int64_t delta) {
  resident_bytes_ += delta;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
}

// f(lo, n) for each non-empty range of bucket b outside `rank`'s chunk, [start, lo) and [hi, end);
// returns their total length.
template <typename F>
static int64_t for_each_outside_chunk(const GradBucket& b, int rank, F&& f) {
  const auto [lo, hi] = b.shard_range(rank);
  const std::pair<int64_t, int64_t> ranges[2] = {{b.start, lo}, {std::max(hi, lo), b.end}};
  int64_t total = 0;
  for (auto [r0, r1] : ranges)
    if (r1 > r0) {
      f(r0, r1 - r0);
      total += r1 - r0;
    }
  return total;
}

// Elements [lo, hi) of the gradient buffer <- this rank's reduced shard: nothing to do when the
// in-place reduce-scatter wrote it there, a copy from an uneven bucket's staging otherwise.
static void place_reduced_shard(const Tensor& grads, const Tensor& reduced, int64_t lo,
                                int64_t hi) {
  if (hi <= lo) return;
  Tensor dst = grads.slice(lo, hi - lo);
  const Tensor red = reduced.slice(0, hi - lo);
  if (red.raw_data() != dst.raw_data()) dst.copy_(red);
}

void DistributedDataParallel::discard_params(std::size_t bi) {
  BucketState& s = state_[bi];
  const int64_t n = for_each_outside_chunk(
      buckets_[bi], group_of(bi).rank(),
      [&](int64_t lo, int64_t len) { release_range(param_slice(bi, lo, len)); });
  s.params_decommitted = true;
  if (s.params_resident) account(-param_elem_size(bi) * n);
  s.params_resident = false;
}

void DistributedDataParallel::discard_grads(std::size_t bi) {
  BucketState& s = state_[bi];
  const int64_t n = for_each_outside_chunk(
      buckets_[bi], group_of(bi).rank(),
      [&](int64_t lo, int64_t len) { release_range(buffer_.grads.slice(lo, len)); });
  s.grads_decommitted = true;
  if (!s.grads_discarded) account(-static_cast<int64_t>(dtype_size(buffer_.grads.dtype())) * n);
  s.grads_discarded = true;
}

void DistributedDataParallel::commit_params(std::size_t bi) {
  BucketState& s = state_[bi];
  if (!s.params_decommitted) return;
  for_each_outside_chunk(buckets_[bi], group_of(bi).rank(),
                         [&](int64_t lo, int64_t len) { commit_range(param_slice(bi, lo, len)); });
  s.params_decommitted = false;
}

void DistributedDataParallel::release_own(std::size_t bi) {
  BucketState& s = state_[bi];
  const auto [lo, hi] = own_range(bi);
  if (s.own_released || hi <= lo) return;
  release_range(buffer_.grads.slice(lo, hi - lo));
  account(-static_cast<int64_t>(dtype_size(buffer_.grads.dtype())) * (hi - lo));
  s.own_released = true;
}

void DistributedDataParallel::take_back_own(std::size_t bi) {
  BucketState& s = state_[bi];
  if (!s.own_released) return;
  const auto [lo, hi] = own_range(bi);  // non-empty: release_own gives back no empty range
  commit_range(buffer_.grads.slice(lo, hi - lo));
  account(static_cast<int64_t>(dtype_size(buffer_.grads.dtype())) * (hi - lo));
  s.own_released = false;
}

void DistributedDataParallel::commit_grads(std::size_t bi) {
  take_back_own(bi);
  BucketState& s = state_[bi];
  if (!s.grads_decommitted) return;
  for_each_outside_chunk(buckets_[bi], group_of(bi).rank(), [&](int64_t lo, int64_t len) {
    commit_range(buffer_.grads.slice(lo, len));
  });
  s.grads_decommitted = false;
}

void DistributedDataParallel::recommit_grads(std::size_t bi) {
  BucketState& s = state_[bi];
  if (!s.grads_decommitted) return;
  commit_grads(bi);
  if (s.grads_discarded) {
    const auto [lo, hi] = own_range(bi);
    account(static_cast<int64_t>(dtype_size(buffer_.grads.dtype())) *
            (buckets_[bi].numel() - (hi - lo)));
    s.grads_discarded = false;
  }
}

void DistributedDataParallel::prepare_grads(std::span<const std::size_t> param_indices) {
  // A device backs the buckets again; on the host (commit: nothing, the pages fault back in as
  // the backward writes them) this counts them resident from here, as a device does, not from
  // their launch.
  for (std::size_t i : param_indices) {
    MG_CHECK(i < params_.size(),
             "DistributedDataParallel::prepare_grads: parameter " << i << " of " << params_.size());
    for (std::size_t bi : buckets_of_param_[i]) recommit_grads(bi);
  }
}

void DistributedDataParallel::commit_grads_of(std::span<const std::size_t> param_indices) {
  if (buffer_.grads.is_host()) return;  // host pages fault back in by themselves
  for (std::size_t i : param_indices) {
    MG_CHECK(i < params_.size(), "DistributedDataParallel::commit_grads_of: parameter "
                                     << i << " of " << params_.size());
    bool decommitted = false;
    for (std::size_t bi : buckets_of_param_[i]) decommitted |= state_[bi].grads_decommitted;
    if (decommitted) commit_range(params_[i].main_grad.view({-1}));
  }
}

void DistributedDataParallel::commit_all_grads() {
  if (buffer_.grads.is_host()) return;
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) commit_grads(bi);
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
  if (!config_.overlap_grad_reduce) return;
  const bool every_microbatch = reduce_every_microbatch();
  if (!is_last_microbatch_ && !every_microbatch) return;
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
      if (every_microbatch) {
        // FSDP: at most one bucket in flight; a completed one keeps only its reduced shard.
        for (std::size_t o = 0; o < buckets_.size(); ++o)
          if (o != b && state_[o].work) complete_bucket(o);
      }
    }
  }
  if (every_microbatch &&
      std::all_of(state_.begin(), state_.end(), [](const BucketState& x) { return x.launched; })) {
    for (std::size_t o = 0; o < buckets_.size(); ++o) complete_bucket(o);
    reset_readiness();  // the next micro-batch's backward reports again
  }
}

bool DistributedDataParallel::reduce_every_microbatch() const {
  return config_.shards_grads() && config_.overlap_grad_reduce && !pipelined_ &&
         shards_over_ranks();
}

void DistributedDataParallel::complete_bucket(std::size_t bi) {
  BucketState& s = state_[bi];
  if (!s.work) return;
  s.work->wait();
  s.work.reset();
  const auto [lo, hi] = own_range(bi);
  const bool accumulate = reduce_every_microbatch();
  if (!accumulate) {
    // One reduction a step: the shard stays where the in-place reduce-scatter left it, with no
    // accumulator beside it.
    place_reduced_shard(buffer_.grads, s.reduced, lo, hi);
  } else if (hi > lo) {
    Tensor red = s.reduced.slice(0, hi - lo);
    if (!s.grad_acc.defined()) {  // a step's first reduction; finish_grad_sync gives it back
      s.grad_acc = Tensor::empty({hi - lo}, red.dtype(), red.device());
      account(static_cast<int64_t>(s.grad_acc.nbytes()));
    } else if (s.acc_released) {  // the host's pages fault back in as the copy below writes them
      account(static_cast<int64_t>(s.grad_acc.nbytes()));
      s.acc_released = false;
    }
    if (!s.acc_valid) {
      s.grad_acc.copy_(red);
    } else {  // acc += reduced shard of this micro-batch
      ops_.axpy(s.grad_acc, red, 1.0f);
    }
  }
  s.acc_valid = accumulate;
  if (buffer_.grads.is_host() || (accumulate && lazy_grad_commit_)) {
    // The host's pages, and a device's with the lazy gradient commit (the next micro-batch's
    // backward backs the bucket again through prepare_grads), are given back at once: the rest
    // of the bucket, and this rank's own range, whose sum is in grad_acc now (it reads as zeros
    // when taken back, as the next micro-batch's local gradients need).
    if (accumulate) release_own(bi);
    discard_grads(bi);
  } else if (accumulate) {
    if (hi > lo) buffer_.grads.slice(lo, hi - lo).zero_();  // local grads from zero again
    // Without the lazy commit a device gives the memory back only in finish_grad_sync, when the
    // step's backward is over: a later micro-batch's backward writes the bucket again, and
    // nothing would back it between micro-batches. Until then the rest of the bucket is zeroed
    // and stays resident. (With one reduction a step finish_grad_sync discards it right after
    // this call.)
    for_each_outside_chunk(buckets_[bi], group_of(bi).rank(), [&](int64_t lo, int64_t len) {
      Tensor g = buffer_.grads.slice(lo, len);
      g.zero_();
    });
  }
}

void DistributedDataParallel::launch(std::size_t bi) {
  const GradBucket& b = buckets_[bi];
  BucketState& s = state_[bi];
  s.launched = true;
  take_back_own(bi);        // the host's pages faulted back in: count them again
  if (s.grads_discarded) {  // FSDP: backward wrote the whole bucket again
    const auto [lo, hi] = own_range(bi);
    account(static_cast<int64_t>(dtype_size(buffer_.grads.dtype())) * (b.numel() - (hi - lo)));
    s.grads_discarded = false;
  }
  Tensor grads = buffer_.grads.slice(b.start, b.numel());
  const int dp = dp_group_->size();
  if (config_.check_for_nan_in_grad) {
    Tensor out = Tensor::empty({1}, DType::f64, grads.device());
    ops_.l2_norm_sq(out, std::span<const Tensor>(&grads, 1));
    const double norm = std::sqrt(host_read<double>(out, HostSync::nan_check)[0]);
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
    if (!config_.use_distributed_optimizer) {
      if (expert_dp_group_->size() > 1) s.work = expert_dp_group_->all_reduce(grads);
      return;
    }
    // FSDP: reduce-scattered over the expert data-parallel group (of one rank: a copy).
    reduce_scatter(bi, grads, comm::ReduceOp::sum, *expert_dp_group_);
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
  reduce_scatter(bi, grads, op, *dp_group_);
}

void DistributedDataParallel::reduce_scatter(std::size_t bi, Tensor& grads, comm::ReduceOp op,
                                             comm::ProcessGroup& group) {
  const GradBucket& b = buckets_[bi];
  BucketState& s = state_[bi];
  const int n = group.size();
  const int64_t mine = group.rank() * b.shard_size;  // this rank's chunk of the (padded) bucket
  if (b.padded_numel(n) == b.numel()) {
    s.reduced = grads.slice(mine, b.shard_size);  // the rank's own grads: own_range(bi)
    s.work = group.reduce_scatter(s.reduced, grads, op);
  } else {
    if (!s.staging.defined())
      s.staging = Tensor::zeros({b.padded_numel(n)}, grads.dtype(), grads.device());
    Tensor head = s.staging.slice(0, b.numel());
    head.copy_(grads);
    s.reduced = s.staging.slice(mine, b.shard_size);
    s.work = group.reduce_scatter(s.reduced, s.staging, op);
  }
}

bool DistributedDataParallel::shards_over_ranks() const {
  return dp_group_->size() > 1 || (expert_dp_group_ && expert_dp_group_->size() > 1);
}

comm::ProcessGroup& DistributedDataParallel::group_of(std::size_t bi) const {
  return buckets_[bi].expert && expert_dp_group_ ? *expert_dp_group_ : *dp_group_;
}

std::pair<int64_t, int64_t> DistributedDataParallel::own_range(std::size_t bi) const {
  return buckets_[bi].shard_range(group_of(bi).rank());
}

void DistributedDataParallel::start_grad_sync() {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (!state_[b].launched) {
      launch(b);
      ++launched_after_backward_;
    }
}

void DistributedDataParallel::finish_grad_sync() {
  if (config_.shards_grads() && shards_over_ranks()) {
    // ZeRO-2/3: every bucket's reduced shard (summed over the micro-batches when each was reduced
    // as its backward completed) into this rank's chunk of the buffer; the rest is discarded.
    // Per-micro-batch reduction leaves nothing to launch when the last backward completed all.
    const bool all_done =
        reduce_every_microbatch() &&
        std::all_of(state_.begin(), state_.end(),
                    [](const BucketState& x) { return !x.launched; }) &&
        std::all_of(state_.begin(), state_.end(),
                    [](const BucketState& x) { return x.acc_valid; }) &&
        std::find(param_ready_.begin(), param_ready_.end(), true) == param_ready_.end();
    if (!all_done) start_grad_sync();
    for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
      complete_bucket(bi);
      BucketState& s = state_[bi];
      const auto [lo, hi] = own_range(bi);
      take_back_own(bi);  // the optimizer reads the step's sum there
      if (hi > lo && s.acc_valid) {
        Tensor dst = buffer_.grads.slice(lo, hi - lo);
        dst.copy_(s.grad_acc);
      }
      // The sum is in the buffer now: the accumulator's memory is given back until the next
      // step's first reduction writes it, so that it serves the optimizer step, the forward and
      // the backward's start. A device frees it; the host gives its pages back and keeps the
      // block (freed, it would stay resident in the host allocator's cache).
      if (s.grad_acc.defined() && !s.acc_released) {
        account(-static_cast<int64_t>(s.grad_acc.nbytes()));
        if (s.grad_acc.is_host()) {
          release_range(s.grad_acc);
          s.acc_released = true;
        } else {
          s.grad_acc = Tensor();
        }
      }
      s.acc_valid = false;
      if (!s.grads_discarded) discard_grads(bi);  // a device's buckets (complete_bucket)
    }
  } else {
    start_grad_sync();
    for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
      BucketState& s = state_[bi];
      if (!s.work) continue;
      s.work->wait();
      s.work.reset();
      if (config_.use_distributed_optimizer) {
        const auto [lo, hi] = own_range(bi);
        place_reduced_shard(buffer_.grads, s.reduced, lo, hi);
      }
    }
  }
  if (config_.shards_params()) {
    // No parameter all-gather may write the buffer while the optimizer steps (a prefetch of the
    // last backward); a bucket no module uses is discarded again.
    for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
      finish_gather(bi);
      if (state_[bi].uses == 0) discard_params(bi);
    }
  }
  reset_readiness();
}

void DistributedDataParallel::zero_grad_buffer() {
  for (auto& s : state_)
    if (s.work) s.work->wait(), s.work.reset();
  if (!config_.shards_grads()) {
    buffer_.grads.zero_();
  } else {
    // ZeRO-2: the discarded grads already read as zeros (zeroing them would bring their pages
    // back before backward needs them); the shards and any bucket not discarded are zeroed. A
    // bucket's full gradients count as resident again from its launch (its backward wrote them).
    for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
      // A device's discarded grads are backed again before backward writes them (commit: they
      // read as zeros; nothing on the host, where the pages fault back in): here, or with the
      // lazy gradient commit by prepare_grads when the backward reaches them. From then on they
      // are resident: a device counts them so (on the host, from the bucket's launch).
      if (!buffer_.grads.is_host() && state_[bi].grads_decommitted && !lazy_grad_commit_)
        recommit_grads(bi);
      const GradBucket& b = buckets_[bi];
      const auto [lo, hi] =
          state_[bi].grads_discarded ? own_range(bi) : std::pair<int64_t, int64_t>{b.start, b.end};
      if (hi > lo && state_[bi].grads_discarded && (buffer_.grads.is_host() || lazy_grad_commit_)) {
        release_own(bi);  // reads as zeros; backed again when the backward writes it
      } else if (hi > lo) {
        Tensor g = buffer_.grads.slice(lo, hi - lo);
        g.zero_();
      }
      state_[bi].acc_valid = false;
    }
  }
  reset_readiness();
}

std::vector<std::pair<int64_t, int64_t>> DistributedDataParallel::optimizer_shard_ranges() const {
  MG_CHECK(config_.use_distributed_optimizer,
           "DistributedDataParallel: shard ranges exist only with --use-distributed-optimizer");
  std::vector<std::pair<int64_t, int64_t>> out;
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    const auto r = own_range(bi);
    if (r.second > r.first) out.push_back(r);
  }
  return out;
}

void DistributedDataParallel::launch_gather(std::size_t bi) {
  comm::ProcessGroup& g = group_of(bi);
  const int dp = g.size();
  const GradBucket& b = buckets_[bi];
  BucketState& s = state_[bi];
  commit_params(bi);  // the all-gather writes the whole bucket
  const Tensor params = param_slice(bi, b.start, b.numel());  // FP8 bytes for an fp8 bucket
  const auto [lo, hi] = own_range(bi);
  if (b.padded_numel(dp) == b.numel()) {
    Tensor out = params;  // in place: the input is this rank's chunk, own_range(bi)
    s.gather_work = g.all_gather(out, params.slice(lo - b.start, hi - lo));
  } else {
    if (!s.gather_staging.defined())
      s.gather_staging = Tensor::zeros({b.padded_numel(dp)}, params.dtype(), params.device());
    const Tensor mine = s.gather_staging.slice(g.rank() * b.shard_size, b.shard_size);
    if (hi > lo) mine.slice(0, hi - lo).copy_(params.slice(lo - b.start, hi - lo));
    s.gather_work = g.all_gather(s.gather_staging, mine);
  }
  ++gathers_pending_;
}

void DistributedDataParallel::start_param_sync() {
  MG_CHECK(config_.use_distributed_optimizer,
           "DistributedDataParallel: param sync exists only with --use-distributed-optimizer");
  if (!shards_over_ranks()) return;
  if (config_.shards_params()) {
    // ZeRO-3: nothing is gathered now; every module gathers its buckets when it runs. Only the
    // first bucket of the next forward (the last in the buffer) is prefetched under overlap.
    reshard_params();
    if (config_.overlap_param_gather && !buckets_.empty()) launch_gather(buckets_.size() - 1);
    return;
  }
  finish_param_sync();  // a previous gather still in flight completes first
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) launch_gather(bi);
}

void DistributedDataParallel::reshard_params() {
  if (!config_.shards_params() || !shards_over_ranks()) return;
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    finish_gather(bi);
    MG_CHECK(state_[bi].uses == 0, "DistributedDataParallel: bucket "
                                       << bi << " is resharded while " << state_[bi].uses
                                       << " module(s) use its parameters");
    discard_params(bi);  // also when not resident: a checkpoint load rewrote the whole buffer
  }
}

void DistributedDataParallel::use_params(std::span<const std::size_t> param_indices) {
  if (!config_.shards_params() || !shards_over_ranks()) return;
  std::size_t first = buckets_.size(), last = 0;
  for (std::size_t i : param_indices) {
    MG_CHECK(i < buckets_of_param_.size(), "DistributedDataParallel::use_params: parameter "
                                               << i << " of " << buckets_of_param_.size());
    for (std::size_t bi : buckets_of_param_[i]) {
      first = std::min(first, bi);
      last = std::max(last, bi);
    }
  }
  if (first > last) return;
  // Every bucket in [first, last] that holds one of these parameters, gathered once, in order.
  for (std::size_t bi = first; bi <= last; ++bi) {
    bool wanted = false;
    for (std::size_t i : param_indices)
      for (std::size_t b : buckets_of_param_[i]) wanted |= b == bi;
    if (!wanted) continue;
    BucketState& s = state_[bi];
    if (!s.params_resident) {
      if (!s.gather_work) launch_gather(bi);
      finish_gather(bi);
      s.params_resident = true;
      ++param_gathers_;
      const auto [lo, hi] = own_range(bi);
      account(param_elem_size(bi) * (buckets_[bi].numel() - (hi - lo)));
    }
    ++s.uses;
  }
  // Prefetch: forward walks the buffer from its end to its start, backward the other way; the
  // direction is that of this use relative to the previous one (all ranks see the same calls).
  if (config_.overlap_param_gather) {
    const bool forward = first < last_used_bucket_;
    last_used_bucket_ = first;
    auto idle = [this](std::size_t b) {
      return !state_[b].params_resident && !state_[b].gather_work;
    };
    if (forward) {
      if (first > 0 && idle(first - 1)) launch_gather(first - 1);
    } else {
      for (std::size_t bi = first + 1; bi <= last + 1 && bi < buckets_.size(); ++bi)
        if (idle(bi)) {
          launch_gather(bi);
          break;
        }
    }
  }
}

void DistributedDataParallel::release_params(std::span<const std::size_t> param_indices) {
  if (!config_.shards_params() || !shards_over_ranks()) return;
  std::vector<std::size_t> seen;
  for (std::size_t i : param_indices)
    for (std::size_t bi : buckets_of_param_.at(i)) {
      if (std::find(seen.begin(), seen.end(), bi) != seen.end()) continue;
      seen.push_back(bi);
      BucketState& s = state_[bi];
      MG_CHECK(s.uses > 0, "DistributedDataParallel::release_params: bucket "
                               << bi << " (parameter '" << params_[i].name
                               << "') was released more often than used");
      if (--s.uses == 0) discard_params(bi);
    }
}

void DistributedDataParallel::finish_gather(std::size_t bi) {
  BucketState& s = state_[bi];
  if (!s.gather_work) return;
  comm::WorkPtr w = std::move(s.gather_work);
  --gathers_pending_;
  w->wait();
  const GradBucket& b = buckets_[bi];
  if (b.padded_numel(group_of(bi).size()) == b.numel()) return;
  Tensor dst = param_slice(bi, b.start, b.numel());
  dst.copy_(s.gather_staging.slice(0, b.numel()));
}

void DistributedDataParallel::finish_param_sync() {
  if (config_.shards_params() && shards_over_ranks()) {  // ZeRO-3: every bucket made whole
    for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
      BucketState& s = state_[bi];
      if (s.params_resident) continue;
      if (!s.gather_work) launch_gather(bi);
      finish_gather(bi);
      s.params_resident = true;
      const auto [lo, hi] = own_range(bi);
      account(param_elem_size(bi) * (buckets_[bi].numel() - (hi - lo)));
    }
    return;
  }
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
