// Conformance tests of init_normal / init_uniform (InitArgs in op_args.h) on every platform and
// kernel dtype: values against the Philox stream definitions, the row-shard slicing property that
// makes initialisation tensor-parallel invariant, moments of the draws, determinism, validation.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "megatron/core/random/philox.h"
#include "tests/unit/test_util.h"

namespace {

using mg::DType;
using mg::Shape;
using mg::Tensor;
using mg::ops::InitArgs;
using mg::test::to_doubles;
using mg::test::tolerance;

// Reference values in f64, rounded to dtype through the library's host conversion (the contract:
// computed in f64, then rounded as convert_host does).
std::vector<double> rounded_to(const std::vector<double>& v, DType dtype) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dtype).to_vector<double>();
}

std::vector<double> ref_normal(std::size_t n, const InitArgs& a) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = a.mean + a.std * mg::random::normal(a.seed, a.offset + i);
  return v;
}

std::vector<double> ref_uniform(std::size_t n, const InitArgs& a) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = a.mean + (a.std - a.mean) * double(mg::random::uniform(a.seed, a.offset + i));
  return v;
}

struct Moments {
  double mean, std;
};
Moments moments(const std::vector<double>& v) {
  double s = 0, s2 = 0;
  for (double x : v) s += x;
  const double mean = s / v.size();
  for (double x : v) s2 += (x - mean) * (x - mean);
  return {mean, std::sqrt(s2 / v.size())};
}

class InitTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  std::string platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(InitTest, NormalMatchesStreamDefinition) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  for (const Shape& shape : std::vector<Shape>{{1}, {7}, {13, 31}, {3, 5, 11}})
    for (uint64_t offset : {0ull, 1ull, 3ull, (1ull << 35) + 7}) {
      const InitArgs args{0.25, 0.02, 1234, offset};
      Tensor x = Tensor::empty(shape, dtype(), dev);
      ops.init_normal(x, args);
      const auto expected = rounded_to(ref_normal(x.numel(), args), dtype());
      EXPECT_TRUE(mg::test::all_close(to_doubles(x), expected, tolerance(dtype())))
          << mg::shape_str(shape) << " offset " << offset;
    }
}

TEST_P(InitTest, UniformMatchesStreamDefinition) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  for (const Shape& shape : std::vector<Shape>{{1}, {7}, {13, 31}, {3, 5, 11}})
    for (uint64_t offset : {0ull, 2ull, 5ull, (1ull << 35) + 1}) {
      const InitArgs args{-0.3, 0.7, 99, offset};
      Tensor x = Tensor::empty(shape, dtype(), dev);
      ops.init_uniform(x, args);
      const auto expected = rounded_to(ref_uniform(x.numel(), args), dtype());
      EXPECT_TRUE(mg::test::all_close(to_doubles(x), expected, tolerance(dtype())))
          << mg::shape_str(shape) << " offset " << offset;
    }
}

// A row shard [start, start + len) of a [V, H] weight initialised with offset + start * H equals
// the slice of the full tensor: vocab/column-parallel layers get the same weights for any TP.
TEST_P(InitTest, RowShardWithShiftedOffsetEqualsSliceOfFullTensor) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  const int64_t v = 37, h = 13;
  const InitArgs args{0.0, 0.02, 5, 17};
  Tensor full_n = Tensor::empty({v, h}, dtype(), dev), full_u = Tensor::empty({v, h}, dtype(), dev);
  ops.init_normal(full_n, args);
  ops.init_uniform(full_u, InitArgs{-1.0, 1.0, args.seed, args.offset});
  // Uneven shards, some starting at counters that are not multiples of the Philox block width.
  for (auto [start, len] : {std::pair<int64_t, int64_t>{0, 10}, {10, 9}, {19, 18}, {36, 1}}) {
    const uint64_t shard_offset = args.offset + static_cast<uint64_t>(start * h);
    Tensor shard = Tensor::empty({len, h}, dtype(), dev);
    ops.init_normal(shard, InitArgs{args.mean, args.std, args.seed, shard_offset});
    EXPECT_EQ(to_doubles(shard), to_doubles(full_n.slice(start, len))) << "normal start " << start;
    ops.init_uniform(shard, InitArgs{-1.0, 1.0, args.seed, shard_offset});
    EXPECT_EQ(to_doubles(shard), to_doubles(full_u.slice(start, len))) << "uniform start " << start;
  }
}

TEST_P(InitTest, MomentsOfTheDraws) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  constexpr int64_t kN = 1 << 16;
  Tensor x = Tensor::empty({kN}, dtype(), dev);
  ops.init_normal(x, InitArgs{1.0, 0.5, 31, 0});
  const Moments mn = moments(to_doubles(x));
  // Standard errors: mean 0.5/sqrt(N) ~ 2e-3, std 0.5/sqrt(2N) ~ 1.4e-3; 5 sigma.
  EXPECT_NEAR(mn.mean, 1.0, 1e-2);
  EXPECT_NEAR(mn.std, 0.5, 7e-3);

  ops.init_uniform(x, InitArgs{-2.0, 1.0, 32, 0});
  const auto u = to_doubles(x);
  const Moments mu = moments(u);
  // U(-2, 1): mean -0.5, std 3/sqrt(12) = 0.866; standard error of the mean 3.4e-3.
  EXPECT_NEAR(mu.mean, -0.5, 1.7e-2);
  EXPECT_NEAR(mu.std, 3.0 / std::sqrt(12.0), 1e-2);
  for (double val : u) {
    ASSERT_GE(val, -2.0);
    ASSERT_LE(val, 1.0);  // u < 1, but rounding to a narrow dtype may reach the bound
  }
}

TEST_P(InitTest, DeterministicInSeedAndOffset) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  auto run = [&](uint64_t seed, uint64_t offset) {
    Tensor x = Tensor::empty({101}, dtype(), dev);
    ops.init_normal(x, InitArgs{0.0, 1.0, seed, offset});
    return to_doubles(x);
  };
  const auto a = run(3, 0);
  EXPECT_EQ(run(3, 0), a);
  EXPECT_NE(run(4, 0), a);
  EXPECT_NE(run(3, 1), a);
}

TEST_P(InitTest, RejectsBadArguments) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  Tensor x = Tensor::empty({4}, dtype(), dev);
  EXPECT_THROW(ops.init_normal(x, InitArgs{0.0, -1.0, 0, 0}), mg::Error);
  EXPECT_THROW(ops.init_uniform(x, InitArgs{1.0, 0.0, 0, 0}), mg::Error);
  Tensor ints = Tensor::empty({4}, DType::i32, dev);
  EXPECT_THROW(ops.init_normal(ints, InitArgs{}), mg::Error);
}

MG_INSTANTIATE_OP_TEST(InitTest);

// The CPU kernels also fill fp8 buffers ("any float dtype"); rounding as convert_host does.
TEST(InitCpu, Fp8OutputsRoundFromF64) {
  const auto& ops = mg::test::ops_on("cpu");
  for (DType dt : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    Tensor x = Tensor::empty({257}, dt);
    const InitArgs args{0.0, 3.0, 8, 2};
    ops.init_normal(x, args);
    EXPECT_EQ(to_doubles(x), rounded_to(ref_normal(257, args), dt)) << dtype_name(dt);
  }
}

}  // namespace
