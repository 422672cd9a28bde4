// Conformance of attention_fwd / attention_bwd against a naive f64 reference on every test platform
// and kernel dtype: causal and not, GQA (NH=4 with NG=2 and NG=1), doc_ids and cu_seqlens masks
// (checked to equal running each document alone), padding rows (negative doc id), attention dropout
// against the philox keep function, odd S and HD not a multiple of 8, S over several query blocks
// (129, 200, 257); keys of another length than the queries (Sk > Sq and Sk < Sq: bottom-right
// aligned causal mask, kv_doc_ids, rows that attend nothing, the last Sq rows of a full causal
// attention equal to Sq queries against all Sk keys); attention_merge of results over split keys
// equal to the full attention; plus finite differences of dq/dk/dv in f64 on the cpu platform. The
// reference backward goes through the softmax Jacobian, not the kernel's D_i = dO_i . O_i shortcut,
// so the two are independent.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "megatron/core/random/philox.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::make_tensor;
using test::to_doubles;

struct AttnCase {
  int64_t s, b, nh, ng, hd;
  bool causal = true;
  float scale = 0.0f;                    // 0 -> 1/sqrt(HD)
  std::vector<int32_t> doc_ids = {};     // [B*S] or empty
  std::vector<int32_t> cu_seqlens = {};  // [D+1] or empty
  ops::DropoutArgs dropout = {};
  int64_t sk_ = 0;                       // keys; 0: S
  std::vector<int32_t> kv_doc_ids = {};  // [B*Sk] or empty

  int64_t sk() const { return sk_ > 0 ? sk_ : s; }
  int64_t q_numel() const { return s * b * nh * hd; }
  int64_t kv_numel() const { return sk() * b * ng * hd; }
  Shape q_shape() const { return {s, b, nh, hd}; }
  Shape kv_shape() const { return {sk(), b, ng, hd}; }
};

struct AttnResult {
  std::vector<double> out, lse, dq, dk, dv;
};

// The document of every (b, s) from doc_ids or cu_seqlens; empty without a document mask.
std::vector<int32_t> docs_of(const AttnCase& c) {
  if (!c.doc_ids.empty()) return c.doc_ids;
  std::vector<int32_t> d;
  if (c.cu_seqlens.empty()) return d;
  d.resize(c.b * c.s);
  for (std::size_t doc = 0; doc + 1 < c.cu_seqlens.size(); ++doc)
    for (int32_t s = c.cu_seqlens[doc]; s < c.cu_seqlens[doc + 1]; ++s)
      for (int64_t b = 0; b < c.b; ++b) d[b * c.s + s] = static_cast<int32_t>(doc);
  return d;
}

// Naive f64 attention forward and backward (dout given) straight from the definitions.
AttnResult ref_attention(const AttnCase& c, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v,
                         const std::vector<double>& dout) {
  const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.hd));
  const auto docs = docs_of(c);
  const auto& kdocs = c.kv_doc_ids.empty() ? docs : c.kv_doc_ids;
  const int64_t sk = c.sk();
  auto qa = [&](int64_t s, int64_t b, int64_t h, int64_t e) {
    return ((s * c.b + b) * c.nh + h) * c.hd + e;
  };
  auto ka = [&](int64_t s, int64_t b, int64_t g, int64_t e) {
    return ((s * c.b + b) * c.ng + g) * c.hd + e;
  };
  AttnResult r;
  r.out.assign(q.size(), 0.0);
  r.lse.assign(c.b * c.nh * c.s, 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.nh; ++h) {
      const int64_t g = h / (c.nh / c.ng);
      for (int64_t i = 0; i < c.s; ++i) {
        std::vector<double> sc(sk), p(sk, 0.0), z(sk, 1.0);
        std::vector<bool> ok(sk, false);
        bool any = false;
        double m = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
          ok[j] = !(c.causal && j > i + sk - c.s);  // bottom-right aligned
          if (!docs.empty())
            ok[j] = ok[j] && docs[b * c.s + i] >= 0 && kdocs[b * sk + j] == docs[b * c.s + i];
          if (!ok[j]) continue;
          any = true;
          double dot = 0;
          for (int64_t e = 0; e < c.hd; ++e) dot += q[qa(i, b, h, e)] * k[ka(j, b, g, e)];
          sc[j] = scale * dot;
          m = std::max(m, sc[j]);
        }
        double& lse = r.lse[(b * c.nh + h) * c.s + i];
        if (!any) {
          lse = -INFINITY;
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < sk; ++j)
          if (ok[j]) l += std::exp(sc[j] - m);
        lse = m + std::log(l);
        for (int64_t j = 0; j < sk; ++j) {
          if (ok[j]) p[j] = std::exp(sc[j] - m) / l;
          if (c.dropout.p > 0.0f) {
            const uint64_t e = c.dropout.offset + ((b * c.nh + h) * c.s + i) * sk + j;
            z[j] = random::dropout_keep(c.dropout.seed, e, c.dropout.p)
                       ? 1.0 / (1.0 - static_cast<double>(c.dropout.p))
                       : 0.0;
          }
        }
        for (int64_t j = 0; j < sk; ++j)
          for (int64_t e = 0; e < c.hd; ++e)
            r.out[qa(i, b, h, e)] += p[j] * z[j] * v[ka(j, b, g, e)];
        // Backward through out_i = sum_j p_j z_j v_j and the softmax Jacobian.
        std::vector<double> dpz(sk, 0.0);
        double sum_pdp = 0;
        for (int64_t j = 0; j < sk; ++j) {
          if (!ok[j]) continue;
          double da = 0;
          for (int64_t e = 0; e < c.hd; ++e) da += dout[qa(i, b, h, e)] * v[ka(j, b, g, e)];
          dpz[j] = da * z[j];
          sum_pdp += p[j] * dpz[j];
        }
        for (int64_t j = 0; j < sk; ++j) {
          if (!ok[j]) continue;
          const double ds = p[j] * (dpz[j] - sum_pdp);
          for (int64_t e = 0; e < c.hd; ++e) {
            r.dv[ka(j, b, g, e)] += p[j] * z[j] * dout[qa(i, b, h, e)];
            r.dq[qa(i, b, h, e)] += scale * ds * k[ka(j, b, g, e)];
            r.dk[ka(j, b, g, e)] += scale * ds * q[qa(i, b, h, e)];
          }
        }
      }
    }
  return r;
}

ops::AttentionArgs args_of(const AttnCase& c, Device dev) {
  ops::AttentionArgs a;
  a.causal = c.causal;
  a.softmax_scale = c.scale;
  a.dropout = c.dropout;
  if (!c.doc_ids.empty())
    a.doc_ids = Tensor::from_vector(c.doc_ids, {c.b, c.s}, DType::i32).to(dev);
  if (!c.kv_doc_ids.empty())
    a.kv_doc_ids = Tensor::from_vector(c.kv_doc_ids, {c.b, c.sk()}, DType::i32).to(dev);
  if (!c.cu_seqlens.empty())
    a.cu_seqlens =
        Tensor::from_vector(c.cu_seqlens, {static_cast<int64_t>(c.cu_seqlens.size())}, DType::i32)
            .to(dev);
  return a;
}

DType lse_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// attention_fwd then attention_bwd (dout given) through the op table; all results as doubles.
AttnResult run_kernel(const ops::OpTable& ops, Device dev, DType dtype, const AttnCase& c,
                      const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& dout) {
  const auto a = args_of(c, dev);
  Tensor qt = make_tensor(q, c.q_shape(), dtype, dev).t;
  Tensor kt = make_tensor(k, c.kv_shape(), dtype, dev).t;
  Tensor vt = make_tensor(v, c.kv_shape(), dtype, dev).t;
  Tensor dot = make_tensor(dout, c.q_shape(), dtype, dev).t;
  Tensor out = Tensor::empty(c.q_shape(), dtype, dev);
  Tensor lse = Tensor::empty({c.b, c.nh, c.s}, lse_dtype(dtype), dev);
  ops.attention_fwd(out, lse, qt, kt, vt, a);
  Tensor dq = Tensor::empty(c.q_shape(), dtype, dev);
  Tensor dk = Tensor::empty(c.kv_shape(), dtype, dev);
  Tensor dv = Tensor::empty(c.kv_shape(), dtype, dev);
  ops.attention_bwd(dq, dk, dv, dot, qt, kt, vt, out, lse, a);
  return {to_doubles(out), to_doubles(lse), to_doubles(dq), to_doubles(dk), to_doubles(dv)};
}

// Random q, k, v, dout for a case, rounded to dtype.
struct Inputs {
  std::vector<double> q, k, v, dout;
};
Inputs make_inputs(const AttnCase& c, DType dtype, uint64_t seed) {
  auto rounded = [&](std::vector<double> x, const Shape& shape) {
    return make_tensor(x, shape, dtype, Device::cpu()).rounded;
  };
  return {rounded(test::random_values(c.q_numel(), seed), c.q_shape()),
          rounded(test::random_values(c.kv_numel(), seed + 1), c.kv_shape()),
          rounded(test::random_values(c.kv_numel(), seed + 2), c.kv_shape()),
          rounded(test::random_values(c.q_numel(), seed + 3), c.q_shape())};
}

::testing::AssertionResult results_close(const AttnResult& got, const AttnResult& want,
                                         DType dtype) {
  const auto tol = test::tolerance(dtype);
  const std::pair<const char*, std::pair<const std::vector<double>*, const std::vector<double>*>>
      parts[] = {{"out", {&got.out, &want.out}},
                 {"lse", {&got.lse, &want.lse}},
                 {"dq", {&got.dq, &want.dq}},
                 {"dk", {&got.dk, &want.dk}},
                 {"dv", {&got.dv, &want.dv}}};
  for (const auto& [name, pv] : parts) {
    // lse is stored in f32 (f64 for f64), computed from the rounded inputs: f32's tolerance.
    const auto t = std::string(name) == "lse" ? test::tolerance(lse_dtype(dtype)) : tol;
    auto r = test::all_close(*pv.first, *pv.second, t);
    if (!r) return ::testing::AssertionFailure() << name << ": " << r.message();
  }
  return ::testing::AssertionSuccess();
}

class AttentionOp : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  const std::string& platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(AttentionOp, MatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const AttnCase cases[] = {
      {13, 2, 4, 2, 12, true},         // causal GQA, HD not a multiple of 8
      {7, 1, 4, 1, 16, false},         // non-causal, one KV group (MQA)
      {1, 2, 2, 2, 8, true},           // S = 1
      {31, 1, 4, 4, 64, true, 0.3f},   // MHA, explicit scale
      {13, 2, 4, 2, 12, false, 0.2f},  // non-causal GQA
  };
  uint64_t seed = 10;
  for (const auto& c : cases) {
    const auto in = make_inputs(c, dtype(), seed += 10);
    EXPECT_TRUE(results_close(run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout),
                              ref_attention(c, in.q, in.k, in.v, in.dout), dtype()))
        << "S " << c.s << " B " << c.b << " NH " << c.nh << " NG " << c.ng << " HD " << c.hd
        << " causal " << c.causal;
  }
}

// Document masks must give exactly what running every document as its own sequence gives.
TEST_P(AttentionOp, DocumentMaskEqualsEachDocumentAlone) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  for (bool causal : {true, false}) {
    for (bool use_cu : {false, true}) {
      AttnCase c{13, 2, 4, 2, 12, causal};
      if (use_cu)
        c.cu_seqlens = {0, 4, 11, 13};
      else
        c.doc_ids = {0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,   // b0: 3 + 5 + 5
                     5, 5, 5, 5, 5, 5, 9, 9, 9, 9, 9, 9, 9};  // b1: 6 + 7
      const auto docs = docs_of(c);
      const auto in = make_inputs(c, dtype(), causal ? 200 : 300);
      const auto full = run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout);
      EXPECT_TRUE(results_close(full, ref_attention(c, in.q, in.k, in.v, in.dout), dtype()))
          << "causal " << causal << " cu_seqlens " << use_cu;
      // Cut every document out of its batch row and run it alone, with no mask.
      for (int64_t b = 0; b < c.b; ++b) {
        for (int64_t st = 0; st < c.s;) {
          int64_t en = st;
          while (en < c.s && docs[b * c.s + en] == docs[b * c.s + st]) ++en;
          AttnCase one{en - st, 1, c.nh, c.ng, c.hd, causal};
          Inputs sub;
          AttnResult want;
          auto cut = [&](const std::vector<double>& x, int64_t heads) {
            std::vector<double> o;
            for (int64_t s = st; s < en; ++s)
              for (int64_t i = 0; i < heads * c.hd; ++i)
                o.push_back(x[(s * c.b + b) * heads * c.hd + i]);
            return o;
          };
          sub = {cut(in.q, c.nh), cut(in.k, c.ng), cut(in.v, c.ng), cut(in.dout, c.nh)};
          want = {
              cut(full.out, c.nh), {}, cut(full.dq, c.nh), cut(full.dk, c.ng), cut(full.dv, c.ng)};
          for (int64_t h = 0; h < c.nh; ++h)
            for (int64_t s = st; s < en; ++s)
              want.lse.push_back(full.lse[(b * c.nh + h) * c.s + s]);
          const auto alone = run_kernel(ops, dev, dtype(), one, sub.q, sub.k, sub.v, sub.dout);
          EXPECT_TRUE(results_close(want, alone, dtype()))
              << "batch row " << b << " document [" << st << ", " << en << ") causal " << causal
              << " cu_seqlens " << use_cu;
          st = en;
        }
      }
    }
  }
}

TEST_P(AttentionOp, PaddingRowsGiveZeroOutputMinusInfLseAndFiniteGradients) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  for (bool causal : {true, false}) {
    AttnCase c{7, 3, 4, 2, 12, causal};
    c.doc_ids = {0,  0, 0,  1, 1, -1, -1,   // padding at the end
                 -1, 2, 2,  2, 2, 2,  2,    // padding first
                 4,  4, -1, 4, 7, 4,  -1};  // padding inside; document 4 not contiguous
    const auto in = make_inputs(c, dtype(), 400);
    const auto got = run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout);
    EXPECT_TRUE(results_close(got, ref_attention(c, in.q, in.k, in.v, in.dout), dtype()));
    for (const auto* x : {&got.out, &got.dq, &got.dk, &got.dv})
      for (double e : *x) EXPECT_TRUE(std::isfinite(e));
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t s = 0; s < c.s; ++s) {
        if (c.doc_ids[b * c.s + s] >= 0) continue;
        for (int64_t h = 0; h < c.nh; ++h) {
          EXPECT_EQ(got.lse[(b * c.nh + h) * c.s + s], -INFINITY);
          for (int64_t e = 0; e < c.hd; ++e) {
            EXPECT_EQ(got.out[((s * c.b + b) * c.nh + h) * c.hd + e], 0.0);
            EXPECT_EQ(got.dq[((s * c.b + b) * c.nh + h) * c.hd + e], 0.0);
          }
        }
        for (int64_t g = 0; g < c.ng; ++g)
          for (int64_t e = 0; e < c.hd; ++e) {
            EXPECT_EQ(got.dk[((s * c.b + b) * c.ng + g) * c.hd + e], 0.0);
            EXPECT_EQ(got.dv[((s * c.b + b) * c.ng + g) * c.hd + e], 0.0);
          }
      }
  }
}

TEST_P(AttentionOp, DropoutMatchesPhiloxReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  for (bool causal : {true, false}) {
    AttnCase c{13, 2, 4, 2, 12, causal};
    c.dropout = {0.3f, 0x1234567890abcdefull, 12345};
    const auto in = make_inputs(c, dtype(), 500);
    const auto got = run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout);
    EXPECT_TRUE(results_close(got, ref_attention(c, in.q, in.k, in.v, in.dout), dtype()))
        << "causal " << causal;
    // Same seed and offset: the same mask again. p = 0: a different result (dropout did act).
    EXPECT_EQ(run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout).out, got.out);
    AttnCase plain = c;
    plain.dropout = {};
    EXPECT_NE(run_kernel(ops, dev, dtype(), plain, in.q, in.k, in.v, in.dout).out, got.out);
  }
  // Dropout together with a document mask and an offset that is not a multiple of 4.
  AttnCase c{7, 2, 4, 1, 12, true};
  c.doc_ids = {0, 0, 0, 1, 1, -1, -1, 3, 3, 3, 3, 3, 3, 3};
  c.dropout = {0.5f, 99, 7};
  const auto in = make_inputs(c, dtype(), 600);
  EXPECT_TRUE(results_close(run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout),
                            ref_attention(c, in.q, in.k, in.v, in.dout), dtype()));
}

// S above the kernel's query block (64 rows on the cpu platform): masks and dropout across block
// boundaries, key spans that start after 0, and whole blocks of padding rows.
TEST_P(AttentionOp, LongSequencesMatchReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  // b0: documents crossing blocks, padding inside one, document 7 not contiguous (rows 10, 190);
  // b1: one document, then padding from row 120 on (rows 128..199 are whole blocks of padding).
  AttnCase docs{200, 2, 4, 2, 12, true};
  for (int32_t s = 0; s < 200; ++s)
    docs.doc_ids.push_back(s == 10 || s == 190                ? 7
                           : s < 50                           ? 0
                           : (s >= 100 && s < 104) || s == 63 ? -1
                           : s < 140                          ? 1
                                                              : 2);
  for (int32_t s = 0; s < 200; ++s) docs.doc_ids.push_back(s < 120 ? 3 : -1);
  AttnCase non_causal = docs;
  non_causal.causal = false;
  AttnCase cu{257, 1, 2, 1, 8, true};
  cu.cu_seqlens = {0, 60, 61, 130, 257};
  cu.dropout = {0.2f, 77, 5};
  AttnCase cu_non_causal = cu;
  cu_non_causal.causal = false;
  const AttnCase cases[] = {docs,
                            non_causal,
                            cu,
                            cu_non_causal,
                            {257, 1, 2, 2, 9, true},
                            {129, 1, 2, 1, 16, false, 0.1f}};
  uint64_t seed = 800;
  for (const auto& c : cases) {
    const auto in = make_inputs(c, dtype(), seed += 10);
    const auto got = run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout);
    EXPECT_TRUE(results_close(got, ref_attention(c, in.q, in.k, in.v, in.dout), dtype()))
        << "S " << c.s << " B " << c.b << " NH " << c.nh << " NG " << c.ng << " HD " << c.hd
        << " causal " << c.causal << " doc_ids " << !c.doc_ids.empty() << " cu_seqlens "
        << !c.cu_seqlens.empty() << " dropout " << c.dropout.p;
    // The same inputs give bitwise the same results (no order depends on scheduling).
    const auto again = run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout);
    EXPECT_EQ(again.out, got.out);
    EXPECT_EQ(again.dq, got.dq);
    EXPECT_EQ(again.dk, got.dk);
    EXPECT_EQ(again.dv, got.dv);
  }
}

TEST_P(AttentionOp, RejectsBadArguments) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const DType dt = dtype();
  Tensor q = Tensor::zeros({7, 2, 4, 8}, dt, dev), k = Tensor::zeros({7, 2, 2, 8}, dt, dev);
  Tensor v = k.clone(), out = Tensor::empty({7, 2, 4, 8}, dt, dev);
  Tensor lse = Tensor::empty({2, 4, 7}, lse_dtype(dt), dev);
  auto expect_throw = [&](const ops::AttentionArgs& a, const char* what) {
    EXPECT_THROW(ops.attention_fwd(out, lse, q, k, v, a), Error) << what;
  };
  auto i32 = [&](std::vector<int32_t> x, Shape s) {
    return Tensor::from_vector(x, s, DType::i32).to(dev);
  };
  ops::AttentionArgs a;
  a.cu_seqlens = i32({0, 3, 7}, {3});
  EXPECT_NO_THROW(ops.attention_fwd(out, lse, q, k, v, a));
  a.doc_ids = i32(std::vector<int32_t>(14, 0), {2, 7});
  expect_throw(a, "both doc_ids and cu_seqlens");
  a = {};
  a.cu_seqlens = i32({1, 3, 7}, {3});
  expect_throw(a, "cu_seqlens not starting at 0");
  a.cu_seqlens = i32({0, 3, 6}, {3});
  expect_throw(a, "cu_seqlens not ending at S");
  a.cu_seqlens = i32({0, 5, 3, 7}, {4});
  expect_throw(a, "cu_seqlens not monotone");
  a = {};
  a.doc_ids = i32(std::vector<int32_t>(7, 0), {1, 7});
  expect_throw(a, "doc_ids not [B, S]");
  a = {};
  a.dropout.p = 1.0f;
  expect_throw(a, "dropout p = 1");
  a = {};
  Tensor lse_bad = Tensor::empty({2, 4, 7}, DType::i32, dev);
  EXPECT_THROW(ops.attention_fwd(out, lse_bad, q, k, v, a), Error);
  Tensor k3 = Tensor::zeros({7, 2, 3, 8}, dt, dev);
  EXPECT_THROW(ops.attention_fwd(out, lse, q, k3, k3, a), Error) << "NH % NG != 0";
  Tensor k_b = Tensor::zeros({7, 1, 2, 8}, dt, dev);
  EXPECT_THROW(ops.attention_fwd(out, lse, q, k_b, k_b, a), Error) << "B mismatch";
  // Sk != Sq: fine alone; a document mask needs the keys' ids; cu_seqlens is refused.
  Tensor k_short = Tensor::zeros({6, 2, 2, 8}, dt, dev);
  EXPECT_NO_THROW(ops.attention_fwd(out, lse, q, k_short, k_short, a));
  a.doc_ids = i32(std::vector<int32_t>(14, 0), {2, 7});
  EXPECT_THROW(ops.attention_fwd(out, lse, q, k_short, k_short, a), Error) << "no kv_doc_ids";
  a.kv_doc_ids = i32(std::vector<int32_t>(14, 0), {2, 7});
  EXPECT_THROW(ops.attention_fwd(out, lse, q, k_short, k_short, a), Error) << "kv_doc_ids not Sk";
  a.kv_doc_ids = i32(std::vector<int32_t>(12, 0), {2, 6});
  EXPECT_NO_THROW(ops.attention_fwd(out, lse, q, k_short, k_short, a));
  a.doc_ids = {};
  expect_throw(a, "kv_doc_ids without doc_ids");
  a = {};
  a.cu_seqlens = i32({0, 3, 6}, {3});
  EXPECT_THROW(ops.attention_fwd(out, lse, q, k_short, k_short, a), Error) << "cu_seqlens, Sk";
}

// Sk != Sq: a KV cache (Sk > Sq, causal bottom-right aligned) and a context-parallel block (any
// Sk, with the keys' own document ids); Sk < Sq causal leaves the first Sq - Sk rows with nothing
// to attend (out 0, lse -inf). Sizes cross the cpu kernel's 64-row blocks and the CUDA 64 tiles.
TEST_P(AttentionOp, KeysOfAnotherLengthMatchReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  std::vector<AttnCase> cases;
  for (bool causal : {true, false}) {
    cases.push_back({5, 2, 4, 2, 12, causal, 0.0f, {}, {}, {}, 13});    // Sk > Sq
    cases.push_back({13, 2, 4, 1, 12, causal, 0.0f, {}, {}, {}, 5});    // Sk < Sq
    cases.push_back({70, 1, 2, 2, 16, causal, 0.0f, {}, {}, {}, 200});  // tiles
    cases.push_back({150, 1, 2, 1, 8, causal, 0.0f, {}, {}, {}, 67});   // tiles, Sk < Sq
    cases.push_back({1, 2, 4, 2, 8, causal, 0.3f, {}, {}, {}, 9});      // one query (decode)
    AttnCase docs{6, 2, 4, 2, 12, causal, 0.0f, {}, {}, {}, 10};        // CP-like block
    docs.doc_ids = {3, 3, 4, 4, 4, -1, 5, 5, 5, 5, 5, 5};
    docs.kv_doc_ids = {1, 3, 3, 3, 4, 4, 2, 2, -1, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5};
    docs.dropout = {0.2f, 31, 3};
    cases.push_back(docs);
    AttnCase none = docs;  // no key of the queries' documents: every row attends nothing
    none.kv_doc_ids.assign(20, 8);
    none.dropout = {};
    cases.push_back(none);
  }
  uint64_t seed = 900;
  for (const auto& c : cases) {
    const auto in = make_inputs(c, dtype(), seed += 10);
    const auto got = run_kernel(ops, dev, dtype(), c, in.q, in.k, in.v, in.dout);
    EXPECT_TRUE(results_close(got, ref_attention(c, in.q, in.k, in.v, in.dout), dtype()))
        << "Sq " << c.s << " Sk " << c.sk() << " causal " << c.causal << " docs "
        << !c.doc_ids.empty();
    for (const auto* x : {&got.out, &got.dq, &got.dk, &got.dv})
      for (double e : *x) EXPECT_TRUE(std::isfinite(e));
  }
  // The last Sq rows of a causal attention over Sk tokens equal Sq queries against all Sk keys.
  AttnCase full{90, 2, 4, 2, 12, true};
  const auto in = make_inputs(full, dtype(), 990);
  const auto want = run_kernel(ops, dev, dtype(), full, in.q, in.k, in.v, in.dout);
  const int64_t sq = 20, row = full.b * full.nh * full.hd, first = full.s - sq;
  AttnCase tail{sq, full.b, full.nh, full.ng, full.hd, true, 0.0f, {}, {}, {}, full.s};
  auto last = [&](const std::vector<double>& x) {
    return std::vector<double>(x.begin() + first * row, x.end());
  };
  const auto got = run_kernel(ops, dev, dtype(), tail, last(in.q), in.k, in.v, last(in.dout));
  EXPECT_TRUE(test::all_close(got.out, last(want.out), test::tolerance(dtype())));
  EXPECT_TRUE(test::all_close(got.dq, last(want.dq), test::tolerance(dtype())));
}

// attention_merge: the results over two disjoint key sets, merged by log-sum-exp, equal the result
// over their union; rows that attend nothing in one half (lse -inf there) or in both (out 0, lse
// -inf) stay finite.
TEST_P(AttentionOp, MergeOfKeySplitsEqualsFullAttention) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const DType dt = dtype();
  const int64_t sq = 9, sk = 14, split = 6, b = 2, nh = 4, ng = 2, hd = 8;
  AttnCase c{sq, b, nh, ng, hd, false, 0.0f, {}, {}, {}, sk};
  // Query documents; key documents: document 2 only in the second split, 3 nowhere, -1 padding.
  c.doc_ids = {0, 0, 1, 1, 2, 2, 3, -1, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4};
  c.kv_doc_ids = {0, 0, 1, 1, 1, 0, 2, 2, 1, 0, 0, -1, 2, 2,   // b0
                  4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,  4, 4};  // b1
  const auto in = make_inputs(c, dt, 950);
  const auto want = ref_attention(c, in.q, in.k, in.v, in.dout);
  const Tensor q = make_tensor(in.q, c.q_shape(), dt, dev).t;
  const Tensor k = make_tensor(in.k, c.kv_shape(), dt, dev).t;
  const Tensor v = make_tensor(in.v, c.kv_shape(), dt, dev).t;
  auto part_ids = [&](int64_t lo, int64_t n) {
    std::vector<int32_t> o;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = lo; j < lo + n; ++j) o.push_back(c.kv_doc_ids[r * sk + j]);
    return Tensor::from_vector(o, {b, n}, DType::i32).to(dev);
  };
  Tensor out = Tensor::empty(c.q_shape(), dt, dev),
         lse = Tensor::empty({b, nh, sq}, lse_dtype(dt), dev);
  Tensor bo = Tensor::empty(c.q_shape(), dt, dev),
         bl = Tensor::empty({b, nh, sq}, lse_dtype(dt), dev);
  ops::AttentionArgs a = args_of(c, dev);
  a.kv_doc_ids = part_ids(0, split);
  ops.attention_fwd(out, lse, q, k.slice(0, split), v.slice(0, split), a);
  a.kv_doc_ids = part_ids(split, sk - split);
  ops.attention_fwd(bo, bl, q, k.slice(split, sk - split), v.slice(split, sk - split), a);
  ops.attention_merge(out, lse, bo, bl);
  EXPECT_TRUE(test::all_close(to_doubles(out), want.out, test::tolerance(dt)));
  const auto got_lse = to_doubles(lse);
  for (std::size_t i = 0; i < got_lse.size(); ++i) {
    if (std::isinf(want.lse[i]))
      EXPECT_EQ(got_lse[i], want.lse[i]) << i;
    else
      EXPECT_NEAR(got_lse[i], want.lse[i], 1e-5 * (1 + std::abs(want.lse[i]))) << i;
  }
  for (double e : to_doubles(out)) EXPECT_TRUE(std::isfinite(e));
  // Shapes must agree.
  Tensor small = Tensor::empty({sq - 1, b, nh, hd}, dt, dev);
  EXPECT_THROW(ops.attention_merge(out, lse, small, bl), Error);
}

MG_INSTANTIATE_OP_TEST(AttentionOp);

// Central differences of sum(out * w) in f64 against attention_bwd with dout = w, for dq, dk, dv.
void check_finite_differences(const AttnCase& c) {
  const auto& ops = test::ops_on("cpu");
  const auto in = make_inputs(c, DType::f64, 700);
  const auto a = args_of(c, Device::cpu());
  auto loss = [&](const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v) {
    Tensor out = Tensor::empty(c.q_shape(), DType::f64);
    Tensor lse = Tensor::empty({c.b, c.nh, c.s}, DType::f64);
    ops.attention_fwd(out, lse, Tensor::from_vector(q, c.q_shape()),
                      Tensor::from_vector(k, c.kv_shape()), Tensor::from_vector(v, c.kv_shape()),
                      a);
    const auto o = out.to_vector<double>();
    double l = 0;
    for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * in.dout[i];
    return l;
  };
  const auto got = run_kernel(ops, Device::cpu(), DType::f64, c, in.q, in.k, in.v, in.dout);
  const test::Tol tol{1e-8, 1e-6};
  EXPECT_TRUE(test::all_close(
      got.dq, test::numerical_gradient([&](const auto& x) { return loss(x, in.k, in.v); }, in.q),
      tol));
  EXPECT_TRUE(test::all_close(
      got.dk, test::numerical_gradient([&](const auto& x) { return loss(in.q, x, in.v); }, in.k),
      tol));
  EXPECT_TRUE(test::all_close(
      got.dv, test::numerical_gradient([&](const auto& x) { return loss(in.q, in.k, x); }, in.v),
      tol));
}

TEST(AttentionGradient, FiniteDifferencesCausalGqaF64) {
  check_finite_differences({7, 2, 4, 2, 5, true});
}

TEST(AttentionGradient, FiniteDifferencesNonCausalMqaF64) {
  check_finite_differences({5, 1, 4, 1, 6, false, 0.7f});
}

TEST(AttentionGradient, FiniteDifferencesKeysOfAnotherLengthF64) {
  check_finite_differences({4, 1, 2, 1, 5, true, 0.0f, {}, {}, {}, 7});
  AttnCase c{6, 1, 2, 2, 4, true, 0.0f, {}, {}, {}, 3};
  c.doc_ids = {0, 0, 1, 1, 1, 1};
  c.kv_doc_ids = {0, 1, 1};
  check_finite_differences(c);
}

TEST(AttentionGradient, FiniteDifferencesDocumentsPaddingDropoutF64) {
  AttnCase c{7, 1, 2, 1, 5, true};
  c.doc_ids = {0, 0, 1, 1, 1, 1, -1};
  c.dropout = {0.25f, 5, 3};
  check_finite_differences(c);
}

}  // namespace
}  // namespace mg
