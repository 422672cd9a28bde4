// Generic (platform-independent) implementations of the named overridable functions, registered
// under the pseudo-platform "*" with Priority::generic. Any platform or plugin may override them.
#pragma once

namespace mg::plugin {
class Registry;
}

namespace mg::ops {
void register_generic(plugin::Registry& registry);
}
