// Deterministic column sums over rows for parameter gradients (bias_grad, dgamma, dbeta, dbias):
//   out[f] += sum_r g(r, f)   for f < width,
// in f64, in two passes: chunks of rows write partial sums (each column's terms in row order),
// then column_finish adds each column's chunks in a fixed order (column_finish_kernel). The result
// does not depend on scheduling, and out may have any kernel float dtype (an f32 main-grad buffer
// for bf16 weights). g is a device functor (no extended lambdas in this build).
// column_chunking() is the chunking; a kernel that writes the partials of its own terms
// (norm.cu's backward, dropout.cu's one-pass bias-dropout-add backward) uses it, writes the same
// partials and finishes with column_finish, so its sums are the same bits.
// Vector path: a functor with `bool eight_ok() const` (host) and
// `__device__ void operator()(int64_t r, int64_t f, double (&out)[8]) const` (the terms of columns
// [f, f + 8) of row r from one 16-byte load8_half; MatrixTerm, dropout.cu's MaskedGrad) is summed
// by column_partial8_kernel, one thread per 8 consecutive columns, when width % 8 == 0 and
// eight_ok() (bf16/f16 data, 16-byte aligned rows); otherwise by the scalar
// column_partial_kernel. Each column's partial is the f64 sum of the same terms in the same row
// order in the same chunk either way, so both paths give the same bits (cuda_ops_test
// ColumnSumVectorPathIsBitwiseTheScalarPath). Counters: vector_path_stats() (cuda_kernels.h).
#pragma once

#include <concepts>
#include <cstdint>

#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"

namespace mg::platforms::cuda {

// Rows [begin, end) of chunk c (column_chunking's chunks: rows_per_chunk rows each, the last one
// short or empty).
struct ChunkRows {
  int64_t begin, end;
};
__device__ __forceinline__ ChunkRows chunk_rows(int64_t c, int64_t rows_per_chunk, int64_t rows) {
  const int64_t r0 = c * rows_per_chunk;
  return {r0, r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows};
}

namespace detail {

template <typename G>
__global__ void column_partial_kernel(double* partial, int64_t rows, int64_t width,
                                      int64_t rows_per_chunk, G g) {
  const int64_t f = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= width) return;
  const int64_t c = blockIdx.y;
  const auto [r0, r1] = chunk_rows(c, rows_per_chunk, rows);
  double s = 0.0;
  for (int64_t r = r0; r < r1; ++r) s += g(r, f);
  partial[c * width + f] = s;
}

// column_partial_kernel for a functor giving 8 terms at once: thread t of the row of blocks takes
// columns [8t, 8t + 8) (width % 8 == 0), so a warp reads 512 contiguous bytes of bf16/f16 per row.
// Each column still adds its terms in row order into its own f64: the scalar kernel's bits. The
// row loop is unrolled so that a thread has several 16-byte loads in flight (there is no store in
// it, so the compiler may issue the loads of four rows before their adds).
template <typename G>
__global__ void column_partial8_kernel(double* partial, int64_t rows, int64_t width,
                                       int64_t rows_per_chunk, G g) {
  const int64_t f = 8 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (f >= width) return;
  const int64_t c = blockIdx.y;
  const auto [r0, r1] = chunk_rows(c, rows_per_chunk, rows);
  double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    double t[8];
    g(r, f, t);
#pragma unroll
    for (int k = 0; k < 8; ++k) s[k] += t[k];
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) partial[c * width + f + k] = s[k];
}

// The finish of a column sum: out[f] += the chunk partials of column f, added in a fixed order
// (kFinishSlices slices, then a tree): slice l (0..31) adds chunks l, l + 32, l + 64, ... in
// increasing order into an f64 starting at 0; then, for o = 16, 8, 4, 2, 1, slice l < o becomes
// slice l + slice (l + o); out[f] = out[f] + slice 0 (in Acc, stored in out's dtype). Fixed, so
// deterministic; tests/unit/platforms/cuda/cuda_ops_test.cpp emulates it on the host bit for bit.
// A block of 256 threads takes kFinishCols = 8 consecutive columns (thread t: column t % 8, slice
// t / 8), so the 8 threads of a slice read 64 contiguous bytes of each chunk row. One thread per
// column adding every chunk in order ran at ~58 cycles per add on an H200 (15 us for 512 chunks,
// 30 us for 1024: Nsight Compute, 2026-11-26); here each thread adds chunks / 32 partials.
// A template only so that every including file may instantiate it (no relocatable device code
// in this build).
inline constexpr int kFinishSlices = 32, kFinishCols = 8;
// Up to two column sums of one shape finished by one launch (blockIdx.y picks the sum): a norm
// backward's dgamma and dbeta.
template <typename Acc>
struct FinishTargets {
  void* out[2];
  DType out_type[2];
  const Acc* partial[2];
};
template <typename Acc = double>
__global__ void __launch_bounds__(kFinishSlices* kFinishCols)
    column_finish_kernel(FinishTargets<Acc> targets, int64_t chunks, int64_t width) {
  __shared__ Acc slice_sum[kFinishSlices][kFinishCols];
  void* out = targets.out[blockIdx.y];
  const DType out_type = targets.out_type[blockIdx.y];
  const Acc* partial = targets.partial[blockIdx.y];
  const int j = static_cast<int>(threadIdx.x) % kFinishCols;
  const int l = static_cast<int>(threadIdx.x) / kFinishCols;
  const int64_t f = static_cast<int64_t>(blockIdx.x) * kFinishCols + j;
  Acc s = 0;
  if (f < width) {
    int64_t c = l;
    // Four loads in flight before their adds (in order).
    for (; c + 3 * kFinishSlices < chunks; c += 4 * kFinishSlices) {
      Acc v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = partial[(c + k * kFinishSlices) * width + f];
#pragma unroll
      for (int k = 0; k < 4; ++k) s += v[k];
    }
    for (; c < chunks; c += kFinishSlices) s += partial[c * width + f];
  }
  slice_sum[l][j] = s;
  __syncthreads();
#pragma unroll
  for (int o = kFinishSlices / 2; o > 0; o >>= 1) {
    if (l < o) slice_sum[l][j] += slice_sum[l + o][j];
    __syncthreads();
  }
  if (l == 0 && f < width)
    store<Acc>(out, out_type, f, load<Acc>(out, out_type, f) + slice_sum[0][j]);
}

}  // namespace detail

// out[f] += the chunk partials [chunks, width] of column f, in column_finish_kernel's order, on
// `stream`; with out2 (optional) also out2[f] += those of partial2 [chunks, width], in the same
// launch (a lone finish of 768 columns is 96 blocks, 10 us on an H200: Nsight Compute,
// 2026-11-26).
template <typename Acc = double>
void column_finish(void* out, DType out_type, const Acc* partial, int64_t chunks, int64_t width,
                   cudaStream_t stream, void* out2 = nullptr, DType out2_type = DType::f32,
                   const Acc* partial2 = nullptr) {
  if (width <= 0) return;
  const detail::FinishTargets<Acc> targets{{out, out2}, {out_type, out2_type}, {partial, partial2}};
  const dim3 grid(
      static_cast<unsigned int>((width + detail::kFinishCols - 1) / detail::kFinishCols),
      out2 ? 2u : 1u);
  detail::column_finish_kernel<Acc>
      <<<grid, detail::kFinishSlices * detail::kFinishCols, 0, stream>>>(targets, chunks, width);
  MG_CUDA_CHECK_LAUNCH();
}

// Element (r, f) of a row-major matrix with leading dimension ld, widened to f64: the term of a
// plain column sum (bias gradients, dbias of a written gradient).
struct MatrixTerm {
  const void* x;
  DType t;
  int64_t ld;
  __device__ double operator()(int64_t r, int64_t f) const {
    return load<double>(x, t, r * ld + f);
  }
  // The vector path: bf16/f16 rows that start 16-byte aligned.
  bool eight_ok() const {
    return (t == DType::bf16 || t == DType::f16) && ld % 8 == 0 && aligned_for_8_halves(x);
  }
  __device__ void operator()(int64_t r, int64_t f, double (&out)[8]) const {
    float v[8];
    load8_half(x, r * ld + f, t == DType::bf16, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = static_cast<double>(v[k]);
  }
};

// A functor that offers the 8-column vector path (see the top of this file).
template <typename G>
concept EightTerms = requires(const G& g) {
  { g.eight_ok() } -> std::convertible_to<bool>;
};

// The chunks of `rows` rows: chunk c sums rows [c * rows_per_chunk, min(rows, (c + 1) *
// rows_per_chunk)) in row order.
struct ColumnChunking {
  int64_t chunks, rows_per_chunk;
};
// At least 16 rows per chunk: gpt2-124m's 16384 rows make 1024 chunks, so its 768-wide sums run
// 1024 blocks of 3 warps (with 32 rows, 512 blocks left ~12 warps per multiprocessor: the bias-
// dropout-add backward ran at 16 % of the H200's memory bandwidth, Nsight Compute 2026-11-26).
inline ColumnChunking column_chunking(int64_t rows) {
  constexpr int64_t kRowsPerChunkMin = 16, kMaxChunks = 1024;
  int64_t chunks = (rows + kRowsPerChunkMin - 1) / kRowsPerChunkMin;
  chunks = chunks < 1 ? 1 : (chunks > kMaxChunks ? kMaxChunks : chunks);
  return {chunks, (rows + chunks - 1) / chunks};
}

// Threads per block of column_partial8_kernel for v = width / 8 column groups: the fewest blocks
// of at most 128 threads that cover v, each a whole number of warps, so that at most 31 lanes per
// block idle (gpt2's widths 768 / 2304 / 3072 give v = 96 / 288 / 384: blocks of 96, 96, 128
// threads, none idle; 256-thread blocks would idle 160 / 96 / 128 lanes per chunk). The grid is
// (blocks, chunks): with chunks = min(1024, rows / 16) (column_chunking) a bias gradient of 16384
// rows has 1024 chunks, so even width 768 gives 1024 blocks of 3 warps (~23 warps per SM on 132
// SMs, each thread's row loop unrolled by four to keep loads in flight); small blocks also let up
// to 16-32 of them share an SM, where 256-thread blocks of mostly idle warps would hold their
// slots.
inline int column_partial8_threads(int64_t v) {
  const int64_t blocks = (v + 127) / 128;
  const int64_t per_block = (v + blocks - 1) / blocks;
  return static_cast<int>((per_block + 31) / 32 * 32);
}

// Adds the column sums of g over `rows` rows into out[width] (dtype out_type) on `device`'s
// current stream. The caller holds a DeviceGuard for `device`.
template <typename G>
void column_sum_accumulate(void* out, DType out_type, int64_t rows, int64_t width, const G& g,
                           int device) {
  if (width <= 0) return;
  const auto [chunks, rows_per_chunk] = column_chunking(rows);
  Scratch partial(device, static_cast<std::size_t>(chunks * width) * sizeof(double));
  cudaStream_t s = current_stream(device);
  bool vector = false;
  if constexpr (EightTerms<G>) {
    if (width % 8 == 0 && g.eight_ok()) {
      vector = true;
      const int64_t v = width / 8;
      const int threads = column_partial8_threads(v);
      const dim3 grid(static_cast<unsigned int>((v + threads - 1) / threads),
                      static_cast<unsigned int>(chunks));
      detail::column_partial8_kernel<<<grid, threads, 0, s>>>(partial.as<double>(), rows, width,
                                                              rows_per_chunk, g);
    }
  }
  if (!vector) {
    const dim3 grid(static_cast<unsigned int>((width + kThreads - 1) / kThreads),
                    static_cast<unsigned int>(chunks));
    detail::column_partial_kernel<<<grid, kThreads, 0, s>>>(partial.as<double>(), rows, width,
                                                            rows_per_chunk, g);
  }
  MG_CUDA_CHECK_LAUNCH();
  count_vector_path(VectorPath::column_sum, vector);
  column_finish(out, out_type, partial.as<double>(), chunks, width, s);
}

}  // namespace mg::platforms::cuda
