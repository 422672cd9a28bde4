// GPTModel on the CPU: Megatron-Core parameter names and shapes (GPT-2 and LLaMA specs), the flat
// buffer layout, Megatron's init, a finite-difference check of every parameter gradient of the
// whole tiny model in f64 (GPT-2, LLaMA with GQA, Qwen2 with qk-layernorm and document masks,
// squared-relu with layernorm_1p and the local spec), and input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "tests/unit/core/models/gpt_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

using models::GPTBatch;
using models::GPTForwardState;
using models::GPTModel;
using models::StepRng;
using transformer::TransformerConfig;

const ops::OpTable& cpu_ops() {
  ensure_runtime();
  return ops_on("cpu");
}

std::map<std::string, Shape> shapes_of(const GPTModel& m) {
  std::map<std::string, Shape> out;
  for (const auto& p : m.parameters()) out[p.name] = p.param.shape();
  return out;
}

TEST(GPTModel, Gpt2ParameterNamesAndShapes) {
  GPTModel m(tiny_gpt2_config(), 50, cpu_ops(), Device::cpu());
  EXPECT_EQ(m.padded_vocab_size(), 64);
  std::map<std::string, Shape> want = {
      {"embedding.word_embeddings.weight", {64, 16}},
      {"embedding.position_embeddings.weight", {12, 16}},
      {"decoder.final_layernorm.weight", {16}},
      {"decoder.final_layernorm.bias", {16}},
  };
  for (int l = 0; l < 2; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    want[p + "self_attention.linear_qkv.layer_norm_weight"] = {16};
    want[p + "self_attention.linear_qkv.layer_norm_bias"] = {16};
    want[p + "self_attention.linear_qkv.weight"] = {48, 16};
    want[p + "self_attention.linear_qkv.bias"] = {48};
    want[p + "self_attention.linear_proj.weight"] = {16, 16};
    want[p + "self_attention.linear_proj.bias"] = {16};
    want[p + "mlp.linear_fc1.layer_norm_weight"] = {16};
    want[p + "mlp.linear_fc1.layer_norm_bias"] = {16};
    want[p + "mlp.linear_fc1.weight"] = {64, 16};
    want[p + "mlp.linear_fc1.bias"] = {64};
    want[p + "mlp.linear_fc2.weight"] = {16, 64};
    want[p + "mlp.linear_fc2.bias"] = {16};
  }
  EXPECT_EQ(shapes_of(m), want);  // tied: no output_layer.weight
  EXPECT_EQ(m.parameters().front().name, "embedding.word_embeddings.weight");
}

TEST(GPTModel, LlamaParameterNamesAndShapes) {
  GPTModel m(tiny_llama_config(), 50, cpu_ops(), Device::cpu());
  std::map<std::string, Shape> want = {
      {"embedding.word_embeddings.weight", {64, 16}},
      {"decoder.final_layernorm.weight", {16}},
      {"output_layer.weight", {64, 16}},
  };
  for (int l = 0; l < 2; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    want[p + "self_attention.linear_qkv.layer_norm_weight"] = {16};
    want[p + "self_attention.linear_qkv.weight"] = {(4 + 2 * 2) * 4, 16};  // (NH + 2 NG) HD
    want[p + "self_attention.linear_proj.weight"] = {16, 16};
    want[p + "mlp.linear_fc1.layer_norm_weight"] = {16};
    want[p + "mlp.linear_fc1.weight"] = {48, 16};  // [gate; up]
    want[p + "mlp.linear_fc2.weight"] = {16, 24};
  }
  EXPECT_EQ(shapes_of(m), want);
}

TEST(GPTModel, LocalSpecNamesAndQwen2Biases) {
  TransformerConfig c = tiny_llama_config();
  models::apply_qwen2_architecture(c);
  c.qk_layernorm = true;
  c.finalize();
  GPTModel m(c, 50, cpu_ops(), Device::cpu(),
             models::get_gpt_decoder_block_spec(c, /*use_transformer_engine=*/false));
  const auto s = shapes_of(m);
  EXPECT_EQ(s.at("decoder.layers.1.input_layernorm.weight"), Shape{16});
  EXPECT_EQ(s.at("decoder.layers.1.pre_mlp_layernorm.weight"), Shape{16});
  EXPECT_EQ(s.at("decoder.layers.1.self_attention.linear_qkv.bias"), Shape{32});
  EXPECT_EQ(s.at("decoder.layers.1.self_attention.q_layernorm.weight"), Shape{4});
  EXPECT_EQ(s.at("decoder.layers.1.self_attention.k_layernorm.weight"), Shape{4});
  EXPECT_EQ(s.count("decoder.layers.1.self_attention.linear_proj.bias"), 0u);
  EXPECT_EQ(s.count("decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"), 0u);
}

TEST(GPTModel, BuffersAreReverseOrderViewsWithNoDecayOnBiasesAndNorms) {
  TransformerConfig c = tiny_gpt2_config(DType::bf16);
  GPTModel m(c, 50, cpu_ops(), Device::cpu());
  auto& buf = m.buffer();
  EXPECT_EQ(buf.params.dtype(), DType::bf16);
  EXPECT_EQ(buf.grads.dtype(), DType::f32);  // main_grad f32 under bf16
  int64_t total = 0;
  for (const auto& p : m.parameters()) total += p.param.numel();
  EXPECT_EQ(m.num_parameters(), total);
  const auto& ps = m.parameters();
  EXPECT_EQ(ps.back().buffer_offset, 0);  // last used in forward sits first
  EXPECT_EQ(ps.front().buffer_offset + ps.front().param.numel(), total);
  for (const auto& p : ps) {
    EXPECT_TRUE(p.param.shares_storage_with(buf.params)) << p.name;
    EXPECT_TRUE(p.main_grad.shares_storage_with(buf.grads)) << p.name;
    EXPECT_EQ(p.param.offset_bytes(), p.buffer_offset * 2u) << p.name;
    EXPECT_EQ(p.no_weight_decay, p.param.dim() == 1) << p.name;
  }
  EXPECT_THROW(m.parameter("decoder.layers.9.mlp.linear_fc1.weight"), mg::Error);
}

TEST(GPTModel, InitMatchesMegatron) {
  TransformerConfig c = tiny_gpt2_config();
  c.num_layers = 8;
  c.hidden_size = 64;
  c.init_method_std = 0.05;
  GPTModel m(c, 500, cpu_ops(), Device::cpu());
  m.init_weights(7);
  auto stdev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (double v : t.to_vector<double>()) s += v, s2 += v * v;
    const double n = static_cast<double>(t.numel());
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  EXPECT_NEAR(stdev(m.parameter("embedding.word_embeddings.weight").param), 0.05, 0.002);
  EXPECT_NEAR(stdev(m.parameter("decoder.layers.3.mlp.linear_fc1.weight").param), 0.05, 0.002);
  const double scaled = 0.05 / std::sqrt(16.0);
  EXPECT_NEAR(stdev(m.parameter("decoder.layers.3.mlp.linear_fc2.weight").param), scaled, 0.001);
  EXPECT_NEAR(stdev(m.parameter("decoder.layers.3.self_attention.linear_proj.weight").param),
              scaled, 0.001);
  for (double v : m.parameter("decoder.layers.3.mlp.linear_fc1.bias").param.to_vector<double>())
    EXPECT_EQ(v, 0.0);
  for (double v : m.parameter("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight")
                      .param.to_vector<double>())
    EXPECT_EQ(v, 1.0);
  // Same seed, same weights; different tensors draw different streams.
  GPTModel m2(c, 500, cpu_ops(), Device::cpu());
  m2.init_weights(7);
  EXPECT_EQ(m.buffer().params.to_vector<float>(), m2.buffer().params.to_vector<float>());
  EXPECT_NE(m.parameter("decoder.layers.0.mlp.linear_fc1.weight").param.to_vector<float>(),
            m.parameter("decoder.layers.1.mlp.linear_fc1.weight").param.to_vector<float>());
}

// f64 finite differences of L = sum(loss * mask) for sampled elements of every parameter.
void check_gradients(TransformerConfig c, const transformer::TransformerBlockSpec* spec,
                     GPTBatch batch) {
  c.params_dtype = DType::f64;
  c.init_method_std = 0.3;  // large enough that every path matters
  c.finalize();
  auto m = spec ? std::make_unique<GPTModel>(c, 50, cpu_ops(), Device::cpu(), *spec)
                : std::make_unique<GPTModel>(c, 50, cpu_ops(), Device::cpu());
  m->init_weights(3);
  // Norm weights and biases away from their 1/0 init so their gradients are generic.
  for (auto& p : m->parameters())
    if (p.param.dim() == 1) {
      auto* d = p.param.data<double>();
      for (int64_t i = 0; i < p.param.numel(); ++i) d[i] += 0.1 * std::sin(1.0 + 3.0 * i);
    }
  auto loss = [&] {
    GPTForwardState st;
    return m->forward(batch, st, StepRng{}, true).loss_sum;
  };
  m->zero_grad();
  GPTForwardState st;
  m->forward(batch, st, StepRng{}, true);
  m->backward(st, 1.0);
  for (auto& p : m->parameters()) {
    double* v = p.param.data<double>();
    const double* g = p.main_grad.data<double>();
    const int64_t n = p.param.numel();
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t i = (k * 7919 + 13) % n;
      const double saved = v[i], h = 1e-5;
      v[i] = saved + h;
      const double up = loss();
      v[i] = saved - h;
      const double down = loss();
      v[i] = saved;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-7 + 1e-6 * std::fabs(fd)) << p.name << "[" << i << "]";
    }
  }
}

TEST(GPTModel, FiniteDifferenceGpt2) {
  check_gradients(tiny_gpt2_config(), nullptr, random_batch(2, 8, 50, 1));
}

TEST(GPTModel, FiniteDifferenceLlamaGqa) {
  check_gradients(tiny_llama_config(), nullptr, random_batch(2, 8, 50, 2));
}

TEST(GPTModel, FiniteDifferenceQwen2QkNormDocMaskPositions) {
  TransformerConfig c = tiny_llama_config();
  models::apply_qwen2_architecture(c);
  c.qk_layernorm = true;
  c.rotary_percent = 0.5;
  GPTBatch batch = random_batch(2, 8, 50, 3);
  std::vector<int32_t> doc = {0, 0, 0, 1, 1, 1, 1, 1, 5, 5, 6, 6, 6, 6, 7, 7};
  std::vector<int64_t> pos = {0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 0, 1};
  batch.doc_ids = Tensor::from_vector(doc, {2, 8}, DType::i32);
  batch.position_ids = Tensor::from_vector(pos, {2, 8}, DType::i64);
  check_gradients(c, nullptr, batch);
}

TEST(GPTModel, FiniteDifferenceSquaredReluLayernorm1pLocalSpec) {
  TransformerConfig c = tiny_gpt2_config();
  c.activation = transformer::Activation::squared_relu;
  c.apply_layernorm_1p = true;
  c.untie_embeddings_and_output_weights = true;
  c.num_query_groups = 2;
  c.finalize();
  const auto spec = models::get_gpt_decoder_block_spec(c, /*use_transformer_engine=*/false);
  GPTBatch batch = random_batch(2, 8, 50, 4);
  std::vector<int64_t> pos = {3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2, 3, 0, 1, 2, 3};
  batch.position_ids = Tensor::from_vector(pos, {2, 8}, DType::i64);
  check_gradients(c, &spec, batch);
}

TEST(GPTModel, LogitsAreSequenceFirstAndMatchForwardLoss) {
  GPTModel m(tiny_llama_config(), 50, cpu_ops(), Device::cpu());
  m.init_weights(1);
  const GPTBatch batch = random_batch(3, 8, 50, 5, /*with_mask=*/false);
  const Tensor logits = m.logits(batch);
  ASSERT_EQ(logits.shape(), (Shape{8, 3, 64}));
  GPTForwardState st;
  const models::LossSums sums = m.forward(batch, st, StepRng{}, false);
  EXPECT_EQ(sums.num_tokens, 24.0);
  const auto lg = logits.to_vector<double>();
  const auto lab = batch.labels.to_vector<int64_t>();
  double total = 0;
  for (int64_t s = 0; s < 8; ++s)
    for (int64_t b = 0; b < 3; ++b) {
      const double* row = &lg[(s * 3 + b) * 64];
      double mx = row[0], se = 0;
      for (int v = 0; v < 64; ++v) mx = std::max(mx, row[v]);
      for (int v = 0; v < 64; ++v) se += std::exp(row[v] - mx);
      total += std::log(se) + mx - row[lab[b * 8 + s]];
    }
  EXPECT_NEAR(sums.loss_sum, total, 1e-4);
}

// PITFALLS #12: packed documents with doc_ids and reset position ids give each token the loss it
// has when its document runs alone.
TEST(GPTModel, DocumentMaskEqualsSeparateDocuments) {
  for (const bool llama : {false, true}) {
    TransformerConfig c = llama ? tiny_llama_config(DType::f64) : tiny_gpt2_config(DType::f64);
    GPTModel m(c, 50, cpu_ops(), Device::cpu());
    m.init_weights(8);
    const GPTBatch packed_src = random_batch(1, 8, 50, 9, /*with_mask=*/false);
    GPTBatch packed = packed_src;
    packed.doc_ids = Tensor::from_vector(std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1, 1}, {1, 8});
    packed.position_ids = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4}, {1, 8});
    GPTForwardState st;
    m.forward(packed, st, StepRng{}, false);
    const auto together = m.token_losses(st).to_vector<double>();
    const auto tok = packed_src.tokens.to_vector<int64_t>();
    const auto lab = packed_src.labels.to_vector<int64_t>();
    for (const auto& [start, len] : {std::pair<int64_t, int64_t>{0, 3}, {3, 5}}) {
      GPTBatch doc;
      doc.tokens = Tensor::from_vector(
          std::vector<int64_t>(tok.begin() + start, tok.begin() + start + len), {1, len});
      doc.labels = Tensor::from_vector(
          std::vector<int64_t>(lab.begin() + start, lab.begin() + start + len), {1, len});
      GPTForwardState ds;
      m.forward(doc, ds, StepRng{}, false);
      const auto alone = m.token_losses(ds).to_vector<double>();
      for (int64_t i = 0; i < len; ++i)
        EXPECT_NEAR(together[start + i], alone[i], 1e-12) << (llama ? "llama" : "gpt2") << i;
    }
  }
}

TEST(GPTModel, RejectsBadBatches) {
  GPTModel m(tiny_gpt2_config(), 50, cpu_ops(), Device::cpu());
  GPTBatch batch = random_batch(2, 8, 50, 6);
  GPTForwardState st;
  batch.tokens.data<int64_t>()[3] = 64;
  EXPECT_NE(error_message([&] { m.forward(batch, st, StepRng{}, false); }).find("64"),
            std::string::npos);
  GPTBatch longer = random_batch(1, 13, 50, 6);  // max_position_embeddings 12
  EXPECT_NE(error_message([&] {
              m.forward(longer, st, StepRng{}, false);
            }).find("max_position_embeddings 12"),
            std::string::npos);
  EXPECT_THROW(m.backward(st, 1.0), mg::Error);  // no forward held
}

// The grad-write hook (FSDP's lazy gradient commit backs a bucket's memory there): every
// parameter is named before backward writes its gradient (still all zeros at the call) and
// before its grad-ready report, and only in backward. Tied GPT-2 (the head writes the word
// embedding's gradient first) and untied LLaMA.
TEST(GPTModel, GradWriteHookPrecedesEveryGradientWrite) {
  for (const bool llama : {false, true}) {
    GPTModel m(llama ? tiny_llama_config() : tiny_gpt2_config(), 50, cpu_ops(), Device::cpu());
    m.init_weights(3);
    const std::size_t n = m.parameters().size();
    std::vector<int> announced(n, 0), ready_before_announce(n, 0), nonzero_at_announce(n, 0);
    std::vector<char> ready(n, 0);
    bool in_backward = false;
    int outside_backward = 0;
    ASSERT_TRUE(m.set_grad_write_hook([&](std::span<const std::size_t> idx) {
      if (!in_backward) ++outside_backward;
      for (std::size_t i : idx) {
        ++announced[i];
        if (ready[i]) ++ready_before_announce[i];
        const auto g = m.parameters()[i].main_grad.to_vector<double>();
        if (announced[i] == 1)
          for (double v : g) nonzero_at_announce[i] += v != 0.0;
      }
    }));
    m.set_grad_ready_hook([&](std::size_t i) { ready[i] = 1; });
    m.zero_grad();
    GPTForwardState st;
    m.forward(random_batch(2, 8, 50, 21), st, StepRng{}, true);
    in_backward = true;
    m.backward(st, 1.0);
    EXPECT_EQ(outside_backward, 0) << (llama ? "llama" : "gpt2");
    for (std::size_t i = 0; i < n; ++i) {
      const auto& p = m.parameters()[i];
      EXPECT_GE(announced[i], 1) << p.name;
      EXPECT_EQ(ready_before_announce[i], 0) << p.name;
      EXPECT_EQ(nonzero_at_announce[i], 0) << p.name << ": written before the hook";
      EXPECT_TRUE(ready[i]) << p.name;
      double sum = 0.0;
      for (double v : p.main_grad.to_vector<double>()) sum += std::fabs(v);
      EXPECT_GT(sum, 0.0) << p.name << ": no gradient (the check above would be vacuous)";
    }
  }
}

}  // namespace
}  // namespace mg::test
