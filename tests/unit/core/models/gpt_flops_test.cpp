// The FLOP counter against hand counts (PITFALLS #20): every GEMM of a step listed by hand, in
// multiply-adds per token, times 2 FLOPs per multiply-add and 3 for forward + dgrad + wgrad.
#include "megatron/core/models/gpt/gpt_flops.h"

#include <gtest/gtest.h>

namespace mg::test {
namespace {

using transformer::TransformerConfig;

TEST(GPTFlops, Gpt2SmallHandCount) {
  TransformerConfig c;  // GPT-2 124M, PERFORMANCE.md gpt2-124m
  c.num_layers = 12;
  c.hidden_size = 768;
  c.num_attention_heads = 12;
  c.seq_length = 1024;
  c.finalize();
  // Per token and layer (multiply-adds): QKV 768*2304 = 1,769,472; proj 768*768 = 589,824;
  // fc1 768*3072 = 2,359,296; fc2 2,359,296; causal core attention (QK^T and PV over S/2 keys on
  // average) 1024*12*64 = 786,432 -> 7,864,320. 12 layers: 94,371,840. Logits 768*50304 =
  // 38,633,472. Total 133,005,312 MACs = 798,031,872 FLOPs per token with 6 = 2 * 3.
  const double per_token = 798031872.0;
  EXPECT_DOUBLE_EQ(models::num_floating_point_operations(c, 50304, 1), per_token * 1024);
  EXPECT_DOUBLE_EQ(models::num_floating_point_operations(c, 50304, 8), per_token * 1024 * 8);
}

TEST(GPTFlops, Llama1bHandCountWithGqaAndSwiglu) {
  TransformerConfig c;  // PERFORMANCE.md llama-1b
  c.num_layers = 16;
  c.hidden_size = 2048;
  c.ffn_hidden_size = 8192;
  c.num_attention_heads = 32;
  c.num_query_groups = 8;
  c.seq_length = 2048;
  c.activation = transformer::Activation::swiglu;
  c.finalize();
  // Per token and layer: QKV 2048*(2048 + 2*512) = 6,291,456; proj 4,194,304; fc1 (gate and up,
  // not 4h) 2048*16384 = 33,554,432; fc2 8192*2048 = 16,777,216; attention 2048*32*64 = 4,194,304
  // -> 65,011,712. 16 layers: 1,040,187,392; logits 2048*32000 = 65,536,000. Total
  // 1,105,723,392 MACs = 6,634,340,352 FLOPs per token.
  const double per_token = 6634340352.0;
  EXPECT_DOUBLE_EQ(models::num_floating_point_operations(c, 32000, 2), per_token * 2048 * 2);
}

}  // namespace
}  // namespace mg::test
