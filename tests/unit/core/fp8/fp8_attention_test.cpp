// FP8 dot-product attention (--fp8-dot-product-attention, Transformer Engine's fp8_dpa; docs/fp8.md
// "FP8 attention"):
//   - the CPU ops fp8_attention_fwd / fp8_attention_bwd bit for bit against an independent
//     implementation of their definition: tests/fixtures/fp8/fp8_attention_fixture.txt
//     (gen_fp8_attention_fixture.py: ml_dtypes casts, numpy f32 arithmetic) -- GQA and MQA,
//     causal and not, the hybrid and e4m3 formats, trained and first-step (all 1) scales; with
//     one OpenMP thread and with all;
//   - the forward close to the model-dtype attention of the dequantised q, k, v within the bound
//     of its two FP8 roundings (P and O); fp8_dequantize against the decode; bad inputs refused;
//   - in a 2-layer LLaMA: the core attentions registered with Fp8State (not in layers kept out by
//     --first-last-layers-bf16), the fp8_attention ops run and attention_fwd/bwd do not, their
//     six amaxes recorded and scaled by delayed scaling (amax_S = 1 under the causal mask),
//     nothing recorded in evaluation, selective recompute bit-identical, the state in the
//     checkpoint JSON, losses near the run without the flag but not equal to it; with
//     NVTE_FP8_DPA_BWD=0 the backward through attention_bwd in the model dtype.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/inference/inference_context.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/op_profiler.h"
#include "megatron/core/tensor/dtype_math.h"
#include "megatron/runtime.h"
#include "tests/unit/core/fp8/fp8_model_run.h"
#include "tests/unit/core/models/gpt_test_util.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

float from_hex(const std::string& h) {
  return std::bit_cast<float>(static_cast<uint32_t>(std::stoul(h, nullptr, 16)));
}

DType fmt_dtype(const std::string& f) {
  return f == "e4m3" ? DType::fp8_e4m3 : DType::fp8_e5m2;
}

// One fixture case: its header fields and named tensors (FP8 as bytes, f32 as values).
struct Case {
  std::string name, qf, gf;
  int64_t b = 0, s = 0, nh = 0, ng = 0, hd = 0;
  bool causal = true;
  float softmax_scale = 0.0f;
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::map<std::string, std::vector<float>> floats;
};

std::vector<Case> read_cases() {
  const std::string path = std::string(MG_TEST_FIXTURES_DIR) + "/fp8/fp8_attention_fixture.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<Case> cases;
  std::string line;
  const std::vector<std::string> f32_names = {
      "fwd_scale", "fwd_scale_inv", "bwd_scale", "bwd_scale_inv", "lse", "amax_fwd", "amax_bwd"};
  while (std::getline(in, line)) {
    std::istringstream is(line);
    std::string tag;
    is >> tag;
    if (tag == "case") {
      Case c;
      int causal = 0;
      std::string scale;
      is >> c.name >> c.b >> c.s >> c.nh >> c.ng >> c.hd >> causal >> scale >> c.qf >> c.gf;
      c.causal = causal != 0;
      c.softmax_scale = from_hex(scale);
      cases.push_back(c);
      continue;
    }
    EXPECT_FALSE(cases.empty()) << "fixture: " << tag << " before any case";
    if (cases.empty()) break;
    Case& c = cases.back();
    int64_t n = 0;
    is >> n;
    const bool is_f32 = std::find(f32_names.begin(), f32_names.end(), tag) != f32_names.end();
    for (int64_t i = 0; i < n; ++i) {
      std::string h;
      is >> h;
      if (is_f32)
        c.floats[tag].push_back(from_hex(h));
      else
        c.bytes[tag].push_back(static_cast<uint8_t>(std::stoul(h, nullptr, 16)));
    }
  }
  return cases;
}

Tensor fp8_tensor(const std::vector<uint8_t>& v, const Shape& shape, DType t) {
  Tensor x = Tensor::empty(shape, t);
  EXPECT_EQ(static_cast<std::size_t>(x.numel()), v.size());
  std::copy(v.begin(), v.end(), static_cast<uint8_t*>(x.raw_data()));
  return x;
}

std::vector<uint8_t> bytes_of(const Tensor& q) {
  const auto* p = static_cast<const uint8_t*>(q.raw_data());
  return std::vector<uint8_t>(p, p + q.numel());
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

void check_case(const Case& c) {
  const ops::OpTable& ops = test::ops_on("cpu");
  const DType qd = fmt_dtype(c.qf), gd = fmt_dtype(c.gf);
  const Shape qs{c.s, c.b, c.nh, c.hd}, ks{c.s, c.b, c.ng, c.hd};
  const Tensor q = fp8_tensor(c.bytes.at("q"), qs, qd), k = fp8_tensor(c.bytes.at("k"), ks, qd),
               v = fp8_tensor(c.bytes.at("v"), ks, qd);
  const Tensor dout = fp8_tensor(c.bytes.at("dout"), qs, gd);
  auto vec = [&](const char* n) { return Tensor::from_vector(c.floats.at(n), {3}); };
  const Tensor fs = vec("fwd_scale"), fsi = vec("fwd_scale_inv"), bs = vec("bwd_scale"),
               bsi = vec("bwd_scale_inv");
  ops::AttentionArgs a;
  a.causal = c.causal;
  a.softmax_scale = c.softmax_scale;
  Tensor out = Tensor::empty(qs, qd), lse = Tensor::empty({c.b, c.nh, c.s}, DType::f32);
  Tensor amax = Tensor::empty({2}, DType::f32);
  ops.fp8_attention_fwd(out, lse, amax, q, k, v, fs, fsi, a);
  EXPECT_EQ(bytes_of(out), c.bytes.at("out")) << c.name << ": out";
  EXPECT_EQ(bits_of(lse.to_vector<float>()), bits_of(c.floats.at("lse"))) << c.name << ": lse";
  EXPECT_EQ(bits_of(amax.to_vector<float>()), bits_of(c.floats.at("amax_fwd")))
      << c.name << ": amax (S, O)";
  // The backward from the fixture's own forward results (equal to ours when the above hold).
  const Tensor out_ref = fp8_tensor(c.bytes.at("out"), qs, qd);
  const Tensor lse_ref = Tensor::from_vector(c.floats.at("lse"), {c.b, c.nh, c.s});
  Tensor dq = Tensor::empty(qs, gd), dk = Tensor::empty(ks, gd), dv = Tensor::empty(ks, gd);
  Tensor amax4 = Tensor::empty({4}, DType::f32);
  ops.fp8_attention_bwd(dq, dk, dv, amax4, dout, q, k, v, out_ref, lse_ref, fs, fsi, bs, bsi, a);
  EXPECT_EQ(bytes_of(dq), c.bytes.at("dq")) << c.name << ": dq";
  EXPECT_EQ(bytes_of(dk), c.bytes.at("dk")) << c.name << ": dk";
  EXPECT_EQ(bytes_of(dv), c.bytes.at("dv")) << c.name << ": dv";
  EXPECT_EQ(bits_of(amax4.to_vector<float>()), bits_of(c.floats.at("amax_bwd")))
      << c.name << ": amax (dP, dQ, dK, dV)";
}

TEST(Fp8AttentionOps, MatchTheReferenceBitForBit) {
  const std::vector<Case> cases = read_cases();
  ASSERT_EQ(cases.size(), 3u);
  const int threads = omp_get_max_threads();
  for (int t : {1, threads}) {
    omp_set_num_threads(t);
    for (const Case& c : cases) check_case(c);
  }
  omp_set_num_threads(threads);
}

// f(x) of an FP8 byte.
double decode(uint8_t b, DType t) {
  return t == DType::fp8_e4m3 ? dmath::e4m3_to_f32(b) : dmath::e5m2_to_f32(b);
}

TEST(Fp8AttentionOps, DequantizeIsTheDecodeTimesScaleInv) {
  const ops::OpTable& ops = test::ops_on("cpu");
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[static_cast<std::size_t>(i)] = static_cast<uint8_t>(i);
  const float si = 0.3712f;
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    const Tensor q = fp8_tensor(all, {16, 16}, t);
    Tensor y32 = Tensor::empty({16, 16}, DType::f32), y16 = Tensor::empty({16, 16}, DType::bf16);
    ops.fp8_dequantize(y32, q, Tensor::from_vector(std::vector<float>{si}, {1}));
    ops.fp8_dequantize(y16, q, Tensor::from_vector(std::vector<float>{si}, {1}));
    const std::vector<float> a = y32.to_vector<float>(), b = y16.to_vector<float>();
    for (int i = 0; i < 256; ++i) {
      const float want = static_cast<float>(decode(static_cast<uint8_t>(i), t)) * si;
      const auto iu = static_cast<std::size_t>(i);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(a[iu]) && std::isnan(b[iu])) << i;
        continue;
      }
      EXPECT_EQ(std::bit_cast<uint32_t>(a[iu]), std::bit_cast<uint32_t>(want)) << i;
      EXPECT_EQ(b[iu], dmath::bf16_to_f32(dmath::f32_to_bf16(want))) << i;
    }
  }
}

TEST(Fp8AttentionOps, RefuseWhatTheyDoNotServe) {
  const ops::OpTable& ops = test::ops_on("cpu");
  const Tensor q = Tensor::zeros({16, 1, 2, 16}, DType::fp8_e4m3),
               k = Tensor::zeros({16, 1, 2, 16}, DType::fp8_e4m3);
  const Tensor one3 = Tensor::from_vector(std::vector<float>{1.0f, 1.0f, 1.0f}, {3});
  Tensor out = Tensor::empty({16, 1, 2, 16}, DType::fp8_e4m3),
         lse = Tensor::empty({1, 2, 16}, DType::f32), amax = Tensor::empty({2}, DType::f32);
  ops::AttentionArgs a;
  EXPECT_NO_THROW(ops.fp8_attention_fwd(out, lse, amax, q, k, k, one3, one3, a));
  const Tensor qb = Tensor::zeros({16, 1, 2, 16}, DType::bf16);
  EXPECT_THROW(ops.fp8_attention_fwd(out, lse, amax, qb, k, k, one3, one3, a), Error);
  ops::AttentionArgs drop = a;
  drop.dropout.p = 0.1f;
  EXPECT_THROW(ops.fp8_attention_fwd(out, lse, amax, q, k, k, one3, one3, drop), Error);
  ops::AttentionArgs docs = a;
  docs.doc_ids = Tensor::zeros({1, 16}, DType::i32);
  EXPECT_THROW(ops.fp8_attention_fwd(out, lse, amax, q, k, k, one3, one3, docs), Error);
  const Tensor k8 = Tensor::zeros({8, 1, 2, 16}, DType::fp8_e4m3);  // Sk != Sq
  EXPECT_THROW(ops.fp8_attention_fwd(out, lse, amax, q, k8, k8, one3, one3, a), Error);
  Tensor amax1 = Tensor::empty({1}, DType::f32);
  EXPECT_THROW(ops.fp8_attention_fwd(out, lse, amax1, q, k, k, one3, one3, a), Error);
  const Tensor one1 = Tensor::from_vector(std::vector<float>{1.0f}, {1});
  EXPECT_THROW(ops.fp8_attention_fwd(out, lse, amax, q, k, k, one1, one3, a), Error);
  const Tensor kmix = Tensor::zeros({16, 1, 2, 16}, DType::fp8_e5m2);
  EXPECT_THROW(ops.fp8_attention_fwd(out, lse, amax, q, kmix, kmix, one3, one3, a), Error);
}

// The forward against the attention of the dequantised q, k, v in f64: the FP8 op rounds P (at
// scale_S) and O (at scale_O) to E4M3. Per element, with u = 2^-4 (E4M3's unit roundoff) and
// t = 2^-10 (half its smallest subnormal step, the absolute error of a value below 2^-6):
//   |f(p8)/S - p| <= u p + t/S, so |o' - o| <= sum_j (u p_j + t/S) |v_j| (+ f32 rounding),
//   |f(out8)/O - o'| <= u |o'| + t/O.
// The test checks |out - o| <= 1.01 (u A + t/S B + u (|o| + u A + t/S B) + t/O) with A = sum_j
// p_j |v_j|, B = sum_j |v_j|.
TEST(Fp8AttentionOps, ForwardWithinTheTwoRoundingsOfTheAttention) {
  const ops::OpTable& ops = test::ops_on("cpu");
  const int64_t S = 32, B = 2, NH = 4, NG = 2, HD = 32;
  std::vector<float> xq(static_cast<std::size_t>(S * B * NH * HD)),
      xk(static_cast<std::size_t>(S * B * NG * HD)), xv(xk.size());
  uint64_t st = 12345;
  auto normal = [&] {
    double u1 = 0, u2 = 0;
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    u1 = (static_cast<double>(st >> 11) + 0.5) / 9007199254740992.0;
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    u2 = (static_cast<double>(st >> 11) + 0.5) / 9007199254740992.0;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  };
  for (float& x : xq) x = normal();
  for (float& x : xk) x = normal();
  for (float& x : xv) x = 1.5f * normal();
  auto cast = [&](const std::vector<float>& x, const Shape& s, float scale) {
    Tensor q = Tensor::empty(s, DType::fp8_e4m3), none;
    Tensor amax = Tensor::zeros({1}, DType::f32);
    ops.fp8_cast_transpose(q, none, amax, Tensor::from_vector(x, s),
                           Tensor::from_vector(std::vector<float>{scale}, {1}));
    return q;
  };
  const float sq = 448.0f / 5.0f, ss = 448.0f, so = 448.0f / 4.0f;
  const Shape qs{S, B, NH, HD}, ks{S, B, NG, HD};
  const Tensor q = cast(xq, qs, sq), k = cast(xk, ks, sq), v = cast(xv, ks, sq);
  const Tensor fs = Tensor::from_vector(std::vector<float>{sq, ss, so}, {3});
  const Tensor fsi = Tensor::from_vector(std::vector<float>{1 / sq, 1 / ss, 1 / so}, {3});
  Tensor out = Tensor::empty(qs, DType::fp8_e4m3), lse = Tensor::empty({B, NH, S}, DType::f32);
  Tensor amax = Tensor::empty({2}, DType::f32);
  ops.fp8_attention_fwd(out, lse, amax, q, k, v, fs, fsi, ops::AttentionArgs{});
  EXPECT_EQ(amax.to_vector<float>()[0], 1.0f) << "causal: row 0 has one key, p = 1";
  const std::vector<uint8_t> qb = bytes_of(q), kb = bytes_of(k), vb = bytes_of(v),
                             ob = bytes_of(out);
  const double u = 1.0 / 16, t = 1.0 / 1024, c = 1.0 / std::sqrt(double(HD));
  auto at = [](int64_t i, int64_t b, int64_t h, int64_t d, int64_t nb, int64_t nh, int64_t hd) {
    return static_cast<std::size_t>(((i * nb + b) * nh + h) * hd + d);
  };
  double worst = 0.0, max_o = 0.0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / (NH / NG);
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> s(static_cast<std::size_t>(i + 1));
        double m = -1e300, l = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0.0;
          for (int64_t d = 0; d < HD; ++d)
            acc += decode(qb[at(i, b, h, d, B, NH, HD)], DType::fp8_e4m3) *
                   decode(kb[at(j, b, g, d, B, NG, HD)], DType::fp8_e4m3);
          s[static_cast<std::size_t>(j)] = acc * c / sq / sq;
          m = std::max(m, s[static_cast<std::size_t>(j)]);
        }
        for (double& x : s) l += (x = std::exp(x - m));
        for (int64_t d = 0; d < HD; ++d) {
          double o = 0.0, A = 0.0, Bs = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            const double vj = decode(vb[at(j, b, g, d, B, NG, HD)], DType::fp8_e4m3) / sq;
            const double p = s[static_cast<std::size_t>(j)] / l;
            o += p * vj;
            A += p * std::fabs(vj);
            Bs += std::fabs(vj);
          }
          const double got = decode(ob[at(i, b, h, d, B, NH, HD)], DType::fp8_e4m3) / so;
          const double e1 = u * A + t / ss * Bs;
          const double bound = 1.01 * (e1 + u * (std::fabs(o) + e1) + t / so);
          const double err = std::fabs(got - o);
          ASSERT_LE(err, bound) << "b " << b << " h " << h << " i " << i << " d " << d;
          worst = std::max(worst, err / bound);
          max_o = std::max(max_o, std::fabs(o));
        }
      }
    }
  EXPECT_GT(max_o, 0.1);   // a real attention output, not zeros
  EXPECT_GT(worst, 0.05);  // the bound is not vacuous: some element uses a good part of it
}

// ---- in a model ---------------------------------------------------------------------------------

// A 2-layer LLaMA (causal, GQA) in FP8 hybrid with delayed scaling (sizes multiples of 16).
transformer::TransformerConfig fp8_llama(bool dpa, int64_t history) {
  transformer::TransformerConfig c = test::tiny_llama_config();
  c.hidden_size = 32;
  c.ffn_hidden_size = 64;
  c.seq_length = 16;
  c.fp8.format = fp8::Fp8Format::hybrid;
  c.fp8.recipe = fp8::Fp8Recipe::delayed;
  c.fp8.amax_history_len = history;
  c.fp8.dot_product_attention = dpa;
  return c;
}

transformer::TransformerConfig fp8_llama_dtype(DType dtype) {
  transformer::TransformerConfig c = fp8_llama(true, 1);
  c.params_dtype = dtype;
  return c;
}

using test::FbRun;
using test::run_fb_profiled;

TEST(Fp8DotProductAttention, RunsTheFp8OpsAndRecordsTheirAmaxes) {
  const FbRun r = run_fb_profiled(fp8_llama(true, 4), 1, 1, false);
  ASSERT_EQ(r.attentions, 2);
  ASSERT_EQ(r.linears, 8);
  EXPECT_EQ(r.calls("fp8_attention_fwd"), 2);
  EXPECT_EQ(r.calls("fp8_attention_bwd"), 2);
  EXPECT_EQ(r.calls("attention_fwd") + r.calls("attention_bwd"), 0);
  // One forward update: the pass's row 0 is now the last row (history 4) of slots [16, 22) (the
  // attentions after the 16 linear slots): QKV > 0, S = 1 exactly (causal: query 0 sees one key),
  // O > 0; the scale of S = 448 / 1.
  const int64_t fslots = 2 * 8 + 3 * 2, bslots = 8 + 3 * 2;
  ASSERT_EQ(r.fwd_history.size(), static_cast<std::size_t>(4 * fslots));
  for (int a = 0; a < 2; ++a) {
    const int64_t f = 16 + 3 * a, bw = 8 + 3 * a;
    auto fh = [&](int64_t col) {
      return r.fwd_history[static_cast<std::size_t>(3 * fslots + col)];
    };
    auto bh = [&](int64_t col) {
      return r.bwd_history[static_cast<std::size_t>(3 * bslots + col)];
    };
    EXPECT_GT(fh(f), 0.0f) << "QKV of attention " << a;
    EXPECT_EQ(fh(f + 1), 1.0f) << "S of attention " << a;
    EXPECT_GT(fh(f + 2), 0.0f) << "O of attention " << a;
    EXPECT_EQ(r.fwd_scale[static_cast<std::size_t>(f + 1)], 448.0f);
    for (int x = 0; x < 3; ++x) EXPECT_GT(bh(bw + x), 0.0f) << "dO/dP/dQKV " << x;
  }
}

TEST(Fp8DotProductAttention, EvaluationRecordsNothing) {
  const FbRun r = run_fb_profiled(fp8_llama(true, 2), 2, 1, true);
  EXPECT_EQ(r.calls("fp8_attention_fwd"), 4);
  for (float h : r.fwd_history) EXPECT_EQ(h, 0.0f);
}

TEST(Fp8DotProductAttention, KeepsOutTheBf16Layers) {
  transformer::TransformerConfig c = fp8_llama(true, 1);
  c.fp8.first_last_layers_bf16 = true;
  c.fp8.num_layers_at_start_in_bf16 = 1;
  c.fp8.num_layers_at_end_in_bf16 = 0;
  const FbRun r = run_fb_profiled(c, 1, 1, false);
  EXPECT_EQ(r.attentions, 1);
  EXPECT_EQ(r.calls("fp8_attention_fwd"), 1);
  EXPECT_EQ(r.calls("attention_fwd"), 1);
  ASSERT_TRUE(r.state.contains("attentions"));
  EXPECT_TRUE(r.state["attentions"].contains("decoder.layers.1.self_attention.core_attention"));
  EXPECT_FALSE(r.state["attentions"].contains("decoder.layers.0.self_attention.core_attention"));
}

TEST(Fp8DotProductAttention, SelectiveRecomputeGivesTheSameNumbers) {
  transformer::TransformerConfig c = fp8_llama(true, 4);
  const FbRun plain = run_fb_profiled(c, 2, 2, false);
  c.recompute_granularity = transformer::RecomputeGranularity::selective;
  const FbRun recomputed = run_fb_profiled(c, 2, 2, false);
  EXPECT_EQ(recomputed.calls("fp8_attention_fwd"),
            plain.calls("fp8_attention_fwd") +
                plain.calls("fp8_attention_bwd"));  // once more per backward
  EXPECT_EQ(plain.losses, recomputed.losses);
  EXPECT_EQ(plain.grads, recomputed.grads);
  EXPECT_EQ(plain.fwd_history, recomputed.fwd_history);  // the recompute records nothing
  EXPECT_EQ(plain.bwd_history, recomputed.bwd_history);
}

// NVTE_FP8_DPA_BWD=0 (Transformer Engine's switch): the forward in FP8, the backward through
// attention_bwd in the model dtype on the saved q, k, v and the dequantised out. The forward's
// losses equal the FP8 backward's in the first call (same forward), the gradients differ; the
// backward slots record nothing; selective recompute gives the same numbers.
TEST(Fp8DotProductAttention, ModelDtypeBackward) {
  transformer::TransformerConfig c = fp8_llama(true, 2);
  const FbRun fp8_bwd = run_fb_profiled(c, 1, 2, false);
  c.fp8.dot_product_attention_fp8_backward = false;
  const FbRun bf16_bwd = run_fb_profiled(c, 1, 2, false);
  EXPECT_EQ(bf16_bwd.calls("fp8_attention_fwd"), 4);
  EXPECT_EQ(bf16_bwd.calls("fp8_attention_bwd"), 0);
  EXPECT_EQ(bf16_bwd.calls("attention_bwd"), 4);
  EXPECT_EQ(bf16_bwd.calls("attention_fwd"), 0);
  EXPECT_EQ(bf16_bwd.losses[0], fp8_bwd.losses[0]);
  EXPECT_NE(bf16_bwd.grads, fp8_bwd.grads);
  const int64_t bslots = 8 + 3 * 2;
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t col = 8; col < bslots; ++col)
      EXPECT_EQ(bf16_bwd.bwd_history[static_cast<std::size_t>(row * bslots + col)], 0.0f) << col;
  c.recompute_granularity = transformer::RecomputeGranularity::selective;
  const FbRun recomputed = run_fb_profiled(c, 1, 2, false);
  EXPECT_EQ(recomputed.losses, bf16_bwd.losses);
  EXPECT_EQ(recomputed.grads, bf16_bwd.grads);
}

TEST(Fp8DotProductAttention, NearTheModelDtypeAttentionButNotEqual) {
  const FbRun fp8 = run_fb_profiled(fp8_llama(true, 1), 2, 3, false);
  const FbRun ref = run_fb_profiled(fp8_llama(false, 1), 2, 3, false);
  ASSERT_EQ(fp8.losses.size(), ref.losses.size());
  bool differ = false;
  for (std::size_t i = 0; i < fp8.losses.size(); ++i) {
    // The loss moves by the attention's FP8 roundings (E4M3's u = 2^-4 per value, averaged over
    // the tokens): within u of the loss.
    EXPECT_NEAR(fp8.losses[i], ref.losses[i], std::fabs(ref.losses[i]) / 16) << i;
    differ = differ || fp8.losses[i] != ref.losses[i];
  }
  EXPECT_TRUE(differ) << "--fp8-dot-product-attention changed nothing";
  EXPECT_NE(fp8.grads, ref.grads);
}

TEST(Fp8DotProductAttention, StateTravelsInTheCheckpointJson) {
  const FbRun r = run_fb_profiled(fp8_llama(true, 3), 1, 2, false);
  const transformer::TransformerConfig c = fp8_llama(true, 3);
  const ops::OpTable& ops = test::ops_on("cpu");
  models::GPTModel fresh(c, 64, ops, Device::cpu());
  fresh.fp8_state()->load_state_json(r.state);
  EXPECT_EQ(fresh.fp8_state()->history(true), r.fwd_history);
  EXPECT_EQ(fresh.fp8_state()->history(false), r.bwd_history);
  EXPECT_EQ(fresh.fp8_state()->scale(true), r.fwd_scale);
  // A checkpoint without FP8 attention state (a run without the flag): fresh attention slots.
  nlohmann::json old = r.state;
  old.erase("attentions");
  models::GPTModel other(c, 64, ops, Device::cpu());
  other.fp8_state()->load_state_json(old);
  const std::vector<float> s = other.fp8_state()->scale(true);
  for (int64_t slot = 16; slot < 22; ++slot) EXPECT_EQ(s[static_cast<std::size_t>(slot)], 1.0f);
  EXPECT_EQ(s[0], r.fwd_scale[0]);  // the linears' state loaded
}

// ---- --fp8-multi-head-attention (Transformer Engine's fp8_mha)
// -----------------------------------

transformer::TransformerConfig fp8_mha_llama(int64_t history, DType dtype = DType::f32) {
  transformer::TransformerConfig c = fp8_llama(true, history);
  c.params_dtype = dtype;
  c.fp8.multi_head_attention = true;
  return c;
}

// The words of a linear's forward amax history (input, weight per row) in the state JSON.
std::vector<uint32_t> proj_fwd_history(const FbRun& r, int layer) {
  std::string name = "decoder.layers.";
  name += std::to_string(layer);
  name += ".self_attention.linear_proj";
  return r.state["linears"][name]["fwd_amax_history"].get<std::vector<uint32_t>>();
}

// The casts at the boundary are gone: per layer one dequantise (O) and two casts (linear_proj's
// input, dO) fewer, one fp8_transpose (O for linear_proj's weight gradient) more; linear_proj's
// input slot records nothing (its history stays 0) while dO's is recorded, by the GEMM.
TEST(Fp8MultiHeadAttention, NoCastsAtTheProjectionBoundary) {
  const FbRun dpa = run_fb_profiled(fp8_llama(true, 4), 1, 2, false);
  const FbRun mha = run_fb_profiled(fp8_mha_llama(4), 1, 2, false);
  ASSERT_EQ(mha.attentions, 2);
  const int64_t passes = 2;  // calls x micro-batches
  EXPECT_EQ(mha.calls("fp8_attention_fwd"), 2 * passes);
  EXPECT_EQ(mha.calls("fp8_attention_bwd"), 2 * passes);
  EXPECT_EQ(dpa.calls("fp8_dequantize") - mha.calls("fp8_dequantize"), 2 * passes);
  EXPECT_EQ(mha.calls("fp8_dequantize"), 3 * 2 * passes);  // dq, dk, dv
  EXPECT_EQ(dpa.calls("fp8_cast_transpose") - mha.calls("fp8_cast_transpose"), 2 * 2 * passes);
  EXPECT_EQ(mha.calls("fp8_transpose"), 2 * passes);
  EXPECT_EQ(dpa.calls("fp8_transpose"), 0);
  for (int layer = 0; layer < 2; ++layer) {
    const std::vector<uint32_t> m = proj_fwd_history(mha, layer), d = proj_fwd_history(dpa, layer);
    ASSERT_EQ(m.size(), 8u);  // history 4 x (input, weight)
    for (std::size_t row = 0; row < 4; ++row) {
      EXPECT_EQ(m[2 * row], 0u) << "linear_proj's input amax recorded, layer " << layer;
      EXPECT_EQ(m[2 * row + 1], d[2 * row + 1]) << "weight amax, layer " << layer;
    }
    EXPECT_NE(d[2 * 3], 0u);  // without fp8_mha linear_proj casts its input
    const auto dh = mha.state["attentions"]["decoder.layers." + std::to_string(layer) +
                                            ".self_attention.core_attention"]["bwd_amax_history"]
                        .get<std::vector<uint32_t>>();
    EXPECT_NE(dh[3 * 3], 0u) << "dO's amax (written by linear_proj's data-gradient GEMM)";
  }
}

// f32 model, one micro-batch: with every scale 1, O at scale_O is the byte linear_proj's own cast
// of the dequantised O makes, and dO cast from the f32 GEMM output is the GEMM's FP8 output; so
// the first pass equals --fp8-dot-product-attention's bit for bit (losses, gradients, every
// amax but linear_proj's input). The next call differs: linear_proj's input scale (its own amax)
// is not O's scale.
TEST(Fp8MultiHeadAttention, FirstPassEqualsTheDpaRunThenDiffers) {
  const FbRun dpa = run_fb_profiled(fp8_llama(true, 1), 1, 1, false);
  const FbRun mha = run_fb_profiled(fp8_mha_llama(1), 1, 1, false);
  EXPECT_EQ(mha.losses, dpa.losses);
  EXPECT_EQ(mha.grads, dpa.grads);
  EXPECT_EQ(mha.bwd_history, dpa.bwd_history);
  const FbRun dpa2 = run_fb_profiled(fp8_llama(true, 1), 1, 3, false);
  const FbRun mha2 = run_fb_profiled(fp8_mha_llama(1), 1, 3, false);
  ASSERT_EQ(mha2.losses.size(), 3u);
  EXPECT_EQ(mha2.losses[0], dpa2.losses[0]);
  EXPECT_NE(mha2.losses, dpa2.losses);
  for (std::size_t i = 0; i < 3; ++i)  // the same FP8 roundings, other scales: within E4M3's u
    EXPECT_NEAR(mha2.losses[i], dpa2.losses[i], std::fabs(dpa2.losses[i]) / 16) << i;
}

// bf16 model: the forward of the first pass is the same (the dequantised O is exact in bf16), the
// gradients are not: dO is one rounding of the GEMM's f32 result instead of bf16 then FP8.
TEST(Fp8MultiHeadAttention, Bf16DgradIsOneRounding) {
  const FbRun dpa = run_fb_profiled(fp8_llama_dtype(DType::bf16), 1, 1, false);
  const FbRun mha = run_fb_profiled(fp8_mha_llama(1, DType::bf16), 1, 1, false);
  EXPECT_EQ(mha.losses, dpa.losses);
  EXPECT_NE(mha.grads, dpa.grads);
}

TEST(Fp8MultiHeadAttention, SelectiveRecomputeGivesTheSameNumbers) {
  transformer::TransformerConfig c = fp8_mha_llama(4);
  const FbRun plain = run_fb_profiled(c, 2, 2, false);
  c.recompute_granularity = transformer::RecomputeGranularity::selective;
  const FbRun recomputed = run_fb_profiled(c, 2, 2, false);
  EXPECT_EQ(recomputed.calls("fp8_attention_fwd"),
            plain.calls("fp8_attention_fwd") + plain.calls("fp8_attention_bwd"));
  EXPECT_EQ(plain.losses, recomputed.losses);
  EXPECT_EQ(plain.grads, recomputed.grads);
  EXPECT_EQ(plain.fwd_history, recomputed.fwd_history);
  EXPECT_EQ(plain.bwd_history, recomputed.bwd_history);
}

// With NVTE_FP8_DPA_BWD=0 (model-dtype attention backward) dO is not FP8: linear_proj's backward
// writes it in the model dtype; its input is still O in FP8. With --no-fp8-wgrad linear_proj's
// weight gradient reads the dequantised O instead of O's transpose. The forward is fp8_mha's in
// both, so the first loss is the same.
TEST(Fp8MultiHeadAttention, ModelDtypeBackwardAndHighPrecisionWgrad) {
  transformer::TransformerConfig c = fp8_mha_llama(2);
  const FbRun mha = run_fb_profiled(c, 1, 2, false);
  c.fp8.dot_product_attention_fp8_backward = false;
  const FbRun bf16_bwd = run_fb_profiled(c, 1, 2, false);
  EXPECT_EQ(bf16_bwd.calls("fp8_attention_bwd"), 0);
  EXPECT_EQ(bf16_bwd.calls("attention_bwd"), 4);
  EXPECT_EQ(bf16_bwd.calls("fp8_transpose"), 4);
  EXPECT_EQ(bf16_bwd.losses[0], mha.losses[0]);
  EXPECT_NE(bf16_bwd.grads, mha.grads);
  transformer::TransformerConfig w = fp8_mha_llama(2);
  w.fp8.wgrad = false;
  const FbRun hp = run_fb_profiled(w, 1, 2, false);
  EXPECT_EQ(hp.calls("fp8_transpose"), 0);
  EXPECT_EQ(hp.calls("fp8_attention_bwd"), 4);
  EXPECT_EQ(hp.losses[0], mha.losses[0]);
  for (std::size_t i = 0; i < hp.losses.size(); ++i)
    EXPECT_NEAR(hp.losses[i], mha.losses[i], std::fabs(mha.losses[i]) / 16) << i;
}

// KV-cache inference (the model-dtype attention) casts O for linear_proj at the attention's O
// scale: with trained scales loaded, the logits equal those of a run without the flag whose
// linear_proj input scale is set to O's (the same bytes into the same GEMM), bit for bit, and
// differ from it with linear_proj's own input scale (1: never recorded under the flag).
TEST(Fp8MultiHeadAttention, InferenceCastsOAtTheOScale) {
  const FbRun trained = run_fb_profiled(fp8_mha_llama(2), 1, 3, false);
  const ops::OpTable& ops = test::ops_on("cpu");
  auto infer = [&](const transformer::TransformerConfig& c, const nlohmann::json& state) {
    models::GPTModel m(c, 64, ops, Device::cpu());
    m.init_weights(3);
    m.fp8_state()->load_state_json(state);
    inference::StaticInferenceContext ic(1, 16);
    std::vector<int64_t> prompt(16);  // FP8 GEMMs: tokens a multiple of 16
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(7 * i % 64);
    return m.infer(Tensor::from_vector(prompt, {1, 16}, DType::i64), ic).to_vector<float>();
  };
  const std::vector<float> mha = infer(fp8_mha_llama(2), trained.state);
  nlohmann::json same = trained.state;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = "decoder.layers." + std::to_string(layer) + ".self_attention.";
    const nlohmann::json& a = trained.state["attentions"][l + "core_attention"];
    nlohmann::json& p = same["linears"][l + "linear_proj"];
    ASSERT_NE(a["fwd_scale"][2].get<uint32_t>(), p["fwd_scale"][0].get<uint32_t>())
        << "O's scale is 1: the test would not tell the scales apart";
    p["fwd_scale"][0] = a["fwd_scale"][2];
    p["fwd_scale_inv"][0] = a["fwd_scale_inv"][2];
  }
  EXPECT_EQ(infer(fp8_llama(true, 2), same), mha);
  EXPECT_NE(infer(fp8_llama(true, 2), trained.state), mha);
}

// Evaluation: the FP8 attention and linear_proj on its O, nothing recorded.
TEST(Fp8MultiHeadAttention, EvaluationRecordsNothing) {
  const FbRun r = run_fb_profiled(fp8_mha_llama(2), 2, 1, true);
  EXPECT_EQ(r.calls("fp8_attention_fwd"), 4);
  EXPECT_EQ(r.calls("fp8_dequantize"), 0);
  for (float h : r.fwd_history) EXPECT_EQ(h, 0.0f);
}

}  // namespace
}  // namespace mg
