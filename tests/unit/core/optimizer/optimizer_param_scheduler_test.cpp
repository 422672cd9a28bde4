// OptimizerParamScheduler against Megatron's formulas: every decay style, WSD's four anneal styles,
// fractional warmup, weight-decay increments, iteration mode counted in samples, validation, and
// the checkpoint semantics (match / use-checkpoint / override, legacy keys, exact continuation).
// Expected tables come from tests/fixtures/optimizer/scheduler_expected.py (an independent Python
// transcription of Megatron's formulas, run by hand; its output is pasted below).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/optimizer/optimizer_param_scheduler.h"

namespace {

using mg::optimizer::LrDecayStyle;
using mg::optimizer::OptimizerParamScheduler;
using mg::optimizer::OptimizerParamSchedulerConfig;
using mg::optimizer::SchedulerArgs;
using mg::optimizer::WdIncrStyle;
using mg::optimizer::WsdDecayStyle;

OptimizerParamSchedulerConfig base(LrDecayStyle style) {
  OptimizerParamSchedulerConfig c;
  c.init_lr = 0.0;
  c.max_lr = 0.01;
  c.min_lr = 0.001;
  c.lr_warmup_steps = 3;
  c.lr_decay_steps = 10;
  c.lr_decay_style = style;
  c.start_wd = c.end_wd = 0.1;
  c.wd_incr_steps = 10;
  return c;
}

// lr() after stepping to each of `steps` (increasing) equals `expected`.
void expect_lrs(const OptimizerParamSchedulerConfig& c, const std::vector<int64_t>& steps,
                const std::vector<double>& expected) {
  ASSERT_EQ(steps.size(), expected.size());
  OptimizerParamScheduler s(c);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    s.step(steps[i] - s.num_steps());
    EXPECT_DOUBLE_EQ(s.lr(), expected[i]) << "num_steps " << steps[i];
  }
}

std::vector<int64_t> range(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

TEST(OptimizerParamScheduler, Linear) {
  // Hand check at step 4: 0.001 + (1 - 1/7) * 0.009 = 0.0087142857...
  expect_lrs(base(LrDecayStyle::linear), range(13),
             {0.0, 0.0033333333333333335, 0.006666666666666667, 0.01, 0.008714285714285716,
              0.007428571428571429, 0.0061428571428571435, 0.0048571428571428585,
              0.0035714285714285718, 0.0022857142857142863, 0.001, 0.001, 0.001});
}

TEST(OptimizerParamScheduler, Cosine) {
  expect_lrs(base(LrDecayStyle::cosine), range(13),
             {0.0, 0.0033333333333333335, 0.006666666666666667, 0.01, 0.009554359905560885,
              0.008305704108364302, 0.006501344202803416, 0.0044986557971965855,
              0.0026942958916356995, 0.0014456400944391143, 0.001, 0.001, 0.001});
}

TEST(OptimizerParamScheduler, ConstantAfterWarmup) {
  expect_lrs(base(LrDecayStyle::constant), range(13),
             {0.0, 0.0033333333333333335, 0.006666666666666667, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01,
              0.01, 0.01, 0.01, 0.01});
}

TEST(OptimizerParamScheduler, InverseSquareRoot) {
  auto c = base(LrDecayStyle::inverse_square_root);
  c.min_lr = 0.0005;
  c.lr_warmup_steps = 4;
  c.lr_decay_steps = 100;
  // Step 16: 0.01 * sqrt(4) / sqrt(16) = 0.005; past decay steps: min_lr.
  expect_lrs(c, {0, 1, 2, 3, 4, 5, 9, 16, 50, 99, 100, 101},
             {0.0, 0.0025, 0.005, 0.0075, 0.01, 0.008944271909999158, 0.006666666666666667, 0.005,
              0.00282842712474619, 0.0020100756305184244, 0.002, 0.0005});
}

TEST(OptimizerParamScheduler, WsdEveryAnnealStyle) {
  const std::vector<double> head = {0.0, 0.005, 0.01};
  const double plateau = 0.010000000000000002;  // min + 1.0 * (max - min)
  const std::vector<std::pair<WsdDecayStyle, std::vector<double>>> tails = {
      {WsdDecayStyle::linear,
       {0.008875000000000001, 0.007750000000000001, 0.006625000000000001, 0.0055000000000000005,
        0.004375, 0.0032500000000000003, 0.002125, 0.001, 0.001}},
      {WsdDecayStyle::cosine,
       {0.009657457896300792, 0.008681980515339464, 0.007222075445642905, 0.0055000000000000005,
        0.0037779245543570965, 0.0023180194846605367, 0.0013425421036992098, 0.001, 0.001}},
      {WsdDecayStyle::exponential,
       {0.008506072777684084, 0.0071361354745668616, 0.0058798974286714675, 0.004727922061357857,
        0.003671555991859087, 0.0027028640350244895, 0.0018145695939873192, 0.001, 0.001}},
      {WsdDecayStyle::minus_sqrt,
       {0.006818019484660537, 0.0055000000000000005, 0.00448864807873785, 0.003636038969321072,
        0.0028848752646211465, 0.002205771365940053, 0.0015812708797586321, 0.001, 0.001}},
  };
  for (const auto& [style, tail] : tails) {
    SCOPED_TRACE(mg::optimizer::to_string(style));
    auto c = base(LrDecayStyle::wsd);
    c.lr_warmup_steps = 2;
    c.lr_decay_steps = 20;
    c.wsd_decay_steps = 8;  // anneal starts after step 12
    c.lr_wsd_decay_style = style;
    std::vector<double> expected = head;
    for (int i = 3; i <= 12; ++i) expected.push_back(plateau);
    expected.insert(expected.end(), tail.begin(), tail.end());
    expect_lrs(c, range(22), expected);
  }
}

TEST(OptimizerParamScheduler, FractionalWarmupFromArgs) {
  SchedulerArgs a;
  a.lr = 0.01;
  a.min_lr = 0.001;
  a.lr_warmup_init = 0.002;
  a.train_iters = 10;
  a.global_batch_size = 1;
  a.lr_warmup_fraction = 0.25;  // 2.5 steps
  a.weight_decay = 0.0;
  const auto c = mg::optimizer::scheduler_config_from_args(a);
  EXPECT_EQ(c.lr_warmup_steps, 2.5);
  expect_lrs(c, range(13),
             {0.002, 0.0052, 0.008400000000000001, 0.009400000000000002, 0.008200000000000002,
              0.007000000000000001, 0.0058000000000000005, 0.004600000000000001,
              0.0034000000000000007, 0.0021999999999999997, 0.001, 0.001, 0.001});
}

TEST(OptimizerParamScheduler, IterationModeCountsSamples) {
  SchedulerArgs a;
  a.lr = 0.01;
  a.min_lr = 0.001;
  a.lr_decay_style = "cosine";
  a.train_iters = 5;
  a.global_batch_size = 4;
  a.lr_warmup_iters = 1;
  const auto c = mg::optimizer::scheduler_config_from_args(a);
  EXPECT_EQ(c.lr_decay_steps, 20);
  EXPECT_EQ(c.lr_warmup_steps, 4.0);
  EXPECT_EQ(c.wd_incr_steps, 20);
  OptimizerParamScheduler s(c);
  const std::vector<double> expected = {
      0.0,   0.01, 0.008681980515339464, 0.0055000000000000005, 0.0023180194846605367, 0.001,
      0.001, 0.001};
  for (double e : expected) {
    EXPECT_DOUBLE_EQ(s.lr(), e) << "samples " << s.num_steps();
    s.step(4);  // one iteration of global batch 4
  }
  // Samples mode passes the sample counts through.
  SchedulerArgs b = a;
  b.train_iters.reset();
  b.lr_warmup_iters = 0;
  b.train_samples = 100;
  b.lr_warmup_samples = 7;
  b.lr_decay_samples = 90;
  const auto d = mg::optimizer::scheduler_config_from_args(b);
  EXPECT_EQ(d.lr_decay_steps, 90);
  EXPECT_EQ(d.lr_warmup_steps, 7.0);
  EXPECT_EQ(d.wd_incr_steps, 100);
}

TEST(OptimizerParamScheduler, WeightDecayIncrement) {
  const std::vector<std::pair<WdIncrStyle, std::vector<double>>> cases = {
      {WdIncrStyle::linear,
       {0.0, 0.010000000000000002, 0.020000000000000004, 0.03, 0.04000000000000001, 0.05, 0.06,
        0.06999999999999999, 0.08000000000000002, 0.09000000000000001, 0.1, 0.1, 0.1}},
      {WdIncrStyle::cosine,
       {0.0, 0.0024471741852423235, 0.009549150281252633, 0.02061073738537635, 0.03454915028125263,
        0.05, 0.06545084971874737, 0.07938926261462365, 0.09045084971874738, 0.09755282581475769,
        0.1, 0.1, 0.1}},
  };
  for (const auto& [style, expected] : cases) {
    auto c = base(LrDecayStyle::linear);
    c.wd_incr_style = style;
    c.start_wd = 0.0;
    c.end_wd = 0.1;
    OptimizerParamScheduler s(c);
    for (double e : expected) {
      EXPECT_DOUBLE_EQ(s.weight_decay(), e)
          << mg::optimizer::to_string(style) << " step " << s.num_steps();
      s.step(1);
    }
  }
  OptimizerParamScheduler constant(base(LrDecayStyle::linear));
  EXPECT_EQ(constant.weight_decay(), 0.1);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const mg::Error& e) {
    return e.message();
  }
  return "";
}

TEST(OptimizerParamScheduler, ValidationNamesValues) {
  auto c = base(LrDecayStyle::linear);
  c.lr_warmup_steps = 10;
  EXPECT_NE(error_of([&] { OptimizerParamScheduler s(c); }).find("lr_warmup_steps 10"),
            std::string::npos);
  c = base(LrDecayStyle::wsd);
  EXPECT_NE(error_of([&] { OptimizerParamScheduler s(c); }).find("wsd_decay_steps"),
            std::string::npos);
  c = base(LrDecayStyle::linear);
  c.start_wd = 0.0;  // constant style with start != end
  EXPECT_NE(error_of([&] { OptimizerParamScheduler s(c); }).find("start_wd == end_wd"),
            std::string::npos);
  c = base(LrDecayStyle::linear);
  c.min_lr = 0.02;
  EXPECT_NE(error_of([&] { OptimizerParamScheduler s(c); }).find("0.02"), std::string::npos);
  c = base(LrDecayStyle::linear);
  c.override_opt_param_scheduler = c.use_checkpoint_opt_param_scheduler = true;
  EXPECT_NE(error_of([&] { OptimizerParamScheduler s(c); }).find("both override"),
            std::string::npos);
  EXPECT_NE(error_of([] { mg::optimizer::parse_lr_decay_style("cosin"); }).find("'cosin'"),
            std::string::npos);
  EXPECT_EQ(mg::optimizer::parse_lr_decay_style("inverse-square-root"),
            LrDecayStyle::inverse_square_root);
  SchedulerArgs a;
  a.train_iters = 10;
  a.train_samples = 10;
  EXPECT_NE(error_of([&] { mg::optimizer::scheduler_config_from_args(a); }).find("exactly one"),
            std::string::npos);
  a.train_samples.reset();
  a.lr = 0.01;
  a.lr_warmup_fraction = 0.1;
  a.lr_warmup_iters = 2;
  EXPECT_NE(error_of([&] { mg::optimizer::scheduler_config_from_args(a); }).find("0.1"),
            std::string::npos);
}

TEST(OptimizerParamScheduler, StateDictResumesExactly) {
  auto c = base(LrDecayStyle::cosine);
  c.wd_incr_style = WdIncrStyle::cosine;
  c.start_wd = 0.01;
  c.end_wd = 0.1;
  OptimizerParamScheduler a(c);
  for (int i = 0; i < 5; ++i) a.step(1);
  const auto sd = a.state_dict();
  EXPECT_EQ(sd.number("num_steps"), 5);
  EXPECT_EQ(sd.string("lr_decay_style"), "cosine");
  OptimizerParamScheduler b(c);
  b.load_state_dict(sd);
  EXPECT_EQ(b.num_steps(), 5);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(a.lr(), b.lr());
    EXPECT_EQ(a.weight_decay(), b.weight_decay());
    a.step(1);
    b.step(1);
  }
}

TEST(OptimizerParamScheduler, LoadCheckUseCheckpointOverride) {
  auto c = base(LrDecayStyle::linear);
  OptimizerParamScheduler saved(c);
  saved.step(4);
  const auto sd = saved.state_dict();

  auto other = c;
  other.max_lr = 0.02;
  OptimizerParamScheduler strict(other);
  const std::string msg = error_of([&] { strict.load_state_dict(sd); });
  EXPECT_NE(msg.find("0.02"), std::string::npos) << msg;
  EXPECT_NE(msg.find("learning rate"), std::string::npos) << msg;

  other.use_checkpoint_opt_param_scheduler = true;
  OptimizerParamScheduler from_ckpt(other);
  from_ckpt.load_state_dict(sd);
  EXPECT_EQ(from_ckpt.config().max_lr, 0.01);
  EXPECT_EQ(from_ckpt.lr(), saved.lr());

  other.use_checkpoint_opt_param_scheduler = false;
  other.override_opt_param_scheduler = true;
  OptimizerParamScheduler overridden(other);
  overridden.load_state_dict(sd);
  EXPECT_EQ(overridden.config().max_lr, 0.02);
  EXPECT_EQ(overridden.num_steps(), 4);
  EXPECT_DOUBLE_EQ(overridden.lr(), 0.001 + (1.0 - 1.0 / 7.0) * (0.02 - 0.001));
}

TEST(OptimizerParamScheduler, LoadsLegacyKeys) {
  auto c = base(LrDecayStyle::linear);
  mg::optimizer::StateDict sd;
  sd.numbers = {{"start_lr", 0.01},
                {"min_lr", 0.001},
                {"warmup_iter", 3},
                {"end_iter", 10},
                {"num_iters", 6}};
  sd.strings = {{"decay_style", "linear"}};
  OptimizerParamScheduler s(c);
  s.load_state_dict(sd);
  EXPECT_EQ(s.num_steps(), 6);
  EXPECT_DOUBLE_EQ(s.lr(), 0.0061428571428571435);  // linear table, step 6
}

}  // namespace
