// Small helpers shared by the CPU kernel files: argument checks with uniform messages, dtype
// dispatch to a typed lambda, the accumulation type of a mixed pair, and a deterministic
// column reduction over rows.
//
// Invariants: every check throws mg::Error naming the op, the argument and the offending value;
// dispatch_float covers exactly the kernel float dtypes (f64, f32, bf16, f16), dispatch_index
// exactly i32 and i64, and both throw on the rest.
// Not here: anything op-specific, and anything touching non-host memory.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::platforms::cpu {

// Below this many elements an element-wise loop stays on one thread (fork/join costs more).
inline constexpr int64_t kParallelMinElements = 1 << 15;

inline bool is_kernel_float(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

inline void check_defined(const char* op, const char* name, const Tensor& t) {
  MG_CHECK(t.defined(), op << ": " << name << " is undefined");
}

inline void check_host(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  MG_CHECK(t.is_host(), op << ": " << name << " " << t.str() << " is not on the host (the cpu "
                           << "platform runs host tensors only)");
}

// Defined, on the host, with a kernel float dtype.
inline void check_float_host(const char* op, const char* name, const Tensor& t) {
  check_host(op, name, t);
  MG_CHECK(is_kernel_float(t.dtype()), op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                          << ", expected one of f64, f32, bf16, f16");
}

inline void check_same_dtype(const char* op, const char* name, const Tensor& t,
                             const char* ref_name, const Tensor& ref) {
  MG_CHECK(t.dtype() == ref.dtype(), op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                        << " but " << ref_name << " has "
                                        << dtype_name(ref.dtype()));
}

inline void check_same_numel(const char* op, const char* name, const Tensor& t,
                             const char* ref_name, const Tensor& ref) {
  MG_CHECK(t.numel() == ref.numel(), op << ": " << name << " " << shape_str(t.shape()) << " has "
                                        << t.numel() << " elements but " << ref_name << " "
                                        << shape_str(ref.shape()) << " has " << ref.numel());
}

inline void check_same_shape(const char* op, const char* name, const Tensor& t,
                             const char* ref_name, const Tensor& ref) {
  MG_CHECK(t.shape() == ref.shape(), op << ": " << name << " " << shape_str(t.shape())
                                        << " does not match " << ref_name << " "
                                        << shape_str(ref.shape()));
}

// A tensor like `ref` (an output or gradient of it): defined, on the host, with ref's dtype and
// shape. Check ref itself first (check_float_host) so its dtype is known to be a kernel float.
inline void check_like(const char* op, const char* name, const Tensor& t, const char* ref_name,
                       const Tensor& ref) {
  check_host(op, name, t);
  check_same_dtype(op, name, t, ref_name, ref);
  check_same_shape(op, name, t, ref_name, ref);
}

inline bool is_index(DType t) {
  return t == DType::i32 || t == DType::i64;
}

// Defined, on the host, with an index dtype (i32 or i64): targets, ids, positions.
inline void check_index_host(const char* op, const char* name, const Tensor& t) {
  check_host(op, name, t);
  MG_CHECK(is_index(t.dtype()),
           op << ": " << name << " has dtype " << dtype_name(t.dtype()) << ", expected i32 or i64");
}

// The dtype of compute_t for storage dtype t: f64 for f64, f32 for the rest. Per-row statistics
// (lse, loss, max, mean, rstd) are stored in it.
inline DType compute_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// A statistic of `ref`: defined, on the host, with dtype compute_dtype(ref's dtype). Its shape is
// the caller's to check.
inline void check_stat_host(const char* op, const char* name, const Tensor& t, const char* ref_name,
                            const Tensor& ref) {
  check_host(op, name, t);
  const DType want = compute_dtype(ref.dtype());
  MG_CHECK(t.dtype() == want, op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                 << ", expected " << dtype_name(want) << " for " << ref_name
                                 << " of dtype " << dtype_name(ref.dtype()));
}

// True when the byte ranges of a and b intersect (same storage only).
inline bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || !a.shares_storage_with(b)) return false;
  const std::size_t a0 = a.offset_bytes(), a1 = a0 + a.nbytes();
  const std::size_t b0 = b.offset_bytes(), b1 = b0 + b.nbytes();
  return a0 < b1 && b0 < a1 && a.nbytes() > 0 && b.nbytes() > 0;
}

// Calls f(std::type_identity<T>{}) with T the storage type of dtype t (double, float, bf16_t,
// f16_t). Use with a template lambda: [&]<typename T>(std::type_identity<T>) { ... }.
template <typename F>
decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f64:
      return f(std::type_identity<double>{});
    case DType::f32:
      return f(std::type_identity<float>{});
    case DType::bf16:
      return f(std::type_identity<bf16_t>{});
    case DType::f16:
      return f(std::type_identity<f16_t>{});
    default:
      break;
  }
  MG_THROW(op << ": unsupported dtype " << dtype_name(t) << " (expected f64, f32, bf16, f16)");
}

// Calls f(std::type_identity<I>{}) with I the storage type of index dtype t (int32_t, int64_t).
// Use with a template lambda: [&]<typename I>(std::type_identity<I>) { ... }.
template <typename F>
decltype(auto) dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32:
      return f(std::type_identity<int32_t>{});
    case DType::i64:
      return f(std::type_identity<int64_t>{});
    default:
      break;
  }
  MG_THROW(op << ": unsupported index dtype " << dtype_name(t) << " (expected i32, i64)");
}

// The accumulation type of a pair of storage types: double if either is f64, float otherwise.
template <typename A, typename B>
using acc_t =
    std::conditional_t<std::is_same_v<A, double> || std::is_same_v<B, double>, double, float>;

// Widening load to any accumulation type (to_f32 keeps double for double).
template <typename Acc, typename T>
inline Acc load(T x) {
  return static_cast<Acc>(to_f32(x));
}

// Narrowing store from an accumulation type (double -> float first for the narrow types, as the
// library's conversions do).
template <typename T, typename Acc>
inline T store_from(Acc x) {
  if constexpr (std::is_same_v<T, double>)
    return static_cast<double>(x);
  else
    return from_f32<T>(static_cast<float>(x));
}

// Copies a small host tensor (a [H] parameter) into a vector of Acc.
template <typename Acc>
std::vector<Acc> to_acc_vector(const Tensor& t, const char* op) {
  std::vector<Acc> out(static_cast<std::size_t>(t.numel()));
  dispatch_float(t.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    const T* p = t.data<T>();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = load<Acc>(p[i]);
  });
  return out;
}

// dst[i] += src[i] for a small host tensor dst of any kernel float dtype (parameter gradients).
template <typename Acc>
void accumulate_into(Tensor& dst, const std::vector<Acc>& src, const char* op) {
  dispatch_float(dst.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    T* p = dst.data<T>();
    for (std::size_t i = 0; i < src.size(); ++i) {
      using A = acc_t<T, Acc>;
      p[i] = store_from<T>(load<A>(p[i]) + static_cast<A>(src[i]));
    }
  });
}

// Deterministic column reduction: out[j] = sum over rows of the per-row contributions, for
// j < width. Rows are cut into chunks whose boundaries depend on `rows` alone (never on the
// thread count); chunk_fn(r0, r1, partial) adds rows [r0, r1) into its zeroed partial[width];
// the partials are then summed in chunk order. So results are bit-identical for any number of
// threads, and summation is blocked (more accurate than one running sum). chunk_fn may also
// write per-row outputs (dx) since every row belongs to exactly one chunk.
template <typename Acc, typename F>
void chunked_row_reduce(int64_t rows, int64_t width, std::vector<Acc>& out, F&& chunk_fn) {
  constexpr int64_t kMinRowsPerChunk = 16;
  constexpr int64_t kMaxChunks = 64;
  out.assign(static_cast<std::size_t>(width), Acc(0));
  if (rows <= 0) return;
  const int64_t chunks =
      std::clamp<int64_t>((rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk, 1, kMaxChunks);
  std::vector<Acc> partial(static_cast<std::size_t>(chunks * width), Acc(0));
#pragma omp parallel for schedule(static) if (chunks > 1 && rows * width >= 4096)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
    chunk_fn(r0, r1, partial.data() + c * width);
  }
#pragma omp parallel for schedule(static) if (chunks * width >= 65536)
  for (int64_t j = 0; j < width; ++j) {
    Acc s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[static_cast<std::size_t>(c * width + j)];
    out[static_cast<std::size_t>(j)] = s;
  }
}

}  // namespace mg::platforms::cpu
