// Generic (platform-independent) implementations of the named overridable functions, registered
// under the pseudo-platform "*" with Priority::generic. Any platform or plugin may override them.
#pragma once

#include "megatron/core/ops/op_args.h"

namespace mg::plugin {
class Registry;
}

namespace mg::ops {
void register_generic(plugin::Registry& registry);

// The FP8 casts fused with SwiGLU as the two ops of x's platform (swiglu_fwd / swiglu_bwd into a
// tensor of x's dtype, then fp8_cast_transpose): the generic default, and a platform kernel's
// fallback for shapes it does not take.
void generic_fp8_swiglu_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& x,
                                       const Tensor& scale);
void generic_fp8_dswiglu_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& dy,
                                        const Tensor& x, const Tensor& scale);
// The FP8 cast fused with the norm in front of a linear as the norm op then fp8_cast_transpose.
void generic_fp8_norm_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, Tensor& sum, Tensor& mean,
                                     Tensor& rstd, const Tensor& x, const Tensor& bias,
                                     const Tensor& residual, const Tensor& gamma,
                                     const Tensor& beta, const Tensor& scale,
                                     const DropoutArgs& dropout, const NormArgs& args,
                                     NormKind kind);
}  // namespace mg::ops
