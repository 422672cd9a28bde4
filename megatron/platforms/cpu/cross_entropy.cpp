// CPU cross entropy on logits [N, Vl]: the serial op, and the pieces of Megatron's
// vocab-parallel cross entropy (local max -> all-reduce max -> local stats with the global max ->
// all-reduce sum -> combine), with the one backward both use.
//
// Gradient rule: no parameters; dlogits is an activation gradient and is written (=).
// Invariants: math in f32 for f32/bf16/f16 logits (f64 for f64); the per-row statistics (loss, max,
// sum_exp, target_logit, dloss) are [N] f32 (f64 for f64 logits). Leading logits dims flatten into
// N; targets (i32/i64) and the statistics may have any shape with N elements. The serial op checks
// 0 <= target < V; the shard ops take this shard's columns [vocab_start, vocab_start + Vl) and give
// target_logit 0 (and no one-hot term) for targets outside them. dlogits may alias logits.
// f32 logits take e^x from vec_math.h's vectorised polynomial (about 1 ulp; 0 below e^-87, where a
// term is under 2^-125 of the row's largest) and reduce a row in kLanes lanes combined in lane
// order: a row's statistics depend on V only, never on the thread count. Other dtypes: std::exp.
// Not done here: ignore_index, label smoothing, z-loss, the all-reduces (the caller's group).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/platforms/cpu/vec_math.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using Rows = ops::CeRows;

// Calls f(std::type_identity<T>{}, std::type_identity<I>{}) with T the storage type of the logits
// and I that of the targets.
template <typename F>
void dispatch_logits_targets(const Tensor& logits, const Tensor& targets, const char* op, F&& f) {
  dispatch_float(logits.dtype(), op, [&]<typename T>(std::type_identity<T> t) {
    dispatch_index(targets.dtype(), op, [&]<typename I>(std::type_identity<I> i) { f(t, i); });
  });
}

// Row maximum and sum of exp(x - max) of one row of V logits. f32 rows go through vec_math.h:
// kLanes lane maxima / partial sums combined in lane order, so a row's result depends on V only
// (not on alignment or threads), and e^x is the vectorised polynomial (about 1 ulp).
template <typename T, typename C = compute_t<T>>
inline C row_max(const T* x, int64_t v) {
  if constexpr (std::is_same_v<T, float>) {
    using namespace vec;
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    FV acc = partial_v(x + v / kLanes * kLanes, v % kLanes, kNegInf);
    for (int64_t j = 0; j + kLanes <= v; j += kLanes) {
      const FV e = load_v(x + j);
      acc = e > acc ? e : acc;
    }
    return lane_max(acc);
  } else {
    C m = -std::numeric_limits<C>::infinity();
    for (int64_t j = 0; j < v; ++j) m = std::max(m, load<C>(x[j]));
    return m;
  }
}

template <typename T, typename C = compute_t<T>>
inline C row_sum_exp(const T* x, int64_t v, C m) {
  if constexpr (std::is_same_v<T, float>) {
    using namespace vec;
    FV acc = {};
    int64_t j = 0;
    for (; j + kLanes <= v; j += kLanes) acc += exp_v(load_v(x + j) - m);
    if (j < v) acc += exp_v(partial_v(x + j, v - j, -std::numeric_limits<float>::infinity()) - m);
    return lane_sum(acc);
  } else {
    C s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(load<C>(x[j]) - m);
    return s;
  }
}

template <typename T, typename I>
void ce_fwd_impl(Tensor& loss, Tensor& max, Tensor& sum_exp, const Tensor& logits,
                 const Tensor& targets, const Rows& r) {
  using C = compute_t<T>;
  const T* x = logits.data<T>();
  const I* t = targets.data<I>();
  C* lp = loss.data<C>();
  C* mp = max.data<C>();
  C* sp = sum_exp.data<C>();
  // Validated serially first: an exception must not leave an OpenMP region.
  for (int64_t n = 0; n < r.n; ++n)
    MG_CHECK(t[n] >= 0 && t[n] < r.v, "cross_entropy_fwd: target "
                                          << static_cast<int64_t>(t[n]) << " of row " << n
                                          << " is outside [0, V = " << r.v << ")");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.n; ++n) {
    const T* row = x + n * r.v;
    const C m = row_max<T>(row, r.v);
    const C s = row_sum_exp<T>(row, r.v, m);
    mp[n] = m;
    sp[n] = s;
    lp[n] = std::log(s) + m - load<C>(row[t[n]]);
  }
}

template <typename T>
void ce_local_max_impl(Tensor& max, const Tensor& logits, const Rows& r) {
  using C = compute_t<T>;
  const T* x = logits.data<T>();
  C* mp = max.data<C>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.n; ++n) mp[n] = row_max<T>(x + n * r.v, r.v);
}

template <typename T, typename I>
void ce_local_stats_impl(Tensor& sum_exp, Tensor& target_logit, const Tensor& logits,
                         const Tensor& max, const Tensor& targets, int64_t vocab_start,
                         const Rows& r) {
  using C = compute_t<T>;
  const T* x = logits.data<T>();
  const C* mp = max.data<C>();
  const I* t = targets.data<I>();
  C* sp = sum_exp.data<C>();
  C* tp = target_logit.data<C>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.n; ++n) {
    const T* row = x + n * r.v;
    sp[n] = row_sum_exp<T>(row, r.v, mp[n]);
    const int64_t local = static_cast<int64_t>(t[n]) - vocab_start;
    tp[n] = local >= 0 && local < r.v ? load<C>(row[local]) : C(0);
  }
}

template <typename C>
void ce_combine_impl(Tensor& loss, const Tensor& max, const Tensor& sum_exp,
                     const Tensor& target_logit, int64_t n) {
  C* lp = loss.data<C>();
  const C* mp = max.data<C>();
  const C* sp = sum_exp.data<C>();
  const C* tp = target_logit.data<C>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) lp[i] = std::log(sp[i]) + mp[i] - tp[i];
}

template <typename T, typename I>
void ce_bwd_impl(Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& max,
                 const Tensor& sum_exp, const Tensor& targets, int64_t vocab_start, const Rows& r) {
  using C = compute_t<T>;
  const T* x = logits.data<T>();
  T* dx = dlogits.data<T>();  // may be x itself: each element is read before it is written
  const C* dl = dloss.data<C>();
  const C* mp = max.data<C>();
  const C* sp = sum_exp.data<C>();
  const I* t = targets.data<I>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.n; ++n) {
    const C g = dl[n];
    const C m = mp[n];
    const C inv = C(1) / sp[n];
    const int64_t local = static_cast<int64_t>(t[n]) - vocab_start;
    const T* row = x + n * r.v;
    T* drow = dx + n * r.v;
    if constexpr (std::is_same_v<T, float>) {
      using namespace vec;
      const bool has_target = local >= 0 && local < r.v;
      const float xt = has_target ? row[local] : 0.0f;  // read first: dx may alias x
      int64_t j = 0;
      for (; j + kLanes <= r.v; j += kLanes)
        store_v(drow + j, g * (exp_v(load_v(row + j) - m) * inv));
      if (j < r.v) {
        const FV e = partial_v(row + j, r.v - j, -std::numeric_limits<float>::infinity());
        store_partial_v(drow + j, g * (exp_v(e - m) * inv), r.v - j);
      }
      // The one-hot term, from the same p as the vector loop computed for that lane.
      if (has_target) {
        const float p = exp_v(FV{} + (xt - m))[0] * inv;
        drow[local] = store<T>(g * (p - C(1)));
      }
    } else {
      for (int64_t j = 0; j < r.v; ++j) {
        const C p = std::exp(load<C>(row[j]) - m) * inv;
        drow[j] = store<T>(g * (j == local ? p - C(1) : p));
      }
    }
  }
}

void cross_entropy_fwd(Tensor& loss, Tensor& max, Tensor& sum_exp, const Tensor& logits,
                       const Tensor& targets) {
  const char* op = "cross_entropy_fwd";
  const Rows r = ops::validate_cross_entropy_fwd(kOnHost, loss, max, sum_exp, logits, targets);
  dispatch_logits_targets(
      logits, targets, op,
      [&]<typename T, typename I>(std::type_identity<T>, std::type_identity<I>) {
        ce_fwd_impl<T, I>(loss, max, sum_exp, logits, targets, r);
      });
}

void ce_local_max(Tensor& max, const Tensor& logits) {
  const char* op = "ce_local_max";
  const Rows r = ops::validate_ce_local_max(kOnHost, max, logits);
  dispatch_float(logits.dtype(), op,
                 [&]<typename T>(std::type_identity<T>) { ce_local_max_impl<T>(max, logits, r); });
}

void ce_local_stats(Tensor& sum_exp, Tensor& target_logit, const Tensor& logits, const Tensor& max,
                    const Tensor& targets, int64_t vocab_start) {
  const char* op = "ce_local_stats";
  const Rows r = ops::validate_ce_local_stats(kOnHost, sum_exp, target_logit, logits, max, targets,
                                              vocab_start);
  dispatch_logits_targets(
      logits, targets, op,
      [&]<typename T, typename I>(std::type_identity<T>, std::type_identity<I>) {
        ce_local_stats_impl<T, I>(sum_exp, target_logit, logits, max, targets, vocab_start, r);
      });
}

void ce_combine(Tensor& loss, const Tensor& max, const Tensor& sum_exp,
                const Tensor& target_logit) {
  ops::validate_ce_combine(kOnHost, loss, max, sum_exp, target_logit);
  if (loss.dtype() == DType::f64)
    ce_combine_impl<double>(loss, max, sum_exp, target_logit, loss.numel());
  else
    ce_combine_impl<float>(loss, max, sum_exp, target_logit, loss.numel());
}

void cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                       const Tensor& max, const Tensor& sum_exp, const Tensor& targets,
                       int64_t vocab_start) {
  const char* op = "cross_entropy_bwd";
  const Rows r = ops::validate_cross_entropy_bwd(kOnHost, dlogits, dloss, logits, max, sum_exp,
                                                 targets, vocab_start);
  MG_CHECK(
      !overlaps(dlogits, logits) || dlogits.offset_bytes() == logits.offset_bytes(),
      op << ": dlogits overlaps logits at a different offset; alias them exactly or not at all");
  dispatch_logits_targets(
      logits, targets, op,
      [&]<typename T, typename I>(std::type_identity<T>, std::type_identity<I>) {
        ce_bwd_impl<T, I>(dlogits, dloss, logits, max, sum_exp, targets, vocab_start, r);
      });
}

}  // namespace

void register_cross_entropy_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::cross_entropy_fwd>("cpu", &cross_entropy_fwd, "cpu:omp");
  r.register_op<ops::OpId::ce_local_max>("cpu", &ce_local_max, "cpu:omp");
  r.register_op<ops::OpId::ce_local_stats>("cpu", &ce_local_stats, "cpu:omp");
  r.register_op<ops::OpId::ce_combine>("cpu", &ce_combine, "cpu:omp");
  r.register_op<ops::OpId::cross_entropy_bwd>("cpu", &cross_entropy_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
