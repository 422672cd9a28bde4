// Google Benchmark of the memory-bound kernels of a training step: layernorm and rmsnorm forward
// and backward, gelu (tanh form) and swiglu forward and backward, bias_dropout_add forward and
// backward (p 0 and 0.1), cross entropy forward and backward, and the AdamW step, at the shapes of
// the PERFORMANCE.md workloads (gpt2-124m: 16384 tokens x H 768, FFN 3072, vocab 50304; llama-1b:
// 8192 tokens x H 2048, FFN 8192 SwiGLU, vocab 32000; AdamW over 124M parameters), bf16 and f32
// activations. MG_BENCH_PLATFORM=cpu (default: smaller shapes, wall-clock time) or cuda
// (device-event time; bench_platform.h).
//
// Figures: bytes/s = the fewest bytes the op must move through memory (every input read once,
// every output written once; per-row statistics and [H] parameters included; counted per op
// below) over the time, and copy_frac = that rate over the copy bandwidth measured in the same
// process (BM_copy: a 1 GiB device-to-device copy on a GPU through the platform's copy, 256 MiB
// memmove on the CPU; bytes read + written, as PERFORMANCE.md counts). The platform copy
// synchronises its stream after each call, so on a GPU the reference includes one host round trip
// per 1 GiB copy (~1%); on the CPU it is one thread's memmove while the kernels use every OpenMP
// thread, so copy_frac can exceed 1 there. Inputs are random (init_normal on the device), never
// zeros. Also the fused pre-norm ops (bias_dropout_add_norm_fwd: residual + dropout(x + bias) then
// the norm, in one pass; norm_bwd_add: the norm's backward plus the residual gradient); compare
// with bias_dropout_add + layernorm / rmsnorm above (their sum is the unfused cost). The GEMM
// epilogues are in gemm_bench. RoPE forward and backward (in place, [B, S] position ids, as the
// GPT model calls it) at llama-1b's q and k shapes (S 2048, B 4, 32 heads / 8 groups, HD 64), with
// the scalar kernel forced (rope.cu's mg_cuda_rope_apply_with) beside the default for comparison.
// BM_fp8_cast: the FP8 casts of llama-1b's linears (docs/fp8.md): fp8_cast_transpose of an
// activation [8192, 2048] and [8192, 8192] (q and qt), and SwiGLU's cast as the separate ops
// (swiglu_fwd / swiglu_bwd, then the cast) against the fused fp8_swiglu_cast_transpose /
// fp8_dswiglu_cast_transpose; bytes/s counts the fused form's traffic for both (x and dy read
// once, q and qt written), so the separate pair shows what the bf16 round trip costs.
// BM_vector_path: bias_grad's column sums, bias_dropout_add_bwd and cross_entropy_fwd on aligned
// data (the 16-byte vector paths) and on a view one element in (their scalar fallbacks).
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "benchmarks/bench_platform.h"
#include "megatron/core/ops/op_args.h"

namespace {

using mg::DType;
using mg::Tensor;

const mg::ops::OpTable& ops() {
  return *mg::bench::bench_platform().ops;
}

// A random tensor on the benchmark device, made once per (shape, dtype, seed).
Tensor random_tensor(const mg::Shape& shape, DType dtype, uint64_t seed, double std = 1.0) {
  static std::map<std::tuple<mg::Shape, DType, uint64_t>, Tensor> cache;
  auto key = std::make_tuple(shape, dtype, seed);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Tensor t = Tensor::empty(shape, dtype, mg::bench::bench_platform().device);
  mg::ops::InitArgs a;
  a.mean = 0.0;
  a.std = std;
  a.seed = seed;
  ops().init_normal(t, a);
  return cache.emplace(key, t).first->second;
}

Tensor empty(const mg::Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, mg::bench::bench_platform().device);
}

// Copy bandwidth of this device (bytes read + written per second), measured once: the median of 5
// rounds of 4 copies between two buffers of 1 GiB (GPU) or 256 MiB (CPU).
double copy_bandwidth() {
  static const double bw = [] {
    const auto& p = mg::bench::bench_platform();
    const int64_t n = (p.gpu() ? (int64_t{1} << 30) : (int64_t{1} << 28)) / 4;
    Tensor src = random_tensor({n}, DType::f32, 901);
    Tensor dst = empty({n}, DType::f32);
    const std::size_t bytes = static_cast<std::size_t>(n) * 4;
    auto copy = [&] {
      p.platform->copy(dst.raw_data(), p.device, src.raw_data(), p.device, bytes);
    };
    copy();
    std::vector<double> secs;
    for (int r = 0; r < 5; ++r) {
      double s;
      if (p.gpu()) {
        auto& stream = p.platform->current_stream(p.device.index);
        auto start = p.platform->create_event(p.device.index, true);
        auto stop = p.platform->create_event(p.device.index, true);
        start->record(stream);
        for (int i = 0; i < 4; ++i) copy();
        stop->record(stream);
        stop->synchronize();
        s = stop->elapsed_ms(*start) / 1e3 / 4;
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 4; ++i) copy();
        s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 4;
      }
      secs.push_back(s);
    }
    std::sort(secs.begin(), secs.end());
    return 2.0 * static_cast<double>(bytes) / secs[secs.size() / 2];
  }();
  return bw;
}

// Times fn, sets bytes/s and copy_frac from `bytes` moved per call.
template <typename F>
void run(benchmark::State& state, double bytes, const std::string& label, F&& fn) {
  const double copy_bw = copy_bandwidth();
  const double secs = mg::bench::time_iterations(state, [&] {
    fn();
    benchmark::ClobberMemory();
  });
  state.counters["bytes/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  if (secs > 0)
    state.counters["copy_frac"] = bytes * static_cast<double>(state.iterations()) / secs / copy_bw;
  state.SetLabel(label);
}

DType dtype_arg(int64_t v) {
  return v == 0 ? DType::f32 : DType::bf16;
}

double esize(DType t) {
  return static_cast<double>(mg::dtype_size(t));
}

// ---- the reference: the copy itself ----

void BM_copy(benchmark::State& state) {
  const auto& p = mg::bench::bench_platform();
  const int64_t n = state.range(0) / 4;
  Tensor src = random_tensor({n}, DType::f32, 902);
  Tensor dst = empty({n}, DType::f32);
  const std::size_t bytes = static_cast<std::size_t>(n) * 4;
  run(state, 2.0 * static_cast<double>(bytes), "platform copy",
      [&] { p.platform->copy(dst.raw_data(), p.device, src.raw_data(), p.device, bytes); });
}

// ---- norms: args N, H, dtype (0 f32, 1 bf16), backward (0/1) ----

void BM_layernorm(benchmark::State& state) {
  const int64_t n = state.range(0), h = state.range(1);
  const DType dt = dtype_arg(state.range(2));
  const bool bwd = state.range(3) != 0;
  Tensor x = random_tensor({n, h}, dt, 1), dy = random_tensor({n, h}, dt, 2);
  Tensor gamma = random_tensor({h}, dt, 3), beta = random_tensor({h}, dt, 4);
  Tensor y = empty({n, h}, dt), dx = empty({n, h}, dt);
  Tensor mean = empty({n}, DType::f32), rstd = empty({n}, DType::f32);
  Tensor dgamma = random_tensor({h}, DType::f32, 5), dbeta = random_tensor({h}, DType::f32, 6);
  mg::ops::NormArgs args;
  ops().layernorm_fwd(y, mean, rstd, x, gamma, beta, args);
  const double e = esize(dt), nh = static_cast<double>(n * h);
  if (!bwd) {  // x in, y out, mean and rstd out, gamma and beta in
    run(state, 2 * nh * e + 8.0 * n + 2.0 * h * e, "layernorm fwd",
        [&] { ops().layernorm_fwd(y, mean, rstd, x, gamma, beta, args); });
  } else {  // dy, x in, dx out, mean and rstd in, gamma in, dgamma and dbeta (f32) read + written
    run(state, 3 * nh * e + 8.0 * n + h * e + 16.0 * h, "layernorm bwd",
        [&] { ops().layernorm_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, args); });
  }
}

void BM_rmsnorm(benchmark::State& state) {
  const int64_t n = state.range(0), h = state.range(1);
  const DType dt = dtype_arg(state.range(2));
  const bool bwd = state.range(3) != 0;
  Tensor x = random_tensor({n, h}, dt, 1), dy = random_tensor({n, h}, dt, 2);
  Tensor gamma = random_tensor({h}, dt, 3);
  Tensor y = empty({n, h}, dt), dx = empty({n, h}, dt);
  Tensor rstd = empty({n}, DType::f32);
  Tensor dgamma = random_tensor({h}, DType::f32, 5);
  mg::ops::NormArgs args;
  ops().rmsnorm_fwd(y, rstd, x, gamma, args);
  const double e = esize(dt), nh = static_cast<double>(n * h);
  if (!bwd) {
    run(state, 2 * nh * e + 4.0 * n + h * e, "rmsnorm fwd",
        [&] { ops().rmsnorm_fwd(y, rstd, x, gamma, args); });
  } else {
    run(state, 3 * nh * e + 4.0 * n + h * e + 8.0 * h, "rmsnorm bwd",
        [&] { ops().rmsnorm_bwd(dx, dgamma, dy, x, rstd, gamma, args); });
  }
}

// ---- activations: args N, F, dtype, backward ----

void BM_gelu(benchmark::State& state) {
  const int64_t n = state.range(0), f = state.range(1);
  const DType dt = dtype_arg(state.range(2));
  const bool bwd = state.range(3) != 0;
  Tensor x = random_tensor({n, f}, dt, 1), dy = random_tensor({n, f}, dt, 2);
  Tensor y = empty({n, f}, dt), dx = empty({n, f}, dt);
  const double nf = static_cast<double>(n * f) * esize(dt);
  const auto approx = mg::ops::GeluApprox::tanh;
  if (!bwd)
    run(state, 2 * nf, "gelu(tanh) fwd", [&] { ops().gelu_fwd(y, x, approx); });
  else
    run(state, 3 * nf, "gelu(tanh) bwd", [&] { ops().gelu_bwd(dx, dy, x, approx); });
}

// x [N, 2F] = [gate | up], y [N, F].
void BM_swiglu(benchmark::State& state) {
  const int64_t n = state.range(0), f = state.range(1);
  const DType dt = dtype_arg(state.range(2));
  const bool bwd = state.range(3) != 0;
  Tensor x = random_tensor({n, 2 * f}, dt, 1), dy = random_tensor({n, f}, dt, 2);
  Tensor y = empty({n, f}, dt), dx = empty({n, 2 * f}, dt);
  const double nf = static_cast<double>(n * f) * esize(dt);
  if (!bwd)
    run(state, 3 * nf, "swiglu fwd", [&] { ops().swiglu_fwd(y, x); });
  else
    run(state, 5 * nf, "swiglu bwd", [&] { ops().swiglu_bwd(dx, dy, x); });
}

// ---- FP8 casts: args N, C, mode (0 cast-transpose of [N, C]; 1 / 2 swiglu then cast, separate /
// fused, F = C; 3 / 4 its backward, separate / fused) ----

void BM_fp8_cast(benchmark::State& state) {
  const int64_t n = state.range(0), c = state.range(1), mode = state.range(2);
  const auto dev = mg::bench::bench_platform().device;
  Tensor scale = Tensor::from_vector(std::vector<float>{8.0f}, {1}, DType::f32, dev);
  Tensor amax = Tensor::zeros({1}, DType::f32, dev);
  const double nc = static_cast<double>(n * c);
  if (mode == 0) {
    Tensor x = random_tensor({n, c}, DType::bf16, 31);
    Tensor q = empty({n, c}, DType::fp8_e4m3), qt = empty({c, n}, DType::fp8_e4m3);
    run(state, 4 * nc, "fp8_cast_transpose",
        [&] { ops().fp8_cast_transpose(q, qt, amax, x, scale); });
    return;
  }
  const bool bwd = mode >= 3, fused = mode == 2 || mode == 4;
  const int64_t qc = bwd ? 2 * c : c;  // the operand's columns
  Tensor x = random_tensor({n, 2 * c}, DType::bf16, 32);
  Tensor dy = random_tensor({n, c}, DType::bf16, 33);
  Tensor q = empty({n, qc}, DType::fp8_e5m2), qt = empty({qc, n}, DType::fp8_e5m2);
  Tensor mid = empty({n, qc}, DType::bf16);
  // Fused traffic: fwd x (4C) + q, qt (2C) per row; bwd dy (2C) + x (4C) + q, qt (4C).
  const double bytes = bwd ? 10 * nc : 6 * nc;
  if (!bwd && fused)
    run(state, bytes, "fused swiglu cast",
        [&] { ops().fp8_swiglu_cast_transpose(q, qt, amax, x, scale); });
  else if (!bwd)
    run(state, bytes, "swiglu_fwd + cast", [&] {
      ops().swiglu_fwd(mid, x);
      ops().fp8_cast_transpose(q, qt, amax, mid, scale);
    });
  else if (fused)
    run(state, bytes, "fused dswiglu cast",
        [&] { ops().fp8_dswiglu_cast_transpose(q, qt, amax, dy, x, scale); });
  else
    run(state, bytes, "swiglu_bwd + cast", [&] {
      ops().swiglu_bwd(mid, dy, x);
      ops().fp8_cast_transpose(q, qt, amax, mid, scale);
    });
}

// ---- bias_dropout_add: args N, H, dtype, backward, p x 100 ----

void BM_bias_dropout_add(benchmark::State& state) {
  const int64_t n = state.range(0), h = state.range(1);
  const DType dt = dtype_arg(state.range(2));
  const bool bwd = state.range(3) != 0;
  mg::ops::DropoutArgs d;
  d.p = static_cast<float>(state.range(4)) / 100.0f;
  d.seed = 1234;
  Tensor x = random_tensor({n, h}, dt, 1), res = random_tensor({n, h}, dt, 2);
  Tensor bias = random_tensor({h}, dt, 3), dy = random_tensor({n, h}, dt, 4);
  Tensor y = empty({n, h}, dt), dx = empty({n, h}, dt);
  Tensor dbias = random_tensor({h}, dt, 5);
  const double e = esize(dt), nh = static_cast<double>(n * h) * e;
  const std::string p = " p " + std::to_string(state.range(4)) + "%";
  if (!bwd)  // x, residual in, y out (the mask is regenerated from the seed, never stored)
    run(state, 3 * nh + h * e, "bias_dropout_add fwd" + p,
        [&] { ops().bias_dropout_add_fwd(y, x, bias, res, d); });
  else  // dy in, dx out, dbias read + written
    run(state, 2 * nh + 2 * h * e, "bias_dropout_add bwd" + p,
        [&] { ops().bias_dropout_add_bwd(dx, dbias, dy, d); });
}

// ---- fused pre-norm: bias_dropout_add_norm_fwd / norm_bwd_add: args N, H, dtype, backward, kind
// (0 layernorm, 1 rmsnorm); dropout p 0.1 ----

void BM_bda_norm(benchmark::State& state) {
  const int64_t n = state.range(0), h = state.range(1);
  const DType dt = dtype_arg(state.range(2));
  const bool bwd = state.range(3) != 0;
  const auto kind = state.range(4) == 0 ? mg::ops::NormKind::layernorm : mg::ops::NormKind::rmsnorm;
  const bool ln = kind == mg::ops::NormKind::layernorm;
  mg::ops::DropoutArgs d;
  d.p = 0.1f;
  d.seed = 1234;
  mg::ops::NormArgs args;
  Tensor x = random_tensor({n, h}, dt, 1), res = random_tensor({n, h}, dt, 2);
  Tensor bias = random_tensor({h}, dt, 3), gamma = random_tensor({h}, dt, 4);
  Tensor beta = ln ? random_tensor({h}, dt, 5) : Tensor();
  Tensor dy = random_tensor({n, h}, dt, 6), dres = random_tensor({n, h}, dt, 7);
  Tensor y = empty({n, h}, dt), sum = empty({n, h}, dt), dx = empty({n, h}, dt);
  Tensor mean = ln ? empty({n}, DType::f32) : Tensor(), rstd = empty({n}, DType::f32);
  Tensor dgamma = random_tensor({h}, DType::f32, 8);
  Tensor dbeta = ln ? random_tensor({h}, DType::f32, 9) : Tensor();
  ops().bias_dropout_add_norm_fwd(y, sum, mean, rstd, x, bias, res, gamma, beta, d, args, kind);
  const double e = esize(dt), nh = static_cast<double>(n * h) * e;
  const double stats = (ln ? 8.0 : 4.0) * static_cast<double>(n);
  const double params = (ln ? 2.0 : 1.0) * static_cast<double>(h);
  const std::string name = ln ? "layernorm" : "rmsnorm";
  if (!bwd)  // x, residual in; sum, y out; stats out; bias, gamma (beta) in
    run(state, 4 * nh + stats + (params + h) * e, "bias_dropout_add+" + name + " fwd p 10%", [&] {
      ops().bias_dropout_add_norm_fwd(y, sum, mean, rstd, x, bias, res, gamma, beta, d, args, kind);
    });
  else  // dy, dresidual, x in; dx out; stats, gamma in; dgamma (dbeta) f32 read + written
    run(state, 4 * nh + stats + h * e + 8.0 * params, name + " bwd + residual grad", [&] {
      ops().norm_bwd_add(dx, dgamma, dbeta, dy, dres, sum, mean, rstd, gamma, args, kind);
    });
}

// ---- cross entropy: args N, V, logits dtype, backward ----

void BM_cross_entropy(benchmark::State& state) {
  const int64_t n = state.range(0), v = state.range(1);
  const DType dt = dtype_arg(state.range(2));
  const bool bwd = state.range(3) != 0;
  Tensor logits = random_tensor({n, v}, dt, 1);
  Tensor dlogits = empty({n, v}, dt);
  Tensor targets = mg::bench::cached_tensor({n}, DType::i32, 7, [&] {
    std::vector<int32_t> t(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = (i * 7919) % v;
    return Tensor::from_vector(t, {n}, DType::i32);
  });
  Tensor loss = empty({n}, DType::f32), mx = empty({n}, DType::f32), se = empty({n}, DType::f32);
  Tensor dloss = random_tensor({n}, DType::f32, 8);
  ops().cross_entropy_fwd(loss, mx, se, logits, targets);
  const double nv = static_cast<double>(n * v) * esize(dt);
  if (!bwd)  // logits, targets in; loss, max, sum_exp out
    run(state, nv + 16.0 * n, "cross_entropy fwd",
        [&] { ops().cross_entropy_fwd(loss, mx, se, logits, targets); });
  else  // logits in, dlogits out; dloss, max, sum_exp, targets in
    run(state, 2 * nv + 16.0 * n, "cross_entropy bwd",
        [&] { ops().cross_entropy_bwd(dlogits, dloss, logits, mx, se, targets, 0); });
}

// ---- the 16-byte vector paths against their scalar fallbacks (bf16): args op (0 bias_grad, 1
// bias_dropout_add_bwd with dbias, p 10%, 2 cross_entropy_fwd), N, F or V, aligned (1: the data at
// the start of its buffer, the vector path; 0: the same op on a view one element in, which is
// only 2-byte aligned, so the scalar path: reduce.cuh's column sums, dropout.cu's two passes,
// cross_entropy.cu's scalar row passes; on the CPU both run the same kernels). Bytes as the ops
// above count them. ----

void BM_vector_path(benchmark::State& state) {
  const int64_t op = state.range(0), n = state.range(1), f = state.range(2);
  const bool aligned = state.range(3) != 0;
  const DType dt = DType::bf16;
  const double e = esize(dt), nf = static_cast<double>(n * f) * e;
  // The input: [n, f] at element 0 (aligned) or 1 (not) of one buffer.
  Tensor in = random_tensor({n * f + 8}, dt, 11).slice(aligned ? 0 : 1, n * f).view({n, f});
  const std::string path = aligned ? " (vector)" : " (scalar: unaligned view)";
  if (op == 0) {
    Tensor dbias = random_tensor({f}, DType::f32, 12);
    run(state, nf + 8.0 * f, "bias_grad -> f32" + path, [&] { ops().bias_grad(dbias, in); });
  } else if (op == 1) {
    mg::ops::DropoutArgs d;
    d.p = 0.1f;
    d.seed = 1234;
    Tensor dx = empty({n, f}, dt), dbias = random_tensor({f}, dt, 13);
    run(state, 2 * nf + 2 * f * e, "bias_dropout_add bwd p 10%" + path,
        [&] { ops().bias_dropout_add_bwd(dx, dbias, in, d); });
  } else {
    Tensor targets = mg::bench::cached_tensor({n}, DType::i32, 7, [&] {
      std::vector<int32_t> t(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = (i * 7919) % f;
      return Tensor::from_vector(t, {n}, DType::i32);
    });
    Tensor loss = empty({n}, DType::f32), mx = empty({n}, DType::f32), se = empty({n}, DType::f32);
    run(state, nf + 16.0 * n, "cross_entropy fwd" + path,
        [&] { ops().cross_entropy_fwd(loss, mx, se, in, targets); });
  }
}

// ---- AdamW: args numel, tensors (the numel split evenly), model_param dtype (0 none, 1 bf16) ----

void BM_adamw(benchmark::State& state) {
  const int64_t numel = state.range(0), count = state.range(1);
  const bool bf16_copy = state.range(2) != 0;
  const int64_t per = numel / count;
  std::vector<mg::ops::AdamParam> params;
  for (int64_t i = 0; i < count; ++i) {
    mg::ops::AdamParam a;
    const uint64_t s = 100 + 10 * static_cast<uint64_t>(i);
    a.param = random_tensor({per}, DType::f32, s, 0.02);
    a.grad = random_tensor({per}, DType::f32, s + 1, 1e-3);
    a.exp_avg = random_tensor({per}, DType::f32, s + 2, 1e-3);
    a.exp_avg_sq = empty({per}, DType::f32);
    ops().fill(a.exp_avg_sq, 1e-6);
    if (bf16_copy) a.model_param = empty({per}, DType::bf16);
    params.push_back(a);
  }
  mg::ops::AdamArgs args;
  args.lr = 1e-6f;
  args.beta2 = 0.95f;
  args.weight_decay = 0.1f;
  // param, exp_avg, exp_avg_sq read + written, grad read, model_param written.
  const double bytes = static_cast<double>(per * count) * (6 * 4 + 4 + (bf16_copy ? 2 : 0));
  run(state, bytes, bf16_copy ? "adamw f32 master -> bf16 param" : "adamw f32",
      [&] { ops().adamw_step(params, args); });
}

bool gpu() {
  return mg::bench::gpu_requested();
}

// ---- RoPE: args S, B, heads, HD, bwd (0/1), scalar (0/1: force the scalar kernel) ----

void BM_rope(benchmark::State& state) {
  const int64_t s = state.range(0), b = state.range(1), h = state.range(2), hd = state.range(3);
  const bool bwd = state.range(4) != 0, scalar = state.range(5) != 0;
  using ApplyWith = void (*)(Tensor&, const Tensor&, const mg::ops::RopeArgs&, bool, bool);
  const auto apply_with =
      reinterpret_cast<ApplyWith>(dlsym(RTLD_DEFAULT, "mg_cuda_rope_apply_with"));
  if (scalar && !apply_with) {
    state.SkipWithError(
        "no mg_cuda_rope_apply_with in this build (CPU, or before the vector kernel)");
    return;
  }
  Tensor x = random_tensor({s, b, h, hd}, DType::bf16, 40).clone();
  std::vector<int64_t> pos(static_cast<std::size_t>(b * s));
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i) % s;
  mg::ops::RopeArgs a;
  a.position_ids =
      Tensor::from_vector(pos, {b, s}, DType::i64).to(mg::bench::bench_platform().device);
  const double bytes =
      2.0 * static_cast<double>(x.numel()) * 2.0 + 8.0 * static_cast<double>(b * s);
  const std::string label = std::string(bwd ? "rope bwd" : "rope fwd") + (scalar ? " scalar" : "");
  run(state, bytes, label, [&] {
    if (scalar)
      apply_with(x, x, a, bwd, true);
    else if (bwd)
      ops().rope_bwd(x, x, a);
    else
      ops().rope_fwd(x, x, a);
  });
}

void rope_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"S", "B", "heads", "HD", "bwd", "scalar"});
  const int64_t s = gpu() ? 2048 : 256;
  for (int64_t bwd : {0, 1})
    for (int64_t heads : {32, 8})
      for (int64_t scalar : {0, 1})
        if (gpu() || scalar == 0) b->Args({s, 4, heads, 64, bwd, scalar});
}

void norm_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "H", "bf16", "bwd"});
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      gpu() ? std::vector<std::pair<int64_t, int64_t>>{{16384, 768}, {8192, 2048}}
            : std::vector<std::pair<int64_t, int64_t>>{{2048, 768}, {1024, 2048}};
  for (int64_t bwd : {0, 1})
    for (int64_t bf : {1, 0})
      for (auto [n, h] : shapes) b->Args({n, h, bf, bwd});
}

void gelu_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "F", "bf16", "bwd"});
  for (int64_t bwd : {0, 1})
    for (int64_t bf : {1, 0}) b->Args({gpu() ? 16384 : 2048, 3072, bf, bwd});
}

void swiglu_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "F", "bf16", "bwd"});
  for (int64_t bwd : {0, 1})
    for (int64_t bf : {1, 0}) b->Args({gpu() ? 8192 : 512, 8192, bf, bwd});
}

void fp8_cast_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "C", "mode"});
  const int64_t n = gpu() ? 8192 : 512;
  b->Args({n, 2048, 0});
  b->Args({n, 8192, 0});
  for (int64_t mode : {1, 2, 3, 4}) b->Args({n, 8192, mode});
}

void bda_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "H", "bf16", "bwd", "p%"});
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      gpu() ? std::vector<std::pair<int64_t, int64_t>>{{16384, 768}, {8192, 2048}}
            : std::vector<std::pair<int64_t, int64_t>>{{2048, 768}};
  for (int64_t bwd : {0, 1})
    for (int64_t p : {0, 10})
      for (auto [n, h] : shapes) b->Args({n, h, 1, bwd, p});
}

void bda_norm_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "H", "bf16", "bwd", "rms"});
  // gpt2-124m: LayerNorm at H 768; llama-1b: RMSNorm at H 2048.
  const int64_t n1 = gpu() ? 16384 : 2048, n2 = gpu() ? 8192 : 1024;
  for (int64_t bwd : {0, 1}) {
    b->Args({n1, 768, 1, bwd, 0});
    b->Args({n2, 2048, 1, bwd, 1});
  }
}

void ce_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "V", "bf16", "bwd"});
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      gpu() ? std::vector<std::pair<int64_t, int64_t>>{{16384, 50304}, {8192, 32000}}
            : std::vector<std::pair<int64_t, int64_t>>{{256, 50304}};
  for (int64_t bwd : {0, 1})
    for (int64_t bf : {1, 0})
      for (auto [n, v] : shapes) b->Args({n, v, bf, bwd});
}

void vector_path_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"op", "N", "F", "aligned"});
  // gpt2-124m: bias grads of H 768 and FFN 3072 over 16384 rows, its bias_dropout_add backward,
  // its logits [16384, 50304].
  const int64_t n = gpu() ? 16384 : 1024;
  for (int64_t aligned : {1, 0}) {
    b->Args({0, n, 768, aligned});
    b->Args({0, n, 3072, aligned});
    b->Args({1, n, 768, aligned});
    b->Args({2, gpu() ? n : 64, 50304, aligned});
  }
}

void adam_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"numel", "tensors", "bf16_param"});
  // GPT-2 124M: one flat buffer (Megatron's contiguous grad buffer) and 148 tensors (per layer).
  const int64_t numel = gpu() ? 124'475'904 : 4'194'304;
  b->Args({numel, 1, 1});
  b->Args({numel, 148, 1});
  b->Args({numel, 1, 0});
}

void copy_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes"});
  b->Arg(gpu() ? (int64_t{1} << 30) : (int64_t{1} << 28));
}

void setup(benchmark::internal::Benchmark* b) {
  mg::bench::set_timing(b);
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_copy)->Apply(copy_args)->Apply(setup);
BENCHMARK(BM_layernorm)->Apply(norm_args)->Apply(setup);
BENCHMARK(BM_rmsnorm)->Apply(norm_args)->Apply(setup);
BENCHMARK(BM_gelu)->Apply(gelu_args)->Apply(setup);
BENCHMARK(BM_swiglu)->Apply(swiglu_args)->Apply(setup);
BENCHMARK(BM_fp8_cast)->Apply(fp8_cast_args)->Apply(setup);
BENCHMARK(BM_bias_dropout_add)->Apply(bda_args)->Apply(setup);
BENCHMARK(BM_bda_norm)->Apply(bda_norm_args)->Apply(setup);
BENCHMARK(BM_cross_entropy)->Apply(ce_args)->Apply(setup);
BENCHMARK(BM_vector_path)->Apply(vector_path_args)->Apply(setup);
BENCHMARK(BM_adamw)->Apply(adam_args)->Apply(setup);
BENCHMARK(BM_rope)->Apply(rope_args)->Apply(setup);

}  // namespace

BENCHMARK_MAIN();
