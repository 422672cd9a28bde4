// Single-process tests of megatron/core/tensor_parallel: partition arithmetic, TP-invariant
// partitioned init (PITFALLS #7), vocab and GQA splits with their errors, the RNG seeding rules,
// and the layers and cross entropy on a one-member group against direct computations.
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/tensor_parallel/cross_entropy.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/tensor_parallel/mappings.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/tensor_parallel/sharding.h"
#include "tests/unit/core/tensor_parallel/tp_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::tensor_parallel {
namespace {

using test::det_tensor;

TEST(Sharding, PiecesOfRowsStridesAndColumns) {
  // [8, 3] rows, TP 2, stride 1: rank 1 holds rows 4..7 = elements 12..23, one piece.
  auto p = partition_pieces({8, 3}, Partition{0, 1, 1, 2});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].global_start, 12);
  EXPECT_EQ(p[0].length, 12);
  // SwiGLU [gate; up] = [8, 3], stride 2, TP 2: rank 1 holds gate rows 2..3 and up rows 6..7.
  p = partition_pieces({8, 3}, Partition{0, 2, 1, 2});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].global_start, 6);
  EXPECT_EQ(p[0].length, 6);
  EXPECT_EQ(p[1].global_start, 18);
  EXPECT_EQ(p[1].local_start, 6);
  // Columns of [2, 4], TP 2, rank 1: elements 2..3 and 6..7.
  p = partition_pieces({2, 4}, Partition{1, 1, 1, 2});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].global_start, 2);
  EXPECT_EQ(p[1].global_start, 6);
  EXPECT_EQ(local_shape({2, 4}, Partition{1, 1, 1, 2}), (Shape{2, 2}));
  // Size 1 and replicated: one piece, the whole tensor.
  EXPECT_EQ(partition_pieces({8, 3}, Partition{0, 2, 0, 1}).size(), 1u);
  EXPECT_EQ(partition_pieces({8, 3}, Partition{-1, 1, 1, 2})[0].length, 24);
}

TEST(Sharding, IndivisibleDimNamesTheValues) {
  const std::string m = test::error_message([] { local_shape({6, 3}, Partition{0, 2, 0, 2}); });
  EXPECT_NE(m.find("(6)"), std::string::npos) << m;
  EXPECT_NE(m.find("partition_stride 2"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor_model_parallel_size 2"), std::string::npos) << m;
}

// PITFALLS #7: the shards, initialised independently and reassembled, equal the full init bit for
// bit, for every TP size and every partition kind of FORMATS.md §6.
TEST(Sharding, PartitionedInitEqualsFullInitForEveryTpSize) {
  test::ensure_runtime();
  const ops::OpTable& ops = test::ops_on("cpu");
  struct Case {
    Shape shape;
    int dim, stride;
  };
  const Case cases[] = {{{48, 16}, 0, 1},   // linear_qkv (grouped GQA rows) / column-parallel
                        {{48, 16}, 0, 2},   // SwiGLU linear_fc1 [gate; up]
                        {{16, 24}, 1, 1},   // linear_proj / linear_fc2
                        {{1024, 8}, 0, 1},  // vocab-parallel embedding
                        {{48}, 0, 2}};
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    for (const Case& c : cases) {
      ops::InitArgs a;
      a.std = 0.02;
      a.seed = 1234;
      a.offset = 7;
      Tensor full = Tensor::empty(c.shape, dt);
      ops.init_normal(full, a);
      for (int64_t tp : {1, 2, 4}) {
        std::vector<Tensor> shards;
        for (int64_t r = 0; r < tp; ++r) {
          const Partition part{c.dim, c.stride, r, tp};
          Tensor s = Tensor::empty(local_shape(c.shape, part), dt);
          init_normal_partitioned(ops, s, c.shape, part, a);
          EXPECT_EQ(s.to_vector<double>(), slice_partition(full, part).to_vector<double>());
          shards.push_back(s);
        }
        EXPECT_EQ(assemble_partitions(shards, c.shape, c.dim, c.stride).to_vector<double>(),
                  full.to_vector<double>())
            << "shape " << shape_str(c.shape) << " dim " << c.dim << " stride " << c.stride
            << " tp " << tp;
      }
    }
  }
}

TEST(Sharding, SwigluShardIsGateRowsThenUpRows) {
  // [gate; up] with F = 4, H = 1: gate rows 0..3, up rows 4..7; TP 2 rank 0: [g0 g1 u0 u1].
  const Tensor full = Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 10, 11, 12, 13}, {8, 1});
  EXPECT_EQ(slice_partition(full, Partition{0, 2, 0, 2}).to_vector<double>(),
            (std::vector<double>{0, 1, 10, 11}));
  EXPECT_EQ(slice_partition(full, Partition{0, 2, 1, 2}).to_vector<double>(),
            (std::vector<double>{2, 3, 12, 13}));
}

TEST(Sharding, VocabRangesCoverThePaddedVocab) {
  transformer::TransformerConfig c;
  c.make_vocab_size_divisible_by = 128;
  for (int64_t tp : {1, 2, 4}) {
    const int64_t vp = c.padded_vocab_size(1000, tp);
    EXPECT_EQ(vp % (128 * tp), 0);
    int64_t next = 0;
    for (int64_t r = 0; r < tp; ++r) {
      const VocabRange v = vocab_range(vp, r, tp);
      EXPECT_EQ(v.start, next);
      next = v.end;
    }
    EXPECT_EQ(next, vp);
  }
  const std::string m = test::error_message([] { vocab_range(1000, 0, 3); });
  EXPECT_NE(m.find("1000"), std::string::npos) << m;
}

TEST(Sharding, GqaSplitsWholeGroupsAndNamesTheValues) {
  const AttentionPartition a = attention_partition(8, 4, 1, 2);
  EXPECT_EQ(a.heads, 4);
  EXPECT_EQ(a.groups, 2);
  EXPECT_EQ(a.first_head, 4);
  EXPECT_EQ(a.first_group, 2);
  std::string m = test::error_message([] { attention_partition(8, 2, 0, 4); });
  EXPECT_NE(m.find("num_query_groups (2)"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor_model_parallel_size (4)"), std::string::npos) << m;
  m = test::error_message([] { attention_partition(6, 6, 0, 4); });
  EXPECT_NE(m.find("num_attention_heads (6)"), std::string::npos) << m;
}

TEST(Random, MegatronSeedingRules) {
  const RngTracker t = model_parallel_manual_seed(1234, 3, 2);
  EXPECT_EQ(t.seed(kDataParallelRng), 1234u);
  EXPECT_EQ(t.seed(kModelParallelRng), 1234u + 2718u + 3u);
  EXPECT_EQ(t.seed(kExpertParallelRng), 1234u + 1024u + 200u + 3u);
  // Data-parallel seed equal on every TP rank, model-parallel seed different.
  const RngTracker t0 = model_parallel_manual_seed(1234, 0);
  EXPECT_EQ(t0.seed(kDataParallelRng), t.seed(kDataParallelRng));
  EXPECT_NE(t0.seed(kModelParallelRng), t.seed(kModelParallelRng));
  RngTracker x;
  x.add("a", 5);
  EXPECT_NE(test::error_message([&] { x.add("a", 6); }).find("already exists"), std::string::npos);
  EXPECT_NE(test::error_message([&] { x.add("b", 5); }).find("already used by region 'a'"),
            std::string::npos);
  EXPECT_NE(test::error_message([&] { (void)x.seed("zz"); }).find("'a'"), std::string::npos);
  EXPECT_EQ(sequence_parallel_offset(4, 2, 8, 1), 64u);
}

// The layers on a one-member group against direct gemms (and the identity mappings).
TEST(Layers, OneRankColumnRowEmbeddingAndCrossEntropy) {
  test::ensure_runtime();
  const ops::OpTable& ops = test::ops_on("cpu");
  test::SoloGroup solo;
  transformer::TransformerConfig cfg;
  transformer::ModuleContext ctx;
  ctx.ops = &ops;
  ctx.config = &cfg;
  ctx.dtype = ctx.grad_dtype = DType::f64;
  transformer::ParamBuilder pb(ctx);
  ctx.tp_group = &solo;
  ColumnParallelLinear col(ctx, pb, "col.", {.input_size = 3, .output_size = 4});
  RowParallelLinear row(ctx, pb, "row.", {.input_size = 4, .output_size = 3});
  std::vector<transformer::Parameter> params;
  transformer::ParamAndGradBuffer buf;
  std::vector<transformer::ParamDecl> decls;
  pb.finish(params, buf, decls);
  buf.params.copy_(det_tensor({buf.params.numel()}, 1));
  const Tensor x = det_tensor({2, 1, 3}, 2);
  ColumnParallelLinear::Saved cs;
  const Tensor hid = col.forward(x, cs);
  const Tensor y = row.forward(hid);  // [2, 1, 3]
  const auto w1 = col.weight().value.to_vector<double>(), b1 = col.bias().value.to_vector<double>();
  const auto w2 = row.weight().value.to_vector<double>(), b2 = row.bias().value.to_vector<double>();
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (int n = 0; n < 2; ++n) {
    double h[4];
    for (int o = 0; o < 4; ++o) {
      h[o] = b1[o];
      for (int i = 0; i < 3; ++i) h[o] += w1[o * 3 + i] * xv[n * 3 + i];
    }
    for (int o = 0; o < 3; ++o) {
      double e = b2[o];
      for (int i = 0; i < 4; ++i) e += w2[o * 4 + i] * h[i];
      EXPECT_NEAR(yv[n * 3 + o], e, 1e-14);
    }
  }
  // Backward: d(sum y)/dx = W1^T W2^T 1.
  const Tensor dx = col.backward(
      row.backward(Tensor::from_vector(std::vector<double>(6, 1.0), {2, 1, 3}), hid), x, cs);
  for (int i = 0; i < 3; ++i) {
    double e = 0;
    for (int o = 0; o < 4; ++o)
      e += w1[o * 3 + i] * (w2[0 * 4 + o] + w2[1 * 4 + o] + w2[2 * 4 + o]);
    EXPECT_NEAR(dx.to_vector<double>()[i], e, 1e-14);
  }

  // Cross entropy on one rank is the serial op.
  const Tensor logits = det_tensor({5, 7}, 3);
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 6, 3, 2, 5}, {5});
  CrossEntropySaved saved;
  const auto loss =
      vocab_parallel_cross_entropy(ops, logits, targets, 0, solo, saved).to_vector<double>();
  const auto lv = logits.to_vector<double>();
  const int64_t tv[] = {0, 6, 3, 2, 5};
  for (int n = 0; n < 5; ++n) {
    double s = 0;
    for (int v = 0; v < 7; ++v) s += std::exp(lv[n * 7 + v]);
    EXPECT_NEAR(loss[n], std::log(s) - lv[n * 7 + tv[n]], 1e-14);
  }
}

}  // namespace
}  // namespace mg::tensor_parallel
