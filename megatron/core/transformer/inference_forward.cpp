// The KV-cache forward of SelfAttention and TransformerLayer (attention.h, transformer_layer.h;
// the cache: megatron/core/inference/inference_context.h). The same ops as forward() in the same
// order, without dropout and without saving activations, so that running a sequence token by
// token through the cache gives the logits of one full forward (tests/unit/core/inference/).
#include "megatron/core/common/error.h"
#include "megatron/core/transformer/attention.h"
#include "megatron/core/transformer/transformer_layer.h"

namespace mg::transformer {

Tensor SelfAttention::infer(const Tensor& x, inference::StaticInferenceContext& ic,
                            int64_t layer) const {
  MG_CHECK(x.dim() == 3 && x.size(2) == h_,
           "SelfAttention::infer: x must be [Sq, B, H = " << h_ << "], got " << x.str());
  const int64_t sq = x.size(0), b = x.size(1), n = sq * b;
  const int64_t off = ic.sequence_len_offset, sk = off + sq;
  MG_CHECK(sk <= ic.max_sequence_length(),
           "inference: " << off << " cached + " << sq << " new tokens exceed the context's "
                         << "max_sequence_length " << ic.max_sequence_length());
  Saved qkv_saved;  // linear_qkv: TP copy into the region (SP is refused by GPTModel::infer)
  Tensor q, k, v;   // [N, NH HD], [N, NG HD], [N, NG HD]
  project_qkv(x, qkv_saved, q, k, v);  // as forward() (same numerics)
  if (q_norm_) {
    Norm::Saved unused;
    q = q_norm_->forward(q.view({n * nh_, hd_}), unused);
    k = k_norm_->forward(k.view({n * ng_, hd_}), unused);
  }
  q = q.view({sq, b, nh_, hd_});
  k = k.view({sq, b, ng_, hd_});
  v = v.view({sq, b, ng_, hd_});
  if (rope_) {
    const TransformerConfig& c = *ctx_.config;
    ops::RopeArgs ra;
    ra.base = static_cast<float>(c.rotary_base);
    ra.rotary_percent = static_cast<float>(c.rotary_percent);
    ra.interleaved = c.rotary_interleaved;
    ra.scaling = c.rope_scaling;
    ra.position_offset = off;  // positions off + s
    ctx_.op().rope_fwd(q, q, ra);
    ctx_.op().rope_fwd(k, k, ra);
  }
  // Append to the cache (rows [off, off + Sq) of [S_max, B, NG, HD]).
  inference::StaticInferenceContext::LayerCache& cache = ic.layer(layer);
  if (!cache.key.defined()) {
    cache.key = ctx_.empty({ic.max_sequence_length(), ic.max_batch_size(), ng_, hd_});
    cache.value = ctx_.empty({ic.max_sequence_length(), ic.max_batch_size(), ng_, hd_});
  }
  MG_CHECK(b == ic.max_batch_size(),
           "inference: batch " << b << " must equal the context's max_batch_size "
                               << ic.max_batch_size() << " (the cache is [S_max, B, NG, HD])");
  Tensor kc = cache.key, vc = cache.value;
  kc.slice(off, sq).copy_(k);
  vc.slice(off, sq).copy_(v);
  const Tensor keys = kc.slice(0, sk), values = vc.slice(0, sk);  // [Sk, B, NG, HD]
  Tensor out = ctx_.empty({sq, b, nh_, hd_});
  Tensor lse = Tensor::empty({b, nh_, sq}, ctx_.stat_dtype(), ctx_.device);
  ops::AttentionArgs aa;
  aa.causal = true;  // bottom-right: query i (position off + i) sees keys j <= off + i
  ctx_.op().attention_fwd(out, lse, q, keys, values, aa);
  if (fp8_mha()) {  // linear_proj's FP8 input is cast at the attention's O scale, as in training
    const fp8::Scaling so = ctx_.fp8->attention_output_scaling(fp8_attn_id_);
    Tensor o8;
    ctx_.fp8->cast(so, out, &o8, nullptr);
    tensor_parallel::RowParallelLinear::Saved unused;
    return linear_proj_->forward_fp8_input(o8.view({sq, b, nh_ * hd_}), so.scale_inv, unused);
  }
  return linear_proj_->forward(out.view({sq, b, nh_ * hd_}));  // [Sq, B, H], reduced over TP
}

Tensor TransformerLayer::infer(const Tensor& x, inference::StaticInferenceContext& ic) const {
  Norm::Saved n1, n2;
  const Tensor ln1 = norm1_ ? norm1_->forward(x, n1) : x;
  const Tensor y = attn_->infer(ln1, ic, layer_);
  Tensor h = ctx_.empty(x.shape());
  ctx_.op().bias_dropout_add_fwd(h, y, attn_->proj_bias().value, x, ops::DropoutArgs{});
  const Tensor ln2 = norm2_ ? norm2_->forward(h, n2) : h;
  MLP::Saved ms;
  moe::MoELayer::Saved es;  // MoE layers: routed experts without aux losses (not training)
  const Tensor z = moe_ ? moe_->forward(ln2, es, /*training=*/false) : mlp_->forward(ln2, ms);
  Tensor out = ctx_.empty(x.shape());
  ctx_.op().bias_dropout_add_fwd(out, z, moe_ ? Tensor() : mlp_->fc2_bias().value, h,
                                 ops::DropoutArgs{});
  return out;
}

}  // namespace mg::transformer
