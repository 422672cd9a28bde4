// TransformerConfig: Megatron's derived defaults, validation messages naming the values, Megatron's
// padded vocabulary, and the recompute layer selection.
#include "megatron/core/transformer/transformer_config.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

using transformer::RecomputeGranularity;
using transformer::RecomputeMethod;
using transformer::TransformerConfig;

TransformerConfig base() {
  TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.seq_length = 32;
  return c;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(TransformerConfig, FinalizeFillsMegatronDefaults) {
  TransformerConfig c = base();
  c.finalize();
  EXPECT_EQ(c.ffn_hidden_size, 256);
  EXPECT_EQ(c.num_query_groups, 8);
  EXPECT_EQ(c.kv_channels, 8);
  EXPECT_EQ(c.max_position_embeddings, 32);
  EXPECT_EQ(c.qkv_projection_size(), 3 * 64);
  EXPECT_EQ(c.fc1_output_size(), 256);
  EXPECT_EQ(c.grad_dtype(), DType::f32);
  // Megatron's TransformerConfig defaults.
  TransformerConfig d;
  EXPECT_TRUE(d.add_bias_linear);
  EXPECT_FALSE(d.untie_embeddings_and_output_weights);
  EXPECT_EQ(d.hidden_dropout, 0.1);
  EXPECT_EQ(d.attention_dropout, 0.1);
  EXPECT_EQ(d.init_method_std, 0.02);
  EXPECT_EQ(d.norm_epsilon, 1e-5);
  EXPECT_EQ(d.make_vocab_size_divisible_by, 128);
  EXPECT_EQ(d.rotary_base, 10000.0);
  EXPECT_EQ(d.normalization, transformer::Normalization::layernorm);

  TransformerConfig g = base();
  g.activation = transformer::Activation::swiglu;
  g.ffn_hidden_size = 96;
  g.num_query_groups = 2;
  g.params_dtype = DType::bf16;
  g.finalize();
  EXPECT_EQ(g.fc1_output_size(), 192);
  EXPECT_EQ(g.qkv_projection_size(), (8 + 2 * 2) * 8);
  EXPECT_EQ(g.grad_dtype(), DType::f32);
  g.params_dtype = DType::f64;
  EXPECT_EQ(g.grad_dtype(), DType::f64);
}

TEST(TransformerConfig, PaddedVocabSizeAsMegatron) {
  TransformerConfig c = base();
  EXPECT_EQ(c.padded_vocab_size(50257), 50304);
  EXPECT_EQ(c.padded_vocab_size(50257, 2), 50432);  // multiple of 128 * 2
  EXPECT_EQ(c.padded_vocab_size(50304), 50304);
  c.make_vocab_size_divisible_by = 1;
  EXPECT_EQ(c.padded_vocab_size(50257), 50257);
  EXPECT_TRUE(contains(error_message([&] { c.padded_vocab_size(0); }), "vocab size must be"));
}

TEST(TransformerConfig, RejectsImpossibleShapesNamingTheValues) {
  {
    TransformerConfig c = base();
    c.hidden_size = 60;
    c.num_attention_heads = 8;
    const std::string msg = error_message([&] { c.finalize(); });
    EXPECT_TRUE(contains(msg, "hidden_size 60")) << msg;
    EXPECT_TRUE(contains(msg, "num_attention_heads 8")) << msg;
  }
  {
    TransformerConfig c = base();
    c.num_query_groups = 3;
    const std::string msg = error_message([&] { c.finalize(); });
    EXPECT_TRUE(contains(msg, "num_attention_heads 8")) << msg;
    EXPECT_TRUE(contains(msg, "num_query_groups 3")) << msg;
  }
  {
    TransformerConfig c = base();
    c.num_layers = 0;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "num_layers must be >= 1, got 0"));
  }
  {
    TransformerConfig c = base();
    c.max_position_embeddings = 16;
    const std::string msg = error_message([&] { c.finalize(); });
    EXPECT_TRUE(contains(msg, "max_position_embeddings 16")) << msg;
    EXPECT_TRUE(contains(msg, "seq_length 32")) << msg;
  }
  {
    TransformerConfig c = base();
    c.hidden_dropout = 1.0;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "hidden_dropout"));
  }
  {
    TransformerConfig c = base();
    c.params_dtype = DType::i32;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "params_dtype"));
  }
  {
    TransformerConfig c = base();
    c.position_embedding_type = transformer::PositionEmbeddingType::rope;
    c.rotary_percent = 0.1;  // 8 * 0.1 = 0 rotary dims
    const std::string msg = error_message([&] { c.finalize(); });
    EXPECT_TRUE(contains(msg, "rotary_percent") || contains(msg, "rotary dims")) << msg;
  }
}

TEST(TransformerConfig, RecomputeCombinations) {
  {
    TransformerConfig c = base();
    c.recompute_granularity = RecomputeGranularity::full;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "needs recompute_method"));
    c.recompute_method = RecomputeMethod::uniform;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "recompute_num_layers"));
    c.recompute_num_layers = 5;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "got 5"));
    c.recompute_num_layers = 2;
    c.finalize();
    for (int l = 0; l < 4; ++l) EXPECT_TRUE(c.layer_recomputed(l));
    c.recompute_method = RecomputeMethod::block;
    EXPECT_TRUE(c.layer_recomputed(1));
    EXPECT_FALSE(c.layer_recomputed(2));
  }
  {
    TransformerConfig c = base();
    c.recompute_granularity = RecomputeGranularity::selective;
    c.recompute_method = RecomputeMethod::block;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "selective"));
  }
  {
    TransformerConfig c = base();
    c.recompute_method = RecomputeMethod::uniform;
    EXPECT_TRUE(contains(error_message([&] { c.finalize(); }), "recompute_granularity is none"));
  }
}

}  // namespace
}  // namespace mg::test
