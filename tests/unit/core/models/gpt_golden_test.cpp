// Golden test against PyTorch: a tiny GPT-2 and a tiny LLaMA (GQA, RoPE, SwiGLU, RMSNorm, untied)
// loaded with the weights of tests/fixtures/gpt_golden/gen_gpt_golden.py (a plain PyTorch model
// written the Hugging Face way, its weights converted to Megatron names and fused layouts) must
// give the same logits, loss, every parameter gradient, and the losses of 5 AdamW steps, in f32.
// The fixture is a plain safetensors file, parsed here (header JSON + raw little-endian data).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

using models::GPTBatch;
using models::GPTForwardState;
using models::GPTModel;
using models::StepRng;
using transformer::TransformerConfig;

// name -> host tensor, from a safetensors file (F32, F64, I64 only).
std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MG_CHECK(f.good(), "cannot open " << path << " (run gen_gpt_golden.py)");
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, ' ');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const std::vector<char> data((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
  std::map<std::string, Tensor> out;
  const nlohmann::json j = nlohmann::json::parse(header);
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") continue;
    const std::string dt = e["dtype"];
    const DType dtype = dt == "F32" ? DType::f32 : dt == "F64" ? DType::f64 : DType::i64;
    MG_CHECK(dt == "F32" || dt == "F64" || dt == "I64", "unexpected dtype " << dt);
    Shape shape = e["shape"].get<Shape>();
    Tensor t = Tensor::empty(shape, dtype);
    const auto begin = e["data_offsets"][0].get<std::size_t>();
    const auto end = e["data_offsets"][1].get<std::size_t>();
    MG_CHECK(end - begin == t.nbytes() && end <= data.size(), "bad offsets for " << name);
    std::memcpy(t.raw_data(), data.data() + begin, t.nbytes());
    out[name] = t;
  }
  return out;
}

TransformerConfig golden_config(bool llama) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.make_vocab_size_divisible_by = 128;
  c.norm_epsilon = 1e-5;
  if (llama) {
    models::apply_llama_architecture(c);
    c.num_query_groups = 2;
    c.ffn_hidden_size = 48;
  } else {
    models::apply_gpt2_architecture(c);
    c.ffn_hidden_size = 128;
    c.max_position_embeddings = 16;
  }
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  return c;
}

// Largest |a - e| relative to the largest |e| of the tensor (scale-aware, so near-zero elements of
// a tensor are judged against its scale rather than their own).
double scaled_max_error(const std::vector<double>& a, const std::vector<double>& e) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - e[i]));
    scale = std::max(scale, std::fabs(e[i]));
  }
  return err / std::max(scale, 1e-30);
}

void run_golden(const std::string& name, bool llama) {
  ensure_runtime();
  const auto& ops = ops_on("cpu");
  const auto fx =
      read_safetensors(std::string(MG_TEST_FIXTURES_DIR) + "/gpt_golden/" + name + ".safetensors");
  GPTModel m(golden_config(llama), 100, ops, Device::cpu());
  ASSERT_EQ(m.padded_vocab_size(), 128);
  // Every parameter comes from the fixture, by its Megatron name, and nothing is left over.
  int64_t loaded = 0;
  for (const auto& [key, t] : fx) {
    if (key.starts_with("grad.") || key.starts_with("input.") || key.starts_with("out.")) continue;
    transformer::Parameter& p = m.parameter(key);
    ASSERT_EQ(p.param.shape(), t.shape()) << key;
    p.param.copy_(t);
    ++loaded;
  }
  ASSERT_EQ(loaded, static_cast<int64_t>(m.parameters().size()));

  GPTBatch batch;
  batch.tokens = fx.at("input.tokens");
  batch.labels = fx.at("input.labels");
  batch.loss_mask = fx.at("input.loss_mask");
  const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1), v = 128;

  // Logits: ours [S, B, V], the reference [B, S, V].
  const auto ours = m.logits(batch).to_vector<double>();
  const auto ref = fx.at("out.logits").to_vector<double>();
  std::vector<double> ours_bs(ours.size());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j)
      for (int64_t k = 0; k < v; ++k) ours_bs[(i * s + j) * v + k] = ours[(j * b + i) * v + k];
  const double logits_err = scaled_max_error(ours_bs, ref);
  EXPECT_LT(logits_err, 2e-6) << name << " logits";

  // Loss (mean over masked tokens) and every gradient.
  m.zero_grad();
  GPTForwardState st;
  const models::LossSums sums = m.forward(batch, st, StepRng{}, true);
  const double loss = sums.loss_sum / sums.num_tokens;
  const double ref_loss = fx.at("out.loss").to_vector<double>()[0];
  EXPECT_NEAR(loss, ref_loss, 1e-6 * std::fabs(ref_loss)) << name << " loss";
  m.backward(st, 1.0 / sums.num_tokens);
  double worst = 0;
  std::string worst_name;
  for (const auto& p : m.parameters()) {
    const double err = scaled_max_error(p.main_grad.to_vector<double>(),
                                        fx.at("grad." + p.name).to_vector<double>());
    EXPECT_LT(err, 1e-5) << name << " grad of " << p.name;
    if (err > worst) worst = err, worst_name = p.name;
  }
  std::printf("%s: logits error %.2e, loss %.9f vs %.9f, worst grad error %.2e (%s)\n",
              name.c_str(), logits_err, loss, ref_loss, worst, worst_name.c_str());

  // 5 AdamW steps with the adamw_step op: weight decay 0.1 on matrices, 0 on biases and norms.
  std::vector<ops::AdamParam> decay, no_decay;
  for (auto& p : m.parameters()) {
    ops::AdamParam a{p.param, p.main_grad, Tensor::zeros(p.param.shape(), DType::f32),
                     Tensor::zeros(p.param.shape(), DType::f32), Tensor()};
    (p.no_weight_decay ? no_decay : decay).push_back(a);
  }
  const auto ref_losses = fx.at("out.adam_losses").to_vector<double>();
  double adam_err = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    m.zero_grad();
    GPTForwardState st2;
    const models::LossSums ls = m.forward(batch, st2, StepRng{0, step, 0}, true);
    const double l = ls.loss_sum / ls.num_tokens;
    EXPECT_NEAR(l, ref_losses[step - 1], 1e-6 * std::fabs(ref_losses[step - 1]))
        << name << " loss before AdamW step " << step;
    adam_err =
        std::max(adam_err, std::fabs(l - ref_losses[step - 1]) / std::fabs(ref_losses[step - 1]));
    if (step == 6) break;
    m.backward(st2, 1.0 / ls.num_tokens);
    ops::AdamArgs args;
    args.lr = 1e-2f;
    args.step = step;
    args.weight_decay = 0.1f;
    ops.adamw_step(decay, args);
    args.weight_decay = 0.0f;
    ops.adamw_step(no_decay, args);
  }
  std::printf("%s: AdamW losses %.6f -> %.6f, worst relative error %.2e\n", name.c_str(),
              ref_losses[0], ref_losses[5], adam_err);
}

TEST(GPTGolden, Gpt2MatchesPyTorch) {
  run_golden("gpt2", false);
}
TEST(GPTGolden, LlamaMatchesPyTorch) {
  run_golden("llama", true);
}

}  // namespace
}  // namespace mg::test
