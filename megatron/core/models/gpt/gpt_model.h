// GPTModel: Megatron-Core's decoder-only language model with explicit forward and backward.
//
//   tokens [B, S] -> embedding (word + learned positions, dropout) -> [S, B, H]
//     -> L transformer layers (per the layer spec) -> final norm -> output layer (tied to the word
//     embedding unless untied) -> logits [S, B, V_pad] -> cross entropy against labels -> loss [S,
//     B]
//
// Parameters carry Megatron-Core's names (FORMATS.md §6) and are views into one flat value buffer
// and one flat gradient buffer (parameter.h; main_grad f32 under bf16/f16). All compute goes
// through the op table given at construction, so the same code runs on every platform.
//
// Activations of one micro-batch live in a caller-owned GPTForwardState, so a schedule can hold
// several micro-batches in flight. forward() fills it; backward() consumes it (and releases it),
// accumulating (+=) into the gradient buffer. Dropout masks are counter-based: each (iteration,
// micro-batch, layer, site) has its own Philox seed (StepRng), so recomputation replays them
// exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/inference/inference_context.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/parameter.h"
#include "megatron/core/transformer/transformer_config.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::models {

// One micro-batch, as Megatron's get_batch gives it. Host or device tensors; the model copies them
// to its device. Only tokens is required.
struct GPTBatch {
  Tensor tokens;        // [B, S] i64 (or i32)
  Tensor labels;        // [B, S] i64 (or i32); required for the loss
  Tensor loss_mask;     // [B, S] f32; undefined -> all ones
  Tensor position_ids;  // [B, S] i64 (or i32); undefined -> 0..S-1 in every row
  Tensor doc_ids;       // [B, S] i32; when defined, attention stays within equal ids (packed docs)
};

// Where the dropout randomness of one micro-batch comes from. Every (iteration, microbatch, layer,
// site) derives its own Philox seed from these, so masks are reproducible and recompute replays
// them; nothing is stored between calls.
struct StepRng {
  uint64_t seed = 1234;    // --seed
  int64_t iteration = 0;   // training iteration
  int64_t microbatch = 0;  // index of the micro-batch within the iteration
};

// What forward() reports for one micro-batch: sum over tokens of loss * loss_mask (f64, summed on
// the host) and sum of loss_mask. Megatron's loss_func returns the same pair.
struct LossSums {
  double loss_sum = 0.0;
  double num_tokens = 0.0;
};

// Tensor (and sequence) parallelism of a GPTModel: this rank's TP group (null: one rank) and
// --sequence-parallel. With TP, every parameter is this rank's shard of Megatron's global tensor
// (Parameter::global_shape, tensor_parallel_dim, partition_stride): vocab-parallel embedding and
// output layer, column-parallel linear_qkv/linear_fc1, row-parallel linear_proj/linear_fc2; the
// padded vocabulary is a multiple of make_vocab_size_divisible_by x TP (Megatron's rule: it grows
// with TP, so the loss equals the TP = 1 loss of the same padded vocabulary). Logits stay
// vocab-parallel (never gathered) into the vocab-parallel cross entropy. Parameters marked
// sequence_parallel (norms and replicated biases under SP, q/k layernorm) need
// tensor_parallel::all_reduce_sequence_parallel_grads after the last micro-batch's backward.
//
// exclude_vocab_padding (not Megatron's behaviour, which keeps the padding rows' logits in the
// softmax): the output layer computes logits for the real vocabulary rows only, so the loss and
// gradients do not depend on the padding, which grows with TP (PITFALLS #1: with V = 50257 and
// --make-vocab-size-divisible-by 128, V_pad is 50304 at TP 1 but 50432 at TP 2). A rank whose shard
// is all padding gets empty logits. Set it alike in the runs being compared.
struct GPTModelParallel {
  comm::ProcessGroup* tp_group = nullptr;
  bool sequence_parallel = false;
  bool exclude_vocab_padding = false;
};

namespace detail {
struct GPTSaved;  // saved activations of one micro-batch (gpt_model.cpp)
}

// Caller-owned activations of one micro-batch between forward() and backward().
class GPTForwardState {
 public:
  GPTForwardState();
  ~GPTForwardState();
  GPTForwardState(GPTForwardState&&) noexcept;
  GPTForwardState& operator=(GPTForwardState&&) noexcept;
  // True between a forward() and its backward().
  bool holds_activations() const;
  void clear();  // drop the saved activations

 private:
  friend class GPTModel;
  std::unique_ptr<detail::GPTSaved> saved_;
};

class GPTModel {
 public:
  // Builds the modules and the parameter/grad buffers on `device`, weights uninitialised (call
  // init_weights or load them). `config` is copied and finalize()d. `spec` defaults to
  // get_gpt_layer_with_transformer_engine_spec(config).
  GPTModel(const transformer::TransformerConfig& config, int64_t vocab_size,
           const ops::OpTable& ops, Device device);
  GPTModel(const transformer::TransformerConfig& config, int64_t vocab_size,
           const ops::OpTable& ops, Device device, const transformer::TransformerLayerSpec& spec);
  GPTModel(const transformer::TransformerConfig& config, int64_t vocab_size,
           const ops::OpTable& ops, Device device, const transformer::TransformerLayerSpec& spec,
           const GPTModelParallel& parallel);
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  const transformer::TransformerConfig& config() const;
  const transformer::TransformerLayerSpec& spec() const;
  int64_t vocab_size() const;         // as given
  int64_t padded_vocab_size() const;  // V_pad: rows of the embedding and output layer (global)
  const GPTModelParallel& parallel() const;
  Device device() const;
  const ops::OpTable& ops() const;

  // Every parameter, in order of first use in forward (embedding first). The buffers lay them out
  // in the reverse order (see parameter.h).
  std::vector<transformer::Parameter>& parameters();
  const std::vector<transformer::Parameter>& parameters() const;
  // The parameter named `name` (Megatron-Core name); throws listing the names when absent.
  transformer::Parameter& parameter(std::string_view name);
  transformer::ParamAndGradBuffer& buffer();
  int64_t num_parameters() const;  // elements in the value buffer

  // Megatron's init from the Philox init ops: weights normal(0, init_method_std), linear_proj and
  // linear_fc2 weights normal(0, std / sqrt(2 L)), biases 0, norm weights 1 (0 with
  // apply_layernorm_1p) and norm biases 0. Each tensor draws from its own seed derived from `seed`
  // and its name, element i of the FULL tensor from counter i, so TP shards can slice it.
  void init_weights(uint64_t seed);
  // main_grad = 0 for every parameter (the whole gradient buffer).
  void zero_grad();

  // Runs one micro-batch and keeps what backward() needs in `state`. training: dropout active.
  // Returns {sum of loss * loss_mask, sum of loss_mask} (labels required).
  LossSums forward(const GPTBatch& batch, GPTForwardState& state, const StepRng& rng,
                   bool training);
  // Accumulates (+=) d(dloss * sum over tokens of loss * loss_mask)/d(param) into every main_grad:
  // dloss is the weight of every masked token's loss (e.g. 1 / num_tokens / num_microbatches times
  // the fp16 loss scale). Consumes `state`.
  void backward(GPTForwardState& state, double dloss);

  // Called once per parameter (its index in parameters()) during backward(), as soon as that
  // parameter's gradient contribution of the micro-batch is complete: after the output layer (when
  // untied), the final norm, each layer (last first), then the embeddings (the tied word
  // embedding last, since the output layer and the embedding both add to it). DDP's
  // --overlap-grad-reduce launches bucket reductions from it (Megatron's grad-accumulation hooks).
  // Empty by default; it observes and never changes what backward computes.
  using GradReadyHook = std::function<void(std::size_t param_index)>;
  void set_grad_ready_hook(GradReadyHook hook);

  // Logits [S, B, V_pad] (f32 under bf16/f16, else the params dtype) without dropout, for tests and
  // generation; labels are not needed. With TP: this rank's vocabulary columns [S, B, V_pad/TP]
  // (exclude_vocab_padding: only its real rows, V overall).
  Tensor logits(const GPTBatch& batch);
  // The per-token loss [S, B] (compute dtype) of the last forward() held in `state`.
  Tensor token_losses(const GPTForwardState& state) const;

  // ---- inference with a KV cache (megatron/core/inference/) ----
  // The next Sq tokens of every sequence, tokens [B, Sq] (host or device; B the context's
  // max_batch_size), at positions ic.sequence_len_offset + [0, Sq): appends their keys/values to
  // the cache, advances the offset by Sq and returns their logits [Sq, B, V_pad] (f32; f64 for
  // f64), as logits() of the whole sequence would give for these positions. No dropout. A prompt
  // is one call (prefill), then one call per generated token. Not with sequence parallelism.
  Tensor infer(const Tensor& tokens, inference::StaticInferenceContext& ic);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mg::models
