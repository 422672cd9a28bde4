// CPU MoE token permutation (op_list.h moe_permute / moe_unpermute / moe_unpermute_bwd): the rows
// a MoE layer sends to its experts, gathered from the tokens in expert-major order, and the
// probability-weighted sum that brings the expert outputs back to their tokens.
//
// Gradient rule: activation gradients are written (=): drows, dprob, and moe_unpermute's out
// (which is moe_permute's backward). Numerics: every sum in f64, rounded once to the output's
// dtype, in the order the op defines (a token's rows as token_rows lists them; dprob over j
// ascending), without FMA contraction (-ffp-contract=off for this file, megatron/CMakeLists.txt),
// so the results equal the MoE layer's former host arithmetic bit for bit and do not depend on the
// thread count (each output row is one thread's).
// Not here: index values are checked from the host tensors (every call), CUDA's kernels do not.
#include <cstring>
#include <span>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

std::span<const int64_t> i64_span(const Tensor& t) {
  return {t.data<int64_t>(), static_cast<std::size_t>(t.numel())};
}

// rows[i] = x[index[i]]
void moe_permute(Tensor& rows, const Tensor& x, const Tensor& index) {
  constexpr const char* op = "moe_permute";
  const ops::MoePermuteDims d = ops::validate_moe_permute(kOnHost, rows, x, index);
  const auto idx = i64_span(index);
  ops::validate_moe_indices(op, "index", idx, d.t);
  const std::size_t row_bytes = static_cast<std::size_t>(d.h) * dtype_size(x.dtype());
  const auto* src = static_cast<const unsigned char*>(x.raw_data());
  auto* dst = static_cast<unsigned char*>(rows.raw_data());
#pragma omp parallel for schedule(static) if (d.r * d.h >= kParallelMinElements)
  for (int64_t i = 0; i < d.r; ++i)
    std::memcpy(dst + static_cast<std::size_t>(i) * row_bytes,
                src + static_cast<std::size_t>(idx[static_cast<std::size_t>(i)]) * row_bytes,
                row_bytes);
}

// out[t] = sum of prob[i] * rows[i] over the token's rows, in f64
void moe_unpermute(Tensor& out, const Tensor& rows, const Tensor& prob, const Tensor& offsets,
                   const Tensor& token_rows) {
  constexpr const char* op = "moe_unpermute";
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute(kOnHost, out, rows, prob, offsets, token_rows);
  const auto off = i64_span(offsets);
  const auto tr = i64_span(token_rows);
  MG_CHECK(off[0] == 0 && off[static_cast<std::size_t>(d.t)] == d.r,
           op << ": offsets must run from 0 to " << d.r << ", got " << off[0] << " .. "
              << off[static_cast<std::size_t>(d.t)]);
  for (int64_t t = 0; t < d.t; ++t)
    MG_CHECK(off[static_cast<std::size_t>(t)] <= off[static_cast<std::size_t>(t + 1)],
             op << ": offsets decrease at token " << t);
  ops::validate_moe_indices(op, "token_rows", tr, d.r);
  const double* p = prob.defined() ? prob.data<double>() : nullptr;
  const int64_t h = d.h;
  dispatch_float(out.dtype(), op, [&]<typename TO>(std::type_identity<TO>) {
    dispatch_float(rows.dtype(), op, [&]<typename TR>(std::type_identity<TR>) {
      TO* o = out.data<TO>();
      const TR* rv = rows.data<TR>();
#pragma omp parallel if (d.t * h >= kParallelMinElements)
      {
        std::vector<double> acc(static_cast<std::size_t>(h));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < d.t; ++t) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t k = off[static_cast<std::size_t>(t)];
               k < off[static_cast<std::size_t>(t + 1)]; ++k) {
            const int64_t i = tr[static_cast<std::size_t>(k)];
            const double w = p ? p[i] : 1.0;
            const TR* src = rv + i * h;
            for (int64_t j = 0; j < h; ++j) acc[j] += w * load<double>(src[j]);
          }
          TO* dst = o + t * h;
          for (int64_t j = 0; j < h; ++j) dst[j] = store_from<TO>(acc[j]);
        }
      }
    });
  });
}

// drows[i] = prob[i] * dout[index[i]]; dprob[i] = dout[index[i]] . rows[i]
void moe_unpermute_bwd(Tensor& drows, Tensor& dprob, const Tensor& dout, const Tensor& rows,
                       const Tensor& prob, const Tensor& index) {
  constexpr const char* op = "moe_unpermute_bwd";
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute_bwd(kOnHost, drows, dprob, dout, rows, prob, index);
  const auto idx = i64_span(index);
  ops::validate_moe_indices(op, "index", idx, d.t);
  const double* p = prob.defined() ? prob.data<double>() : nullptr;
  const int64_t h = d.h;
  dispatch_float(dout.dtype(), op, [&]<typename TD>(std::type_identity<TD>) {
    const TD* dy = dout.data<TD>();
    if (drows.defined())
      dispatch_float(drows.dtype(), op, [&]<typename TR>(std::type_identity<TR>) {
        TR* dr = drows.data<TR>();
#pragma omp parallel for schedule(static) if (d.r * h >= kParallelMinElements)
        for (int64_t i = 0; i < d.r; ++i) {
          const double w = p ? p[i] : 1.0;
          const TD* src = dy + idx[static_cast<std::size_t>(i)] * h;
          for (int64_t j = 0; j < h; ++j) dr[i * h + j] = store_from<TR>(w * load<double>(src[j]));
        }
      });
    if (dprob.defined())
      dispatch_float(rows.dtype(), op, [&]<typename TR>(std::type_identity<TR>) {
        const TR* rv = rows.data<TR>();
        double* dp = dprob.data<double>();
#pragma omp parallel for schedule(static) if (d.r * h >= kParallelMinElements)
        for (int64_t i = 0; i < d.r; ++i) {
          const TD* src = dy + idx[static_cast<std::size_t>(i)] * h;
          double dot = 0.0;
          for (int64_t j = 0; j < h; ++j) dot += load<double>(src[j]) * load<double>(rv[i * h + j]);
          dp[i] = dot;
        }
      });
  });
}

}  // namespace

void register_moe_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::moe_permute>("cpu", &moe_permute, "cpu:omp");
  r.register_op<ops::OpId::moe_unpermute>("cpu", &moe_unpermute, "cpu:omp");
  r.register_op<ops::OpId::moe_unpermute_bwd>("cpu", &moe_unpermute_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
