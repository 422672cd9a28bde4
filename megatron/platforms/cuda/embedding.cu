// CUDA vocab-parallel embedding: lookup (forward) and scatter-add of row gradients (backward).
//
// Gradient rule: parameter gradients accumulate (+=: dweight); activation gradients are written
// (=: there are none, ids are not differentiable).
//
// This rank holds rows [vocab_start, vocab_start + Vl) of the full [V, H] table. Forward copies
// out[n] = weight[ids[n] - vocab_start] bit for bit for ids inside the shard and writes zeros
// elsewhere (negative ids included: the forward does not synchronise to inspect ids). Backward adds
// dout[n] into dweight[ids[n] - vocab_start] deterministically and as the CPU does: the ids are
// copied to the host (one stream synchronisation), (row, token) pairs sorted there, and one block
// per distinct row sums its dout rows in increasing token order in f32 (f64 when dweight or dout is
// f64) before a single add into dweight. Negative ids are rejected there, as on the CPU.
// Not here: a device-side sort (not yet), padding_idx, max_norm.
#include <algorithm>
#include <utility>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// out [N, H] = weight [Vl, H] rows, raw element copies (U: an unsigned type of the element size).
template <typename U>
__global__ void embedding_fwd_kernel(U* out, const void* ids, DType id_type, const U* weight,
                                     int64_t vocab_start, int64_t v, int64_t n, int64_t h) {
  const int64_t total = n * h;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t tok = i / h, j = i - tok * h;
    const int64_t local = load_index(ids, id_type, tok) - vocab_start;
    out[i] = local >= 0 && local < v ? weight[local * h + j] : U(0);
  }
}

// dweight[rows[g]] += sum of dout[tokens[p]] for p in [starts[g], starts[g+1]), per column.
template <typename Acc>
__global__ void embedding_bwd_kernel(void* dweight, DType tw, const void* dout, DType td,
                                     const int64_t* rows, const int64_t* starts,
                                     const int64_t* tokens, int64_t groups, int64_t h) {
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row = rows[g];
    for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < h;
         j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      Acc acc = 0;
      for (int64_t p = starts[g]; p < starts[g + 1]; ++p)
        acc += load<Acc>(dout, td, tokens[p] * h + j);
      store<Acc>(dweight, tw, row * h + j, load<Acc>(dweight, tw, row * h + j) + acc);
    }
  }
}

// out [N, H] = weight [Vl, H] rows (0 outside the shard)
void embedding_fwd(Tensor& out, const Tensor& ids, const Tensor& weight, int64_t vocab_start) {
  constexpr const char* op = "embedding_fwd";
  // Negative ids are not rejected here (that needs a host sync); they read zeros (the op's rule
  // for ids outside the shard).
  const ops::EmbeddingDims d =
      ops::validate_embedding_fwd(OnCudaDevice{}, out, ids, weight, vocab_start);
  const int64_t n = d.n, v = d.v, h = d.h;
  if (n * h == 0) return;
  const int dev = weight.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  auto launch = [&](auto tag) {
    using U = decltype(tag);
    embedding_fwd_kernel<U><<<grid_for(n * h), kThreads, 0, s>>>(
        static_cast<U*>(out.raw_data()), ids.raw_data(), ids.dtype(),
        static_cast<const U*>(weight.raw_data()), vocab_start, v, n, h);
  };
  with_element_bits(weight.dtype(), op, launch);
  MG_CUDA_CHECK_LAUNCH();
}

// dweight [Vl, H] += scatter of dout [N, H] rows by ids
void embedding_bwd(Tensor& dweight, const Tensor& dout, const Tensor& ids, int64_t vocab_start) {
  constexpr const char* op = "embedding_bwd";
  const ops::EmbeddingDims ed =
      ops::validate_embedding_bwd(OnCudaDevice{}, dweight, dout, ids, vocab_start);
  const int64_t n = ed.n, v = ed.v, h = ed.h;
  if (n == 0 || h == 0) return;
  const int dev = dweight.device().index;
  DeviceGuard guard(dev);

  // ids on the host, widened and validated.
  std::vector<int64_t> id(static_cast<std::size_t>(n));
  if (ids.dtype() == DType::i64) {
    copy_to_host(id.data(), ids.raw_data(), static_cast<std::size_t>(n) * 8, dev);
  } else {
    std::vector<int32_t> id32(static_cast<std::size_t>(n));
    copy_to_host(id32.data(), ids.raw_data(), static_cast<std::size_t>(n) * 4, dev);
    std::copy(id32.begin(), id32.end(), id.begin());
  }
  ops::validate_ids_nonnegative(op, ids, id);

  // (local row, token) pairs inside the shard, sorted: groups of equal rows, tokens ascending.
  std::vector<std::pair<int64_t, int64_t>> pairs;
  pairs.reserve(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t local = id[i] - vocab_start;
    if (local >= 0 && local < v) pairs.emplace_back(local, i);
  }
  if (pairs.empty()) return;
  std::sort(pairs.begin(), pairs.end());
  // One buffer: tokens [P] | starts [G + 1] | rows [G].
  std::vector<int64_t> meta;
  meta.reserve(pairs.size() * 3 + 1);
  for (const auto& p : pairs) meta.push_back(p.second);
  std::vector<int64_t> rows;
  const std::size_t starts_at = meta.size();
  for (std::size_t p = 0; p < pairs.size(); ++p)
    if (p == 0 || pairs[p].first != pairs[p - 1].first) {
      meta.push_back(static_cast<int64_t>(p));
      rows.push_back(pairs[p].first);
    }
  meta.push_back(static_cast<int64_t>(pairs.size()));
  const std::size_t rows_at = meta.size();
  meta.insert(meta.end(), rows.begin(), rows.end());
  const auto groups = static_cast<int64_t>(rows.size());

  Scratch buf(dev, meta.size() * sizeof(int64_t));
  copy_to_device(buf.get(), meta.data(), meta.size() * sizeof(int64_t), dev);
  const int64_t* d = buf.as<int64_t>();
  const dim3 grid(
      static_cast<unsigned int>(std::min<int64_t>(groups, 65535)),
      static_cast<unsigned int>(std::min<int64_t>((h + kThreads - 1) / kThreads, 65535)));
  const bool f64 = dweight.dtype() == DType::f64 || dout.dtype() == DType::f64;
  with_compute(f64 ? DType::f64 : DType::f32, [&](auto tag) {
    using Acc = decltype(tag);
    embedding_bwd_kernel<Acc><<<grid, kThreads, 0, current_stream(dev)>>>(
        dweight.raw_data(), dweight.dtype(), dout.raw_data(), dout.dtype(), d + rows_at,
        d + starts_at, d, groups, h);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_embedding_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::embedding_fwd>(kPlatformName, &embedding_fwd, "cuda:kernel");
  r.register_op<ops::OpId::embedding_bwd>(kPlatformName, &embedding_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
