// CUDA MoE token permutation (op_list.h moe_permute / moe_unpermute / moe_unpermute_bwd), the CPU
// kernels' definitions (platforms/cpu/moe.cpp) on the device: the gather is an exact copy; the
// weighted sums run in f64 in the order the op defines (one thread per output element, a token's
// rows in token_rows order, dprob over j ascending), no atomics, so the results are deterministic
// and equal the CPU's up to FMA contraction.
//
// Gradient rule: activation gradients are written (=): drows, dprob, and moe_unpermute's out.
// Not here: index values are not checked (that needs a host copy); an index outside its range
// reads zeros (moe_permute) or is skipped (moe_unpermute, moe_unpermute_bwd), never memory
// outside the tensors. Correct-first: one thread per dprob row.
#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// rows[i] = x[index[i]], raw element copies (U: an unsigned type of the element size).
template <typename U>
__global__ void moe_permute_kernel(U* rows, const U* x, const int64_t* index, int64_t t, int64_t r,
                                   int64_t h) {
  const int64_t total = r * h;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t i = e / h, j = e - i * h;
    const int64_t src = index[i];
    rows[e] = src >= 0 && src < t ? x[src * h + j] : U(0);
  }
}

__global__ void moe_unpermute_kernel(void* out, DType to, const void* rows, DType tr,
                                     const double* prob, const int64_t* offsets,
                                     const int64_t* token_rows, int64_t t, int64_t r, int64_t h) {
  const int64_t total = t * h;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t tok = e / h, j = e - tok * h;
    double acc = 0.0;
    for (int64_t k = offsets[tok]; k < offsets[tok + 1]; ++k) {
      const int64_t i = token_rows[k];
      if (i < 0 || i >= r) continue;
      acc += (prob ? prob[i] : 1.0) * load<double>(rows, tr, i * h + j);
    }
    store<double>(out, to, e, acc);
  }
}

__global__ void moe_unpermute_bwd_rows_kernel(void* drows, DType tr, const void* dout, DType td,
                                              const double* prob, const int64_t* index, int64_t t,
                                              int64_t r, int64_t h) {
  const int64_t total = r * h;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t i = e / h, j = e - i * h;
    const int64_t tok = index[i];
    const double g = tok >= 0 && tok < t ? load<double>(dout, td, tok * h + j) : 0.0;
    store<double>(drows, tr, e, (prob ? prob[i] : 1.0) * g);
  }
}

__global__ void moe_unpermute_bwd_prob_kernel(double* dprob, const void* dout, DType td,
                                              const void* rows, DType tr, const int64_t* index,
                                              int64_t t, int64_t r, int64_t h) {
  for (int64_t i = grid_start(); i < r; i += grid_stride()) {
    const int64_t tok = index[i];
    double dot = 0.0;
    if (tok >= 0 && tok < t)
      for (int64_t j = 0; j < h; ++j)
        dot += load<double>(dout, td, tok * h + j) * load<double>(rows, tr, i * h + j);
    dprob[i] = dot;
  }
}

void moe_permute(Tensor& rows, const Tensor& x, const Tensor& index) {
  constexpr const char* op = "moe_permute";
  const ops::MoePermuteDims d = ops::validate_moe_permute(OnCudaDevice{}, rows, x, index);
  if (d.r * d.h == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  auto launch = [&](auto tag) {
    using U = decltype(tag);
    moe_permute_kernel<U><<<grid_for(d.r * d.h), kThreads, 0, s>>>(
        static_cast<U*>(rows.raw_data()), static_cast<const U*>(x.raw_data()),
        index.data<int64_t>(), d.t, d.r, d.h);
  };
  with_element_bits(x.dtype(), op, launch);
  MG_CUDA_CHECK_LAUNCH();
}

void moe_unpermute(Tensor& out, const Tensor& rows, const Tensor& prob, const Tensor& offsets,
                   const Tensor& token_rows) {
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute(OnCudaDevice{}, out, rows, prob, offsets, token_rows);
  if (d.t * d.h == 0) return;
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  moe_unpermute_kernel<<<grid_for(d.t * d.h), kThreads, 0, current_stream(dev)>>>(
      out.raw_data(), out.dtype(), rows.raw_data(), rows.dtype(),
      prob.defined() ? prob.data<double>() : nullptr, offsets.data<int64_t>(),
      token_rows.data<int64_t>(), d.t, d.r, d.h);
  MG_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_bwd(Tensor& drows, Tensor& dprob, const Tensor& dout, const Tensor& rows,
                       const Tensor& prob, const Tensor& index) {
  const ops::MoePermuteDims d =
      ops::validate_moe_unpermute_bwd(OnCudaDevice{}, drows, dprob, dout, rows, prob, index);
  if (d.r == 0) return;
  const int dev = dout.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const double* p = prob.defined() ? prob.data<double>() : nullptr;
  if (drows.defined() && d.h > 0) {
    moe_unpermute_bwd_rows_kernel<<<grid_for(d.r * d.h), kThreads, 0, s>>>(
        drows.raw_data(), drows.dtype(), dout.raw_data(), dout.dtype(), p, index.data<int64_t>(),
        d.t, d.r, d.h);
    MG_CUDA_CHECK_LAUNCH();
  }
  if (dprob.defined()) {
    moe_unpermute_bwd_prob_kernel<<<grid_for(d.r), kThreads, 0, s>>>(
        dprob.data<double>(), dout.raw_data(), dout.dtype(), rows.raw_data(), rows.dtype(),
        index.data<int64_t>(), d.t, d.r, d.h);
    MG_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void register_moe_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::moe_permute>("cuda", &moe_permute, "cuda:moe");
  r.register_op<ops::OpId::moe_unpermute>("cuda", &moe_unpermute, "cuda:moe");
  r.register_op<ops::OpId::moe_unpermute_bwd>("cuda", &moe_unpermute_bwd, "cuda:moe");
}

}  // namespace mg::platforms::cuda
