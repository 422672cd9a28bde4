// CPU rotary position embeddings (RoPE) on x [S, B, NH, HD] (any head count: q's NH or k's NG),
// Megatron's non-interleaved rotate_half form by default, interleaved on request.
//
// Gradient rule: no parameters; dx is an activation gradient and is written (=).
// Invariants: rot = HD * rotary_percent must be even and > 0; features >= rot pass through. Pair
// i < rot/2 is (i, i + rot/2) (interleaved: (2i, 2i + 1)) and turns by pos * base^(-2i/rot); the
// angle is computed in f64 and its cos/sin rounded to the compute type (f32, or f64 for f64
// storage), where the rotation is applied. Positions come from position_ids ([S] or [B, S],
// i32/i64) or else are s + position_offset. The backward is the rotation by the negative angle.
// Frequencies scaled per RopeArgs::scaling (ops/rope_scaling.h: linear, llama3, YaRN with its
// attention factor on cos/sin). y may alias x and dx may alias dy. Not done here: fused q/k
// application, dynamic NTK scaling, multimodal (mrope) sections, the bshd layout.
#include <cmath>
#include <cstdint>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/ops/rope_scaling.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using ops::RopeArgs;

// What rope needs to know about the input and its arguments, validated once.
struct RopePlan {
  int64_t s, b, heads, hd, rot;
  bool per_batch_positions;  // position_ids is [B, S]
  std::vector<int64_t> pos;  // [S] or [B, S]
};

RopePlan plan_rope(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                   const Tensor& in, const RopeArgs& a) {
  const ops::RopeDims d = ops::validate_rope(kOnHost, op, out_name, out, in_name, in, a);
  RopePlan p{d.s, d.b, d.heads, d.hd, d.rot, d.per_batch_positions, {}};
  if (a.position_ids.defined()) {
    const Tensor& ids = a.position_ids;
    p.pos.resize(static_cast<std::size_t>(ids.numel()));
    dispatch_index(ids.dtype(), op, [&]<typename I>(std::type_identity<I>) {
      const I* v = ids.data<I>();
      for (int64_t i = 0; i < ids.numel(); ++i) p.pos[i] = v[i];
    });
  } else {
    p.pos.resize(static_cast<std::size_t>(p.s));
    for (int64_t s = 0; s < p.s; ++s) p.pos[s] = s + a.position_offset;
  }
  return p;
}

// Rotates every (S, B) row of x by +angle (sign = 1) or -angle (sign = -1) into y.
template <typename T>
void rope_apply(Tensor& y, const Tensor& x, const RopePlan& p, const RopeArgs& a, int sign) {
  using C = compute_t<T>;
  const int64_t half = p.rot / 2;
  const int64_t npos = static_cast<int64_t>(p.pos.size());
  // cos/sin table [npos, rot/2]: computed once per distinct position row, reused by every head.
  std::vector<C> cs(npos * half), sn(npos * half);
  const std::vector<double> inv_freq = ops::rope_inv_freq(a.base, p.rot, a.scaling);
  const double att = ops::rope_attention_scaling(a.scaling);  // 1 unless YaRN
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < npos; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(p.pos[t]) * inv_freq[i];
      cs[t * half + i] = static_cast<C>(std::cos(ang) * att);
      sn[t * half + i] = static_cast<C>(sign * std::sin(ang) * att);
    }
  }
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  const int64_t row = p.heads * p.hd;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < p.s; ++s) {
    for (int64_t b = 0; b < p.b; ++b) {
      const int64_t t = p.per_batch_positions ? b * p.s + s : s;
      const C* c = cs.data() + t * half;
      const C* sv = sn.data() + t * half;
      const T* xr = xp + (s * p.b + b) * row;
      T* yr = yp + (s * p.b + b) * row;
      for (int64_t h = 0; h < p.heads; ++h) {
        const T* xh = xr + h * p.hd;
        T* yh = yr + h * p.hd;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = a.interleaved ? 2 * i : i;
          const int64_t i2 = a.interleaved ? 2 * i + 1 : i + half;
          const C x1 = load<C>(xh[i1]);
          const C x2 = load<C>(xh[i2]);
          yh[i1] = store<T>(x1 * c[i] - x2 * sv[i]);
          yh[i2] = store<T>(x2 * c[i] + x1 * sv[i]);
        }
        if (yh != xh)
          for (int64_t e = p.rot; e < p.hd; ++e) yh[e] = xh[e];
      }
    }
  }
}

void rope_fwd(Tensor& y, const Tensor& x, const RopeArgs& args) {
  const RopePlan p = plan_rope("rope_fwd", "y", y, "x", x, args);
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), "rope_fwd",
                 [&]<typename T>(std::type_identity<T>) { rope_apply<T>(y, x, p, args, +1); });
}

void rope_bwd(Tensor& dx, const Tensor& dy, const RopeArgs& args) {
  const RopePlan p = plan_rope("rope_bwd", "dx", dx, "dy", dy, args);
  if (dy.numel() == 0) return;
  dispatch_float(dy.dtype(), "rope_bwd",
                 [&]<typename T>(std::type_identity<T>) { rope_apply<T>(dx, dy, p, args, -1); });
}

}  // namespace

void register_rope_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::rope_fwd>("cpu", &rope_fwd, "cpu:omp");
  r.register_op<ops::OpId::rope_bwd>("cpu", &rope_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
