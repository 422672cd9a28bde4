// cuDNN fused attention (megatron/platforms/cuda/cudnn/cudnn_attention.cpp: the providers
// "cuda:cudnn" of attention_fwd / attention_bwd and "cuda:cudnn-deterministic" of attention_bwd,
// preferred through ResolveOptions::providers as --attention-backend fused/auto does) against the
// CPU platform's f32 attention: bf16 and f16, head dim 64 and 128, causal (Sq == Sk) and
// bottom-right causal (Sk > Sq), not causal, GQA and MQA, lengths that are no multiple of a tile;
// packed documents (cu_seqlens: B = 2 and B = 1, uneven lengths, a zero-length document, causal and
// not). Attention dropout uses cuDNN's own Philox stream, not the CPU's masks, so it is checked
// against an f64 reference that applies the mask cuDNN reports (its RNG dump, through the test-only
// C symbol mg_cuda_cudnn_attention_fwd_rng_dump): out, lse, dq, dk, dv; the provider's forward and
// backward use that same mask; the kept fraction is within 6 binomial sigma of 1 - p; the same
// (seed, offset) gives the same bits, another offset or seed other bits. The provider's call
// counters (the C symbol mg_cuda_cudnn_attention_stats) prove cuDNN ran; calls it does not serve
// (doc_ids, with or without dropout; cu_seqlens with dropout) fall back to our kernels and still
// match the CPU (masks included: our kernels draw the CPU's dropout bits). Where cuDNN refuses a
// packed-document graph (its check_support: library, GPU), the test says so (the provider's stderr
// line gives cuDNN's reason) and checks the fallback's result. The deterministic backward is
// bit-identical run to run. The resolution tests need a cuDNN build only; the numerical ones skip
// without a GPU, saying why.
//
// Tolerances, derived (u: the unit roundoff of the storage dtype, 2^-8 for bf16, 2^-11 for f16;
// inputs in [0.1, 1] with random signs, so max|q|, max|k|, max|v|, max|dO| <= 1; scale = HD^-1/2):
//   forward out: cuDNN rounds each probability P to the dtype before the PV product: out moves by
//     at most u * max|V| (sum_j P_j / l = 1). The scores: f32 dot products in different orders on
//     each side, and cuDNN folds scale * log2(e) into one f32 multiply and uses exp2: each score
//     within delta = 2 * HD * 2^-24 * HD * scale + 4 * 2^-24 * HD * scale of the other side's, a
//     softmax average moves by at most 2 * delta * max|V|. Row sums l (Sk f32 terms, any order)
//     differ relatively by <= Sk * 2^-24, the approximate exp2 by 2^-21 each: out moves by
//     (Sk * 2^-24 + 2^-21) * max|V|. Both round out to the dtype once: rtol 2u.
//   lse: the scores' delta, log(l)'s Sk * 2^-24, the approximate exp2 / log2 (2^-21 each): atol
//     delta + Sk * 2^-24 + 2^-20, rtol 2^-21.
//   backward (both sides fed the CPU's out and lse, so that it is tested alone): cuDNN rounds P
//     and dS = P (dP - D) to the dtype before the dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q
//     products (2u relative per term: P's rounding moves dS by u|dS|, dS's own rounding u|dS|);
//     each output is rounded once more (u |ref|, ours too: rtol 2u). Per element, from the exact
//     P and dS computed here in f64 (summed over a GQA group's heads for dK, dV):
//       |dV_j| error <= 2u * max|dO| * sum_i P_ij, |dQ_i| <= 2u * scale * max|K| * sum_j |dS_ij|,
//       |dK_j| <= 2u * scale * max|Q| * sum_i |dS_ij|; plus f32 sums (Sk * 2^-24 relative of the
//       same sums) and the approximate exp2 of P (2^-21), both below 2^-20 of them: atol x 1.01.
//     And one absolute term the relative ones miss: dP_ij = dO_i . V_j and D_i = dO_i . O_i are f32
//     dot products of dtype values (exact products), summed in a different order on each side
//     (cuDNN and our kernel take D from a separate row reduction), each within HD * 2^-24 of the
//     sum of its terms' magnitudes (recursive summation, on each side: x 2). Where dP - D cancels,
//     the relative terms vanish but this does not: a causal row 0 attends to key 0 alone, so
//     O_0 = V_0, dP_00 = D_0 and the exact dS_00 is 0 (the CPU gets 0 exactly, summing both
//     in one order; the GPU about 1e-7 scale). So with
//     e_ij = 2 * HD * 2^-24 * (sum_d |dO_id V_jd| + sum_d |dO_id O_id|):
//       dQ_i += scale * max|K| * sum_j P_ij e_ij,   dK_j += scale * max|Q| * sum_i P_ij e_ij.
//   packed documents: the same bounds, the sums over the keys of the query's document only.
//   dropout (against the f64 reference with cuDNN's mask M, 0 or 1, keep = 1/(1-p)): cuDNN rounds
//     P~ = P M keep (not P) to the dtype before the PV product, so every term of the forward bound
//     above is multiplied by keep (sum_j P~_ij <= keep); lse does not see dropout (same bound). The
//     reference is exact, so the two-sided bounds above hold with room. Backward (fed the
//     reference's out, rounded to the dtype, and lse, rounded to f32; the reference uses those
//     values): dP = (dO . V_j) M keep, D_i = dO_i . O_i, dS = P (dP - D) (cuDNN's graph computes
//     the same: dP' M - (1-p) D, times P keep); dV's bound takes P~ for P, e_ij takes
//     |dO_i V_j| M keep for |dO_i V_j|; dQ and dK as above.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::make_tensor;
using test::random_values;
using test::to_doubles;

const Device kGpu = Device::cuda(0);
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Mirrors CudnnAttentionStats (megatron/platforms/cuda/cudnn/cudnn_attention.h).
struct Stats {
  uint64_t graphs = 0, unsupported = 0, fwd_calls = 0, bwd_calls = 0;
};
Stats (*stats_fn())() {
  return reinterpret_cast<Stats (*)()>(dlsym(RTLD_DEFAULT, "mg_cuda_cudnn_attention_stats"));
}
const char* version() {
  auto fn =
      reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "mg_cuda_cudnn_attention_version"));
  return fn ? fn() : "none";
}

bool has_cudnn_provider() {
  test::ensure_runtime();
  const auto& reg = plugin::global_registry();
  if (!reg.find_platform("cuda")) return false;
  const auto r = reg.resolutions("cuda")[static_cast<std::size_t>(ops::OpId::attention_fwd)];
  return std::find(r.shadowed.begin(), r.shadowed.end(), "cuda:cudnn") != r.shadowed.end();
}

#define MG_SKIP_WITHOUT_CUDNN()                                                                  \
  do {                                                                                           \
    test::ensure_runtime();                                                                      \
    if (!plugin::global_registry().find_platform("cuda"))                                        \
      GTEST_SKIP() << "this build has no CUDA platform";                                         \
    if (!has_cudnn_provider())                                                                   \
      GTEST_SKIP() << "this build has no cuDNN attention (configure found no cuDNN frontend or " \
                      "libcudnn; scripts/install_deps.sh fetches the frontend)";                 \
  } while (0)

plugin::ResolveOptions cudnn_choice(bool deterministic) {
  plugin::ResolveOptions o;
  o.deterministic = deterministic;
  o.providers = {{"attention_fwd", "cuda:cudnn"},
                 {"attention_bwd", deterministic ? "cuda:cudnn-deterministic" : "cuda:cudnn"}};
  return o;
}
const ops::OpTable& gpu_ops(bool deterministic = false) {
  test::ensure_runtime();
  return plugin::global_registry().ops("cuda", cudnn_choice(deterministic));
}
const ops::OpTable& cpu_ops() {
  return test::ops_on("cpu");
}

struct Pair {
  Tensor cpu, gpu;
};
Pair random_pair(const Shape& shape, DType dtype, uint64_t seed) {
  auto h = make_tensor(random_values(static_cast<std::size_t>(shape_numel(shape)), seed), shape,
                       dtype, Device::cpu());
  return {h.t, h.t.to(kGpu)};
}
Pair poisoned_pair(const Shape& shape, DType dtype) {
  auto nan = make_tensor(std::vector<double>(static_cast<std::size_t>(shape_numel(shape)), kNaN),
                         shape, dtype, kGpu);
  return {Tensor::empty(shape, dtype), nan.t};
}

struct Case {
  int64_t sq, sk, b, nh, ng;
  bool causal;
  const char* what;
};
const std::vector<Case> kCases = {
    {128, 128, 2, 4, 2, true, "GQA, causal, S = 128"},
    {200, 200, 1, 3, 1, true, "MQA, causal, S = 200"},
    {100, 170, 2, 2, 2, true, "Sk > Sq, bottom-right causal"},
    {130, 130, 2, 2, 1, false, "MQA, not causal, S = 130"},
};

class CudaCudnnAttention : public ::testing::TestWithParam<DType> {};

TEST_P(CudaCudnnAttention, ForwardMatchesCpu) {
  MG_SKIP_WITHOUT_CUDNN();
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = GetParam();
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double e24 = std::ldexp(1.0, -24);
  std::cout << "cuDNN: " << version() << std::endl;
  for (int64_t hd : {64, 128}) {
    for (const Case& c : kCases) {
      auto q = random_pair({c.sq, c.b, c.nh, hd}, dt, 31);
      auto k = random_pair({c.sk, c.b, c.ng, hd}, dt, 32);
      auto v = random_pair({c.sk, c.b, c.ng, hd}, dt, 33);
      ops::AttentionArgs a;
      a.causal = c.causal;
      auto out = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
      auto lse = poisoned_pair({c.b, c.nh, c.sq}, DType::f32);
      const Stats before = stats_fn()();
      cpu_ops().attention_fwd(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, a);
      gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, a);
      const std::string what = std::string(c.what) + ", hd " + std::to_string(hd);
      EXPECT_EQ(stats_fn()().fwd_calls, before.fwd_calls + 1) << "cuDNN did not run: " << what;

      const double scale = 1.0 / std::sqrt(static_cast<double>(hd)), h = static_cast<double>(hd);
      const double delta = 2.0 * h * e24 * h * scale + 4.0 * e24 * h * scale;
      const double sum_err = static_cast<double>(c.sk) * e24 + std::ldexp(1.0, -21);
      const test::Tol out_tol{u + 2.0 * delta + sum_err, 2.0 * u};
      const test::Tol lse_tol{delta + static_cast<double>(c.sk) * e24 + std::ldexp(1.0, -20),
                              std::ldexp(1.0, -21)};
      const auto og = to_doubles(out.gpu), oc = to_doubles(out.cpu);
      const auto lg = to_doubles(lse.gpu), lc = to_doubles(lse.cpu);
      for (double x : og) ASSERT_FALSE(std::isnan(x)) << "NaN in out: " << what;
      for (double x : lg) ASSERT_FALSE(std::isnan(x)) << "NaN in lse: " << what;
      EXPECT_TRUE(test::all_close(og, oc, out_tol)) << "out: " << what;
      EXPECT_TRUE(test::all_close(lg, lc, lse_tol)) << "lse: " << what;
    }
  }
}

// Per-element bounds of the backward (see the file comment) from f64 P and dS; with `docs` (the
// document of each position, shared by the batch rows) only keys of the query's document count;
// with `mask` ([B, NH, Sq, Sk], 1 kept) the dropout terms, keep = 1/(1-p).
struct BwdBounds {
  std::vector<double> dq, dk, dv;
};
BwdBounds bwd_bounds(const Case& c, int64_t hd, double u, const std::vector<double>& q,
                     const std::vector<double>& k, const std::vector<double>& v,
                     const std::vector<double>& dout, const std::vector<double>& out,
                     const std::vector<double>& lse, const std::vector<int32_t>* docs = nullptr,
                     const std::vector<double>* mask = nullptr, double keep = 1.0) {
  const int64_t B = c.b, NH = c.nh, NG = c.ng, Sq = c.sq, Sk = c.sk, HD = hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  const double e24 = std::ldexp(1.0, -24);
  auto qi = [&](int64_t s, int64_t b, int64_t h, int64_t d) {
    return ((s * B + b) * NH + h) * HD + d;
  };
  auto ki = [&](int64_t s, int64_t b, int64_t g, int64_t d) {
    return ((s * B + b) * NG + g) * HD + d;
  };
  BwdBounds r;
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  std::vector<double> colP(static_cast<std::size_t>(B * NG * Sk), 0.0), colS(colP.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / (NH / NG);
      for (int64_t i = 0; i < Sq; ++i) {
        double D = 0, absD = 0, rowS = 0, rowE = 0;
        for (int64_t d = 0; d < HD; ++d) {
          D += dout[qi(i, b, h, d)] * out[qi(i, b, h, d)];
          absD += std::abs(dout[qi(i, b, h, d)] * out[qi(i, b, h, d)]);
        }
        const double l = lse[(b * NH + h) * Sq + i];
        for (int64_t j = 0; j < Sk; ++j) {
          if (c.causal && j > i + Sk - Sq) continue;
          if (docs && (*docs)[static_cast<std::size_t>(i)] != (*docs)[static_cast<std::size_t>(j)])
            continue;
          const double m =
              mask ? (*mask)[static_cast<std::size_t>(((b * NH + h) * Sq + i) * Sk + j)] * keep
                   : 1.0;
          double s = 0, dp = 0, absdp = 0;
          for (int64_t d = 0; d < HD; ++d) {
            s += q[qi(i, b, h, d)] * k[ki(j, b, g, d)];
            dp += dout[qi(i, b, h, d)] * v[ki(j, b, g, d)];
            absdp += std::abs(dout[qi(i, b, h, d)] * v[ki(j, b, g, d)]);
          }
          dp *= m;
          absdp *= m;
          const double P = std::exp(s * scale - l), dS = std::abs(P * (dp - D));
          const double E = P * 2.0 * static_cast<double>(HD) * e24 * (absdp + absD);
          rowS += dS;
          rowE += E;
          colP[(b * NG + g) * Sk + j] += P * m;
          colS[(b * NG + g) * Sk + j] += 2.0 * u * dS + E;
        }
        for (int64_t d = 0; d < HD; ++d) r.dq[qi(i, b, h, d)] = scale * (2.0 * u * rowS + rowE);
      }
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < NG; ++g)
      for (int64_t j = 0; j < Sk; ++j)
        for (int64_t d = 0; d < HD; ++d) {
          r.dv[ki(j, b, g, d)] = 2.0 * u * colP[(b * NG + g) * Sk + j];
          r.dk[ki(j, b, g, d)] = scale * colS[(b * NG + g) * Sk + j];
        }
  for (auto* vec : {&r.dq, &r.dk, &r.dv})
    for (double& x : *vec) x *= 1.01;
  return r;
}

// got against ref within atol[e] + 2u |ref[e]| per element; non-finite values, and errors where the
// bound is 0, counted apart (the f16 causal dq once failed on an H200 at causal row 0, where the
// bound lacked the e_ij term).
void check_grad(const char* name, const std::vector<double>& got, const std::vector<double>& ref,
                const std::vector<double>& atol, double u, const std::string& what) {
  int bad = 0, got_nf = 0, ref_nf = 0, tol_nf = 0, zero_tol_bad = 0;
  double worst = 0;
  std::size_t first_nf = got.size();
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double err = std::abs(got[e] - ref[e]);
    const double tol = atol[e] + 2.0 * u * std::abs(ref[e]);
    if (!(err <= tol)) ++bad;
    const bool nf = !std::isfinite(got[e]) || !std::isfinite(ref[e]) || !std::isfinite(tol);
    got_nf += !std::isfinite(got[e]);
    ref_nf += !std::isfinite(ref[e]);
    tol_nf += !std::isfinite(tol);
    if (nf && first_nf == got.size()) first_nf = e;
    if (!nf && tol > 0) worst = std::max(worst, err / tol);
    zero_tol_bad += !nf && tol == 0 && err > 0;
  }
  std::string nf_what;
  if (first_nf < got.size())
    nf_what = "; first non-finite at flat index " + std::to_string(first_nf) + ": got " +
              std::to_string(got[first_nf]) + ", ref " + std::to_string(ref[first_nf]) +
              ", bound " + std::to_string(atol[first_nf]);
  EXPECT_EQ(bad, 0) << name << ": " << what << " (worst finite error / bound " << worst
                    << "; non-finite: got " << got_nf << ", ref " << ref_nf << ", bound " << tol_nf
                    << nf_what << "; nonzero where the bound is 0: " << zero_tol_bad << ")";
}

TEST_P(CudaCudnnAttention, BackwardMatchesCpu) {
  MG_SKIP_WITHOUT_CUDNN();
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = GetParam();
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  for (bool deterministic : {false, true}) {
    for (int64_t hd : {64, 128}) {
      for (const Case& c : kCases) {
        auto q = random_pair({c.sq, c.b, c.nh, hd}, dt, 41);
        auto k = random_pair({c.sk, c.b, c.ng, hd}, dt, 42);
        auto v = random_pair({c.sk, c.b, c.ng, hd}, dt, 43);
        auto dout = random_pair({c.sq, c.b, c.nh, hd}, dt, 44);
        ops::AttentionArgs a;
        a.causal = c.causal;
        Tensor out = Tensor::empty({c.sq, c.b, c.nh, hd}, dt);
        Tensor lse = Tensor::empty({c.b, c.nh, c.sq}, DType::f32);
        cpu_ops().attention_fwd(out, lse, q.cpu, k.cpu, v.cpu, a);
        const Tensor out_g = out.to(kGpu), lse_g = lse.to(kGpu);
        auto dq = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
        auto dk = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
        auto dv = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
        const Stats before = stats_fn()();
        cpu_ops().attention_bwd(dq.cpu, dk.cpu, dv.cpu, dout.cpu, q.cpu, k.cpu, v.cpu, out, lse, a);
        gpu_ops(deterministic)
            .attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out_g, lse_g, a);
        const std::string what = std::string(c.what) + ", hd " + std::to_string(hd) +
                                 (deterministic ? ", deterministic" : "");
        EXPECT_EQ(stats_fn()().bwd_calls, before.bwd_calls + 1) << "cuDNN did not run: " << what;
        const BwdBounds bound =
            bwd_bounds(c, hd, u, to_doubles(q.cpu), to_doubles(k.cpu), to_doubles(v.cpu),
                       to_doubles(dout.cpu), to_doubles(out), to_doubles(lse));
        const struct {
          const char* name;
          const Pair* p;
          const std::vector<double>* atol;
        } grads[] = {{"dq", &dq, &bound.dq}, {"dk", &dk, &bound.dk}, {"dv", &dv, &bound.dv}};
        for (const auto& g : grads)
          check_grad(g.name, to_doubles(g.p->gpu), to_doubles(g.p->cpu), *g.atol, u, what);
        if (deterministic) {  // a second run gives the same bits
          auto dq2 = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
          auto dk2 = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
          auto dv2 = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
          gpu_ops(true).attention_bwd(dq2.gpu, dk2.gpu, dv2.gpu, dout.gpu, q.gpu, k.gpu, v.gpu,
                                      out_g, lse_g, a);
          EXPECT_EQ(to_doubles(dq2.gpu), to_doubles(dq.gpu)) << "dq: " << what;
          EXPECT_EQ(to_doubles(dk2.gpu), to_doubles(dk.gpu)) << "dk: " << what;
          EXPECT_EQ(to_doubles(dv2.gpu), to_doubles(dv.gpu)) << "dv: " << what;
        }
      }
    }
  }
}

// Calls cuDNN does not serve here fall back to our kernels (and still match the CPU within our
// tiled kernel's tolerance, dropout included: our kernels draw the CPU's bits); cuDNN's counters do
// not move. doc_ids (--reset-attention-mask's per-row ids) have no cuDNN equivalent here;
// cu_seqlens with dropout is not served until a test covers the pair.
TEST_P(CudaCudnnAttention, UnservedCallsFallBack) {
  MG_SKIP_WITHOUT_CUDNN();
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = GetParam();
  const int64_t s = 96, b = 2, nh = 2, hd = 64;
  auto q = random_pair({s, b, nh, hd}, dt, 51);
  auto k = random_pair({s, b, nh, hd}, dt, 52);
  auto v = random_pair({s, b, nh, hd}, dt, 53);
  std::vector<ops::AttentionArgs> calls(3);
  std::vector<int32_t> docs(static_cast<std::size_t>(b * s));
  for (std::size_t i = 0; i < docs.size(); ++i) docs[i] = static_cast<int32_t>((i % s) / 40);
  calls[0].doc_ids = Tensor::from_vector(docs, {b, s}, DType::i32);
  calls[1].doc_ids = calls[0].doc_ids;
  calls[1].dropout = {0.1f, 5, 0};
  calls[2].cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 30, 96}, {3}, DType::i32);
  calls[2].dropout = {0.1f, 5, 0};
  for (const auto& ac : calls) {
    ops::AttentionArgs ag = ac;
    if (ac.doc_ids.defined()) ag.doc_ids = ac.doc_ids.to(kGpu);
    if (ac.cu_seqlens.defined()) ag.cu_seqlens = ac.cu_seqlens.to(kGpu);
    auto out = poisoned_pair({s, b, nh, hd}, dt);
    auto lse = poisoned_pair({b, nh, s}, DType::f32);
    const Stats before = stats_fn()();
    cpu_ops().attention_fwd(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, ac);
    gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, ag);
    EXPECT_EQ(stats_fn()().fwd_calls, before.fwd_calls);
    const auto tol = test::tolerance(dt);
    EXPECT_TRUE(
        test::all_close(to_doubles(out.gpu), to_doubles(out.cpu), {2 * tol.atol, 2 * tol.rtol}));
  }
}

// ---- attention dropout: cuDNN's mask, checked through its RNG dump ------------------------------

using RngDumpFn = const char* (*)(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const ops::AttentionArgs&);
RngDumpFn rng_dump_fn() {
  return reinterpret_cast<RngDumpFn>(dlsym(RTLD_DEFAULT, "mg_cuda_cudnn_attention_fwd_rng_dump"));
}

// f64 attention with the keep mask ([B, NH, Sq, Sk], 1 kept) and keep = 1/(1-p): out and lse.
void dropout_fwd_ref(const Case& c, int64_t hd, const std::vector<double>& q,
                     const std::vector<double>& k, const std::vector<double>& v,
                     const std::vector<double>& mask, double keep, std::vector<double>* out,
                     std::vector<double>* lse) {
  const int64_t B = c.b, NH = c.nh, NG = c.ng, Sq = c.sq, Sk = c.sk, HD = hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  out->assign(static_cast<std::size_t>(Sq * B * NH * HD), 0.0);
  lse->assign(static_cast<std::size_t>(B * NH * Sq), 0.0);
  std::vector<double> sc(static_cast<std::size_t>(Sk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / (NH / NG);
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t last = c.causal ? std::min(Sk - 1, i + Sk - Sq) : Sk - 1;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= last; ++j) {
          double x = 0;
          for (int64_t d = 0; d < HD; ++d)
            x += q[static_cast<std::size_t>(((i * B + b) * NH + h) * HD + d)] *
                 k[static_cast<std::size_t>(((j * B + b) * NG + g) * HD + d)];
          sc[static_cast<std::size_t>(j)] = x * scale;
          m = std::max(m, x * scale);
        }
        double l = 0;
        for (int64_t j = 0; j <= last; ++j) l += std::exp(sc[static_cast<std::size_t>(j)] - m);
        const double ls = m + std::log(l);
        (*lse)[static_cast<std::size_t>((b * NH + h) * Sq + i)] = ls;
        for (int64_t j = 0; j <= last; ++j) {
          const double pm = std::exp(sc[static_cast<std::size_t>(j)] - ls) * keep *
                            mask[static_cast<std::size_t>(((b * NH + h) * Sq + i) * Sk + j)];
          for (int64_t d = 0; d < HD; ++d)
            (*out)[static_cast<std::size_t>(((i * B + b) * NH + h) * HD + d)] +=
                pm * v[static_cast<std::size_t>(((j * B + b) * NG + g) * HD + d)];
        }
      }
    }
}

// f64 gradients of that attention from (out, lse) as given (file comment).
struct Grads {
  std::vector<double> dq, dk, dv;
};
Grads dropout_bwd_ref(const Case& c, int64_t hd, const std::vector<double>& q,
                      const std::vector<double>& k, const std::vector<double>& v,
                      const std::vector<double>& dout, const std::vector<double>& out,
                      const std::vector<double>& lse, const std::vector<double>& mask,
                      double keep) {
  const int64_t B = c.b, NH = c.nh, NG = c.ng, Sq = c.sq, Sk = c.sk, HD = hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  auto qi = [&](int64_t s, int64_t b, int64_t h, int64_t d) {
    return static_cast<std::size_t>(((s * B + b) * NH + h) * HD + d);
  };
  auto ki = [&](int64_t s, int64_t b, int64_t g, int64_t d) {
    return static_cast<std::size_t>(((s * B + b) * NG + g) * HD + d);
  };
  Grads r{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
          std::vector<double>(v.size(), 0.0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / (NH / NG);
      for (int64_t i = 0; i < Sq; ++i) {
        double D = 0;
        for (int64_t d = 0; d < HD; ++d) D += dout[qi(i, b, h, d)] * out[qi(i, b, h, d)];
        const double l = lse[static_cast<std::size_t>((b * NH + h) * Sq + i)];
        const int64_t last = c.causal ? std::min(Sk - 1, i + Sk - Sq) : Sk - 1;
        for (int64_t j = 0; j <= last; ++j) {
          const double m = mask[static_cast<std::size_t>(((b * NH + h) * Sq + i) * Sk + j)] * keep;
          double x = 0, dp = 0;
          for (int64_t d = 0; d < HD; ++d) {
            x += q[qi(i, b, h, d)] * k[ki(j, b, g, d)];
            dp += dout[qi(i, b, h, d)] * v[ki(j, b, g, d)];
          }
          const double P = std::exp(x * scale - l), dS = P * (dp * m - D);
          for (int64_t d = 0; d < HD; ++d) {
            r.dv[ki(j, b, g, d)] += P * m * dout[qi(i, b, h, d)];
            r.dq[qi(i, b, h, d)] += scale * dS * k[ki(j, b, g, d)];
            r.dk[ki(j, b, g, d)] += scale * dS * q[qi(i, b, h, d)];
          }
        }
      }
    }
  return r;
}

struct DropoutRun {
  Pair out, lse;
  Tensor dump;          // [B, NH, Sq, Sk] f32 on the GPU
  std::string refused;  // why the RNG-dump graph did not run ("" when it ran)
};
DropoutRun forward_with_dump(const Case& c, int64_t hd, DType dt, const Pair& q, const Pair& k,
                             const Pair& v, const ops::AttentionArgs& a) {
  DropoutRun r{poisoned_pair({c.sq, c.b, c.nh, hd}, dt),
               poisoned_pair({c.b, c.nh, c.sq}, DType::f32),
               poisoned_pair({c.b, c.nh, c.sq, c.sk}, DType::f32).gpu, ""};
  const RngDumpFn fn = rng_dump_fn();
  if (!fn) {
    r.refused = "this build exports no mg_cuda_cudnn_attention_fwd_rng_dump";
    return r;
  }
  if (const char* why = fn(r.out.gpu, r.lse.gpu, r.dump, q.gpu, k.gpu, v.gpu, a)) r.refused = why;
  return r;
}

const std::vector<Case> kDropoutCases = {
    {128, 128, 2, 4, 2, true, "GQA, causal, S = 128"},
    {130, 130, 1, 2, 1, false, "MQA, not causal, S = 130"},
};

// out, lse, dq, dk, dv against the f64 reference with cuDNN's own mask; the provider's forward and
// backward (both backward providers) use that mask; the kept fraction is 1 - p within 6 sigma.
TEST_P(CudaCudnnAttention, DropoutMatchesReferenceWithCudnnMask) {
  MG_SKIP_WITHOUT_CUDNN();
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = GetParam();
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double e24 = std::ldexp(1.0, -24);
  const int64_t hd = 64;
  const float p = 0.1f;
  const double keep = 1.0 / (1.0 - static_cast<double>(p));
  for (const Case& c : kDropoutCases) {
    const std::string what = std::string(c.what) + ", hd 64, p 0.1";
    auto q = random_pair({c.sq, c.b, c.nh, hd}, dt, 61);
    auto k = random_pair({c.sk, c.b, c.ng, hd}, dt, 62);
    auto v = random_pair({c.sk, c.b, c.ng, hd}, dt, 63);
    ops::AttentionArgs a;
    a.causal = c.causal;
    a.dropout = {p, 20261126, 777};
    const Stats before = stats_fn()();
    DropoutRun run = forward_with_dump(c, hd, dt, q, k, v, a);
    // cuDNN may refuse the RNG-dump graph (the frontend: none on Blackwell); anything else fails.
    if (run.refused.find("cuDNN does not serve this call") != std::string::npos)
      GTEST_SKIP() << "cuDNN refused the RNG-dump graph: " << run.refused;
    ASSERT_TRUE(run.refused.empty()) << "the RNG-dump forward failed: " << run.refused;
    EXPECT_EQ(stats_fn()().fwd_calls, before.fwd_calls + 1) << "cuDNN did not run: " << what;

    // The mask: 0 or 1 where the query may attend the key; the kept fraction.
    const std::vector<double> mask = to_doubles(run.dump);
    int64_t n = 0, kept = 0, odd = 0;
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t h = 0; h < c.nh; ++h)
        for (int64_t i = 0; i < c.sq; ++i)
          for (int64_t j = 0; j < c.sk; ++j) {
            if (c.causal && j > i + c.sk - c.sq) continue;
            const double x = mask[static_cast<std::size_t>(((b * c.nh + h) * c.sq + i) * c.sk + j)];
            ++n;
            kept += x == 1.0;
            odd += x != 0.0 && x != 1.0;
          }
    ASSERT_EQ(odd, 0) << "the RNG dump holds values other than 0 and 1: " << what;
    const double frac = static_cast<double>(kept) / static_cast<double>(n);
    const double sigma = std::sqrt(static_cast<double>(p) * (1.0 - p) / static_cast<double>(n));
    std::printf("%s: kept %lld of %lld (%.5f; 1 - p = %.5f, sigma %.5f)\n", what.c_str(),
                static_cast<long long>(kept), static_cast<long long>(n), frac, 1.0 - p, sigma);
    EXPECT_LE(std::abs(frac - (1.0 - p)), 6.0 * sigma) << what;

    // Forward against the reference with that mask (file comment: the bounds times keep).
    std::vector<double> ref_out, ref_lse;
    const auto qd = to_doubles(q.cpu), kd = to_doubles(k.cpu), vd = to_doubles(v.cpu);
    dropout_fwd_ref(c, hd, qd, kd, vd, mask, keep, &ref_out, &ref_lse);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd)), h = static_cast<double>(hd);
    const double delta = 2.0 * h * e24 * h * scale + 4.0 * e24 * h * scale;
    const double sum_err = static_cast<double>(c.sk) * e24 + std::ldexp(1.0, -21);
    const test::Tol out_tol{(u + 2.0 * delta + sum_err) * keep, 2.0 * u};
    const test::Tol lse_tol{delta + static_cast<double>(c.sk) * e24 + std::ldexp(1.0, -20),
                            std::ldexp(1.0, -21)};
    EXPECT_TRUE(test::all_close(to_doubles(run.out.gpu), ref_out, out_tol)) << "out: " << what;
    EXPECT_TRUE(test::all_close(to_doubles(run.lse.gpu), ref_lse, lse_tol)) << "lse: " << what;
    // The provider's forward (the graph without the dump) draws the same mask.
    auto out2 = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
    auto lse2 = poisoned_pair({c.b, c.nh, c.sq}, DType::f32);
    const Stats mid = stats_fn()();
    gpu_ops().attention_fwd(out2.gpu, lse2.gpu, q.gpu, k.gpu, v.gpu, a);
    EXPECT_EQ(stats_fn()().fwd_calls, mid.fwd_calls + 1) << "cuDNN did not run: " << what;
    EXPECT_TRUE(test::all_close(to_doubles(out2.gpu), ref_out, out_tol))
        << "provider out: " << what;

    // Backward, fed the reference's out (rounded to the dtype) and lse (rounded to f32).
    const auto out_r = test::make_tensor(ref_out, {c.sq, c.b, c.nh, hd}, dt, kGpu);
    const auto lse_r = test::make_tensor(ref_lse, {c.b, c.nh, c.sq}, DType::f32, kGpu);
    auto dout = random_pair({c.sq, c.b, c.nh, hd}, dt, 64);
    const auto dod = to_doubles(dout.cpu);
    const Grads ref =
        dropout_bwd_ref(c, hd, qd, kd, vd, dod, out_r.rounded, lse_r.rounded, mask, keep);
    const BwdBounds bound =
        bwd_bounds(c, hd, u, qd, kd, vd, dod, out_r.rounded, lse_r.rounded, nullptr, &mask, keep);
    for (bool deterministic : {false, true}) {
      auto dq = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
      auto dk = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
      auto dv = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
      const Stats bb = stats_fn()();
      gpu_ops(deterministic)
          .attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out_r.t, lse_r.t,
                         a);
      const std::string w = what + (deterministic ? ", deterministic" : "");
      EXPECT_EQ(stats_fn()().bwd_calls, bb.bwd_calls + 1) << "cuDNN did not run: " << w;
      check_grad("dq", to_doubles(dq.gpu), ref.dq, bound.dq, u, w);
      check_grad("dk", to_doubles(dk.gpu), ref.dk, bound.dk, u, w);
      check_grad("dv", to_doubles(dv.gpu), ref.dv, bound.dv, u, w);
    }
  }
}

// The same (seed, offset) gives the same bits (forward, and the deterministic backward); another
// offset or seed other bits of out, and the same lse (dropout acts after the softmax statistics).
TEST_P(CudaCudnnAttention, DropoutIsReproducible) {
  MG_SKIP_WITHOUT_CUDNN();
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = GetParam();
  const Case c = kCases[0];
  const int64_t hd = 64;
  auto q = random_pair({c.sq, c.b, c.nh, hd}, dt, 71);
  auto k = random_pair({c.sk, c.b, c.ng, hd}, dt, 72);
  auto v = random_pair({c.sk, c.b, c.ng, hd}, dt, 73);
  auto dout = random_pair({c.sq, c.b, c.nh, hd}, dt, 74);
  auto fwd = [&](uint64_t seed, uint64_t offset) {
    ops::AttentionArgs a;
    a.causal = c.causal;
    a.dropout = {0.1f, seed, offset};
    auto out = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
    auto lse = poisoned_pair({c.b, c.nh, c.sq}, DType::f32);
    const Stats before = stats_fn()();
    gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, a);
    EXPECT_EQ(stats_fn()().fwd_calls, before.fwd_calls + 1) << "cuDNN did not run";
    return std::make_pair(out.gpu, lse.gpu);
  };
  const auto [o1, l1] = fwd(99, 1000);
  const auto [o2, l2] = fwd(99, 1000);
  const auto [o3, l3] = fwd(99, 1001);
  const auto [o4, l4] = fwd(98, 1000);
  const auto o1d = to_doubles(o1);
  for (double x : o1d) ASSERT_TRUE(std::isfinite(x)) << "non-finite out";
  EXPECT_EQ(to_doubles(o2), o1d) << "the same seed and offset gave other bits";
  EXPECT_EQ(to_doubles(l2), to_doubles(l1));
  EXPECT_NE(to_doubles(o3), o1d) << "another offset gave the same out";
  EXPECT_NE(to_doubles(o4), o1d) << "another seed gave the same out";
  EXPECT_EQ(to_doubles(l3), to_doubles(l1)) << "lse depends on the dropout offset";
  // The deterministic backward, twice from the same inputs: the same bits.
  ops::AttentionArgs a;
  a.causal = c.causal;
  a.dropout = {0.1f, 99, 1000};
  std::vector<double> first[3];
  for (int rep = 0; rep < 2; ++rep) {
    auto dq = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
    auto dk = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
    auto dv = poisoned_pair({c.sk, c.b, c.ng, hd}, dt);
    const Stats before = stats_fn()();
    gpu_ops(true).attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, o1, l1, a);
    EXPECT_EQ(stats_fn()().bwd_calls, before.bwd_calls + 1) << "cuDNN did not run";
    const std::vector<double> got[3] = {to_doubles(dq.gpu), to_doubles(dk.gpu), to_doubles(dv.gpu)};
    for (int t = 0; t < 3; ++t) {
      if (rep == 0)
        first[t] = got[t];
      else
        EXPECT_EQ(got[t], first[t]) << "gradient " << t << " (dq, dk, dv) differs run to run";
    }
  }
}

// ---- packed documents (cu_seqlens)
// ----------------------------------------------------------------

struct PackedCase {
  int64_t b;
  std::vector<int32_t> cu;
  const char* what;
};
const std::vector<PackedCase> kPackedCases = {
    {2, {0, 37, 101, 160}, "B 2, documents 37, 64, 59"},
    {1, {0, 37, 101, 160}, "B 1, documents 37, 64, 59"},
    {2, {0, 45, 45, 128}, "B 2, documents 45, 0, 83 (zero-length)"},
};

// cu_seqlens against the CPU (forward and both backward providers, causal and not); counters
// prove cuDNN ran. Where cuDNN refuses the graph (library or GPU), the test says so and checks the
// fallback's result instead (the provider's stderr line gives cuDNN's reason).
TEST_P(CudaCudnnAttention, PackedDocumentsMatchCpu) {
  MG_SKIP_WITHOUT_CUDNN();
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = GetParam();
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double e24 = std::ldexp(1.0, -24);
  const int64_t hd = 64, nh = 4, ng = 2;
  const auto fallback_tol = test::tolerance(dt);
  for (const PackedCase& pc : kPackedCases) {
    for (bool causal : {true, false}) {
      const int64_t s = pc.cu.back();
      const Case c{s, s, pc.b, nh, ng, causal, pc.what};
      const std::string what = std::string(pc.what) + (causal ? ", causal" : ", not causal");
      std::vector<int32_t> docs(static_cast<std::size_t>(s));
      for (std::size_t d = 0; d + 1 < pc.cu.size(); ++d)
        for (int32_t t = pc.cu[d]; t < pc.cu[d + 1]; ++t)
          docs[static_cast<std::size_t>(t)] = static_cast<int32_t>(d);
      auto q = random_pair({s, pc.b, nh, hd}, dt, 81);
      auto k = random_pair({s, pc.b, ng, hd}, dt, 82);
      auto v = random_pair({s, pc.b, ng, hd}, dt, 83);
      auto dout = random_pair({s, pc.b, nh, hd}, dt, 84);
      ops::AttentionArgs ac;
      ac.causal = causal;
      ac.cu_seqlens = Tensor::from_vector(pc.cu, {static_cast<int64_t>(pc.cu.size())}, DType::i32);
      ops::AttentionArgs ag = ac;
      ag.cu_seqlens = ac.cu_seqlens.to(kGpu);

      // Forward.
      auto out = poisoned_pair({s, pc.b, nh, hd}, dt);
      auto lse = poisoned_pair({pc.b, nh, s}, DType::f32);
      Stats before = stats_fn()();
      cpu_ops().attention_fwd(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, ac);
      gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, ag);
      const bool served = stats_fn()().fwd_calls == before.fwd_calls + 1;
      const auto og = to_doubles(out.gpu), lg = to_doubles(lse.gpu);
      for (double x : og) ASSERT_FALSE(std::isnan(x)) << "NaN in out: " << what;
      for (double x : lg) ASSERT_FALSE(std::isnan(x)) << "NaN in lse: " << what;
      if (!served) {
        std::printf(
            "%s %s: cuDNN refused the packed-document forward (see the 'cuda:cudnn: cuDNN "
            "does not serve' line above for its reason); checking our fallback\n",
            std::string(dtype_name(dt)).c_str(), what.c_str());
        EXPECT_TRUE(test::all_close(og, to_doubles(out.cpu),
                                    {2 * fallback_tol.atol, 2 * fallback_tol.rtol}))
            << "fallback out: " << what;
      } else {
        const double scale = 1.0 / std::sqrt(static_cast<double>(hd)), h = static_cast<double>(hd);
        const double delta = 2.0 * h * e24 * h * scale + 4.0 * e24 * h * scale;
        const double sum_err = static_cast<double>(s) * e24 + std::ldexp(1.0, -21);
        const test::Tol out_tol{u + 2.0 * delta + sum_err, 2.0 * u};
        const test::Tol lse_tol{delta + static_cast<double>(s) * e24 + std::ldexp(1.0, -20),
                                std::ldexp(1.0, -21)};
        EXPECT_TRUE(test::all_close(og, to_doubles(out.cpu), out_tol)) << "out: " << what;
        EXPECT_TRUE(test::all_close(lg, to_doubles(lse.cpu), lse_tol)) << "lse: " << what;
      }

      // Backward, both sides fed the CPU's out and lse.
      const Tensor out_g = out.cpu.to(kGpu), lse_g = lse.cpu.to(kGpu);
      const BwdBounds bound =
          bwd_bounds(c, hd, u, to_doubles(q.cpu), to_doubles(k.cpu), to_doubles(v.cpu),
                     to_doubles(dout.cpu), to_doubles(out.cpu), to_doubles(lse.cpu), &docs);
      auto dq = poisoned_pair({s, pc.b, nh, hd}, dt);
      auto dk = poisoned_pair({s, pc.b, ng, hd}, dt);
      auto dv = poisoned_pair({s, pc.b, ng, hd}, dt);
      cpu_ops().attention_bwd(dq.cpu, dk.cpu, dv.cpu, dout.cpu, q.cpu, k.cpu, v.cpu, out.cpu,
                              lse.cpu, ac);
      for (bool deterministic : {false, true}) {
        const std::string w = what + (deterministic ? ", deterministic" : "");
        auto gq = poisoned_pair({s, pc.b, nh, hd}, dt);
        auto gk = poisoned_pair({s, pc.b, ng, hd}, dt);
        auto gv = poisoned_pair({s, pc.b, ng, hd}, dt);
        before = stats_fn()();
        gpu_ops(deterministic)
            .attention_bwd(gq.gpu, gk.gpu, gv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out_g, lse_g, ag);
        const std::pair<const Pair*, const Pair*> pairs[] = {{&gq, &dq}, {&gk, &dk}, {&gv, &dv}};
        const char* names[] = {"dq", "dk", "dv"};
        const std::vector<double>* bounds[] = {&bound.dq, &bound.dk, &bound.dv};
        if (stats_fn()().bwd_calls != before.bwd_calls + 1) {
          std::printf(
              "%s %s: cuDNN refused the packed-document backward (see the 'cuda:cudnn: "
              "cuDNN does not serve' line above for its reason); checking our fallback\n",
              std::string(dtype_name(dt)).c_str(), w.c_str());
          for (int t = 0; t < 3; ++t)
            EXPECT_TRUE(test::all_close(to_doubles(pairs[t].first->gpu),
                                        to_doubles(pairs[t].second->cpu),
                                        {2 * fallback_tol.atol, 2 * fallback_tol.rtol}))
                << "fallback " << names[t] << ": " << w;
          continue;
        }
        for (int t = 0; t < 3; ++t)
          check_grad(names[t], to_doubles(pairs[t].first->gpu), to_doubles(pairs[t].second->cpu),
                     *bounds[t], u, w);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaCudnnAttention, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The registry's table says what runs (needs a cuDNN build, no GPU).
TEST(CudaCudnnAttentionSelection, PreferredWithOurKernelsAsFallbacks) {
  MG_SKIP_WITHOUT_CUDNN();
  const auto& reg = plugin::global_registry();
  const auto fwd = static_cast<std::size_t>(ops::OpId::attention_fwd);
  const auto bwd = static_cast<std::size_t>(ops::OpId::attention_bwd);
  const auto res = reg.resolutions("cuda", cudnn_choice(false));
  EXPECT_EQ(plugin::describe(res[fwd]),
            "cuda:cudnn (else cuda:attention-tiled, cuda:attention-rows)");
  EXPECT_EQ(plugin::describe(res[bwd]),
            "cuda:cudnn (else cuda:attention-tiled, cuda:attention-rows)");
  // Deterministic: the fast backward is excluded, the deterministic one runs.
  const auto det = reg.resolutions("cuda", cudnn_choice(true));
  EXPECT_EQ(plugin::describe(det[bwd]),
            "cuda:cudnn-deterministic (else cuda:attention-tiled, cuda:attention-rows)");
  EXPECT_EQ(det[bwd].excluded, std::vector<std::string>{"cuda:cudnn"});
  // Not preferred: ours run, cuDNN is shadowed (opt-in, as --attention-backend local).
  const auto plain = reg.resolutions("cuda");
  EXPECT_EQ(plugin::describe(plain[fwd]), "cuda:attention-tiled (else cuda:attention-rows)");
  // Preferring the non-deterministic backward in a deterministic run is refused, naming why.
  plugin::ResolveOptions bad = cudnn_choice(true);
  bad.providers["attention_bwd"] = "cuda:cudnn";
  const std::string msg = test::error_message([&] { plugin::global_registry().ops("cuda", bad); });
  EXPECT_NE(msg.find("is not deterministic"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mg
