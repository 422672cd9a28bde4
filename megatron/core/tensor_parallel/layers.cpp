// ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding forward/backward over the gemm,
// gemm_epilogue, bias and embedding ops and the conjugate mappings (layers.h). ColumnParallelLinear
// fuses its bias into the GEMM (bias epilogue) and its bias gradient into the weight-gradient GEMM
// (bgrad); RowParallelLinear adds its bias after the TP reduction, so it stays a bias_add.
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/tensor_parallel/layers.h"

#include "megatron/core/common/error.h"
#include "megatron/core/tensor_parallel/mappings.h"
#include "megatron/core/tensor_parallel/sharding.h"

namespace mg::tensor_parallel {

namespace {

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

}  // namespace

// ---- ColumnParallelLinear ----------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const ModuleContext& ctx, ParamBuilder& pb,
                                           const std::string& name_prefix,
                                           const ColumnParallelLinearConfig& config,
                                           comm::ProcessGroup& tp)
    : ctx_(ctx), cfg_(config), tp_(tp) {
  MG_CHECK(cfg_.input_size >= 1 && cfg_.output_size >= 1,
           "ColumnParallelLinear " << name_prefix << ": input_size " << cfg_.input_size
                                   << ", output_size " << cfg_.output_size);
  const Partition part{0, cfg_.partition_stride, tp.rank(), tp.size()};
  out_local_ = local_shape({cfg_.output_size}, part)[0];
  pb.add(w_, name_prefix + "weight", {cfg_.output_size, cfg_.input_size}, cfg_.init, part);
  if (cfg_.bias) pb.add(b_, name_prefix + "bias", {cfg_.output_size}, InitRule::zeros, part);
}

Tensor ColumnParallelLinear::forward(const Tensor& x, Saved& saved) const {
  const int64_t in = cfg_.input_size;
  MG_CHECK(x.dim() >= 1 && x.size(-1) == in,
           "ColumnParallelLinear: input " << x.str() << ", expected [.., " << in << "]");
  const Tensor total = cfg_.sequence_parallel ? gather_from_sequence_parallel_region(x, tp_)
                                              : copy_to_tensor_model_parallel_region(x, tp_);
  const int64_t n = total.numel() / in;
  saved.input = total.view({n, in});  // [N, in]
  Tensor y;                           // [N, out/TP]
  if (b_.defined()) {                 // x W^T + b in one GEMM (bias epilogue)
    y = ctx_.empty({n, out_local_});
    Tensor none, none2;
    ctx_.op().gemm_epilogue(
        y, none, none2, saved.input, w_.value, b_.value,
        ops::GemmEpilogueArgs{.trans_b = true, .epilogue = ops::GemmEpilogue::bias});
  } else {
    y = linear_fwd(ctx_, saved.input, w_.value);
  }
  Tensor out = y.view(with_last(total.shape(), out_local_));
  return cfg_.gather_output ? gather_from_tensor_model_parallel_region(out, tp_) : out;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, Saved& saved) {
  MG_CHECK(saved.input.defined(), "ColumnParallelLinear::backward without a forward");
  const Tensor g = cfg_.gather_output ? gather_from_tensor_model_parallel_region_bwd(dy, tp_) : dy;
  const int64_t n = saved.input.size(0);
  const Tensor g2 = g.view({n, out_local_});     // [N, out/TP]
  Tensor dx = ctx_.empty({n, cfg_.input_size});  // partial sum over the output shards
  if (b_.defined()) {
    // dW += dy^T x with dbias += sum_n dy on the weight-gradient GEMM (bgrad epilogue); under SP
    // the input is the gathered [N, in] and dy this rank's [N, out/TP]: the sums are complete.
    Tensor none;
    ctx_.op().gemm_epilogue(
        w_.grad, none, b_.grad, g2, saved.input, Tensor(),
        ops::GemmEpilogueArgs{.trans_a = true, .epilogue = ops::GemmEpilogue::bgrad, .beta = 1.0f});
    ctx_.op().gemm(dx, g2, w_.value, ops::GemmArgs{});
  } else {
    linear_bwd(ctx_, dx, w_.grad, g2, saved.input, w_.value);
  }
  saved = Saved{};
  dx = dx.view(with_last(g.shape(), cfg_.input_size));
  return cfg_.sequence_parallel ? gather_from_sequence_parallel_region_bwd(dx, tp_)
                                : copy_to_tensor_model_parallel_region_bwd(dx, tp_);
}

// ---- RowParallelLinear -------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(const ModuleContext& ctx, ParamBuilder& pb,
                                     const std::string& name_prefix,
                                     const RowParallelLinearConfig& config, comm::ProcessGroup& tp)
    : ctx_(ctx), cfg_(config), tp_(tp) {
  MG_CHECK(cfg_.input_size >= 1 && cfg_.output_size >= 1,
           "RowParallelLinear " << name_prefix << ": input_size " << cfg_.input_size
                                << ", output_size " << cfg_.output_size);
  const Partition part{1, 1, tp.rank(), tp.size()};
  in_local_ = local_shape({cfg_.output_size, cfg_.input_size}, part)[1];
  pb.add(w_, name_prefix + "weight", {cfg_.output_size, cfg_.input_size}, cfg_.init, part);
  if (cfg_.bias)
    pb.add(b_, name_prefix + "bias", {cfg_.output_size}, InitRule::zeros, Partition{},
           cfg_.sequence_parallel);
}

Tensor RowParallelLinear::forward(const Tensor& x, Saved& saved) const {
  const Tensor xp = cfg_.input_is_parallel ? x : scatter_to_tensor_model_parallel_region(x, tp_);
  MG_CHECK(xp.dim() >= 1 && xp.size(-1) == in_local_,
           "RowParallelLinear: input " << x.str() << ", expected [.., "
                                       << (cfg_.input_is_parallel ? in_local_ : cfg_.input_size)
                                       << "]");
  const int64_t n = xp.numel() / in_local_, out = cfg_.output_size;
  saved.input = xp.view({n, in_local_});               // [N, in/TP]
  Tensor y = linear_fwd(ctx_, saved.input, w_.value);  // [N, out], partial sum over TP
  y = y.view(with_last(xp.shape(), out));
  y = cfg_.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(y, tp_)
                             : reduce_from_tensor_model_parallel_region(y, tp_);
  if (b_.defined() && !cfg_.skip_bias_add) {
    Tensor y2 = y.view({y.numel() / out, out});
    ctx_.op().bias_add(y2, b_.value);
  }
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, Saved& saved) {
  MG_CHECK(saved.input.defined(), "RowParallelLinear::backward without a forward");
  const int64_t out = cfg_.output_size;
  if (b_.defined() && !cfg_.skip_bias_add)
    ctx_.op().bias_grad(b_.grad, dy.view({dy.numel() / out, out}));
  const Tensor g = cfg_.sequence_parallel ? reduce_scatter_to_sequence_parallel_region_bwd(dy, tp_)
                                          : reduce_from_tensor_model_parallel_region_bwd(dy, tp_);
  const int64_t n = saved.input.size(0);
  Tensor dx = ctx_.empty({n, in_local_});
  linear_bwd(ctx_, dx, w_.grad, g.view({n, out}), saved.input, w_.value);
  saved = Saved{};
  dx = dx.view(with_last(g.shape(), in_local_));
  return cfg_.input_is_parallel ? dx : scatter_to_tensor_model_parallel_region_bwd(dx, tp_);
}

// ---- VocabParallelEmbedding --------------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(const ModuleContext& ctx, ParamBuilder& pb,
                                               const std::string& name, int64_t padded_vocab,
                                               int64_t hidden, comm::ProcessGroup& tp,
                                               bool reduce_scatter_embeddings)
    : ctx_(ctx), tp_(tp), reduce_scatter_(reduce_scatter_embeddings), h_(hidden) {
  const VocabRange r = vocab_range(padded_vocab, tp.rank(), tp.size());
  vocab_start_ = r.start;
  vocab_end_ = r.end;
  pb.add(w_, name, {padded_vocab, hidden}, InitRule::normal, Partition{0, 1, tp.rank(), tp.size()});
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids, int64_t s, int64_t b) const {
  MG_CHECK(ids.numel() == s * b, "VocabParallelEmbedding: " << ids.numel() << " ids for [S, B] = ["
                                                            << s << ", " << b << "]");
  Tensor out = ctx_.empty({s, b, h_});  // this shard's rows, 0 for ids of other shards
  ctx_.op().embedding_fwd(out, ids, w_.value, vocab_start_);
  return reduce_scatter_ ? reduce_scatter_to_sequence_parallel_region(out, tp_)
                         : reduce_from_tensor_model_parallel_region(out, tp_);
}

void VocabParallelEmbedding::backward(const Tensor& dy, const Tensor& ids) {
  const Tensor g = reduce_scatter_ ? reduce_scatter_to_sequence_parallel_region_bwd(dy, tp_)
                                   : reduce_from_tensor_model_parallel_region_bwd(dy, tp_);
  ctx_.op().embedding_bwd(w_.grad, g.view({ids.numel(), h_}), ids, vocab_start_);
}

// ---- sequence-parallel gradients ---------------------------------------------------------------

void all_reduce_sequence_parallel_grads(std::vector<transformer::Parameter>& params,
                                        comm::ProcessGroup& tp) {
  if (tp.size() == 1) return;
  std::vector<Tensor*> grads;
  int64_t total = 0;
  for (auto& p : params) {
    if (!p.sequence_parallel) continue;
    MG_CHECK(grads.empty() || p.main_grad.dtype() == grads[0]->dtype(),
             "all_reduce_sequence_parallel_grads: " << p.name << " grad dtype "
                                                    << dtype_name(p.main_grad.dtype()));
    grads.push_back(&p.main_grad);
    total += p.main_grad.numel();
  }
  if (grads.empty()) return;
  Tensor buf = Tensor::empty({total}, grads[0]->dtype(), grads[0]->device());
  int64_t off = 0;
  for (Tensor* g : grads) {
    buf.slice(off, g->numel()).copy_(*g);
    off += g->numel();
  }
  all_reduce_(buf, tp);
  off = 0;
  for (Tensor* g : grads) {
    g->copy_(buf.slice(off, g->numel()));
    off += g->numel();
  }
}

}  // namespace mg::tensor_parallel
