// The host side of FSDP's discarded ranges (distributed_data_parallel.h release_range /
// commit_range over Platform::decommit / commit, platform.h): on the host the whole pages inside
// a range go back to the OS and read as zeros, the partial pages at its edges are zeroed, bytes
// outside it keep their values; commit is harmless and the pages fault back in when written;
// decommit of a range already given back gives back the same pages again (still zeros); the
// platform defaults report what they do.
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/plugin/registry.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

TEST(DdpReleaseRange, HostGivesBackWholePagesAndZeroesEdges) {
  test::ensure_runtime();
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t n = 8 * page;  // bytes (u8 elements)
  Tensor t = Tensor::empty({n}, DType::u8, Device::cpu());
  auto* p = t.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(1 + i % 251);
  // From the middle of page 1 to the middle of page 5: pages 2..4 whole.
  const int64_t lo = page + page / 2, hi = 5 * page + page / 3;
  Tensor view = t.slice(lo, hi - lo);
  // The allocator's memory may not start on a page boundary: count the whole pages inside.
  const auto base = reinterpret_cast<uintptr_t>(view.raw_data());
  const int64_t whole =
      static_cast<int64_t>(((base + (hi - lo)) / page * page) - ((base + page - 1) / page * page));
  EXPECT_EQ(distributed::release_range(view), whole);
  for (int64_t i = 0; i < n; ++i) {
    if (i >= lo && i < hi)
      ASSERT_EQ(p[i], 0) << i;
    else
      ASSERT_EQ(p[i], static_cast<uint8_t>(1 + i % 251)) << i;
  }
  // Again: harmless, still zeros; then commit (nothing on the host) and write.
  EXPECT_EQ(distributed::release_range(view), whole);
  distributed::commit_range(view);
  for (int64_t i = lo; i < hi; ++i) ASSERT_EQ(p[i], 0);
  for (int64_t i = lo; i < hi; ++i) p[i] = 7;
  for (int64_t i = lo; i < hi; ++i) ASSERT_EQ(p[i], 7);
  // A range inside one page: zeroed, nothing given back.
  Tensor small = t.slice(lo, 16);
  EXPECT_EQ(distributed::release_range(small), 0);
  for (int64_t i = lo; i < lo + 16; ++i) ASSERT_EQ(p[i], 0);
  EXPECT_EQ(p[lo + 16], 7);
}

TEST(DdpReleaseRange, PlatformDefaults) {
  test::ensure_runtime();
  plugin::Platform& cpu = plugin::global_registry().platform(DeviceType::cpu);
  const auto info = cpu.sparse_memory_info(0);
  EXPECT_TRUE(info.releases);
  EXPECT_EQ(info.granularity, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  // The host's sparse tensors are ordinary host tensors.
  Tensor z = Tensor::zeros_sparse({1000}, DType::f32, Device::cpu());
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(1000, 0.0f));
  EXPECT_EQ(cpu.decommit(z.raw_data(), 0, 0), 0u);
}

}  // namespace
}  // namespace mg
