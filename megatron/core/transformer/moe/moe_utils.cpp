// MoE routing math on the host (moe_utils.h).
#include "megatron/core/transformer/moe/moe_utils.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"
#include "megatron/core/transformer/moe/router_math.h"

namespace mg::transformer::moe {

namespace {

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// softmax of row[0..n) into out.
void softmax_row(const double* row, int64_t n, double* out) {
  double mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, row[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (out[i] = std::exp(row[i] - mx));
  for (int64_t i = 0; i < n; ++i) out[i] /= sum;
}

// log(sum_i exp(row[i])) as max + log(sum exp(row - max)).
double logsumexp_row(const double* row, int64_t n) {
  double mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, row[i]);
  double se = 0.0;
  for (int64_t i = 0; i < n; ++i) se += std::exp(row[i] - mx);
  return mx + std::log(se);
}

void check_sizes(const std::vector<double>& v, int64_t t, int64_t e, const char* what) {
  MG_CHECK(static_cast<int64_t>(v.size()) == t * e,
           what << ": " << v.size() << " values, expected [" << t << ", " << e << "]");
}

}  // namespace

RouterOptions RouterOptions::from_op_args(const ops::MoeRouterArgs& a, int64_t num_experts) {
  RouterOptions o;
  o.num_experts = num_experts;
  o.topk = a.topk;
  o.score_function = a.score == ops::MoeRouterScore::softmax
                         ? transformer::MoeScoreFunction::softmax
                         : transformer::MoeScoreFunction::sigmoid;
  o.pre_softmax = a.pre_softmax;
  o.capacity_factor = a.capacity_factor;
  o.drop_policy = a.drop_policy == ops::MoeDropPolicy::probs
                      ? transformer::MoeTokenDropPolicy::probs
                      : transformer::MoeTokenDropPolicy::position;
  o.num_groups = a.group_topk > 0 ? a.num_groups : 0;
  o.group_topk = a.group_topk;
  o.scaling_factor = a.scaling_factor;
  return o;
}

RouterOptions RouterOptions::from_config(const TransformerConfig& c) {
  RouterOptions o;
  o.num_experts = c.num_moe_experts;
  o.topk = c.moe_router_topk;
  o.score_function = c.moe_router_score_function;
  o.pre_softmax = c.moe_router_pre_softmax;
  o.capacity_factor = c.moe_expert_capacity_factor;
  o.drop_policy = c.moe_token_drop_policy;
  o.num_groups = c.moe_router_group_topk > 0 ? c.moe_router_num_groups : 0;
  o.group_topk = c.moe_router_group_topk;
  o.scaling_factor = c.moe_router_topk_scaling_factor;
  return o;
}

namespace {

// Descending by value, ties to the lower index.
struct ByValueDesc {
  const double* v;
  bool operator()(int64_t a, int64_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// Megatron's group_limited_topk over one token's selection values v [E]: the k chosen experts
// (descending v) within the g best groups (group score: the sum of its k / g largest v).
void group_limited_topk(const double* v, int64_t E, int64_t K, int64_t G, int64_t g, int64_t* out,
                        std::vector<int64_t>& order, std::vector<double>& gscore,
                        std::vector<int64_t>& gorder) {
  const int64_t per = E / G, take = K / g;
  for (int64_t grp = 0; grp < G; ++grp) {
    int64_t* first = order.data() + grp * per;
    std::iota(first, first + per, grp * per);
    std::partial_sort(first, first + take, first + per, ByValueDesc{v});
    double sum = 0.0;
    for (int64_t j = 0; j < take; ++j) sum += v[first[j]];
    gscore[static_cast<std::size_t>(grp)] = sum;
  }
  std::iota(gorder.begin(), gorder.end(), 0);
  std::partial_sort(gorder.begin(), gorder.begin() + g, gorder.end(), ByValueDesc{gscore.data()});
  // Candidates: the experts of the chosen groups, ascending, so ties go to the lower expert.
  std::sort(gorder.begin(), gorder.begin() + g);
  std::vector<int64_t> cand;
  cand.reserve(static_cast<std::size_t>(g * per));
  for (int64_t j = 0; j < g; ++j)
    for (int64_t e = 0; e < per; ++e) cand.push_back(gorder[static_cast<std::size_t>(j)] * per + e);
  std::partial_sort(cand.begin(), cand.begin() + K, cand.end(), ByValueDesc{v});
  std::copy_n(cand.begin(), K, out);
}

}  // namespace

Routing topk_routing(const std::vector<double>& logits, int64_t T, const RouterOptions& o,
                     const std::vector<float>* expert_bias) {
  const int64_t E = o.num_experts, K = o.topk, G = o.num_groups, g = o.group_topk;
  MG_CHECK(E >= 1 && K >= 1 && K <= E, "topk_routing: topk " << K << " of " << E << " experts");
  check_sizes(logits, T, E, "topk_routing logits");
  const bool grouped = g > 0;
  if (grouped)
    MG_CHECK(G >= 1 && E % G == 0 && g <= G && K % g == 0 && K / g <= E / G,
             "topk_routing: group-limited routing of topk "
                 << K << " over " << G << " groups (" << g << " chosen) of " << E << " experts");
  if (expert_bias) {
    MG_CHECK(static_cast<int64_t>(expert_bias->size()) == E,
             "topk_routing: expert bias has " << expert_bias->size() << " entries for " << E
                                              << " experts");
    MG_CHECK(o.score_function == MoeScoreFunction::sigmoid,
             "topk_routing: an expert bias needs sigmoid scores");
  }
  // Selection values other than the logits: groups or an expert bias.
  const bool by_value = grouped || expert_bias;
  const bool on_logits = o.score_function == MoeScoreFunction::softmax && !o.pre_softmax;
  std::vector<double> v(by_value ? static_cast<std::size_t>(E) : 0);
  std::vector<double> gscore(static_cast<std::size_t>(std::max<int64_t>(G, 0)));
  std::vector<int64_t> gorder(gscore.size());
  Routing r;
  r.num_tokens = T;
  r.num_experts = E;
  r.topk = K;
  r.expert.resize(static_cast<std::size_t>(T * K));
  r.prob.resize(static_cast<std::size_t>(T * K));
  r.kept.assign(static_cast<std::size_t>(T * K), 1);
  r.scores.resize(static_cast<std::size_t>(T * E));
  r.tokens_per_expert.assign(static_cast<std::size_t>(E), 0.0);
  std::vector<int64_t> order(static_cast<std::size_t>(E));
  std::vector<double> sel(static_cast<std::size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    double* s = r.scores.data() + t * E;
    if (o.score_function == MoeScoreFunction::softmax)
      softmax_row(l, E, s);
    else
      for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(l[e]);
    int64_t* ex = r.expert.data() + t * K;
    double* p = r.prob.data() + t * K;
    if (!by_value) {
      // Top-k by logit (softmax and sigmoid are monotonic): descending, ties to the lower expert.
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [l](int64_t a, int64_t b) {
        return l[a] > l[b] || (l[a] == l[b] && a < b);
      });
      std::copy_n(order.begin(), K, ex);
    } else {
      for (int64_t e = 0; e < E; ++e)
        v[e] =
            (on_logits ? l[e] : s[e]) +
            (expert_bias ? static_cast<double>((*expert_bias)[static_cast<std::size_t>(e)]) : 0.0);
      if (grouped) {
        group_limited_topk(v.data(), E, K, G, g, ex, order, gscore, gorder);
      } else {
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + K, order.end(), ByValueDesc{v.data()});
        std::copy_n(order.begin(), K, ex);
      }
    }
    for (int64_t k = 0; k < K; ++k) r.tokens_per_expert[static_cast<std::size_t>(ex[k])] += 1.0;
    if (o.score_function == MoeScoreFunction::softmax) {
      if (o.pre_softmax) {
        for (int64_t k = 0; k < K; ++k) p[k] = s[ex[k]];
      } else {
        for (int64_t k = 0; k < K; ++k) sel[k] = l[ex[k]];
        softmax_row(sel.data(), K, p);
      }
    } else {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) sum += (p[k] = s[ex[k]]);
      if (K > 1)
        for (int64_t k = 0; k < K; ++k) p[k] /= sum + kSigmoidNormEps;
    }
    if (o.scaling_factor)
      for (int64_t k = 0; k < K; ++k) p[k] *= *o.scaling_factor;
  }
  if (o.capacity_factor) {
    r.capacity = static_cast<int64_t>(
        std::ceil(static_cast<double>(T * K) / static_cast<double>(E) * *o.capacity_factor));
    std::vector<std::vector<int64_t>> chosen(static_cast<std::size_t>(E));  // entries t*K+k
    for (int64_t i = 0; i < T * K; ++i) chosen[static_cast<std::size_t>(r.expert[i])].push_back(i);
    for (auto& list : chosen) {
      if (static_cast<int64_t>(list.size()) <= r.capacity) continue;
      if (o.drop_policy == MoeTokenDropPolicy::probs)
        std::stable_sort(list.begin(), list.end(),
                         [&r](int64_t a, int64_t b) { return r.prob[a] > r.prob[b]; });
      for (std::size_t j = static_cast<std::size_t>(r.capacity); j < list.size(); ++j)
        r.kept[static_cast<std::size_t>(list[j])] = 0;
    }
  }
  return r;
}

void topk_routing_backward(const Routing& r, const std::vector<double>& logits,
                           const std::vector<double>& dprob, const RouterOptions& o,
                           std::vector<double>& dlogits) {
  const int64_t T = r.num_tokens, E = r.num_experts, K = r.topk;
  check_sizes(dprob, T, K, "topk_routing_backward dprob");
  check_sizes(dlogits, T, E, "topk_routing_backward dlogits");
  std::vector<double> g(static_cast<std::size_t>(K));
  std::vector<double> sel(static_cast<std::size_t>(K)), unscaled(static_cast<std::size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t* ex = r.expert.data() + t * K;
    const double* p = r.prob.data() + t * K;
    const double* s = r.scores.data() + t * E;
    double* dl = dlogits.data() + t * E;
    bool any = false;
    for (int64_t k = 0; k < K; ++k) {
      g[k] = r.kept[t * K + k] ? dprob[t * K + k] : 0.0;
      if (o.scaling_factor) g[k] *= *o.scaling_factor;
      any |= g[k] != 0.0;
    }
    if (!any) continue;
    if (o.scaling_factor && o.score_function == MoeScoreFunction::softmax && !o.pre_softmax) {
      // The unscaled softmax over the chosen logits, recomputed as forward computed it.
      for (int64_t k = 0; k < K; ++k) sel[k] = logits[t * E + ex[k]];
      softmax_row(sel.data(), K, unscaled.data());
      p = unscaled.data();
    }
    router_topk_token_backward(ex, p, g.data(), s, K, E,
                               o.score_function == MoeScoreFunction::sigmoid, o.pre_softmax, dl);
  }
}

std::vector<double> aux_loss_scores(const std::vector<double>& logits, int64_t T, int64_t E,
                                    MoeScoreFunction f) {
  check_sizes(logits, T, E, "aux_loss_scores logits");
  std::vector<double> out(logits.size());
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    double* s = out.data() + t * E;
    if (f == MoeScoreFunction::softmax) {
      softmax_row(l, E, s);
    } else {
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = sigmoid(l[e]));
      for (int64_t e = 0; e < E; ++e) s[e] /= sum + kSigmoidNormEps;
    }
  }
  return out;
}

void aux_loss_scores_backward(const std::vector<double>& logits, const std::vector<double>& scores,
                              const std::vector<double>& dscores, int64_t T, int64_t E,
                              MoeScoreFunction f, std::vector<double>& dlogits) {
  check_sizes(dscores, T, E, "aux_loss_scores_backward dscores");
  check_sizes(dlogits, T, E, "aux_loss_scores_backward dlogits");
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    const double* s = scores.data() + t * E;
    const double* d = dscores.data() + t * E;
    double* dl = dlogits.data() + t * E;
    if (f == MoeScoreFunction::softmax) {
      double dot = 0.0;
      for (int64_t e = 0; e < E; ++e) dot += s[e] * d[e];
      for (int64_t e = 0; e < E; ++e) dl[e] += s[e] * (d[e] - dot);
    } else {
      double sum = 0.0, gs = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        const double q = sigmoid(l[e]);
        sum += q;
        gs += d[e] * q;
      }
      const double den = sum + kSigmoidNormEps;
      for (int64_t e = 0; e < E; ++e) {
        const double q = sigmoid(l[e]);
        dl[e] += (d[e] / den - gs / (den * den)) * q * (1.0 - q);
      }
    }
  }
}

double switch_load_balancing_loss_from_sums(const std::vector<double>& sums, int64_t T, int64_t E,
                                            const std::vector<double>& tokens_per_expert,
                                            int64_t topk, int64_t num_sub_sequence, double coeff,
                                            std::vector<double>* drow) {
  MG_CHECK(
      static_cast<int64_t>(sums.size()) == E && static_cast<int64_t>(tokens_per_expert.size()) == E,
      "switch_load_balancing_loss: " << sums.size() << " score sums and "
                                     << tokens_per_expert.size()
                                     << " tokens_per_expert entries for " << E << " experts");
  if (drow) drow->assign(static_cast<std::size_t>(E), 0.0);
  const double n = static_cast<double>(T * num_sub_sequence);
  if (n == 0.0) return 0.0;
  const double factor = static_cast<double>(E) * coeff / (static_cast<double>(topk) * n * n);
  double loss = 0.0;
  for (int64_t e = 0; e < E; ++e) loss += sums[e] * tokens_per_expert[e];
  if (drow)
    for (int64_t e = 0; e < E; ++e) (*drow)[e] = factor * tokens_per_expert[e];
  return loss * factor;
}

double switch_load_balancing_loss(const std::vector<double>& scores, int64_t T, int64_t E,
                                  const std::vector<double>& tokens_per_expert, int64_t topk,
                                  int64_t num_sub_sequence, double coeff,
                                  std::vector<double>* dscores) {
  check_sizes(scores, T, E, "switch_load_balancing_loss scores");
  std::vector<double> sums(static_cast<std::size_t>(E), 0.0), drow;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t = 0; t < T; ++t) sums[e] += scores[t * E + e];
  const double loss = switch_load_balancing_loss_from_sums(
      sums, T, E, tokens_per_expert, topk, num_sub_sequence, coeff, dscores ? &drow : nullptr);
  if (dscores && T * num_sub_sequence != 0)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) (*dscores)[t * E + e] += drow[e];
  return loss;
}

double sequence_load_balancing_loss_from_sums(const std::vector<double>& sums, int64_t S, int64_t B,
                                              int64_t E, const std::vector<double>& counts,
                                              int64_t topk, int64_t num_sub_sequence, double coeff,
                                              std::vector<double>* drows) {
  check_sizes(sums, B, E, "sequence_load_balancing_loss sums");
  check_sizes(counts, B, E, "sequence_load_balancing_loss counts");
  if (drows) drows->assign(static_cast<std::size_t>(B * E), 0.0);
  const double s_full = static_cast<double>(S * num_sub_sequence);
  if (s_full == 0.0 || B == 0) return 0.0;
  double loss = 0.0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < E; ++e) {
      const double w = coeff / static_cast<double>(B) * counts[b * E + e] * static_cast<double>(E) /
                       (s_full * static_cast<double>(topk)) / s_full;
      loss += w * sums[b * E + e];
      if (drows) (*drows)[b * E + e] = w;
    }
  return loss;
}

double sequence_load_balancing_loss(const std::vector<double>& scores, int64_t S, int64_t B,
                                    int64_t E, const std::vector<double>& counts, int64_t topk,
                                    int64_t num_sub_sequence, double coeff,
                                    std::vector<double>* dscores) {
  check_sizes(scores, S * B, E, "sequence_load_balancing_loss scores");
  std::vector<double> sums(static_cast<std::size_t>(B * E), 0.0), drows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t s = 0; s < S; ++s) sums[b * E + e] += scores[(s * B + b) * E + e];
  const double loss = sequence_load_balancing_loss_from_sums(
      sums, S, B, E, counts, topk, num_sub_sequence, coeff, dscores ? &drows : nullptr);
  if (dscores && S * num_sub_sequence != 0 && B != 0)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < E; ++e)
        for (int64_t s = 0; s < S; ++s) (*dscores)[(s * B + b) * E + e] += drows[b * E + e];
  return loss;
}

double z_loss(const std::vector<double>& logits, int64_t T, int64_t E, double coeff, double scale,
              std::vector<double>* dlogits) {
  check_sizes(logits, T, E, "z_loss logits");
  if (T == 0) return 0.0;
  double sum = 0.0;
  std::vector<double> sm(static_cast<std::size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    const double lse = logsumexp_row(l, E);
    sum += lse * lse;
    if (dlogits) {
      softmax_row(l, E, sm.data());
      const double g = scale * coeff * 2.0 * lse / static_cast<double>(T);
      for (int64_t e = 0; e < E; ++e) (*dlogits)[t * E + e] += g * sm[e];
    }
  }
  return coeff * sum / static_cast<double>(T);
}

double z_loss_sum(const std::vector<double>& logits, int64_t T, int64_t E) {
  check_sizes(logits, T, E, "z_loss logits");
  double sum = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const double lse = logsumexp_row(logits.data() + t * E, E);
    sum += lse * lse;
  }
  return sum;
}

void update_expert_bias(std::vector<float>& bias, const std::vector<double>& tokens, double rate) {
  MG_CHECK(bias.size() == tokens.size(),
           "update_expert_bias: " << bias.size() << " biases for " << tokens.size() << " counts");
  if (bias.empty()) return;
  // f32 as Megatron's buffers: the mean of the counts, then bias + sign(mean - count) * rate.
  float sum = 0.0f;
  for (double c : tokens) sum += static_cast<float>(c);
  const float mean = sum / static_cast<float>(tokens.size());
  const auto step = static_cast<float>(rate);
  for (std::size_t e = 0; e < bias.size(); ++e) {
    const float off = mean - static_cast<float>(tokens[e]);
    const float sign = off > 0.0f ? 1.0f : (off < 0.0f ? -1.0f : 0.0f);
    bias[e] = bias[e] + sign * step;
  }
}

void MoEState::update_expert_biases(comm::ProcessGroup* group, double rate) {
  if (expert_bias.empty()) return;
  std::vector<double> all;
  for (const auto& [layer, st] : expert_bias)
    all.insert(all.end(), st.local_tokens_per_expert.begin(), st.local_tokens_per_expert.end());
  if (group && group->size() > 1) {
    Tensor t = Tensor::from_vector(all, {static_cast<int64_t>(all.size())}, DType::f64);
    group->all_reduce(t, comm::ReduceOp::sum)->wait();
    all = t.to_vector<double>();
  }
  std::size_t off = 0;
  for (auto& [layer, st] : expert_bias) {
    const std::size_t n = st.local_tokens_per_expert.size();
    const std::vector<double> tokens(all.begin() + static_cast<std::ptrdiff_t>(off),
                                     all.begin() + static_cast<std::ptrdiff_t>(off + n));
    update_expert_bias(st.expert_bias, tokens, rate);
    std::fill(st.local_tokens_per_expert.begin(), st.local_tokens_per_expert.end(), 0.0);
    off += n;
  }
}

static std::string expert_bias_name(int64_t layer) {
  return "decoder.layers." + std::to_string(layer) + ".mlp.router.expert_bias";
}

std::map<std::string, std::vector<float>> MoEState::expert_bias_state() const {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [layer, st] : expert_bias) out[expert_bias_name(layer)] = st.expert_bias;
  return out;
}

int64_t MoEState::load_expert_bias_state(const std::map<std::string, std::vector<float>>& state) {
  int64_t n = 0;
  for (auto& [layer, st] : expert_bias) {
    const auto it = state.find(expert_bias_name(layer));
    if (it == state.end()) continue;
    MG_CHECK(it->second.size() == st.expert_bias.size(),
             it->first << ": " << it->second.size() << " values in the checkpoint, the model has "
                       << st.expert_bias.size() << " experts");
    st.expert_bias = it->second;
    ++n;
  }
  return n;
}

void MoEMetricsTracker::add(int64_t layer, double lb_loss, double z,
                            const std::vector<double>& tokens) {
  resolve();
  accumulate(layer, lb_loss, z, tokens);
}

Tensor MoEMetricsTracker::device_slot(int64_t n, Device device) {
  constexpr int64_t kChunk = 4096;  // values per shared buffer (32 KiB)
  if (chunks_.empty() || chunks_.back().device() != device ||
      chunk_used_ + n > chunks_.back().numel()) {
    chunks_.push_back(Tensor::zeros({std::max(kChunk, n)}, DType::f64, device));
    chunk_used_ = 0;
  }
  Tensor slot = chunks_.back().slice(chunk_used_, n);
  chunk_used_ += n;
  return slot;
}

void MoEMetricsTracker::add_pending(
    int64_t layer, std::vector<double> tokens, const Tensor& slot,
    std::function<std::pair<double, double>(std::span<const double>)> losses) {
  Pending p{layer, std::move(tokens), chunks_.size(), 0, slot.numel(), Tensor(), std::move(losses)};
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    if (slot.shares_storage_with(chunks_[c])) {
      p.chunk = c;
      p.offset =
          static_cast<int64_t>((slot.offset_bytes() - chunks_[c].offset_bytes()) / sizeof(double));
    }
  if (p.chunk == chunks_.size()) p.own = slot;  // its buffer was resolved before: read alone
  pending_.push_back(std::move(p));
}

void MoEMetricsTracker::resolve() {
  if (pending_.empty()) return;
  // Every buffer with a pending value read once.
  std::vector<std::vector<double>> host(chunks_.size());
  for (const Pending& p : pending_)
    if (p.chunk < chunks_.size() && host[p.chunk].empty())
      host[p.chunk] = host_read<double>(chunks_[p.chunk], HostSync::moe);
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  chunks_.clear();
  chunk_used_ = 0;
  for (const Pending& p : pending) {
    std::vector<double> own;
    if (p.own.defined()) own = host_read<double>(p.own, HostSync::moe);
    const double* v = p.own.defined() ? own.data() : host[p.chunk].data() + p.offset;
    const auto [lb_loss, z] = p.losses(std::span<const double>(v, static_cast<std::size_t>(p.n)));
    accumulate(p.layer, lb_loss, z, p.tokens);
  }
}

void MoEMetricsTracker::accumulate(int64_t layer, double lb_loss, double z,
                                   const std::vector<double>& tokens) {
  MoELayerMetrics& m = layers_[layer];
  m.load_balancing_loss += lb_loss;
  m.z_loss += z;
  if (m.tokens_per_expert.size() < tokens.size()) m.tokens_per_expert.resize(tokens.size(), 0.0);
  for (std::size_t e = 0; e < tokens.size(); ++e) m.tokens_per_expert[e] += tokens[e];
  ++m.microbatches;
}

MoELogLines moe_metrics_log(MoEMetricsTracker& tracker, comm::ProcessGroup* world,
                            const TransformerConfig& c, int64_t seq_partition, int64_t iterations,
                            bool per_layer) {
  MoELogLines out;
  const int64_t L = c.num_layers, E = c.num_moe_experts, w = 3 + E;
  if (E <= 0) return out;
  std::vector<double> v(static_cast<std::size_t>(L * w), 0.0);
  for (const auto& [layer, m] : tracker.layers()) {
    if (layer < 0 || layer >= L) continue;
    v[layer * w] = m.load_balancing_loss;
    v[layer * w + 1] = m.z_loss;
    v[layer * w + 2] = static_cast<double>(m.microbatches);
    for (std::size_t e = 0; e < m.tokens_per_expert.size() && e < static_cast<std::size_t>(E); ++e)
      v[layer * w + 3 + e] = m.tokens_per_expert[e];
  }
  tracker.clear();
  if (world && world->size() > 1) {
    Tensor t = Tensor::from_vector(v, {L * w}, DType::f64);
    world->all_reduce(t, comm::ReduceOp::sum)->wait();
    v = t.to_vector<double>();
  }
  auto sci = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6E", x);
    return std::string(buf);
  };
  const bool lb = c.moe_router_load_balancing_type != MoeLoadBalancingType::none;
  const bool z = c.moe_z_loss_coeff > 0.0;
  double lb_sum = 0.0, z_sum = 0.0;
  int64_t n = 0;
  std::ostringstream lines;
  for (int64_t l = 0; l < L; ++l) {
    // Each rank holding the layer recorded its micro-batches: count = replicas * partition * mbs.
    const double count = v[l * w + 2];
    if (!c.is_moe_layer(l) || count <= 0.0) continue;
    const double per = count / static_cast<double>(seq_partition);
    const double lbv = v[l * w] / per, zv = v[l * w + 1] / per;
    lb_sum += lbv;
    z_sum += zv;
    ++n;
    if (!per_layer) continue;
    if (lb) out.scalars.emplace_back("moe/load_balancing_loss_layer_" + std::to_string(l), lbv);
    if (z) out.scalars.emplace_back("moe/z_loss_layer_" + std::to_string(l), zv);
    lines << " moe layer " << l << " |";
    if (lb) lines << " load_balancing_loss: " << sci(lbv) << " |";
    if (z) lines << " z_loss: " << sci(zv) << " |";
    lines << " tokens per expert:";
    for (int64_t e = 0; e < E; ++e) {
      const double tok = v[l * w + 3 + e] / static_cast<double>(std::max<int64_t>(iterations, 1));
      lines << (e == 0 ? " [" : " ") << static_cast<int64_t>(std::llround(tok));
    }
    lines << "] |\n";
  }
  if (n == 0) return out;
  std::ostringstream in;
  if (lb) in << " load_balancing_loss: " << sci(lb_sum / static_cast<double>(n)) << " |";
  if (z) in << " z_loss: " << sci(z_sum / static_cast<double>(n)) << " |";
  out.inline_part = in.str();
  out.layer_lines = lines.str();
  if (lb)
    out.scalars.emplace(out.scalars.begin(), "load_balancing_loss",
                        lb_sum / static_cast<double>(n));
  if (z)
    out.scalars.emplace(out.scalars.begin() + (lb ? 1 : 0), "z_loss",
                        z_sum / static_cast<double>(n));
  return out;
}

}  // namespace mg::transformer::moe
