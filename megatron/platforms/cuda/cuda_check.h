// Checking macros for every CUDA runtime, cuBLAS and cuBLASLt call of the CUDA platform.
//
// MG_CUDA_CHECK(call) / MG_CUBLAS_CHECK(call) throw mg::Error naming the error, its description
// and the call's text. MG_CUDA_CHECK_LAUNCH() checks the last kernel launch. Host code only.
// Invariant: a failed call never exits or aborts; destructors use the non-throwing
// cuda_ok_or_ignore() instead, because they run during unwinding and at process teardown.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "megatron/core/common/error.h"

namespace mg::platforms::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

// For destructors and deallocation: returns whether the call succeeded and clears a non-sticky
// error so that it is not reported by an unrelated later check.
inline bool cuda_ok_or_ignore(cudaError_t err) {
  if (err == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

}  // namespace mg::platforms::cuda::detail

#define MG_CUDA_CHECK(call)                                                                     \
  do {                                                                                          \
    const cudaError_t mg_cuda_err_ = (call);                                                    \
    if (mg_cuda_err_ != cudaSuccess) [[unlikely]]                                               \
      ::mg::platforms::cuda::detail::throw_cuda_error(mg_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define MG_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                             \
    const cublasStatus_t mg_cublas_st_ = (call);                                                   \
    if (mg_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                       \
      ::mg::platforms::cuda::detail::throw_cublas_error(mg_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

namespace mg::platforms::cuda::detail {
// Kernel launches of the platform's code (counted by MG_CUDA_CHECK_LAUNCH, which follows each
// launch: one check per <<<...>>>, branches that launch one of two kernels share it) and calls into
// cuBLAS / cuBLASLt / cuDNN (count_library_call at each), since the process started:
// CudaPlatform::launch_counts(), the op profile's launches per step.
inline std::atomic<uint64_t> g_kernel_launches{0};
inline std::atomic<uint64_t> g_library_calls{0};
inline void count_library_call() {
  g_library_calls.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace mg::platforms::cuda::detail

// After a <<<...>>> launch: configuration errors surface here, execution errors at the next sync.
// Counts the launch (detail::g_kernel_launches).
#define MG_CUDA_CHECK_LAUNCH()                                                                \
  do {                                                                                        \
    ::mg::platforms::cuda::detail::g_kernel_launches.fetch_add(1, std::memory_order_relaxed); \
    MG_CUDA_CHECK(cudaGetLastError());                                                        \
  } while (0)
