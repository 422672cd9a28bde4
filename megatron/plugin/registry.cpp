// Registry: platform bookkeeping, op resolution (priorities, per-run options, supports predicates
// with fallbacks), selection, plugin loading.
//
// A slot whose first provider has a supports predicate resolves to a dispatch thunk: a plain
// function pointer of the slot's type (OpTable holds nothing else) that tries the resolved
// providers in order. A function pointer carries no state, so each thunk reads its chain from a
// pool of kMaxChains chains per slot, interned by content and written once under a mutex: the pool
// only ever holds immutable plans, shared by every registry and table that resolved the same chain.
#include "megatron/plugin/registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "megatron/core/common/error.h"
#include "megatron/plugin/abi_check.h"
#include "megatron/plugin/plugin_api.h"

namespace mg::plugin {

namespace {

bool is_known_platform(std::string_view name) {
  return std::find(std::begin(kKnownPlatforms), std::end(kKnownPlatforms), name) !=
         std::end(kKnownPlatforms);
}

std::string known_list() {
  std::string s;
  for (auto n : kKnownPlatforms) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

// A slot without an implementation resolves to a thunk of the right type that throws.
template <typename Fn, ops::OpId id>
struct MissingThunk;
template <typename R, typename... A, ops::OpId id>
struct MissingThunk<R (*)(A...), id> {
  static R call(A...) {
    MG_THROW("op '" << ops::OpTraits<id>::name
                    << "' has no implementation on the selected platform; "
                       "`build/bin/megatron_info` lists what each platform provides");
  }
};

template <std::size_t... I>
constexpr std::array<void (*)(), ops::kNumOps> make_missing(std::index_sequence<I...>) {
  return {reinterpret_cast<void (*)()>(
      &MissingThunk<ops::OpFn<static_cast<ops::OpId>(I)>, static_cast<ops::OpId>(I)>::call)...};
}
const std::array<void (*)(), ops::kNumOps> kMissing =
    make_missing(std::make_index_sequence<ops::kNumOps>{});

// ---- fallback chains ----
constexpr int kMaxChains = 8;  // distinct chains per slot in one process

struct Step {
  void (*fn)();
  void (*supports)();  // null: serves every call (the last step, unless every provider has one)
  bool operator==(const Step&) const = default;
};
struct Chain {
  std::vector<Step> steps;
  std::string platform;
  std::vector<std::string> providers;  // of the steps, for the error when none serves a call
  bool operator==(const Chain&) const = default;
};
struct ChainPool {
  std::mutex mu;
  std::array<std::array<Chain, kMaxChains>, ops::kNumOps> chains;
  std::array<int, ops::kNumOps> used{};
};
ChainPool& chain_pool() {
  static ChainPool* p = new ChainPool();  // never destroyed: tables may outlive static teardown
  return *p;
}

[[noreturn]] void no_provider_serves(int slot, int k) {
  const Chain& c = chain_pool().chains[slot][k];
  std::string names;
  for (const auto& n : c.providers) names += (names.empty() ? "" : ", ") + n;
  MG_THROW("op '" << ops::kSlots[slot].name << "' on platform '" << c.platform
                  << "': no resolved provider supports this call (tried " << names
                  << "); `build/bin/megatron_info` lists each slot's providers");
}

template <typename Fn, ops::OpId id, int k>
struct Dispatch;
template <typename R, typename... A, ops::OpId id, int k>
struct Dispatch<R (*)(A...), id, k> {
  static R call(A... a) {
    constexpr int slot = static_cast<int>(id);
    for (const Step& s : chain_pool().chains[slot][k].steps)
      if (!s.supports || reinterpret_cast<bool (*)(A...)>(s.supports)(a...))
        return reinterpret_cast<R (*)(A...)>(s.fn)(a...);
    no_provider_serves(slot, k);
  }
};

template <std::size_t S, std::size_t... K>
std::array<void (*)(), kMaxChains> dispatch_row(std::index_sequence<K...>) {
  constexpr auto id = static_cast<ops::OpId>(S);
  return {reinterpret_cast<void (*)()>(&Dispatch<ops::OpFn<id>, id, static_cast<int>(K)>::call)...};
}
template <std::size_t... S>
std::array<std::array<void (*)(), kMaxChains>, ops::kNumOps> dispatch_table(
    std::index_sequence<S...>) {
  return {dispatch_row<S>(std::make_index_sequence<kMaxChains>{})...};
}
const std::array<std::array<void (*)(), kMaxChains>, ops::kNumOps> kDispatch =
    dispatch_table(std::make_index_sequence<ops::kNumOps>{});

// The dispatch thunk of `chain` for `slot`, interning the chain in the pool.
void (*intern_chain(int slot, Chain chain))() {
  auto& pool = chain_pool();
  std::lock_guard lock(pool.mu);
  auto& row = pool.chains[slot];
  int& used = pool.used[slot];
  for (int k = 0; k < used; ++k)
    if (row[k] == chain) return kDispatch[slot][k];
  MG_CHECK(used < kMaxChains, "op '" << ops::kSlots[slot].name << "': more than " << kMaxChains
                                     << " distinct provider chains resolved in one process");
  row[used] = std::move(chain);
  return kDispatch[slot][used++];
}

int slot_index(std::string_view name) {
  for (int s = 0; s < ops::kNumOps; ++s)
    if (ops::kSlots[s].name == name) return s;
  return -1;
}

std::string slot_list() {
  std::string s;
  for (const auto& slot : ops::kSlots) s += (s.empty() ? "" : ", ") + std::string(slot.name);
  return s;
}

}  // namespace

std::string ResolveOptions::str() const {
  std::string s = deterministic ? "deterministic" : "";
  std::string p;
  for (const auto& [slot, provider] : providers)
    p += (p.empty() ? "" : ",") + slot + "=" + provider;
  if (!p.empty()) s += (s.empty() ? "" : ";") + p;
  return s;
}

std::map<std::string, std::string> parse_op_providers(std::string_view spec,
                                                      std::string_view source) {
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  std::map<std::string, std::string> out;
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const auto entry = trim(spec.substr(0, comma));
    if (!entry.empty()) {
      const auto eq = entry.find('=');
      MG_CHECK(eq != std::string_view::npos && eq > 0 && eq + 1 < entry.size(),
               source << ": entry '" << entry
                      << "' is not slot=provider (e.g. attention_fwd=cuda:attention-mma)");
      const std::string slot(trim(entry.substr(0, eq))), provider(trim(entry.substr(eq + 1)));
      MG_CHECK(out.emplace(slot, provider).second, source << ": slot '" << slot
                                                          << "' is named twice ('" << out[slot]
                                                          << "' and '" << provider << "')");
    }
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return out;
}

std::map<std::string, std::string> op_providers_from_env() {
  const char* env = std::getenv("MG_OP_PROVIDERS");
  return env ? parse_op_providers(env, "MG_OP_PROVIDERS") : std::map<std::string, std::string>{};
}

std::string describe(const Resolution& r) {
  if (r.provider.empty()) return "MISSING";
  std::string s = r.provider;
  if (!r.fallbacks.empty()) {
    s += " (else";
    for (std::size_t i = 0; i < r.fallbacks.size(); ++i) s += (i ? ", " : " ") + r.fallbacks[i];
    s += ")";
  } else if (r.supports_predicate) {
    s += " (only the calls it supports)";
  }
  return s;
}

bool Registry::register_once(std::string_view name, void (*register_fn)(Registry&)) {
  MG_CHECK(register_fn != nullptr, "register_once('" << name << "'): null function");
  {
    std::lock_guard lock(mu_);
    if (std::find(registered_once_.begin(), registered_once_.end(), name) != registered_once_.end())
      return false;
  }
  register_fn(*this);  // not under mu_: it registers through this registry
  std::lock_guard lock(mu_);
  registered_once_.emplace_back(name);
  return true;
}

void Registry::register_platform(std::unique_ptr<Platform> platform) {
  MG_CHECK(platform != nullptr, "register_platform: null platform");
  const std::string name(platform->name());
  MG_CHECK(is_known_platform(name),
           "platform name '" << name << "' is not one Megatron-CPP knows (" << known_list() << ")");
  MG_CHECK(device_type_name(platform->device_type()) == name,
           "platform '" << name << "' reports device type '"
                        << device_type_name(platform->device_type()) << "'");
  std::lock_guard lock(mu_);
  for (const auto& p : platforms_)
    MG_CHECK(p->name() != name, "platform '" << name << "' is already registered");
  platforms_.push_back(std::move(platform));
}

Platform* Registry::find_platform(std::string_view name) const {
  std::lock_guard lock(mu_);
  for (const auto& p : platforms_)
    if (p->name() == name) return p.get();
  return nullptr;
}

Platform& Registry::platform(DeviceType type) const {
  Platform* p = find_platform(device_type_name(type));
  if (!p && type == DeviceType::cpu)
    MG_THROW("the CPU platform is not registered: call mg::init()");
  MG_CHECK(
      p != nullptr, "no platform is registered for device type '"
                        << device_type_name(type) << "'; registered: " << [&] {
                             std::string s;
                             for (const auto& st : platform_statuses())
                               if (st.registered) s += (s.empty() ? "" : ", ") + st.name;
                             return s.empty() ? std::string("none") : s;
                           }());
  return *p;
}

std::vector<PlatformStatus> Registry::platform_statuses() const {
  std::vector<PlatformStatus> out;
  for (auto name : kKnownPlatforms) {
    PlatformStatus st;
    st.name = std::string(name);
    if (Platform* p = find_platform(name)) {
      st.registered = true;
      st.availability = p->availability();
    } else {
      st.availability = {false, "not provided by this build; a plugin providing '" + st.name +
                                    "' must be listed in MG_PLUGINS"};
    }
    out.push_back(std::move(st));
  }
  return out;
}

Platform& Registry::select_platform(std::string_view requested) const {
  std::string name(requested);
  std::string source = "--platform";
  if (name.empty()) {
    if (const char* env = std::getenv("MG_PLATFORM"); env && *env) {
      name = env;
      source = "MG_PLATFORM";
    }
  }
  const auto statuses = platform_statuses();
  auto table = [&] {
    std::ostringstream os;
    for (const auto& st : statuses)
      os << "\n  " << st.name << ": " << (st.availability.available ? "available" : "unavailable")
         << " (" << st.availability.reason << ")";
    return os.str();
  };
  if (name.empty()) {
    for (const auto& st : statuses)
      if (st.availability.available) return *find_platform(st.name);
    MG_THROW("no platform is available:" << table());
  }
  MG_CHECK(is_known_platform(name), source << "='" << name << "' is not a platform name; known: "
                                           << known_list() << table());
  Platform* p = find_platform(name);
  MG_CHECK(p != nullptr, source << "='" << name << "': platform '" << name
                                << "' needs a plugin (none is loaded; list one in MG_PLUGINS)."
                                << " Platforms:" << table());
  const auto av = p->availability();
  MG_CHECK(av.available, source << "='" << name << "': platform '" << name
                                << "' is unavailable: " << av.reason << ". Platforms:" << table());
  return *p;
}

void Registry::add_candidate(int slot, std::string_view platform, void (*fn)(),
                             std::string provider, Priority priority, void (*supports)(),
                             bool deterministic) {
  MG_CHECK(fn != nullptr, "null implementation for op '" << ops::kSlots[slot].name << "'");
  MG_CHECK(!provider.empty(), "op '" << ops::kSlots[slot].name << "': empty provider name");
  MG_CHECK(platform == kGenericPlatform || is_known_platform(platform),
           "cannot register op '" << ops::kSlots[slot].name << "' for unknown platform '"
                                  << platform << "' (known: " << known_list() << ", or '*')");
  std::lock_guard lock(mu_);
  MG_CHECK(resolved_.empty() || (platform != kGenericPlatform && !resolved_.count(platform)),
           "op '" << ops::kSlots[slot].name << "' registered by '" << provider
                  << "' after the op table of '" << platform
                  << "' was resolved: load plugins before building models");
  auto& per_slot = candidates_[std::string(platform)];
  if (per_slot.empty()) per_slot.resize(ops::kNumOps);
  for (const auto& c : per_slot[slot])
    MG_CHECK(c.provider != provider, "op '" << ops::kSlots[slot].name << "' on '" << platform
                                            << "': provider '" << provider
                                            << "' is already registered");
  per_slot[slot].push_back({fn, std::move(provider), static_cast<int>(priority), next_order_++,
                            supports, deterministic});
}

std::vector<const Registry::Candidate*> Registry::ranked(int slot,
                                                         std::string_view platform) const {
  std::vector<const Candidate*> out;
  for (std::string_view p : {platform, kGenericPlatform}) {
    auto it = candidates_.find(p);
    if (it == candidates_.end()) continue;
    for (const auto& c : it->second[slot]) out.push_back(&c);
    if (p == kGenericPlatform) break;
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate* a, const Candidate* b) {
    return a->priority != b->priority ? a->priority > b->priority : a->order > b->order;
  });
  return out;
}

void Registry::check_options(std::string_view platform, const ResolveOptions& options) const {
  for (const auto& [slot, provider] : options.providers) {
    const std::string what = "op provider choice '" + slot + "=" + provider +
                             "' (RuntimeOptions::op_providers or MG_OP_PROVIDERS)";
    const int s = slot_index(slot);
    MG_CHECK(s >= 0, what << ": '" << slot << "' is not an op slot; slots: " << slot_list());
    const auto candidates = ranked(s, platform);
    std::string names;
    const Candidate* found = nullptr;
    for (const Candidate* c : candidates) {
      names += (names.empty() ? "" : ", ") + c->provider;
      if (c->provider == provider && !found) found = c;
    }
    MG_CHECK(found != nullptr, what << ": slot '" << slot << "' has no provider '" << provider
                                    << "' on platform '" << platform
                                    << "'; its providers: " << (names.empty() ? "none" : names));
    MG_CHECK(!options.deterministic || found->deterministic,
             what << ": provider '" << provider
                  << "' is not deterministic and this run is in deterministic mode "
                     "(--deterministic-mode)");
  }
}

Registry::Plan Registry::plan(int slot, std::string_view platform,
                              const ResolveOptions& options) const {
  Plan p;
  std::vector<const Candidate*> usable;
  for (const Candidate* c : ranked(slot, platform))
    (options.deterministic && !c->deterministic ? p.excluded : usable).push_back(c);
  if (auto it = options.providers.find(std::string(ops::kSlots[slot].name));
      it != options.providers.end()) {
    auto pos = std::find_if(usable.begin(), usable.end(),
                            [&](const Candidate* c) { return c->provider == it->second; });
    if (pos != usable.end()) {  // check_options made sure it is
      std::rotate(usable.begin(), pos, pos + 1);
      p.preferred = true;
    }
  }
  bool closed = false;  // a provider without a predicate serves every call: the chain ends there
  for (const Candidate* c : usable) {
    (closed ? p.shadowed : p.run).push_back(c);
    if (!c->supports) closed = true;
  }
  return p;
}

const ops::OpTable& Registry::ops(std::string_view platform, const ResolveOptions& options) {
  std::lock_guard lock(mu_);
  const std::string key = options.str();
  if (auto it = resolved_.find(platform); it != resolved_.end())
    if (auto t = it->second.find(key); t != it->second.end()) return *t->second;
  check_options(platform, options);
  std::array<void (*)(), ops::kNumOps> fns{};
  for (int s = 0; s < ops::kNumOps; ++s) {
    const Plan p = plan(s, platform, options);
    if (p.run.empty()) {
      fns[s] = kMissing[s];
    } else if (p.run.size() == 1 && !p.run.front()->supports) {
      fns[s] = p.run.front()->fn;  // the common case: a direct call, no dispatch
    } else {
      Chain chain;
      chain.platform = std::string(platform);
      for (const Candidate* c : p.run) {
        chain.steps.push_back({c->fn, c->supports});
        chain.providers.push_back(c->provider);
      }
      fns[s] = intern_chain(s, std::move(chain));
    }
  }
  auto table = std::make_unique<ops::OpTable>();
#define MG_X(slot, kind, bwd, sig) \
  table->slot = reinterpret_cast<decltype(table->slot)>(fns[static_cast<int>(ops::OpId::slot)]);
  MG_OP_LIST(MG_X)
#undef MG_X
  auto& ref = *table;
  auto& per_platform = resolved_[std::string(platform)];
  per_platform.emplace(key, std::move(table));
  return ref;
}

std::vector<Resolution> Registry::resolutions(std::string_view platform,
                                              const ResolveOptions& options) const {
  std::lock_guard lock(mu_);
  check_options(platform, options);
  std::vector<Resolution> out;
  for (int s = 0; s < ops::kNumOps; ++s) {
    Resolution r;
    r.slot = ops::kSlots[s].name;
    r.kind = ops::kSlots[s].kind;
    r.backward = ops::kSlots[s].backward;
    const Plan p = plan(s, platform, options);
    if (!p.run.empty()) {
      r.provider = p.run.front()->provider;
      r.supports_predicate = p.run.front()->supports != nullptr;
      r.preferred = p.preferred;
      for (std::size_t i = 1; i < p.run.size(); ++i) r.fallbacks.push_back(p.run[i]->provider);
    }
    for (const Candidate* c : p.shadowed) r.shadowed.push_back(c->provider);
    for (const Candidate* c : p.excluded) r.excluded.push_back(c->provider);
    out.push_back(std::move(r));
  }
  return out;
}

void Registry::load_plugin(const std::string& path) {
  MG_CHECK(!path.empty(), "empty plugin path");
  {
    std::lock_guard lock(mu_);
    for (const auto& p : plugins_)
      MG_CHECK(p.path != path, "plugin '" << path << "' is already loaded (as '" << p.name << "')");
  }
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    MG_THROW("cannot load plugin '" << path << "': " << (err ? err : "unknown dlopen error"));
  }
  auto fn = reinterpret_cast<MgPluginDescriptorFn>(dlsym(handle, MG_PLUGIN_ENTRY_SYMBOL));
  if (!fn) {
    dlclose(handle);
    MG_THROW("'" << path << "' is not a Megatron-CPP plugin: it does not export extern \"C\" "
                 << MG_PLUGIN_ENTRY_SYMBOL << "() (see megatron/plugin/plugin_api.h)");
  }
  const MgPluginDescriptor* d = fn();
  if (!d) {
    dlclose(handle);
    MG_THROW("plugin '" << path << "': " << MG_PLUGIN_ENTRY_SYMBOL << "() returned null");
  }
  // Copy what the messages need before dlclose() unmaps the descriptor.
  const uint32_t version = d->api_version;
  const uint64_t hash = d->op_table_hash;
  if (version != MG_PLUGIN_API_VERSION) {
    dlclose(handle);
    MG_THROW("plugin '" << path << "' was built for plugin API version " << version
                        << ", this build provides version " << MG_PLUGIN_API_VERSION
                        << ": rebuild the plugin against these headers");
  }
  if (hash != ops::kOpTableAbiHash) {
    dlclose(handle);
    MG_THROW("plugin '" << path << "' was built against a different op table (hash 0x" << std::hex
                        << hash << ", this build 0x" << ops::kOpTableAbiHash
                        << "): rebuild the plugin against these headers");
  }
  MG_CHECK(d->register_fn != nullptr, "plugin '" << path << "' has no register function");
  d->register_fn(*this);
  std::lock_guard lock(mu_);
  plugins_.push_back({path, d->name ? d->name : "?", d->version ? d->version : "?"});
  handles_.push_back(handle);
}

std::vector<std::string> plugins_from_env() {
  std::vector<std::string> out;
  const char* env = std::getenv("MG_PLUGINS");
  if (!env) return out;
  std::string_view list(env);
  while (!list.empty()) {
    const auto colon = list.find(':');
    const auto item = list.substr(0, colon);
    if (!item.empty()) out.emplace_back(item);
    if (colon == std::string_view::npos) break;
    list.remove_prefix(colon + 1);
  }
  return out;
}

void Registry::load_plugins_from_env() {
  for (const auto& path : plugins_from_env()) load_plugin(path);
}

std::vector<PluginInfo> Registry::plugins() const {
  std::lock_guard lock(mu_);
  return plugins_;
}

uint64_t library_op_table_abi_hash() {
  return ops::kOpTableAbiHash;
}

Registry& global_registry() {
  static Registry* r = new Registry();  // never destroyed: tensors may outlive static teardown
  return *r;
}

const ops::OpTable& ops_for(Device device) {
  return global_registry().ops(device_type_name(device.type));
}

}  // namespace mg::plugin
