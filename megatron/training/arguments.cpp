// Megatron's flags bound to the component configs, and validate_args' defaults and checks.
#include "megatron/training/arguments.h"

#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/pipeline_parallel/layer_layout.h"
#include "megatron/training/arg_parser.h"

namespace mg::training {
namespace {

using transformer::Activation;
using transformer::Normalization;
using transformer::PositionEmbeddingType;
using transformer::RecomputeGranularity;
using transformer::RecomputeMethod;

// Flag-level state that is not a config field (Megatron's args namespace entries consumed here).
struct Pending {
  bool swiglu = false, squared_relu = false, group_query_attention = false;
  bool disable_bias_linear = false, no_bias_gelu_fusion = false, bf16 = false, fp16 = false;
  bool recompute_activations = false;
  std::optional<int64_t> num_query_groups;
  std::optional<std::string> yaml_cfg;
  std::optional<int64_t> virtual_pipeline_model_parallel_size;  // resolved with the layout
  std::optional<std::string> moe_layer_freq;                    // int or "[1,0,...]"
};

// ---- Mixture of Experts and expert parallelism (Megatron's --moe-* flags) ----
void add_moe_flags(ArgParser& p, transformer::TransformerConfig& m, Arguments& a, Pending& x) {
  using namespace transformer;
  p.add("--num-experts", m.num_moe_experts, "routed experts per MoE layer (0: dense MLP)");
  p.add("--moe-router-topk", m.moe_router_topk, "experts per token (2)");
  p.add_choice(
      "--moe-router-load-balancing-type", {"aux_loss", "seq_aux_loss", "none"},
      [&m](const std::string& v) {
        m.moe_router_load_balancing_type = v == "aux_loss" ? MoeLoadBalancingType::aux_loss
                                           : v == "seq_aux_loss"
                                               ? MoeLoadBalancingType::seq_aux_loss
                                               : MoeLoadBalancingType::none;
      },
      "load-balancing loss (aux_loss)");
  p.add("--moe-aux-loss-coeff", m.moe_aux_loss_coeff, "load-balancing loss coefficient (0)");
  p.add("--moe-z-loss-coeff", m.moe_z_loss_coeff, "router z-loss coefficient (0: none)");
  p.add_choice(
      "--moe-router-score-function", {"softmax", "sigmoid"},
      [&m](const std::string& v) {
        m.moe_router_score_function =
            v == "softmax" ? MoeScoreFunction::softmax : MoeScoreFunction::sigmoid;
      },
      "router score function (softmax)");
  p.add_switch("--moe-router-pre-softmax", m.moe_router_pre_softmax, true,
               "softmax over all experts before top-k");
  p.add("--moe-expert-capacity-factor", m.moe_expert_capacity_factor,
        "expert capacity factor (default: dropless)");
  p.add_choice(
      "--moe-token-drop-policy", {"probs", "position"},
      [&m](const std::string& v) {
        m.moe_token_drop_policy =
            v == "probs" ? MoeTokenDropPolicy::probs : MoeTokenDropPolicy::position;
      },
      "which tokens an expert over capacity keeps (probs)");
  p.add_choice(
      "--moe-token-dispatcher-type", {"allgather", "alltoall"},
      [&m](const std::string& v) {
        m.moe_token_dispatcher_type =
            v == "alltoall" ? MoeTokenDispatcherType::alltoall : MoeTokenDispatcherType::allgather;
      },
      "token dispatcher over the expert-parallel group (allgather)");
  p.add("--moe-ffn-hidden-size", m.moe_ffn_hidden_size,
        "routed experts' FFN size (--ffn-hidden-size)");
  p.add("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size,
        "shared experts' FFN size (0: none)");
  p.add("--moe-layer-freq", x.moe_layer_freq,
        "every N-th layer is MoE, or a pattern [1,0,...] (1)");
  p.add_switch("--moe-grouped-gemm", m.moe_grouped_gemm, true,
               "grouped expert GEMMs (same math here: a loop of GEMMs)");
  p.add("--expert-model-parallel-size", a.parallel.expert_model_parallel_size,
        "expert-parallel ranks (1); --num-experts must divide by it");
  p.add("--expert-tensor-parallel-size", a.parallel.expert_tensor_parallel_size,
        "tensor parallelism inside experts (default TP; only 1 is supported)");
}

// --moe-layer-freq: an integer N (every N-th layer) or a list "[1,0,1,...]".
void apply_moe_layer_freq(transformer::TransformerConfig& m, const std::string& v) {
  std::string t;
  for (char ch : v)
    if (ch != ' ') t += ch;
  if (!t.empty() && t.front() == '[') {
    MG_CHECK(t.back() == ']', "--moe-layer-freq " << v << ": expected a list like [1,0,1]");
    std::stringstream ss(t.substr(1, t.size() - 2));
    std::string item;
    while (std::getline(ss, item, ',')) {
      MG_CHECK(item == "0" || item == "1",
               "--moe-layer-freq " << v << ": list entries must be 0 or 1, got '" << item << "'");
      m.moe_layer_pattern.push_back(item == "1" ? 1 : 0);
    }
    return;
  }
  try {
    std::size_t used = 0;
    m.moe_layer_freq = std::stoll(t, &used);
    MG_CHECK(used == t.size(), "trailing characters");
  } catch (...) {
    MG_THROW("--moe-layer-freq " << v << ": expected an integer or a list like [1,0,1]");
  }
}

void add_model_flags(ArgParser& p, transformer::TransformerConfig& m, Pending& x) {
  p.add("--num-layers", m.num_layers, "number of transformer layers L");
  p.add("--hidden-size", m.hidden_size, "hidden size H");
  p.add("--ffn-hidden-size", m.ffn_hidden_size,
        "MLP hidden size F (default 4H; with --swiglu int(4H*2/3/64)*64)");
  p.add("--num-attention-heads", m.num_attention_heads, "attention heads NH");
  p.add_switch("--group-query-attention", x.group_query_attention, true,
               "grouped-query attention (with --num-query-groups)");
  p.add("--num-query-groups", x.num_query_groups, "KV heads NG under --group-query-attention (1)");
  p.add("--kv-channels", m.kv_channels, "head dim HD (default H/NH)");
  p.add_choice(
      "--normalization", {"LayerNorm", "RMSNorm"},
      [&m](const std::string& v) {
        m.normalization = v == "RMSNorm" ? Normalization::rmsnorm : Normalization::layernorm;
      },
      "normalization layer");
  p.add("--norm-epsilon", m.norm_epsilon, "epsilon of the norms (1e-5)");
  p.add("--layernorm-epsilon", m.norm_epsilon, "deprecated alias of --norm-epsilon");
  p.add_switch("--apply-layernorm-1p", m.apply_layernorm_1p, true,
               "zero-centred norm weights (gamma stored as weight + 1)");
  p.add_switch("--swiglu", x.swiglu, true, "SwiGLU MLP activation");
  p.add_switch("--squared-relu", x.squared_relu, true, "squared-ReLU MLP activation");
  p.add_switch("--no-bias-gelu-fusion", x.no_bias_gelu_fusion, true,
               "exact erf GELU instead of the fused (tanh) bias-GELU");
  p.add_switch("--disable-bias-linear", x.disable_bias_linear, true, "no biases in linear layers");
  p.add_switch("--add-qkv-bias", m.add_qkv_bias, true, "bias on linear_qkv only (Qwen2)");
  p.add_switch("--qk-layernorm", m.qk_layernorm, true, "normalize queries and keys per head");
  p.add_choice(
      "--position-embedding-type", {"learned_absolute", "rope", "none"},
      [&m](const std::string& v) {
        m.position_embedding_type = v == "rope"   ? PositionEmbeddingType::rope
                                    : v == "none" ? PositionEmbeddingType::none
                                                  : PositionEmbeddingType::learned_absolute;
      },
      "position embeddings");
  p.add("--rotary-base", m.rotary_base, "RoPE base (10000)");
  p.add("--rotary-percent", m.rotary_percent, "fraction of the head dim rotated (1.0)");
  p.add_switch("--rotary-interleaved", m.rotary_interleaved, true, "interleaved RoPE pairs");
  p.add_switch("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights, true,
               "separate output layer weight");
  p.add("--hidden-dropout", m.hidden_dropout, "dropout on hidden states (0.1)");
  p.add("--attention-dropout", m.attention_dropout, "dropout on attention probabilities (0.1)");
  p.add("--init-method-std", m.init_method_std, "std of the normal weight init (0.02)");
  p.add("--seq-length", m.seq_length, "sequence length S of a sample");
  p.add("--max-position-embeddings", m.max_position_embeddings,
        "rows of the learned position table (default --seq-length)");
  p.add("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by,
        "pad the vocabulary to a multiple of this (128)");
  p.add_choice(
      "--recompute-granularity", {"full", "selective"},
      [&m](const std::string& v) {
        m.recompute_granularity =
            v == "full" ? RecomputeGranularity::full : RecomputeGranularity::selective;
      },
      "activation recomputation");
  p.add_switch("--recompute-activations", x.recompute_activations, true,
               "same as --recompute-granularity selective");
  p.add_choice(
      "--recompute-method", {"uniform", "block"},
      [&m](const std::string& v) {
        m.recompute_method = v == "block" ? RecomputeMethod::block : RecomputeMethod::uniform;
      },
      "full recompute: layers per chunk (uniform) or the first N layers (block)");
  p.add("--recompute-num-layers", m.recompute_num_layers, "layers for --recompute-method");
  p.add_switch("--calculate-per-token-loss", m.calculate_per_token_loss, true,
               "loss summed over tokens, grads divided by the global token count");
}

void add_optimizer_flags(ArgParser& p, optimizer::OptimizerConfig& o, optimizer::SchedulerArgs& s,
                         Pending& x) {
  p.add_choice(
      "--optimizer", {"adam", "sgd"}, [&o](const std::string& v) { o.optimizer = v; }, "optimizer");
  p.add("--lr", o.lr, "peak learning rate");
  p.add("--min-lr", o.min_lr, "learning rate floor of the decay (0)");
  p.add_choice(
      "--lr-decay-style", {"constant", "linear", "cosine", "inverse-square-root", "WSD"},
      [&s](const std::string& v) { s.lr_decay_style = v; }, "learning-rate decay");
  p.add("--lr-decay-iters", s.lr_decay_iters, "decay length in iterations (default train iters)");
  p.add("--lr-decay-samples", s.lr_decay_samples, "decay length in samples");
  p.add("--lr-warmup-iters", s.lr_warmup_iters, "linear warmup iterations (0)");
  p.add("--lr-warmup-samples", s.lr_warmup_samples, "linear warmup samples (0)");
  p.add("--lr-warmup-fraction", s.lr_warmup_fraction, "warmup as a fraction of the decay length");
  p.add("--lr-warmup-init", s.lr_warmup_init, "learning rate at the start of warmup (0)");
  p.add_choice(
      "--lr-wsd-decay-style", {"exponential", "linear", "cosine", "minus_sqrt"},
      [&s](const std::string& v) { s.lr_wsd_decay_style = v; }, "WSD annealing shape");
  p.add("--lr-wsd-decay-iters", s.lr_wsd_decay_iters, "WSD annealing iterations");
  p.add("--lr-wsd-decay-samples", s.lr_wsd_decay_samples, "WSD annealing samples");
  p.add_switch("--override-opt_param-scheduler", s.override_opt_param_scheduler, true,
               "take the scheduler settings from the flags, not the checkpoint");
  p.add_switch("--use-checkpoint-opt_param-scheduler", s.use_checkpoint_opt_param_scheduler, true,
               "take the scheduler settings from the checkpoint");
  p.add("--weight-decay", o.weight_decay, "decoupled weight decay (0.01)");
  p.add("--start-weight-decay", s.start_weight_decay, "weight decay at the start (increment)");
  p.add("--end-weight-decay", s.end_weight_decay, "weight decay at the end (increment)");
  p.add_choice(
      "--weight-decay-incr-style", {"constant", "linear", "cosine"},
      [&s](const std::string& v) { s.weight_decay_incr_style = v; }, "weight-decay schedule");
  p.add("--adam-beta1", o.adam_beta1, "Adam beta1 (0.9)");
  p.add("--adam-beta2", o.adam_beta2, "Adam beta2 (0.999)");
  p.add("--adam-eps", o.adam_eps, "Adam epsilon (1e-8)");
  p.add("--sgd-momentum", o.sgd_momentum, "SGD momentum (0.9)");
  p.add("--clip-grad", o.clip_grad, "clip the global grad norm to this (1.0; 0 disables)");
  p.add_switch("--bf16", x.bf16, true, "bf16 weights, fp32 master weights and grads");
  p.add_switch("--fp16", x.fp16, true, "fp16 weights with dynamic loss scaling");
  p.add("--loss-scale", o.loss_scale, "static loss scale (default dynamic under --fp16)");
  p.add("--initial-loss-scale", o.initial_loss_scale, "initial dynamic loss scale (2^32)");
  p.add("--min-loss-scale", o.min_loss_scale, "minimum dynamic loss scale (1)");
  p.add("--loss-scale-window", o.loss_scale_window, "clean steps before the scale grows (1000)");
  p.add("--hysteresis", o.hysteresis, "overflows tolerated before the scale shrinks (2)");
  p.add_switch("--log-num-zeros-in-grad", o.log_num_zeros_in_grad, true,
               "log the number of zero gradients");
}

void add_data_flags(ArgParser& p, datasets::DataConfig& d, tokenizers::TokenizerArgs& t) {
  p.add_switch("--mock-data", d.mock, true, "synthetic data (Megatron's MockGPTDataset)");
  p.add("--data-path", d.data_path, "dataset prefix(es), optionally weighted: [w1] p1 [w2 p2 ...]");
  p.add("--split", d.split, "train,valid,test proportions (969,30,1)");
  p.add("--train-data-path", d.train_data_path, "training dataset prefix(es)");
  p.add("--valid-data-path", d.valid_data_path, "validation dataset prefix(es)");
  p.add("--test-data-path", d.test_data_path, "test dataset prefix(es)");
  p.add("--data-cache-path", d.data_cache_path, "where the dataset indices are cached");
  p.add_switch("--reset-position-ids", d.reset_position_ids, true,
               "position ids restart after each EOD");
  p.add_switch("--reset-attention-mask", d.reset_attention_mask, true,
               "attention stays within each document");
  p.add_switch("--eod-mask-loss", d.eod_mask_loss, true, "no loss on EOD tokens");
  p.add_switch("--create-attention-mask-in-dataloader", d.create_attention_mask, true,
               "accepted for Megatron parity (masks are causal + doc ids)");
  p.add("--mid-level-dataset-surplus", d.mid_level_dataset_surplus,
        "extra samples per blended dataset (0.005)");
  p.add_switch("--no-drop-last-partial-validation-sequence",
               d.drop_last_partial_validation_sequence, false, "keep a partial last sample");
  p.add_choice(
      "--tokenizer-type",
      {"GPT2BPETokenizer", "NullTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
       "Llama2Tokenizer", "HuggingFaceTokenizer"},
      [&t](const std::string& v) { t.tokenizer_type = v; }, "tokenizer");
  p.add("--tokenizer-model", t.tokenizer_model, "SentencePiece model / HF tokenizer.json");
  p.add("--vocab-file", t.vocab_file, "GPT-2 vocab.json");
  p.add("--merge-file", t.merge_file, "GPT-2 merges.txt");
  p.add("--vocab-size", t.vocab_size, "NullTokenizer vocabulary size");
}

void add_ddp_flags(ArgParser& p, distributed::DistributedDataParallelConfig& d) {
  p.add_switch("--use-distributed-optimizer", d.use_distributed_optimizer, true,
               "shard optimizer state over data-parallel ranks (ZeRO-1)");
  p.add_switch("--overlap-grad-reduce", d.overlap_grad_reduce, true,
               "reduce gradient buckets during the last micro-batch's backward");
  p.add_switch("--overlap-param-gather", d.overlap_param_gather, true,
               "all-gather updated parameters during the next forward (distributed optimizer)");
  p.add("--ddp-bucket-size", d.bucket_size, "elements per gradient bucket");
  p.add_switch("--accumulate-allreduce-grads-in-fp32", d.grad_reduce_in_fp32, true,
               "accumulate and reduce grads in fp32 (always so in this build)");
  p.add_switch("--ddp-average-in-collective", d.average_in_collective, true,
               "average in the collective instead of pre-scaling grads by 1/dp");
}

void add_training_flags(ArgParser& p, TrainingConfig& tr, CheckpointConfig& c, LoggingConfig& l,
                        std::string& platform, Pending& x) {
  p.add("--micro-batch-size", tr.micro_batch_size, "samples per micro-batch per rank");
  p.add("--global-batch-size", tr.global_batch_size,
        "samples per iteration (default micro-batch size x data-parallel size)");
  p.add("--train-iters", tr.train_iters, "iterations to train");
  p.add("--train-samples", tr.train_samples, "samples to train (instead of --train-iters)");
  p.add("--eval-interval", tr.eval_interval, "iterations between evaluations (1000)");
  p.add("--eval-iters", tr.eval_iters, "iterations per evaluation (100; 0: none)");
  p.add_switch("--skip-train", tr.skip_train, true, "evaluate only");
  p.add("--exit-interval", tr.exit_interval, "exit when the iteration is a multiple of this");
  p.add("--exit-duration-in-mins", tr.exit_duration_in_mins, "exit after this many minutes");
  p.add("--seed", tr.seed, "random seed (1234)");
  p.add_switch("--no-check-for-nan-in-loss-and-grad", tr.check_for_nan_in_loss_and_grad, false,
               "count and skip NaN-loss iterations instead of stopping (bf16/fp32)");
  p.add("--save", c.save, "checkpoint directory to save to");
  p.add("--save-interval", c.save_interval, "iterations between checkpoints");
  p.add("--load", c.load, "checkpoint directory to load from");
  p.add_switch("--no-save-optim", c.no_save_optim, true, "save no optimizer/scheduler state");
  p.add_switch("--no-save-rng", c.no_save_rng, true, "save no RNG state");
  p.add_switch("--no-load-optim", c.no_load_optim, true, "load no optimizer/scheduler state");
  p.add_switch("--no-load-rng", c.no_load_rng, true, "load no RNG state");
  p.add_switch("--finetune", c.finetune, true,
               "load the model only and start at iteration 0 with fresh optimizer and data");
  p.add_switch("--exit-on-missing-checkpoint", c.exit_on_missing_checkpoint, true,
               "fail when --load has no checkpoint");
  // ---- checkpoint format (checkpoint helper) ----
  p.add_choice(
      "--ckpt-format", {"sharded", "legacy"}, [&c](const std::string& v) { c.ckpt_format = v; },
      "checkpoint format: sharded (loads into any TP/PP/DP layout; default) or legacy (the "
      "previous same-layout files)");
  p.add_switch("--auto-detect-ckpt-format", c.auto_detect_ckpt_format, true,
               "load a checkpoint of either format whatever --ckpt-format says");
  p.add_switch("--async-save", c.async_save, true,
               "write checkpoints from a background thread after a host copy (sharded format)");
  p.add("--log-interval", l.log_interval, "iterations between log lines (100)");
  p.add("--peak-tflops", l.peak_tflops, "device peak dense TFLOP/s for MFU");
  p.add_switch("--log-params-norm", l.log_params_norm, true, "log the parameters' L2 norm");
  p.add_choice(
      "--platform", {"cuda", "musa", "txda", "cpu"},
      [&platform](const std::string& v) { platform = v; }, "platform (default MG_PLATFORM, auto)");
  p.add("--yaml-cfg", x.yaml_cfg, "YAML file of these flags (the command line overrides it)");
}

void check(bool ok, ArgParser& p, const char* a, const char* b) {
  MG_CHECK(ok, a << " and " << b << " conflict; give only one of them");
  (void)p;
}

}  // namespace

Arguments parse_args(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_args(args);
}

Arguments parse_args(const std::vector<std::string>& raw) {
  Arguments a;
  Pending x;
  ArgParser p;
  bool help = false;
  p.add_switch("--help", help, true, "show this help and exit");
  add_model_flags(p, a.model, x);
  add_optimizer_flags(p, a.optimizer, a.scheduler, x);
  add_data_flags(p, a.data, a.tokenizer);
  add_training_flags(p, a.training, a.checkpoint, a.logging, a.platform, x);
  p.add_choice(
      "--distributed-backend", {"nccl", "mpi", "single"},
      [&a](const std::string& v) { a.distributed_backend = v; },
      "communication backend (default: mpi under mpirun/srun, else a single rank)");
  p.add("--distributed-timeout-minutes", a.distributed_timeout_minutes,
        "minutes a collective may wait for every rank before the job aborts (10)");
  p.add_switch("--deterministic-mode", a.deterministic_mode, true,
               "deterministic kernels only, bit-identical reruns (NCCL: needs NCCL_ALGO)");
  p.add_choice(
      "--attention-backend", {"auto", "flash", "fused", "unfused", "local"},
      [&a](const std::string& v) {
        MG_CHECK(v != "flash",
                 "--attention-backend flash: no FlashAttention library in Megatron-CPP; use "
                 "fused (cuDNN fused attention), local (our kernels), unfused or auto");
        a.attention_backend = v;
      },
      "attention kernels: auto (cuDNN where it serves the call, else ours), fused (cuDNN), "
      "local (ours), unfused (our reference kernel)");
  p.add("--tensor-model-parallel-size", a.parallel.tensor_model_parallel_size,
        "tensor-parallel ranks (1); the world size must be a multiple");
  p.add_switch("--sequence-parallel", a.parallel.sequence_parallel, true,
               "shard norms/dropout over the sequence across TP ranks (needs TP > 1)");
  p.add("--pipeline-model-parallel-size", a.parallel.pipeline_model_parallel_size,
        "pipeline stages (1); the world size must be a multiple of TP x PP");
  p.add("--virtual-pipeline-model-parallel-size", x.virtual_pipeline_model_parallel_size,
        "model chunks per pipeline rank: the interleaved 1F1B schedule");
  p.add("--num-layers-per-virtual-pipeline-stage", a.parallel.num_layers_per_virtual_pipeline_stage,
        "layers per virtual pipeline stage (interleaved schedule)");
  p.add("--decoder-first-pipeline-num-layers", a.parallel.decoder_first_pipeline_num_layers,
        "layers of the first pipeline stage (uneven split)");
  p.add("--decoder-last-pipeline-num-layers", a.parallel.decoder_last_pipeline_num_layers,
        "layers of the last pipeline stage (uneven split)");
  p.add("--context-parallel-size", a.parallel.context_parallel_size,
        "context-parallel ranks (1): each sequence cut into 2 CP chunks across them");
  p.add_choice(
      "--cp-comm-type", {"p2p", "a2a", "allgather"},
      [&a](const std::string& v) { a.parallel.cp_comm_type = v; },
      "how attention crosses the CP group: p2p (ring, default), allgather, a2a (Ulysses)");
  add_ddp_flags(p, a.ddp);
  add_moe_flags(p, a.model, a, x);
  a.help_text = p.help();

  std::vector<std::string> args;
  for (const auto& s : raw) args.push_back(s == "-h" ? "--help" : s);
  // --yaml-cfg first, so the command line overrides the file.
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string path;
    if (args[i] == "--yaml-cfg" && i + 1 < args.size()) path = args[i + 1];
    if (args[i].rfind("--yaml-cfg=", 0) == 0) path = args[i].substr(11);
    if (!path.empty()) p.parse_yaml_file(path);
  }
  p.parse(args);
  a.given = p.given_values();
  if (help) {
    a.help = true;
    return a;
  }

  // ---- conflicts (validate_args), before any defaults are derived ----
  check(!(x.fp16 && x.bf16), p, "--fp16", "--bf16");
  check(!(x.swiglu && x.squared_relu), p, "--swiglu", "--squared-relu");
  check(!(p.given("--lr-warmup-fraction") &&
          (p.given("--lr-warmup-iters") || p.given("--lr-warmup-samples"))),
        p, "--lr-warmup-fraction", "--lr-warmup-iters/--lr-warmup-samples");
  check(!(p.given("--recompute-activations") && p.given("--recompute-granularity")), p,
        "--recompute-activations", "--recompute-granularity");
  check(!(p.given("--layernorm-epsilon") && p.given("--norm-epsilon")), p, "--layernorm-epsilon",
        "--norm-epsilon");
  if (a.training.train_samples) {
    MG_CHECK(!p.given("--lr-decay-iters") && !p.given("--lr-warmup-iters") &&
                 !p.given("--lr-wsd-decay-iters"),
             "--train-samples " << *a.training.train_samples
                                << " counts samples: use --lr-decay-samples / "
                                   "--lr-warmup-samples / --lr-wsd-decay-samples, not *-iters");
  } else {
    MG_CHECK(!p.given("--lr-decay-samples") && !p.given("--lr-warmup-samples") &&
                 !p.given("--lr-wsd-decay-samples"),
             "--lr-*-samples flags need --train-samples (iteration-based runs use --lr-*-iters)");
  }
  const bool any_path = !a.data.data_path.empty() || !a.data.train_data_path.empty() ||
                        !a.data.valid_data_path.empty() || !a.data.test_data_path.empty();
  MG_CHECK(!(a.data.mock && any_path),
           "--mock-data conflicts with --data-path / --train-data-path / --valid-data-path / "
           "--test-data-path; give one or the other");
  MG_CHECK(!x.num_query_groups || x.group_query_attention,
           "--num-query-groups " << *x.num_query_groups << " needs --group-query-attention");
  if (a.model.position_embedding_type != PositionEmbeddingType::rope)
    MG_CHECK(!p.given("--rotary-base") && !p.given("--rotary-percent") &&
                 !p.given("--rotary-interleaved"),
             "--rotary-* flags need --position-embedding-type rope (got "
                 << transformer::to_string(a.model.position_embedding_type) << ")");
  MG_CHECK(!a.checkpoint.finetune || a.checkpoint.load,
           "--finetune needs --load DIR (the model to start from)");

  // ---- Megatron's flag-level defaults ----
  if (x.swiglu) a.model.activation = Activation::swiglu;
  if (x.squared_relu) a.model.activation = Activation::squared_relu;
  if (x.swiglu && a.model.ffn_hidden_size == 0)
    a.model.ffn_hidden_size =
        static_cast<int64_t>((4.0 * a.model.hidden_size * 2.0 / 3.0) / 64) * 64;
  a.model.bias_activation_fusion = a.model.activation == Activation::gelu && !x.no_bias_gelu_fusion;
  if (x.disable_bias_linear) a.model.add_bias_linear = false;
  if (x.group_query_attention) a.model.num_query_groups = x.num_query_groups.value_or(1);
  if (x.recompute_activations) a.model.recompute_granularity = RecomputeGranularity::selective;
  const DType dtype = x.bf16 ? DType::bf16 : x.fp16 ? DType::f16 : DType::f32;
  a.model.params_dtype = a.optimizer.params_dtype = dtype;
  a.optimizer.bf16 = x.bf16;
  a.optimizer.fp16 = x.fp16;
  MG_CHECK(a.model.seq_length >= 1, "--seq-length is required (got " << a.model.seq_length << ")");
  if (x.moe_layer_freq) apply_moe_layer_freq(a.model, *x.moe_layer_freq);
  a.model.finalize();
  a.parallel.validate(a.model, a.ddp.use_distributed_optimizer,
                      static_cast<int>(x.virtual_pipeline_model_parallel_size.value_or(1)));

  MG_CHECK(a.training.micro_batch_size >= 1, "--micro-batch-size is required and must be >= 1 (got "
                                                 << a.training.micro_batch_size << ")");
  if (a.training.global_batch_size == 0)
    a.training.global_batch_size = a.training.micro_batch_size * a.training.data_parallel_size;
  a.training.validate();
  MG_CHECK(a.distributed_timeout_minutes > 0,
           "--distributed-timeout-minutes must be > 0, got " << a.distributed_timeout_minutes);
  a.ddp.validate();
  a.checkpoint.validate();
  a.logging.validate();

  MG_CHECK(a.optimizer.lr.has_value(), "--lr is required (the peak learning rate)");
  a.optimizer.validate();
  a.scheduler.lr = *a.optimizer.lr;
  a.scheduler.min_lr = a.optimizer.min_lr.value_or(0.0);
  a.scheduler.weight_decay = a.optimizer.weight_decay;
  a.scheduler.train_iters = a.training.train_iters;
  a.scheduler.train_samples = a.training.train_samples;
  a.scheduler.global_batch_size = a.training.global_batch_size;
  optimizer::scheduler_config_from_args(a.scheduler).validate();

  a.data.seq_length = static_cast<int32_t>(a.model.seq_length);
  a.data.seed = static_cast<uint32_t>(a.training.seed);
  if (a.tokenizer.tokenizer_type.empty() && a.tokenizer.vocab_size)
    a.tokenizer.tokenizer_type = "NullTokenizer";
  MG_CHECK(!a.tokenizer.tokenizer_type.empty(),
           "--tokenizer-type is required (e.g. --tokenizer-type NullTokenizer --vocab-size N "
           "with --mock-data)");
  a.tokenizer.validate();
  return a;
}

}  // namespace mg::training
