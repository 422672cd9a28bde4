// The same GPTModel code on every registered platform: with identical weights and batch, logits,
// loss and every gradient equal the CPU's (f32 and bf16), and recompute stays bit-identical on the
// platform itself. Skips (with the platform's reason) where a platform is unavailable.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "tests/unit/core/models/gpt_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

using models::GPTBatch;
using models::GPTForwardState;
using models::GPTModel;
using models::StepRng;
using transformer::TransformerConfig;

double scaled_error(const std::vector<double>& a, const std::vector<double>& e) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - e[i]));
    scale = std::max(scale, std::fabs(e[i]));
  }
  return err / std::max(scale, 1e-30);
}

class GPTPlatforms : public ::testing::TestWithParam<std::string> {};

void compare_with_cpu(const std::string& platform, TransformerConfig c, double tol) {
  GPTModel cpu(c, 50, ops_on("cpu"), Device::cpu());
  cpu.init_weights(9);
  GPTModel dev(c, 50, ops_on(platform), device_for(platform));
  dev.buffer().params.copy_(cpu.buffer().params);
  GPTBatch batch = random_batch(2, 8, 50, 61);
  std::vector<int32_t> doc = {0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3};
  batch.doc_ids = Tensor::from_vector(doc, {2, 8}, DType::i32);
  double loss[2];
  GPTModel* ms[2] = {&cpu, &dev};
  for (int i = 0; i < 2; ++i) {
    ms[i]->zero_grad();
    GPTForwardState st;
    const auto ls = ms[i]->forward(batch, st, StepRng{3, 1, 0}, true);
    loss[i] = ls.loss_sum / ls.num_tokens;
    ms[i]->backward(st, 1.0 / ls.num_tokens);
  }
  EXPECT_NEAR(loss[1], loss[0], tol * loss[0]) << platform;
  EXPECT_LT(
      scaled_error(dev.logits(batch).to_vector<double>(), cpu.logits(batch).to_vector<double>()),
      tol)
      << platform << " logits";
  for (const auto& p : cpu.parameters())
    EXPECT_LT(scaled_error(dev.parameter(p.name).main_grad.to_vector<double>(),
                           p.main_grad.to_vector<double>()),
              tol)
        << platform << " grad of " << p.name;
}

TEST_P(GPTPlatforms, Gpt2WithDropoutEqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  TransformerConfig c = tiny_gpt2_config();
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  compare_with_cpu(GetParam(), c, 1e-5);
}

TEST_P(GPTPlatforms, LlamaEqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  compare_with_cpu(GetParam(), tiny_llama_config(), 1e-5);
}

TEST_P(GPTPlatforms, LlamaBf16EqualsCpu) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  compare_with_cpu(GetParam(), tiny_llama_config(DType::bf16), 2e-2);
}

TEST_P(GPTPlatforms, RecomputeIsBitIdentical) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  TransformerConfig c = tiny_gpt2_config();
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  TransformerConfig rc = c;
  rc.recompute_granularity = transformer::RecomputeGranularity::full;
  rc.recompute_method = transformer::RecomputeMethod::uniform;
  rc.recompute_num_layers = 1;
  GPTModel a(c, 50, ops_on(GetParam()), device_for(GetParam()));
  GPTModel b(rc, 50, ops_on(GetParam()), device_for(GetParam()));
  a.init_weights(4);
  b.init_weights(4);
  const GPTBatch batch = random_batch(4, 8, 50, 62);
  std::vector<double> grads[2];
  double loss[2];
  GPTModel* ms[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    ms[i]->zero_grad();
    int64_t next = 0;
    loss[i] = pipeline_parallel::forward_backward_no_pipelining(
                  *ms[i], [&] { return batch_rows(batch, 2 * next++, 2); }, 2, {}, StepRng{1, 2, 0})
                  .lm_loss;
    grads[i] = ms[i]->buffer().grads.to_vector<double>();
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

INSTANTIATE_TEST_SUITE_P(AllPlatforms, GPTPlatforms, ::testing::ValuesIn(op_test_platforms()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mg::test
