// LanguageModule: what the schedules, DDP, gradient finalisation and the trainer need from a model
// (Megatron-Core's LanguageModule / MegatronModule), so that they are written once for every model
// family. GPTModel implements it (models/gpt/gpt_model.h); a BERT, T5, Mamba or MTP model would
// implement the same calls and run under every schedule and parallel wrapping unchanged.
//
// A model is held by a rank as one or several chunks (virtual pipeline stages, PipelineChunk): the
// schedules run forward_chunk / backward_chunk per (micro-batch, chunk), pass the hidden states of
// pipeline_tensor_shape between stages, and keep each micro-batch's activations in a caller-owned
// ForwardState (new_forward_state) from its forward to its backward. Parameters are views into one
// flat value buffer and one flat gradient buffer (transformer/parameter.h): DDP, the optimizer and
// checkpoints work on those, never on the model's modules.
//
// Gradient rule: backward_chunk accumulates (+=) into the gradient buffer; the caller zeroes it at
// the start of an iteration. Loss semantics (what dloss means) are the schedules' (schedules.h).
// Not here: the loss function itself (each model's post_process chunk computes its own), data.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/parameter.h"
#include "megatron/core/transformer/transformer_config.h"

namespace mg::transformer::moe {
struct MoEState;  // transformer/moe/moe_utils.h
}

namespace mg::models {

// One micro-batch, as Megatron's get_batch gives it. Host or device tensors; the model copies them
// to its device. Only tokens is required.
struct Batch {
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

// What a post_process chunk reports for one micro-batch: sum over tokens of loss * loss_mask (f64,
// summed on the host) and sum of loss_mask. Megatron's loss_func returns the same pair. Under
// context parallelism num_tokens is the CP group's total / CP on every CP rank: the schedules'
// mean-loss gradient (loss_sum / num_tokens) is then Megatron's local sum x CP / global count (DDP
// averages over dp-cp), sums over dp-cp stay exact, and a rank whose tokens are all masked is no
// error.
//
// A model may leave loss_sum pending on the device (`pending`: the token losses and their host
// weights), so that a step reads its losses once, not once per micro-batch: the schedules call
// resolve_loss_sums before they use loss_sum.
struct PendingLoss {
  Tensor loss;               // [N] token losses (f32, f64 for f64), on the model's device
  std::vector<double> mask;  // [N] loss_mask weights (host)
};
struct LossSums {
  double loss_sum = 0.0;
  double num_tokens = 0.0;
  std::shared_ptr<const PendingLoss> pending;  // loss_sum not read yet
};

// Completes every pending loss_sum in `sums` with one device-to-host read (HostSync::loss) of all
// their token losses: loss_sum = sum over tokens in order of loss * mask, masked tokens skipped (a
// masked NaN must not poison the sum), in f64 on the host.
void resolve_loss_sums(std::span<LossSums* const> sums);

// One model chunk (virtual pipeline stage): layers [layer_offset, layer_offset + num_layers) of the
// global decoder; pre_process: it holds the embedding (the first virtual stage); post_process:
// final norm, output layer and loss (the last virtual stage).
struct PipelineChunk {
  int64_t layer_offset = 0;
  int64_t num_layers = 0;
  bool pre_process = true;
  bool post_process = true;
};

// Caller-owned activations of one micro-batch of one chunk, between forward_chunk and
// backward_chunk. Each model has its own concrete state (new_forward_state makes one).
class ForwardState {
 public:
  virtual ~ForwardState() = default;
  virtual bool holds_activations() const = 0;  // true between a forward and its backward
  virtual void clear() = 0;                    // drop the saved activations
};

class LanguageModule {
 public:
  virtual ~LanguageModule() = default;

  virtual const transformer::TransformerConfig& config() const = 0;
  virtual const ops::OpTable& ops() const = 0;
  virtual Device device() const = 0;

  // Every parameter this rank holds, in order of first use in forward, and the flat buffers they
  // are views of (laid out in reverse order, parameter.h).
  virtual std::vector<transformer::Parameter>& parameters() = 0;
  virtual transformer::ParamAndGradBuffer& buffer() = 0;
  virtual int64_t vocab_size() const = 0;         // as given (the real vocabulary)
  virtual int64_t padded_vocab_size() const = 0;  // rows of the embedding and output layer
  virtual int64_t num_parameters() const = 0;     // elements in the value buffer (this rank)
  // Megatron's initialisation, deterministic from `seed` and each parameter's name, so that a
  // shard of any layout equals the matching slice of the single-rank model's tensor.
  virtual void init_weights(uint64_t seed) = 0;

  // The word embedding on a pre_process chunk, or the copy a post_process chunk without the
  // embedding holds as output weight when they are tied (Megatron's
  // shared_embedding_or_output_weight); null when this rank holds neither. Pipelining with tied
  // embeddings sums its gradient over the embedding group (finalize_model_grads).
  virtual transformer::Parameter* shared_embedding_or_output_weight() = 0;

  // Pipeline parallelism: the chunks this rank holds (one when not pipelined), in virtual-stage
  // order.
  virtual int num_chunks() const = 0;
  virtual const PipelineChunk& chunk(int v) const = 0;
  // The hidden states one chunk passes to the next stage for a micro-batch of micro_batch_size
  // sequences of seq_length (sequence-parallel shards under SP).
  virtual Shape pipeline_tensor_shape(int64_t seq_length, int64_t micro_batch_size) const = 0;
  virtual DType pipeline_tensor_dtype() const = 0;

  // An empty state for forward_chunk.
  virtual std::unique_ptr<ForwardState> new_forward_state() const = 0;
  // Runs chunk v on one micro-batch; `input` is the previous stage's hidden states (ignored by a
  // pre_process chunk). Returns the output hidden states, or an undefined tensor for a
  // post_process chunk, whose loss sums go to *sums. training: dropout active.
  virtual Tensor forward_chunk(int v, const Batch& batch, const Tensor& input, ForwardState& state,
                               const StepRng& rng, bool training, LossSums* sums) = 0;
  // Backward of the chunk `state` holds (consumed): output_grad = d objective / d output (ignored
  // by a post_process chunk, which starts from dloss, the weight of every masked token's loss).
  // Returns d objective / d input, or an undefined tensor for a pre_process chunk.
  virtual Tensor backward_chunk(ForwardState& state, const Tensor& output_grad, double dloss) = 0;

  // DDP's hooks (distributed_data_parallel.h): called once per parameter as soon as its gradient
  // of the micro-batch is complete (--overlap-grad-reduce), and before a module first uses its
  // parameters in forward (--overlap-param-gather). They observe; they never change the numbers.
  using GradReadyHook = std::function<void(std::size_t param_index)>;
  using ParamUseHook = std::function<void(std::span<const std::size_t> param_indices)>;
  virtual void set_grad_ready_hook(GradReadyHook hook) = 0;
  virtual void set_param_use_hook(ParamUseHook hook) = 0;
  // FSDP optim_grads_params: the param-use hook is then also called before a module's backward
  // (and a recompute), and this one after each use, forward or backward, with the same indices;
  // between the two the module reads its parameters, never outside. A model that cannot promise
  // that keeps this default, which refuses.
  virtual void set_param_release_hook(ParamUseHook) {
    MG_THROW(
        "this model does not report when it is done with its parameters: FSDP "
        "optim_grads_params (ZeRO-3) is not available for it");
  }
  // FSDP on a device (distributed_data_parallel.h "lazy gradient commit"): called during backward
  // before a module first writes its parameters' gradients, with their indices (the head's, each
  // layer's, the embeddings'), so the gradient memory a sharded bucket gave back after its last
  // reduce-scatter is backed again just in time. Returns whether the model calls it; this default
  // does not (its gradients then stay backed between micro-batches).
  virtual bool set_grad_write_hook(ParamUseHook) { return false; }
  // The parameter indices of each unit the param-use hook reports together (a layer, the head,
  // the embeddings); FSDP's default bucket size comes from the largest. Empty: unknown.
  virtual std::vector<std::vector<std::size_t>> param_units() const { return {}; }

  // Mixture of experts: the model's own auxiliary-loss scale (Megatron's MoEAuxLossAutoScaler,
  // set by the trainer to the lm loss's seed scale, schedules.h aux_loss_scale) and metrics
  // tracker (the training log's load-balancing / z losses and tokens per expert). A model without
  // MoE layers has one that stays empty.
  virtual transformer::moe::MoEState& moe_state() = 0;
  // The FP8 scaling state (fp8/fp8_state.h: amax histories and scales, carried by checkpoints);
  // null when the model runs no FP8 GEMMs.
  virtual fp8::Fp8State* fp8_state() { return nullptr; }
};

}  // namespace mg::models
