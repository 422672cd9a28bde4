// Megatron flag parsing: values land in the component configs, Megatron's derived defaults, YAML
// files, and the errors (unknown flag with a suggestion, conflicts naming both flags, bad values).
#include "megatron/training/arguments.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "megatron/core/ops/rope_scaling.h"
#include "megatron/training/arg_parser.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

std::vector<std::string> base() {
  return {"--num-layers",
          "2",
          "--hidden-size",
          "64",
          "--num-attention-heads",
          "4",
          "--seq-length",
          "32",
          "--micro-batch-size",
          "2",
          "--train-iters",
          "10",
          "--lr",
          "1e-3",
          "--mock-data",
          "--tokenizer-type",
          "NullTokenizer",
          "--vocab-size",
          "100"};
}

std::vector<std::string> with(std::vector<std::string> extra) {
  auto v = base();
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

std::string parse_error(const std::vector<std::string>& args) {
  return test::error_message([&] { parse_args(args); });
}

TEST(EditDistance, Basics) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("--lr", "--lr"), 0u);
}

TEST(Arguments, ValuesLandInTheConfigs) {
  Arguments a = parse_args(with({"--ffn-hidden-size",
                                 "100",
                                 "--normalization",
                                 "RMSNorm",
                                 "--disable-bias-linear",
                                 "--position-embedding-type",
                                 "rope",
                                 "--rotary-base=500000",
                                 "--untie-embeddings-and-output-weights",
                                 "--hidden-dropout",
                                 "0",
                                 "--weight-decay",
                                 "0.1",
                                 "--lr-decay-style",
                                 "cosine",
                                 "--min-lr",
                                 "1e-5",
                                 "--adam-beta2",
                                 "0.95",
                                 "--clip-grad",
                                 "0.5",
                                 "--seed",
                                 "7",
                                 "--eval-interval",
                                 "5",
                                 "--eval-iters",
                                 "2",
                                 "--log-interval",
                                 "1",
                                 "--save",
                                 "/tmp/x",
                                 "--save-interval",
                                 "5",
                                 "--no-save-optim"}));
  EXPECT_EQ(a.model.num_layers, 2);
  EXPECT_EQ(a.model.hidden_size, 64);
  EXPECT_EQ(a.model.ffn_hidden_size, 100);
  EXPECT_EQ(a.model.kv_channels, 16);  // derived H / NH
  EXPECT_EQ(a.model.num_query_groups, 4);
  EXPECT_EQ(a.model.max_position_embeddings, 32);
  EXPECT_EQ(a.model.normalization, transformer::Normalization::rmsnorm);
  EXPECT_FALSE(a.model.add_bias_linear);
  EXPECT_EQ(a.model.position_embedding_type, transformer::PositionEmbeddingType::rope);
  EXPECT_EQ(a.model.rotary_base, 500000.0);
  EXPECT_TRUE(a.model.untie_embeddings_and_output_weights);
  EXPECT_EQ(a.model.hidden_dropout, 0.0);
  EXPECT_EQ(a.optimizer.weight_decay, 0.1);
  EXPECT_EQ(a.scheduler.lr_decay_style, "cosine");
  EXPECT_EQ(a.scheduler.lr, 1e-3);
  EXPECT_EQ(a.scheduler.min_lr, 1e-5);
  EXPECT_EQ(a.optimizer.adam_beta2, 0.95);
  EXPECT_EQ(a.optimizer.clip_grad, 0.5);
  EXPECT_EQ(a.training.seed, 7u);
  EXPECT_EQ(a.data.seed, 7u);
  EXPECT_EQ(a.data.seq_length, 32);
  EXPECT_TRUE(a.data.mock);
  EXPECT_EQ(a.training.global_batch_size, 2);  // default mbs * dp
  EXPECT_EQ(a.training.num_microbatches(), 1);
  EXPECT_EQ(a.logging.log_interval, 1);
  EXPECT_EQ(*a.checkpoint.save, "/tmp/x");
  EXPECT_TRUE(a.checkpoint.no_save_optim);
  EXPECT_EQ(a.tokenizer.tokenizer_type, "NullTokenizer");
  EXPECT_EQ(*a.tokenizer.vocab_size, 100);
}

TEST(Arguments, MegatronDerivedDefaults) {
  Arguments a = parse_args(
      with({"--swiglu", "--group-query-attention", "--global-batch-size", "8", "--bf16"}));
  EXPECT_EQ(a.model.activation, transformer::Activation::swiglu);
  EXPECT_EQ(a.model.ffn_hidden_size, 128);  // int(4*64*2/3/64)*64 = int(2.67)*64
  EXPECT_EQ(a.model.num_query_groups, 1);   // Megatron's --num-query-groups default
  EXPECT_EQ(a.training.num_microbatches(), 4);
  EXPECT_EQ(a.model.params_dtype, DType::bf16);
  EXPECT_TRUE(a.optimizer.bf16);
  Arguments g = parse_args(base());
  EXPECT_EQ(g.model.ffn_hidden_size, 256);      // 4H
  EXPECT_TRUE(g.model.bias_activation_fusion);  // Megatron's default bias-GELU fusion (tanh)
  EXPECT_FALSE(parse_args(with({"--no-bias-gelu-fusion"})).model.bias_activation_fusion);
  // SwiGLU's FP8 cast fusion (docs/fp8.md): on by default, off with --no-bias-swiglu-fusion.
  EXPECT_TRUE(g.model.bias_swiglu_fusion);
  EXPECT_FALSE(parse_args(with({"--no-bias-swiglu-fusion"})).model.bias_swiglu_fusion);
}

TEST(Arguments, UnknownFlagSuggestsTheClosest) {
  auto e = parse_error(with({"--num-layer", "3"}));
  EXPECT_NE(e.find("unrecognized argument --num-layer"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean --num-layers?"), std::string::npos) << e;
  e = parse_error(with({"--hiden-size", "3"}));
  EXPECT_NE(e.find("--hidden-size"), std::string::npos) << e;
}

TEST(Arguments, ConflictsAreRejectedNamingTheFlags) {
  auto e = parse_error(with({"--fp16", "--bf16"}));
  EXPECT_NE(e.find("--fp16 and --bf16 conflict"), std::string::npos) << e;
  e = parse_error(with({"--train-samples", "100"}));
  EXPECT_NE(e.find("--train-iters 10 and --train-samples 100"), std::string::npos) << e;
  e = parse_error(with({"--swiglu", "--squared-relu"}));
  EXPECT_NE(e.find("--swiglu and --squared-relu"), std::string::npos) << e;
  e = parse_error(with({"--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.1"}));
  EXPECT_NE(e.find("--lr-warmup-fraction and --lr-warmup-iters"), std::string::npos) << e;
  e = parse_error(with({"--data-path", "foo"}));
  EXPECT_NE(e.find("--mock-data conflicts with --data-path"), std::string::npos) << e;
  e = parse_error(with({"--num-query-groups", "2"}));
  EXPECT_NE(e.find("--num-query-groups 2 needs --group-query-attention"), std::string::npos) << e;
  e = parse_error(with({"--rotary-base", "5"}));
  EXPECT_NE(e.find("--position-embedding-type rope"), std::string::npos) << e;
  e = parse_error(with({"--save-interval", "5"}));
  EXPECT_NE(e.find("--save-interval 5 needs --save"), std::string::npos) << e;
  e = parse_error(with({"--finetune"}));
  EXPECT_NE(e.find("--finetune needs --load"), std::string::npos) << e;
  e = parse_error(with({"--global-batch-size", "5"}));
  EXPECT_NE(e.find("--global-batch-size 5 is not divisible by --micro-batch-size 2"),
            std::string::npos)
      << e;
}

TEST(Arguments, BadValuesNameTheFlag) {
  auto e = parse_error(with({"--hidden-dropout", "abc"}));
  EXPECT_NE(e.find("--hidden-dropout expects a number, got 'abc'"), std::string::npos) << e;
  e = parse_error(with({"--eval-iters", "1.5"}));
  EXPECT_NE(e.find("--eval-iters expects an integer, got '1.5'"), std::string::npos) << e;
  e = parse_error(with({"--normalization", "BatchNorm"}));
  EXPECT_NE(e.find("'BatchNorm' is not one of: LayerNorm, RMSNorm"), std::string::npos) << e;
  e = parse_error(with({"--seed"}));
  EXPECT_NE(e.find("--seed expects a value"), std::string::npos) << e;
  e = parse_error(with({"--bf16=1"}));
  EXPECT_NE(e.find("--bf16 is a switch"), std::string::npos) << e;
  e = parse_error(with({"stray"}));
  EXPECT_NE(e.find("unexpected argument 'stray'"), std::string::npos) << e;
  e = parse_error({"--num-layers", "2"});
  EXPECT_NE(e.find("--seq-length is required"), std::string::npos) << e;
  // Counts written as 1e3 are accepted; negative numbers are values, not flags.
  EXPECT_EQ(*parse_args(with({"--exit-interval", "1e3"})).training.exit_interval, 1000);
  EXPECT_NE(parse_error(with({"--eval-iters", "-1"})).find("--eval-iters must be >= 0, got -1"),
            std::string::npos);
}

// --tensor-model-parallel-size / --sequence-parallel: heads and query groups must divide by TP;
// SP is switched off at TP 1 as Megatron's validate_args does (the loop logs Megatron's warning).
TEST(Arguments, TensorAndSequenceParallelFlags) {
  auto a = parse_args(with({"--tensor-model-parallel-size", "2", "--sequence-parallel"}));
  EXPECT_EQ(a.parallel.tensor_model_parallel_size, 2);
  EXPECT_TRUE(a.parallel.sequence_parallel);
  EXPECT_FALSE(a.parallel.sequence_parallel_disabled);
  a = parse_args(with({"--sequence-parallel"}));
  EXPECT_EQ(a.parallel.tensor_model_parallel_size, 1);
  EXPECT_FALSE(a.parallel.sequence_parallel);
  EXPECT_TRUE(a.parallel.sequence_parallel_disabled);
  auto e = parse_error(with({"--tensor-model-parallel-size", "3"}));
  EXPECT_NE(e.find("--num-attention-heads 4 must be divisible by --tensor-model-parallel-size 3"),
            std::string::npos)
      << e;
  e = parse_error(with(
      {"--tensor-model-parallel-size", "4", "--group-query-attention", "--num-query-groups", "2"}));
  EXPECT_NE(e.find("query groups 2 (--num-query-groups) must be divisible by "
                   "--tensor-model-parallel-size 4"),
            std::string::npos)
      << e;
  e = parse_error(with({"--tensor-model-parallel-size", "0"}));
  EXPECT_NE(e.find("--tensor-model-parallel-size must be >= 1, got 0"), std::string::npos) << e;
}

TEST(Arguments, YamlFileAndCommandLineOverride) {
  const auto path = std::filesystem::temp_directory_path() / "mg_args_test.yaml";
  {
    std::ofstream f(path);
    f << "num_layers: 3\nhidden-size: 64\nnum-attention-heads: 4\nseq-length: 32\n"
         "micro-batch-size: 2\ntrain-iters: 10\nlr: 1.0e-3\nmock-data: true\nbf16: false\n"
         "tokenizer-type: NullTokenizer\nvocab-size: 100\ndata-cache-path:\n";
  }
  Arguments a = parse_args({"--yaml-cfg", path.string(), "--num-layers", "5"});
  EXPECT_EQ(a.model.num_layers, 5);  // the command line wins
  EXPECT_EQ(a.model.hidden_size, 64);
  EXPECT_TRUE(a.data.mock);
  EXPECT_EQ(a.model.params_dtype, DType::f32);
  {
    std::ofstream f(path);
    f << "num-layer: 3\n";
  }
  auto e = parse_error({"--yaml-cfg", path.string()});
  EXPECT_NE(e.find("unrecognized key 'num-layer'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean num-layers?"), std::string::npos) << e;
  e = parse_error({"--yaml-cfg", "/nonexistent.yaml"});
  EXPECT_NE(e.find("--yaml-cfg '/nonexistent.yaml'"), std::string::npos) << e;
  std::filesystem::remove(path);
}

bool has_notice(const Arguments& a, const std::string& text) {
  for (const auto& n : a.notices)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

// argparse: a repeated flag takes its last value; one start-up line names it with both values.
TEST(Arguments, RepeatedFlagTakesTheLastValueAndSaysSo) {
  Arguments a =
      parse_args(with({"--lr", "1e-4", "--seed", "7", "--seed", "9", "--bf16", "--bf16"}));
  EXPECT_DOUBLE_EQ(*a.optimizer.lr, 1e-4);
  EXPECT_EQ(a.training.seed, 9u);
  EXPECT_TRUE(has_notice(a, "--lr given more than once: 1e-3 then 1e-4; the last value applies"))
      << ::testing::PrintToString(a.notices);
  EXPECT_TRUE(has_notice(a, "--seed given more than once: 7 then 9"));
  EXPECT_TRUE(has_notice(a, "--bf16 given more than once: (switch) then (switch)"));
  // The checkpoint's record holds each flag once, with the value that applied.
  int lrs = 0;
  for (const auto& [k, v] : a.given) {
    if (k != "--lr") continue;
    ++lrs;
    EXPECT_EQ(v, std::vector<std::string>{"1e-4"});
  }
  EXPECT_EQ(lrs, 1);
  EXPECT_FALSE(has_notice(parse_args(base()), "more than once"));
}

// Performance knobs of Megatron's PyTorch/TE implementation: accepted, one line each saying why
// nothing changes; the model config is untouched.
TEST(Arguments, NoEffectFlagsAreAcceptedWithOneLine) {
  const Arguments plain = parse_args(base());
  Arguments a = parse_args(
      with({"--use-mcore-models", "--transformer-impl", "transformer_engine",
            "--no-gradient-accumulation-fusion", "--tp-comm-overlap", "--attention-softmax-in-fp32",
            "--use-flash-attn", "--accumulate-allreduce-grads-in-fp32",
            "--cross-entropy-fusion-impl", "te", "--no-mmap-bin-files"}));
  for (const char* f :
       {"--use-mcore-models: no effect here", "--transformer-impl transformer_engine: no effect",
        "--no-gradient-accumulation-fusion: no effect here", "--tp-comm-overlap: no effect here",
        "--attention-softmax-in-fp32: no effect here",
        "--use-flash-attn: no FlashAttention library here; attention runs --attention-backend auto",
        "--accumulate-allreduce-grads-in-fp32: already",
        "--cross-entropy-fusion-impl te: no effect here", "--no-mmap-bin-files: no effect here"})
    EXPECT_TRUE(has_notice(a, f)) << f << "\n" << ::testing::PrintToString(a.notices);
  EXPECT_EQ(a.model.hidden_size, plain.model.hidden_size);
  EXPECT_EQ(a.model.position_embedding_type, plain.model.position_embedding_type);
  EXPECT_TRUE(plain.notices.empty()) << ::testing::PrintToString(plain.notices);
  a = parse_args(with({"--attention-backend", "unfused", "--use-flash-attn"}));
  EXPECT_EQ(a.attention_backend, "unfused");
  EXPECT_TRUE(has_notice(a, "attention runs --attention-backend unfused"));
  EXPECT_NE(parse_error(with({"--transformer-impl", "te"})).find("'te' is not one of"),
            std::string::npos);
}

// Features that would change the results and are not built: an error naming the feature.
TEST(Arguments, RefusedFlagsNameTheMissingFeature) {
  auto e = parse_error(with({"--multi-latent-attention"}));
  EXPECT_NE(e.find("--multi-latent-attention: multi-latent attention (MLA) is not implemented"),
            std::string::npos)
      << e;
  e = parse_error(with({"--rampup-batch-size", "16", "8", "300000"}));
  EXPECT_NE(e.find("--rampup-batch-size: batch-size ramp-up is not implemented"), std::string::npos)
      << e;
  e = parse_error(with({"--use-legacy-models"}));
  EXPECT_NE(e.find("Megatron-Core GPTModel only"), std::string::npos) << e;
  for (const char* f : {"torch", "torch_dist", "torch_dcp"}) {
    e = parse_error(with({"--ckpt-format", f}));
    EXPECT_NE(e.find(std::string("--ckpt-format ") + f +
                     ": Megatron-LM's PyTorch checkpoint formats are not read or written here"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("convert_checkpoint import"), std::string::npos) << e;
  }
  EXPECT_EQ(parse_args(with({"--ckpt-format", "legacy"})).checkpoint.ckpt_format, "legacy");
  e = parse_error(with({"--ckpt-format", "zip"}));
  EXPECT_NE(e.find("--ckpt-format 'zip' is not one of: sharded, legacy"), std::string::npos) << e;
  e = parse_error(with({"--dataloader-type", "external"}));
  EXPECT_NE(e.find("--dataloader-type external"), std::string::npos) << e;
}

// Deprecated spellings Megatron still accepts, the data loader and tokenizer-system flags.
TEST(Arguments, MegatronAliasesAndLoaderFlags) {
  Arguments a = parse_args(with({"--use-rotary-position-embeddings", "--rotary-base", "500000"}));
  EXPECT_EQ(a.model.position_embedding_type, transformer::PositionEmbeddingType::rope);
  EXPECT_DOUBLE_EQ(a.model.rotary_base, 500000);
  a = parse_args(with({"--position-embedding-type", "rope", "--no-position-embedding"}));
  EXPECT_EQ(a.model.position_embedding_type, transformer::PositionEmbeddingType::rope);
  auto e = parse_error(with({"--no-position-embedding"}));
  EXPECT_NE(e.find("--no-position-embedding is deprecated"), std::string::npos) << e;
  a = parse_args(base());
  EXPECT_EQ(a.training.dataloader_type, "single");
  EXPECT_EQ(a.training.num_workers, 2);
  EXPECT_FALSE(a.tokenizer.legacy_tokenizer);
  a = parse_args(with({"--dataloader-type", "cyclic", "--num-workers", "0", "--legacy-tokenizer"}));
  EXPECT_EQ(a.training.dataloader_type, "cyclic");
  EXPECT_EQ(a.training.num_workers, 0);
  EXPECT_TRUE(a.tokenizer.legacy_tokenizer);
  EXPECT_NO_THROW(parse_args(with({"--recompute-modules", "core_attn"})));
  e = parse_error(with({"--recompute-modules", "core_attn", "mlp"}));
  EXPECT_NE(e.find("--recompute-modules mlp: selective recompute of 'mlp' is not implemented"),
            std::string::npos)
      << e;
  e = parse_error(with({"--num-workers", "-1"}));
  EXPECT_NE(e.find("--num-workers must be in [0, 64], got -1"), std::string::npos) << e;
}

// docs/flags.md lists every flag the parser knows in the class its help line gives (implemented,
// "accepted, no effect here", "refused"), and names no flag of those classes the parser lacks.
TEST(Arguments, DocsListEveryFlagInItsClass) {
  std::ifstream in(std::filesystem::path(MG_TEST_FIXTURES_DIR) / ".." / ".." / "docs" / "flags.md");
  ASSERT_TRUE(in.good());
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto section = [&](const std::string& from, const std::string& to) {
    const auto b = doc.find(from);
    EXPECT_NE(b, std::string::npos) << from;
    const auto e = doc.find(to, b);
    EXPECT_NE(e, std::string::npos) << to;
    std::set<std::string> flags;
    const std::string text = doc.substr(b, e - b);
    for (std::size_t p = text.find("`--"); p != std::string::npos; p = text.find("`--", p + 1)) {
      std::size_t q = p + 1;
      while (q < text.size() && (std::isalnum(static_cast<unsigned char>(text[q])) ||
                                 text[q] == '-' || text[q] == '_'))
        ++q;
      flags.insert(text.substr(p + 1, q - p - 1));
    }
    return flags;
  };
  const auto implemented = section("## Implemented", "## No effect here");
  const auto no_effect = section("## No effect here", "## Refused");
  const auto refused = section("## Refused", "Refused through a value");
  std::map<std::string, std::string> parser;  // flag -> class by its help line
  std::istringstream help(parse_args({"--help"}).help_text);
  for (std::string line; std::getline(help, line);) {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    parser[name] = line.find("accepted, no effect here") != std::string::npos ? "no effect"
                   : line.find("refused: ") != std::string::npos              ? "refused"
                                                                              : "implemented";
  }
  ASSERT_GT(parser.size(), 250u);
  for (const auto& [name, cls] : parser) {
    const auto& listed = cls == "no effect" ? no_effect : cls == "refused" ? refused : implemented;
    EXPECT_TRUE(listed.count(name))
        << name << " is not listed under " << cls << " in docs/flags.md";
  }
  for (const auto* set : {&implemented, &no_effect, &refused})
    for (const auto& name : *set)
      EXPECT_TRUE(parser.count(name)) << name << " is listed in docs/flags.md but not parsed";
}

TEST(Arguments, HelpListsFlags) {
  Arguments a = parse_args({"--help"});
  EXPECT_TRUE(a.help);
  EXPECT_NE(a.help_text.find("--num-layers"), std::string::npos);
  EXPECT_NE(a.help_text.find("--yaml-cfg"), std::string::npos);
}

TEST(Arguments, MegatronFsdpFlags) {
  using distributed::ShardingStrategy;
  Arguments a = parse_args(base());
  EXPECT_FALSE(a.ddp.use_megatron_fsdp);
  EXPECT_EQ(a.ddp.sharding_strategy, ShardingStrategy::no_shard);  // Megatron's default
  EXPECT_FALSE(a.ddp.use_distributed_optimizer);
  EXPECT_FALSE(a.optimizer.optimizer_cpu_offload);
  EXPECT_EQ(a.optimizer.optimizer_offload_fraction, 1.0);

  a = parse_args(with({"--use-megatron-fsdp"}));
  EXPECT_TRUE(a.ddp.use_megatron_fsdp);
  EXPECT_FALSE(a.ddp.use_distributed_optimizer);  // no_shard = DDP
  EXPECT_FALSE(a.ddp.shards_grads());
  for (const auto& [name, s, grads, params] :
       {std::tuple{"optim", ShardingStrategy::optim, false, false},
        std::tuple{"optim_grads", ShardingStrategy::optim_grads, true, false},
        std::tuple{"optim_grads_params", ShardingStrategy::optim_grads_params, true, true}}) {
    a = parse_args(with({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", name}));
    EXPECT_EQ(a.ddp.sharding_strategy, s) << name;
    EXPECT_TRUE(a.ddp.use_distributed_optimizer) << name;  // the optimizer state is sharded
    EXPECT_EQ(a.ddp.shards_grads(), grads) << name;
    EXPECT_EQ(a.ddp.shards_params(), params) << name;
  }
  // --use-torch-fsdp2: the ZeRO-3 engine.
  a = parse_args(with({"--use-torch-fsdp2"}));
  EXPECT_TRUE(a.use_torch_fsdp2);
  EXPECT_TRUE(a.ddp.use_megatron_fsdp);
  EXPECT_EQ(a.ddp.sharding_strategy, ShardingStrategy::optim_grads_params);
  a = parse_args(with({"--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"}));
  EXPECT_TRUE(a.optimizer.optimizer_cpu_offload);
  EXPECT_EQ(a.optimizer.optimizer_offload_fraction, 0.5);

  auto e = parse_error(with({"--data-parallel-sharding-strategy", "optim_grads"}));
  EXPECT_NE(e.find("--data-parallel-sharding-strategy needs --use-megatron-fsdp"),
            std::string::npos)
      << e;
  e = parse_error(with({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "zero3"}));
  EXPECT_NE(e.find("zero3"), std::string::npos) << e;
  EXPECT_NE(e.find("optim_grads_params"), std::string::npos) << e;
  e = parse_error(with({"--use-torch-fsdp2", "--data-parallel-sharding-strategy", "optim_grads"}));
  EXPECT_NE(e.find("--use-torch-fsdp2 shards parameters"), std::string::npos) << e;
  e = parse_error(with({"--optimizer-offload-fraction", "1.5"}));
  EXPECT_NE(e.find("--optimizer-offload-fraction must be in [0, 1], got 1.5"), std::string::npos)
      << e;
  // Megatron's offload companions: the overlap (needs the offload), precision-aware (no effect:
  // the default dtypes), torch.optim on the host (refused).
  a = parse_args(with({"--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                       "--use-precision-aware-optimizer", "--no-pin-cpu-grads"}));
  EXPECT_TRUE(a.optimizer.overlap_cpu_optimizer_d2h_h2d);
  e = parse_error(with({"--overlap-cpu-optimizer-d2h-h2d"}));
  EXPECT_NE(
      e.find("--overlap-cpu-optimizer-d2h-h2d overlaps the copies of --optimizer-cpu-offload"),
      std::string::npos)
      << e;
  e = parse_error(with({"--optimizer-cpu-offload", "--use-torch-optimizer-for-cpu-offload"}));
  EXPECT_NE(e.find("--use-torch-optimizer-for-cpu-offload"), std::string::npos) << e;
  EXPECT_NE(e.find("not implemented"), std::string::npos) << e;
}

// The trainer's flags: each kind alone, its settings reach the model config, errors name flags.
TEST(RopeScalingFlags, ParseAndRefuse) {
  const std::vector<std::string> base = {"--num-layers",
                                         "1",
                                         "--hidden-size",
                                         "32",
                                         "--num-attention-heads",
                                         "4",
                                         "--seq-length",
                                         "16",
                                         "--max-position-embeddings",
                                         "64",
                                         "--micro-batch-size",
                                         "1",
                                         "--train-iters",
                                         "1",
                                         "--lr",
                                         "1e-3",
                                         "--mock-data",
                                         "--tokenizer-type",
                                         "NullTokenizer",
                                         "--vocab-size",
                                         "99",
                                         "--position-embedding-type"};
  auto parse = [&base](std::vector<std::string> extra) {
    std::vector<std::string> cmd = base;
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    return parse_args(cmd);
  };
  auto a = parse({"rope", "--use-rope-scaling", "--rope-scaling-factor", "32",
                  "--rope-scaling-original-max-position-embeddings", "16"});
  EXPECT_EQ(a.model.rope_scaling.type, ops::RopeScalingType::llama3);
  EXPECT_EQ(a.model.rope_scaling.factor, 32.0);
  EXPECT_EQ(a.model.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(a.model.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(a.model.rope_scaling.original_max_position_embeddings, 16);
  EXPECT_EQ(parse({"rope", "--use-rope-scaling"}).model.rope_scaling.factor, 8.0)
      << "Megatron's default --rope-scaling-factor";
  a = parse({"yarn", "--yarn-rotary-scaling-factor", "4", "--yarn-original-max-position-embeddings",
             "16", "--yarn-beta-fast", "16"});
  EXPECT_EQ(a.model.rope_scaling.type, ops::RopeScalingType::yarn);
  EXPECT_EQ(a.model.rope_scaling.factor, 4.0);
  EXPECT_EQ(a.model.rope_scaling.beta_fast, 16.0);
  EXPECT_EQ(a.model.rope_scaling.original_max_position_embeddings, 16);
  a = parse({"rope", "--rotary-seq-len-interpolation-factor", "2"});
  EXPECT_EQ(a.model.rope_scaling.type, ops::RopeScalingType::linear);
  EXPECT_EQ(a.model.rope_scaling.factor, 2.0);
  EXPECT_EQ(parse({"rope"}).model.rope_scaling.type, ops::RopeScalingType::none);
  auto error = [&parse](std::vector<std::string> extra) {
    try {
      parse(extra);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error({"rope", "--rope-scaling-factor", "4"}).find("needs --use-rope-scaling"),
            std::string::npos);
  EXPECT_NE(error({"rope", "--yarn-beta-fast", "4"}).find("needs --position-embedding-type yarn"),
            std::string::npos);
  EXPECT_NE(error({"yarn", "--use-rope-scaling"}).find("give one"), std::string::npos);
  EXPECT_NE(error({"learned_absolute", "--use-rope-scaling"}).find("--position-embedding-type"),
            std::string::npos);
  EXPECT_NE(error({"rope", "--use-rope-scaling", "--rope-scaling-factor", "0"}).find("factor 0"),
            std::string::npos);
}

}  // namespace
}  // namespace mg::training
