// The platform the kernel benchmarks run on, and how one benchmark iteration is timed there.
//   MG_BENCH_PLATFORM=cpu (default) or cuda: ops, device and tensors of that platform, its op
//   table resolved with MG_OP_PROVIDERS' preferred providers (e.g. attention_fwd=cuda:cudnn).
// CPU: wall-clock time of one call (benchmarks use UseRealTime). GPU: work is asynchronous, so an
// iteration queues kGpuCallsPerIteration calls between two device events on the current stream
// and reports the mean time per call (UseManualTime): launch and host-side set-up overlap the
// device work as they do in training, and a host-bound op shows up as a slower call.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/plugin/abi_check.h"
#include "megatron/plugin/platform.h"
#include "megatron/plugin/registry.h"
#include "megatron/runtime.h"

namespace mg::bench {

constexpr int kGpuCallsPerIteration = 10;

struct BenchPlatform {
  std::string name;
  Device device;
  plugin::Platform* platform = nullptr;
  const ops::OpTable* ops = nullptr;
  bool gpu() const { return !device.is_host(); }
};

inline const BenchPlatform& bench_platform() {
  static const BenchPlatform p = [] {
    init();
    plugin::check_op_table_abi("this benchmark", "make bench");
    BenchPlatform b;
    const char* env = std::getenv("MG_BENCH_PLATFORM");
    b.name = env && *env ? env : "cpu";
    auto& reg = plugin::global_registry();
    b.platform = reg.find_platform(b.name);
    MG_CHECK(b.platform, "MG_BENCH_PLATFORM=" << b.name << ": no such platform in this build");
    const auto avail = b.platform->availability();
    MG_CHECK(avail.available, "platform " << b.name << " unavailable: " << avail.reason);
    b.device = b.name == "cpu" ? Device::cpu() : Device{b.platform->device_type(), 0};
    plugin::ResolveOptions options;
    options.providers = plugin::op_providers_from_env();
    b.ops = &reg.ops(b.name, options);
    return b;
  }();
  return p;
}

// The tensor make() returns for (shape, dtype, seed), made once per process on the benchmark
// platform's device: Google Benchmark runs a benchmark's body again for every iteration-count
// probe and repetition, and drawing 8192 x 16384 random values on the host takes seconds (seen on
// the H100 machine: set-up, not the GEMMs, used up a 450 s call). Outputs may be shared too:
// their contents do not change the time.
template <typename Make>
Tensor cached_tensor(const Shape& shape, DType dtype, uint64_t seed, Make&& make) {
  static std::map<std::tuple<Shape, DType, uint64_t>, Tensor> cache;
  auto key = std::make_tuple(shape, dtype, seed);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make().to(bench_platform().device)).first;
  return it->second;
}

// Runs fn once per benchmark iteration on the CPU, kGpuCallsPerIteration times on a GPU. Returns
// the total timed seconds per call summed over the iterations (device-event time on a GPU,
// wall-clock on the CPU), for benchmarks that derive a figure of their own from the time.
template <typename F>
double time_iterations(benchmark::State& state, F&& fn) {
  const BenchPlatform& p = bench_platform();
  double total = 0.0;
  if (!p.gpu()) {
    for (auto _ : state) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return total;
  }
  auto& stream = p.platform->current_stream(p.device.index);
  auto start = p.platform->create_event(p.device.index, true);
  auto stop = p.platform->create_event(p.device.index, true);
  fn();  // warm-up: handles, module load, allocator caches
  p.platform->synchronize(p.device.index);
  for (auto _ : state) {
    start->record(stream);
    for (int i = 0; i < kGpuCallsPerIteration; ++i) fn();
    stop->record(stream);
    stop->synchronize();
    const double secs = stop->elapsed_ms(*start) / 1e3 / kGpuCallsPerIteration;
    state.SetIterationTime(secs);
    total += secs;
  }
  return total;
}

// Whether MG_BENCH_PLATFORM names a GPU platform; read without mg::init(), so that benchmark
// registration (static initialisation) may use it to pick timing and shapes.
inline bool gpu_requested() {
  const char* env = std::getenv("MG_BENCH_PLATFORM");
  return env && *env && std::string(env) != "cpu";
}

// UseRealTime on the CPU, UseManualTime (device events) on a GPU.
inline void set_timing(benchmark::internal::Benchmark* b) {
  if (gpu_requested())
    b->UseManualTime();
  else
    b->UseRealTime();
}

}  // namespace mg::bench
