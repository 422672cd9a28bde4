// CPU linear algebra: gemm (OpenBLAS), gemm_epilogue, bias_add, bias_grad, axpy, fill.
//
// gemm_epilogue is the definition of the fused epilogues (op_args.h GemmEpilogueArgs) that the
// CUDA platform's cuBLASLt epilogues mirror: the product in f32 (f64 for f64) through the same
// BLAS path as gemm, then bias / GELU (tanh) / GELU gradient on the unrounded values, every output
// rounded once to its dtype, bias gradients summed in the compute type and added (+=). The product
// lands in C (in aux for bias_gelu) when that is stored in the compute type, so f32/f64 calls need
// no temporaries; f32 GELU uses gelu_fwd's vectorised sigmoid form (0.5 (1 + tanh u) =
// sigmoid(2u)), f64 std::tanh.
//
// Gradient rule: parameter gradients accumulate (+=: bias_grad, and gemm with beta = 1 for weight
// gradients); activation gradients are written (=: gemm with beta = 0).
//
// gemm: C = alpha * op(A) @ op(B) + beta * C, row-major, rank 2 or rank 3 (shared leading batch
// dim, one BLAS call per batch entry). f64 runs dgemm, f32 sgemm. bf16 and f16 inputs are widened
// to f32 temporaries and run sgemm: Debian's OpenBLAS 0.3.21 declares cblas_sbgemm in its header
// but is built without BUILD_BFLOAT16, so the symbol is absent, and on AVX2-only hosts its kernel
// would be generic code anyway; the widening is O(MK + KN) against O(MNK) flops. A C of another
// dtype than the compute type goes through a compute-type temporary (loaded from C only when
// beta != 0). beta = 0 never reads C: BLAS defines it so, OpenBLAS zeroes C before accumulating,
// and the temporaries start at zero; gemm_test checks it with a NaN-filled C.
// Threading: OpenBLAS is set single-threaded and each product is split over the OpenMP threads
// (row or column blocks of C, or whole batch entries), so the process has one thread pool.
// Not here: strided/transposed views (tensors are contiguous), broadcasting a rank-2 B against a
// rank-3 A (callers view [S, B, H] as [S*B, H]), integer or fp8 GEMM.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/platforms/cpu/vec_math.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using ops::GemmArgs;
using ops::GemmDims;

// The contract (ops::validate_gemm), then what BLAS needs: a separate output and int dims.
GemmDims check_gemm(const Tensor& c, const Tensor& a, const Tensor& b, const GemmArgs& args) {
  const GemmDims d = ops::validate_gemm(kOnHost, c, a, b, args);
  MG_CHECK(!overlaps(c, a) && !overlaps(c, b),
           "gemm: C " << c.str() << " overlaps an input; BLAS needs a separate output");
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  MG_CHECK(d.m <= kMax && d.n <= kMax && d.k <= kMax,
           "gemm: dims [" << d.m << ", " << d.n << ", " << d.k << "] exceed the BLAS integer range "
                          << kMax);
  return d;
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
               double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
               double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Below this many multiply-adds one BLAS call on one thread is cheaper than forking.
constexpr int64_t kMinSplitWork = int64_t{1} << 20;

// One product C [M, N] split over the OpenMP threads along M (row blocks of C and of op(A)) or,
// when N is larger, along N (column blocks of C and of op(B)); each block is a single-threaded
// BLAS call with the full K (the K reduction is never split, so no partial sums to combine).
template <typename Acc>
void gemm_split(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, Acc alpha,
                const Acc* a, int64_t lda, const Acc* b, int64_t ldb, Acc beta, Acc* c,
                int64_t ldc) {
  constexpr int64_t kMinBlock = 16;  // rows or columns per block: keeps BLAS tiles efficient
  const bool split_m = m >= n;
  const int64_t extent = split_m ? m : n;
  const int64_t parts = std::min<int64_t>(omp_get_max_threads(), extent / kMinBlock);
  if (parts <= 1 || m * n * k < kMinSplitWork) {
    blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int nt = static_cast<int>(parts);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t lo = extent * p / parts, len = extent * (p + 1) / parts - lo;
    if (split_m) {
      // rows [lo, lo + len) of op(A): rows of A, or columns of A^T's storage
      const Acc* ap = ta == CblasTrans ? a + lo : a + lo * lda;
      blas_gemm(ta, tb, len, n, k, alpha, ap, lda, b, ldb, beta, c + lo * ldc, ldc);
    } else {
      // columns [lo, lo + len) of op(B): columns of B, or rows of B^T's storage
      const Acc* bp = tb == CblasTrans ? b + lo * ldb : b + lo;
      blas_gemm(ta, tb, m, len, k, alpha, a, lda, bp, ldb, beta, c + lo, ldc);
    }
  }
}

// Widening/narrowing copies for the temporaries, threaded for large tensors.
template <typename D, typename S>
void convert_copy(D* dst, const S* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) dst[i] = store_from<D>(load<compute_t<S>>(src[i]));
}

// cp [batch, M, N] = alpha * op(A) @ op(B) + beta * cp, all in the compute type Acc.
template <typename Acc>
void product_acc(Acc* cp, const Acc* a, const Acc* b, const GemmDims& d, bool trans_a, bool trans_b,
                 Acc alpha, Acc beta) {
  const int64_t c_numel = d.batch * d.m * d.n;
  if (d.k == 0) {
    // op(A) @ op(B) is all zeros; C = beta * C, with beta = 0 discarding old C (NaN included).
    for (int64_t i = 0; i < c_numel; ++i) cp[i] = beta == Acc(0) ? Acc(0) : beta * cp[i];
    return;
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  // Row-major leading dims: A is [M, K] (or [K, M] when transposed), B [K, N] (or [N, K]).
  const int64_t lda = trans_a ? d.m : d.k;
  const int64_t ldb = trans_b ? d.k : d.n;
  const int64_t ldc = d.n;
  const int threads = omp_get_max_threads();
  if (d.batch >= threads && threads > 1 && d.m * d.n * d.k >= kMinSplitWork / 4) {
    // Enough independent products: one per thread at a time.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.batch; ++i)
      blas_gemm(ta, tb, d.m, d.n, d.k, alpha, a + i * d.m * d.k, lda, b + i * d.k * d.n, ldb, beta,
                cp + i * d.m * d.n, ldc);
  } else {
    for (int64_t i = 0; i < d.batch; ++i)
      gemm_split(ta, tb, d.m, d.n, d.k, alpha, a + i * d.m * d.k, lda, b + i * d.k * d.n, ldb, beta,
                 cp + i * d.m * d.n, ldc);
  }
}

// A and B already in the compute type Acc; C of storage type TC (Acc itself or another dtype).
template <typename Acc, typename TC>
void gemm_compute(Tensor& c, const Acc* a, const Acc* b, const GemmDims& d, const GemmArgs& args) {
  const int64_t c_numel = d.batch * d.m * d.n;
  if (c_numel == 0) return;
  TC* c_store = c.data<TC>();
  Acc* cp = nullptr;
  std::vector<Acc> c_tmp;
  if constexpr (std::is_same_v<TC, Acc>) {
    cp = c_store;
  } else {
    c_tmp.assign(static_cast<std::size_t>(c_numel), Acc(0));  // zeros: beta = 0 reads nothing
    if (args.beta != 0.0f) convert_copy(c_tmp.data(), c_store, c_numel);
    cp = c_tmp.data();
  }
  product_acc<Acc>(cp, a, b, d, args.trans_a, args.trans_b, Acc(args.alpha), Acc(args.beta));
  if constexpr (!std::is_same_v<TC, Acc>) convert_copy(c_store, cp, c_numel);
}

template <typename Acc>
void gemm_with_c(Tensor& c, const Acc* a, const Acc* b, const GemmDims& d, const GemmArgs& args) {
  dispatch_float(c.dtype(), "gemm", [&]<typename TC>(std::type_identity<TC>) {
    gemm_compute<Acc, TC>(c, a, b, d, args);
  });
}

void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmArgs& args) {
  const GemmDims d = check_gemm(c, a, b, args);
  dispatch_float(a.dtype(), "gemm", [&]<typename T>(std::type_identity<T>) {
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
      gemm_with_c<T>(c, a.data<T>(), b.data<T>(), d, args);
    } else {
      // bf16 / f16: widen once, then sgemm (see the file comment for why not sbgemm).
      std::vector<float> a32(static_cast<std::size_t>(a.numel()));
      std::vector<float> b32(static_cast<std::size_t>(b.numel()));
      convert_copy(a32.data(), a.data<T>(), a.numel());
      convert_copy(b32.data(), b.data<T>(), b.numel());
      gemm_with_c<float>(c, a32.data(), b32.data(), d, args);
    }
  });
}

// grouped_gemm: the groups one after the other through gemm, so each group's numbers are those of
// the per-expert loop of gemm calls it replaces (bit-identical).
void grouped_gemm(std::span<Tensor> c, std::span<const Tensor> a, std::span<const Tensor> b,
                  const GemmArgs& args) {
  const std::vector<GemmDims> dims = ops::validate_grouped_gemm(kOnHost, c, a, b, args);
  for (std::size_t g = 0; g < dims.size(); ++g)
    if (dims[g].m * dims[g].n > 0) gemm(c[g], a[g], b[g], args);
}

// ---- gemm_epilogue: the definition the other platforms mirror ---------------------------------
// P = op(A) @ op(B) (+ beta * C for bgrad) in Acc (f32, f64 for f64), then the epilogue on the
// unrounded values, each output rounded once (op_args.h GemmEpilogueArgs).

template <typename Acc>
Acc gelu_tanh(Acc x) {
  const Acc kSqrt2OverPi = Acc(0.7978845608028654), kCubic = Acc(0.044715);
  return Acc(0.5) * x * (Acc(1) + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
}
template <typename Acc>
Acc gelu_tanh_grad(Acc x) {
  const Acc kSqrt2OverPi = Acc(0.7978845608028654), kCubic = Acc(0.044715);
  const Acc t = std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
  return Acc(0.5) * (Acc(1) + t) +
         Acc(0.5) * x * (Acc(1) - t * t) * kSqrt2OverPi * (Acc(1) + Acc(3) * kCubic * x * x);
}

// t's values in Acc: the data itself when t is stored in Acc, else a widened copy in tmp.
template <typename T, typename Acc>
const Acc* as_acc(const Tensor& t, std::vector<Acc>& tmp) {
  if constexpr (std::is_same_v<T, Acc>) {
    return t.data<T>();
  } else {
    tmp.resize(static_cast<std::size_t>(t.numel()));
    convert_copy(tmp.data(), t.data<T>(), t.numel());
    return tmp.data();
  }
}

// dst (any kernel float dtype) = src rounded once; dst_to_acc the other way.
template <typename Acc>
void store_acc(Tensor& dst, const std::vector<Acc>& src) {
  dispatch_float(dst.dtype(), "gemm_epilogue", [&]<typename D>(std::type_identity<D>) {
    convert_copy(dst.data<D>(), src.data(), dst.numel());
  });
}
template <typename Acc>
void load_acc(std::vector<Acc>& dst, const Tensor& src) {
  dispatch_float(src.dtype(), "gemm_epilogue", [&]<typename S>(std::type_identity<S>) {
    convert_copy(dst.data(), src.data<S>(), src.numel());
  });
}

// f32 GELU (tanh form) on vec_math.h lanes as gelu_fwd / gelu_bwd compute it: 0.5 (1 + tanh u) =
// sigmoid(2u), y = x s, y' = s + 2 x s (1 - s) du/dx (no tanhf calls; lane-wise, so independent
// of the thread count).
inline vec::FV gelu_sigmoid_v(vec::FV x) {
  const vec::FV u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 1.0f / (1.0f + vec::exp_v(-2.0f * u));
}
// out[i] = f(x[i], out[i]) (READ_OUT) or f(x[i], 0) over n f32 elements, kLanes at a time (out
// may alias x).
template <bool READ_OUT, typename F>
void map_f32_inplace(float* out, const float* x, int64_t n, F&& f) {
  using namespace vec;
  const int64_t blocks = (n + kLanes - 1) / kLanes;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i = b * kLanes, m = std::min<int64_t>(kLanes, n - i);
    if (m == kLanes)
      store_v(out + i, f(load_v(x + i), READ_OUT ? load_v(out + i) : FV{}));
    else
      store_partial_v(
          out + i, f(partial_v(x + i, m, 0.0f), READ_OUT ? partial_v(out + i, m, 0.0f) : FV{}), m);
  }
}
// y = gelu(x); g *= gelu'(x): f32 vectorised, f64 scalar with std::tanh.
template <typename Acc>
void gelu_acc(Acc* y, const Acc* x, int64_t n) {
  if constexpr (std::is_same_v<Acc, float>) {
    map_f32_inplace<false>(y, x, n, [](vec::FV v, vec::FV) { return v * gelu_sigmoid_v(v); });
  } else {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh(x[i]);
  }
}
template <typename Acc>
void dgelu_mul_acc(Acc* g, const Acc* x, int64_t n) {
  if constexpr (std::is_same_v<Acc, float>) {
    map_f32_inplace<true>(g, x, n, [](vec::FV v, vec::FV gv) {
      const vec::FV sg = gelu_sigmoid_v(v);
      const vec::FV du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * v * v);
      return gv * (sg + 2.0f * v * sg * (1.0f - sg) * du);
    });
  } else {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) g[i] *= gelu_tanh_grad(x[i]);
  }
}

template <typename T>
void gemm_epilogue_typed(Tensor& c, Tensor& aux, Tensor& dbias, const Tensor& a, const Tensor& b,
                         const Tensor& bias, const ops::GemmEpilogueArgs& args, const GemmDims& d) {
  using Acc = compute_t<T>;
  using ops::GemmEpilogue;
  const GemmEpilogue e = args.epilogue;
  const int64_t m = d.m, n = d.n, k = d.k, mn = m * n;
  std::vector<Acc> a_tmp, b_tmp;
  const Acc* ap = as_acc<T, Acc>(a, a_tmp);
  const Acc* bp = as_acc<T, Acc>(b, b_tmp);
  // The unrounded product P lands in C itself (bias_gelu: in aux, the pre-activation) when that
  // is stored in Acc, else in a temporary rounded into C once at the end.
  const bool in_place = c.dtype() == (std::is_same_v<Acc, double> ? DType::f64 : DType::f32);
  std::vector<Acc> p_tmp;
  Acc* p = nullptr;
  if (in_place) {
    p = e == GemmEpilogue::bias_gelu ? aux.data<Acc>() : c.data<Acc>();
  } else {
    p_tmp.assign(static_cast<std::size_t>(mn), Acc(0));
    if (args.beta != 0.0f) load_acc(p_tmp, c);
    p = p_tmp.data();
  }
  if (mn > 0) product_acc<Acc>(p, ap, bp, d, args.trans_a, args.trans_b, Acc(1), Acc(args.beta));
  std::vector<Acc> bv;
  if (bias.defined()) {
    bv = to_acc_vector<Acc>(bias, "gemm_epilogue");
#pragma omp parallel for schedule(static) if (mn >= kParallelMinElements)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) p[i * n + j] += bv[static_cast<std::size_t>(j)];
  }
  switch (e) {
    case GemmEpilogue::bias:
      if (!in_place) store_acc(c, p_tmp);
      break;
    case GemmEpilogue::bias_gelu:  // p = t, the pre-activation
      if (in_place) {
        gelu_acc(c.data<Acc>(), p, mn);
      } else {
        store_acc(aux, p_tmp);
        gelu_acc(p, p, mn);
        store_acc(c, p_tmp);
      }
      break;
    case GemmEpilogue::dgelu_bgrad: {
      std::vector<Acc> x_tmp;
      const Acc* x = nullptr;
      if (in_place) {
        x = aux.data<Acc>();
      } else {
        x_tmp.resize(static_cast<std::size_t>(mn));
        load_acc(x_tmp, aux);
        x = x_tmp.data();
      }
      dgelu_mul_acc(p, x, mn);  // p = g, unrounded
      if (dbias.defined()) {
        std::vector<Acc> sum;  // over the M rows of the unrounded gradient
        chunked_row_reduce<Acc>(m, n, sum, [&](int64_t r0, int64_t r1, Acc* part) {
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t j = 0; j < n; ++j) part[j] += p[r * n + j];
        });
        accumulate_into(dbias, sum, "gemm_epilogue");
      }
      if (!in_place) store_acc(c, p_tmp);
      break;
    }
    case GemmEpilogue::bgrad: {
      if (!in_place && mn > 0) store_acc(c, p_tmp);
      // dbias [M] += sum over K of op(A)[m, k]: column sums of A [K, M] (trans_a), row sums of
      // A [M, K] otherwise.
      std::vector<Acc> sum;
      if (args.trans_a) {
        chunked_row_reduce<Acc>(k, m, sum, [&](int64_t r0, int64_t r1, Acc* part) {
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t j = 0; j < m; ++j) part[j] += ap[r * m + j];
        });
      } else {
        sum.assign(static_cast<std::size_t>(m), Acc(0));
#pragma omp parallel for schedule(static) if (m * k >= kParallelMinElements)
        for (int64_t i = 0; i < m; ++i) {
          Acc s = 0;
          for (int64_t j = 0; j < k; ++j) s += ap[i * k + j];
          sum[static_cast<std::size_t>(i)] = s;
        }
      }
      accumulate_into(dbias, sum, "gemm_epilogue");
      break;
    }
  }
}

// c [M, N] = epilogue(op(A) @ op(B)); see op_args.h GemmEpilogueArgs.
void gemm_epilogue(Tensor& c, Tensor& aux, Tensor& dbias, const Tensor& a, const Tensor& b,
                   const Tensor& bias, const ops::GemmEpilogueArgs& args) {
  const GemmDims d = ops::validate_gemm_epilogue(kOnHost, c, aux, dbias, a, b, bias, args);
  MG_CHECK(!overlaps(c, a) && !overlaps(c, b),
           "gemm_epilogue: C " << c.str() << " overlaps an input; BLAS needs a separate output");
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  MG_CHECK(d.m <= kMax && d.n <= kMax && d.k <= kMax,
           "gemm_epilogue: dims [" << d.m << ", " << d.n << ", " << d.k
                                   << "] exceed the BLAS integer range " << kMax);
  dispatch_float(a.dtype(), "gemm_epilogue", [&]<typename T>(std::type_identity<T>) {
    gemm_epilogue_typed<T>(c, aux, dbias, a, b, bias, args, d);
  });
}

// y [N, F] += bias [F]
void bias_add(Tensor& y, const Tensor& bias) {
  const int64_t f = ops::validate_bias_add(kOnHost, y, bias);
  if (f == 0 || y.numel() == 0) return;
  const int64_t rows = y.numel() / f;
  dispatch_float(y.dtype(), "bias_add", [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const std::vector<Acc> bv = to_acc_vector<Acc>(bias, "bias_add");
    T* p = y.data<T>();
#pragma omp parallel for schedule(static) if (y.numel() >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      T* row = p + r * f;
      for (int64_t j = 0; j < f; ++j) row[j] = store<T>(to_f32(row[j]) + bv[j]);
    }
  });
}

// dbias [F] += sum_n dy [N, F]
void bias_grad(Tensor& dbias, const Tensor& dy) {
  const int64_t f = ops::validate_bias_grad(kOnHost, dbias, dy);
  if (f == 0) return;
  const int64_t rows = dy.numel() / f;
  dispatch_float(dy.dtype(), "bias_grad", [&]<typename T>(std::type_identity<T>) {
    auto run = [&]<typename Acc>(std::type_identity<Acc>) {
      const T* p = dy.data<T>();
      std::vector<Acc> sum;
      chunked_row_reduce<Acc>(rows, f, sum, [&](int64_t r0, int64_t r1, Acc* part) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t j = 0; j < f; ++j) part[j] += load<Acc>(p[r * f + j]);
      });
      accumulate_into(dbias, sum, "bias_grad");
    };
    // An f64 dbias keeps f64 sums even for f32 dy.
    if (dbias.dtype() == DType::f64)
      run(std::type_identity<double>{});
    else
      run(std::type_identity<compute_t<T>>{});
  });
}

// y += alpha * x; x and y may differ in float dtype (an f32 grad buffer, a bf16 grad).
void axpy(Tensor& y, const Tensor& x, float alpha) {
  ops::validate_axpy(kOnHost, y, x);
  const int64_t n = y.numel();
  dispatch_float(y.dtype(), "axpy", [&]<typename TY>(std::type_identity<TY>) {
    dispatch_float(x.dtype(), "axpy", [&]<typename TX>(std::type_identity<TX>) {
      using Acc = acc_t<TX, TY>;
      TY* yp = y.data<TY>();
      const TX* xp = x.data<TX>();
      const Acc a = alpha;
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
      for (int64_t i = 0; i < n; ++i)
        yp[i] = store_from<TY>(load<Acc>(yp[i]) + a * load<Acc>(xp[i]));
    });
  });
}

// x = value for every element; any dtype (integers and fp8 included), converted as Tensor::to.
void fill(Tensor& x, double value) {
  check_host("fill", "x", x);
  const int64_t n = x.numel();
  if (n == 0) return;
  const std::size_t es = dtype_size(x.dtype());
  unsigned char elem[8] = {};
  convert_host(elem, x.dtype(), &value, DType::f64, 1);
  auto fill_as = [&]<typename U>(std::type_identity<U>) {
    U v;
    std::memcpy(&v, elem, sizeof(U));
    U* p = static_cast<U*>(x.raw_data());
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  };
  switch (es) {
    case 1:
      std::memset(x.raw_data(), elem[0], static_cast<std::size_t>(n));
      break;
    case 2:
      fill_as(std::type_identity<uint16_t>{});
      break;
    case 4:
      fill_as(std::type_identity<uint32_t>{});
      break;
    case 8:
      fill_as(std::type_identity<uint64_t>{});
      break;
    default:
      MG_THROW("fill: unsupported element size " << es << " of " << dtype_name(x.dtype()));
  }
}

}  // namespace

void register_gemm_kernels(plugin::Registry& r) {
  // One thread pool per process: OpenBLAS's pthread workers and libgomp's would spin against each
  // other after every switch between a BLAS call and an OpenMP kernel (measured 50x slower on 2
  // cores), so OpenBLAS runs single-threaded and gemm_split threads it with OpenMP.
  openblas_set_num_threads(1);
  r.register_op<ops::OpId::gemm>("cpu", &gemm, "cpu:openblas");
  r.register_op<ops::OpId::grouped_gemm>("cpu", &grouped_gemm, "cpu:openblas-loop");
  r.register_op<ops::OpId::gemm_epilogue>("cpu", &gemm_epilogue, "cpu:openblas+omp");
  r.register_op<ops::OpId::bias_add>("cpu", &bias_add, "cpu:omp");
  r.register_op<ops::OpId::bias_grad>("cpu", &bias_grad, "cpu:omp");
  r.register_op<ops::OpId::axpy>("cpu", &axpy, "cpu:omp");
  r.register_op<ops::OpId::fill>("cpu", &fill, "cpu:omp");
}

}  // namespace mg::platforms::cpu
