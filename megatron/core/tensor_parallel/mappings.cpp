// Collective primitives behind the conjugate TP/SP mappings (mappings.h).
#include "megatron/core/tensor_parallel/mappings.h"

#include <cstring>

#include "megatron/core/common/error.h"

namespace mg::tensor_parallel {

namespace {

Tensor flat(const Tensor& x) {
  return x.view({x.numel()});
}

// Host permutation of column blocks: src rows of `parts` blocks of `cols` elements.
// gather: src [P, R, C] -> dst [R, P, C]; split: dst [R, C] <- src [R, P, C] block `part`.
void permute_blocks_host(void* dst, const void* src, int64_t parts, int64_t rows, int64_t cols,
                         std::size_t elem) {
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * elem;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(d + (r * parts + p) * row_bytes, s + (p * rows + r) * row_bytes, row_bytes);
}

}  // namespace

Tensor all_reduce_(Tensor x, ProcessGroup& g) {
  if (g.size() == 1) return x;
  Tensor f = flat(x);
  g.all_reduce(f, comm::ReduceOp::sum)->wait();
  return x;
}

Tensor all_gather_dim0(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x;
  MG_CHECK(x.dim() >= 1, "all_gather_dim0 on a 0-d tensor (group " << g.name() << ")");
  Shape s = x.shape();
  s[0] *= g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  Tensor o = flat(out);
  g.all_gather(o, flat(x))->wait();
  return out;
}

Tensor reduce_scatter_dim0(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x;
  MG_CHECK(x.dim() >= 1 && x.size(0) % g.size() == 0,
           "reduce_scatter_dim0: dim 0 of " << x.str() << " is not divisible by the size "
                                            << g.size() << " of group " << g.name());
  Shape s = x.shape();
  s[0] /= g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  Tensor o = flat(out);
  g.reduce_scatter(o, flat(x), comm::ReduceOp::sum)->wait();
  return out;
}

Tensor split_dim0(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x;
  MG_CHECK(x.dim() >= 1 && x.size(0) % g.size() == 0,
           "split_dim0: dim 0 of " << x.str() << " is not divisible by the size " << g.size()
                                   << " of group " << g.name());
  const int64_t n = x.size(0) / g.size();
  return x.slice(g.rank() * n, n);
}

Tensor all_gather_last_dim(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x;
  MG_CHECK(x.dim() >= 1, "all_gather_last_dim on a 0-d tensor (group " << g.name() << ")");
  const int64_t p = g.size(), c = x.size(-1), rows = x.numel() / c;
  Tensor gathered = Tensor::empty({p * x.numel()}, x.dtype(), x.device());  // [P, R, C]
  g.all_gather(gathered, flat(x))->wait();
  const Tensor src = gathered.to(Device::cpu());
  Tensor dst = Tensor::empty({p * x.numel()}, x.dtype(), Device::cpu());  // [R, P, C]
  permute_blocks_host(dst.raw_data(), src.raw_data(), p, rows, c, dtype_size(x.dtype()));
  Shape s = x.shape();
  s.back() *= p;
  return dst.to(x.device()).view(s);
}

Tensor split_last_dim(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x;
  const int64_t p = g.size();
  MG_CHECK(x.dim() >= 1 && x.size(-1) % p == 0, "split_last_dim: the last dim of "
                                                    << x.str() << " is not divisible by the size "
                                                    << p << " of group " << g.name());
  const int64_t c = x.size(-1) / p, rows = x.numel() / x.size(-1);
  const Tensor src = x.to(Device::cpu());
  Shape s = x.shape();
  s.back() = c;
  Tensor dst = Tensor::empty(s, x.dtype(), Device::cpu());
  const std::size_t elem = dtype_size(x.dtype()), row_bytes = static_cast<std::size_t>(c) * elem;
  const auto* sp = static_cast<const char*>(src.raw_data());
  auto* dp = static_cast<char*>(dst.raw_data());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dp + r * row_bytes, sp + (r * p + g.rank()) * row_bytes, row_bytes);
  return dst.to(x.device());
}

Tensor gather_partitioned(const Tensor& shard, const Shape& global_shape, const Partition& part,
                          ProcessGroup& g) {
  MG_CHECK(part.size == g.size() && part.rank == g.rank(),
           "gather_partitioned: partition rank " << part.rank << " of " << part.size
                                                 << " but group " << g.name() << " rank "
                                                 << g.rank() << " of " << g.size());
  if (part.replicated()) return shard;
  Tensor all = Tensor::empty({g.size() * shard.numel()}, shard.dtype(), shard.device());
  g.all_gather(all, flat(shard))->wait();
  std::vector<Tensor> shards;
  for (int64_t r = 0; r < g.size(); ++r)
    shards.push_back(all.slice(r * shard.numel(), shard.numel()).view(shard.shape()));
  return assemble_partitions(shards, global_shape, part.dim, part.stride);
}

}  // namespace mg::tensor_parallel
