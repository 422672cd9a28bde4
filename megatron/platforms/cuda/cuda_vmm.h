// Sparse-capable device memory for the CUDA platform (Platform::sparse_allocator / decommit /
// commit, platform.h), built on CUDA's virtual memory management: each allocation is one address
// reservation backed granule by granule (the minimum allocation granularity, typically 2 MiB) by
// physical chunks of its own, so that decommit can unmap and free the chunks of whole granules
// inside a range and commit can create, map and zero them again. FSDP's discarded parameter and
// gradient ranges use it (distributed_data_parallel.h).
//
// Invariants: a granule is either mapped read-write with a chunk of its own or unmapped (an access
// to it faults: a range must be committed before it is used). decommit synchronizes the device
// (every stream, not only the current one: an NCCL stream may still read the range) before it
// unmaps; commit zeroes a new chunk with cudaMemsetAsync on the device's current stream, so work
// queued after it on that stream (or on a stream that waits for it, as the NCCL communicator's
// does) sees zeros. The driver functions are resolved at run time through the runtime
// (cudaGetDriverEntryPointByVersion), so the library does not link libcuda and still loads on a
// machine without a driver.
// The chunks mapped are counted in the device caching allocator's statistics (account_external),
// so Platform::memory_stats and the log's memory figures include them.
// Where VMM is unsupported (the device attribute, or a failing reservation) or turned off
// (environment MG_CUDA_VMM=0) an allocation comes from the caching allocator instead, decommit
// only zeroes it and gives back 0 bytes, and the reason is printed once on stderr. Each decommit
// of whole granules waits for the device (HostSync::memory, counted per step by
// --profile-op-table).
// Not here: sharing chunks between processes, or memory of another device than the reservation's.
#pragma once

#include <cstddef>
#include <string>

#include "megatron/plugin/platform.h"

namespace mg::platforms::cuda {

// The sparse allocator of one device (created on first use, lives until exit).
plugin::Allocator& vmm_allocator(int device);
// Platform::sparse_memory_info / decommit / commit for the CUDA platform.
plugin::Platform::SparseMemoryInfo vmm_info(int device);
std::size_t vmm_decommit(void* ptr, std::size_t bytes, int device);
void vmm_commit(void* ptr, std::size_t bytes, int device);
// Bytes of physical chunks the sparse allocator of `device` holds now (for tests).
std::size_t vmm_physical_bytes(int device);

}  // namespace mg::platforms::cuda
