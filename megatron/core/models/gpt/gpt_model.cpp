// GPTModel: embedding, decoder (with full/selective recompute), final norm, output layer and
// cross-entropy loss, forward and backward (gpt_model.h).
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/models/gpt/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/models/gpt/gpt_layer_specs.h"
#include "megatron/core/tensor_parallel/cross_entropy.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/tensor_parallel/mappings.h"
#include "megatron/core/tensor_parallel/sharding.h"
#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/transformer/norm.h"
#include "megatron/core/transformer/transformer_layer.h"

namespace mg::models {

using tensor_parallel::ColumnParallelLinear;
using tensor_parallel::VocabParallelEmbedding;
using transformer::AttentionInputs;
using transformer::DropoutCtx;
using transformer::DropoutSite;
using transformer::InitRule;
using transformer::Norm;
using transformer::TransformerConfig;
using transformer::TransformerLayer;
using transformer::Weight;

namespace detail {

struct GPTSaved {
  int chunk = 0;  // the model chunk that ran
  int64_t s = 0, b = 0;
  Tensor tokens, positions, labels;  // [N] on the device, sequence-first (row n = s*B + b)
  std::vector<double> mask;          // [N] host, sequence-first
  AttentionInputs in;
  DropoutCtx rng;
  std::vector<TransformerLayer::Saved> layers;  // the chunk's layers, in order
  Tensor decoder_out, final_ln;                 // [S, B, H] ([S/TP, B, H] under SP)
  ColumnParallelLinear::Saved output_layer;     // TP > 1: its input in the TP region [S, B, H]
  Norm::Saved final_norm;
  Tensor logits, max, sum_exp, loss;  // [N, V_pad]; [N] x3
};

}  // namespace detail

GPTForwardState::GPTForwardState() = default;
GPTForwardState::~GPTForwardState() = default;
GPTForwardState::GPTForwardState(GPTForwardState&&) noexcept = default;
GPTForwardState& GPTForwardState::operator=(GPTForwardState&&) noexcept = default;
bool GPTForwardState::holds_activations() const {
  return saved_ != nullptr;
}
void GPTForwardState::clear() {
  saved_.reset();
}

struct GPTModel::Impl {
  TransformerConfig config;
  transformer::TransformerBlockSpec spec;
  transformer::ModuleContext ctx;
  transformer::moe::MoEState moe;      // the MoE layers' aux-loss scale and metrics (ctx.moe)
  std::unique_ptr<fp8::Fp8State> fp8;  // the FP8 linears' scaling state (ctx.fp8); null: no FP8
  int64_t vocab = 0, vocab_padded = 0;
  GPTModelParallel parallel;
  tensor_parallel::VocabRange vocab_shard;  // this rank's rows of the padded vocabulary
  int64_t logit_rows = 0;  // output rows with logits: the shard, or its real rows (no padding)
  std::vector<transformer::Parameter> params;
  std::vector<transformer::ParamDecl> decls;
  transformer::ParamAndGradBuffer buffer;
  // embedding.word_embeddings (vocab-parallel), embedding.position_embeddings (learned absolute
  // positions, replicated), output_layer (column-parallel, logits never gathered; no weight of
  // its own when tied to the word embedding).
  std::unique_ptr<VocabParallelEmbedding> word_embeddings;
  Weight position;
  std::unique_ptr<ColumnParallelLinear> output_layer;
  std::vector<std::unique_ptr<TransformerLayer>> layers;  // every chunk's, chunk after chunk
  std::vector<PipelineChunk> chunks;
  std::vector<int64_t> chunk_begin;              // index in `layers` of each chunk's first layer
  bool pre_process = true, post_process = true;  // some chunk has the embedding / the head
  std::unique_ptr<Norm> final_norm;
  // Full recompute: [start, end) layer ranges whose activations are rebuilt in backward.
  std::vector<std::pair<int64_t, int64_t>> recompute_chunks;
  // Grad-ready hook and the parameter indices each backward stage completes.
  GPTModel::GradReadyHook grad_ready;
  std::vector<std::vector<std::size_t>> layer_params;  // per layer (index in `layers`)
  std::vector<std::size_t> head_params;                // output layer (untied) and final norm
  std::vector<std::size_t> embedding_params;           // the rest: embeddings
  // What the head reads: head_params and, when tied on a rank with the embedding, the word
  // embedding (the param-use / param-release hooks' set for the head).
  std::vector<std::size_t> head_use;

  // Param-use hook (forward pre-hook): called before a module first uses these parameters.
  GPTModel::ParamUseHook param_use;
  void use(const std::vector<std::size_t>& indices) const {
    if (param_use && !indices.empty()) param_use(std::span<const std::size_t>(indices));
  }
  // Param-release hook (FSDP): the module that called use() with these is done with them.
  GPTModel::ParamUseHook param_release;
  void release(const std::vector<std::size_t>& indices) const {
    if (param_release && !indices.empty()) param_release(std::span<const std::size_t>(indices));
  }

  // Grad-write hook (FSDP on a device): these parameters' gradients are about to be written.
  GPTModel::ParamUseHook grad_write;
  void will_write_grads(const std::vector<std::size_t>& indices) const {
    if (grad_write && !indices.empty()) grad_write(std::span<const std::size_t>(indices));
  }

  void report_ready(const std::vector<std::size_t>& indices) const {
    if (grad_ready)
      for (std::size_t i : indices) grad_ready(i);
  }

  // Embedding dropout; under SP on this rank's sequence shard at its offset in the full tensor.
  ops::DropoutArgs embedding_dropout(const DropoutCtx& rng, const Tensor& shard) const {
    ops::DropoutArgs a = rng.args(config.hidden_dropout, -1, DropoutSite::embedding);
    if (ctx.sequence_parallel && a.p > 0.0f)
      a.offset = static_cast<uint64_t>(ctx.tp_rank() * shard.numel());
    return a;
  }

  // The output layer gives logits in the model dtype, as Megatron's (bf16 training keeps bf16
  // logits: half the memory of f32 ones for the whole vocabulary); the cross entropy computes in
  // f32 from them and its per-row statistics (loss, max, sum_exp, dloss) are stat_dtype(): f32,
  // f64 for f64.
  DType stat_dtype() const { return ctx.dtype == DType::f64 ? DType::f64 : DType::f32; }
  // The output layer's weight (its own, or the tied word embedding), cut to the rows that
  // produce logits (exclude_vocab_padding); padding rows get no gradient.
  Weight logit_weight() const {
    const Weight& w = config.untie_embeddings_and_output_weights ? output_layer->weight()
                                                                 : word_embeddings->weight();
    if (logit_rows == w.value.size(0)) return w;
    Weight rows = w;
    rows.value = w.value.slice(0, logit_rows);
    rows.grad = w.grad.slice(0, logit_rows);
    return rows;
  }
  // Targets must lie below this (the vocab-parallel cross entropy's check).
  int64_t loss_vocab_end() const { return parallel.exclude_vocab_padding ? vocab : vocab_padded; }

  // Forward/backward pieces (gpt_model.cpp): inputs of a micro-batch, embedding, a chunk's
  // layers, final norm + output layer + loss.
  void prepare(const GPTBatch& batch, detail::GPTSaved& st, const StepRng& rng, bool training,
               bool pre, bool post) const;
  Tensor embed(detail::GPTSaved& st);
  Tensor decoder(int v, Tensor x, detail::GPTSaved& st);
  LossSums head(const Tensor& x, detail::GPTSaved& st);
  Tensor head_bwd(detail::GPTSaved& st, double dloss);
  Tensor decoder_bwd(Tensor dx, detail::GPTSaved& st);
  void embed_bwd(const Tensor& dx, detail::GPTSaved& st);

  // Which recompute chunk holds layer l (-1: none).
  int chunk_of(int64_t l) const {
    for (std::size_t i = 0; i < recompute_chunks.size(); ++i)
      if (l >= recompute_chunks[i].first && l < recompute_chunks[i].second)
        return static_cast<int>(i);
    return -1;
  }
};

GPTModel::GPTModel(const TransformerConfig& config, int64_t vocab_size, const ops::OpTable& ops,
                   Device device)
    : GPTModel(config, vocab_size, ops, device, [&] {
        TransformerConfig c = config;
        c.finalize();
        return get_gpt_decoder_block_spec(c);
      }()) {}

GPTModel::GPTModel(const TransformerConfig& config, int64_t vocab_size, const ops::OpTable& ops,
                   Device device, const transformer::TransformerBlockSpec& spec)
    : GPTModel(config, vocab_size, ops, device, spec, GPTModelParallel{}) {}

GPTModel::GPTModel(const TransformerConfig& config, int64_t vocab_size, const ops::OpTable& ops,
                   Device device, const transformer::TransformerBlockSpec& spec,
                   const GPTModelParallel& parallel)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.config = config;
  m.config.finalize();
  transformer::check_block_spec(spec, m.config);
  m.spec = spec;
  m.ctx.moe = &m.moe;
  const TransformerConfig& c = m.config;
  m.ctx.ops = &ops;
  m.ctx.device = device;
  m.ctx.config = &m.config;
  m.ctx.dtype = c.params_dtype;
  m.ctx.grad_dtype = c.grad_dtype();
  m.parallel = parallel;
  MG_CHECK(!parallel.sequence_parallel || parallel.tp_group != nullptr,
           "sequence parallelism needs a tensor-parallel group");
  m.ctx.tp_group = parallel.tp_group;
  m.ctx.ep_group = parallel.ep_group;
  m.ctx.expert_tp_group = parallel.expert_tp_group;
  m.ctx.inference_only = parallel.inference_only;
  m.ctx.sparse_buffers = parallel.sparse_buffers && !device.is_host();
  m.ctx.cp = parallel.cp;
  m.ctx.tp_cp_group = parallel.tp_cp_group;
  if (c.fp8.enabled()) {
    m.fp8 = std::make_unique<fp8::Fp8State>(c.fp8, ops, device);
    m.ctx.fp8 = m.fp8.get();
  }
  m.ctx.sequence_parallel = parallel.sequence_parallel && m.ctx.tp_size() > 1;
  m.vocab = vocab_size;
  m.vocab_padded = c.padded_vocab_size(vocab_size, m.ctx.tp_size());
  m.vocab_shard = tensor_parallel::vocab_range(m.vocab_padded, m.ctx.tp_rank(), m.ctx.tp_size());
  m.logit_rows =
      parallel.exclude_vocab_padding
          ? std::max<int64_t>(0, std::min(m.vocab_shard.end, vocab_size) - m.vocab_shard.start)
          : m.vocab_shard.size();

  // Pipeline chunks: checked, then the embedding on a pre_process chunk, the layers of every chunk
  // (global numbers), the head on a post_process chunk.
  m.chunks = parallel.pipeline_chunks;
  if (m.chunks.empty()) m.chunks.push_back(PipelineChunk{0, c.num_layers, true, true});
  m.pre_process = m.post_process = false;
  for (std::size_t v = 0; v < m.chunks.size(); ++v) {
    const PipelineChunk& ch = m.chunks[v];
    MG_CHECK(ch.layer_offset >= 0 && ch.num_layers >= 0 &&
                 ch.layer_offset + ch.num_layers <= c.num_layers,
             "pipeline chunk " << v << ": layers [" << ch.layer_offset << ", "
                               << ch.layer_offset + ch.num_layers << ") are outside the model's "
                               << c.num_layers << " layers");
    MG_CHECK(v == 0 || ch.layer_offset >= m.chunks[v - 1].layer_offset + m.chunks[v - 1].num_layers,
             "pipeline chunk " << v << " starts at layer " << ch.layer_offset
                               << ", inside or before chunk " << v - 1);
    MG_CHECK(!ch.pre_process || v == 0, "only the first pipeline chunk may hold the embedding");
    MG_CHECK(!ch.post_process || v + 1 == m.chunks.size(),
             "only the last pipeline chunk may hold the output layer");
    m.pre_process |= ch.pre_process;
    m.post_process |= ch.post_process;
  }
  const bool tied = !c.untie_embeddings_and_output_weights;
  transformer::ParamBuilder pb(m.ctx);
  // The word embedding: all-reduced over TP (never reduce-scattered: positions are added to the
  // full [S, B, H] before the SP scatter). A last stage without the embedding holds its replica
  // for the tied output layer.
  if (m.pre_process || (tied && m.post_process))
    m.word_embeddings = std::make_unique<VocabParallelEmbedding>(
        m.ctx, pb, "embedding.word_embeddings.weight", m.vocab_padded, c.hidden_size);
  if (m.pre_process &&
      c.position_embedding_type == transformer::PositionEmbeddingType::learned_absolute)
    pb.add(m.position, "embedding.position_embeddings.weight",
           {c.max_position_embeddings, c.hidden_size}, InitRule::normal);
  for (const PipelineChunk& ch : m.chunks) {
    m.chunk_begin.push_back(static_cast<int64_t>(m.layers.size()));
    for (int64_t l = ch.layer_offset; l < ch.layer_offset + ch.num_layers; ++l)
      m.layers.push_back(std::make_unique<TransformerLayer>(m.ctx, pb, spec.layer(l), l));
  }
  m.chunk_begin.push_back(static_cast<int64_t>(m.layers.size()));
  if (m.post_process && spec.final_layernorm.impl != transformer::NormImpl::identity)
    m.final_norm = std::make_unique<Norm>(
        m.ctx, pb, spec.final_layernorm.impl, "decoder.final_layernorm.weight",
        "decoder.final_layernorm.bias", c.hidden_size, m.ctx.sequence_parallel);
  // Megatron's output layer: a ColumnParallelLinear without bias or gather; tied, it uses the word
  // embedding (skip_weight_param_allocation).
  if (m.post_process)
    m.output_layer = std::make_unique<ColumnParallelLinear>(
        m.ctx, pb, "output_layer.",
        tensor_parallel::ColumnParallelLinearConfig{.input_size = c.hidden_size,
                                                    .output_size = m.vocab_padded,
                                                    .bias = false,
                                                    .gather_output = false,
                                                    .init = InitRule::normal,
                                                    .skip_weight_param_allocation = tied});
  pb.finish(m.params, m.buffer, m.decls);
  if (m.fp8) m.fp8->finalize();
  if (m.fp8 && c.fp8.param_gather) m.fp8->bind_params(m.params);  // FP8 weight parameters
  std::vector<int64_t> local_of(static_cast<std::size_t>(c.num_layers), -1);
  for (std::size_t i = 0; i < m.layers.size(); ++i)
    local_of[static_cast<std::size_t>(m.layers[i]->layer_number())] = static_cast<int64_t>(i);
  m.layer_params.resize(m.layers.size());
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const std::string& name = m.params[i].name;
    const std::string layers = "decoder.layers.";
    if (name.rfind(layers, 0) == 0) {
      const auto l = local_of.at(static_cast<std::size_t>(std::stoll(name.substr(layers.size()))));
      m.layer_params.at(static_cast<std::size_t>(l)).push_back(i);
    } else if (name.rfind("output_layer.", 0) == 0 ||
               name.rfind("decoder.final_layernorm.", 0) == 0) {
      m.head_params.push_back(i);
    } else if (!m.pre_process && name == "embedding.word_embeddings.weight") {
      m.params[i].shared = true;  // the last stage's replica of the tied word embedding
      m.head_params.push_back(i);
    } else {
      m.embedding_params.push_back(i);
    }
  }
  m.head_use = m.head_params;
  if (tied && m.pre_process)
    for (std::size_t i : m.embedding_params)
      if (m.params[i].name == "embedding.word_embeddings.weight") m.head_use.push_back(i);

  // Full recompute: per chunk, over its own layers (Megatron: per pipeline stage).
  if (c.recompute_granularity == transformer::RecomputeGranularity::full) {
    const int64_t k = c.recompute_num_layers;
    for (std::size_t v = 0; v < m.chunks.size(); ++v) {
      const int64_t lo = m.chunk_begin[v], hi = m.chunk_begin[v + 1];
      if (c.recompute_method == transformer::RecomputeMethod::uniform) {
        for (int64_t l = lo; l < hi; l += k)
          m.recompute_chunks.emplace_back(l, std::min(l + k, hi));
      } else {
        for (int64_t l = lo; l < std::min(lo + k, hi); ++l)
          m.recompute_chunks.emplace_back(l, l + 1);
      }
    }
  }
}

GPTModel::~GPTModel() = default;

const TransformerConfig& GPTModel::config() const {
  return impl_->config;
}
const transformer::TransformerBlockSpec& GPTModel::spec() const {
  return impl_->spec;
}
transformer::moe::MoEState& GPTModel::moe_state() {
  return impl_->moe;
}
int64_t GPTModel::vocab_size() const {
  return impl_->vocab;
}
int64_t GPTModel::padded_vocab_size() const {
  return impl_->vocab_padded;
}
const GPTModelParallel& GPTModel::parallel() const {
  return impl_->parallel;
}
Device GPTModel::device() const {
  return impl_->ctx.device;
}
const ops::OpTable& GPTModel::ops() const {
  return *impl_->ctx.ops;
}
std::vector<transformer::Parameter>& GPTModel::parameters() {
  return impl_->params;
}
const std::vector<transformer::Parameter>& GPTModel::parameters() const {
  return impl_->params;
}
transformer::ParamAndGradBuffer& GPTModel::buffer() {
  return impl_->buffer;
}
int64_t GPTModel::num_parameters() const {
  return impl_->buffer.params.numel();
}

transformer::Parameter& GPTModel::parameter(std::string_view name) {
  for (auto& p : impl_->params)
    if (p.name == name) return p;
  std::ostringstream names;
  for (const auto& p : impl_->params) names << "\n  " << p.name;
  MG_THROW("GPTModel has no parameter '" << name << "'; it has:" << names.str());
}

void GPTModel::init_weights(uint64_t seed) {
  Impl& m = *impl_;
  const double std = m.config.init_method_std;
  const double scaled = std / std::sqrt(2.0 * static_cast<double>(m.config.num_layers));
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    Tensor& t = m.params[i].param;
    switch (m.decls[i].init) {
      case InitRule::normal:
      case InitRule::scaled_normal: {
        ops::InitArgs a;
        a.mean = 0.0;
        a.std = m.decls[i].init == InitRule::normal ? std : scaled;
        a.seed = transformer::init_seed(seed, m.params[i].name);
        a.offset = 0;
        // A TP shard draws the counters of its slice of the full tensor: TP-invariant init.
        tensor_parallel::init_normal_partitioned(m.ctx.op(), t, m.params[i].global_shape,
                                                 m.decls[i].partition, a);
        break;
      }
      case InitRule::zeros:
        m.ctx.op().fill(t, 0.0);
        break;
      case InitRule::ones:
        m.ctx.op().fill(t, 1.0);
        break;
    }
  }
}

void GPTModel::zero_grad() {
  impl_->buffer.grads.zero_();
}

namespace {

// [B, S] (host or device) -> host values in sequence-first order (row n = s*B + b).
std::vector<int64_t> to_sb_i64(const Tensor& t, int64_t b, int64_t s) {
  const std::vector<int64_t> v = t.to_vector<int64_t>();
  std::vector<int64_t> out(v.size());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j) out[j * b + i] = v[i * s + j];
  return out;
}

// A batch tensor converted to dtype on `dev`; a host tensor bound for a device is staged in pinned
// memory of the device's platform (the per-step upload; a plain conversion on the host).
Tensor upload(const Tensor& t, DType dtype, Device dev) {
  if (dev.is_host() || !t.is_host()) return t.to(dtype).to(dev);
  Tensor pinned = Tensor::empty_pinned(t.shape(), dtype, dev);
  pinned.copy_(t);
  return pinned.to(dev);
}

void check_bs(const char* name, const Tensor& t, int64_t b, int64_t s) {
  MG_CHECK(t.shape() == (Shape{b, s}), "GPTBatch." << name << " " << shape_str(t.shape())
                                                   << " must be [B, S] = " << shape_str(Shape{b, s})
                                                   << " like tokens");
}

}  // namespace

void GPTModel::Impl::prepare(const GPTBatch& batch, detail::GPTSaved& st, const StepRng& rng,
                             bool training, bool pre, bool post) const {
  const TransformerConfig& c = config;
  MG_CHECK(batch.tokens.defined() && batch.tokens.dim() == 2,
           "GPTBatch.tokens must be [B, S], got " << batch.tokens.str());
  const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1), n = s * b;
  st.s = s;
  st.b = b;
  MG_CHECK(
      !(position.defined() && s > c.max_position_embeddings),
      "sequence length " << s << " exceeds max_position_embeddings " << c.max_position_embeddings);
  const Device dev = ctx.device;
  if (pre) {
    const std::vector<int64_t> tok = to_sb_i64(batch.tokens, b, s);
    for (std::size_t i = 0; i < tok.size(); ++i)
      MG_CHECK(tok[i] >= 0 && tok[i] < vocab_padded,
               "token id " << tok[i] << " at flat index " << i << " is outside [0, " << vocab_padded
                           << ") (padded vocab)");
    st.tokens = Tensor::from_vector(tok, {n}, DType::i64, dev);  // via pinned memory
  }
  if (post && batch.labels.defined()) {
    check_bs("labels", batch.labels, b, s);
    st.labels = Tensor::from_vector(to_sb_i64(batch.labels, b, s), {n}, DType::i64, dev);
    if (batch.loss_mask.defined()) {
      check_bs("loss_mask", batch.loss_mask, b, s);
      const std::vector<double> mk = batch.loss_mask.to_vector<double>();
      st.mask.resize(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < s; ++j) st.mask[j * b + i] = mk[i * s + j];
    } else {
      st.mask.assign(static_cast<std::size_t>(n), 1.0);
    }
  }
  std::vector<int64_t> pos(static_cast<std::size_t>(n));
  if (batch.position_ids.defined()) {
    check_bs("position_ids", batch.position_ids, b, s);
    pos = to_sb_i64(batch.position_ids, b, s);
    st.in.position_ids = upload(batch.position_ids, DType::i64, dev);
  } else {
    for (int64_t j = 0; j < s; ++j)
      for (int64_t i = 0; i < b; ++i) pos[j * b + i] = j;
  }
  if (pre && position.defined()) {
    for (std::size_t i = 0; i < pos.size(); ++i)
      MG_CHECK(pos[i] >= 0 && pos[i] < c.max_position_embeddings,
               "position id " << pos[i] << " is outside [0, " << c.max_position_embeddings
                              << ") (max_position_embeddings)");
    st.positions = Tensor::from_vector(pos, {n}, DType::i64, dev);
  }
  if (batch.doc_ids.defined()) {
    check_bs("doc_ids", batch.doc_ids, b, s);
    st.in.doc_ids = upload(batch.doc_ids, DType::i32, dev);
  }
  MG_CHECK(!ctx.sequence_parallel || s % ctx.tp_size() == 0,
           "sequence parallelism: sequence length "
               << s << " is not divisible by tensor_model_parallel_size " << ctx.tp_size());
  st.in.s = s;
  st.in.b = b;
  st.rng = DropoutCtx{rng.seed, rng.iteration, rng.microbatch, training};
}

// Embedding: word (vocab-parallel: this shard's rows, summed over TP) + learned positions, then
// under SP this rank's sequence shard, then dropout. [N, H] = [S, B, H] ([S/TP, B, H] SP).
Tensor GPTModel::Impl::embed(detail::GPTSaved& st) {
  const auto& ops = ctx.op();
  const int64_t s = st.s, b = st.b, h = config.hidden_size;
  Tensor emb = word_embeddings->forward(st.tokens, s, b);  // [S, B, H], summed over TP
  if (position.defined()) {
    Tensor pe = ctx.empty({s, b, h});
    ops.embedding_fwd(pe, st.positions, position.value, 0);
    ops.axpy(emb, pe, 1.0f);
  }
  if (ctx.sequence_parallel)
    emb = tensor_parallel::scatter_to_sequence_parallel_region(emb, *ctx.tp_group);
  Tensor x = ctx.empty(emb.shape());
  ops.dropout_fwd(x, emb, embedding_dropout(st.rng, emb));
  return x;
}

// The layers of chunk v (full recompute keeps only each recompute chunk's input).
Tensor GPTModel::Impl::decoder(int v, Tensor x, detail::GPTSaved& st) {
  const bool selective =
      config.recompute_granularity == transformer::RecomputeGranularity::selective;
  const int64_t lo = chunk_begin[static_cast<std::size_t>(v)],
                hi = chunk_begin[static_cast<std::size_t>(v) + 1];
  st.chunk = v;
  st.layers.resize(static_cast<std::size_t>(hi - lo));
  for (int64_t l = lo; l < hi; ++l) {
    TransformerLayer::Saved& ls = st.layers[static_cast<std::size_t>(l - lo)];
    use(layer_params[static_cast<std::size_t>(l)]);
    Tensor y = layers[static_cast<std::size_t>(l)]->forward(x, ls, st.in, st.rng, !selective);
    release(layer_params[static_cast<std::size_t>(l)]);
    const int rc = chunk_of(l);
    if (rc >= 0) {  // full recompute: keep only the chunk's input
      const bool first = recompute_chunks[static_cast<std::size_t>(rc)].first == l;
      Tensor input = ls.x;
      ls = TransformerLayer::Saved{};
      if (first) ls.x = input;
    }
    x = y;
  }
  return x;
}

// Final norm, output layer and loss. logits [N, V_pad] ([N, V_pad/TP] vocab-parallel, never
// gathered) in the model dtype; the loss statistics [N] in f32 (f64 for f64). With TP the input
// enters the TP region (copy, or SP all-gather).
LossSums GPTModel::Impl::head(const Tensor& x, detail::GPTSaved& st) {
  const auto& ops = ctx.op();
  const int64_t n = st.s * st.b;
  st.decoder_out = x;
  st.final_ln = final_norm ? final_norm->forward(x, st.final_norm) : x;
  const Weight w = logit_weight();
  st.logits = output_layer->forward(st.final_ln, st.output_layer, &w).view({n, logit_rows});
  LossSums sums;
  if (st.labels.defined()) {
    const DType stat = stat_dtype();
    if (ctx.tp_size() > 1) {
      tensor_parallel::CrossEntropySaved ce;
      st.loss = tensor_parallel::vocab_parallel_cross_entropy(
          ops, st.logits, st.labels, vocab_shard.start, *ctx.tp_group, ce, loss_vocab_end());
      st.max = ce.max;
      st.sum_exp = ce.sum_exp;
    } else {
      st.loss = Tensor::empty({n}, stat, ctx.device);
      st.max = Tensor::empty({n}, stat, ctx.device);
      st.sum_exp = Tensor::empty({n}, stat, ctx.device);
      ops.cross_entropy_fwd(st.loss, st.max, st.sum_exp, st.logits, st.labels);
    }
    // The loss sum stays pending on the device (the schedule reads a step's losses at once).
    for (int64_t i = 0; i < n; ++i)
      if (st.mask[i] != 0.0) sums.num_tokens += st.mask[i];
    sums.pending = std::make_shared<const PendingLoss>(PendingLoss{st.loss, st.mask});
    if (ctx.cp.active()) {  // the whole sequence's count / CP (LossSums, gpt_model.h)
      Tensor t = Tensor::from_vector(std::vector<double>{sums.num_tokens}, {1}, DType::f64);
      ctx.cp.group->all_reduce(t, comm::ReduceOp::sum)->wait();
      sums.num_tokens = t.to_vector<double>()[0] / static_cast<double>(ctx.cp.group->size());
    }
  }
  return sums;
}

LossSums GPTModel::forward(const GPTBatch& batch, GPTForwardState& state, const StepRng& rng,
                           bool training) {
  Impl& m = *impl_;
  MG_CHECK(m.chunks.size() == 1 && m.chunks[0].pre_process && m.chunks[0].post_process,
           "GPTModel::forward runs the whole model; this one is a pipeline stage ("
               << m.chunks.size() << " chunk(s)): use forward_chunk");
  LossSums sums;
  forward_chunk(0, batch, Tensor(), state, rng, training, &sums);
  LossSums* one = &sums;
  resolve_loss_sums(std::span<LossSums* const>(&one, 1));
  return sums;
}

Tensor GPTModel::forward_chunk(int v, const GPTBatch& batch, const Tensor& input,
                               GPTForwardState& state, const StepRng& rng, bool training,
                               LossSums* sums) {
  Impl& m = *impl_;
  MG_CHECK(v >= 0 && v < static_cast<int>(m.chunks.size()),
           "forward_chunk: chunk " << v << " is outside [0, " << m.chunks.size() << ")");
  const PipelineChunk& ch = m.chunks[static_cast<std::size_t>(v)];
  auto sv = std::make_unique<detail::GPTSaved>();
  detail::GPTSaved& st = *sv;
  m.prepare(batch, st, rng, training, ch.pre_process, ch.post_process);
  m.ctx.fp8_training = training;
  Tensor x;
  if (ch.pre_process) {
    m.use(m.embedding_params);
    x = m.embed(st);
    m.release(m.embedding_params);
  } else {
    const Shape want = pipeline_tensor_shape(st.s, st.b);
    MG_CHECK(input.defined() && input.shape() == want && input.dtype() == m.ctx.dtype,
             "forward_chunk " << v << ": the input hidden states must be " << shape_str(want) << " "
                              << dtype_name(m.ctx.dtype) << ", got "
                              << (input.defined() ? input.str() : std::string("none")));
    x = input;
  }
  x = m.decoder(v, x, st);
  Tensor out;
  if (ch.post_process) {
    m.use(m.head_use);
    const LossSums ls = m.head(x, st);
    m.release(m.head_use);
    if (sums) *sums = ls;
  } else {
    out = x;
  }
  state.saved_ = std::move(sv);
  // Transformer Engine's fp8_autocast exit: the forward amaxes are reduced and the scales updated
  // after each training pass of a chunk (docs/fp8.md).
  if (m.fp8 && training) m.fp8->update(true, m.parallel.amax_group);
  m.ctx.fp8_training = false;
  return out;
}

// Cross entropy, output layer, final norm; returns d(decoder output).
Tensor GPTModel::Impl::head_bwd(detail::GPTSaved& st, double dloss) {
  const auto& ops = ctx.op();
  MG_CHECK(st.labels.defined(), "GPTModel::backward: the forward ran without labels");
  const int64_t n = st.s * st.b;
  // Cross entropy: dlogits = dloss * mask * (softmax - onehot), written over the logits.
  std::vector<double> dl(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) dl[i] = dloss * st.mask[i];
  const Tensor dloss_t = Tensor::from_vector(dl, {n}, stat_dtype(), ctx.device);
  if (logit_rows > 0)
    ops.cross_entropy_bwd(st.logits, dloss_t, st.logits, st.max, st.sum_exp, st.labels,
                          vocab_shard.start);
  const Tensor dlogits = st.logits;  // [N, V_pad(/TP)] in the model dtype, as the gemms take
  st.logits = Tensor();

  // Output layer (the word embedding when tied): d(final_ln) = dlogits W, summed over TP (SP:
  // reduce-scattered); dW += dlogits^T ln (a shard of padding only: no logits, dx 0).
  use(head_use);  // FSDP optim_grads_params gathers the head's parameters again for backward
  will_write_grads(head_use);
  Weight w = logit_weight();
  const Tensor dln = output_layer->backward(dlogits.view({st.s, st.b, logit_rows}), st.final_ln,
                                            st.output_layer, false, &w);
  Tensor dx = final_norm ? final_norm->backward(dln, st.decoder_out, st.final_norm) : dln;
  release(head_use);
  st.final_ln = Tensor();
  st.decoder_out = Tensor();
  report_ready(head_params);
  return dx;
}

// The chunk's layers, last first; a recompute chunk is rebuilt from its input when reached.
Tensor GPTModel::Impl::decoder_bwd(Tensor dx, detail::GPTSaved& st) {
  const TransformerConfig& c = config;
  const int64_t lo = chunk_begin[static_cast<std::size_t>(st.chunk)],
                hi = chunk_begin[static_cast<std::size_t>(st.chunk) + 1];
  auto saved = [&](int64_t l) -> TransformerLayer::Saved& {
    return st.layers[static_cast<std::size_t>(l - lo)];
  };
  for (int64_t l = hi - 1; l >= lo; --l) {
    TransformerLayer::Saved& ls = saved(l);
    if (!ls.complete) {
      const int rc = chunk_of(l);
      MG_CHECK(rc >= 0, "layer " << l << " holds no activations and is not recomputed");
      const auto [first, last] = recompute_chunks[static_cast<std::size_t>(rc)];
      Tensor x = saved(first).x;
      const bool selective =
          c.recompute_granularity == transformer::RecomputeGranularity::selective;
      for (int64_t r = first; r < last; ++r) {
        use(layer_params[static_cast<std::size_t>(r)]);
        x = layers[static_cast<std::size_t>(r)]->forward(x, saved(r), st.in, st.rng, !selective);
        release(layer_params[static_cast<std::size_t>(r)]);
      }
    }
    use(layer_params[static_cast<std::size_t>(l)]);
    will_write_grads(layer_params[static_cast<std::size_t>(l)]);
    dx = layers[static_cast<std::size_t>(l)]->backward(dx, ls, st.in, st.rng);
    release(layer_params[static_cast<std::size_t>(l)]);
    report_ready(layer_params[static_cast<std::size_t>(l)]);
  }
  return dx;
}

// Embedding: dropout', then scatter-add into the word (and position) tables.
void GPTModel::Impl::embed_bwd(const Tensor& dx, detail::GPTSaved& st) {
  const auto& ops = ctx.op();
  will_write_grads(embedding_params);
  Tensor demb = ctx.empty(dx.shape());
  ops.dropout_bwd(demb, dx, embedding_dropout(st.rng, dx));
  if (ctx.sequence_parallel)
    demb = tensor_parallel::scatter_to_sequence_parallel_region_bwd(demb, *ctx.tp_group);
  word_embeddings->backward(demb, st.tokens);
  if (position.defined()) ops.embedding_bwd(position.grad, demb, st.positions, 0);
}

void GPTModel::backward(GPTForwardState& state, double dloss) {
  MG_CHECK(state.saved_ != nullptr, "GPTModel::backward: the state holds no forward activations");
  const PipelineChunk& ch = impl_->chunks[static_cast<std::size_t>(state.saved_->chunk)];
  MG_CHECK(ch.pre_process && ch.post_process,
           "GPTModel::backward runs the whole model; this state is of a pipeline chunk: use "
           "backward_chunk");
  backward_chunk(state, Tensor(), dloss);
}

Tensor GPTModel::backward_chunk(GPTForwardState& state, const Tensor& output_grad, double dloss) {
  Impl& m = *impl_;
  MG_CHECK(state.saved_ != nullptr,
           "GPTModel::backward_chunk: the state holds no forward activations");
  detail::GPTSaved& st = *state.saved_;
  const PipelineChunk& ch = m.chunks[static_cast<std::size_t>(st.chunk)];
  m.ctx.fp8_training = true;
  Tensor dx;
  if (ch.post_process) {
    dx = m.head_bwd(st, dloss);
  } else {
    const Shape want = pipeline_tensor_shape(st.s, st.b);
    MG_CHECK(output_grad.defined() && output_grad.shape() == want,
             "backward_chunk " << st.chunk << ": the output gradient must be " << shape_str(want)
                               << ", got " << (output_grad.defined() ? output_grad.str() : "none"));
    dx = output_grad;
  }
  dx = m.decoder_bwd(dx, st);
  if (ch.pre_process) {
    m.embed_bwd(dx, st);
    dx = Tensor();
  }
  state.saved_.reset();
  if (m.fp8) m.fp8->update(false, m.parallel.amax_group);  // the backward amaxes, likewise
  m.ctx.fp8_training = false;
  if (ch.pre_process) m.report_ready(m.embedding_params);
  return dx;
}

fp8::Fp8State* GPTModel::fp8_state() {
  return impl_->fp8.get();
}

int GPTModel::num_chunks() const {
  return static_cast<int>(impl_->chunks.size());
}
const PipelineChunk& GPTModel::chunk(int v) const {
  MG_CHECK(v >= 0 && v < num_chunks(), "chunk " << v << " is outside [0, " << num_chunks() << ")");
  return impl_->chunks[static_cast<std::size_t>(v)];
}
Shape GPTModel::pipeline_tensor_shape(int64_t seq_length, int64_t micro_batch_size) const {
  const int64_t s = impl_->ctx.sequence_parallel ? seq_length / impl_->ctx.tp_size() : seq_length;
  return Shape{s, micro_batch_size, impl_->config.hidden_size};
}
DType GPTModel::pipeline_tensor_dtype() const {
  return impl_->ctx.dtype;
}

void GPTModel::set_param_use_hook(ParamUseHook hook) {
  impl_->param_use = std::move(hook);
}

void GPTModel::set_param_release_hook(ParamUseHook hook) {
  impl_->param_release = std::move(hook);
}

bool GPTModel::set_grad_write_hook(ParamUseHook hook) {
  impl_->grad_write = std::move(hook);
  return true;
}

std::vector<std::vector<std::size_t>> GPTModel::param_units() const {
  std::vector<std::vector<std::size_t>> units = impl_->layer_params;
  units.push_back(impl_->head_params);
  units.push_back(impl_->embedding_params);
  return units;
}

void GPTModel::set_grad_ready_hook(GradReadyHook hook) {
  impl_->grad_ready = std::move(hook);
}

Tensor GPTModel::logits(const GPTBatch& batch) {
  GPTBatch b = batch;
  b.labels = Tensor();
  GPTForwardState state;
  forward(b, state, StepRng{}, /*training=*/false);
  const detail::GPTSaved& st = *state.saved_;
  return st.logits.view({st.s, st.b, impl_->logit_rows}).to(impl_->stat_dtype());
}

Tensor GPTModel::token_losses(const GPTForwardState& state) const {
  MG_CHECK(state.saved_ && state.saved_->loss.defined(),
           "token_losses: the state holds no forward with labels");
  return state.saved_->loss.view({state.saved_->s, state.saved_->b});
}

// ---- inference with a KV cache (gpt_model.h; the layers' infer in inference_forward.cpp) ----
Tensor GPTModel::infer(const Tensor& tokens, inference::StaticInferenceContext& ic) {
  Impl& m = *impl_;
  const TransformerConfig& c = m.config;
  const auto& ops = m.ctx.op();
  MG_CHECK(tokens.defined() && tokens.dim() == 2,
           "GPTModel::infer: tokens must be [B, Sq], got "
               << (tokens.defined() ? tokens.str() : "none"));
  MG_CHECK(!m.ctx.sequence_parallel, "GPTModel::infer: not supported with sequence parallelism");
  MG_CHECK(static_cast<int64_t>(m.layers.size()) == c.num_layers,
           "GPTModel::infer needs the whole model (this one holds "
               << m.layers.size() << " of " << c.num_layers << " layers: a pipeline stage)");
  const int64_t b = tokens.size(0), s = tokens.size(1), n = s * b, h = c.hidden_size;
  const int64_t off = ic.sequence_len_offset;
  MG_CHECK(!(m.position.defined() && off + s > c.max_position_embeddings),
           "GPTModel::infer: position " << off + s - 1 << " exceeds max_position_embeddings "
                                        << c.max_position_embeddings);
  const std::vector<int64_t> tok = to_sb_i64(tokens, b, s);
  for (std::size_t i = 0; i < tok.size(); ++i)
    MG_CHECK(tok[i] >= 0 && tok[i] < m.vocab_padded,
             "token id " << tok[i] << " is outside [0, " << m.vocab_padded << ") (padded vocab)");
  const Device dev = m.ctx.device;
  Tensor emb = m.word_embeddings->forward(Tensor::from_vector(tok, {n}, DType::i64, dev), s, b);
  if (m.position.defined()) {
    std::vector<int64_t> pos(static_cast<std::size_t>(n));
    for (int64_t j = 0; j < s; ++j)
      for (int64_t i = 0; i < b; ++i) pos[j * b + i] = off + j;
    Tensor pe = m.ctx.empty({s, b, h});
    ops.embedding_fwd(pe, Tensor::from_vector(pos, {n}, DType::i64, dev), m.position.value, 0);
    ops.axpy(emb, pe, 1.0f);
  }
  Tensor x = emb;
  for (const auto& layer : m.layers) x = layer->infer(x, ic);
  Norm::Saved unused;
  Tensor ln = m.final_norm ? m.final_norm->forward(x, unused) : x;
  ColumnParallelLinear::Saved unused_in;
  const Weight w = m.logit_weight();
  const Tensor logits = m.output_layer->forward(ln, unused_in, &w);  // [Sq, B, rows]
  ic.sequence_len_offset = off + s;
  return logits.view({s, b, m.logit_rows}).to(m.stat_dtype());  // as logits(): model dtype, f32
}

}  // namespace mg::models
