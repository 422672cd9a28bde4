// CUDA gemm and gemm_epilogue: C = alpha * op(A) @ op(B) + beta * C, row-major, rank 2 or rank 3
// with a shared leading batch dim (one strided-batched call); gemm_epilogue (rank 2) adds a fused
// epilogue (op_args.h GemmEpilogueArgs: bias, bias_gelu, dgelu_bgrad, bgrad).
//
// Gradient rule: parameter gradients accumulate (gemm with beta = 1 for weight gradients, dbias
// +=); activation gradients are written (beta = 0, c and aux of gemm_epilogue).
// Paths:
//   f32, bf16, f16 A/B: cuBLASLt with CUBLAS_COMPUTE_32F (true f32 math, no TF32), C f32 or A's
//     dtype, split-K partial sums in f32 only (never rounded to a bf16/f16 C); if cuBLASLt
//     offers no algorithm or refuses the call, cublasGemmStridedBatchedEx with the same types and
//     compute type.
//   f64 A/B: cublasDgemmStridedBatched; an f32 C goes through an f64 temporary.
// Row-major C = A B is computed as column-major C^T = B^T A^T, so cuBLAS's "A" is our B, its
// D [N rows, M cols]: "bias over our columns N" is cuBLAS's bias over D's rows (EPILOGUE_BIAS,
// GELU_AUX_BIAS: vectors of length N; DGELU_BGRAD is not used, see epilogue_fused), the aux matrix
// has ld N, and our bgrad (dbias [M] = sums over K of op(A), A being cuBLAS's B) is BGRADB (length
// = D's columns = M). Plan cache: per device, a mutex-guarded map from the full problem (dtypes of
// A/B/C/bias/aux, m/n/k/batch, transposes, leading dims, batch strides, epilogue, the alignment
// class of every pointer) to the matmul descriptor, the layouts, the preference and the algorithm
// the heuristic chose (queried once; "none" is cached too, and goes to the fallback at once). A
// call sets the per-call pointers (bias, aux) on the cached descriptor and launches under the
// plan's mutex, so threads sharing a plan do not race. The cache holds at most kMaxPlans plans per
// device and is emptied when full (a training run has a few dozen shapes; in-flight plans stay
// alive by shared_ptr). gemm_plan_cache_stats() (cuda_kernels.h) counts hits, misses, fused
// epilogues and unfused fallbacks. Workspace: the algorithm's own workspaceSize (at most 32 MiB)
// from the caching allocator per call: stream-ordered frees make it stream-safe with no per-stream
// buffer. Epilogues: fused in cuBLASLt when the heuristic offers an algorithm (GELU epilogues need
// N % 8 == 0 and a bf16/f16 C, bias epilogues a bias of C's dtype); bias gradients are written by
// cuBLASLt into an f32 scratch [N] or [M] (C's dtype if the f32 bias-gradient type has no
// algorithm) and then added to dbias. Otherwise (f64, K = 0, no algorithm) the unfused sequence
// mirrors the CPU definition exactly: the product in the compute type into a scratch, one
// element-wise epilogue kernel from the unrounded values, deterministic column sums for the bias
// gradients. beta = 0 never reads C (cuBLAS's contract; K = 0 is handled here and writes beta * C,
// 0 for beta = 0). The cuBLASLt handle is one per device (thread-safe, the stream is per call);
// cuBLAS handles are per thread and device (their stream is handle state) and live until process
// exit. Not here: fp8, batched epilogues (rank-3 gemm_epilogue), other activations' epilogues
// (ReLU).
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/reduce.cuh"
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
  detail::count_library_call();
  MG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, g.op_a, g.op_b, static_cast<int>(d.n), static_cast<int>(d.m), static_cast<int>(d.k),
      &alpha, b, cuda_type(tab), static_cast<int>(g.rows_a), g.stride_a, a, cuda_type(tab),
      static_cast<int>(g.rows_b), g.stride_b, &beta, c, cuda_type(tc), static_cast<int>(d.n),
      g.stride_c, static_cast<int>(d.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---- cuBLASLt plans -----------------------------------------------------------------------------

constexpr std::size_t kMaxPlans = 4096;  // per device; emptied when full

// One cuBLASLt call: the operands in cuBLAS's column-major view (ColMajor) plus the epilogue.
struct LtCall {
  const void* a = nullptr;  // our A (cuBLAS's B)
  const void* b = nullptr;  // our B (cuBLAS's A)
  void* c = nullptr;
  DType tab = DType::f32, tc = DType::f32;
  GemmDims d;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // bias (input) or bias gradient (output) vector, when the epilogue has one
  cudaDataType_t bias_type = CUDA_R_32F;
  void* aux = nullptr;  // GELU pre-activation [M, N] in C's dtype, ld N
};

// Everything the heuristic's answer depends on.
struct PlanKey {
  int32_t tab, tc, bias_type, epilogue;
  int64_t m, n, k, batch;
  int64_t rows_a, rows_b, stride_a, stride_b, stride_c;  // leading dims and batch strides
  int32_t op_a, op_b;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    for (int64_t v : {int64_t{k.tab},
                      int64_t{k.tc},
                      int64_t{k.bias_type},
                      int64_t{k.epilogue},
                      k.m,
                      k.n,
                      k.k,
                      k.batch,
                      k.rows_a,
                      k.rows_b,
                      k.stride_a,
                      k.stride_b,
                      k.stride_c,
                      int64_t{k.op_a},
                      int64_t{k.op_b},
                      int64_t{k.align_a},
                      int64_t{k.align_b},
                      int64_t{k.align_c},
                      int64_t{k.align_bias},
                      int64_t{k.align_aux}})
      mix(static_cast<uint64_t>(v));
    return static_cast<std::size_t>(h);
  }
};

// The descriptors of one problem and the algorithm the heuristic chose for it (RAII).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
  // false: cuBLASLt offers nothing (or refused at run time): use the fallback
  std::atomic<bool> found{false};
  std::mutex mu;  // held while a call sets its pointers on `op` and launches
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct PlanCache {
  std::mutex mu;
  std::unordered_map<PlanKey, std::shared_ptr<Plan>, PlanKeyHash> plans;
};

PlanCache& plan_cache(int device) {
  static std::array<PlanCache, kMaxDevices> caches;  // process lifetime
  return caches[static_cast<std::size_t>(device)];
}

struct Counters {
  std::atomic<uint64_t> hits{0}, misses{0}, fused{0}, unfused{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  const int32_t count = static_cast<int32_t>(batch);
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                   sizeof(count)));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof(stride)));
}

bool has_bias_pointer(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool has_aux_pointer(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

// The per-call pointers of the epilogue on the (cached) descriptor.
void set_pointers(cublasLtMatmulDesc_t op, const LtCall& x) {
  if (has_bias_pointer(x.epilogue))
    MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &x.bias,
                                                   sizeof(x.bias)));
  if (has_aux_pointer(x.epilogue))
    MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                   &x.aux, sizeof(x.aux)));
}

PlanKey plan_key(const LtCall& x, const ColMajor& g) {
  const int64_t ab_size = static_cast<int64_t>(dtype_size(x.tab));
  const int64_t c_size = static_cast<int64_t>(dtype_size(x.tc));
  PlanKey k{};
  k.tab = static_cast<int32_t>(x.tab);
  k.tc = static_cast<int32_t>(x.tc);
  k.bias_type = has_bias_pointer(x.epilogue) ? static_cast<int32_t>(x.bias_type) : -1;
  k.epilogue = static_cast<int32_t>(x.epilogue);
  k.m = x.d.m;
  k.n = x.d.n;
  k.k = x.d.k;
  k.batch = x.d.batch;
  k.rows_a = g.rows_a;
  k.rows_b = g.rows_b;
  k.stride_a = g.stride_a;
  k.stride_b = g.stride_b;
  k.stride_c = g.stride_c;
  k.op_a = static_cast<int32_t>(g.op_a);
  k.op_b = static_cast<int32_t>(g.op_b);
  k.align_a = alignment_of(x.b, g.stride_a * ab_size, x.d.batch);  // cuBLAS's A is our B
  k.align_b = alignment_of(x.a, g.stride_b * ab_size, x.d.batch);
  k.align_c = alignment_of(x.c, g.stride_c * c_size, x.d.batch);
  k.align_bias = has_bias_pointer(x.epilogue) ? alignment_of(x.bias, 0, 1) : 0;
  k.align_aux = has_aux_pointer(x.epilogue) ? alignment_of(x.aux, 0, 1) : 0;
  return k;
}

// Builds the descriptors and asks the heuristic once; a plan with found = false when it has no
// algorithm.
std::shared_ptr<Plan> make_plan(const LtCall& x, const ColMajor& g, const PlanKey& key,
                                cublasLtHandle_t h) {
  auto p = std::make_shared<Plan>();
  const cudaDataType_t ab_type = cuda_type(x.tab), c_type = cuda_type(x.tc);
  MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &g.op_a, sizeof(g.op_a)));
  MG_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &g.op_b, sizeof(g.op_b)));
  if (x.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &x.epilogue, sizeof(x.epilogue)));
    if (has_bias_pointer(x.epilogue)) {
      const int32_t bt = static_cast<int32_t>(x.bias_type);
      MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &bt, sizeof(bt)));
    }
    if (has_aux_pointer(x.epilogue)) {
      const int64_t ld = x.d.n;  // aux [M, N] row-major = cuBLAS's [N, M] column-major, ld N
      MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                     &ld, sizeof(ld)));
    }
    set_pointers(p->op, x);  // the heuristic reads their alignment
  }
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab_type, static_cast<uint64_t>(g.rows_a),
                                             static_cast<uint64_t>(g.cols_a), g.rows_a));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab_type, static_cast<uint64_t>(g.rows_b),
                                             static_cast<uint64_t>(g.cols_b), g.rows_b));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, c_type, static_cast<uint64_t>(x.d.n),
                                             static_cast<uint64_t>(x.d.m), x.d.n));
  set_batch(p->a, x.d.batch, g.stride_a);
  set_batch(p->b, x.d.batch, g.stride_b);
  set_batch(p->c, x.d.batch, g.stride_c);

  const uint64_t ws_bytes = kLtWorkspaceBytes;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p->pref));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof(key.align_a)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof(key.align_b)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof(key.align_c)));
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof(key.align_c)));
  // Split-K only with partial sums kept in f32 (the compute type) and reduced in a separate,
  // ordered step. The default mask also allows INPLACE and OUTPUT_TYPE, which add the partial
  // products up in C's dtype: with a bf16 C that rounds every partial sum to 8 bits (seen on an
  // H100: absolute errors of 0.01-0.02, a bf16 ulp of the O(3) partial sums, on results near 0 at
  // m 67, n 181, k 101).
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p->pref,
                                                       CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                       &reduction_mask, sizeof(reduction_mask)));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(h, p->op, p->a, p->b, p->c, p->c, p->pref, 1, &result, &found);
  if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
      result.workspaceSize <= kLtWorkspaceBytes) {
    p->algo = result.algo;
    p->workspace = result.workspaceSize;
    p->found.store(true);
  }
  return p;
}

// The cached plan of x (built on a miss).
std::shared_ptr<Plan> get_plan(const LtCall& x, const ColMajor& g, int dev, cublasLtHandle_t h) {
  const PlanKey key = plan_key(x, g);
  PlanCache& cache = plan_cache(dev);
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) {
      counters().hits.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  counters().misses.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<Plan> p = make_plan(x, g, key, h);  // outside the lock: the heuristic is slow
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.plans.size() >= kMaxPlans) cache.plans.clear();
  auto [it, inserted] = cache.plans.emplace(key, p);
  return it->second;  // another thread's plan if it won the race
}

// x through cuBLASLt with its cached plan. Returns false when cuBLASLt cannot run the call.
bool run_lt(const LtCall& x, int dev, cudaStream_t s) {
  const ColMajor g = col_major(x.d, GemmArgs{.trans_a = x.trans_a, .trans_b = x.trans_b});
  cublasLtHandle_t h = lt_handle(dev);
  std::shared_ptr<Plan> p = get_plan(x, g, dev, h);
  if (!p->found.load()) return false;
  Scratch workspace;
  if (p->workspace > 0) workspace = Scratch(dev, p->workspace);
  std::lock_guard<std::mutex> lock(p->mu);
  if (!p->found.load()) return false;  // refused at run time by another thread
  if (x.epilogue != CUBLASLT_EPILOGUE_DEFAULT) set_pointers(p->op, x);
  detail::count_library_call();
  const cublasStatus_t st =
      cublasLtMatmul(h, p->op, &x.alpha, x.b, p->a, x.a, p->b, &x.beta, x.c, p->c, x.c, p->c,
                     &p->algo, workspace.get(), p->workspace, s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    p->found.store(false);  // do not ask again for this problem
    return false;
  }
  MG_CUBLAS_CHECK(st);
  return true;
}

// Plain product (no epilogue) through cuBLASLt: false when it cannot run the call.
bool gemm_lt(void* c, DType tc, const void* a, const void* b, DType tab, const GemmDims& d,
             const GemmArgs& args, int dev, cudaStream_t s) {
  LtCall x;
  x.a = a;
  x.b = b;
  x.c = c;
  x.tab = tab;
  x.tc = tc;
  x.d = d;
  x.trans_a = args.trans_a;
  x.trans_b = args.trans_b;
  x.alpha = args.alpha;
  x.beta = args.beta;
  return run_lt(x, dev, s);
}

void gemm_f64(void* c, const void* a, const void* b, const GemmDims& d, const GemmArgs& args,
              int dev, cudaStream_t s) {
  const ColMajor g = col_major(d, args);
  cublasHandle_t h = cublas_handle(dev);
  MG_CUBLAS_CHECK(cublasSetStream(h, s));
  const double alpha = args.alpha, beta = args.beta;
  detail::count_library_call();
  MG_CUBLAS_CHECK(cublasDgemmStridedBatched(
      h, g.op_a, g.op_b, static_cast<int>(d.n), static_cast<int>(d.m), static_cast<int>(d.k),
      &alpha, static_cast<const double*>(b), static_cast<int>(g.rows_a), g.stride_a,
      static_cast<const double*>(a), static_cast<int>(g.rows_b), g.stride_b, &beta,
      static_cast<double*>(c), static_cast<int>(d.n), g.stride_c, static_cast<int>(d.batch)));
}

// C = alpha * op(A) @ op(B) + beta * C on raw buffers (dims already checked): every path.
void product(void* c, DType tc, const void* a, const void* b, DType tab, const GemmDims& d,
             const GemmArgs& args, int dev, cudaStream_t s) {
  const int64_t c_numel = d.batch * d.m * d.n;
  if (c_numel == 0) return;
  if (d.k == 0) {
    with_compute(tab, [&](auto tag) {
      using C = decltype(tag);
      scale_kernel<C>
          <<<grid_for(c_numel), kThreads, 0, s>>>(c, tc, static_cast<C>(args.beta), c_numel);
    });
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  if (tab == DType::f64) {
    if (tc == DType::f64) {
      gemm_f64(c, a, b, d, args, dev, s);
    } else {
      // f32 C from f64 inputs: an f64 temporary, loaded from C only when beta reads it.
      Scratch tmp(dev, static_cast<std::size_t>(c_numel) * sizeof(double));
      if (args.beta != 0.0f)
        launch_convert(tmp.get(), DType::f64, c, tc, static_cast<std::size_t>(c_numel), dev);
      gemm_f64(tmp.get(), a, b, d, args, dev, s);
      launch_convert(c, tc, tmp.get(), DType::f64, static_cast<std::size_t>(c_numel), dev);
    }
    return;
  }
  if (!gemm_lt(c, tc, a, b, tab, d, args, dev, s)) gemm_ex(c, tc, a, b, tab, d, args, dev, s);
}

// C [M, N] (or [Bt, M, N]) = alpha * op(A) @ op(B) + beta * C
void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmArgs& args) {
  const GemmDims d = check_gemm(c, a, b, args);
  if (d.batch * d.m * d.n == 0) return;
  const int dev = c.device().index;
  DeviceGuard guard(dev);
  product(c.raw_data(), c.dtype(), a.raw_data(), b.raw_data(), a.dtype(), d, args, dev,
          current_stream(dev));
}

// ---- grouped_gemm -------------------------------------------------------------------------------

// cublasGemmGroupedBatchedEx (cuBLAS 12.5+) takes A, B and C of one dtype: bf16, f16 or f32.
bool grouped_batched_usable(DType tab, DType tc) {
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
  return tab == tc && (tab == DType::bf16 || tab == DType::f16 || tab == DType::f32);
#else
  (void)tab;
  (void)tc;
  return false;
#endif
}

// All groups in one cublasGemmGroupedBatchedEx call (one cuBLAS group of size 1 per GEMM, f32
// compute, default math as gemm_ex) where the dtypes allow; otherwise (f64, or bf16/f16 inputs
// accumulating into an f32 C: the wgrad into main_grad) each group through gemm's own path, in
// order on the one stream. Groups with M, N or K 0 take gemm's path too (nothing, or C = beta C).
void grouped_gemm(std::span<Tensor> c, std::span<const Tensor> a, std::span<const Tensor> b,
                  const GemmArgs& args) {
  const std::vector<GemmDims> dims = ops::validate_grouped_gemm(OnCudaDevice{}, c, a, b, args);
  if (dims.empty()) return;
  const int dev = c[0].device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const DType tab = a[0].dtype(), tc = c[0].dtype();
  std::vector<std::size_t> batched;
  for (std::size_t g = 0; g < dims.size(); ++g) {
    check_gemm(c[g], a[g], b[g], args);
    if (dims[g].m * dims[g].n == 0) continue;
    if (!grouped_batched_usable(tab, tc) || dims[g].k == 0)
      product(c[g].raw_data(), tc, a[g].raw_data(), b[g].raw_data(), tab, dims[g], args, dev, s);
    else
      batched.push_back(g);
  }
  if (batched.empty()) return;
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
  const std::size_t n = batched.size();
  std::vector<cublasOperation_t> op_a(n), op_b(n);
  std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), size(n, 1);
  std::vector<float> alpha(n, args.alpha), beta(n, args.beta);
  std::vector<const void*> ptrs(3 * n);  // cuBLAS's A (our B), B (our A), C: device arrays
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t g = batched[i];
    const ColMajor cm = col_major(dims[g], args);
    op_a[i] = cm.op_a;
    op_b[i] = cm.op_b;
    m[i] = static_cast<int>(dims[g].n);
    nn[i] = static_cast<int>(dims[g].m);
    k[i] = static_cast<int>(dims[g].k);
    lda[i] = static_cast<int>(cm.rows_a);
    ldb[i] = static_cast<int>(cm.rows_b);
    ldc[i] = static_cast<int>(dims[g].n);
    ptrs[i] = b[g].raw_data();
    ptrs[n + i] = a[g].raw_data();
    ptrs[2 * n + i] = c[g].raw_data();
  }
  // A pageable source: cudaMemcpyAsync returns once it has staged `ptrs`, so it may go out of
  // scope; the scratch is freed in stream order after the GEMMs.
  Scratch dptrs(dev, ptrs.size() * sizeof(void*));
  MG_CUDA_CHECK(cudaMemcpyAsync(dptrs.get(), ptrs.data(), ptrs.size() * sizeof(void*),
                                cudaMemcpyHostToDevice, s));
  const void* const* d = static_cast<const void* const*>(dptrs.get());
  cublasHandle_t h = cublas_handle(dev);
  MG_CUBLAS_CHECK(cublasSetStream(h, s));
  MG_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  detail::count_library_call();
  MG_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
      h, op_a.data(), op_b.data(), m.data(), nn.data(), k.data(), alpha.data(), d, cuda_type(tab),
      lda.data(), d + n, cuda_type(tab), ldb.data(), beta.data(),
      const_cast<void* const*>(d + 2 * n), cuda_type(tc), ldc.data(), static_cast<int>(n),
      size.data(), CUBLAS_COMPUTE_32F));
#endif
}

// ---- gemm_epilogue
// --------------------------------------------------------------------------------

using ops::GemmEpilogue;
using ops::GemmEpilogueArgs;

template <typename C>
__device__ __forceinline__ C gelu_tanh(C x) {
  const C kSqrt2OverPi = C(0.7978845608028654), kCubic = C(0.044715);
  return C(0.5) * x * (C(1) + tanh_c(kSqrt2OverPi * (x + kCubic * x * x * x)));
}
template <typename C>
__device__ __forceinline__ C gelu_tanh_grad(C x) {
  const C kSqrt2OverPi = C(0.7978845608028654), kCubic = C(0.044715);
  const C t = tanh_c(kSqrt2OverPi * (x + kCubic * x * x * x));
  return C(0.5) * (C(1) + t) +
         C(0.5) * x * (C(1) - t * t) * kSqrt2OverPi * (C(1) + C(3) * kCubic * x * x);
}

// The unfused epilogue on the product p [M, N] (compute type C, unrounded), as the CPU defines it:
//   bias         c = p + bias
//   bias_gelu    t = p + bias (bias may be null); aux = t; c = gelu(t)
//   dgelu_bgrad  g = gelu'(aux) * p; c = g; p = g (kept unrounded for the bias-gradient sums)
template <typename C>
__global__ void epilogue_kernel(GemmEpilogue e, C* p, void* c, DType tc, void* aux,
                                const void* bias, DType tbias, int64_t mn, int64_t n) {
  for (int64_t i = grid_start(); i < mn; i += grid_stride()) {
    const C v = p[i];
    switch (e) {
      case GemmEpilogue::bias:
        store<C>(c, tc, i, v + load<C>(bias, tbias, i % n));
        break;
      case GemmEpilogue::bias_gelu: {
        const C t = bias ? v + load<C>(bias, tbias, i % n) : v;
        store<C>(aux, tc, i, t);
        store<C>(c, tc, i, gelu_tanh(t));
        break;
      }
      case GemmEpilogue::dgelu_bgrad: {
        const C g = gelu_tanh_grad(load<C>(aux, tc, i)) * v;
        store<C>(c, tc, i, g);
        p[i] = g;
        break;
      }
      case GemmEpilogue::bgrad:
        break;
    }
  }
}

// out[j] += sum_{r < rows} x[r * row_stride + j * col_stride] for j < cols: one thread per output,
// the rows summed in order (deterministic). Coalesced for col_stride 1 (column sums of a row-major
// matrix); the row sums of bgrad without trans_a read strided (fallback path only).
template <typename C>
__global__ void strided_sum_add_kernel(void* out, DType tout, const void* x, DType tx, int64_t rows,
                                       int64_t cols, int64_t row_stride, int64_t col_stride) {
  for (int64_t j = grid_start(); j < cols; j += grid_stride()) {
    C sum = C(0);
    for (int64_t r = 0; r < rows; ++r) sum += load<C>(x, tx, r * row_stride + j * col_stride);
    store<C>(out, tout, j, load<C>(out, tout, j) + sum);
  }
}

// out[j] += src[j] (a bias gradient cuBLASLt wrote into a scratch vector).
template <typename C>
__global__ void add_kernel(void* out, DType tout, const void* src, DType tsrc, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(out, tout, i, load<C>(out, tout, i) + load<C>(src, tsrc, i));
}

void launch_strided_sum_add(Tensor& out, const void* x, DType tx, int64_t rows, int64_t cols,
                            int64_t row_stride, int64_t col_stride, cudaStream_t s) {
  if (cols == 0) return;
  with_compute(tx == DType::f64 || out.dtype() == DType::f64 ? DType::f64 : DType::f32,
               [&](auto tag) {
                 using C = decltype(tag);
                 strided_sum_add_kernel<C><<<grid_for(cols), kThreads, 0, s>>>(
                     out.raw_data(), out.dtype(), x, tx, rows, cols, row_stride, col_stride);
               });
  MG_CUDA_CHECK_LAUNCH();
}

void launch_add(Tensor& out, const void* src, DType tsrc, cudaStream_t s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  with_compute(out.dtype(), [&](auto tag) {
    using C = decltype(tag);
    add_kernel<C><<<grid_for(n), kThreads, 0, s>>>(out.raw_data(), out.dtype(), src, tsrc, n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

// dbias [M] += sum over K of op(A) [M, K]: column sums of A [K, M] (trans_a), row sums of A [M, K].
void bgrad_sums(Tensor& dbias, const Tensor& a, const GemmDims& d, bool trans_a, cudaStream_t s) {
  if (trans_a)
    launch_strided_sum_add(dbias, a.raw_data(), a.dtype(), d.k, d.m, d.m, 1, s);
  else
    launch_strided_sum_add(dbias, a.raw_data(), a.dtype(), d.k, d.m, 1, d.k, s);
}

// The unfused sequence: the exact mirror of the CPU definition.
void epilogue_unfused(Tensor& c, Tensor& aux, Tensor& dbias, const Tensor& a, const Tensor& b,
                      const Tensor& bias, const GemmEpilogueArgs& args, const GemmDims& d, int dev,
                      cudaStream_t s) {
  counters().unfused.fetch_add(1, std::memory_order_relaxed);
  const GemmArgs ga{.trans_a = args.trans_a, .trans_b = args.trans_b, .beta = args.beta};
  const int64_t mn = d.m * d.n;
  if (args.epilogue == GemmEpilogue::bgrad) {
    product(c.raw_data(), c.dtype(), a.raw_data(), b.raw_data(), a.dtype(), d, ga, dev, s);
    bgrad_sums(dbias, a, d, args.trans_a, s);
    return;
  }
  if (mn == 0) return;
  const DType tp = ops::compute_dtype(a.dtype());  // f32, f64 for f64
  Scratch p(dev, static_cast<std::size_t>(mn) * dtype_size(tp));
  product(p.get(), tp, a.raw_data(), b.raw_data(), a.dtype(), d, ga, dev, s);
  with_compute(tp, [&](auto tag) {
    using C = decltype(tag);
    epilogue_kernel<C><<<grid_for(mn), kThreads, 0, s>>>(
        args.epilogue, p.as<C>(), c.raw_data(), c.dtype(), aux.defined() ? aux.raw_data() : nullptr,
        bias.defined() ? bias.raw_data() : nullptr, bias.defined() ? bias.dtype() : tp, mn, d.n);
  });
  MG_CUDA_CHECK_LAUNCH();
  if (args.epilogue == GemmEpilogue::dgelu_bgrad && dbias.defined())
    launch_strided_sum_add(dbias, p.get(), tp, d.m, d.n, d.n, 1, s);
}

// The cuBLASLt epilogue, when the call meets its constraints and the heuristic has an algorithm.
// Returns false (nothing written) otherwise.
bool epilogue_fused(Tensor& c, Tensor& aux, Tensor& dbias, const Tensor& a, const Tensor& b,
                    const Tensor& bias, const GemmEpilogueArgs& args, const GemmDims& d, int dev,
                    cudaStream_t s) {
  if (a.dtype() == DType::f64 || d.k == 0 || d.m == 0 || d.n == 0) return false;
  LtCall x;
  x.a = a.raw_data();
  x.b = b.raw_data();
  x.c = c.raw_data();
  x.tab = a.dtype();
  x.tc = c.dtype();
  x.d = d;
  x.trans_a = args.trans_a;
  x.trans_b = args.trans_b;
  x.beta = args.beta;
  // EPILOGUE_AUX_LD (= N) must be a multiple of 8. The GELU epilogues are fused only for a bf16 or
  // f16 C: cuBLASLt does not document the accuracy of its GELU (it may use a fast tanh), which is
  // below a 16-bit output's rounding but not an f32 one's; an f32 C keeps the exact mirror of the
  // CPU (the f32 GPU-vs-CPU training checks rely on it).
  const bool aux_ok = d.n % 8 == 0 && c.dtype() != DType::f32;
  auto run_fused = [&](const LtCall& call) {
    if (!run_lt(call, dev, s)) return false;
    counters().fused.fetch_add(1, std::memory_order_relaxed);
    return true;
  };
  switch (args.epilogue) {
    case GemmEpilogue::bias:
      if (bias.dtype() != c.dtype()) return false;
      x.epilogue = CUBLASLT_EPILOGUE_BIAS;
      x.bias = const_cast<void*>(bias.raw_data());  // read only (a const void* attribute)
      x.bias_type = cuda_type(bias.dtype());
      return run_fused(x);
    case GemmEpilogue::bias_gelu:
      if (!aux_ok || (bias.defined() && bias.dtype() != c.dtype())) return false;
      x.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      if (bias.defined()) {
        x.bias = const_cast<void*>(bias.raw_data());
        x.bias_type = cuda_type(bias.dtype());
      }
      x.aux = aux.raw_data();
      return run_fused(x);
    case GemmEpilogue::dgelu_bgrad:
    case GemmEpilogue::bgrad: {
      const bool dgelu = args.epilogue == GemmEpilogue::dgelu_bgrad;
      if (dgelu && !aux_ok) return false;
      if (dgelu) x.aux = aux.raw_data();
      if (dgelu && !dbias.defined()) {
        x.epilogue = CUBLASLT_EPILOGUE_DGELU;
        return run_fused(x);
      }
      // DGELU_BGRAD's bias gradient was off by up to 0.5 on sums of O(1) in bf16 (36 of 3,072,
      // m 256, k 768) and 0.06 in f16 on an H200 (2026-11-26-h200-lease.md): cuBLASLt does not
      // document the precision of that reduction, and its errors look like sums kept in C's
      // dtype. So: the fused DGELU (c = g in C's dtype), then dbias += the column sums of c in
      // f64 (reduce.cuh's chunked sums: deterministic, and parallel over rows as well as
      // columns). That is the bias gradient of the rounded g, as
      // Megatron's unfused path computes it from the bf16 gradient; the difference from the
      // CPU's sums of the unrounded g is at most u_C sum_r |g_r| (cuda_gemm_epilogue_test).
      if (dgelu) {
        x.epilogue = CUBLASLT_EPILOGUE_DGELU;
        if (!run_fused(x)) return false;
        column_sum_accumulate(dbias.raw_data(), dbias.dtype(), d.m, d.n,
                              MatrixTerm{c.raw_data(), c.dtype(), d.n}, dev);
        return true;
      }
      // The weight-gradient GEMM of a layer with a bias (A = dY [K tokens, M], trans_a): the
      // plain GEMM, then dbias += the column sums of A in f64 (reduce.cuh), deterministic and of
      // a known precision (cuBLASLt's BGRADB does not document its reduction's). The cost is
      // about the same: gpt2-124m's QKV wgrads (three 768 x 768 x 16384 GEMMs a layer, split-K)
      // took 2.09 ms a step this way against 2.00 with BGRADB on an H200
      // (2026-11-26-h200-lease-s20.md); what makes them slow is their small M x N.
      if (args.trans_a) {
        if (!run_fused(x)) return false;
        column_sum_accumulate(dbias.raw_data(), dbias.dtype(), d.k, d.m,
                              MatrixTerm{a.raw_data(), a.dtype(), d.m}, dev);
        return true;
      }
      // A [M, K]: row sums, which cuBLASLt's epilogue writes into a scratch vector, added to
      // dbias afterwards. f32 first; C's dtype (the documented default) when f32 has no algorithm.
      x.epilogue = CUBLASLT_EPILOGUE_BGRADB;
      const int64_t len = d.m;
      for (DType tg : {DType::f32, c.dtype()}) {
        Scratch grad(dev, static_cast<std::size_t>(len) * dtype_size(tg));
        x.bias = grad.get();
        x.bias_type = cuda_type(tg);
        if (run_fused(x)) {
          launch_add(dbias, grad.get(), tg, s);
          return true;
        }
        if (tg == c.dtype()) break;
      }
      return false;
    }
  }
  return false;
}

// c [M, N] = epilogue(op(A) @ op(B)); see op_args.h GemmEpilogueArgs.
void gemm_epilogue(Tensor& c, Tensor& aux, Tensor& dbias, const Tensor& a, const Tensor& b,
                   const Tensor& bias, const GemmEpilogueArgs& args) {
  const GemmDims d = ops::validate_gemm_epilogue(OnCudaDevice{}, c, aux, dbias, a, b, bias, args);
  MG_CHECK(!overlaps(c, a) && !overlaps(c, b),
           "gemm_epilogue: C " << c.str() << " overlaps an input; cuBLAS needs a separate output");
  MG_CHECK(!aux.defined() || (!overlaps(aux, a) && !overlaps(aux, b)),
           "gemm_epilogue: aux overlaps an input");
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  MG_CHECK(d.m <= kMax && d.n <= kMax && d.k <= kMax, "gemm_epilogue: dims ["
                                                          << d.m << ", " << d.n << ", " << d.k
                                                          << "] exceed cuBLAS's int range");
  const int dev = c.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  if (!epilogue_fused(c, aux, dbias, a, b, bias, args, d, dev, s))
    epilogue_unfused(c, aux, dbias, a, b, bias, args, d, dev, s);
}

}  // namespace

void register_gemm_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::gemm>(kPlatformName, &gemm, "cuda:cublaslt");
  r.register_op<ops::OpId::grouped_gemm>(kPlatformName, &grouped_gemm,
                                         "cuda:cublas-grouped-batched");
  r.register_op<ops::OpId::gemm_epilogue>(kPlatformName, &gemm_epilogue, "cuda:cublaslt-epilogue");
}

GemmPlanCacheStats gemm_plan_cache_stats() {
  GemmPlanCacheStats st;
  st.hits = counters().hits.load();
  st.misses = counters().misses.load();
  st.fused = counters().fused.load();
  st.unfused = counters().unfused.load();
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    PlanCache& cache = plan_cache(dev);
    std::lock_guard<std::mutex> lock(cache.mu);
    st.plans += cache.plans.size();
  }
  return st;
}

}  // namespace mg::platforms::cuda

extern "C" mg::platforms::cuda::GemmPlanCacheStats mg_cuda_gemm_plan_cache_stats() {
  return mg::platforms::cuda::gemm_plan_cache_stats();
}
