// The CUDA platform through the Platform interface (no CUDA headers here: the tests build in every
// configuration and skip, with the reason, where no GPU is usable).
//   Everywhere: without a usable GPU the platform is unavailable with a reason, selecting it throws
//   an error that lists the platforms, and megatron_info prints the reason.
//   On a GPU: capabilities, device-index checks, allocator statistics, alignment, caching and
//   thread safety, stream/event ordering and timing, per-thread current streams, host <-> device
//   round trips of every dtype, memset, and convert() against convert_host for every dtype pair on
//   edge values (NaN, Inf, subnormals, overflow).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

plugin::Platform* cuda_platform() {
  test::ensure_runtime();
  return plugin::global_registry().find_platform("cuda");
}

plugin::Platform& cuda() {
  return *cuda_platform();
}

const DType kAllDTypes[] = {DType::f64,      DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3,
                            DType::fp8_e5m2, DType::i32, DType::i64,  DType::u8};

// ---- everywhere ---------------------------------------------------------------------------------

TEST(CudaPlatformWithoutGpu, ReportsUnavailableAndSelectionFailsListingPlatforms) {
  plugin::Platform* p = cuda_platform();
  if (p && p->availability().available) GTEST_SKIP() << "a usable GPU is present";
  if (p) {
    const auto av = p->availability();
    EXPECT_FALSE(av.reason.empty());
    EXPECT_EQ(p->device_count(), 0);
    EXPECT_THROW(p->capabilities(0), Error);
    EXPECT_THROW(p->allocator(0), Error);
    EXPECT_THROW(p->current_stream(0), Error);
    EXPECT_THROW(p->create_stream(0), Error);
    EXPECT_THROW(Tensor::empty({4}, DType::f32, Device::cuda(0)), Error);
  }
  try {
    plugin::global_registry().select_platform("cuda");
    ADD_FAILURE() << "selecting cuda without a GPU did not throw";
  } catch (const Error& e) {
    const std::string msg = e.message();
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu: available"), std::string::npos) << msg;
    if (p) {
      EXPECT_NE(msg.find(p->availability().reason), std::string::npos) << msg;
    }
  }
}

TEST(CudaPlatformWithoutGpu, MegatronInfoPrintsTheReason) {
  plugin::Platform* p = cuda_platform();
  if (!p) GTEST_SKIP() << "this build has no CUDA platform";
  if (p->availability().available) GTEST_SKIP() << "a usable GPU is present";
  const auto res = test::run_command(std::string(MG_BIN_DIR) + "/megatron_info --platform cpu");
  const std::string& out = res.output;
  EXPECT_EQ(res.status, 0) << out;
  std::string cuda_line;
  for (std::size_t pos = 0; pos < out.size();) {
    const std::size_t end = out.find('\n', pos);
    const std::string line = out.substr(pos, end == std::string::npos ? end : end - pos);
    if (line.rfind("  cuda ", 0) == 0) cuda_line = line;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  EXPECT_NE(cuda_line.find("unavailable"), std::string::npos) << out;
  EXPECT_NE(cuda_line.find(p->availability().reason), std::string::npos) << out;
}

// ---- on a GPU -----------------------------------------------------------------------------------

TEST(CudaPlatform, CapabilitiesAndDeviceChecks) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  EXPECT_EQ(p.name(), "cuda");
  EXPECT_EQ(p.device_type(), DeviceType::cuda);
  ASSERT_GE(p.device_count(), 1);
  const auto c = p.capabilities(0);
  EXPECT_FALSE(c.device_name.empty());
  EXPECT_GT(c.total_memory_bytes, std::size_t{1} << 30);
  EXPECT_GE(c.compute_major, 8);
  EXPECT_GT(c.num_compute_units, 0);
  EXPECT_TRUE(c.bf16);
  EXPECT_TRUE(c.f16);
  EXPECT_EQ(c.fp8, c.compute_major * 10 + c.compute_minor >= 89);
  const int n = p.device_count();
  EXPECT_THROW(p.capabilities(n), Error);
  EXPECT_THROW(p.capabilities(-1), Error);
  EXPECT_THROW(p.allocator(n), Error);
  EXPECT_THROW(p.create_stream(n), Error);
  EXPECT_THROW(p.current_stream(n), Error);
  p.manual_seed(1234);
  EXPECT_EQ(p.seed(), 1234u);
  p.synchronize(0);
}

TEST(CudaPlatform, AllocatorStatsFollowTensorLifetimes) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  const auto before = p.memory_stats(0);
  {
    Tensor a = Tensor::empty({1000, 1000}, DType::f32, Device::cuda(0));  // 4 MB
    const auto during = p.memory_stats(0);
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + 4000000u);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
    EXPECT_GE(during.reserved_bytes, during.allocated_bytes);
    EXPECT_EQ(during.num_allocs, before.num_allocs + 1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw_data()) % 256, 0u);
    Tensor view = a.slice(10, 20);  // shares storage: no allocation
    EXPECT_EQ(p.memory_stats(0).num_allocs, during.num_allocs);
    Tensor small = Tensor::empty({3}, DType::u8, Device::cuda(0));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.raw_data()) % 256, 0u);
    EXPECT_EQ(p.memory_stats(0).allocated_bytes, during.allocated_bytes + 3u);
  }
  const auto after = p.memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_frees, before.num_frees + 2);
  EXPECT_GE(after.peak_allocated_bytes, before.allocated_bytes + 4000003u);
  p.allocator(0).reset_peak();
  EXPECT_EQ(p.memory_stats(0).peak_allocated_bytes, p.memory_stats(0).allocated_bytes);
}

TEST(CudaPlatform, AllocatorReusesFreedBlocksAndSurvivesOutOfMemory) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  void* first = nullptr;
  {
    Tensor a = Tensor::empty({3 << 20}, DType::f32, Device::cuda(0));
    first = a.raw_data();
  }
  const auto reserved = p.memory_stats(0).reserved_bytes;
  {
    Tensor b = Tensor::empty({3 << 20}, DType::f32, Device::cuda(0));
    EXPECT_EQ(b.raw_data(), first);  // the cached block, not a new cudaMalloc
    EXPECT_EQ(p.memory_stats(0).reserved_bytes, reserved);
  }
  const auto stats = p.memory_stats(0);
  try {
    Tensor huge = Tensor::empty({int64_t{1} << 50}, DType::u8, Device::cuda(0));
    ADD_FAILURE() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.message()).find("out of memory"), std::string::npos) << e.message();
  }
  EXPECT_EQ(p.memory_stats(0).allocated_bytes, stats.allocated_bytes);
  Tensor after = Tensor::zeros({1024}, DType::f32, Device::cuda(0));  // still usable
  EXPECT_EQ(after.to_vector<float>()[1023], 0.0f);
}

TEST(CudaPlatform, AllocatorIsThreadSafe) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  const auto before = p.memory_stats(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        Tensor a = Tensor::empty({(i % 7 + 1) * 1000 + t}, DType::f32, Device::cuda(0));
        Tensor b = Tensor::empty({(i % 3 + 1) * 300000}, DType::bf16, Device::cuda(0));
      }
    });
  for (auto& th : threads) th.join();
  const auto after = p.memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_allocs - before.num_allocs, 1600u);
  EXPECT_EQ(after.num_frees - before.num_frees, 1600u);
}

// A gemm big enough to take a while, so that an unordered reader would see unfinished results.
struct SlowWork {
  Tensor a, b, c;
  explicit SlowWork(Device dev) {
    a = Tensor::empty({2048, 2048}, DType::f32, dev);
    b = Tensor::empty({2048, 2048}, DType::f32, dev);
    c = Tensor::empty({2048, 2048}, DType::f32, dev);
  }
};

TEST(CudaPlatform, StreamEventOrderingAndElapsedTime) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  const auto& ops = test::ops_on("cuda");
  const Device dev = Device::cuda(0);
  auto s1 = p.create_stream(0);
  auto s2 = p.create_stream(0);
  EXPECT_EQ(s1->device(), dev);
  EXPECT_NE(s1->native_handle(), nullptr);
  EXPECT_NE(s1->native_handle(), s2->native_handle());
  SlowWork w(dev);
  ops.fill(w.a, 1.0);
  ops.fill(w.b, 0.5);
  p.synchronize(0);
  auto start = p.create_event(0, true);
  auto stop = p.create_event(0, true);
  auto done = p.create_event(0, false);
  Tensor y = Tensor::zeros({2048, 2048}, DType::f32, dev);
  p.synchronize(0);

  p.set_current_stream(0, s1.get());
  start->record(*s1);
  for (int r = 0; r < 4; ++r) ops.gemm(w.c, w.a, w.b, ops::GemmArgs{});  // c = 1024 everywhere
  stop->record(*s1);
  done->record(*s1);
  p.set_current_stream(0, s2.get());
  done->wait(*s2);         // s2 waits on the device, the host does not block
  ops.axpy(y, w.c, 2.0f);  // on s2, after the gemms
  p.set_current_stream(0, nullptr);
  s2->synchronize();
  EXPECT_TRUE(done->query());
  const auto yv = y.to_vector<float>();
  EXPECT_EQ(yv.front(), 2048.0f);
  EXPECT_EQ(yv.back(), 2048.0f);
  stop->synchronize();
  const double ms = stop->elapsed_ms(*start);
  EXPECT_GT(ms, 0.0);
  EXPECT_LT(ms, 60000.0);
  EXPECT_THROW(done->elapsed_ms(*start), Error);  // created without timing
}

TEST(CudaPlatform, CurrentStreamIsPerThreadAndRestorable) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  plugin::Stream& def = p.current_stream(0);
  EXPECT_EQ(&def, &p.current_stream(0));
  EXPECT_NE(def.native_handle(), nullptr);  // the platform's own non-blocking stream
  auto s = p.create_stream(0);
  p.set_current_stream(0, s.get());
  EXPECT_EQ(&p.current_stream(0), s.get());
  plugin::Stream* other_thread = nullptr;
  std::thread([&] { other_thread = &p.current_stream(0); }).join();
  EXPECT_EQ(other_thread, &def);
  p.set_current_stream(0, nullptr);
  EXPECT_EQ(&p.current_stream(0), &def);
  auto cpu_stream = plugin::global_registry().find_platform("cpu")->create_stream(0);
  EXPECT_THROW(p.set_current_stream(0, cpu_stream.get()), Error);
  {
    auto gone = p.create_stream(0);
    p.set_current_stream(0, gone.get());
  }  // destroying the current stream falls back to the default
  EXPECT_EQ(&p.current_stream(0), &def);
}

// Edge values of every dtype as host bytes (NaN, Inf, subnormals, overflow for the narrow types).
std::vector<unsigned char> edge_bytes(DType t, std::size_t* n) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = {0.0,
                           -0.0,
                           1.0,
                           -1.5,
                           2.5,
                           255.0,
                           65504.0,
                           65520.0,
                           448.0,
                           464.0,
                           480.0,
                           57344.0,
                           1e-40,
                           5.96e-8,
                           2.98e-8,
                           1e-3,
                           3.4e38,
                           1e300,
                           inf,
                           -inf,
                           16777217.0,
                           std::numeric_limits<double>::quiet_NaN(),
                           -std::numeric_limits<double>::quiet_NaN()};
  if (t == DType::i32 || t == DType::i64 || t == DType::u8) {
    std::vector<double> ints;
    for (double x : v)
      if (std::isfinite(x) && x == std::trunc(x) && x >= 0 && x <= 255) ints.push_back(x);
    ints.push_back(t == DType::u8 ? 7.0 : -7.0);
    v = ints;
  }
  *n = v.size();
  std::vector<unsigned char> out(v.size() * dtype_size(t));
  convert_host(out.data(), t, v.data(), DType::f64, v.size());
  return out;
}

TEST(CudaPlatform, CopyRoundTripEveryDtype) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  for (DType t : kAllDTypes) {
    std::size_t n = 0;
    const auto host = edge_bytes(t, &n);
    Tensor h = Tensor::empty({static_cast<int64_t>(n)}, t);
    std::memcpy(h.raw_data(), host.data(), host.size());
    Tensor d = h.to(Device::cuda(0));
    Tensor d2 = d.clone();  // device to device
    Tensor back = d2.to(Device::cpu());
    EXPECT_EQ(0, std::memcmp(back.raw_data(), host.data(), host.size())) << dtype_name(t);
    // A view at an odd element offset, through the raw copy entry point.
    if (n > 3) {
      std::vector<unsigned char> part((n - 3) * dtype_size(t));
      p.copy(part.data(), Device::cpu(), d.slice(3, static_cast<int64_t>(n) - 3).raw_data(),
             Device::cuda(0), part.size());
      EXPECT_EQ(0, std::memcmp(part.data(), host.data() + 3 * dtype_size(t), part.size()))
          << dtype_name(t);
    }
  }
}

TEST(CudaPlatform, MemsetZero) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  auto& p = cuda();
  Tensor d = Tensor::from_vector(std::vector<float>(1001, 3.0f), {1001}).to(Device::cuda(0));
  p.memset_zero(d.slice(1, 999).raw_data(), 0, 999 * 4);
  const auto v = d.to_vector<float>();
  EXPECT_EQ(v[0], 3.0f);
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_EQ(v[999], 0.0f);
  EXPECT_EQ(v[1000], 3.0f);
  EXPECT_EQ(Tensor::zeros({17}, DType::bf16, Device::cuda(0)).to_vector<double>(),
            std::vector<double>(17, 0.0));
}

TEST(CudaPlatform, ConvertMatchesConvertHostForEveryDtypePair) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  for (DType src : kAllDTypes) {
    std::size_t n = 0;
    const auto host = edge_bytes(src, &n);
    Tensor h = Tensor::empty({static_cast<int64_t>(n)}, src);
    std::memcpy(h.raw_data(), host.data(), host.size());
    Tensor d = h.to(Device::cuda(0));
    for (DType dst : kAllDTypes) {
      std::vector<unsigned char> want(n * dtype_size(dst));
      convert_host(want.data(), dst, host.data(), src, n);
      Tensor got = d.to(dst).to(Device::cpu());  // converted on the device, then copied
      EXPECT_EQ(0, std::memcmp(got.raw_data(), want.data(), want.size()))
          << dtype_name(src) << " -> " << dtype_name(dst);
    }
  }
}

}  // namespace
}  // namespace mg
