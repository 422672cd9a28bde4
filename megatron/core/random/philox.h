// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of cuRAND and PyTorch, and the streams Megatron-CPP derives from it.
// Header-only and __host__ __device__, so the CPU and CUDA platforms produce identical bits.
//
// Streams (the contract every platform implements; tests check CPU against it):
//   key = (lo32(seed), hi32(seed)).
//   uniform_u32(seed, e): element e (= offset + i) is lane e%4 of block e/4, block counter
//                         (lo32(e/4), hi32(e/4), 0, 0).
//   uniform(seed, e)    : (uniform_u32 >> 8) * 2^-24, in [0, 1), exact in f32.
//   normal(seed, e)     : Box-Muller in f64 on lanes (2*(e%2), 2*(e%2)+1) of block e/2:
//                         u1 = (x0 + 1) * 2^-32 in (0, 1], u2 = x1 * 2^-32;
//                         z = sqrt(-2 ln u1) * (e even ? cos : sin)(2 pi u2).
//   dropout keep(e)     : uniform(seed, e) >= p.
#pragma once

#include <cmath>
#include <cstdint>

#ifndef MG_HOST_DEVICE
#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MG_HOST_DEVICE inline
#endif
#endif

namespace mg::random {

struct Philox4x32 {
  uint32_t v[4];
};

MG_HOST_DEVICE uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds: counter c, key k.
MG_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo32(kM0, c.v[0], &hi0);
    const uint32_t lo1 = mulhilo32(kM1, c.v[2], &hi1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

MG_HOST_DEVICE Philox4x32 philox_block(uint64_t seed, uint64_t block) {
  return philox4x32_10(
      Philox4x32{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

MG_HOST_DEVICE uint32_t uniform_u32(uint64_t seed, uint64_t e) {
  return philox_block(seed, e >> 2).v[e & 3];
}

// uniform() of a lane already taken from its block (callers that use all four lanes of a block).
MG_HOST_DEVICE float uniform_of_lane(uint32_t u) {
  return static_cast<float>(u >> 8) * (1.0f / 16777216.0f);
}

MG_HOST_DEVICE float uniform(uint64_t seed, uint64_t e) {
  return uniform_of_lane(uniform_u32(seed, e));
}

MG_HOST_DEVICE double normal(uint64_t seed, uint64_t e) {
  const Philox4x32 r = philox_block(seed, e >> 1);
  const int lane = static_cast<int>(e & 1) * 2;
  const double u1 = (static_cast<double>(r.v[lane]) + 1.0) * 2.3283064365386963e-10;
  const double u2 = static_cast<double>(r.v[lane + 1]) * 2.3283064365386963e-10;
  const double radius = sqrt(-2.0 * log(u1));
  const double theta = 6.283185307179586476925 * u2;
  return radius * ((e & 1) ? sin(theta) : cos(theta));
}

MG_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t e, float p) {
  return uniform(seed, e) >= p;
}

}  // namespace mg::random
