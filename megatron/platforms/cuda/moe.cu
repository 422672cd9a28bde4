// CUDA MoE token permutation (op_list.h moe_permute / moe_unpermute / moe_unpermute_bwd), the CPU
// kernels' definitions (platforms/cpu/moe.cpp) on the device: the gather is an exact copy; the
// weighted sums run in f64 in the order the op defines (one thread per output element, a token's
// rows in token_rows order, dprob over j ascending), no atomics, so the results are deterministic
// and equal the CPU's up to FMA contraction.
//
// Gradient rule: activation gradients are written (=): drows, dprob, and moe_unpermute's out.
// Not here: index values are not checked (that needs a host copy); an index outside its range
// reads zeros (moe_permute) or is skipped (moe_unpermute, moe_unpermute_bwd), never memory
// outside the tensors. Correct-first: one thread per dprob row.
//
// The router (moe_router_topk / moe_router_topk_bwd), the CPU's topk_routing on the device: one
// warp per token. The lanes compute the scores element-wise and every top-k as warp arg-max
// reductions (exact: larger value, then lower index, the CPU's tie rule, in any order); the sums
// (softmax denominators, group scores, probabilities, the backward's dot products) run in one
// lane in the CPU's order. Capacity: one thread per choice counts the choices of its expert ahead
// of it (probs: higher prob, then lower index; position: lower index). No atomics: deterministic;
// equal to the CPU up to exp/log rounding and FMA contraction (the same choices unless two
// selection values differ only in that rounding). Correct-first: O((T K)^2) capacity, O(E T K)
// counts; topk and group_topk at most kMaxRouterTopk.
//
// The shared-expert gate (moe_shared_gate_fwd / _bwd): one thread per token for its dot products
// (f64, j ascending, __dadd_rn / __dmul_rn so that nvcc does not contract them: the CPU's order
// and roundings), element-wise kernels for out, dz and dx, and dw's column sums over the tokens
// through reduce.cuh (f64, chunked: deterministic, equal to the CPU's t-ascending sums up to their
// order). Equal to the CPU up to exp's rounding and that order.
//
// The dispatch's index lists (moe_dispatch_index, moe_chunk_order), built on the device so that
// the chosen experts never go to the host (no copy, no synchronisation). moe_dispatch_index: the
// (local expert, choice) pairs, the unselected keyed after every expert, sorted by CUB's stable
// radix sort (so choices ascending within an expert, the CPU's counting-sort order); counts by
// binary search of the sorted keys, the rows from the sorted pairs, choice_offsets an inclusive
// scan (CUB) of the selected flags, each token's rows placed by their rank among its at most K
// rows (O(K^2) per token); choice_counts by integer atomics (order-free). All integers, no float
// atomics: deterministic and equal to the CPU's. moe_chunk_order: the chunk starts of both
// layouts by one block's scan of the counts, then one thread per row binary-searches its chunk.
// Not here: the values are not checked (that needs a host read, the CPU refuses them): a negative
// expert is never selected, one outside choice_counts' [0, E) is not counted, a negative chunk
// count is an empty chunk, and rows past the counts' total (counts not summing to R) get order -1
// (and inverse -1 where no row maps); 32-bit sort keys (N < 2^31 choices, checked).
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cmath>
#include <limits>

#include "megatron/core/ops/ops.h"
#include "megatron/core/transformer/moe/router_math.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/reduce.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// rows[i] = x[index[i]], raw copies of h units of type U per row (U: an unsigned type of the
// element size, or a 4/8/16-byte unit dividing the row's bytes).
template <typename U>
__global__ void moe_permute_kernel(U* rows, const U* x, const int64_t* index, int64_t t, int64_t r,
                                   int64_t h) {
  const int64_t total = r * h;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t i = e / h, j = e - i * h;
    const int64_t src = index[i];
    rows[e] = src >= 0 && src < t ? x[src * h + j] : U{};
  }
}

__global__ void moe_unpermute_kernel(void* out, DType to, const void* rows, DType tr,
                                     const double* prob, const int64_t* offsets,
                                     const int64_t* token_rows, int64_t t, int64_t r, int64_t h) {
  const int64_t total = t * h;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t tok = e / h, j = e - tok * h;
    double acc = 0.0;
    for (int64_t k = offsets[tok]; k < offsets[tok + 1]; ++k) {
      const int64_t i = token_rows[k];
      if (i < 0 || i >= r) continue;
      acc += (prob ? prob[i] : 1.0) * load<double>(rows, tr, i * h + j);
    }
    store<double>(out, to, e, acc);
  }
}

__global__ void moe_unpermute_bwd_rows_kernel(void* drows, DType tr, const void* dout, DType td,
                                              const double* prob, const int64_t* index, int64_t t,
                                              int64_t r, int64_t h) {
  const int64_t total = r * h;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t i = e / h, j = e - i * h;
    const int64_t tok = index[i];
    const double g = tok >= 0 && tok < t ? load<double>(dout, td, tok * h + j) : 0.0;
    store<double>(drows, tr, e, (prob ? prob[i] : 1.0) * g);
  }
}

__global__ void moe_unpermute_bwd_prob_kernel(double* dprob, const void* dout, DType td,
                                              const void* rows, DType tr, const int64_t* index,
                                              int64_t t, int64_t r, int64_t h) {
  for (int64_t i = grid_start(); i < r; i += grid_stride()) {
    const int64_t tok = index[i];
    double dot = 0.0;
    if (tok >= 0 && tok < t)
      for (int64_t j = 0; j < h; ++j)
        dot += load<double>(dout, td, tok * h + j) * load<double>(rows, tr, i * h + j);
    dprob[i] = dot;
  }
}

void moe_permute(Tensor& rows, const Tensor& x, const Tensor& index) {
  constexpr const char* op = "moe_permute";
  const ops::MoePermuteDims d = ops::validate_moe_permute(OnCudaDevice{}, rows, x, index);
  if (d.r * d.h == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  auto launch_units = [&](auto tag, int64_t units_per_row) {
    using U = decltype(tag);
    moe_permute_kernel<U><<<grid_for(d.r * units_per_row), kThreads, 0, s>>>(
        static_cast<U*>(rows.raw_data()), static_cast<const U*>(x.raw_data()),
        index.data<int64_t>(), d.t, d.r, units_per_row);
  };
  // A row is a byte copy: moved in the widest unit (16, 8 or 4 bytes) that divides the row's
  // bytes and both base addresses, else element by element.
  const int64_t row_bytes = d.h * static_cast<int64_t>(dtype_size(x.dtype()));
  const auto addr = reinterpret_cast<std::uintptr_t>(rows.raw_data()) |
                    reinterpret_cast<std::uintptr_t>(x.raw_data());
  auto fits = [&](int64_t w) {
    return row_bytes % w == 0 && addr % static_cast<std::uintptr_t>(w) == 0;
  };
  if (fits(16))
    launch_units(uint4{}, row_bytes / 16);
  else if (fits(8))
    launch_units(uint2{}, row_bytes / 8);
  else if (fits(4))
    launch_units(uint32_t{}, row_bytes / 4);
  else
    with_element_bits(x.dtype(), op, [&](auto tag) { launch_units(tag, d.h); });
  MG_CUDA_CHECK_LAUNCH();
}

void moe_unpermute(Tensor& out, const Tensor& rows, const Tensor& prob, const Tensor& offsets,
                   const Tensor& token_rows) {
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute(OnCudaDevice{}, out, rows, prob, offsets, token_rows);
  if (d.t * d.h == 0) return;
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  moe_unpermute_kernel<<<grid_for(d.t * d.h), kThreads, 0, current_stream(dev)>>>(
      out.raw_data(), out.dtype(), rows.raw_data(), rows.dtype(),
      prob.defined() ? prob.data<double>() : nullptr, offsets.data<int64_t>(),
      token_rows.data<int64_t>(), d.t, d.r, d.h);
  MG_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_bwd(Tensor& drows, Tensor& dprob, const Tensor& dout, const Tensor& rows,
                       const Tensor& prob, const Tensor& index) {
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute_bwd(OnCudaDevice{}, drows, dprob, dout, rows, prob, index);
  if (d.r == 0) return;
  const int dev = dout.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const double* p = prob.defined() ? prob.data<double>() : nullptr;
  if (drows.defined() && d.h > 0) {
    moe_unpermute_bwd_rows_kernel<<<grid_for(d.r * d.h), kThreads, 0, s>>>(
        drows.raw_data(), drows.dtype(), dout.raw_data(), dout.dtype(), p, index.data<int64_t>(),
        d.t, d.r, d.h);
    MG_CUDA_CHECK_LAUNCH();
  }
  if (dprob.defined()) {
    moe_unpermute_bwd_prob_kernel<<<grid_for(d.r), kThreads, 0, s>>>(
        dprob.data<double>(), dout.raw_data(), dout.dtype(), rows.raw_data(), rows.dtype(),
        index.data<int64_t>(), d.t, d.r, d.h);
    MG_CUDA_CHECK_LAUNCH();
  }
}

constexpr int kMaxRouterTopk = 64;
using transformer::moe::kSigmoidNormEps;

struct Pick {
  double v;
  int64_t i;  // -1: none
};

__device__ __forceinline__ Pick better(Pick a, Pick b) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
}

// The warp's best pick (every lane gets it).
__device__ __forceinline__ Pick warp_best(Pick p) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Pick q;
    q.v = __shfl_xor_sync(0xffffffffu, p.v, o);
    q.i = __shfl_xor_sync(0xffffffffu, p.i, o);
    p = better(p, q);
  }
  return p;
}

__device__ __forceinline__ bool picked(const int64_t* list, int n, int64_t e) {
  for (int j = 0; j < n; ++j)
    if (list[j] == e) return true;
  return false;
}

struct RouterKernelArgs {
  int64_t t, e, k, groups, group_topk;
  bool sigmoid, pre_softmax, has_scale;
  double scale;
};

// One warp per token (blockDim.x = 32 * tokens per block).
__global__ void moe_router_topk_kernel(int64_t* expert, double* prob, uint8_t* kept, double* scores,
                                       double* gscore_ws, const void* logits, DType tl,
                                       const float* bias, RouterKernelArgs a) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t tok = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x / 32);
  if (tok >= a.t) return;  // a whole warp leaves together
  const int64_t E = a.e, K = a.k;
  double* s = scores + tok * E;
  auto logit = [&](int64_t e) { return load<double>(logits, tl, tok * E + e); };
  // Scores: softmax (max exact in any order; the sum in expert order in lane 0) or sigmoid.
  if (!a.sigmoid) {
    double mx = -INFINITY;
    for (int64_t e = lane; e < E; e += 32) mx = fmax(mx, logit(e));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int64_t e = lane; e < E; e += 32) s[e] = exp(logit(e) - mx);
    __syncwarp();
    double sum = 0.0;
    if (lane == 0)
      for (int64_t e = 0; e < E; ++e) sum += s[e];
    sum = __shfl_sync(0xffffffffu, sum, 0);
    for (int64_t e = lane; e < E; e += 32) s[e] = s[e] / sum;
  } else {
    for (int64_t e = lane; e < E; e += 32) s[e] = 1.0 / (1.0 + exp(-logit(e)));
  }
  __syncwarp();
  // Selection values: with groups or a bias the logits (softmax without pre-softmax) or the scores,
  // + the bias; else the logits (the host's choice: the same order, but exact where a score
  // saturates).
  const bool on_logits = (!a.sigmoid && !a.pre_softmax) || (a.group_topk == 0 && !bias);
  auto value = [&](int64_t e) {
    const double base = on_logits ? logit(e) : s[e];
    return bias ? base + static_cast<double>(bias[e]) : base;
  };
  int64_t chosen[kMaxRouterTopk];
  int64_t groups[kMaxRouterTopk];
  const int64_t G = a.group_topk > 0 ? a.groups : 1, g = a.group_topk > 0 ? a.group_topk : 1;
  const int64_t per = E / G;
  if (a.group_topk > 0) {
    // Group score: the sum of its K / g largest values, in descending order.
    double* gs = gscore_ws + tok * G;
    const int64_t take = K / g;
    for (int64_t grp = 0; grp < G; ++grp) {
      double sum = 0.0;
      for (int j = 0; j < take; ++j) {
        Pick p{0.0, -1};
        for (int64_t e = grp * per + lane; e < (grp + 1) * per; e += 32)
          if (!picked(chosen, j, e)) p = better(p, Pick{value(e), e});
        p = warp_best(p);
        chosen[j] = p.i;
        sum += p.v;
      }
      if (lane == 0) gs[grp] = sum;
    }
    __syncwarp();
    for (int j = 0; j < g; ++j) {
      Pick p{0.0, -1};
      for (int64_t q = lane; q < G; q += 32)
        if (!picked(groups, j, q)) p = better(p, Pick{gs[q], q});
      groups[j] = warp_best(p).i;
    }
  }
  for (int j = 0; j < K; ++j) {
    Pick p{0.0, -1};
    for (int64_t e = lane; e < E; e += 32) {
      if (a.group_topk > 0 && !picked(groups, static_cast<int>(g), e / per)) continue;
      if (!picked(chosen, j, e)) p = better(p, Pick{value(e), e});
    }
    chosen[j] = warp_best(p).i;
  }
  if (lane != 0) return;
  int64_t* ex = expert + tok * K;
  double* pr = prob + tok * K;
  for (int j = 0; j < K; ++j) {
    ex[j] = chosen[j];
    kept[tok * K + j] = 1;
  }
  if (!a.sigmoid) {
    if (a.pre_softmax) {
      for (int j = 0; j < K; ++j) pr[j] = s[chosen[j]];
    } else {
      double mx = logit(chosen[0]);
      for (int j = 1; j < K; ++j) mx = fmax(mx, logit(chosen[j]));
      double sum = 0.0;
      for (int j = 0; j < K; ++j) sum += (pr[j] = exp(logit(chosen[j]) - mx));
      for (int j = 0; j < K; ++j) pr[j] /= sum;
    }
  } else {
    double sum = 0.0;
    for (int j = 0; j < K; ++j) sum += (pr[j] = s[chosen[j]]);
    if (K > 1)
      for (int j = 0; j < K; ++j) pr[j] /= sum + kSigmoidNormEps;
  }
  if (a.has_scale)
    for (int j = 0; j < K; ++j) pr[j] *= a.scale;
}

// Capacity: choice i is dropped when `capacity` choices of its expert come before it.
__global__ void moe_router_capacity_kernel(uint8_t* kept, const int64_t* expert, const double* prob,
                                           int64_t n, int64_t capacity, bool by_prob) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t e = expert[i];
    int64_t ahead = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (j == i || expert[j] != e) continue;
      if (by_prob ? (prob[j] > prob[i] || (!(prob[i] > prob[j]) && j < i)) : j < i) ++ahead;
    }
    kept[i] = ahead < capacity ? 1 : 0;
  }
}

__global__ void moe_router_counts_kernel(double* tokens_per_expert, int64_t* expert_counts,
                                         const int64_t* expert, const uint8_t* kept, int64_t n,
                                         int64_t num_experts) {
  for (int64_t e = grid_start(); e < num_experts; e += grid_stride()) {
    int64_t chosen = 0, kept_n = 0;
    for (int64_t i = 0; i < n; ++i)
      if (expert[i] == e) {
        ++chosen;
        kept_n += kept[i] ? 1 : 0;
      }
    if (tokens_per_expert) tokens_per_expert[e] = static_cast<double>(chosen);
    if (expert_counts) expert_counts[e] = kept_n;
  }
}

// The load-balancing scores' row sums (sigmoid: sum_e s[t, e]) and logsumexp(l_t), per token.
__global__ void moe_router_token_stats_kernel(double* sig_sum, double* lse, const double* scores,
                                              const void* logits, DType tl, int64_t t, int64_t e) {
  for (int64_t tok = grid_start(); tok < t; tok += grid_stride()) {
    if (sig_sum) {
      double sum = 0.0;
      for (int64_t j = 0; j < e; ++j) sum += scores[tok * e + j];
      sig_sum[tok] = sum;
    }
    if (lse) {
      double mx = load<double>(logits, tl, tok * e);
      for (int64_t j = 1; j < e; ++j) mx = fmax(mx, load<double>(logits, tl, tok * e + j));
      double se = 0.0;
      for (int64_t j = 0; j < e; ++j) se += exp(load<double>(logits, tl, tok * e + j) - mx);
      lse[tok] = mx + log(se);
    }
  }
}

// aux_sums[g, e] = sum over t = g mod G, ascending, of the load-balancing score of (t, e).
__global__ void moe_router_aux_sums_kernel(double* aux_sums, const double* scores,
                                           const double* sig_sum, int64_t t, int64_t e, int64_t g) {
  for (int64_t i = grid_start(); i < g * e; i += grid_stride()) {
    const int64_t row = i / e, col = i - row * e;
    double sum = 0.0;
    for (int64_t tok = row; tok < t; tok += g) {
      const double v = scores[tok * e + col];
      sum += sig_sum ? v / (sig_sum[tok] + kSigmoidNormEps) : v;
    }
    aux_sums[i] = sum;
  }
}

__global__ void moe_router_z_sum_kernel(double* z_sum, const double* lse, int64_t t) {
  if (grid_start() != 0) return;
  double sum = 0.0;
  for (int64_t tok = 0; tok < t; ++tok) sum += lse[tok] * lse[tok];
  z_sum[0] = sum;
}

// One thread per token: topk_routing_backward, aux_loss_scores_backward and z_loss's gradient
// (moe_utils.cpp) in their order.
__global__ void moe_router_topk_bwd_kernel(double* dlogits, const double* dprob,
                                           const double* aux_dscores, int64_t aux_rows,
                                           const void* logits, DType tl, const int64_t* expert,
                                           const double* prob, const uint8_t* kept,
                                           const double* scores, RouterKernelArgs a, double z_coeff,
                                           double z_scale) {
  const int64_t E = a.e, K = a.k;
  for (int64_t t = grid_start(); t < a.t; t += grid_stride()) {
    double* dl = dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) dl[e] = 0.0;
    const int64_t* ex = expert + t * K;
    const double* s = scores + t * E;
    auto logit = [&](int64_t e) { return load<double>(logits, tl, t * E + e); };
    double g[kMaxRouterTopk], unscaled[kMaxRouterTopk];
    bool any = false;
    for (int k = 0; k < K; ++k) {
      g[k] = kept[t * K + k] ? dprob[t * K + k] : 0.0;
      if (a.has_scale) g[k] *= a.scale;
      any |= g[k] != 0.0;
    }
    if (any) {
      const double* p = prob + t * K;
      if (a.has_scale && !a.sigmoid && !a.pre_softmax) {
        double mx = logit(ex[0]);
        for (int k = 1; k < K; ++k) mx = fmax(mx, logit(ex[k]));
        double sum = 0.0;
        for (int k = 0; k < K; ++k) sum += (unscaled[k] = exp(logit(ex[k]) - mx));
        for (int k = 0; k < K; ++k) unscaled[k] /= sum;
        p = unscaled;
      }
      transformer::moe::router_topk_token_backward(ex, p, g, s, K, E, a.sigmoid, a.pre_softmax, dl);
    }
    if (aux_dscores) {
      // The load-balancing scores are the softmax scores, or the sigmoid scores normalised.
      const double* d = aux_dscores + (t % aux_rows) * E;
      if (!a.sigmoid) {
        double dot = 0.0;
        for (int64_t e = 0; e < E; ++e) dot += s[e] * d[e];
        for (int64_t e = 0; e < E; ++e) dl[e] += s[e] * (d[e] - dot);
      } else {
        double sum = 0.0, gs = 0.0;
        for (int64_t e = 0; e < E; ++e) {
          sum += s[e];
          gs += d[e] * s[e];
        }
        const double den = sum + kSigmoidNormEps;
        for (int64_t e = 0; e < E; ++e)
          dl[e] += (d[e] / den - gs / (den * den)) * s[e] * (1.0 - s[e]);
      }
    }
    if (z_coeff > 0.0) {
      double mx = logit(0);
      for (int64_t e = 1; e < E; ++e) mx = fmax(mx, logit(e));
      double se = 0.0;
      for (int64_t e = 0; e < E; ++e) se += exp(logit(e) - mx);
      const double lse = mx + log(se);
      const double gz = z_scale * z_coeff * 2.0 * lse / static_cast<double>(a.t);
      for (int64_t e = 0; e < E; ++e) dl[e] += gz * (exp(logit(e) - mx) / se);
    }
  }
}

RouterKernelArgs router_kernel_args(const ops::MoeRouterDims& d, const ops::MoeRouterArgs& a) {
  MG_CHECK(d.k <= kMaxRouterTopk,
           "moe_router_topk: topk " << d.k << " is over the CUDA kernel's " << kMaxRouterTopk);
  RouterKernelArgs k{};
  k.t = d.t;
  k.e = d.e;
  k.k = d.k;
  k.groups = a.group_topk > 0 ? a.num_groups : 0;
  k.group_topk = a.group_topk;
  k.sigmoid = a.score == ops::MoeRouterScore::sigmoid;
  k.pre_softmax = a.pre_softmax;
  k.has_scale = a.scaling_factor.has_value();
  k.scale = a.scaling_factor.value_or(1.0);
  return k;
}

void moe_router_topk(Tensor& expert, Tensor& prob, Tensor& kept, Tensor& scores,
                     Tensor& tokens_per_expert, Tensor& expert_counts, Tensor& aux_sums,
                     Tensor& z_sum, const Tensor& logits, const Tensor& expert_bias,
                     const ops::MoeRouterArgs& args) {
  const ops::MoeRouterDims d =
      ops::validate_moe_router_topk(OnCudaDevice{}, expert, prob, kept, scores, tokens_per_expert,
                                    expert_counts, aux_sums, z_sum, logits, expert_bias, args);
  const RouterKernelArgs ka = router_kernel_args(d, args);
  MG_CHECK(d.t <= (int64_t{1} << 20) * (kThreads / 32),
           "moe_router_topk: " << d.t << " tokens are over the CUDA kernel's grid");
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  if (d.t > 0) {
    Tensor gscore;
    if (ka.group_topk > 0) gscore = Tensor::empty({d.t, ka.groups}, DType::f64, logits.device());
    constexpr int kWarps = kThreads / 32;
    moe_router_topk_kernel<<<grid_for(d.t, kWarps), kThreads, 0, s>>>(
        expert.data<int64_t>(), prob.data<double>(), kept.data<uint8_t>(), scores.data<double>(),
        gscore.defined() ? gscore.data<double>() : nullptr, logits.raw_data(), logits.dtype(),
        expert_bias.defined() ? expert_bias.data<float>() : nullptr, ka);
    MG_CUDA_CHECK_LAUNCH();
    if (args.capacity_factor) {
      const auto capacity = static_cast<int64_t>(std::ceil(
          static_cast<double>(d.t * d.k) / static_cast<double>(d.e) * *args.capacity_factor));
      moe_router_capacity_kernel<<<grid_for(d.t * d.k), kThreads, 0, s>>>(
          kept.data<uint8_t>(), expert.data<int64_t>(), prob.data<double>(), d.t * d.k, capacity,
          args.drop_policy == ops::MoeDropPolicy::probs);
      MG_CUDA_CHECK_LAUNCH();
    }
  }
  if (tokens_per_expert.defined() || expert_counts.defined()) {
    moe_router_counts_kernel<<<grid_for(d.e), kThreads, 0, s>>>(
        tokens_per_expert.defined() ? tokens_per_expert.data<double>() : nullptr,
        expert_counts.defined() ? expert_counts.data<int64_t>() : nullptr, expert.data<int64_t>(),
        kept.data<uint8_t>(), d.t * d.k, d.e);
    MG_CUDA_CHECK_LAUNCH();
  }
  if (aux_sums.defined() || z_sum.defined()) {
    Tensor sig_sum, lse;
    if (aux_sums.defined() && ka.sigmoid)
      sig_sum = Tensor::empty({std::max<int64_t>(d.t, 1)}, DType::f64, logits.device());
    if (z_sum.defined())
      lse = Tensor::empty({std::max<int64_t>(d.t, 1)}, DType::f64, logits.device());
    if (d.t > 0 && (sig_sum.defined() || lse.defined())) {
      moe_router_token_stats_kernel<<<grid_for(d.t), kThreads, 0, s>>>(
          sig_sum.defined() ? sig_sum.data<double>() : nullptr,
          lse.defined() ? lse.data<double>() : nullptr, scores.data<double>(), logits.raw_data(),
          logits.dtype(), d.t, d.e);
      MG_CUDA_CHECK_LAUNCH();
    }
    if (aux_sums.defined()) {
      const int64_t g = aux_sums.size(0);
      moe_router_aux_sums_kernel<<<grid_for(g * d.e), kThreads, 0, s>>>(
          aux_sums.data<double>(), scores.data<double>(),
          sig_sum.defined() ? sig_sum.data<double>() : nullptr, d.t, d.e, g);
      MG_CUDA_CHECK_LAUNCH();
    }
    if (z_sum.defined()) {
      moe_router_z_sum_kernel<<<1, 32, 0, s>>>(z_sum.data<double>(), lse.data<double>(), d.t);
      MG_CUDA_CHECK_LAUNCH();
    }
  }
}

void moe_router_topk_bwd(Tensor& dlogits, const Tensor& dprob, const Tensor& aux_dscores,
                         const Tensor& logits, const Tensor& expert, const Tensor& prob,
                         const Tensor& kept, const Tensor& scores, const ops::MoeRouterArgs& args) {
  const ops::MoeRouterDims d = ops::validate_moe_router_topk_bwd(
      OnCudaDevice{}, dlogits, dprob, aux_dscores, logits, expert, prob, kept, scores, args);
  if (d.t == 0) return;
  const RouterKernelArgs ka = router_kernel_args(d, args);
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  moe_router_topk_bwd_kernel<<<grid_for(d.t), kThreads, 0, current_stream(dev)>>>(
      dlogits.data<double>(), dprob.data<double>(),
      aux_dscores.defined() ? aux_dscores.data<double>() : nullptr,
      aux_dscores.defined() ? aux_dscores.size(0) : 1, logits.raw_data(), logits.dtype(),
      expert.data<int64_t>(), prob.data<double>(), kept.data<uint8_t>(), scores.data<double>(), ka,
      args.z_loss_coeff, args.z_loss_scale);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---- shared-expert gate ----

// One thread per token: gate[t] = sigmoid(a_t . b_t) (b_row_stride 0: b is one row, w), or with
// `backward` dg[t] = (a_t . b_t) g_t (1 - g_t) from the forward's gate g.
__global__ void shared_gate_token_kernel(double* out, const void* a, DType ta, const void* b,
                                         DType tb, int64_t b_row_stride, const double* gate,
                                         int64_t t_n, int64_t h) {
  for (int64_t t = grid_start(); t < t_n; t += grid_stride()) {
    double dot = 0.0;
    for (int64_t j = 0; j < h; ++j)
      dot = __dadd_rn(dot, __dmul_rn(load<double>(a, ta, t * h + j),
                                     load<double>(b, tb, t * b_row_stride + j)));
    if (gate) {
      const double g = gate[t];
      out[t] = __dmul_rn(__dmul_rn(dot, g), __dadd_rn(1.0, -g));
    } else {
      out[t] = 1.0 / (1.0 + exp(-dot));
    }
  }
}

// out = y + g_t z (f64, rounded once).
__global__ void shared_gate_out_kernel(void* out, DType to, const double* y, const void* z,
                                       DType tz, const double* gate, int64_t t_n, int64_t h) {
  const int64_t n = t_n * h;
  for (int64_t e = grid_start(); e < n; e += grid_stride())
    store<double>(out, to, e, __dadd_rn(y[e], __dmul_rn(gate[e / h], load<double>(z, tz, e))));
}

// dz = g_t dy, dx = dg_t w (each rounded once).
__global__ void shared_gate_bwd_rows_kernel(void* dz, DType tdz, void* dx, DType tdx,
                                            const void* dy, DType tdy, const void* w, DType tw,
                                            const double* gate, const double* dg, int64_t t_n,
                                            int64_t h) {
  const int64_t n = t_n * h;
  for (int64_t e = grid_start(); e < n; e += grid_stride()) {
    const int64_t t = e / h, j = e - t * h;
    store<double>(dz, tdz, e, __dmul_rn(gate[t], load<double>(dy, tdy, e)));
    store<double>(dx, tdx, e, __dmul_rn(dg[t], load<double>(w, tw, j)));
  }
}

// dw's term of (token r, column f): dg_r x[r, f].
struct SharedGateWeightTerm {
  const double* dg;
  const void* x;
  DType t;
  int64_t h;
  __device__ double operator()(int64_t r, int64_t f) const {
    return __dmul_rn(dg[r], load<double>(x, t, r * h + f));
  }
};

void moe_shared_gate_fwd(Tensor& out, Tensor& gate, const Tensor& y, const Tensor& z,
                         const Tensor& x, const Tensor& w) {
  const ops::MoeSharedGateDims d =
      ops::validate_moe_shared_gate_fwd(OnCudaDevice{}, out, gate, y, z, x, w);
  if (d.t == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  shared_gate_token_kernel<<<grid_for(d.t), kThreads, 0, s>>>(
      gate.data<double>(), x.raw_data(), x.dtype(), w.raw_data(), w.dtype(), 0, nullptr, d.t, d.h);
  MG_CUDA_CHECK_LAUNCH();
  if (d.h == 0) return;
  shared_gate_out_kernel<<<grid_for(d.t * d.h), kThreads, 0, s>>>(
      out.raw_data(), out.dtype(), y.data<double>(), z.raw_data(), z.dtype(), gate.data<double>(),
      d.t, d.h);
  MG_CUDA_CHECK_LAUNCH();
}

void moe_shared_gate_bwd(Tensor& dz, Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& z,
                         const Tensor& x, const Tensor& w, const Tensor& gate) {
  const ops::MoeSharedGateDims d =
      ops::validate_moe_shared_gate_bwd(OnCudaDevice{}, dz, dx, dw, dy, z, x, w, gate);
  const int dev = dy.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  if (d.h > 0) MG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), s));
  if (d.t == 0 || d.h == 0) return;
  Scratch dg(dev, static_cast<std::size_t>(d.t) * sizeof(double));
  shared_gate_token_kernel<<<grid_for(d.t), kThreads, 0, s>>>(dg.as<double>(), dy.raw_data(),
                                                              dy.dtype(), z.raw_data(), z.dtype(),
                                                              d.h, gate.data<double>(), d.t, d.h);
  MG_CUDA_CHECK_LAUNCH();
  shared_gate_bwd_rows_kernel<<<grid_for(d.t * d.h), kThreads, 0, s>>>(
      dz.raw_data(), dz.dtype(), dx.raw_data(), dx.dtype(), dy.raw_data(), dy.dtype(), w.raw_data(),
      w.dtype(), gate.data<double>(), dg.as<double>(), d.t, d.h);
  MG_CUDA_CHECK_LAUNCH();
  column_sum_accumulate(dw.raw_data(), DType::f64, d.t, d.h,
                        SharedGateWeightTerm{dg.as<double>(), x.raw_data(), x.dtype(), d.h}, dev);
}

// ---- moe_dispatch_index / moe_chunk_order ------------------------------------------------------

namespace {

// The first p in [0, n) with a[p] >= v (n when none): a binary search of the sorted keys.
__device__ __forceinline__ int64_t lower_bound_i32(const int32_t* a, int64_t n, int32_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// keys[i] = choice i's local expert (l when not selected: sorted after every expert), vals[i] = i,
// selected[i] = 1 or 0 (the choice_offsets scan's input).
__global__ void dispatch_keys_kernel(int32_t* keys, int32_t* vals, int64_t* selected,
                                     const int64_t* expert, const uint8_t* kept, int64_t first,
                                     int64_t l, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t x = expert[i];
    const bool sel = (kept == nullptr || kept[i] != 0) && x >= first && x - first < l;
    keys[i] = static_cast<int32_t>(sel ? x - first : l);
    vals[i] = static_cast<int32_t>(i);
    selected[i] = sel ? 1 : 0;
  }
}

// counts[e] = the length of expert e's run in the sorted keys.
__global__ void dispatch_counts_kernel(int64_t* counts, const int32_t* skeys, int64_t l,
                                       int64_t n) {
  for (int64_t e = grid_start(); e < l; e += grid_stride())
    counts[e] = lower_bound_i32(skeys, n, static_cast<int32_t>(e + 1)) -
                lower_bound_i32(skeys, n, static_cast<int32_t>(e));
}

// Row r of the sorted pairs: its choice and token (-1 past the selected rows), and row_of[choice].
__global__ void dispatch_rows_kernel(int64_t* row_choice, int64_t* row_token, int64_t* row_of,
                                     const int32_t* skeys, const int32_t* svals, int64_t k,
                                     int64_t l, int64_t n) {
  for (int64_t r = grid_start(); r < n; r += grid_stride()) {
    if (skeys[r] < l) {
      const int64_t i = svals[r];
      row_choice[r] = i;
      row_token[r] = i / k;
      row_of[i] = r;
    } else {
      row_choice[r] = -1;
      row_token[r] = -1;
    }
  }
}

// choice_rows[choice_offsets[i]] = row_of[i] for the selected choices (choice_offsets[i + 1] >
// choice_offsets[i]); choice_rows and token_rows are -1 from R = choice_offsets[n] on.
__global__ void dispatch_choice_rows_kernel(int64_t* choice_rows, int64_t* token_rows,
                                            const int64_t* choice_offsets, const int64_t* row_of,
                                            int64_t n) {
  const int64_t r = choice_offsets[n];
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    if (choice_offsets[i + 1] > choice_offsets[i]) choice_rows[choice_offsets[i]] = row_of[i];
    if (i >= r) {
      choice_rows[i] = -1;
      token_rows[i] = -1;
    }
  }
}

// token_offsets[t] = choice_offsets[t k] for t <= tokens; token t's selected rows (distinct) at
// token_rows[token_offsets[t] + their rank among them], so ascending (O(k^2), k is small).
__global__ void dispatch_token_kernel(int64_t* token_offsets, int64_t* token_rows,
                                      const int64_t* choice_offsets, const int64_t* row_of,
                                      int64_t k, int64_t tokens) {
  for (int64_t t = grid_start(); t <= tokens; t += grid_stride()) {
    const int64_t base = choice_offsets[t * k];
    token_offsets[t] = base;
    if (t == tokens) continue;
    const int64_t c = t * k;
    for (int64_t a = 0; a < k; ++a) {
      if (choice_offsets[c + a + 1] == choice_offsets[c + a]) continue;
      const int64_t row = row_of[c + a];
      int64_t rank = 0;
      for (int64_t b = 0; b < k; ++b)
        rank += choice_offsets[c + b + 1] > choice_offsets[c + b] && row_of[c + b] < row;
      token_rows[base + rank] = row;
    }
  }
}

// choice_counts[((i - c0) / k) mod g, expert[i]] += 1 for i in [c0, c0 + num); an expert outside
// [0, e) is skipped. Integer atomics: the counts do not depend on the order.
__global__ void dispatch_choice_counts_kernel(int64_t* choice_counts, const int64_t* expert,
                                              int64_t c0, int64_t num, int64_t k, int64_t g,
                                              int64_t e) {
  for (int64_t j = grid_start(); j < num; j += grid_stride()) {
    const int64_t x = expert[c0 + j];
    if (x < 0 || x >= e) continue;
    atomicAdd(reinterpret_cast<unsigned long long*>(choice_counts + (j / k) % g * e + x), 1ULL);
  }
}

void moe_dispatch_index(Tensor& counts, Tensor& choice_counts, Tensor& row_choice,
                        Tensor& row_token, Tensor& choice_offsets, Tensor& choice_rows,
                        Tensor& token_offsets, Tensor& token_rows, const Tensor& expert,
                        const Tensor& kept, const ops::MoeDispatchArgs& args) {
  constexpr const char* op = "moe_dispatch_index";
  const ops::MoeDispatchDims d = ops::validate_moe_dispatch_index(
      OnCudaDevice{}, counts, choice_counts, row_choice, row_token, choice_offsets, choice_rows,
      token_offsets, token_rows, expert, kept, args);
  const int64_t n = d.n, k = d.k, l = d.l;
  MG_CHECK(
      n < std::numeric_limits<int32_t>::max() && l < std::numeric_limits<int32_t>::max(),
      op << ": " << n << " choices or " << l << " experts exceed the device sort's 32-bit keys");
  const int dev = expert.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  if (choice_counts.defined()) {
    MG_CUDA_CHECK(cudaMemsetAsync(choice_counts.raw_data(), 0, choice_counts.nbytes(), s));
    if (args.count_num > 0) {
      dispatch_choice_counts_kernel<<<grid_for(args.count_num), kThreads, 0, s>>>(
          choice_counts.data<int64_t>(), expert.data<int64_t>(), args.count_first, args.count_num,
          k, d.g, d.e);
      MG_CUDA_CHECK_LAUNCH();
    }
  }
  if (n == 0) {  // no rows: zero counts, offsets [0] (the [N] outputs are empty)
    MG_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), s));
    MG_CUDA_CHECK(cudaMemsetAsync(choice_offsets.raw_data(), 0, choice_offsets.nbytes(), s));
    MG_CUDA_CHECK(cudaMemsetAsync(token_offsets.raw_data(), 0, token_offsets.nbytes(), s));
    return;
  }
  const auto nn = static_cast<std::size_t>(n);
  // row_of | selected (i64) | keys | vals | sorted keys | sorted vals (i32).
  Scratch buf(dev, nn * (2 * sizeof(int64_t) + 4 * sizeof(int32_t)));
  int64_t* row_of = buf.as<int64_t>();
  int64_t* selected = row_of + nn;
  int32_t* keys = reinterpret_cast<int32_t*>(selected + nn);
  int32_t *vals = keys + nn, *skeys = keys + 2 * nn, *svals = keys + 3 * nn;
  dispatch_keys_kernel<<<grid_for(n), kThreads, 0, s>>>(
      keys, vals, selected, expert.data<int64_t>(), kept.defined() ? kept.data<uint8_t>() : nullptr,
      args.first_expert, l, n);
  MG_CUDA_CHECK_LAUNCH();
  // Stable: choices ascending within an expert.
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) <= l) ++end_bit;  // keys in [0, l]
  const int ni = static_cast<int>(n);
  std::size_t sort_bytes = 0, scan_bytes = 0;
  int64_t* co = choice_offsets.data<int64_t>();
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, skeys, vals, svals, ni,
                                                0, end_bit, s));
  MG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, selected, co + 1, ni, s));
  Scratch temp(dev, std::max<std::size_t>({sort_bytes, scan_bytes, 1}));
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), sort_bytes, keys, skeys, vals, svals,
                                                ni, 0, end_bit, s));
  dispatch_counts_kernel<<<grid_for(l), kThreads, 0, s>>>(counts.data<int64_t>(), skeys, l, n);
  MG_CUDA_CHECK_LAUNCH();
  dispatch_rows_kernel<<<grid_for(n), kThreads, 0, s>>>(
      row_choice.data<int64_t>(), row_token.data<int64_t>(), row_of, skeys, svals, k, l, n);
  MG_CUDA_CHECK_LAUNCH();
  // choice_offsets = [0, inclusive sums of selected]; the stream orders the temp storage's reuse.
  MG_CUDA_CHECK(cudaMemsetAsync(co, 0, sizeof(int64_t), s));
  MG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp.get(), scan_bytes, selected, co + 1, ni, s));
  dispatch_choice_rows_kernel<<<grid_for(n), kThreads, 0, s>>>(
      choice_rows.data<int64_t>(), token_rows.data<int64_t>(), co, row_of, n);
  MG_CUDA_CHECK_LAUNCH();
  dispatch_token_kernel<<<grid_for(d.tokens + 1), kThreads, 0, s>>>(
      token_offsets.data<int64_t>(), token_rows.data<int64_t>(), co, row_of, k, d.tokens);
  MG_CUDA_CHECK_LAUNCH();
}

// out[p] = the sum of item(q) over q < p for p in [0, m], item(q) clamped at 0 (a negative count
// is an empty chunk), by the one block of kThreads threads: each thread sums a contiguous span,
// a block scan offsets the spans.
template <typename Item>
__device__ void block_exclusive_scan(int64_t* out, int64_t m, Item item) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t total;
  const int64_t span = (m + kThreads - 1) / kThreads;
  const int64_t lo = threadIdx.x * span, hi = lo + span < m ? lo + span : m;
  int64_t sum = 0;
  auto count = [&](int64_t q) {
    const int64_t c = item(q);
    return c > 0 ? c : int64_t{0};
  };
  for (int64_t q = lo; q < hi; ++q) sum += count(q);
  int64_t start = 0, all = 0;
  Scan(temp).ExclusiveSum(sum, start, all);
  for (int64_t q = lo; q < hi; ++q) {
    out[q] = start;
    start += count(q);
  }
  if (threadIdx.x == 0) total = all;
  __syncthreads();
  if (threadIdx.x == 0) out[m] = total;
  __syncthreads();  // temp is reused by the next scan
}

// received[j l + i] = the start of chunk [source j][local expert i] in the received layout (the
// counts' order), target[i ep + j] = its start in [i][j] order; both [ep l + 1], the last the
// total.
__global__ void chunk_starts_kernel(int64_t* received, int64_t* target, const int64_t* counts,
                                    int64_t ep, int64_t l) {
  const int64_t m = ep * l;
  block_exclusive_scan(received, m, [&](int64_t q) { return counts[q]; });
  block_exclusive_scan(target, m, [&](int64_t p) { return counts[(p % ep) * l + p / ep]; });
}

// order[q] = the received index of target row q (chunk c = i ep + j holding q, by binary search of
// the target starts), inverse[order[q]] = q. Rows past the counts' total get -1.
__global__ void chunk_order_kernel(int64_t* order, int64_t* inverse, const int64_t* received,
                                   const int64_t* target, int64_t ep, int64_t l, int64_t r) {
  const int64_t m = ep * l;
  for (int64_t q = grid_start(); q < r; q += grid_stride()) {
    if (q >= target[m]) {
      order[q] = -1;
      continue;
    }
    int64_t lo = 0, hi = m - 1;  // the last chunk c with target[c] <= q (non-empty: it holds q)
    while (lo < hi) {
      const int64_t mid = hi - (hi - lo) / 2;
      if (target[mid] <= q)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t i = lo / ep, j = lo % ep;
    const int64_t o = received[j * l + i] + (q - target[lo]);
    order[q] = o;
    if (o >= 0 && o < r) inverse[o] = q;
  }
}

void moe_chunk_order(Tensor& order, Tensor& inverse, const Tensor& counts) {
  ops::validate_moe_chunk_order(OnCudaDevice{}, order, inverse, counts);
  const int64_t ep = counts.size(0), l = counts.size(1), r = order.size(0);
  if (r == 0) return;
  const int dev = counts.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const auto m = static_cast<std::size_t>(ep * l + 1);
  Scratch starts(dev, 2 * m * sizeof(int64_t));  // received | target
  int64_t* received = starts.as<int64_t>();
  int64_t* target = received + m;
  chunk_starts_kernel<<<1, kThreads, 0, s>>>(received, target, counts.data<int64_t>(), ep, l);
  MG_CUDA_CHECK_LAUNCH();
  // -1 where no row maps (only when the counts do not sum to R, which is not checked here).
  MG_CUDA_CHECK(cudaMemsetAsync(inverse.raw_data(), 0xff, inverse.nbytes(), s));
  chunk_order_kernel<<<grid_for(r), kThreads, 0, s>>>(
      order.data<int64_t>(), inverse.data<int64_t>(), received, target, ep, l, r);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_moe_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::moe_router_topk>("cuda", &moe_router_topk, "cuda:moe");
  r.register_op<ops::OpId::moe_router_topk_bwd>("cuda", &moe_router_topk_bwd, "cuda:moe");
  r.register_op<ops::OpId::moe_permute>("cuda", &moe_permute, "cuda:moe");
  r.register_op<ops::OpId::moe_unpermute>("cuda", &moe_unpermute, "cuda:moe");
  r.register_op<ops::OpId::moe_unpermute_bwd>("cuda", &moe_unpermute_bwd, "cuda:moe");
  r.register_op<ops::OpId::moe_shared_gate_fwd>("cuda", &moe_shared_gate_fwd, "cuda:moe");
  r.register_op<ops::OpId::moe_shared_gate_bwd>("cuda", &moe_shared_gate_bwd, "cuda:moe");
  r.register_op<ops::OpId::moe_dispatch_index>("cuda", &moe_dispatch_index, "cuda:moe");
  r.register_op<ops::OpId::moe_chunk_order>("cuda", &moe_chunk_order, "cuda:moe");
}

}  // namespace mg::platforms::cuda
