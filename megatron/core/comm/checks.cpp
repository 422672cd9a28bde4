// Argument checks shared by the ProcessGroup backends (see checks.h).
#include "megatron/core/comm/checks.h"

#include <set>
#include <sstream>

namespace mg::comm::detail {

std::string ranks_str(std::span<const int> ranks) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

std::string describe(const ProcessGroup& g) {
  std::ostringstream os;
  os << "group '" << g.name() << "' (" << g.backend() << ", rank " << g.rank() << " of " << g.size()
     << ", global ranks " << ranks_str(g.ranks()) << ")";
  return os.str();
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || !a.shares_storage_with(b)) return false;
  const std::size_t a0 = a.offset_bytes(), a1 = a0 + a.nbytes();
  const std::size_t b0 = b.offset_bytes(), b1 = b0 + b.nbytes();
  return a0 < b1 && b0 < a1 && a.nbytes() > 0 && b.nbytes() > 0;
}

namespace {

void check_defined(const ProcessGroup& g, std::string_view op, const char* what, const Tensor& t) {
  MG_CHECK(t.defined(), op << " on " << describe(g) << ": " << what << " is an undefined tensor");
}

void check_same_dtype(const ProcessGroup& g, std::string_view op, const Tensor& out,
                      const Tensor& in) {
  MG_CHECK(out.dtype() == in.dtype(), op << " on " << describe(g) << ": out " << out.str()
                                         << " and in " << in.str() << " have different dtypes");
}

void check_reduce_op(const ProcessGroup& g, std::string_view op, const Tensor& t, ReduceOp r) {
  MG_CHECK(r != ReduceOp::avg || is_floating(t.dtype()),
           op << " on " << describe(g) << ": ReduceOp avg needs a floating dtype, got " << t.str());
}

// out is `factor` times in along dim 0: numel always; the shapes too when both have the same rank.
void check_scaled(const ProcessGroup& g, std::string_view op, const Tensor& big,
                  const Tensor& small, const char* big_name, const char* small_name) {
  const int64_t n = g.size();
  bool ok = big.numel() == n * small.numel();
  if (ok && big.dim() == small.dim() && big.dim() >= 1) {
    ok = big.size(0) == n * small.size(0);
    for (int d = 1; d < big.dim() && ok; ++d) ok = big.size(d) == small.size(d);
  }
  MG_CHECK(ok, op << " on " << describe(g) << ": " << big_name << " " << shape_str(big.shape())
                  << " must be " << n << " x " << small_name << " " << shape_str(small.shape())
                  << " along dim 0 (group size " << n << ")");
}

}  // namespace

void check_all_reduce(const ProcessGroup& g, const Tensor& x, ReduceOp op) {
  check_defined(g, "all_reduce", "x", x);
  check_reduce_op(g, "all_reduce", x, op);
}

void check_all_gather(const ProcessGroup& g, const Tensor& out, const Tensor& in) {
  check_defined(g, "all_gather", "out", out);
  check_defined(g, "all_gather", "in", in);
  check_same_dtype(g, "all_gather", out, in);
  MG_CHECK(out.device() == in.device(), "all_gather on " << describe(g) << ": out " << out.str()
                                                         << " and in " << in.str()
                                                         << " are on different devices");
  check_scaled(g, "all_gather", out, in, "out", "in");
}

void check_reduce_scatter(const ProcessGroup& g, const Tensor& out, const Tensor& in, ReduceOp op) {
  check_defined(g, "reduce_scatter", "out", out);
  check_defined(g, "reduce_scatter", "in", in);
  check_same_dtype(g, "reduce_scatter", out, in);
  MG_CHECK(out.device() == in.device(), "reduce_scatter on " << describe(g) << ": out " << out.str()
                                                             << " and in " << in.str()
                                                             << " are on different devices");
  check_reduce_op(g, "reduce_scatter", in, op);
  check_scaled(g, "reduce_scatter", in, out, "in", "out");
}

void check_broadcast(const ProcessGroup& g, const Tensor& x, int root) {
  check_defined(g, "broadcast", "x", x);
  MG_CHECK(root >= 0 && root < g.size(), "broadcast on " << describe(g) << ": root " << root
                                                         << " is not a group rank in [0, "
                                                         << g.size() << ")");
}

void check_all_to_all(const ProcessGroup& g, const Tensor& out, const Tensor& in) {
  check_defined(g, "all_to_all", "out", out);
  check_defined(g, "all_to_all", "in", in);
  check_same_dtype(g, "all_to_all", out, in);
  MG_CHECK(out.device() == in.device(), "all_to_all on " << describe(g) << ": out " << out.str()
                                                         << " and in " << in.str()
                                                         << " are on different devices");
  MG_CHECK(out.numel() == in.numel() && in.numel() % g.size() == 0,
           "all_to_all on " << describe(g) << ": out " << shape_str(out.shape()) << " and in "
                            << shape_str(in.shape())
                            << " must have the same number of elements, divisible by the group "
                               "size "
                            << g.size());
}

void check_all_to_all_v(const ProcessGroup& g, const Tensor& out, const Tensor& in,
                        std::span<const int64_t> send_counts,
                        std::span<const int64_t> recv_counts) {
  check_defined(g, "all_to_all_v", "out", out);
  check_defined(g, "all_to_all_v", "in", in);
  check_same_dtype(g, "all_to_all_v", out, in);
  MG_CHECK(out.device() == in.device(), "all_to_all_v on " << describe(g) << ": out " << out.str()
                                                           << " and in " << in.str()
                                                           << " are on different devices");
  const auto n = static_cast<std::size_t>(g.size());
  MG_CHECK(send_counts.size() == n && recv_counts.size() == n,
           "all_to_all_v on " << describe(g) << ": " << send_counts.size() << " send counts and "
                              << recv_counts.size() << " recv counts for a group of " << n);
  int64_t send_total = 0, recv_total = 0;
  for (std::size_t j = 0; j < n; ++j) {
    MG_CHECK(send_counts[j] >= 0 && recv_counts[j] >= 0,
             "all_to_all_v on " << describe(g) << ": negative count for member " << j << " (send "
                                << send_counts[j] << ", recv " << recv_counts[j] << ")");
    send_total += send_counts[j];
    recv_total += recv_counts[j];
  }
  MG_CHECK(send_total <= in.numel() && recv_total <= out.numel(),
           "all_to_all_v on " << describe(g) << ": send counts total " << send_total << " for in "
                              << shape_str(in.shape()) << " (" << in.numel()
                              << " elements), recv counts total " << recv_total << " for out "
                              << shape_str(out.shape()) << " (" << out.numel() << " elements)");
}

void check_p2p(const ProcessGroup& g, std::string_view op, const Tensor& x, int peer, int tag) {
  check_defined(g, op, "tensor", x);
  MG_CHECK(peer >= 0 && peer < g.size(), op << " on " << describe(g) << ": peer " << peer
                                            << " is not a group rank in [0, " << g.size() << ")");
  MG_CHECK(tag >= 0 && tag < (1 << 20),
           op << " on " << describe(g) << ": tag " << tag << " outside [0, 2^20)");
}

void check_partition(const std::vector<std::vector<int>>& groups, int world_size,
                     const std::string& name) {
  std::set<int> seen;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    MG_CHECK(!groups[i].empty(), "new_groups '" << name << "': group " << i << " is empty");
    for (int r : groups[i]) {
      MG_CHECK(r >= 0 && r < world_size, "new_groups '" << name << "': group " << i << " "
                                                        << ranks_str(groups[i]) << " has rank " << r
                                                        << " outside the world [0, " << world_size
                                                        << ")");
      MG_CHECK(seen.insert(r).second, "new_groups '" << name << "': rank " << r
                                                     << " is in more than one group (group " << i
                                                     << " " << ranks_str(groups[i]) << ")");
    }
  }
}

}  // namespace mg::comm::detail
