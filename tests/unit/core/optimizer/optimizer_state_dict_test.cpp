// MegatronOptimizer checkpoints and construction checks: save after N steps, load into a fresh
// optimizer over the saved model weights, and the next steps are bit-identical (Adam f32/bf16/fp16
// with a scaler mid-hysteresis, SGD with momentum); without loading they are not. Keys follow
// Megatron's "optimizer.state.<kind>.<param name>". Bad checkpoints, bad configs and bad parameter
// layouts are refused with messages naming the key, value or parameter.
#include <limits>
#include <string>
#include <vector>

#include "tests/unit/core/optimizer/optimizer_test_util.h"

namespace {

using mg::DType;
using mg::Tensor;
using mg::optimizer::MegatronOptimizer;
using mg::optimizer::OptimizerConfig;
using mg::optimizer::StateDict;
using mg::test::error_message;
using namespace mg::test::opt;

struct Case {
  std::string name;
  std::string optimizer;
  DType dtype;
};

OptimizerConfig config_for(const Case& k) {
  OptimizerConfig c;
  c.optimizer = k.optimizer;
  c.params_dtype = k.dtype;
  c.bf16 = k.dtype == DType::bf16;
  c.fp16 = k.dtype == DType::f16;
  c.initial_loss_scale = 256.0;
  c.loss_scale_window = 3;
  c.clip_grad = 1.0;
  return c;
}

// Grads of step s; for fp16 they are multiplied by the current loss scale, and step 1 overflows.
void feed(TestModel& m, const MegatronOptimizer& opt, int s) {
  auto g = make_grads(1000 + 10 * s, opt.loss_scale());
  if (opt.config().fp16 && s == 1) g[0][0] = std::numeric_limits<double>::infinity();
  set_grads(m, g);
}

StateDict host_copy(const StateDict& sd) {
  StateDict out = sd;
  for (auto& [k, t] : out.tensors) t = t.to(mg::Device::cpu()).clone();
  return out;
}

class OptimizerStateDictTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerStateDictTest, ResumeIsBitIdentical) {
  const Case k = GetParam();
  const auto dev = mg::Device::cpu();
  const auto& ops = mg::test::ops_on("cpu");
  const OptimizerConfig c = config_for(k);

  auto a = make_model(k.dtype, DType::f32, dev);
  MegatronOptimizer opt_a(c, a.params, a.buffer, ops);
  for (int s = 0; s < 3; ++s) {
    feed(a, opt_a, s);
    opt_a.step(1e-2 * (s + 1), 0.05);
    opt_a.zero_grad();
  }
  const StateDict sd = host_copy(opt_a.state_dict());
  const Tensor saved_model = a.buffer.params.clone();
  const float saved_scale = opt_a.loss_scale();
  std::vector<std::vector<std::vector<double>>> continued;
  for (int s = 3; s < 6; ++s) {
    feed(a, opt_a, s);
    opt_a.step(1e-2, 0.05);
    opt_a.zero_grad();
    continued.push_back(model_values(a));
  }

  // Keys and scalars.
  EXPECT_EQ(sd.string("optimizer"), k.optimizer);
  EXPECT_EQ(sd.number("step"), k.dtype == DType::f16 ? 2 : 3);  // fp16 skipped step 1
  const std::string first = "optimizer.state.";
  const std::string name = "decoder.layers.0.mlp.linear_fc1.weight";
  if (k.optimizer == "adam") {
    EXPECT_TRUE(sd.has_tensor(first + "exp_avg." + name));
    EXPECT_TRUE(sd.has_tensor(first + "exp_avg_sq." + name));
  } else {
    EXPECT_TRUE(sd.has_tensor(first + "momentum_buffer." + name));
  }
  const bool mixed = k.dtype == DType::bf16 || k.dtype == DType::f16;
  EXPECT_EQ(sd.has_tensor(first + "fp32_param." + name), mixed);
  EXPECT_EQ(sd.has_number("grad_scaler.scale"), k.dtype == DType::f16);

  auto resume = [&](bool load) {
    auto b = make_model(k.dtype, DType::f32, dev, /*seed=*/99);
    b.buffer.params.copy_(saved_model);
    MegatronOptimizer opt_b(c, b.params, b.buffer, ops);
    if (load) opt_b.load_state_dict(sd);
    std::vector<std::vector<std::vector<double>>> out;
    for (int s = 3; s < 6; ++s) {
      feed(b, opt_b, s);
      opt_b.step(1e-2, 0.05);
      opt_b.zero_grad();
      out.push_back(model_values(b));
    }
    if (load) {
      EXPECT_EQ(opt_b.loss_scale(), opt_a.loss_scale());
      EXPECT_EQ(opt_b.num_steps(), opt_a.num_steps());
      for (std::size_t i = 0; i < b.params.size(); ++i)
        EXPECT_EQ(opt_b.master_param(i).to_vector<double>(),
                  opt_a.master_param(i).to_vector<double>());
    }
    return out;
  };
  EXPECT_EQ(resume(true), continued);
  EXPECT_NE(resume(false), continued);  // the state matters: the test can fail
  if (k.dtype == DType::f16) {
    EXPECT_EQ(saved_scale, 256.0f);  // hysteresis 2: the one overflow did not back off
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerStateDictTest,
                         ::testing::Values(Case{"adam_f32", "adam", DType::f32},
                                           Case{"adam_bf16", "adam", DType::bf16},
                                           Case{"adam_fp16", "adam", DType::f16},
                                           Case{"sgd_f32", "sgd", DType::f32},
                                           Case{"sgd_bf16", "sgd", DType::bf16}),
                         [](const auto& info) { return info.param.name; });

TEST(OptimizerStateDict, BadCheckpointsNameTheKey) {
  const auto& ops = mg::test::ops_on("cpu");
  auto m = make_model(DType::bf16, DType::f32, mg::Device::cpu());
  OptimizerConfig c = config_for({"", "adam", DType::bf16});
  MegatronOptimizer opt(c, m.params, m.buffer, ops);
  const StateDict good = host_copy(opt.state_dict());

  StateDict missing = good;
  missing.tensors.erase("optimizer.state.fp32_param.output_layer.weight");
  EXPECT_NE(error_message([&] {
              opt.load_state_dict(missing);
            }).find("optimizer.state.fp32_param.output_layer.weight"),
            std::string::npos);

  StateDict shape = good;
  shape.tensors["optimizer.state.exp_avg.output_layer.weight"] = Tensor::zeros({10}, DType::f32);
  const std::string msg = error_message([&] { opt.load_state_dict(shape); });
  EXPECT_NE(msg.find("[10]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;

  StateDict kind = good;
  kind.strings["optimizer"] = "sgd";
  EXPECT_NE(error_message([&] { opt.load_state_dict(kind); }).find("sgd"), std::string::npos);
}

TEST(OptimizerStateDict, ReloadModelParamsCopiesModelIntoMaster) {
  const auto& ops = mg::test::ops_on("cpu");
  auto m = make_model(DType::bf16, DType::f32, mg::Device::cpu());
  MegatronOptimizer opt(config_for({"", "adam", DType::bf16}), m.params, m.buffer, ops);
  set_grads(m, make_grads(5));
  opt.step(0.1, 0.0);  // master now differs from bf16(master) in its low bits
  m.buffer.params.copy_(Tensor::from_vector(std::vector<double>(m.buffer.params.numel(), 0.375),
                                            {m.buffer.params.numel()}));
  opt.reload_model_params();  // --no-load-optim / --finetune: the loaded weights become the master
  for (std::size_t i = 0; i < m.params.size(); ++i)
    for (double v : opt.master_param(i).to_vector<double>()) ASSERT_EQ(v, 0.375);
}

TEST(OptimizerConstruction, RefusesBadLayoutsAndConfigs) {
  const auto& ops = mg::test::ops_on("cpu");
  const auto dev = mg::Device::cpu();
  OptimizerConfig c;
  {
    auto m = make_model(DType::f32, DType::f32, dev);
    m.params[2].name = m.params[1].name;
    EXPECT_NE(error_message([&] {
                MegatronOptimizer o(c, m.params, m.buffer, ops);
              }).find("'decoder.final_layernorm.weight' appears twice"),
              std::string::npos);
  }
  {
    auto m = make_model(DType::f32, DType::f32, dev);
    m.params.push_back(m.params[0]);  // a tied weight listed twice
    m.params.back().name = "embedding.word_embeddings.weight";
    EXPECT_NE(
        error_message([&] { MegatronOptimizer o(c, m.params, m.buffer, ops); }).find("overlap"),
        std::string::npos);
  }
  {
    auto m = make_model(DType::f32, DType::f32, dev);
    m.params[1].param = Tensor::zeros({4}, DType::f32);
    EXPECT_NE(
        error_message([&] { MegatronOptimizer o(c, m.params, m.buffer, ops); }).find("not a view"),
        std::string::npos);
  }
  {
    auto m = make_model(DType::f32, DType::f32, dev);
    m.params[3].buffer_offset += 1;
    EXPECT_NE(error_message([&] {
                MegatronOptimizer o(c, m.params, m.buffer, ops);
              }).find("buffer_offset"),
              std::string::npos);
  }
  {
    auto m = make_model(DType::bf16, DType::f32, dev);
    EXPECT_NE(error_message([&] {
                MegatronOptimizer o(c, m.params, m.buffer, ops);
              }).find("the parameter buffer is bf16 but params_dtype is f32"),
              std::string::npos);
  }
  OptimizerConfig bad;
  bad.fp16 = bad.bf16 = true;
  EXPECT_NE(error_message([&] { bad.validate(); }).find("fp16 and bf16"), std::string::npos);
  bad = OptimizerConfig{};
  bad.optimizer = "adamw";
  EXPECT_NE(error_message([&] { bad.validate(); }).find("'adamw'"), std::string::npos);
  EXPECT_NE(error_message([&] { bad.validate(); }).find("valid values: adam, sgd"),
            std::string::npos);
  // The enum and the flag / checkpoint spelling, both ways.
  for (auto t : {mg::optimizer::OptimizerType::adam, mg::optimizer::OptimizerType::sgd})
    EXPECT_EQ(mg::optimizer::parse_optimizer_type(mg::optimizer::optimizer_type_name(t)), t);
  EXPECT_THROW(mg::optimizer::parse_optimizer_type("Adam"), mg::Error);
  bad = OptimizerConfig{};
  bad.adam_beta2 = 1.0;
  EXPECT_NE(error_message([&] { bad.validate(); }).find("adam_beta2"), std::string::npos);
  bad = OptimizerConfig{};
  bad.bf16 = true;  // params_dtype left at f32
  EXPECT_NE(error_message([&] { bad.validate(); }).find("expected bf16"), std::string::npos);
}

}  // namespace
