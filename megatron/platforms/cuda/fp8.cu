// CUDA FP8 kernels (docs/fp8.md): fp8_cast_transpose and fp8_gemm (cuBLASLt), the CPU emulation's
// (platforms/cpu/fp8.cpp) counterparts.
//
// fp8_cast_transpose: one 32 x 32 tile per block: x read coalesced, q = the saturating RNE cast of
// f32(x) * scale (dtype_math.h, the same code as the CPU: bit-identical), q written coalesced and
// the tile transposed through shared memory so qt is written coalesced too (Transformer Engine's
// fused cast-transpose). Each block writes its tile's max |x| to a partial; one block then folds
// the partials in index order into amax (no atomics; max is exact, so equal to the CPU's).
// fp8_gemm: cuBLASLt with A/B CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2, CUBLAS_COMPUTE_32F, the scale
// inverses as CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER (device pointers: no host sync), FAST_ACCUM
// off (TE's split accumulator: partial sums promoted to f32), C = D (beta 1 accumulates into the
// f32 main_grad). Row-major c = a b^T is column-major c^T = b a^T: cuBLAS's A is our b with
// TRANSA = T, its B our a with TRANSB = N -- the "TN" layout, the only one Hopper's FP8 tensor
// cores take, which is why the op takes both operands K-contiguous. Compute capability 8.9 or 9.0
// only, else an error naming the device. Not yet: a plan cache (the heuristic runs per call),
// FP8 outputs with an amax epilogue (CUBLASLT_MATMUL_DESC_AMAX_D_POINTER), fast accumulation for
// the forward GEMM.
// Gradient rule: fp8_gemm with beta = 1 accumulates (weight gradients); the rest writes.
#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

constexpr int kTile = 32;
constexpr int kMaxDevices = 64;
constexpr std::size_t kFp8WorkspaceBytes = std::size_t{32} << 20;

__device__ __forceinline__ float nan_max(float m, float a) {
  return (a > m || a != a) ? a : m;
}

// Block (tile_c, tile_r) of a [rows, cols] x; blockDim (32, 8), each thread 4 rows of the tile.
__global__ void cast_transpose_kernel(uint8_t* q, uint8_t* qt, float* partial, const void* x,
                                      DType tx, const float* scale, bool e4m3, int64_t rows,
                                      int64_t cols, int64_t tiles_c) {
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
    partial[tr * tiles_c + tc] = b;
  }
}

// amax = max(amax, partials...) folded in index order by one block.
__global__ void fold_amax_kernel(float* amax, const float* partial, int64_t n) {
  __shared__ float part[kThreads];
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = nan_max(m, partial[i]);
  part[threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = *amax;
    for (int t = 0; t < static_cast<int>(blockDim.x); ++t) b = nan_max(b, part[t]);
    *amax = b;
  }
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
  Scratch partial(dev, static_cast<std::size_t>(tiles_r * tiles_c) * sizeof(float));
  const DType qd = q.defined() ? q.dtype() : qt.defined() ? qt.dtype() : DType::fp8_e4m3;
  cast_transpose_kernel<<<dim3(static_cast<unsigned>(tiles_c), static_cast<unsigned>(tiles_r)),
                          dim3(kTile, 8), 0, s>>>(
      q.defined() ? static_cast<uint8_t*>(q.raw_data()) : nullptr,
      qt.defined() ? static_cast<uint8_t*>(qt.raw_data()) : nullptr, partial.as<float>(),
      x.raw_data(), x.dtype(), scale.data<float>(), qd == DType::fp8_e4m3, rows, cols, tiles_c);
  MG_CUDA_CHECK_LAUNCH();
  fold_amax_kernel<<<1, kThreads, 0, s>>>(amax.data<float>(), partial.as<float>(),
                                          tiles_r * tiles_c);
  MG_CUDA_CHECK_LAUNCH();
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

// Owns the cuBLASLt descriptors of one call.
struct LtFp8Call {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtFp8Call() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

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
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  cublasLtHandle_t h = fp8_lt_handle(dev);
  // Column-major: D [N, M] = op(B_lt) op(A_lt) with A_lt = our b ([K, N] col-major, ld K, op T)
  // and B_lt = our a ([K, M] col-major, ld K, op N).
  LtFp8Call x;
  MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const void* sa = b_scale_inv.raw_data();  // cuBLAS's A is our b
  const void* sb = a_scale_inv.raw_data();
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  const int8_t fast_accum = 0;
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                 sizeof(fast_accum)));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.la, cuda_type(b.dtype()), d.k, d.n, d.k));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.lb, cuda_type(a.dtype()), d.k, d.m, d.k));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.lc, cuda_type(c.dtype()), d.n, d.m, d.n));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x.pref));
  const std::size_t ws = kFp8WorkspaceBytes;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MG_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(h, x.op, x.la, x.lb, x.lc, x.lc, x.pref, 1, &result, &found));
  MG_CHECK(found > 0, "fp8_gemm: cuBLASLt has no FP8 algorithm for [M, N, K] = ["
                          << d.m << ", " << d.n << ", " << d.k << "], A " << dtype_name(a.dtype())
                          << ", B " << dtype_name(b.dtype()) << ", C " << dtype_name(c.dtype()));
  Scratch workspace;
  if (result.workspaceSize > 0) workspace = Scratch(dev, result.workspaceSize);
  const float alpha = 1.0f, beta = args.beta;
  MG_CUBLAS_CHECK(cublasLtMatmul(h, x.op, &alpha, b.raw_data(), x.la, a.raw_data(), x.lb, &beta,
                                 c.raw_data(), x.lc, c.raw_data(), x.lc, &result.algo,
                                 workspace.get(), result.workspaceSize, s));
}

}  // namespace

void register_fp8_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::fp8_cast_transpose>(kPlatformName, &fp8_cast_transpose,
                                               "cuda:cast-transpose");
  r.register_op<ops::OpId::fp8_gemm>(kPlatformName, &fp8_gemm, "cuda:cublaslt-fp8");
}

}  // namespace mg::platforms::cuda
