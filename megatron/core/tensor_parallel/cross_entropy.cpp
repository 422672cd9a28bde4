// Vocab-parallel cross entropy over the ce_local_max / ce_local_stats / ce_combine /
// cross_entropy_bwd ops and two all-reduces (cross_entropy.h).
#include "megatron/core/tensor_parallel/cross_entropy.h"

#include <limits>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/core/tensor_parallel/mappings.h"

namespace mg::tensor_parallel {

Tensor vocab_parallel_cross_entropy(const ops::OpTable& ops, const Tensor& logits,
                                    const Tensor& targets, int64_t vocab_start,
                                    comm::ProcessGroup& tp, CrossEntropySaved& saved,
                                    int64_t vocab_end_of_all) {
  MG_CHECK(logits.dim() == 2,
           "vocab_parallel_cross_entropy: logits " << logits.str() << " must be [N, Vl]");
  const int64_t n = logits.size(0), vl = logits.size(1);
  const DType stat = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Device dev = logits.device();
  Tensor loss = Tensor::empty({n}, stat, dev);
  saved.max = Tensor::empty({n}, stat, dev);
  if (tp.size() == 1) {
    saved.sum_exp = Tensor::empty({n}, stat, dev);
    ops.cross_entropy_fwd(loss, saved.max, saved.sum_exp, logits, targets);
    return loss;
  }
  // A target outside the vocabulary would match no shard and silently give loss = logsumexp:
  // refuse it (one host copy of the ids, as the serial op's own check).
  if (vocab_end_of_all < 0) vocab_end_of_all = vl * tp.size();
  const int64_t v = vocab_end_of_all;
  const std::vector<int64_t> t = host_read<int64_t>(targets, HostSync::vocab_targets);
  for (std::size_t i = 0; i < t.size(); ++i)
    MG_CHECK(t[i] >= 0 && t[i] < v, "vocab_parallel_cross_entropy: target "
                                        << t[i] << " at row " << i << " outside [0, " << v
                                        << ") (padded vocab)");
  // sum_exp and target_logit in one buffer: one all-reduce for both.
  Tensor stats = Tensor::empty({2 * n}, stat, dev);
  saved.sum_exp = stats.slice(0, n);
  Tensor target_logit = stats.slice(n, n);
  Tensor max = saved.max;
  if (vl == 0) {  // a shard of padding only (the caller dropped its padded rows): no terms
    ops.fill(max, -std::numeric_limits<double>::infinity());
    tp.all_reduce(max, comm::ReduceOp::max)->wait();
    ops.fill(stats, 0.0);
  } else {
    ops.ce_local_max(max, logits);
    tp.all_reduce(max, comm::ReduceOp::max)->wait();
    ops.ce_local_stats(saved.sum_exp, target_logit, logits, saved.max, targets, vocab_start);
  }
  all_reduce_(stats, tp);
  ops.ce_combine(loss, saved.max, saved.sum_exp, target_logit);
  return loss;
}

void vocab_parallel_cross_entropy_bwd(const ops::OpTable& ops, Tensor& dlogits, const Tensor& dloss,
                                      const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_start, const CrossEntropySaved& saved) {
  if (logits.numel() == 0) return;
  ops.cross_entropy_bwd(dlogits, dloss, logits, saved.max, saved.sum_exp, targets, vocab_start);
}

}  // namespace mg::tensor_parallel
