// CUDA gemm: C = alpha * op(A) @ op(B) + beta * C, row-major, rank 2 or rank 3 with a shared
// leading batch dim (one strided-batched call).
//
// Gradient rule: parameter gradients accumulate (gemm with beta = 1 for weight gradients);
// activation gradients are written (beta = 0).
// Paths:
//   f32, bf16, f16 A/B: cuBLASLt with CUBLAS_COMPUTE_32F (true f32 math, no TF32), C f32 or A's
//     dtype, split-K partial sums in f32 only (never rounded to a bf16/f16 C); if cuBLASLt
//     offers no algorithm or refuses the call, cublasGemmStridedBatchedEx with the same types and
//     compute type.
//   f64 A/B: cublasDgemmStridedBatched; an f32 C goes through an f64 temporary.
// Row-major C = A B is computed as column-major C^T = B^T A^T, so cuBLAS's "A" is our B.
// beta = 0 never reads C (cuBLAS's contract; K = 0 is handled here and writes beta * C, 0 for
// beta = 0). The 32 MiB cuBLASLt workspace comes from the caching allocator per call, so it is
// stream-safe. The cuBLASLt handle is one per device (thread-safe, the stream is per call); cuBLAS
// handles are per thread and device (their stream is handle state) and live until process exit.
// Not here: descriptor/algorithm caching, epilogues (bias, GELU), fp8 (the speed issue).
#include <array>
#include <cstdint>
#include <limits>
#include <mutex>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using ops::GemmArgs;

constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;
constexpr int kMaxDevices = 64;

using ops::GemmDims;

// The contract (ops::validate_gemm), then what cuBLAS needs: a separate output and int dims.
GemmDims check_gemm(const Tensor& c, const Tensor& a, const Tensor& b, const GemmArgs& args) {
  const GemmDims d = ops::validate_gemm(OnCudaDevice{}, c, a, b, args);
  MG_CHECK(!overlaps(c, a) && !overlaps(c, b),
           "gemm: C " << c.str() << " overlaps an input; cuBLAS needs a separate output");
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  MG_CHECK(d.m <= kMax && d.n <= kMax && d.k <= kMax && d.batch <= kMax,
           "gemm: dims [" << d.batch << ", " << d.m << ", " << d.n << ", " << d.k
                          << "] exceed cuBLAS's int range");
  return d;
}

// C = beta * C (0 when beta = 0, whatever C held): the K = 0 case.
template <typename C>
__global__ void scale_kernel(void* c, DType tc, C beta, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(c, tc, i, beta == C(0) ? C(0) : beta * load<C>(c, tc, i));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f64:
      return CUDA_R_64F;
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      MG_THROW("gemm: no cuBLAS type for dtype " << dtype_name(t));
  }
}

cublasHandle_t cublas_handle(int device) {
  MG_CHECK(device >= 0 && device < kMaxDevices, "gemm: device index " << device << " too large");
  thread_local std::array<cublasHandle_t, kMaxDevices> handles{};  // leaked at thread exit
  if (!handles[device]) MG_CUBLAS_CHECK(cublasCreate(&handles[device]));
  return handles[device];
}

cublasLtHandle_t lt_handle(int device) {
  MG_CHECK(device >= 0 && device < kMaxDevices, "gemm: device index " << device << " too large");
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};  // process lifetime
  std::call_once(once[device], [&] { MG_CUBLAS_CHECK(cublasLtCreate(&handles[device])); });
  return handles[device];
}

// Largest power of two (<= 256) dividing every batch entry's address: what cuBLASLt may assume.
uint32_t alignment_of(const void* p, int64_t batch_stride_bytes, int64_t batch) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(batch_stride_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// RAII for the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  const int32_t count = static_cast<int32_t>(batch);
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                   sizeof(count)));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof(stride)));
}

// Column-major operands of the swapped product (cuBLAS A = our B, cuBLAS B = our A).
struct ColMajor {
  cublasOperation_t op_a, op_b;
  int64_t rows_a, cols_a, rows_b, cols_b;  // stored shapes; ld = rows
  int64_t stride_a, stride_b, stride_c;    // elements between batch entries
};

ColMajor col_major(const GemmDims& d, const GemmArgs& args) {
  ColMajor g;
  g.op_a = args.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.op_b = args.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.rows_a = args.trans_b ? d.k : d.n;
  g.cols_a = args.trans_b ? d.n : d.k;
  g.rows_b = args.trans_a ? d.m : d.k;
  g.cols_b = args.trans_a ? d.k : d.m;
  g.stride_a = d.k * d.n;
  g.stride_b = d.m * d.k;
  g.stride_c = d.m * d.n;
  return g;
}

// cublasGemmStridedBatchedEx with f32 compute: the fallback of the cuBLASLt path.
void gemm_ex(void* c, DType tc, const void* a, const void* b, DType tab, const GemmDims& d,
             const GemmArgs& args, int dev, cudaStream_t s) {
  const ColMajor g = col_major(d, args);
  cublasHandle_t h = cublas_handle(dev);
  MG_CUBLAS_CHECK(cublasSetStream(h, s));
  MG_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  const float alpha = args.alpha, beta = args.beta;
  MG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, g.op_a, g.op_b, static_cast<int>(d.n), static_cast<int>(d.m), static_cast<int>(d.k),
      &alpha, b, cuda_type(tab), static_cast<int>(g.rows_a), g.stride_a, a, cuda_type(tab),
      static_cast<int>(g.rows_b), g.stride_b, &beta, c, cuda_type(tc), static_cast<int>(d.n),
      g.stride_c, static_cast<int>(d.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// f32 / bf16 / f16 inputs through cuBLASLt. Returns false when cuBLASLt cannot run the call.
bool gemm_lt(void* c, DType tc, const void* a, const void* b, DType tab, const GemmDims& d,
             const GemmArgs& args, int dev, cudaStream_t s) {
  const ColMajor g = col_major(d, args);
  const cudaDataType_t ab_type = cuda_type(tab), c_type = cuda_type(tc);
  LtDescs x;
  MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &g.op_a, sizeof(g.op_a)));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &g.op_b, sizeof(g.op_b)));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.a, ab_type, static_cast<uint64_t>(g.rows_a),
                                             static_cast<uint64_t>(g.cols_a), g.rows_a));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.b, ab_type, static_cast<uint64_t>(g.rows_b),
                                             static_cast<uint64_t>(g.cols_b), g.rows_b));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.c, c_type, static_cast<uint64_t>(d.n),
                                             static_cast<uint64_t>(d.m), d.n));
  set_batch(x.a, d.batch, g.stride_a);
  set_batch(x.b, d.batch, g.stride_b);
  set_batch(x.c, d.batch, g.stride_c);

  const int64_t ab_size = static_cast<int64_t>(dtype_size(tab));
  const int64_t c_size = static_cast<int64_t>(dtype_size(tc));
  const uint32_t align_a = alignment_of(b, g.stride_a * ab_size, d.batch);
  const uint32_t align_b = alignment_of(a, g.stride_b * ab_size, d.batch);
  const uint32_t align_c = alignment_of(c, g.stride_c * c_size, d.batch);
  const uint64_t ws_bytes = kLtWorkspaceBytes;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x.pref));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  // Split-K only with partial sums kept in f32 (the compute type) and reduced in a separate,
  // ordered step. The default mask also allows INPLACE and OUTPUT_TYPE, which add the partial
  // products up in C's dtype: with a bf16 C that rounds every partial sum to 8 bits (seen on an
  // H100: absolute errors of 0.01-0.02, a bf16 ulp of the O(3) partial sums, on results near 0 at
  // m 67, n 181, k 101).
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_mask, sizeof(reduction_mask)));

  cublasLtHandle_t h = lt_handle(dev);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(h, x.op, x.a, x.b, x.c, x.c, x.pref, 1, &result, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return false;

  Scratch workspace(dev, kLtWorkspaceBytes);
  const float alpha = args.alpha, beta = args.beta;
  const cublasStatus_t st = cublasLtMatmul(h, x.op, &alpha, b, x.a, a, x.b, &beta, c, x.c, c, x.c,
                                           &result.algo, workspace.get(), kLtWorkspaceBytes, s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  MG_CUBLAS_CHECK(st);
  return true;
}

void gemm_f64(void* c, const void* a, const void* b, const GemmDims& d, const GemmArgs& args,
              int dev, cudaStream_t s) {
  const ColMajor g = col_major(d, args);
  cublasHandle_t h = cublas_handle(dev);
  MG_CUBLAS_CHECK(cublasSetStream(h, s));
  const double alpha = args.alpha, beta = args.beta;
  MG_CUBLAS_CHECK(cublasDgemmStridedBatched(
      h, g.op_a, g.op_b, static_cast<int>(d.n), static_cast<int>(d.m), static_cast<int>(d.k),
      &alpha, static_cast<const double*>(b), static_cast<int>(g.rows_a), g.stride_a,
      static_cast<const double*>(a), static_cast<int>(g.rows_b), g.stride_b, &beta,
      static_cast<double*>(c), static_cast<int>(d.n), g.stride_c, static_cast<int>(d.batch)));
}

// C [M, N] (or [Bt, M, N]) = alpha * op(A) @ op(B) + beta * C
void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmArgs& args) {
  const GemmDims d = check_gemm(c, a, b, args);
  const int64_t c_numel = d.batch * d.m * d.n;
  if (c_numel == 0) return;
  const int dev = c.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  if (d.k == 0) {
    with_compute(a.dtype(), [&](auto tag) {
      using C = decltype(tag);
      scale_kernel<C><<<grid_for(c_numel), kThreads, 0, s>>>(c.raw_data(), c.dtype(),
                                                             static_cast<C>(args.beta), c_numel);
    });
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  if (a.dtype() == DType::f64) {
    if (c.dtype() == DType::f64) {
      gemm_f64(c.raw_data(), a.raw_data(), b.raw_data(), d, args, dev, s);
    } else {
      // f32 C from f64 inputs: an f64 temporary, loaded from C only when beta reads it.
      Scratch tmp(dev, static_cast<std::size_t>(c_numel) * sizeof(double));
      if (args.beta != 0.0f)
        launch_convert(tmp.get(), DType::f64, c.raw_data(), c.dtype(),
                       static_cast<std::size_t>(c_numel), dev);
      gemm_f64(tmp.get(), a.raw_data(), b.raw_data(), d, args, dev, s);
      launch_convert(c.raw_data(), c.dtype(), tmp.get(), DType::f64,
                     static_cast<std::size_t>(c_numel), dev);
    }
    return;
  }
  if (!gemm_lt(c.raw_data(), c.dtype(), a.raw_data(), b.raw_data(), a.dtype(), d, args, dev, s))
    gemm_ex(c.raw_data(), c.dtype(), a.raw_data(), b.raw_data(), a.dtype(), d, args, dev, s);
}

}  // namespace

void register_gemm_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::gemm>(kPlatformName, &gemm, "cuda:cublaslt");
}

}  // namespace mg::platforms::cuda
