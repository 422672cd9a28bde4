// mg::init(): built-in platform registration, plugin loading and platform selection, once.
#include "megatron/runtime.h"

#include <mutex>
#include <sstream>

#include "megatron/build_info.h"
#include "megatron/core/ops/generic.h"
#include "megatron/platforms/cpu/cpu_platform.h"
#if MG_WITH_CUDA
#include "megatron/platforms/cuda/cuda_platform.h"
#endif

namespace mg {

void register_builtin(plugin::Registry& registry) {
  ops::register_generic(registry);
  platforms::cpu::register_cpu(registry);
#if MG_WITH_CUDA
  platforms::cuda::register_cuda(registry);
#endif
}

Runtime& init(const RuntimeOptions& options) {
  static std::mutex mu;
  static Runtime rt;
  static bool done = false;
  static bool builtins = false;  // registered once even if a later step of a first call threw
  std::lock_guard lock(mu);
  if (done) {
    MG_CHECK(options.platform.empty() || options.platform == rt.platform->name(),
             "mg::init: platform '" << options.platform << "' requested after the runtime chose '"
                                    << rt.platform->name() << "'");
    return rt;
  }
  auto& reg = plugin::global_registry();
  if (!builtins) {
    register_builtin(reg);
    builtins = true;
  }
  if (options.load_env_plugins) reg.load_plugins_from_env();
  for (const auto& p : options.plugins) reg.load_plugin(p);
  rt.registry = &reg;
  rt.platform = &reg.select_platform(options.platform);
  rt.ops = &reg.ops(rt.platform->name());
  plugin::set_deterministic_mode(options.deterministic);
  rt.local_rank = comm::local_rank();
  int index = 0;
  if (rt.platform->device_type() != DeviceType::cpu) {
    index = comm::select_device(rt.local_rank.rank, rt.platform->device_count());
    rt.platform->set_device(index);
  }
  rt.device = Device{rt.platform->device_type(), index};
  done = true;
  return rt;
}

std::string device_summary(const Runtime& rt) {
  std::ostringstream os;
  os << rt.device.str();
  if (rt.platform) {
    os << " (" << rt.platform->capabilities(rt.device.index).device_name << "), local rank "
       << rt.local_rank.rank << " from " << rt.local_rank.source << ", "
       << rt.platform->device_count() << " device" << (rt.platform->device_count() > 1 ? "s" : "");
  }
  return os.str();
}

BuildInfo build_info() {
  BuildInfo b;
  b.version = MG_VERSION;
  b.git_commit = MG_GIT_COMMIT;
  b.build_type = MG_BUILD_TYPE;
  b.compiler = MG_CXX_COMPILER;
  b.blas = MG_BLAS_VERSION;
  b.with_mpi = MG_WITH_MPI;
  b.mpi = MG_WITH_MPI ? std::string("MPI ") + MG_MPI_VERSION : "not found";
  b.with_cuda = MG_WITH_CUDA;
  b.cuda = MG_WITH_CUDA ? std::string("nvcc ") + MG_CUDA_COMPILER_VERSION : "not built";
  b.cuda_archs = MG_CUDA_ARCHITECTURES;
  return b;
}

}  // namespace mg
