// The registry: platforms, op/function implementations per platform, plugins, and selection.
//
// Registration is explicit (register_cpu(Registry&), a plugin's entry point); there are no static
// initialisers. register_once() runs a named registration (the built-in platforms) at most once per
// registry: that is a property of the registry, not of whoever calls it. Known platform names, in
// auto-selection order: cuda, musa, txda, cpu. The pseudo-platform "*" holds generic
// implementations (the default of every named function), which any platform inherits.
//
// Resolution (ggml's supports_op, PyTorch's dispatcher): the registry, never an environment
// variable read by a kernel, decides which implementation of a slot runs, and resolutions() says
// so. For each slot the candidates are ranked by priority (plugin > platform > alternative >
// generic), ties going to the later registration. A ResolveOptions (the per-run choices:
// --deterministic-mode, preferred providers) then drops the non-deterministic candidates of a
// deterministic run and moves a preferred provider to the front. The slot runs the first candidate;
// when that one has a supports predicate (it serves only some calls: dtypes, head dims, alignment),
// each call tries the candidates in order, up to and including the first without a predicate (the
// fallback). The rest are shadowed: they never run under these options. ops(platform, options)
// resolves once per (platform, options) and caches the table for the registry's lifetime;
// registering for a platform whose table was already resolved is an error: load plugins before
// building models.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/plugin/platform.h"

namespace mg::plugin {

// alternative: an opt-in variant of a platform kernel (e.g. an unverified tensor-core path): ranked
// below the platform's own provider, so it runs only where ResolveOptions::providers prefers it.
enum class Priority : int { generic = 0, alternative = 50, platform = 100, plugin = 200 };

inline constexpr std::string_view kGenericPlatform = "*";
// Auto-selection order; also the only names a platform may register under.
inline constexpr std::string_view kKnownPlatforms[] = {"cuda", "musa", "txda", "cpu"};

struct PlatformStatus {
  std::string name;
  bool registered = false;  // some build or plugin provides it
  Availability availability;
};

namespace detail {
template <typename Sig>
struct SupportsOf;
template <typename R, typename... A>
struct SupportsOf<R(A...)> {
  using type = bool (*)(A...);
};
}  // namespace detail

// A provider's supports predicate: the slot's arguments, true when the provider serves this call.
template <ops::OpId id>
using SupportsFn = typename detail::SupportsOf<typename ops::OpTraits<id>::Sig>::type;

// What a provider declares about itself besides its function.
template <ops::OpId id>
struct ProviderTraits {
  // Whether it serves a call (ggml's supports_op), asked before every call when it is resolved
  // first or as a fallback; null: every call. Cheap (dtype, shape, alignment tests) and total: it
  // returns false, never throws, for arguments the function would reject.
  SupportsFn<id> supports = nullptr;
  // False for a kernel whose results may differ run to run (float atomics, arrival-order
  // reductions): never resolved for a deterministic run (ResolveOptions::deterministic).
  bool deterministic = true;
};

// The per-run choices an op table is resolved for (RuntimeOptions fills them; runtime.h). Part of
// the table's identity: two runs with different options in one process get two tables.
struct ResolveOptions {
  bool deterministic = false;                      // --deterministic-mode
  std::map<std::string, std::string> providers{};  // slot -> preferred provider
  // "deterministic;attention_fwd=cuda:attention-mma" (the cache key; "" for the defaults).
  std::string str() const;
  bool operator==(const ResolveOptions&) const = default;
};

// "attention_fwd=cuda:attention-mma,attention_bwd=cuda:attention-rows" (MG_OP_PROVIDERS' syntax:
// comma-separated slot=provider; blanks around entries ignored) -> {slot: provider}. A malformed
// entry or a slot named twice is an error naming `source` (e.g. "MG_OP_PROVIDERS").
std::map<std::string, std::string> parse_op_providers(std::string_view spec,
                                                      std::string_view source);
// parse_op_providers of MG_OP_PROVIDERS ({} when unset).
std::map<std::string, std::string> op_providers_from_env();

struct Resolution {
  std::string_view slot;
  ops::SlotKind kind = ops::SlotKind::op;
  std::string_view backward;
  std::string provider;                // runs first ("" when missing)
  bool preferred = false;              // chosen by ResolveOptions::providers
  bool supports_predicate = false;     // provider serves only the calls its predicate accepts
  std::vector<std::string> fallbacks;  // tried next, in order, for calls it does not serve
  std::vector<std::string> shadowed;   // never run under these options, best first
  std::vector<std::string> excluded;   // not deterministic, dropped for a deterministic run
};

// "cuda:attention-mma (else cuda:attention-tiled, cuda:attention-rows)": who runs (for logs).
std::string describe(const Resolution& r);

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

  // Runs register_fn(*this) unless a registration named `name` already completed on this registry
  // (then returns false). mg::register_builtin registers the built-in platforms through it.
  bool register_once(std::string_view name, void (*register_fn)(Registry&));

  // ---- ops and functions ----
  // `provider` names the implementation in tables and in ResolveOptions::providers; it must be
  // unique among the slot's providers on `platform`.
  template <ops::OpId id>
  void register_op(std::string_view platform, ops::OpFn<id> fn, std::string provider,
                   Priority priority = Priority::platform, ProviderTraits<id> traits = {}) {
    add_candidate(static_cast<int>(id), platform, reinterpret_cast<void (*)()>(fn),
                  std::move(provider), priority, reinterpret_cast<void (*)()>(traits.supports),
                  traits.deterministic);
  }
  // The table of `platform` resolved for `options` (see the top of this file), cached. An option
  // naming an unknown slot, or a provider the slot does not have on this platform, or a
  // non-deterministic one for a deterministic run, is an error listing the valid ones.
  const ops::OpTable& ops(std::string_view platform, const ResolveOptions& options = {});
  std::vector<Resolution> resolutions(std::string_view platform,
                                      const ResolveOptions& options = {}) const;

  // ---- plugins ----
  // dlopen()s a shared library exporting mg_plugin_descriptor() (plugin_api.h), checks its API
  // version and op-table hash, and calls its register function with this registry. A path already
  // loaded into this registry is an error.
  void load_plugin(const std::string& path);
  // Loads every path of plugins_from_env().
  void load_plugins_from_env();
  std::vector<PluginInfo> plugins() const;

 private:
  struct Candidate {
    void (*fn)();
    std::string provider;
    int priority;
    int order;
    void (*supports)();  // SupportsFn of the slot, or null
    bool deterministic;
  };
  // One slot under some options: the candidates that run, in the order they are tried.
  struct Plan {
    std::vector<const Candidate*> run, shadowed, excluded;
    bool preferred = false;
  };
  void add_candidate(int slot, std::string_view platform, void (*fn)(), std::string provider,
                     Priority priority, void (*supports)(), bool deterministic);
  std::vector<const Candidate*> ranked(int slot, std::string_view platform) const;
  void check_options(std::string_view platform, const ResolveOptions& options) const;
  Plan plan(int slot, std::string_view platform, const ResolveOptions& options) const;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Platform>> platforms_;
  // candidates_[platform][slot]
  std::map<std::string, std::vector<std::vector<Candidate>>, std::less<>> candidates_;
  // resolved_[platform][options.str()]
  std::map<std::string, std::map<std::string, std::unique_ptr<ops::OpTable>>, std::less<>>
      resolved_;
  std::vector<std::string> registered_once_;
  std::vector<PluginInfo> plugins_;
  std::vector<void*> handles_;  // dlopen handles, never closed (code may still be referenced)
  int next_order_ = 0;
};

// The paths in MG_PLUGINS (colon-separated; empty entries ignored).
std::vector<std::string> plugins_from_env();

// The process-wide registry used by tools, tensors and modules. Empty until mg::init() (runtime.h)
// registers the built-in platforms; a test may also build its own Registry.
Registry& global_registry();

// The default-options op table of the platform that owns `device`, from the global registry
// (cached). Code holding a run's table (Runtime::ops, a module's ops()) should call through that.
const ops::OpTable& ops_for(Device device);

// The host allocator (256-byte aligned, with stats). Lives in core so host tensors work
// before any platform is registered; the CPU platform hands it out.
Allocator& host_allocator();

}  // namespace mg::plugin
