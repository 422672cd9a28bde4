// Parameter structs of the ops declared in op_list.h. Plain data, documented once here, so that op
// signatures stay short (outputs, saved, inputs, then one of these).
//
// Shape letters (docs/architecture.md): N rows (= S*B flattened), S sequence, B batch, H hidden,
// F ffn hidden, NH attention heads, NG query groups (KV heads), HD head dim, V vocab (Vl: this
// rank's vocab shard).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "megatron/core/tensor/tensor.h"

namespace mg::comm {
class ProcessGroup;
}

namespace mg::ops {

// C = alpha * op(A) @ op(B) + beta * C. op(X) = X^T when trans_x. Rank-2 [M,K]x[K,N] -> [M,N], or
// rank-3 with a shared leading batch dim. A and B share a dtype (f64, f32, bf16, f16); C has that
// dtype or f32. Accumulation in f32 (f64 for f64). beta = 1 accumulates (parameter gradients).
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// gemm_epilogue: a 2-D GEMM P = op(A) @ op(B) [M, N] with a fused epilogue, computed in f32 (f64
// for f64) and rounded to C's dtype once. Gradient rule: c and aux are written; dbias accumulates
// (+=). bias and dbias may have any float dtype.
//   bias         c = P + bias[N]                                        (Linear with a bias)
//   bias_gelu    t = P + bias[N] (bias optional); aux = t, c = gelu_tanh(t), both from the
//                unrounded t; aux [M, N] has C's dtype and is the pre-activation for the backward
//   dgelu_bgrad  g = gelu_tanh'(aux) * P; c = g; dbias[N] += sum over the M rows of the unrounded
//                g (dbias optional): the fc2 data-gradient GEMM of a bias-GELU MLP, giving
//                d(pre-activation) and the fc1 bias gradient in one call
//   bgrad        c = P + beta * C; dbias[M] += sum over K of op(A)[m, k]: the weight-gradient GEMM
//                dW += dY^T X (A = dY, trans_a) with the bias gradient sum_n dY[n, :]
// beta (0 or 1) is allowed with bgrad only (parameter gradients accumulate).
enum class GemmEpilogue : uint8_t { bias, bias_gelu, dgelu_bgrad, bgrad };
inline const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::bias:
      return "bias";
    case GemmEpilogue::bias_gelu:
      return "bias_gelu";
    case GemmEpilogue::dgelu_bgrad:
      return "dgelu_bgrad";
    case GemmEpilogue::bgrad:
      return "bgrad";
  }
  return "unknown";
}

struct GemmEpilogueArgs {
  bool trans_a = false;
  bool trans_b = false;
  GemmEpilogue epilogue = GemmEpilogue::bias;
  float beta = 0.0f;
};

// fp8_gemm: c [M, N] = s * acc + beta * c with acc[m][n] = sum_k a[m][k] * b[n][k] over the FP8
// values (exact products, f32 accumulation), s = a_scale_inv * b_scale_inv (f32, the dequantisation
// factors, [1] tensors on the device), rounded to C's dtype (f32, bf16 or f16) once. Both operands
// have K contiguous (cuBLASLt's "TN", the only FP8 layout of Hopper); fp8_cast_transpose gives the
// transposed copies a layer needs. beta 0 or 1 (1: weight-gradient accumulation into main_grad).
// fast_accum: Hopper's FP8 tensor-core accumulation without the periodic promotion of partial sums
// to f32 (cuBLASLt FAST_ACCUM; Transformer Engine's use_split_accumulator = false), which TE uses
// for the forward GEMM (_2X_ACC_FPROP = False) and not for the two gradient GEMMs. The CPU
// emulation ignores it (f32 sums); docs/fp8.md's bound covers both.
// FP8 output (C fp8_e4m3 / fp8_e5m2; Transformer Engine's FP8 GEMM output, cuBLASLt's D scale and
// amax epilogue): v = s * acc in f32, c = the saturating round-to-nearest-even cast of
// f32(v * out_scale), out_amax = max(out_amax, max |v|) (a NaN makes it NaN); beta 0. out_scale
// [1] f32 is required then, out_amax [1] f32 optional; both unused for a float C.
struct Fp8GemmArgs {
  float beta = 0.0f;
  bool fast_accum = false;
  Tensor out_scale{}, out_amax{};  // (initialisers: designated initialisers may omit them)
};

// fp8_scale_update (docs/fp8.md): per slot j of history [L, S]
//   delayed (current = false): amax = max over rows (max_history) or row 0; the history rolled
//     (row i takes row i + 1, the last row the old row 0) and row 0 zeroed; scale = (fp8_max /
//     amax) / 2^margin, kept when amax is 0 or not finite, the f32 maximum if it overflows;
//   current (true; L = 1): scale = fp8_max / amax, 1 when amax is 0 or not finite, the f32
//     maximum on overflow; the history untouched;
// then scale_inv = 1 / scale. Transformer Engine's _default_get_amax_and_update_history and
// _default_sf_compute, and Float8CurrentScaling's scale.
struct Fp8ScaleUpdateArgs {
  float fp8_max = 448.0f;
  int64_t margin = 0;
  bool max_history = false;  // --fp8-amax-compute-algo max (else most_recent)
  bool current = false;      // tensorwise (current) scaling
};

// LayerNorm / RMSNorm. zero_centered_gamma: the weight is stored as (gamma - 1) and applied as
// (1 + w) (Megatron's apply_layernorm_1p / Gemma-style RMSNorm).
struct NormArgs {
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
};

// Which normalisation the fused norm ops (bias_dropout_add_norm_fwd, norm_bwd_add) apply; the
// unfused ops name it by their slot (layernorm_* / rmsnorm_*).
enum class NormKind : uint8_t { layernorm, rmsnorm };

enum class GeluApprox : uint8_t {
  none,  // exact: x * Phi(x) with erf (Megatron's unfused default, torch gelu)
  tanh,  // tanh approximation (GPT-2 / HF gelu_new, Megatron's fused bias-gelu)
};

// Counter-based dropout: element i of the op keeps its value iff philox_uniform(seed, offset + i)
// >= p, and is scaled by 1/(1-p). Backward regenerates the same mask from (seed, offset); nothing
// is stored. p = 0 is the identity. See megatron/core/random/philox.h for the exact stream.
struct DropoutArgs {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Scaled dot-product attention on Megatron's sbhd layout:
//   q [Sq, B, NH, HD], k and v [Sk, B, NG, HD] with NH % NG == 0 (GQA: head h reads group
//   h/(NH/NG)). Sk may differ from Sq (a KV cache, a context-parallel K/V block).
// Masks: causal is bottom-right aligned: query i attends key j iff j <= i + Sk - Sq (with Sk == Sq
// the usual j <= i; a query with i + Sk - Sq < 0 attends nothing). Documents: with doc_ids
// ([B, Sq] i32) query i attends key j only if its id equals the key's id, the keys' ids being
// kv_doc_ids ([B, Sk] i32) when given, else doc_ids (then Sk must equal Sq); with cu_seqlens ([D+1]
// i32, shared by every batch row, cu_seqlens[D] == S, only with Sk == Sq) the same for the
// documents [cu[d], cu[d+1]). A query with a negative doc id is padding, and so is any query that
// may attend no key: its output is 0 and its lse is -inf (never NaN), and it gets no gradient.
// Softmax in f32 (f64 for f64 inputs) with -inf masking, unlike Megatron's -10000 fill. Optional
// attention dropout on the probabilities: our kernels (CPU and CUDA) draw the mask indexed as
// below, bit for bit alike; cuDNN's provider (cuda:cudnn) draws its own Philox mask from the same
// (seed, offset), same distribution, other bits (its forward and backward agree).
struct AttentionArgs {
  bool causal = true;
  float softmax_scale = 0.0f;  // 0 -> 1/sqrt(HD)
  Tensor doc_ids;              // optional [B, Sq] i32: the queries' documents
  Tensor kv_doc_ids;           // optional [B, Sk] i32: the keys' documents (needs doc_ids)
  Tensor cu_seqlens;           // optional [D+1] i32
  DropoutArgs dropout;  // on the attention probabilities, indexed by ((b*NH + h)*Sq + i)*Sk + j
};

// attention_merge: two attention results of the same queries over disjoint key sets, (out, lse)
// and (block_out, block_lse), become the result over the union, in place in (out, lse):
//   lse' = log(e^lse + e^block_lse); out' = e^(lse - lse') out + e^(block_lse - lse') block_out.
// A side with lse = -inf (its queries attended nothing there) contributes nothing; both -inf leave
// out = 0 and lse = -inf (never NaN). Shapes and dtypes as attention_fwd's out and lse.

// Rotary embeddings, Megatron's non-interleaved (rotate_half) form by default. The first
// rot = HD * rotary_percent features (even) rotate, the rest pass through. inv_freq[i] =
// base^(-2i/rot); angle = pos * inv_freq[i] for feature pairs (i, i + rot/2) (interleaved: (2i,
// 2i+1)). Positions: position_ids ([S] or [B, S], i32/i64) or else s + position_offset.
// Frequency scaling of the rotary embedding (transformers' rope_type; rope_scaling.h computes the
// frequencies, kernels rotate by pos * inv_freq[i] and multiply cos/sin by the attention factor):
//   linear: inv_freq / factor (Megatron's --rotary-seq-len-interpolation-factor);
//   llama3: Llama 3.1's band-wise scaling (--use-rope-scaling, --rope-scaling-factor; Megatron
//           fixes low 1, high 4, original context 8192);
//   yarn:   YaRN's ramp between interpolation and extrapolation and its attention factor
//           (Megatron-Core's yarn_* settings).
enum class RopeScalingType : int { none, linear, llama3, yarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;       // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  double mscale = 1.0, mscale_all_dim = 0.0;             // yarn: the attention factor
  bool correction_range_round_to_int = true;             // yarn: floor / ceil of the ramp ends
};

struct RopeArgs {
  float base = 10000.0f;
  float rotary_percent = 1.0f;
  bool interleaved = false;
  RopeScaling scaling;
  Tensor position_ids;  // optional
  int64_t position_offset = 0;
};

// One parameter for the multi-tensor AdamW step. param, exp_avg, exp_avg_sq are f32 (f64 allowed,
// all alike); grad is f32/bf16/f16 (or f64); model_param, when defined, receives the updated value
// converted to its dtype (bf16 model weights from f32 master weights).
struct AdamParam {
  Tensor param;
  Tensor grad;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  Tensor model_param;
};

// Adam / AdamW as apex FusedAdam (Megatron's optimizer): step counts from 1.
//   g' = g * grad_scale (+ wd * p when !decoupled)
//   m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   mh = m / (1 - b1^step); vh = v / (1 - b2^step)   (when bias_correction)
//   p -= lr * (mh / (sqrt(vh) + eps) + (decoupled ? wd * p : 0))
struct AdamArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;
  bool bias_correction = true;
  bool decoupled_weight_decay = true;  // AdamW
  float grad_scale = 1.0f;             // multiplies the grad first (1/loss_scale for fp16)
};

// grad_norm / clip_grad_norm of gradients spread over ranks (Megatron's get_grad_norm_fp32 over its
// grad_stats_parallel_group, with the expert optimizer's norm beside it). The caller passes the
// gradients this rank counts, every parameter exactly once over all ranks (Megatron's
// get_main_grads_for_grad_norm: TP-replicated parameters on TP rank 0 only, the pipeline's replica
// of the tied embedding nowhere); the norm is
//   sqrt(allreduce_sum over groups[0], groups[1], ... (this rank's sum of squares of grads)
//        + allreduce_sum over expert_group (this rank's sum of squares of expert_grads))
// with the expert term reduced first. The default is one process (no reductions). Every member of
// these groups calls the slot, also when it holds no gradients (they are collectives).
struct GradNormArgs {
  // Summed over in this order: the distributed optimizer's shard group, then TP, then PP. Null or
  // size-1 entries are skipped.
  std::span<comm::ProcessGroup* const> groups;
  // Routed experts' gradients under expert parallelism (each rank of expert_group holds other
  // experts): summed over expert_group only, apart from `grads`.
  std::span<const Tensor> expert_grads;
  comm::ProcessGroup* expert_group = nullptr;
  // FSDP with expert parallelism: the expert data-parallel group whose ranks hold disjoint chunks
  // of the expert gradients; summed over before expert_group (null: experts not sharded).
  comm::ProcessGroup* expert_shard_group = nullptr;
  // The device of the gradients: clip_grad_norm calls grad_norm through this device's op table
  // (resolved the same way on a rank that holds no gradients).
  Device device = Device::cpu();
};

// moe_router_topk: Megatron's topk_softmax_with_capacity (moe_utils.py) per token t of logits l
// [T, E] (the exact arithmetic: transformer/moe/moe_utils.h topk_routing, f64):
//   softmax, pre_softmax: s = softmax(l); top-k of s; prob = s at the chosen experts
//   softmax            : top-k of l; prob = softmax over the k chosen logits
//   sigmoid            : s = sigmoid(l); top-k of s (+ expert_bias for the choice only);
//                        prob = s / (sum of the k chosen + 1e-20) (k > 1; k = 1 keeps s)
// group-limited routing (num_groups G, group_topk g > 0): only the experts of the g best groups
// (a group's score: the sum of its k / g largest selection values; ties to the lower group);
// prob *= scaling_factor last. Capacity c = ceil(T k / E * capacity_factor) per expert: the
// policy `probs` keeps each expert's c choices of highest prob (ties: lower t * K + k),
// `position` its first c; the rest are dropped (kept 0). Ties in every top-k: lower index first.
// The load-balancing scores (aux_sums, aux_dscores) are softmax(l), or sigmoid(l) normalised per
// token (+ 1e-20) for sigmoid (moe_utils.h aux_loss_scores); the z-loss (backward only here) is
// z_loss_coeff * mean_t logsumexp(l_t)^2, its gradient seeded with z_loss_scale (moe_utils.h
// z_loss).
enum class MoeRouterScore : uint8_t { softmax, sigmoid };
enum class MoeDropPolicy : uint8_t { probs, position };
struct MoeRouterArgs {
  int64_t topk = 1;
  MoeRouterScore score = MoeRouterScore::softmax;
  bool pre_softmax = false;
  int64_t num_groups = 0, group_topk = 0;   // group-limited routing (group_topk 0: off)
  std::optional<double> scaling_factor{};   // nullopt: none
  std::optional<double> capacity_factor{};  // nullopt: dropless
  MoeDropPolicy drop_policy = MoeDropPolicy::probs;
  double z_loss_coeff = 0.0;  // moe_router_topk_bwd: the z-loss's coefficient (0: no z-loss)
  double z_loss_scale = 1.0;  // and its gradient's seed (the aux-loss scale)
};

// moe_dispatch_index: how the chosen experts are laid out and which are selected.
struct MoeDispatchArgs {
  int64_t topk = 1;          // K: choices per token, token-major ([tokens, K])
  int64_t first_expert = 0;  // the selected experts: [first_expert, first_expert + L)
  // choice_counts: the choices [count_first, count_first + count_num) (multiples of K).
  int64_t count_first = 0, count_num = 0;
};

// Weight initialisation from the counter-based generator: element i of the FULL tensor draws from
// counter (offset + i), so a shard initialised with offset + its global start equals the slice of
// the full tensor (TP-invariant init).
struct InitArgs {
  double mean = 0.0;  // normal: mean; uniform: low
  double std = 1.0;   // normal: standard deviation; uniform: high
  uint64_t seed = 0;
  uint64_t offset = 0;
};

}  // namespace mg::ops
