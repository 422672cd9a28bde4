// Pinned host tensors (Tensor::empty_pinned, to_pinned_host, from_vector onto a device) on every
// platform: host tensors from the platform's pinned_host_allocator() (the CPU platform's is the
// ordinary host allocator), with its statistics, alignment, and exact copies to and from the
// device. On CUDA also: freed blocks are cached and reused (cudaHostAlloc is slow), uploads do not
// wait and their staging blocks are not reused before the copy has read them. Skips with
// the platform's reason where it is unavailable.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/common/host_sync.h"
#include "tests/unit/test_util.h"

namespace mg::test {
namespace {

class PinnedMemory : public ::testing::TestWithParam<std::string> {
 protected:
  plugin::Platform& platform() { return *plugin::global_registry().find_platform(GetParam()); }
  Device device() { return device_for(GetParam()); }
};

TEST_P(PinnedMemory, EmptyPinnedIsAHostTensorFromThePinnedAllocator) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  plugin::Allocator& a = platform().pinned_host_allocator();
  const auto before = a.stats();
  {
    Tensor t = Tensor::empty_pinned({250, 4}, DType::f32, device());
    EXPECT_TRUE(t.is_host());
    EXPECT_EQ(t.device(), Device::cpu());
    EXPECT_EQ(t.is_pinned(), !device().is_host());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 256, 0u);
    const auto live = a.stats();
    EXPECT_EQ(live.allocated_bytes, before.allocated_bytes + 4000);
    EXPECT_EQ(live.num_allocs, before.num_allocs + 1);
    EXPECT_GE(live.peak_allocated_bytes, live.allocated_bytes);
    // Ordinary host memory semantics: write and read back.
    float* p = t.data<float>();
    for (int i = 0; i < 1000; ++i) p[i] = static_cast<float>(i) * 0.5f;
    EXPECT_EQ(t.to_vector<float>()[999], 499.5f);
  }
  const auto after = a.stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_frees, before.num_frees + 1);
}

TEST_P(PinnedMemory, FromVectorOntoTheDeviceIsExact) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  const std::vector<double> v = random_values(777, 5, 0.1, 100.0);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor d = Tensor::from_vector(v, {7, 111}, dt, device());
    EXPECT_EQ(d.device(), device());
    EXPECT_EQ(d.dtype(), dt);
    // The reference: the same conversion entirely on the host.
    EXPECT_EQ(d.to_vector<double>(), Tensor::from_vector(v, {7, 111}, dt).to_vector<double>())
        << dtype_name(dt);
  }
  std::vector<int64_t> ids(4096);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919 % 50257);
  EXPECT_EQ(Tensor::from_vector(ids, {64, 64}, DType::i64, device()).to_vector<int64_t>(), ids);
}

TEST_P(PinnedMemory, ToPinnedHostCopiesDeviceTensors) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  const std::vector<double> v = random_values(1 << 16, 6);
  const Tensor d = Tensor::from_vector(v, {256, 256}, DType::f32).to(device());
  const Tensor h = d.to_pinned_host();
  EXPECT_TRUE(h.is_host());
  EXPECT_EQ(h.shape(), d.shape());
  EXPECT_EQ(h.to_vector<double>(), d.to_vector<double>());
  if (device().is_host()) {
    EXPECT_TRUE(h.shares_storage_with(d));  // a host tensor is returned as is
  } else {
    EXPECT_TRUE(h.is_pinned());
    // and back onto the device from pinned memory
    Tensor back = Tensor::empty(d.shape(), d.dtype(), device());
    back.copy_(h);
    EXPECT_EQ(back.to_vector<double>(), d.to_vector<double>());
  }
}

TEST_P(PinnedMemory, DevicePlatformsCacheFreedPinnedBlocks) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  if (device().is_host()) GTEST_SKIP() << "the CPU platform's staging memory is ordinary memory";
  plugin::Allocator& a = platform().pinned_host_allocator();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty_pinned({3 << 20}, DType::u8, device());
    first = t.raw_data();
  }
  const auto cached = a.stats();
  Tensor again = Tensor::empty_pinned({3 << 20}, DType::u8, device());
  EXPECT_EQ(again.raw_data(), first);  // the cached block, no new cudaHostAlloc
  EXPECT_EQ(a.stats().reserved_bytes, cached.reserved_bytes);
}

// Uploads return queued on a device platform (no host wait: no HostSync::upload counted) and a
// staging block dropped right after its upload is not reused before the copy has read it: many
// large uploads from fresh pinned buffers, each with its own pattern, all arrive intact. Pageable
// sources do not wait either.
TEST_P(PinnedMemory, UploadsDoNotWaitAndStagingIsNotReusedEarly) {
  MG_SKIP_IF_UNAVAILABLE(GetParam());
  if (device().is_host()) GTEST_SKIP() << "the CPU platform has no uploads";
  const int64_t n = int64_t{8} << 20;  // 32 MiB of f32 per upload
  const HostSyncCounts before = host_sync_counts();
  std::vector<Tensor> on_device;
  for (int i = 0; i < 12; ++i) {
    Tensor h = Tensor::empty_pinned({n}, DType::f32, device());
    ASSERT_TRUE(h.is_pinned());
    float* p = h.data<float>();
    for (int64_t j = 0; j < n; ++j) p[j] = static_cast<float>(i * 7 + (j % 1000));
    on_device.push_back(h.to(device()));  // h dies here, its copy maybe still queued
  }
  on_device.push_back(Tensor::from_vector(std::vector<float>(1000, 5.0f), {1000}).to(device()));
  EXPECT_EQ((host_sync_counts() - before)[HostSync::upload], 0);
  for (int i = 0; i < 12; ++i) {
    const std::vector<float> v = on_device[static_cast<std::size_t>(i)].to_vector<float>();
    for (int64_t j = 0; j < n; j += 4099)
      ASSERT_EQ(v[static_cast<std::size_t>(j)], static_cast<float>(i * 7 + (j % 1000)))
          << "upload " << i << " element " << j;
  }
  EXPECT_EQ(on_device.back().to_vector<float>(), std::vector<float>(1000, 5.0f));
}

INSTANTIATE_TEST_SUITE_P(AllPlatforms, PinnedMemory, ::testing::ValuesIn(op_test_platforms()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mg::test
