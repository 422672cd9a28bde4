// CPU FP8 dot-product attention and dequantisation (docs/fp8.md "FP8 attention"): the reference of
// Transformer Engine's fp8_dpa, computing the logical graph of cuDNN's FP8 SDPA (the frontend's
// sdpa_fp8 / sdpa_fp8_backward nodes) with every rounding defined, so that an independent
// implementation (tests/fixtures/fp8/gen_fp8_attention_fixture.py: numpy + ml_dtypes) reproduces it
// bit for bit.
//
// Notation: x8 an FP8 tensor, f(x8) its value (exact in f64), cast(v) the saturating
// round-to-nearest-even cast of fp8_cast_transpose into the named format, "." an f32 product
// evaluated left to right, dot(a, b) = sum of f(a) f(b) accumulated in f64 in index order, then
// rounded once to f32 (products of FP8 values are exact in f64, and so are the sums whenever the
// terms span fewer than 53 bits: real tensors' sums do not depend on the order). Scales (device
// scalars): (QKV, S, O) = fwd_scale[0..2] with their inverses fwd_scale_inv, (dO, dP, dQKV) =
// bwd_scale[0..2] and bwd_scale_inv. Row i of head h attends key j iff causal => j <= i; head h
// reads KV group g = h / (NH / NG); c = softmax_scale (0: 1 / sqrt(HD)).
//
// Forward (per batch row b, head h, query i):
//   s_ij  = dot(q_i, k_j) . c . qkv_inv . qkv_inv            (cuDNN: bmm1, attn_scale, descales)
//   m_i   = max_j s_ij;  e_ij = f32(exp(f64(s_ij - m_i)));  l_i = f32(sum_j f64(e_ij))
//   p_ij  = e_ij / l_i;  lse_i = f32(f64(m_i) + log(f64(l_i)))   (cuDNN's Stats)
//   amax[0] = max p (amax_S, before scaling);  p8_ij = cast_q(p_ij . S)
//   o_i   = (sum_j f(p8_ij) f(v_j) in f64 -> f32) . S_inv . qkv_inv
//   amax[1] = max |o| (amax_O);  out_i = cast_q(o_i . O)
// Backward (the forward's scales, the gradient's; cast_g: dout's format):
//   D_i   = dot(dout_i, out_i) . dO_inv . O_inv
//   p_ij  = f32(exp(f64(s_ij - lse_i))) (s_ij as above);  p8_ij = cast_q(p_ij . S)
//   dv_j  = (sum over the group's heads and i of f(p8_ij) f(dout_i)) . S_inv . dO_inv
//   ds_ij = (dot(dout_i, v_j) . dO_inv . qkv_inv - D_i) . p_ij . c
//   amax[0] = max |ds| (amax_dP);  ds8_ij = cast_g(ds_ij . dP)
//   dq_i  = (sum_j f(ds8_ij) f(k_j)) . dP_inv . qkv_inv;  dk_j = (sum over the group's heads and i
//           of f(ds8_ij) f(q_i)) . dP_inv . qkv_inv
//   amax[1..3] = max |dq|, max |dk|, max |dv|;  dq8 = cast_g(dq . dQKV), likewise dk8, dv8
// Masked pairs have p = 0 and ds = 0. NaN propagates into the amaxes (the recipe then keeps its
// scale). cuDNN's flash kernel quantises exp(s - running max) unnormalised and sums in its own
// order: its results lie within the bound cuda_fp8_attention_test derives, not bit for bit.
//
// Compiled without FMA contraction (-ffp-contract=off, megatron/CMakeLists.txt): each f32
// product and difference above is rounded as written.
// Parallel: the forward one (b, h) per OpenMP iteration, the backward one (b, KV group) (dk and dv
// sum over the group's heads); each output element is computed by one thread in a fixed order,
// per-task amaxes combined in task order: results do not depend on the thread count.
// fp8_dequantize: y = f32(f(q) * scale_inv) rounded once to y's dtype.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/dtype_math.h"
#include "megatron/platforms/cpu/fp8_codec.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

// An sbhd FP8 tensor [S, B, heads, HD] widened to f64, as [b][head][s][d] (exact).
std::vector<double> widen_bhsd(const Tensor& t) {
  const int64_t s = t.size(0), b = t.size(1), nh = t.size(2), hd = t.size(3);
  const Fp8Codec codec(t.dtype());
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < s; ++i)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t d = 0; d < hd; ++d)
          out[static_cast<std::size_t>(((bb * nh + h) * s + i) * hd + d)] =
              codec.decode(p[((i * b + bb) * nh + h) * hd + d]);
  return out;
}

// Element (i, b, h, d) of an sbhd tensor [S, B, NH, HD].
inline int64_t sbhd(int64_t i, int64_t bb, int64_t h, int64_t d, int64_t b, int64_t nh,
                    int64_t hd) {
  return ((i * b + bb) * nh + h) * hd + d;
}

inline float dot_f32(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return static_cast<float>(acc);
}

struct Scales {
  float qkv_inv, s, s_inv, o, o_inv;  // forward
  float do_inv, dp, dp_inv, dqkv;     // backward
};

Scales read_scales(const Tensor& fwd, const Tensor& fwd_inv, const Tensor* bwd,
                   const Tensor* bwd_inv) {
  const float* f = fwd.data<float>();
  const float* fi = fwd_inv.data<float>();
  Scales s{fi[0], f[1], fi[1], f[2], fi[2], 0.0f, 0.0f, 0.0f, 0.0f};
  if (bwd) {
    s.do_inv = bwd_inv->data<float>()[0];
    s.dp = bwd->data<float>()[1];
    s.dp_inv = bwd_inv->data<float>()[1];
    s.dqkv = bwd->data<float>()[2];
  }
  return s;
}

float softmax_scale(const ops::AttentionArgs& a, int64_t hd) {
  return a.softmax_scale != 0.0f ? a.softmax_scale
                                 : static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
}

// The scores of query row i against keys [0, nk): s_ij = dot . c . qkv_inv . qkv_inv.
void scores(float* s, const double* qi, const double* kh, int64_t nk, int64_t hd, float c,
            float qkv_inv) {
  for (int64_t j = 0; j < nk; ++j) s[j] = dot_f32(qi, kh + j * hd, hd) * c * qkv_inv * qkv_inv;
}

void fp8_attention_fwd(Tensor& out, Tensor& lse, Tensor& amax, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& fwd_scale, const Tensor& fwd_scale_inv,
                       const ops::AttentionArgs& args) {
  const ops::AttentionDims d = ops::validate_fp8_attention_fwd(kOnHost, out, lse, amax, q, k, v,
                                                               fwd_scale, fwd_scale_inv, args);
  const int64_t S = d.s, B = d.b, NH = d.nh, NG = d.ng, HD = d.hd, qpg = NH / NG;
  const Scales sc = read_scales(fwd_scale, fwd_scale_inv, nullptr, nullptr);
  const float c = softmax_scale(args, HD);
  const Fp8Codec codec(q.dtype());
  const std::vector<double> qw = widen_bhsd(q), kw = widen_bhsd(k), vw = widen_bhsd(v);
  auto* op = static_cast<uint8_t*>(out.raw_data());
  float* lp = lse.data<float>();
  const int64_t tasks = B * NH;
  std::vector<float> amax_s(static_cast<std::size_t>(tasks), 0.0f),
      amax_o(static_cast<std::size_t>(tasks), 0.0f);
#pragma omp parallel
  {
    std::vector<float> s(static_cast<std::size_t>(S)), e(static_cast<std::size_t>(S));
    std::vector<double> p8(static_cast<std::size_t>(S));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t bb = t / NH, h = t % NH, g = h / qpg;
      const double* qh = qw.data() + (bb * NH + h) * S * HD;
      const double* kh = kw.data() + (bb * NG + g) * S * HD;
      const double* vh = vw.data() + (bb * NG + g) * S * HD;
      float as = 0.0f, ao = 0.0f;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t nk = args.causal ? i + 1 : S;
        scores(s.data(), qh + i * HD, kh, nk, HD, c, sc.qkv_inv);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < nk; ++j) m = nan_max(m, s[static_cast<std::size_t>(j)]);
        double l64 = 0.0;
        for (int64_t j = 0; j < nk; ++j) {
          const auto ju = static_cast<std::size_t>(j);
          e[ju] = static_cast<float>(std::exp(static_cast<double>(s[ju] - m)));
          l64 += e[ju];
        }
        const float l = static_cast<float>(l64);
        lp[(bb * NH + h) * S + i] =
            static_cast<float>(static_cast<double>(m) + std::log(static_cast<double>(l)));
        for (int64_t j = 0; j < nk; ++j) {
          const auto ju = static_cast<std::size_t>(j);
          const float p = e[ju] / l;
          as = nan_max(as, p);
          p8[ju] = codec.decode(codec.encode(p * sc.s));
        }
        for (int64_t dd = 0; dd < HD; ++dd) {
          double acc = 0.0;
          for (int64_t j = 0; j < nk; ++j) acc += p8[static_cast<std::size_t>(j)] * vh[j * HD + dd];
          const float o = static_cast<float>(acc) * sc.s_inv * sc.qkv_inv;
          ao = nan_max(ao, std::fabs(o));
          op[sbhd(i, bb, h, dd, B, NH, HD)] = codec.encode(o * sc.o);
        }
      }
      amax_s[static_cast<std::size_t>(t)] = as;
      amax_o[static_cast<std::size_t>(t)] = ao;
    }
  }
  float as = 0.0f, ao = 0.0f;
  for (std::size_t t = 0; t < amax_s.size(); ++t) {
    as = nan_max(as, amax_s[t]);
    ao = nan_max(ao, amax_o[t]);
  }
  amax.data<float>()[0] = as;
  amax.data<float>()[1] = ao;
}

void fp8_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& amax, const Tensor& dout,
                       const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       const Tensor& lse, const Tensor& fwd_scale, const Tensor& fwd_scale_inv,
                       const Tensor& bwd_scale, const Tensor& bwd_scale_inv,
                       const ops::AttentionArgs& args) {
  const ops::AttentionDims d =
      ops::validate_fp8_attention_bwd(kOnHost, dq, dk, dv, amax, dout, q, k, v, out, lse, fwd_scale,
                                      fwd_scale_inv, bwd_scale, bwd_scale_inv, args);
  const int64_t S = d.s, B = d.b, NH = d.nh, NG = d.ng, HD = d.hd, qpg = NH / NG;
  const Scales sc = read_scales(fwd_scale, fwd_scale_inv, &bwd_scale, &bwd_scale_inv);
  const float c = softmax_scale(args, HD);
  const Fp8Codec fq(q.dtype()), fg(dout.dtype());
  const std::vector<double> qw = widen_bhsd(q), kw = widen_bhsd(k), vw = widen_bhsd(v),
                            ow = widen_bhsd(out), gw = widen_bhsd(dout);
  const float* lp = lse.data<float>();
  auto* dqp = static_cast<uint8_t*>(dq.raw_data());
  auto* dkp = static_cast<uint8_t*>(dk.raw_data());
  auto* dvp = static_cast<uint8_t*>(dv.raw_data());
  const int64_t tasks = B * NG;
  // Per task: max |ds|, |dq|, |dk|, |dv|.
  std::vector<float> am(static_cast<std::size_t>(tasks * 4), 0.0f);
#pragma omp parallel
  {
    std::vector<float> s(static_cast<std::size_t>(S));
    std::vector<double> ds8(static_cast<std::size_t>(S)), dk_acc(static_cast<std::size_t>(S * HD)),
        dv_acc(static_cast<std::size_t>(S * HD));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t bb = t / NG, g = t % NG;
      const double* kh = kw.data() + (bb * NG + g) * S * HD;
      const double* vh = vw.data() + (bb * NG + g) * S * HD;
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
      float a_ds = 0.0f, a_dq = 0.0f;
      for (int64_t h = g * qpg; h < (g + 1) * qpg; ++h) {
        const double* qh = qw.data() + (bb * NH + h) * S * HD;
        const double* oh = ow.data() + (bb * NH + h) * S * HD;
        const double* gh = gw.data() + (bb * NH + h) * S * HD;
        for (int64_t i = 0; i < S; ++i) {
          const int64_t nk = args.causal ? i + 1 : S;
          const double* gi = gh + i * HD;
          const float di = dot_f32(gi, oh + i * HD, HD) * sc.do_inv * sc.o_inv;
          const float li = lp[(bb * NH + h) * S + i];
          scores(s.data(), qh + i * HD, kh, nk, HD, c, sc.qkv_inv);
          for (int64_t j = 0; j < nk; ++j) {
            const auto ju = static_cast<std::size_t>(j);
            const float p = static_cast<float>(std::exp(static_cast<double>(s[ju] - li)));
            const double p8 = fq.decode(fq.encode(p * sc.s));
            for (int64_t dd = 0; dd < HD; ++dd)
              dv_acc[static_cast<std::size_t>(j * HD + dd)] += p8 * gi[dd];
            const float dp = dot_f32(gi, vh + j * HD, HD) * sc.do_inv * sc.qkv_inv;
            const float ds = (dp - di) * p * c;
            a_ds = nan_max(a_ds, std::fabs(ds));
            ds8[ju] = fg.decode(fg.encode(ds * sc.dp));
          }
          for (int64_t dd = 0; dd < HD; ++dd) {
            double acc = 0.0;
            for (int64_t j = 0; j < nk; ++j)
              acc += ds8[static_cast<std::size_t>(j)] * kh[j * HD + dd];
            const float x = static_cast<float>(acc) * sc.dp_inv * sc.qkv_inv;
            a_dq = nan_max(a_dq, std::fabs(x));
            dqp[sbhd(i, bb, h, dd, B, NH, HD)] = fg.encode(x * sc.dqkv);
          }
          for (int64_t j = 0; j < nk; ++j) {
            const double ds = ds8[static_cast<std::size_t>(j)];
            for (int64_t dd = 0; dd < HD; ++dd)
              dk_acc[static_cast<std::size_t>(j * HD + dd)] += ds * qh[i * HD + dd];
          }
        }
      }
      float a_dk = 0.0f, a_dv = 0.0f;
      for (int64_t j = 0; j < S; ++j)
        for (int64_t dd = 0; dd < HD; ++dd) {
          const auto e = static_cast<std::size_t>(j * HD + dd);
          const float xk = static_cast<float>(dk_acc[e]) * sc.dp_inv * sc.qkv_inv;
          const float xv = static_cast<float>(dv_acc[e]) * sc.s_inv * sc.do_inv;
          a_dk = nan_max(a_dk, std::fabs(xk));
          a_dv = nan_max(a_dv, std::fabs(xv));
          dkp[sbhd(j, bb, g, dd, B, NG, HD)] = fg.encode(xk * sc.dqkv);
          dvp[sbhd(j, bb, g, dd, B, NG, HD)] = fg.encode(xv * sc.dqkv);
        }
      float* a = am.data() + t * 4;
      a[0] = a_ds;
      a[1] = a_dq;
      a[2] = a_dk;
      a[3] = a_dv;
    }
  }
  float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t t = 0; t < tasks; ++t)
    for (int x = 0; x < 4; ++x) r[x] = nan_max(r[x], am[static_cast<std::size_t>(t * 4 + x)]);
  for (int x = 0; x < 4; ++x) amax.data<float>()[x] = r[x];
}

void fp8_dequantize(Tensor& y, const Tensor& q, const Tensor& scale_inv) {
  const int64_t n = ops::validate_fp8_dequantize(kOnHost, y, q, scale_inv);
  const float si = *scale_inv.data<float>();
  const Fp8Codec codec(q.dtype());
  const auto* qp = static_cast<const uint8_t*>(q.raw_data());
  dispatch_float(y.dtype(), "fp8_dequantize", [&]<typename T>(std::type_identity<T>) {
    T* yp = y.data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i)
      yp[i] = store_from<T>(static_cast<float>(codec.decode(qp[i])) * si);
  });
}

}  // namespace

void register_fp8_attention_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::fp8_attention_fwd>("cpu", &fp8_attention_fwd, "cpu:reference");
  r.register_op<ops::OpId::fp8_attention_bwd>("cpu", &fp8_attention_bwd, "cpu:reference");
  r.register_op<ops::OpId::fp8_dequantize>("cpu", &fp8_dequantize, "cpu:omp");
}

}  // namespace mg::platforms::cpu
