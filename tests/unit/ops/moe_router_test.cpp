// Conformance tests of the MoE router op (moe_router_topk, moe_router_topk_bwd) on every platform,
// logits in f32 and f64, over every router option the MoE layer passes (softmax / pre-softmax /
// sigmoid scores, expert bias, group-limited routing, scaling factor, capacity with both drop
// policies, ties): the cpu instances equal the host routing of transformer/moe/moe_utils.h
// (topk_routing / topk_routing_backward, the MoE layer's former host path) BIT FOR BIT; the cuda
// instances run the same cases and compare with the cpu op (the same choices, kept mask and
// counts exactly; probabilities, scores and d(logits) within 1e-12, exp's rounding aside), and
// skip with the reason printed on a machine without a GPU. Bad arguments are refused, named.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/transformer/moe/moe_utils.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using transformer::moe::RouterOptions;
using transformer::moe::Routing;

struct Case {
  std::string name;
  ops::MoeRouterArgs args;
  int64_t e = 8;
  bool bias = false;
  bool ties = false;     // logits on a coarse grid: many equal values (tie-breaking)
  int64_t aux_rows = 1;  // rows of aux_sums / aux_dscores (1: switch loss; B: sequence loss)
};

std::vector<Case> cases() {
  using ops::MoeDropPolicy;
  using ops::MoeRouterScore;
  std::vector<Case> c;
  auto add = [&c](std::string name, ops::MoeRouterArgs a, bool bias = false, bool ties = false,
                  int64_t e = 8) {
    c.push_back({std::move(name), a, e, bias, ties});
  };
  add("softmax_top2", {.topk = 2});
  add("softmax_top1", {.topk = 1});
  add("pre_softmax_top2", {.topk = 2, .pre_softmax = true});
  add("softmax_scaled", {.topk = 3, .scaling_factor = 2.5});
  add("pre_softmax_scaled", {.topk = 2, .pre_softmax = true, .scaling_factor = 0.5});
  add("sigmoid_top1", {.topk = 1, .score = MoeRouterScore::sigmoid});
  add("sigmoid_top4", {.topk = 4, .score = MoeRouterScore::sigmoid});
  add("sigmoid_bias", {.topk = 4, .score = MoeRouterScore::sigmoid}, true);
  add("softmax_groups", {.topk = 4, .num_groups = 4, .group_topk = 2});
  add("deepseek",
      {.topk = 4,
       .score = MoeRouterScore::sigmoid,
       .num_groups = 4,
       .group_topk = 2,
       .scaling_factor = 2.5},
      true, false, 16);
  add("capacity_probs", {.topk = 2, .capacity_factor = 1.0});
  add("capacity_position",
      {.topk = 2, .capacity_factor = 0.5, .drop_policy = MoeDropPolicy::position});
  add("capacity_sigmoid_scaled", {.topk = 2,
                                  .score = MoeRouterScore::sigmoid,
                                  .scaling_factor = 2.0,
                                  .capacity_factor = 0.75});
  add("ties_softmax", {.topk = 3}, false, true);
  add("ties_pre_softmax_capacity", {.topk = 2, .pre_softmax = true, .capacity_factor = 0.5}, false,
      true);
  add("ties_sigmoid_groups",
      {.topk = 4, .score = MoeRouterScore::sigmoid, .num_groups = 4, .group_topk = 2}, false, true);
  // The load-balancing rows and the z-loss, varied over the cases: none, one row (the switch
  // loss), two rows (the sequence loss of two sequences), with and without a z-loss.
  for (std::size_t i = 0; i < c.size(); ++i) {
    c[i].aux_rows = static_cast<int64_t>(i % 3);
    if (i % 2 == 1) {
      c[i].args.z_loss_coeff = 1e-2 * static_cast<double>(i);
      c[i].args.z_loss_scale = 0.25;
    }
  }
  return c;
}

constexpr int64_t kT = 13;

std::vector<double> logits_for(const Case& c) {
  std::vector<double> v = test::random_values(static_cast<std::size_t>(kT * c.e), 7, 0.05, 2.0);
  if (c.ties)
    for (double& x : v) x = std::round(x * 2.0) / 2.0;  // {-2, ..., 2} in halves
  return v;
}

std::vector<float> bias_for(const Case& c) {
  if (!c.bias) return {};
  std::vector<float> b;
  for (double x : test::random_values(static_cast<std::size_t>(c.e), 11, 0.01, 0.2))
    b.push_back(static_cast<float>(x));
  return b;
}

// The op's results on the host.
struct Result {
  std::vector<int64_t> expert, counts;
  std::vector<double> prob, scores, tokens, dlogits, aux_sums, z_sum;
  std::vector<uint8_t> kept;
};

std::vector<double> aux_dscores_for(const Case& c) {
  return test::random_values(static_cast<std::size_t>(std::max<int64_t>(c.aux_rows, 1) * c.e), 17);
}

Result run_op(const std::string& platform, const Case& c, DType dtype) {
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const int64_t e = c.e, k = c.args.topk;
  const Tensor logits = Tensor::from_vector(logits_for(c), {kT, e}, dtype).to(dev);
  const std::vector<float> b = bias_for(c);
  const Tensor bias = b.empty() ? Tensor() : Tensor::from_vector(b, {e}, DType::f32).to(dev);
  Tensor expert = Tensor::empty({kT, k}, DType::i64, dev);
  Tensor prob = Tensor::empty({kT, k}, DType::f64, dev);
  Tensor kept = Tensor::empty({kT, k}, DType::u8, dev);
  Tensor scores = Tensor::empty({kT, e}, DType::f64, dev);
  Tensor tokens = Tensor::empty({e}, DType::f64, dev);
  Tensor counts = Tensor::empty({e}, DType::i64, dev);
  const int64_t g = c.aux_rows;
  Tensor aux_sums = g > 0 ? Tensor::empty({g, e}, DType::f64, dev) : Tensor();
  Tensor z_sum = c.args.z_loss_coeff > 0.0 ? Tensor::empty({1}, DType::f64, dev) : Tensor();
  ops.moe_router_topk(expert, prob, kept, scores, tokens, counts, aux_sums, z_sum, logits, bias,
                      c.args);
  const Tensor dprob =
      Tensor::from_vector(test::random_values(static_cast<std::size_t>(kT * k), 13), {kT, k},
                          DType::f64)
          .to(dev);
  const Tensor aux_dscores =
      g > 0 ? Tensor::from_vector(aux_dscores_for(c), {g, e}, DType::f64).to(dev) : Tensor();
  Tensor dlogits = Tensor::empty({kT, e}, DType::f64, dev);
  ops.moe_router_topk_bwd(dlogits, dprob, aux_dscores, logits, expert, prob, kept, scores, c.args);
  return {expert.to_vector<int64_t>(),
          counts.to_vector<int64_t>(),
          prob.to_vector<double>(),
          scores.to_vector<double>(),
          tokens.to_vector<double>(),
          dlogits.to_vector<double>(),
          g > 0 ? aux_sums.to_vector<double>() : std::vector<double>{},
          z_sum.defined() ? z_sum.to_vector<double>() : std::vector<double>{},
          kept.to_vector<uint8_t>()};
}

// The host routing (the MoE layer's former path) on the same rounded logits: the routing, the
// load-balancing losses' score sums (as switch_load_balancing_loss / sequence_load_balancing_loss
// form them) and the z-loss's sum, and the backward in the layer's order (routing, load-balancing
// scores, z-loss).
Result run_host(const Case& c, DType dtype) {
  namespace moe = transformer::moe;
  const int64_t e = c.e, k = c.args.topk, g = c.aux_rows;
  const std::vector<double> logits =
      Tensor::from_vector(logits_for(c), {kT, e}, dtype).to_vector<double>();
  const std::vector<float> b = bias_for(c);
  const RouterOptions o = RouterOptions::from_op_args(c.args, e);
  const Routing r = moe::topk_routing(logits, kT, o, b.empty() ? nullptr : &b);
  Result out{r.expert,
             std::vector<int64_t>(static_cast<std::size_t>(e), 0),
             r.prob,
             r.scores,
             r.tokens_per_expert,
             std::vector<double>(static_cast<std::size_t>(kT * e), 0.0),
             {},
             {},
             r.kept};
  for (int64_t i = 0; i < kT * k; ++i)
    if (r.kept[static_cast<std::size_t>(i)]) ++out.counts[static_cast<std::size_t>(r.expert[i])];
  const std::vector<double> aux = moe::aux_loss_scores(logits, kT, e, o.score_function);
  if (g > 0) {
    out.aux_sums.assign(static_cast<std::size_t>(g * e), 0.0);
    for (int64_t row = 0; row < g; ++row)
      for (int64_t x = 0; x < e; ++x)
        for (int64_t t = row; t < kT; t += g) out.aux_sums[row * e + x] += aux[t * e + x];
  }
  if (c.args.z_loss_coeff > 0.0) out.z_sum = {moe::z_loss_sum(logits, kT, e)};
  moe::topk_routing_backward(r, logits, test::random_values(kT * k, 13), o, out.dlogits);
  if (g > 0) {
    const std::vector<double> rows = aux_dscores_for(c);
    std::vector<double> ds(static_cast<std::size_t>(kT * e));
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t x = 0; x < e; ++x) ds[t * e + x] = rows[(t % g) * e + x];
    moe::aux_loss_scores_backward(logits, aux, ds, kT, e, o.score_function, out.dlogits);
  }
  if (c.args.z_loss_coeff > 0.0)
    moe::z_loss(logits, kT, e, c.args.z_loss_coeff, c.args.z_loss_scale, &out.dlogits);
  return out;
}

class MoeRouterTest : public ::testing::TestWithParam<test::PlatformDType> {};

TEST_P(MoeRouterTest, MatchesTheHostRoutingForEveryOption) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  int64_t dropped = 0, tied = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Result ref = platform == "cpu" ? run_host(c, dtype) : run_op("cpu", c, dtype);
    const Result got = run_op(platform, c, dtype);
    // Choices, kept mask and counts: exact everywhere.
    EXPECT_EQ(got.expert, ref.expert);
    EXPECT_EQ(got.kept, ref.kept);
    EXPECT_EQ(got.counts, ref.counts);
    EXPECT_EQ(got.tokens, ref.tokens);
    if (platform == "cpu") {  // the host arithmetic, bit for bit
      EXPECT_EQ(got.prob, ref.prob);
      EXPECT_EQ(got.scores, ref.scores);
      EXPECT_EQ(got.dlogits, ref.dlogits);
      EXPECT_EQ(got.aux_sums, ref.aux_sums);
      EXPECT_EQ(got.z_sum, ref.z_sum);
    } else {
      EXPECT_TRUE(test::all_close(got.aux_sums, ref.aux_sums, {1e-12, 1e-12}));
      EXPECT_TRUE(test::all_close(got.z_sum, ref.z_sum, {1e-12, 1e-12}));
      EXPECT_TRUE(test::all_close(got.prob, ref.prob, {1e-12, 1e-12}));
      EXPECT_TRUE(test::all_close(got.scores, ref.scores, {1e-12, 1e-12}));
      EXPECT_TRUE(test::all_close(got.dlogits, ref.dlogits, {1e-12, 1e-12}));
    }
    for (uint8_t v : ref.kept) dropped += v == 0 ? 1 : 0;
    if (c.ties) ++tied;
    // The counts are the kept choices; tokens_per_expert all choices.
    int64_t kept = 0;
    for (int64_t n : got.counts) kept += n;
    double chosen = 0.0;
    for (double n : got.tokens) chosen += n;
    EXPECT_EQ(chosen, static_cast<double>(kT * c.args.topk));
    EXPECT_LE(kept, kT * c.args.topk);
  }
  EXPECT_GT(dropped, 0) << "the capacity cases must drop choices";
  EXPECT_GT(tied, 0);
}

// Equal logits: the lower expert wins every tie (Megatron's torch.topk order, the host's rule).
TEST_P(MoeRouterTest, TiesGoToTheLowerExpert) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  // Token 0: all equal; token 1: experts 5 and 2 tie for first, 7 and 1 for third.
  const std::vector<double> l = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5, 1, 0, 0, 1, 0, 0.5};
  const Tensor logits = Tensor::from_vector(l, {2, 8}, dtype).to(dev);
  Tensor expert = Tensor::empty({2, 3}, DType::i64, dev),
         prob = Tensor::empty({2, 3}, DType::f64, dev);
  Tensor kept = Tensor::empty({2, 3}, DType::u8, dev),
         scores = Tensor::empty({2, 8}, DType::f64, dev);
  Tensor tokens = Tensor::empty({8}, DType::f64, dev);
  Tensor none;
  for (bool sigmoid : {false, true}) {
    ops::MoeRouterArgs a{.topk = 3};
    if (sigmoid) a.score = ops::MoeRouterScore::sigmoid;
    ops.moe_router_topk(expert, prob, kept, scores, tokens, none, none, none, logits, Tensor(), a);
    EXPECT_EQ(expert.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 2, 5, 1}))
        << (sigmoid ? "sigmoid" : "softmax");
  }
}

// Sigmoid scores of large logits round to 1: without groups or a bias the logits choose (the
// host's rule), not the saturated scores.
TEST_P(MoeRouterTest, SaturatedScoresChooseByLogits) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const Tensor logits =
      Tensor::from_vector(std::vector<double>{40, 45, 0, 50, 0, 0, 0, 0}, {1, 8}, dtype).to(dev);
  Tensor expert = Tensor::empty({1, 2}, DType::i64, dev);
  Tensor prob = Tensor::empty({1, 2}, DType::f64, dev);
  Tensor kept = Tensor::empty({1, 2}, DType::u8, dev);
  Tensor scores = Tensor::empty({1, 8}, DType::f64, dev);
  Tensor tokens = Tensor::empty({8}, DType::f64, dev);
  Tensor none;
  ops.moe_router_topk(expert, prob, kept, scores, tokens, none, none, none, logits, Tensor(),
                      {.topk = 2, .score = ops::MoeRouterScore::sigmoid});
  EXPECT_EQ(scores.to_vector<double>()[1], 1.0);  // saturated: equal to expert 3's
  EXPECT_EQ(expert.to_vector<int64_t>(), (std::vector<int64_t>{3, 1}));
}

TEST_P(MoeRouterTest, RefusesBadArguments) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const Tensor logits = Tensor::from_vector(test::random_values(4 * 8, 3), {4, 8}, dtype).to(dev);
  Tensor expert = Tensor::empty({4, 2}, DType::i64, dev),
         prob = Tensor::empty({4, 2}, DType::f64, dev);
  Tensor kept = Tensor::empty({4, 2}, DType::u8, dev),
         scores = Tensor::empty({4, 8}, DType::f64, dev);
  Tensor tokens = Tensor::empty({8}, DType::f64, dev);
  Tensor none;
  const Tensor bias = Tensor::from_vector(std::vector<float>(8, 0.1f), {8}, DType::f32).to(dev);
  auto msg = [&](const ops::MoeRouterArgs& a, const Tensor& b) {
    return test::error_message([&] {
      ops.moe_router_topk(expert, prob, kept, scores, tokens, none, none, none, logits, b, a);
    });
  };
  EXPECT_NE(msg({.topk = 9}, Tensor()).find("topk 9 of 8 experts"), std::string::npos);
  EXPECT_NE(msg({.topk = 2}, bias).find("an expert bias needs sigmoid scores"), std::string::npos);
  EXPECT_NE(msg({.topk = 2, .num_groups = 3, .group_topk = 1}, Tensor()).find("group-limited"),
            std::string::npos);
  EXPECT_NE(msg({.topk = 2, .capacity_factor = 0.0}, Tensor()).find("capacity_factor 0"),
            std::string::npos);
  EXPECT_NE(msg({.topk = 3}, Tensor()).find("expert is"), std::string::npos);  // [4, 2] for k 3
}

INSTANTIATE_TEST_SUITE_P(Ops, MoeRouterTest,
                         ::testing::Combine(::testing::ValuesIn(test::op_test_platforms()),
                                            ::testing::Values(DType::f64, DType::f32)),
                         test::PlatformDTypeName{});

// ---- moe_shared_gate_fwd / _bwd --------------------------------------------------------------

class MoeSharedGateTest : public ::testing::TestWithParam<test::PlatformDType> {};

// The op list's definition in long double: g_t = sigmoid(x_t . w), out = y + g z; dz = g dy,
// dg = (dy . z) g (1 - g), dx = dg w, dw = sum_t dg x_t. Every output against it within the
// output dtype's rounding (plus f64 summation error), on each platform; and the backward against
// central differences of sum(dy * out) in f64 (the gradient of the forward as implemented).
TEST_P(MoeSharedGateTest, MatchesTheDefinitionAndItsGradient) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  const int64_t T = 37, H = 24;
  const std::vector<double> y = test::random_values(T * H, 1, -1.0, 1.0),
                            z = test::random_values(T * H, 2, -1.0, 1.0),
                            x = test::random_values(T * H, 3, -1.0, 1.0),
                            w = test::random_values(H, 4, -0.5, 0.5),
                            dy = test::random_values(T * H, 5, -1.0, 1.0);
  auto on_dev = [&](const std::vector<double>& v, const Shape& s, DType t) {
    return Tensor::from_vector(v, s, t).to(dev);
  };
  // The inputs as the op sees them (rounded to dtype once).
  auto rounded = [&](const std::vector<double>& v) {
    return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dtype).to_vector<double>();
  };
  const auto zr = rounded(z), xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
  Tensor out = Tensor::empty({T, H}, dtype, dev), gate = Tensor::empty({T}, DType::f64, dev);
  ops.moe_shared_gate_fwd(out, gate, on_dev(y, {T, H}, DType::f64), on_dev(z, {T, H}, dtype),
                          on_dev(x, {T, H}, dtype), on_dev(w, {H}, dtype));
  Tensor dz = Tensor::empty({T, H}, dtype, dev), dx = Tensor::empty({T, H}, dtype, dev);
  Tensor dw = Tensor::empty({H}, DType::f64, dev);
  ops.moe_shared_gate_bwd(dz, dx, dw, on_dev(dy, {T, H}, dtype), on_dev(z, {T, H}, dtype),
                          on_dev(x, {T, H}, dtype), on_dev(w, {H}, dtype), gate);
  const auto out_v = out.to_vector<double>(), gate_v = gate.to_vector<double>(),
             dz_v = dz.to_vector<double>(), dx_v = dx.to_vector<double>(),
             dw_v = dw.to_vector<double>();
  const double u = dtype == DType::f64 ? 0x1p-52 : dtype == DType::f32 ? 0x1p-23 : 0x1p-7;
  const double e64 = 1e-12;  // f64 sums of H or T terms of magnitude <= 1 (and exp's rounding)
  std::vector<long double> dw_ref(static_cast<std::size_t>(H), 0.0L), dw_mag(dw_ref);
  for (int64_t t = 0; t < T; ++t) {
    long double dot = 0.0L, dyz = 0.0L;
    for (int64_t j = 0; j < H; ++j) {
      dot += static_cast<long double>(xr[t * H + j]) * wr[j];
      dyz += static_cast<long double>(dyr[t * H + j]) * zr[t * H + j];
    }
    const long double g = 1.0L / (1.0L + std::exp(-dot));
    ASSERT_NEAR(gate_v[t], static_cast<double>(g), e64) << platform << " token " << t;
    const long double dg = dyz * g * (1.0L - g);
    for (int64_t j = 0; j < H; ++j) {
      const auto i = static_cast<std::size_t>(t * H + j);
      const long double o = y[i] + g * zr[i], dzr = g * dyr[i], dxr = dg * wr[j];
      EXPECT_NEAR(out_v[i], static_cast<double>(o), u * std::fabs(static_cast<double>(o)) + e64)
          << platform << " out " << t << "," << j;
      EXPECT_NEAR(dz_v[i], static_cast<double>(dzr), u * std::fabs(static_cast<double>(dzr)) + e64)
          << platform << " dz " << t << "," << j;
      EXPECT_NEAR(dx_v[i], static_cast<double>(dxr), u * std::fabs(static_cast<double>(dxr)) + e64)
          << platform << " dx " << t << "," << j;
      dw_ref[static_cast<std::size_t>(j)] += dg * xr[i];
      dw_mag[static_cast<std::size_t>(j)] += std::fabs(dg * xr[i]);
    }
  }
  for (int64_t j = 0; j < H; ++j)
    EXPECT_NEAR(dw_v[j], static_cast<double>(dw_ref[j]),
                1e-13 * (1.0 + static_cast<double>(dw_mag[j])))
        << platform << " dw " << j;
  // The gradient of L = sum(dy * out) with respect to w, by central differences (f64 only: the
  // differences of rounded outputs say nothing in narrower dtypes).
  if (dtype != DType::f64) return;
  const double h = 1e-6;
  for (int64_t j = 0; j < H; j += 5) {
    auto loss_at = [&](double dwj) {
      std::vector<double> w2 = w;
      w2[j] += dwj;
      Tensor o2 = Tensor::empty({T, H}, dtype, dev), g2 = Tensor::empty({T}, DType::f64, dev);
      ops.moe_shared_gate_fwd(o2, g2, on_dev(y, {T, H}, DType::f64), on_dev(z, {T, H}, dtype),
                              on_dev(x, {T, H}, dtype), on_dev(w2, {H}, dtype));
      const auto ov = o2.to_vector<double>();
      double l = 0.0;
      for (std::size_t i = 0; i < ov.size(); ++i) l += dy[i] * ov[i];
      return l;
    };
    const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
    EXPECT_NEAR(dw_v[j], numeric, 1e-7 * (1.0 + std::fabs(numeric))) << platform << " dw " << j;
  }
}

TEST_P(MoeSharedGateTest, RefusesBadShapes) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  Tensor out = Tensor::empty({4, 8}, dtype, dev), gate = Tensor::empty({4}, DType::f64, dev);
  const Tensor y64 = Tensor::zeros({4, 8}, DType::f64, dev), y = Tensor::zeros({4, 8}, dtype, dev);
  const Tensor x = Tensor::zeros({4, 8}, dtype, dev), w = Tensor::zeros({8}, dtype, dev);
  const Tensor w7 = Tensor::zeros({7}, dtype, dev);
  auto fwd = [&](const Tensor& yy, const Tensor& ww) {
    return test::error_message([&] { ops.moe_shared_gate_fwd(out, gate, yy, x, x, ww); });
  };
  if (dtype != DType::f64) {
    EXPECT_NE(fwd(y, w).find("moe_shared_gate_fwd: y is"), std::string::npos) << fwd(y, w);
  }
  EXPECT_NE(fwd(y64, w7).find("w is"), std::string::npos) << fwd(y64, w7);
  EXPECT_NE(
      test::error_message([&] { ops.moe_shared_gate_fwd(out, gate, y64, x, x, out); }).find("w is"),
      std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Ops, MoeSharedGateTest,
                         ::testing::Combine(::testing::ValuesIn(test::op_test_platforms()),
                                            ::testing::Values(DType::f64, DType::f32, DType::bf16)),
                         test::PlatformDTypeName{});

}  // namespace
}  // namespace mg
