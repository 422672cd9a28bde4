// Google Benchmark of the attention kernels (attention_fwd, and attention_fwd + attention_bwd) at
// small training shapes: S 128..512, B 1-2, NH 4-8, HD 64, causal, GQA; f32 and bf16 storage.
// MG_BENCH_PLATFORM=cpu (default, wall-clock time) or cuda (device-event time, bench_platform.h),
// which adds S 1024 and 2048 with B 2, NH 16, NG 4.
//
// FLOP/s counts the matmul work only, as flash-attention reports do: forward 4 * B * NH * HD per
// (query, key) pair the mask allows (S (S + 1) / 2 pairs when causal), backward 2.5x that (five
// matmul-shaped products, the recomputed scores included). On the CPU wall-clock time
// (UseRealTime), since the kernels run on every OpenMP thread. Not measured here: masks other than
// causal, dropout.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_platform.h"

namespace {

using mg::DType;
using mg::Tensor;

constexpr int64_t kHeadDim = 64;

Tensor random_tensor(const mg::Shape& shape, DType dtype, uint64_t seed) {
  return mg::bench::cached_tensor(shape, dtype, seed, [&] {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(mg::shape_numel(shape)));
    for (auto& x : v) x = dist(gen);
    return Tensor::from_vector(v, shape, dtype);
  });
}

// Arguments: S, B, NH, NG, dtype (0 f32, 1 bf16), with_backward (0/1).
void attention(benchmark::State& state) {
  const int64_t s = state.range(0), b = state.range(1), nh = state.range(2), ng = state.range(3);
  const DType dtype = state.range(4) == 0 ? DType::f32 : DType::bf16;
  const bool with_bwd = state.range(5) != 0;
  const mg::bench::BenchPlatform& p = mg::bench::bench_platform();
  const mg::ops::OpTable& ops = *p.ops;

  const Tensor q = random_tensor({s, b, nh, kHeadDim}, dtype, 1);
  const Tensor k = random_tensor({s, b, ng, kHeadDim}, dtype, 2);
  const Tensor v = random_tensor({s, b, ng, kHeadDim}, dtype, 3);
  const Tensor dout = random_tensor({s, b, nh, kHeadDim}, dtype, 4);
  Tensor out = Tensor::empty({s, b, nh, kHeadDim}, dtype, p.device);
  Tensor lse = Tensor::empty({b, nh, s}, DType::f32, p.device);
  Tensor dq = Tensor::empty(q.shape(), dtype, p.device);
  Tensor dk = Tensor::empty(k.shape(), dtype, p.device);
  Tensor dv = Tensor::empty(v.shape(), dtype, p.device);
  mg::ops::AttentionArgs args;
  args.causal = true;

  mg::bench::time_iterations(state, [&] {
    ops.attention_fwd(out, lse, q, k, v, args);
    if (with_bwd) ops.attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, args);
    benchmark::DoNotOptimize(out.raw_data());
    benchmark::DoNotOptimize(dq.raw_data());
    benchmark::ClobberMemory();
  });
  const double pairs = static_cast<double>(s) * static_cast<double>(s + 1) / 2.0;
  const double fwd_flops = 4.0 * static_cast<double>(b * nh * kHeadDim) * pairs;
  state.counters["FLOP/s"] = benchmark::Counter(with_bwd ? 3.5 * fwd_flops : fwd_flops,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(mg::dtype_name(dtype)) + (with_bwd ? " fwd+bwd" : " fwd"));
}

void shapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"S", "B", "NH", "NG", "bf16", "bwd"});
  std::vector<std::vector<int64_t>> sbhg = {
      {128, 1, 8, 2}, {256, 1, 8, 2}, {512, 1, 8, 2}, {256, 2, 4, 1}, {512, 2, 4, 2}};
  if (mg::bench::gpu_requested()) {
    sbhg.push_back({1024, 2, 16, 4});
    sbhg.push_back({2048, 2, 16, 4});
  }
  for (int64_t bwd : {0, 1})
    for (int64_t bf16 : {0, 1})
      for (const auto& x : sbhg) bm->Args({x[0], x[1], x[2], x[3], bf16, bwd});
}

BENCHMARK(attention)->Apply(shapes)->Apply(mg::bench::set_timing)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
