// The CPU platform through the Platform interface: availability, devices, memory stats as tensors
// come and go, synchronous streams, events, copy / memset / convert, seed, bad device indices.
#include <thread>

#include "tests/unit/test_util.h"

namespace {

mg::plugin::Platform& cpu() {
  mg::test::ensure_runtime();
  return *mg::plugin::global_registry().find_platform("cpu");
}

TEST(CpuPlatform, AvailableWithOneDevice) {
  auto& p = cpu();
  EXPECT_EQ(p.name(), "cpu");
  EXPECT_EQ(p.device_type(), mg::DeviceType::cpu);
  EXPECT_TRUE(p.availability().available);
  EXPECT_EQ(p.device_count(), 1);
  const auto caps = p.capabilities(0);
  EXPECT_FALSE(caps.device_name.empty());
  EXPECT_GT(caps.total_memory_bytes, 0u);
  EXPECT_GE(caps.num_compute_units, 1);
  EXPECT_THROW(p.capabilities(1), mg::Error);
  EXPECT_THROW(p.allocator(3), mg::Error);
}

TEST(CpuPlatform, MemoryStatsFollowTensorLifetimes) {
  auto& p = cpu();
  const auto before = p.memory_stats(0);
  {
    mg::Tensor a = mg::Tensor::empty({1000, 1000}, mg::DType::f32);  // 4 MB
    const auto during = p.memory_stats(0);
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + 4000000u);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
    EXPECT_EQ(during.num_allocs, before.num_allocs + 1);
    mg::Tensor view = a.slice(10, 20);  // shares storage: no allocation
    EXPECT_EQ(p.memory_stats(0).num_allocs, during.num_allocs);
  }
  const auto after = p.memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_frees, before.num_frees + 1);
  EXPECT_GE(after.peak_allocated_bytes, before.allocated_bytes + 4000000u);
  p.allocator(0).reset_peak();
  EXPECT_EQ(p.memory_stats(0).peak_allocated_bytes, p.memory_stats(0).allocated_bytes);
}

TEST(CpuPlatform, StreamsAndEvents) {
  auto& p = cpu();
  auto s = p.create_stream(0);
  EXPECT_EQ(s->device(), mg::Device::cpu());
  EXPECT_EQ(s->native_handle(), nullptr);
  auto start = p.create_event(0, true);
  auto stop = p.create_event(0, true);
  start->record(*s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop->record(*s);
  stop->synchronize();
  EXPECT_TRUE(stop->query());
  const double ms = stop->elapsed_ms(*start);
  EXPECT_GE(ms, 19.0);
  EXPECT_LT(ms, 5000.0);
  EXPECT_EQ(&p.current_stream(0), &p.current_stream(0));
}

TEST(CpuPlatform, CopyMemsetConvert) {
  auto& p = cpu();
  std::vector<float> src = {1.5f, -2.25f, 3.0f, 1e-3f};
  std::vector<float> dst(4, 0.0f);
  p.copy(dst.data(), mg::Device::cpu(), src.data(), mg::Device::cpu(), 16);
  EXPECT_EQ(dst, src);
  p.memset_zero(dst.data(), 0, 8);
  EXPECT_EQ(dst, (std::vector<float>{0, 0, 3.0f, 1e-3f}));
  std::vector<uint16_t> bf(4);
  p.convert(bf.data(), mg::DType::bf16, src.data(), mg::DType::f32, 4, 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf[i], mg::f32_to_bf16_bits(src[i]));
  EXPECT_THROW(p.copy(dst.data(), mg::Device::cuda(0), src.data(), mg::Device::cpu(), 4),
               mg::Error);
}

TEST(CpuPlatform, Seed) {
  auto& p = cpu();
  p.manual_seed(1234);
  EXPECT_EQ(p.seed(), 1234u);
}

}  // namespace
