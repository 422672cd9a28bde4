// Google Benchmark of the gemm op at training shapes, f32 and bf16, reporting FLOP/s (2*M*N*K per
// call). MG_BENCH_PLATFORM=cpu (default: OpenBLAS, wall-clock time, the work runs on several
// threads) or cuda (cuBLASLt, device-event time; bench_platform.h), which adds 4096 and 8192
// squares and the GEMMs of the PERFORMANCE.md workloads.
//
// Shapes: squares 256..1024; GPT-2-small's fused QKV linear at S*B = 512 (Y [S*B, 3H] = X [S*B, H]
// @ W^T, W [3H, H]: Megatron's ColumnParallelLinear layout, trans_b) and its weight gradient
// (dW [3H, H] += dY^T @ X: trans_a, beta = 1, f32 C for bf16 inputs as main_grad). On a GPU also
// every linear of a training step of gpt2-124m (T = 16384 tokens: micro-batch 16 x seq 1024; H 768)
// and llama-1b (T = 8192: micro-batch 4 x seq 2048; H 2048, QKV 3072 = 32 + 2 x 8 heads of 64,
// SwiGLU fc1 2 x 8192), for each of QKV, proj, fc1, fc2 and the logits (vocab 50304 / 32000):
//   fwd    Y [T, out] = X [T, in] @ W^T                      (trans_b)
//   dgrad  dX [T, in] = dY [T, out] @ W [out, in]
//   wgrad  dW [out, in] += dY^T @ X  into f32 main_grad      (trans_a, beta 1)
// and gemm_epilogue (BM_gemm_epilogue: bias, bias_gelu, dgelu_bgrad, bgrad) on gpt2-124m's MLP,
// and, when built with the CUDA toolkit (MG_BENCH_CUBLAS), the same calls as one raw cublasGemmEx
// each (BM_cublas_*: default algorithm, f32 compute, no TF32, on the same stream, timed the same
// way): "cuBLAS alone", so ours / cuBLAS shows what our gemm op adds (descriptor set-up,
// heuristics, validation, launch). On the CPU, bf16 runs include widening A and B to f32 (the CPU
// kernel's path), so bf16 vs f32 shows that cost. CUDA f32 is true f32 (no TF32), so its ceiling is
// the FP32 rate, not the tensor cores'. Inputs are random non-zero values (drawn on the device on a
// GPU). BM_fp8_gemm_workload (GPU, sm_89 / sm_90): the same llama-1b linears' three GEMMs as the
// FP8 linears run them (docs/fp8.md: fp8_gemm, both operands K-contiguous; fwd E4M3 x E4M3 -> bf16
// with fast accumulation, dgrad E5M2 x E4M3 -> bf16, wgrad E5M2 x E4M3 += into f32), to set
// beside BM_gemm_bf16_workload / BM_gemm_bf16_into_f32_workload's rows of the same M, N, K.
// Not run by the tests; build with the `benchmarks` target.
#include <benchmark/benchmark.h>

#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "benchmarks/bench_platform.h"

#ifdef MG_BENCH_CUBLAS
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace {

using mg::DType;
using mg::Tensor;

// Random non-zero values: +-U(0.1, 1) drawn on the host for the CPU platform; on a GPU N(0, 1)
// drawn on the device (init_normal), since drawing the workload shapes' 800M-element logits on the
// host would take most of a device call.
Tensor random_tensor(const mg::Shape& shape, DType dtype, uint64_t seed) {
  if (mg::bench::bench_platform().gpu()) {
    static std::map<std::tuple<mg::Shape, DType, uint64_t>, Tensor> cache;
    auto key = std::make_tuple(shape, dtype, seed);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Tensor t = Tensor::empty(shape, dtype, mg::bench::bench_platform().device);
    mg::ops::InitArgs a;
    a.seed = seed;
    mg::bench::bench_platform().ops->init_normal(t, a);
    return cache.emplace(key, t).first->second;
  }
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

// The GEMMs of a training step of the PERFORMANCE.md workloads (see the file comment): fwd, dgrad
// and wgrad of each linear. Rows: M, N, K, ta, tb, beta.
void workload_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "ta", "tb", "beta"});
  struct Linear {
    int64_t in, out;
  };
  struct Workload {
    int64_t tokens;
    std::vector<Linear> linears;  // QKV, proj, fc1, fc2, logits
  };
  const std::vector<Workload> workloads = {
      {16384, {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}}},
      {8192, {{2048, 3072}, {2048, 2048}, {2048, 16384}, {8192, 2048}, {2048, 32000}}}};
  for (const auto& w : workloads)
    for (const auto& l : w.linears) {
      b->Args({w.tokens, l.out, l.in, 0, 1, 0});  // fwd
      b->Args({w.tokens, l.in, l.out, 0, 0, 0});  // dgrad
    }
  b->Unit(benchmark::kMillisecond);
  mg::bench::set_timing(b);
}

// The weight gradients of workload_args' linears (f32 main_grad C, beta 1).
void workload_wgrad_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "ta", "tb", "beta"});
  const std::vector<std::vector<int64_t>> wl = {
      {16384, 768, 2304, 768, 768, 768, 3072, 3072, 768, 768, 50304},
      {8192, 2048, 3072, 2048, 2048, 2048, 16384, 8192, 2048, 2048, 32000}};
  for (const auto& w : wl)
    for (std::size_t i = 1; i + 1 < w.size(); i += 2)
      b->Args({w[i + 1], w[i], w[0], 1, 0, 1});  // dW [out, in] += dY^T [out, T] @ X [T, in]
  b->Unit(benchmark::kMillisecond);
  mg::bench::set_timing(b);
}

void gpu_only(benchmark::internal::Benchmark* b, void (*args)(benchmark::internal::Benchmark*)) {
  if (mg::bench::gpu_requested()) {
    args(b);
  } else {  // one placeholder row that skips: the CPU run stays short
    b->ArgNames({"M", "N", "K", "ta", "tb", "beta"});
    b->Args({0, 0, 0, 0, 0, 0});
  }
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

// gemm_epilogue (the fused bias / bias-GELU / dGELU+bias-grad / bias-grad GEMMs of a bias-GELU
// MLP): args M, N, K, ta, tb, beta, epilogue (0 bias, 1 bias_gelu, 2 dgelu_bgrad, 3 bgrad). A, B, C
// and aux bf16 (C f32 for bgrad: main_grad), bias bf16, dbias f32. On a GPU gpt2-124m's shapes (T =
// 16384): QKV fwd + bias, fc1 fwd + bias-GELU, fc2's dgrad + dGELU + fc1 bias grad, the fc1 wgrad +
// bias grad, and the QKV / proj / fc2 wgrads + bias grad; compare with BM_gemm_bf16_workload and
// BM_gemm_bf16_into_f32_workload (the GEMM alone) on the same shape.
void BM_gemm_epilogue(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  mg::ops::GemmEpilogueArgs g;
  g.trans_a = state.range(3) != 0;
  g.trans_b = state.range(4) != 0;
  g.beta = static_cast<float>(state.range(5));
  g.epilogue = static_cast<mg::ops::GemmEpilogue>(state.range(6));
  const auto e = g.epilogue;
  const auto& ops = *mg::bench::bench_platform().ops;
  const DType c_dtype = e == mg::ops::GemmEpilogue::bgrad ? DType::f32 : DType::bf16;
  Tensor a = random_tensor(g.trans_a ? mg::Shape{k, m} : mg::Shape{m, k}, DType::bf16, 1);
  Tensor b = random_tensor(g.trans_b ? mg::Shape{n, k} : mg::Shape{k, n}, DType::bf16, 2);
  Tensor c = random_tensor({m, n}, c_dtype, 3);
  const bool has_aux =
      e == mg::ops::GemmEpilogue::bias_gelu || e == mg::ops::GemmEpilogue::dgelu_bgrad;
  const bool has_bias = e == mg::ops::GemmEpilogue::bias || e == mg::ops::GemmEpilogue::bias_gelu;
  const bool has_dbias =
      e == mg::ops::GemmEpilogue::dgelu_bgrad || e == mg::ops::GemmEpilogue::bgrad;
  Tensor aux = has_aux ? random_tensor({m, n}, c_dtype, 4) : Tensor();
  Tensor bias = has_bias ? random_tensor({n}, DType::bf16, 5) : Tensor();
  Tensor dbias = has_dbias
                     ? random_tensor({e == mg::ops::GemmEpilogue::bgrad ? m : n}, DType::f32, 6)
                     : Tensor();
  mg::bench::time_iterations(state, [&] {
    ops.gemm_epilogue(c, aux, dbias, a, b, bias, g);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  });
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(mg::ops::gemm_epilogue_name(e));
}

void epilogue_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "ta", "tb", "beta", "epi"});
  const int64_t t = mg::bench::gpu_requested() ? 16384 : 512;
  b->Args({t, 2304, 768, 0, 1, 0, 0});  // QKV fwd + bias
  b->Args({t, 3072, 768, 0, 1, 0, 1});  // fc1 fwd + bias-GELU
  b->Args({t, 3072, 768, 0, 0, 0, 2});  // fc2 dgrad dY [T, H] @ W2 [H, F] + dGELU + fc1 dbias
  b->Args({3072, 768, t, 1, 0, 1, 3});  // fc1 wgrad dW [F, H] += dY^T X + dbias [F]
  if (mg::bench::gpu_requested()) {     // the other wgrads with a bias: QKV, proj, fc2
    b->Args({2304, 768, t, 1, 0, 1, 3});
    b->Args({768, 768, t, 1, 0, 1, 3});
    b->Args({768, 3072, t, 1, 0, 1, 3});
  }
  b->Unit(benchmark::kMillisecond);
  mg::bench::set_timing(b);
}

#ifdef MG_BENCH_CUBLAS
// "cuBLAS alone": the op's call as one cublasGemmEx on raw device pointers. Row-major C [M, N] =
// op(A) op(B) is column-major C^T [N, M] = op(B)^T op(A)^T, so cuBLAS gets B first: B is [K, N]
// row-major (ld N) or [N, K] with trans_b (ld K); A is [M, K] (ld K) or [K, M] with trans_a (ld M).
const char* cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

// Google Benchmark 1.7 takes a const char* (and copies it).
void skip(benchmark::State& state, const std::string& msg) {
  state.SkipWithError(msg.c_str());
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

void run_cublas(benchmark::State& state, DType ab, DType c_dtype) {
  const mg::bench::BenchPlatform& p = mg::bench::bench_platform();
  if (!p.gpu() || p.name != "cuda") {
    state.SkipWithError("the cuBLAS baseline needs MG_BENCH_PLATFORM=cuda");
    return;
  }
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  const float alpha = 1.0f, beta = static_cast<float>(state.range(5));
  static cublasHandle_t handle = nullptr;
  if (!handle) {
    const cublasStatus_t st = cublasCreate(&handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
      handle = nullptr;
      skip(state, std::string("cublasCreate: ") + cublas_status_name(st));
      return;
    }
  }
  auto stream =
      static_cast<cudaStream_t>(p.platform->current_stream(p.device.index).native_handle());
  cublasStatus_t st = cublasSetStream(handle, stream);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
  if (st != CUBLAS_STATUS_SUCCESS) {
    skip(state, std::string("cublasSetStream/SetMathMode: ") + cublas_status_name(st));
    return;
  }
  Tensor a = random_tensor(ta ? mg::Shape{k, m} : mg::Shape{m, k}, ab, 1);
  Tensor b = random_tensor(tb ? mg::Shape{n, k} : mg::Shape{k, n}, ab, 2);
  Tensor c = random_tensor({m, n}, c_dtype, 3);
  const int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n);
  auto call = [&] {
    return cublasGemmEx(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
                        b.raw_data(), cuda_type(ab), ldb, a.raw_data(), cuda_type(ab), lda, &beta,
                        c.raw_data(), cuda_type(c_dtype), static_cast<int>(n), CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
  };
  st = call();  // checked once outside the timed loop; a failure inside is reported after it
  if (st != CUBLAS_STATUS_SUCCESS) {
    skip(state, std::string("cublasGemmEx: ") + cublas_status_name(st));
    return;
  }
  cublasStatus_t loop_status = CUBLAS_STATUS_SUCCESS;
  mg::bench::time_iterations(state, [&] {
    const cublasStatus_t s = call();
    if (s != CUBLAS_STATUS_SUCCESS) loop_status = s;
  });
  const cudaError_t err = cudaGetLastError();
  if (loop_status != CUBLAS_STATUS_SUCCESS || err != cudaSuccess) {
    skip(state, std::string("cublasGemmEx in the timed loop: ") + cublas_status_name(loop_status) +
                    ", " + cudaGetErrorString(err));
    return;
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}
#endif

// On the CPU the workload rows are placeholders that skip (gpu_only).
void BM_gemm_bf16_workload(benchmark::State& s) {
  if (s.range(0) == 0) return s.SkipWithError("the workload GEMMs run with MG_BENCH_PLATFORM=cuda");
  run_gemm(s, DType::bf16, DType::bf16);
}
void BM_gemm_bf16_into_f32_workload(benchmark::State& s) {
  if (s.range(0) == 0) return s.SkipWithError("the workload GEMMs run with MG_BENCH_PLATFORM=cuda");
  run_gemm(s, DType::bf16, DType::f32);
}

// FP8 GEMMs of llama-1b's FP8 linears (T = 8192; QKV 3072 as the model's three parts 2048, 512,
// 512; proj; fc1 2 x 8192; fc2): args M, N, K, kind (0 fwd, 1 dgrad, 2 wgrad).
void fp8_workload_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "kind"});
  const int64_t t = 8192;
  const std::vector<std::pair<int64_t, int64_t>> linears = {
      {2048, 2048}, {2048, 512}, {2048, 2048}, {2048, 16384}, {8192, 2048}};  // {in, out}
  for (auto [in, out] : linears) {
    b->Args({t, out, in, 0});  // y [T, out] = x_q [T, in] . w_q [out, in]^T
    b->Args({t, in, out, 1});  // dx [T, in] = g_q [T, out] . (w_q^T) [in, out]^T
    b->Args({out, in, t, 2});  // dW [out, in] += (g_q^T) [out, T] . (x_q^T) [in, T]^T
  }
  b->Unit(benchmark::kMillisecond);
  mg::bench::set_timing(b);
}

// An FP8 tensor of random values (a bf16 N(0, 1) draw cast at scale 1).
Tensor random_fp8(const mg::Shape& shape, DType dt, uint64_t seed) {
  const auto& p = mg::bench::bench_platform();
  Tensor x = random_tensor(shape, DType::bf16, seed);
  Tensor q = Tensor::empty(shape, dt, p.device), none;
  Tensor one = Tensor::from_vector(std::vector<float>{1.0f}, {1}, DType::f32, p.device);
  Tensor amax = Tensor::zeros({1}, DType::f32, p.device);
  p.ops->fp8_cast_transpose(q, none, amax, x, one);
  return q;
}

void BM_fp8_gemm_workload(benchmark::State& state) {
  if (state.range(0) == 0)
    return state.SkipWithError("the FP8 GEMMs run with MG_BENCH_PLATFORM=cuda");
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2), kind = state.range(3);
  const auto& p = mg::bench::bench_platform();
  const DType ta = kind == 0 ? DType::fp8_e4m3 : DType::fp8_e5m2;  // hybrid: gradients E5M2
  Tensor a = random_fp8({m, k}, ta, 11), b = random_fp8({n, k}, DType::fp8_e4m3, 12);
  Tensor c = random_tensor({m, n}, kind == 2 ? DType::f32 : DType::bf16, 13);
  Tensor s = Tensor::from_vector(std::vector<float>{1.0f}, {1}, DType::f32, p.device);
  const mg::ops::Fp8GemmArgs args{.beta = kind == 2 ? 1.0f : 0.0f, .fast_accum = kind == 0};
  mg::bench::time_iterations(state, [&] {
    p.ops->fp8_gemm(c, a, b, s, s, args);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  });
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(kind == 0 ? "fwd" : kind == 1 ? "dgrad" : "wgrad");
}

BENCHMARK(BM_fp8_gemm_workload)->Apply([](benchmark::internal::Benchmark* b) {
  if (mg::bench::gpu_requested()) {
    fp8_workload_args(b);
  } else {
    b->ArgNames({"M", "N", "K", "kind"});
    b->Args({0, 0, 0, 0});
  }
});
BENCHMARK(BM_gemm_f32)->Apply(square_args);
BENCHMARK(BM_gemm_bf16)->Apply(square_args);
BENCHMARK(BM_gemm_f32)->Apply(linear_args);
BENCHMARK(BM_gemm_bf16)->Apply(linear_args);
BENCHMARK(BM_gemm_bf16_into_f32)->Apply(linear_args);
BENCHMARK(BM_gemm_bf16_workload)->Apply([](benchmark::internal::Benchmark* b) {
  gpu_only(b, workload_args);
});
BENCHMARK(BM_gemm_bf16_into_f32_workload)->Apply([](benchmark::internal::Benchmark* b) {
  gpu_only(b, workload_wgrad_args);
});
BENCHMARK(BM_gemm_epilogue)->Apply(epilogue_args);
#ifdef MG_BENCH_CUBLAS
void BM_cublas_bf16(benchmark::State& s) {
  run_cublas(s, DType::bf16, DType::bf16);
}
void BM_cublas_bf16_into_f32(benchmark::State& s) {
  run_cublas(s, DType::bf16, DType::f32);
}
void BM_cublas_bf16_workload(benchmark::State& s) {
  if (s.range(0) == 0) return s.SkipWithError("the cuBLAS baseline needs MG_BENCH_PLATFORM=cuda");
  run_cublas(s, DType::bf16, DType::bf16);
}
void BM_cublas_bf16_into_f32_workload(benchmark::State& s) {
  if (s.range(0) == 0) return s.SkipWithError("the cuBLAS baseline needs MG_BENCH_PLATFORM=cuda");
  run_cublas(s, DType::bf16, DType::f32);
}
BENCHMARK(BM_cublas_bf16)->Apply([](benchmark::internal::Benchmark* b) {
  gpu_only(b, square_args);
});
BENCHMARK(BM_cublas_bf16_into_f32)->Apply([](benchmark::internal::Benchmark* b) {
  gpu_only(b, linear_args);
});
BENCHMARK(BM_cublas_bf16_workload)->Apply([](benchmark::internal::Benchmark* b) {
  gpu_only(b, workload_args);
});
BENCHMARK(BM_cublas_bf16_into_f32_workload)->Apply([](benchmark::internal::Benchmark* b) {
  gpu_only(b, workload_wgrad_args);
});
#endif

}  // namespace

BENCHMARK_MAIN();
