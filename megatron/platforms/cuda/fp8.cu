// CUDA FP8 kernels (docs/fp8.md): fp8_cast_transpose, fp8_scale_update, fp8_gemm (cuBLASLt) and
// fp8_dequantize, the CPU emulation's (platforms/cpu/fp8.cpp, fp8_attention.cpp) counterparts. (The
// FP8 attention is cuDNN's: cudnn/cudnn_fp8_attention.cpp.)
//
// fp8_cast_transpose: one kernel, one pass over x; q = the saturating RNE cast of f32(x) * scale
// (dtype_math.h, the same code as the CPU: bit-identical, but for a NaN input's sign, which the
// GPU's f32 multiply does not keep: it returns the canonical NaN), the tile transposed through
// shared memory so qt is written coalesced too (Transformer Engine's fused cast-transpose); the
// block's max |x| goes into amax by one atomicMax on its bit pattern (amax and |x| are >= +0 or a
// positive NaN, whose bit patterns order as the values do, a NaN above every number: max is exact,
// so equal to the CPU's). Two kernels:
//   - vector (bf16 / f16 x, rows and cols multiples of 8, x 16-byte and q / qt 8-byte aligned: the
//     activations and weights of a model's linears): a 64 x 64 tile per block of 256 threads, each
//     thread loading 8 elements as one 16-byte load and storing 8 bytes of q and of qt at once.
//     The scalar kernel (one byte per thread, a 2-byte load) ran at 620 GB/s on an H200, 38 ms of
//     a 179 ms llama-1b FP8 step (benchmarks/results/2026-11-26-h200-lease.md); this one at
//     ~1.2 TB/s with dtype_math.h's integer encoder, about as much instruction time as memory
//     time, so on sm_89+ it converts with the hardware's cvt.rn.satfinite (the same bytes for
//     every non-NaN value, zeros, ties, subnormals, saturation and Inf included, on an H200:
//     cuda_fp8_test; NaN through the encoder). With it: 19.7 -> 9.9 ms (2.4 TB/s) per llama-1b
//     FP8 step (benchmarks/results/2026-11-26-h200-lease-s19.md).
//   - scalar (anything else): a 32 x 32 tile per block, one element per thread.
// The vector kernel is a template over what it casts (PlainSrc: x itself); SwigluSrc and
// DswigluSrc make the operand from SwiGLU's inputs in the same pass: fp8_swiglu_cast_transpose /
// fp8_dswiglu_cast_transpose (docs/fp8.md "Fused casts"), the activation (gradient) computed with
// swiglu_math.cuh's expressions and rounded to x's dtype as swiglu_fwd / swiglu_bwd store it, so
// q, qt and amax equal those ops followed by fp8_cast_transpose, without the bf16 round trip.
// fp8_scale_update: one thread per slot running fp8/fp8_math.h's update (the CPU kernel's code,
// IEEE divisions): the amax history roll and the scales stay on the device, no host read.
// fp8_gemm: cuBLASLt with A/B CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2, CUBLAS_COMPUTE_32F, the scale
// inverses as CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER (device pointers: no host sync), FAST_ACCUM
// as Fp8GemmArgs asks (TE: on for the forward GEMM, off -- the split accumulator, partial sums
// promoted to f32 -- for the gradient GEMMs), C = D (beta 1 accumulates into the
// f32 main_grad). Row-major c = a b^T is column-major c^T = b a^T: cuBLAS's A is our b with
// TRANSA = T, its B our a with TRANSB = N -- the "TN" layout, the only one Hopper's FP8 tensor
// cores take, which is why the op takes both operands K-contiguous. Compute capability 8.9 or 9.0
// only, else an error naming the device. Plan cache (as gemm.cu's): per device a map from the
// problem (M, N, K, the three dtypes, beta, fast_accum, the pointers' alignments) to the matmul
// descriptor, the layouts, the preference and the heuristic's algorithm, built once; a call sets
// its scale pointers on the cached descriptor and launches under the plan's mutex
// (fp8_gemm_plan_cache_stats() counts). An FP8 C (Fp8GemmArgs::out_scale, --fp8-multi-head-
// attention's dO): D in FP8 with CUBLASLT_MATMUL_DESC_D_SCALE_POINTER = out_scale and
// AMAX_D_POINTER = a scratch float, folded into out_amax by a one-thread kernel (cuBLASLt writes
// the amax, the op accumulates it); C declared BF16 and not passed (beta 0).
// fp8_transpose: the vector cast kernel's tile and byte-permute write-out without the cast (8-byte
// loads and stores), a 32 x 32 byte tile for other shapes.
// fp8_dequantize: y = f32(f(q) * scale_inv) rounded once to y's dtype (f32 / bf16 / f16), the
// CPU's (platforms/cpu/fp8_attention.cpp) bit for bit: the same dtype_math.h decode and roundings,
// one IEEE f32 multiply (scale_inv read on the device: no host sync); a NaN operand is returned
// as the host's multiply returns it (its NaN, quiet, sign kept), not as the GPU's canonical NaN.
// Vector kernel (q 8-byte and y 16-byte aligned): 8 elements per thread, one 8-byte load of q and
// one 16-byte (bf16 / f16) or two (f32) stores of y, the last n % 8 elements by the first block's
// first threads; anything else one element per thread.
// Gradient rule: fp8_gemm with beta = 1 accumulates (weight gradients); the rest writes.
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "megatron/core/fp8/fp8_math.h"
#include "megatron/core/ops/generic.h"
#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/fp8_convert.cuh"
#include "megatron/platforms/cuda/swiglu_math.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

constexpr int kTile = 32;
constexpr int kMaxDevices = 64;
constexpr std::size_t kFp8WorkspaceBytes = std::size_t{32} << 20;

using fp8cvt::nan_max;
using fp8cvt::to_fp8_saturating;
using fp8cvt::to_fp8x2_saturating;

// Block (tile_c, tile_r) of a [rows, cols] x; blockDim (32, 8), each thread 4 rows of the tile.
__global__ void cast_transpose_kernel(uint8_t* q, uint8_t* qt, float* amax, const void* x, DType tx,
                                      const float* scale, bool e4m3, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ float warp_max[8];
  const int64_t tr = blockIdx.y, tc = blockIdx.x;
  const int64_t r0 = tr * kTile, c0 = tc * kTile;
  const float s = *scale;
  float m = 0.0f;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = load<float>(x, tx, r * cols + c);
      m = nan_max(m, fabsf(v));
      if (q || qt) {
        const float sv = v * s;
        const uint8_t b = e4m3 ? dmath::f32_to_e4m3(sv, true) : dmath::f32_to_e5m2(sv, true);
        if (q) q[r * cols + c] = b;
        tile[i][threadIdx.x] = b;
      }
    }
  }
  if (qt) {
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;  // qt [cols, rows]: row c, column r
      if (r < rows && c < cols) qt[c * rows + r] = tile[threadIdx.x][i];
    }
  }
  for (int off = 16; off > 0; off >>= 1) m = nan_max(m, __shfl_down_sync(0xffffffffu, m, off));
  if (threadIdx.x == 0) warp_max[threadIdx.y] = m;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    float b = warp_max[0];
    for (int w = 1; w < static_cast<int>(blockDim.y); ++w) b = nan_max(b, warp_max[w]);
    // Non-negative floats (and positive NaNs) order as their bit patterns do.
    if (b != 0.0f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(fabsf(b)));
  }
}

constexpr int kVTile = 64;  // the vector kernel's tile: 64 x 64 elements, 256 threads

// What the vector kernel casts: Src::kParts operands [rows, cols] side by side (q [rows, kParts
// cols], part p at columns p cols; qt [kParts cols, rows], part p at rows p cols). For elements
// (r, c..c+7) of each (c a multiple of 8) Src::fetch issues its kLoads 16-byte loads and
// Src::produce turns them into the f32 values (fetch for both of a thread's rows first, so their
// loads are in flight together).
// The operand as it is (fp8_cast_transpose): x [rows, cols] bf16 / f16.
struct PlainSrc {
  static constexpr int kParts = 1, kLoads = 1;
  const uint16_t* x;
  bool bf16;
  int64_t cols;
  __device__ __forceinline__ void fetch(int64_t r, int64_t c, uint4 (&raw)[kLoads]) const {
    raw[0] = load8_raw(x, r * cols + c);
  }
  __device__ __forceinline__ void produce(const uint4 (&raw)[kLoads], float (&o)[1][8]) const {
    unpack8_half(raw[0], bf16, o[0]);
  }
};

// The value the unfused op stores in x's dtype (bf16 / f16), widened back to f32.
__device__ __forceinline__ float stored_half(float v, bool bf16) {
  return bf16 ? dmath::bf16_to_f32(dmath::f32_to_bf16(v)) : dmath::f16_to_f32(dmath::f32_to_f16(v));
}

// Gate and up of x [rows, 2f] = [gate | up], as SwigluSrc and DswigluSrc read them.
struct GateUp {
  const uint16_t* x;
  bool bf16;
  int64_t f;
  __device__ __forceinline__ void fetch(int64_t r, int64_t c, uint4& gate, uint4& up) const {
    gate = load8_raw(x, r * 2 * f + c);
    up = load8_raw(x, r * 2 * f + f + c);
  }
};

// swiglu_fwd(x) [rows, f] of x [rows, 2f] (fp8_swiglu_cast_transpose).
struct SwigluSrc {
  static constexpr int kParts = 1, kLoads = 2;
  GateUp gu;
  __device__ __forceinline__ void fetch(int64_t r, int64_t c, uint4 (&raw)[kLoads]) const {
    gu.fetch(r, c, raw[0], raw[1]);
  }
  __device__ __forceinline__ void produce(const uint4 (&raw)[kLoads], float (&o)[1][8]) const {
    float a[8], u[8];
    unpack8_half(raw[0], gu.bf16, a);
    unpack8_half(raw[1], gu.bf16, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[0][k] = stored_half(swiglu_value(a[k], u[k]), gu.bf16);
  }
};

// swiglu_bwd(dy, x) [rows, 2f] of dy [rows, f], x [rows, 2f] (fp8_dswiglu_cast_transpose): part 0
// the gate's gradient (columns [0, f)), part 1 the up half's ([f, 2f)), both from one read of dy,
// gate and up.
struct DswigluSrc {
  static constexpr int kParts = 2, kLoads = 3;
  GateUp gu;
  const uint16_t* dy;
  __device__ __forceinline__ void fetch(int64_t r, int64_t c, uint4 (&raw)[kLoads]) const {
    gu.fetch(r, c, raw[0], raw[1]);
    raw[2] = load8_raw(dy, r * gu.f + c);
  }
  __device__ __forceinline__ void produce(const uint4 (&raw)[kLoads], float (&o)[2][8]) const {
    float a[8], u[8], d[8];
    unpack8_half(raw[0], gu.bf16, a);
    unpack8_half(raw[1], gu.bf16, u);
    unpack8_half(raw[2], gu.bf16, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float dg, du;
      swiglu_grads(d[k], a[k], u[k], dg, du);
      o[0][k] = stored_half(dg, gu.bf16);
      o[1][k] = stored_half(du, gu.bf16);
    }
  }
};

// The columns j of four 4-byte rows w[0..3]: col[j] = (w0.bj, w1.bj, w2.bj, w3.bj), byte 0 first.
__device__ __forceinline__ void transpose4x4(const uint32_t* w, uint32_t* col) {
  const uint32_t t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
  const uint32_t t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
  col[0] = __byte_perm(t0, t2, 0x5410);
  col[1] = __byte_perm(t0, t2, 0x7632);
  col[2] = __byte_perm(t1, t3, 0x5410);
  col[3] = __byte_perm(t1, t3, 0x7632);
}

// Block (tile_c, tile_r) of the [rows, cols] operands; rows % 8 == 0 and cols % 8 == 0, so a
// vector of 8 is in range when its first element is. Thread t produces the 8 columns (t % 8) * 8..
// of tile rows t / 8 and t / 8 + 32 (one 16-byte load per input) and stores 8 bytes of q per part
// and the same bytes into the shared tile; the transpose then reads the tile in 8 x 4 blocks and
// writes qt with byte permutes (below). That transpose, against one shared byte load per qt byte
// before (session 27, H200, the llama-1b hd128 FP8 step's op table): fp8_cast_transpose 2.27 ->
// 2.59 TB/s, the fused dswiglu 2.05 -> 2.19, swiglu 2.29 -> 2.38.
// At least 5 blocks per SM (48 registers): with the paired conversion, the fastest of the forms
// measured on an H200 (benchmarks/results/2026-11-27-h200-lease-s25.md, call 3: no bound, 5 and 6
// blocks; the fused SwiGLU casts are instruction-bound, so occupancy and instruction count count).
template <class Src>
__global__ void __launch_bounds__(256, 5)
    cast_transpose_vec_kernel(uint8_t* q, uint8_t* qt, float* amax, Src src, const float* scale,
                              bool e4m3, int64_t rows, int64_t cols) {
  constexpr int P = Src::kParts;
  __shared__ __align__(8) uint8_t tile[P][kVTile][kVTile + 8];
  __shared__ float warp_max[8];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kVTile;
  const int t = static_cast<int>(threadIdx.x), lane8 = (t % 8) * 8;
  const int64_t qcols = P * cols, qtrows = rows;
  const float s = *scale;
  float m = 0.0f;
  uint4 raw[2][Src::kLoads];
  bool in_range[2];
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {  // every load of the thread first
    const int64_t r = r0 + t / 8 + pass * 32, c = c0 + lane8;
    in_range[pass] = r < rows && c < cols;
    if (in_range[pass]) src.fetch(r, c, raw[pass]);
  }
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int lr = t / 8 + pass * 32;
    const int64_t r = r0 + lr, c = c0 + lane8;
    if (in_range[pass]) {
      float xs[P][8];
      src.produce(raw[pass], xs);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
          const float v0 = xs[p][k], v1 = xs[p][k + 1];
          m = nan_max(m, fabsf(v0));
          m = nan_max(m, fabsf(v1));
          const uint32_t b = to_fp8x2_saturating(v0 * s, v1 * s, e4m3);
          if (k < 4)
            lo |= b << (8 * k);
          else
            hi |= b << (8 * (k - 4));
        }
        const uint2 packed = make_uint2(lo, hi);
        if (q) *reinterpret_cast<uint2*>(q + r * qcols + p * cols + c) = packed;
        if (qt) *reinterpret_cast<uint2*>(&tile[p][lr][lane8]) = packed;
      }
    }
  }
  if (qt) {
    // 8 x 4 blocks: task k of part p reads tile rows 8 br .. 8 br + 7 at bytes 4 wc .. 4 wc + 3
    // (one 4-byte load a row), turns them in registers (byte permutes) and writes qt rows
    // c .. c + 3, 8 bytes each. A warp's four br of one half write 32 contiguous bytes of each of
    // 8 qt rows; its loads meet at most two to a bank (row stride 18 words).
    __syncthreads();
    for (int k = t; k < P * 128; k += 256) {
      const int p = k >> 7, kk = k & 127;
      const int br = (kk & 3) + 4 * (kk >> 6), wc = (kk >> 2) & 15;
      const int64_t r = r0 + 8 * br, c = c0 + 4 * wc;
      if (r < rows && c < cols) {  // rows, cols % 8 == 0: the whole block is in range
        uint32_t w[8], lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 8; ++i)
          w[i] = *reinterpret_cast<const uint32_t*>(&tile[p][8 * br + i][4 * wc]);
        transpose4x4(w, lo);
        transpose4x4(w + 4, hi);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          *reinterpret_cast<uint2*>(qt + (p * cols + c + j) * qtrows + r) =
              make_uint2(lo[j], hi[j]);
      }
    }
  }
  for (int off = 16; off > 0; off >>= 1) m = nan_max(m, __shfl_down_sync(0xffffffffu, m, off));
  if (t % 32 == 0) warp_max[t / 32] = m;
  __syncthreads();
  if (t == 0) {
    float b = warp_max[0];
    for (int w = 1; w < 8; ++w) b = nan_max(b, warp_max[w]);
    if (b != 0.0f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(fabsf(b)));
  }
}

bool aligned(const void* p, std::uintptr_t to) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % to == 0;
}

// fp8_transpose, vector form (rows, cols multiples of 8, q and qt 8-byte aligned): the cast
// kernel's tile without the cast. Each thread loads 8 bytes of tile rows t / 8 and t / 8 + 32 into
// shared memory; the write-out is the same 8 x 4 byte-permute transpose.
__global__ void __launch_bounds__(256)
    transpose_vec_kernel(uint8_t* qt, const uint8_t* q, int64_t rows, int64_t cols) {
  __shared__ __align__(8) uint8_t tile[kVTile][kVTile + 8];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kVTile;
  const int t = static_cast<int>(threadIdx.x), lane8 = (t % 8) * 8;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int lr = t / 8 + pass * 32;
    const int64_t r = r0 + lr, c = c0 + lane8;
    if (r < rows && c < cols)
      *reinterpret_cast<uint2*>(&tile[lr][lane8]) =
          *reinterpret_cast<const uint2*>(q + r * cols + c);
  }
  __syncthreads();
  if (t < 128) {
    const int br = (t & 3) + 4 * (t >> 6), wc = (t >> 2) & 15;
    const int64_t r = r0 + 8 * br, c = c0 + 4 * wc;
    if (r < rows && c < cols) {
      uint32_t w[8], lo[4], hi[4];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        w[i] = *reinterpret_cast<const uint32_t*>(&tile[8 * br + i][4 * wc]);
      transpose4x4(w, lo);
      transpose4x4(w + 4, hi);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<uint2*>(qt + (c + j) * rows + r) = make_uint2(lo[j], hi[j]);
    }
  }
}

// Any shape: a 32 x 32 tile per block (32, 8), one byte per thread.
__global__ void transpose_kernel(uint8_t* qt, const uint8_t* q, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = q[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) qt[c * rows + r] = tile[threadIdx.x][i];
  }
}

void fp8_transpose(Tensor& qt, const Tensor& q) {
  const ops::GemmDims d = ops::validate_fp8_transpose(OnCudaDevice{}, qt, q);
  const int64_t rows = d.m, cols = d.n;
  if (rows * cols == 0) return;
  const int dev = q.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const auto* qp = static_cast<const uint8_t*>(q.raw_data());
  auto* tp = static_cast<uint8_t*>(qt.raw_data());
  if (rows % 8 == 0 && cols % 8 == 0 && aligned(qp, 8) && aligned(tp, 8) &&
      (rows + kVTile - 1) / kVTile <= 65535) {
    const int64_t vr = (rows + kVTile - 1) / kVTile, vc = (cols + kVTile - 1) / kVTile;
    transpose_vec_kernel<<<dim3(static_cast<unsigned>(vc), static_cast<unsigned>(vr)), 256, 0, s>>>(
        tp, qp, rows, cols);
  } else {
    const int64_t tr = (rows + kTile - 1) / kTile, tc = (cols + kTile - 1) / kTile;
    MG_CHECK(tr <= 65535,
             "fp8_transpose: " << rows << " rows exceed the grid limit of " << 65535 * kTile);
    transpose_kernel<<<dim3(static_cast<unsigned>(tc), static_cast<unsigned>(tr)), dim3(kTile, 8),
                       0, s>>>(tp, qp, rows, cols);
  }
  MG_CUDA_CHECK_LAUNCH();
}

// The vector kernel over Src's [rows, cols] operands (part p of q / qt as the kernel says).
template <class Src>
void launch_vec(Tensor& q, Tensor& qt, Tensor& amax, const Src& src, const Tensor& scale,
                int64_t rows, int64_t cols, int dev) {
  DeviceGuard guard(dev);
  const DType qd = q.defined() ? q.dtype() : qt.defined() ? qt.dtype() : DType::fp8_e4m3;
  const int64_t vr = (rows + kVTile - 1) / kVTile, vc = (cols + kVTile - 1) / kVTile;
  cast_transpose_vec_kernel<Src>
      <<<dim3(static_cast<unsigned>(vc), static_cast<unsigned>(vr)), 256, 0, current_stream(dev)>>>(
          q.defined() ? static_cast<uint8_t*>(q.raw_data()) : nullptr,
          qt.defined() ? static_cast<uint8_t*>(qt.raw_data()) : nullptr, amax.data<float>(), src,
          scale.data<float>(), qd == DType::fp8_e4m3, rows, cols);
  MG_CUDA_CHECK_LAUNCH();
}

// Whether the vector kernel takes operands of [rows, cols] per part read from x (and dy): bf16 /
// f16, rows and cols multiples of 8, the inputs 16-byte and q / qt 8-byte aligned, the grid's rows
// in range.
bool vec_kernel_takes(const Tensor& q, const Tensor& qt, const Tensor& x, const Tensor& dy,
                      int64_t rows, int64_t cols) {
  return (x.dtype() == DType::bf16 || x.dtype() == DType::f16) && rows % 8 == 0 && cols % 8 == 0 &&
         aligned(x.raw_data(), 16) && (!dy.defined() || aligned(dy.raw_data(), 16)) &&
         aligned(q.defined() ? q.raw_data() : nullptr, 8) &&
         aligned(qt.defined() ? qt.raw_data() : nullptr, 8) &&
         (rows + kVTile - 1) / kVTile <= 65535;
}

void fp8_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& x, const Tensor& scale) {
  const ops::GemmDims d = ops::validate_fp8_cast_transpose(OnCudaDevice{}, q, qt, amax, x, scale);
  const int64_t rows = d.m, cols = d.n;
  if (rows * cols == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  MG_CHECK(tiles_r <= 65535,
           "fp8_cast_transpose: " << rows << " rows exceed the grid limit of " << 65535 * kTile);
  if (vec_kernel_takes(q, qt, x, Tensor(), rows, cols)) {
    launch_vec(q, qt, amax,
               PlainSrc{static_cast<const uint16_t*>(x.raw_data()), x.dtype() == DType::bf16, cols},
               scale, rows, cols, dev);
    return;
  }
  const DType qd = q.defined() ? q.dtype() : qt.defined() ? qt.dtype() : DType::fp8_e4m3;
  cast_transpose_kernel<<<dim3(static_cast<unsigned>(tiles_c), static_cast<unsigned>(tiles_r)),
                          dim3(kTile, 8), 0, s>>>(
      q.defined() ? static_cast<uint8_t*>(q.raw_data()) : nullptr,
      qt.defined() ? static_cast<uint8_t*>(qt.raw_data()) : nullptr, amax.data<float>(),
      x.raw_data(), x.dtype(), scale.data<float>(), qd == DType::fp8_e4m3, rows, cols);
  MG_CUDA_CHECK_LAUNCH();
}

// fp8_swiglu_cast_transpose / fp8_dswiglu_cast_transpose: one pass reading x (and dy) and
// writing q / qt, the SwiGLU operand never stored (the vector kernel with SwigluSrc /
// DswigluSrc); the same bytes and amax as swiglu_fwd / swiglu_bwd followed by fp8_cast_transpose,
// whose kernels compute the same f32 expressions (swiglu_math.cuh) and round them to x's dtype
// as the operand's store would. Shapes the vector kernel does not take (f32, R or F not a
// multiple of 8, unaligned data): the generic two ops.
void fp8_swiglu_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& x,
                               const Tensor& scale) {
  const ops::GemmDims d = ops::validate_fp8_swiglu_cast_transpose(
      OnCudaDevice{}, "fp8_swiglu_cast_transpose", q, qt, amax, Tensor(), x, scale);
  if (d.m * d.n == 0) return;
  if (!vec_kernel_takes(q, qt, x, Tensor(), d.m, d.n))
    return ops::generic_fp8_swiglu_cast_transpose(q, qt, amax, x, scale);
  const GateUp gu{static_cast<const uint16_t*>(x.raw_data()), x.dtype() == DType::bf16, d.n};
  launch_vec(q, qt, amax, SwigluSrc{gu}, scale, d.m, d.n, x.device().index);
}

void fp8_dswiglu_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& dy,
                                const Tensor& x, const Tensor& scale) {
  const ops::GemmDims d = ops::validate_fp8_swiglu_cast_transpose(
      OnCudaDevice{}, "fp8_dswiglu_cast_transpose", q, qt, amax, dy, x, scale);
  if (d.m * d.n == 0) return;
  const int64_t f = d.n / 2;
  if (!vec_kernel_takes(q, qt, x, dy, d.m, f))
    return ops::generic_fp8_dswiglu_cast_transpose(q, qt, amax, dy, x, scale);
  const GateUp gu{static_cast<const uint16_t*>(x.raw_data()), x.dtype() == DType::bf16, f};
  launch_vec(q, qt, amax, DswigluSrc{gu, static_cast<const uint16_t*>(dy.raw_data())}, scale, d.m,
             f, x.device().index);
}

__global__ void scale_update_kernel(float* history, float* scale, float* scale_inv, int64_t len,
                                    int64_t slots, float fp8_max, float pow2, bool max_history,
                                    bool current) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < slots)
    fp8::math::scale_update_slot(history, scale, scale_inv, len, slots, j, fp8_max, pow2,
                                 max_history, current);
}

void fp8_scale_update(Tensor& history, Tensor& scale, Tensor& scale_inv,
                      const ops::Fp8ScaleUpdateArgs& args) {
  const ops::GemmDims d =
      ops::validate_fp8_scale_update(OnCudaDevice{}, history, scale, scale_inv, args);
  if (d.n == 0) return;
  const int dev = history.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const float pow2 = std::ldexp(1.0f, static_cast<int>(args.margin));
  const auto blocks = static_cast<unsigned>((d.n + kThreads - 1) / kThreads);
  scale_update_kernel<<<blocks, kThreads, 0, s>>>(history.data<float>(), scale.data<float>(),
                                                  scale_inv.data<float>(), d.m, d.n, args.fp8_max,
                                                  pow2, args.max_history, args.current);
  MG_CUDA_CHECK_LAUNCH();
}

// ---- fp8_dequantize -----------------------------------------------------------------------------

// f(b) * s as the host's f32 multiply gives it (fp8_attention.cpp's fp8_dequantize): for numbers
// the IEEE round-to-nearest product (the same on both); a NaN operand comes back quiet with its
// sign and payload, the value's first (x86 returns its NaN operand; the GPU's multiply would give
// the canonical NaN, whose sign f32 and f16 outputs would show).
__device__ __forceinline__ float dequantize_value(uint32_t b, bool e4m3, float s) {
  const auto byte = static_cast<uint8_t>(b);
  const float v = e4m3 ? dmath::e4m3_to_f32(byte) : dmath::e5m2_to_f32(byte);
  if (v != v) return v;  // dtype_math.h decodes NaN quiet
  if (s != s) return dmath::bits_f32(dmath::f32_bits(s) | 0x00400000u);
  return v * s;
}

// y [n] (Out: f32, bf16 or f16) = dequantize_value(q [n]) rounded to Out. kVec: 8 elements per
// grid-stride step (q 8-byte, y 16-byte aligned), the last n % 8 by block 0; else one per step.
template <DType Out, bool kVec>
__global__ void dequantize_kernel(void* y, const uint8_t* q, const float* scale_inv, bool e4m3,
                                  int64_t n) {
  const float s = *scale_inv;
  if constexpr (kVec) {
    const int64_t n8 = n / 8;
    for (int64_t i = grid_start(); i < n8; i += grid_stride()) {
      const uint2 raw = reinterpret_cast<const uint2*>(q)[i];
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        v[k] = dequantize_value(((k < 4 ? raw.x : raw.y) >> (8 * (k % 4))) & 0xffu, e4m3, s);
      if constexpr (Out == DType::f32) {
        auto* yp = reinterpret_cast<float4*>(y) + 2 * i;
        yp[0] = make_float4(v[0], v[1], v[2], v[3]);
        yp[1] = make_float4(v[4], v[5], v[6], v[7]);
      } else {
        store8_half(y, 8 * i, Out == DType::bf16, v);
      }
    }
    const int64_t tail = n8 * 8 + threadIdx.x;
    if (blockIdx.x == 0 && tail < n)
      dmath::store_narrow(y, Out, tail, dequantize_value(q[tail], e4m3, s));
  } else {
    for (int64_t i = grid_start(); i < n; i += grid_stride())
      dmath::store_narrow(y, Out, i, dequantize_value(q[i], e4m3, s));
  }
}

template <DType Out>
void launch_dequantize(void* y, const uint8_t* q, const float* scale_inv, bool e4m3, int64_t n,
                       bool vec, cudaStream_t st) {
  if (vec)
    dequantize_kernel<Out, true>
        <<<grid_for((n + 7) / 8), kThreads, 0, st>>>(y, q, scale_inv, e4m3, n);
  else
    dequantize_kernel<Out, false><<<grid_for(n), kThreads, 0, st>>>(y, q, scale_inv, e4m3, n);
  MG_CUDA_CHECK_LAUNCH();
}

void fp8_dequantize(Tensor& y, const Tensor& q, const Tensor& scale_inv) {
  const int64_t n = ops::validate_fp8_dequantize(OnCudaDevice{}, y, q, scale_inv);
  if (n == 0) return;
  const int dev = q.device().index;
  DeviceGuard guard(dev);
  cudaStream_t st = current_stream(dev);
  const auto* qp = static_cast<const uint8_t*>(q.raw_data());
  const bool e4m3 = q.dtype() == DType::fp8_e4m3;
  const bool vec = aligned(qp, 8) && aligned(y.raw_data(), 16);
  const float* s = scale_inv.data<float>();
  switch (y.dtype()) {
    case DType::f32:
      return launch_dequantize<DType::f32>(y.raw_data(), qp, s, e4m3, n, vec, st);
    case DType::bf16:
      return launch_dequantize<DType::bf16>(y.raw_data(), qp, s, e4m3, n, vec, st);
    default:  // f16 (validate_fp8_dequantize allows f32, bf16, f16)
      return launch_dequantize<DType::f16>(y.raw_data(), qp, s, e4m3, n, vec, st);
  }
}

cublasLtHandle_t fp8_lt_handle(int device) {
  MG_CHECK(device >= 0 && device < kMaxDevices, "fp8_gemm: device index " << device);
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};  // process lifetime
  std::call_once(once[device], [&] { MG_CUBLAS_CHECK(cublasLtCreate(&handles[device])); });
  return handles[device];
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::fp8_e4m3:
      return CUDA_R_8F_E4M3;
    case DType::fp8_e5m2:
      return CUDA_R_8F_E5M2;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// ---- cuBLASLt FP8 plans ------------------------------------------------------------------------

constexpr std::size_t kMaxFp8Plans = 1024;  // per device; emptied when full

struct Fp8PlanKey {
  int64_t m, n, k;
  int32_t ta, tb, tc;
  bool accumulate;
  bool fast_accum;
  bool amax;  // an FP8 D with an amax output
  uint32_t align_a, align_b, align_c;
  bool operator==(const Fp8PlanKey&) const = default;
};

struct Fp8PlanKeyHash {
  std::size_t operator()(const Fp8PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    for (int64_t v : {k.m, k.n, k.k, int64_t{k.ta}, int64_t{k.tb}, int64_t{k.tc},
                      int64_t{k.accumulate}, int64_t{k.fast_accum}, int64_t{k.amax},
                      int64_t{k.align_a}, int64_t{k.align_b}, int64_t{k.align_c}})
      mix(static_cast<uint64_t>(v));
    return static_cast<std::size_t>(h);
  }
};

// The descriptors of one FP8 problem and the heuristic's algorithm (RAII).
struct Fp8Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
  bool found = false;
  std::mutex mu;  // held while a call sets its scale pointers on `op` and launches
  Fp8Plan() = default;
  Fp8Plan(const Fp8Plan&) = delete;
  Fp8Plan& operator=(const Fp8Plan&) = delete;
  ~Fp8Plan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct Fp8PlanCache {
  std::mutex mu;
  std::unordered_map<Fp8PlanKey, std::shared_ptr<Fp8Plan>, Fp8PlanKeyHash> plans;
};

Fp8PlanCache& fp8_plan_cache(int device) {
  static std::array<Fp8PlanCache, kMaxDevices> caches;  // process lifetime
  return caches[static_cast<std::size_t>(device)];
}

std::atomic<uint64_t> g_fp8_plan_hits{0}, g_fp8_plan_misses{0};

// The largest power of two <= 256 dividing the address (cuBLASLt's alignment preference).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

void set_scale_pointers(cublasLtMatmulDesc_t op, const void* sa, const void* sb) {
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
}

// An FP8 D's scale (cuBLASLt multiplies the f32 result by it before the conversion) and the
// location its amax (of the result before that scale) is written to; null: no amax.
void set_out_pointers(cublasLtMatmulDesc_t op, const void* d_scale, void* d_amax) {
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &d_scale,
                                                 sizeof(d_scale)));
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &d_amax,
                                                 sizeof(d_amax)));
}

// out_amax = max(out_amax, *gemm_amax) (NaN kept): cuBLASLt writes the GEMM's amax, the op's
// contract accumulates it as the casts do.
__global__ void fold_amax_kernel(float* out_amax, const float* gemm_amax) {
  *out_amax = nan_max(*out_amax, *gemm_amax);
}

// Column-major: D [N, M] = op(A_lt) op(B_lt) with A_lt = our b ([K, N] col-major, ld K, op T) and
// B_lt = our a ([K, M] col-major, ld K, op N). sa / sb: cuBLAS's A / B scale pointers.
std::shared_ptr<Fp8Plan> make_fp8_plan(const Fp8PlanKey& key, DType ta, DType tb, DType tc,
                                       const void* sa, const void* sb, const void* d_scale,
                                       void* d_amax, cublasLtHandle_t h) {
  auto p = std::make_shared<Fp8Plan>();
  MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  set_scale_pointers(p->op, sa, sb);
  const int8_t fast_accum = key.fast_accum ? 1 : 0;
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                 &fast_accum, sizeof(fast_accum)));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, cuda_type(tb), key.k, key.n, key.k));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, cuda_type(ta), key.k, key.m, key.k));
  // An FP8 D takes a 16-bit C (cuBLASLt's FP8 table; beta is 0, C is not read): BF16, as
  // Transformer Engine declares it.
  const bool fp8_out = tc == DType::fp8_e4m3 || tc == DType::fp8_e5m2;
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, fp8_out ? CUDA_R_16BF : cuda_type(tc), key.n,
                                             key.m, key.n));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, cuda_type(tc), key.n, key.m, key.n));
  if (fp8_out) set_out_pointers(p->op, d_scale, d_amax);
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p->pref));
  const std::size_t ws = kFp8WorkspaceBytes;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_b, sizeof(key.align_b)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_a, sizeof(key.align_a)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof(key.align_c)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof(key.align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, p->op, p->la, p->lb, p->lc, p->ld,
                                                           p->pref, 1, &result, &found);
  if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
      result.workspaceSize <= kFp8WorkspaceBytes) {
    p->algo = result.algo;
    p->workspace = result.workspaceSize;
    p->found = true;
  }
  return p;
}

void fp8_gemm(Tensor& c, const Tensor& a, const Tensor& b, const Tensor& a_scale_inv,
              const Tensor& b_scale_inv, const ops::Fp8GemmArgs& args) {
  const ops::GemmDims d =
      ops::validate_fp8_gemm(OnCudaDevice{}, c, a, b, a_scale_inv, b_scale_inv, args);
  MG_CHECK(!overlaps(c, a) && !overlaps(c, b), "fp8_gemm: C " << c.str() << " overlaps an input");
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  MG_CHECK(d.m <= kMax && d.n <= kMax && d.k <= kMax,
           "fp8_gemm: dims [" << d.m << ", " << d.n << ", " << d.k << "] exceed cuBLAS's range");
  const int dev = c.device().index;
  const cudaDeviceProp& p = device_properties(dev);
  const int cc = p.major * 10 + p.minor;
  MG_CHECK(cc == 89 || cc == 90,
           "fp8_gemm: FP8 GEMMs need an sm_89 (Ada) or sm_90 (Hopper) GPU; device "
               << dev << " (" << p.name << ") has compute capability " << p.major << "." << p.minor
               << " (run without --fp8-format, or on the CPU platform's emulation)");
  if (d.m * d.n == 0) return;
  MG_CHECK(dev >= 0 && dev < kMaxDevices, "fp8_gemm: device index " << dev);
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  cublasLtHandle_t h = fp8_lt_handle(dev);
  const void* sa = b_scale_inv.raw_data();  // cuBLAS's A is our b
  const void* sb = a_scale_inv.raw_data();
  const bool fp8_out = c.dtype() == DType::fp8_e4m3 || c.dtype() == DType::fp8_e5m2;
  const void* d_scale = fp8_out ? args.out_scale.raw_data() : nullptr;
  Scratch gemm_amax;  // cuBLASLt's amax of D, folded into out_amax after the call
  if (fp8_out && args.out_amax.defined()) gemm_amax = Scratch(dev, sizeof(float));
  void* d_amax = gemm_amax.get();
  const Fp8PlanKey key{.m = d.m,
                       .n = d.n,
                       .k = d.k,
                       .ta = static_cast<int32_t>(a.dtype()),
                       .tb = static_cast<int32_t>(b.dtype()),
                       .tc = static_cast<int32_t>(c.dtype()),
                       .accumulate = args.beta != 0.0f,
                       .fast_accum = args.fast_accum,
                       .amax = d_amax != nullptr,
                       .align_a = alignment(a.raw_data()),
                       .align_b = alignment(b.raw_data()),
                       .align_c = alignment(c.raw_data())};
  Fp8PlanCache& cache = fp8_plan_cache(dev);
  std::shared_ptr<Fp8Plan> plan;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) plan = it->second;
  }
  if (plan) {
    g_fp8_plan_hits.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_fp8_plan_misses.fetch_add(1, std::memory_order_relaxed);
    plan = make_fp8_plan(key, a.dtype(), b.dtype(), c.dtype(), sa, sb, d_scale, d_amax,
                         h);  // the slow part
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.plans.size() >= kMaxFp8Plans) cache.plans.clear();
    plan = cache.plans.emplace(key, plan).first->second;  // another thread's if it won the race
  }
  MG_CHECK(plan->found, "fp8_gemm: cuBLASLt has no FP8 algorithm for [M, N, K] = ["
                            << d.m << ", " << d.n << ", " << d.k << "], A " << dtype_name(a.dtype())
                            << ", B " << dtype_name(b.dtype()) << ", C " << dtype_name(c.dtype()));
  Scratch workspace;
  if (plan->workspace > 0) workspace = Scratch(dev, plan->workspace);
  const float alpha = 1.0f, beta = args.beta;
  std::lock_guard<std::mutex> lock(plan->mu);
  set_scale_pointers(plan->op, sa, sb);
  if (fp8_out) set_out_pointers(plan->op, d_scale, d_amax);
  detail::count_library_call();
  // An FP8 D: no C (beta 0; Transformer Engine passes none either).
  MG_CUBLAS_CHECK(cublasLtMatmul(h, plan->op, &alpha, b.raw_data(), plan->la, a.raw_data(),
                                 plan->lb, &beta, fp8_out ? nullptr : c.raw_data(), plan->lc,
                                 c.raw_data(), plan->ld, &plan->algo, workspace.get(),
                                 plan->workspace, s));
  if (d_amax) {
    fold_amax_kernel<<<1, 1, 0, s>>>(args.out_amax.data<float>(),
                                     static_cast<const float*>(d_amax));
    MG_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void register_fp8_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::fp8_cast_transpose>(kPlatformName, &fp8_cast_transpose,
                                               "cuda:cast-transpose");
  r.register_op<ops::OpId::fp8_scale_update>(kPlatformName, &fp8_scale_update, "cuda:scale-update");
  r.register_op<ops::OpId::fp8_swiglu_cast_transpose>(kPlatformName, &fp8_swiglu_cast_transpose,
                                                      "cuda:swiglu-cast-transpose");
  r.register_op<ops::OpId::fp8_dswiglu_cast_transpose>(kPlatformName, &fp8_dswiglu_cast_transpose,
                                                       "cuda:dswiglu-cast-transpose");
  r.register_op<ops::OpId::fp8_gemm>(kPlatformName, &fp8_gemm, "cuda:cublaslt-fp8");
  r.register_op<ops::OpId::fp8_dequantize>(kPlatformName, &fp8_dequantize, "cuda:dequantize");
  r.register_op<ops::OpId::fp8_transpose>(kPlatformName, &fp8_transpose, "cuda:transpose");
}

Fp8GemmPlanCacheStats fp8_gemm_plan_cache_stats() {
  Fp8GemmPlanCacheStats st;
  st.hits = g_fp8_plan_hits.load();
  st.misses = g_fp8_plan_misses.load();
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Fp8PlanCache& cache = fp8_plan_cache(dev);
    std::lock_guard<std::mutex> lock(cache.mu);
    st.plans += cache.plans.size();
  }
  return st;
}

}  // namespace mg::platforms::cuda

extern "C" mg::platforms::cuda::Fp8GemmPlanCacheStats mg_cuda_fp8_gemm_plan_cache_stats() {
  return mg::platforms::cuda::fp8_gemm_plan_cache_stats();
}
