// Small helpers shared by the CPU kernel files: the host placement check, dtype dispatch to a
// typed lambda, the accumulation type of a mixed pair, and a deterministic column reduction over
// rows. The ops' argument contracts are checked by megatron/core/ops/validate.h.
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
#include "megatron/core/ops/validate.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::platforms::cpu {

// Below this many elements an element-wise loop stays on one thread (fork/join costs more).
inline constexpr int64_t kParallelMinElements = 1 << 15;

// The op contracts are checked by megatron/core/ops/validate.h; only placement is checked here.
using ops::overlaps;

inline void check_host(const char* op, const char* name, const Tensor& t) {
  ops::check_defined(op, name, t);
  MG_CHECK(t.is_host(), op << ": " << name << " " << t.str() << " is not on the host (the cpu "
                           << "platform runs host tensors only)");
}

// The cpu platform's Placement for the ops::validate_* checks: every tensor on the host.
class OnHost final : public ops::Placement {
 public:
  void check(const char* op, const char* name, const Tensor& t) const override {
    check_host(op, name, t);
  }
};
inline const OnHost kOnHost{};

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
