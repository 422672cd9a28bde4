// Loss scalers against Megatron's grad_scaler.py, step by step: growth after loss_scale_window
// clean steps, hysteresis before the first backoff, backoff on every overflow once hysteresis is
// spent, refill on growth, the min_scale floor, the constant scaler, make_grad_scaler's choice,
// state dict.
#include <gtest/gtest.h>

#include <string>

#include "megatron/core/common/error.h"
#include "megatron/core/optimizer/grad_scaler.h"

namespace {

using mg::optimizer::ConstantGradScaler;
using mg::optimizer::DynamicGradScaler;
using mg::optimizer::OptimizerConfig;

TEST(DynamicGradScaler, GrowsAfterWindowOfCleanSteps) {
  DynamicGradScaler s(1024.0, 1.0, 2.0, 0.5, /*growth_interval=*/3, /*hysteresis=*/2);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 1024.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.growth_tracker(), 2);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 4096.0f);
}

TEST(DynamicGradScaler, HysteresisThenBackoffOnEveryOverflow) {
  DynamicGradScaler s(1024.0, 1.0, 2.0, 0.5, 3, 2);
  s.update(false);  // growth tracker 1
  s.update(true);   // hysteresis 2 -> 1: no backoff yet, growth tracker reset
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.hysteresis_tracker(), 1);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(true);  // hysteresis 0: backoff
  EXPECT_EQ(s.scale(), 512.0f);
  s.update(true);  // hysteresis -1: Megatron keeps backing off without refilling
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.hysteresis_tracker(), -1);
  // Clean steps do not refill hysteresis until a growth happens.
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.hysteresis_tracker(), -1);
  s.update(true);
  EXPECT_EQ(s.scale(), 128.0f);
  for (int i = 0; i < 3; ++i) s.update(false);  // growth: scale doubles, hysteresis refilled
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.hysteresis_tracker(), 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 256.0f);
}

TEST(DynamicGradScaler, NeverBelowMinScale) {
  DynamicGradScaler s(8.0, 3.0, 2.0, 0.5, 1000, 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 4.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 3.0f);  // max(2, 3)
  s.update(true);
  EXPECT_EQ(s.scale(), 3.0f);
}

TEST(DynamicGradScaler, ValidatesArguments) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const mg::Error& e) {
      return e.message();
    }
    return std::string();
  };
  EXPECT_NE(msg([] { DynamicGradScaler(1.0, 2.0, 2.0, 0.5, 10, 2); }).find("min_scale 2"),
            std::string::npos);
  EXPECT_NE(msg([] { DynamicGradScaler(4.0, 1.0, 1.0, 0.5, 10, 2); }).find("growth_factor"),
            std::string::npos);
  EXPECT_NE(msg([] { DynamicGradScaler(4.0, 1.0, 2.0, 1.5, 10, 2); }).find("1.5"),
            std::string::npos);
  EXPECT_NE(msg([] { DynamicGradScaler(4.0, 1.0, 2.0, 0.5, 0, 2); }).find("growth_interval"),
            std::string::npos);
  EXPECT_NE(msg([] { DynamicGradScaler(4.0, 1.0, 2.0, 0.5, 10, 0); }).find("hysteresis"),
            std::string::npos);
}

TEST(DynamicGradScaler, StateDictRoundTrip) {
  DynamicGradScaler a(65536.0, 1.0, 2.0, 0.5, 4, 3);
  a.update(true);
  a.update(false);
  a.update(false);
  const auto sd = a.state_dict();
  EXPECT_EQ(sd.number("scale"), 65536.0);
  EXPECT_EQ(sd.number("growth_tracker"), 2);
  EXPECT_EQ(sd.number("hysteresis_tracker"), 2);
  DynamicGradScaler b(1.0, 1.0, 2.0, 0.5, 4, 3);
  b.load_state_dict(sd);
  for (bool inf : {false, false, true, true, true, false}) {
    a.update(inf);
    b.update(inf);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.growth_tracker(), b.growth_tracker());
    EXPECT_EQ(a.hysteresis_tracker(), b.hysteresis_tracker());
  }
}

TEST(ConstantGradScaler, NeverChanges) {
  ConstantGradScaler s(128.0);
  s.update(true);
  s.update(false);
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_TRUE(s.state_dict().empty());
}

TEST(MakeGradScaler, FollowsMegatronChoice) {
  OptimizerConfig c;
  EXPECT_EQ(mg::optimizer::make_grad_scaler(c), nullptr);  // fp32
  c.bf16 = true;
  c.params_dtype = mg::DType::bf16;
  EXPECT_EQ(mg::optimizer::make_grad_scaler(c), nullptr);  // bf16 without --loss-scale
  c.loss_scale = 8.0;
  auto constant = mg::optimizer::make_grad_scaler(c);
  ASSERT_NE(dynamic_cast<ConstantGradScaler*>(constant.get()), nullptr);
  EXPECT_EQ(constant->scale(), 8.0f);
  c = OptimizerConfig{};
  c.fp16 = true;
  c.params_dtype = mg::DType::f16;
  auto dynamic = mg::optimizer::make_grad_scaler(c);
  ASSERT_NE(dynamic_cast<DynamicGradScaler*>(dynamic.get()), nullptr);
  EXPECT_EQ(dynamic->scale(), 4294967296.0f);  // 2^32
}

}  // namespace
