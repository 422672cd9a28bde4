// Block spec lookup and its consistency check against the config (transformer_layer_spec.h).
#include "megatron/core/transformer/transformer_layer_spec.h"

#include "megatron/core/common/error.h"

namespace mg::transformer {

NormImpl norm_impl(Normalization n) {
  return n == Normalization::layernorm ? NormImpl::layernorm : NormImpl::rmsnorm;
}

std::string norm_impl_name(NormImpl n) {
  switch (n) {
    case NormImpl::identity:
      return "identity";
    case NormImpl::layernorm:
      return "layernorm";
    case NormImpl::rmsnorm:
      return "rmsnorm";
  }
  return "?";
}

const TransformerLayerSpec& TransformerBlockSpec::layer(int64_t layer_number) const {
  MG_CHECK(
      layer_number >= 0 && layer_number < static_cast<int64_t>(layer_specs.size()),
      "the block spec has " << layer_specs.size() << " layer specs, no layer " << layer_number);
  return layer_specs[static_cast<std::size_t>(layer_number)];
}

namespace {

void check_norm(const NormSpec& n, NormImpl want, bool may_be_identity, const std::string& where) {
  if (n.impl == NormImpl::identity && may_be_identity) return;
  MG_CHECK(n.impl == want, where << ": the spec says " << norm_impl_name(n.impl)
                                 << ", the config's normalization is " << norm_impl_name(want));
}

}  // namespace

void check_block_spec(const TransformerBlockSpec& spec, const TransformerConfig& c) {
  MG_CHECK(static_cast<int64_t>(spec.layer_specs.size()) == c.num_layers,
           "the block spec has " << spec.layer_specs.size() << " layer specs, num_layers is "
                                 << c.num_layers);
  const NormImpl norm = norm_impl(c.normalization);
  check_norm(spec.final_layernorm, norm, true, "decoder.final_layernorm");
  MG_CHECK(spec.final_layernorm.naming == NormNaming::separate,
           "decoder.final_layernorm: always its own module (NormNaming::separate)");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const TransformerLayerSpec& s = spec.layer(l);
    const std::string at = "layer " + std::to_string(l) + " ";
    check_norm(s.input_layernorm, norm, true, at + "input_layernorm");
    check_norm(s.pre_mlp_layernorm, norm, true, at + "pre_mlp_layernorm");
    for (const NormSpec* qk : {&s.self_attention.q_layernorm, &s.self_attention.k_layernorm}) {
      MG_CHECK((qk->impl != NormImpl::identity) == c.qk_layernorm,
               at << "q/k layernorm: the spec says " << norm_impl_name(qk->impl)
                  << ", qk_layernorm is " << (c.qk_layernorm ? "on" : "off"));
      check_norm(*qk, norm, true, at + "q/k layernorm");
    }
    const bool moe = s.mlp.impl == MlpImpl::moe;
    MG_CHECK(moe == c.is_moe_layer(l), at << "mlp: the spec says " << (moe ? "moe" : "dense")
                                          << ", the config (" << c.num_moe_experts
                                          << " experts, moe_layer_freq) makes it "
                                          << (c.is_moe_layer(l) ? "an MoE layer" : "dense"));
  }
}

}  // namespace mg::transformer
