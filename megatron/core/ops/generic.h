// Generic (platform-independent) implementations of the named overridable functions, registered
// under the pseudo-platform "*" with Priority::generic. Any platform or plugin may override them.
#pragma once

namespace mg::plugin {
class Registry;
}

namespace mg {
class Tensor;
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
}  // namespace mg::ops
