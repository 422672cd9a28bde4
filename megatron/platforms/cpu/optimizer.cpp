// CPU optimizer and multi-tensor utilities: the AdamW step (apex FusedAdam semantics, see AdamArgs
// in op_args.h), the sum of squares behind the gradient norm, and in-place scaling with an
// overflow flag (apex multi_tensor_l2norm / multi_tensor_scale).
//
// Invariants: work is cut into chunks of at most kChunk elements across all tensors of a call, so
// one large tensor and many small ones parallelise alike. l2_norm_sq accumulates in f64 per chunk
// and sums the chunk partials in a fixed order: its result does not depend on the thread count.
// adamw_step math is f32 for f32 master params, f64 for f64. multi_tensor_scale never clears
// found_nonfinite (the caller zeroes it, as apex's amp does).
// Gradient rule: none here (no backward); the optimizer updates param/exp_avg/exp_avg_sq in place.
// Not here: the distributed optimizer's sharding, gradient reductions, loss-scale bookkeeping.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

constexpr int64_t kChunk = 1 << 14;

// A piece [begin, end) of tensor `index` of a multi-tensor call.
struct Chunk {
  std::size_t index;
  int64_t begin, end;
};

template <typename NumelOf>
std::vector<Chunk> make_chunks(std::size_t count, NumelOf&& numel_of) {
  std::vector<Chunk> chunks;
  for (std::size_t t = 0; t < count; ++t) {
    const int64_t n = numel_of(t);
    for (int64_t b = 0; b < n; b += kChunk) chunks.push_back({t, b, std::min(n, b + kChunk)});
  }
  return chunks;
}

int64_t total_numel(const std::vector<Chunk>& chunks) {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.end - c.begin;
  return n;
}

// ---- adamw_step
// ----------------------------------------------------------------------------------

struct NoModelParam {};  // model_param undefined

template <typename C>
struct AdamCoeffs {
  C lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
  bool decoupled;
};

// Updates elements [b, e) of one parameter. P: param/exp_avg/exp_avg_sq, G: grad, M: model_param.
template <typename P, typename G, typename M>
void adam_chunk(const ops::AdamParam& prm, int64_t b, int64_t e,
                const AdamCoeffs<compute_t<P>>& k) {
  using C = compute_t<P>;
  P* p = prm.param.data<P>();
  P* m = prm.exp_avg.data<P>();
  P* v = prm.exp_avg_sq.data<P>();
  const G* g = prm.grad.data<G>();
  M* model = nullptr;
  if constexpr (!std::is_same_v<M, NoModelParam>) model = prm.model_param.data<M>();
  for (int64_t i = b; i < e; ++i) {
    const C pi = p[i];
    C gi = static_cast<C>(to_f32(g[i])) * k.grad_scale;
    if (!k.decoupled) gi += k.wd * pi;  // L2 mode: decay folded into the gradient
    const C mi = k.beta1 * m[i] + (C(1) - k.beta1) * gi;
    const C vi = k.beta2 * v[i] + (C(1) - k.beta2) * gi * gi;
    const C denom = std::sqrt(vi / k.bc2) + k.eps;
    C update = (mi / k.bc1) / denom;
    if (k.decoupled) update += k.wd * pi;  // AdamW: decay on the weight itself
    const C pn = pi - k.lr * update;
    p[i] = pn;
    m[i] = mi;
    v[i] = vi;
    if constexpr (!std::is_same_v<M, NoModelParam>) model[i] = store_from<M>(pn);
  }
}

void adamw_step(std::span<const ops::AdamParam> params, const ops::AdamArgs& args) {
  constexpr const char* op = "adamw_step";
  ops::validate_adamw(kOnHost, params, args);

  // Bias corrections in f64 on the host, then rounded to the math type (apex does the same).
  const double bc1 =
      args.bias_correction ? 1.0 - std::pow(double(args.beta1), double(args.step)) : 1.0;
  const double bc2 =
      args.bias_correction ? 1.0 - std::pow(double(args.beta2), double(args.step)) : 1.0;
  auto coeffs = [&]<typename C>(std::type_identity<C>) {
    return AdamCoeffs<C>{C(args.lr),  C(args.beta1),        C(args.beta2),
                         C(args.eps), C(args.weight_decay), C(bc1),
                         C(bc2),      C(args.grad_scale),   args.decoupled_weight_decay};
  };
  const AdamCoeffs<float> kf = coeffs(std::type_identity<float>{});
  const AdamCoeffs<double> kd = coeffs(std::type_identity<double>{});

  const auto chunks =
      make_chunks(params.size(), [&](std::size_t t) { return params[t].param.numel(); });
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 1) if (total_numel(chunks) >= kParallelMinElements)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[static_cast<std::size_t>(c)];
    const ops::AdamParam& a = params[ch.index];
    auto with_model = [&]<typename P, typename G>(std::type_identity<P>, std::type_identity<G>) {
      const auto& k = [&]() -> const AdamCoeffs<compute_t<P>>& {
        if constexpr (std::is_same_v<P, double>)
          return kd;
        else
          return kf;
      }();
      if (!a.model_param.defined()) {
        adam_chunk<P, G, NoModelParam>(a, ch.begin, ch.end, k);
      } else {
        dispatch_float(a.model_param.dtype(), op, [&]<typename M>(std::type_identity<M>) {
          adam_chunk<P, G, M>(a, ch.begin, ch.end, k);
        });
      }
    };
    dispatch_float(a.grad.dtype(), op, [&]<typename G>(std::type_identity<G>) {
      if (a.param.dtype() == DType::f64)
        with_model(std::type_identity<double>{}, std::type_identity<G>{});
      else
        with_model(std::type_identity<float>{}, std::type_identity<G>{});
    });
  }
}

// ---- l2_norm_sq
// ----------------------------------------------------------------------------------

// out [1] f32/f64 = sum over all xs of sum(x^2), accumulated in f64.
void l2_norm_sq(Tensor& out, std::span<const Tensor> xs) {
  constexpr const char* op = "l2_norm_sq";
  ops::validate_l2_norm_sq(kOnHost, out, xs);
  const auto chunks = make_chunks(xs.size(), [&](std::size_t t) { return xs[t].numel(); });
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  std::vector<double> partial(chunks.size(), 0.0);
#pragma omp parallel for schedule(dynamic, 1) if (total_numel(chunks) >= kParallelMinElements)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[static_cast<std::size_t>(c)];
    dispatch_float(xs[ch.index].dtype(), op, [&]<typename T>(std::type_identity<T>) {
      const T* x = xs[ch.index].data<T>();
      double s = 0.0;
      for (int64_t i = ch.begin; i < ch.end; ++i) {
        const double v = static_cast<double>(to_f32(x[i]));
        s += v * v;
      }
      partial[static_cast<std::size_t>(c)] = s;
    });
  }
  double total = 0.0;
  for (double s : partial) total += s;  // fixed order: deterministic for any thread count
  if (out.dtype() == DType::f64)
    *out.data<double>() = total;
  else
    *out.data<float>() = static_cast<float>(total);
}

// ---- multi_tensor_scale
// --------------------------------------------------------------------------

// xs[i] [*] *= factor in place; found_nonfinite [1] f32 (optional) := 1 if any result is inf/nan.
void multi_tensor_scale(std::span<Tensor> xs, double factor, Tensor& found_nonfinite) {
  constexpr const char* op = "multi_tensor_scale";
  ops::validate_multi_tensor_scale(kOnHost, xs, found_nonfinite);
  const auto chunks = make_chunks(xs.size(), [&](std::size_t t) { return xs[t].numel(); });
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  bool nonfinite = false;
#pragma omp parallel for schedule(dynamic, 1) \
    reduction(||                              \
              : nonfinite) if (total_numel(chunks) >= kParallelMinElements)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[static_cast<std::size_t>(c)];
    dispatch_float(xs[ch.index].dtype(), op, [&]<typename T>(std::type_identity<T>) {
      using C = compute_t<T>;
      T* x = xs[ch.index].data<T>();
      const C f = static_cast<C>(factor);
      bool bad = false;
      for (int64_t i = ch.begin; i < ch.end; ++i) {
        x[i] = store<T>(static_cast<C>(to_f32(x[i])) * f);
        // Checked after rounding to the storage type: a finite product may overflow f16/bf16.
        bad |= !std::isfinite(to_f32(x[i]));
      }
      nonfinite = nonfinite || bad;
    });
  }
  if (nonfinite && found_nonfinite.defined()) *found_nonfinite.data<float>() = 1.0f;
}

}  // namespace

void register_optimizer_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::adamw_step>("cpu", &adamw_step, "cpu:omp");
  r.register_op<OpId::l2_norm_sq>("cpu", &l2_norm_sq, "cpu:omp");
  r.register_op<OpId::multi_tensor_scale>("cpu", &multi_tensor_scale, "cpu:omp");
}

}  // namespace mg::platforms::cpu
