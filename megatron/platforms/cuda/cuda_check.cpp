// Out-of-line error construction for cuda_check.h, so the throwing path stays off the hot paths.
#include "megatron/platforms/cuda/cuda_check.h"

#include <sstream>

namespace mg::platforms::cuda::detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so later checks report their own
  std::ostringstream os;
  os << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") in "
     << call;
  ::mg::detail::throw_error(file, line, nullptr, os.str());
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << "cuBLAS error " << cublasGetStatusName(status) << " (" << cublasGetStatusString(status)
     << ") in " << call;
  ::mg::detail::throw_error(file, line, nullptr, os.str());
}

}  // namespace mg::platforms::cuda::detail
