// The caching allocators of the CUDA platform: device memory (CudaAllocator, one per device) and
// pinned host memory (CudaPinnedAllocator, one per process); both live for the process.
//
// ---- CudaAllocator
//
// Blocks come from cudaMalloc (256-byte aligned) in size classes (512 B steps up to 1 MiB, 1 MiB
// steps above) and return to a free list on deallocate. Reuse is stream-safe: deallocate records
// an event on the freeing thread's current stream, and allocate makes the allocating thread's
// current stream wait for that event before handing the block out again. So a tensor may die
// while kernels on its stream still read it. Memory used on a stream other than the current one
// at free time needs the caller's synchronisation (as PyTorch's record_stream).
// When cudaMalloc fails the cache is released (after the blocks' events complete) and the
// allocation retried once; a second failure throws with the statistics.
// Stats: allocated_bytes counts requested bytes; reserved_bytes counts every block held from
// cudaMalloc, live or cached. deallocate never throws (it runs in destructors, also at process
// teardown when the CUDA runtime may already be gone; then the block is dropped).
// Not here: block splitting, expandable segments, per-stream pools (not yet).
//
// ---- CudaPinnedAllocator
// Page-locked host memory (cudaHostAlloc with cudaHostAllocPortable: pinned for every device's
// context) for the staging buffers of host<->device copies: the per-step batch upload and
// checkpoint staging. cudaHostAlloc is slow (it pins pages: ~ms per MB), so freed blocks are kept
// in the same size classes as device blocks and reused, up to kMaxCachedBytes in all (a block that
// would exceed it is freed at once). Uploads are asynchronous (CudaPlatform::copy from a block's
// start to a device does not wait): the copy marks the block with read_by_stream, and a block freed
// while such a copy may still read it waits in a pending list until its event completes, then
// joins the cache. So the staging buffers of consecutive uploads are distinct (double-buffered, or
// more when the host runs further ahead), and the host may drop a staged tensor right after
// queueing its upload; it must not write into it again (every upload here stages into a fresh
// tensor). Device-to-host copies still wait. When cudaHostAlloc fails, or the pinned total would
// pass max_reserved_bytes(), the cache is released and the call retried once; a second failure
// throws with the statistics (Tensor::empty_pinned then stages in pageable memory). Stats as
// CudaAllocator's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "megatron/plugin/platform.h"

namespace mg::platforms::cuda {

namespace detail {
// The live blocks and statistics both allocators keep (the caller holds its lock): handed_out()
// records a block given to a caller, taken_back() removes it again (false when the pointer is not
// one of ours). reserved_bytes is the owner's to keep (its policies differ).
struct BlockLedger {
  struct Live {
    std::size_t block;
    std::size_t requested;
  };
  void handed_out(void* ptr, std::size_t block, std::size_t requested);
  bool taken_back(void* ptr, std::size_t& block);
  std::unordered_map<void*, Live> live;
  plugin::MemoryStats stats;
};
}  // namespace detail

class CudaAllocator final : public plugin::Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  plugin::MemoryStats stats() const override;
  void reset_peak() override;
  // Returns every cached block to the driver (after its pending work completes).
  void release_cached();
  // Device memory held for tensors outside the cache (the sparse allocator's mapped chunks,
  // cuda_vmm.h), +bytes when mapped, -bytes when unmapped: counted in allocated_bytes and its
  // peak, so that stats() (the log's "mem allocated" / "mem max allocated") is the device memory
  // this process holds for tensors, whichever allocator served them.
  void account_external(std::ptrdiff_t bytes);

  // Size class of a request (exposed for tests of the policy).
  static std::size_t block_size(std::size_t bytes);

 private:
  struct Cached {
    void* ptr;
    cudaEvent_t freed;  // recorded on the freeing stream; null when none could be recorded
  };
  void release_cached_locked();
  cudaEvent_t take_event_locked();

  int device_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, Cached> cache_;  // block size -> cached blocks
  std::vector<cudaEvent_t> event_pool_;
  detail::BlockLedger ledger_;
};

class CudaPinnedAllocator final : public plugin::Allocator {
 public:
  static constexpr std::size_t kMaxCachedBytes = std::size_t{4} << 30;
  // Pinned bytes held at most (live + cached): a quarter of physical memory, so that staging
  // never locks most of the host's RAM; past it allocate() throws and Tensor::empty_pinned falls
  // back to pageable memory.
  static std::size_t max_reserved_bytes();
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  plugin::MemoryStats stats() const override;
  void reset_peak() override;
  void release_cached();  // frees every cached block (cudaFreeHost), pending ones after their copy
  std::size_t cached_bytes() const;
  // A copy queued on `stream` reads the live block starting at `ptr`: the block is not reused
  // before that copy completes. False (nothing recorded) when ptr is not the start of a live
  // block of this allocator.
  bool read_by_stream(const void* ptr, cudaStream_t stream);

 private:
  void release_cached_locked();
  void cache_locked(void* ptr, std::size_t block);
  void reclaim_locked(bool wait);  // pending blocks whose copy completed (all with wait) -> cache

  struct Pending {
    cudaEvent_t done;
    void* ptr;
    std::size_t block;
  };
  std::unordered_map<const void*, cudaEvent_t> reading_;  // live blocks with a copy in flight
  std::vector<Pending> pending_;                          // freed, a copy maybe still reading
  std::vector<cudaEvent_t> event_pool_;

  mutable std::mutex mu_;
  std::multimap<std::size_t, void*> cache_;  // block size -> cached blocks
  std::size_t cached_bytes_ = 0;
  detail::BlockLedger ledger_;
};

// The process's pinned host allocator (created on first use, never destroyed).
CudaPinnedAllocator& pinned_allocator();

}  // namespace mg::platforms::cuda
