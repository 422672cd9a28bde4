// CUDA cross entropy on logits [N, Vl]: the serial op, and the pieces of Megatron's vocab-parallel
// cross entropy (local max -> all-reduce max -> local stats with the global max -> all-reduce sum
// -> combine), with the one backward both use.
//
// Gradient rule: no parameters; dlogits is an activation gradient and is written (=).
// Invariants: one thread block per row for the row statistics; math in f32 for f32/bf16/f16
// logits (f64 for f64); the per-row statistics (loss, max, sum_exp, target_logit, dloss) are [N]
// f32 (f64 for f64 logits). Leading logits dims flatten into N; targets (i32/i64) and statistics
// may have any shape with N elements. The serial op checks 0 <= target < V as the CPU does, in the
// kernel: a bad target is a deferred error (cuda_common.h), thrown by the host's next
// synchronisation (the step's loss read), its row's loss NaN, no host round trip (until
// 2026-11-26 the targets were copied to the host each micro-batch); the shard ops take this
// shard's columns [vocab_start, vocab_start + Vl) and give target_logit 0 (and no one-hot term)
// for targets outside them. dlogits may alias logits exactly (element-wise backward).
// Vector row passes (max, sum_exp) for bf16/f16 logits with V % 8 == 0 and 16-byte aligned rows:
// 16-byte loads staged through shared memory so that each thread still sums its scalar-loop
// elements in the scalar order (the same bits as the scalar passes); the backward is vectorised
// likewise (ce_bwd_vec_kernel).
// Not here: ignore_index, label smoothing, z-loss, the all-reduces (the caller's group).
#include <cuda_pipeline.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// The vector row passes (kVec): bf16 / f16 logits, V % 8 == 0, 16-byte aligned rows, blocks of
// kThreads threads. The row is read in tiles of kTileHalves logits, each thread loading
// kTileLoads 16-byte pieces (the whole tile's loads in flight before one barrier) into shared
// memory; then thread t takes the tile's columns t, t + kThreads, ... in order: exactly the
// elements, and the order, of the scalar loop `for (j = t; j < v; j += kThreads)`. So each
// thread's partial max / sum is the scalar one and block_max / block_sum give the same bits; the
// loads are 16 bytes instead of 2 (the scalar passes ran at ~530 GB/s on an H200, 3 ms of a
// gpt2-124m step at logits [16384, 50304] bf16).
constexpr int kTileLoads = 4;
constexpr int64_t kTileHalves = int64_t{kTileLoads} * kThreads * 8;

// The tile (16 KiB): one per kernel, whichever passes use it (a __shared__ array in the pass
// template itself would be one per instantiation, 32 KiB for the forward's two passes).
__device__ __forceinline__ uint4* row_tile() {
  __shared__ uint4 tile[kTileLoads * kThreads];
  return tile;
}

// f(x_j) in C for j = threadIdx.x, threadIdx.x + kThreads, ... < v, in that order.
template <typename C, typename F>
__device__ void for_row_in_thread_order8(const void* x, bool bf16, int64_t base, int64_t v, F&& f) {
  uint4* tile = row_tile();
  const auto* row = static_cast<const uint16_t*>(x) + base;
  const auto* halves = reinterpret_cast<const uint16_t*>(tile);
  for (int64_t t0 = 0; t0 < v; t0 += kTileHalves) {
    uint4 piece[kTileLoads];
#pragma unroll
    for (int u = 0; u < kTileLoads; ++u) {
      const int64_t j = t0 + (static_cast<int64_t>(u) * kThreads + threadIdx.x) * 8;
      if (j < v) piece[u] = *reinterpret_cast<const uint4*>(row + j);
    }
    __syncthreads();  // the previous tile is consumed
#pragma unroll
    for (int u = 0; u < kTileLoads; ++u) {
      const int64_t j = t0 + (static_cast<int64_t>(u) * kThreads + threadIdx.x) * 8;
      if (j < v) tile[u * kThreads + threadIdx.x] = piece[u];
    }
    __syncthreads();
    const int64_t in_tile = v - t0 < kTileHalves ? v - t0 : kTileHalves;
    for (int64_t j = threadIdx.x; j < in_tile; j += kThreads) {
      const uint16_t h = halves[j];
      f(static_cast<C>(bf16 ? dmath::bf16_to_f32(h) : dmath::f16_to_f32(h)));
    }
  }
}

// Row max of one row of V logits (block-wide, every thread gets it).
template <typename C, bool kVec>
__device__ C row_max(const void* x, DType t, int64_t base, int64_t v) {
  C m = neg_inf<C>();
  if constexpr (kVec) {
    for_row_in_thread_order8<C>(x, t == DType::bf16, base, v, [&m](C e) { m = e > m ? e : m; });
  } else {
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      const C e = load<C>(x, t, base + j);
      m = e > m ? e : m;
    }
  }
  return block_max(m);
}

template <typename C, bool kVec>
__device__ C row_sum_exp(const void* x, DType t, int64_t base, int64_t v, C m) {
  C s = 0;
  if constexpr (kVec) {
    for_row_in_thread_order8<C>(x, t == DType::bf16, base, v, [&s, m](C e) { s += exp_c(e - m); });
  } else {
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) s += exp_c(load<C>(x, t, base + j) - m);
  }
  return block_sum(s);
}

// Thread 0's end of forward row r: max, sum_exp, and the loss log(s) + m - logit(target), or NaN
// with a deferred error (raised by the host's next synchronisation) for a target outside [0, v).
template <typename C, typename Logit>
__device__ void store_ce_row(void* loss, void* max, void* sum_exp, DType st, int64_t r, C m, C s,
                             const void* targets, DType tt, int64_t v, DeferredError* err,
                             const Logit& logit) {
  store<C>(max, st, r, m);
  store<C>(sum_exp, st, r, s);
  const int64_t target = load_index(targets, tt, r);
  if (target < 0 || target >= v) {
    record_deferred_error(err, kDeferredCrossEntropyTarget, r, target, v);
    store<C>(loss, st, r, C(NAN));
    return;
  }
  store<C>(loss, st, r, log_c(s) + m - logit(target));
}

// One block per row. Blocks looping over rows with about half the L2 cache's worth of rows in
// flight (2 per multiprocessor for [65536, 50304] bf16, so that the sum pass would re-read its row
// from L2) were slower: 4.98 against 3.55 ms a gpt2-124m mb-64 step (H200, 2026-11-26).
// loss, max, sum_exp [N] <- logits [N, V], targets [N]; a target outside [0, V) is recorded as a
// deferred error (raised by the host's next synchronisation) and its row's loss is NaN.
template <typename C, bool kVec>
__global__ void ce_fwd_kernel(void* loss, void* max, void* sum_exp, DType st, const void* x,
                              DType t, const void* targets, DType tt, int64_t n, int64_t v,
                              DeferredError* err) {
  const int64_t r = block_row();
  if (r >= n) return;
  const int64_t base = r * v;
  const C m = row_max<C, kVec>(x, t, base, v);
  const C s = row_sum_exp<C, kVec>(x, t, base, v, m);
  if (threadIdx.x == 0)
    store_ce_row<C>(loss, max, sum_exp, st, r, m, s, targets, tt, v, err,
                    [&](int64_t j) { return load<C>(x, t, base + j); });
}

// The forward with the row cached in shared memory (bf16 / f16 logits, V % 8 == 0, 16-byte aligned
// rows, 2 V bytes of dynamic shared memory a block): the row is read from DRAM once instead of
// twice. The two-pass kernel above reads each row for the max and again for the sum of exps: 3.55
// ms of a gpt2-124m mb-64 step (H200, session 21), 13.2 GB at 3.7 TB/s, and the L2 cannot hold the
// rows in between (the note above). The floors here: 6.6 GB of DRAM, ~1.7 ms, and about 15
// instructions per logit (the accurate expf), ~1.5 ms at full issue; with 2 rows (16 warps) per
// multiprocessor at gpt2's V the issue rate is the open question. The copy is cp.async (16-byte
// pieces, no registers), issued whole at the start in kCacheChunks commit groups; the max pass
// takes chunk c as soon as it has landed, while the later chunks are still in flight. Chunk
// boundaries are multiples of kThreads logits, so thread t still visits j = t, t + kThreads, ... in
// that order across the chunks: each thread's partial max and sum are the scalar loop's, and
// block_max / block_sum give the two-pass kernels' bits
// (CrossEntropyVectorRowPassesAreBitwiseTheScalarPasses). Blocks per multiprocessor: 2 at V 50304
// (100.6 KB a row), 3 at V 32000; while one block waits for its row, another computes.
constexpr int kCacheChunks = 4;

__global__ void ce_fwd_cached_kernel(void* loss, void* max, void* sum_exp, DType st, const void* x,
                                     bool bf16, const void* targets, DType tt, int64_t n, int64_t v,
                                     DeferredError* err) {
  extern __shared__ uint4 cached_row[];
  const int64_t r = block_row();
  if (r >= n) return;
  const int64_t base = r * v;
  const auto* row = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + base);
  // Chunk c: logits [c * per, min((c + 1) * per, v)), per a multiple of kThreads (and so of 8).
  const int64_t per = ((v + kCacheChunks * kThreads - 1) / (kCacheChunks * kThreads)) * kThreads;
#pragma unroll
  for (int c = 0; c < kCacheChunks; ++c) {
    const int64_t lo = c * per / 8, hi = ((c + 1) * per < v ? (c + 1) * per : v) / 8;
    for (int64_t p = lo + threadIdx.x; p < hi; p += kThreads)
      __pipeline_memcpy_async(&cached_row[p], &row[p], sizeof(uint4));
    __pipeline_commit();  // one group per chunk on every thread, empty ones included
  }
  const auto* halves = reinterpret_cast<const uint16_t*>(cached_row);
  auto logit = [&](int64_t j) {
    return bf16 ? dmath::bf16_to_f32(halves[j]) : dmath::f16_to_f32(halves[j]);
  };
  float m = neg_inf<float>();
#pragma unroll
  for (int c = 0; c < kCacheChunks; ++c) {
    __pipeline_wait_prior(kCacheChunks - 1 - c);  // this thread's copies of chunk c are done
    __syncthreads();                              // and every other thread's
    const int64_t hi = (c + 1) * per < v ? (c + 1) * per : v;
    for (int64_t j = c * per + threadIdx.x; j < hi; j += kThreads) {
      const float e = logit(j);
      m = e > m ? e : m;
    }
  }
  m = block_max(m);
  float s = 0;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) s += exp_c(logit(j) - m);
  s = block_sum(s);
  if (threadIdx.x == 0)
    store_ce_row<float>(loss, max, sum_exp, st, r, m, s, targets, tt, v, err, logit);
}

// The forward in one pass without a cached row (MG_CUDA_CE_FWD=online; bf16 / f16 logits, V % 8
// == 0, 16-byte aligned rows): each thread keeps a running max m and sum s of exp(x - m) over its
// 16-byte pieces (8 logits; s = s exp(m_old - m_new) when the max grows), and the block combines
// them: M = block_max(m), S = block_sum(s exp(m - M)). One DRAM read at full occupancy (no shared
// memory), against the row cache's 2 rows per multiprocessor at gpt2's V; S adds the terms in
// another order than the two-pass kernels (not their bits; M is the same): cuda_ops_test bounds
// the difference. For the A/B measurement against the row cache and the two-pass kernel.
__global__ void ce_fwd_online_kernel(void* loss, void* max, void* sum_exp, DType st, const void* x,
                                     bool bf16, const void* targets, DType tt, int64_t n, int64_t v,
                                     DeferredError* err) {
  const int64_t r = block_row();
  if (r >= n) return;
  const int64_t base = r * v;
  float m = neg_inf<float>(), s = 0.0f;
#pragma unroll 2
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * 8; j < v; j += int64_t{kThreads} * 8) {
    float e[8];
    load8_half(x, base + j, bf16, e);
    float vm = e[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) vm = e[k] > vm ? e[k] : vm;
    if (vm > m) {
      s *= exp_c(m - vm);  // 0 at the first piece (m = -inf, s = 0)
      m = vm;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) s += exp_c(e[k] - m);
  }
  const float mm = block_max(m);
  const float ss = block_sum(m == neg_inf<float>() ? 0.0f : s * exp_c(m - mm));
  if (threadIdx.x == 0)
    store_ce_row<float>(loss, max, sum_exp, st, r, mm, ss, targets, tt, v, err, [&](int64_t j) {
      return load<float>(x, bf16 ? DType::bf16 : DType::f16, base + j);
    });
}

template <typename C, bool kVec>
__global__ void ce_local_max_kernel(void* max, DType st, const void* x, DType t, int64_t n,
                                    int64_t v) {
  const int64_t r = block_row();
  if (r >= n) return;
  const C m = row_max<C, kVec>(x, t, r * v, v);
  if (threadIdx.x == 0) store<C>(max, st, r, m);
}

template <typename C, bool kVec>
__global__ void ce_local_stats_kernel(void* sum_exp, void* target_logit, DType st, const void* x,
                                      DType t, const void* max, const void* targets, DType tt,
                                      int64_t vocab_start, int64_t n, int64_t v) {
  const int64_t r = block_row();
  if (r >= n) return;
  const int64_t base = r * v;
  const C s = row_sum_exp<C, kVec>(x, t, base, v, load<C>(max, st, r));
  if (threadIdx.x == 0) {
    store<C>(sum_exp, st, r, s);
    const int64_t local = load_index(targets, tt, r) - vocab_start;
    store<C>(target_logit, st, r, local >= 0 && local < v ? load<C>(x, t, base + local) : C(0));
  }
}

template <typename C>
__global__ void ce_combine_kernel(void* loss, const void* max, const void* sum_exp,
                                  const void* target_logit, DType st, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(loss, st, i,
             log_c(load<C>(sum_exp, st, i)) + load<C>(max, st, i) - load<C>(target_logit, st, i));
}

// dlogits [N, V] = dloss * (softmax - onehot(target - vocab_start)); may alias logits.
template <typename C>
__global__ void ce_bwd_kernel(void* dx, const void* x, DType t, const void* dloss, const void* max,
                              const void* sum_exp, DType st, const void* targets, DType tt,
                              int64_t vocab_start, int64_t n, int64_t v) {
  const int64_t total = n * v;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t r = i / v, j = i - r * v;
    const C g = load<C>(dloss, st, r);
    const C inv = C(1) / load<C>(sum_exp, st, r);
    const C p = exp_c(load<C>(x, t, i) - load<C>(max, st, r)) * inv;
    const int64_t local = load_index(targets, tt, r) - vocab_start;
    store<C>(dx, t, i, g * (j == local ? p - C(1) : p));
  }
}

// The same for bf16 / f16 logits with V % 8 == 0: one block per row (the row's statistics read
// once), eight columns per thread with 16-byte accesses, the same per-element expression, so the
// same bits. The grid-stride kernel ran at ~500-580 GB/s on an H200 (5.7 ms of a 80 ms gpt2-124m
// step).
template <typename C>
__global__ void ce_bwd_vec_kernel(void* dx, const void* x, bool bf16, const void* dloss,
                                  const void* max, const void* sum_exp, DType st,
                                  const void* targets, DType tt, int64_t vocab_start, int64_t n,
                                  int64_t v) {
  const int64_t r = block_row();
  if (r >= n) return;
  const C g = load<C>(dloss, st, r);
  const C inv = C(1) / load<C>(sum_exp, st, r);
  const C m = load<C>(max, st, r);
  const int64_t local = load_index(targets, tt, r) - vocab_start;
  const int64_t base = r * v;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * 8; j < v;
       j += static_cast<int64_t>(blockDim.x) * 8) {
    float xs[8], out[8];
    load8_half(x, base + j, bf16, xs);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const C p = exp_c(static_cast<C>(xs[k]) - m) * inv;
      out[k] = static_cast<float>(g * (j + k == local ? p - C(1) : p));
    }
    store8_half(dx, base + j, bf16, out);
  }
}

using Rows = ops::CeRows;

// Calls f(C{}, std::bool_constant<kVec>{}) for the row kernels over logits [N, v]: the vector
// passes (float math) for bf16 / f16 logits with v % 8 == 0 and 16-byte aligned data, else the
// scalar ones in the dtype's compute type. Counts the choice (vector_path_stats).
template <typename F>
void with_row_passes(const Tensor& logits, int64_t v, F&& f) {
  const bool half = logits.dtype() == DType::bf16 || logits.dtype() == DType::f16;
  const bool vec = half && v % 8 == 0 && aligned_for_8_halves(logits.raw_data());
  count_vector_path(VectorPath::ce_rows, vec);
  if (vec) return f(float{}, std::true_type{});
  with_compute(logits.dtype(), [&](auto tag) { f(tag, std::false_type{}); });
}

// cross_entropy_fwd's kernel for a vector-path row: MG_CUDA_CE_FWD (read at each call, for A/B
// runs and tests) = row-cache (the default: ce_fwd_cached_kernel, where the row's 2 V bytes fit
// the device's per-block opt-in limit beside the reductions' static arrays, else two-pass),
// two-pass (ce_fwd_kernel's vector passes; the same bits as row-cache) or online
// (ce_fwd_online_kernel, other bits).
enum class CeFwd { row_cache, two_pass, online };
CeFwd ce_fwd_choice(int dev, int64_t v) {
  const char* env = std::getenv("MG_CUDA_CE_FWD");
  const std::string want = env ? env : "row-cache";
  MG_CHECK(want == "row-cache" || want == "two-pass" || want == "online",
           "MG_CUDA_CE_FWD=" << want << ": expected row-cache (the default), two-pass or online");
  if (want == "online") return CeFwd::online;
  const auto bytes = static_cast<std::size_t>(v) * 2;
  return want == "row-cache" && bytes + 1024 <= device_properties(dev).sharedMemPerBlockOptin
             ? CeFwd::row_cache
             : CeFwd::two_pass;
}

void cross_entropy_fwd(Tensor& loss, Tensor& max, Tensor& sum_exp, const Tensor& logits,
                       const Tensor& targets) {
  const Rows r =
      ops::validate_cross_entropy_fwd(OnCudaDevice{}, loss, max, sum_exp, logits, targets);
  if (r.n == 0) return;
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  with_row_passes(logits, r.v, [&](auto tag, auto vec) {
    using C = decltype(tag);
    if constexpr (decltype(vec)::value) {
      const CeFwd how = ce_fwd_choice(dev, r.v);
      const bool bf16 = logits.dtype() == DType::bf16;
      if (how == CeFwd::row_cache) {
        count_vector_path(VectorPath::ce_row_cache, true);
        const auto smem = static_cast<std::size_t>(r.v) * 2;
        if (smem > 48 * 1024)
          MG_CUDA_CHECK(cudaFuncSetAttribute(ce_fwd_cached_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem)));
        ce_fwd_cached_kernel<<<grid_rows(r.n), kThreads, smem, current_stream(dev)>>>(
            loss.raw_data(), max.raw_data(), sum_exp.raw_data(), loss.dtype(), logits.raw_data(),
            bf16, targets.raw_data(), targets.dtype(), r.n, r.v, deferred_error_record(dev));
        return;
      }
      if (how == CeFwd::online) {
        count_vector_path(VectorPath::ce_online, true);
        ce_fwd_online_kernel<<<grid_rows(r.n), kThreads, 0, current_stream(dev)>>>(
            loss.raw_data(), max.raw_data(), sum_exp.raw_data(), loss.dtype(), logits.raw_data(),
            bf16, targets.raw_data(), targets.dtype(), r.n, r.v, deferred_error_record(dev));
        return;
      }
    }
    ce_fwd_kernel<C, decltype(vec)::value><<<grid_rows(r.n), kThreads, 0, current_stream(dev)>>>(
        loss.raw_data(), max.raw_data(), sum_exp.raw_data(), loss.dtype(), logits.raw_data(),
        logits.dtype(), targets.raw_data(), targets.dtype(), r.n, r.v, deferred_error_record(dev));
  });
  MG_CUDA_CHECK_LAUNCH();
}

void ce_local_max(Tensor& max, const Tensor& logits) {
  const Rows r = ops::validate_ce_local_max(OnCudaDevice{}, max, logits);
  if (r.n == 0) return;
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  with_row_passes(logits, r.v, [&](auto tag, auto vec) {
    using C = decltype(tag);
    ce_local_max_kernel<C, decltype(vec)::value>
        <<<grid_rows(r.n), kThreads, 0, current_stream(dev)>>>(
            max.raw_data(), max.dtype(), logits.raw_data(), logits.dtype(), r.n, r.v);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void ce_local_stats(Tensor& sum_exp, Tensor& target_logit, const Tensor& logits, const Tensor& max,
                    const Tensor& targets, int64_t vocab_start) {
  const Rows r = ops::validate_ce_local_stats(OnCudaDevice{}, sum_exp, target_logit, logits, max,
                                              targets, vocab_start);
  if (r.n == 0) return;
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  with_row_passes(logits, r.v, [&](auto tag, auto vec) {
    using C = decltype(tag);
    ce_local_stats_kernel<C, decltype(vec)::value>
        <<<grid_rows(r.n), kThreads, 0, current_stream(dev)>>>(
            sum_exp.raw_data(), target_logit.raw_data(), sum_exp.dtype(), logits.raw_data(),
            logits.dtype(), max.raw_data(), targets.raw_data(), targets.dtype(), vocab_start, r.n,
            r.v);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void ce_combine(Tensor& loss, const Tensor& max, const Tensor& sum_exp,
                const Tensor& target_logit) {
  ops::validate_ce_combine(OnCudaDevice{}, loss, max, sum_exp, target_logit);
  const int64_t n = loss.numel();
  if (n == 0) return;
  const int dev = loss.device().index;
  DeviceGuard guard(dev);
  with_compute(loss.dtype(), [&](auto tag) {
    using C = decltype(tag);
    ce_combine_kernel<C><<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
        loss.raw_data(), max.raw_data(), sum_exp.raw_data(), target_logit.raw_data(), loss.dtype(),
        n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                       const Tensor& max, const Tensor& sum_exp, const Tensor& targets,
                       int64_t vocab_start) {
  const char* op = "cross_entropy_bwd";
  const Rows r = ops::validate_cross_entropy_bwd(OnCudaDevice{}, dlogits, dloss, logits, max,
                                                 sum_exp, targets, vocab_start);
  MG_CHECK(
      !dlogits.shares_storage_with(logits) || dlogits.offset_bytes() == logits.offset_bytes(),
      op << ": dlogits overlaps logits at a different offset; alias them exactly or not at all");
  if (r.n == 0) return;
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  const bool half = logits.dtype() == DType::bf16 || logits.dtype() == DType::f16;
  if (half && r.v % 8 == 0 && aligned_for_8_halves(logits.raw_data()) &&
      aligned_for_8_halves(dlogits.raw_data())) {
    ce_bwd_vec_kernel<float><<<grid_rows(r.n), kThreads, 0, current_stream(dev)>>>(
        dlogits.raw_data(), logits.raw_data(), logits.dtype() == DType::bf16, dloss.raw_data(),
        max.raw_data(), sum_exp.raw_data(), max.dtype(), targets.raw_data(), targets.dtype(),
        vocab_start, r.n, r.v);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  with_compute(logits.dtype(), [&](auto tag) {
    using C = decltype(tag);
    ce_bwd_kernel<C><<<grid_for(r.n * r.v), kThreads, 0, current_stream(dev)>>>(
        dlogits.raw_data(), logits.raw_data(), logits.dtype(), dloss.raw_data(), max.raw_data(),
        sum_exp.raw_data(), max.dtype(), targets.raw_data(), targets.dtype(), vocab_start, r.n,
        r.v);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_cross_entropy_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::cross_entropy_fwd>(kPlatformName, &cross_entropy_fwd, "cuda:kernel");
  r.register_op<OpId::ce_local_max>(kPlatformName, &ce_local_max, "cuda:kernel");
  r.register_op<OpId::ce_local_stats>(kPlatformName, &ce_local_stats, "cuda:kernel");
  r.register_op<OpId::ce_combine>(kPlatformName, &ce_combine, "cuda:kernel");
  r.register_op<OpId::cross_entropy_bwd>(kPlatformName, &cross_entropy_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
