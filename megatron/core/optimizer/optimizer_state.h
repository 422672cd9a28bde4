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
};

struct MegatronOptimizer::State {
  bool separate_master = false;  // bf16/fp16 model: f32 master weights of their own
  Tensor master_flat;            // [P] f32 (or the params buffer itself); sharded: [owned] f32
  Tensor exp_avg_flat, exp_avg_sq_flat, momentum_flat;  // [P] or sharded [owned]
  bool momentum_initialized = false;  // torch SGD creates the buffer on the first step
  std::vector<Piece> pieces;          // unsharded: one per Parameter, in order
  std::vector<std::vector<std::size_t>> group_pieces;  // per ParamGroup: indices into pieces
  Tensor found_inf;                                    // [1] f32
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
