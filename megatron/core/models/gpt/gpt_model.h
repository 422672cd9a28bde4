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
// Pipeline parallelism (Megatron's pre_process / post_process): a model may hold only some of the
// layers, as one or several chunks (virtual pipeline stages, PipelineChunk). A chunk with
// pre_process starts at the embedding, one without starts from the previous stage's hidden states;
// a chunk with post_process ends with final norm, output layer and loss, one without returns its
// hidden states (forward_chunk / backward_chunk). Layers keep their GLOBAL numbers in names and
// dropout seeds ("decoder.layers.<offset + i>."), so a stage's parameters and activations equal
// the single-stage model's. With tied embeddings, a last stage without the embedding builds its
// own copy of the word embedding as output weight (Megatron's shared embedding): same name, same
// init (so equal to the first stage's copy), Parameter::shared = true;
// distributed::finalize_model_grads keeps the two copies equal by summing their grads over the
// embedding group (shared_embedding_or_output_weight).
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
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/inference/inference_context.h"
#include "megatron/core/models/common/language_module.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/transformer/parameter.h"
#include "megatron/core/transformer/transformer_config.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::transformer::moe {
struct MoEState;  // transformer/moe/moe_utils.h
}

namespace mg::models {

// The model-independent types of a micro-batch (models/common/language_module.h).
using GPTBatch = Batch;

// Tensor (and sequence) parallelism of a GPTModel: this rank's TP group (null: one rank) and
// --sequence-parallel. With TP, every parameter is this rank's shard of Megatron's global tensor
// (Parameter::global_shape, tensor_parallel_dim, partition_stride): vocab-parallel embedding and
// output layer, column-parallel linear_qkv/linear_fc1, row-parallel linear_proj/linear_fc2; the
// padded vocabulary is a multiple of make_vocab_size_divisible_by x TP (Megatron's rule: it grows
// with TP, so the loss equals the TP = 1 loss of the same padded vocabulary). Logits stay
// vocab-parallel (never gathered) into the vocab-parallel cross entropy. Parameters marked
// sequence_parallel (norms and replicated biases under SP, q/k layernorm) have their grads summed
// over TP after the last micro-batch's backward (distributed::finalize_model_grads).
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
  // Expert parallelism (MoE layers, transformer/moe/moe_layer.h): the expert-model-parallel group
  // the routed experts are spread over (null: every expert on this rank).
  comm::ProcessGroup* ep_group = nullptr;
  // Expert tensor parallelism: the expert-TP group (null: ETP 1).
  comm::ProcessGroup* expert_tp_group = nullptr;
  // Built for forward-only use (generation, export): MoE layers then accept tensor parallelism
  // without sequence parallelism (router and experts replicated over TP, no gradients).
  bool inference_only = false;
  // Context parallelism (transformer/context_parallel.h): the CP group and --cp-comm-type. The
  // batch then holds this rank's two sequence chunks (r and 2 CP - 1 - r, with their real
  // position ids), only core attention crosses the group, and forward reports num_tokens as the
  // whole sequence's count / CP (see LossSums).
  transformer::ContextParallel cp;
  // MoE with sequence parallelism and CP: the tp-cp group, over which the aux losses' token
  // counts are summed (Megatron's tp_cp_group; null otherwise).
  comm::ProcessGroup* tp_cp_group = nullptr;
  // The chunks this rank builds, in virtual-stage order (chunk v of pipeline rank p is virtual
  // stage v * PP + p); only the first may be pre_process, only the last post_process; layer ranges
  // ascending and disjoint. Empty: one chunk with every layer, pre_process and post_process (no
  // pipelining).
  std::vector<PipelineChunk> pipeline_chunks;
  // FP8 delayed scaling (TransformerConfig::fp8): the group the amaxes are reduced over (max)
  // after each pass -- Megatron's amax reduction group, tp-dp-cp (tp-cp with --tp-only-amax-red).
  // Null: this rank's own amaxes.
  comm::ProcessGroup* amax_group = nullptr;
  // Megatron FSDP optim_grads / optim_grads_params on a device: the flat parameter and gradient
  // buffers come from the platform's sparse allocator, so that their discarded ranges give
  // device memory back (distributed_data_parallel.h). No effect on the host.
  bool sparse_buffers = false;
};

namespace detail {
struct GPTSaved;  // saved activations of one micro-batch (gpt_model.cpp)
}

// Caller-owned activations of one micro-batch between forward() and backward().
class GPTForwardState final : public ForwardState {
 public:
  GPTForwardState();
  ~GPTForwardState() override;
  GPTForwardState(GPTForwardState&&) noexcept;
  GPTForwardState& operator=(GPTForwardState&&) noexcept;
  // True between a forward() and its backward().
  bool holds_activations() const override;
  void clear() override;  // drop the saved activations

 private:
  friend class GPTModel;
  std::unique_ptr<detail::GPTSaved> saved_;
};

class GPTModel final : public LanguageModule {
 public:
  // Builds the modules and the parameter/grad buffers on `device`, weights uninitialised (call
  // init_weights or load them). `config` is copied and finalize()d. `spec` (one layer spec per
  // layer, checked against the config: check_block_spec) defaults to
  // get_gpt_decoder_block_spec(config).
  GPTModel(const transformer::TransformerConfig& config, int64_t vocab_size,
           const ops::OpTable& ops, Device device);
  GPTModel(const transformer::TransformerConfig& config, int64_t vocab_size,
           const ops::OpTable& ops, Device device, const transformer::TransformerBlockSpec& spec);
  GPTModel(const transformer::TransformerConfig& config, int64_t vocab_size,
           const ops::OpTable& ops, Device device, const transformer::TransformerBlockSpec& spec,
           const GPTModelParallel& parallel);
  ~GPTModel() override;
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  const transformer::TransformerConfig& config() const override;
  const transformer::TransformerBlockSpec& spec() const;
  int64_t vocab_size() const override;  // as given
  // V_pad: rows of the embedding and output layer (global)
  int64_t padded_vocab_size() const override;
  const GPTModelParallel& parallel() const;
  Device device() const override;
  const ops::OpTable& ops() const override;

  // Every parameter, in order of first use in forward (embedding first). The buffers lay them out
  // in the reverse order (see parameter.h).
  std::vector<transformer::Parameter>& parameters() override;
  const std::vector<transformer::Parameter>& parameters() const;
  // The parameter named `name` (Megatron-Core name); throws listing the names when absent.
  transformer::Parameter& parameter(std::string_view name);
  transformer::ParamAndGradBuffer& buffer() override;
  int64_t num_parameters() const override;  // elements in the value buffer

  // Megatron's init from the Philox init ops: weights normal(0, init_method_std), linear_proj and
  // linear_fc2 weights normal(0, std / sqrt(2 L)), biases 0, norm weights 1 (0 with
  // apply_layernorm_1p) and norm biases 0. Each tensor draws from its own seed derived from `seed`
  // and its name, element i of the FULL tensor from counter i, so TP shards can slice it.
  void init_weights(uint64_t seed) override;
  // main_grad = 0 for every parameter (the whole gradient buffer).
  void zero_grad();

  // Runs one micro-batch and keeps what backward() needs in `state`. training: dropout active.
  // Returns {sum of loss * loss_mask, sum of loss_mask} (labels required). The whole model only
  // (one chunk with pre_process and post_process); pipeline stages use forward_chunk.
  LossSums forward(const GPTBatch& batch, GPTForwardState& state, const StepRng& rng,
                   bool training);
  // Accumulates (+=) d(dloss * sum over tokens of loss * loss_mask)/d(param) into every main_grad:
  // dloss is the weight of every masked token's loss (e.g. 1 / num_tokens / num_microbatches times
  // the fp16 loss scale). Consumes `state`.
  void backward(GPTForwardState& state, double dloss);

  // Pipeline parallelism: the chunks this model holds (one when not pipelined).
  int num_chunks() const override;
  const PipelineChunk& chunk(int v) const override;
  // The hidden states one chunk passes to the next stage: [S, B, H] ([S/TP, B, H] under SP) in
  // the params dtype, for a micro-batch of `micro_batch_size` sequences of `seq_length`.
  Shape pipeline_tensor_shape(int64_t seq_length, int64_t micro_batch_size) const override;
  DType pipeline_tensor_dtype() const override;
  // Runs chunk v on one micro-batch. `batch` gives the shapes, the tokens (pre_process), labels
  // and loss mask (post_process), position ids and document ids (every stage). `input`: the
  // previous stage's hidden states (pipeline_tensor_shape), ignored for a pre_process chunk.
  // Returns the chunk's output hidden states, or an undefined tensor for a post_process chunk,
  // whose loss sums go to *sums (labels required there).
  Tensor forward_chunk(int v, const GPTBatch& batch, const Tensor& input, GPTForwardState& state,
                       const StepRng& rng, bool training, LossSums* sums);
  // Backward of the chunk `state` holds (consumed): output_grad = d objective / d output
  // (ignored for a post_process chunk, which starts from dloss as backward() does). Returns
  // d objective / d input, or an undefined tensor for a pre_process chunk.
  Tensor backward_chunk(GPTForwardState& state, const Tensor& output_grad, double dloss);

  // LanguageModule (models/common/language_module.h): the same calls on a model-independent
  // state (a GPTForwardState made by new_forward_state; another model's state is an error), the
  // tied word embedding.
  std::unique_ptr<ForwardState> new_forward_state() const override;
  Tensor forward_chunk(int v, const Batch& batch, const Tensor& input, ForwardState& state,
                       const StepRng& rng, bool training, LossSums* sums) override;
  Tensor backward_chunk(ForwardState& state, const Tensor& output_grad, double dloss) override;
  transformer::Parameter* shared_embedding_or_output_weight() override;

  // Called once per parameter (its index in parameters()) during backward(), as soon as that
  // parameter's gradient contribution of the micro-batch is complete: after the output layer (when
  // untied), the final norm, each layer (last first), then the embeddings (the tied word
  // embedding last, since the output layer and the embedding both add to it). DDP's
  // --overlap-grad-reduce launches bucket reductions from it (Megatron's grad-accumulation hooks).
  // Empty by default; it observes and never changes what backward computes.
  void set_grad_ready_hook(GradReadyHook hook) override;

  // Called during forward() / forward_chunk() before a module first uses its parameters, with
  // their indices in parameters(): the embedding's, then each layer's, then the final norm's and
  // output layer's. DDP's --overlap-param-gather waits there for the all-gathers of the buckets
  // holding them (Megatron's forward pre-hook). Empty by default; it never changes what forward
  // computes.
  void set_param_use_hook(ParamUseHook hook) override;
  void set_param_release_hook(ParamUseHook hook) override;
  // Called in backward before the output layer and final norm (with the tied word embedding),
  // each layer (last first) and the embeddings write their gradients.
  bool set_grad_write_hook(ParamUseHook hook) override;
  std::vector<std::vector<std::size_t>> param_units() const override;

  // This model's MoE state (transformer/moe/moe_utils.h), which its MoE layers use: the aux/z
  // losses' backward seed (Megatron's MoEAuxLossAutoScaler.set_loss_scale, set by the training
  // step) and the per-layer metrics tracker (the training log's moe_metrics_log).
  transformer::moe::MoEState& moe_state() override;
  // The FP8 linears' scaling state (fp8/fp8_state.h); null without --fp8-format.
  fp8::Fp8State* fp8_state() override;

  // Logits [S, B, V_pad] (computed in the model dtype as in training, returned in f32 under
  // bf16/f16, else the params dtype) without dropout, for tests and
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
