// The CUDA platform's sparse memory (platforms/cuda/cuda_vmm.h: Platform::sparse_allocator,
// decommit, commit over CUDA virtual memory management), what FSDP's discarded ranges use:
//   - a buffer of several granules, filled; a decommit of a range from the middle of granule 1 to
//     the middle of granule 4 gives back granules 2 and 3 (their bytes), the device's free memory
//     (cudaMemGetInfo: VMM chunks bypass the caching allocator) grows by as much, the allocator's
//     physical bytes (stats().reserved_bytes) shrink by as much; the partial-granule edges read
//     zeros and the bytes outside the range keep their values;
//   - the platform's memory statistics (the log's "mem allocated") fall by the released bytes;
//   - decommit again: harmless, 0 bytes; commit: the range reads zeros and can be written; commit
//     again: harmless; freeing the buffer returns every chunk;
//   - where VMM is unsupported the test says so and checks the fallback (zeroing, 0 bytes).
// Every test skips without a GPU (printing the platform's reason). NOT yet run on a GPU.
#include <dlfcn.h>

#include <cstdint>
#include <vector>

#include "megatron/plugin/registry.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

const Device kGpu = Device::cuda(0);

// cudaMemGetInfo, looked up by name (this file also builds without CUDA).
std::size_t free_device_bytes() {
  using Fn = int (*)(std::size_t*, std::size_t*);
  const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  MG_CHECK(fn != nullptr, "cudaMemGetInfo is not in the process");
  std::size_t free = 0, total = 0;
  MG_CHECK(fn(&free, &total) == 0, "cudaMemGetInfo failed");
  return free;
}

std::vector<uint8_t> read(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<uint8_t>();
}

uint8_t pattern(int64_t i) {
  return static_cast<uint8_t>(1 + i % 251);
}

TEST(CudaVmm, DecommitFreesWholeGranulesAndCommitBringsZeros) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  plugin::Platform& cuda = plugin::global_registry().platform(DeviceType::cuda);
  const auto info = cuda.sparse_memory_info(0);
  std::cout << "sparse memory: " << info.note << std::endl;
  const int64_t g = info.releases ? static_cast<int64_t>(info.granularity) : 2 << 20;
  const int64_t n = 6 * g;
  std::vector<uint8_t> host(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) host[static_cast<std::size_t>(i)] = pattern(i);
  plugin::Allocator& alloc = cuda.sparse_allocator(0);
  const std::size_t physical0 = alloc.stats().reserved_bytes;
  {
    Tensor t = Tensor::zeros_sparse({n}, DType::u8, kGpu);
    t.copy_(Tensor::from_vector(host, {n}, DType::u8));
    const int64_t lo = g + g / 2, hi = 4 * g + g / 2;
    Tensor view = t.slice(lo, hi - lo);
    cuda.synchronize(0);
    const std::size_t free0 = free_device_bytes();
    const std::size_t counted0 = cuda.memory_stats(0).allocated_bytes;
    const std::size_t released = cuda.decommit(view.raw_data(), view.nbytes(), 0);
    if (!info.releases) {
      EXPECT_EQ(released, 0u);
    } else {
      EXPECT_EQ(released, static_cast<std::size_t>(2 * g));
      EXPECT_GE(free_device_bytes(), free0 + released);
      EXPECT_EQ(alloc.stats().reserved_bytes, physical0 + static_cast<std::size_t>(4 * g));
      // The device's statistics (the log's memory figures) count the mapped chunks only.
      EXPECT_EQ(cuda.memory_stats(0).allocated_bytes, counted0 - released);
    }
    // The edges (mapped) read zeros, the rest its values; the released granules are not read.
    const std::vector<uint8_t> left = read(t.slice(0, 2 * g));
    const std::vector<uint8_t> right = read(t.slice(4 * g, 2 * g));
    for (int64_t i = 0; i < 2 * g; ++i)
      ASSERT_EQ(left[static_cast<std::size_t>(i)], i >= lo ? 0 : pattern(i)) << i;
    for (int64_t i = 0; i < 2 * g; ++i)
      ASSERT_EQ(right[static_cast<std::size_t>(i)], 4 * g + i < hi ? 0 : pattern(4 * g + i)) << i;
    EXPECT_EQ(cuda.decommit(view.raw_data(), view.nbytes(), 0), 0u);  // again: harmless
    cuda.commit(view.raw_data(), view.nbytes(), 0);
    cuda.commit(view.raw_data(), view.nbytes(), 0);  // again: harmless
    if (info.releases) {
      EXPECT_EQ(alloc.stats().reserved_bytes, physical0 + static_cast<std::size_t>(6 * g));
    }
    const std::vector<uint8_t> all = read(t);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(all[static_cast<std::size_t>(i)], i >= lo && i < hi ? 0 : pattern(i)) << i;
    view.copy_(Tensor::from_vector(std::vector<uint8_t>(static_cast<std::size_t>(hi - lo), 9),
                                   {hi - lo}, DType::u8));
    const std::vector<uint8_t> v = read(view);
    for (uint8_t x : v) ASSERT_EQ(x, 9);
  }
  cuda.synchronize(0);
  EXPECT_EQ(alloc.stats().reserved_bytes, physical0);  // freeing returns every chunk
}

}  // namespace
}  // namespace mg
