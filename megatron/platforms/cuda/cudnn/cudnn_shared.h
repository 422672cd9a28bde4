// What the cuDNN providers of this folder share (internal: included by cudnn_attention.cpp, which
// owns it, and cudnn_fp8_attention.cpp; built only with MG_WITH_CUDNN): one cuDNN handle per
// device and the lock under which it is used (bound to the thread's current stream and executed
// on) and under which each provider reads and fills its graph cache; and the FP8 provider's
// registration, which register_cudnn_attention_kernels calls.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace mg::plugin {
class Registry;
}

namespace mg::platforms::cuda::cudnn {

// Held around every use of a handle of device_handle() and every graph cache access.
std::mutex& handle_mutex();
// The device's cuDNN handle, created on first use; null, with the reason in *why (when not null),
// where cuDNN cannot run (no such device, compute capability < 8.0, cudnnCreate failed). Caller
// holds handle_mutex().
cudnnHandle_t device_handle(int device, std::string* why);

// cudnn_fp8_attention.cpp: fp8_attention_fwd / fp8_attention_bwd, provider "cuda:cudnn".
void register_cudnn_fp8_attention_kernels(plugin::Registry& r);

// Counters of cudnn_fp8_attention.cpp since process start: graphs built, keys cuDNN refused
// (cached as such), forward and backward calls run, and of those the calls that staged their
// scalars through 16-byte slots (cuDNN refused the 4-byte-aligned ones). Also exported as the C
// symbol mg_cuda_cudnn_fp8_attention_stats (dlsym: tests).
struct CudnnFp8AttentionStats {
  uint64_t graphs = 0, unsupported = 0, fwd_calls = 0, bwd_calls = 0, staged_calls = 0;
};
CudnnFp8AttentionStats cudnn_fp8_attention_stats();

}  // namespace mg::platforms::cuda::cudnn
