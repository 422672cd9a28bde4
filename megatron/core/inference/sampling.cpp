// Greedy / temperature / top-k / top-p sampling (sampling.h).
#include "megatron/core/inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "megatron/core/common/error.h"

namespace mg::inference {

void SamplingParams::validate() const {
  MG_CHECK(std::isfinite(temperature) && temperature > 0.0,
           "--temperature " << temperature << " must be > 0 (use --greedy for argmax)");
  MG_CHECK(top_k >= 0, "--top-k " << top_k << " must be >= 0 (0: no limit)");
  MG_CHECK(top_p >= 0.0 && top_p <= 1.0, "--top-p " << top_p << " must be in [0, 1] (0: no limit)");
}

namespace {

int64_t argmax(std::span<const float> logits) {
  MG_CHECK(!logits.empty(), "sampling: empty logits");
  int64_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<std::size_t>(best)]) best = static_cast<int64_t>(i);
  return best;
}

}  // namespace

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  p.validate();
  const std::size_t v = logits.size();
  std::vector<double> prob(v, 0.0);
  for (std::size_t i = 0; i < v; ++i)
    MG_CHECK(!std::isnan(logits[i]), "sampling: logit " << i << " is NaN");
  if (p.greedy || p.top_k == 1) {
    prob[static_cast<std::size_t>(argmax(logits))] = 1.0;
    return prob;
  }
  // Ids by logit, descending (stable: lower id first on ties).
  std::vector<int64_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  std::size_t keep = v;
  if (p.top_k > 0) keep = std::min<std::size_t>(keep, static_cast<std::size_t>(p.top_k));
  // Softmax of logit / T over the top-k.
  const double top =
      static_cast<double>(logits[static_cast<std::size_t>(order[0])]) / p.temperature;
  std::vector<double> e(keep);
  double sum = 0.0;
  for (std::size_t r = 0; r < keep; ++r) {
    e[r] = std::exp(
        static_cast<double>(logits[static_cast<std::size_t>(order[r])]) / p.temperature - top);
    sum += e[r];
  }
  if (p.top_p > 0.0) {
    double before = 0.0;
    std::size_t r = 0;
    for (; r < keep; ++r) {
      if (r > 0 && before > p.top_p) break;  // the mass before this token already exceeds top_p
      before += e[r] / sum;
    }
    keep = r;
    sum = 0.0;
    for (std::size_t i = 0; i < keep; ++i) sum += e[i];
  }
  for (std::size_t r = 0; r < keep; ++r) prob[static_cast<std::size_t>(order[r])] = e[r] / sum;
  return prob;
}

Sampler::Sampler(const SamplingParams& params) : p_(params), gen_(params.seed) {
  p_.validate();
}

double Sampler::uniform() {
  return static_cast<double>(gen_() >> 11) * 0x1.0p-53;
}

int64_t Sampler::sample(std::span<const float> logits) {
  if (p_.greedy || p_.top_k == 1) return argmax(logits);
  const std::vector<double> prob = sampling_distribution(logits, p_);
  const double u = uniform();
  double c = 0.0;
  int64_t last = -1;
  for (std::size_t i = 0; i < prob.size(); ++i) {
    if (prob[i] == 0.0) continue;
    c += prob[i];
    last = static_cast<int64_t>(i);
    if (u < c) return last;
  }
  return last;  // u beyond the rounded total: the last kept id
}

}  // namespace mg::inference
