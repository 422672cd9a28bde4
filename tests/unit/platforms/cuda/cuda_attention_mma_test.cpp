// The opt-in tensor-core attention forward (megatron/platforms/cuda/attention_mma.cu, the registry
// provider "cuda:attention-mma" of attention_fwd, preferred through ResolveOptions::providers as
// MG_OP_PROVIDERS=attention_fwd=cuda:attention-mma does) against the CPU platform's attention_fwd:
// bf16 and f16, head dim 64 and 128, causal and not, GQA and MQA, Sk > Sq and Sk < Sq
// (bottom-right causal: rows that see no key), doc_ids with padding rows, doc_ids + kv_doc_ids
// with padding keys, cu_seqlens, attention dropout (the CPU's Philox bits), sequence lengths that
// are not multiples of the 64-row tile, and outputs poisoned with NaN. The resolution table must
// name it (with the tiled and row kernels as fallbacks), and an unknown provider must fail naming
// the valid ones; those two need the CUDA build only, the numerical tests skip without a GPU.
//
// Tolerances, derived (u: the unit roundoff of the storage dtype, 2^-8 for bf16, 2^-11 for f16):
//   out: the mma kernel rounds each (dropped, scaled) probability P_j to the dtype before the PV
//     product; out = sum_j P_j V_j / l then moves by at most u * sum_j P_j |V_j| / l <=
//     u * max|V| / (1 - p) (sum_j P_j = l before dropout's 1/(1-p)); f16 subnormal P (< 2^-14)
//     adds at most Sk * 2^-25 * max|V| / (1 - p). Both platforms compute the scores in f32 in
//     different summation orders: each score is within HD * 2^-24 * |q| |k| scale of the exact one
//     on either side, delta = 2 * HD * 2^-24 * HD * scale * max|q| max|k|, and a softmax average
//     moves by at most 2 * delta * max|V| (weights shift by <= delta each, V spans 2 max|V|).
//     The row sums l (Sk f32 terms, different orders) differ relatively by <= Sk * 2^-24, which
//     moves out by that times max|V| / (1 - p). Both round out to the dtype once: rtol 2u.
//   lse: unaffected by the rounding of P; the scores' delta, log(l)'s Sk * 2^-24 and the f32
//     rounding of log/exp: atol delta + Sk * 2^-24, rtol 2^-21.
#include <algorithm>
#include <cmath>
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

const ops::OpTable& cpu_ops() {
  return test::ops_on("cpu");
}
// The choice that makes the tensor-core forward run first (other calls fall back to the tiled and
// row kernels).
plugin::ResolveOptions mma_choice() {
  plugin::ResolveOptions o;
  o.providers = {{"attention_fwd", "cuda:attention-mma"}};
  return o;
}
// The CUDA table resolved with that choice.
const ops::OpTable& gpu_ops() {
  test::ensure_runtime();
  return plugin::global_registry().ops("cuda", mma_choice());
}

struct Pair {
  Tensor cpu, gpu;
};
// Values in [0.1, 1] with random signs (so max|q|, max|k|, max|v| <= 1), rounded to dtype once.
Pair random_pair(const Shape& shape, DType dtype, uint64_t seed) {
  auto h = make_tensor(random_values(static_cast<std::size_t>(shape_numel(shape)), seed), shape,
                       dtype, Device::cpu());
  return {h.t, h.t.to(kGpu)};
}
// The CPU side empty, the GPU side NaN: every element must be written.
Pair poisoned_pair(const Shape& shape, DType dtype) {
  auto nan = make_tensor(std::vector<double>(static_cast<std::size_t>(shape_numel(shape)), kNaN),
                         shape, dtype, kGpu);
  return {Tensor::empty(shape, dtype), nan.t};
}

enum class Mask { none, docs_padding, docs_kv, cu_seqlens };

struct Case {
  int64_t sq, sk, b, nh, ng;
  Mask mask;
  float p;  // dropout
  const char* what;
};

const std::vector<Case> kCases = {
    {130, 130, 2, 4, 2, Mask::none, 0.0f, "GQA, S = 130 (a partial tile)"},
    {200, 200, 1, 3, 1, Mask::docs_padding, 0.1f, "MQA, doc_ids with padding rows, dropout"},
    {100, 170, 2, 2, 2, Mask::docs_kv, 0.15f, "Sk > Sq, doc_ids + kv_doc_ids, padding keys"},
    {130, 70, 1, 2, 1, Mask::none, 0.0f, "Sk < Sq (causal rows that see no key)"},
    {1, 1, 1, 1, 1, Mask::none, 0.0f, "S = 1"},
    {257, 257, 2, 2, 1, Mask::cu_seqlens, 0.2f, "cu_seqlens, dropout, S = 257"},
    {64, 320, 1, 2, 1, Mask::none, 0.1f, "one query tile over five key tiles, dropout"},
};

// Query documents: the first 17 positions of each row padding (-1), then documents of 70.
std::vector<int32_t> query_docs(int64_t b, int64_t s) {
  std::vector<int32_t> d(static_cast<std::size_t>(b * s));
  for (int64_t i = 0; i < b * s; ++i) d[i] = (i % s) < 17 ? -1 : static_cast<int32_t>((i % s) / 70);
  return d;
}
// Key documents over Sk positions spread like the queries' (scaled), with padding keys (-1) at
// every 11th position.
std::vector<int32_t> key_docs(int64_t b, int64_t sq, int64_t sk) {
  std::vector<int32_t> d(static_cast<std::size_t>(b * sk));
  for (int64_t i = 0; i < b * sk; ++i) {
    const int64_t j = i % sk;
    d[i] = j % 11 == 5 ? -1 : static_cast<int32_t>((j * sq / sk) / 70);
  }
  return d;
}

class CudaAttentionMma : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
};

TEST_P(CudaAttentionMma, ForwardMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const DType dt = dtype();
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  for (int64_t hd : {64, 128}) {
    for (bool causal : {true, false}) {
      for (const Case& c : kCases) {
        auto q = random_pair({c.sq, c.b, c.nh, hd}, dt, 31);
        auto k = random_pair({c.sk, c.b, c.ng, hd}, dt, 32);
        auto v = random_pair({c.sk, c.b, c.ng, hd}, dt, 33);
        ops::AttentionArgs ac;
        ac.causal = causal;
        ac.dropout = {c.p, 7, 1000};
        if (c.mask == Mask::docs_padding || c.mask == Mask::docs_kv)
          ac.doc_ids = Tensor::from_vector(query_docs(c.b, c.sq), {c.b, c.sq}, DType::i32);
        if (c.mask == Mask::docs_kv)
          ac.kv_doc_ids = Tensor::from_vector(key_docs(c.b, c.sq, c.sk), {c.b, c.sk}, DType::i32);
        if (c.mask == Mask::cu_seqlens) {
          const std::vector<int32_t> cu = {0, 50, 64, 129, static_cast<int32_t>(c.sq)};
          ac.cu_seqlens = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())}, DType::i32);
        }
        ops::AttentionArgs ag = ac;
        if (ac.doc_ids.defined()) ag.doc_ids = ac.doc_ids.to(kGpu);
        if (ac.kv_doc_ids.defined()) ag.kv_doc_ids = ac.kv_doc_ids.to(kGpu);
        if (ac.cu_seqlens.defined()) ag.cu_seqlens = ac.cu_seqlens.to(kGpu);
        auto out = poisoned_pair({c.sq, c.b, c.nh, hd}, dt);
        auto lse = poisoned_pair({c.b, c.nh, c.sq}, DType::f32);
        cpu_ops().attention_fwd(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, ac);
        gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, ag);

        const double keep = 1.0 / (1.0 - c.p), scale = 1.0 / std::sqrt(static_cast<double>(hd));
        const double delta = 2.0 * static_cast<double>(hd) * std::ldexp(1.0, -24) *
                             static_cast<double>(hd) * scale;  // max|q| = max|k| = 1
        const double sum_err = static_cast<double>(c.sk) * std::ldexp(1.0, -24);
        double atol = u * keep + 2.0 * delta * keep + sum_err * keep;
        if (dt == DType::f16) atol += static_cast<double>(c.sk) * std::ldexp(1.0, -25) * keep;
        const test::Tol out_tol{atol, 2.0 * u};
        const test::Tol lse_tol{delta + sum_err, std::ldexp(1.0, -21)};

        const std::string what =
            std::string(c.what) + ", hd " + std::to_string(hd) + ", causal " + (causal ? "1" : "0");
        const auto og = to_doubles(out.gpu), oc = to_doubles(out.cpu);
        const auto lg = to_doubles(lse.gpu), lc = to_doubles(lse.cpu);
        for (double x : og) ASSERT_FALSE(std::isnan(x)) << "NaN in out: " << what;
        for (double x : lg) ASSERT_FALSE(std::isnan(x)) << "NaN in lse: " << what;
        EXPECT_TRUE(test::all_close(og, oc, out_tol)) << "out: " << what;
        EXPECT_TRUE(test::all_close(lg, lc, lse_tol)) << "lse: " << what;
        // Rows that attend nothing: lse -inf and out 0 on both.
        for (std::size_t r = 0; r < lc.size(); ++r) {
          if (std::isinf(lc[r])) {
            EXPECT_EQ(lg[r], lc[r]) << "lse row " << r << ": " << what;
          }
        }
      }
    }
  }
}

TEST_P(CudaAttentionMma, BackwardFromTheMmaForwardMatchesCpu) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  // The backward (attention.cu's kernels) reads the mma forward's out and lse: gradients within
  // twice the dtype's tolerance of the CPU's computed from the CPU's forward.
  const DType dt = dtype();
  const int64_t s = 150, b = 2, nh = 4, ng = 2, hd = 64;
  auto q = random_pair({s, b, nh, hd}, dt, 41);
  auto k = random_pair({s, b, ng, hd}, dt, 42);
  auto v = random_pair({s, b, ng, hd}, dt, 43);
  auto dout = random_pair({s, b, nh, hd}, dt, 44);
  ops::AttentionArgs ac;
  ac.dropout = {0.1f, 3, 77};
  ac.doc_ids = Tensor::from_vector(query_docs(b, s), {b, s}, DType::i32);
  ops::AttentionArgs ag = ac;
  ag.doc_ids = ac.doc_ids.to(kGpu);
  auto out = poisoned_pair({s, b, nh, hd}, dt);
  auto lse = poisoned_pair({b, nh, s}, DType::f32);
  cpu_ops().attention_fwd(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, ac);
  gpu_ops().attention_fwd(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, ag);
  auto dq = poisoned_pair({s, b, nh, hd}, dt);
  auto dk = poisoned_pair({s, b, ng, hd}, dt);
  auto dv = poisoned_pair({s, b, ng, hd}, dt);
  cpu_ops().attention_bwd(dq.cpu, dk.cpu, dv.cpu, dout.cpu, q.cpu, k.cpu, v.cpu, out.cpu, lse.cpu,
                          ac);
  gpu_ops().attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out.gpu, lse.gpu,
                          ag);
  const auto tol = test::tolerance(dt);
  for (auto* g : {&dq, &dk, &dv})
    EXPECT_TRUE(
        test::all_close(to_doubles(g->gpu), to_doubles(g->cpu), {2 * tol.atol, 2 * tol.rtol}));
}

// The registry's table, not an environment variable, says what runs (resolution needs no GPU).
TEST(CudaAttentionMmaSelection, TableNamesTheTensorCoreForwardAndItsFallbacks) {
  test::ensure_runtime();
  const auto& reg = plugin::global_registry();
  if (!reg.find_platform("cuda")) GTEST_SKIP() << "this build has no CUDA platform";
  const auto fwd = static_cast<std::size_t>(ops::OpId::attention_fwd);
  const auto chosen = reg.resolutions("cuda", mma_choice())[fwd];
  EXPECT_EQ(chosen.provider, "cuda:attention-mma");
  EXPECT_TRUE(chosen.preferred);
  EXPECT_TRUE(chosen.supports_predicate);
  EXPECT_EQ(chosen.fallbacks,
            (std::vector<std::string>{"cuda:attention-tiled", "cuda:attention-rows"}));
  // Opt-in: the default table runs the tiled kernel and shadows the tensor-core one.
  const auto plain = reg.resolutions("cuda")[fwd];
  EXPECT_EQ(plain.provider, "cuda:attention-tiled");
  EXPECT_NE(std::find(plain.shadowed.begin(), plain.shadowed.end(), "cuda:attention-mma"),
            plain.shadowed.end());  // with cuDNN's forward ("cuda:cudnn") in a cuDNN build
}

TEST(CudaAttentionMmaSelection, UnknownProviderFailsNamingTheValidOnes) {
  test::ensure_runtime();
  auto& reg = plugin::global_registry();
  if (!reg.find_platform("cuda")) GTEST_SKIP() << "this build has no CUDA platform";
  plugin::ResolveOptions o;
  o.providers = plugin::parse_op_providers("attention_fwd=cuda:attention-wgmma", "MG_OP_PROVIDERS");
  const std::string msg = test::error_message([&] { reg.ops("cuda", o); });
  EXPECT_NE(msg.find("'attention_fwd=cuda:attention-wgmma'"), std::string::npos) << msg;
  // cuDNN's forward ranks between them in a cuDNN build (an alternative registered later).
  EXPECT_TRUE(msg.find("its providers: cuda:attention-tiled, cuda:attention-rows, "
                       "cuda:attention-mma") != std::string::npos ||
              msg.find("its providers: cuda:attention-tiled, cuda:attention-rows, cuda:cudnn, "
                       "cuda:attention-mma") != std::string::npos)
      << msg;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttentionMma, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace mg
