// The CPU dropout stream helpers shared by dropout.cpp (dropout, bias_dropout_add) and norm.cpp
// (the fused bias_dropout_add_norm_fwd): walking philox.h's keep decisions four counters per
// Philox block, the 1/(1-p) scale, and the bias-dropout-add element loop itself.
//
// Invariant: bias_dropout_add_range is the ONE definition of y = residual + dropout(x + bias) on
// the CPU. It is a non-inlined template, so the unfused op and the fused norm op run the same
// machine code (same rounding, same FMA contraction): their sums are bit-identical.
// Not here: validation (megatron/core/ops/validate.h), threading (the callers split the range).
#pragma once

#include <cstdint>

#include "megatron/core/ops/op_args.h"
#include "megatron/core/random/philox.h"
#include "megatron/core/tensor/dtype.h"

namespace mg::platforms::cpu {

// philox.h's uniform() on one lane of an already computed block (same expression, same bits).
inline float lane_uniform(uint32_t u) {
  return static_cast<float>(u >> 8) * (1.0f / 16777216.0f);
}

// Calls f(i, keep) for i in [begin, end), keep = dropout_keep(seed, offset + i, p). One Philox
// block serves four consecutive counters, so it is computed once per four elements.
template <typename F>
inline void for_each_keep(const ops::DropoutArgs& a, int64_t begin, int64_t end, F&& f) {
  int64_t i = begin;
  while (i < end) {
    const uint64_t e = a.offset + static_cast<uint64_t>(i);
    const random::Philox4x32 r = random::philox_block(a.seed, e >> 2);
    for (uint64_t lane = e & 3u; lane < 4 && i < end; ++lane, ++i)
      f(i, lane_uniform(r.v[lane]) >= a.p);
  }
}

// 1/(1-p) in the compute type C.
template <typename C>
C keep_scale(float p) {
  return C(1) / (C(1) - static_cast<C>(p));
}

// y[i] = residual[i] + dropout(x[i] + bias[i % f]) for flat indices i in [begin, end) of x [N, F]
// (bias null: none). The dropout element index is i (counter offset + i). Element-wise at the
// same index, so y may alias x or residual.
template <typename T>
[[gnu::noinline]] void bias_dropout_add_range(T* y, const T* x, const T* bias, const T* residual,
                                              int64_t f, const ops::DropoutArgs& args,
                                              int64_t begin, int64_t end) {
  using C = compute_t<T>;
  const bool identity = args.p == 0.0f;
  const C scale = identity ? C(1) : keep_scale<C>(args.p);
  auto one = [&](int64_t i, bool keep) {
    C v = C(0);
    if (keep) {
      v = to_f32(x[i]);
      if (bias) v += to_f32(bias[i % f]);
      v *= scale;
    }
    y[i] = store<T>(static_cast<C>(to_f32(residual[i])) + v);
  };
  if (identity) {
    for (int64_t i = begin; i < end; ++i) one(i, true);
  } else {
    for_each_keep(args, begin, end, one);
  }
}

}  // namespace mg::platforms::cpu
