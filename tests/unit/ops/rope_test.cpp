// Conformance of rope_fwd / rope_bwd against a naive f64 reference written in Megatron's form
// (y = x * cos(emb) + rotate_half(x) * sin(emb)), on every test platform and kernel dtype: both
// layouts, rotary_percent < 1, position ids per batch row, position offsets, head counts 1..4; plus
// the relative-position property (q_m . k_n depends only on m - n) and a finite-difference check
// of the backward in f64 on the cpu platform.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::make_tensor;
using test::to_doubles;

struct RopeCase {
  int64_t s, b, h, hd;
  float percent = 1.0f;
  bool interleaved = false;
  float base = 10000.0f;
  int64_t offset = 0;
  std::vector<int64_t> pos = {};  // [S] or [B, S]; empty: s + offset
  bool pos_i32 = false;
  Shape shape() const { return {s, b, h, hd}; }
  int64_t numel() const { return s * b * h * hd; }
};

int64_t position(const RopeCase& c, int64_t s, int64_t b) {
  if (c.pos.empty()) return s + c.offset;
  if (static_cast<int64_t>(c.pos.size()) == c.s) return c.pos[s];
  return c.pos[b * c.s + s];
}

// Megatron's apply_rotary_pos_emb in f64: emb = cat(freqs, freqs) (interleaved: each freq twice in
// a row), rotate_half(x) = cat(-x2, x1) (interleaved: (-x[2i+1], x[2i]) pairs); sign -1 turns back.
std::vector<double> ref_rope(const RopeCase& c, const std::vector<double>& x, double sign) {
  const int64_t rot = static_cast<int64_t>(c.hd * static_cast<double>(c.percent));
  std::vector<double> y(x.size());
  for (int64_t s = 0; s < c.s; ++s)
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t h = 0; h < c.h; ++h) {
        const double* xr = x.data() + ((s * c.b + b) * c.h + h) * c.hd;
        double* yr = y.data() + ((s * c.b + b) * c.h + h) * c.hd;
        for (int64_t f = 0; f < c.hd; ++f) {
          if (f >= rot) {
            yr[f] = xr[f];
            continue;
          }
          const int64_t i = c.interleaved ? f / 2 : f % (rot / 2);
          const double freq = 1.0 / std::pow(static_cast<double>(c.base),
                                             static_cast<double>(2 * i) / static_cast<double>(rot));
          const double ang = sign * static_cast<double>(position(c, s, b)) * freq;
          double rh;
          if (c.interleaved)
            rh = f % 2 == 0 ? -xr[f + 1] : xr[f - 1];
          else
            rh = f < rot / 2 ? -xr[f + rot / 2] : xr[f - rot / 2];
          yr[f] = xr[f] * std::cos(ang) + rh * std::sin(ang);
        }
      }
  return y;
}

ops::RopeArgs args_of(const RopeCase& c, Device dev) {
  ops::RopeArgs a;
  a.base = c.base;
  a.rotary_percent = c.percent;
  a.interleaved = c.interleaved;
  a.position_offset = c.offset;
  if (!c.pos.empty()) {
    const Shape ps = static_cast<int64_t>(c.pos.size()) == c.s ? Shape{c.s} : Shape{c.b, c.s};
    a.position_ids = Tensor::from_vector(c.pos, ps, c.pos_i32 ? DType::i32 : DType::i64).to(dev);
  }
  return a;
}

std::vector<RopeCase> cases() {
  RopeCase per_batch{5, 3, 1, 8};
  per_batch.pos = {3, 1, 4, 1, 5, 90, 2, 6, 5, 3, 5, 8, 9, 7, 4093};
  RopeCase flat_i32{7, 2, 3, 10, 0.4f, false, 500.0f};
  flat_i32.pos = {0, 2, 4, 6, 8, 100, 1000};
  flat_i32.pos_i32 = true;
  return {
      {7, 2, 4, 16},                            // Megatron default
      {13, 1, 2, 12, 0.5f, true, 10000.0f, 5},  // interleaved, half the features, offset
      {1, 1, 1, 2},                             // the smallest
      {31, 2, 3, 20, 1.0f, true},               // interleaved, 3 heads
      {7, 2, 2, 12, 0.5f, false},               // rotate_half on 6 of 12 features
      per_batch,
      flat_i32,
  };
}

class RopeOp : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  const std::string& platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(RopeOp, ForwardAndBackwardMatchReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  uint64_t seed = 1;
  for (const auto& c : cases()) {
    const auto a = args_of(c, dev);
    auto x = make_tensor(test::random_values(c.numel(), seed++), c.shape(), dtype(), dev);
    Tensor y = Tensor::empty(c.shape(), dtype(), dev);
    ops.rope_fwd(y, x.t, a);
    EXPECT_TRUE(
        test::all_close(to_doubles(y), ref_rope(c, x.rounded, 1.0), test::tolerance(dtype())))
        << "fwd S " << c.s << " B " << c.b << " H " << c.h << " HD " << c.hd << " percent "
        << c.percent << " interleaved " << c.interleaved;
    auto dy = make_tensor(test::random_values(c.numel(), seed++), c.shape(), dtype(), dev);
    Tensor dx = Tensor::empty(c.shape(), dtype(), dev);
    ops.rope_bwd(dx, dy.t, a);
    EXPECT_TRUE(
        test::all_close(to_doubles(dx), ref_rope(c, dy.rounded, -1.0), test::tolerance(dtype())))
        << "bwd S " << c.s << " B " << c.b << " H " << c.h << " HD " << c.hd << " percent "
        << c.percent << " interleaved " << c.interleaved;
  }
}

TEST_P(RopeOp, InPlaceEqualsOutOfPlace) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const RopeCase c{7, 2, 2, 12, 0.5f, true, 10000.0f, 3};
  const auto a = args_of(c, dev);
  auto x = make_tensor(test::random_values(c.numel(), 77), c.shape(), dtype(), dev);
  Tensor y = Tensor::empty(c.shape(), dtype(), dev);
  ops.rope_fwd(y, x.t, a);
  Tensor xy = x.t.clone();
  ops.rope_fwd(xy, xy, a);
  EXPECT_EQ(to_doubles(xy), to_doubles(y));
  ops.rope_bwd(xy, xy, a);  // and back again
  EXPECT_TRUE(test::all_close(to_doubles(xy), x.rounded, test::tolerance(dtype())));
}

TEST_P(RopeOp, RejectsBadArguments) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  Tensor x = Tensor::zeros({5, 2, 3, 6}, dtype(), dev);
  Tensor y = Tensor::empty({5, 2, 3, 6}, dtype(), dev);
  ops::RopeArgs a;
  EXPECT_NO_THROW(ops.rope_fwd(y, x, a));
  a.rotary_percent = 0.5f;  // 3 rotary features: odd
  EXPECT_THROW(ops.rope_fwd(y, x, a), Error);
  a = {};
  a.position_ids = Tensor::from_vector(std::vector<int64_t>(4, 0), {4}).to(dev);
  EXPECT_THROW(ops.rope_fwd(y, x, a), Error) << "position_ids neither [S] nor [B, S]";
  a.position_ids = Tensor::from_vector(std::vector<float>(5, 0.0f), {5}).to(dev);
  EXPECT_THROW(ops.rope_fwd(y, x, a), Error) << "float position_ids";
  a = {};
  Tensor y_bad = Tensor::empty({5, 2, 3, 4}, dtype(), dev);
  EXPECT_THROW(ops.rope_fwd(y_bad, x, a), Error);
  Tensor x3 = Tensor::zeros({5, 2, 18}, dtype(), dev);
  EXPECT_THROW(ops.rope_fwd(x3, x3, a), Error) << "rank 3";
}

MG_INSTANTIATE_OP_TEST(RopeOp);

// After rope, q_m . k_n depends only on m - n (and not on a common position offset): the point
// of rotary embeddings. Checked in f64 on every platform, for both layouts and a partial rotation.
TEST(RopeProperty, DotProductDependsOnlyOnRelativePosition) {
  for (const auto& platform : test::op_test_platforms()) {
    if (test::unavailable_reason(platform)) continue;
    const auto& ops = test::ops_on(platform);
    const Device dev = test::device_for(platform);
    const int64_t S = 12, HD = 16;
    const auto qv = test::random_values(HD, 5), kv = test::random_values(HD, 6);
    for (bool interleaved : {false, true}) {
      for (float percent : {1.0f, 0.5f}) {
        // dots[offset][m][n] = rope(q at m) . rope(k at n)
        std::vector<std::vector<double>> dots;
        for (int64_t offset : {0, 37}) {
          std::vector<double> qs, ks;
          for (int64_t s = 0; s < S; ++s) {
            qs.insert(qs.end(), qv.begin(), qv.end());
            ks.insert(ks.end(), kv.begin(), kv.end());
          }
          ops::RopeArgs a;
          a.interleaved = interleaved;
          a.rotary_percent = percent;
          a.position_offset = offset;
          Tensor q = Tensor::from_vector(qs, {S, 1, 1, HD}).to(dev),
                 k = Tensor::from_vector(ks, {S, 1, 1, HD}).to(dev);
          Tensor rq = Tensor::empty({S, 1, 1, HD}, DType::f64, dev);
          Tensor rk = Tensor::empty({S, 1, 1, HD}, DType::f64, dev);
          ops.rope_fwd(rq, q, a);
          ops.rope_fwd(rk, k, a);
          const auto rqv = to_doubles(rq), rkv = to_doubles(rk);
          std::vector<double> d(S * S);
          for (int64_t m = 0; m < S; ++m)
            for (int64_t n = 0; n < S; ++n)
              for (int64_t e = 0; e < HD; ++e) d[m * S + n] += rqv[m * HD + e] * rkv[n * HD + e];
          dots.push_back(d);
        }
        const auto& d = dots[0];
        double spread = 0;
        for (int64_t m = 0; m + 1 < S; ++m)
          for (int64_t n = 0; n + 1 < S; ++n) {
            EXPECT_NEAR(d[(m + 1) * S + n + 1], d[m * S + n], 1e-12) << platform;
            spread = std::max(spread, std::abs(d[m * S + n + 1] - d[m * S + n]));
          }
        EXPECT_GT(spread, 1e-3) << "the dot product must change with the relative position";
        EXPECT_TRUE(test::all_close(dots[1], dots[0], test::tolerance(DType::f64)));
      }
    }
  }
}

// d/dx sum(rope(x) * w) by central differences equals rope_bwd(dy = w).
TEST(RopeGradient, FiniteDifferencesF64) {
  const auto& ops = test::ops_on("cpu");
  for (bool interleaved : {false, true}) {
    RopeCase c{3, 2, 2, 8, 0.5f, interleaved};
    c.pos = {4, 0, 9, 2, 7, 1};
    const auto a = args_of(c, Device::cpu());
    const auto x0 = test::random_values(c.numel(), 31);
    const auto w = test::random_values(c.numel(), 32);
    auto loss = [&](const std::vector<double>& xv) {
      Tensor y = Tensor::empty(c.shape(), DType::f64);
      ops.rope_fwd(y, Tensor::from_vector(xv, c.shape()), a);
      const auto yv = y.to_vector<double>();
      double l = 0;
      for (std::size_t i = 0; i < yv.size(); ++i) l += yv[i] * w[i];
      return l;
    };
    Tensor dx = Tensor::empty(c.shape(), DType::f64);
    ops.rope_bwd(dx, Tensor::from_vector(w, c.shape()), a);
    EXPECT_TRUE(
        test::all_close(dx.to_vector<double>(), test::numerical_gradient(loss, x0), {1e-8, 1e-6}))
        << "interleaved " << interleaved;
  }
}

}  // namespace
}  // namespace mg
