// RoPE frequency scaling (ops/rope_scaling.h) against transformers: the fixture
// tests/fixtures/hf_models/rope_scaling.json holds inv_freq and attention_scaling of
// transformers' ROPE_INIT_FUNCTIONS for linear, llama3 and yarn configurations
// (gen_hf_models_2.py). Checked: rope_scaling_from_hf + rope_inv_freq / rope_attention_scaling
// equal them (transformers computes in f32: a few f32 ulps), and rope_fwd / rope_bwd with the
// scaling on every platform and dtype equal a naive f64 rotation by the fixture's frequencies
// times its attention factor. Plus the HF parser's errors (the flags: arguments_test).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "megatron/core/ops/rope_scaling.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::make_tensor;
using test::to_doubles;

nlohmann::json load_cases() {
  std::ifstream f(std::string(MG_TEST_FIXTURES_DIR) + "/hf_models/rope_scaling.json");
  return nlohmann::json::parse(f).at("cases");
}

// f32 frequencies from transformers: agreement to a few f32 ulps (relative 2^-21).
constexpr double kRel = 4.8e-7;

TEST(RopeScalingFrequencies, EqualTransformers) {
  const auto cases = load_cases();
  ASSERT_GE(cases.size(), 6u);
  for (const auto& c : cases) {
    const auto& rp = c.at("rope_parameters");
    const ops::RopeScaling s =
        ops::rope_scaling_from_hf(rp, c.at("max_position_embeddings").get<int64_t>(), "fixture");
    EXPECT_EQ(ops::to_string(s.type), rp.at("rope_type").get<std::string>());
    const auto want = c.at("inv_freq").get<std::vector<double>>();
    const int64_t hd = c.at("head_dim").get<int64_t>();
    const std::vector<double> got = ops::rope_inv_freq(rp.at("rope_theta").get<double>(), hd, s);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], kRel * std::abs(want[i]) + 1e-30)
          << rp.dump() << " inv_freq[" << i << "]";
    EXPECT_NEAR(ops::rope_attention_scaling(s), c.at("attention_scaling").get<double>(), 1e-6)
        << rp.dump();
  }
}

TEST(RopeScalingFrequencies, UnscaledIsTheBaseFormula) {
  const auto inv = ops::rope_inv_freq(10000.0, 8, ops::RopeScaling{});
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_EQ(inv[i], std::pow(10000.0, -2.0 * static_cast<double>(i) / 8.0));
}

TEST(RopeScalingFrequencies, ClearErrors) {
  auto msg = [](const nlohmann::json& rp) {
    try {
      ops::rope_scaling_from_hf(rp, 64, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg({{"rope_type", "dynamic"}, {"factor", 2.0}}).find("rope_type 'dynamic'"),
            std::string::npos);
  EXPECT_NE(msg({{"rope_type", "llama3"}, {"factor", 8.0}}).find("low_freq_factor"),
            std::string::npos);
  EXPECT_NE(msg({{"rope_type", "linear"}}).find("\"factor\""), std::string::npos);
  EXPECT_NE(msg({{"rope_type", "linear"}, {"factor", -1.0}}).find("factor -1"), std::string::npos);
  EXPECT_NE(msg({{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 3.0}})
                .find("attention_factor 3"),
            std::string::npos);
}

// rope_fwd / rope_bwd with scaled frequencies on every platform and dtype vs an f64 rotation by
// the fixture's (transformers') frequencies and attention factor.
class RopeScalingOp : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  const std::string& platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(RopeScalingOp, KernelsRotateByTheScaledFrequencies) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  uint64_t seed = 5;
  for (const auto& c : load_cases()) {
    const auto& rp = c.at("rope_parameters");
    const int64_t hd = c.at("head_dim").get<int64_t>(), s = 40, b = 2, h = 2;  // past 16
    const auto inv = c.at("inv_freq").get<std::vector<double>>();
    const double att = c.at("attention_scaling").get<double>();
    ops::RopeArgs a;
    a.base = rp.at("rope_theta").get<float>();
    a.scaling =
        ops::rope_scaling_from_hf(rp, c.at("max_position_embeddings").get<int64_t>(), "fixture");
    a.position_offset = 3;
    const Shape shape{s, b, h, hd};
    const int64_t n = s * b * h * hd;
    for (double sign : {1.0, -1.0}) {
      auto x = make_tensor(test::random_values(n, seed++), shape, dtype(), dev);
      Tensor y = Tensor::empty(shape, dtype(), dev);
      if (sign > 0)
        ops.rope_fwd(y, x.t, a);
      else
        ops.rope_bwd(y, x.t, a);
      std::vector<double> want(static_cast<std::size_t>(n));
      const int64_t half = hd / 2;
      for (int64_t r = 0; r < s * b * h; ++r) {
        const double pos = static_cast<double>(r / (b * h) + a.position_offset);
        for (int64_t i = 0; i < half; ++i) {
          const double ang = pos * inv[i];
          const double cs = std::cos(ang) * att, sn = sign * std::sin(ang) * att;
          const double x1 = x.rounded[r * hd + i], x2 = x.rounded[r * hd + i + half];
          want[r * hd + i] = x1 * cs - x2 * sn;
          want[r * hd + i + half] = x2 * cs + x1 * sn;
        }
      }
      // transformers' frequencies are f32 (relative kRel): the angle differs from ours by up to
      // pos * inv * kRel, which moves each output by at most 2 |x| att times that.
      double max_inv = 0.0, max_x = 0.0;
      for (double v : inv) max_inv = std::max(max_inv, v);
      for (double v : x.rounded) max_x = std::max(max_x, std::abs(v));
      const double max_pos = static_cast<double>(s - 1 + a.position_offset);
      test::Tol tol = test::tolerance(dtype());
      tol.atol += 2.0 * max_x * att * max_pos * max_inv * kRel;
      EXPECT_TRUE(test::all_close(to_doubles(y), want, tol))
          << rp.dump() << (sign > 0 ? " fwd" : " bwd");
    }
  }
}

MG_INSTANTIATE_OP_TEST(RopeScalingOp);

}  // namespace
}  // namespace mg
