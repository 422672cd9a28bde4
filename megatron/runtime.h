// The runtime: the one call a tool or test makes before using devices or ops.
//
// mg::init() registers the built-in platforms (CPU, and CUDA when built) and the generic function
// implementations into the global registry, loads the plugins in MG_PLUGINS (and any given), and
// selects the platform (--platform / MG_PLATFORM / first available of cuda > musa > txda > cpu).
// It runs its set-up once per process; later calls return the same Runtime and refuse a different
// platform request.
#pragma once

#include <string>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/plugin/platform.h"
#include "megatron/plugin/registry.h"

namespace mg {

struct RuntimeOptions {
  std::string platform;              // "" -> MG_PLATFORM, else auto
  std::vector<std::string> plugins;  // loaded after MG_PLUGINS
  bool load_env_plugins = true;
};

struct Runtime {
  plugin::Registry* registry = nullptr;
  plugin::Platform* platform = nullptr;  // the selected platform
  const ops::OpTable* ops = nullptr;     // its resolved op table
  Device device;                         // device 0 of the selected platform
};

Runtime& init(const RuntimeOptions& options = {});

// Registers CPU (+ CUDA) platforms and kernels, and the generic functions, into `registry`.
// mg::init() calls it on the global registry; tests may call it on their own Registry.
void register_builtin(plugin::Registry& registry);

// What this build contains (for megatron_info and logs).
struct BuildInfo {
  std::string version, git_commit, build_type, compiler, blas, mpi, cuda, cuda_archs;
  bool with_cuda = false, with_mpi = false;
};
BuildInfo build_info();

}  // namespace mg
