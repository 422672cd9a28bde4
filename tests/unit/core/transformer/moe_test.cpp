// MoE routing math and the MoE layer on one rank against serial references: the router's top-k
// probabilities, aux/z losses and their backward against finite differences; capacity dropping
// against a brute-force reference of Megatron's two drop policies (dropped choices pass no
// gradient); the aux loss on balanced vs skewed routing; MoELayer forward against a per-token loop
// over the experts and its backward (input, router and expert grads) against finite differences of
// sum(dy * y) + aux losses, in f64.
#include "megatron/core/transformer/moe/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "megatron/core/inference/inference_context.h"
#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

using transformer::MoeScoreFunction;
using transformer::MoeTokenDropPolicy;
using namespace transformer::moe;

std::vector<double> randn(std::size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(g);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct RouterCase {
  MoeScoreFunction f;
  bool pre;
  int64_t k;
};

TEST(MoERouter, TopkProbabilitiesBackwardMatchesFiniteDifferences) {
  const int64_t T = 5, E = 6;
  for (const RouterCase rc : {RouterCase{MoeScoreFunction::softmax, false, 2},
                              RouterCase{MoeScoreFunction::softmax, true, 2},
                              RouterCase{MoeScoreFunction::sigmoid, false, 2},
                              RouterCase{MoeScoreFunction::sigmoid, false, 1}}) {
    RouterOptions o;
    o.num_experts = E;
    o.topk = rc.k;
    o.score_function = rc.f;
    o.pre_softmax = rc.pre;
    const auto logits = randn(static_cast<std::size_t>(T * E), 3);
    const auto w = randn(static_cast<std::size_t>(T * rc.k), 4);
    const Routing r = topk_routing(logits, T, o);
    // Reference selection: the k largest logits of each row.
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> idx(E);
      for (int64_t e = 0; e < E; ++e) idx[e] = e;
      std::sort(idx.begin(), idx.end(),
                [&](int64_t a, int64_t b) { return logits[t * E + a] > logits[t * E + b]; });
      for (int64_t k = 0; k < rc.k; ++k) EXPECT_EQ(r.expert[t * rc.k + k], idx[k]);
    }
    std::vector<double> grad(logits.size(), 0.0);
    topk_routing_backward(r, logits, w, o, grad);
    const double eps = 1e-6;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      auto lp = logits, lm = logits;
      lp[i] += eps;
      lm[i] -= eps;
      const double fd =
          (dot(topk_routing(lp, T, o).prob, w) - dot(topk_routing(lm, T, o).prob, w)) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 1e-7) << "logit " << i;
    }
  }
}

TEST(MoERouter, AuxScoresAndZLossBackwardMatchFiniteDifferences) {
  const int64_t T = 4, E = 5;
  const auto logits = randn(static_cast<std::size_t>(T * E), 7);
  const auto c = randn(static_cast<std::size_t>(T * E), 8);
  for (MoeScoreFunction f : {MoeScoreFunction::softmax, MoeScoreFunction::sigmoid}) {
    std::vector<double> grad(logits.size(), 0.0);
    aux_loss_scores_backward(logits, aux_loss_scores(logits, T, E, f), c, T, E, f, grad);
    for (std::size_t i = 0; i < logits.size(); ++i) {
      auto lp = logits, lm = logits;
      lp[i] += 1e-6;
      lm[i] -= 1e-6;
      const double fd =
          (dot(aux_loss_scores(lp, T, E, f), c) - dot(aux_loss_scores(lm, T, E, f), c)) / 2e-6;
      EXPECT_NEAR(grad[i], fd, 1e-7);
    }
  }
  std::vector<double> grad(logits.size(), 0.0);
  const double z = z_loss(logits, T, E, 0.3, 2.0, &grad);
  double ref = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(logits[t * E + e]);
    ref += std::log(s) * std::log(s);
  }
  EXPECT_NEAR(z, 0.3 * ref / T, 1e-12);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    auto lp = logits, lm = logits;
    lp[i] += 1e-6;
    lm[i] -= 1e-6;
    const double fd =
        2.0 * (z_loss(lp, T, E, 0.3, 0, nullptr) - z_loss(lm, T, E, 0.3, 0, nullptr)) / 2e-6;
    EXPECT_NEAR(grad[i], fd, 1e-7);
  }
}

TEST(MoERouter, AuxLossBalancedVersusSkewed) {
  const int64_t T = 8, E = 4, K = 1;
  RouterOptions o;
  o.num_experts = E;
  o.topk = K;
  // Balanced: token t prefers expert t % E by a small margin: every expert gets T/E tokens and the
  // mean scores are nearly uniform, so the loss is about coeff (its minimum, 1 x coeff).
  std::vector<double> bal(T * E, 0.0), skew(T * E, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    bal[t * E + t % E] = 1e-3;
    skew[t * E] = 4.0;  // every token strongly prefers expert 0
  }
  auto loss = [&](const std::vector<double>& l) {
    const Routing r = topk_routing(l, T, o);
    return switch_load_balancing_loss(aux_loss_scores(l, T, E, MoeScoreFunction::softmax), T, E,
                                      r.tokens_per_expert, K, 1, 0.01, nullptr);
  };
  EXPECT_NEAR(loss(bal), 0.01, 1e-5);
  EXPECT_GT(loss(skew), 0.03);  // E * max(p) * coeff = 4 * 0.95 * 0.01
  // The sequence partition: two halves with globally summed counts add up to the whole.
  const Routing r = topk_routing(skew, T, o);
  const auto sc = aux_loss_scores(skew, T, E, MoeScoreFunction::softmax);
  const std::vector<double> a(sc.begin(), sc.begin() + T / 2 * E),
      b(sc.begin() + T / 2 * E, sc.end());
  EXPECT_NEAR(switch_load_balancing_loss(a, T / 2, E, r.tokens_per_expert, K, 2, 0.01, nullptr) +
                  switch_load_balancing_loss(b, T / 2, E, r.tokens_per_expert, K, 2, 0.01, nullptr),
              loss(skew), 1e-12);
}

TEST(MoERouter, CapacityDropsTheTokensOfASerialReference) {
  const int64_t T = 12, E = 4, K = 2;
  const auto logits = randn(static_cast<std::size_t>(T * E), 11);
  for (MoeTokenDropPolicy policy : {MoeTokenDropPolicy::probs, MoeTokenDropPolicy::position}) {
    RouterOptions o;
    o.num_experts = E;
    o.topk = K;
    o.capacity_factor = 0.5;
    o.drop_policy = policy;
    const Routing r = topk_routing(logits, T, o);
    EXPECT_EQ(r.capacity, 3);  // ceil(12 * 2 / 4 * 0.5)
    // Serial reference: per expert, its choices sorted by the policy, the first `capacity` kept.
    for (int64_t e = 0; e < E; ++e) {
      std::vector<std::pair<double, int64_t>> c;  // (key, entry)
      for (int64_t i = 0; i < T * K; ++i)
        if (r.expert[i] == e)
          c.emplace_back(policy == MoeTokenDropPolicy::probs ? -r.prob[i] : double(i / K), i);
      std::stable_sort(c.begin(), c.end());
      for (std::size_t j = 0; j < c.size(); ++j)
        EXPECT_EQ(r.kept[c[j].second], j < 3 ? 1 : 0) << "expert " << e << " rank " << j;
    }
    // Dropped choices pass no gradient: d(prob) on them changes nothing.
    std::vector<double> g(T * E, 0.0), g_kept(T * E, 0.0), ones(T * K, 1.0), kept_only(T * K);
    int64_t dropped = 0;
    for (int64_t i = 0; i < T * K; ++i) {
      kept_only[i] = r.kept[i] ? 1.0 : 0.0;
      dropped += r.kept[i] ? 0 : 1;
    }
    EXPECT_GT(dropped, 0);
    topk_routing_backward(r, logits, ones, o, g);
    topk_routing_backward(r, logits, kept_only, o, g_kept);
    EXPECT_EQ(g, g_kept);
  }
}

// ---- DeepSeek-style routing against tests/fixtures/moe_routing (gen_moe_routing.py: a NumPy
// transcription of Megatron's topk_routing_with_score_function, group_limited_topk and
// get_updated_expert_bias; gradients by finite differences of that forward) ----
nlohmann::json routing_fixture() {
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/moe_routing/moe_routing.json");
  EXPECT_TRUE(in.good()) << "tests/fixtures/moe_routing/moe_routing.json missing";
  return nlohmann::json::parse(in);
}

TEST(MoERouter, GroupLimitedBiasedScaledRoutingMatchesMegatronReference) {
  const nlohmann::json fx = routing_fixture();
  ASSERT_GE(fx.at("cases").size(), 7u);
  for (const auto& c : fx.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    RouterOptions o;
    o.num_experts = c.at("E").get<int64_t>();
    o.topk = c.at("topk").get<int64_t>();
    o.score_function =
        c.at("score_function") == "sigmoid" ? MoeScoreFunction::sigmoid : MoeScoreFunction::softmax;
    o.pre_softmax = c.at("pre_softmax").get<bool>();
    o.num_groups = c.at("num_groups").get<int64_t>();
    o.group_topk = c.at("group_topk").get<int64_t>();
    if (!c.at("scaling_factor").is_null()) o.scaling_factor = c.at("scaling_factor").get<double>();
    std::vector<float> bias;
    if (!c.at("bias").is_null()) bias = c.at("bias").get<std::vector<float>>();
    const int64_t T = c.at("T").get<int64_t>(), E = o.num_experts;
    const auto logits = c.at("logits").get<std::vector<double>>();
    const Routing r = topk_routing(logits, T, o, bias.empty() ? nullptr : &bias);
    EXPECT_EQ(r.expert, c.at("expert").get<std::vector<int64_t>>());
    const auto prob = c.at("prob").get<std::vector<double>>();
    ASSERT_EQ(r.prob.size(), prob.size());
    for (std::size_t i = 0; i < prob.size(); ++i) EXPECT_NEAR(r.prob[i], prob[i], 1e-14) << i;
    std::vector<double> grad(static_cast<std::size_t>(T * E), 0.0);
    topk_routing_backward(r, logits, c.at("w").get<std::vector<double>>(), o, grad);
    const auto ref = c.at("grad").get<std::vector<double>>();
    for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(grad[i], ref[i], 1e-8) << i;
  }
}

TEST(MoERouter, ExpertBiasUpdateMatchesMegatronReference) {
  const nlohmann::json u = routing_fixture().at("bias_update");
  std::vector<float> bias = u.at("bias").get<std::vector<float>>();
  update_expert_bias(bias, u.at("tokens").get<std::vector<double>>(), u.at("rate").get<double>());
  const auto want = u.at("updated").get<std::vector<float>>();
  ASSERT_EQ(bias.size(), want.size());
  for (std::size_t e = 0; e < want.size(); ++e) EXPECT_EQ(bias[e], want[e]) << "expert " << e;
  // Counts equal to the mean leave the bias alone; the counts are zeroed by the state's update.
  MoEState st;
  st.expert_bias[3] = {{0.5f, 0.5f}, {4.0, 2.0}};
  st.update_expert_biases(nullptr, 0.25);
  EXPECT_EQ(st.expert_bias[3].expert_bias, (std::vector<float>{0.25f, 0.75f}));
  EXPECT_EQ(st.expert_bias[3].local_tokens_per_expert, (std::vector<double>{0.0, 0.0}));
  const auto saved = st.expert_bias_state();
  ASSERT_EQ(saved.count("decoder.layers.3.mlp.router.expert_bias"), 1u);
  MoEState other;
  other.expert_bias[3] = {{0.0f, 0.0f}, {0.0, 0.0}};
  EXPECT_EQ(other.load_expert_bias_state(saved), 1);
  EXPECT_EQ(other.expert_bias[3].expert_bias, st.expert_bias[3].expert_bias);
}

TEST(MoERouter, GroupLimitedRoutingRefusesBadGroups) {
  RouterOptions o;
  o.num_experts = 6;
  o.topk = 2;
  o.num_groups = 4;  // 6 experts do not split into 4 groups
  o.group_topk = 2;
  const auto logits = randn(12, 1);
  EXPECT_THROW(topk_routing(logits, 2, o), Error);
  transformer::TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.seq_length = 4;
  c.add_bias_linear = false;
  c.num_moe_experts = 8;
  c.moe_router_topk = 2;
  c.moe_router_enable_expert_bias = true;  // softmax scores: Megatron refuses
  EXPECT_THROW(c.finalize(), Error);
  c.moe_router_score_function = MoeScoreFunction::sigmoid;
  c.moe_router_num_groups = 4;  // without --moe-router-group-topk
  EXPECT_THROW(c.finalize(), Error);
  c.moe_router_group_topk = 3;  // topk 2 is not a multiple of 3
  EXPECT_THROW(c.finalize(), Error);
  c.moe_router_group_topk = 2;
  EXPECT_NO_THROW(c.finalize());
}

// ---- MoELayer on one rank, f64 ----
struct LayerFixture {
  transformer::TransformerConfig c;
  transformer::ModuleContext ctx;
  MoEState state;  // this layer's aux-loss scale and metrics (a model's, in training)
  std::unique_ptr<transformer::ParamBuilder> pb;
  std::unique_ptr<MoELayer> layer;
  std::vector<transformer::Parameter> params;
  transformer::ParamAndGradBuffer buffer;
  std::vector<transformer::ParamDecl> decls;

  // bias: the experts' linear_fc{1,2}.bias; grouped: --moe-grouped-gemm; deepseek: sigmoid scores
  // with an expert bias, 2 groups of 2 experts (1 chosen), probabilities scaled by 2.5
  // (DeepSeek-V3's router at toy size).
  explicit LayerFixture(MoeScoreFunction f, bool shared, bool gate = false, bool bias = false,
                        bool grouped = false, bool deepseek = false) {
    c.num_layers = 1;
    c.hidden_size = 8;
    c.num_attention_heads = 2;
    c.seq_length = 3;
    c.add_bias_linear = bias;  // the experts' linear_fc{1,2}.bias (not with shared experts)
    c.activation = transformer::Activation::swiglu;
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 6;
    c.moe_router_score_function = f;
    c.moe_aux_loss_coeff = 0.1;
    c.moe_z_loss_coeff = 0.01;
    c.moe_shared_expert_intermediate_size = shared ? 5 : 0;
    c.moe_shared_expert_gate = gate;  // Qwen2-MoE's sigmoid gate on the shared experts
    c.moe_grouped_gemm = grouped;     // the experts' GEMMs through grouped_gemm
    c.params_dtype = DType::f64;
    if (deepseek) {
      c.moe_router_score_function = MoeScoreFunction::sigmoid;
      c.moe_router_enable_expert_bias = true;
      c.moe_router_num_groups = 2;
      c.moe_router_group_topk = 1;
      c.moe_router_topk_scaling_factor = 2.5;
      c.moe_router_load_balancing_type = transformer::MoeLoadBalancingType::seq_aux_loss;
    }
    c.finalize();
    ctx.ops = &ops_on("cpu");
    ctx.device = Device::cpu();
    ctx.config = &c;
    ctx.dtype = DType::f64;
    ctx.grad_dtype = DType::f64;
    ctx.moe = &state;
    pb = std::make_unique<transformer::ParamBuilder>(ctx);
    layer = std::make_unique<MoELayer>(ctx, *pb, "decoder.layers.0.mlp.", 0,
                                       transformer::MlpSubmodules{});
    pb->finish(params, buffer, decls);
    uint32_t seed = 1;
    for (auto& p : params) {
      auto v = randn(static_cast<std::size_t>(p.param.numel()), seed++, 0.5);
      p.param.copy_(Tensor::from_vector(v, p.param.shape(), DType::f64));
    }
  }
};

std::vector<double> row_of(const Tensor& w, int64_t r) {
  const auto v = w.to_vector<double>();
  const int64_t n = w.size(1);
  return std::vector<double>(v.begin() + r * n, v.begin() + (r + 1) * n);
}

// y = W2 swiglu(W1 x + b1) + b2 for one token, host f64 (b1, b2 undefined: no biases).
std::vector<double> mlp_ref(const Tensor& w1, const Tensor& w2, const std::vector<double>& x,
                            const Tensor& b1 = Tensor(), const Tensor& b2 = Tensor()) {
  const int64_t f = w2.size(1), h = w2.size(0);
  const std::vector<double> bv1 =
      b1.defined() ? b1.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(2 * f));
  const std::vector<double> bv2 =
      b2.defined() ? b2.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(h));
  std::vector<double> a(f), y(h, 0.0);
  for (int64_t j = 0; j < f; ++j) {
    const double g = dot(row_of(w1, j), x) + bv1[j], u = dot(row_of(w1, f + j), x) + bv1[f + j];
    a[j] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t i = 0; i < h; ++i) y[i] = dot(row_of(w2, i), a) + bv2[i];
  return y;
}

TEST(MoELayer, ForwardMatchesPerTokenExpertLoop) {
  for (int variant : {0, 1, 2, 3}) {  // no shared experts, shared, shared with its gate, biases
    const bool shared = variant == 1 || variant == 2, gate = variant == 2, bias = variant == 3;
    LayerFixture fx(MoeScoreFunction::softmax, shared, gate, bias);
    const int64_t S = 3, B = 2, H = 8, T = S * B;
    const auto xv = randn(static_cast<std::size_t>(T * H), 21);
    const Tensor x = Tensor::from_vector(xv, {S, B, H}, DType::f64);
    MoELayer::Saved saved;
    const auto y = fx.layer->forward(x, saved, true).to_vector<double>();
    auto param = [&](const std::string& n) -> const Tensor& {
      for (const auto& p : fx.params)
        if (p.name == n) return p.param;
      throw std::runtime_error(n);
    };
    const Tensor& wr = param("decoder.layers.0.mlp.router.weight");
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> xt(xv.begin() + t * H, xv.begin() + (t + 1) * H);
      std::vector<double> logits(4);
      for (int64_t e = 0; e < 4; ++e) logits[e] = dot(row_of(wr, e), xt);
      RouterOptions o = RouterOptions::from_config(fx.c);
      const Routing r = topk_routing(logits, 1, o);
      std::vector<double> ref(H, 0.0);
      for (int64_t k = 0; k < 2; ++k) {
        const std::string p =
            "decoder.layers.0.mlp.experts.local_experts." + std::to_string(r.expert[k]) + ".";
        const auto ye =
            bias ? mlp_ref(param(p + "linear_fc1.weight"), param(p + "linear_fc2.weight"), xt,
                           param(p + "linear_fc1.bias"), param(p + "linear_fc2.bias"))
                 : mlp_ref(param(p + "linear_fc1.weight"), param(p + "linear_fc2.weight"), xt);
        for (int64_t i = 0; i < H; ++i) ref[i] += r.prob[k] * ye[i];
      }
      if (shared) {
        const auto ys = mlp_ref(param("decoder.layers.0.mlp.shared_experts.linear_fc1.weight"),
                                param("decoder.layers.0.mlp.shared_experts.linear_fc2.weight"), xt);
        const double g =
            gate ? 1.0 / (1.0 +
                          std::exp(-dot(
                              row_of(param("decoder.layers.0.mlp.shared_experts.gate_weight"), 0),
                              xt)))
                 : 1.0;
        for (int64_t i = 0; i < H; ++i) ref[i] += g * ys[i];
      }
      for (int64_t i = 0; i < H; ++i) EXPECT_NEAR(y[t * H + i], ref[i], 1e-12);
    }
  }
}

TEST(MoELayer, BackwardMatchesFiniteDifferences) {
  // softmax, sigmoid, softmax with the shared-expert gate, DeepSeek-V3 routing (bias, groups,
  // scaling), experts with biases (no shared experts)
  for (int variant : {0, 1, 2, 3, 4}) {
    const MoeScoreFunction f =
        variant == 1 || variant == 3 ? MoeScoreFunction::sigmoid : MoeScoreFunction::softmax;
    LayerFixture fx(f, variant != 4, variant == 2, variant == 4, false, variant == 3);
    if (variant == 3) fx.state.expert_bias.at(0).expert_bias = {0.05f, -0.1f, 0.2f, 0.0f};
    const int64_t S = 3, B = 2, H = 8;
    const auto xv = randn(static_cast<std::size_t>(S * B * H), 31);
    const auto dyv = randn(xv.size(), 32);
    const double ca = fx.c.moe_aux_loss_coeff, cz = fx.c.moe_z_loss_coeff;
    // J = sum(dy * y) + aux_coeff * load-balancing loss + z_coeff * z-loss.
    auto objective = [&](const std::vector<double>& xs) {
      MoELayer::Saved s;
      const auto y = fx.layer->forward(Tensor::from_vector(xs, {S, B, H}, DType::f64), s, true)
                         .to_vector<double>();
      const auto [lb_value, z_value] = s.aux.values();
      return dot(y, dyv) + ca * lb_value + cz * z_value;
    };
    fx.state.aux_loss_auto_scaler.set_loss_scale(1.0);
    fx.buffer.grads.zero_();
    MoELayer::Saved s;
    fx.layer->forward(Tensor::from_vector(xv, {S, B, H}, DType::f64), s, true);
    const auto dx =
        fx.layer->backward(Tensor::from_vector(dyv, {S, B, H}, DType::f64), s).to_vector<double>();
    EXPECT_EQ(fx.state.metrics_tracker.layers().size(), 1u);  // backward records the layer
    fx.state.metrics_tracker.clear();
    const double eps = 1e-6;
    for (std::size_t i = 0; i < xv.size(); i += 3) {
      auto xp = xv, xm = xv;
      xp[i] += eps;
      xm[i] -= eps;
      EXPECT_NEAR(dx[i], (objective(xp) - objective(xm)) / (2 * eps), 1e-6) << "x " << i;
    }
    // Parameter grads: a few elements of each parameter.
    for (auto& p : fx.params) {
      const auto g = p.main_grad.to_vector<double>();
      auto v = p.param.to_vector<double>();
      for (std::size_t i = 0; i < v.size(); i += 7) {
        const double old = v[i];
        v[i] = old + eps;
        p.param.copy_(Tensor::from_vector(v, p.param.shape(), DType::f64));
        const double jp = objective(xv);
        v[i] = old - eps;
        p.param.copy_(Tensor::from_vector(v, p.param.shape(), DType::f64));
        const double jm = objective(xv);
        v[i] = old;
        p.param.copy_(Tensor::from_vector(v, p.param.shape(), DType::f64));
        EXPECT_NEAR(g[i], (jp - jm) / (2 * eps), 1e-6) << p.name << " [" << i << "]";
      }
    }
    EXPECT_TRUE(fx.state.metrics_tracker.layers().empty());  // forward alone adds nothing
  }
}

// --moe-router-enable-expert-bias: the kept choices of training micro-batches are counted in
// backward (not by forward alone, not in evaluation), the update moves the bias towards the
// under-used experts and zeroes the counts, and a large bias steers every token to its expert.
TEST(MoELayer, ExpertBiasCountsTrainingChoicesAndSteersRouting) {
  LayerFixture fx(MoeScoreFunction::sigmoid, false, false, false, false, true);
  const int64_t S = 3, B = 2, H = 8, T = S * B;
  const Tensor x =
      Tensor::from_vector(randn(static_cast<std::size_t>(T * H), 41), {S, B, H}, DType::f64);
  const Tensor dy =
      Tensor::from_vector(randn(static_cast<std::size_t>(T * H), 42), {S, B, H}, DType::f64);
  ExpertBiasState& eb = fx.state.expert_bias.at(0);
  MoELayer::Saved s;
  fx.layer->forward(x, s, false);  // evaluation
  s = MoELayer::Saved{};
  fx.layer->forward(x, s, true);
  EXPECT_EQ(eb.local_tokens_per_expert, std::vector<double>(4, 0.0));  // forward alone: nothing
  const std::vector<int64_t> chosen = s.expert_t.to_vector<int64_t>();
  fx.layer->backward(dy, s);
  std::vector<double> want(4, 0.0);
  for (int64_t e : chosen) want[static_cast<std::size_t>(e)] += 1.0;
  EXPECT_EQ(eb.local_tokens_per_expert, want);
  fx.state.update_expert_biases(nullptr, 1e-3);
  const double mean = static_cast<double>(T * 2) / 4.0;
  for (std::size_t e = 0; e < 4; ++e)
    EXPECT_EQ(eb.expert_bias[e], want[e] < mean   ? 1e-3f
                                 : want[e] > mean ? -1e-3f
                                                  : 0.0f)
        << "expert " << e;
  EXPECT_EQ(eb.local_tokens_per_expert, std::vector<double>(4, 0.0));
  eb.expert_bias = {0.0f, 0.0f, 0.0f, 5.0f};  // sigmoid scores < 1: expert 3 always wins
  s = MoELayer::Saved{};
  fx.layer->forward(x, s, false);
  const std::vector<int64_t> steered = s.expert_t.to_vector<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(steered[t * 2], 3) << "token " << t;
    EXPECT_EQ(steered[t * 2 + 1], 2) << "token " << t;  // the same group (2 of 2)
  }
}

// --moe-grouped-gemm: forward output, input gradient and every parameter gradient are bit-identical
// to the per-expert GEMM loop's (the CPU grouped_gemm is that loop), with and without shared
// experts.
TEST(MoELayer, GroupedGemmIsBitIdenticalToTheExpertLoop) {
  for (const bool shared : {false, true}) {
    LayerFixture loop(MoeScoreFunction::softmax, shared),
        grouped(MoeScoreFunction::softmax, shared, false, false, true);
    const int64_t S = 3, B = 2, H = 8;
    const Tensor x =
        Tensor::from_vector(randn(static_cast<std::size_t>(S * B * H), 41), {S, B, H}, DType::f64);
    const Tensor dy =
        Tensor::from_vector(randn(static_cast<std::size_t>(S * B * H), 42), {S, B, H}, DType::f64);
    std::vector<std::vector<double>> out[2];
    int i = 0;
    for (LayerFixture* fx : {&loop, &grouped}) {
      fx->state.aux_loss_auto_scaler.set_loss_scale(1.0);
      fx->buffer.grads.zero_();
      MoELayer::Saved s;
      out[i].push_back(fx->layer->forward(x, s, true).to_vector<double>());
      out[i].push_back(fx->layer->backward(dy, s).to_vector<double>());
      out[i].push_back(fx->buffer.grads.to_vector<double>());
      out[i].push_back(fx->buffer.params.to_vector<double>());
      ++i;
    }
    EXPECT_EQ(out[0][3], out[1][3]) << "the two layers must start from the same parameters";
    EXPECT_EQ(out[0][0], out[1][0]) << "forward";
    EXPECT_EQ(out[0][1], out[1][1]) << "input gradient";
    EXPECT_EQ(out[0][2], out[1][2]) << "parameter gradients";
    double norm = 0.0;
    for (double v : out[1][2]) norm += v * v;
    EXPECT_GT(norm, 0.0);
  }
}

TEST(MoELayer, ExpertParametersAreMarkedWithGlobalNames) {
  LayerFixture fx(MoeScoreFunction::softmax, true);
  int experts = 0;
  for (const auto& p : fx.params) {
    const bool is_expert = p.name.find(".experts.local_experts.") != std::string::npos;
    EXPECT_EQ(p.is_expert, is_expert) << p.name;
    experts += is_expert;
  }
  EXPECT_EQ(experts, 8);  // 4 experts x (fc1, fc2)
  // With biases: Megatron's SequentialMLP names, the biases expert parameters as well.
  LayerFixture fb(MoeScoreFunction::softmax, false, false, true);
  std::vector<std::string> names;
  for (const auto& p : fb.params)
    if (p.name.find(".experts.local_experts.") != std::string::npos) {
      EXPECT_TRUE(p.is_expert) << p.name;
      names.push_back(p.name);
    }
  ASSERT_EQ(names.size(), 16u);  // 4 experts x (fc1, fc2) x (weight, bias)
  EXPECT_EQ(names[1], "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.bias");
  EXPECT_EQ(names[3], "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias");
}

// The Mixtral-style and DeepSeek-style presets build GPT models whose MoE layers train: expert
// parameters marked and named per global expert, every parameter gets a gradient, and the aux
// losses reach the tracker in backward.
TEST(MoEPresets, MixtralAndDeepSeekStyleModelsTrain) {
  for (int preset = 0; preset < 2; ++preset) {
    transformer::TransformerConfig c;
    c.num_layers = 2;
    c.hidden_size = 16;
    c.num_attention_heads = 2;
    c.ffn_hidden_size = 24;
    c.seq_length = 8;
    if (preset == 0)
      models::apply_mixtral_architecture(c, 4);
    else
      models::apply_deepseek_moe_architecture(c, 4, 2, 8);
    c.moe_z_loss_coeff = 1e-3;
    models::GPTModel model(
        c, 50, ops_on("cpu"), Device::cpu(),
        preset == 0 ? models::mixtral_block_spec(c) : models::deepseek_moe_block_spec(c));
    models::GPTModel other(c, 50, ops_on("cpu"), Device::cpu());  // its own MoE state
    model.init_weights(3);
    int experts = 0;
    for (const auto& p : model.parameters()) experts += p.is_expert;
    EXPECT_EQ(experts, 2 * 4 * 2);  // layers x experts x (fc1, fc2)
    model.parameter("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight");
    if (preset == 1) model.parameter("decoder.layers.0.mlp.shared_experts.linear_fc2.weight");
    std::vector<int64_t> tok(16), lab(16);
    for (int i = 0; i < 16; ++i) tok[i] = (i * 7) % 50, lab[i] = (i * 7 + 1) % 50;
    models::GPTBatch b;
    b.tokens = Tensor::from_vector(tok, {2, 8}, DType::i64);
    b.labels = Tensor::from_vector(lab, {2, 8}, DType::i64);
    models::GPTForwardState st;
    model.zero_grad();
    const auto sums = model.forward(b, st, models::StepRng{}, true);
    EXPECT_TRUE(std::isfinite(sums.loss_sum));
    model.backward(st, 1.0 / sums.num_tokens);
    for (const auto& p : model.parameters()) {
      double sq = 0.0;
      for (double v : p.main_grad.to_vector<double>()) sq += v * v;
      EXPECT_GT(sq, 0.0) << p.name;
    }
    EXPECT_EQ(model.moe_state().metrics_tracker.layers().size(), 2u);
    EXPECT_TRUE(other.moe_state().metrics_tracker.layers().empty());  // per model, not global
    model.moe_state().metrics_tracker.clear();
    // KV-cache inference through the MoE layers: prefill + one token equal the full logits.
    const auto full = model.logits(b).to_vector<double>();  // [S, B, V]
    inference::StaticInferenceContext ic(2, 8);
    std::vector<int64_t> head, last;
    for (int bi = 0; bi < 2; ++bi) {
      head.insert(head.end(), tok.begin() + bi * 8, tok.begin() + bi * 8 + 7);
      last.push_back(tok[bi * 8 + 7]);
    }
    model.infer(Tensor::from_vector(head, {2, 7}, DType::i64), ic);
    const auto step = model.infer(Tensor::from_vector(last, {2, 1}, DType::i64), ic);
    const auto sv = step.to_vector<double>();
    const int64_t v = step.size(2);
    for (int64_t i = 0; i < 2 * v; ++i) EXPECT_NEAR(sv[i], full[7 * 2 * v + i], 1e-4);
  }
}

}  // namespace
}  // namespace mg::test
