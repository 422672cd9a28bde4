// The layer and block specs pick implementations that the modules build: the decoder block spec
// makes exactly the config's MoE layers MoE, the family presets differ where the families do, the
// norm slots' kind and naming decide the parameters, an identity slot has none, and a spec value a
// module does not implement, or one the config contradicts, is an error naming the slot and values.
#include "megatron/core/transformer/transformer_layer_spec.h"

#include <gtest/gtest.h>

#include <string>

#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

using models::GPTModel;
using transformer::MlpImpl;
using transformer::NormImpl;
using transformer::NormNaming;
using transformer::TransformerBlockSpec;
using transformer::TransformerConfig;

TransformerConfig tiny() {
  TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.ffn_hidden_size = 24;
  c.seq_length = 8;
  return c;
}

bool has_param(const GPTModel& m, const std::string& name) {
  for (const auto& p : m.parameters())
    if (p.name == name) return true;
  return false;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(LayerSpec, DecoderBlockSpecMakesTheConfigsMoeLayersMoe) {
  ensure_runtime();
  TransformerConfig c = tiny();
  models::apply_llama_architecture(c);
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_layer_pattern = {1, 0, 0, 1};
  const TransformerBlockSpec spec = models::get_gpt_decoder_block_spec(c);
  ASSERT_EQ(spec.layer_specs.size(), 4u);
  const MlpImpl want[] = {MlpImpl::moe, MlpImpl::dense, MlpImpl::dense, MlpImpl::moe};
  for (int l = 0; l < 4; ++l) EXPECT_EQ(spec.layer(l).mlp.impl, want[l]) << "layer " << l;
  const GPTModel m(c, 50, ops_on("cpu"), Device::cpu(), spec);
  EXPECT_TRUE(has_param(m, "decoder.layers.0.mlp.router.weight"));
  EXPECT_TRUE(has_param(m, "decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_FALSE(has_param(m, "decoder.layers.1.mlp.router.weight"));
  EXPECT_TRUE(has_param(m, "decoder.layers.3.mlp.experts.local_experts.3.linear_fc2.weight"));
}

TEST(LayerSpec, FamilyPresetsDiffer) {
  TransformerConfig c = tiny();
  models::apply_mixtral_architecture(c, 4);
  const TransformerBlockSpec gpt2 = models::gpt2_block_spec(c);
  const TransformerBlockSpec llama = models::llama_block_spec(c);
  const TransformerBlockSpec mixtral = models::mixtral_block_spec(c);
  EXPECT_EQ(gpt2.layer(0).input_layernorm.impl, NormImpl::layernorm);
  EXPECT_EQ(gpt2.final_layernorm.impl, NormImpl::layernorm);
  EXPECT_EQ(llama.layer(0).input_layernorm.impl, NormImpl::rmsnorm);
  EXPECT_EQ(llama.final_layernorm.impl, NormImpl::rmsnorm);
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(llama.layer(l).mlp.impl, MlpImpl::dense);
    EXPECT_EQ(mixtral.layer(l).mlp.impl, MlpImpl::moe);
  }
  // DeepSeek-style: MoE where moe_layer_freq says.
  TransformerConfig d = tiny();
  models::apply_deepseek_moe_architecture(d, 4, 2, 8);
  d.moe_layer_freq = 2;
  const TransformerBlockSpec ds = models::deepseek_moe_block_spec(d);
  EXPECT_EQ(ds.layer(0).mlp.impl, MlpImpl::moe);
  EXPECT_EQ(ds.layer(1).mlp.impl, MlpImpl::dense);
  EXPECT_EQ(ds.layer(2).mlp.impl, MlpImpl::moe);
}

// The norm slots decide the parameters: TE naming, local naming, or none (identity).
TEST(LayerSpec, NormSlotsDecideTheParameters) {
  ensure_runtime();
  TransformerConfig c = tiny();
  models::apply_gpt2_architecture(c);
  TransformerBlockSpec spec = models::get_gpt_decoder_block_spec(c);
  spec.layer_specs[1] = models::get_gpt_layer_local_spec(c);
  spec.layer_specs[2].pre_mlp_layernorm = {NormImpl::identity, NormNaming::separate};
  const GPTModel m(c, 50, ops_on("cpu"), Device::cpu(), spec);
  EXPECT_TRUE(has_param(m, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"));
  EXPECT_TRUE(has_param(m, "decoder.layers.0.mlp.linear_fc1.layer_norm_bias"));
  EXPECT_TRUE(has_param(m, "decoder.layers.1.input_layernorm.weight"));
  EXPECT_TRUE(has_param(m, "decoder.layers.1.pre_mlp_layernorm.bias"));
  EXPECT_FALSE(has_param(m, "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"));
  EXPECT_TRUE(has_param(m, "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight"));
  EXPECT_FALSE(has_param(m, "decoder.layers.2.mlp.linear_fc1.layer_norm_weight"));
  EXPECT_FALSE(has_param(m, "decoder.layers.2.pre_mlp_layernorm.weight"));
  // RMSNorm has no bias.
  TransformerConfig r = tiny();
  models::apply_llama_architecture(r);
  const GPTModel l(r, 50, ops_on("cpu"), Device::cpu(), models::llama_block_spec(r));
  EXPECT_TRUE(has_param(l, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"));
  EXPECT_FALSE(has_param(l, "decoder.layers.0.self_attention.linear_qkv.layer_norm_bias"));
  EXPECT_FALSE(has_param(l, "decoder.final_layernorm.bias"));
}

TEST(LayerSpec, ContradictionsAndUnimplementedChoicesAreErrors) {
  ensure_runtime();
  TransformerConfig c = tiny();
  models::apply_gpt2_architecture(c);
  const auto build = [&](const TransformerBlockSpec& s) {
    return error_message([&] { GPTModel m(c, 50, ops_on("cpu"), Device::cpu(), s); });
  };
  // A LLaMA (RMSNorm) spec on a LayerNorm config.
  std::string m = build(models::llama_block_spec(c));
  EXPECT_TRUE(contains(m, "rmsnorm") && contains(m, "layernorm")) << m;
  // An MoE layer the config (no experts) does not have.
  TransformerBlockSpec s = models::gpt2_block_spec(c);
  s.layer_specs[3].mlp.impl = MlpImpl::moe;
  m = build(s);
  EXPECT_TRUE(contains(m, "layer 3 mlp") && contains(m, "moe")) << m;
  // q/k layernorm without config.qk_layernorm.
  s = models::gpt2_block_spec(c);
  s.layer_specs[0].self_attention.q_layernorm = {NormImpl::layernorm, NormNaming::separate};
  m = build(s);
  EXPECT_TRUE(contains(m, "q/k layernorm")) << m;
  // Too few layer specs.
  s = models::gpt2_block_spec(c);
  s.layer_specs.pop_back();
  m = build(s);
  EXPECT_TRUE(contains(m, "3 layer specs") && contains(m, "num_layers is 4")) << m;
  // A linear implementation the fused QKV does not have.
  s = models::gpt2_block_spec(c);
  s.layer_specs[1].self_attention.linear_qkv = transformer::LinearImpl::row_parallel;
  m = build(s);
  EXPECT_TRUE(contains(m, "decoder.layers.1.self_attention.linear_qkv")) << m;
  s = models::gpt2_block_spec(c);
  s.layer_specs[2].mlp.submodules.linear_fc2 = transformer::LinearImpl::column_parallel;
  m = build(s);
  EXPECT_TRUE(contains(m, "decoder.layers.2.mlp.linear_fc2")) << m;
}

// The TE and local namings are the same math: equal losses from equal weights.
TEST(LayerSpec, NamingDoesNotChangeTheNumbers) {
  ensure_runtime();
  TransformerConfig c = tiny();
  models::apply_gpt2_architecture(c);
  GPTModel te(c, 50, ops_on("cpu"), Device::cpu(), models::get_gpt_decoder_block_spec(c, true));
  GPTModel local(c, 50, ops_on("cpu"), Device::cpu(), models::get_gpt_decoder_block_spec(c, false));
  te.init_weights(5);
  ASSERT_EQ(te.num_parameters(), local.num_parameters());
  local.buffer().params.copy_(te.buffer().params);  // same layout, other names
  std::vector<int64_t> tok(16), lab(16);
  for (int i = 0; i < 16; ++i) tok[i] = (i * 7) % 50, lab[i] = (i * 7 + 1) % 50;
  models::GPTBatch b;
  b.tokens = Tensor::from_vector(tok, {2, 8}, DType::i64);
  b.labels = Tensor::from_vector(lab, {2, 8}, DType::i64);
  models::GPTForwardState s1, s2;
  const auto l1 = te.forward(b, s1, models::StepRng{}, false);
  const auto l2 = local.forward(b, s2, models::StepRng{}, false);
  EXPECT_EQ(l1.loss_sum, l2.loss_sum);
}

}  // namespace
}  // namespace mg::test
