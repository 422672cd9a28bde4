// An example out-of-tree plugin: overrides the CPU implementation of squared_relu_fwd.
//
// Build it like any shared library against the Megatron-CPP headers and libmegatron_core, then
//   MG_PLUGINS=/path/libmg_example_plugin.so build/bin/megatron_info
// shows "plugin:example" next to squared_relu_fwd. It exports one C symbol, mg_plugin_descriptor,
// carrying the plugin API version and the op-table hash it was compiled against, and a call counter
// (mg_example_plugin_calls) so a test can see that the override really runs.
#include <atomic>
#include <cstdint>

#include "megatron/core/ops/ops.h"
#include "megatron/plugin/plugin_api.h"
#include "megatron/plugin/registry.h"

namespace {

std::atomic<int64_t> g_calls{0};

template <typename T>
void squared_relu(mg::Tensor& y, const mg::Tensor& x) {
  const T* in = x.data<T>();
  T* out = y.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto v = mg::to_f32(in[i]);
    out[i] = mg::store<T>(v > 0 ? v * v : 0);
  }
}

void squared_relu_fwd(mg::Tensor& y, const mg::Tensor& x) {
  ++g_calls;
  MG_CHECK(x.is_host() && y.is_host(), "example plugin: host tensors only");
  MG_CHECK(x.dtype() == y.dtype() && x.numel() == y.numel(),
           "squared_relu_fwd: y " << y.str() << " does not match x " << x.str());
  switch (x.dtype()) {
    case mg::DType::f64:
      return squared_relu<double>(y, x);
    case mg::DType::f32:
      return squared_relu<float>(y, x);
    case mg::DType::bf16:
      return squared_relu<mg::bf16_t>(y, x);
    case mg::DType::f16:
      return squared_relu<mg::f16_t>(y, x);
    default:
      MG_THROW("squared_relu_fwd: unsupported dtype " << mg::dtype_name(x.dtype()));
  }
}

void register_example(mg::plugin::Registry& r) {
  r.register_op<mg::ops::OpId::squared_relu_fwd>("cpu", &squared_relu_fwd, "plugin:example",
                                                 mg::plugin::Priority::plugin);
}

const MgPluginDescriptor kDescriptor{MG_PLUGIN_API_VERSION, mg::ops::kOpTableAbiHash, "example",
                                     "1.0", &register_example};

}  // namespace

extern "C" {
__attribute__((visibility("default"))) const MgPluginDescriptor* mg_plugin_descriptor() {
  return &kDescriptor;
}
__attribute__((visibility("default"))) int64_t mg_example_plugin_calls() {
  return g_calls.load();
}
}
