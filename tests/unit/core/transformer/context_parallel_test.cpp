// Context-parallel core attention (context_parallel.h) on the world as the CP group, against
// attention_fwd / attention_bwd over the whole sequence in one process. tests/CMakeLists.txt runs
// it under mpirun -np 2 and 4 (label mpi); alone (one rank) only the slicing checks run. f64, so
// "equal" means equal to f64 round-off (the partial results merge in another order). Checked, for
// the p2p ring, the all-gather and the all-to-all (Ulysses, heads split) variants:
//   - the merged output, lse, dq, dk and dv of this rank's chunks r and 2CP-1-r equal the
//     full attention's rows of those chunks (causal and not, GQA), on random inputs;
//   - with per-document masks of packed sequences (documents crossing chunk boundaries), and with
//     a whole chunk of padding (PITFALLS.md row 14: finite, and equal to CP = 1);
//   - with attention dropout the result is finite and the same on a second run;
//   - slice_sequence_for_cp_rank keeps chunks r and 2CP-1-r; bad lengths are refused.
// Every rank runs the same collectives whatever a check gives (EXPECT_*, never ASSERT_*).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/transformer/context_parallel.h"
#include "tests/unit/core/tensor_parallel/tp_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::transformer {
namespace {

using namespace std::chrono_literals;
using test::det_tensor;

comm::Communicator& communicator() {
  static std::unique_ptr<comm::Communicator> c = [] {
    auto p = comm::init_communicator("");
    p->set_default_timeout(20s);
    return p;
  }();
  return *c;
}
comm::ProcessGroup& world() {
  return *communicator().world();
}

// Rows [r C, (r+1) C) and [(2P-1-r) C, (2P-r) C) of x [S, ...] -> [2C, ...].
Tensor local_rows(const Tensor& x, int r, int p) {
  const int64_t c = x.size(0) / (2 * p);
  Shape sh = x.shape();
  sh[0] = 2 * c;
  Tensor out = Tensor::empty(sh, x.dtype(), x.device());
  out.slice(0, c).copy_(x.slice(r * c, c));
  out.slice(c, c).copy_(x.slice((2 * p - 1 - r) * c, c));
  return out;
}

// lse [B, NH, S] -> this rank's [2, B, NH, C].
std::vector<double> local_lse(const Tensor& lse, int r, int p) {
  const auto v = lse.to_vector<double>();
  const int64_t b = lse.size(0), nh = lse.size(1), s = lse.size(2), c = s / (2 * p);
  std::vector<double> o;
  for (int64_t g : {static_cast<int64_t>(r), static_cast<int64_t>(2 * p - 1 - r)})
    for (int64_t i = 0; i < b * nh; ++i)
      for (int64_t j = 0; j < c; ++j) o.push_back(v[i * s + g * c + j]);
  return o;
}

struct Case {
  int64_t s, b, nh, ng, hd;
  bool causal = true;
  std::vector<int32_t> doc_ids = {};  // [B, S] or empty
  float dropout = 0.0f;
};

// On `platform` ("cuda": the CP collectives carry device tensors through the MPI backend's
// staging; document masks are CPU-only here).
void check_case(Case cs, CpCommType type, uint64_t seed, const std::string& platform = "cpu") {
  const auto& ops = test::ops_on(platform);
  const Device dev = test::device_for(platform);
  comm::ProcessGroup& g = world();
  const int p = g.size(), r = g.rank();
  if (type == CpCommType::a2a && (cs.nh % p != 0 || cs.ng % p != 0)) {
    // Ulysses splits whole heads and KV groups across CP: the same case with CP | NG.
    cs.nh = cs.nh / cs.ng * p;
    cs.ng = p;
  }
  const Shape qs{cs.s, cs.b, cs.nh, cs.hd}, ks{cs.s, cs.b, cs.ng, cs.hd};
  const Tensor q = det_tensor(qs, seed).to(dev), k = det_tensor(ks, seed + 1).to(dev),
               v = det_tensor(ks, seed + 2).to(dev);
  const Tensor dout = det_tensor(qs, seed + 3).to(dev);
  ops::AttentionArgs full;
  full.causal = cs.causal;
  if (!cs.doc_ids.empty()) full.doc_ids = Tensor::from_vector(cs.doc_ids, {cs.b, cs.s}, DType::i32);
  // Reference: the whole sequence in this process.
  Tensor out = Tensor::empty(qs, DType::f64, dev),
         lse = Tensor::empty({cs.b, cs.nh, cs.s}, DType::f64, dev);
  ops.attention_fwd(out, lse, q, k, v, full);
  Tensor dq = Tensor::empty(qs, DType::f64, dev), dk = Tensor::empty(ks, DType::f64, dev),
         dv = Tensor::empty(ks, DType::f64, dev);
  ops.attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, full);
  // This rank's chunks through the CP group.
  const int64_t c = cs.s / (2 * p);
  ContextParallel cp{&g, type};
  ops::AttentionArgs a;
  a.causal = cs.causal;
  if (full.doc_ids.defined()) a.doc_ids = slice_sequence_for_cp_rank(full.doc_ids, r, p);
  a.dropout.p = cs.dropout;
  a.dropout.seed = 77;
  const Tensor lq = local_rows(q, r, p), lk = local_rows(k, r, p), lv = local_rows(v, r, p),
               ldo = local_rows(dout, r, p);
  Tensor lo = Tensor::empty(lq.shape(), DType::f64, dev),
         ll = Tensor::empty(cp_lse_shape(cp, 2 * c, cs.b, cs.nh), DType::f64, dev);
  cp_attention_fwd(ops, cp, lo, ll, lq, lk, lv, a);
  Tensor ldq = Tensor::empty(lq.shape(), DType::f64, dev),
         ldk = Tensor::empty(lk.shape(), DType::f64, dev),
         ldv = Tensor::empty(lk.shape(), DType::f64, dev);
  cp_attention_bwd(ops, cp, ldq, ldk, ldv, ldo, lq, lk, lv, lo, ll, a);
  const std::string what = std::string(cp_comm_type_name(type)) + " CP " + std::to_string(p) +
                           " rank " + std::to_string(r) + " causal " + std::to_string(cs.causal) +
                           " docs " + std::to_string(!cs.doc_ids.empty());
  for (const Tensor* t : {&lo, &ldq, &ldk, &ldv})
    for (double e : t->to_vector<double>()) EXPECT_TRUE(std::isfinite(e)) << what;
  if (cs.dropout > 0.0f) {  // masks differ from CP = 1: the same result again, and finite
    Tensor lo2 = Tensor::empty(lq.shape(), DType::f64, dev),
           ll2 = Tensor::empty(ll.shape(), DType::f64, dev);
    cp_attention_fwd(ops, cp, lo2, ll2, lq, lk, lv, a);
    EXPECT_EQ(lo2.to_vector<double>(), lo.to_vector<double>()) << what;
    EXPECT_EQ(ll2.to_vector<double>(), ll.to_vector<double>()) << what;
    return;
  }
  const test::Tol tol{1e-12, 1e-10};
  EXPECT_TRUE(
      test::all_close(lo.to_vector<double>(), local_rows(out, r, p).to_vector<double>(), tol))
      << "out " << what;
  // lse: this rank's chunks, every head (p2p, allgather); this rank's heads, the whole sequence
  // (a2a).
  std::vector<double> want_lse;
  if (type == CpCommType::a2a) {
    const auto all = lse.to_vector<double>();
    const int64_t hp = cs.nh / p;
    for (int64_t b = 0; b < cs.b; ++b)
      for (int64_t h = r * hp; h < (r + 1) * hp; ++h)
        for (int64_t i = 0; i < cs.s; ++i) want_lse.push_back(all[(b * cs.nh + h) * cs.s + i]);
  } else {
    want_lse = local_lse(lse, r, p);
  }
  const auto got_lse = ll.to_vector<double>();
  EXPECT_EQ(got_lse.size(), want_lse.size()) << what;
  for (std::size_t i = 0; i < std::min(want_lse.size(), got_lse.size()); ++i) {
    if (std::isinf(want_lse[i]))
      EXPECT_EQ(got_lse[i], want_lse[i]) << "lse " << i << " " << what;
    else
      EXPECT_NEAR(got_lse[i], want_lse[i], 1e-10) << "lse " << i << " " << what;
  }
  EXPECT_TRUE(
      test::all_close(ldq.to_vector<double>(), local_rows(dq, r, p).to_vector<double>(), tol))
      << "dq " << what;
  EXPECT_TRUE(
      test::all_close(ldk.to_vector<double>(), local_rows(dk, r, p).to_vector<double>(), tol))
      << "dk " << what;
  EXPECT_TRUE(
      test::all_close(ldv.to_vector<double>(), local_rows(dv, r, p).to_vector<double>(), tol))
      << "dv " << what;
}

class CpAttention : public ::testing::TestWithParam<CpCommType> {};

TEST_P(CpAttention, EqualsFullAttention) {
  const int p = world().size();
  if (p == 1) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int64_t c = 5;  // tokens per chunk: S = 2 P C
  const int64_t s = 2 * p * c;
  uint64_t seed = 100;
  for (bool causal : {true, false}) {
    check_case({s, 2, 4, 2, 8, causal}, GetParam(), seed += 10);  // GQA
    check_case({s, 1, 2, 1, 6, causal}, GetParam(), seed += 10);  // MQA
  }
}

// The same on the CUDA platform, every rank on GPU 0 through the MPI backend (skipped, printing
// why, without a usable GPU).
TEST_P(CpAttention, EqualsFullAttentionCuda) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const int p = world().size();
  if (p == 1) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int64_t s = 2 * p * 5;
  check_case({s, 2, 4, 2, 8, true}, GetParam(), 300, "cuda");
  check_case({s, 1, 2, 1, 6, false}, GetParam(), 310, "cuda");
}

TEST_P(CpAttention, DocumentMasksAcrossChunks) {
  const int p = world().size();
  if (p == 1) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int64_t c = 4, s = 2 * p * c;
  Case cs{s, 2, 4, 2, 8, true};
  // b0: documents of 3, 7, 2, ... tokens crossing chunk boundaries; b1: one document then
  // padding for the whole last quarter (whole chunks of padding on some ranks).
  int32_t doc = 0, left = 3;
  for (int64_t i = 0; i < s; ++i) {
    cs.doc_ids.push_back(doc);
    if (--left == 0) left = (++doc % 3 == 1) ? 7 : 2;
  }
  for (int64_t i = 0; i < s; ++i) cs.doc_ids.push_back(i < s - s / 4 ? 5 : -1);
  uint64_t seed = 300;
  for (bool causal : {true, false}) {
    cs.causal = causal;
    check_case(cs, GetParam(), seed += 10);
  }
}

// PITFALLS.md row 14: a CP rank whose tokens are all masked (padding) must give finite results
// equal to CP = 1 (out 0, lse -inf, zero gradients for those tokens).
TEST_P(CpAttention, FullyMaskedChunkIsFinite) {
  const int p = world().size();
  if (p == 1) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int64_t c = 3, s = 2 * p * c;
  Case cs{s, 1, 2, 1, 4, true};
  // Chunk 0 is one document; every other token is padding: rank 0's late chunk and every other
  // rank's two chunks attend nothing.
  for (int64_t i = 0; i < s; ++i) cs.doc_ids.push_back(i < c ? 0 : -1);
  check_case(cs, GetParam(), 500);
  // And one where only the late chunks are padding.
  cs.doc_ids.clear();
  for (int64_t i = 0; i < s; ++i) cs.doc_ids.push_back(i < s / 2 ? 1 : -1);
  check_case(cs, GetParam(), 510);
}

TEST_P(CpAttention, DropoutIsFiniteAndReproducible) {
  const int p = world().size();
  if (p == 1) GTEST_SKIP() << "needs mpirun -np 2 or more";
  Case cs{2 * p * 4, 2, 2, 1, 8, true};
  cs.dropout = 0.3f;
  check_case(cs, GetParam(), 700);
}

INSTANTIATE_TEST_SUITE_P(CommTypes, CpAttention,
                         ::testing::Values(CpCommType::p2p, CpCommType::allgather, CpCommType::a2a),
                         [](const auto& info) {
                           return std::string(cp_comm_type_name(info.param));
                         });

TEST(ContextParallel, SliceSequenceKeepsChunksRAnd2CpMinus1MinusR) {
  std::vector<int64_t> x;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 16; ++i) x.push_back(100 * b + i);
  const Tensor t = Tensor::from_vector(x, {2, 16}, DType::i64);
  // CP 4: chunks of 2; rank 1 keeps chunks 1 and 6.
  EXPECT_EQ(slice_sequence_for_cp_rank(t, 1, 4).to_vector<int64_t>(),
            (std::vector<int64_t>{2, 3, 12, 13, 102, 103, 112, 113}));
  // CP 2: chunks of 4; rank 0 keeps chunks 0 and 3.
  EXPECT_EQ(
      slice_sequence_for_cp_rank(t, 0, 2).to_vector<int64_t>(),
      (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15, 100, 101, 102, 103, 112, 113, 114, 115}));
  EXPECT_EQ(slice_sequence_for_cp_rank(t, 0, 1).to_vector<int64_t>(), x);
  EXPECT_THROW(slice_sequence_for_cp_rank(t, 0, 3), Error);  // 16 % 6 != 0
}

TEST(ContextParallel, ParsesCommType) {
  EXPECT_EQ(parse_cp_comm_type("p2p"), CpCommType::p2p);
  EXPECT_EQ(parse_cp_comm_type("allgather"), CpCommType::allgather);
  EXPECT_EQ(parse_cp_comm_type("a2a"), CpCommType::a2a);
  EXPECT_THROW(parse_cp_comm_type("ring"), Error);
}

}  // namespace
}  // namespace mg::transformer
