// CPU vocab-parallel embedding: lookup (forward) and scatter-add of row gradients (backward).
//
// Gradient rule: parameter gradients accumulate (+=: dweight); activation gradients are written
// (=: there are none, ids are not differentiable).
//
// This rank holds rows [vocab_start, vocab_start + Vl) of the full [V, H] table. Forward writes
// out[n] = weight[ids[n] - vocab_start] for ids inside the shard and zeros elsewhere (the TP
// all-reduce then sums the shards, as Megatron's VocabParallelEmbedding). Backward adds dout[n]
// into dweight[ids[n] - vocab_start] for ids inside the shard. It is deterministic: (id, n) pairs
// are sorted, each thread owns whole dweight rows and sums their dout rows in increasing n, in
// f32 (f64 for f64), before one add into dweight. No atomics on floats.
// Not here: the global vocab size (ids beyond it cannot be detected per shard; negative ids are
// rejected), padding_idx, max_norm.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

// ids (validated: i32 or i64) widened to i64 on the host, all checked >= 0.
std::vector<int64_t> load_ids(const char* op, const Tensor& ids) {
  std::vector<int64_t> out(static_cast<std::size_t>(ids.numel()));
  dispatch_index(ids.dtype(), op, [&]<typename I>(std::type_identity<I>) {
    const I* p = ids.data<I>();
    std::copy(p, p + ids.numel(), out.begin());
  });
  ops::validate_ids_nonnegative(op, ids, out);
  return out;
}

// out [N, H] = weight [Vl, H] rows (0 outside the shard)
void embedding_fwd(Tensor& out, const Tensor& ids, const Tensor& weight, int64_t vocab_start) {
  const ops::EmbeddingDims d = ops::validate_embedding_fwd(kOnHost, out, ids, weight, vocab_start);
  const int64_t n = d.n, v = d.v, h = d.h;
  const std::vector<int64_t> id = load_ids("embedding_fwd", ids);
  const std::size_t row_bytes = static_cast<std::size_t>(h) * dtype_size(weight.dtype());
  const auto* w = static_cast<const unsigned char*>(weight.raw_data());
  auto* o = static_cast<unsigned char*>(out.raw_data());
#pragma omp parallel for schedule(static) if (n * h >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t local = id[static_cast<std::size_t>(i)] - vocab_start;
    unsigned char* dst = o + static_cast<std::size_t>(i) * row_bytes;
    if (local >= 0 && local < v)
      std::memcpy(dst, w + static_cast<std::size_t>(local) * row_bytes, row_bytes);
    else
      std::memset(dst, 0, row_bytes);  // all-zero bits are +0 in every float dtype
  }
}

// dweight [Vl, H] += scatter of dout [N, H] rows by ids
void embedding_bwd(Tensor& dweight, const Tensor& dout, const Tensor& ids, int64_t vocab_start) {
  const ops::EmbeddingDims d =
      ops::validate_embedding_bwd(kOnHost, dweight, dout, ids, vocab_start);
  const int64_t n = d.n, v = d.v, h = d.h;
  const std::vector<int64_t> id = load_ids("embedding_bwd", ids);
  if (h == 0) return;

  // (local row, token) pairs inside the shard, sorted: groups of equal rows, tokens ascending.
  std::vector<std::pair<int64_t, int64_t>> pairs;
  pairs.reserve(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t local = id[static_cast<std::size_t>(i)] - vocab_start;
    if (local >= 0 && local < v) pairs.emplace_back(local, i);
  }
  std::sort(pairs.begin(), pairs.end());
  std::vector<int64_t> group_start;  // index into pairs where each distinct row begins
  for (std::size_t p = 0; p < pairs.size(); ++p)
    if (p == 0 || pairs[p].first != pairs[p - 1].first)
      group_start.push_back(static_cast<int64_t>(p));
  group_start.push_back(static_cast<int64_t>(pairs.size()));
  const int64_t groups = static_cast<int64_t>(group_start.size()) - 1;

  dispatch_float(dweight.dtype(), "embedding_bwd", [&]<typename TW>(std::type_identity<TW>) {
    dispatch_float(dout.dtype(), "embedding_bwd", [&]<typename TD>(std::type_identity<TD>) {
      using Acc = acc_t<TW, TD>;
      TW* dw = dweight.data<TW>();
      const TD* dy = dout.data<TD>();
#pragma omp parallel if (static_cast <int64_t>(pairs.size()) * h >= kParallelMinElements)
      {
        std::vector<Acc> acc(static_cast<std::size_t>(h));
#pragma omp for schedule(dynamic, 8)
        for (int64_t g = 0; g < groups; ++g) {
          std::fill(acc.begin(), acc.end(), Acc(0));
          const int64_t row = pairs[static_cast<std::size_t>(group_start[g])].first;
          for (int64_t p = group_start[g]; p < group_start[g + 1]; ++p) {
            const TD* src = dy + pairs[static_cast<std::size_t>(p)].second * h;
            for (int64_t j = 0; j < h; ++j) acc[j] += load<Acc>(src[j]);
          }
          TW* dst = dw + row * h;
          for (int64_t j = 0; j < h; ++j) dst[j] = store_from<TW>(load<Acc>(dst[j]) + acc[j]);
        }
      }
    });
  });
}

}  // namespace

void register_embedding_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::embedding_fwd>("cpu", &embedding_fwd, "cpu:omp");
  r.register_op<ops::OpId::embedding_bwd>("cpu", &embedding_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
