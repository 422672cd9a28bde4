// CPU weight initialisation from the counter-based Philox streams (philox.h):
//   init_normal : x[i] = mean + std * normal(seed, offset + i)
//   init_uniform: x[i] = low + (high - low) * uniform(seed, offset + i)   (InitArgs mean/std =
//   low/high)
// Each value is computed in f64 and rounded to x's dtype as convert_host does (narrow floats via
// f32). Element i draws counter offset + i, so a tensor-parallel shard initialised with
// offset + (its global start) equals the slice of the full tensor: init is TP-invariant.
// Gradient rule: none (no backward).
// Not here: the choice of std per layer (init_method_normal / scaled_init_method_normal).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "megatron/core/random/philox.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

constexpr int64_t kChunk = 1 << 14;

// Calls f(type_identity<T>) for any float dtype; fp8 included (init of fp8 buffers is legitimate
// and costs nothing extra here).
template <typename F>
void dispatch_any_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::fp8_e4m3:
      return f(std::type_identity<fp8_e4m3_t>{});
    case DType::fp8_e5m2:
      return f(std::type_identity<fp8_e5m2_t>{});
    default:
      return dispatch_float(t, op, std::forward<F>(f));
  }
}

// Fills x with value_of(i) (an f64) for every element, chunked over OpenMP threads.
template <typename ValueOf>
void fill_with(const char* op, Tensor& x, ValueOf&& value_of) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_any_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    T* p = x.data<T>();
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = c * kChunk, e = std::min(n, (c + 1) * kChunk);
      value_of(b, e, [&](int64_t i, double v) { p[i] = store_from<T>(v); });
    }
  });
}

// x [*] = mean + std * N(0, 1)
void init_normal(Tensor& x, const ops::InitArgs& args) {
  constexpr const char* op = "init_normal";
  ops::validate_init_normal(kOnHost, x, args);
  fill_with(op, x, [&](int64_t b, int64_t e, auto&& put) {
    for (int64_t i = b; i < e; ++i)
      put(i, args.mean + args.std * random::normal(args.seed, args.offset + uint64_t(i)));
  });
}

// x [*] = low + (high - low) * U[0, 1)
void init_uniform(Tensor& x, const ops::InitArgs& args) {
  constexpr const char* op = "init_uniform";
  ops::validate_init_uniform(kOnHost, x, args);
  const double low = args.mean, high = args.std;
  fill_with(op, x, [&](int64_t b, int64_t e, auto&& put) {
    // One Philox block serves four consecutive counters; same bits as random::uniform().
    int64_t i = b;
    while (i < e) {
      const uint64_t ctr = args.offset + static_cast<uint64_t>(i);
      const random::Philox4x32 r = random::philox_block(args.seed, ctr >> 2);
      for (uint64_t lane = ctr & 3u; lane < 4 && i < e; ++lane, ++i) {
        const float u = static_cast<float>(r.v[lane] >> 8) * (1.0f / 16777216.0f);
        put(i, low + (high - low) * static_cast<double>(u));
      }
    }
  });
}

}  // namespace

void register_init_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::init_normal>("cpu", &init_normal, "cpu:omp");
  r.register_op<OpId::init_uniform>("cpu", &init_uniform, "cpu:omp");
}

}  // namespace mg::platforms::cpu
