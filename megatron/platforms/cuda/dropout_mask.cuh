// The dropout mask of the CUDA kernels, shared by dropout.cu (dropout, bias_dropout_add) and
// norm.cu (the fused bias_dropout_add_norm_fwd): element i keeps its value iff
// mg::random::dropout_keep(seed, offset + i, p) (philox.h, the same __host__ __device__ code the
// CPU runs, so masks are bit-identical across platforms and across the fused/unfused ops), and
// kept values are scaled by keep_scale(p) = 1/(1-p); p == 0 is the identity.
// Not here: validation (megatron/core/ops/validate.h), kernels.
#pragma once

#include <cstdint>

#include "megatron/core/ops/op_args.h"
#include "megatron/core/random/philox.h"

namespace mg::platforms::cuda {

struct DropoutMask {
  uint64_t seed, offset;
  float p;
  bool identity;
  __device__ __forceinline__ bool keep(int64_t i) const {
    return identity || random::dropout_keep(seed, offset + static_cast<uint64_t>(i), p);
  }
};

inline DropoutMask make_mask(const ops::DropoutArgs& a) {
  return DropoutMask{a.seed, a.offset, a.p, a.p == 0.0f};
}

// 1/(1-p) in the compute type C (computed on the host, as the CPU computes it).
template <typename C>
C keep_scale(float p) {
  return C(1) / (C(1) - static_cast<C>(p));
}

}  // namespace mg::platforms::cuda
