// Google Benchmark of the gemm op at training shapes, f32 and bf16, reporting FLOP/s (2*M*N*K per
// call). MG_BENCH_PLATFORM=cpu (default: OpenBLAS, wall-clock time, the work runs on several
// threads) or cuda (cuBLASLt, device-event time; bench_platform.h), which adds 4096 and 8192
// squares and GPT-sized linears (S*B = 8192 tokens, H = 4096, 3H QKV and 4H FFN).
//
// Shapes: squares 256..1024, and GPT-2-small's fused QKV linear Y [S*B, 3H] = X [S*B, H] @ W^T
// with W [3H, H] (Megatron's ColumnParallelLinear layout, trans_b), S*B = 512, H = 768, plus its
// weight gradient dW [3H, H] += dY^T @ X (trans_a, beta = 1, f32 C for bf16 inputs as main_grad).
// On the CPU, bf16 runs include widening A and B to f32 (the CPU kernel's path), so bf16 vs f32
// shows that cost. CUDA f32 is true f32 (no TF32), so its ceiling is the FP32 rate, not the tensor
// cores'. Inputs are random non-zero values. Not run by the tests; build with the `benchmarks`
// target.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "benchmarks/bench_platform.h"

namespace {

using mg::DType;
using mg::Tensor;

Tensor random_tensor(const mg::Shape& shape, DType dtype, uint64_t seed) {
  return mg::bench::cached_tensor(shape, dtype, seed, [&] {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> u(0.1f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(mg::shape_numel(shape)));
    for (auto& x : v) x = (gen() & 1) ? u(gen) : -u(gen);
    return Tensor::from_vector(v, shape, dtype);
  });
}

// args: M, N, K, trans_a, trans_b, beta (0/1); dtype of A and B, dtype of C.
void run_gemm(benchmark::State& state, DType ab, DType c_dtype) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  mg::ops::GemmArgs g;
  g.trans_a = state.range(3) != 0;
  g.trans_b = state.range(4) != 0;
  g.beta = static_cast<float>(state.range(5));
  const auto& ops = *mg::bench::bench_platform().ops;
  Tensor a = random_tensor(g.trans_a ? mg::Shape{k, m} : mg::Shape{m, k}, ab, 1);
  Tensor b = random_tensor(g.trans_b ? mg::Shape{n, k} : mg::Shape{k, n}, ab, 2);
  Tensor c = random_tensor({m, n}, c_dtype, 3);
  mg::bench::time_iterations(state, [&] {
    ops.gemm(c, a, b, g);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  });
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void square_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "ta", "tb", "beta"});
  for (int64_t s : {256, 512, 1024}) b->Args({s, s, s, 0, 0, 0});
  if (mg::bench::gpu_requested())
    for (int64_t s : {4096, 8192}) b->Args({s, s, s, 0, 0, 0});
  b->Unit(benchmark::kMillisecond);
  mg::bench::set_timing(b);
}

// S*B = 512 tokens, H = 768: forward QKV and the weight gradient.
void linear_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "ta", "tb", "beta"});
  b->Args({512, 3 * 768, 768, 0, 1, 0});  // Y [S*B, 3H] = X [S*B, H] @ W^T
  b->Args({3 * 768, 768, 512, 1, 0, 1});  // dW [3H, H] += dY^T [3H, S*B] @ X [S*B, H]
  if (mg::bench::gpu_requested()) {
    // S*B = 8192, H = 4096: QKV forward, its weight gradient, FFN up (4H) forward.
    b->Args({8192, 3 * 4096, 4096, 0, 1, 0});
    b->Args({3 * 4096, 4096, 8192, 1, 0, 1});
    b->Args({8192, 4 * 4096, 4096, 0, 1, 0});
  }
  b->Unit(benchmark::kMillisecond);
  mg::bench::set_timing(b);
}

void BM_gemm_f32(benchmark::State& s) {
  run_gemm(s, DType::f32, DType::f32);
}
void BM_gemm_bf16(benchmark::State& s) {
  run_gemm(s, DType::bf16, DType::bf16);
}
void BM_gemm_bf16_into_f32(benchmark::State& s) {
  run_gemm(s, DType::bf16, DType::f32);
}

BENCHMARK(BM_gemm_f32)->Apply(square_args);
BENCHMARK(BM_gemm_bf16)->Apply(square_args);
BENCHMARK(BM_gemm_f32)->Apply(linear_args);
BENCHMARK(BM_gemm_bf16)->Apply(linear_args);
BENCHMARK(BM_gemm_bf16_into_f32)->Apply(linear_args);

}  // namespace

BENCHMARK_MAIN();
