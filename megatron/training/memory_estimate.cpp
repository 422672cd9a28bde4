// The per-rank memory estimate (memory_estimate.h).
#include "megatron/training/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/pipeline_parallel/layer_layout.h"
#include "megatron/core/tensor/dtype.h"

namespace mg::training {
namespace {

using transformer::Normalization;
using transformer::PositionEmbeddingType;
using transformer::TransformerConfig;

double norm_params(const TransformerConfig& c, int64_t width) {
  return static_cast<double>(c.normalization == Normalization::layernorm ? 2 * width : width);
}

// Parameters of an MLP of FFN size f, TP-sharded (dense layers and shared experts).
double mlp_params(const TransformerConfig& c, int64_t f, int64_t tp) {
  const double h = static_cast<double>(c.hidden_size);
  const double rows =
      static_cast<double>(c.gated_linear_unit() ? 2 * f : f) / static_cast<double>(tp);
  const double fl = static_cast<double>(f) / static_cast<double>(tp);
  double n = rows * h + h * fl;
  if (c.add_bias_linear) n += rows + h;
  return n;
}

// Parameters of the routed experts of decoder layer `layer` (global index) on one rank (E / EP
// local experts, each split over expert TP; 0 for a dense layer).
double expert_params(const TransformerConfig& c, int64_t layer, const MemoryLayout& l) {
  if (!c.is_moe_layer(layer)) return 0.0;
  const double h = static_cast<double>(c.hidden_size);
  const int64_t fe = c.expert_ffn_hidden_size();
  const double local = static_cast<double>(c.num_moe_experts / std::max<int64_t>(l.ep, 1));
  return local *
         (static_cast<double>(c.gated_linear_unit() ? 2 * fe : fe) * h +
          h * static_cast<double>(fe)) /
         static_cast<double>(std::max<int64_t>(l.etp, 1));
}

// Parameters of decoder layer `layer` (global index) on one rank.
double layer_params(const TransformerConfig& c, int64_t layer, const MemoryLayout& l) {
  const double h = static_cast<double>(c.hidden_size);
  const double tp = static_cast<double>(l.tp);
  double n = 2 * norm_params(c, c.hidden_size);  // input_layernorm, pre_mlp_layernorm
  const double qkv = static_cast<double>(c.qkv_projection_size()) / tp;
  n += qkv * h + (c.add_bias_linear || c.add_qkv_bias ? qkv : 0.0);
  if (c.qk_layernorm) n += 2 * norm_params(c, c.kv_channels);
  n += static_cast<double>(c.query_projection_size()) / tp * h + (c.add_bias_linear ? h : 0.0);
  if (!c.is_moe_layer(layer)) return n + mlp_params(c, c.ffn_hidden_size, l.tp);
  n += static_cast<double>(c.num_moe_experts) * h;  // router
  n += expert_params(c, layer, l);
  if (c.moe_shared_expert_intermediate_size > 0)
    n += mlp_params(c, c.moe_shared_expert_intermediate_size, l.tp);
  return n;
}

// --fp8-param-gather: the FP8 linears' weight elements of decoder layer `layer` on one rank (QKV,
// projection, fc1, fc2 and a shared expert's; 0 for a layer --first-last-layers-bf16 keeps out).
double fp8_weight_params(const TransformerConfig& c, int64_t layer, const MemoryLayout& l) {
  if (!c.fp8.layer_in_fp8(layer, c.num_layers)) return 0.0;
  const double h = static_cast<double>(c.hidden_size);
  const double tp = static_cast<double>(l.tp);
  auto mlp_weights = [&](int64_t f) {
    const double rows = static_cast<double>(c.gated_linear_unit() ? 2 * f : f) / tp;
    return rows * h + h * static_cast<double>(f) / tp;
  };
  double n = static_cast<double>(c.qkv_projection_size()) / tp * h +
             static_cast<double>(c.query_projection_size()) / tp * h;
  if (!c.is_moe_layer(layer)) return n + mlp_weights(c.ffn_hidden_size);
  if (c.moe_shared_expert_intermediate_size > 0)
    n += mlp_weights(c.moe_shared_expert_intermediate_size);
  return n;
}

// Bytes one micro-batch keeps for layer `layer` between its forward and backward, over `tokens`
// local tokens (activation dtype `a` bytes per element).
double layer_activation_bytes(const TransformerConfig& c, int64_t layer, const MemoryLayout& l,
                              double tokens, double a) {
  const double h = static_cast<double>(c.hidden_size);
  const double tp = static_cast<double>(l.tp);
  const double sp = l.sequence_parallel ? tp : 1.0;
  if (c.layer_recomputed(layer)) return tokens * h / sp * a;  // the layer's input only
  // Layer input, norm1 output, the residual after attention, norm2 output.
  double elems = 4 * h / sp;
  elems += static_cast<double>(c.qkv_projection_size()) / tp;          // q, k, v
  elems += static_cast<double>(c.query_projection_size()) / tp;        // attention context
  double f32_elems = static_cast<double>(c.num_attention_heads) / tp;  // log-sum-exp
  if (!c.is_moe_layer(layer)) {
    elems += static_cast<double>(c.fc1_output_size() + c.ffn_hidden_size) / tp;
  } else {
    const double k = static_cast<double>(c.moe_router_topk);
    const int64_t fe = c.expert_ffn_hidden_size();
    // Dispatched copies of the tokens, fc1 and activation outputs of the routed experts.
    elems += k * (h + static_cast<double>((c.gated_linear_unit() ? 2 * fe : fe) + fe));
    f32_elems += static_cast<double>(c.num_moe_experts) + k;  // router logits, probabilities
    if (c.moe_shared_expert_intermediate_size > 0) {
      const int64_t fs = c.moe_shared_expert_intermediate_size;
      elems += static_cast<double>((c.gated_linear_unit() ? 2 * fs : fs) + fs) / tp;
    }
  }
  const double mask_bytes = c.hidden_dropout > 0.0 ? 2 * h / sp : 0.0;  // one byte per element
  return tokens * (elems * a + f32_elems * 4 + mask_bytes);
}

std::string flag_value(const char* flag, double v) {
  std::ostringstream s;
  s << flag << " " << static_cast<int64_t>(v);
  return s.str();
}

}  // namespace

MemoryLayout memory_layout(const Arguments& args, int64_t world_size) {
  const auto& p = args.parallel;
  MemoryLayout l;
  l.tp = p.tensor_model_parallel_size;
  l.pp = p.pipeline_model_parallel_size;
  l.cp = p.context_parallel_size;
  l.ep = p.expert_model_parallel_size;
  l.etp = args.model.num_moe_experts > 0
              ? p.expert_tensor_parallel_size.value_or(p.tensor_model_parallel_size)
              : 1;
  l.sequence_parallel = p.sequence_parallel;
  const int64_t mp = l.tp * l.pp * l.cp;
  MG_CHECK(world_size >= 1 && mp >= 1 && world_size % mp == 0,
           "world size " << world_size << " is not a multiple of tensor (" << l.tp
                         << ") x pipeline (" << l.pp << ") x context (" << l.cp
                         << ") parallel sizes");
  l.dp = world_size / mp;
  l.vp = p.virtual_pipeline_model_parallel_size;
  if (p.num_layers_per_virtual_pipeline_stage && *p.num_layers_per_virtual_pipeline_stage > 0)
    l.vp = args.model.num_layers / l.pp / *p.num_layers_per_virtual_pipeline_stage;
  l.vp = std::max<int64_t>(l.vp, 1);
  const int64_t mbs = std::max<int64_t>(args.training.micro_batch_size, 1);
  const int64_t gbs =
      args.training.global_batch_size > 0 ? args.training.global_batch_size : mbs * l.dp;
  l.num_microbatches = std::max<int64_t>(gbs / (mbs * l.dp), 1);
  return l;
}

ShardingDivisors sharding_divisors(const Arguments& args, const MemoryLayout& layout) {
  ShardingDivisors d;
  const int64_t shard = layout.dp * layout.cp;  // the data-parallel (dp-cp) group
  if (args.ddp.use_distributed_optimizer) d.optimizer_state = shard;
  if (args.ddp.shards_grads()) d.gradients = shard;
  if (args.ddp.shards_params()) d.parameters = shard;
  // Routed experts: sharded over the expert data-parallel group, world / (expert TP x EP x PP)
  // ranks, instead.
  const int64_t expert_dp =
      std::max<int64_t>(layout.tp * layout.dp * layout.cp / (layout.ep * layout.etp), 1);
  if (args.ddp.use_distributed_optimizer) d.expert_optimizer_state = expert_dp;
  if (args.ddp.shards_grads()) d.expert_gradients = expert_dp;
  if (args.ddp.shards_params()) d.expert_parameters = expert_dp;
  return d;
}

MemoryEstimate estimate_memory(const Arguments& args, int64_t vocab_size,
                               const MemoryLayout& layout, int64_t pipeline_rank) {
  const TransformerConfig& c = args.model;
  MG_CHECK(pipeline_rank >= 0 && pipeline_rank < layout.pp,
           "pipeline rank " << pipeline_rank << " is outside [0, " << layout.pp << ")");
  const auto pl = pipeline_parallel::make_pipeline_layout(
      c.num_layers, static_cast<int>(layout.pp),
      args.parallel.num_layers_per_virtual_pipeline_stage
          ? 1
          : static_cast<int>(args.parallel.virtual_pipeline_model_parallel_size),
      args.parallel.num_layers_per_virtual_pipeline_stage,
      args.parallel.decoder_first_pipeline_num_layers,
      args.parallel.decoder_last_pipeline_num_layers);
  const auto chunks = pl.chunks(static_cast<int>(pipeline_rank));
  bool pre = false, post = false;
  for (const auto& ch : chunks) pre |= ch.pre_process, post |= ch.post_process;

  MemoryEstimate e;
  e.pipeline_rank = pipeline_rank;
  e.divisors = sharding_divisors(args, layout);
  const double h = static_cast<double>(c.hidden_size);
  const double tp = static_cast<double>(layout.tp);
  const double vpad = static_cast<double>(c.padded_vocab_size(vocab_size, layout.tp));
  const bool tied = !c.untie_embeddings_and_output_weights;

  // Parameters.
  double n = 0;
  if (pre || (tied && post)) n += vpad / tp * h;  // word embedding (or the tied copy)
  if (pre && c.position_embedding_type == PositionEmbeddingType::learned_absolute)
    n += static_cast<double>(c.max_position_embeddings) * h;
  for (const auto& ch : chunks)
    for (int64_t i = ch.layer_offset; i < ch.layer_offset + ch.num_layers; ++i)
      n += layer_params(c, i, layout);
  if (post) n += norm_params(c, c.hidden_size) + (tied ? 0.0 : vpad / tp * h);
  e.num_parameters = n;
  double ne = 0;  // of which routed experts (sharded over the expert data-parallel group)
  for (const auto& ch : chunks)
    for (int64_t i = ch.layer_offset; i < ch.layer_offset + ch.num_layers; ++i)
      ne += expert_params(c, i, layout);
  const double nd = n - ne;
  const ShardingDivisors& dv = e.divisors;
  auto sharded = [nd, ne](int64_t dense, int64_t expert) {
    return nd / static_cast<double>(dense) + ne / static_cast<double>(expert);
  };

  const DType pdt = c.params_dtype;
  const double p_bytes = static_cast<double>(dtype_size(pdt));
  const double g_bytes = static_cast<double>(dtype_size(c.grad_dtype()));
  const bool mixed = pdt == DType::bf16 || pdt == DType::f16;
  const double master_bytes = mixed ? 4.0 : p_bytes;  // the master (and moment) dtype
  e.parameter_bytes = sharded(dv.parameters, dv.expert_parameters) * p_bytes;
  if (c.fp8.enabled() && c.fp8.param_gather) {
    // FP8 parameters: 1 byte per element (Megatron's FP8 parameter buffer), on top of the
    // model-dtype flat buffer, which here keeps their slots (docs/fp8.md "FP8 parameters").
    for (const auto& ch : chunks)
      for (int64_t i = ch.layer_offset; i < ch.layer_offset + ch.num_layers; ++i)
        e.num_fp8_parameters += fp8_weight_params(c, i, layout);
    e.parameter_bytes += e.num_fp8_parameters / static_cast<double>(dv.parameters);
  }
  e.gradient_bytes = sharded(dv.gradients, dv.expert_gradients) * g_bytes;
  const double moments = args.optimizer.optimizer == "sgd" ? 1.0 : 2.0;
  e.optimizer_bytes = sharded(dv.optimizer_state, dv.expert_optimizer_state) *
                      ((mixed ? 4.0 : 0.0) + moments * master_bytes);
  if (layout.optimizer_offload) {
    // The offloaded fraction of this rank's optimizer elements: their masters (f32/f64 models
    // keep a host copy too), moments, and the gradient (and model-weight) staging.
    const double f = args.optimizer.optimizer_offload_fraction;
    const double owned = sharded(dv.optimizer_state, dv.expert_optimizer_state);
    e.host_optimizer_bytes =
        f * (owned * (master_bytes + moments * master_bytes + g_bytes + (mixed ? p_bytes : 0.0)));
    e.optimizer_bytes *= 1.0 - f;
  }
  // FSDP's unsharded copies in flight (DistributedDataParallel): ZeRO-3 gathers a bucket (about
  // a layer, the embeddings alone; bounded here by the largest unit, or --ddp-bucket-size) and
  // prefetches the next under
  // --overlap-param-gather; ZeRO-2/3 hold the full gradients of a bucket until it is
  // reduce-scattered: with per-micro-batch reduction two whole buckets, beside a shard
  // accumulator that stands for this rank's own range (given back between micro-batches, it is
  // gradient_bytes' shard); with one reduction a step every bucket's rest.
  const double shard = static_cast<double>(layout.dp * layout.cp);
  if (args.ddp.shards_grads() && shard > 1) {
    double layer = 0;  // the default bucket: about one layer (parallelize.cpp)
    for (const auto& ch : chunks)
      for (int64_t i = ch.layer_offset; i < ch.layer_offset + ch.num_layers; ++i)
        layer = std::max(layer, layer_params(c, i, layout));
    double largest = layer;  // the embeddings (or the untied head) get a bucket of their own
    if (post)
      largest = std::max(largest, norm_params(c, c.hidden_size) + (tied ? 0.0 : vpad / tp * h));
    if (pre) largest = std::max(largest, vpad / tp * h);
    if (args.ddp.bucket_size) layer = largest = static_cast<double>(*args.ddp.bucket_size);
    if (layer == 0) layer = largest;
    const double rest = 1.0 - 1.0 / shard;  // the part of a bucket that is not this rank's
    const bool per_microbatch = args.ddp.overlap_grad_reduce && layout.pp == 1;
    // Gradients in flight at once: the largest bucket and the next one (being written / reduced).
    // A tied embedding's bucket is written first (the head) and last (the lookup), so it stays
    // whole through the backward beside those two layer buckets.
    const double in_flight = pre && post && tied ? largest + 2 * layer : largest + layer;
    e.fsdp_gradient_bytes =
        (per_microbatch ? std::min(n, in_flight) * g_bytes : n * rest * g_bytes);
    if (args.ddp.shards_params())
      e.fsdp_parameter_bytes =
          std::min(n, largest + (args.ddp.overlap_param_gather ? layer : 0.0)) * rest * p_bytes;
  }

  // Activations of one micro-batch.
  const double tokens = static_cast<double>(c.seq_length) / static_cast<double>(layout.cp) *
                        static_cast<double>(std::max<int64_t>(args.training.micro_batch_size, 1));
  const double a = p_bytes;  // activations are stored in the params dtype
  const double sp = layout.sequence_parallel ? tp : 1.0;
  double stack = 0, one_layer = 0;
  for (const auto& ch : chunks)
    for (int64_t i = ch.layer_offset; i < ch.layer_offset + ch.num_layers; ++i) {
      stack += layer_activation_bytes(c, i, layout, tokens, a);
      TransformerConfig full = c;
      full.recompute_granularity = transformer::RecomputeGranularity::none;
      one_layer = std::max(one_layer, layer_activation_bytes(full, i, layout, tokens, a));
      ++e.layers;
    }
  e.activation_bytes_per_layer = one_layer;
  double embedding = 0;
  if (pre) embedding = tokens * (h * a + (c.hidden_dropout > 0.0 ? h : 0.0));
  if (post) {
    e.logits_bytes = tokens * vpad / tp * (a + 4.0);  // logits and the f32 softmax
    stack += tokens * h / sp * a;                     // the final norm's output
  }
  // Micro-batches a stage holds at once.
  const int64_t m = layout.num_microbatches;
  double in_flight = 1;
  if (layout.pp > 1 && layout.vp == 1) {
    in_flight = static_cast<double>(std::min(layout.pp - pipeline_rank, m));
  } else if (layout.pp > 1) {
    const int64_t chunks_in_flight = std::min(
        (layout.pp - pipeline_rank - 1) * 2 + (layout.vp - 1) * layout.pp + 1, m * layout.vp);
    in_flight = static_cast<double>(chunks_in_flight) / static_cast<double>(layout.vp);
  }
  e.microbatches_in_flight_exact = in_flight;
  e.microbatches_in_flight = static_cast<int64_t>(in_flight + 0.999999);
  e.activation_bytes = (stack + embedding) * in_flight + e.logits_bytes;

  // Workspace: backward's transients of one layer, the logits gradient, the batch tensors.
  e.workspace_bytes = one_layer + (post ? tokens * vpad / tp * 4.0 : 0.0) + tokens * 4 * 8.0;
  return e;
}

MemoryEstimate estimate_peak_memory(const Arguments& args, int64_t vocab_size,
                                    const MemoryLayout& layout) {
  MemoryEstimate best;
  for (int64_t p = 0; p < layout.pp; ++p) {
    MemoryEstimate e = estimate_memory(args, vocab_size, layout, p);
    if (p == 0 || e.total_bytes() > best.total_bytes()) best = e;
  }
  return best;
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) bytes /= 1024.0, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[u]);
  return buf;
}

std::string MemoryEstimate::str() const {
  std::ostringstream s;
  auto per = [](int64_t d, const char* what) {
    return d > 1 ? " (/" + std::to_string(d) + " " + what + ")" : std::string();
  };
  s << "parameters " << format_bytes(parameter_bytes) << per(divisors.parameters, "FSDP")
    << ", gradients " << format_bytes(gradient_bytes) << per(divisors.gradients, "FSDP")
    << ", optimizer state " << format_bytes(optimizer_bytes)
    << per(divisors.optimizer_state, "distributed optimizer")
    << (host_optimizer_bytes > 0
            ? " (+ " + format_bytes(host_optimizer_bytes) + " in host memory, offloaded)"
            : std::string())
    << (fsdp_parameter_bytes + fsdp_gradient_bytes > 0
            ? ", FSDP in flight " + format_bytes(fsdp_parameter_bytes + fsdp_gradient_bytes) +
                  " (gathered parameters " + format_bytes(fsdp_parameter_bytes) +
                  ", unsharded gradients " + format_bytes(fsdp_gradient_bytes) + ")"
            : std::string())
    << ", activations " << format_bytes(activation_bytes) << " (" << layers << " layers, "
    << microbatches_in_flight << " micro-batch(es) in flight"
    << (logits_bytes > 0 ? ", logits " + format_bytes(logits_bytes) : std::string())
    << "), workspace " << format_bytes(workspace_bytes) << " = " << format_bytes(total_bytes());
  return s.str();
}

std::string MemoryEstimate::driving_flags(const Arguments& args) const {
  const auto& c = args.model;
  const double state = parameter_bytes + gradient_bytes + optimizer_bytes;
  const double act = activation_bytes + workspace_bytes;
  std::ostringstream s;
  if (act >= state) {
    s << "activations, driven by " << flag_value("--seq-length", static_cast<double>(c.seq_length))
      << " and "
      << flag_value("--micro-batch-size", static_cast<double>(args.training.micro_batch_size));
    if (logits_bytes > 0.5 * activation_bytes) s << " (the vocabulary logits)";
    return s.str();
  }
  s << "parameters, gradients and optimizer state (" << static_cast<int64_t>(num_parameters)
    << " parameters on this rank), driven by ";
  const double pos = c.position_embedding_type == PositionEmbeddingType::learned_absolute
                         ? static_cast<double>(c.max_position_embeddings * c.hidden_size)
                         : 0.0;
  bool max_pos_given = false;
  for (const auto& g : args.given) max_pos_given |= g.first == "--max-position-embeddings";
  if (pos > 0.5 * num_parameters && max_pos_given)
    s << flag_value("--max-position-embeddings", static_cast<double>(c.max_position_embeddings))
      << " (the learned position table)";
  else if (pos > 0.5 * num_parameters)
    s << flag_value("--seq-length", static_cast<double>(c.seq_length))
      << " (the learned position table has --max-position-embeddings = --seq-length rows; "
         "--position-embedding-type rope has none)";
  else
    s << flag_value("--num-layers", static_cast<double>(c.num_layers)) << " and "
      << flag_value("--hidden-size", static_cast<double>(c.hidden_size)) << " ("
      << flag_value("--ffn-hidden-size", static_cast<double>(c.ffn_hidden_size)) << ")";
  return s.str();
}

void check_memory_fits(const MemoryEstimate& estimate, const AvailableMemory& available,
                       const Arguments& args) {
  if (available.bytes <= 0 || estimate.total_bytes() <= available.bytes) return;
  MG_CHECK(false,
           "this run cannot fit in memory: the estimate for pipeline rank "
               << estimate.pipeline_rank << " is " << format_bytes(estimate.total_bytes())
               << " per rank (" << estimate.str() << "), but " << available.what
               << " is available. The largest part is " << estimate.driving_flags(args)
               << "; reduce it, or spread the run over more ranks (tensor, pipeline, "
                  "context parallelism, --use-distributed-optimizer, --recompute-granularity "
                  "full)");
}

}  // namespace mg::training
