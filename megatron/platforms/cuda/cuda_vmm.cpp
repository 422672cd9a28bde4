// Sparse-capable device memory through CUDA virtual memory management (cuda_vmm.h).
#include "megatron/platforms/cuda/cuda_vmm.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/platforms/cuda/cuda_allocator.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"

namespace mg::platforms::cuda {

namespace {

// The driver entry points, resolved through the runtime (no link against libcuda).
struct Driver {
  decltype(&cuDeviceGetAttribute) get_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  std::string error;  // why not every function was found

  Driver() {
    auto get = [this](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess || p == nullptr) {
        (void)cudaGetLastError();
        if (error.empty()) error = std::string("driver entry point ") + name + " not found";
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuDeviceGetAttribute", get_attribute);
    get("cuMemGetAllocationGranularity", granularity);
    get("cuMemAddressReserve", reserve);
    get("cuMemAddressFree", address_free);
    get("cuMemCreate", create);
    get("cuMemRelease", release);
    get("cuMemMap", map);
    get("cuMemUnmap", unmap);
    get("cuMemSetAccess", set_access);
  }
};

const Driver& driver() {
  static const Driver d;
  return d;
}

void check_cu(CUresult r, const char* what) {
  MG_CHECK(r == CUDA_SUCCESS,
           "CUDA VMM: " << what << " failed (CUresult " << static_cast<int>(r) << ")");
}

void note_fallback_once(const std::string& reason) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::cerr << "CUDA VMM unavailable (" << reason
              << "): sparse buffers are ordinary allocations; decommit zeroes, frees nothing"
              << std::endl;
  });
}

class VmmAllocator final : public plugin::Allocator {
 public:
  explicit VmmAllocator(int device) : device_(device) {
    DeviceGuard g(device);
    if (const char* env = std::getenv("MG_CUDA_VMM");
        env != nullptr && std::strcmp(env, "0") == 0) {
      reason_ = "MG_CUDA_VMM=0";
      return;
    }
    const Driver& d = driver();
    if (!d.error.empty()) {
      reason_ = d.error;
      return;
    }
    int supported = 0;
    CUresult r = d.get_attribute(&supported,
                                 CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
    if (r != CUDA_SUCCESS || supported == 0) {
      reason_ = "device " + std::to_string(device) + " does not support virtual memory management";
      return;
    }
    size_t g_bytes = 0;
    const CUmemAllocationProp prop = this->prop();
    r = d.granularity(&g_bytes, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || g_bytes == 0) {
      reason_ = "cuMemGetAllocationGranularity failed";
      return;
    }
    granularity_ = g_bytes;
  }

  bool supported() const { return granularity_ > 0; }
  std::size_t granularity() const { return granularity_; }
  const std::string& reason() const { return reason_; }

  void* allocate(std::size_t bytes) override {
    if (supported()) {
      try {
        return allocate_vmm(bytes);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mu_);
        if (reason_.empty()) reason_ = std::string("reservation failed: ") + e.what();
      }
    }
    note_fallback_once(reason_);
    return device_allocator(device_).allocate(bytes);
  }

  void deallocate(void* ptr, std::size_t bytes) override {
    if (ptr == nullptr) return;
    std::unique_lock<std::mutex> lock(mu_);
    auto it = res_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == res_.end()) {
      lock.unlock();
      device_allocator(device_).deallocate(ptr, bytes);
      return;
    }
    Reservation r = std::move(it->second);
    res_.erase(it);
    allocated_ -= r.bytes;
    ++frees_;
    lock.unlock();
    DeviceGuard g(device_);
    count_host_sync(HostSync::memory);
    MG_CUDA_CHECK(cudaDeviceSynchronize());  // no queued kernel may still use the memory
    lock.lock();
    for (std::size_t i = 0; i < r.chunks.size(); ++i) unmap_granule(r, i);
    lock.unlock();
    check_cu(driver().address_free(r.base, r.chunks.size() * granularity_), "cuMemAddressFree");
  }

  plugin::MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    plugin::MemoryStats s;
    s.allocated_bytes = allocated_;
    s.peak_allocated_bytes = peak_;
    s.reserved_bytes = physical_;
    s.num_allocs = allocs_;
    s.num_frees = frees_;
    return s;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = allocated_;
  }

  std::size_t physical_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return physical_;
  }

  std::size_t decommit(void* ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    Reservation* r = find(ptr, bytes);
    if (r == nullptr) {
      zero(ptr, bytes);
      return 0;
    }
    DeviceGuard g(device_);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr) - r->base, hi = lo + bytes;
    const uintptr_t glo = (lo + granularity_ - 1) / granularity_, ghi = hi / granularity_;
    if (ghi <= glo) {
      zero_mapped(*r, lo, hi);
      return 0;
    }
    zero_mapped(*r, lo, glo * granularity_);
    zero_mapped(*r, ghi * granularity_, hi);
    // The edges' zeroing and every queued user of the granules (any stream) finish first: a host
    // wait (counted), the price of giving memory back without a stream-ordered allocator.
    count_host_sync(HostSync::memory);
    MG_CUDA_CHECK(cudaDeviceSynchronize());
    std::size_t released = 0;
    for (uintptr_t i = glo; i < ghi; ++i) released += unmap_granule(*r, i);
    return released;
  }

  void commit(void* ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    Reservation* r = find(ptr, bytes);
    if (r == nullptr || bytes == 0) return;
    DeviceGuard g(device_);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr) - r->base, hi = lo + bytes;
    for (uintptr_t i = lo / granularity_; i * granularity_ < hi; ++i) {
      if (r->chunks[i] != 0) continue;
      map_granule(*r, i);
      // Stream-ordered zeros: work queued after this on the current stream (or waiting for it,
      // as the NCCL stream does) sees them, without blocking the host.
      MG_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(r->base + i * granularity_), 0,
                                    granularity_, current_stream(device_)));
    }
  }

 private:
  struct Reservation {
    CUdeviceptr base = 0;
    std::size_t bytes = 0;                             // asked for
    std::vector<CUmemGenericAllocationHandle> chunks;  // per granule; 0: unmapped
  };

  CUmemAllocationProp prop() const {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device_;
    return p;
  }

  void* allocate_vmm(std::size_t bytes) {
    DeviceGuard g(device_);
    const Driver& d = driver();
    Reservation r;
    r.bytes = bytes;
    const std::size_t n = std::max<std::size_t>(1, (bytes + granularity_ - 1) / granularity_);
    check_cu(d.reserve(&r.base, n * granularity_, granularity_, 0, 0), "cuMemAddressReserve");
    r.chunks.assign(n, 0);
    std::lock_guard<std::mutex> lock(mu_);
    try {
      for (std::size_t i = 0; i < n; ++i) map_granule(r, i);
    } catch (...) {
      for (std::size_t i = 0; i < n; ++i) unmap_granule(r, i);
      (void)d.address_free(r.base, n * granularity_);
      throw;
    }
    void* p = reinterpret_cast<void*>(r.base);
    allocated_ += bytes;
    peak_ = std::max(peak_, allocated_);
    ++allocs_;
    res_.emplace(r.base, std::move(r));
    return p;
  }

  // Called with mu_ held (or on a reservation not yet published).
  void map_granule(Reservation& r, std::size_t i) {
    const Driver& d = driver();
    const CUmemAllocationProp p = prop();
    CUmemGenericAllocationHandle h = 0;
    check_cu(d.create(&h, granularity_, &p, 0), "cuMemCreate");
    const CUdeviceptr at = r.base + i * granularity_;
    CUresult res = d.map(at, granularity_, 0, h, 0);
    if (res == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location = p.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      res = d.set_access(at, granularity_, &access, 1);
      if (res != CUDA_SUCCESS) (void)d.unmap(at, granularity_);
    }
    if (res != CUDA_SUCCESS) {
      (void)d.release(h);
      check_cu(res, "cuMemMap / cuMemSetAccess");
    }
    r.chunks[i] = h;
    physical_ += granularity_;
    account(static_cast<std::ptrdiff_t>(granularity_));
  }

  // The device's memory statistics (the caching allocator's, the log's) count the mapped chunks.
  void account(std::ptrdiff_t bytes) const {
    if (auto* c = dynamic_cast<CudaAllocator*>(&device_allocator(device_)))
      c->account_external(bytes);
  }

  std::size_t unmap_granule(Reservation& r, std::size_t i) {
    if (r.chunks[i] == 0) return 0;
    check_cu(driver().unmap(r.base + i * granularity_, granularity_), "cuMemUnmap");
    check_cu(driver().release(r.chunks[i]), "cuMemRelease");
    r.chunks[i] = 0;
    physical_ -= granularity_;
    account(-static_cast<std::ptrdiff_t>(granularity_));
    return granularity_;
  }

  Reservation* find(void* ptr, std::size_t bytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    auto it = res_.upper_bound(p);
    if (it == res_.begin()) return nullptr;
    --it;
    Reservation& r = it->second;
    if (p + bytes > r.base + r.chunks.size() * granularity_) return nullptr;
    return &r;
  }

  void zero(void* ptr, std::size_t bytes) {
    if (bytes == 0) return;
    DeviceGuard g(device_);
    MG_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, current_stream(device_)));
  }

  // Zeroes [lo, hi) (offsets in r) where it is mapped.
  void zero_mapped(Reservation& r, uintptr_t lo, uintptr_t hi) {
    while (lo < hi) {
      const std::size_t i = lo / granularity_;
      const uintptr_t end = std::min<uintptr_t>(hi, (i + 1) * granularity_);
      if (r.chunks[i] != 0) zero(reinterpret_cast<void*>(r.base + lo), end - lo);
      lo = end;
    }
  }

  int device_;
  std::size_t granularity_ = 0;
  std::string reason_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Reservation> res_;  // by base address
  std::size_t allocated_ = 0, peak_ = 0, physical_ = 0, allocs_ = 0, frees_ = 0;
};

VmmAllocator& vmm(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<VmmAllocator>> by_device;
  std::lock_guard<std::mutex> lock(mu);
  auto& a = by_device[device];
  if (!a) a = std::make_unique<VmmAllocator>(device);
  return *a;
}

}  // namespace

plugin::Allocator& vmm_allocator(int device) {
  return vmm(device);
}

plugin::Platform::SparseMemoryInfo vmm_info(int device) {
  const VmmAllocator& a = vmm(device);
  if (!a.supported()) return {false, 0, "CUDA VMM unavailable: " + a.reason()};
  std::ostringstream s;
  s << "CUDA VMM, granularity " << a.granularity() / 1048576.0 << " MiB";
  return {true, a.granularity(), s.str()};
}

std::size_t vmm_decommit(void* ptr, std::size_t bytes, int device) {
  if (bytes == 0) return 0;
  return vmm(device).decommit(ptr, bytes);
}

void vmm_commit(void* ptr, std::size_t bytes, int device) {
  vmm(device).commit(ptr, bytes);
}

std::size_t vmm_physical_bytes(int device) {
  return vmm(device).physical_bytes();
}

}  // namespace mg::platforms::cuda
