// The FP8 scaling state of a model's linears (Transformer Engine's fp8_meta; docs/fp8.md): for each
// FP8 linear, three tensors are quantised per pass -- the input and the weight in forward (E4M3),
// the output gradient in backward (E5M2 under hybrid) -- each with its own amax history, scale and
// scale_inv. Delayed scaling keeps them in TE's layout: forward history [len, 2 n] (columns 2 i
// input, 2 i + 1 weight of linear i), backward history [len, n]; row 0 is where the casts of the
// running pass record their amax. update() after a training pass reduces row 0 over the amax group
// (max), takes amax (max of the history or row 0), rolls the history (row 0 zeroed) and sets
// scale = fp8_max / amax / 2^margin (kept when amax is 0 or not finite), scale_inv = 1 / scale.
// The weights' FP8 copies (Transformer Engine's weight workspace, is_first_microbatch): inside a
// forward-backward call the schedules open the cache (WeightCacheScope); a training pass casts a
// weight (and its transpose, recording its amax) on its first use and reuses those bytes and their
// scale_inv for the call's later micro-batches, which record no weight amax -- TE's semantics, the
// weights change only at the optimizer step. Outside a scope, in evaluation and with
// disable_parameter_transpose_cache every pass casts.
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
#include "megatron/core/transformer/parameter.h"

namespace mg::fp8 {

enum class Role : uint8_t { input = 0, weight = 1, grad_output = 2 };

// A weight's FP8 copy: per part (one unless the linear splits its output) q [rows, in] and
// qt [in, rows], and the scale_inv they were cast with.
struct WeightFp8 {
  std::vector<Tensor> q, qt;
  Tensor scale_inv;
};

// How one operand is quantised: the scale to multiply by, the amax the cast records into, and
// scale_inv (a copy of its own, kept by the backward that uses the quantised tensor later).
struct Scaling {
  Tensor scale, amax, scale_inv;
  DType dtype = DType::fp8_e4m3;
};

// A norm fused into the cast of its output (Operand::norm; fp8_norm_cast_transpose): y =
// norm(x) by kind, or with a residual of sum = residual + dropout(x + bias) (written into sum);
// the statistics written into mean / rstd (the norm's saved ones; mean for LayerNorm). The
// tensors are handles: the cast writes into the caller's storage. It must outlive the cast.
struct NormFusion {
  ops::NormKind kind = ops::NormKind::rmsnorm;
  ops::NormArgs args;
  Tensor gamma, beta, mean, rstd;
  Tensor bias, residual, sum;
  ops::DropoutArgs dropout;
};

// An FP8 operand, possibly made by an op fused into its cast (docs/fp8.md "Fused casts"): the
// operand is then never written in the model dtype. tensor: x as it is ([.., C] viewed as
// [R, C]); swiglu: swiglu_fwd(x) [N, F] of the fc1 output x [N, 2F]; dswiglu: swiglu_bwd(dy, x)
// [N, 2F], dy [N, F] the gradient of swiglu's output; norm: the norm of x [.., C] (*norm says
// which and where its statistics go). The same bytes and amax as the unfused ops.
struct Operand {
  enum class Kind : uint8_t { tensor, swiglu, dswiglu, norm };
  Kind kind = Kind::tensor;
  Tensor x, dy;
  const NormFusion* norm = nullptr;
  static Operand tensor(const Tensor& x) { return Operand{Kind::tensor, x, Tensor(), nullptr}; }
  static Operand swiglu(const Tensor& u) { return Operand{Kind::swiglu, u, Tensor(), nullptr}; }
  static Operand dswiglu(const Tensor& da, const Tensor& u) {
    return Operand{Kind::dswiglu, u, da, nullptr};
  }
  static Operand normed(const Tensor& x, const NormFusion* n) {
    return Operand{Kind::norm, x, Tensor(), n};
  }
  int64_t cols() const;  // C of the operand viewed as [R, C]
  int64_t rows() const;
};

// --fp8-param-gather: a run [start, end) of the model's flat parameter buffer whose parameters are
// FP8 model parameters, their bytes in `data` (1-D, E4M3, data[i] for element start + i).
struct ParamRun {
  int64_t start = 0, end = 0;
  Tensor data;
};

// A master-weight shard of this rank (the distributed optimizer's): parameter `param` (an index
// into the model's Parameter vector), flat-buffer elements [offset, offset + master.numel()).
struct MasterShard {
  std::size_t param = 0;
  int64_t offset = 0;
  Tensor master;  // 1-D, f32 (the model dtype for f32 models)
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

  // --fp8-dot-product-attention (docs/fp8.md "FP8 attention"): registers the core attention of a
  // decoder layer (name: e.g. "decoder.layers.1.self_attention.core_attention"); returns its id.
  // Each has three forward operands (QKV, S = the softmax output, O) and three backward ones (dO,
  // dP, dQKV), delayed scaling only, in slots after the linears' (forward 2 n + 3 a + r,
  // backward n + 3 a + r): TE's DotProductAttention fp8_meta.
  int add_attention(const std::string& name);
  int num_attentions() const { return static_cast<int>(attn_names_.size()); }
  const std::vector<std::string>& attention_names() const { return attn_names_; }
  // Attention `id`'s scale vectors, views [3] of the state: forward (QKV, S, O), backward (dO, dP,
  // dQKV) scale and scale_inv.
  struct AttentionScales {
    Tensor fwd_scale, fwd_scale_inv, bwd_scale, bwd_scale_inv;
  };
  AttentionScales attention_scales(int id) const;
  // The scaling of attention `id`'s QKV (forward) or dO (backward) cast: the current scale, amax
  // into history row 0 when training (q, k and v share one scale, as TE's QKV quantizer).
  Scaling attention_scaling(int id, bool forward, bool training) const;
  // The scaling of attention `id`'s O (its current scale, nothing recorded): linear_proj's input
  // under --fp8-multi-head-attention where the model-dtype attention ran (KV-cache inference).
  Scaling attention_output_scaling(int id) const;
  // Records the FP8 attention op's amaxes (written by the op) into history row 0 when training:
  // forward amax [2] -> S, O; backward amax [4] -> dP, and max(dQ, dK, dV) for dQKV.
  void record_attention_amax(int id, bool forward, const Tensor& amax, bool training) const;

  // The scaling of operand `role` of linear `id` for the tensors `xs` (one scale for all: the
  // parts of a split GEMM). Delayed: the current scale, amax into history row 0 when training.
  // Tensorwise: amax of xs reduced (max) over `group` (null: none), scale from it.
  Scaling scaling(int id, Role role, std::span<const Tensor> xs, bool training,
                  comm::ProcessGroup* group);
  Scaling scaling(int id, Role role, std::span<const Operand> xs, bool training,
                  comm::ProcessGroup* group);
  // The quantised x (q: like x, qt: [C, R] of x viewed as [R, C]); either may be skipped.
  void cast(const Scaling& s, const Tensor& x, Tensor* q, Tensor* qt) const;
  // The same for an operand (q: [R, C]).
  void cast(const Scaling& s, const Operand& x, Tensor* q, Tensor* qt) const;

  // The FP8 copy of linear `id`'s weight w [out, in] cut into parts of `part_rows` rows (empty:
  // one part), its scaling as scaling(id, Role::weight, ...). An FP8 w (--fp8-param-gather: the
  // FP8 parameter, param_q, or its regrouped rows) is used as it is: no cast and no amax, only the
  // transposes, with the parameter's scale_inv. cached_weight: the copy of this
  // forward-backward call (null when none is cached or the pass does not train).
  const WeightFp8* cached_weight(int id, bool training) const;
  WeightFp8 cast_weight(int id, const Tensor& w, std::span<const int64_t> part_rows, bool training,
                        comm::ProcessGroup* group);
  // Opens the weight cache for one forward-backward call (every weight is cast again on its first
  // use; Megatron's set_is_first_microbatch), closes and empties it at the end.
  class WeightCacheScope {
   public:
    explicit WeightCacheScope(Fp8State* s);
    ~WeightCacheScope();
    WeightCacheScope(const WeightCacheScope&) = delete;
    WeightCacheScope& operator=(const WeightCacheScope&) = delete;

   private:
    Fp8State* s_;
  };
  // Weight casts so far (one per weight tensor cast; tests).
  int64_t weight_casts() const { return weight_casts_; }

  // --fp8-param-gather (config().param_gather; docs/fp8.md "FP8 parameters"): the FP8 linears'
  // weights as FP8 model parameters, Transformer Engine's Float8Tensor weights.
  // bind_params (after finalize, once the model's buffer exists): each FP8 linear's weight is
  // "<linear>.weight" of `params`; allocates the FP8 storage, 1 byte per element, in runs of
  // adjacent weights of the flat buffer (ParamRun), zero until the first quantize_param_shards.
  void bind_params(const std::vector<transformer::Parameter>& params);
  bool param_gather() const { return cfg_.param_gather; }
  const std::vector<ParamRun>& param_runs() const { return runs_; }
  // The linear whose FP8 weight parameter `param` is (-1: none).
  int linear_of_param(std::size_t param) const;
  // Linear `id`'s FP8 weight parameter q [out, in] (a view of its run) and its scale_inv (f32 [1]).
  Tensor param_q(int id) const;
  Tensor param_scale_inv(int id) const;
  // Transformer Engine's cast_master_weights_to_fp8 (Megatron's quantize_param_shard after the
  // distributed optimizer's step): this rank's master shards of FP8 weights (others are skipped)
  // cast into the FP8 storage at their flat offsets. Delayed: with the weight's current scale s,
  // q = sat(rne(master * s)), amax of the master shard into history row 0 (the weight's slot),
  // row 0 max-reduced over `dp`, the parameter's scale_inv = 1 / s. Tensorwise: amax of the
  // master shards max-reduced over `dp` then `tp`, s = fp8_max / amax, the same cast. Collective
  // over dp (and tp): every rank calls it, in the same order.
  void quantize_param_shards(std::span<const MasterShard> shards, comm::ProcessGroup* dp,
                             comm::ProcessGroup* tp);
  // Every FP8 parameter dequantised into its model-dtype tensor (q * scale_inv in f32, rounded
  // once; TE's Float8Tensor.dequantize): what a checkpoint stores for it.
  void dequantize_params(std::vector<transformer::Parameter>& params) const;

  // After a training forward (forward = true) or backward pass: delayed scaling's amax reduction
  // over `group` (max; null: none; one all-reduce of every linear's amaxes) and the scale update
  // (the fp8_scale_update op: no host copy). Nothing for tensorwise.
  void update(bool forward, comm::ProcessGroup* group);

  // The host values (tests, checkpoints): history [len, slots], scale and scale_inv [slots].
  std::vector<float> history(bool forward) const;
  std::vector<float> scale(bool forward) const;
  std::vector<float> scale_inv(bool forward) const;
  // {"recipe", "format", "amax_history_len", "linears": {name: {fwd/bwd history, scale,
  // scale_inv as f32 bit patterns}}, "attentions": {name: the same, three slots each way}};
  // load_state_json restores the linears and attentions it names (one it lacks keeps its fresh
  // state) and refuses another history length or recipe.
  nlohmann::json state_json() const;
  void load_state_json(const nlohmann::json& j);

 private:
  struct Buffers {
    Tensor history, scale, scale_inv;  // [len, slots], [slots], [slots] f32
  };
  // Delayed scaling of slot `slot` of the forward / backward buffers: its scale, a copy of its
  // scale_inv, its history row 0 as the amax when training (else a scratch).
  Scaling delayed_scaling(int64_t slot, bool forward, bool training) const;
  // fp8_cast_transpose of the operand (or the fused op making it).
  void cast_operand(const Operand& x, Tensor& q, Tensor& qt, Tensor& amax,
                    const Tensor& scale) const;
  Buffers& buffers(bool forward) { return forward ? fwd_ : bwd_; }
  const Buffers& buffers(bool forward) const { return forward ? fwd_ : bwd_; }
  int slots(bool forward) const {
    return (forward ? 2 * num_linears() : num_linears()) + 3 * num_attentions();
  }
  // The first slot of attention `id` in the forward / backward buffers.
  int attention_slot(int id, bool forward) const {
    return (forward ? 2 * num_linears() : num_linears()) + 3 * id;
  }

  Fp8Config cfg_;
  const ops::OpTable* ops_;
  Device device_;
  std::vector<std::string> names_;
  std::vector<std::string> attn_names_;
  Buffers fwd_, bwd_;
  Tensor one_;  // f32 [1] = 1 on the device (amax-only casts)
  bool finalized_ = false;
  bool cache_open_ = false;
  std::vector<WeightFp8> weights_;  // [linear] the cached copies
  std::vector<char> weight_valid_;  // [linear]
  // --fp8-param-gather: the FP8 storage, each linear's weight parameter index and q view, the
  // parameters' scale_inv [linears] f32, and param -> linear.
  std::vector<ParamRun> runs_;
  std::vector<std::size_t> param_of_;
  std::vector<Tensor> param_q_;
  Tensor param_scale_inv_;
  std::vector<int> linear_of_param_;
  bool params_cast_ = false;  // quantize_param_shards ran
  int64_t weight_casts_ = 0;
};

// Delayed scaling's update on host values (Transformer Engine's
// _default_get_amax_and_update_history + _default_sf_compute): history [len, slots] is rolled in
// place, scale and scale_inv [slots] updated. Exposed for the reference test.
void delayed_update(std::vector<float>& history, std::vector<float>& scale,
                    std::vector<float>& scale_inv, int64_t len, int64_t slots, float fp8_max,
                    int64_t margin, AmaxComputeAlgo algo);
// max-all-reduces x over group (null or size 1: nothing); a device tensor is staged through the
// host only when the group's backend carries host tensors alone (MPI).
void all_reduce_max(comm::ProcessGroup* group, Tensor& x);
// Current scaling's scale from an amax: fp8_max / amax (1 when amax is 0 or not finite; the f32
// maximum when the quotient overflows).
float current_scale(float amax, float fp8_max);

}  // namespace mg::fp8
