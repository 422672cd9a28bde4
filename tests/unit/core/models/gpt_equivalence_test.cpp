// Equivalences of the GPT training step on the CPU:
//  * recompute (full uniform, full block, selective) vs none with dropout > 0: bit-identical loss
//    and gradients (PITFALLS #6);
//  * one global batch split as micro-batch size x accumulation steps in several ways: same loss and
//    gradients (PITFALLS #8), for per-token loss with uneven masks and for the default mean loss;
//  * forward_backward_no_pipelining's loss semantics (Megatron's) and loss scale;
//  * bf16 and fp16 runs track f32 within the tolerances stated below.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "megatron/core/distributed/finalize_model_grads.h"
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
using pipeline_parallel::forward_backward_no_pipelining;
using pipeline_parallel::ForwardBackwardConfig;
using transformer::RecomputeGranularity;
using transformer::RecomputeMethod;
using transformer::TransformerConfig;

const ops::OpTable& cpu_ops() {
  ensure_runtime();
  return ops_on("cpu");
}

struct StepResult {
  double lm_loss;
  std::vector<double> grads;
};

// One training step: zero grads, `splits` micro-batches of the global batch, forward-backward.
StepResult run_step(GPTModel& m, const GPTBatch& global, int64_t num_microbatches,
                    ForwardBackwardConfig cfg = {}, StepRng rng = {}) {
  m.zero_grad();
  const int64_t mbs = global.tokens.size(0) / num_microbatches;
  int64_t next = 0;
  auto r = forward_backward_no_pipelining(
      m, [&] { return batch_rows(global, mbs * next++, mbs); }, num_microbatches, cfg, rng);
  if (!cfg.forward_only) {  // the per-token division is finalize_model_grads' (one rank here)
    distributed::FinalizeModelGradsConfig fin;
    fin.calculate_per_token_loss = cfg.calculate_per_token_loss;
    distributed::finalize_model_grads(m, fin, {r.loss_sum, r.num_tokens, nullptr});
  }
  return {r.lm_loss, m.buffer().grads.to_vector<double>()};
}

std::unique_ptr<GPTModel> make_model(TransformerConfig c, uint64_t seed = 11) {
  auto m = std::make_unique<GPTModel>(c, 50, cpu_ops(), Device::cpu());
  m->init_weights(seed);
  return m;
}

TEST(GPTEquivalence, RecomputeWithDropoutIsBitIdentical) {
  TransformerConfig c = tiny_gpt2_config();
  c.num_layers = 4;
  c.hidden_dropout = 0.2;
  c.attention_dropout = 0.2;
  const GPTBatch batch = random_batch(4, 8, 50, 21);
  auto base = make_model(c);
  const StepResult ref = run_step(*base, batch, 2, {}, StepRng{5, 3, 0});
  // Dropout is really on: evaluation (no dropout) gives another loss.
  ForwardBackwardConfig eval;
  eval.forward_only = true;
  EXPECT_NE(run_step(*base, batch, 2, eval, StepRng{5, 3, 0}).lm_loss, ref.lm_loss);
  // ... and the masks depend on the iteration.
  EXPECT_NE(run_step(*base, batch, 2, {}, StepRng{5, 4, 0}).lm_loss, ref.lm_loss);

  struct Variant {
    RecomputeGranularity g;
    RecomputeMethod m;
    int64_t n;
  };
  for (const Variant v : {Variant{RecomputeGranularity::full, RecomputeMethod::uniform, 1},
                          Variant{RecomputeGranularity::full, RecomputeMethod::uniform, 3},
                          Variant{RecomputeGranularity::full, RecomputeMethod::block, 2},
                          Variant{RecomputeGranularity::selective, RecomputeMethod::none, 0}}) {
    TransformerConfig rc = c;
    rc.recompute_granularity = v.g;
    rc.recompute_method = v.m;
    rc.recompute_num_layers = v.n;
    auto m = make_model(rc);
    const StepResult r = run_step(*m, batch, 2, {}, StepRng{5, 3, 0});
    EXPECT_EQ(r.lm_loss, ref.lm_loss) << to_string(v.g) << " " << to_string(v.m) << " " << v.n;
    EXPECT_EQ(r.grads, ref.grads) << to_string(v.g) << " " << to_string(v.m) << " " << v.n;
  }
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return err / scale;
}

TEST(GPTEquivalence, MicroBatchSplitsGiveTheSameLossAndGrads) {
  // f64, so only the summation order differs between splits.
  TransformerConfig c = tiny_llama_config(DType::f64);
  auto m = make_model(c);
  // Per-token loss with uneven masks: the objective is the token mean of the whole batch.
  const GPTBatch masked = random_batch(4, 8, 50, 31);
  ForwardBackwardConfig per_token;
  per_token.calculate_per_token_loss = true;
  const StepResult ref = run_step(*m, masked, 1, per_token);
  for (int64_t k : {2, 4}) {
    const StepResult r = run_step(*m, masked, k, per_token);
    EXPECT_NEAR(r.lm_loss, ref.lm_loss, 1e-12 * ref.lm_loss) << k << " micro-batches";
    EXPECT_LT(max_rel_diff(r.grads, ref.grads), 1e-12) << k << " micro-batches";
  }
  // Default (mean per micro-batch, averaged over micro-batches): equal when every micro-batch has
  // the same token count, as with a full mask.
  const GPTBatch full = random_batch(4, 8, 50, 32, /*with_mask=*/false);
  const StepResult ref2 = run_step(*m, full, 1);
  for (int64_t k : {2, 4}) {
    const StepResult r = run_step(*m, full, k);
    EXPECT_NEAR(r.lm_loss, ref2.lm_loss, 1e-12 * ref2.lm_loss) << k << " micro-batches";
    EXPECT_LT(max_rel_diff(r.grads, ref2.grads), 1e-12) << k << " micro-batches";
  }
  // Per-token and default agree there too.
  EXPECT_LT(max_rel_diff(run_step(*m, full, 2, per_token).grads, ref2.grads), 1e-12);
}

TEST(GPTEquivalence, ScheduleUsesMegatronLossSemantics) {
  TransformerConfig c = tiny_gpt2_config(DType::f64);
  auto m = make_model(c);
  const GPTBatch batch = random_batch(4, 8, 50, 41);
  // By hand: micro-batch i contributes loss_sum_i / tokens_i / 2; the reported loss is the token
  // mean of the whole batch.
  m->zero_grad();
  double sum = 0, tokens = 0;
  for (int64_t i = 0; i < 2; ++i) {
    GPTForwardState st;
    const models::LossSums ls = m->forward(batch_rows(batch, 2 * i, 2), st, StepRng{0, 0, i}, true);
    m->backward(st, 1.0 / ls.num_tokens / 2.0);
    sum += ls.loss_sum;
    tokens += ls.num_tokens;
  }
  const std::vector<double> manual = m->buffer().grads.to_vector<double>();
  const StepResult r = run_step(*m, batch, 2);
  EXPECT_EQ(r.grads, manual);
  EXPECT_DOUBLE_EQ(r.lm_loss, sum / tokens);
  // The loss scale multiplies the gradients.
  ForwardBackwardConfig scaled;
  scaled.loss_scale = 1024.0;
  const StepResult s = run_step(*m, batch, 2, scaled);
  for (std::size_t i = 0; i < manual.size(); ++i) ASSERT_DOUBLE_EQ(s.grads[i], 1024.0 * manual[i]);
  // A micro-batch without any unmasked token is refused under the default semantics.
  GPTBatch empty = batch_rows(batch, 0, 2);
  empty.loss_mask = Tensor::zeros({2, 8}, DType::f32);
  m->zero_grad();
  EXPECT_THROW(forward_backward_no_pipelining(m.get()[0], [&] { return empty; }, 1, {}, {}),
               mg::Error);
}

// bf16 / fp16 weights (rounded from the same f32 weights) against f32. Tolerances stated here:
// loss within 0.1% relative; every gradient within 3% of its tensor's largest element (bf16 has an
// 8-bit mantissa: 0.4% per rounding, accumulating over 2 layers of products; measured: bf16 loss
// 3e-6 relative, worst gradient 1.4%; fp16 0.1%).
void check_tracks_f32(DType dtype) {
  TransformerConfig c = tiny_llama_config();
  auto ref = make_model(c);
  TransformerConfig lc = c;
  lc.params_dtype = dtype;
  GPTModel low(lc, 50, cpu_ops(), Device::cpu());
  low.buffer().params.copy_(ref->buffer().params);  // identical layouts: one converting copy
  const GPTBatch batch = random_batch(4, 8, 50, 51);
  const StepResult r32 = run_step(*ref, batch, 2);
  ForwardBackwardConfig scaled;
  scaled.loss_scale = dtype == DType::f16 ? 1024.0 : 1.0;
  StepResult r = run_step(low, batch, 2, scaled);
  for (double& g : r.grads) g /= scaled.loss_scale;
  EXPECT_NEAR(r.lm_loss, r32.lm_loss, 1e-3 * r32.lm_loss) << dtype_name(dtype);
  double worst = 0;
  for (const auto& p : ref->parameters()) {
    const auto a = low.parameter(p.name).main_grad.to_vector<double>();
    const auto e = p.main_grad.to_vector<double>();
    std::vector<double> as(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) as[i] = a[i] / scaled.loss_scale;
    const double err = max_rel_diff(as, e);
    EXPECT_LT(err, 0.03) << dtype_name(dtype) << " " << p.name;
    worst = std::max(worst, err);
  }
  std::printf("%s: loss %.6f vs f32 %.6f, worst grad error %.3f of the tensor's max\n",
              std::string(dtype_name(dtype)).c_str(), r.lm_loss, r32.lm_loss, worst);
}

TEST(GPTEquivalence, Bf16TracksF32) {
  check_tracks_f32(DType::bf16);
}
TEST(GPTEquivalence, Fp16TracksF32) {
  check_tracks_f32(DType::f16);
}

}  // namespace
}  // namespace mg::test
