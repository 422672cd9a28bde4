// The per-token arithmetic of the MoE router that the CPU (moe_utils.cpp) and the CUDA router
// kernels (platforms/cuda/moe.cu) share, as __host__ __device__ code: one definition, so the two
// platforms compute the same expressions in the same order.
// Not here: the top-k selection, group limiting, capacity, the auxiliary losses.
#pragma once

#include <cstdint>

#include "megatron/core/tensor/dtype_math.h"  // MG_HOST_DEVICE

namespace mg::transformer::moe {

inline constexpr double kSigmoidNormEps =
    1e-20;  // Megatron's "+ 1e-20" in the sigmoid normalisation

// dl[e] += the gradient reaching token t's E logits through its K top-k probabilities.
// ex: the chosen experts; g: d(loss)/d(prob) of the kept choices (0 for dropped ones), already
// multiplied by the top-k scaling factor; p: the probabilities before that factor (the softmax
// over the chosen logits; unused otherwise); s: the token's E scores (softmax over all logits, or
// sigmoids). softmax + pre_softmax: prob = the full softmax's entries; softmax alone: the softmax
// over the chosen; sigmoid: the chosen sigmoids normalised by their sum (K > 1).
MG_HOST_DEVICE void router_topk_token_backward(const int64_t* ex, const double* p, const double* g,
                                               const double* s, int64_t K, int64_t E, bool sigmoid,
                                               bool pre_softmax, double* dl) {
  if (!sigmoid) {
    if (pre_softmax) {
      // d(score e) = the g of the choices of e, added in choice order.
      auto ds = [&](int64_t e) {
        double v = 0.0;
        for (int64_t k = 0; k < K; ++k)
          if (ex[k] == e) v += g[k];
        return v;
      };
      double dot = 0.0;
      for (int64_t e = 0; e < E; ++e) dot += s[e] * ds(e);
      for (int64_t e = 0; e < E; ++e) dl[e] += s[e] * (ds(e) - dot);
    } else {
      double dot = 0.0;
      for (int64_t k = 0; k < K; ++k) dot += p[k] * g[k];
      for (int64_t k = 0; k < K; ++k) dl[ex[k]] += p[k] * (g[k] - dot);
    }
    return;
  }
  double sum = 0.0, gq = 0.0;
  for (int64_t k = 0; k < K; ++k) {
    sum += s[ex[k]];
    gq += g[k] * s[ex[k]];
  }
  const double den = sum + kSigmoidNormEps;
  for (int64_t k = 0; k < K; ++k) {
    const double q = s[ex[k]];
    const double dq = K > 1 ? g[k] / den - gq / (den * den) : g[k];
    dl[ex[k]] += dq * q * (1.0 - q);
  }
}

}  // namespace mg::transformer::moe
