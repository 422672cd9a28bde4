// The platform interface: what a device family (CPU, CUDA, or a plugin's MUSA/TXDA) must provide
// beyond its op kernels. Split ggml-style into small pieces: Allocator, Stream, Event, Platform.
//
// Invariants: a Platform object is created once per process and lives until exit (tensors hold a
// pointer to its allocator). Ops run on the platform's current stream for the device; the CPU
// platform's streams are synchronous. Availability is asked, never assumed: a CUDA build on a
// machine without a GPU has a CUDA platform that says why it is unavailable.
//
// Also here: the pinned host allocator of a platform (page-locked staging memory for host<->device
// copies). Not here: --deterministic-mode. It is a per-run choice of the op table (a kernel with a
// faster non-deterministic variant registers that variant as its own provider with
// ProviderTraits::deterministic = false, and a deterministic run's table never resolves it:
// registry.h), so no kernel consults a process-wide flag.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "megatron/core/tensor/device.h"
#include "megatron/core/tensor/dtype.h"

namespace mg::plugin {

struct Availability {
  bool available = false;
  std::string reason;  // why not (or a short description of what was found, when available)
};

struct MemoryStats {
  std::size_t allocated_bytes = 0;       // live bytes handed out now
  std::size_t peak_allocated_bytes = 0;  // max of allocated_bytes since start / reset_peak
  std::size_t reserved_bytes = 0;        // bytes held from the system (>= allocated with caching)
  std::size_t num_allocs = 0;            // allocate() calls
  std::size_t num_frees = 0;             // deallocate() calls
};

// Thread-safe. Returned memory is aligned to at least 256 bytes (vector loads, TMA, cuBLASLt).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  virtual void synchronize() = 0;
  virtual void* native_handle() = 0;  // cudaStream_t for CUDA, nullptr for the CPU
};

class Event {
 public:
  virtual ~Event() = default;
  virtual void record(Stream& s) = 0;
  virtual void wait(Stream& s) = 0;  // make s wait for this event (no host block)
  virtual void synchronize() = 0;    // block the host until the event completes
  virtual bool query() = 0;          // completed?
  // Milliseconds between start (recorded earlier) and this event; both must have completed.
  virtual double elapsed_ms(const Event& start) const = 0;
};

struct Capabilities {
  std::string device_name;
  std::size_t total_memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;  // CUDA compute capability; 0 elsewhere
  bool bf16 = false;                         // native bf16 compute worth using
  bool f16 = false;
  bool fp8 = false;           // hardware fp8 GEMM (Hopper and later)
  int num_compute_units = 0;  // SMs or cores
};

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };

class Platform {
 public:
  virtual ~Platform() = default;

  virtual std::string_view name() const = 0;  // "cpu", "cuda", "musa", ...
  virtual DeviceType device_type() const = 0;
  virtual Availability availability() const = 0;
  virtual int device_count() const = 0;
  virtual Capabilities capabilities(int device) const = 0;

  virtual Allocator& allocator(int device) = 0;
  MemoryStats memory_stats(int device) { return allocator(device).stats(); }
  // Host memory for staging copies to and from this platform's devices: page-locked (CUDA:
  // cudaHostAlloc, cached) where that makes copies faster and truly asynchronous; the default,
  // and the CPU platform's, is the ordinary host allocator. Thread-safe, 256-byte aligned, with
  // stats like allocator(). Tensor::empty_pinned allocates from it.
  virtual Allocator& pinned_host_allocator();

  // Makes `device` the calling thread's current device (CUDA: cudaSetDevice), so that work not
  // routed through the platform (libraries, NCCL) lands on it too. mg::init calls it with the
  // device of the node-local rank. The default (host platforms) only checks the index.
  virtual void set_device(int device);

  virtual std::unique_ptr<Stream> create_stream(int device) = 0;
  virtual std::unique_ptr<Event> create_event(int device, bool enable_timing = false) = 0;
  // The stream ops use on this thread; set_current_stream(nullptr) restores the default.
  virtual Stream& current_stream(int device) = 0;
  virtual void set_current_stream(int device, Stream* s) = 0;
  virtual void synchronize(int device) = 0;

  // Profiling (--profile): a named range around host-issued work, shown by the vendor's timeline
  // tool (CUDA: NVTX push / pop, seen by nsys), and the capture range of such a tool (CUDA:
  // cudaProfilerStart / Stop, nsys --capture-range=cudaProfilerApi). The defaults do nothing (the
  // CPU platform has no such tool); profiling_tool() names what they drive ("" for none).
  virtual std::string_view profiling_tool() const { return {}; }
  virtual void range_push(const char* /*name*/) {}
  virtual void range_pop() {}
  virtual void profiler_start() {}
  virtual void profiler_stop() {}

  // Seeds the platform's default generator (Philox key) on every device.
  virtual void manual_seed(uint64_t seed) = 0;
  virtual uint64_t seed() const = 0;

  // Raw memory movement between this platform's devices and the host, on the current stream;
  // returns when the copy is complete, except that a host-to-device copy, and a copy within one
  // device, may return queued on the current stream (CUDA does both): the source may then be
  // dropped (the allocator orders its reuse after the copy) but not written again except by work
  // queued after it on that stream.
  // dst_device/src_device pick the devices.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device,
                    std::size_t bytes) = 0;
  virtual void memset_zero(void* dst, int device, std::size_t bytes) = 0;
  // Element-wise dtype conversion of n elements, both buffers on `device` (see dtype.h).
  virtual void convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
                       int device) = 0;

  // Device work submitted by this process since it started (all devices), for the op profile's
  // launches per step: the kernels the platform's own code launched, and its calls into vendor
  // libraries (GEMMs, fused attention; each may launch more than one kernel). counted = false
  // (the default, and the CPU platform's: its ops run on host threads) prints no such line.
  struct LaunchCounts {
    bool counted = false;
    uint64_t kernels = 0, library_calls = 0;
  };
  virtual LaunchCounts launch_counts() const { return {}; }

  // Sparse-capable memory: buffers whose ranges can give their memory back and take it again
  // (FSDP's discarded parameter and gradient ranges, distributed_data_parallel.h). Added last so
  // that the slots above keep their places for plugins built against the older interface.
  // sparse_allocator(device): allocations that decommit / commit can release (the default: the
  // ordinary allocator, whose memory they cannot). decommit(ptr, bytes, device): the range reads
  // as zeros afterwards; the physical memory of every whole granule inside it is given back (the
  // bytes outside whole granules are zeroed); returns the bytes given back. commit: the range is
  // backed again and reads as zeros where it had been given back (the rest keeps its contents);
  // a range must be committed before it is written. Both are harmless on a range already in
  // that state and work on any memory of the device (memory not from sparse_allocator is zeroed,
  // 0 bytes given back). The defaults: on a host platform (device_type() cpu) decommit is
  // release_host_pages and commit nothing (a page faults back in, zeroed, when written); on
  // another platform decommit zeroes the range (memset_zero) and gives back nothing.
  struct SparseMemoryInfo {
    bool releases = false;        // decommit really gives memory back
    std::size_t granularity = 0;  // bytes of one granule (host: the page size)
    std::string note;             // what backs it, or why nothing is given back
  };
  virtual SparseMemoryInfo sparse_memory_info(int device);
  virtual Allocator& sparse_allocator(int device) { return allocator(device); }
  virtual std::size_t decommit(void* ptr, std::size_t bytes, int device);
  virtual void commit(void* /*ptr*/, std::size_t /*bytes*/, int /*device*/) {}
};

// Host decommit: zeroes [ptr, ptr + bytes) and gives the whole pages inside it back to the OS
// (madvise MADV_DONTNEED: private anonymous memory, as the host allocator's, then reads as zeros
// and faults back in when written); returns the bytes given back.
std::size_t release_host_pages(void* ptr, std::size_t bytes);

}  // namespace mg::plugin
