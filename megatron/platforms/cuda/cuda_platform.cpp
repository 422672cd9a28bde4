// The CUDA platform: availability, devices and their properties, the current device (set_device:
// cudaSetDevice, called by mg::init with the node-local rank's device), streams and events, the
// caching allocators (device and pinned host), memory movement and conversion, and register_cuda().
//
// Invariants:
//   - Availability is probed once with cudaGetDeviceCount and never throws: on a machine without a
//     driver or GPU the platform is registered and reports why it is unavailable (the CUDA error
//     string). Kernels are registered regardless and only reached when the platform is available.
//   - Device state (properties, default streams, allocators) is a process singleton shared by every
//     CudaPlatform object, created lazily per device and never destroyed (tensors may outlive any
//     registry, and the CUDA runtime may be unloaded before static destructors run).
//   - Streams: each device has a default stream, a NON-BLOCKING stream the platform creates (not
//     the legacy stream 0, so that other libraries' work on stream 0 does not serialise with ours).
//     The current stream is per thread and per device; set_current_stream(d, nullptr) restores the
//     default. Every op launches on the current stream of its tensors' device.
//   - copy() is cudaMemcpyAsync on the current stream, then a stream synchronize, except uploads
//     (host to device) from the start of a pinned block (Tensor::empty_pinned: a direct DMA; the
//     block is not reused before the copy completes, CudaPinnedAllocator::read_by_stream) or from
//     pageable memory (staged by the driver before the call returns): they return queued, and
//     the stream's later work is ordered after them. memset_zero() and convert() are
//     stream-ordered and return before completion.
// Not here: kernels (one family per .cu file), the allocator policy (cuda_allocator.h).
#include "megatron/platforms/cuda/cuda_platform.h"

#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/platforms/cuda/cuda_allocator.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/cuda_vmm.h"
#if MG_WITH_CUDNN
#include "megatron/platforms/cuda/cudnn/cudnn_attention.h"
#endif
#include "megatron/platforms/cuda/nccl_communicator.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

constexpr int kMaxDevices = 64;
// Compute capability the build's kernels need (CMAKE_CUDA_ARCHITECTURES 80 and 90, with PTX).
constexpr int kMinComputeMajor = 8;

class CudaStream;

// The streams set_current_stream() chose on this thread, per device (null: the default stream).
thread_local std::array<CudaStream*, kMaxDevices> tl_current_stream{};

class CudaStream final : public plugin::Stream {
 public:
  CudaStream(int device, cudaStream_t s, bool owned) : device_(device), s_(s), owned_(owned) {}
  ~CudaStream() override {
    if (device_ >= 0 && device_ < kMaxDevices && tl_current_stream[device_] == this)
      tl_current_stream[device_] = nullptr;
    if (owned_) detail::cuda_ok_or_ignore(cudaStreamDestroy(s_));
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Device device() const override { return Device::cuda(device_); }
  void synchronize() override { MG_CUDA_CHECK(cudaStreamSynchronize(s_)); }
  void* native_handle() override { return s_; }
  cudaStream_t handle() const { return s_; }

 private:
  int device_;
  cudaStream_t s_;
  bool owned_;
};

// Process-wide device state, probed on first use.
class Devices {
 public:
  static Devices& get() {
    static Devices* d = new Devices();  // never destroyed (see the file comment)
    return *d;
  }

  const plugin::Availability& availability() const { return avail_; }
  int count() const { return avail_.available ? count_ : 0; }

  void check(int device) const {
    MG_CHECK(avail_.available, "the CUDA platform is unavailable: " << avail_.reason);
    MG_CHECK(device >= 0 && device < count_,
             "CUDA device " << device << " does not exist (" << count_ << " visible)");
  }

  const cudaDeviceProp& props(int device) {
    check(device);
    return per_[device].props;
  }

  CudaStream& default_stream(int device) {
    check(device);
    PerDevice& p = per_[device];
    std::call_once(p.stream_once, [&] {
      DeviceGuard guard(device);
      cudaStream_t s = nullptr;
      MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      p.stream = new CudaStream(device, s, true);
    });
    return *p.stream;
  }

  // The deferred-error record of `device` (cuda_common.h), allocated on first use: the host's and
  // the device's view of the same mapped pinned memory.
  DeferredError* error_record_host(int device) { return error_records(device).first; }
  DeferredError* error_record_device(int device) { return error_records(device).second; }

  CudaAllocator& allocator(int device) {
    check(device);
    PerDevice& p = per_[device];
    std::call_once(p.alloc_once, [&] { p.alloc = new CudaAllocator(device); });
    return *p.alloc;
  }

 private:
  struct PerDevice {
    cudaDeviceProp props{};
    std::once_flag stream_once, alloc_once, error_once;
    CudaStream* stream = nullptr;           // never destroyed
    CudaAllocator* alloc = nullptr;         // never destroyed
    DeferredError* error_host = nullptr;    // mapped pinned memory, never freed
    DeferredError* error_device = nullptr;  // the same memory seen from the device
  };

  std::pair<DeferredError*, DeferredError*> error_records(int device) {
    check(device);
    PerDevice& p = per_[device];
    std::call_once(p.error_once, [&] {
      DeviceGuard guard(device);
      void* h = nullptr;
      MG_CUDA_CHECK(cudaHostAlloc(&h, sizeof(DeferredError), cudaHostAllocMapped));
      std::memset(h, 0, sizeof(DeferredError));
      void* d = nullptr;
      MG_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
      p.error_host = static_cast<DeferredError*>(h);
      p.error_device = static_cast<DeferredError*>(d);
    });
    return {p.error_host, p.error_device};
  }

  Devices() { probe(); }

  void probe() {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      avail_ = {false, std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) +
                           " from cudaGetDeviceCount)"};
      return;
    }
    if (n <= 0) {
      avail_ = {false, "no CUDA-capable device is detected (cudaGetDeviceCount returned 0)"};
      return;
    }
    count_ = n < kMaxDevices ? n : kMaxDevices;
    per_ = std::make_unique<PerDevice[]>(static_cast<std::size_t>(count_));
    std::ostringstream desc;
    for (int d = 0; d < count_; ++d) {
      const cudaError_t perr = cudaGetDeviceProperties(&per_[d].props, d);
      if (perr != cudaSuccess) {
        (void)cudaGetLastError();
        avail_ = {false, "cudaGetDeviceProperties(" + std::to_string(d) +
                             ") failed: " + cudaGetErrorString(perr)};
        return;
      }
      const cudaDeviceProp& p = per_[d].props;
      if (p.major < kMinComputeMajor) {
        avail_ = {false, "device " + std::to_string(d) + " (" + p.name +
                             ") has compute capability " + std::to_string(p.major) + "." +
                             std::to_string(p.minor) + "; this build's kernels need " +
                             std::to_string(kMinComputeMajor) + ".0 or newer"};
        return;
      }
      desc << (d ? ", " : "") << p.name << " (sm_" << p.major << p.minor << ")";
    }
    int driver = 0, runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaGetLastError();
    std::ostringstream os;
    os << count_ << " device" << (count_ > 1 ? "s" : "") << ": " << desc.str() << "; driver "
       << driver / 1000 << "." << (driver % 1000) / 10 << ", runtime " << runtime / 1000 << "."
       << (runtime % 1000) / 10;
    avail_ = {true, os.str()};
  }

  plugin::Availability avail_;
  int count_ = 0;
  std::unique_ptr<PerDevice[]> per_;
};

CudaStream& as_cuda_stream(plugin::Stream& s, const char* what) {
  auto* cs = dynamic_cast<CudaStream*>(&s);
  MG_CHECK(cs != nullptr, what << ": stream on " << s.device() << " is not a CUDA platform stream");
  return *cs;
}

class CudaEvent final : public plugin::Event {
 public:
  CudaEvent(int device, bool timing) : device_(device), timing_(timing) {
    DeviceGuard guard(device);
    MG_CUDA_CHECK(
        cudaEventCreateWithFlags(&ev_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override { detail::cuda_ok_or_ignore(cudaEventDestroy(ev_)); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record(plugin::Stream& s) override {
    CudaStream& cs = as_cuda_stream(s, "Event::record");
    check_device(cs, "record on");
    MG_CUDA_CHECK(cudaEventRecord(ev_, cs.handle()));
    recorded_ = true;
  }
  void wait(plugin::Stream& s) override {
    CudaStream& cs = as_cuda_stream(s, "Event::wait");
    MG_CUDA_CHECK(cudaStreamWaitEvent(cs.handle(), ev_, 0));
  }
  void synchronize() override { MG_CUDA_CHECK(cudaEventSynchronize(ev_)); }
  bool query() override {
    const cudaError_t err = cudaEventQuery(ev_);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    MG_CUDA_CHECK(err);
    return false;
  }
  double elapsed_ms(const plugin::Event& start) const override {
    const auto* s = dynamic_cast<const CudaEvent*>(&start);
    MG_CHECK(s != nullptr, "elapsed_ms: start event is not a CUDA event");
    MG_CHECK(timing_ && s->timing_,
             "elapsed_ms: both events must be created with enable_timing = true");
    MG_CHECK(recorded_ && s->recorded_, "elapsed_ms: both events must have been recorded");
    float ms = 0.0f;
    MG_CUDA_CHECK(cudaEventElapsedTime(&ms, s->ev_, ev_));
    return static_cast<double>(ms);
  }

 private:
  void check_device(const CudaStream& s, const char* what) const {
    MG_CHECK(s.device().index == device_,
             "Event::" << what << " a stream of " << s.device()
                       << ", but the event belongs to cuda:" << device_);
  }
  int device_;
  bool timing_;
  bool recorded_ = false;
  cudaEvent_t ev_ = nullptr;
};

class CudaPlatform final : public plugin::Platform {
 public:
  std::string_view name() const override { return kPlatformName; }
  DeviceType device_type() const override { return DeviceType::cuda; }
  plugin::Availability availability() const override { return Devices::get().availability(); }
  int device_count() const override { return Devices::get().count(); }

  plugin::Capabilities capabilities(int device) const override {
    const cudaDeviceProp& p = Devices::get().props(device);
    plugin::Capabilities c;
    c.device_name = p.name;
    c.total_memory_bytes = p.totalGlobalMem;
    c.compute_major = p.major;
    c.compute_minor = p.minor;
    c.bf16 = p.major >= 8;
    c.f16 = p.major >= 6;
    c.fp8 = p.major * 10 + p.minor >= 89;
    c.num_compute_units = p.multiProcessorCount;
    return c;
  }

  plugin::Allocator& allocator(int device) override { return device_allocator(device); }

  plugin::Allocator& pinned_host_allocator() override {
    MG_CHECK(Devices::get().availability().available,
             "the CUDA platform is unavailable: " << Devices::get().availability().reason);
    return pinned_allocator();
  }

  void set_device(int device) override {
    Devices::get().check(device);
    MG_CUDA_CHECK(cudaSetDevice(device));
  }

  std::unique_ptr<plugin::Stream> create_stream(int device) override {
    Devices::get().check(device);
    DeviceGuard guard(device);
    cudaStream_t s = nullptr;
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::make_unique<CudaStream>(device, s, true);
  }

  std::unique_ptr<plugin::Event> create_event(int device, bool enable_timing) override {
    Devices::get().check(device);
    return std::make_unique<CudaEvent>(device, enable_timing);
  }

  plugin::Stream& current_stream(int device) override {
    Devices::get().check(device);
    if (CudaStream* s = tl_current_stream[device]) return *s;
    return Devices::get().default_stream(device);
  }

  void set_current_stream(int device, plugin::Stream* s) override {
    Devices::get().check(device);
    if (s == nullptr) {
      tl_current_stream[device] = nullptr;
      return;
    }
    CudaStream& cs = as_cuda_stream(*s, "set_current_stream");
    MG_CHECK(cs.device() == Device::cuda(device),
             "set_current_stream: stream belongs to " << cs.device() << ", not cuda:" << device);
    tl_current_stream[device] = &cs;
  }

  void synchronize(int device) override {
    Devices::get().check(device);
    DeviceGuard guard(device);
    MG_CUDA_CHECK(cudaDeviceSynchronize());
    raise_deferred_error(device);
  }

  // NVTX 3 (header-only in the toolkit; it loads the tool's injection library only under a tool
  // such as nsys, otherwise each call is a no-op) and the CUDA profiler API.
  std::string_view profiling_tool() const override {
    return "NVTX ranges + cudaProfilerStart/Stop (nsys --capture-range=cudaProfilerApi)";
  }
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }
  void profiler_start() override { MG_CUDA_CHECK(cudaProfilerStart()); }
  void profiler_stop() override { MG_CUDA_CHECK(cudaProfilerStop()); }
  SparseMemoryInfo sparse_memory_info(int device) override {
    Devices::get().check(device);
    return vmm_info(device);
  }
  plugin::Allocator& sparse_allocator(int device) override {
    Devices::get().check(device);
    return vmm_allocator(device);
  }
  std::size_t decommit(void* ptr, std::size_t bytes, int device) override {
    return vmm_decommit(ptr, bytes, device);
  }
  void commit(void* ptr, std::size_t bytes, int device) override { vmm_commit(ptr, bytes, device); }
  LaunchCounts launch_counts() const override {
    return {.counted = true,
            .kernels = detail::g_kernel_launches.load(std::memory_order_relaxed),
            .library_calls = detail::g_library_calls.load(std::memory_order_relaxed)};
  }

  void manual_seed(uint64_t seed) override { seed_.store(seed); }
  uint64_t seed() const override { return seed_.load(); }

  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            std::size_t bytes) override {
    MG_CHECK((dst_device.is_host() || dst_device.type == DeviceType::cuda) &&
                 (src_device.is_host() || src_device.type == DeviceType::cuda),
             "the CUDA platform copies between the host and CUDA devices, got "
                 << src_device << " -> " << dst_device);
    if (bytes == 0) return;
    if (dst_device.is_host() && src_device.is_host()) {
      std::memmove(dst, src, bytes);
      return;
    }
    const int device = dst_device.is_host() ? src_device.index : dst_device.index;
    Devices::get().check(device);
    DeviceGuard guard(device);
    cudaStream_t s = cuda::current_stream(device);
    if (!dst_device.is_host() && !src_device.is_host() && dst_device.index != src_device.index) {
      Devices::get().check(src_device.index);
      MG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, s));
    } else {
      const cudaMemcpyKind kind = dst_device.is_host()   ? cudaMemcpyDeviceToHost
                                  : src_device.is_host() ? cudaMemcpyHostToDevice
                                                         : cudaMemcpyDeviceToDevice;
      MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    }
    // Uploads do not wait: a source block of the pinned allocator is kept from reuse until the
    // copy completes (CudaPinnedAllocator::read_by_stream), and a pageable source has been staged
    // by the driver when cudaMemcpyAsync returns. Copies within one device do not wait either:
    // the host touches neither end, the work after them on this stream is ordered after them,
    // the NCCL stream waits for an event of this one, and the allocator keeps a freed block from
    // reuse until the work queued before its free is done (CudaAllocator). Those waits were
    // 1,296 host round trips per gpt2-124m step on an H200 (2026-11-26-h200-lease.md). Copies
    // between two devices and downloads wait; download waits are counted by Tensor::copy_ /
    // host_read (named sites).
    if (!src_device.is_host() && !dst_device.is_host() && dst_device.index == src_device.index)
      return;
    if (src_device.is_host() && !dst_device.is_host()) {
      if (pinned_allocator().read_by_stream(src, s)) return;
      cudaPointerAttributes attr{};
      const cudaError_t err = cudaPointerGetAttributes(&attr, src);
      if (err == cudaSuccess && attr.type == cudaMemoryTypeUnregistered) return;
      (void)cudaGetLastError();
      count_host_sync(HostSync::upload);  // inside a pinned block, or not known: wait
    }
    if (!src_device.is_host() && !dst_device.is_host())
      count_host_sync(HostSync::device_copy);  // peer
    MG_CUDA_CHECK(cudaStreamSynchronize(s));
    raise_deferred_error(device);
  }

  void memset_zero(void* dst, int device, std::size_t bytes) override {
    Devices::get().check(device);
    if (bytes == 0) return;
    DeviceGuard guard(device);
    MG_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cuda::current_stream(device)));
  }

  void convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
               int device) override {
    Devices::get().check(device);
    if (n == 0) return;
    DeviceGuard guard(device);
    if (dst_type == src_type) {
      if (dst != src)
        MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(dst_type), cudaMemcpyDeviceToDevice,
                                      cuda::current_stream(device)));
      return;
    }
    launch_convert(dst, dst_type, src, src_type, n, device);
  }

 private:
  std::atomic<uint64_t> seed_{0};
};

}  // namespace

// ---- cuda_common.h --------------------------------------------------------------------------

cudaStream_t current_stream(int device) {
  Devices& d = Devices::get();
  d.check(device);
  if (CudaStream* s = tl_current_stream[device]) return s->handle();
  return d.default_stream(device).handle();
}

DeferredError* deferred_error_record(int device) {
  return Devices::get().error_record_device(device);
}

void raise_deferred_error(int device) {
  volatile DeferredError* e = Devices::get().error_record_host(device);
  if (e->state != 2) return;  // the stream was synchronised: a record is complete or absent
  const int32_t op = e->op;
  const int64_t row = e->row, value = e->value, limit = e->limit;
  e->state = 0;
  switch (op) {
    case kDeferredCrossEntropyTarget:
      MG_THROW("cross_entropy_fwd: target "
               << value << " of row " << row << " is outside [0, V = " << limit
               << ") (found on cuda:" << device << " by the kernel; its loss is NaN)");
    case kDeferredCuSeqlens:
      MG_THROW("attention (cuda:cudnn): cu_seqlens["
               << row << "] = " << value
               << " breaks the contract (cu_seqlens[0] = 0, cu_seqlens[D] "
               << "= S = " << limit << ", monotone; found on cuda:" << device
               << " by the kernel that builds cuDNN's ragged offsets; that attention's results are "
                  "meaningless)");
    default:
      MG_THROW("cuda:" << device << ": a kernel recorded the deferred error " << op << " (row "
                       << row << ", value " << value << ", limit " << limit << ")");
  }
}

plugin::Allocator& device_allocator(int device) {
  return Devices::get().allocator(device);
}

const cudaDeviceProp& device_properties(int device) {
  return Devices::get().props(device);
}

DeviceGuard::DeviceGuard(int device) {
  MG_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != device) {
    MG_CUDA_CHECK(cudaSetDevice(device));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) detail::cuda_ok_or_ignore(cudaSetDevice(prev_));
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, int device) {
  if (bytes == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = current_stream(device);
  MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  count_host_sync(HostSync::kernel);
  MG_CUDA_CHECK(cudaStreamSynchronize(s));
  raise_deferred_error(device);
}

void copy_to_device(void* dst, const void* src, std::size_t bytes, int device) {
  if (bytes == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = current_stream(device);
  MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  count_host_sync(HostSync::kernel);
  MG_CUDA_CHECK(cudaStreamSynchronize(s));
}

// ---- cuda_platform.h ------------------------------------------------------------------------

void register_cuda(plugin::Registry& r) {
  r.register_platform(std::make_unique<CudaPlatform>());
  register_gemm_kernels(r);
  register_elementwise_kernels(r);
  register_embedding_kernels(r);
  register_norm_kernels(r);
  register_activation_kernels(r);
  register_dropout_kernels(r);
  register_softmax_kernels(r);
  register_attention_kernels(r);
  register_rope_kernels(r);
  register_cross_entropy_kernels(r);
  register_optimizer_kernels(r);
  register_init_kernels(r);
  register_fp8_kernels(r);
  register_moe_kernels(r);
#if MG_WITH_CUDNN
  register_cudnn_attention_kernels(r);
#endif
  register_nccl_backend();  // init_communicator("nccl")
}

}  // namespace mg::platforms::cuda
