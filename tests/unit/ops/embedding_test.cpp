// Conformance tests of the vocab-parallel embedding lookup and its scatter-add backward against
// naive f64 references on every platform and kernel dtype, an f64 finite-difference check of the
// backward, and the validation of ids.
#include <cmath>
#include <limits>
#include <tuple>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;
using test::tolerance;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr test::Tol kFdTol{1e-7, 1e-6};

using Param = test::PlatformDType;

// A shard of the full vocabulary: rows [kVocabStart, kVocabStart + kLocalVocab) of V = 37.
constexpr int64_t kVocabStart = 11;
constexpr int64_t kLocalVocab = 13;
// ids [S = 5, B = 3]: inside the shard, below it, above it, repeats, and both shard edges.
const std::vector<int64_t> kIds = {11, 0, 23, 15, 15, 36, 10, 24, 12, 15, 30, 23, 5, 11, 17};

Tensor ids_tensor(const std::vector<int64_t>& ids, const Shape& shape, DType dtype, Device dev) {
  return Tensor::from_vector(ids, shape, dtype).to(dev);
}

// out[n] = weight[ids[n] - start] when inside the shard, else 0.
std::vector<double> ref_lookup(const std::vector<double>& w, const std::vector<int64_t>& ids,
                               int64_t start, int64_t v, int64_t h) {
  std::vector<double> out(ids.size() * h, 0.0);
  for (std::size_t n = 0; n < ids.size(); ++n) {
    const int64_t row = ids[n] - start;
    if (row < 0 || row >= v) continue;
    for (int64_t j = 0; j < h; ++j) out[n * h + j] = w[row * h + j];
  }
  return out;
}

// dweight0 + scatter-add of dout rows.
std::vector<double> ref_scatter(std::vector<double> dw, const std::vector<double>& dout,
                                const std::vector<int64_t>& ids, int64_t start, int64_t v,
                                int64_t h) {
  for (std::size_t n = 0; n < ids.size(); ++n) {
    const int64_t row = ids[n] - start;
    if (row < 0 || row >= v) continue;
    for (int64_t j = 0; j < h; ++j) dw[row * h + j] += dout[n * h + j];
  }
  return dw;
}

class EmbeddingTest : public ::testing::TestWithParam<Param> {};

TEST_P(EmbeddingTest, ForwardLooksUpShardRowsAndZerosTheRest) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (int64_t h : {1, 7, 64}) {
    for (DType id_dtype : {DType::i64, DType::i32}) {
      auto w = make_tensor(random_values(kLocalVocab * h, 10 + h), {kLocalVocab, h}, dtype, dev);
      Tensor ids = ids_tensor(kIds, {5, 3}, id_dtype, dev);
      auto out = make_tensor(std::vector<double>(15 * h, kNaN), {5, 3, h}, dtype, dev);
      ops.embedding_fwd(out.t, ids, w.t, kVocabStart);
      // A copy: exact.
      EXPECT_TRUE(all_close(to_doubles(out.t),
                            ref_lookup(w.rounded, kIds, kVocabStart, kLocalVocab, h), {0, 0}))
          << "H " << h << " ids " << dtype_name(id_dtype);
    }
  }
}

TEST_P(EmbeddingTest, BackwardScatterAddsRepeatedIds) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (int64_t h : {1, 7, 64}) {
    for (DType dw_dtype : {dtype, DType::f32}) {
      for (DType id_dtype : {DType::i64, DType::i32}) {
        auto dw =
            make_tensor(random_values(kLocalVocab * h, 20 + h), {kLocalVocab, h}, dw_dtype, dev);
        auto dout = make_tensor(random_values(15 * h, 30 + h), {5, 3, h}, dtype, dev);
        Tensor ids = ids_tensor(kIds, {5, 3}, id_dtype, dev);
        ops.embedding_bwd(dw.t, dout.t, ids, kVocabStart);
        EXPECT_TRUE(
            all_close(to_doubles(dw.t),
                      ref_scatter(dw.rounded, dout.rounded, kIds, kVocabStart, kLocalVocab, h),
                      tolerance(dw_dtype)))
            << "H " << h << " dweight " << dtype_name(dw_dtype) << " ids " << dtype_name(id_dtype);
      }
    }
  }
}

TEST_P(EmbeddingTest, BackwardManyTokensIsDeterministic) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  // 4096 tokens over 53 ids, a shard of 31 rows at 20: many repeats, threaded on the cpu.
  const int64_t n = 4096, h = 19, v = 31, start = 20;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 7919) % 53;
  auto dout = make_tensor(random_values(n * h, 41), {n, h}, dtype, dev);
  const auto dw0 = random_values(v * h, 42);
  Tensor id_t = ids_tensor(ids, {n}, DType::i64, dev);
  auto dw_a = make_tensor(dw0, {v, h}, DType::f32, dev);
  auto dw_b = make_tensor(dw0, {v, h}, DType::f32, dev);
  ops.embedding_bwd(dw_a.t, dout.t, id_t, start);
  ops.embedding_bwd(dw_b.t, dout.t, id_t, start);
  const auto a = to_doubles(dw_a.t);
  EXPECT_EQ(a, to_doubles(dw_b.t));
  EXPECT_TRUE(all_close(a, ref_scatter(dw_a.rounded, dout.rounded, ids, start, v, h),
                        tolerance(DType::f32)));
}

MG_INSTANTIATE_OP_TEST(EmbeddingTest);

TEST(EmbeddingGradient, BackwardMatchesFiniteDifferences) {
  const auto& ops = test::ops_on("cpu");
  const int64_t h = 5, n = static_cast<int64_t>(kIds.size());
  const auto w0 = random_values(kLocalVocab * h, 51), gv = random_values(n * h, 52);
  Tensor ids = Tensor::from_vector(kIds, {n}, DType::i64);
  // loss = sum(out * G)
  auto loss_of = [&](const std::vector<double>& wv) {
    Tensor out = Tensor::empty({n, h}, DType::f64);
    ops.embedding_fwd(out, ids, Tensor::from_vector(wv, {kLocalVocab, h}, DType::f64), kVocabStart);
    const auto o = to_doubles(out);
    double loss = 0;
    for (std::size_t i = 0; i < o.size(); ++i) loss += o[i] * gv[i];
    return loss;
  };
  Tensor dw = Tensor::zeros({kLocalVocab, h}, DType::f64);
  ops.embedding_bwd(dw, Tensor::from_vector(gv, {n, h}, DType::f64), ids, kVocabStart);
  EXPECT_TRUE(all_close(to_doubles(dw), test::numerical_gradient(loss_of, w0), kFdTol));
}

TEST(EmbeddingValidation, RejectsBadIdsAndShapes) {
  const auto& ops = test::ops_on("cpu");
  Tensor w = Tensor::zeros({4, 3}, DType::f32);
  Tensor out = Tensor::zeros({2, 3}, DType::f32);
  Tensor neg = Tensor::from_vector(std::vector<int64_t>{1, -2}, {2}, DType::i64);
  try {
    ops.embedding_fwd(out, neg, w, 0);
    ADD_FAILURE() << "negative id accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("negative id -2"), std::string::npos) << e.message();
  }
  Tensor dw = Tensor::zeros({4, 3}, DType::f32);
  EXPECT_THROW(ops.embedding_bwd(dw, out, neg, 0), Error);
  Tensor ok_ids = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2}, DType::i64);
  Tensor f_ids = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  EXPECT_THROW(ops.embedding_fwd(out, f_ids, w, 0), Error);  // float ids
  Tensor out_bf16 = Tensor::zeros({2, 3}, DType::bf16);
  EXPECT_THROW(ops.embedding_fwd(out_bf16, ok_ids, w, 0), Error);  // out dtype != weight dtype
  Tensor out_wide = Tensor::zeros({2, 4}, DType::f32);
  EXPECT_THROW(ops.embedding_fwd(out_wide, ok_ids, w, 0), Error);  // H mismatch
  Tensor out_long = Tensor::zeros({3, 3}, DType::f32);
  EXPECT_THROW(ops.embedding_fwd(out_long, ok_ids, w, 0), Error);  // N mismatch
  EXPECT_THROW(ops.embedding_fwd(out, ok_ids, w, -1), Error);      // negative vocab_start
}

}  // namespace
}  // namespace mg
