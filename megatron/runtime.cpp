// mg::init(): the process's platform set-up once (built-ins, plugins, platform, device), and one
// immutable Runtime per distinct set of run choices (runtime.h).
#include "megatron/runtime.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <sstream>

#include "megatron/build_info.h"
#include "megatron/core/ops/generic.h"
#include "megatron/platforms/cpu/cpu_platform.h"
#if MG_WITH_CUDA
#include "megatron/platforms/cuda/cuda_platform.h"
#endif

namespace mg {

namespace {

void register_builtin_once(plugin::Registry& registry) {
  ops::register_generic(registry);
  platforms::cpu::register_cpu(registry);
#if MG_WITH_CUDA
  platforms::cuda::register_cuda(registry);
#endif
}

// The process's set-up, established by the first successful init() and never torn down (tensors
// and modules hold pointers into it until exit). Guarded by mu.
struct Process {
  std::mutex mu;
  bool established = false;
  plugin::Platform* platform = nullptr;
  Device device;
  comm::LocalRank local_rank;
  std::map<std::string, std::unique_ptr<Runtime>> runs;  // by ResolveOptions::str()
};

Process& process() {
  static Process* p = new Process();  // never destroyed: see above
  return *p;
}

bool is_loaded(const plugin::Registry& reg, const std::string& path) {
  const auto loaded = reg.plugins();
  return std::any_of(loaded.begin(), loaded.end(),
                     [&](const plugin::PluginInfo& p) { return p.path == path; });
}

std::string loaded_list(const plugin::Registry& reg) {
  std::string s;
  for (const auto& p : reg.plugins()) s += (s.empty() ? "" : ", ") + p.path;
  return s.empty() ? "none" : s;
}

std::vector<std::string> requested_plugins(const RuntimeOptions& options) {
  std::vector<std::string> out;
  if (options.load_env_plugins) out = plugin::plugins_from_env();
  out.insert(out.end(), options.plugins.begin(), options.plugins.end());
  return out;
}

void establish(Process& pr, plugin::Registry& reg, const RuntimeOptions& options) {
  register_builtin(reg);
  // A first call that failed after loading some (a later plugin, the platform) left them loaded.
  for (const auto& path : requested_plugins(options))
    if (!is_loaded(reg, path)) reg.load_plugin(path);
  plugin::Platform& platform = reg.select_platform(options.platform);
  const comm::LocalRank local_rank = comm::local_rank();
  int index = 0;
  if (platform.device_type() != DeviceType::cpu) {
    index = comm::select_device(local_rank.rank, platform.device_count());
    platform.set_device(index);
  }
  pr.platform = &platform;
  pr.local_rank = local_rank;
  pr.device = Device{platform.device_type(), index};
  pr.established = true;
}

// A later call may only ask for what the first one set up.
void check_established(const Process& pr, const plugin::Registry& reg,
                       const RuntimeOptions& options) {
  MG_CHECK(options.platform.empty() || options.platform == pr.platform->name(),
           "mg::init: platform '" << options.platform << "' requested, but this process's runtime "
                                  << "was set up on platform '" << pr.platform->name()
                                  << "' by the first mg::init (the platform is fixed per process)");
  for (const auto& path : requested_plugins(options))
    MG_CHECK(is_loaded(reg, path),
             "mg::init: plugin '" << path << "' requested, but this process's runtime was set up "
                                  << "with plugins: " << loaded_list(reg)
                                  << " (plugins are loaded by the first mg::init, before any op "
                                     "table is resolved)");
}

}  // namespace

void register_builtin(plugin::Registry& registry) {
  registry.register_once("builtin", &register_builtin_once);
}

std::vector<plugin::Resolution> Runtime::resolutions() const {
  MG_CHECK(registry && platform, "Runtime::resolutions: not an initialised runtime");
  return registry->resolutions(platform->name(), resolve);
}

Runtime& init(const RuntimeOptions& options) {
  Process& pr = process();
  std::lock_guard lock(pr.mu);
  auto& reg = plugin::global_registry();
  if (!pr.established)
    establish(pr, reg, options);
  else
    check_established(pr, reg, options);

  plugin::ResolveOptions resolve;
  resolve.deterministic = options.deterministic;
  if (options.load_env_op_providers) resolve.providers = plugin::op_providers_from_env();
  for (const auto& [slot, provider] : options.op_providers) resolve.providers[slot] = provider;
  auto& run = pr.runs[resolve.str()];
  if (!run) {
    auto rt = std::make_unique<Runtime>();
    rt->registry = &reg;
    rt->platform = pr.platform;
    rt->ops = &reg.ops(pr.platform->name(), resolve);  // validates the choices
    rt->resolve = std::move(resolve);
    rt->device = pr.device;
    rt->local_rank = pr.local_rank;
    run = std::move(rt);
  }
  return *run;
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
