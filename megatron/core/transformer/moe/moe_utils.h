// Mixture-of-Experts routing math (megatron/core/transformer/moe/moe_utils.py and router.py), on
// host vectors in f64: score functions, top-k with capacity (token dropping), the load-balancing
// losses (switch aux loss, sequence aux loss) and the z-loss, each with its exact backward;
// Megatron's MoEAuxLossAutoScaler scale and the per-layer metrics
// tracker that the training log prints (per model: MoEState).
//
// Layouts: logits / scores [T, E] row-major (token t = row, sequence-first: t = s * B + b);
// top-k results [T, K] (the k-th choice of token t at t * K + k, experts in descending score).
// Gradient rule: d(logits) is accumulated (+=) by every backward here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/ops/op_args.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/transformer_config.h"

namespace mg::transformer::moe {

struct RouterOptions {
  int64_t num_experts = 0;
  int64_t topk = 1;
  MoeScoreFunction score_function = MoeScoreFunction::softmax;
  bool pre_softmax = false;
  std::optional<double> capacity_factor;  // nullopt: dropless
  MoeTokenDropPolicy drop_policy = MoeTokenDropPolicy::probs;
  int64_t num_groups = 0, group_topk = 0;  // group-limited routing (0: off)
  std::optional<double> scaling_factor;    // probabilities times this (nullopt: none)
  static RouterOptions from_config(const TransformerConfig& c);
  // The options of the moe_router_topk op's arguments (the CPU kernel runs the host routing).
  static RouterOptions from_op_args(const ops::MoeRouterArgs& a, int64_t num_experts);
};

// Megatron's topk_softmax_with_capacity for T local tokens.
struct Routing {
  int64_t num_tokens = 0, num_experts = 0, topk = 0;
  std::vector<int64_t> expert;  // [T, K] chosen experts, descending score (ties: lower index)
  std::vector<double> prob;     // [T, K] their routing probabilities
  std::vector<uint8_t> kept;    // [T, K] 1 unless dropped for capacity (all 1 when dropless)
  std::vector<double> scores;   // [T, E] the score function's output (backward)
  std::vector<double> tokens_per_expert;  // [E] choices per expert before dropping
  int64_t capacity = -1;                  // per expert; -1 dropless
};

//   softmax, pre_softmax: s = softmax(l); top-k of s; prob = s at the chosen experts
//   softmax            : top-k of l; prob = softmax over the k chosen logits
//   sigmoid            : s = sigmoid(l); top-k of s; prob = s / (sum of the k chosen + 1e-20)
//                        (k > 1; k = 1 keeps s)
// Megatron's topk_routing_with_score_function: the choice is made on the selection values v
// (l for softmax without pre-softmax, else s; sigmoid with an expert bias: s + bias, the bias
// never reaching the probabilities). Group-limited routing (num_groups G, group_topk g): each
// group of E / G consecutive experts scores the sum of its k / g largest v, the g best groups
// (ties: lower group) are kept and the top k of v is taken among their experts only. Without
// groups or bias the top k of the logits is taken (the same order, the score functions being
// monotonic). scaling_factor multiplies the probabilities last.
// Capacity c = ceil(T k / E * factor) per expert: policy probs keeps each expert's c chosen tokens
// with the highest probabilities (ties: lower token), position its first c chosen tokens.
// expert_bias (optional, [E]): sigmoid only (the caller checks).
Routing topk_routing(const std::vector<double>& logits, int64_t num_tokens, const RouterOptions& o,
                     const std::vector<float>* expert_bias = nullptr);
// d(prob) [T, K] (dropped entries ignored) -> d(logits) [T, E] += the routing's backward.
void topk_routing_backward(const Routing& r, const std::vector<double>& logits,
                           const std::vector<double>& dprob, const RouterOptions& o,
                           std::vector<double>& dlogits);

// The scores the load-balancing losses use: softmax(l), or sigmoid(l) normalised per token.
std::vector<double> aux_loss_scores(const std::vector<double>& logits, int64_t num_tokens,
                                    int64_t num_experts, MoeScoreFunction f);
// d(scores) -> d(logits) += through aux_loss_scores.
void aux_loss_scores_backward(const std::vector<double>& logits, const std::vector<double>& scores,
                              const std::vector<double>& dscores, int64_t num_tokens,
                              int64_t num_experts, MoeScoreFunction f,
                              std::vector<double>& dlogits);

// Megatron's switch_load_balancing_loss_func with a sequence partition of `num_sub_sequence`
// ranks: loss = sum_e (sum_t scores[t, e]) * tokens_per_expert[e] * E * coeff / (k * N^2), with
// N = T * num_sub_sequence and tokens_per_expert summed over the partition (the caller's
// all-reduce). The partition's losses sum to the whole sequence's. dscores (optional, [T, E]) +=
// d loss / d scores.
double switch_load_balancing_loss(const std::vector<double>& scores, int64_t num_tokens,
                                  int64_t num_experts, const std::vector<double>& tokens_per_expert,
                                  int64_t topk, int64_t num_sub_sequence, double coeff,
                                  std::vector<double>* dscores);
// Megatron's sequence_load_balancing_loss_func (DeepSeek-V2's per-sequence aux loss): rows are
// t = s * B + b over S local positions; counts [B, E] are the chosen-expert counts per sequence
// summed over the partition, S_full = S * num_sub_sequence:
//   loss = coeff / B * sum_b sum_e counts[b, e] * E / (S_full k) * sum_s scores[s, b, e] / S_full
double sequence_load_balancing_loss(const std::vector<double>& scores, int64_t seq_local,
                                    int64_t batch, int64_t num_experts,
                                    const std::vector<double>& counts, int64_t topk,
                                    int64_t num_sub_sequence, double coeff,
                                    std::vector<double>* dscores);
// The same losses from the score sums the router op forms on the device (moe_router_topk's
// aux_sums; the same arithmetic as above): switch from sums [E] (sum over the T tokens of
// scores[t, e]), drow (optional) = [E] d loss / d scores[t, e] of every token; sequence from sums
// [B, E] (sum over the S positions of scores[s * B + b, e]), drows (optional) = [B, E]
// d loss / d scores[s * B + b, e] of every s.
double switch_load_balancing_loss_from_sums(const std::vector<double>& sums, int64_t num_tokens,
                                            int64_t num_experts,
                                            const std::vector<double>& tokens_per_expert,
                                            int64_t topk, int64_t num_sub_sequence, double coeff,
                                            std::vector<double>* drow);
double sequence_load_balancing_loss_from_sums(const std::vector<double>& sums, int64_t seq_local,
                                              int64_t batch, int64_t num_experts,
                                              const std::vector<double>& counts, int64_t topk,
                                              int64_t num_sub_sequence, double coeff,
                                              std::vector<double>* drows);
// Megatron's z_loss_func: coeff * mean_t logsumexp(l_t)^2; dlogits (optional) += scale * grad.
double z_loss(const std::vector<double>& logits, int64_t num_tokens, int64_t num_experts,
              double coeff, double scale, std::vector<double>* dlogits);
// sum_t logsumexp(l_t)^2 over the tokens in order (z_loss = coeff * z_loss_sum / T).
double z_loss_sum(const std::vector<double>& logits, int64_t num_tokens, int64_t num_experts);

// Megatron's get_updated_expert_bias in f32: bias[e] += sign(mean - tokens[e]) * rate, mean the
// average of tokens (already summed over the tp-dp-cp group).
void update_expert_bias(std::vector<float>& bias, const std::vector<double>& tokens, double rate);

// Megatron's MoEAuxLossAutoScaler: the aux and z losses' backward seed, which must match the lm
// loss's: loss_scale / num_microbatches (loss_scale alone under calculate_per_token_loss). Set by
// the training step before the backward passes; 1 by default. One per model (MoEState), not
// process-wide as in Megatron.
class MoEAuxLossAutoScaler {
 public:
  void set_loss_scale(double scale) { scale_ = scale; }
  double loss_scale() const { return scale_; }

 private:
  double scale_ = 1.0;
};

// Megatron's MoE layer-wise logging tracker: per layer (global number), the load-balancing and z
// losses (without their coefficients, summed over the layer's micro-batches) and the tokens each
// expert was chosen by (summed). Layers add in backward, so a recomputed forward is not counted
// twice. One per model (MoEState), not process-wide as in Megatron.
struct MoELayerMetrics {
  double load_balancing_loss = 0.0;
  double z_loss = 0.0;
  std::vector<double> tokens_per_expert;
  int64_t microbatches = 0;
};
// A layer's losses may still be on the device (add_pending: Megatron's tracker keeps device
// tensors too): they are computed, in the order added, when layers() is asked or the next add
// comes, so the sums are the same as with immediate adds. Their device values live in slots of a
// few shared buffers (device_slot), each read with one host round trip when the tracker resolves.
class MoEMetricsTracker {
 public:
  void add(int64_t layer, double lb_loss, double z_loss, const std::vector<double>& tokens);
  // A zeroed f64 slot [n] on `device` from the tracker's buffers (kept until the next resolve).
  Tensor device_slot(int64_t n, Device device);
  // losses(the slot's values) -> (load-balancing loss, z-loss), called once at resolution; slot
  // from device_slot.
  void add_pending(int64_t layer, std::vector<double> tokens, const Tensor& slot,
                   std::function<std::pair<double, double>(std::span<const double>)> losses);
  std::map<int64_t, MoELayerMetrics>& layers() {
    resolve();
    return layers_;
  }
  void clear() {
    pending_.clear();
    chunks_.clear();
    layers_.clear();
  }

 private:
  struct Pending {
    int64_t layer;
    std::vector<double> tokens;
    std::size_t chunk;  // chunks_.size(): `own` (a slot of buffers already resolved)
    int64_t offset, n;
    Tensor own;
    std::function<std::pair<double, double>(std::span<const double>)> losses;
  };
  void resolve();
  void accumulate(int64_t layer, double lb_loss, double z_loss, const std::vector<double>& tokens);
  std::map<int64_t, MoELayerMetrics> layers_;
  std::vector<Pending> pending_;
  std::vector<Tensor> chunks_;  // f64 device buffers the slots are cut from
  int64_t chunk_used_ = 0;      // values handed out of the last chunk
};

// The MoE state of one model, mutated by its MoE layers: owned by the GPTModel
// (GPTModel::moe_state()), reached by its layers through ModuleContext::moe.
// --moe-router-enable-expert-bias: a router's buffers (Megatron's TopKRouter.expert_bias, f32,
// saved in checkpoints, and local_tokens_per_expert, the kept choices per expert of the training
// micro-batches since the last update, counted in backward so a recomputed forward is not counted
// twice).
struct ExpertBiasState {
  std::vector<float> expert_bias;
  std::vector<double> local_tokens_per_expert;
};

struct MoEState {
  MoEAuxLossAutoScaler aux_loss_auto_scaler;
  MoEMetricsTracker metrics_tracker;
  // Per MoE layer (global number) under --moe-router-enable-expert-bias; filled by the layers.
  std::map<int64_t, ExpertBiasState> expert_bias;

  // Megatron's _update_router_expert_bias (finalize_model_grads): the local tokens per expert of
  // every layer summed over `group` (tp-dp-cp; null: this rank alone), each bias moved by
  // update_expert_bias, the counts zeroed. Collective over `group` (its ranks hold the same
  // layers).
  void update_expert_biases(comm::ProcessGroup* group, double rate);
  // The biases by Megatron's name "decoder.layers.N.mlp.router.expert_bias" -> [E] values, and
  // back (names this model does not hold are ignored; returns how many were loaded).
  std::map<std::string, std::vector<float>> expert_bias_state() const;
  int64_t load_expert_bias_state(const std::map<std::string, std::vector<float>>& state);
};

// The training log's MoE part, Megatron's track_moe_metrics: a collective over `world` (every rank
// calls it at each log line with the same arguments; null: this process only). Per layer: the
// load-balancing and z losses averaged over micro-batches and data-parallel replicas (summed over
// the sequence partition of `seq_partition` ranks), and the tokens each expert was chosen by per
// iteration (the whole batch), from `tracker` (the model's), which it clears.
struct MoELogLines {
  std::string inline_part;  // " load_balancing_loss: 1.000123E+00 | z_loss: ... |" (layer mean)
  std::string layer_lines;  // per_layer: one " moe layer N | load_balancing_loss: ... | tokens
                            // per expert: [...]" line per MoE layer, each ending in "\n"
  // Megatron's TensorBoard scalars: "load_balancing_loss", "z_loss" (layer means) and, per_layer,
  // "moe/load_balancing_loss_layer_<l>", "moe/z_loss_layer_<l>" (l 0-based, global).
  std::vector<std::pair<std::string, double>> scalars;
};
MoELogLines moe_metrics_log(MoEMetricsTracker& tracker, comm::ProcessGroup* world,
                            const TransformerConfig& config, int64_t seq_partition,
                            int64_t iterations, bool per_layer = true);

}  // namespace mg::transformer::moe
