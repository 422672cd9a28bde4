// Megatron's flags bound to the component configs, and validate_args' defaults and checks.
#include "megatron/training/arguments.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/rope_scaling.h"
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
  bool fp8_e4m3 = false, fp8_hybrid = false;
  int64_t fp8_interval = 1;
  bool use_rotary_position_embeddings = false, no_position_embedding = false;
  bool use_flash_attn = false, attention_softmax_in_fp32 = false;
  std::optional<std::string> transformer_impl;
  bool yarn = false;  // --position-embedding-type yarn
  bool use_rope_scaling = false;
  std::optional<double> rotary_seq_len_interpolation_factor;
  ops::RopeScaling llama3{.factor = 8.0}, yarn_scaling;  // each kind's flags, chosen after parsing
};

// ---- FP8 (Megatron's --fp8-* flags; docs/fp8.md) ----
void add_fp8_flags(ArgParser& p, fp8::Fp8Config& f, Pending& x) {
  using fp8::AmaxComputeAlgo;
  using fp8::Fp8Format;
  using fp8::Fp8Recipe;
  p.add_choice(
      "--fp8-format", {"e4m3", "hybrid"},
      [&f](const std::string& v) { f.format = v == "e4m3" ? Fp8Format::e4m3 : Fp8Format::hybrid; },
      "FP8 GEMMs in the decoder layers' linears: e4m3 everywhere, or hybrid (E4M3 forward, E5M2 "
      "gradients)");
  p.add_switch("--fp8-e4m3", x.fp8_e4m3, true, "older spelling of --fp8-format e4m3");
  p.add_switch("--fp8-hybrid", x.fp8_hybrid, true, "older spelling of --fp8-format hybrid");
  p.add_choice(
      "--fp8-recipe", {"delayed", "tensorwise", "mxfp8", "blockwise"},
      [&f](const std::string& v) {
        MG_CHECK(v == "delayed" || v == "tensorwise",
                 "--fp8-recipe " << v
                                 << ": not built yet (mxfp8: an E8M0 scale per 32 elements, "
                                    "Blackwell's block-scaled FP8 GEMMs; blockwise: 1x128 / "
                                    "128x128 block scales); valid here: delayed, tensorwise");
        f.recipe = v == "delayed" ? Fp8Recipe::delayed : Fp8Recipe::tensorwise;
      },
      "scaling recipe (delayed: amax history; tensorwise: current per-tensor scaling)");
  p.add("--fp8-margin", f.margin, "scaling margin: scale = fp8_max / amax / 2^margin (0)");
  p.add("--fp8-interval", x.fp8_interval,
        "scaling update interval; deprecated and ignored by Megatron: only 1 is accepted");
  p.add("--fp8-amax-history-len", f.amax_history_len, "amax history length of delayed scaling (1)");
  p.add_choice(
      "--fp8-amax-compute-algo", {"most_recent", "max"},
      [&f](const std::string& v) {
        f.amax_compute_algo = v == "max" ? AmaxComputeAlgo::max : AmaxComputeAlgo::most_recent;
      },
      "amax from the history: most_recent (default) or max");
  p.add_switch("--no-fp8-wgrad", f.wgrad, false,
               "weight-gradient GEMMs in the model dtype instead of FP8");
  p.add_switch("--fp8-param-gather", f.param_gather, true,
               "keep the FP8 linears' weights as FP8 parameters: the distributed optimizer casts "
               "its master shards to FP8 after the step and all-gathers 1 byte per element");
  p.add_switch("--fp8-dot-product-attention", f.dot_product_attention, true,
               "the decoder layers' core attention in FP8 (Transformer Engine's fp8_dpa: cuDNN's "
               "FP8 SDPA on the GPU, its exact emulation on the CPU; delayed recipe)");
  p.add_switch("--fp8-multi-head-attention", f.multi_head_attention, true,
               "FP8 attention without casts at its boundary with the output projection "
               "(Transformer Engine's fp8_mha; implies --fp8-dot-product-attention): O goes to "
               "linear_proj's FP8 GEMM as it is, which writes dO in FP8");
  p.add_switch("--tp-only-amax-red", f.tp_only_amax_red, true,
               "reduce amaxes over the tensor-(context-)parallel group only, not data parallel");
  p.add_switch("--first-last-layers-bf16", f.first_last_layers_bf16, true,
               "keep the first and last decoder layers out of FP8");
  p.add("--num-layers-at-start-in-bf16", f.num_layers_at_start_in_bf16,
        "with --first-last-layers-bf16: leading layers kept in the model dtype (1)");
  p.add("--num-layers-at-end-in-bf16", f.num_layers_at_end_in_bf16,
        "with --first-last-layers-bf16: trailing layers kept in the model dtype (1)");
}

// The FP8 flags' conflicts and dependencies; sets the format from the older spellings.
void check_fp8_flags(ArgParser& p, fp8::Fp8Config& f, const Pending& x) {
  MG_CHECK(!(x.fp8_e4m3 && x.fp8_hybrid), "--fp8-e4m3 and --fp8-hybrid conflict; give only one");
  if (x.fp8_e4m3 || x.fp8_hybrid) {
    const fp8::Fp8Format old = x.fp8_e4m3 ? fp8::Fp8Format::e4m3 : fp8::Fp8Format::hybrid;
    MG_CHECK(!p.given("--fp8-format") || f.format == old,
             "--fp8-format " << fp8::format_name(f.format) << " conflicts with "
                             << (x.fp8_e4m3 ? "--fp8-e4m3" : "--fp8-hybrid"));
    f.format = old;
  }
  MG_CHECK(x.fp8_interval == 1, "--fp8-interval " << x.fp8_interval
                                                  << ": deprecated (Megatron and Transformer "
                                                     "Engine ignore it; scales update every "
                                                     "pass); only 1 is accepted");
  if (!f.enabled()) {
    for (const char* flag :
         {"--fp8-recipe", "--fp8-margin", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
          "--no-fp8-wgrad", "--tp-only-amax-red", "--first-last-layers-bf16", "--fp8-param-gather",
          "--fp8-dot-product-attention", "--fp8-multi-head-attention"})
      MG_CHECK(!p.given(flag), flag << " needs --fp8-format e4m3|hybrid (FP8 is off)");
  }
  // Transformer Engine forces fp8_dpa when fp8_mha is set ("Forcing fp8_dpa=True due to
  // fp8_mha=True"): the FP8 attention's checks below then apply.
  if (f.multi_head_attention) f.dot_product_attention = true;
  for (const char* flag : {"--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"})
    MG_CHECK(!p.given(flag) || f.first_last_layers_bf16, flag << " needs --first-last-layers-bf16");
}

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
  p.add("--moe-router-num-groups", m.moe_router_num_groups,
        "expert groups for group-limited routing (0: off; DeepSeek's n_group)");
  p.add("--moe-router-group-topk", m.moe_router_group_topk,
        "groups each token may route to (0: off; DeepSeek's topk_group)");
  p.add("--moe-router-topk-scaling-factor", m.moe_router_topk_scaling_factor,
        "routing probabilities times this factor (None)");
  p.add_switch("--moe-router-enable-expert-bias", m.moe_router_enable_expert_bias, true,
               "aux-loss-free load balancing: per-expert bias on the scores for the top-k choice "
               "(sigmoid scores)");
  p.add_choice(
      "--moe-router-dtype", {"fp32", "fp64"},
      [&m](const std::string& v) { m.moe_router_dtype = v; },
      "router logits' dtype (fp32 is what runs; fp64 with an fp64 model)");
  p.add("--moe-router-bias-update-rate", m.moe_router_bias_update_rate,
        "expert bias step per iteration: bias += rate * sign(mean - count) (1e-3)");
  p.add("--moe-ffn-hidden-size", m.moe_ffn_hidden_size,
        "routed experts' FFN size (--ffn-hidden-size)");
  p.add_switch("--moe-shared-expert-gate", m.moe_shared_expert_gate, true,
               "sigmoid gate on the shared experts' output (Qwen2-MoE)");
  p.add("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size,
        "shared experts' FFN size (0: none)");
  p.add("--moe-layer-freq", x.moe_layer_freq,
        "every N-th layer is MoE, or a pattern [1,0,...] (1)");
  p.add_switch("--moe-per-layer-logging", a.logging.moe_per_layer_logging, true,
               "log each MoE layer's losses and tokens per expert (stdout, TensorBoard)");
  p.add_switch("--moe-grouped-gemm", m.moe_grouped_gemm, true,
               "the local experts' GEMMs as one grouped GEMM each (needs --disable-bias-linear)");
  p.add("--expert-model-parallel-size", a.parallel.expert_model_parallel_size,
        "expert-parallel ranks (1); --num-experts must divide by it");
  p.add("--expert-tensor-parallel-size", a.parallel.expert_tensor_parallel_size,
        "tensor parallelism inside each expert over Megatron's expert-TP group (default TP)");
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
  p.add_switch("--no-bias-swiglu-fusion", m.bias_swiglu_fusion, false,
               "SwiGLU as its own op under FP8, not fused into the FP8 casts (the same numbers)");
  p.add_switch("--disable-bias-linear", x.disable_bias_linear, true, "no biases in linear layers");
  p.add_switch("--add-qkv-bias", m.add_qkv_bias, true, "bias on linear_qkv only (Qwen2)");
  p.add_switch("--qk-layernorm", m.qk_layernorm, true, "normalize queries and keys per head");
  p.add_choice(
      "--position-embedding-type", {"learned_absolute", "rope", "yarn", "none"},
      [&m, &x](const std::string& v) {
        m.position_embedding_type = v == "rope" || v == "yarn" ? PositionEmbeddingType::rope
                                    : v == "none"              ? PositionEmbeddingType::none
                                                  : PositionEmbeddingType::learned_absolute;
        x.yarn = v == "yarn";
      },
      "position embeddings (yarn: RoPE with YaRN scaling, the --yarn-* flags)");
  p.add("--rotary-base", m.rotary_base, "RoPE base (10000)");
  p.add("--rotary-percent", m.rotary_percent, "fraction of the head dim rotated (1.0)");
  p.add_switch("--rotary-interleaved", m.rotary_interleaved, true, "interleaved RoPE pairs");
  // RoPE scaling (ops/rope_scaling.h), each equal to transformers' rope_type of the same name.
  p.add("--rotary-seq-len-interpolation-factor", x.rotary_seq_len_interpolation_factor,
        "linear RoPE scaling: positions divided by this factor");
  p.add_switch("--use-rope-scaling", x.use_rope_scaling, true,
               "Llama 3.1 (rope_type llama3) frequency scaling");
  p.add("--rope-scaling-factor", x.llama3.factor, "--use-rope-scaling factor (8.0)");
  p.add("--rope-scaling-low-freq-factor", x.llama3.low_freq_factor,
        "--use-rope-scaling low_freq_factor (1.0; fixed in Megatron)");
  p.add("--rope-scaling-high-freq-factor", x.llama3.high_freq_factor,
        "--use-rope-scaling high_freq_factor (4.0; fixed in Megatron)");
  p.add("--rope-scaling-original-max-position-embeddings",
        x.llama3.original_max_position_embeddings,
        "--use-rope-scaling original context (8192; fixed in Megatron)");
  p.add("--yarn-rotary-scaling-factor", x.yarn_scaling.factor, "YaRN scaling factor (1.0)");
  p.add("--yarn-original-max-position-embeddings", x.yarn_scaling.original_max_position_embeddings,
        "YaRN original context (8192)");
  p.add("--yarn-beta-fast", x.yarn_scaling.beta_fast, "YaRN beta_fast (32)");
  p.add("--yarn-beta-slow", x.yarn_scaling.beta_slow, "YaRN beta_slow (1)");
  p.add("--yarn-mscale", x.yarn_scaling.mscale, "YaRN mscale (1.0)");
  p.add("--yarn-mscale-all-dim", x.yarn_scaling.mscale_all_dim, "YaRN mscale_all_dim (0.0)");
  p.add_switch("--no-yarn-correction-range-round-to-int",
               x.yarn_scaling.correction_range_round_to_int, false,
               "YaRN ramp ends not rounded (transformers' truncate false)");
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
  p.add_switch("--optimizer-cpu-offload", o.optimizer_cpu_offload, true,
               "optimizer state and update in host memory (the identity on the CPU platform)");
  p.add("--optimizer-offload-fraction", o.optimizer_offload_fraction,
        "fraction of the optimizer state offloaded (1.0)");
  p.add_switch("--overlap-cpu-optimizer-d2h-h2d", o.overlap_cpu_optimizer_d2h_h2d, true,
               "pipeline the offloaded part's copies with its host update");
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

// ---- Megatron flags given a meaning here this session: deprecated spellings, the attention
// backend, the data loader, the tokenizer system (docs/flags.md "implemented"). ----
void add_megatron_alias_flags(ArgParser& p, Arguments& a, Pending& x) {
  p.add_switch("--use-rotary-position-embeddings", x.use_rotary_position_embeddings, true,
               "deprecated spelling of --position-embedding-type rope");
  p.add_switch("--no-position-embedding", x.no_position_embedding, true,
               "deprecated spelling of --position-embedding-type none");
  p.add_switch("--use-flash-attn", x.use_flash_attn, true,
               "flash attention: --attention-backend auto here (no FlashAttention library)");
  p.add_switch("--attention-softmax-in-fp32", x.attention_softmax_in_fp32, true,
               "softmax in fp32 (always so here)");
  p.add_choice(
      "--transformer-impl", {"local", "transformer_engine"},
      [&x](const std::string& v) { x.transformer_impl = v; },
      "Megatron's layer implementation; one here (the platform's kernels)");
  p.add(
      "--dataloader-type", ArgParser::Nargs::one,
      [&a](const auto& v) {
        MG_CHECK(v[0] != "external",
                 "--dataloader-type external: a user-supplied Python data loader cannot be "
                 "plugged in here; use single or cyclic");
        MG_CHECK(v[0] == "single" || v[0] == "cyclic",
                 "--dataloader-type '" << v[0] << "' is not one of: single, cyclic");
        a.training.dataloader_type = v[0];
      },
      "single (one pass in order) or cyclic (Megatron's random sampler, reshuffled per epoch)");
  p.add("--num-workers", a.training.num_workers,
        "data-loader threads collating micro-batches ahead (2; 0: in the training thread)");
  p.add(
      "--recompute-modules", ArgParser::Nargs::many,
      [](const auto& v) {
        for (const auto& m : v)
          MG_CHECK(m == "core_attn", "--recompute-modules "
                                         << m << ": selective recompute of '" << m
                                         << "' is not implemented (selective recomputes core_attn "
                                            "only, Megatron's default)");
      },
      "submodules selective recompute covers: core_attn (the default and the only one here)");
  // argparse aliases Megatron declares next to the names above.
  p.add_switch("--override-opt-param-scheduler", a.scheduler.override_opt_param_scheduler, true,
               "spelling of --override-opt_param-scheduler");
  p.add_switch("--use-checkpoint-opt-param-scheduler",
               a.scheduler.use_checkpoint_opt_param_scheduler, true,
               "spelling of --use-checkpoint-opt_param-scheduler");
  p.add("--persistent-save-interval", a.checkpoint.save_interval, "spelling of --save-interval");
  p.add_switch("--legacy-tokenizer", a.tokenizer.legacy_tokenizer, true,
               "Megatron-LM's legacy tokenizer system: its identity in --data-cache-path files");
}

void add_ddp_flags(ArgParser& p, distributed::DistributedDataParallelConfig& d, Arguments& a) {
  p.add_switch("--use-megatron-fsdp", d.use_megatron_fsdp, true,
               "Megatron FSDP over the data-parallel group (--data-parallel-sharding-strategy)");
  p.add_choice(
      "--data-parallel-sharding-strategy",
      {"no_shard", "optim", "optim_grads", "optim_grads_params"},
      [&d](const std::string& v) { d.sharding_strategy = distributed::parse_sharding_strategy(v); },
      "FSDP: no_shard (DDP), optim (ZeRO-1), optim_grads (ZeRO-2), optim_grads_params (ZeRO-3)");
  p.add_switch("--use-torch-fsdp2", a.use_torch_fsdp2, true,
               "FSDP2 spelling: the --use-megatron-fsdp optim_grads_params engine");
  p.add_switch("--use-distributed-optimizer", d.use_distributed_optimizer, true,
               "shard optimizer state over data-parallel ranks (ZeRO-1)");
  p.add_switch("--overlap-grad-reduce", d.overlap_grad_reduce, true,
               "reduce gradient buckets during the last micro-batch's backward");
  p.add_switch("--overlap-param-gather", d.overlap_param_gather, true,
               "all-gather updated parameters during the next forward (distributed optimizer)");
  p.add("--ddp-bucket-size", d.bucket_size, "elements per gradient bucket");
  p.add_switch("--accumulate-allreduce-grads-in-fp32", d.grad_reduce_in_fp32, true,
               "accumulate and reduce grads in fp32 (bf16/fp16: already so in this build)");
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
  p.add(
      "--ckpt-format", ArgParser::Nargs::one,
      [&c](const auto& v) {
        const std::string& f = v[0];
        if (f == "torch" || f == "torch_dist" || f == "zarr" || f == "torch_dcp" ||
            f == "fsdp_dtensor")
          MG_THROW("--ckpt-format "
                   << f
                   << ": Megatron-LM's PyTorch checkpoint formats are not read or written here. "
                      "This build writes its own format: --ckpt-format sharded (the default; like "
                      "torch_dist it loads into any TP/PP/DP layout) or legacy. To bring a "
                      "Megatron-LM checkpoint across, export it to HuggingFace (Megatron Bridge: "
                      "convert_checkpoints.py export) and import that with `convert_checkpoint "
                      "import --hf-dir DIR --save DIR`; `convert_checkpoint export` goes back");
        MG_CHECK(f == "sharded" || f == "legacy",
                 "--ckpt-format '" << f << "' is not one of: sharded, legacy");
        c.ckpt_format = f;
      },
      "checkpoint format: sharded (loads into any TP/PP/DP layout; default) or legacy (the "
      "previous same-layout files); Megatron's torch/torch_dist are refused (see docs/flags.md)");
  p.add_switch("--auto-detect-ckpt-format", c.auto_detect_ckpt_format, true,
               "load a checkpoint of either format whatever --ckpt-format says");
  p.add_switch("--async-save", c.async_save, true,
               "write checkpoints from a background thread after a host copy (sharded format)");
  p.add_switch("--allow-ckpt-model-mismatch", c.allow_ckpt_model_mismatch, true,
               "load a checkpoint whose recorded model flags (heads, groups, kv-channels, norm, "
               "activation, positions, RoPE base, vocabulary, ...) differ from this run's, with a "
               "warning (e.g. fine-tuning with a new vocabulary); default: an error");
  p.add_switch("--no-ckpt-checksum", c.ckpt_checksum, false,
               "write checkpoints without per-tensor XXH3-64 checksums and load without "
               "verifying them (faster; corruption then goes unnoticed)");
  p.add("--log-interval", l.log_interval, "iterations between log lines (100)");
  p.add("--peak-tflops", l.peak_tflops, "device peak dense TFLOP/s for MFU");
  p.add_switch("--log-params-norm", l.log_params_norm, true, "log the parameters' L2 norm");
  p.add_switch("--profile", l.profile, true,
               "nsys profiling: NVTX ranges around every op and cudaProfilerStart/Stop around "
               "iterations [--profile-step-start, --profile-step-end) on --profile-ranks (run "
               "under nsys --capture-range=cudaProfilerApi); no such tool on the CPU platform");
  p.add_switch("--profile-op-table", l.profile_op_table, true,
               "time every op of the profiled iterations (device events, one wait at the end) "
               "and print a table: calls, ms, share of the step, TFLOP/s, GB/s, host syncs");
  p.add("--profile-step-start", l.profile_step_start, "first profiled iteration, 0-based (10)");
  p.add("--profile-step-end", l.profile_step_end, "iteration profiling stops before (12)");
  p.add(
      "--profile-ranks", ArgParser::Nargs::many,
      [&l](const auto& v) {
        l.profile_ranks.clear();
        for (const auto& x : v) {
          std::size_t used = 0;
          int64_t r = -1;
          try {
            r = std::stoll(x, &used);
          } catch (const std::exception&) {
            used = 0;
          }
          MG_CHECK(used == x.size() && !x.empty(),
                   "--profile-ranks: '" << x << "' is not an integer rank");
          l.profile_ranks.push_back(r);
        }
      },
      "global ranks to profile (0)");
  p.add_choice(
      "--platform", {"cuda", "musa", "txda", "cpu"},
      [&platform](const std::string& v) { platform = v; }, "platform (default MG_PLATFORM, auto)");
  p.add("--yaml-cfg", x.yaml_cfg, "YAML file of these flags (the command line overrides it)");
}

// ---- Megatron flags that are performance knobs of its PyTorch / Transformer Engine / NCCL
// implementation: accepted, and one start-up line says why they change nothing here. Each entry
// is a flag of megatron/training/arguments.py whose effect never reaches the numbers (docs/flags.md
// "no effect here"). ----
struct NoEffectFlag {
  const char* name;
  ArgParser::Nargs nargs;
  const char* why;
};
constexpr const char* kFusion =
    "a kernel-fusion switch of Megatron's PyTorch/TE code; the kernels "
    "here compute the same function either way";
constexpr const char* kTpOverlap =
    "Transformer Engine's userbuffer TP-communication overlap; "
    "collectives here are not overlapped with GEMMs";
constexpr const char* kNccl = "an NCCL/communicator tuning knob; it does not change results";
constexpr const char* kMemory =
    "a PyTorch memory-management knob; memory here is the platform allocator's";
const NoEffectFlag kNoEffectFlags[] = {
    {"--use-precision-aware-optimizer", ArgParser::Nargs::zero,
     "the master weights, gradients and Adam moments are f32 here, what its default dtypes "
     "give; Megatron asks for it with --optimizer-cpu-offload"},
    {"--no-pin-cpu-grads", ArgParser::Nargs::zero,
     "--optimizer-cpu-offload's host staging is pinned where the platform can pin; pageable "
     "memory gives the same numbers"},
    {"--no-pin-cpu-params", ArgParser::Nargs::zero,
     "--optimizer-cpu-offload's host staging is pinned where the platform can pin; pageable "
     "memory gives the same numbers"},
    {"--use-mcore-models", ArgParser::Nargs::zero,
     "deprecated in Megatron-LM too: Megatron-Core models are the only ones here"},
    {"--no-gradient-accumulation-fusion", ArgParser::Nargs::zero,
     "weight gradients are accumulated into the fp32 main_grad by the GEMM either way"},
    {"--no-masked-softmax-fusion", ArgParser::Nargs::zero, kFusion},
    {"--no-bias-dropout-fusion", ArgParser::Nargs::zero, kFusion},
    {"--no-rope-fusion", ArgParser::Nargs::zero, kFusion},
    {"--no-persist-layer-norm", ArgParser::Nargs::zero, kFusion},
    {"--cross-entropy-loss-fusion", ArgParser::Nargs::zero, kFusion},
    {"--cross-entropy-fusion-impl", ArgParser::Nargs::one, kFusion},
    {"--moe-permute-fusion", ArgParser::Nargs::zero, kFusion},
    {"--moe-router-fusion", ArgParser::Nargs::zero, kFusion},
    {"--use-te-activation-func", ArgParser::Nargs::zero, kFusion},
    {"--use-fused-weighted-squared-relu", ArgParser::Nargs::zero, kFusion},
    {"--no-async-tensor-model-parallel-allreduce", ArgParser::Nargs::zero,
     "deprecated and ignored by Megatron-LM too"},
    {"--tp-comm-overlap", ArgParser::Nargs::zero, kTpOverlap},
    {"--tp-comm-overlap-cfg", ArgParser::Nargs::one, kTpOverlap},
    {"--disable-tp-comm-overlap-ag", ArgParser::Nargs::zero, kTpOverlap},
    {"--disable-tp-comm-overlap-rs", ArgParser::Nargs::zero, kTpOverlap},
    {"--tp-comm-overlap-rs-dgrad", ArgParser::Nargs::zero, kTpOverlap},
    {"--disable-tp-comm-bulk-dgrad", ArgParser::Nargs::zero, kTpOverlap},
    {"--disable-tp-comm-bulk-wgrad", ArgParser::Nargs::zero, kTpOverlap},
    {"--disable-tp-comm-split-ag", ArgParser::Nargs::zero, kTpOverlap},
    {"--disable-tp-comm-split-rs", ArgParser::Nargs::zero, kTpOverlap},
    {"--tp-comm-bootstrap-backend", ArgParser::Nargs::one, kTpOverlap},
    {"--no-overlap-p2p-communication", ArgParser::Nargs::zero,
     "pipeline send/recv are posted as in Megatron's batched mode; overlap does not change "
     "results"},
    {"--overlap-p2p-communication-warmup-flush", ArgParser::Nargs::zero,
     "pipeline send/recv overlap does not change results"},
    {"--no-align-grad-reduce", ArgParser::Nargs::zero,
     "when each pipeline stage launches its gradient reduce does not change results"},
    {"--no-align-param-gather", ArgParser::Nargs::zero,
     "when each pipeline stage launches its parameter all-gather does not change results"},
    {"--overlap-param-gather-with-optimizer-step", ArgParser::Nargs::zero,
     "overlapping the first bucket's all-gather with the step does not change results"},
    {"--ddp-pad-buckets-for-high-nccl-busbw", ArgParser::Nargs::zero, kNccl},
    {"--use-nccl-ub", ArgParser::Nargs::zero, kNccl},
    {"--disable-symmetric-registration", ArgParser::Nargs::zero, kNccl},
    {"--use-sharp", ArgParser::Nargs::zero, kNccl},
    {"--sharp-enabled-group", ArgParser::Nargs::one, kNccl},
    {"--nccl-communicator-config-path", ArgParser::Nargs::one, kNccl},
    {"--high-priority-stream-groups", ArgParser::Nargs::many, kNccl},
    {"--disable-gloo-process-groups", ArgParser::Nargs::zero,
     "there are no Gloo process groups here (MPI or NCCL only)"},
    {"--local-rank", ArgParser::Nargs::one,
     "torchrun's per-node rank; ranks come from MPI here (mpirun/srun)"},
    {"--empty-unused-memory-level", ArgParser::Nargs::one, kMemory},
    {"--manual-gc", ArgParser::Nargs::zero, "Python garbage collection; there is none here"},
    {"--manual-gc-interval", ArgParser::Nargs::one,
     "Python garbage collection; there is none here"},
    {"--no-manual-gc-eval", ArgParser::Nargs::zero,
     "Python garbage collection; there is none here"},
    {"--train-sync-interval", ArgParser::Nargs::one,
     "a CPU-GPU synchronisation knob of PyTorch's asynchronous launches"},
    {"--num-dataset-builder-threads", ArgParser::Nargs::one,
     "the dataset indices are built by one thread per rank here; the files are the same"},
    {"--use-dist-ckpt", ArgParser::Nargs::zero,
     "deprecated in Megatron-LM too (see --ckpt-format)"},
    {"--ckpt-fully-parallel-save", ArgParser::Nargs::zero,
     "deprecated in Megatron-LM; sharded checkpoints here are written by every rank already"},
    {"--no-ckpt-fully-parallel-save", ArgParser::Nargs::zero,
     "how torch_dist spreads the writes; the sharded format here is always reshardable"},
    {"--ckpt-fully-parallel-load", ArgParser::Nargs::zero,
     "how torch_dist spreads the reads; the loaded values are the same"},
    {"--ckpt-assume-constant-structure", ArgParser::Nargs::zero,
     "a torch_dist save-planning cache; the files here are the same"},
    {"--use-persistent-ckpt-worker", ArgParser::Nargs::zero,
     "a torch_dist async-save worker process; --async-save here uses a thread"},
    {"--log-throughput", ArgParser::Nargs::zero,
     "the log line here always reports throughput: TFLOP/s and tokens/s per GPU"},
    {"--no-one-logger", ArgParser::Nargs::zero, "NVIDIA's internal one_logger is not part of this"},
    {"--enable-experimental", ArgParser::Nargs::zero,
     "the experimental features it gates are not part of this build"},
    {"--cpu-offloading-num-layers", ArgParser::Nargs::one,
     "activation offloading saves memory, not arithmetic; not done here"},
    {"--distribute-saved-activations", ArgParser::Nargs::zero,
     "spreading recomputed activations over TP saves memory, not arithmetic; not done here"},
    {"--use-cpu-initialization", ArgParser::Nargs::zero,
     "initial weights here are already the same for every TP layout (each element draws from its "
     "index in the full tensor)"},
    {"--delay-wgrad-compute", ArgParser::Nargs::zero,
     "when the weight gradient is computed does not change it"},
    {"--overlap-moe-expert-parallel-comm", ArgParser::Nargs::zero,
     "overlapping the expert all-to-all does not change results"},
    {"--no-mmap-bin-files", ArgParser::Nargs::zero,
     "the .bin files are memory-mapped; reading them otherwise gives the same tokens"},
    {"--no-create-attention-mask-in-dataloader", ArgParser::Nargs::zero,
     "masks here are causal plus document ids and are never materialised in the loader"},
};

// ---- Megatron flags whose feature changes the results and is not built here: a clear error
// naming the feature (docs/flags.md "refused"). ----
struct RefusedFlag {
  const char* name;
  ArgParser::Nargs nargs;
  const char* feature;
};
const RefusedFlag kRefusedFlags[] = {
    {"--use-torch-optimizer-for-cpu-offload", ArgParser::Nargs::zero,
     "torch.optim as the host optimizer (the host update here is the CPU platform's adamw_step, "
     "which --optimizer-cpu-offload uses)"},
    {"--use-legacy-models", ArgParser::Nargs::zero,
     "Megatron-LM's legacy (non-Core) models; this build has the Megatron-Core GPTModel only"},
    {"--rampup-batch-size", ArgParser::Nargs::many, "batch-size ramp-up"},
    {"--decoupled-lr", ArgParser::Nargs::one,
     "a separate learning rate for the input and output layers"},
    {"--decoupled-min-lr", ArgParser::Nargs::one,
     "a separate learning rate for the input and output layers"},
    {"--multi-latent-attention", ArgParser::Nargs::zero, "multi-latent attention (MLA)"},
    {"--q-lora-rank", ArgParser::Nargs::one, "multi-latent attention (MLA)"},
    {"--kv-lora-rank", ArgParser::Nargs::one, "multi-latent attention (MLA)"},
    {"--qk-head-dim", ArgParser::Nargs::one, "multi-latent attention (MLA)"},
    {"--qk-pos-emb-head-dim", ArgParser::Nargs::one, "multi-latent attention (MLA)"},
    {"--v-head-dim", ArgParser::Nargs::one, "multi-latent attention (MLA)"},
    {"--mtp-num-layers", ArgParser::Nargs::one, "multi-token prediction (MTP)"},
    {"--mtp-loss-scaling-factor", ArgParser::Nargs::one, "multi-token prediction (MTP)"},
    {"--moe-input-jitter-eps", ArgParser::Nargs::one, "MoE input jitter"},
    {"--moe-pad-expert-input-to-capacity", ArgParser::Nargs::zero,
     "padding expert inputs to capacity"},
    {"--moe-shared-expert-overlap", ArgParser::Nargs::zero,
     "running shared experts after the router (it reorders gradient sums)"},
    {"--moe-enable-deepep", ArgParser::Nargs::zero, "the DeepEP (flex) token dispatcher"},
    {"--moe-use-upcycling", ArgParser::Nargs::zero, "dense-to-MoE upcycling"},
    {"--grad-reduce-in-bf16", ArgParser::Nargs::zero,
     "bf16 gradient reduction (gradients are accumulated and reduced in fp32 here)"},
    {"--fp32-residual-connection", ArgParser::Nargs::zero, "fp32 residual connections"},
    {"--apply-query-key-layer-scaling", ArgParser::Nargs::zero, "query-key layer scaling"},
    {"--apply-residual-connection-post-layernorm", ArgParser::Nargs::zero,
     "post-layernorm residual connections"},
    {"--openai-gelu", ArgParser::Nargs::zero, "OpenAI's GELU"},
    {"--quick-geglu", ArgParser::Nargs::zero, "the quick-GEGLU activation"},
    {"--init-method-xavier-uniform", ArgParser::Nargs::zero, "Xavier-uniform initialisation"},
    {"--embedding-init-method-std", ArgParser::Nargs::one,
     "a separate embedding initialisation std"},
    {"--window-size", ArgParser::Nargs::one, "sliding-window attention"},
    {"--pipeline-model-parallel-layout", ArgParser::Nargs::one,
     "custom pipeline layouts (use --decoder-first/last-pipeline-num-layers)"},
    {"--account-for-embedding-in-pipeline-split", ArgParser::Nargs::zero,
     "counting the embedding as a layer in the pipeline split"},
    {"--account-for-loss-in-pipeline-split", ArgParser::Nargs::zero,
     "counting the loss as a layer in the pipeline split"},
    {"--num-distributed-optimizer-instances", ArgParser::Nargs::one,
     "several distributed-optimizer instances"},
    {"--data-parallel-random-init", ArgParser::Nargs::zero,
     "different initial weights per data-parallel rank"},
    {"--use-checkpoint-args", ArgParser::Nargs::zero,
     "taking model flags from the checkpoint (give them, or --yaml-cfg the model_args.yaml "
     "convert_checkpoint writes)"},
    {"--iterations-to-skip", ArgParser::Nargs::many, "skipping iterations"},
    {"--adlr-autoresume", ArgParser::Nargs::zero, "ADLR autoresume"},
    {"--sft", ArgParser::Nargs::zero, "supervised fine-tuning datasets"},
    {"--data-args-path", ArgParser::Nargs::one,
     "reading --data-path from a file (pass the list itself, or use --yaml-cfg)"},
    {"--per-split-data-args-path", ArgParser::Nargs::one,
     "reading per-split data paths from a file (use --yaml-cfg)"},
};

void add_megatron_compat_flags(ArgParser& p, std::vector<std::string>& notices) {
  for (const auto& f : kNoEffectFlags) {
    const std::string name = f.name, why = f.why;
    p.add(
        name, f.nargs,
        [&notices, name, why](const auto& v) {
          std::string shown = name;
          for (const auto& x : v) shown += " " + x;
          notices.push_back(shown + ": no effect here (" + why + ")");
        },
        std::string("accepted, no effect here: ") + why);
  }
  for (const auto& f : kRefusedFlags) {
    const std::string name = f.name, feature = f.feature;
    p.add(
        name, f.nargs,
        [name, feature](const auto&) {
          MG_THROW(name << ": " << feature
                        << " is not implemented in this build (Megatron-LM's flag; it would "
                           "change the results, so it is refused rather than ignored; see "
                           "docs/flags.md)");
        },
        "refused: " + feature + " is not implemented");
  }
}

// Deprecated spellings and the flags that only select what is already the behaviour here; each
// leaves one start-up line in a.notices.
void resolve_megatron_aliases(Arguments& a, const Pending& x, bool fp32_grads) {
  // validate_args: --use-rotary-position-embeddings sets rope; --no-position-embedding is
  // refused unless rope.
  if (x.use_rotary_position_embeddings)
    a.model.position_embedding_type = PositionEmbeddingType::rope;
  MG_CHECK(
      !x.no_position_embedding || a.model.position_embedding_type == PositionEmbeddingType::rope,
      "--no-position-embedding is deprecated (Megatron-LM refuses it too unless RoPE is "
      "used); use --position-embedding-type none");
  if (x.use_flash_attn)  // Megatron's deprecated switch for its flash backend
    a.notices.push_back(
        "--use-flash-attn: no FlashAttention library here; attention runs --attention-backend " +
        a.attention_backend +
        " (auto: cuDNN fused attention where it serves the call, else our flash-style kernels: "
        "online softmax in fp32, saving the output and logsumexp, never the probabilities)");
  if (x.attention_softmax_in_fp32)
    a.notices.push_back(
        "--attention-softmax-in-fp32: no effect here (the attention softmax is always fp32)");
  if (x.transformer_impl)
    a.notices.push_back("--transformer-impl " + *x.transformer_impl +
                        ": no effect here (one implementation of each layer: the platform's "
                        "kernels with Megatron-Core's layer math and parameter names)");
  if (fp32_grads)
    a.notices.push_back(
        "--accumulate-allreduce-grads-in-fp32: already the behaviour here (gradients are "
        "accumulated in an fp32 main_grad buffer and reduced in fp32, bf16/fp16 runs included)");
}

void check(bool ok, ArgParser& p, const char* a, const char* b) {
  MG_CHECK(ok, a << " and " << b << " conflict; give only one of them");
  (void)p;
}

// FP8 GEMMs need M, N, K multiples of 16 (cuBLASLt; Transformer Engine asserts the same): the
// sizes every FP8 linear's GEMMs take, per tensor-parallel rank, checked before any work.
void check_fp8_sizes(const Arguments& a) {
  if (!a.model.fp8.enabled()) return;
  const auto& m = a.model;
  const int64_t tp = a.parallel.tensor_model_parallel_size;
  const int64_t tokens =
      m.seq_length / a.parallel.context_parallel_size * a.training.micro_batch_size;
  const std::pair<const char*, int64_t> sizes[] = {
      {"--hidden-size", m.hidden_size},
      {"the FFN size per tensor-parallel rank (fc1 output / TP)", m.fc1_output_size() / tp},
      {"the query projection per tensor-parallel rank", m.query_projection_size() / tp},
      {"the key / value projection per tensor-parallel rank", m.kv_projection_size() / tp},
      {"tokens per micro-batch (--seq-length / CP x --micro-batch-size)", tokens}};
  for (const auto& [what, v] : sizes)
    MG_CHECK(v % 16 == 0, "--fp8-format: " << what << " is " << v
                                           << "; FP8 GEMMs need multiples of 16 (cuBLASLt, as "
                                              "Transformer Engine asserts)");
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
  add_ddp_flags(p, a.ddp, a);
  add_monitoring_flags(p, a.monitoring);
  add_moe_flags(p, a.model, a, x);
  add_fp8_flags(p, a.model.fp8, x);
  add_megatron_alias_flags(p, a, x);
  add_megatron_compat_flags(p, a.notices);
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
  {
    // Start-up lines: repeated flags first, then the no-effect flags (already in a.notices).
    std::vector<std::string> lines;
    auto join = [](const std::vector<std::string>& v) {
      std::string out;
      for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
      return out.empty() ? std::string("(switch)") : out;
    };
    for (const auto& o : p.overrides())
      lines.push_back(o.name + " given more than once: " + join(o.before) + " then " +
                      join(o.after) + "; the last value applies (as in Megatron-LM's argparse)");
    for (auto& n : a.notices)
      if (std::find(lines.begin(), lines.end(), n) == lines.end()) lines.push_back(n);
    a.notices = std::move(lines);
  }
  resolve_megatron_aliases(a, x, p.given("--accumulate-allreduce-grads-in-fp32"));

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
                 !p.given("--rotary-interleaved") && !p.given("--use-rope-scaling") &&
                 !p.given("--rotary-seq-len-interpolation-factor"),
             "--rotary-* flags need --position-embedding-type rope (got "
                 << transformer::to_string(a.model.position_embedding_type) << ")");
  check_fp8_flags(p, a.model.fp8, x);
  MG_CHECK(!a.checkpoint.finetune || a.checkpoint.load,
           "--finetune needs --load DIR (the model to start from)");
  {  // RoPE scaling: one kind, and no flag of a kind that is not chosen.
    const int kinds = (x.yarn ? 1 : 0) + (x.use_rope_scaling ? 1 : 0) +
                      (x.rotary_seq_len_interpolation_factor ? 1 : 0);
    MG_CHECK(kinds <= 1,
             "--position-embedding-type yarn, --use-rope-scaling and "
             "--rotary-seq-len-interpolation-factor are different RoPE scalings; give "
             "one");
    for (const char* f :
         {"--rope-scaling-factor", "--rope-scaling-low-freq-factor",
          "--rope-scaling-high-freq-factor", "--rope-scaling-original-max-position-embeddings"})
      MG_CHECK(x.use_rope_scaling || !p.given(f), f << " needs --use-rope-scaling");
    for (const char* f : {"--yarn-rotary-scaling-factor", "--yarn-original-max-position-embeddings",
                          "--yarn-beta-fast", "--yarn-beta-slow", "--yarn-mscale",
                          "--yarn-mscale-all-dim", "--no-yarn-correction-range-round-to-int"})
      MG_CHECK(x.yarn || !p.given(f), f << " needs --position-embedding-type yarn");
    if (x.use_rope_scaling) {
      a.model.rope_scaling = x.llama3;
      a.model.rope_scaling.type = ops::RopeScalingType::llama3;
    } else if (x.yarn) {
      a.model.rope_scaling = x.yarn_scaling;
      a.model.rope_scaling.type = ops::RopeScalingType::yarn;
    } else if (x.rotary_seq_len_interpolation_factor) {
      a.model.rope_scaling.type = ops::RopeScalingType::linear;
      a.model.rope_scaling.factor = *x.rotary_seq_len_interpolation_factor;
    }
    ops::validate_rope_scaling(a.model.rope_scaling, "RoPE scaling flags");
  }

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
  // FSDP: --use-torch-fsdp2 is the ZeRO-3 engine; every strategy above no_shard shards the
  // optimizer state (the distributed optimizer's).
  if (a.use_torch_fsdp2) {
    MG_CHECK(!p.given("--data-parallel-sharding-strategy") ||
                 a.ddp.sharding_strategy == distributed::ShardingStrategy::optim_grads_params,
             "--use-torch-fsdp2 shards parameters, gradients and optimizer state "
             "(optim_grads_params); got --data-parallel-sharding-strategy "
                 << distributed::to_string(a.ddp.sharding_strategy));
    a.ddp.use_megatron_fsdp = true;
    a.ddp.sharding_strategy = distributed::ShardingStrategy::optim_grads_params;
  }
  MG_CHECK(a.ddp.use_megatron_fsdp || !p.given("--data-parallel-sharding-strategy"),
           "--data-parallel-sharding-strategy needs --use-megatron-fsdp (or --use-torch-fsdp2)");
  if (a.ddp.use_megatron_fsdp && a.ddp.sharding_strategy != distributed::ShardingStrategy::no_shard)
    a.ddp.use_distributed_optimizer = true;
  a.parallel.validate(a.model,
                      static_cast<int>(x.virtual_pipeline_model_parallel_size.value_or(1)));
  // Megatron: "--fp8-param-gather only supported with distributed optimizer" (or FSDP, which
  // implies it here): the FP8 parameters are re-cast from the optimizer's master shards.
  MG_CHECK(!a.model.fp8.param_gather || a.ddp.use_distributed_optimizer,
           "--fp8-param-gather needs --use-distributed-optimizer (or --use-megatron-fsdp / "
           "--use-torch-fsdp2): the FP8 parameters are cast from the distributed optimizer's "
           "master-weight shards after each step");
  MG_CHECK(!a.model.fp8.param_gather || !a.optimizer.optimizer_cpu_offload,
           "--fp8-param-gather with --optimizer-cpu-offload: not built (the FP8 cast reads the "
           "master weights on the device)");

  if (a.model.fp8.dot_product_attention) {  // docs/fp8.md "FP8 attention"
    // The flag the user gave (--fp8-multi-head-attention implies the other).
    const std::string flag = a.model.fp8.multi_head_attention ? "--fp8-multi-head-attention"
                                                              : "--fp8-dot-product-attention";
    MG_CHECK(a.model.fp8.recipe == fp8::Fp8Recipe::delayed,
             flag << " needs --fp8-recipe delayed (FP8 attention under the tensorwise recipe is "
                     "not built), got --fp8-recipe "
                  << fp8::recipe_name(a.model.fp8.recipe));
    MG_CHECK(a.parallel.context_parallel_size == 1,
             flag << " with --context-parallel-size " << a.parallel.context_parallel_size
                  << ": FP8 attention across the context-parallel ring is not built (use 1)");
    MG_CHECK(a.model.attention_dropout == 0.0,
             flag << " needs --attention-dropout 0 (FP8 attention with dropout is not built), got "
                  << a.model.attention_dropout);
    MG_CHECK(!a.data.reset_attention_mask,
             flag << " with --reset-attention-mask: FP8 attention with document masks is not "
                     "built");
    // Transformer Engine's switch for the FP8 attention's backward (its environment variable).
    if (const char* e = std::getenv("NVTE_FP8_DPA_BWD")) {
      const std::string v = e;
      MG_CHECK(v == "0" || v == "1",
               "NVTE_FP8_DPA_BWD=" << v
                                   << ": expected 1 (the FP8 attention's backward in FP8, the "
                                      "default) or 0 (in the model dtype)");
      a.model.fp8.dot_product_attention_fp8_backward = v == "1";
    }
  }
  MG_CHECK(a.training.micro_batch_size >= 1, "--micro-batch-size is required and must be >= 1 (got "
                                                 << a.training.micro_batch_size << ")");
  check_fp8_sizes(a);
  if (a.training.global_batch_size == 0)
    a.training.global_batch_size = a.training.micro_batch_size * a.training.data_parallel_size;
  a.training.validate();
  MG_CHECK(a.distributed_timeout_minutes > 0,
           "--distributed-timeout-minutes must be > 0, got " << a.distributed_timeout_minutes);
  a.ddp.validate();
  a.checkpoint.validate();
  a.logging.validate();
  a.monitoring.validate();

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
