// CPU scaled dot-product attention (forward and backward) on Megatron's sbhd layout, with GQA,
// causal (bottom-right aligned) and document masks (doc_ids [+ kv_doc_ids] or cu_seqlens),
// counter-based attention dropout, and key sequences longer or shorter than the queries' (Sk !=
// Sq); and attention_merge, the log-sum-exp merge of partial results (ring attention).
//
// Gradient rule: no parameters; dq, dk, dv are activation gradients and are written (=).
// Invariants:
//   - q, out, dq, dout [Sq, B, NH, HD]; k, v, dk, dv [Sk, B, NG, HD]; lse [B, NH, Sq]; all
//     contiguous. Causal: query i sees keys j <= i + Sk - Sq.
//     Head h reads KV group h / (NH / NG); dk/dv sum over the NH / NG heads of a group.
//   - Math in f32 for f32/bf16/f16 storage (f64 for f64); lse is f32 (f64 for f64 inputs).
//   - Masked scores are -inf, not Megatron's -10000; a row that may attend nothing (a padding token
//     with a negative doc id) gets out = 0, lse = -inf and zero gradients, never NaN.
//   - Dropout on the probabilities: P[b,h,i,j] is kept iff
//     random::dropout_keep(seed, offset + ((b*NH + h)*Sq + i)*Sk + j, p) and scaled by 1/(1-p); the
//     backward regenerates the same mask. The backward uses D_i = dO_i . O_i, which holds with
//     dropout too, so out must be the forward's output.
//   - Results do not depend on the thread count: each (b, h) is computed by one thread in a fixed
//     order, and the per-head dK/dV are summed over a group's heads in head order.
// Algorithm: one (b, h) per OpenMP task; its Q/K/V (and dO) are widened to the compute type once.
// Queries go in blocks of kBlock rows; a block's scores against the key span its rows may see
// (causal: up to its last row; documents: the union of its rows' documents) are one BLAS gemm
// (S_blk = scale Q_blk K^T), then masked and softmaxed row by row exactly (the whole key span is in
// the buffer: not a flash-style online softmax), and O_blk = P V is a second gemm. The backward
// recomputes P from lse and does dP = dO V^T, dS = P (dP - D), dQ = dS K, dK += dS^T Q and
// dV += P^T dO as gemms. BLAS is single-threaded (set at registration), so each task calls it
// directly; per thread the buffers are O(S HD + kBlock S). The f32 softmax takes e^x from a
// vectorised polynomial (about 1 ulp, 0 below e^-87) rather than std::exp, its cost otherwise.
// Not done here: non-contiguous (bshd) layouts, attention bias or sliding windows.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/random/philox.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/platforms/cpu/vec_math.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using ops::AttentionArgs;
using Dims = ops::AttentionDims;

// Document of every query ([B*Sq]) and key ([B*Sk]), both empty when there is no document mask,
// and, per query, the key range [lo, hi) that holds every key of its document (empty when no key
// has it), so rows scan only that range.
struct DocMask {
  std::vector<int32_t> ids, kids;
  std::vector<int64_t> lo, hi;
  bool active() const { return !ids.empty(); }
};

// The mask tensors are validated (ops::validate_attention_*); the cu_seqlens values here.
DocMask build_doc_mask(const char* op, const AttentionArgs& a, const Dims& d) {
  DocMask m;
  const bool has_doc = a.doc_ids.defined(), has_cu = a.cu_seqlens.defined();
  if (!has_doc && !has_cu) return m;
  const int64_t n = d.b * d.s, nk = d.b * d.sk;
  if (n == 0) return m;
  m.ids.resize(static_cast<std::size_t>(n));
  if (has_doc) {
    const int32_t* p = a.doc_ids.data<int32_t>();
    std::copy(p, p + n, m.ids.begin());
    if (a.kv_doc_ids.defined()) {
      const int32_t* pk = a.kv_doc_ids.data<int32_t>();
      m.kids.assign(pk, pk + nk);
    }
  } else {
    const Tensor& cu = a.cu_seqlens;
    const int32_t* c = cu.data<int32_t>();
    const int64_t nd = cu.numel() - 1;
    ops::validate_cu_seqlens(op, {c, static_cast<std::size_t>(cu.numel())}, d.s);
    for (int64_t doc = 0; doc < nd; ++doc)
      for (int64_t s = c[doc]; s < c[doc + 1]; ++s)
        for (int64_t b = 0; b < d.b; ++b) m.ids[b * d.s + s] = static_cast<int32_t>(doc);
  }
  if (m.kids.empty()) m.kids = m.ids;  // Sk == Sq (validated)
  m.lo.resize(static_cast<std::size_t>(n));
  m.hi.resize(static_cast<std::size_t>(n));
  for (int64_t b = 0; b < d.b; ++b) {
    const int32_t* id = m.ids.data() + b * d.s;
    const int32_t* kid = m.kids.data() + b * d.sk;
    std::unordered_map<int32_t, std::pair<int64_t, int64_t>> span;  // key id -> [first, last + 1)
    for (int64_t s = 0; s < d.sk; ++s) {
      auto [it, fresh] = span.try_emplace(kid[s], s, s + 1);
      if (!fresh) it->second.second = s + 1;
    }
    for (int64_t s = 0; s < d.s; ++s) {
      const auto it = span.find(id[s]);
      const bool any = it != span.end();
      m.lo[b * d.s + s] = any ? it->second.first : 0;
      m.hi[b * d.s + s] = any ? it->second.second : 0;
    }
  }
  return m;
}

// The keys row i of batch row b may read lie in [lo, hi) (each still checked against the row's
// document by mask_row); an empty range means the row attends nothing.
struct RowRange {
  int64_t lo, hi;
};

inline RowRange row_range(const DocMask& m, bool causal, int64_t b, int64_t i, const Dims& d) {
  int64_t lo = 0, hi = causal ? std::clamp<int64_t>(i + 1 + d.sk - d.s, 0, d.sk) : d.sk;
  if (m.active()) {
    const int64_t t = b * d.s + i;
    if (m.ids[t] < 0) return {0, 0};  // padding
    lo = m.lo[t];
    hi = std::min(hi, m.hi[t]);
  }
  return {lo, std::max(lo, hi)};
}

// The factor applied to the scores: softmax_scale, or 1/sqrt(HD) when it is 0.
template <typename C>
C score_scale(const AttentionArgs& a, const Dims& d) {
  return a.softmax_scale != 0.0f ? static_cast<C>(a.softmax_scale)
                                 : C(1) / std::sqrt(static_cast<C>(d.hd));
}

// z[j] for j in r: 1/(1-p) where the attention-dropout mask keeps P[b,h,i,j], else 0. The forward
// and the backward both call this, so they see the same mask.
// Elements come four to a Philox block (philox.h), so one block serves four consecutive keys.
template <typename C>
void dropout_factors(C* z, const ops::DropoutArgs& dr, const Dims& d, int64_t b, int64_t h,
                     int64_t i, const RowRange& r) {
  const float p = dr.p;
  const C keep_scale = C(1) / (C(1) - static_cast<C>(p));
  const uint64_t row_base = dr.offset + static_cast<uint64_t>(((b * d.nh + h) * d.s + i) * d.sk);
  uint64_t cached = ~uint64_t{0};
  random::Philox4x32 blk{};
  for (int64_t j = r.lo; j < r.hi; ++j) {
    const uint64_t e = row_base + static_cast<uint64_t>(j);
    if ((e >> 2) != cached) {
      cached = e >> 2;
      blk = random::philox_block(dr.seed, cached);
    }
    // Same value as random::uniform(seed, e); tests check against random::dropout_keep.
    const float u = static_cast<float>(blk.v[e & 3] >> 8) * (1.0f / 16777216.0f);
    z[j] = u >= p ? keep_scale : C(0);
  }
}

// Widens head h's rows of x [len, B, heads, HD] into dst [len, HD] (row-major).
template <typename T, typename C>
void load_head(C* dst, const T* x, const Dims& d, int64_t len, int64_t heads, int64_t b,
               int64_t h) {
  for (int64_t s = 0; s < len; ++s) {
    const T* row = x + ((s * d.b + b) * heads + h) * d.hd;
    for (int64_t e = 0; e < d.hd; ++e) dst[s * d.hd + e] = load<C>(row[e]);
  }
}

// Query rows per block: big enough for BLAS to run near its peak, small enough that the causal
// blocks waste little on the diagonal and the [kBlock, S] score buffers stay in cache.
constexpr int64_t kBlock = 64;

// Row-major C [m, n] = alpha op(A) op(B) + beta C with single-threaded BLAS; no dimension is 0.
inline void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}
inline void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                      const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                      double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// f32 vectors and e^x: vec_math.h.
using vec::exp_v;
using vec::FV;
using vec::kLanes;
using vec::load_v;
using vec::store_v;

// The n < kLanes elements of x as a vector, -inf in the lanes past the end.
inline FV tail_v(const float* x, int64_t n) {
  float buf[kLanes];
  std::fill(buf, buf + kLanes, -std::numeric_limits<float>::infinity());
  std::copy(x, x + n, buf);
  return load_v(buf);
}

// Max of x[0, n), and x[j] = e^(x[j] - shift) returning their sum. The sums go in kLanes lanes
// combined in a fixed order, so the result depends on n only (not on alignment or threads).
template <typename C>
C row_max(const C* x, int64_t n) {
  if constexpr (std::is_same_v<C, float>) {
    FV acc = tail_v(x + n / kLanes * kLanes, n % kLanes);
    for (int64_t j = 0; j + kLanes <= n; j += kLanes) {
      const FV v = load_v(x + j);
      acc = v > acc ? v : acc;
    }
    float m = acc[0];
    for (int64_t l = 1; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
    return m;
  } else {
    C m = -std::numeric_limits<C>::infinity();
    for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
    return m;
  }
}
template <typename C>
C exp_shifted_sum(C* x, int64_t n, C shift) {  // a -inf x[j] gives 0
  if constexpr (std::is_same_v<C, float>) {
    FV acc = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      const FV v = exp_v(load_v(x + j) - shift);
      store_v(x + j, v);
      acc += v;
    }
    if (j < n) {
      const FV v = exp_v(tail_v(x + j, n - j) - shift);
      for (int64_t l = 0; l < n - j; ++l) x[j + l] = v[l];
      acc += v;
    }
    float sum = acc[0];
    for (int64_t l = 1; l < kLanes; ++l) sum += acc[l];
    return sum;
  } else {
    C sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - shift));
    return sum;
  }
}

// The key span [lo, hi) of query rows [i0, i1): the union of their row ranges (empty if every row
// is padding). rows[i - i0] receives each row's own range.
RowRange block_span(RowRange* rows, const DocMask& m, bool causal, int64_t b, int64_t i0,
                    int64_t i1, const Dims& d) {
  RowRange span{d.sk, 0};
  for (int64_t i = i0; i < i1; ++i) {
    const RowRange r = row_range(m, causal, b, i, d);
    rows[i - i0] = r;
    if (r.lo == r.hi) continue;
    span.lo = std::min(span.lo, r.lo);
    span.hi = std::max(span.hi, r.hi);
  }
  return span.lo < span.hi ? span : RowRange{0, 0};
}

// Row i's scores s[0, n) over keys [kl, kl + n): -inf outside its range r or its document.
template <typename C>
void mask_row(C* s, int64_t kl, int64_t n, const RowRange& r, const DocMask& m, int64_t b,
              int64_t i, const Dims& d) {
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  std::fill(s, s + (r.lo - kl), kNegInf);
  std::fill(s + (r.hi - kl), s + n, kNegInf);
  if (!m.active()) return;
  const int32_t* id = m.kids.data() + b * d.sk;
  const int32_t own = m.ids[b * d.s + i];
  for (int64_t j = r.lo; j < r.hi; ++j) s[j - kl] = id[j] == own ? s[j - kl] : kNegInf;
}

template <typename T>
void attention_fwd_impl(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionArgs& a, const Dims& d, const DocMask& m) {
  using C = compute_t<T>;
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  const T* qp = q.data<T>();
  const T* kp = k.data<T>();
  const T* vp = v.data<T>();
  T* op = out.data<T>();
  C* lp = lse.data<C>();
  const C scale = score_scale<C>(a, d);
  const int64_t per_group = d.nh / d.ng;
  const bool dropout = a.dropout.p > 0.0f;
  const int64_t hd = d.hd;
#pragma omp parallel
  {
    // Per thread: the head's Q [Sq, HD], K, V [Sk, HD], the block's scores / probabilities
    // [kBlock, span], its output [kBlock, HD], dropout factors over keys [Sk], the rows' key
    // ranges.
    std::vector<C> qh(d.s * hd), kh(d.sk * hd), vh(d.sk * hd), sc(kBlock * d.sk), ob(kBlock * hd);
    std::vector<C> z(dropout ? d.sk : 0);
    std::vector<RowRange> rows(kBlock);
    std::vector<C> inv(kBlock);  // 1 / the softmax sum per row; 0 for a row that attends nothing
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.b; ++b) {
      for (int64_t h = 0; h < d.nh; ++h) {
        const int64_t g = h / per_group;
        load_head<T, C>(qh.data(), qp, d, d.s, d.nh, b, h);
        load_head<T, C>(kh.data(), kp, d, d.sk, d.ng, b, g);
        load_head<T, C>(vh.data(), vp, d, d.sk, d.ng, b, g);
        C* lse_h = lp + (b * d.nh + h) * d.s;
        for (int64_t i0 = 0; i0 < d.s; i0 += kBlock) {
          const int64_t i1 = std::min(d.s, i0 + kBlock), nb = i1 - i0;
          const RowRange span = block_span(rows.data(), m, a.causal, b, i0, i1, d);
          const int64_t kl = span.lo, nk = span.hi - span.lo;
          if (nk > 0)
            blas_gemm(false, true, nb, nk, hd, scale, qh.data() + i0 * hd, hd, kh.data() + kl * hd,
                      hd, C(0), sc.data(), nk);
          for (int64_t i = i0; i < i1; ++i) {
            const RowRange& r = rows[i - i0];
            C* srow = sc.data() + (i - i0) * nk;
            C mx = kNegInf;
            if (r.lo < r.hi) {
              mask_row(srow, kl, nk, r, m, b, i, d);
              mx = row_max(srow, nk);
            }
            if (mx == kNegInf) {  // attends nothing: a padding or fully masked row
              std::fill(srow, srow + nk, C(0));
              lse_h[i] = kNegInf;
              inv[i - i0] = C(0);
              continue;
            }
            const C sum = exp_shifted_sum(srow, nk, mx);  // masked: e^-inf = 0
            lse_h[i] = mx + std::log(sum);
            inv[i - i0] = C(1) / sum;  // applied to the block's output, HD wide, not to P
            if (dropout) {
              dropout_factors(z.data(), a.dropout, d, b, h, i, r);
              for (int64_t j = r.lo; j < r.hi; ++j) srow[j - kl] *= z[j];
            }
          }
          if (nk > 0)
            blas_gemm(false, false, nb, hd, nk, C(1), sc.data(), nk, vh.data() + kl * hd, hd, C(0),
                      ob.data(), hd);
          for (int64_t i = i0; i < i1; ++i) {
            T* orow = op + ((i * d.b + b) * d.nh + h) * hd;
            const C* o = ob.data() + (i - i0) * hd;
            const C f = nk == 0 ? C(0) : inv[i - i0];  // 0: exact zeros, whatever V holds
            for (int64_t e = 0; e < hd; ++e) orow[e] = store<T>(f == C(0) ? C(0) : o[e] * f);
          }
        }
      }
    }
  }
}

template <typename T>
void attention_bwd_impl(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionArgs& a, const Dims& d, const DocMask& m) {
  using C = compute_t<T>;
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  const T* qp = q.data<T>();
  const T* kp = k.data<T>();
  const T* vp = v.data<T>();
  const T* op = out.data<T>();
  const T* dop = dout.data<T>();
  const C* lp = lse.data<C>();
  T* dqp = dq.data<T>();
  T* dkp = dk.data<T>();
  T* dvp = dv.data<T>();
  const C scale = score_scale<C>(a, d);
  const int64_t per_group = d.nh / d.ng;
  const bool dropout = a.dropout.p > 0.0f;
  const int64_t hd = d.hd, head_elems = d.sk * hd;
  // dK/dV per (b, h) [B, NH, Sk, HD], summed over each group's heads afterwards: heads run in
  // parallel and would otherwise race on their shared group.
  std::vector<C> dk_heads(d.b * d.nh * head_elems, C(0)), dv_heads(d.b * d.nh * head_elems, C(0));
#pragma omp parallel
  {
    // Per thread: the head's Q, dO [Sq, HD], K, V [Sk, HD]; the block's P (then P z) and dP (then
    // dS) [kBlock, span]; its dQ [kBlock, HD]; dropout factors [Sk]; the rows' key ranges.
    std::vector<C> qh(d.s * hd), doh(d.s * hd), kh(head_elems), vh(head_elems);
    std::vector<C> sc(kBlock * d.sk), dp(kBlock * d.sk), dqb(kBlock * hd), z(dropout ? d.sk : 0);
    std::vector<RowRange> rows(kBlock);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.b; ++b) {
      for (int64_t h = 0; h < d.nh; ++h) {
        const int64_t g = h / per_group;
        load_head<T, C>(qh.data(), qp, d, d.s, d.nh, b, h);
        load_head<T, C>(doh.data(), dop, d, d.s, d.nh, b, h);
        load_head<T, C>(kh.data(), kp, d, d.sk, d.ng, b, g);
        load_head<T, C>(vh.data(), vp, d, d.sk, d.ng, b, g);
        C* dkb = dk_heads.data() + (b * d.nh + h) * head_elems;
        C* dvb = dv_heads.data() + (b * d.nh + h) * head_elems;
        const C* lse_h = lp + (b * d.nh + h) * d.s;
        for (int64_t i0 = 0; i0 < d.s; i0 += kBlock) {
          const int64_t i1 = std::min(d.s, i0 + kBlock), nb = i1 - i0;
          const RowRange span = block_span(rows.data(), m, a.causal, b, i0, i1, d);
          const int64_t kl = span.lo, nk = span.hi - span.lo;
          if (nk == 0) {  // every row is padding: no gradient
            for (int64_t i = i0; i < i1; ++i) {
              T* dqrow = dqp + ((i * d.b + b) * d.nh + h) * hd;
              for (int64_t e = 0; e < hd; ++e) dqrow[e] = store<T>(C(0));
            }
            continue;
          }
          const C* qb = qh.data() + i0 * hd;
          const C* dob = doh.data() + i0 * hd;
          blas_gemm(false, true, nb, nk, hd, scale, qb, hd, kh.data() + kl * hd, hd, C(0),
                    sc.data(), nk);
          blas_gemm(false, true, nb, nk, hd, C(1), dob, hd, vh.data() + kl * hd, hd, C(0),
                    dp.data(), nk);
          for (int64_t i = i0; i < i1; ++i) {
            const RowRange& r = rows[i - i0];
            C* prow = sc.data() + (i - i0) * nk;
            C* dsrow = dp.data() + (i - i0) * nk;
            if (lse_h[i] == kNegInf || r.lo == r.hi) {  // the row attended nothing: no gradient
              std::fill(prow, prow + nk, C(0));
              std::fill(dsrow, dsrow + nk, C(0));
              continue;
            }
            const T* orow = op + ((i * d.b + b) * d.nh + h) * hd;
            const C* doi = dob + (i - i0) * hd;
            C di = 0;  // D_i = dO_i . O_i = sum_j P_ij dP_ij
            for (int64_t e = 0; e < hd; ++e) di += doi[e] * load<C>(orow[e]);
            mask_row(prow, kl, nk, r, m, b, i, d);
            exp_shifted_sum(prow, nk, lse_h[i]);  // P, 0 where masked
            if (dropout) {
              dropout_factors(z.data(), a.dropout, d, b, h, i, r);
              for (int64_t j = r.lo; j < r.hi; ++j) {
                const C pj = prow[j - kl], zj = z[j];
                dsrow[j - kl] = pj * (dsrow[j - kl] * zj - di) * scale;
                prow[j - kl] = pj * zj;
              }
              std::fill(dsrow, dsrow + (r.lo - kl), C(0));  // outside the row's range P = 0
              std::fill(dsrow + (r.hi - kl), dsrow + nk, C(0));
            } else {
#pragma omp simd
              for (int64_t j = 0; j < nk; ++j) dsrow[j] = prow[j] * (dsrow[j] - di) * scale;
            }
          }
          // dV += (P z)^T dO; dQ = dS K; dK += dS^T Q, over the block's key span.
          blas_gemm(true, false, nk, hd, nb, C(1), sc.data(), nk, dob, hd, C(1), dvb + kl * hd, hd);
          blas_gemm(false, false, nb, hd, nk, C(1), dp.data(), nk, kh.data() + kl * hd, hd, C(0),
                    dqb.data(), hd);
          blas_gemm(true, false, nk, hd, nb, C(1), dp.data(), nk, qb, hd, C(1), dkb + kl * hd, hd);
          for (int64_t i = i0; i < i1; ++i) {
            T* dqrow = dqp + ((i * d.b + b) * d.nh + h) * hd;
            const C* dqi = dqb.data() + (i - i0) * hd;
            for (int64_t e = 0; e < hd; ++e) dqrow[e] = store<T>(dqi[e]);
          }
        }
      }
    }
    // dk/dv [Sk, B, NG, HD] = sum over the heads of each group.
#pragma omp for collapse(2) schedule(static)
    for (int64_t s = 0; s < d.sk; ++s) {
      for (int64_t b = 0; b < d.b; ++b) {
        for (int64_t g = 0; g < d.ng; ++g) {
          T* dkrow = dkp + ((s * d.b + b) * d.ng + g) * d.hd;
          T* dvrow = dvp + ((s * d.b + b) * d.ng + g) * d.hd;
          for (int64_t e = 0; e < d.hd; ++e) {
            C sk = 0, sv = 0;
            for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
              const int64_t at = (b * d.nh + h) * head_elems + s * d.hd + e;
              sk += dk_heads[at];
              sv += dv_heads[at];
            }
            dkrow[e] = store<T>(sk);
            dvrow[e] = store<T>(sv);
          }
        }
      }
    }
  }
}

void attention_fwd(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const AttentionArgs& args) {
  const char* op = "attention_fwd";
  const Dims d = ops::validate_attention_fwd(kOnHost, out, lse, q, k, v, args);
  const DocMask m = build_doc_mask(op, args, d);
  if (q.numel() == 0) return;
  dispatch_float(q.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    attention_fwd_impl<T>(out, lse, q, k, v, args, d, m);
  });
}

void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const AttentionArgs& args) {
  const char* op = "attention_bwd";
  const Dims d = ops::validate_attention_bwd(kOnHost, dq, dk, dv, dout, q, k, v, out, lse, args);
  const DocMask m = build_doc_mask(op, args, d);
  if (q.numel() == 0) return;
  dispatch_float(q.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    attention_bwd_impl<T>(dq, dk, dv, dout, q, k, v, out, lse, args, d, m);
  });
}

// (out, lse) <- their log-sum-exp merge with (bo, bl) (op_args.h attention_merge), per row.
template <typename T>
void attention_merge_impl(Tensor& out, Tensor& lse, const Tensor& bo, const Tensor& bl,
                          const Dims& d) {
  using C = compute_t<T>;
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  T* op = out.data<T>();
  const T* bp = bo.data<T>();
  C* lp = lse.data<C>();
  const C* blp = bl.data<C>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < d.b; ++b) {
    for (int64_t h = 0; h < d.nh; ++h) {
      for (int64_t i = 0; i < d.s; ++i) {
        const int64_t li = (b * d.nh + h) * d.s + i;
        const C l1 = lp[li], l2 = blp[li];
        if (l2 == kNegInf) continue;  // the block attended nothing: keep (out, lse)
        T* o = op + ((i * d.b + b) * d.nh + h) * d.hd;
        const T* x = bp + ((i * d.b + b) * d.nh + h) * d.hd;
        if (l1 == kNegInf) {  // nothing so far: take the block's
          std::copy(x, x + d.hd, o);
          lp[li] = l2;
          continue;
        }
        const C m = std::max(l1, l2);
        const C l = m + std::log(std::exp(l1 - m) + std::exp(l2 - m));
        const C w1 = std::exp(l1 - l), w2 = std::exp(l2 - l);
        for (int64_t e = 0; e < d.hd; ++e) o[e] = store<T>(w1 * load<C>(o[e]) + w2 * load<C>(x[e]));
        lp[li] = l;
      }
    }
  }
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse) {
  const Dims d = ops::validate_attention_merge(kOnHost, out, lse, block_out, block_lse);
  if (out.numel() == 0) return;
  dispatch_float(out.dtype(), "attention_merge", [&]<typename T>(std::type_identity<T>) {
    attention_merge_impl<T>(out, lse, block_out, block_lse, d);
  });
}

}  // namespace

void register_attention_kernels(plugin::Registry& r) {
  // The kernels call BLAS inside their OpenMP loop: it must not start threads of its own (as
  // register_gemm_kernels also sets, for the reason given there).
  openblas_set_num_threads(1);
  r.register_op<ops::OpId::attention_fwd>("cpu", &attention_fwd, "cpu:omp+openblas");
  r.register_op<ops::OpId::attention_bwd>("cpu", &attention_bwd, "cpu:omp+openblas");
  r.register_op<ops::OpId::attention_merge>("cpu", &attention_merge, "cpu:omp");
}

}  // namespace mg::platforms::cpu
