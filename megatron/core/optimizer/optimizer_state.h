// MegatronOptimizer's private state, shared by its .cpp files (optimizer.cpp: construction and the
// step; clip_grads.cpp: grad norm and zero count; optimizer_state_dict.cpp: checkpoints). Not a
// public header: nothing outside megatron/core/optimizer/ includes it.
//
// A piece is what the optimizer steps as one tensor: a whole Parameter, or (sharded) its
// intersection with one owned range of the flat buffer, as a 1-D view. Pieces are in Parameter
// order unsharded, in buffer order sharded; the state buffers are flat and viewed per piece.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::optimizer {

struct Piece {
  std::size_t param = 0;  // index into the Parameter vector
  int64_t offset = 0;     // element offset in the flat buffer
  Tensor master, grad, exp_avg, exp_avg_sq, momentum;
  Tensor model_param;  // the model weight piece (written by adamw_step when master is separate)
  // --optimizer-cpu-offload: master, exp_avg, exp_avg_sq, momentum are host views; the update
  // reads host_grad (the host copy of `grad`, which stays the device gradient for the statistics)
  // and, with separate master weights, writes host_model (copied to model_param afterwards).
  bool on_host = false;
  Tensor host_grad, host_model;
};

// --optimizer-cpu-offload: host pieces adjacent both in the state buffers and in the flat
// buffer, copied as one (device -> host gradients before the update, host -> device weights
// after it).
struct OffloadRun {
  Tensor device_grad, host_grad;    // the flat buffer's gradients, their host staging
  Tensor device_param, host_model;  // the model weights, their host staging (separate master)
  Tensor host_master;               // the host master weights of the run
  std::vector<std::vector<std::size_t>> group_pieces;  // per ParamGroup: its pieces in this run
};

struct MegatronOptimizer::State {
  bool separate_master = false;  // bf16/fp16 model: f32 master weights of their own
  Tensor master_flat;            // [P] f32 (or the params buffer itself); sharded: [owned] f32
  Tensor exp_avg_flat, exp_avg_sq_flat, momentum_flat;  // [P] or sharded [owned]
  bool momentum_initialized = false;  // torch SGD creates the buffer on the first step
  std::vector<Piece> pieces;          // unsharded: one per Parameter, in order
  std::vector<std::vector<std::size_t>> group_pieces;  // per ParamGroup: indices into pieces
  Tensor found_inf;                                    // [1] f32
  // --optimizer-cpu-offload on a device (optimizer.h): the state of positions [0, split)
  // lives in (pinned) host memory and is stepped by the CPU platform's kernels; the device flats
  // above hold the rest, from position split on. Off: split 0, nothing below is used.
  bool offload = false;
  int64_t split = 0;
  int64_t host_numel = 0;  // elements of the host pieces (split less any gaps between them)
  Tensor host_master_flat, host_exp_avg_flat, host_exp_avg_sq_flat, host_momentum_flat;
  Tensor host_grad_flat, host_model_flat;  // staging: gradients in, model weights out
  std::vector<OffloadRun> offload_runs;
  std::vector<std::vector<std::size_t>> device_group_pieces;  // per ParamGroup: not offloaded
  const ops::OpTable* host_ops = nullptr;                     // the CPU platform's op table
  // Fixed at construction (views of the grad buffer), in piece order:
  std::vector<Tensor> grads;  // every non-empty piece's grad (unscaled and clipped)
  // Megatron's get_main_grads_for_grad_norm: the grads this rank counts in the norm (each
  // parameter once over all ranks), and the experts' apart (with an expert group only).
  std::vector<Tensor> grads_for_norm, expert_grads_for_norm;
};

namespace detail {

// `x` reduced with `op` over `group` (a host f64 all-reduce); identity for null or size 1.
double all_reduce_scalar(comm::ProcessGroup* group, double x, comm::ReduceOp op);

}  // namespace detail

}  // namespace mg::optimizer
