// DistributedDataParallel: Megatron-Core's DDP (megatron/core/distributed/
// distributed_data_parallel.py) over the model's flat gradient buffer, without wrapping the model:
// the model keeps its own forward/backward and calls param_grad_ready() from its grad-ready hook
// (GPTModel::set_grad_ready_hook) when --overlap-grad-reduce is on.
//
// Per bucket (param_and_grad_buffer.h) over the data-parallel (dp-cp) group: grads scaled by 1/dp
// (or the collective's avg), then all-reduced in place, or reduce-scattered under the distributed
// optimizer (each rank's chunk of the bucket then holds the averaged grads; the rest of the buffer
// keeps this rank's local grads and must not be read). With overlap, a bucket's collective is
// launched asynchronously as soon as all its params' grads are final in the LAST micro-batch's
// backward (set_is_last_microbatch, Megatron's no_sync); finish_grad_sync() launches what is left
// and waits. After the distributed optimizer's step, start/finish_param_sync() all-gather every
// bucket's parameter chunks.
//
// Invariants: every rank builds the same buckets and launches the same collectives in the same
// order (backward is deterministic); a group of one rank communicates nothing and scales nothing,
// so single-rank training is bit-identical to running without DDP.
// --overlap-param-gather: start_param_sync() launches every bucket's all-gather and returns;
// the model's param-use hook calls wait_param_gather() before a module's first use of its
// parameters in the next forward, which waits for (only) the buckets holding them; anything else
// that reads the parameters (checkpoint save, the end of training) calls finish_param_sync().
// Expert parameters (MoE with expert parallelism) are bucketed apart and reduced over the
// expert-data-parallel group (constructor).
// FSDP (config.use_megatron_fsdp, Megatron FSDP's sharding strategies over the same buckets and
// the same collectives, so the numbers equal the distributed optimizer's):
//   optim_grads (ZeRO-2): after a bucket's reduce-scatter, the rest of its gradients is discarded
//     (release_range: the pages go back to the OS on the host; on a device the whole granules
//     of the sparse buffers are unmapped and freed, see below), so
//     between steps each rank holds only its gradient shard;
//   optim_grads_params (ZeRO-3): also the parameters outside this rank's chunk are discarded after
//     the optimizer step; the model's param-use hook (use_params, forward AND backward) all-gathers
//     the buckets holding a module's parameters just before it runs (with --overlap-param-gather
//     the next bucket's all-gather is already in flight), its param-release hook (release_params)
//     discards them again once no module in flight uses them. finish_param_sync() gathers every
//     bucket (checkpoint save, end of training); reshard_params() discards them again.
// Memory saved is real on the host (madvise(MADV_DONTNEED) of whole pages inside a range) and, on
// a device whose platform has sparse memory (CUDA virtual memory management: the model's flat
// buffers then come from Platform::sparse_allocator), for the whole granules inside a range
// (Platform::decommit; the edges are zeroed). A released device range has no memory behind it:
// it is committed (commit_range) before anything writes it again: the parameter all-gather
// (launch_gather), the gradients at zero_grad_buffer (a device keeps its gradients mapped between
// the micro-batches of a step and releases them in finish_grad_sync), the sequence-parallel
// all-reduce (commit_grads_of). Without VMM a device range is only zeroed. NOT yet run on a GPU.
// See docs/architecture.md.
// With expert parallelism (or TP with whole experts, or CP) the distributed optimizer and FSDP
// shard expert buckets over the expert data-parallel group (their reduce-scatters and gathers run
// there; optimizer_shard_ranges() includes their chunks), dense ones over the dp-cp group.
// --fp8-param-gather (fp8_params: the model's fp8::ParamRun, Fp8State::param_runs): FP8
// parameters are bucketed apart (Megatron's buffer of FP8 parameters); their buckets reduce the
// gradients as any other, but the parameter all-gather (and FSDP's discard) works on the FP8
// bytes, 1 byte per element; the model-dtype values of those parameters are not gathered (the
// forward reads the FP8 ones).
// Not here: bucket groups of several buckets.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/distributed/distributed_data_parallel_config.h"
#include "megatron/core/distributed/param_and_grad_buffer.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/transformer/parameter.h"

namespace mg::distributed {

class DistributedDataParallel {
 public:
  // `params` and `buffer` (the model's) must outlive this; dp_group is the data-parallel group
  // (dp-cp with context parallelism). config.validate() is called.
  // expert_dp_group (Megatron's expert-data-parallel group; null or the same ranks as dp_group:
  // experts are ordinary parameters): expert parameters (Parameter::is_expert) get buckets of
  // their own, scaled by 1/dp as the dense ones (Megatron's expert_gradient_scaling_factor) and
  // summed over this group; under the distributed optimizer they are sharded over it.
  DistributedDataParallel(const DistributedDataParallelConfig& config,
                          std::vector<transformer::Parameter>& params,
                          transformer::ParamAndGradBuffer& buffer, const ops::OpTable& ops,
                          comm::ProcessGroupPtr dp_group,
                          comm::ProcessGroupPtr expert_dp_group = nullptr,
                          std::vector<fp8::ParamRun> fp8_params = {});
  ~DistributedDataParallel();  // waits for collectives still in flight
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const DistributedDataParallelConfig& config() const { return config_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const comm::ProcessGroupPtr& data_parallel_group() const { return dp_group_; }
  // The expert data-parallel group when expert buckets are reduced over it (else null).
  const comm::ProcessGroupPtr& expert_data_parallel_group() const { return expert_dp_group_; }

  // Megatron's no_sync(): false while earlier micro-batches run their backward (grad-ready calls
  // are then ignored); true (the default) for the last one.
  void set_is_last_microbatch(bool last) { is_last_microbatch_ = last; }
  // Pipelining: gradients are reduced only after the whole schedule (the tied embedding's
  // gradient is summed over the embedding group before the data-parallel reduction), so FSDP's
  // per-micro-batch reduce-scatter is off.
  void set_pipelined(bool pipelined) { pipelined_ = pipelined; }
  // The model's grad-ready hook: parameter `param_index`'s gradient of this micro-batch is final.
  // With overlap on the last micro-batch, a bucket whose params are all ready is launched. A
  // parameter reported twice in one backward is an error.
  void param_grad_ready(std::size_t param_index);
  // Launches every bucket not launched yet (all of them without overlap).
  void start_grad_sync();
  // Launches what is left and waits for every bucket; afterwards the grads (this rank's chunks
  // under the distributed optimizer) hold the average over the dp group.
  void finish_grad_sync();
  // Zeroes the gradient buffer and resets the readiness of every bucket.
  void zero_grad_buffer();

  // Distributed optimizer: this rank's element ranges (its chunk of every bucket), ascending.
  std::vector<std::pair<int64_t, int64_t>> optimizer_shard_ranges() const;
  // Distributed optimizer: all-gather each bucket's parameter chunks (after the step). start
  // launches them all asynchronously; finish waits for those still in flight.
  void start_param_sync();
  void finish_param_sync();
  // Waits for the all-gathers of the buckets holding these parameters (indices into params), if
  // in flight: the forward pre-hook of --overlap-param-gather. Cheap when nothing is pending.
  void wait_param_gather(std::span<const std::size_t> param_indices);
  // Whether any parameter all-gather is still in flight.
  bool param_sync_pending() const { return gathers_pending_ > 0; }

  // FSDP optim_grads_params (no-ops otherwise): the model's param-use hook in forward and backward
  // (gathers the buckets holding these parameters unless resident, counts the use, prefetches
  // the next bucket under --overlap-param-gather) and its param-release hook (ends the use; a
  // bucket no module uses any more is discarded outside this rank's chunk).
  void use_params(std::span<const std::size_t> param_indices);
  void release_params(std::span<const std::size_t> param_indices);
  // Discards every bucket's parameters outside this rank's chunk (after a checkpoint load or
  // save, which need them whole); buckets in use are an error.
  void reshard_params();
  // FSDP: bytes of the flat buffers currently resident on this rank (params + grads; the whole
  // buffers without FSDP) and the peak since construction (host pages, counted per discarded
  // range as the engine tracks them).
  int64_t resident_buffer_bytes() const { return resident_bytes_; }
  int64_t peak_resident_buffer_bytes() const { return peak_resident_bytes_; }
  // FSDP on a device: backs the (discarded) gradients of these parameters again before code
  // outside DDP writes them after finish_grad_sync (the sequence-parallel all-reduce of
  // finalize_model_grads). Nothing on the host.
  void commit_grads_of(std::span<const std::size_t> param_indices);
  // FSDP on a device, lazy gradient commit (enable_lazy_grad_commit, set by parallelize when the
  // model calls its grad-write hook): with a reduction every micro-batch (--overlap-grad-reduce) a
  // bucket gives its gradient memory outside this rank's chunk back as soon as its reduce-scatter
  // completed (complete_bucket), zero_grad_buffer leaves discarded buckets unbacked, and
  // prepare_grads -- the model's grad-write hook, before a module writes its gradients -- backs
  // the buckets holding these parameters again (reading as zeros). So the whole gradient buffer
  // is never resident at once, nor beside the activations at the start of a backward. On the host
  // (its pages fault back by themselves) prepare_grads only counts the buckets resident from
  // there, as a device does; without the hook they count from their launch.
  void enable_lazy_grad_commit() { lazy_grad_commit_ = true; }
  void prepare_grads(std::span<const std::size_t> param_indices);
  // FSDP on a device: backs every discarded gradient range again (they read as zeros) for code
  // that reads the whole gradient buffer (the non-finite-gradient diagnostic of train_step).
  // Nothing on the host. The resident-bytes count is not raised (the run stops after it).
  void commit_all_grads();
  // FSDP optim_grads_params: all-gathers run by use_params (sync or prefetched) since construction.
  int64_t param_gathers() const { return param_gathers_; }

  // Buckets launched by param_grad_ready (during backward) vs by start_grad_sync, since
  // construction: tells a test that overlap really overlaps.
  int64_t buckets_launched_in_backward() const { return launched_in_backward_; }
  int64_t buckets_launched_after_backward() const { return launched_after_backward_; }

 private:
  struct BucketState;
  void launch(std::size_t bucket);
  void finish_gather(std::size_t bucket);  // waits for one bucket's all-gather and unstages
  void launch_gather(std::size_t bucket);  // starts one bucket's all-gather
  void reset_readiness();
  // FSDP optim_grads(_params) with --overlap-grad-reduce and no pipelining: each micro-batch's
  // buckets are reduce-scattered as its backward completes them (Megatron FSDP), summed into a
  // shard accumulator, and the full gradients discarded.
  bool reduce_every_microbatch() const;
  void complete_bucket(std::size_t bucket);  // waits, accumulates the shard, clears the bucket
  void reduce_scatter(std::size_t bucket, Tensor& grads, comm::ReduceOp op,
                      comm::ProcessGroup& group);
  // Whether any bucket is sharded over more than one rank (the data-parallel group or, for expert
  // buckets, the expert data-parallel group).
  bool shards_over_ranks() const;
  // The group a bucket is sharded over (the expert data-parallel one for expert buckets) and
  // this rank's chunk of it.
  comm::ProcessGroup& group_of(std::size_t bucket) const;
  std::pair<int64_t, int64_t> own_range(std::size_t bucket) const;
  // Discards this bucket's params / grads outside this rank's chunk (FSDP) and marks it so.
  void discard_params(std::size_t bucket);
  void discard_grads(std::size_t bucket);
  // Backs a bucket's discarded params / grads again (commit_range) before they are written.
  void commit_params(std::size_t bucket);
  void commit_grads(std::size_t bucket);
  // commit_grads and the resident-bytes count of a discarded bucket (zero_grad_buffer,
  // prepare_grads).
  void recommit_grads(std::size_t bucket);
  // FSDP: gives this rank's own gradient range back (it reads as zeros: zero_grad_buffer, and
  // complete_bucket once grad_acc holds its sum), and backs it again, counted resident, before it
  // is written (commit_grads, launch, finish_grad_sync).
  void release_own(std::size_t bucket);
  void take_back_own(std::size_t bucket);
  void account(int64_t delta_bytes);
  // Bucket bi's parameter storage for flat elements [lo, lo + n): the model-dtype buffer, or the
  // FP8 bytes of an fp8 bucket; and its element size.
  Tensor param_slice(std::size_t bi, int64_t lo, int64_t n) const;
  int64_t param_elem_size(std::size_t bi) const;

  DistributedDataParallelConfig config_;
  std::vector<transformer::Parameter>& params_;
  transformer::ParamAndGradBuffer& buffer_;
  const ops::OpTable& ops_;
  comm::ProcessGroupPtr dp_group_;
  comm::ProcessGroupPtr expert_dp_group_;  // set only when it differs from dp_group_
  std::vector<fp8::ParamRun> fp8_runs_;
  std::vector<GradBucket> buckets_;
  std::vector<BucketState> state_;
  std::vector<std::vector<std::size_t>> buckets_of_param_;
  std::vector<bool> param_ready_;
  bool is_last_microbatch_ = true;
  bool pipelined_ = false;
  bool lazy_grad_commit_ = false;
  int64_t launched_in_backward_ = 0, launched_after_backward_ = 0;
  int64_t gathers_pending_ = 0;  // buckets whose all-gather is in flight
  int64_t resident_bytes_ = 0, peak_resident_bytes_ = 0, param_gathers_ = 0;
  std::size_t last_used_bucket_ = 0;  // ZeRO-3 prefetch: the first bucket of the last use
};

// Discards the contents of a 1-D tensor view (they read as zeros afterwards) through its
// platform's decommit: on the host the whole pages inside it go back to the OS (madvise
// MADV_DONTNEED; the edges are zeroed); on a device, the whole granules inside a sparse buffer
// (Tensor::zeros_sparse; CUDA: virtual memory management) are unmapped and freed, the rest
// zeroed. Returns the bytes given back.
int64_t release_range(const Tensor& view);
// Makes a released view writable again (Platform::commit; nothing on the host): what was given
// back reads as zeros, the rest keeps its contents.
void commit_range(const Tensor& view);

}  // namespace mg::distributed
