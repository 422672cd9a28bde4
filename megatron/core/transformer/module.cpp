// Parameter declaration and flat-buffer layout, linear helpers, dropout and init seeds (module.h).
#include "megatron/core/transformer/module.h"

#include <algorithm>

#include "megatron/core/common/error.h"

namespace mg::transformer {

void ParamBuilder::add(Weight& w, const std::string& name, const Shape& shape, InitRule init,
                       int tp_dim) {
  add(w, name, shape, init, tensor_parallel::Partition{tp_dim, 1, 0, 1});
}

void ParamBuilder::add(Weight& w, const std::string& name, const Shape& global_shape, InitRule init,
                       const tensor_parallel::Partition& part, bool sequence_parallel) {
  for (const auto& p : params_) MG_CHECK(p.name != name, "parameter " << name << " declared twice");
  Parameter p;
  p.name = name;
  p.global_shape = global_shape;
  // Megatron's no-weight-decay rule: biases and 1-D (norm) parameters.
  p.no_weight_decay = global_shape.size() == 1 || name.ends_with(".bias");
  p.tensor_parallel_dim = part.dim;
  p.partition_stride = part.stride;
  p.sequence_parallel = sequence_parallel;
  w.index = static_cast<int>(params_.size());
  shapes_.push_back(tensor_parallel::local_shape(global_shape, part));
  params_.push_back(std::move(p));
  decls_.push_back(ParamDecl{init, part});
  weights_.push_back(&w);
}

void ParamBuilder::set_expert(const Weight& w) {
  MG_CHECK(w.index >= 0 && w.index < static_cast<int>(params_.size()),
           "ParamBuilder::set_expert: the weight was not declared");
  Parameter& p = params_[static_cast<std::size_t>(w.index)];
  p.is_expert = true;
  const tensor_parallel::Partition& part = decls_[static_cast<std::size_t>(w.index)].partition;
  p.expert_tp_rank = part.rank;
  p.expert_tp_size = part.size;
}

void ParamBuilder::finish(std::vector<Parameter>& params, ParamAndGradBuffer& buffer,
                          std::vector<ParamDecl>& decls) {
  // Reverse order of first use: the last-declared parameter sits at offset 0. With
  // --fp8-param-gather the FP8 linears' weights come first, as one run (Megatron keeps FP8
  // parameters in a buffer of their own; here the distributed optimizer's buckets of that run
  // gather FP8 bytes), each part in reverse order of first use.
  std::vector<char> fp8_weight(params_.size(), 0);
  bool any_fp8 = false;
  if (ctx_.fp8 && ctx_.fp8->param_gather())
    for (const std::string& linear : ctx_.fp8->names())
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (params_[i].name == linear + ".weight") fp8_weight[i] = 1, any_fp8 = true;
  int64_t total = 0;
  for (int pass = any_fp8 ? 0 : 1; pass < 2; ++pass)
    for (std::size_t i = params_.size(); i-- > 0;) {
      if ((fp8_weight[i] != 0) != (pass == 0)) continue;
      params_[i].buffer_offset = total;
      total += shape_numel(shapes_[i]);
    }
  if (ctx_.sparse_buffers) {  // FSDP: their discarded ranges give device memory back
    buffer.params = Tensor::zeros_sparse({total}, ctx_.dtype, ctx_.device);
    buffer.grads = Tensor::zeros_sparse({total}, ctx_.grad_dtype, ctx_.device);
  } else {
    buffer.params = Tensor::zeros({total}, ctx_.dtype, ctx_.device);
    buffer.grads = Tensor::zeros({total}, ctx_.grad_dtype, ctx_.device);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    const int64_t n = shape_numel(shapes_[i]);
    p.param = buffer.params.slice(p.buffer_offset, n).view(shapes_[i]);
    p.main_grad = buffer.grads.slice(p.buffer_offset, n).view(shapes_[i]);
    weights_[i]->value = p.param;
    weights_[i]->grad = p.main_grad;
  }
  params = std::move(params_);
  decls = std::move(decls_);
  shapes_.clear();
  weights_.clear();
}

Tensor linear_fwd(const ModuleContext& ctx, const Tensor& x, const Tensor& w) {
  Tensor y = ctx.empty({x.size(0), w.size(0)});  // [N, out]
  ctx.op().gemm(y, x, w, ops::GemmArgs{.trans_a = false, .trans_b = true});
  return y;
}

void linear_bwd(const ModuleContext& ctx, Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x,
                const Tensor& w, bool accumulate) {
  if (dx.defined())  // dx [N, in] = dy [N, out] @ w [out, in]
    ctx.op().gemm(dx, dy, w, ops::GemmArgs{.beta = accumulate ? 1.0f : 0.0f});
  // dw [out, in] += dy^T [out, N] @ x [N, in]
  ctx.op().gemm(dw, dy, x, ops::GemmArgs{.trans_a = true, .beta = 1.0f});
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t dropout_seed(uint64_t seed, int64_t iteration, int64_t microbatch, int64_t layer,
                      DropoutSite site) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(iteration));
  h = splitmix64(h ^ static_cast<uint64_t>(microbatch));
  h = splitmix64(h ^ static_cast<uint64_t>(layer + 1));
  return splitmix64(h ^ static_cast<uint64_t>(site));
}

uint64_t init_seed(uint64_t seed, const std::string& name) {
  return splitmix64(seed ^ ops::fnv1a(name));
}

ops::DropoutArgs DropoutCtx::args(double p, int64_t layer, DropoutSite site) const {
  ops::DropoutArgs a;
  if (!training || p <= 0.0) return a;
  a.p = static_cast<float>(p);
  a.seed = dropout_seed(seed, iteration, microbatch, layer, site);
  a.offset = 0;
  return a;
}

}  // namespace mg::transformer

namespace mg::transformer {

bool ModuleContext::fp8_covers(const std::string& prefix) const {
  if (!fp8 || !config) return false;
  static const std::string kDecoder = "decoder.layers.";
  if (prefix.rfind(kDecoder, 0) != 0) return false;
  const int64_t layer = std::stoll(prefix.substr(kDecoder.size()));
  return config->fp8.layer_in_fp8(layer, config->num_layers);
}

}  // namespace mg::transformer
