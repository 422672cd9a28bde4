// Plugins used only by the plugin tests, each built as its own .so from this one file with a
// selector macro:
//   MG_TEST_PLUGIN_BAD_VERSION  exports a descriptor with a wrong API version
//   MG_TEST_PLUGIN_BAD_HASH     exports a descriptor built against "another" op table
//   MG_TEST_PLUGIN_NO_ENTRY     exports no entry point at all
//   MG_TEST_PLUGIN_FAKE_MUSA    provides a "musa" platform backed by host memory, with one op
//   (fill),
//                               the in-tree fake backend that proves a plugin can add a platform
#include <cstring>
#include <memory>

#include "megatron/plugin/plugin_api.h"
#include "megatron/plugin/registry.h"

namespace {

#if defined(MG_TEST_PLUGIN_FAKE_MUSA)
class FakeStream final : public mg::plugin::Stream {
 public:
  mg::Device device() const override { return {mg::DeviceType::musa, 0}; }
  void synchronize() override {}
  void* native_handle() override { return nullptr; }
};

class FakeMusa final : public mg::plugin::Platform {
 public:
  std::string_view name() const override { return "musa"; }
  mg::DeviceType device_type() const override { return mg::DeviceType::musa; }
  mg::plugin::Availability availability() const override {
    return {true, "fake MUSA (host memory)"};
  }
  int device_count() const override { return 1; }
  mg::plugin::Capabilities capabilities(int) const override {
    mg::plugin::Capabilities c;
    c.device_name = "fake musa";
    return c;
  }
  mg::plugin::Allocator& allocator(int) override { return mg::plugin::host_allocator(); }
  std::unique_ptr<mg::plugin::Stream> create_stream(int) override {
    return std::make_unique<FakeStream>();
  }
  std::unique_ptr<mg::plugin::Event> create_event(int, bool) override { return nullptr; }
  mg::plugin::Stream& current_stream(int) override { return stream_; }
  void set_current_stream(int, mg::plugin::Stream*) override {}
  void synchronize(int) override {}
  void manual_seed(uint64_t s) override { seed_ = s; }
  uint64_t seed() const override { return seed_; }
  void copy(void* dst, mg::Device, const void* src, mg::Device, std::size_t n) override {
    std::memmove(dst, src, n);
  }
  void memset_zero(void* dst, int, std::size_t n) override { std::memset(dst, 0, n); }
  void convert(void* dst, mg::DType dt, const void* src, mg::DType st, std::size_t n,
               int) override {
    mg::convert_host(dst, dt, src, st, n);
  }

 private:
  FakeStream stream_;
  uint64_t seed_ = 0;
};

void fake_fill(mg::Tensor& x, double value) {
  MG_CHECK(x.dtype() == mg::DType::f32, "fake musa fill: f32 only");
  float* p = static_cast<float*>(x.raw_data());
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>(value);
}
#endif

void register_test_plugin(mg::plugin::Registry& r) {
#if defined(MG_TEST_PLUGIN_FAKE_MUSA)
  r.register_platform(std::make_unique<FakeMusa>());
  r.register_op<mg::ops::OpId::fill>("musa", &fake_fill, "plugin:fake_musa",
                                     mg::plugin::Priority::plugin);
#else
  (void)r;
#endif
}

#if defined(MG_TEST_PLUGIN_BAD_VERSION)
constexpr uint32_t kVersion = MG_PLUGIN_API_VERSION + 41;
#else
constexpr uint32_t kVersion = MG_PLUGIN_API_VERSION;
#endif
#if defined(MG_TEST_PLUGIN_BAD_HASH)
constexpr uint64_t kHash = mg::ops::kOpTableAbiHash ^ 0x5a5a;
#else
constexpr uint64_t kHash = mg::ops::kOpTableAbiHash;
#endif

const MgPluginDescriptor kDescriptor{kVersion, kHash, "test", "0", &register_test_plugin};

}  // namespace

#if !defined(MG_TEST_PLUGIN_NO_ENTRY)
extern "C" __attribute__((visibility("default"))) const MgPluginDescriptor* mg_plugin_descriptor() {
  return &kDescriptor;
}
#else
extern "C" __attribute__((visibility("default"))) int not_a_plugin() {
  return kDescriptor.api_version;
}
#endif
