// CPU scaled dot-product attention (forward and backward) on Megatron's sbhd layout, with GQA,
// causal and document masks (doc_ids or cu_seqlens) and counter-based attention dropout.
//
// Gradient rule: no parameters; dq, dk, dv are activation gradients and are written (=).
// Invariants:
//   - q, out, dq, dout [S, B, NH, HD]; k, v, dk, dv [S, B, NG, HD]; lse [B, NH, S]; all contiguous.
//     Head h reads KV group h / (NH / NG); dk/dv sum over the NH / NG heads of a group.
//   - Math in f32 for f32/bf16/f16 storage (f64 for f64); lse is f32 (f64 for f64 inputs).
//   - Masked scores are -inf, not Megatron's -10000; a row that may attend nothing (a padding token
//     with a negative doc id) gets out = 0, lse = -inf and zero gradients, never NaN.
//   - Dropout on the probabilities: P[b,h,i,j] is kept iff
//     random::dropout_keep(seed, offset + ((b*NH + h)*S + i)*S + j, p) and scaled by 1/(1-p); the
//     backward regenerates the same mask. The backward uses D_i = dO_i . O_i, which holds with
//     dropout too, so out must be the forward's output.
// Algorithm: one (b, h) per OpenMP task, then row by row with the whole key row in a buffer (an
// exact softmax, not a flash-style online one): Q/K/V of the head are widened to the compute type
// once, K and V are kept transposed so the score and dO.V loops are unit-stride over keys.
// Not done here: sequence lengths differing between q and k/v, non-contiguous (bshd) layouts,
// attention bias or sliding windows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/random/philox.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using ops::AttentionArgs;
using Dims = ops::AttentionDims;

// Document of every token ([B*S], empty when there is no document mask) and, per token, the key
// range [lo, hi) that holds every token of its document, so rows scan only that range.
struct DocMask {
  std::vector<int32_t> ids;
  std::vector<int64_t> lo, hi;
  bool active() const { return !ids.empty(); }
};

// The mask tensors are validated (ops::validate_attention_*); the cu_seqlens values here.
DocMask build_doc_mask(const char* op, const AttentionArgs& a, const Dims& d) {
  DocMask m;
  const bool has_doc = a.doc_ids.defined(), has_cu = a.cu_seqlens.defined();
  if (!has_doc && !has_cu) return m;
  const int64_t n = d.b * d.s;
  if (n == 0) return m;
  m.ids.resize(static_cast<std::size_t>(n));
  if (has_doc) {
    const int32_t* p = a.doc_ids.data<int32_t>();
    std::copy(p, p + n, m.ids.begin());
  } else {
    const Tensor& cu = a.cu_seqlens;
    const int32_t* c = cu.data<int32_t>();
    const int64_t nd = cu.numel() - 1;
    ops::validate_cu_seqlens(op, {c, static_cast<std::size_t>(cu.numel())}, d.s);
    for (int64_t doc = 0; doc < nd; ++doc)
      for (int64_t s = c[doc]; s < c[doc + 1]; ++s)
        for (int64_t b = 0; b < d.b; ++b) m.ids[b * d.s + s] = static_cast<int32_t>(doc);
  }
  m.lo.resize(static_cast<std::size_t>(n));
  m.hi.resize(static_cast<std::size_t>(n));
  for (int64_t b = 0; b < d.b; ++b) {
    const int32_t* id = m.ids.data() + b * d.s;
    std::unordered_map<int32_t, std::pair<int64_t, int64_t>> span;  // id -> [first, last + 1)
    for (int64_t s = 0; s < d.s; ++s) {
      auto [it, fresh] = span.try_emplace(id[s], s, s + 1);
      if (!fresh) it->second.second = s + 1;
    }
    for (int64_t s = 0; s < d.s; ++s) {
      const auto& r = span.at(id[s]);
      m.lo[b * d.s + s] = r.first;
      m.hi[b * d.s + s] = r.second;
    }
  }
  return m;
}

// The keys row i of batch row b may read lie in [lo, hi) (each still checked with allowed());
// an empty range means the row attends nothing.
struct RowRange {
  int64_t lo, hi;
};

inline RowRange row_range(const DocMask& m, bool causal, int64_t b, int64_t i, const Dims& d) {
  int64_t lo = 0, hi = causal ? i + 1 : d.s;
  if (m.active()) {
    const int64_t t = b * d.s + i;
    if (m.ids[t] < 0) return {0, 0};  // padding
    lo = m.lo[t];
    hi = std::min(hi, m.hi[t]);
  }
  return {lo, std::max(lo, hi)};
}

inline bool allowed(const DocMask& m, int64_t b, int64_t i, int64_t j, int64_t s) {
  return !m.active() || m.ids[b * s + j] == m.ids[b * s + i];
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
  const uint64_t row_base = dr.offset + static_cast<uint64_t>(((b * d.nh + h) * d.s + i) * d.s);
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

// Widens head h's rows of x [S, B, heads, HD] into dst [S, HD] (row-major) or [HD, S] (transposed).
template <typename T, typename C>
void load_head(C* dst, const T* x, const Dims& d, int64_t heads, int64_t b, int64_t h,
               bool transpose) {
  for (int64_t s = 0; s < d.s; ++s) {
    const T* row = x + ((s * d.b + b) * heads + h) * d.hd;
    if (transpose)
      for (int64_t e = 0; e < d.hd; ++e) dst[e * d.s + s] = load<C>(row[e]);
    else
      for (int64_t e = 0; e < d.hd; ++e) dst[s * d.hd + e] = load<C>(row[e]);
  }
}

// sc[j] = sum_e qi[e] * kt[e, j] for j in [lo, hi): unit stride over keys, so it vectorises.
template <typename C>
inline void row_scores(C* sc, const C* qi, const C* kt, int64_t s, int64_t hd, int64_t lo,
                       int64_t hi) {
  for (int64_t j = lo; j < hi; ++j) sc[j] = 0;
  for (int64_t e = 0; e < hd; ++e) {
    const C qe = qi[e];
    const C* kr = kt + e * s;
#pragma omp simd
    for (int64_t j = lo; j < hi; ++j) sc[j] += qe * kr[j];
  }
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
#pragma omp parallel
  {
    std::vector<C> qh(d.s * d.hd), kt(d.hd * d.s), vh(d.s * d.hd), sc(d.s), z(d.s), o(d.hd);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.b; ++b) {
      for (int64_t h = 0; h < d.nh; ++h) {
        const int64_t g = h / per_group;
        load_head<T, C>(qh.data(), qp, d, d.nh, b, h, false);
        load_head<T, C>(kt.data(), kp, d, d.ng, b, g, true);
        load_head<T, C>(vh.data(), vp, d, d.ng, b, g, false);
        for (int64_t i = 0; i < d.s; ++i) {
          T* orow = op + ((i * d.b + b) * d.nh + h) * d.hd;
          C* lse_i = lp + (b * d.nh + h) * d.s + i;
          const RowRange r = row_range(m, a.causal, b, i, d);
          row_scores(sc.data(), qh.data() + i * d.hd, kt.data(), d.s, d.hd, r.lo, r.hi);
          C mx = kNegInf;
          for (int64_t j = r.lo; j < r.hi; ++j) {
            sc[j] = allowed(m, b, i, j, d.s) ? sc[j] * scale : kNegInf;
            mx = std::max(mx, sc[j]);
          }
          if (mx == kNegInf) {  // attends nothing: a padding row
            for (int64_t e = 0; e < d.hd; ++e) orow[e] = store<T>(C(0));
            *lse_i = kNegInf;
            continue;
          }
          C sum = 0;
          for (int64_t j = r.lo; j < r.hi; ++j) {
            sc[j] = std::exp(sc[j] - mx);  // masked: exp(-inf) = 0
            sum += sc[j];
          }
          *lse_i = mx + std::log(sum);
          const C inv = C(1) / sum;
          if (dropout) dropout_factors(z.data(), a.dropout, d, b, h, i, r);
          std::fill(o.begin(), o.end(), C(0));
          for (int64_t j = r.lo; j < r.hi; ++j) {
            const C pj = sc[j] * inv * (dropout ? z[j] : C(1));
            if (pj == C(0)) continue;
            const C* vr = vh.data() + j * d.hd;
#pragma omp simd
            for (int64_t e = 0; e < d.hd; ++e) o[e] += pj * vr[e];
          }
          for (int64_t e = 0; e < d.hd; ++e) orow[e] = store<T>(o[e]);
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
  const int64_t head_elems = d.s * d.hd;
  // dK/dV per (b, h) [B, NH, S, HD], summed over each group's heads afterwards: heads run in
  // parallel and would otherwise race on their shared group.
  std::vector<C> dk_heads(d.b * d.nh * head_elems, C(0)), dv_heads(d.b * d.nh * head_elems, C(0));
#pragma omp parallel
  {
    std::vector<C> qh(head_elems), kh(head_elems), kt(head_elems), vt(head_elems), doh(head_elems);
    std::vector<C> sc(d.s), dp(d.s), z(d.s), dqi(d.hd);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.b; ++b) {
      for (int64_t h = 0; h < d.nh; ++h) {
        const int64_t g = h / per_group;
        load_head<T, C>(qh.data(), qp, d, d.nh, b, h, false);
        load_head<T, C>(doh.data(), dop, d, d.nh, b, h, false);
        load_head<T, C>(kh.data(), kp, d, d.ng, b, g, false);
        load_head<T, C>(kt.data(), kp, d, d.ng, b, g, true);
        load_head<T, C>(vt.data(), vp, d, d.ng, b, g, true);
        C* dkb = dk_heads.data() + (b * d.nh + h) * head_elems;
        C* dvb = dv_heads.data() + (b * d.nh + h) * head_elems;
        for (int64_t i = 0; i < d.s; ++i) {
          T* dqrow = dqp + ((i * d.b + b) * d.nh + h) * d.hd;
          const C lse_i = lp[(b * d.nh + h) * d.s + i];
          const RowRange r = row_range(m, a.causal, b, i, d);
          if (lse_i == kNegInf || r.lo == r.hi) {  // the row attended nothing: no gradient
            for (int64_t e = 0; e < d.hd; ++e) dqrow[e] = store<T>(C(0));
            continue;
          }
          const C* qi = qh.data() + i * d.hd;
          const C* doi = doh.data() + i * d.hd;
          const T* orow = op + ((i * d.b + b) * d.nh + h) * d.hd;
          C di = 0;  // D_i = dO_i . O_i = sum_j P_ij dP_ij
          for (int64_t e = 0; e < d.hd; ++e) di += doi[e] * load<C>(orow[e]);
          row_scores(sc.data(), qi, kt.data(), d.s, d.hd, r.lo, r.hi);
          row_scores(dp.data(), doi, vt.data(), d.s, d.hd, r.lo, r.hi);
          if (dropout) dropout_factors(z.data(), a.dropout, d, b, h, i, r);
          std::fill(dqi.begin(), dqi.end(), C(0));
          for (int64_t j = r.lo; j < r.hi; ++j) {
            if (!allowed(m, b, i, j, d.s)) continue;
            const C pj = std::exp(sc[j] * scale - lse_i);
            const C zj = dropout ? z[j] : C(1);
            const C pz = pj * zj;
            const C ds = pj * (dp[j] * zj - di);
            C* dvr = dvb + j * d.hd;
            C* dkr = dkb + j * d.hd;
            const C* kr = kh.data() + j * d.hd;
            const C dss = ds * scale;
#pragma omp simd
            for (int64_t e = 0; e < d.hd; ++e) {
              dvr[e] += pz * doi[e];
              dqi[e] += dss * kr[e];
              dkr[e] += dss * qi[e];
            }
          }
          for (int64_t e = 0; e < d.hd; ++e) dqrow[e] = store<T>(dqi[e]);
        }
      }
    }
    // dk/dv [S, B, NG, HD] = sum over the heads of each group.
#pragma omp for collapse(2) schedule(static)
    for (int64_t s = 0; s < d.s; ++s) {
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

}  // namespace

void register_attention_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::attention_fwd>("cpu", &attention_fwd, "cpu:omp");
  r.register_op<ops::OpId::attention_bwd>("cpu", &attention_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
