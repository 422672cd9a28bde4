// MoELayer: Megatron-Core's MoE MLP (megatron/core/transformer/moe/moe_layer.py) with its
// TopKRouter, token dispatcher (alltoall or allgather over the expert-model-parallel group),
// SequentialMLP experts and optional shared experts; explicit forward and backward.
//
//   x [S, B, H] -> router: logits [T, E] = x W_r^T (f32; f64 for f64), top-k with optional
//   capacity (moe_utils.h) -> dispatch each kept (token, choice) to its expert's EP rank -> expert
//   e: linear_fc2(act(linear_fc1(rows))) -> back to the token's rank -> y[t] = sum_k prob[t, k] *
//   expert_out -> + shared_experts(x) (an MLP of F = moe_shared_expert_intermediate_size)
//
// Parameters (Megatron's names, the GLOBAL expert index in every name on every rank, so a layout
// with more EP ranks holds a subset of the same names and the init is EP-invariant):
//   decoder.layers.N.mlp.router.weight                                [E, H]
//   decoder.layers.N.mlp.experts.local_experts.<e>.linear_fc1.weight  [F_moe (2 F_moe gated), H]
//   decoder.layers.N.mlp.experts.local_experts.<e>.linear_fc2.weight  [H, F_moe]
//   decoder.layers.N.mlp.shared_experts.linear_fc{1,2}.weight         (as the dense MLP)
//   decoder.layers.N.mlp.shared_experts.gate_weight [1, H]  (--moe-shared-expert-gate: the shared
//     experts' output times sigmoid(x . gate_weight) per token, Qwen2-MoE's shared_expert_gate)
//   decoder.layers.N.mlp.experts.local_experts.<e>.linear_fc{1,2}.bias [F_moe (2 F_moe)], [H]
//     (without --disable-bias-linear, as Megatron's SequentialMLP; the expert output
//     fc2(act(fc1 x + b1)) + b2 is weighted by the routing probability as a whole)
// --moe-grouped-gemm keeps these SequentialMLP names and runs each of the experts' GEMMs (fc1, fc2;
// dgrad and wgrad in backward) as one grouped_gemm op over the local experts (CPU: the same numbers
// as the per-expert loop; CUDA: cublasGemmGroupedBatchedEx); it needs --disable-bias-linear.
//
// Expert parallelism (ctx.ep_group, EP ranks): rank r holds experts [r L, (r + 1) L), L = E / EP.
//   alltoall : counts per expert exchanged by all-to-all, rows by all-to-all-v (a rank may send
//              or receive none), sorted to [local expert][source rank], and back the same way;
//              the probabilities are applied on the token's own rank.
//   allgather: every rank gathers the EP group's tokens and routing, runs its experts on the
//              rows routed to them, weights them by their probabilities and reduce-scatters
//              the sums back.
// Both give each expert its rows in (source rank, token, choice) order, so the experts' sums match
// the single-rank layer's up to f32 round-off. With TP > 1 the layer needs sequence parallelism
// (each TP rank routes its own sequence shard), as Megatron requires.
//
// Expert tensor parallelism (ctx.expert_tp_group, ETP ranks, Megatron's expert grid ETP x EP x
// expert-DP x PP): each expert's linear_fc1 is column-parallel (gated: [gate_r; up_r], stride 2,
// as the dense MLP; its bias with it) and linear_fc2 row-parallel (dim 1; its bias whole). The rows
// a rank's dispatcher hands its experts are all-gathered over the expert-TP group, the experts run
// on the group's rows ([local expert][member] order) with their shards, and the partial outputs
// are reduce-scattered back (summed in member order, f64), then fc2's bias is added once; backward
// mirrors it (gather the output grads, scatter-sum the input grads). Parameters keep their global
// names and shapes; Parameter::expert_tp_rank/size place the shard for checkpoints, so they
// reshard between EP / ETP layouts.
//
// Aux losses (training only): the load-balancing loss (aux_loss / seq_aux_loss) over the scores
// of aux_loss_scores, with tokens per expert summed over the sequence partition (Megatron's
// tp_cp_group: TP under SP, times CP; each CP rank routes its own tokens), and the z-loss (coeff /
// partition size, Megatron's). They add nothing to forward's output; backward adds their gradient
// times the model's aux-loss scale to the router logits' (Megatron's MoEAuxLossAutoScaler), and
// records their values (without coefficients) and the tokens per expert in the model's
// MoEMetricsTracker: both are the model's MoEState (moe_utils.h), reached through
// ModuleContext::moe.
//
// Routing runs on the device: moe_router_topk (f64; the host's moe_utils arithmetic on the CPU)
// and, in backward, moe_router_topk_bwd with the aux and z losses' gradients. The dispatch's index
// lists are built on the device too (moe_dispatch_index: the stable counting sort of the chosen
// experts; moe_chunk_order for the all-to-all's received chunks); the chosen experts never reach
// the host. The host reads one small i64 buffer per MoE layer and micro-batch: the rows per
// expert (the experts' GEMM sizes), with the alltoall dispatcher and EP > 1 the all-to-all split
// sizes (exchanged on the device first), and this rank's choices per expert (the log's tokens
// per expert; the load-balancing loss's counts, summed over the sequence partition on the device)
// - the one synchronisation Megatron's dropless dispatcher has too. The aux losses' values wait
// on the device for the log. The alltoall dispatcher (and EP 1) moves the tokens on the device:
// moe_permute gathers the rows (and their probabilities), all-to-all-v exchanges them,
// moe_permute orders them per expert and back, moe_unpermute sums prob * expert output per token
// in f64 (its backward moe_unpermute_bwd; d(prob) back to [T, K] by moe_unpermute).
// The allgather dispatcher gathers the EP group's tokens, chosen experts and probabilities on the
// device, gathers its experts' rows with moe_permute, sums prob * expert output per gathered
// token with moe_unpermute and reduce-scatters the sums; backward: moe_unpermute_bwd, d(prob)
// all-reduced over the EP group, moe_unpermute and reduce-scatter for dx (the former host
// arithmetic bit for bit). The expert and router GEMMs and activations go through the op table.
// Expert TP's group row counts come in the same read (all-gathered on the device first); its
// replicate and member-sum lists are built on the host from them and uploaded.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/transformer/mlp.h"
#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/moe/moe_utils.h"

namespace mg::transformer::moe {

// A micro-batch's aux-loss values without coefficients (the log's), whose sums stay on the
// device until values() reads them (one host round trip): the load-balancing loss from the score
// sums (switch: one row; sequence: B rows) and the token counts (summed over the sequence
// partition), the z-loss from the sum of logsumexp^2. Both 0 when not computed.
struct AuxLossValues {
  Tensor sums;  // [G * E] score sums, then [1] the z-loss's sum, f64 (undefined: none)
  std::vector<double> counts;  // switch [E], sequence [B, E]
  bool lb = false, seq_aux = false;
  int64_t tokens = 0, seq = 0, batch = 0, experts = 0, topk = 0, partition = 1;
  // (load-balancing loss, z-loss) from the sums' values v; values() reads `sums` first.
  std::pair<double, double> values_from(std::span<const double> v) const;
  std::pair<double, double> values() const;
};

class MoELayer {
 public:
  struct Saved {
    Tensor x;       // [T, H] layer input (normalised)
    Shape shape;    // its [S, B, H]
    Tensor logits;  // [T, E] f32 (f64 for f64), on the device
    // moe_router_topk's outputs, on the device: [T, K] chosen experts, probabilities, kept mask;
    // [T, E] scores.
    Tensor expert_t, prob_t, kept_t, scores_t;
    // [E] i64 kept choices per expert (the allgather dispatcher with an expert bias: this rank's
    // for the bias update; the alltoall one has them as its rows per expert).
    Tensor kept_counts_t;
    // The host's part, from the layer's one read per micro-batch (dispatch_index): this rank's
    // choices per expert before dropping (the log's tokens per expert) and (with an expert bias)
    // its kept choices per expert.
    std::vector<double> tokens_per_expert;
    std::vector<int64_t> kept_per_expert;
    bool training = false;
    // The aux losses (training): their values, and the load-balancing loss's gradient rows
    // d loss / d scores ([G, E]; empty: no load-balancing loss).
    AuxLossValues aux;
    std::vector<double> aux_drows;
    // Dispatch: the rows this rank's tokens send (alltoall: to every expert; allgather: the
    // gathered tokens' rows for this rank's experts), and what came back. On the device, from
    // moe_dispatch_index: per row its choice, token (gathered index) and probability (f64); each
    // token's rows (moe_unpermute's offsets / token_rows); each choice's row (none when dropped:
    // moe_unpermute's lists for d(prob)); the expert outputs [rows, H] (alltoall: back on this
    // rank; allgather: the gathered tokens' rows for this rank's experts).
    int64_t rows = 0;
    std::vector<int64_t> expert_counts;             // rows per selected expert (alltoall: [E])
    std::vector<int64_t> send_counts, recv_counts;  // alltoall, per EP rank (rows)
    std::vector<int64_t> recv_expert_counts;        // alltoall, [EP][L] rows received
    Tensor row_choice_t, row_token_t, row_prob_t, token_offsets_t, token_rows_t, out_rows_t;
    Tensor entry_offsets_t, entry_rows_t;
    // alltoall, EP > 1: the received rows' [source][local expert] counts on the device, and the
    // [local expert][source] order of the rows (moe_chunk_order) with its inverse.
    Tensor recv_counts_t, order_t, inverse_t;
    // The experts: input rows per local expert and their activations.
    std::vector<int64_t> local_counts;  // [L]
    std::vector<Tensor> expert_in, fc1_out, act_out;
    // Expert TP (ETP > 1): rows per local expert of every member of the expert-TP group [ETP][L];
    // the experts ran on all of them (expert_in etc. are the gathered rows).
    std::vector<int64_t> etp_counts;
    Tensor etp_order_t,
        etp_inverse_t;  // the group's rows [member][L] <-> [L][member] (moe_chunk_order)
    MLP::Saved shared;
    Tensor shared_out, shared_gate;  // --moe-shared-expert-gate: z [T, H], sigmoid [T] f64
  };

  // prefix: "decoder.layers.N.mlp."; shared_experts: the spec of the shared experts' MLP (built
  // when config.moe_shared_expert_intermediate_size > 0). Needs ctx.moe (the model's MoEState).
  MoELayer(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix,
           int64_t layer_number, const MlpSubmodules& shared_experts);

  // x [S, B, H] (an SP shard under sequence parallelism) -> [S, B, H]. training: compute the aux
  // losses (their collectives run on every rank alike).
  Tensor forward(const Tensor& x, Saved& saved, bool training) const;
  // dy -> dx (written); router, expert and shared-expert grads accumulate. Clears `saved`.
  Tensor backward(const Tensor& dy, Saved& saved);

  int64_t num_local_experts() const { return local_; }
  int64_t first_expert() const { return first_; }

 private:
  struct Expert {
    Weight fc1, fc2;
    Weight fc1_bias, fc2_bias;  // --add-bias-linear (Megatron's default): SequentialMLP's biases
  };
  int64_t ep_size() const { return ctx_.ep_group ? ctx_.ep_group->size() : 1; }
  // The ranks that share one sequence (Megatron's tp_cp_group: TP under SP, times CP), over which
  // the aux losses' token counts are summed; null: this rank holds whole sequences.
  comm::ProcessGroup* seq_partition_group() const;
  int64_t seq_partition() const {
    const comm::ProcessGroup* g = seq_partition_group();
    return g ? g->size() : 1;
  }
  // Rows [R, H] grouped by local expert (counts) -> expert outputs [R, H]; saves activations.
  // Under ETP the rows of the expert-TP group are gathered first and the outputs reduce-scattered
  // back (etp_gather_rows / etp_scatter_rows).
  Tensor experts_forward(const Tensor& rows, Saved& s) const;
  Tensor experts_backward(const Tensor& drows, Saved& s);
  // The local experts on rows grouped by expert (counts [L]): fc1 (+ bias), activation, fc2 (no
  // fc2 bias: added by the caller after the ETP reduction). Per-expert gemm calls, or one
  // grouped_gemm per GEMM under --moe-grouped-gemm (the same numbers).
  Tensor experts_compute(const Tensor& rows, const std::vector<int64_t>& counts, Saved& s) const;
  // c[g] = op(a[g]) op(b[g]) for the experts with rows: one grouped_gemm under
  // --moe-grouped-gemm, else a gemm per group (the same numbers on the CPU).
  void expert_gemms(std::vector<Tensor>& cs, const std::vector<Tensor>& as,
                    const std::vector<Tensor>& bs, const ops::GemmArgs& args) const;
  Tensor experts_compute_backward(const Tensor& dz, const std::vector<int64_t>& counts, Saved& s);
  // ETP: rows [R, H] grouped by local expert (counts [L]) -> the group's rows [sum, H] in
  // [local expert][member] order (s.etp_counts set), and back: the group's partial outputs summed
  // over the members into this rank's rows.
  Tensor etp_gather_rows(const Tensor& rows, Saved& s) const;
  Tensor etp_scatter_rows(const Tensor& rows, const Saved& s) const;
  // Token rows to their experts and back (moe_permute / moe_unpermute on the device) -> y [T, H]
  // in out_dtype, from dispatch_index's lists and counts.
  Tensor dispatch_alltoall(Saved& s, DType out_dtype) const;
  Tensor dispatch_allgather(Saved& s) const;
  // The dispatch's index lists on the device (moe_dispatch_index over this rank's chosen experts;
  // allgather: the EP group's, all-gathered) and the layer's one host read: the rows per selected
  // expert, (alltoall, EP > 1) the all-to-all's split sizes, this rank's choices per expert (and
  // the aux losses' counts, summed over the sequence partition on the device), (expert TP) the
  // group's rows per local expert. Sets s's counts, index tensors, tokens_per_expert, aux.counts
  // and etp_counts.
  void dispatch_index(Saved& s, int64_t aux_rows) const;
  // dy -> dx [T, H] (written); dprob: [T, K] f64 on the device (written).
  Tensor combine_backward_alltoall(const Tensor& dy, Saved& s, Tensor& dprob);
  Tensor combine_backward_allgather(const Tensor& dy, Saved& s, Tensor& dprob);

  const ModuleContext& ctx_;
  int64_t layer_;
  int64_t h_, e_, k_, f_, local_, first_;
  int64_t f_local_;  // F / ETP: this rank's share of each expert's intermediate size
  RouterOptions router_;
  ops::MoeRouterArgs router_args_;  // the same options for moe_router_topk
  Weight router_w_;
  std::vector<Expert> experts_;
  std::unique_ptr<MLP> shared_;
  Weight shared_gate_w_;  // [1, H] under --moe-shared-expert-gate
};

}  // namespace mg::transformer::moe
