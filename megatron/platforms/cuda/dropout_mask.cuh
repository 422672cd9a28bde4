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
  // keep(i + k) for k < 8 (the vector kernels' masks): elements offset + i .. + 7 are lanes of two
  // or three consecutive Philox blocks (philox.h: element e is lane e % 4 of block e / 4), so
  // those blocks are computed once each rather than one per element; the same decisions, bit for
  // bit. The lane shift (offset + i) % 4 is a select on registers, never a local-memory index.
  __device__ __forceinline__ void keep8(int64_t i, bool (&out)[8]) const {
    if (identity) {
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = true;
      return;
    }
    const uint64_t e = offset + static_cast<uint64_t>(i);
    const unsigned shift = static_cast<unsigned>(e & 3u);
    const random::Philox4x32 b0 = random::philox_block(seed, e >> 2);
    const random::Philox4x32 b1 = random::philox_block(seed, (e >> 2) + 1);
    random::Philox4x32 b2{{0u, 0u, 0u, 0u}};
    if (shift != 0) b2 = random::philox_block(seed, (e >> 2) + 2);
    const uint32_t w[12] = {b0.v[0], b0.v[1], b0.v[2], b0.v[3], b1.v[0], b1.v[1],
                            b1.v[2], b1.v[3], b2.v[0], b2.v[1], b2.v[2], b2.v[3]};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t u = shift == 0   ? w[k]
                         : shift == 1 ? w[k + 1]
                         : shift == 2 ? w[k + 2]
                                      : w[k + 3];
      out[k] = random::uniform_of_lane(u) >= p;
    }
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
