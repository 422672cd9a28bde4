// Argument checks shared by every ProcessGroup backend (single, MPI, NCCL): the same contract, the
// same messages. Each throws mg::Error naming the op, the group (name, backend, size) and the
// shapes. They check what a backend can see locally; that every member passes matching sizes is the
// caller's contract (MPI and NCCL cannot check it without an extra collective).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "megatron/core/comm/process_group.h"

namespace mg::comm::detail {

// "group 'tp' (mpi, rank 1 of 4, global ranks [0, 1, 2, 3])"
std::string describe(const ProcessGroup& g);
std::string ranks_str(std::span<const int> ranks);

// True when the byte ranges of a and b intersect (same storage).
bool overlaps(const Tensor& a, const Tensor& b);

void check_all_reduce(const ProcessGroup& g, const Tensor& x, ReduceOp op);
void check_all_gather(const ProcessGroup& g, const Tensor& out, const Tensor& in);
void check_reduce_scatter(const ProcessGroup& g, const Tensor& out, const Tensor& in, ReduceOp op);
void check_broadcast(const ProcessGroup& g, const Tensor& x, int root);
void check_all_to_all(const ProcessGroup& g, const Tensor& out, const Tensor& in);
void check_all_to_all_v(const ProcessGroup& g, const Tensor& out, const Tensor& in,
                        std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts);
void check_p2p(const ProcessGroup& g, std::string_view op, const Tensor& x, int peer, int tag);
// The partition passed to Communicator::new_groups: non-empty groups of distinct ranks in
// [0, world_size), no rank in two groups.
void check_partition(const std::vector<std::vector<int>>& groups, int world_size,
                     const std::string& name);

}  // namespace mg::comm::detail
