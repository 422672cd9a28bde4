// The op list a program was compiled against vs the one the library was built with. The op table
// is a struct of function pointers whose layout comes from op_list.h, so a program compiled
// against another list (e.g. a benchmark, which is EXCLUDE_FROM_ALL, left stale by an op-list
// change) calls the wrong slots: check_op_table_abi turns that into an error naming the fix.
// Plugins are checked the same way at load time (registry.cpp, plugin_api.h).
#pragma once

#include <cstdint>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"

namespace mg::plugin {

// ops::kOpTableAbiHash as the library saw it when it was built.
uint64_t library_op_table_abi_hash();

// Throws unless `program` (compiled where this inline function is) has the library's op list.
inline void check_op_table_abi(const char* program, const char* rebuild) {
  const uint64_t lib = library_op_table_abi_hash();
  MG_CHECK(lib == ops::kOpTableAbiHash,
           program << " was compiled against another op list than the library's (op table hash 0x"
                   << std::hex << ops::kOpTableAbiHash << ", the library's 0x" << lib << std::dec
                   << "): rebuild it (" << rebuild << ")");
}

}  // namespace mg::plugin
