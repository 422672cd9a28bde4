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
// Not done here: ignore_index, label smoothing, z-loss, the all-reduces (the caller's group).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f64:
      f(double{});
      break;
    case DType::f32:
      f(float{});
      break;
    case DType::bf16:
      f(bf16_t{});
      break;
    case DType::f16:
      f(f16_t{});
      break;
    default:
      MG_THROW(op << ": unsupported dtype " << dtype_name(dt) << " (expected f64, f32, bf16, f16)");
  }
}

// Calls f(I{}) with I the index type of a target tensor.
template <typename F>
void dispatch_index(const Tensor& targets, const char* op, F&& f) {
  switch (targets.dtype()) {
    case DType::i32:
      f(int32_t{});
      break;
    case DType::i64:
      f(int64_t{});
      break;
    default:
      MG_THROW(op << ": targets has dtype " << dtype_name(targets.dtype())
                  << ", expected i32 or i64");
  }
}

DType stat_dtype(DType logits) {
  return logits == DType::f64 ? DType::f64 : DType::f32;
}

struct Rows {
  int64_t n, v;
};

// logits [N, Vl] (leading dims flattened).
Rows check_logits(const char* op, const Tensor& logits) {
  MG_CHECK(logits.defined() && logits.is_host(), op << ": logits must be a cpu tensor");
  MG_CHECK(logits.dim() >= 1, op << ": logits must be [N, V], got a scalar");
  const int64_t v = logits.size(-1);
  MG_CHECK(v > 0, op << ": logits " << shape_str(logits.shape()) << " has an empty vocab dim");
  return {logits.numel() / v, v};
}

// A per-row statistic [N] of the dtype that goes with the logits.
void check_stat(const char* op, const char* name, const Tensor& t, const Tensor& logits,
                const Rows& r) {
  MG_CHECK(t.defined() && t.is_host(), op << ": " << name << " must be a cpu tensor");
  const DType want = stat_dtype(logits.dtype());
  MG_CHECK(t.dtype() == want, op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                 << ", expected " << dtype_name(want) << " for logits of dtype "
                                 << dtype_name(logits.dtype()));
  MG_CHECK(t.numel() == r.n, op << ": " << name << " " << shape_str(t.shape()) << " has "
                                << t.numel() << " elements, expected N = " << r.n << " (logits "
                                << shape_str(logits.shape()) << ")");
}

void check_targets(const char* op, const Tensor& targets, const Tensor& logits, const Rows& r) {
  MG_CHECK(targets.defined() && targets.is_host(), op << ": targets must be a cpu tensor");
  MG_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64,
           op << ": targets has dtype " << dtype_name(targets.dtype()) << ", expected i32 or i64");
  MG_CHECK(targets.numel() == r.n, op << ": targets " << shape_str(targets.shape()) << " has "
                                      << targets.numel() << " elements, expected N = " << r.n
                                      << " (logits " << shape_str(logits.shape()) << ")");
}

// Row maximum and sum of exp(x - max) of one row of V logits.
template <typename T, typename C = compute_t<T>>
inline C row_max(const T* x, int64_t v) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<C>(to_f32(x[j])));
  return m;
}

template <typename T, typename C = compute_t<T>>
inline C row_sum_exp(const T* x, int64_t v, C m) {
  C s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(static_cast<C>(to_f32(x[j])) - m);
  return s;
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
    lp[n] = std::log(s) + m - static_cast<C>(to_f32(row[t[n]]));
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
    tp[n] = local >= 0 && local < r.v ? static_cast<C>(to_f32(row[local])) : C(0);
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
    for (int64_t j = 0; j < r.v; ++j) {
      const C p = std::exp(static_cast<C>(to_f32(row[j])) - m) * inv;
      drow[j] = store<T>(g * (j == local ? p - C(1) : p));
    }
  }
}

void cross_entropy_fwd(Tensor& loss, Tensor& max, Tensor& sum_exp, const Tensor& logits,
                       const Tensor& targets) {
  const char* op = "cross_entropy_fwd";
  const Rows r = check_logits(op, logits);
  check_targets(op, targets, logits, r);
  check_stat(op, "loss", loss, logits, r);
  check_stat(op, "max", max, logits, r);
  check_stat(op, "sum_exp", sum_exp, logits, r);
  dispatch_float(logits.dtype(), op, [&](auto tag) {
    dispatch_index(targets, op, [&](auto itag) {
      ce_fwd_impl<decltype(tag), decltype(itag)>(loss, max, sum_exp, logits, targets, r);
    });
  });
}

void ce_local_max(Tensor& max, const Tensor& logits) {
  const char* op = "ce_local_max";
  const Rows r = check_logits(op, logits);
  check_stat(op, "max", max, logits, r);
  dispatch_float(logits.dtype(), op,
                 [&](auto tag) { ce_local_max_impl<decltype(tag)>(max, logits, r); });
}

void ce_local_stats(Tensor& sum_exp, Tensor& target_logit, const Tensor& logits, const Tensor& max,
                    const Tensor& targets, int64_t vocab_start) {
  const char* op = "ce_local_stats";
  const Rows r = check_logits(op, logits);
  check_targets(op, targets, logits, r);
  check_stat(op, "sum_exp", sum_exp, logits, r);
  check_stat(op, "target_logit", target_logit, logits, r);
  check_stat(op, "max", max, logits, r);
  MG_CHECK(vocab_start >= 0, op << ": vocab_start " << vocab_start << " is negative");
  dispatch_float(logits.dtype(), op, [&](auto tag) {
    dispatch_index(targets, op, [&](auto itag) {
      ce_local_stats_impl<decltype(tag), decltype(itag)>(sum_exp, target_logit, logits, max,
                                                         targets, vocab_start, r);
    });
  });
}

void ce_combine(Tensor& loss, const Tensor& max, const Tensor& sum_exp,
                const Tensor& target_logit) {
  const char* op = "ce_combine";
  MG_CHECK(loss.defined() && loss.is_host(), op << ": loss must be a cpu tensor");
  MG_CHECK(loss.dtype() == DType::f32 || loss.dtype() == DType::f64,
           op << ": loss has dtype " << dtype_name(loss.dtype()) << ", expected f32 or f64");
  const std::pair<const char*, const Tensor*> ins[] = {
      {"max", &max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit}};
  for (const auto& [name, t] : ins) {
    MG_CHECK(t->defined() && t->is_host(), op << ": " << name << " must be a cpu tensor");
    MG_CHECK(t->dtype() == loss.dtype(), op << ": " << name << " has dtype "
                                            << dtype_name(t->dtype()) << " but loss has "
                                            << dtype_name(loss.dtype()));
    MG_CHECK(t->numel() == loss.numel(),
             op << ": " << name << " " << shape_str(t->shape()) << " does not have loss's "
                << loss.numel() << " elements (loss " << shape_str(loss.shape()) << ")");
  }
  if (loss.dtype() == DType::f64)
    ce_combine_impl<double>(loss, max, sum_exp, target_logit, loss.numel());
  else
    ce_combine_impl<float>(loss, max, sum_exp, target_logit, loss.numel());
}

void cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                       const Tensor& max, const Tensor& sum_exp, const Tensor& targets,
                       int64_t vocab_start) {
  const char* op = "cross_entropy_bwd";
  const Rows r = check_logits(op, logits);
  MG_CHECK(dlogits.defined() && dlogits.is_host(), op << ": dlogits must be a cpu tensor");
  MG_CHECK(dlogits.dtype() == logits.dtype() && dlogits.shape() == logits.shape(),
           op << ": dlogits (" << dtype_name(dlogits.dtype()) << ", " << shape_str(dlogits.shape())
              << ") does not match logits (" << dtype_name(logits.dtype()) << ", "
              << shape_str(logits.shape()) << ")");
  MG_CHECK(
      !dlogits.shares_storage_with(logits) || dlogits.offset_bytes() == logits.offset_bytes(),
      op << ": dlogits overlaps logits at a different offset; alias them exactly or not at all");
  check_targets(op, targets, logits, r);
  check_stat(op, "dloss", dloss, logits, r);
  check_stat(op, "max", max, logits, r);
  check_stat(op, "sum_exp", sum_exp, logits, r);
  MG_CHECK(vocab_start >= 0, op << ": vocab_start " << vocab_start << " is negative");
  dispatch_float(logits.dtype(), op, [&](auto tag) {
    dispatch_index(targets, op, [&](auto itag) {
      ce_bwd_impl<decltype(tag), decltype(itag)>(dlogits, dloss, logits, max, sum_exp, targets,
                                                 vocab_start, r);
    });
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
