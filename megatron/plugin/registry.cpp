// Registry: platform bookkeeping, op resolution with priorities, selection, plugin loading.
#include "megatron/plugin/registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "megatron/core/common/error.h"
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

}  // namespace

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
                             std::string provider, Priority priority) {
  MG_CHECK(fn != nullptr, "null implementation for op '" << ops::kSlots[slot].name << "'");
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
  per_slot[slot].push_back({fn, std::move(provider), static_cast<int>(priority), next_order_++});
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

const ops::OpTable& Registry::ops(std::string_view platform) {
  std::lock_guard lock(mu_);
  if (auto it = resolved_.find(platform); it != resolved_.end()) return *it->second;
  std::array<void (*)(), ops::kNumOps> fns{};
  for (int s = 0; s < ops::kNumOps; ++s) {
    auto r = ranked(s, platform);
    fns[s] = r.empty() ? kMissing[s] : r.front()->fn;
  }
  auto table = std::make_unique<ops::OpTable>();
#define MG_X(slot, kind, bwd, sig) \
  table->slot = reinterpret_cast<decltype(table->slot)>(fns[static_cast<int>(ops::OpId::slot)]);
  MG_OP_LIST(MG_X)
#undef MG_X
  auto& ref = *table;
  resolved_.emplace(std::string(platform), std::move(table));
  return ref;
}

std::vector<Resolution> Registry::resolutions(std::string_view platform) const {
  std::lock_guard lock(mu_);
  std::vector<Resolution> out;
  for (int s = 0; s < ops::kNumOps; ++s) {
    Resolution r{ops::kSlots[s].name, ops::kSlots[s].kind, ops::kSlots[s].backward, {}, {}};
    auto ranked_list = ranked(s, platform);
    for (std::size_t i = 0; i < ranked_list.size(); ++i) {
      if (i == 0)
        r.provider = ranked_list[i]->provider;
      else
        r.shadowed.push_back(ranked_list[i]->provider);
    }
    out.push_back(std::move(r));
  }
  return out;
}

void Registry::load_plugin(const std::string& path) {
  MG_CHECK(!path.empty(), "empty plugin path");
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

void Registry::load_plugins_from_env() {
  const char* env = std::getenv("MG_PLUGINS");
  if (!env) return;
  std::string_view list(env);
  while (!list.empty()) {
    const auto colon = list.find(':');
    const auto item = list.substr(0, colon);
    if (!item.empty()) load_plugin(std::string(item));
    if (colon == std::string_view::npos) break;
    list.remove_prefix(colon + 1);
  }
}

std::vector<PluginInfo> Registry::plugins() const {
  std::lock_guard lock(mu_);
  return plugins_;
}

Registry& global_registry() {
  static Registry* r = new Registry();  // never destroyed: tensors may outlive static teardown
  return *r;
}

const ops::OpTable& ops_for(Device device) {
  return global_registry().ops(device_type_name(device.type));
}

}  // namespace mg::plugin
