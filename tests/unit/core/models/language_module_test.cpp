// The LanguageModule seam (models/common/language_module.h): a model that is not a GPT (a
// token-unigram "model": loss of a token = w[token]) runs under the schedules, DDP's hooks and
// finalize_model_grads unchanged, with Megatron's loss semantics. Also: the schedules leave the
// per-token division to finalize_model_grads, which applies it exactly once.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/models/common/language_module.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using models::Batch;
using models::ForwardState;
using models::LossSums;

class UnigramState final : public ForwardState {
 public:
  bool holds_activations() const override { return tokens.defined(); }
  void clear() override { tokens = mask = Tensor(); }
  Tensor tokens, mask;  // [B, S]
};

// loss(token) = w[token]; one parameter "unigram.weight" [V] in f64 on the host.
class UnigramModel final : public models::LanguageModule {
 public:
  UnigramModel(int64_t vocab, const ops::OpTable& ops) : ops_(ops), vocab_(vocab) {
    buffer_.params = Tensor::from_vector(std::vector<double>(vocab, 0.5), {vocab}, DType::f64);
    buffer_.grads = Tensor::zeros({vocab}, DType::f64, Device::cpu());
    transformer::Parameter p;
    p.name = "unigram.weight";
    p.param = buffer_.params;
    p.main_grad = buffer_.grads;
    p.global_shape = {vocab};
    params_.push_back(p);
    config_.num_layers = 1;
  }
  const transformer::TransformerConfig& config() const override { return config_; }
  const ops::OpTable& ops() const override { return ops_; }
  Device device() const override { return Device::cpu(); }
  std::vector<transformer::Parameter>& parameters() override { return params_; }
  transformer::ParamAndGradBuffer& buffer() override { return buffer_; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t padded_vocab_size() const override { return vocab_; }
  int64_t num_parameters() const override { return vocab_; }
  void init_weights(uint64_t) override {
    buffer_.params.copy_(
        Tensor::from_vector(std::vector<double>(vocab_, 0.5), {vocab_}, DType::f64));
  }
  transformer::Parameter* shared_embedding_or_output_weight() override { return &params_[0]; }
  int num_chunks() const override { return 1; }
  const models::PipelineChunk& chunk(int) const override { return chunk_; }
  Shape pipeline_tensor_shape(int64_t s, int64_t b) const override { return {s, b, 1}; }
  DType pipeline_tensor_dtype() const override { return DType::f64; }
  std::unique_ptr<ForwardState> new_forward_state() const override {
    return std::make_unique<UnigramState>();
  }
  Tensor forward_chunk(int, const Batch& batch, const Tensor&, ForwardState& state,
                       const models::StepRng&, bool, LossSums* sums) override {
    auto& st = dynamic_cast<UnigramState&>(state);
    st.tokens = batch.tokens;
    st.mask = batch.loss_mask;
    const auto tok = batch.tokens.to_vector<int64_t>();
    const auto mask = batch.loss_mask.to_vector<double>();
    const auto w = buffer_.params.to_vector<double>();
    LossSums ls;
    for (std::size_t i = 0; i < tok.size(); ++i) {
      ls.loss_sum += w[static_cast<std::size_t>(tok[i])] * mask[i];
      ls.num_tokens += mask[i];
    }
    if (sums) *sums = ls;
    ++forwards;
    return Tensor();
  }
  Tensor backward_chunk(ForwardState& state, const Tensor&, double dloss) override {
    auto& st = dynamic_cast<UnigramState&>(state);
    const auto tok = st.tokens.to_vector<int64_t>();
    const auto mask = st.mask.to_vector<double>();
    auto g = buffer_.grads.to_vector<double>();
    for (std::size_t i = 0; i < tok.size(); ++i)
      g[static_cast<std::size_t>(tok[i])] += dloss * mask[i];
    buffer_.grads.copy_(Tensor::from_vector(g, {vocab_}, DType::f64));
    st.clear();
    if (grad_ready) grad_ready(0);
    return Tensor();
  }
  void set_grad_ready_hook(GradReadyHook hook) override { grad_ready = std::move(hook); }
  void set_param_use_hook(ParamUseHook) override {}
  transformer::moe::MoEState& moe_state() override { return moe_; }

  GradReadyHook grad_ready;
  int forwards = 0;

 private:
  const ops::OpTable& ops_;
  int64_t vocab_;
  transformer::TransformerConfig config_;
  transformer::ParamAndGradBuffer buffer_;
  std::vector<transformer::Parameter> params_;
  models::PipelineChunk chunk_;
  transformer::moe::MoEState moe_;
};

// Two micro-batches of [1, 4] tokens with uneven masks (3 and 1 unmasked tokens).
std::vector<Batch> batches() {
  std::vector<Batch> b(2);
  b[0].tokens = Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 2}, {1, 4}, DType::i64);
  b[0].loss_mask = Tensor::from_vector(std::vector<double>{1, 1, 1, 0}, {1, 4}, DType::f64);
  b[1].tokens = Tensor::from_vector(std::vector<int64_t>{2, 2, 3, 0}, {1, 4}, DType::i64);
  b[1].loss_mask = Tensor::from_vector(std::vector<double>{0, 1, 0, 0}, {1, 4}, DType::f64);
  return b;
}

const ops::OpTable& cpu_ops() {
  test::ensure_runtime();
  return test::ops_on("cpu");
}

pipeline_parallel::ForwardBackwardResult run(UnigramModel& m,
                                             const pipeline_parallel::ForwardBackwardConfig& cfg) {
  auto b = batches();
  std::size_t i = 0;
  return pipeline_parallel::forward_backward_no_pipelining(
      m, [&] { return b.at(i++); }, 2, cfg, models::StepRng{});
}

TEST(LanguageModule, MeanLossSemanticsOnAModelThatIsNotAGpt) {
  UnigramModel m(4, cpu_ops());
  pipeline_parallel::ForwardBackwardConfig cfg;
  cfg.loss_scale = 2.0;
  const auto r = run(m, cfg);
  EXPECT_EQ(m.forwards, 2);
  EXPECT_DOUBLE_EQ(r.loss_sum, 0.5 * 4);
  EXPECT_DOUBLE_EQ(r.num_tokens, 4.0);
  // Micro-batch i's token weight: loss_scale / tokens_i / 2 (Megatron's mean of means).
  const auto g = m.buffer().grads.to_vector<double>();
  const double w0 = 2.0 / 3.0 / 2.0, w1 = 2.0 / 1.0 / 2.0;
  EXPECT_DOUBLE_EQ(g[0], w0);
  EXPECT_DOUBLE_EQ(g[1], 2 * w0);
  EXPECT_DOUBLE_EQ(g[2], w1);
  EXPECT_DOUBLE_EQ(g[3], 0.0);
  EXPECT_DOUBLE_EQ(pipeline_parallel::aux_loss_scale(cfg, 2), 1.0);
  // Context parallelism: x CP (the gradients are averaged over dp-cp while each CP rank's aux-loss
  // gradient is its share of the whole sequence's already).
  EXPECT_DOUBLE_EQ(pipeline_parallel::aux_loss_scale(cfg, 2, 4), 4.0);
}

TEST(LanguageModule, PerTokenDivisionIsFinalizeModelGradsAlone) {
  UnigramModel m(4, cpu_ops());
  pipeline_parallel::ForwardBackwardConfig cfg;
  cfg.calculate_per_token_loss = true;
  const auto r = run(m, cfg);
  // The schedule leaves the raw token counts: each token's loss has weight 1.
  auto g = m.buffer().grads.to_vector<double>();
  EXPECT_EQ(g, (std::vector<double>{1, 2, 1, 0}));
  distributed::FinalizeModelGradsConfig fin;
  fin.calculate_per_token_loss = true;
  const LossSums global =
      distributed::finalize_model_grads(m, fin, {r.loss_sum, r.num_tokens, nullptr});
  EXPECT_DOUBLE_EQ(global.num_tokens, 4.0);
  g = m.buffer().grads.to_vector<double>();
  EXPECT_EQ(g, (std::vector<double>{0.25, 0.5, 0.25, 0.0}));
  EXPECT_DOUBLE_EQ(pipeline_parallel::aux_loss_scale(cfg, 2), 1.0);
  EXPECT_DOUBLE_EQ(pipeline_parallel::aux_loss_scale(cfg, 2, 4), 1.0);
  // A global batch without an unmasked token is an error under per-token loss.
  EXPECT_THROW(distributed::finalize_model_grads(m, fin, {0.0, 0.0, nullptr}), Error);
}

TEST(LanguageModule, LossSeedRejectsAMicroBatchWithoutTokens) {
  pipeline_parallel::ForwardBackwardConfig cfg;
  EXPECT_THROW(pipeline_parallel::loss_backward_seed(cfg, 0.0, 2, 1), Error);
  EXPECT_DOUBLE_EQ(pipeline_parallel::loss_backward_seed(cfg, 4.0, 2, 0), 1.0 / 8.0);
  cfg.calculate_per_token_loss = true;
  cfg.loss_scale = 3.0;
  EXPECT_DOUBLE_EQ(pipeline_parallel::loss_backward_seed(cfg, 0.0, 2, 1), 3.0);
}

}  // namespace
}  // namespace mg
