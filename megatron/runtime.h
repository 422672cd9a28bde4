// The runtime: the one call a tool or test makes before using devices or ops.
//
// Two lifetimes, kept apart:
//   - The process's platform set-up, established by the first successful mg::init() and kept until
//     exit: the built-in platforms registered into the global registry (once per registry:
//     Registry::register_once), the plugins of MG_PLUGINS and RuntimeOptions::plugins loaded, the
//     platform selected (--platform / MG_PLATFORM / first available of cuda > musa > txda > cpu)
//     and, on a device platform, this process's device: the node-local rank (comm::local_rank():
//     LOCAL_RANK > OMPI_COMM_WORLD_LOCAL_RANK > SLURM_LOCALID > MPI_LOCALRANKID, else 0) modulo the
//     platform's device count, made the thread's current device (Platform::set_device:
//     cudaSetDevice); the NCCL communicator picks the same one. The host platform has one device.
//     A later call may not ask for another set-up: a platform other than the selected one, or a
//     plugin that was not loaded, is an error naming what was asked and what is established
//     (platform "" and no plugins ask for nothing).
//   - A run's choices (--deterministic-mode, preferred op providers): each distinct set gets its
//     own Runtime, whose op table is resolved for exactly those choices (plugin::ResolveOptions),
//     so two runs in one process never see each other's setting. mg::init returns the Runtime of
//     the options it was given; Runtimes are immutable and live until exit.
// Kernel selection goes through the registry only: RuntimeOptions::op_providers (over
// MG_OP_PROVIDERS, "slot=provider,...") prefers a provider for a slot, validated against the
// registry (an unknown slot or provider is an error listing the valid ones), and
// Runtime::resolutions() says which provider runs each slot and what it falls back to.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "megatron/core/comm/local_rank.h"
#include "megatron/core/ops/ops.h"
#include "megatron/plugin/platform.h"
#include "megatron/plugin/registry.h"

namespace mg {

struct RuntimeOptions {
  // ---- the process's set-up (fixed by the first call) ----
  // (Every member has an initializer, so designated initializers may name any subset of them.)
  std::string platform{};              // "" -> MG_PLATFORM, else auto
  std::vector<std::string> plugins{};  // loaded after MG_PLUGINS
  bool load_env_plugins = true;
  // ---- this run's choices (one Runtime per distinct set) ----
  // --deterministic-mode: the op table resolves only deterministic providers (all built-in
  // kernels are; docs/architecture.md).
  bool deterministic = false;
  // Preferred provider per slot, e.g. {"attention_fwd": "cuda:attention-mma"}; entries override
  // those of MG_OP_PROVIDERS (read when load_env_op_providers).
  std::map<std::string, std::string> op_providers{};
  bool load_env_op_providers = true;
};

struct Runtime {
  plugin::Registry* registry = nullptr;
  plugin::Platform* platform = nullptr;  // the selected platform
  const ops::OpTable* ops = nullptr;     // its op table, resolved for `resolve`
  plugin::ResolveOptions resolve;        // this run's choices (deterministic, op providers)
  Device device;                         // this process's device (see above)
  comm::LocalRank local_rank;            // the node-local rank it came from, and its source

  bool deterministic() const { return resolve.deterministic; }
  // What `ops` runs for each slot (provider, fallbacks, shadowed): for start-up logs.
  std::vector<plugin::Resolution> resolutions() const;
};

// Sets up the process on the first call, then returns the Runtime of `options`' run choices
// (the same object for the same choices). Thread-safe.
Runtime& init(const RuntimeOptions& options = {});

// Registers CPU (+ CUDA) platforms and kernels, and the generic functions, into `registry`, once
// per registry (later calls return without registering again). mg::init() calls it on the global
// registry; tests may call it on their own Registry.
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
