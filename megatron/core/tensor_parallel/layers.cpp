// ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding forward/backward over the gemm,
// gemm_epilogue, bias and embedding ops and the conjugate mappings (layers.h). With
// gemm_bias_fusion ColumnParallelLinear fuses its bias into the GEMM (bias epilogue) and its bias
// gradient into the weight-gradient GEMM (bgrad); RowParallelLinear adds its bias after the TP
// reduction, so it stays a bias_add. On one rank (ctx.tp_size() == 1) the mappings are the
// identity: no communication.
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/tensor_parallel/layers.h"

#include <algorithm>
#include <span>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor_parallel/mappings.h"
#include "megatron/core/tensor_parallel/sharding.h"

namespace mg::tensor_parallel {

namespace {

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

// Entry and exit of a tensor-parallel region, as conjugate pairs of mappings.h; the identity on
// one rank.
//   enter: copy_to_tensor_model_parallel_region, or under SP gather_from_sequence_parallel_region
//          ([S/TP, B, H] -> [S, B, H]); enter_bwd: all-reduce, or reduce-scatter to [S/TP, B, H].
//   exit : reduce_from_tensor_model_parallel_region (all-reduce), or under SP
//          reduce_scatter_to_sequence_parallel_region; exit_bwd: identity, or all-gather.
Tensor region_enter(const ModuleContext& ctx, const Tensor& x) {
  if (ctx.tp_size() == 1) return x;
  return ctx.sequence_parallel ? gather_from_sequence_parallel_region(x, *ctx.tp_group)
                               : copy_to_tensor_model_parallel_region(x, *ctx.tp_group);
}

Tensor region_enter_bwd(const ModuleContext& ctx, const Tensor& dx) {
  if (ctx.tp_size() == 1) return dx;
  return ctx.sequence_parallel ? gather_from_sequence_parallel_region_bwd(dx, *ctx.tp_group)
                               : copy_to_tensor_model_parallel_region_bwd(dx, *ctx.tp_group);
}

Tensor region_exit(const ModuleContext& ctx, const Tensor& y) {
  if (ctx.tp_size() == 1) return y;
  return ctx.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(y, *ctx.tp_group)
                               : reduce_from_tensor_model_parallel_region(y, *ctx.tp_group);
}

Tensor region_exit_bwd(const ModuleContext& ctx, const Tensor& dy) {
  if (ctx.tp_size() == 1) return dy;
  return ctx.sequence_parallel ? reduce_scatter_to_sequence_parallel_region_bwd(dy, *ctx.tp_group)
                               : reduce_from_tensor_model_parallel_region_bwd(dy, *ctx.tp_group);
}

// First row of each part in a regrouped [parts..] tensor.
std::vector<int64_t> part_offsets(const OutputSplit& split) {
  std::vector<int64_t> off(split.part_rows.size(), 0);
  for (std::size_t p = 1; p < off.size(); ++p) off[p] = off[p - 1] + split.part_rows[p - 1];
  return off;
}

// ---- FP8 GEMMs (layers.h Fp8Saved, docs/fp8.md) --------------------------------------------

// forward_split's parts must cover the layer's output rows.
void check_split_rows(const OutputSplit& split, int64_t out_local) {
  int64_t rows = 0;
  for (int64_t r : split.part_rows) rows += r;
  MG_CHECK(rows == out_local, "ColumnParallelLinear::forward_split: the parts hold "
                                  << rows << " rows, the layer " << out_local);
}

// The Fp8State id of the linear `prefix` ("decoder.layers.<l>.<...>.") when ctx.fp8 covers it.
int fp8_linear_id(const ModuleContext& ctx, const std::string& prefix) {
  if (!ctx.fp8_covers(prefix)) return -1;
  std::string name = prefix;
  if (!name.empty() && name.back() == '.') name.pop_back();
  return ctx.fp8->add_linear(name);
}

// The input x [N, in] (a tensor, or made by an op fused into the cast) cast with its transpose
// as the input of linear `id`.
void fp8_cast_input(const ModuleContext& ctx, int id, const fp8::Operand& x, Tensor& xq,
                    Fp8Saved& sv) {
  const fp8::Scaling sx = ctx.fp8->scaling(
      id, fp8::Role::input, std::span<const fp8::Operand>(&x, 1), ctx.fp8_training, ctx.tp_group);
  ctx.fp8->cast(sx, x, &xq, &sv.input_t);
  sv.input_scale_inv = sx.scale_inv;
}

// y [N, out] = x_q w_q^T in the model dtype for an input xq [N, in] already cast (sv's input
// part set); fills sv's weight part.
Tensor fp8_gemm_forward(const ModuleContext& ctx, int id, const Tensor& xq, const Tensor& w,
                        Fp8Saved& sv) {
  const fp8::WeightFp8* cached = ctx.fp8->cached_weight(id, ctx.fp8_training);
  const fp8::WeightFp8 wf =
      cached ? *cached
             : ctx.fp8->cast_weight(id, ctx.fp8->param_gather() ? ctx.fp8->param_q(id) : w, {},
                                    ctx.fp8_training, ctx.tp_group);
  MG_CHECK(wf.q.size() == 1 && wf.q[0].size(0) == w.size(0),
           "FP8 linear " << ctx.fp8->names()[static_cast<std::size_t>(id)]
                         << ": its cached weight was cast in " << wf.q.size()
                         << " part(s) by forward_split; forward needs the whole weight");
  sv.weight_t = wf.qt[0];
  sv.weight_scale_inv = wf.scale_inv;
  Tensor y = ctx.empty({xq.size(0), w.size(0)});
  ctx.op().fp8_gemm(y, xq, wf.q[0], sv.input_scale_inv, sv.weight_scale_inv,
                    ops::Fp8GemmArgs{.fast_accum = true});  // TE's forward: no split accumulator
  return y;
}

// y [N, out] = x_q w_q^T in the model dtype; fills sv.
Tensor fp8_forward(const ModuleContext& ctx, int id, const fp8::Operand& x, const Tensor& w,
                   Fp8Saved& sv) {
  Tensor xq;
  fp8_cast_input(ctx, id, x, xq, sv);
  return fp8_gemm_forward(ctx, id, xq, w, sv);
}

// The output gradient g2 [N, out] cast (with its transpose) at the scaling s.
void fp8_cast_grad(const ModuleContext& ctx, const fp8::Scaling& s, const Tensor& g2, Tensor& gq,
                   Tensor& gqt) {
  ctx.fp8->cast(s, g2, &gq, &gqt);
}

// dx [N, in] = g_q (w_q^T)^T (beta: 0 writes, 1 adds; dx_fp8: an FP8 dx cast at its scale, its
// amax recorded) and dW += g_q^T x_q (FP8, or with --no-fp8-wgrad the high-precision gemm of g2
// and x2, which only that case reads; dw undefined: none).
void fp8_backward(const ModuleContext& ctx, const fp8::Scaling& sg, const Tensor& gq,
                  const Tensor& gqt, const Tensor& weight_t, const Tensor& g2, const Tensor& x2,
                  const Fp8Saved& sv, Tensor& dx, float dx_beta, Tensor& dw, float dw_beta,
                  const fp8::Scaling* dx_fp8 = nullptr) {
  ops::Fp8GemmArgs dgrad{.beta = dx_beta};
  if (dx_fp8) {
    dgrad.out_scale = dx_fp8->scale;
    dgrad.out_amax = dx_fp8->amax;
  }
  ctx.op().fp8_gemm(dx, gq, weight_t, sg.scale_inv, sv.weight_scale_inv, dgrad);
  if (!dw.defined()) return;  // the caller writes the weight gradient itself
  if (ctx.config->fp8.wgrad)
    ctx.op().fp8_gemm(dw, gqt, sv.input_t, sg.scale_inv, sv.input_scale_inv,
                      ops::Fp8GemmArgs{.beta = dw_beta});
  else {
    MG_CHECK(g2.defined() && x2.defined(),
             "FP8 linear: --no-fp8-wgrad needs the high-precision output gradient and input "
             "(not with a fused cast)");
    ctx.op().gemm(dw, g2, x2, ops::GemmArgs{.trans_a = true, .beta = dw_beta});
  }
}

fp8::Scaling fp8_grad_scaling(const ModuleContext& ctx, int id, std::span<const Tensor> gs) {
  return ctx.fp8->scaling(id, fp8::Role::grad_output, gs, ctx.fp8_training, ctx.tp_group);
}

}  // namespace

// ---- ColumnParallelLinear ----------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const ModuleContext& ctx, ParamBuilder& pb,
                                           const std::string& name_prefix,
                                           const ColumnParallelLinearConfig& config)
    : ctx_(ctx), cfg_(config) {
  MG_CHECK(cfg_.input_size >= 1 && cfg_.output_size >= 1,
           "ColumnParallelLinear " << name_prefix << ": input_size " << cfg_.input_size
                                   << ", output_size " << cfg_.output_size);
  const Partition part = ctx.tp_partition(0, cfg_.partition_stride);
  out_local_ = local_shape({cfg_.output_size}, part)[0];
  if (!cfg_.skip_weight_param_allocation)
    pb.add(w_, name_prefix + "weight", {cfg_.output_size, cfg_.input_size}, cfg_.init, part);
  if (cfg_.bias) pb.add(b_, name_prefix + "bias", {cfg_.output_size}, InitRule::zeros, part);
  if (!cfg_.skip_weight_param_allocation) fp8_id_ = fp8_linear_id(ctx, name_prefix);
}

Tensor ColumnParallelLinear::enter(const Tensor& x, Saved& saved) const {
  const int64_t in = cfg_.input_size;
  MG_CHECK(x.dim() >= 1 && x.size(-1) == in,
           "ColumnParallelLinear: input " << x.str() << ", expected [.., " << in << "]");
  const Tensor total = region_enter(ctx_, x);
  if (ctx_.tp_size() > 1) saved.input = total;
  return total;
}

Tensor ColumnParallelLinear::forward(const Tensor& x, Saved& saved, const Weight* weight) const {
  const Weight& w = weight ? *weight : w_;
  MG_CHECK(w.value.defined(),
           "ColumnParallelLinear: no weight (skip_weight_param_allocation "
           "needs one given to forward)");
  const int64_t in = cfg_.input_size, out = w.value.size(0);
  const Tensor total = enter(x, saved);
  const int64_t n = total.numel() / in;
  const Tensor x2 = total.view({n, in});  // [N, in]
  Tensor y;                               // [N, out/TP]
  if (out == 0) {
    y = ctx_.empty({n, 0});  // a shard with no output rows (the output layer's padding)
  } else if (fp8_id_ >= 0 && !weight) {
    y = fp8_forward(ctx_, fp8_id_, fp8::Operand::tensor(x2), w.value, saved.fp8);
    if (b_.defined()) ctx_.op().bias_add(y, b_.value);
  } else if (b_.defined() && cfg_.gemm_bias_fusion) {  // x W^T + b in one GEMM (bias epilogue)
    y = ctx_.empty({n, out});
    Tensor none, none2;
    ctx_.op().gemm_epilogue(
        y, none, none2, x2, w.value, b_.value,
        ops::GemmEpilogueArgs{.trans_b = true, .epilogue = ops::GemmEpilogue::bias});
  } else {
    y = linear_fwd(ctx_, x2, w.value);
    if (b_.defined()) ctx_.op().bias_add(y, b_.value);
  }
  Tensor o = y.view(with_last(total.shape(), out));
  return cfg_.gather_output && ctx_.tp_size() > 1
             ? gather_from_tensor_model_parallel_region(o, *ctx_.tp_group)
             : o;
}

bool ColumnParallelLinear::fuses_input_operand() const {
  return fp8_id_ >= 0 && ctx_.config->fp8.wgrad && ctx_.tp_size() == 1 && !cfg_.gather_output;
}

Tensor ColumnParallelLinear::forward(const fp8::Operand& x, Saved& saved) const {
  MG_CHECK(fuses_input_operand(),
           "ColumnParallelLinear::forward(Operand): needs an FP8 linear with FP8 weight gradients "
           "at TP 1 (fuses_input_operand)");
  const int64_t in = cfg_.input_size, out = w_.value.size(0);
  MG_CHECK(x.cols() == in,
           "ColumnParallelLinear: operand of " << x.cols() << " columns, expected " << in);
  Tensor y = fp8_forward(ctx_, fp8_id_, x, w_.value, saved.fp8);  // TP 1: no region to enter
  if (b_.defined()) ctx_.op().bias_add(y, b_.value);
  return y.view(with_last(x.x.shape(), out));
}

Tensor ColumnParallelLinear::forward_bias_gelu(const Tensor& x, Saved& saved,
                                               Tensor& pre_activation) const {
  MG_CHECK(!cfg_.gather_output, "ColumnParallelLinear::forward_bias_gelu: not with gather_output");
  const int64_t in = cfg_.input_size;
  const Tensor total = enter(x, saved);
  const int64_t n = total.numel() / in;
  Tensor a = ctx_.empty({n, out_local_});
  if (fp8_id_ >= 0) {  // FP8 GEMM, then bias and GELU (tanh) as ops
    pre_activation =
        fp8_forward(ctx_, fp8_id_, fp8::Operand::tensor(total.view({n, in})), w_.value, saved.fp8);
    if (b_.defined()) ctx_.op().bias_add(pre_activation, b_.value);
    ctx_.op().gelu_fwd(a, pre_activation, ops::GeluApprox::tanh);
    return a.view(with_last(total.shape(), out_local_));
  }
  pre_activation = ctx_.empty({n, out_local_});  // x W^T + b, kept for the backward
  Tensor none;
  ctx_.op().gemm_epilogue(
      a, pre_activation, none, total.view({n, in}), w_.value, b_.value,
      ops::GemmEpilogueArgs{.trans_b = true, .epilogue = ops::GemmEpilogue::bias_gelu});
  return a.view(with_last(total.shape(), out_local_));
}

const ColumnParallelLinear::RowMaps& ColumnParallelLinear::row_maps(
    const OutputSplit& split) const {
  auto same = [](const OutputSplit::Block& a, const OutputSplit::Block& b) {
    return a.part == b.part && a.offset == b.offset && a.rows == b.rows;
  };
  if (row_maps_.blocks.size() == split.blocks.size() &&
      std::equal(split.blocks.begin(), split.blocks.end(), row_maps_.blocks.begin(), same))
    return row_maps_;
  row_maps_ = RowMaps{split.blocks, Tensor(), Tensor()};
  if (split.blocks.size() <= split.part_rows.size()) return row_maps_;  // one block per part
  const std::vector<int64_t> base = part_offsets(split);
  std::vector<int64_t> filled(split.part_rows.size(), 0);
  std::vector<int64_t> to(static_cast<std::size_t>(out_local_)),
      from(static_cast<std::size_t>(out_local_));
  for (const OutputSplit::Block& blk : split.blocks) {
    const auto p = static_cast<std::size_t>(blk.part);
    for (int64_t k = 0; k < blk.rows; ++k) {
      const int64_t part_row = base[p] + filled[p] + k, row = blk.offset + k;
      to[static_cast<std::size_t>(part_row)] = row;
      from[static_cast<std::size_t>(row)] = part_row;
    }
    filled[p] += blk.rows;
  }
  row_maps_.to_parts = Tensor::from_vector(to, {out_local_}, DType::i64).to(ctx_.device);
  row_maps_.from_parts = Tensor::from_vector(from, {out_local_}, DType::i64).to(ctx_.device);
  return row_maps_;
}

// Rows as 2-D [rows, elements per row] (a bias is [out, 1]) for the row gather.
Tensor as_rows(const Tensor& t) {
  return t.view({t.size(0), t.numel() / t.size(0)});
}

// With several blocks per part (QKV's groups: 3 x groups blocks), one row gather
// (moe_permute: rows[i] = x[index[i]], a byte copy of any dtype) instead of a copy per block:
// the same bytes.
Tensor ColumnParallelLinear::regroup(const Tensor& full, const OutputSplit& split) const {
  Tensor t = Tensor::empty(full.shape(), full.dtype(), full.device());
  const RowMaps& maps = row_maps(split);
  if (maps.to_parts.defined()) {
    Tensor rows = as_rows(t);
    ctx_.op().moe_permute(rows, as_rows(full), maps.to_parts);
    return t;
  }
  const std::vector<int64_t> base = part_offsets(split);
  std::vector<int64_t> filled(split.part_rows.size(), 0);
  for (const OutputSplit::Block& blk : split.blocks) {
    const auto p = static_cast<std::size_t>(blk.part);
    t.slice(base[p] + filled[p], blk.rows).copy_(full.slice(blk.offset, blk.rows));
    filled[p] += blk.rows;
  }
  return t;
}

// With several blocks per part, the rows gathered back into block order and one axpy (instead
// of an axpy per block: 72 launches per GPT-2 layer's QKV on the H200); each element gets the
// same single add either way.
void ColumnParallelLinear::add_ungrouped(Tensor& grad, const Tensor& parts,
                                         const OutputSplit& split) const {
  const RowMaps& maps = row_maps(split);
  if (maps.from_parts.defined()) {
    Tensor back = Tensor::empty(parts.shape(), parts.dtype(), parts.device());
    Tensor rows = as_rows(back);
    ctx_.op().moe_permute(rows, as_rows(parts), maps.from_parts);
    ctx_.op().axpy(grad, back, 1.0f);
    return;
  }
  const std::vector<int64_t> base = part_offsets(split);
  std::vector<int64_t> filled(split.part_rows.size(), 0);
  for (const OutputSplit::Block& blk : split.blocks) {
    const auto p = static_cast<std::size_t>(blk.part);
    Tensor g = grad.slice(blk.offset, blk.rows);
    ctx_.op().axpy(g, parts.slice(base[p] + filled[p], blk.rows), 1.0f);
    filled[p] += blk.rows;
  }
}

std::vector<Tensor> ColumnParallelLinear::forward_split(const Tensor& x, Saved& saved,
                                                        const OutputSplit& split) const {
  MG_CHECK(!cfg_.gather_output, "ColumnParallelLinear::forward_split: not with gather_output");
  check_split_rows(split, out_local_);
  const int64_t in = cfg_.input_size;
  const Tensor total = enter(x, saved);
  const int64_t n = total.numel() / in;
  const Tensor x2 = total.view({n, in});
  if (fp8_id_ >= 0) return fp8_forward_split(fp8::Operand::tensor(x2), saved, split);
  const std::vector<int64_t> base = part_offsets(split);
  const Tensor bias = b_.defined() ? regroup(b_.value, split) : Tensor();
  std::vector<Tensor> parts;
  const Tensor w = regroup(w_.value, split);
  for (std::size_t p = 0; p < split.part_rows.size(); ++p) {
    const int64_t r = split.part_rows[p];
    const Tensor wp = w.slice(base[p], r);
    if (b_.defined() && cfg_.gemm_bias_fusion) {
      Tensor y = ctx_.empty({n, r});
      Tensor none, none2;
      ctx_.op().gemm_epilogue(
          y, none, none2, x2, wp, bias.slice(base[p], r),
          ops::GemmEpilogueArgs{.trans_b = true, .epilogue = ops::GemmEpilogue::bias});
      parts.push_back(y);
    } else {
      Tensor y = linear_fwd(ctx_, x2, wp);
      if (b_.defined()) ctx_.op().bias_add(y, bias.slice(base[p], r));
      parts.push_back(y);
    }
  }
  return parts;
}

std::vector<Tensor> ColumnParallelLinear::forward_split(const fp8::Operand& x, Saved& saved,
                                                        const OutputSplit& split) const {
  MG_CHECK(fuses_input_operand(),
           "ColumnParallelLinear::forward_split(Operand): needs an FP8 linear with FP8 weight "
           "gradients at TP 1 (fuses_input_operand)");
  MG_CHECK(x.cols() == cfg_.input_size, "ColumnParallelLinear::forward_split: operand of "
                                            << x.cols() << " columns, expected "
                                            << cfg_.input_size);
  check_split_rows(split, out_local_);
  return fp8_forward_split(x, saved, split);
}

// One cast of x (or of the operand made inside the cast) and of the (regrouped) weight, one FP8
// GEMM per part.
std::vector<Tensor> ColumnParallelLinear::fp8_forward_split(const fp8::Operand& x2, Saved& saved,
                                                            const OutputSplit& split) const {
  const int64_t n = x2.rows();
  const std::vector<int64_t> base = part_offsets(split);
  const Tensor bias = b_.defined() ? regroup(b_.value, split) : Tensor();
  std::vector<Tensor> parts;
  Tensor xq;
  fp8_cast_input(ctx_, fp8_id_, x2, xq, saved.fp8);
  const fp8::WeightFp8* cached = ctx_.fp8->cached_weight(fp8_id_, ctx_.fp8_training);
  const fp8::WeightFp8 wf =
      cached ? *cached
             : ctx_.fp8->cast_weight(
                   fp8_id_,
                   regroup(ctx_.fp8->param_gather() ? ctx_.fp8->param_q(fp8_id_) : w_.value, split),
                   split.part_rows, ctx_.fp8_training, ctx_.tp_group);
  MG_CHECK(wf.q.size() == split.part_rows.size(),
           "FP8 linear " << ctx_.fp8->names()[static_cast<std::size_t>(fp8_id_)]
                         << ": its cached weight holds " << wf.q.size() << " part(s), the split "
                         << split.part_rows.size());
  for (std::size_t p = 0; p < wf.q.size(); ++p)
    MG_CHECK(wf.q[p].size(0) == split.part_rows[p],
             "FP8 linear: cached weight part " << p << " has " << wf.q[p].size(0)
                                               << " rows, the split " << split.part_rows[p]);
  saved.fp8.weight_scale_inv = wf.scale_inv;
  saved.fp8.weight_parts_t = wf.qt;
  for (std::size_t p = 0; p < split.part_rows.size(); ++p) {
    Tensor y = ctx_.empty({n, split.part_rows[p]});
    ctx_.op().fp8_gemm(y, xq, wf.q[p], saved.fp8.input_scale_inv, wf.scale_inv,
                       ops::Fp8GemmArgs{.fast_accum = true});
    if (b_.defined()) ctx_.op().bias_add(y, bias.slice(base[p], split.part_rows[p]));
    parts.push_back(y);
  }
  return parts;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, const Tensor& x, Saved& saved,
                                      bool bias_grad_done, Weight* weight) {
  Weight& w = weight ? *weight : w_;
  // total undefined: forward(Operand)'s input, never written (FP8 weight gradients read x_q^T).
  const Tensor total = saved.input.defined() ? saved.input : x;
  MG_CHECK(total.defined() || (fp8_id_ >= 0 && !weight && fuses_input_operand()),
           "ColumnParallelLinear::backward: no input x (only forward(Operand)'s FP8 linear runs "
           "without it)");
  const int64_t in = cfg_.input_size, out = w.value.size(0);
  const Tensor g = cfg_.gather_output && ctx_.tp_size() > 1
                       ? gather_from_tensor_model_parallel_region_bwd(dy, *ctx_.tp_group)
                       : dy;
  const int64_t n = total.defined() ? total.numel() / in : g.numel() / out;
  const Tensor x2 = total.defined() ? total.view({n, in}) : Tensor();
  const Tensor g2 = g.view({n, out});  // [N, out/TP]
  Tensor dx = ctx_.empty({n, in});     // partial sum over the output shards
  if (out == 0) {
    ctx_.op().fill(dx, 0.0);  // no output rows: no contribution
  } else if (fp8_id_ >= 0 && !weight) {
    if (b_.defined() && !bias_grad_done) ctx_.op().bias_grad(b_.grad, g2);
    const fp8::Scaling sg = fp8_grad_scaling(ctx_, fp8_id_, std::span<const Tensor>(&g2, 1));
    Tensor gq, gqt;
    fp8_cast_grad(ctx_, sg, g2, gq, gqt);
    fp8_backward(ctx_, sg, gq, gqt, saved.fp8.weight_t, g2, x2, saved.fp8, dx, 0.0f, w.grad, 1.0f);
  } else if (b_.defined() && !bias_grad_done && cfg_.gemm_bias_fusion) {
    // dW += dy^T x with dbias += sum_n dy on the weight-gradient GEMM (bgrad epilogue); under SP
    // the input is the gathered [N, in] and dy this rank's [N, out/TP]: the sums are complete.
    Tensor none;
    ctx_.op().gemm_epilogue(
        w.grad, none, b_.grad, g2, x2, Tensor(),
        ops::GemmEpilogueArgs{.trans_a = true, .epilogue = ops::GemmEpilogue::bgrad, .beta = 1.0f});
    ctx_.op().gemm(dx, g2, w.value, ops::GemmArgs{});
  } else {
    if (b_.defined() && !bias_grad_done) ctx_.op().bias_grad(b_.grad, g2);
    linear_bwd(ctx_, dx, w.grad, g2, x2, w.value);
  }
  saved = Saved{};
  return region_enter_bwd(ctx_,
                          dx.view(with_last(total.defined() ? total.shape() : g.shape(), in)));
}

bool ColumnParallelLinear::fuses_grad_cast() const {
  return fp8_id_ >= 0 && !b_.defined() && !cfg_.gather_output && ctx_.config->fp8.wgrad;
}

Tensor ColumnParallelLinear::backward_dswiglu(const Tensor& da, const Tensor& u, const Tensor& x,
                                              Saved& saved) {
  MG_CHECK(fuses_grad_cast(),
           "ColumnParallelLinear::backward_dswiglu: needs an FP8 linear with FP8 weight "
           "gradients, no bias and no gather_output (fuses_grad_cast)");
  const Tensor total = saved.input.defined() ? saved.input : x;  // undefined: forward(Operand)
  const int64_t in = cfg_.input_size, n = u.numel() / out_local_;
  MG_CHECK((!total.defined() || total.numel() == n * in) && u.numel() == n * out_local_ &&
               da.numel() * 2 == u.numel(),
           "ColumnParallelLinear::backward_dswiglu: u "
               << u.str() << " and da " << da.str() << " for " << n << " tokens of " << out_local_
               << " outputs");
  // The output gradient swiglu_bwd(da, u) [N, out/TP], cast (E5M2 under hybrid) without being
  // written in the model dtype.
  const fp8::Operand g =
      fp8::Operand::dswiglu(da.view({n, out_local_ / 2}), u.view({n, out_local_}));
  const fp8::Scaling sg =
      ctx_.fp8->scaling(fp8_id_, fp8::Role::grad_output, std::span<const fp8::Operand>(&g, 1),
                        ctx_.fp8_training, ctx_.tp_group);
  Tensor gq, gqt;
  ctx_.fp8->cast(sg, g, &gq, &gqt);
  Tensor dx = ctx_.empty({n, in});
  fp8_backward(ctx_, sg, gq, gqt, saved.fp8.weight_t, Tensor(), Tensor(), saved.fp8, dx, 0.0f,
               w_.grad, 1.0f);
  saved = Saved{};
  return region_enter_bwd(ctx_,
                          dx.view(with_last(total.defined() ? total.shape() : u.shape(), in)));
}

Tensor ColumnParallelLinear::backward_split(const std::vector<Tensor>& dparts, const Tensor& x,
                                            Saved& saved, const OutputSplit& split) {
  MG_CHECK(dparts.size() == split.part_rows.size(),
           "ColumnParallelLinear::backward_split: " << dparts.size() << " gradients for "
                                                    << split.part_rows.size() << " parts");
  const Tensor total = saved.input.defined() ? saved.input : x;  // undefined: forward(Operand)
  MG_CHECK(total.defined() || fuses_input_operand(),
           "ColumnParallelLinear::backward_split: no input x (only forward_split(Operand)'s FP8 "
           "linear runs without it)");
  const int64_t in = cfg_.input_size, n = total.defined() ? total.numel() / in : dparts[0].size(0);
  const Tensor x2 = total.defined() ? total.view({n, in}) : Tensor();
  const std::vector<int64_t> base = part_offsets(split);
  const std::size_t np = split.part_rows.size();
  // FP8 weight gradients straight into the main_grad rows of each block (beta 1): the rows of
  // part p's transposed gradient gqt are its blocks' rows in order, so block b's gradient is
  // dW[b] += gqt[rows of b] x_q -- no regrouped scratch, no gather back, no axpy. Needs FP8 weight
  // gradients, no bias (its sums would be column slices of the parts) and block rows multiples of
  // 16 (fp8_gemm's M). Otherwise: part by part into regrouped scratch, then added into the
  // main_grad rows of each block.
  bool direct = fp8_id_ >= 0 && ctx_.config->fp8.wgrad && !b_.defined();
  for (const OutputSplit::Block& blk : split.blocks) direct = direct && blk.rows % 16 == 0;
  Tensor dw, db;
  if (!direct) dw = Tensor::empty(w_.grad.shape(), ctx_.grad_dtype, ctx_.device);
  if (b_.defined()) db = Tensor::zeros(b_.grad.shape(), ctx_.grad_dtype, ctx_.device);
  Tensor dx8;  // FP8: dx = sum_p g_p W_p, accumulated part by part
  if (fp8_id_ >= 0) {
    const fp8::Scaling sg = fp8_grad_scaling(ctx_, fp8_id_, dparts);
    dx8 = ctx_.empty({n, in});
    std::vector<int64_t> filled(np, 0);
    for (std::size_t p = 0; p < np; ++p) {
      const int64_t r = split.part_rows[p];
      if (b_.defined()) {
        Tensor dbp = db.slice(base[p], r);
        ctx_.op().bias_grad(dbp, dparts[p]);
      }
      Tensor gq, gqt;
      fp8_cast_grad(ctx_, sg, dparts[p], gq, gqt);
      Tensor dwp = direct ? Tensor() : dw.slice(base[p], r);  // direct: the blocks below
      fp8_backward(ctx_, sg, gq, gqt, saved.fp8.weight_parts_t[p], dparts[p], x2, saved.fp8, dx8,
                   p == 0 ? 0.0f : 1.0f, dwp, 0.0f);
      if (!direct) continue;
      for (const OutputSplit::Block& blk : split.blocks) {
        if (static_cast<std::size_t>(blk.part) != p) continue;
        Tensor dwb = w_.grad.slice(blk.offset, blk.rows);
        ctx_.op().fp8_gemm(dwb, gqt.slice(filled[p], blk.rows), saved.fp8.input_t, sg.scale_inv,
                           saved.fp8.input_scale_inv, ops::Fp8GemmArgs{.beta = 1.0f});
        filled[p] += blk.rows;
      }
    }
  }
  for (std::size_t p = 0; p < np && fp8_id_ < 0; ++p) {
    const int64_t r = split.part_rows[p];
    Tensor dwp = dw.slice(base[p], r);
    if (b_.defined() && cfg_.gemm_bias_fusion) {  // dW = dy^T x with dbias = sum_n dy (bgrad)
      Tensor none;
      Tensor dbp = db.slice(base[p], r);
      ctx_.op().gemm_epilogue(
          dwp, none, dbp, dparts[p], x2, Tensor(),
          ops::GemmEpilogueArgs{.trans_a = true, .epilogue = ops::GemmEpilogue::bgrad});
    } else {
      if (b_.defined()) {
        Tensor dbp = db.slice(base[p], r);
        ctx_.op().bias_grad(dbp, dparts[p]);
      }
      ctx_.op().gemm(dwp, dparts[p], x2, ops::GemmArgs{.trans_a = true, .beta = 0.0f});
    }
  }
  if (b_.defined()) add_ungrouped(b_.grad, db, split);
  if (!direct) add_ungrouped(w_.grad, dw, split);
  // dx = sum_p d(part p) W_p with the regrouped weight.
  Tensor dx = dx8;
  if (fp8_id_ < 0) {
    const Tensor w = regroup(w_.value, split);
    dx = ctx_.empty({n, in});
    for (std::size_t p = 0; p < np; ++p)
      ctx_.op().gemm(dx, dparts[p], w.slice(base[p], split.part_rows[p]),
                     ops::GemmArgs{.beta = p == 0 ? 0.0f : 1.0f});
  }
  saved = Saved{};
  return region_enter_bwd(ctx_, total.defined() ? dx.view(with_last(total.shape(), in)) : dx);
}

// ---- RowParallelLinear -------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(const ModuleContext& ctx, ParamBuilder& pb,
                                     const std::string& name_prefix,
                                     const RowParallelLinearConfig& config)
    : ctx_(ctx), cfg_(config) {
  MG_CHECK(cfg_.input_size >= 1 && cfg_.output_size >= 1,
           "RowParallelLinear " << name_prefix << ": input_size " << cfg_.input_size
                                << ", output_size " << cfg_.output_size);
  const Partition part = ctx.tp_partition(1);
  in_local_ = local_shape({cfg_.output_size, cfg_.input_size}, part)[1];
  pb.add(w_, name_prefix + "weight", {cfg_.output_size, cfg_.input_size}, cfg_.init, part);
  // Replicated; under SP each rank adds it to (and takes the gradient of) its own sequence shard.
  if (cfg_.bias)
    pb.add(b_, name_prefix + "bias", {cfg_.output_size}, InitRule::zeros, Partition{},
           ctx.sequence_parallel && ctx.tp_size() > 1);
  fp8_id_ = fp8_linear_id(ctx, name_prefix);
}

Tensor RowParallelLinear::forward(const Tensor& x) const {
  Saved saved;
  return forward(x, saved);
}

Tensor RowParallelLinear::backward(const Tensor& dy, const Tensor& x) {
  MG_CHECK(fp8_id_ < 0,
           "RowParallelLinear::backward: an FP8 linear needs the Saved of its forward");
  Saved saved;
  return backward(dy, x, saved);
}

Tensor RowParallelLinear::backward_dgelu_bgrad(const Tensor& dy, const Tensor& x,
                                               const Tensor& pre_activation, Tensor& dbias_prev) {
  MG_CHECK(fp8_id_ < 0,
           "RowParallelLinear::backward_dgelu_bgrad: an FP8 linear needs the Saved of "
           "its forward");
  Saved saved;
  return backward_dgelu_bgrad(dy, x, pre_activation, dbias_prev, saved);
}

Tensor RowParallelLinear::forward(const Tensor& x, Saved& saved) const {
  const Tensor xp = cfg_.input_is_parallel || ctx_.tp_size() == 1
                        ? x
                        : scatter_to_tensor_model_parallel_region(x, *ctx_.tp_group);
  MG_CHECK(xp.dim() >= 1 && xp.size(-1) == in_local_,
           "RowParallelLinear: input " << x.str() << ", expected [.., "
                                       << (cfg_.input_is_parallel ? in_local_ : cfg_.input_size)
                                       << "]");
  const int64_t n = xp.numel() / in_local_, out = cfg_.output_size;
  Tensor y = fp8_id_ >= 0
                 ? fp8_forward(ctx_, fp8_id_, fp8::Operand::tensor(xp.view({n, in_local_})),
                               w_.value, saved.fp8)
                 : linear_fwd(ctx_, xp.view({n, in_local_}), w_.value);  // partial over TP
  y = region_exit(ctx_, y.view(with_last(xp.shape(), out)));
  if (b_.defined() && !cfg_.skip_bias_add) {
    Tensor y2 = y.view({y.numel() / out, out});
    ctx_.op().bias_add(y2, b_.value);
  }
  return y;
}

bool RowParallelLinear::fuses_input_cast() const {
  return fp8_id_ >= 0 && cfg_.input_is_parallel && ctx_.config->fp8.wgrad;
}

Tensor RowParallelLinear::forward_swiglu(const Tensor& u, Saved& saved) const {
  MG_CHECK(fuses_input_cast(),
           "RowParallelLinear::forward_swiglu: needs an FP8 linear with FP8 weight gradients and "
           "a parallel input (fuses_input_cast)");
  MG_CHECK(u.dim() >= 1 && u.size(-1) == 2 * in_local_, "RowParallelLinear::forward_swiglu: u "
                                                            << u.str() << ", expected [.., "
                                                            << 2 * in_local_ << "] (gate | up)");
  const int64_t n = u.numel() / u.size(-1), out = cfg_.output_size;
  const fp8::Operand x = fp8::Operand::swiglu(u.view({n, 2 * in_local_}));
  Tensor y = fp8_forward(ctx_, fp8_id_, x, w_.value, saved.fp8);  // partial over TP
  y = region_exit(ctx_, y.view(with_last(u.shape(), out)));
  if (b_.defined() && !cfg_.skip_bias_add) {
    Tensor y2 = y.view({y.numel() / out, out});
    ctx_.op().bias_add(y2, b_.value);
  }
  return y;
}

Tensor RowParallelLinear::forward_fp8_input(const Tensor& xq, const Tensor& x_scale_inv,
                                            Saved& saved) const {
  MG_CHECK(fp8_id_ >= 0 && cfg_.input_is_parallel,
           "RowParallelLinear::forward_fp8_input: needs an FP8 linear with a parallel input");
  MG_CHECK(xq.dim() >= 1 && xq.size(-1) == in_local_ && xq.dtype() == DType::fp8_e4m3,
           "RowParallelLinear::forward_fp8_input: xq " << xq.str() << ", expected fp8_e4m3 [.., "
                                                       << in_local_ << "]");
  const int64_t n = xq.numel() / in_local_, out = cfg_.output_size;
  saved.fp8.input_t = Tensor();  // made from xq by the backward
  saved.fp8.input_scale_inv = x_scale_inv;
  Tensor y = fp8_gemm_forward(ctx_, fp8_id_, xq.view({n, in_local_}), w_.value, saved.fp8);
  y = region_exit(ctx_, y.view(with_last(xq.shape(), out)));  // partial over TP
  if (b_.defined() && !cfg_.skip_bias_add) {
    Tensor y2 = y.view({y.numel() / out, out});
    ctx_.op().bias_add(y2, b_.value);
  }
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, const Tensor& x, Saved& saved) {
  return backward_impl(dy, x, saved, nullptr);
}

Tensor RowParallelLinear::backward_fp8_dgrad(const Tensor& dy, const Tensor& x, Saved& saved,
                                             const fp8::Scaling& dx_scaling) {
  MG_CHECK(fp8_id_ >= 0 && cfg_.input_is_parallel,
           "RowParallelLinear::backward_fp8_dgrad: needs an FP8 linear with a parallel input");
  return backward_impl(dy, x, saved, &dx_scaling);
}

Tensor RowParallelLinear::backward_impl(const Tensor& dy, const Tensor& x, Saved& saved,
                                        const fp8::Scaling* dx_scaling) {
  const int64_t out = cfg_.output_size;
  if (b_.defined() && !cfg_.skip_bias_add)
    ctx_.op().bias_grad(b_.grad, dy.view({dy.numel() / out, out}));
  const Tensor g = region_exit_bwd(ctx_, dy);
  // x undefined: the input was never written (forward_swiglu), which FP8 weight gradients
  // do not need.
  MG_CHECK(x.defined() || fuses_input_cast(),
           "RowParallelLinear::backward: no input x (only an FP8 linear with FP8 weight "
           "gradients runs without it)");
  const Tensor xp = !x.defined() || cfg_.input_is_parallel || ctx_.tp_size() == 1
                        ? x
                        : scatter_to_tensor_model_parallel_region(x, *ctx_.tp_group);
  const int64_t n = g.numel() / out;
  Tensor dx = dx_scaling ? Tensor::empty({n, in_local_}, dx_scaling->dtype, ctx_.device)
                         : ctx_.empty({n, in_local_});
  if (fp8_id_ >= 0) {
    const Tensor g2 = g.view({n, out});
    const fp8::Scaling sg = fp8_grad_scaling(ctx_, fp8_id_, std::span<const Tensor>(&g2, 1));
    Tensor gq, gqt;
    fp8_cast_grad(ctx_, sg, g2, gq, gqt);
    Tensor x2 = xp.defined() ? xp.view({n, in_local_}) : Tensor();
    if (x2.defined() && (x2.dtype() == DType::fp8_e4m3 || x2.dtype() == DType::fp8_e5m2)) {
      // forward_fp8_input's FP8 input: the weight gradient's column-wise copy made from it.
      MG_CHECK(ctx_.config->fp8.wgrad,
               "RowParallelLinear::backward: an FP8 input x with --no-fp8-wgrad (the model-dtype "
               "weight gradient needs the model-dtype input)");
      saved.fp8.input_t = Tensor::empty({in_local_, n}, x2.dtype(), ctx_.device);
      ctx_.op().fp8_transpose(saved.fp8.input_t, x2);
      x2 = Tensor();
    }
    fp8_backward(ctx_, sg, gq, gqt, saved.fp8.weight_t, g2, x2, saved.fp8, dx, 0.0f, w_.grad, 1.0f,
                 dx_scaling);
    saved = Saved{};
  } else {
    linear_bwd(ctx_, dx, w_.grad, g.view({n, out}), xp.view({n, in_local_}), w_.value);
  }
  dx = dx.view(with_last(g.shape(), in_local_));
  return cfg_.input_is_parallel || ctx_.tp_size() == 1
             ? dx
             : scatter_to_tensor_model_parallel_region_bwd(dx, *ctx_.tp_group);
}

Tensor RowParallelLinear::backward_dgelu_bgrad(const Tensor& dy, const Tensor& x,
                                               const Tensor& pre_activation, Tensor& dbias_prev,
                                               Saved& saved) {
  MG_CHECK(cfg_.input_is_parallel && (!b_.defined() || cfg_.skip_bias_add),
           "RowParallelLinear::backward_dgelu_bgrad: needs input_is_parallel and no bias of its "
           "own to add");
  const int64_t out = cfg_.output_size;
  const Tensor g = region_exit_bwd(ctx_, dy);
  const int64_t n = g.numel() / out;
  const Tensor g2 = g.view({n, out});
  Tensor du = ctx_.empty(pre_activation.shape());
  if (fp8_id_ >= 0) {  // FP8 data gradient, then GELU's gradient and the bias sums as ops
    const fp8::Scaling sg = fp8_grad_scaling(ctx_, fp8_id_, std::span<const Tensor>(&g2, 1));
    Tensor gq, gqt;
    fp8_cast_grad(ctx_, sg, g2, gq, gqt);
    Tensor da = ctx_.empty(pre_activation.shape());
    fp8_backward(ctx_, sg, gq, gqt, saved.fp8.weight_t, g2, x.view({n, in_local_}), saved.fp8, da,
                 0.0f, w_.grad, 1.0f);
    ctx_.op().gelu_bwd(du, da, pre_activation, ops::GeluApprox::tanh);
    if (dbias_prev.defined()) ctx_.op().bias_grad(dbias_prev, du);
    saved = Saved{};
    return du;
  }
  // d(pre-act) = gelu'(pre) * (dy W) and dbias_prev += its column sums, in one GEMM.
  Tensor pre = pre_activation;  // the epilogue's aux input (a view, not written)
  ctx_.op().gemm_epilogue(du, pre, dbias_prev, g2, w_.value, Tensor(),
                          ops::GemmEpilogueArgs{.epilogue = ops::GemmEpilogue::dgelu_bgrad});
  ctx_.op().gemm(w_.grad, g2, x.view({n, in_local_}),
                 ops::GemmArgs{.trans_a = true, .beta = 1.0f});  // dW += dy^T x
  return du;
}

// ---- VocabParallelEmbedding --------------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(const ModuleContext& ctx, ParamBuilder& pb,
                                               const std::string& name, int64_t padded_vocab,
                                               int64_t hidden, bool reduce_scatter_embeddings)
    : ctx_(ctx), reduce_scatter_(reduce_scatter_embeddings), h_(hidden) {
  MG_CHECK(!reduce_scatter_ || ctx.sequence_parallel || ctx.tp_size() == 1,
           "VocabParallelEmbedding " << name << ": reduce_scatter_embeddings needs sequence "
                                     << "parallelism");
  const VocabRange r = vocab_range(padded_vocab, ctx.tp_rank(), ctx.tp_size());
  vocab_start_ = r.start;
  vocab_end_ = r.end;
  pb.add(w_, name, {padded_vocab, hidden}, InitRule::normal, ctx.tp_partition(0));
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids, int64_t s, int64_t b) const {
  MG_CHECK(ids.numel() == s * b, "VocabParallelEmbedding: " << ids.numel() << " ids for [S, B] = ["
                                                            << s << ", " << b << "]");
  Tensor out = ctx_.empty({s, b, h_});  // this shard's rows, 0 for ids of other shards
  ctx_.op().embedding_fwd(out, ids, w_.value, vocab_start_);
  if (ctx_.tp_size() == 1) return out;
  return reduce_scatter_ ? reduce_scatter_to_sequence_parallel_region(out, *ctx_.tp_group)
                         : reduce_from_tensor_model_parallel_region(out, *ctx_.tp_group);
}

void VocabParallelEmbedding::backward(const Tensor& dy, const Tensor& ids) {
  Tensor g = dy;
  if (ctx_.tp_size() > 1)
    g = reduce_scatter_ ? reduce_scatter_to_sequence_parallel_region_bwd(dy, *ctx_.tp_group)
                        : reduce_from_tensor_model_parallel_region_bwd(dy, *ctx_.tp_group);
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
