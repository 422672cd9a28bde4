// Conformance tests of the MoE token permutation ops (moe_permute, moe_unpermute,
// moe_unpermute_bwd) on every platform and kernel dtype against naive f64 references: the gather
// is exact, the weighted per-token sums are the f64 sums rounded once (bit for bit on the CPU,
// within the dtype's tolerance elsewhere), empty tokens write zeros, the backward's drows / dprob
// are the definitions', and bad shapes or indices are refused naming them. On a build without a
// GPU the cuda instances skip, printing why.
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;
using test::tolerance;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using Param = test::PlatformDType;

// T = 5 tokens, R = 8 rows in expert-major order: token 3 has no row, token 1 three.
const std::vector<int64_t> kRowToken = {1, 4, 0, 1, 2, 4, 1, 0};
constexpr int64_t kT = 5;

Tensor i64(const std::vector<int64_t>& v, Device dev) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::i64).to(dev);
}

// Each token's rows in row order.
void csr(const std::vector<int64_t>& row_token, int64_t t, std::vector<int64_t>& off,
         std::vector<int64_t>& rows) {
  off.assign(static_cast<std::size_t>(t + 1), 0);
  rows.clear();
  for (int64_t tok = 0; tok < t; ++tok) {
    for (std::size_t i = 0; i < row_token.size(); ++i)
      if (row_token[i] == tok) rows.push_back(static_cast<int64_t>(i));
    off[static_cast<std::size_t>(tok + 1)] = static_cast<int64_t>(rows.size());
  }
}

class MoePermuteTest : public ::testing::TestWithParam<Param> {};

TEST_P(MoePermuteTest, PermuteGathersRowsExactly) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  // H 64 and 300: rows copied in 16- or 8-byte units on the GPU; 1 and 7 narrower.
  for (int64_t h : {1, 7, 64, 300}) {
    auto x = make_tensor(random_values(kT * h, 1 + h), {kT, h}, dtype, dev);
    const int64_t r = static_cast<int64_t>(kRowToken.size());
    auto rows = make_tensor(std::vector<double>(r * h, kNaN), {r, h}, dtype, dev);
    ops.moe_permute(rows.t, x.t, i64(kRowToken, dev));
    std::vector<double> ref;
    for (int64_t tok : kRowToken)
      ref.insert(ref.end(), x.rounded.begin() + tok * h, x.rounded.begin() + (tok + 1) * h);
    EXPECT_EQ(to_doubles(rows.t), ref) << "H " << h;
  }
}

// A row gather is a byte copy, of any dtype: FP8 bytes too (ColumnParallelLinear regroups
// --fp8-param-gather's FP8 weights with it).
TEST_P(MoePermuteTest, PermuteCopiesFp8RowsBytes) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  if (dtype != DType::f32) GTEST_SKIP() << "one run per platform (the data is FP8, not the param)";
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const int64_t h = 9, r = static_cast<int64_t>(kRowToken.size());
  std::vector<uint8_t> bytes(static_cast<std::size_t>(kT * h));
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(37 * i + 5);
  Tensor x = Tensor::empty({kT, h}, DType::fp8_e4m3);
  std::memcpy(x.raw_data(), bytes.data(), bytes.size());
  Tensor rows = Tensor::empty({r, h}, DType::fp8_e4m3, dev);
  ops.moe_permute(rows, x.to(dev), i64(kRowToken, dev));
  const Tensor got = rows.to(Device::cpu());
  const auto* g = static_cast<const uint8_t*>(got.raw_data());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < h; ++j)
      EXPECT_EQ(g[i * h + j], bytes[static_cast<std::size_t>(kRowToken[i] * h + j)])
          << "row " << i << " column " << j;
}

TEST_P(MoePermuteTest, UnpermuteSumsWeightedRowsPerToken) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const int64_t r = static_cast<int64_t>(kRowToken.size());
  std::vector<int64_t> off, list;
  csr(kRowToken, kT, off, list);
  for (int64_t h : {1, 7, 300}) {
    for (bool weighted : {true, false}) {
      for (DType out_dtype : {dtype, DType::f64}) {
        auto rows = make_tensor(random_values(r * h, 11 + h), {r, h}, dtype, dev);
        const auto p = random_values(static_cast<std::size_t>(r), 12);
        Tensor prob = weighted ? Tensor::from_vector(p, {r}, DType::f64).to(dev) : Tensor();
        auto out = make_tensor(std::vector<double>(kT * h, kNaN), {kT, h}, out_dtype, dev);
        ops.moe_unpermute(out.t, rows.t, prob, i64(off, dev), i64(list, dev));
        std::vector<double> sum(static_cast<std::size_t>(kT * h), 0.0);
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < h; ++j)
            sum[kRowToken[i] * h + j] += (weighted ? p[i] : 1.0) * rows.rounded[i * h + j];
        // Rounded once to out's dtype.
        const auto ref = to_doubles(Tensor::from_vector(sum, {kT, h}, out_dtype));
        const auto got = to_doubles(out.t);
        if (platform == "cpu")
          EXPECT_EQ(got, ref) << "H " << h << " weighted " << weighted;
        else
          EXPECT_TRUE(all_close(got, ref, tolerance(out_dtype))) << "H " << h;
        for (int64_t j = 0; j < h; ++j) EXPECT_EQ(got[3 * h + j], 0.0);  // token 3: no row
      }
    }
  }
}

TEST_P(MoePermuteTest, UnpermuteBackwardGivesRowAndProbabilityGradients) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const int64_t r = static_cast<int64_t>(kRowToken.size());
  for (int64_t h : {1, 7, 300}) {
    auto dout = make_tensor(random_values(kT * h, 21 + h), {kT, h}, dtype, dev);
    auto rows = make_tensor(random_values(r * h, 22 + h), {r, h}, dtype, dev);
    const auto p = random_values(static_cast<std::size_t>(r), 23);
    Tensor prob = Tensor::from_vector(p, {r}, DType::f64).to(dev);
    auto drows = make_tensor(std::vector<double>(r * h, kNaN), {r, h}, dtype, dev);
    auto dprob = make_tensor(std::vector<double>(r, kNaN), {r}, DType::f64, dev);
    ops.moe_unpermute_bwd(drows.t, dprob.t, dout.t, rows.t, prob, i64(kRowToken, dev));
    std::vector<double> dr(static_cast<std::size_t>(r * h)), dp(static_cast<std::size_t>(r), 0.0);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < h; ++j) {
        dr[i * h + j] = p[i] * dout.rounded[kRowToken[i] * h + j];
        dp[i] += dout.rounded[kRowToken[i] * h + j] * rows.rounded[i * h + j];
      }
    const auto ref_dr = to_doubles(Tensor::from_vector(dr, {r, h}, dtype));
    if (platform == "cpu") {
      EXPECT_EQ(to_doubles(drows.t), ref_dr) << "H " << h;
    } else {
      EXPECT_TRUE(all_close(to_doubles(drows.t), ref_dr, tolerance(dtype))) << "H " << h;
    }
    EXPECT_TRUE(all_close(to_doubles(dprob.t), dp, {1e-12, 1e-12})) << "H " << h;
  }
}

TEST_P(MoePermuteTest, RefusesBadShapes) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  auto x = make_tensor(random_values(kT * 4, 31), {kT, 4}, dtype, dev);
  auto rows = make_tensor(random_values(8 * 3, 32), {8, 3}, dtype, dev);  // hidden 3 != 4
  EXPECT_THROW(ops.moe_permute(rows.t, x.t, i64(kRowToken, dev)), Error);
  auto rows4 = make_tensor(random_values(8 * 4, 33), {8, 4}, dtype, dev);
  EXPECT_THROW(ops.moe_permute(rows4.t, x.t, i64({0, 1}, dev)), Error);  // index [2] for 8 rows
  Tensor bad_prob = Tensor::from_vector(random_values(8, 34), {8}, DType::f32).to(dev);
  std::vector<int64_t> off, list;
  csr(kRowToken, kT, off, list);
  EXPECT_THROW(ops.moe_unpermute(x.t, rows4.t, bad_prob, i64(off, dev), i64(list, dev)), Error);
}

MG_INSTANTIATE_OP_TEST(MoePermuteTest);

// The CPU reads the index values: one outside the tokens is named.
TEST(MoePermuteCpu, RefusesIndicesOutOfRange) {
  const auto& ops = test::ops_on("cpu");
  const Device dev = Device::cpu();
  auto x = make_tensor(random_values(kT * 2, 41), {kT, 2}, DType::f32, dev);
  auto rows = make_tensor(random_values(2 * 2, 42), {2, 2}, DType::f32, dev);
  try {
    ops.moe_permute(rows.t, x.t, i64({0, kT}, dev));
    ADD_FAILURE() << "an index equal to T was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index[1] = 5 is outside [0, 5)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mg
