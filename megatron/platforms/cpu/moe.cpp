// CPU MoE token permutation (op_list.h moe_permute / moe_unpermute / moe_unpermute_bwd): the rows
// a MoE layer sends to its experts, gathered from the tokens in expert-major order, and the
// probability-weighted sum that brings the expert outputs back to their tokens. And the router
// (moe_router_topk / moe_router_topk_bwd): the host routing math of transformer/moe/moe_utils.h
// (topk_routing, topk_routing_backward, the one f64 implementation in megatron_core) on the op's
// host tensors, so the op's results are that code's bit for bit. And the shared-expert gate
// (moe_shared_gate_fwd / _bwd): the f64 arithmetic the MoE layer did on the host before it was an
// op, in the same order (serial loops). And the dispatch's index lists (moe_dispatch_index,
// moe_chunk_order): the layer's former host counting sorts, serial.
//
// Gradient rule: activation gradients are written (=): drows, dprob, and moe_unpermute's out
// (which is moe_permute's backward). Numerics: every sum in f64, rounded once to the output's
// dtype, in the order the op defines (a token's rows as token_rows lists them; dprob over j
// ascending), without FMA contraction (-ffp-contract=off for this file, megatron/CMakeLists.txt),
// so the results equal the MoE layer's former host arithmetic bit for bit and do not depend on the
// thread count (each output row is one thread's).
// Not here: index values are checked from the host tensors (every call), CUDA's kernels do not.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

std::span<const int64_t> i64_span(const Tensor& t) {
  return {t.data<int64_t>(), static_cast<std::size_t>(t.numel())};
}

// rows[i] = x[index[i]]
void moe_permute(Tensor& rows, const Tensor& x, const Tensor& index) {
  constexpr const char* op = "moe_permute";
  const ops::MoePermuteDims d = ops::validate_moe_permute(kOnHost, rows, x, index);
  const auto idx = i64_span(index);
  ops::validate_moe_indices(op, "index", idx, d.t);
  const std::size_t row_bytes = static_cast<std::size_t>(d.h) * dtype_size(x.dtype());
  const auto* src = static_cast<const unsigned char*>(x.raw_data());
  auto* dst = static_cast<unsigned char*>(rows.raw_data());
#pragma omp parallel for schedule(static) if (d.r * d.h >= kParallelMinElements)
  for (int64_t i = 0; i < d.r; ++i)
    std::memcpy(dst + static_cast<std::size_t>(i) * row_bytes,
                src + static_cast<std::size_t>(idx[static_cast<std::size_t>(i)]) * row_bytes,
                row_bytes);
}

// out[t] = sum of prob[i] * rows[i] over the token's rows, in f64
void moe_unpermute(Tensor& out, const Tensor& rows, const Tensor& prob, const Tensor& offsets,
                   const Tensor& token_rows) {
  constexpr const char* op = "moe_unpermute";
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute(kOnHost, out, rows, prob, offsets, token_rows);
  const auto off = i64_span(offsets);
  const auto tr = i64_span(token_rows);
  MG_CHECK(off[0] == 0 && off[static_cast<std::size_t>(d.t)] == d.r,
           op << ": offsets must run from 0 to " << d.r << ", got " << off[0] << " .. "
              << off[static_cast<std::size_t>(d.t)]);
  for (int64_t t = 0; t < d.t; ++t)
    MG_CHECK(off[static_cast<std::size_t>(t)] <= off[static_cast<std::size_t>(t + 1)],
             op << ": offsets decrease at token " << t);
  ops::validate_moe_indices(op, "token_rows", tr, d.r);
  const double* p = prob.defined() ? prob.data<double>() : nullptr;
  const int64_t h = d.h;
  dispatch_float(out.dtype(), op, [&]<typename TO>(std::type_identity<TO>) {
    dispatch_float(rows.dtype(), op, [&]<typename TR>(std::type_identity<TR>) {
      TO* o = out.data<TO>();
      const TR* rv = rows.data<TR>();
#pragma omp parallel if (d.t * h >= kParallelMinElements)
      {
        std::vector<double> acc(static_cast<std::size_t>(h));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < d.t; ++t) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t k = off[static_cast<std::size_t>(t)];
               k < off[static_cast<std::size_t>(t + 1)]; ++k) {
            const int64_t i = tr[static_cast<std::size_t>(k)];
            const double w = p ? p[i] : 1.0;
            const TR* src = rv + i * h;
            for (int64_t j = 0; j < h; ++j) acc[j] += w * load<double>(src[j]);
          }
          TO* dst = o + t * h;
          for (int64_t j = 0; j < h; ++j) dst[j] = store_from<TO>(acc[j]);
        }
      }
    });
  });
}

// drows[i] = prob[i] * dout[index[i]]; dprob[i] = dout[index[i]] . rows[i]
void moe_unpermute_bwd(Tensor& drows, Tensor& dprob, const Tensor& dout, const Tensor& rows,
                       const Tensor& prob, const Tensor& index) {
  constexpr const char* op = "moe_unpermute_bwd";
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute_bwd(kOnHost, drows, dprob, dout, rows, prob, index);
  const auto idx = i64_span(index);
  ops::validate_moe_indices(op, "index", idx, d.t);
  const double* p = prob.defined() ? prob.data<double>() : nullptr;
  const int64_t h = d.h;
  dispatch_float(dout.dtype(), op, [&]<typename TD>(std::type_identity<TD>) {
    const TD* dy = dout.data<TD>();
    if (drows.defined())
      dispatch_float(drows.dtype(), op, [&]<typename TR>(std::type_identity<TR>) {
        TR* dr = drows.data<TR>();
#pragma omp parallel for schedule(static) if (d.r * h >= kParallelMinElements)
        for (int64_t i = 0; i < d.r; ++i) {
          const double w = p ? p[i] : 1.0;
          const TD* src = dy + idx[static_cast<std::size_t>(i)] * h;
          for (int64_t j = 0; j < h; ++j) dr[i * h + j] = store_from<TR>(w * load<double>(src[j]));
        }
      });
    if (dprob.defined())
      dispatch_float(rows.dtype(), op, [&]<typename TR>(std::type_identity<TR>) {
        const TR* rv = rows.data<TR>();
        double* dp = dprob.data<double>();
#pragma omp parallel for schedule(static) if (d.r * h >= kParallelMinElements)
        for (int64_t i = 0; i < d.r; ++i) {
          const TD* src = dy + idx[static_cast<std::size_t>(i)] * h;
          double dot = 0.0;
          for (int64_t j = 0; j < h; ++j) dot += load<double>(src[j]) * load<double>(rv[i * h + j]);
          dp[i] = dot;
        }
      });
  });
}

// The stable counting sort of the chosen experts (moe_dispatch_index), serial: the MoE layer's
// former host loops (rows per expert in choice order; each token's rows ascending).
void moe_dispatch_index(Tensor& counts, Tensor& choice_counts, Tensor& row_choice,
                        Tensor& row_token, Tensor& choice_offsets, Tensor& choice_rows,
                        Tensor& token_offsets, Tensor& token_rows, const Tensor& expert,
                        const Tensor& kept, const ops::MoeDispatchArgs& args) {
  constexpr const char* op = "moe_dispatch_index";
  const ops::MoeDispatchDims d = ops::validate_moe_dispatch_index(
      kOnHost, counts, choice_counts, row_choice, row_token, choice_offsets, choice_rows,
      token_offsets, token_rows, expert, kept, args);
  const auto ex = i64_span(expert);
  const int64_t n = d.n, k = d.k, l = d.l, first = args.first_expert;
  const int64_t c0 = args.count_first, c1 = args.count_first + args.count_num;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = ex[static_cast<std::size_t>(i)];
    MG_CHECK(e >= 0, op << ": expert[" << i << "] = " << e << " is negative");
    MG_CHECK(d.e == 0 || i < c0 || i >= c1 || e < d.e, op << ": expert[" << i << "] = " << e
                                                          << " is outside choice_counts' " << d.e
                                                          << " experts");
  }
  const uint8_t* kp = kept.defined() ? kept.data<uint8_t>() : nullptr;
  auto selected = [&](int64_t i) {
    const int64_t e = ex[static_cast<std::size_t>(i)];
    return (kp == nullptr || kp[i] != 0) && e >= first && e < first + l;
  };
  int64_t* c = counts.data<int64_t>();
  std::fill(c, c + l, int64_t{0});
  for (int64_t i = 0; i < n; ++i)
    if (selected(i)) ++c[ex[static_cast<std::size_t>(i)] - first];
  // Rows: expert-major, choices ascending within an expert.
  std::vector<int64_t> next(static_cast<std::size_t>(l)), row_of(static_cast<std::size_t>(n), -1);
  int64_t r = 0;
  for (int64_t e = 0; e < l; ++e) {
    next[static_cast<std::size_t>(e)] = r;
    r += c[e];
  }
  int64_t* rc = row_choice.data<int64_t>();
  int64_t* rt = row_token.data<int64_t>();
  std::fill(rc, rc + n, int64_t{-1});
  std::fill(rt, rt + n, int64_t{-1});
  for (int64_t i = 0; i < n; ++i)
    if (selected(i)) {
      const int64_t row = next[static_cast<std::size_t>(ex[static_cast<std::size_t>(i)] - first)]++;
      rc[row] = i;
      rt[row] = i / k;
      row_of[static_cast<std::size_t>(i)] = row;
    }
  // Each choice's row, and each token's rows ascending (a token's experts are distinct, but the
  // sort makes no use of that).
  int64_t* co = choice_offsets.data<int64_t>();
  int64_t* cr = choice_rows.data<int64_t>();
  int64_t* to = token_offsets.data<int64_t>();
  int64_t* tr = token_rows.data<int64_t>();
  std::fill(cr, cr + n, int64_t{-1});
  std::fill(tr, tr + n, int64_t{-1});
  int64_t m = 0;
  co[0] = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (row_of[static_cast<std::size_t>(i)] >= 0) cr[m++] = row_of[static_cast<std::size_t>(i)];
    co[i + 1] = m;
  }
  std::vector<int64_t> mine;
  for (int64_t t = 0; t < d.tokens; ++t) {
    to[t] = co[t * k];
    mine.assign(cr + co[t * k], cr + co[(t + 1) * k]);
    std::sort(mine.begin(), mine.end());
    std::copy(mine.begin(), mine.end(), tr + co[t * k]);
  }
  to[d.tokens] = co[n];
  if (choice_counts.defined()) {
    int64_t* cc = choice_counts.data<int64_t>();
    std::fill(cc, cc + d.g * d.e, int64_t{0});
    for (int64_t i = c0; i < c1; ++i)
      ++cc[((i - c0) / k) % d.g * d.e + ex[static_cast<std::size_t>(i)]];
  }
}

// The received rows' [source][local expert] chunks in [local expert][source] order
// (moe_chunk_order), serial.
void moe_chunk_order(Tensor& order, Tensor& inverse, const Tensor& counts) {
  constexpr const char* op = "moe_chunk_order";
  ops::validate_moe_chunk_order(kOnHost, order, inverse, counts);
  const int64_t ep = counts.size(0), l = counts.size(1), r = order.size(0);
  const int64_t* c = counts.data<int64_t>();
  std::vector<int64_t> start(static_cast<std::size_t>(ep * l));
  int64_t off = 0;
  for (int64_t j = 0; j < ep * l; ++j) {
    MG_CHECK(c[j] >= 0,
             op << ": counts[" << j / l << ", " << j % l << "] = " << c[j] << " is negative");
    start[static_cast<std::size_t>(j)] = off;
    off += c[j];
  }
  MG_CHECK(off == r, op << ": the counts sum to " << off << " rows, order has " << r);
  int64_t* o = order.data<int64_t>();
  int64_t* inv = inverse.data<int64_t>();
  int64_t q = 0;
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = 0; j < ep; ++j)
      for (int64_t x = 0; x < c[j * l + i]; ++x, ++q) {
        o[q] = start[static_cast<std::size_t>(j * l + i)] + x;
        inv[o[q]] = q;
      }
}

namespace moe = transformer::moe;

template <typename T>
void write(Tensor& out, const std::vector<T>& v) {
  std::copy(v.begin(), v.end(), out.data<T>());
}

void moe_router_topk(Tensor& expert, Tensor& prob, Tensor& kept, Tensor& scores,
                     Tensor& tokens_per_expert, Tensor& expert_counts, Tensor& aux_sums,
                     Tensor& z_sum, const Tensor& logits, const Tensor& expert_bias,
                     const ops::MoeRouterArgs& args) {
  const ops::MoeRouterDims d =
      ops::validate_moe_router_topk(kOnHost, expert, prob, kept, scores, tokens_per_expert,
                                    expert_counts, aux_sums, z_sum, logits, expert_bias, args);
  const std::vector<double> l = logits.to_vector<double>();
  const std::vector<float> bias =
      expert_bias.defined() ? expert_bias.to_vector<float>() : std::vector<float>{};
  const moe::RouterOptions o = moe::RouterOptions::from_op_args(args, d.e);
  const moe::Routing r = moe::topk_routing(l, d.t, o, expert_bias.defined() ? &bias : nullptr);
  write(expert, r.expert);
  write(prob, r.prob);
  write(kept, r.kept);
  write(scores, r.scores);
  if (tokens_per_expert.defined()) write(tokens_per_expert, r.tokens_per_expert);
  if (expert_counts.defined()) {
    int64_t* c = expert_counts.data<int64_t>();
    std::fill(c, c + d.e, int64_t{0});
    for (int64_t i = 0; i < d.t * d.k; ++i)
      if (r.kept[static_cast<std::size_t>(i)]) ++c[r.expert[static_cast<std::size_t>(i)]];
  }
  if (aux_sums.defined()) {
    // The load-balancing losses' sums (moe_utils.cpp's order: tokens ascending per entry).
    const int64_t g = aux_sums.size(0);
    const std::vector<double> aux = moe::aux_loss_scores(l, d.t, d.e, o.score_function);
    std::vector<double> sums(static_cast<std::size_t>(g * d.e), 0.0);
    for (int64_t t = 0; t < d.t; ++t)
      for (int64_t e = 0; e < d.e; ++e) sums[(t % g) * d.e + e] += aux[t * d.e + e];
    write(aux_sums, sums);
  }
  if (z_sum.defined()) z_sum.data<double>()[0] = moe::z_loss_sum(l, d.t, d.e);
}

void moe_router_topk_bwd(Tensor& dlogits, const Tensor& dprob, const Tensor& aux_dscores,
                         const Tensor& logits, const Tensor& expert, const Tensor& prob,
                         const Tensor& kept, const Tensor& scores, const ops::MoeRouterArgs& args) {
  constexpr const char* op = "moe_router_topk_bwd";
  const ops::MoeRouterDims d = ops::validate_moe_router_topk_bwd(
      kOnHost, dlogits, dprob, aux_dscores, logits, expert, prob, kept, scores, args);
  moe::Routing r;
  r.num_tokens = d.t;
  r.num_experts = d.e;
  r.topk = d.k;
  r.expert = expert.to_vector<int64_t>();
  ops::validate_moe_indices(op, "expert", r.expert, d.e);
  r.prob = prob.to_vector<double>();
  r.kept = kept.to_vector<uint8_t>();
  r.scores = scores.to_vector<double>();
  const std::vector<double> l = logits.to_vector<double>();
  const moe::RouterOptions o = moe::RouterOptions::from_op_args(args, d.e);
  // The MoE layer's former host order: the routing's gradient, the load-balancing scores', the
  // z-loss's, each added (+=) to the one f64 buffer.
  std::vector<double> dl(static_cast<std::size_t>(d.t * d.e), 0.0);
  moe::topk_routing_backward(r, l, dprob.to_vector<double>(), o, dl);
  if (aux_dscores.defined()) {
    const int64_t g = aux_dscores.size(0);
    const std::vector<double> rows = aux_dscores.to_vector<double>();
    std::vector<double> ds(static_cast<std::size_t>(d.t * d.e));
    for (int64_t t = 0; t < d.t; ++t)
      std::copy_n(rows.begin() + (t % g) * d.e, d.e, ds.begin() + t * d.e);
    moe::aux_loss_scores_backward(l, moe::aux_loss_scores(l, d.t, d.e, o.score_function), ds, d.t,
                                  d.e, o.score_function, dl);
  }
  if (args.z_loss_coeff > 0.0) moe::z_loss(l, d.t, d.e, args.z_loss_coeff, args.z_loss_scale, &dl);
  write(dlogits, dl);
}

// ---- shared-expert gate: the arithmetic the MoE layer did on the host, as ops ----

// t's elements widened to f64 (exact for every kernel float).
std::vector<double> widen(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  convert_host(v.data(), DType::f64, t.raw_data(), t.dtype(), v.size());
  return v;
}
// v rounded into t (Tensor::from_vector's conversion).
void narrow_into(Tensor& t, const std::vector<double>& v) {
  convert_host(t.raw_data(), t.dtype(), v.data(), DType::f64, v.size());
}

// out = y + sigmoid(x . w) * z per token, gate = the sigmoid (f64; serial loops: the order the
// op list gives, which the CUDA kernels follow per token).
void moe_shared_gate_fwd(Tensor& out, Tensor& gate, const Tensor& y, const Tensor& z,
                         const Tensor& x, const Tensor& w) {
  const ops::MoeSharedGateDims d =
      ops::validate_moe_shared_gate_fwd(kOnHost, out, gate, y, z, x, w);
  const int64_t t_n = d.t, h = d.h;
  std::vector<double> acc = widen(y);
  const std::vector<double> zh = widen(z), xh = widen(x), wh = widen(w);
  double* g_out = gate.data<double>();
  for (int64_t t = 0; t < t_n; ++t) {
    double g = 0.0;
    for (int64_t j = 0; j < h; ++j) g += xh[t * h + j] * wh[j];
    const double sig = 1.0 / (1.0 + std::exp(-g));
    g_out[t] = sig;
    for (int64_t j = 0; j < h; ++j) acc[t * h + j] += sig * zh[t * h + j];
  }
  narrow_into(out, acc);
}

// dz = g dy, dg = (dy . z) g (1 - g), dx = dg w, dw = sum_t dg x_t.
void moe_shared_gate_bwd(Tensor& dz, Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& z,
                         const Tensor& x, const Tensor& w, const Tensor& gate) {
  const ops::MoeSharedGateDims d =
      ops::validate_moe_shared_gate_bwd(kOnHost, dz, dx, dw, dy, z, x, w, gate);
  const int64_t t_n = d.t, h = d.h;
  const std::vector<double> dyh = widen(dy), zh = widen(z), xh = widen(x), wh = widen(w);
  const double* g_in = gate.data<double>();
  std::vector<double> dzv(dyh.size()), dxv(dyh.size());
  double* dwp = dw.data<double>();
  std::fill(dwp, dwp + h, 0.0);
  for (int64_t t = 0; t < t_n; ++t) {
    const double sig = g_in[t];
    double dot = 0.0;
    for (int64_t j = 0; j < h; ++j) {
      dzv[t * h + j] = sig * dyh[t * h + j];
      dot += dyh[t * h + j] * zh[t * h + j];
    }
    const double dg = dot * sig * (1.0 - sig);
    for (int64_t j = 0; j < h; ++j) {
      dwp[j] += dg * xh[t * h + j];
      dxv[t * h + j] = dg * wh[j];
    }
  }
  narrow_into(dz, dzv);
  narrow_into(dx, dxv);
}

}  // namespace

void register_moe_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::moe_router_topk>("cpu", &moe_router_topk, "cpu:host");
  r.register_op<ops::OpId::moe_router_topk_bwd>("cpu", &moe_router_topk_bwd, "cpu:host");
  r.register_op<ops::OpId::moe_permute>("cpu", &moe_permute, "cpu:omp");
  r.register_op<ops::OpId::moe_unpermute>("cpu", &moe_unpermute, "cpu:omp");
  r.register_op<ops::OpId::moe_unpermute_bwd>("cpu", &moe_unpermute_bwd, "cpu:omp");
  r.register_op<ops::OpId::moe_dispatch_index>("cpu", &moe_dispatch_index, "cpu:host");
  r.register_op<ops::OpId::moe_chunk_order>("cpu", &moe_chunk_order, "cpu:host");
  r.register_op<ops::OpId::moe_shared_gate_fwd>("cpu", &moe_shared_gate_fwd, "cpu:host");
  r.register_op<ops::OpId::moe_shared_gate_bwd>("cpu", &moe_shared_gate_bwd, "cpu:host");
}

}  // namespace mg::platforms::cpu
