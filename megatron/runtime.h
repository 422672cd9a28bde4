// The runtime: the one call a tool or test makes before using devices or ops.
//
// mg::init() registers the built-in platforms (CPU, and CUDA when built) and the generic function
// implementations into the global registry, loads the plugins in MG_PLUGINS (and any given), and
// selects the platform (--platform / MG_PLATFORM / first available of cuda > musa > txda > cpu).
// On a device platform it then selects this process's device: the node-local rank
// (comm::local_rank(): LOCAL_RANK > OMPI_COMM_WORLD_LOCAL_RANK > SLURM_LOCALID > MPI_LOCALRANKID,
// else 0) modulo the platform's device count, made the thread's current device
// (Platform::set_device: cudaSetDevice); the NCCL communicator picks the same one. The host
// platform has one device, 0.
// It runs its set-up once per process; later calls return the same Runtime and refuse a different
// platform request. The first call sets the process-wide deterministic-mode flag
// (plugin::deterministic_mode(), --deterministic-mode) from its options; later changes go through
// plugin::set_deterministic_mode (the training loop sets it for each run).
#pragma once

#include <string>
#include <vector>

#include "megatron/core/comm/local_rank.h"
#include "megatron/core/ops/ops.h"
#include "megatron/plugin/platform.h"
#include "megatron/plugin/registry.h"

namespace mg {

struct RuntimeOptions {
  std::string platform;              // "" -> MG_PLATFORM, else auto
  std::vector<std::string> plugins;  // loaded after MG_PLUGINS
  bool load_env_plugins = true;
  // --deterministic-mode: only deterministic kernels (all built-in ones are; see
  // docs/architecture.md), published as plugin::deterministic_mode() for the platforms.
  bool deterministic = false;
};

struct Runtime {
  plugin::Registry* registry = nullptr;
  plugin::Platform* platform = nullptr;  // the selected platform
  const ops::OpTable* ops = nullptr;     // its resolved op table
  Device device;                         // this process's device (see above)
  comm::LocalRank local_rank;            // the node-local rank it came from, and its source
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

// One line for start-up logs: "cuda:1 (NVIDIA H100 80GB HBM3), local rank 1 from LOCAL_RANK,
// 8 devices".
std::string device_summary(const Runtime& rt);

}  // namespace mg
