// The KV-cache forward (GPTModel::infer, megatron/core/inference/) against the full forward:
// a prompt prefilled in one call and the rest fed one token at a time give, at every position, the
// logits GPTModel::logits() gives for the whole sequence (GPT-2: learned positions, biases, tied;
// LLaMA: RoPE, GQA, SwiGLU; Qwen2: qkv bias; MoE: top-2 of 4 experts and a shared expert in every
// other layer), in f64 (1e-10) and f32 (1e-4), batch 1 and 2.
// Generation with the cache equals generation recomputing the prefix (greedy and sampled), and
// stops at EOD / max-new-tokens / the position table.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "megatron/core/inference/inference_context.h"
#include "megatron/core/inference/text_generation.h"
#include "tests/unit/core/models/gpt_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

using models::GPTModel;
using transformer::TransformerConfig;

const ops::OpTable& cpu_ops() {
  ensure_runtime();
  return ops_on("cpu");
}

TransformerConfig qwen2_config(DType dtype) {
  TransformerConfig c = tiny_llama_config(dtype);
  models::apply_qwen2_architecture(c);
  return c;
}

// LLaMA with dropless top-2 MoE (4 experts) in every other layer and a shared expert.
TransformerConfig moe_config(DType dtype) {
  TransformerConfig c = tiny_llama_config(dtype);
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_layer_freq = 2;
  c.moe_shared_expert_intermediate_size = 8;
  return c;
}

std::unique_ptr<GPTModel> make(TransformerConfig c, uint64_t seed = 5) {
  c.max_position_embeddings = 16;
  auto m = std::make_unique<GPTModel>(c, 40, cpu_ops(), Device::cpu());
  m->init_weights(seed);
  // Non-zero biases and norm weights, so a bias skipped in the cached path shows.
  for (auto& p : m->parameters())
    if (p.param.dim() == 1) {
      const auto v = random_values(static_cast<std::size_t>(p.param.numel()), p.param.numel() + 3);
      std::vector<double> w(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) w[i] = 1.0 + 0.3 * v[i];
      p.param.copy_(Tensor::from_vector(w, p.param.shape(), p.param.dtype()));
    }
  return m;
}

void check_cached_equals_full(GPTModel& m, int64_t b, int64_t prefill, double tol) {
  const int64_t s = 11;
  const models::GPTBatch batch = random_batch(b, s, 40, 9, false);
  models::GPTBatch full;
  full.tokens = batch.tokens;
  const std::vector<double> want = to_doubles(m.logits(full));  // [S, B, V_pad]
  const int64_t vp = m.padded_vocab_size();
  inference::StaticInferenceContext ic(b, s);
  std::vector<double> got;
  // Prefill, then token by token: tokens [B, S] columns.
  const std::vector<int64_t> tok = batch.tokens.to_vector<int64_t>();
  auto columns = [&](int64_t from, int64_t len) {
    std::vector<int64_t> t(static_cast<std::size_t>(b * len));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < len; ++j) t[i * len + j] = tok[i * s + from + j];
    return Tensor::from_vector(t, {b, len}, DType::i64);
  };
  const std::vector<double> pre = to_doubles(m.infer(columns(0, prefill), ic));
  got.insert(got.end(), pre.begin(), pre.end());
  for (int64_t j = prefill; j < s; ++j) {
    EXPECT_EQ(ic.sequence_len_offset, j);
    const std::vector<double> step = to_doubles(m.infer(columns(j, 1), ic));
    got.insert(got.end(), step.begin(), step.end());
  }
  ASSERT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
    worst = std::max(worst, d);
    if (d > tol) {
      ADD_FAILURE() << "position " << i / (b * vp) << " batch " << (i / vp) % b << " id " << i % vp
                    << ": cached " << got[i] << " vs full " << want[i];
      break;
    }
  }
  EXPECT_LE(worst, tol);
}

struct Arch {
  const char* name;
  TransformerConfig (*config)(DType);
};

class CachedLogits : public ::testing::TestWithParam<Arch> {};

TEST_P(CachedLogits, EqualTheFullForwardF64) {
  auto m = make(GetParam().config(DType::f64));
  check_cached_equals_full(*m, 1, 4, 1e-10);
  check_cached_equals_full(*m, 2, 1, 1e-10);
  check_cached_equals_full(*m, 2, 11, 1e-10);  // all prefill
}

TEST_P(CachedLogits, EqualTheFullForwardF32) {
  auto m = make(GetParam().config(DType::f32));
  check_cached_equals_full(*m, 1, 3, 1e-4);
  check_cached_equals_full(*m, 2, 5, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, CachedLogits,
    ::testing::Values(Arch{"gpt2", [](DType d) { return tiny_gpt2_config(d); }},
                      Arch{"llama", [](DType d) { return tiny_llama_config(d); }},
                      Arch{"qwen2", qwen2_config}, Arch{"moe", moe_config}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Generate, CachedEqualsRecomputedGreedyAndSampled) {
  auto m = make(tiny_llama_config(DType::f64));
  for (bool greedy : {true, false}) {
    inference::GenerationOptions o;
    o.sampling.greedy = greedy;
    o.sampling.temperature = 0.9;
    o.sampling.top_k = 8;
    o.sampling.top_p = 0.9;
    o.sampling.seed = 3;
    o.max_new_tokens = 9;
    const auto cached = inference::generate(*m, {3, 1, 4, 1, 5}, o);
    o.use_kv_cache = false;
    const auto plain = inference::generate(*m, {3, 1, 4, 1, 5}, o);
    EXPECT_EQ(cached.tokens, plain.tokens) << (greedy ? "greedy" : "sampled");
    EXPECT_EQ(cached.tokens.size(), 9u);
    EXPECT_EQ(cached.stop_reason, "max-new-tokens");
    for (int32_t t : cached.tokens) EXPECT_LT(t, 40) << "a padding id was sampled";
  }
}

TEST(Generate, StopsAtEodAndAtThePositionTable) {
  auto m = make(tiny_gpt2_config(DType::f64));  // max_position_embeddings 16
  inference::GenerationOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = 100;
  const auto r = inference::generate(*m, {1, 2, 3}, o);
  EXPECT_EQ(r.stop_reason, "max-sequence-length");
  EXPECT_EQ(r.tokens.size(), 13u);  // 3 + 13 = 16 positions
  o.eod = r.tokens.at(4);
  const auto e = inference::generate(*m, {1, 2, 3}, o);
  EXPECT_EQ(e.stop_reason, "eod");
  ASSERT_FALSE(e.tokens.empty());
  EXPECT_EQ(e.tokens.back(), *o.eod);
  EXPECT_LE(e.tokens.size(), 5u);
  const std::vector<int32_t> long_prompt(17, 1);
  EXPECT_THROW(inference::generate(*m, long_prompt, o), Error);
}

}  // namespace
}  // namespace mg::test
