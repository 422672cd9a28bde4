// cuDNN fused attention (cudnn_attention.cpp), built when CMake finds the cuDNN frontend and
// libcudnn (which defines MG_WITH_CUDNN for this file's includers): the providers "cuda:cudnn"
// (attention_fwd/bwd) and "cuda:cudnn-deterministic" (attention_bwd), Priority::alternative; the
// cuDNN / frontend versions for logs; counters since process start: graphs built, shapes cuDNN
// refused (cached as such), calls run. Also exported as the C symbols
// mg_cuda_cudnn_attention_stats / mg_cuda_cudnn_attention_version (dlsym: tests, benchmarks and
// the training log, which link no CUDA code), and, for tests only,
// mg_cuda_cudnn_attention_fwd_rng_dump (a forward that also returns cuDNN's dropout mask).
#pragma once

#include <cstdint>
#include <string>

namespace mg::plugin {
class Registry;
}

namespace mg::platforms::cuda {

struct CudnnAttentionStats {
  uint64_t graphs = 0, unsupported = 0, fwd_calls = 0, bwd_calls = 0;
};
void register_cudnn_attention_kernels(plugin::Registry& r);
std::string cudnn_attention_version();
CudnnAttentionStats cudnn_attention_stats();

}  // namespace mg::platforms::cuda
