// Google Benchmark of the attention kernels: attention_fwd, attention_bwd alone (after one
// forward), and attention_fwd + attention_bwd; causal; f32 and bf16 storage.
// MG_BENCH_PLATFORM=cpu (default, wall-clock time): small training shapes, S 128..512, B 1-2,
// NH 4-8, GQA, HD 64 and 128. cuda (device-event time, bench_platform.h): flash-attention's own
// benchmark sweep, bf16, HD 64 and 128, S 1k/2k/4k/8k, 16k tokens per call (B = 16384 / S),
// NH = 2048 / HD (hidden 2048), no GQA, so the figures compare with the FA2/FA3/cuDNN numbers of
// PERFORMANCE.md (FA3 paper, H100: causal hdim 128 forward 616 TFLOP/s, backward 561; FA2 335 and
// 322); plus the llama-1b layer's own shape (S 2048, B 4, NH 32, NG 8, HD 64).
//
// FLOP/s uses flash-attention's convention: forward 4 * B * NH * HD * S^2, halved when causal;
// backward 2.5x the forward (five matmul-shaped products, the recomputed scores included); forward
// + backward 3.5x. On the CPU wall-clock time (UseRealTime), since the kernels run on every OpenMP
// thread. Not measured here: masks other than causal, dropout, document masks.
// MG_OP_PROVIDERS picks the provider (attention_fwd=cuda:cudnn,attention_bwd=cuda:cudnn: cuDNN
// fused attention); the counter cudnn_calls (from mg_cuda_cudnn_attention_stats) shows whether
// cuDNN ran the calls or they fell back to ours.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_platform.h"

namespace {

using mg::DType;
using mg::Tensor;

Tensor random_tensor(const mg::Shape& shape, DType dtype, uint64_t seed) {
  return mg::bench::cached_tensor(shape, dtype, seed, [&] {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(mg::shape_numel(shape)));
    for (auto& x : v) x = dist(gen);
    return Tensor::from_vector(v, shape, dtype);
  });
}

// Arguments: S, B, NH, NG, HD, dtype (0 f32, 1 bf16), mode (0 fwd, 1 fwd+bwd, 2 bwd).
void attention(benchmark::State& state) {
  const int64_t s = state.range(0), b = state.range(1), nh = state.range(2), ng = state.range(3);
  const int64_t hd = state.range(4);
  const DType dtype = state.range(5) == 0 ? DType::f32 : DType::bf16;
  const int64_t mode = state.range(6);
  const mg::bench::BenchPlatform& p = mg::bench::bench_platform();
  const mg::ops::OpTable& ops = *p.ops;

  const Tensor q = random_tensor({s, b, nh, hd}, dtype, 1);
  const Tensor k = random_tensor({s, b, ng, hd}, dtype, 2);
  const Tensor v = random_tensor({s, b, ng, hd}, dtype, 3);
  const Tensor dout = random_tensor({s, b, nh, hd}, dtype, 4);
  Tensor out = Tensor::empty({s, b, nh, hd}, dtype, p.device);
  Tensor lse = Tensor::empty({b, nh, s}, DType::f32, p.device);
  Tensor dq = Tensor::empty(q.shape(), dtype, p.device);
  Tensor dk = Tensor::empty(k.shape(), dtype, p.device);
  Tensor dv = Tensor::empty(v.shape(), dtype, p.device);
  mg::ops::AttentionArgs args;
  args.causal = true;
  if (mode == 2) ops.attention_fwd(out, lse, q, k, v, args);  // the saved out and lse

  struct CudnnStats {
    uint64_t graphs, unsupported, fwd_calls, bwd_calls;
  };
  auto cudnn_stats =
      reinterpret_cast<CudnnStats (*)()>(dlsym(RTLD_DEFAULT, "mg_cuda_cudnn_attention_stats"));
  const CudnnStats before = cudnn_stats ? cudnn_stats() : CudnnStats{};
  mg::bench::time_iterations(state, [&] {
    if (mode != 2) ops.attention_fwd(out, lse, q, k, v, args);
    if (mode != 0) ops.attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, args);
    benchmark::DoNotOptimize(out.raw_data());
    benchmark::DoNotOptimize(dq.raw_data());
    benchmark::ClobberMemory();
  });
  const double fwd_flops = 4.0 * static_cast<double>(b * nh * hd) * static_cast<double>(s) *
                           static_cast<double>(s) / 2.0;
  const double mult = mode == 0 ? 1.0 : mode == 1 ? 3.5 : 2.5;
  if (cudnn_stats) {
    const CudnnStats after = cudnn_stats();
    state.counters["cudnn_calls"] = static_cast<double>(after.fwd_calls + after.bwd_calls -
                                                        before.fwd_calls - before.bwd_calls);
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(mult * fwd_flops, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(mg::dtype_name(dtype)) + " hd" + std::to_string(hd) +
                 (mode == 0   ? " fwd"
                  : mode == 1 ? " fwd+bwd"
                              : " bwd"));
}

void shapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"S", "B", "NH", "NG", "HD", "bf16", "mode"});
  if (mg::bench::gpu_requested()) {
    for (int64_t mode : {0, 2, 1}) {
      for (int64_t hd : {64, 128})
        for (int64_t s : {1024, 2048, 4096, 8192})
          bm->Args({s, 16384 / s, 2048 / hd, 2048 / hd, hd, 1, mode});
      bm->Args({2048, 4, 32, 8, 64, 1, mode});  // llama-1b's layer (micro-batch 4)
    }
    return;
  }
  const std::vector<std::vector<int64_t>> sbhgd = {
      {128, 1, 8, 2, 64}, {256, 1, 8, 2, 64},  {512, 1, 8, 2, 64}, {256, 2, 4, 1, 64},
      {512, 2, 4, 2, 64}, {256, 1, 4, 4, 128}, {512, 1, 4, 2, 128}};
  for (int64_t mode : {0, 1})
    for (int64_t bf16 : {0, 1})
      for (const auto& x : sbhgd) bm->Args({x[0], x[1], x[2], x[3], x[4], bf16, mode});
}

BENCHMARK(attention)->Apply(shapes)->Apply(mg::bench::set_timing)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
