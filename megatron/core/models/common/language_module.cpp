// resolve_loss_sums (language_module.h).
#include "megatron/core/models/common/language_module.h"

#include "megatron/core/common/host_sync.h"

namespace mg::models {

void resolve_loss_sums(std::span<LossSums* const> sums) {
  std::vector<LossSums*> todo;
  int64_t total = 0;
  for (LossSums* s : sums)
    if (s && s->pending) {
      todo.push_back(s);
      total += s->pending->loss.numel();
    }
  if (todo.empty()) return;
  // The micro-batches' losses side by side on their device, then one read.
  const Tensor& first = todo.front()->pending->loss;
  Tensor all = first.view({first.numel()});
  if (todo.size() > 1) {
    all = Tensor::empty({total}, first.dtype(), first.device());
    int64_t off = 0;
    for (LossSums* s : todo) {
      const Tensor& l = s->pending->loss;
      MG_CHECK(l.dtype() == first.dtype() && l.device() == first.device(),
               "resolve_loss_sums: the pending losses differ in dtype or device ("
                   << l.str() << " and " << first.str() << ")");
      all.slice(off, l.numel()).copy_(l.view({l.numel()}));
      off += l.numel();
    }
  }
  const std::vector<double> loss = host_read<double>(all, HostSync::loss);
  std::size_t off = 0;
  for (LossSums* s : todo) {
    const PendingLoss& p = *s->pending;
    MG_CHECK(p.mask.size() == static_cast<std::size_t>(p.loss.numel()),
             "resolve_loss_sums: " << p.mask.size() << " mask weights for " << p.loss.numel()
                                   << " token losses");
    double sum = 0.0;
    for (std::size_t i = 0; i < p.mask.size(); ++i) {
      if (p.mask[i] == 0.0) continue;  // a masked NaN loss must not poison the sum
      sum += loss[off + i] * p.mask[i];
    }
    s->loss_sum = sum;
    off += p.mask.size();
    s->pending.reset();
  }
}

}  // namespace mg::models
