// The registry: platforms, op/function implementations per platform, plugins, and selection.
//
// Registration is explicit (register_cpu(Registry&), a plugin's entry point); there are no static
// initialisers. Resolution of a platform's OpTable happens once and is cached: for each slot the
// candidate with the highest priority wins (plugin > platform > generic), ties going to the later
// registration. Registering for a platform whose table was already resolved is an error: load
// plugins before building models. Known platform names, in auto-selection order: cuda, musa,
// txda, cpu. The pseudo-platform "*" holds generic implementations (the default of every named
// function), which any platform inherits.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/plugin/platform.h"

namespace mg::plugin {

enum class Priority : int { generic = 0, platform = 100, plugin = 200 };

inline constexpr std::string_view kGenericPlatform = "*";
// Auto-selection order; also the only names a platform may register under.
inline constexpr std::string_view kKnownPlatforms[] = {"cuda", "musa", "txda", "cpu"};

struct PlatformStatus {
  std::string name;
  bool registered = false;  // some build or plugin provides it
  Availability availability;
};

struct Resolution {
  std::string_view slot;
  ops::SlotKind kind;
  std::string_view backward;
  std::string provider;               // who won ("" when missing)
  std::vector<std::string> shadowed;  // lower-priority candidates, best first
};

struct PluginInfo {
  std::string path;
  std::string name;
  std::string version;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // ---- platforms ----
  void register_platform(std::unique_ptr<Platform> platform);
  Platform* find_platform(std::string_view name) const;
  // The platform serving a device type; throws naming the registered ones if none does.
  Platform& platform(DeviceType type) const;
  std::vector<PlatformStatus> platform_statuses() const;  // in kKnownPlatforms order
  // requested: a name, or "" to use MG_PLATFORM, or else the first available in order.
  // Unknown, unregistered or unavailable names are hard errors listing every platform and why.
  Platform& select_platform(std::string_view requested = "") const;

  // ---- ops and functions ----
  template <ops::OpId id>
  void register_op(std::string_view platform, ops::OpFn<id> fn, std::string provider,
                   Priority priority = Priority::platform) {
    add_candidate(static_cast<int>(id), platform, reinterpret_cast<void (*)()>(fn),
                  std::move(provider), priority);
  }
  const ops::OpTable& ops(std::string_view platform);
  std::vector<Resolution> resolutions(std::string_view platform) const;

  // ---- plugins ----
  // dlopen()s a shared library exporting mg_plugin_descriptor() (plugin_api.h), checks its API
  // version and op-table hash, and calls its register function with this registry.
  void load_plugin(const std::string& path);
  // Loads every path in MG_PLUGINS (colon-separated); empty entries are ignored.
  void load_plugins_from_env();
  std::vector<PluginInfo> plugins() const;

 private:
  struct Candidate {
    void (*fn)();
    std::string provider;
    int priority;
    int order;
  };
  void add_candidate(int slot, std::string_view platform, void (*fn)(), std::string provider,
                     Priority priority);
  std::vector<const Candidate*> ranked(int slot, std::string_view platform) const;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Platform>> platforms_;
  // candidates_[platform][slot]
  std::map<std::string, std::vector<std::vector<Candidate>>, std::less<>> candidates_;
  std::map<std::string, std::unique_ptr<ops::OpTable>, std::less<>> resolved_;
  std::vector<PluginInfo> plugins_;
  std::vector<void*> handles_;  // dlopen handles, never closed (code may still be referenced)
  int next_order_ = 0;
};

// The process-wide registry used by tools, tensors and modules. Empty until mg::init() (runtime.h)
// registers the built-in platforms; a test may also build its own Registry.
Registry& global_registry();

// The resolved op table of the platform that owns `device`, from the global registry (cached).
const ops::OpTable& ops_for(Device device);

// The host allocator (256-byte aligned, with stats). Lives in core so host tensors work
// before any platform is registered; the CPU platform hands it out.
Allocator& host_allocator();

}  // namespace mg::plugin
