// CUDA vocab-parallel embedding: lookup (forward) and scatter-add of row gradients (backward).
//
// Gradient rule: parameter gradients accumulate (+=: dweight); activation gradients are written
// (=: there are none, ids are not differentiable).
//
// This rank holds rows [vocab_start, vocab_start + Vl) of the full [V, H] table. Forward copies
// out[n] = weight[ids[n] - vocab_start] bit for bit for ids inside the shard and writes zeros
// elsewhere (negative ids included: the forward does not synchronise to inspect ids), 16 bytes at
// a time where the rows allow. Backward adds
// dout[n] into dweight[ids[n] - vocab_start] deterministically and as the CPU does: the ids are
// sorted by row (tokens ascending within a row), and one block
// per distinct row sums its dout rows in increasing token order in f32 (f64 when dweight or dout is
// f64) before a single add into dweight: the CPU's order, so the same bits. The (row, token) pairs
// are sorted on the device (CUB's stable radix sort; no host round trip: until 2026-11-26 the ids
// were copied to the host and sorted there, one stream synchronisation per micro-batch). Negative
// ids, which the CPU rejects, are outside the shard here as in the forward (rejecting them needs a
// host read). bf16 / f16 gradients with H % 8 == 0 take 8 columns per thread from 16-byte loads,
// the same sums (embedding_bwd_sorted8_kernel; not yet run on a GPU). Not here: padding_idx,
// max_norm.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// out [N, H] = weight [Vl, H] rows, raw copies of U (an unsigned type of the element size, or
// uint4: 16 bytes of a row at once, h then counting 16-byte pieces).
template <typename U>
__global__ void embedding_fwd_kernel(U* out, const void* ids, DType id_type, const U* weight,
                                     int64_t vocab_start, int64_t v, int64_t n, int64_t h) {
  const int64_t total = n * h;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t tok = i / h, j = i - tok * h;
    const int64_t local = load_index(ids, id_type, tok) - vocab_start;
    out[i] = local >= 0 && local < v ? weight[local * h + j] : U{};
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
  auto launch = [&](auto tag, int64_t units) {
    using U = decltype(tag);
    embedding_fwd_kernel<U><<<grid_for(n * units), kThreads, 0, s>>>(
        static_cast<U*>(out.raw_data()), ids.raw_data(), ids.dtype(),
        static_cast<const U*>(weight.raw_data()), vocab_start, v, n, units);
  };
  // Rows of whole 16-byte pieces, both tables 16-byte aligned: a piece per thread (element by
  // element, gpt2-124m's [65536, 768] bf16 lookup ran at ~0.5 TB/s on an H200).
  const auto row_bytes = static_cast<int64_t>(h * dtype_size(weight.dtype()));
  if (row_bytes % 16 == 0 && aligned_16_bytes(out.raw_data()) &&
      aligned_16_bytes(weight.raw_data()))
    launch(uint4{}, row_bytes / 16);
  else
    with_element_bits(weight.dtype(), op, [&](auto tag) { launch(tag, h); });
  MG_CUDA_CHECK_LAUNCH();
}

// keys[i] = the local row of token i (v for an id outside the shard, negative ids included: sorted
// after every row and skipped), tokens[i] = i.
__global__ void embedding_keys_kernel(int32_t* keys, int32_t* tokens, const void* ids,
                                      DType id_type, int64_t vocab_start, int64_t v, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t local = load_index(ids, id_type, i) - vocab_start;
    keys[i] = static_cast<int32_t>(local >= 0 && local < v ? local : v);
    tokens[i] = static_cast<int32_t>(i);
  }
}

// dweight[row] += sum of dout[tokens[q]] over the run of equal keys[q] == row starting at p, per
// column; the block of a position that does not start a run (or whose key is v) does nothing.
// f(p, row) for each position p of this block (grid-stride) that starts a run of equal sorted keys
// row < v.
template <typename F>
__device__ void for_each_run_start(const int32_t* keys, int64_t n, int64_t v, F&& f) {
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const int32_t row = keys[p];
    if (row >= v || (p > 0 && keys[p - 1] == row)) continue;
    f(p, row);
  }
}

template <typename Acc>
__global__ void embedding_bwd_sorted_kernel(void* dweight, DType tw, const void* dout, DType td,
                                            const int32_t* keys, const int32_t* tokens, int64_t n,
                                            int64_t v, int64_t h) {
  for_each_run_start(keys, n, v, [&](int64_t p, int32_t row) {
    for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < h;
         j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      Acc acc = 0;
      for (int64_t q = p; q < n && keys[q] == row; ++q)
        acc += load<Acc>(dout, td, static_cast<int64_t>(tokens[q]) * h + j);
      const int64_t at = static_cast<int64_t>(row) * h + j;
      store<Acc>(dweight, tw, at, load<Acc>(dweight, tw, at) + acc);
    }
  });
}

// embedding_bwd_sorted_kernel for bf16 / f16 dout with H % 8 == 0 and 16-byte aligned data (f32 or
// lower dweight): thread t of a run's block takes columns [8t, 8t + 8) from one 16-byte load per
// token, each column still summed in f32 over the run's tokens in ascending order and added once
// into dweight, so the scalar kernel's bits. The scalar kernel loads 2 bytes a thread: 0.72 ms of
// a gpt2-124m mb-64 step at ~0.5 TB/s on an H200 (session 21's op table).
__global__ void embedding_bwd_sorted8_kernel(void* dweight, DType tw, const void* dout, bool bf16,
                                             const int32_t* keys, const int32_t* tokens, int64_t n,
                                             int64_t v, int64_t h) {
  for_each_run_start(keys, n, v, [&](int64_t p, int32_t row) {
    for (int64_t j = 8 * (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x); j < h;
         j += 8 * static_cast<int64_t>(gridDim.y) * blockDim.x) {
      float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t q = p; q < n && keys[q] == row; ++q) {
        float e[8];
        load8_half(dout, static_cast<int64_t>(tokens[q]) * h + j, bf16, e);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += e[k];
      }
      const int64_t at = static_cast<int64_t>(row) * h + j;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        store<float>(dweight, tw, at + k, load<float>(dweight, tw, at + k) + acc[k]);
    }
  });
}

// dweight [Vl, H] += scatter of dout [N, H] rows by ids: (row, token) pairs sorted on the device by
// CUB's stable radix sort (tokens ascending within a row), then one block per run of equal rows.
void embedding_bwd(Tensor& dweight, const Tensor& dout, const Tensor& ids, int64_t vocab_start) {
  const ops::EmbeddingDims ed =
      ops::validate_embedding_bwd(OnCudaDevice{}, dweight, dout, ids, vocab_start);
  const int64_t n = ed.n, v = ed.v, h = ed.h;
  if (n == 0 || h == 0) return;
  MG_CHECK(
      n < std::numeric_limits<int32_t>::max() && v < std::numeric_limits<int32_t>::max(),
      "embedding_bwd: " << n << " tokens or " << v << " rows exceed the device sort's 32-bit keys");
  const int dev = dweight.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const auto nn = static_cast<std::size_t>(n);
  Scratch pairs(dev, 4 * nn * sizeof(int32_t));  // keys | tokens | sorted keys | sorted tokens
  int32_t* keys = pairs.as<int32_t>();
  int32_t *tokens = keys + nn, *skeys = keys + 2 * nn, *stokens = keys + 3 * nn;
  embedding_keys_kernel<<<grid_for(n), kThreads, 0, s>>>(keys, tokens, ids.raw_data(), ids.dtype(),
                                                         vocab_start, v, n);
  MG_CUDA_CHECK_LAUNCH();
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) <= v) ++end_bit;  // keys in [0, v]
  std::size_t temp_bytes = 0;
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, skeys, tokens, stokens,
                                                n, 0, end_bit, s));
  Scratch temp(dev, std::max<std::size_t>(temp_bytes, 1));
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys, skeys, tokens,
                                                stokens, n, 0, end_bit, s));
  const bool f64 = dweight.dtype() == DType::f64 || dout.dtype() == DType::f64;
  const bool half = dout.dtype() == DType::bf16 || dout.dtype() == DType::f16;
  if (half && !f64 && h % 8 == 0 && aligned_for_8_halves(dout.raw_data())) {
    // Blocks of whole warps covering the h / 8 column groups (96 threads at gpt2's 768), at most
    // kThreads.
    const int64_t groups = h / 8;
    const int threads = static_cast<int>(std::min<int64_t>(kThreads, (groups + 31) / 32 * 32));
    const dim3 grid8(
        static_cast<unsigned int>(std::min<int64_t>(n, 65535)),
        static_cast<unsigned int>(std::min<int64_t>((groups + threads - 1) / threads, 65535)));
    embedding_bwd_sorted8_kernel<<<grid8, threads, 0, s>>>(
        dweight.raw_data(), dweight.dtype(), dout.raw_data(), dout.dtype() == DType::bf16, skeys,
        stokens, n, v, h);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  const dim3 grid(
      static_cast<unsigned int>(std::min<int64_t>(n, 65535)),
      static_cast<unsigned int>(std::min<int64_t>((h + kThreads - 1) / kThreads, 65535)));
  with_compute(f64 ? DType::f64 : DType::f32, [&](auto tag) {
    using Acc = decltype(tag);
    embedding_bwd_sorted_kernel<Acc><<<grid, kThreads, 0, s>>>(dweight.raw_data(), dweight.dtype(),
                                                               dout.raw_data(), dout.dtype(), skeys,
                                                               stokens, n, v, h);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_embedding_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::embedding_fwd>(kPlatformName, &embedding_fwd, "cuda:kernel");
  r.register_op<ops::OpId::embedding_bwd>(kPlatformName, &embedding_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
