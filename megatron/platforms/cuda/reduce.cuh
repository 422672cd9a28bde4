// Deterministic column sums over rows for parameter gradients (bias_grad, dgamma, dbeta, dbias):
//   out[f] += sum_r g(r, f)   for f < width,
// in f64, in two passes: chunks of rows write partial sums, then each column adds its chunks in
// order. The result does not depend on scheduling, and out may have any kernel float dtype (an f32
// main-grad buffer for bf16 weights). g is a device functor (no extended lambdas in this build).
// column_chunking() is the chunking; a kernel that fuses the column partials into its own row pass
// (norm.cu's backward) uses it, writes the same partials and finishes with column_finish_kernel,
// so its sums are the same bits.
#pragma once

#include <cstdint>

#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/device_util.cuh"

namespace mg::platforms::cuda {

namespace detail {

template <typename G>
__global__ void column_partial_kernel(double* partial, int64_t rows, int64_t width,
                                      int64_t rows_per_chunk, G g) {
  const int64_t f = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= width) return;
  const int64_t c = blockIdx.y;
  const int64_t r0 = c * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  double s = 0.0;
  for (int64_t r = r0; r < r1; ++r) s += g(r, f);
  partial[c * width + f] = s;
}

// out[f] += sum of the chunk partials of column f, in chunk order. A template only so that every
// including file may instantiate it (no relocatable device code in this build).
template <typename Acc = double>
__global__ void column_finish_kernel(void* out, DType out_type, const Acc* partial, int64_t chunks,
                                     int64_t width) {
  for (int64_t f = grid_start(); f < width; f += grid_stride()) {
    Acc s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * width + f];
    store<Acc>(out, out_type, f, load<Acc>(out, out_type, f) + s);
  }
}

}  // namespace detail

// Element (r, f) of a row-major matrix with leading dimension ld, widened to f64: the term of a
// plain column sum (bias gradients, dbias of a written gradient).
struct MatrixTerm {
  const void* x;
  DType t;
  int64_t ld;
  __device__ double operator()(int64_t r, int64_t f) const {
    return load<double>(x, t, r * ld + f);
  }
};

// The chunks of `rows` rows: chunk c sums rows [c * rows_per_chunk, min(rows, (c + 1) *
// rows_per_chunk)) in row order.
struct ColumnChunking {
  int64_t chunks, rows_per_chunk;
};
inline ColumnChunking column_chunking(int64_t rows) {
  constexpr int64_t kRowsPerChunkMin = 32, kMaxChunks = 1024;
  int64_t chunks = (rows + kRowsPerChunkMin - 1) / kRowsPerChunkMin;
  chunks = chunks < 1 ? 1 : (chunks > kMaxChunks ? kMaxChunks : chunks);
  return {chunks, (rows + chunks - 1) / chunks};
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
  const dim3 grid(static_cast<unsigned int>((width + kThreads - 1) / kThreads),
                  static_cast<unsigned int>(chunks));
  detail::column_partial_kernel<<<grid, kThreads, 0, s>>>(partial.as<double>(), rows, width,
                                                          rows_per_chunk, g);
  MG_CUDA_CHECK_LAUNCH();
  detail::column_finish_kernel<double>
      <<<grid_for(width), kThreads, 0, s>>>(out, out_type, partial.as<double>(), chunks, width);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::platforms::cuda
