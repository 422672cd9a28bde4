// The stable entry point of an out-of-tree plugin (the Megatron-LM-FL plugin idea in C++).
//
// A plugin is a shared library, listed in MG_PLUGINS, that exports exactly one C symbol:
//
//   extern "C" const MgPluginDescriptor* mg_plugin_descriptor();
//
// The loader refuses it unless api_version == MG_PLUGIN_API_VERSION and op_table_hash ==
// mg::ops::kOpTableAbiHash (i.e. it was compiled against this op list). register_fn receives the
// registry and may register platforms (e.g. "musa") and op/function implementations, normally with
// Priority::plugin so that they override the built-in ones. See examples/plugins/.
#pragma once

#include <cstdint>

#include "megatron/core/ops/ops.h"

namespace mg::plugin {
class Registry;
}

// 2: Platform gained pinned_host_allocator() and set_device() (its vtable changed).
// 3: Registry::register_op takes ProviderTraits (supports predicate, deterministic), and resolves
//    per ResolveOptions; plugin::set_deterministic_mode / deterministic_mode() are gone.
#define MG_PLUGIN_API_VERSION 3u
#define MG_PLUGIN_ENTRY_SYMBOL "mg_plugin_descriptor"

extern "C" {
struct MgPluginDescriptor {
  uint32_t api_version;    // MG_PLUGIN_API_VERSION
  uint64_t op_table_hash;  // mg::ops::kOpTableAbiHash
  const char* name;
  const char* version;
  void (*register_fn)(mg::plugin::Registry& registry);
};
typedef const MgPluginDescriptor* (*MgPluginDescriptorFn)();
}
