// CUDA LayerNorm and RMSNorm over the last dim (x viewed as [N, H]), forward and backward, and
// their fusions with the residual path of a pre-norm transformer layer:
//   bias_dropout_add_norm_fwd: sum = residual + dropout(x + bias), stored in x's dtype, then
//                              y = norm(sum) from the stored (rounded) sum, in one kernel
//   norm_bwd_add:              dx = store(store(norm dx) + dresidual), in the dx kernel
//
// Gradient rule: parameter gradients accumulate (+=: dgamma, dbeta); activation gradients are
// written (=: dx).
//
// One thread block per row (the backward: one block per chunk of rows of reduce.cuh's
// column_chunking, the dgamma / dbeta partials accumulated in shared memory in the same pass;
// the unfused column sums where those accumulators do not fit). Forward saves per-row statistics in
// the compute type (f32, f64 for f64 x): LayerNorm mean and rstd = 1/sqrt(var + eps) with the
// biased (1/H) variance in two passes; RMSNorm rstd = 1/sqrt(mean(x^2) + eps). The applied weight
// is gamma, or (1 + gamma) with zero_centered_gamma. Backward, with xhat = normalised x and g = dy
// * weight:
//   LayerNorm dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm   dx = rstd * (g - xhat * mean(g * xhat))
//   dgamma += sum_n dy * xhat;  dbeta += sum_n dy   (f64 column sums in a fixed order)
// The same formulas, checks and fused-op definitions as megatron/platforms/cpu/norm.cpp: the sum
// is rounded to the storage dtype before its statistics are taken, the dropout mask is dropout.cu's
// (DropoutMask, the flat index of x), and norm_bwd_add rounds the norm's dx to the storage dtype
// before adding dresidual with a non-contracted add (__fadd_rn / __dadd_rn), as layernorm_bwd +
// axpy do. Results agree with the CPU to the dtype's tolerance (other reduction order), not bits.
// gamma/beta and their grads may have another float dtype than x (f32 grads of bf16 params).
// dx may alias dy or dresidual: the column sums run before the dx kernel, and each dx element is
// written by the thread that read it last. In the fused forward, sum may alias x or residual (each
// element is read, then written, by one thread); y must not overlap sum (validated).
// Vector paths (bf16/f16 storage, H % 8 == 0, H <= 8192, 16-byte aligned rows and weights): the row
// is held in registers as 8-element vectors (16-byte loads and stores, device_util.cuh's
// load8_half), a block of 32..512 threads spans it (thread t owns vectors t, t + T, ...), the two
// row sums of the backward share one block reduction; the backward's dgamma / dbeta partials are a
// pass of their own before the dx rows (norm_param_partial8_kernel). The same per-element
// expressions and, for dgamma / dbeta, the same f64 terms in the same row order per chunk (the same
// bits as the scalar kernels); the row sums (mean, variance, mean(g), mean(g xhat)) are reduced in
// another order than the scalar kernel's (the CPU tolerance applies, as for the scalar kernel). The
// scalar kernels serve the rest. fp8_norm_cast_transpose: the vector forward kernel writes its
// output in FP8 (Fp8Out: rounded to the storage dtype first, so the bytes and amax of the norm op
// followed by fp8_cast_transpose), the transpose by fp8_transpose; other shapes the generic pair.
// Not here: the MLP-BDA + next layer's input norm fusion.
#include <initializer_list>

#include "megatron/core/ops/generic.h"
#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/dropout_mask.cuh"
#include "megatron/platforms/cuda/fp8_convert.cuh"
#include "megatron/platforms/cuda/reduce.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using ops::NormArgs;
using ops::NormKind;

struct Param {
  const void* p;
  DType t;
  bool plus_one;  // zero_centered_gamma
  template <typename C>
  __device__ __forceinline__ C at(int64_t j) const {
    const C w = load<C>(p, t, j);
    return plus_one ? w + C(1) : w;
  }
  // at<float>(j + e) for e in [0, 8) by 16-byte loads (j a multiple of 8, p 16-byte aligned: the
  // vector paths check it). Read element by element, a thread's 8 weights were 8 scalar loads,
  // the threads of a warp 32 bytes apart: that L1 traffic bounded the vector norm kernels (the
  // forward of gpt2-124m's [16384, 768] went from 59 to 37 us a call, H200, 2026-11-26).
  __device__ __forceinline__ void at8(int64_t j, float (&w)[8]) const {
    if (t == DType::f32) {
      const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + j);
      const float4 a = q[0], b = q[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z,
      w[7] = b.w;
    } else if (t == DType::bf16 || t == DType::f16) {
      load8_half(p, j, t == DType::bf16, w);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) w[e] = load<float>(p, t, j + e);
    }
    if (plus_one) {
#pragma unroll
      for (int e = 0; e < 8; ++e) w[e] = w[e] + 1.0f;
    }
  }
};

// Row r of the forward: y [R, H], mean [R], rstd [R] <- x [R, H]; mean == nullptr: RMSNorm (no
// centring, no beta). Each thread reads only the elements j = threadIdx.x + k * blockDim.x.
template <typename C>
__device__ __forceinline__ void norm_fwd_row(void* y, void* mean, void* rstd, DType st,
                                             const void* x, DType t, const Param& gamma,
                                             const Param& beta, C eps, int64_t r, int64_t h) {
  const int64_t base = r * h;
  const C inv_h = C(1) / static_cast<C>(h);
  C mu = C(0);
  if (mean) {
    C s = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) s += load<C>(x, t, base + j);
    mu = block_sum(s) * inv_h;
  }
  C ss = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const C d = load<C>(x, t, base + j) - mu;
    ss += d * d;
  }
  ss = block_sum(ss);
  const C rs = C(1) / sqrt_c(ss * inv_h + eps);
  if (threadIdx.x == 0) {
    if (mean) store<C>(mean, st, r, mu);
    store<C>(rstd, st, r, rs);
  }
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    C v = (load<C>(x, t, base + j) - mu) * rs * gamma.at<C>(j);
    if (beta.p) v += beta.at<C>(j);
    store<C>(y, t, base + j, v);
  }
}

// y [R, H], mean [R], rstd [R] <- x [R, H]; mean == nullptr: RMSNorm.
template <typename C>
__global__ void norm_fwd_kernel(void* y, void* mean, void* rstd, DType st, const void* x, DType t,
                                Param gamma, Param beta, C eps, int64_t rows, int64_t h) {
  const int64_t r = block_row();
  if (r >= rows) return;
  norm_fwd_row<C>(y, mean, rstd, st, x, t, gamma, beta, eps, r, h);
}

// The bias-dropout-add inputs of the fused forward (bias [H] optional: null).
struct BdaArgs {
  const void* x;
  const void* bias;
  const void* residual;
  DropoutMask mask;
};

// sum [R, H] = residual + mask * (x + bias) * scale, stored in t (bias_dropout_add_kernel's
// element), then y, mean, rstd = norm(sum) from the stored values. The thread that stores a sum
// element is the one that reads it back (same j stride), so no barrier is needed in between.
template <typename C>
__global__ void bda_norm_fwd_kernel(void* y, void* sum, void* mean, void* rstd, DType st, DType t,
                                    BdaArgs in, C scale, Param gamma, Param beta, C eps,
                                    int64_t rows, int64_t h) {
  const int64_t r = block_row();
  if (r >= rows) return;
  const int64_t base = r * h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const int64_t i = base + j;
    C v = C(0);
    if (in.mask.keep(i)) {
      v = load<C>(in.x, t, i);
      if (in.bias) v += load<C>(in.bias, t, j);
      v *= scale;
    }
    store<C>(sum, t, i, load<C>(in.residual, t, i) + v);
  }
  norm_fwd_row<C>(y, mean, rstd, st, sum, t, gamma, beta, eps, r, h);
}

// v rounded to storage dtype t and widened back (store + load through a register-sized buffer);
// the identity for f32 (C float) and f64 (C double).
template <typename C>
__device__ __forceinline__ C round_to(C v, DType t) {
  if (t == DType::f32 || t == DType::f64) return v;
  uint64_t buf = 0;
  store<C>(&buf, t, 0, v);
  return load<C>(&buf, t, 0);
}

// a + b rounded once, never contracted with the multiply that produced a (norm_bwd_add's add must
// round like a separate axpy).
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}

// Row r of the backward: dx [R, H] <- dy, x [R, H], mean/rstd [R] (mean == nullptr: RMSNorm),
// gamma [H]; dres (optional, null: none): dx = store(store(norm dx) + dres), norm_bwd_add's
// definition. acc (optional): acc[j] += dy * xhat and, with acc_b, acc_b[j] += dy in f64 for the
// columns j this thread owns (the parameter gradients' terms, as NormParamTerm computes them).
template <typename C>
__device__ __forceinline__ void norm_bwd_row(void* dx, const void* dy, const void* dres,
                                             const void* x, DType t, const void* mean,
                                             const void* rstd, DType st, const Param& gamma,
                                             int64_t r, int64_t h, double* acc, double* acc_b) {
  const int64_t base = r * h;
  const C inv_h = C(1) / static_cast<C>(h);
  const C mu = mean ? load<C>(mean, st, r) : C(0);
  const C rs = load<C>(rstd, st, r);
  C sum_g = 0, sum_gx = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const C xh = (load<C>(x, t, base + j) - mu) * rs;
    const C d = load<C>(dy, t, base + j);
    const C g = d * gamma.at<C>(j);
    sum_g += g;
    sum_gx += g * xh;
    if (acc) acc[j] += static_cast<double>(d * xh);
    if (acc_b) acc_b[j] += static_cast<double>(d);
  }
  const C mg = mean ? block_sum(sum_g) * inv_h : C(0);
  const C mgx = block_sum(sum_gx) * inv_h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const C xh = (load<C>(x, t, base + j) - mu) * rs;
    const C g = load<C>(dy, t, base + j) * gamma.at<C>(j);
    const C v = rs * (g - mg - xh * mgx);
    if (dres) {
      // The norm's dx rounded to the storage dtype first (a no-op for f32/f64), then the add.
      const C rounded = round_to<C>(v, t);
      store<C>(dx, t, base + j, add_rn(rounded, load<C>(dres, t, base + j)));
    } else {
      store<C>(dx, t, base + j, v);
    }
  }
}

template <typename C>
__global__ void norm_bwd_kernel(void* dx, const void* dy, const void* dres, const void* x, DType t,
                                const void* mean, const void* rstd, DType st, Param gamma,
                                int64_t rows, int64_t h) {
  const int64_t r = block_row();
  if (r >= rows) return;
  norm_bwd_row<C>(dx, dy, dres, x, t, mean, rstd, st, gamma, r, h, nullptr, nullptr);
}

// norm_bwd_kernel with the parameter gradients' column partials fused into its row pass: block c
// takes chunk c of column_chunking(rows) (reduce.cuh), keeps the partial sums of dy * xhat (and
// of dy for dbeta) of the columns its threads own in shared memory, in row order, and writes them
// as column_sum_accumulate's partials [chunks, h] would be (the same terms in the same order:
// the same bits); column_finish then adds them into dgamma / dbeta. Saves the two extra
// passes over dy and x (norm_bwd_add ran at 255-420 GB/s on an H200: 6-12 % of a step).
template <typename C>
__global__ void norm_bwd_fused_kernel(void* dx, const void* dy, const void* dres, const void* x,
                                      DType t, const void* mean, const void* rstd, DType st,
                                      Param gamma, int64_t rows, int64_t h, int64_t rows_per_chunk,
                                      double* partial_g, double* partial_b) {
  extern __shared__ double acc[];  // [h] dgamma partials, then [h] dbeta partials
  const int64_t c = blockIdx.x;
  const auto [r0, r1] = chunk_rows(c, rows_per_chunk, rows);
  double* acc_b = partial_b ? acc + h : nullptr;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    acc[j] = 0.0;
    if (acc_b) acc_b[j] = 0.0;
  }
  for (int64_t r = r0; r < r1; ++r)
    norm_bwd_row<C>(dx, dy, dres, x, t, mean, rstd, st, gamma, r, h, acc, acc_b);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    partial_g[c * h + j] = acc[j];
    if (acc_b) partial_b[c * h + j] = acc_b[j];
  }
}

// ---- vector paths (bf16 / f16 storage, see the file comment) ----------------------------------

constexpr int kVecMaxThreads = 512;  // threads spanning one row
constexpr int kVecMaxPerThread = 2;  // 8-element vectors per thread: H <= 8 * 512 * 2

// Vectors per thread and threads per block for a row of h (h % 8 == 0) elements.
struct VecGeometry {
  int per_thread = 0, threads = 0;
};
VecGeometry vec_geometry(int64_t h) {
  const int64_t nvec = h / 8;
  const int64_t vpt = (nvec + kVecMaxThreads - 1) / kVecMaxThreads;
  const int64_t threads = ((nvec + vpt - 1) / vpt + 31) / 32 * 32;
  return {static_cast<int>(vpt), static_cast<int>(threads)};
}
bool vec_ok(DType t, int64_t h, std::initializer_list<const void*> ptrs) {
  if ((t != DType::bf16 && t != DType::f16) || h % 8 != 0 || h <= 0 ||
      h > int64_t{8} * kVecMaxThreads * kVecMaxPerThread)
    return false;
  for (const void* p : ptrs)
    if (p && !aligned_for_8_halves(p)) return false;
  return true;
}

// The k-th 8-element vector of this thread's row share (thread t owns vectors t, t + T, ...).
__device__ __forceinline__ int64_t vec_of_thread(int k) {
  return threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
}

// v[0..N) each summed over the block (blockDim.x a multiple of 32, <= 1024) in a fixed order: a
// warp's shuffle tree, then the warps' partials in warp order; every thread gets the sums. One
// pair of barriers for all N values; safe to call repeatedly.
template <int N>
__device__ __forceinline__ void block_sum_n(float (&v)[N]) {
  __shared__ float part[32][N];
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int nwarps = static_cast<int>(blockDim.x >> 5);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
  }
  __syncthreads();  // a previous call may still be reading `part`
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) part[warp][i] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float t = part[0][i];
    for (int w = 1; w < nwarps; ++w) t += part[w][i];
    v[i] = t;
  }
}

__device__ __forceinline__ float round_half(float v, bool bf16) {
  return bf16 ? dmath::bf16_to_f32(dmath::f32_to_bf16(v)) : dmath::f16_to_f32(dmath::f32_to_f16(v));
}

// The FP8 output of the fused norm-cast (fp8_norm_cast_transpose): q [R, H] = the saturating cast
// of the output rounded to the storage dtype times *scale, the block's max |rounded output| into
// *amax (atomicMax on the bit pattern, as the cast kernels); q null: y is written instead.
struct Fp8Out {
  uint8_t* q = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
  bool e4m3 = true;
};

struct NanMaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return fp8cvt::nan_max(a, b);
  }
};

// One block per row: y, mean, rstd <- x, or with `bda` (in.x non-null) sum = residual + dropout(x
// + bias) stored first and normalised from its rounded values (bda_norm_fwd_kernel's element);
// with f8.q the output goes to q in FP8 instead of y (the same rounded values fp8_cast_transpose
// would read back from y: the same bytes and amax).
template <int VPT>
__global__ void __launch_bounds__(kVecMaxThreads)
    norm_fwd_vec_kernel(void* y, void* sum, void* mean, void* rstd, DType st, bool bf16,
                        const void* x, BdaArgs in, float scale, Param gamma, Param beta, float eps,
                        int64_t rows, int64_t h, Fp8Out f8) {
  const int64_t r = block_row();
  if (r >= rows) return;
  const int64_t base = r * h, nvec = h / 8;
  const float inv_h = 1.0f / static_cast<float>(h);
  float v[VPT][8];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t vi = vec_of_thread(k);
    if (vi >= nvec) continue;
    const int64_t j0 = vi * 8;
    if (in.x) {
      float xv[8], rv[8];
      load8_half(in.x, base + j0, bf16, xv);
      load8_half(in.residual, base + j0, bf16, rv);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float d = 0.0f;
        if (in.mask.keep(base + j0 + e)) {
          d = xv[e];
          if (in.bias) d += load<float>(in.bias, bf16 ? DType::bf16 : DType::f16, j0 + e);
          d *= scale;
        }
        v[k][e] = rv[e] + d;
      }
      store8_half(sum, base + j0, bf16, v[k]);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k][e] = round_half(v[k][e], bf16);
    } else {
      load8_half(x, base + j0, bf16, v[k]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) s += v[k][e];
  }
  float mu = 0.0f;
  if (mean) {
    float sum[1] = {s};
    block_sum_n<1>(sum);
    mu = sum[0] * inv_h;
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t vi = vec_of_thread(k);
    if (vi >= nvec) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float d = v[k][e] - mu;
      ss += d * d;
    }
  }
  float sq[1] = {ss};
  block_sum_n<1>(sq);
  const float rs = 1.0f / sqrtf(sq[0] * inv_h + eps);
  if (threadIdx.x == 0) {
    if (mean) store<float>(mean, st, r, mu);
    store<float>(rstd, st, r, rs);
  }
  float m8 = 0.0f;  // f8: this thread's max |rounded output|
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t vi = vec_of_thread(k);
    if (vi >= nvec) continue;
    const int64_t j0 = vi * 8;
    float o[8], gw[8], bw[8];
    gamma.at8(j0, gw);
    if (beta.p) beta.at8(j0, bw);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float t = (v[k][e] - mu) * rs * gw[e];
      if (beta.p) t += bw[e];
      o[e] = t;
    }
    if (!f8.q) {
      store8_half(y, base + j0, bf16, o);
      continue;
    }
    const float qs = *f8.scale;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const float a0 = round_half(o[e], bf16), a1 = round_half(o[e + 1], bf16);
      m8 = fp8cvt::nan_max(fp8cvt::nan_max(m8, fabsf(a0)), fabsf(a1));
      const uint32_t b = fp8cvt::to_fp8x2_saturating(a0 * qs, a1 * qs, f8.e4m3);
      if (e < 4)
        lo |= b << (8 * e);
      else
        hi |= b << (8 * (e - 4));
    }
    *reinterpret_cast<uint2*>(f8.q + base + j0) = make_uint2(lo, hi);
  }
  if (f8.q) {  // uniform over the block: every thread reaches the reduction
    const float bm = block_reduce(m8, NanMaxOp{});
    if (threadIdx.x == 0 && bm != 0.0f)
      atomicMax(reinterpret_cast<int*>(f8.amax), __float_as_int(fabsf(bm)));
  }
}

// The vector backward is two passes (bf16 / f16 rows, vec_ok):
//  1. norm_param_partial8_kernel: the dgamma (and dbeta) partials of column_chunking's chunks, one
//     thread per 8 columns of a chunk, its rows in row order, the terms dy * xhat (and dy) widened
//     to f64: NormParamTerm's terms in column_sum_accumulate's order, so the same bits as the
//     scalar path; column_finish adds the chunks.
//  2. norm_bwd_dx_vec_kernel: dx, one block per row, the row in registers as 16-byte vectors.
// One fused pass (the dx rows and the partials in the same block, a chunk of 32 rows per block)
// ran at 550 GB/s for gpt2-124m's [16384, 768] on an H200: 512 blocks of 3 warps, 162 registers,
// 18 % occupancy, stalled on instruction fetch (Nsight Compute, 2026-11-26); the passes apart each
// keep every multiprocessor full. The partials pass runs first: dx may alias dy.
// Four rows per block (their loads issued together, their sums in one block reduction) was
// twice as slow for [16384, 768] (the forward 74 against 34 us, H200, 2026-11-26), and
// a warp per row (rows of H <= 1024, the sums by shuffles alone, no barrier) was slower on the
// H200 in every gpt2-124m norm op: norm_bwd_add 130 against 107 us a call, the fused forward 89
// against 63, layernorm_fwd 46 against 37 (op tables, 2026-11-26).
__global__ void norm_param_partial8_kernel(double* partial_g, double* partial_b, const void* dy,
                                           const void* x, bool bf16, const void* mean,
                                           const void* rstd, DType st, int64_t rows, int64_t h,
                                           int64_t rows_per_chunk) {
  const int64_t f = 8 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (f >= h) return;
  const int64_t c = blockIdx.y;
  const auto [r0, r1] = chunk_rows(c, rows_per_chunk, rows);
  double sg[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  double sb[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  // The loads of kBatch rows are issued before their adds (which stay in row order): with the
  // loads interleaved with the adds this pass waited on memory (39 us for [16384, 768], 28 % of
  // DRAM bandwidth: Nsight Compute, H200, 2026-11-26). 4 rows (95 registers) beat 8 (158): the
  // whole layernorm backward of [16384, 768] took 81 against 87 us (95 before).
  constexpr int kBatch = 4;
  for (int64_t rb = r0; rb < r1; rb += kBatch) {
    uint4 xr[kBatch], dr[kBatch];
    float mu[kBatch], rs[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t r = rb + i < r1 ? rb + i : r1 - 1;  // past the chunk: a load that is not used
      xr[i] = load8_raw(x, r * h + f);
      dr[i] = load8_raw(dy, r * h + f);
      mu[i] = mean ? load<float>(mean, st, r) : 0.0f;
      rs[i] = load<float>(rstd, st, r);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (rb + i >= r1) break;
      float xv[8], dv[8];
      unpack8_half(xr[i], bf16, xv);
      unpack8_half(dr[i], bf16, dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xhat = (xv[e] - mu[i]) * rs[i];
        sg[e] += static_cast<double>(dv[e] * xhat);
        if (partial_b) sb[e] += static_cast<double>(dv[e]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    partial_g[c * h + f + e] = sg[e];
    if (partial_b) partial_b[c * h + f + e] = sb[e];
  }
}

// dx of row block_row() (+ the residual gradient dres, when given, added to the rounded dx), the
// row's 2 sums reduced over the block once. dx may alias dy or dres: each thread reads its
// elements before it writes them.
template <int VPT>
__global__ void __launch_bounds__(kVecMaxThreads)
    norm_bwd_dx_vec_kernel(void* dx, const void* dy, const void* dres, const void* x, bool bf16,
                           const void* mean, const void* rstd, DType st, Param gamma, int64_t rows,
                           int64_t h) {
  const int64_t r = block_row();
  if (r >= rows) return;
  const int64_t base = r * h, nvec = h / 8;
  const float inv_h = 1.0f / static_cast<float>(h);
  const float mu = mean ? load<float>(mean, st, r) : 0.0f;
  const float rs = load<float>(rstd, st, r);
  float xh[VPT][8], g[VPT][8];
  uint4 dr_raw[VPT];
  float sums[2] = {0.0f, 0.0f};  // sum g, sum g * xhat
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t vi = vec_of_thread(k);
    if (vi >= nvec) continue;
    if (dres) dr_raw[k] = load8_raw(dres, base + vi * 8);
    float xv[8], dv[8], gw[8];
    load8_half(x, base + vi * 8, bf16, xv);
    load8_half(dy, base + vi * 8, bf16, dv);
    gamma.at8(vi * 8, gw);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float xhat = (xv[e] - mu) * rs;
      const float gg = dv[e] * gw[e];
      xh[k][e] = xhat;
      g[k][e] = gg;
      sums[0] += gg;
      sums[1] += gg * xhat;
    }
  }
  block_sum_n<2>(sums);
  const float mg = mean ? sums[0] * inv_h : 0.0f;
  const float mgx = sums[1] * inv_h;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t vi = vec_of_thread(k);
    if (vi >= nvec) continue;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = rs * (g[k][e] - mg - xh[k][e] * mgx);
    if (dres) {
      float dr[8];
      unpack8_half(dr_raw[k], bf16, dr);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = __fadd_rn(round_half(o[e], bf16), dr[e]);
    }
    store8_half(dx, base + vi * 8, bf16, o);
  }
}

// dgamma term dy * xhat (with_xhat) or the dbeta term dy, in C, widened.
template <typename C>
struct NormParamTerm {
  const void* dy;
  const void* x;
  DType t;
  const void* mean;  // null for RMSNorm
  const void* rstd;
  DType st;
  int64_t h;
  bool with_xhat;
  __device__ double operator()(int64_t r, int64_t j) const {
    const int64_t i = r * h + j;
    const C d = load<C>(dy, t, i);
    if (!with_xhat) return static_cast<double>(d);
    const C mu = mean ? load<C>(mean, st, r) : C(0);
    const C xh = (load<C>(x, t, i) - mu) * load<C>(rstd, st, r);
    return static_cast<double>(d * xh);
  }
};

Param param_of(const Tensor& t, bool plus_one) {
  return t.defined() ? Param{t.raw_data(), t.dtype(), plus_one} : Param{nullptr, DType::f32, false};
}

void launch_fwd_vec(void* y, void* sum, void* mean, void* rstd, DType st, DType t, const void* x,
                    const BdaArgs& in, float scale, const Param& gamma, const Param& beta,
                    float eps, int64_t rows, int64_t h, int dev, const Fp8Out& f8 = Fp8Out{}) {
  const VecGeometry g = vec_geometry(h);
  const bool bf16 = t == DType::bf16;
  cudaStream_t s = current_stream(dev);
  if (g.per_thread == 1)
    norm_fwd_vec_kernel<1><<<grid_rows(rows), g.threads, 0, s>>>(
        y, sum, mean, rstd, st, bf16, x, in, scale, gamma, beta, eps, rows, h, f8);
  else
    norm_fwd_vec_kernel<2><<<grid_rows(rows), g.threads, 0, s>>>(
        y, sum, mean, rstd, st, bf16, x, in, scale, gamma, beta, eps, rows, h, f8);
  MG_CUDA_CHECK_LAUNCH();
}

void launch_fwd(Tensor& y, Tensor* mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                const Tensor& beta, const NormArgs& args) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  if (rows == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  if (vec_ok(x.dtype(), h,
             {y.raw_data(), x.raw_data(), gamma.raw_data(),
              beta.defined() ? beta.raw_data() : nullptr})) {
    launch_fwd_vec(y.raw_data(), nullptr, mean ? mean->raw_data() : nullptr, rstd.raw_data(),
                   rstd.dtype(), x.dtype(), x.raw_data(), BdaArgs{}, 1.0f,
                   param_of(gamma, args.zero_centered_gamma), param_of(beta, false),
                   static_cast<float>(args.eps), rows, h, dev);
    return;
  }
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    norm_fwd_kernel<C><<<grid_rows(rows), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), mean ? mean->raw_data() : nullptr, rstd.raw_data(), rstd.dtype(),
        x.raw_data(), x.dtype(), param_of(gamma, args.zero_centered_gamma), param_of(beta, false),
        static_cast<C>(args.eps), rows, h);
  });
  MG_CUDA_CHECK_LAUNCH();
}

// dres: optional (null) residual gradient added to dx (norm_bwd_add).
void launch_bwd(Tensor& dx, Tensor& dgamma, Tensor* dbeta, const Tensor& dy, const Tensor* dres,
                const Tensor& x, const Tensor* mean, const Tensor& rstd, const Tensor& gamma,
                const NormArgs& args) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const void* mp = mean ? mean->raw_data() : nullptr;
    // Vector path (bf16/f16, vec_ok): the partials pass, then the dx rows (see
    // norm_param_partial8_kernel). Otherwise fused: the row pass writes the parameter gradients'
    // column partials too, when their shared-memory accumulators fit. dx may alias dy: each
    // thread reads its dy elements of a row before it writes them.
    const std::size_t smem =
        static_cast<std::size_t>(dbeta ? 2 : 1) * static_cast<std::size_t>(h) * sizeof(double);
    const void* dr = dres ? dres->raw_data() : nullptr;
    const bool vec =
        rows > 0 &&
        vec_ok(x.dtype(), h, {dx.raw_data(), dy.raw_data(), x.raw_data(), dr, gamma.raw_data()});
    const bool fused =
        rows > 0 && h > 0 &&
        smem <= static_cast<std::size_t>(device_properties(dev).sharedMemPerBlockOptin);
    if (vec || fused) {
      const auto [chunks, rows_per_chunk] = column_chunking(rows);
      const auto ph = static_cast<std::size_t>(chunks * h);
      Scratch partial(dev, (dbeta ? 2 : 1) * ph * sizeof(double));
      double* pg = partial.as<double>();
      double* pb = dbeta ? pg + ph : nullptr;
      cudaStream_t s = current_stream(dev);
      const Param gp = param_of(gamma, args.zero_centered_gamma);
      const auto grid = static_cast<unsigned int>(chunks);
      if (vec) {
        const VecGeometry g = vec_geometry(h);
        const bool bf16 = x.dtype() == DType::bf16;
        const int64_t v = h / 8;
        const int pt = column_partial8_threads(v);
        const dim3 pgrid(static_cast<unsigned int>((v + pt - 1) / pt), grid);
        norm_param_partial8_kernel<<<pgrid, pt, 0, s>>>(pg, pb, dy.raw_data(), x.raw_data(), bf16,
                                                        mp, rstd.raw_data(), rstd.dtype(), rows, h,
                                                        rows_per_chunk);
        MG_CUDA_CHECK_LAUNCH();
        auto launch = [&](auto kernel) {
          kernel<<<grid_rows(rows), g.threads, 0, s>>>(dx.raw_data(), dy.raw_data(), dr,
                                                       x.raw_data(), bf16, mp, rstd.raw_data(),
                                                       rstd.dtype(), gp, rows, h);
        };
        if (g.per_thread == 1)
          launch(norm_bwd_dx_vec_kernel<1>);
        else
          launch(norm_bwd_dx_vec_kernel<2>);
      } else {
        if (smem > 48 * 1024)
          MG_CUDA_CHECK(cudaFuncSetAttribute(norm_bwd_fused_kernel<C>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem)));
        norm_bwd_fused_kernel<C><<<grid, kThreads, smem, s>>>(
            dx.raw_data(), dy.raw_data(), dr, x.raw_data(), x.dtype(), mp, rstd.raw_data(),
            rstd.dtype(), gp, rows, h, rows_per_chunk, pg, pb);
      }
      MG_CUDA_CHECK_LAUNCH();
      column_finish(dgamma.raw_data(), dgamma.dtype(), pg, chunks, h, s,
                    dbeta ? dbeta->raw_data() : nullptr, dbeta ? dbeta->dtype() : DType::f32, pb);
      return;
    }
    // Parameter gradients first: dx may alias dy.
    column_sum_accumulate(dgamma.raw_data(), dgamma.dtype(), rows, h,
                          NormParamTerm<C>{dy.raw_data(), x.raw_data(), x.dtype(), mp,
                                           rstd.raw_data(), rstd.dtype(), h, true},
                          dev);
    if (dbeta)
      column_sum_accumulate(dbeta->raw_data(), dbeta->dtype(), rows, h,
                            NormParamTerm<C>{dy.raw_data(), x.raw_data(), x.dtype(), mp,
                                             rstd.raw_data(), rstd.dtype(), h, false},
                            dev);
    if (rows == 0) return;
    norm_bwd_kernel<C><<<grid_rows(rows), kThreads, 0, current_stream(dev)>>>(
        dx.raw_data(), dy.raw_data(), dres ? dres->raw_data() : nullptr, x.raw_data(), x.dtype(),
        mp, rstd.raw_data(), rstd.dtype(), param_of(gamma, args.zero_centered_gamma), rows, h);
    MG_CUDA_CHECK_LAUNCH();
  });
}

// y [N, H], mean [N], rstd [N] <- x [N, H], gamma [H], beta [H] (optional)
void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                   const Tensor& beta, const NormArgs& args) {
  ops::validate_layernorm_fwd(OnCudaDevice{}, y, mean, rstd, x, gamma, beta, args);
  launch_fwd(y, &mean, rstd, x, gamma, beta, args);
}

// dx [N, H] =, dgamma [H] +=, dbeta [H] += (optional) <- dy, x [N, H], mean, rstd [N], gamma [H]
void layernorm_bwd(Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor& dy, const Tensor& x,
                   const Tensor& mean, const Tensor& rstd, const Tensor& gamma,
                   const NormArgs& args) {
  ops::validate_layernorm_bwd(OnCudaDevice{}, dx, dgamma, dbeta, dy, x, mean, rstd, gamma);
  launch_bwd(dx, dgamma, dbeta.defined() ? &dbeta : nullptr, dy, nullptr, x, &mean, rstd, gamma,
             args);
}

// y [N, H], rstd [N] <- x [N, H], gamma [H]
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                 const NormArgs& args) {
  ops::validate_rmsnorm_fwd(OnCudaDevice{}, y, rstd, x, gamma, args);
  launch_fwd(y, nullptr, rstd, x, gamma, Tensor(), args);
}

// dx [N, H] =, dgamma [H] += <- dy, x [N, H], rstd [N], gamma [H]
void rmsnorm_bwd(Tensor& dx, Tensor& dgamma, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                 const Tensor& gamma, const NormArgs& args) {
  ops::validate_rmsnorm_bwd(OnCudaDevice{}, dx, dgamma, dy, x, rstd, gamma);
  launch_bwd(dx, dgamma, nullptr, dy, nullptr, x, nullptr, rstd, gamma, args);
}

// y [N, H], sum [N, H], mean [N] (layernorm), rstd [N] <- x [N, H], bias [H] (optional),
// residual [N, H], gamma [H], beta [H] (optional, layernorm)
void bias_dropout_add_norm_fwd(Tensor& y, Tensor& sum, Tensor& mean, Tensor& rstd, const Tensor& x,
                               const Tensor& bias, const Tensor& residual, const Tensor& gamma,
                               const Tensor& beta, const ops::DropoutArgs& dropout,
                               const NormArgs& args, NormKind kind) {
  const ops::NormDims nd = ops::validate_bias_dropout_add_norm_fwd(
      OnCudaDevice{}, y, sum, mean, rstd, x, bias, residual, gamma, beta, dropout, args, kind);
  if (nd.rows == 0) return;
  const bool ln = kind == NormKind::layernorm;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  if (vec_ok(x.dtype(), nd.h,
             {y.raw_data(), sum.raw_data(), x.raw_data(), residual.raw_data(), gamma.raw_data(),
              ln && beta.defined() ? beta.raw_data() : nullptr})) {
    const BdaArgs in{x.raw_data(), bias.defined() ? bias.raw_data() : nullptr, residual.raw_data(),
                     make_mask(dropout)};
    launch_fwd_vec(y.raw_data(), sum.raw_data(), ln ? mean.raw_data() : nullptr, rstd.raw_data(),
                   rstd.dtype(), x.dtype(), nullptr, in, keep_scale<float>(dropout.p),
                   param_of(gamma, args.zero_centered_gamma),
                   ln ? param_of(beta, false) : param_of(Tensor(), false),
                   static_cast<float>(args.eps), nd.rows, nd.h, dev);
    return;
  }
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const BdaArgs in{x.raw_data(), bias.defined() ? bias.raw_data() : nullptr, residual.raw_data(),
                     make_mask(dropout)};
    bda_norm_fwd_kernel<C><<<grid_rows(nd.rows), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), sum.raw_data(), ln ? mean.raw_data() : nullptr, rstd.raw_data(), rstd.dtype(),
        x.dtype(), in, keep_scale<C>(dropout.p), param_of(gamma, args.zero_centered_gamma),
        ln ? param_of(beta, false) : param_of(Tensor(), false), static_cast<C>(args.eps), nd.rows,
        nd.h);
  });
  MG_CUDA_CHECK_LAUNCH();
}

// dx [N, H] = norm_bwd(dy) + dresidual (optional), dgamma [H] +=, dbeta [H] += (optional)
void norm_bwd_add(Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor& dy,
                  const Tensor& dresidual, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                  const Tensor& gamma, const NormArgs& args, NormKind kind) {
  ops::validate_norm_bwd_add(OnCudaDevice{}, dx, dgamma, dbeta, dy, dresidual, x, mean, rstd, gamma,
                             kind);
  const bool ln = kind == NormKind::layernorm;
  launch_bwd(dx, dgamma, ln && dbeta.defined() ? &dbeta : nullptr, dy,
             dresidual.defined() ? &dresidual : nullptr, x, ln ? &mean : nullptr, rstd, gamma,
             args);
}

// fp8_norm_cast_transpose (docs/fp8.md "Fused casts"): the vector forward kernel writing its
// output in FP8 (q, rowwise; a scratch q when only qt or the amax is wanted), then fp8_transpose
// for qt: the norm's output is never written in the storage dtype. Shapes the vector kernel does
// not take (f32, H not a multiple of 8 or above 8192, misaligned rows): the generic norm op + cast.
void fp8_norm_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, Tensor& sum, Tensor& mean,
                             Tensor& rstd, const Tensor& x, const Tensor& bias,
                             const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                             const Tensor& scale, const ops::DropoutArgs& dropout,
                             const NormArgs& args, NormKind kind) {
  const ops::GemmDims d =
      ops::validate_fp8_norm_cast_transpose(OnCudaDevice{}, q, qt, amax, sum, mean, rstd, x, bias,
                                            residual, gamma, beta, scale, dropout, args, kind);
  if (d.m * d.n == 0) return;
  const bool ln = kind == NormKind::layernorm, bda = residual.defined();
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const DType qd = q.defined() ? q.dtype() : qt.defined() ? qt.dtype() : DType::fp8_e4m3;
  Tensor qq = q.defined() ? q : Tensor::empty({d.m, d.n}, qd, x.device());
  if (!vec_ok(
          x.dtype(), d.n,
          {x.raw_data(), gamma.raw_data(), ln && beta.defined() ? beta.raw_data() : nullptr,
           bda ? sum.raw_data() : nullptr, bda ? residual.raw_data() : nullptr, qq.raw_data()})) {
    ops::generic_fp8_norm_cast_transpose(q, qt, amax, sum, mean, rstd, x, bias, residual, gamma,
                                         beta, scale, dropout, args, kind);
    return;
  }
  const Fp8Out f8{static_cast<uint8_t*>(qq.raw_data()), scale.data<float>(), amax.data<float>(),
                  qd == DType::fp8_e4m3};
  const Param g = param_of(gamma, args.zero_centered_gamma);
  const Param b = ln ? param_of(beta, false) : param_of(Tensor(), false);
  if (bda) {
    const BdaArgs in{x.raw_data(), bias.defined() ? bias.raw_data() : nullptr, residual.raw_data(),
                     make_mask(dropout)};
    launch_fwd_vec(nullptr, sum.raw_data(), ln ? mean.raw_data() : nullptr, rstd.raw_data(),
                   rstd.dtype(), x.dtype(), nullptr, in, keep_scale<float>(dropout.p), g, b,
                   static_cast<float>(args.eps), d.m, d.n, dev, f8);
  } else {
    launch_fwd_vec(nullptr, nullptr, ln ? mean.raw_data() : nullptr, rstd.raw_data(), rstd.dtype(),
                   x.dtype(), x.raw_data(), BdaArgs{}, 1.0f, g, b, static_cast<float>(args.eps),
                   d.m, d.n, dev, f8);
  }
  if (qt.defined()) plugin::ops_for(x.device()).fp8_transpose(qt, qq);
}

}  // namespace

void register_norm_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::layernorm_fwd>(kPlatformName, &layernorm_fwd, "cuda:kernel");
  r.register_op<OpId::layernorm_bwd>(kPlatformName, &layernorm_bwd, "cuda:kernel");
  r.register_op<OpId::rmsnorm_fwd>(kPlatformName, &rmsnorm_fwd, "cuda:kernel");
  r.register_op<OpId::rmsnorm_bwd>(kPlatformName, &rmsnorm_bwd, "cuda:kernel");
  r.register_op<OpId::bias_dropout_add_norm_fwd>(kPlatformName, &bias_dropout_add_norm_fwd,
                                                 "cuda:kernel");
  r.register_op<OpId::norm_bwd_add>(kPlatformName, &norm_bwd_add, "cuda:kernel");
  r.register_op<OpId::fp8_norm_cast_transpose>(kPlatformName, &fp8_norm_cast_transpose,
                                               "cuda:norm-cast");
}

}  // namespace mg::platforms::cuda
