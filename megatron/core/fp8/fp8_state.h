// The FP8 scaling state of a model's linears (Transformer Engine's fp8_meta; docs/fp8.md): for each
// FP8 linear, three tensors are quantised per pass -- the input and the weight in forward (E4M3),
// the output gradient in backward (E5M2 under hybrid) -- each with its own amax history, scale and
// scale_inv. Delayed scaling keeps them in TE's layout: forward history [len, 2 n] (columns 2 i
// input, 2 i + 1 weight of linear i), backward history [len, n]; row 0 is where the casts of the
// running pass record their amax. update() after a training pass reduces row 0 over the amax group
// (max), takes amax (max of the history or row 0), rolls the history (row 0 zeroed) and sets
// scale = fp8_max / amax / 2^margin (kept when amax is 0 or not finite), scale_inv = 1 / scale.
// Tensorwise (current) scaling keeps no history: each cast first takes its tensor's amax, reduced
// over the tensor-parallel group, and scale = fp8_max / amax.
// Not training (evaluation, inference): delayed casts use the scales as they are and record
// nothing. The state travels in checkpoints as JSON with the f32 bit patterns (state_json).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/fp8/fp8_config.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::fp8 {

enum class Role : uint8_t { input = 0, weight = 1, grad_output = 2 };

// How one operand is quantised: the scale to multiply by, the amax the cast records into, and
// scale_inv (a copy of its own, kept by the backward that uses the quantised tensor later).
struct Scaling {
  Tensor scale, amax, scale_inv;
  DType dtype = DType::fp8_e4m3;
};

class Fp8State {
 public:
  Fp8State(const Fp8Config& config, const ops::OpTable& ops, Device device);

  // Registers an FP8 linear during the model build (name: its parameter prefix, e.g.
  // "decoder.layers.1.mlp.linear_fc1"); returns its id. finalize() allocates the state once the
  // last one is registered.
  int add_linear(const std::string& name);
  void finalize();

  const Fp8Config& config() const { return cfg_; }
  int num_linears() const { return static_cast<int>(names_.size()); }
  const std::vector<std::string>& names() const { return names_; }

  // The scaling of operand `role` of linear `id` for the tensors `xs` (one scale for all: the
  // parts of a split GEMM). Delayed: the current scale, amax into history row 0 when training.
  // Tensorwise: amax of xs reduced (max) over `group` (null: none), scale from it.
  Scaling scaling(int id, Role role, std::span<const Tensor> xs, bool training,
                  comm::ProcessGroup* group);
  // The quantised x (q: like x, qt: [C, R] of x viewed as [R, C]); either may be skipped.
  void cast(const Scaling& s, const Tensor& x, Tensor* q, Tensor* qt) const;

  // After a training forward (forward = true) or backward pass: delayed scaling's amax reduction
  // over `group` (max; null: none) and scale update. Nothing for tensorwise.
  void update(bool forward, comm::ProcessGroup* group);

  // The host values (tests, checkpoints): history [len, slots], scale and scale_inv [slots].
  std::vector<float> history(bool forward) const;
  std::vector<float> scale(bool forward) const;
  std::vector<float> scale_inv(bool forward) const;
  // {"recipe", "format", "amax_history_len", "linears": {name: {fwd/bwd history, scale,
  // scale_inv as f32 bit patterns}}}; load_state_json restores the linears it names (a linear
  // it lacks keeps its fresh state) and refuses another history length or recipe.
  nlohmann::json state_json() const;
  void load_state_json(const nlohmann::json& j);

 private:
  struct Buffers {
    Tensor history, scale, scale_inv;  // [len, slots], [slots], [slots] f32
  };
  Buffers& buffers(bool forward) { return forward ? fwd_ : bwd_; }
  const Buffers& buffers(bool forward) const { return forward ? fwd_ : bwd_; }
  int slots(bool forward) const { return forward ? 2 * num_linears() : num_linears(); }

  Fp8Config cfg_;
  const ops::OpTable* ops_;
  Device device_;
  std::vector<std::string> names_;
  Buffers fwd_, bwd_;
  bool finalized_ = false;
};

// Delayed scaling's update on host values (Transformer Engine's
// _default_get_amax_and_update_history + _default_sf_compute): history [len, slots] is rolled in
// place, scale and scale_inv [slots] updated. Exposed for the reference test.
void delayed_update(std::vector<float>& history, std::vector<float>& scale,
                    std::vector<float>& scale_inv, int64_t len, int64_t slots, float fp8_max,
                    int64_t margin, AmaxComputeAlgo algo);
// Current scaling's scale from an amax: fp8_max / amax (1 when amax is 0 or not finite; the f32
// maximum when the quotient overflows).
float current_scale(float amax, float fp8_max);

}  // namespace mg::fp8
