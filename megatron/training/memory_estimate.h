// Per-rank memory estimate of a training run from its flags and parallel layout, before anything
// is allocated: parameters, gradients, optimizer state, activations and workspace, for one
// pipeline rank (or the heaviest one). pretrain() refuses a run whose estimate cannot fit
// (check_memory_fits); the FSDP memory accounting extends the same arithmetic through
// ShardingDivisors.
//
// What is counted (bytes on one rank):
//   parameters   this rank's elements (TP shards, its pipeline stage's layers, embedding on the
//                first stage, output layer / tied copy on the last, E / EP local experts split
//                over expert TP) x the params dtype, / ShardingDivisors::parameters; with
//                --fp8-param-gather plus 1 byte per FP8 linear weight element (its FP8 copy);
//   gradients    the same elements x the grad dtype (f32 under bf16/fp16), / ::gradients;
//   optimizer    f32 master weights (bf16/fp16 only) + Adam's two moments (SGD: one momentum
//                buffer), / ::optimizer_state (dp under --use-distributed-optimizer); with
//                MemoryLayout::optimizer_offload, --optimizer-offload-fraction of it (and of
//                f32/f64 models' masters, and the gradient / weight staging) is host memory
//                (host_optimizer_bytes), not counted in the device total;
//   activations  what a micro-batch keeps between forward and backward, per layer and per token of
//                the S / CP local tokens x micro-batch: layer input, norm outputs, QKV, attention
//                context and log-sum-exp (no S x S probabilities: attention is tiled), fc1 and
//                activation outputs (top-k routed copies for MoE layers), dropout masks; divided
//                by TP (and the H-wide ones by TP under --sequence-parallel); a fully recomputed
//                layer keeps its input only. Times the micro-batches a stage holds at once (1
//                without pipelining; 1F1B: min(PP - rank, M); interleaved: Megatron's warm-up
//                count of chunks), plus the embedding output and the vocab logits (activation
//                dtype + f32) on the stages that own them;
//   workspace    one layer's activations again (backward's transients, a recomputed layer), the
//                logits gradient, the micro-batch's token / label / mask / position tensors.
// It is an estimate of what the run must hold, not an upper bound: allocator slack, the op
// table's scratch, MPI / NCCL buffers and the data pipeline are not in it.
#pragma once

#include <cstdint>
#include <string>

#include "megatron/training/arguments.h"

namespace mg::training {

// The parallel layout an estimate is for (world-size dependent; memory_layout() derives it).
struct MemoryLayout {
  int64_t tp = 1, pp = 1, vp = 1, cp = 1, ep = 1, dp = 1;
  int64_t etp = 1;  // expert tensor parallel (--expert-tensor-parallel-size; default TP with MoE)
  bool sequence_parallel = false;
  int64_t num_microbatches = 1;  // M = gbs / (mbs x dp)
  // --optimizer-cpu-offload with the model on a device (the trainer sets it; on the CPU platform
  // the offload is the identity and everything is host memory anyway).
  bool optimizer_offload = false;
};

// The layout of `args` on `world_size` ranks (dp = world / (tp x pp x cp); M from the batch sizes;
// vp from either virtual-pipeline flag). Throws naming the sizes when they do not divide.
MemoryLayout memory_layout(const Arguments& args, int64_t world_size);

// How many ranks share each of the per-rank state components: the one place a sharding strategy
// enters the estimate: the data-parallel (dp-cp) group's size. --use-distributed-optimizer
// (ZeRO-1): optimizer_state; FSDP optim_grads also gradients, optim_grads_params also parameters
// (the unsharded copies FSDP holds at its peak are MemoryEstimate::fsdp_*_bytes). Routed experts
// divide by the expert data-parallel group's size instead (expert_*).
struct ShardingDivisors {
  int64_t parameters = 1;
  int64_t gradients = 1;
  int64_t optimizer_state = 1;
  // The same for the routed experts' elements: the expert data-parallel group's size.
  int64_t expert_parameters = 1;
  int64_t expert_gradients = 1;
  int64_t expert_optimizer_state = 1;
};
ShardingDivisors sharding_divisors(const Arguments& args, const MemoryLayout& layout);

struct MemoryEstimate {
  int64_t pipeline_rank = 0;
  double num_parameters = 0;  // this rank's parameter elements before sharding (exact < 2^53)
  // --fp8-param-gather: of those, the FP8 linears' weights, also held as FP8 (1 byte each, in
  // parameter_bytes on top of their model-dtype slots).
  double num_fp8_parameters = 0;
  ShardingDivisors divisors;
  // Bytes on this rank.
  double parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  double host_optimizer_bytes = 0;  // --optimizer-cpu-offload: pinned host memory, not in total
  double activation_bytes = 0;      // all micro-batches in flight, logits included
  // FSDP (optim_grads / optim_grads_params): unsharded copies held at the peak on top of the
  // shards: gathered parameter buckets (ZeRO-3) and gradients not yet reduce-scattered plus the
  // shard accumulator (memory_estimate.cpp says which).
  double fsdp_parameter_bytes = 0, fsdp_gradient_bytes = 0;
  double workspace_bytes = 0;
  // The parts of activation_bytes.
  double activation_bytes_per_layer = 0;  // one micro-batch, one (non-recomputed) layer
  double logits_bytes = 0;                // one micro-batch's vocab logits (0 off the last stage)
  int64_t layers = 0;                     // decoder layers on this rank (all its chunks)
  int64_t microbatches_in_flight = 1;     // in layer-stack units (interleaved: chunk units / vp)
  double microbatches_in_flight_exact = 1;

  double total_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + fsdp_parameter_bytes +
           fsdp_gradient_bytes + activation_bytes + workspace_bytes;
  }
  // "parameters 1.2 GiB, gradients ..., optimizer ..., activations ..., workspace ... = total".
  std::string str() const;
  // The largest component and the flags (with the run's values) that drive it, e.g.
  // "activations, driven by --seq-length 100000000 and --micro-batch-size 1".
  std::string driving_flags(const Arguments& args) const;
};

// The estimate for pipeline rank `pipeline_rank` of `layout`. vocab_size: the tokenizer's (padded
// here as the model pads it). `args.model` must be finalized (parse_args does it).
MemoryEstimate estimate_memory(const Arguments& args, int64_t vocab_size,
                               const MemoryLayout& layout, int64_t pipeline_rank);
// The heaviest pipeline rank's estimate.
MemoryEstimate estimate_peak_memory(const Arguments& args, int64_t vocab_size,
                                    const MemoryLayout& layout);

// "1.50 GiB", "312.0 MiB", "3.1 PiB".
std::string format_bytes(double bytes);

// The memory one rank may use: the device's total memory (CUDA: cudaMemGetInfo's total through
// the platform's capabilities), on the host divided by the ranks sharing it (local_ranks).
struct AvailableMemory {
  double bytes = 0;
  std::string what;  // "host memory 23.4 GiB / 4 ranks on this node", "device cuda:0 79.1 GiB"
};

// Throws mg::Error when estimate.total_bytes() > available.bytes: the estimate with its parts,
// the flags that drive the largest part, and the available memory.
void check_memory_fits(const MemoryEstimate& estimate, const AvailableMemory& available,
                       const Arguments& args);

}  // namespace mg::training
