// CudaAllocator and CudaPinnedAllocator (see cuda_allocator.h for the policies and invariants).
#include "megatron/platforms/cuda/cuda_allocator.h"

#include <unistd.h>

#include <algorithm>

#include "megatron/core/common/error.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"

namespace mg::platforms::cuda {

namespace {
constexpr std::size_t kSmallStep = 512;
constexpr std::size_t kLargeStep = std::size_t{1} << 20;
// A cached block serves a request of up to this much smaller size class (bounded waste).
constexpr std::size_t kMaxSlackNum = 5, kMaxSlackDen = 4;
}  // namespace

void detail::BlockLedger::handed_out(void* ptr, std::size_t block, std::size_t requested) {
  live.emplace(ptr, Live{block, requested});
  stats.allocated_bytes += requested;
  stats.peak_allocated_bytes = std::max(stats.peak_allocated_bytes, stats.allocated_bytes);
  ++stats.num_allocs;
}

bool detail::BlockLedger::taken_back(void* ptr, std::size_t& block) {
  auto it = live.find(ptr);
  if (it == live.end()) return false;
  block = it->second.block;
  stats.allocated_bytes -= it->second.requested;
  ++stats.num_frees;
  live.erase(it);
  return true;
}

void CudaAllocator::account_external(std::ptrdiff_t bytes) {
  std::lock_guard lock(mu_);
  plugin::MemoryStats& st = ledger_.stats;
  st.allocated_bytes =
      static_cast<std::size_t>(static_cast<std::ptrdiff_t>(st.allocated_bytes) + bytes);
  st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
}

std::size_t CudaAllocator::block_size(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  const std::size_t step = bytes <= kLargeStep ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

cudaEvent_t CudaAllocator::take_event_locked() {
  if (!event_pool_.empty()) {
    cudaEvent_t e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (!detail::cuda_ok_or_ignore(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)))
    return nullptr;
  return e;
}

void* CudaAllocator::allocate(std::size_t bytes) {
  const std::size_t size = block_size(bytes);
  std::lock_guard lock(mu_);
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  auto it = cache_.lower_bound(size);
  if (it != cache_.end() && it->first * kMaxSlackDen <= size * kMaxSlackNum) {
    const std::size_t block = it->first;
    Cached c = it->second;
    cache_.erase(it);
    if (c.freed) {
      // Work queued before the free (on any stream) must finish before the new owner's work.
      MG_CUDA_CHECK(cudaStreamWaitEvent(current_stream(device_), c.freed, 0));
      event_pool_.push_back(c.freed);
    }
    ptr = c.ptr;
    ledger_.handed_out(ptr, block, bytes);
  } else {
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached_locked();
      err = cudaMalloc(&ptr, size);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      MG_THROW("CUDA out of memory on cuda:" << device_ << ": cudaMalloc of " << size
                                             << " bytes (requested " << bytes << ") failed with "
                                             << cudaGetErrorString(err) << "; allocated "
                                             << ledger_.stats.allocated_bytes << " bytes, reserved "
                                             << ledger_.stats.reserved_bytes << " bytes, peak "
                                             << ledger_.stats.peak_allocated_bytes << " bytes");
    }
    ledger_.stats.reserved_bytes += size;
    ledger_.handed_out(ptr, size, bytes);
  }
  return ptr;
}

void CudaAllocator::deallocate(void* ptr, std::size_t) {
  if (!ptr) return;
  std::lock_guard lock(mu_);
  std::size_t block = 0;
  if (!ledger_.taken_back(ptr, block)) return;  // not ours; never throw from a destructor path
  cudaEvent_t ev = nullptr;
  try {
    DeviceGuard guard(device_);  // the event must belong to the block's device
    ev = take_event_locked();
    if (ev && !detail::cuda_ok_or_ignore(cudaEventRecord(ev, current_stream(device_)))) {
      event_pool_.push_back(ev);
      ev = nullptr;
      // The runtime is shutting down (or broken): drop the block rather than risk reuse.
      ledger_.stats.reserved_bytes -= block;
      return;
    }
  } catch (...) {
    ledger_.stats.reserved_bytes -= block;
    return;
  }
  cache_.emplace(block, Cached{ptr, ev});
}

void CudaAllocator::release_cached_locked() {
  for (auto& [size, c] : cache_) {
    if (c.freed) {
      detail::cuda_ok_or_ignore(cudaEventSynchronize(c.freed));
      event_pool_.push_back(c.freed);
    }
    detail::cuda_ok_or_ignore(cudaFree(c.ptr));
    ledger_.stats.reserved_bytes -= size;
  }
  cache_.clear();
}

void CudaAllocator::release_cached() {
  std::lock_guard lock(mu_);
  DeviceGuard guard(device_);
  release_cached_locked();
}

plugin::MemoryStats CudaAllocator::stats() const {
  std::lock_guard lock(mu_);
  return ledger_.stats;
}

void CudaAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  ledger_.stats.peak_allocated_bytes = ledger_.stats.allocated_bytes;
}

// ---- CudaPinnedAllocator ----------------------------------------------------------------------

void* CudaPinnedAllocator::allocate(std::size_t bytes) {
  const std::size_t size = CudaAllocator::block_size(bytes);
  std::lock_guard lock(mu_);
  reclaim_locked(false);
  void* ptr = nullptr;
  auto it = cache_.lower_bound(size);
  if (it != cache_.end() && it->first * kMaxSlackDen <= size * kMaxSlackNum) {
    const std::size_t block = it->first;
    ptr = it->second;
    cache_.erase(it);
    cached_bytes_ -= block;
    ledger_.handed_out(ptr, block, bytes);
  } else {
    if (ledger_.stats.reserved_bytes + size > max_reserved_bytes()) release_cached_locked();
    MG_CHECK(ledger_.stats.reserved_bytes + size <= max_reserved_bytes(),
             "pinned host memory: " << size << " more bytes would exceed the cap of "
                                    << max_reserved_bytes() << " bytes (a quarter of RAM; "
                                    << ledger_.stats.allocated_bytes << " bytes live)");
    cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached_locked();
      err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      MG_THROW("pinned host allocation failed: cudaHostAlloc of "
               << size << " bytes (requested " << bytes << ") failed with "
               << cudaGetErrorString(err) << "; pinned allocated " << ledger_.stats.allocated_bytes
               << " bytes, reserved " << ledger_.stats.reserved_bytes << " bytes");
    }
    ledger_.stats.reserved_bytes += size;
    ledger_.handed_out(ptr, size, bytes);
  }
  return ptr;
}

std::size_t CudaPinnedAllocator::max_reserved_bytes() {
  static const std::size_t cap = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return std::size_t{8} << 30;
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) / 4;
  }();
  return cap;
}

void CudaPinnedAllocator::deallocate(void* ptr, std::size_t) {
  if (!ptr) return;
  std::lock_guard lock(mu_);
  std::size_t block = 0;
  if (!ledger_.taken_back(ptr, block)) return;  // not ours; never throw from a destructor path
  if (auto it = reading_.find(ptr); it != reading_.end()) {  // an upload may still read it
    pending_.push_back({it->second, ptr, block});
    reading_.erase(it);
    return;
  }
  cache_locked(ptr, block);
}

void CudaPinnedAllocator::cache_locked(void* ptr, std::size_t block) {
  if (cached_bytes_ + block > kMaxCachedBytes) {
    detail::cuda_ok_or_ignore(cudaFreeHost(ptr));
    ledger_.stats.reserved_bytes -= block;
    return;
  }
  cache_.emplace(block, ptr);
  cached_bytes_ += block;
}

bool CudaPinnedAllocator::read_by_stream(const void* ptr, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  if (ledger_.live.find(const_cast<void*>(ptr)) == ledger_.live.end()) return false;
  cudaEvent_t& ev = reading_[ptr];
  if (!ev) {
    if (event_pool_.empty()) {
      cudaEvent_t e = nullptr;
      MG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      event_pool_.push_back(e);
    }
    ev = event_pool_.back();
    event_pool_.pop_back();
  }
  MG_CUDA_CHECK(cudaEventRecord(ev, stream));  // after the copy: a later one supersedes
  return true;
}

void CudaPinnedAllocator::reclaim_locked(bool wait) {
  std::size_t kept = 0;
  for (Pending& p : pending_) {
    const cudaError_t st = wait ? cudaEventSynchronize(p.done) : cudaEventQuery(p.done);
    if (st == cudaErrorNotReady) {
      pending_[kept++] = p;
      continue;
    }
    if (st != cudaSuccess) (void)cudaGetLastError();  // a failed copy no longer reads the block
    event_pool_.push_back(p.done);
    cache_locked(p.ptr, p.block);
  }
  pending_.resize(kept);
}

void CudaPinnedAllocator::release_cached_locked() {
  reclaim_locked(true);
  for (auto& [size, p] : cache_) {
    detail::cuda_ok_or_ignore(cudaFreeHost(p));
    ledger_.stats.reserved_bytes -= size;
  }
  cache_.clear();
  cached_bytes_ = 0;
}

void CudaPinnedAllocator::release_cached() {
  std::lock_guard lock(mu_);
  release_cached_locked();
}

std::size_t CudaPinnedAllocator::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_bytes_;
}

plugin::MemoryStats CudaPinnedAllocator::stats() const {
  std::lock_guard lock(mu_);
  return ledger_.stats;
}

void CudaPinnedAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  ledger_.stats.peak_allocated_bytes = ledger_.stats.allocated_bytes;
}

CudaPinnedAllocator& pinned_allocator() {
  static CudaPinnedAllocator* a = new CudaPinnedAllocator();  // never destroyed
  return *a;
}

}  // namespace mg::platforms::cuda
