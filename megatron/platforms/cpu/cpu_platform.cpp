// CpuPlatform: the Platform interface on the host. Streams are synchronous (an op has finished when
// it returns), so events only record wall-clock time.
#include "megatron/platforms/cpu/cpu_platform.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "megatron/core/common/error.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

class CpuStream final : public plugin::Stream {
 public:
  Device device() const override { return Device::cpu(); }
  void synchronize() override {}
  void* native_handle() override { return nullptr; }
};

class CpuEvent final : public plugin::Event {
 public:
  void record(plugin::Stream&) override { t_ = std::chrono::steady_clock::now(); }
  void wait(plugin::Stream&) override {}
  void synchronize() override {}
  bool query() override { return true; }
  double elapsed_ms(const plugin::Event& start) const override {
    const auto* s = dynamic_cast<const CpuEvent*>(&start);
    MG_CHECK(s != nullptr, "elapsed_ms: start event is not a CPU event");
    return std::chrono::duration<double, std::milli>(t_ - s->t_).count();
  }

 private:
  std::chrono::steady_clock::time_point t_ = std::chrono::steady_clock::now();
};

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  return "host CPU";
}

class CpuPlatform final : public plugin::Platform {
 public:
  std::string_view name() const override { return "cpu"; }
  DeviceType device_type() const override { return DeviceType::cpu; }
  plugin::Availability availability() const override {
    return {true, std::to_string(omp_get_max_threads()) + " OpenMP threads"};
  }
  int device_count() const override { return 1; }
  plugin::Capabilities capabilities(int device) const override {
    check_device(device);
    plugin::Capabilities c;
    c.device_name = cpu_model_name();
    c.total_memory_bytes = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                           static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
    c.bf16 = true;  // storage and conversion; math in f32
    c.f16 = true;
    c.fp8 = false;
    c.num_compute_units = omp_get_max_threads();
    return c;
  }
  plugin::Allocator& allocator(int device) override {
    check_device(device);
    return plugin::host_allocator();
  }
  std::unique_ptr<plugin::Stream> create_stream(int device) override {
    check_device(device);
    return std::make_unique<CpuStream>();
  }
  std::unique_ptr<plugin::Event> create_event(int device, bool) override {
    check_device(device);
    return std::make_unique<CpuEvent>();
  }
  plugin::Stream& current_stream(int device) override {
    check_device(device);
    return default_stream_;
  }
  void set_current_stream(int device, plugin::Stream*) override { check_device(device); }
  void synchronize(int device) override { check_device(device); }
  void manual_seed(uint64_t seed) override { seed_ = seed; }
  uint64_t seed() const override { return seed_; }
  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            std::size_t bytes) override {
    MG_CHECK(
        dst_device.is_host() && src_device.is_host(),
        "the CPU platform copies host memory only, got " << src_device << " -> " << dst_device);
    std::memmove(dst, src, bytes);
  }
  void memset_zero(void* dst, int device, std::size_t bytes) override {
    check_device(device);
    std::memset(dst, 0, bytes);
  }
  void convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
               int device) override {
    check_device(device);
    convert_host(dst, dst_type, src, src_type, n);
  }

 private:
  static void check_device(int device) {
    MG_CHECK(device == 0, "the CPU platform has one device (0), got " << device);
  }
  CpuStream default_stream_;
  uint64_t seed_ = 0;
};

}  // namespace

void register_cpu(plugin::Registry& r) {
  r.register_platform(std::make_unique<CpuPlatform>());
  register_gemm_kernels(r);
  register_embedding_kernels(r);
  register_norm_kernels(r);
  register_activation_kernels(r);
  register_dropout_kernels(r);
  register_softmax_kernels(r);
  register_attention_kernels(r);
  register_rope_kernels(r);
  register_cross_entropy_kernels(r);
  register_optimizer_kernels(r);
  register_init_kernels(r);
  register_fp8_kernels(r);
  register_fp8_attention_kernels(r);
  register_moe_kernels(r);
}

}  // namespace mg::platforms::cpu
