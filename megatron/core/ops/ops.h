// Typed view of op_list.h: OpId, per-slot traits, and OpTable (one function pointer per slot).
//
// An OpTable is what a module holds after resolution: calls go straight through a function pointer,
// nothing is looked up per call. A slot with no implementation on a platform holds a thunk that
// throws a clear error naming the slot, so a partial platform fails loudly only when used.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "megatron/core/ops/op_args.h"
#include "megatron/core/ops/op_list.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::ops {

enum class SlotKind : uint8_t { op, function };

enum class OpId : int {
#define MG_X(slot, kind, bwd, sig) slot,
  MG_OP_LIST(MG_X)
#undef MG_X
};

inline constexpr int kNumOps = 0
#define MG_X(slot, kind, bwd, sig) +1
    MG_OP_LIST(MG_X)
#undef MG_X
    ;

template <OpId id>
struct OpTraits;

#define MG_X(slot, kind_, bwd, sig)                     \
  template <>                                           \
  struct OpTraits<OpId::slot> {                         \
    using Sig = sig;                                    \
    using Fn = std::add_pointer_t<sig>;                 \
    static constexpr std::string_view name = #slot;     \
    static constexpr SlotKind kind = SlotKind::kind_;   \
    static constexpr std::string_view backward = bwd;   \
    static constexpr std::string_view signature = #sig; \
  };
MG_OP_LIST(MG_X)
#undef MG_X

template <OpId id>
using OpFn = typename OpTraits<id>::Fn;

struct SlotInfo {
  std::string_view name;
  SlotKind kind;
  std::string_view backward;
  std::string_view signature;
};
inline constexpr std::array<SlotInfo, kNumOps> kSlots = {{
#define MG_X(slot, kind_, bwd, sig) {#slot, SlotKind::kind_, bwd, #sig},
    MG_OP_LIST(MG_X)
#undef MG_X
}};

struct OpTable {
#define MG_X(slot, kind, bwd, sig) std::add_pointer_t<sig> slot = nullptr;
  MG_OP_LIST(MG_X)
#undef MG_X
};

// FNV-1a over every slot's name, kind and signature text: a plugin built against a different op
// list (or argument structs renamed) carries a different hash and is refused at load time.
constexpr uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}
constexpr uint64_t compute_abi_hash() {
  uint64_t h = fnv1a("megatron-cpp-op-table");
  for (const auto& s : kSlots) {
    h = fnv1a(s.name, h);
    h = fnv1a(s.kind == SlotKind::op ? "op" : "function", h);
    h = fnv1a(s.signature, h);
  }
  return h;
}
inline constexpr uint64_t kOpTableAbiHash = compute_abi_hash();

constexpr std::string_view slot_kind_name(SlotKind k) {
  return k == SlotKind::op ? "op" : "function";
}

}  // namespace mg::ops
