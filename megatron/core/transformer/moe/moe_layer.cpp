// MoELayer forward/backward: router, dispatchers, SequentialMLP experts, shared experts
// (moe_layer.h). Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/transformer/moe/moe_layer.h"

#include <cmath>
#include <numeric>

#include "megatron/core/common/error.h"
#include "megatron/core/common/host_sync.h"

namespace mg::transformer::moe {

namespace {

Tensor device_tensor(const ModuleContext& ctx, const std::vector<double>& v, const Shape& shape,
                     DType dtype) {
  return Tensor::from_vector(v, shape, dtype).to(ctx.device);
}

Tensor index_tensor(const ModuleContext& ctx, const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::i64).to(ctx.device);
}

// rows [R, H] = x[index] on the device, index [R] i64 (moe_permute: an exact copy).
Tensor gather_rows(const ModuleContext& ctx, const Tensor& x, const Tensor& index) {
  Tensor rows = Tensor::empty({index.size(0), x.size(1)}, x.dtype(), ctx.device);
  ctx.op().moe_permute(rows, x, index);
  return rows;
}

// all_to_all_v of rows [*, h] on the device: send_counts[j] rows to member j, recv_counts[j]
// rows from it.
Tensor exchange_rows(const ModuleContext& ctx, comm::ProcessGroup& g, const Tensor& rows,
                     const std::vector<int64_t>& send_counts,
                     const std::vector<int64_t>& recv_counts) {
  const int64_t h = rows.size(1);
  const int64_t n_out = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  std::vector<int64_t> sc, rc;
  for (int64_t c : send_counts) sc.push_back(c * h);
  for (int64_t c : recv_counts) rc.push_back(c * h);
  Tensor out = Tensor::empty({n_out, h}, rows.dtype(), ctx.device);
  Tensor in = rows.view({rows.numel()});
  Tensor flat = out.view({out.numel()});
  g.all_to_all_v(flat, in, sc, rc)->wait();
  return out;
}

}  // namespace

MoELayer::MoELayer(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix,
                   int64_t layer_number, const MlpSubmodules& shared_experts)
    : ctx_(ctx), layer_(layer_number) {
  const TransformerConfig& c = *ctx.config;
  MG_CHECK(c.num_moe_experts >= 1,
           prefix << ": the spec names an MoE layer, but num_moe_experts is " << c.num_moe_experts);
  MG_CHECK(ctx.moe != nullptr,
           prefix << ": an MoE layer needs its model's MoE state (ModuleContext::moe)");
  h_ = c.hidden_size;
  e_ = c.num_moe_experts;
  k_ = c.moe_router_topk;
  f_ = c.expert_ffn_hidden_size();
  router_ = RouterOptions::from_config(c);
  router_args_.topk = router_.topk;
  router_args_.score = router_.score_function == MoeScoreFunction::softmax
                           ? ops::MoeRouterScore::softmax
                           : ops::MoeRouterScore::sigmoid;
  router_args_.pre_softmax = router_.pre_softmax;
  router_args_.num_groups = router_.num_groups;
  router_args_.group_topk = router_.group_topk;
  router_args_.scaling_factor = router_.scaling_factor;
  router_args_.capacity_factor = router_.capacity_factor;
  router_args_.drop_policy = router_.drop_policy == MoeTokenDropPolicy::probs
                                 ? ops::MoeDropPolicy::probs
                                 : ops::MoeDropPolicy::position;
  const int64_t ep = ep_size();
  MG_CHECK(e_ % ep == 0, "--num-experts " << e_ << " must be divisible by "
                                          << "--expert-model-parallel-size " << ep);
  MG_CHECK(ctx.tp_size() == 1 || ctx.sequence_parallel || ctx.inference_only,
           "MoE with tensor parallelism needs --sequence-parallel (Megatron's rule)");
  MG_CHECK(!(ctx.sequence_parallel && ctx.tp_size() > 1 && ctx.cp.active()) || ctx.tp_cp_group,
           "MoE with sequence parallelism and context parallelism needs the tp-cp group "
           "(GPTModelParallel::tp_cp_group)");
  local_ = e_ / ep;
  first_ = (ctx.ep_group ? ctx.ep_group->rank() : 0) * local_;
  // The router sees this rank's sequence shard under SP: its grad is summed over TP.
  pb.add(router_w_, prefix + "router.weight", {e_, h_}, InitRule::normal,
         tensor_parallel::Partition{}, ctx.sequence_parallel && ctx.tp_size() > 1);
  // Expert TP: fc1 column-parallel (a gated fc1 as the dense MLP's, [gate_r; up_r], stride 2), its
  // bias with it; fc2 row-parallel, its bias replicated (added once, after the reduction).
  const int64_t etp = ctx.etp_size();
  MG_CHECK(f_ % etp == 0, prefix << "experts: the experts' hidden size " << f_
                                 << " must be divisible by --expert-tensor-parallel-size " << etp);
  f_local_ = f_ / etp;
  const int stride = c.gated_linear_unit() ? 2 : 1;
  const int64_t fc1_rows = stride * f_;
  using tensor_parallel::Partition;
  const Partition col = etp > 1 ? Partition{0, stride, ctx.etp_rank(), etp} : Partition{};
  const Partition row = etp > 1 ? Partition{1, 1, ctx.etp_rank(), etp} : Partition{};
  const Partition rep = etp > 1 ? Partition{-1, 1, ctx.etp_rank(), etp} : Partition{};
  experts_.resize(static_cast<std::size_t>(local_));
  for (int64_t i = 0; i < local_; ++i) {
    const std::string p = prefix + "experts.local_experts." + std::to_string(first_ + i) + ".";
    Expert& x = experts_[static_cast<std::size_t>(i)];
    pb.add(x.fc1, p + "linear_fc1.weight", {fc1_rows, h_}, InitRule::normal, col);
    pb.set_expert(x.fc1);
    if (c.add_bias_linear) {
      pb.add(x.fc1_bias, p + "linear_fc1.bias", {fc1_rows}, InitRule::zeros, col);
      pb.set_expert(x.fc1_bias);
    }
    pb.add(x.fc2, p + "linear_fc2.weight", {h_, f_}, InitRule::scaled_normal, row);
    pb.set_expert(x.fc2);
    if (c.add_bias_linear) {
      pb.add(x.fc2_bias, p + "linear_fc2.bias", {h_}, InitRule::zeros, rep);
      pb.set_expert(x.fc2_bias);
    }
  }
  if (c.moe_router_enable_expert_bias) {
    // Megatron's TopKRouter buffers: expert_bias (zeros, f32) and local_tokens_per_expert.
    ExpertBiasState& b = ctx.moe->expert_bias[layer_];
    b.expert_bias.assign(static_cast<std::size_t>(e_), 0.0f);
    b.local_tokens_per_expert.assign(static_cast<std::size_t>(e_), 0.0);
  }
  if (c.moe_shared_expert_intermediate_size > 0)
    shared_ = std::make_unique<MLP>(ctx, pb, prefix + "shared_experts.", shared_experts,
                                    c.moe_shared_expert_intermediate_size);
  if (c.moe_shared_expert_gate)  // sees the SP shard, as the router: grad summed over TP
    pb.add(shared_gate_w_, prefix + "shared_experts.gate_weight", {1, h_}, InitRule::normal,
           tensor_parallel::Partition{}, ctx.sequence_parallel && ctx.tp_size() > 1);
}

Tensor MoELayer::experts_compute(const Tensor& rows, const std::vector<int64_t>& counts,
                                 Saved& s) const {
  const TransformerConfig& c = *ctx_.config;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t fc1_cols = (c.gated_linear_unit() ? 2 : 1) * f_local_;
  Tensor out = ctx_.empty({total, h_});
  Tensor u_all = ctx_.empty({total, fc1_cols}), a_all = ctx_.empty({total, f_local_});
  s.expert_in.assign(static_cast<std::size_t>(local_), Tensor());
  s.fc1_out.assign(static_cast<std::size_t>(local_), Tensor());
  s.act_out.assign(static_cast<std::size_t>(local_), Tensor());
  const ops::GeluApprox gelu =
      c.bias_activation_fusion ? ops::GeluApprox::tanh : ops::GeluApprox::none;
  // The experts with rows: their operand views, for per-expert or grouped GEMMs.
  std::vector<int64_t> idx;
  std::vector<Tensor> in, u, a, z, w1, w2;
  int64_t off = 0;
  for (int64_t i = 0; i < local_; ++i) {
    const int64_t n = counts[static_cast<std::size_t>(i)];
    if (n > 0) {
      const Expert& x = experts_[static_cast<std::size_t>(i)];
      idx.push_back(i);
      in.push_back(rows.slice(off, n));
      u.push_back(u_all.slice(off, n));
      a.push_back(a_all.slice(off, n));
      z.push_back(out.slice(off, n));
      w1.push_back(x.fc1.value);
      w2.push_back(x.fc2.value);
    }
    off += n;
  }
  const ops::GemmArgs fwd{.trans_b = true};  // x W^T, as linear_fwd
  expert_gemms(u, in, w1, fwd);
  for (std::size_t g = 0; g < idx.size(); ++g) {
    const Expert& x = experts_[static_cast<std::size_t>(idx[g])];
    if (x.fc1_bias.defined()) ctx_.op().bias_add(u[g], x.fc1_bias.value);
    activation_fwd(ctx_, c.activation, gelu, a[g], u[g]);
    s.expert_in[static_cast<std::size_t>(idx[g])] = in[g];
    s.fc1_out[static_cast<std::size_t>(idx[g])] = u[g];
    s.act_out[static_cast<std::size_t>(idx[g])] = a[g];
  }
  expert_gemms(z, a, w2, fwd);
  return out;
}

void MoELayer::expert_gemms(std::vector<Tensor>& cs, const std::vector<Tensor>& as,
                            const std::vector<Tensor>& bs, const ops::GemmArgs& args) const {
  if (ctx_.config->moe_grouped_gemm)
    ctx_.op().grouped_gemm(cs, as, bs, args);
  else
    for (std::size_t g = 0; g < cs.size(); ++g) ctx_.op().gemm(cs[g], as[g], bs[g], args);
}

Tensor MoELayer::experts_compute_backward(const Tensor& dz, const std::vector<int64_t>& counts,
                                          Saved& s) {
  const TransformerConfig& c = *ctx_.config;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t fc1_cols = (c.gated_linear_unit() ? 2 : 1) * f_local_;
  Tensor din = ctx_.empty({total, h_});
  Tensor da_all = ctx_.empty({total, f_local_}), du_all = ctx_.empty({total, fc1_cols});
  const ops::GeluApprox gelu =
      c.bias_activation_fusion ? ops::GeluApprox::tanh : ops::GeluApprox::none;
  std::vector<int64_t> idx;
  std::vector<Tensor> dzs, da, du, dx, act, xin, w1, w2, dw1, dw2;
  int64_t off = 0;
  for (int64_t i = 0; i < local_; ++i) {
    const int64_t n = counts[static_cast<std::size_t>(i)];
    if (n > 0) {
      Expert& x = experts_[static_cast<std::size_t>(i)];
      const auto e = static_cast<std::size_t>(i);
      idx.push_back(i);
      dzs.push_back(dz.slice(off, n));
      da.push_back(da_all.slice(off, n));
      du.push_back(du_all.slice(off, n));
      dx.push_back(din.slice(off, n));
      act.push_back(s.act_out[e]);
      xin.push_back(s.expert_in[e]);
      w1.push_back(x.fc1.value);
      w2.push_back(x.fc2.value);
      dw1.push_back(x.fc1.grad);
      dw2.push_back(x.fc2.grad);
    }
    off += n;
  }
  // As linear_bwd: dx = dy W (beta 0), dW += dy^T x.
  const ops::GemmArgs dgrad{}, wgrad{.trans_a = true, .beta = 1.0f};
  expert_gemms(da, dzs, w2, dgrad);
  expert_gemms(dw2, dzs, act, wgrad);
  for (std::size_t g = 0; g < idx.size(); ++g) {
    const auto e = static_cast<std::size_t>(idx[g]);
    activation_bwd(ctx_, c.activation, gelu, du[g], da[g], s.fc1_out[e]);
    Expert& x = experts_[e];
    if (x.fc1_bias.defined()) ctx_.op().bias_grad(x.fc1_bias.grad, du[g]);
  }
  expert_gemms(dx, du, w1, dgrad);
  expert_gemms(dw1, du, xin, wgrad);
  return din;
}

Tensor MoELayer::etp_gather_rows(const Tensor& rows, Saved& s) const {
  comm::ProcessGroup& g = *ctx_.expert_tp_group;
  const int64_t etp = g.size();
  if (!s.etp_order_t.defined()) {
    // The group's rows from [member][local expert] to [local expert][member] order and back
    // (s.etp_counts: read with the dispatch's counts, dispatch_index).
    const Tensor counts =
        Tensor::from_vector(s.etp_counts, {etp, local_}, DType::i64).to(ctx_.device);
    const int64_t all = std::accumulate(s.etp_counts.begin(), s.etp_counts.end(), int64_t{0});
    s.etp_order_t = Tensor::empty({all}, DType::i64, ctx_.device);
    s.etp_inverse_t = Tensor::empty({all}, DType::i64, ctx_.device);
    ctx_.op().moe_chunk_order(s.etp_order_t, s.etp_inverse_t, counts);
  }
  const int64_t mine = std::accumulate(s.local_counts.begin(), s.local_counts.end(), int64_t{0});
  std::vector<int64_t> send(static_cast<std::size_t>(etp), mine),
      recv(static_cast<std::size_t>(etp));
  for (int64_t j = 0; j < etp; ++j)
    for (int64_t i = 0; i < local_; ++i) recv[j] += s.etp_counts[j * local_ + i];
  // An all-gather of unequal row counts: this rank's rows to every member (all-to-all-v), then
  // the group's rows ordered [local expert][member] (moe_permute: exact copies).
  std::vector<int64_t> rep;
  rep.reserve(static_cast<std::size_t>(mine * etp));
  for (int64_t j = 0; j < etp; ++j)
    for (int64_t q = 0; q < mine; ++q) rep.push_back(q);
  const Tensor got = exchange_rows(
      ctx_, g, gather_rows(ctx_, rows.view({mine, h_}), index_tensor(ctx_, rep)), send, recv);
  return gather_rows(ctx_, got, s.etp_order_t);
}

Tensor MoELayer::etp_scatter_rows(const Tensor& rows, const Saved& s) const {
  comm::ProcessGroup& g = *ctx_.expert_tp_group;
  const int64_t etp = g.size();
  const int64_t mine = std::accumulate(s.local_counts.begin(), s.local_counts.end(), int64_t{0});
  std::vector<int64_t> send(static_cast<std::size_t>(etp)),
      recv(static_cast<std::size_t>(etp), mine);
  for (int64_t j = 0; j < etp; ++j)
    for (int64_t i = 0; i < local_; ++i) send[j] += s.etp_counts[j * local_ + i];
  // A reduce-scatter of unequal row counts: member j's rows to member j, summed here in member
  // order (moe_unpermute without probabilities: f64, rounded once).
  const Tensor got = exchange_rows(ctx_, g, gather_rows(ctx_, rows, s.etp_inverse_t), send, recv);
  std::vector<int64_t> off(static_cast<std::size_t>(mine + 1)), list;
  list.reserve(static_cast<std::size_t>(mine * etp));
  for (int64_t q = 0; q <= mine; ++q) off[static_cast<std::size_t>(q)] = q * etp;
  for (int64_t q = 0; q < mine; ++q)
    for (int64_t j = 0; j < etp; ++j) list.push_back(j * mine + q);
  Tensor sum = Tensor::empty({mine, h_}, ctx_.dtype, ctx_.device);
  if (mine > 0)
    ctx_.op().moe_unpermute(sum, got, Tensor(), index_tensor(ctx_, off), index_tensor(ctx_, list));
  return sum;
}

Tensor MoELayer::experts_forward(const Tensor& rows, Saved& s) const {
  Tensor out;
  if (ctx_.etp_size() == 1) {
    out = experts_compute(rows, s.local_counts, s);
  } else {
    const Tensor all = etp_gather_rows(rows, s);
    std::vector<int64_t> counts(static_cast<std::size_t>(local_), 0);
    for (int64_t j = 0; j < ctx_.etp_size(); ++j)
      for (int64_t i = 0; i < local_; ++i) counts[i] += s.etp_counts[j * local_ + i];
    out = etp_scatter_rows(experts_compute(all, counts, s), s);
  }
  // fc2's bias, once per row after the expert-TP reduction.
  int64_t off = 0;
  for (int64_t i = 0; i < local_; ++i) {
    const int64_t n = s.local_counts[static_cast<std::size_t>(i)];
    const Expert& x = experts_[static_cast<std::size_t>(i)];
    if (n > 0 && x.fc2_bias.defined()) {
      Tensor z = out.slice(off, n);
      ctx_.op().bias_add(z, x.fc2_bias.value);
    }
    off += n;
  }
  return out;
}

Tensor MoELayer::experts_backward(const Tensor& drows, Saved& s) {
  const int64_t etp = ctx_.etp_size();
  // The gradient of the expert outputs: this rank's rows, or (ETP) the group's rows, gathered
  // as the forward's reduction's backward.
  const Tensor dz = etp == 1 ? drows : etp_gather_rows(drows, s);
  std::vector<int64_t> counts = s.local_counts;
  if (etp > 1) {
    std::fill(counts.begin(), counts.end(), 0);
    for (int64_t j = 0; j < etp; ++j)
      for (int64_t i = 0; i < local_; ++i) counts[i] += s.etp_counts[j * local_ + i];
  }
  // fc2's bias gradient over every row the expert ran on (the whole group's under ETP, so each
  // member holds the full gradient of the replicated bias).
  int64_t off = 0;
  for (int64_t i = 0; i < local_; ++i) {
    const int64_t n = counts[static_cast<std::size_t>(i)];
    Expert& x = experts_[static_cast<std::size_t>(i)];
    if (n > 0 && x.fc2_bias.defined()) ctx_.op().bias_grad(x.fc2_bias.grad, dz.slice(off, n));
    off += n;
  }
  const Tensor din = experts_compute_backward(dz, counts, s);
  return etp == 1 ? din : etp_scatter_rows(din, s);
}

void MoELayer::dispatch_index(Saved& s, int64_t aux_rows) const {
  const TransformerConfig& c = *ctx_.config;
  const int64_t T = s.x.size(0), tk = T * k_, nss = seq_partition();
  const bool allgather =
      ep_size() > 1 && c.moe_token_dispatcher_type == MoeTokenDispatcherType::allgather;
  const bool a2a = !allgather && ep_size() > 1;
  const bool capacity = router_.capacity_factor.has_value();
  const bool summed = s.aux.lb && nss > 1;
  const bool own_kept = allgather && c.moe_router_enable_expert_bias && s.training;
  const int64_t etp = ctx_.etp_size();
  // The choices to sort: this rank's (selected: every expert), or the EP group's all-gathered
  // (selected: this rank's experts; counted: this rank's part).
  Tensor expert = s.expert_t.view({tk}), kept = capacity ? s.kept_t.view({tk}) : Tensor();
  ops::MoeDispatchArgs a{.topk = k_, .first_expert = 0, .count_first = 0, .count_num = tk};
  int64_t sel = e_;
  if (allgather) {
    comm::ProcessGroup& g = *ctx_.ep_group;
    const int64_t ep = g.size();
    Tensor eg = Tensor::empty({ep * tk}, DType::i64, ctx_.device);
    g.all_gather(eg, expert)->wait();
    expert = eg;
    if (capacity) {
      Tensor kg = Tensor::empty({ep * tk}, DType::u8, ctx_.device);
      g.all_gather(kg, kept)->wait();
      kept = kg;
    }
    a.first_expert = first_;
    a.count_first = static_cast<int64_t>(g.rank()) * tk;
    sel = local_;
  }
  const int64_t n = expert.size(0), ge = aux_rows * e_;
  // The host's buffer: [sel] rows per selected expert | [E] received per [source][local expert]
  // (a2a) | [G, E] this rank's choices | [G, E] summed over the sequence partition (summed) |
  // [E] this rank's kept choices (own_kept) | [ETP, rows per (source, local expert)] the
  // expert-TP group's (etp > 1).
  const int64_t at_recv = sel, at_own = at_recv + (a2a ? e_ : 0), at_sum = at_own + ge;
  const int64_t at_kept = at_sum + (summed ? ge : 0), at_etp = at_kept + (own_kept ? e_ : 0);
  const int64_t per_member = a2a ? e_ : sel;  // this rank's experts' rows, per source rank
  const int64_t len = at_etp + (etp > 1 ? etp * per_member : 0);
  Tensor host = Tensor::empty({len}, DType::i64, ctx_.device);
  // The index lists, slices of one allocation: rows, tokens, each choice's row, each token's rows
  // [n] each (valid up to the row count), then the choices' and the tokens' offsets.
  Tensor lists = Tensor::empty({4 * n + (n + 1) + (n / k_ + 1)}, DType::i64, ctx_.device);
  Tensor counts = host.slice(0, sel), own = host.slice(at_own, ge).view({aux_rows, e_});
  s.row_choice_t = lists.slice(0, n);
  s.row_token_t = lists.slice(n, n);
  s.entry_rows_t = lists.slice(2 * n, n);
  s.token_rows_t = lists.slice(3 * n, n);
  s.entry_offsets_t = lists.slice(4 * n, n + 1);
  s.token_offsets_t = lists.slice(5 * n + 1, n / k_ + 1);
  ctx_.op().moe_dispatch_index(counts, own, s.row_choice_t, s.row_token_t, s.entry_offsets_t,
                               s.entry_rows_t, s.token_offsets_t, s.token_rows_t, expert, kept, a);
  if (a2a) {
    // The all-to-all split sizes: rows per [source rank][local expert], exchanged on the device.
    s.recv_counts_t = host.slice(at_recv, e_);
    ctx_.ep_group->all_to_all(s.recv_counts_t, counts)->wait();
  }
  if (summed) {
    Tensor sum = host.slice(at_sum, ge);
    sum.copy_(own.view({ge}));
    seq_partition_group()->all_reduce(sum, comm::ReduceOp::sum)->wait();
  }
  if (own_kept) host.slice(at_kept, e_).copy_(s.kept_counts_t);  // the router's, this rank's
  if (etp > 1) {
    // Expert TP: every member's rows per (source rank, local expert), for the experts' gather.
    Tensor mine = a2a ? s.recv_counts_t : counts;
    Tensor group = host.slice(at_etp, etp * per_member);
    ctx_.expert_tp_group->all_gather(group, mine)->wait();
  }
  const std::vector<int64_t> v = host_read<int64_t>(host, HostSync::moe);
  auto part = [&](int64_t at, int64_t len_) {
    return std::vector<int64_t>(v.begin() + at, v.begin() + at + len_);
  };
  s.expert_counts = part(0, sel);
  s.rows = std::accumulate(s.expert_counts.begin(), s.expert_counts.end(), int64_t{0});
  if (a2a) s.recv_expert_counts = part(at_recv, e_);
  // This rank's choices per expert (all rows of the [G, E] counts), and the aux losses' counts.
  s.tokens_per_expert.assign(static_cast<std::size_t>(e_), 0.0);
  for (int64_t i = 0; i < ge; ++i)
    s.tokens_per_expert[i % e_] += static_cast<double>(v[at_own + i]);
  if (s.aux.lb) {
    const int64_t from = summed ? at_sum : at_own;
    s.aux.counts.assign(v.begin() + from, v.begin() + from + ge);
  }
  if (c.moe_router_enable_expert_bias && s.training)
    s.kept_per_expert = own_kept ? part(at_kept, e_) : s.expert_counts;
  if (etp > 1) {
    // Member j's rows per local expert i: summed over its source ranks.
    s.etp_counts.assign(static_cast<std::size_t>(etp * local_), 0);
    for (int64_t j = 0; j < etp; ++j)
      for (int64_t q = 0; q < per_member; ++q)
        s.etp_counts[static_cast<std::size_t>(j * local_ + q % local_)] +=
            v[static_cast<std::size_t>(at_etp + j * per_member + q)];
  }
  // The lists' valid parts.
  s.row_choice_t = s.row_choice_t.slice(0, s.rows);
  s.row_token_t = s.row_token_t.slice(0, s.rows);
  s.entry_rows_t = s.entry_rows_t.slice(0, s.rows);
  s.token_rows_t = s.token_rows_t.slice(0, s.rows);
}

Tensor MoELayer::dispatch_alltoall(Saved& s, DType out_dtype) const {
  const int64_t ep = ep_size(), T = s.x.size(0), rows = s.rows;
  // Per row its choice's probability and its token's input, gathered on the device.
  Tensor row_prob = Tensor::empty({rows, 1}, DType::f64, ctx_.device);
  ctx_.op().moe_permute(row_prob, s.prob_t.view({T * k_, 1}), s.row_choice_t);
  s.row_prob_t = row_prob.view({rows});
  const Tensor send = gather_rows(ctx_, s.x, s.row_token_t);
  s.send_counts.assign(static_cast<std::size_t>(ep), 0);
  for (int64_t e = 0; e < e_; ++e) s.send_counts[e / local_] += s.expert_counts[e];
  Tensor recv;
  if (ep == 1) {
    s.recv_counts = s.send_counts;
    s.recv_expert_counts = s.expert_counts;
    recv = send;
  } else {
    s.recv_counts.assign(static_cast<std::size_t>(ep), 0);
    for (int64_t j = 0; j < ep; ++j)
      for (int64_t i = 0; i < local_; ++i) s.recv_counts[j] += s.recv_expert_counts[j * local_ + i];
    recv = exchange_rows(ctx_, *ctx_.ep_group, send, s.send_counts, s.recv_counts);
  }
  s.local_counts.assign(static_cast<std::size_t>(local_), 0);
  for (int64_t j = 0; j < ep; ++j)
    for (int64_t i = 0; i < local_; ++i) s.local_counts[i] += s.recv_expert_counts[j * local_ + i];
  Tensor out;
  if (ep == 1) {
    // One source rank: the received rows are already in expert order.
    out = experts_forward(recv, s);
  } else {
    const int64_t r = recv.size(0);
    s.order_t = Tensor::empty({r}, DType::i64, ctx_.device);
    s.inverse_t = Tensor::empty({r}, DType::i64, ctx_.device);
    ctx_.op().moe_chunk_order(s.order_t, s.inverse_t, s.recv_counts_t.view({ep, local_}));
    out = gather_rows(ctx_, experts_forward(gather_rows(ctx_, recv, s.order_t), s), s.inverse_t);
    out = exchange_rows(ctx_, *ctx_.ep_group, out, s.recv_counts, s.send_counts);
  }
  // Combine on the token's rank: y[t] = sum_k prob[t, k] * expert output (f64, rounded once).
  Tensor y = Tensor::empty({T, h_}, out_dtype, ctx_.device);
  ctx_.op().moe_unpermute(y, out, s.row_prob_t, s.token_offsets_t, s.token_rows_t);
  s.out_rows_t = out;
  return y;
}

Tensor MoELayer::dispatch_allgather(Saved& s) const {
  comm::ProcessGroup& g = *ctx_.ep_group;
  const int64_t ep = g.size(), t_local = s.x.size(0), tk = t_local * k_, tg = ep * t_local;
  // The EP group's tokens and probabilities on the device (its chosen experts: dispatch_index).
  Tensor xg = Tensor::empty({tg * h_}, ctx_.dtype, ctx_.device);
  g.all_gather(xg, s.x.view({t_local * h_}))->wait();
  Tensor pg = Tensor::empty({ep * tk}, DType::f64, ctx_.device);
  g.all_gather(pg, s.prob_t.view({tk}))->wait();
  // Rows for this rank's experts: expert-major, then gathered token order, then choice; their
  // inputs and probabilities (exact copies).
  s.local_counts = s.expert_counts;
  const Tensor rows = gather_rows(ctx_, xg.view({tg, h_}), s.row_token_t);
  Tensor row_prob = Tensor::empty({s.rows, 1}, DType::f64, ctx_.device);
  ctx_.op().moe_permute(row_prob, pg.view({ep * tk, 1}), s.row_choice_t);
  s.row_prob_t = row_prob.view({s.rows});
  s.out_rows_t = experts_forward(rows, s);
  // The group's tokens: sum of prob * expert output (f64, rounded once), reduce-scattered back.
  Tensor yall = Tensor::empty({tg, h_}, ctx_.dtype, ctx_.device);
  ctx_.op().moe_unpermute(yall, s.out_rows_t, s.row_prob_t, s.token_offsets_t, s.token_rows_t);
  Tensor yout = Tensor::empty({t_local * h_}, ctx_.dtype, ctx_.device);
  g.reduce_scatter(yout, yall.view({tg * h_}), comm::ReduceOp::sum)->wait();
  return yout.view({t_local, h_});
}

std::pair<double, double> AuxLossValues::values() const {
  if (!sums.defined()) return {0.0, 0.0};
  const std::vector<double> v = host_read<double>(sums, HostSync::moe);
  return values_from(v);
}

std::pair<double, double> AuxLossValues::values_from(std::span<const double> v) const {
  const std::vector<double> part(v.begin(), v.end() - 1);
  double lb_loss = 0.0, z = 0.0;
  if (lb && seq_aux)
    lb_loss = sequence_load_balancing_loss_from_sums(part, seq, batch, experts, counts, topk,
                                                     partition, 1.0, nullptr);
  else if (lb)
    lb_loss = switch_load_balancing_loss_from_sums(part, tokens, experts, counts, topk, partition,
                                                   1.0, nullptr);
  // z_loss's value: coeff * sum / T with coeff 1 / partition (0 without a z-loss: the sum is 0).
  if (tokens > 0) z = 1.0 / static_cast<double>(partition) * v.back() / static_cast<double>(tokens);
  return {lb_loss, z};
}

comm::ProcessGroup* MoELayer::seq_partition_group() const {
  const bool sp = ctx_.sequence_parallel && ctx_.tp_size() > 1;
  if (ctx_.cp.active()) return sp ? ctx_.tp_cp_group : ctx_.cp.group;
  return sp ? ctx_.tp_group : nullptr;
}

Tensor MoELayer::forward(const Tensor& x, Saved& s, bool training) const {
  const TransformerConfig& c = *ctx_.config;
  s = Saved{};
  s.shape = x.shape();
  MG_CHECK(x.dim() == 3 && x.size(2) == h_,
           "MoELayer: input must be [S, B, " << h_ << "], got " << x.str());
  const int64_t T = x.size(0) * x.size(1);
  s.x = x.view({T, h_});
  s.training = training;
  const int64_t nss = seq_partition();

  // Router: logits in f32 (f64 for f64) and the routing (moe_router_topk) on the device; the
  // dispatch's index lists from it on the device too (dispatch_index: the one host read of
  // counts); the aux losses' values are read when logged.
  s.logits = Tensor::empty({T, e_}, ctx_.stat_dtype(), ctx_.device);
  if (T > 0) ctx_.op().gemm(s.logits, s.x, router_w_.value, ops::GemmArgs{.trans_b = true});
  const bool lb = training && c.moe_router_load_balancing_type != MoeLoadBalancingType::none;
  const bool zl = training && c.moe_z_loss_coeff > 0.0;
  AuxLossValues& aux = s.aux;
  aux.lb = lb;
  aux.seq_aux = c.moe_router_load_balancing_type == MoeLoadBalancingType::seq_aux_loss;
  aux.tokens = T;
  aux.seq = x.size(0);
  aux.batch = x.size(1);
  aux.experts = e_;
  aux.topk = k_;
  aux.partition = nss;
  const int64_t aux_rows = aux.seq_aux ? x.size(1) : 1;
  s.expert_t = Tensor::empty({T, k_}, DType::i64, ctx_.device);
  s.prob_t = Tensor::empty({T, k_}, DType::f64, ctx_.device);
  s.kept_t = Tensor::empty({T, k_}, DType::u8, ctx_.device);
  s.scores_t = Tensor::empty({T, e_}, DType::f64, ctx_.device);
  if (training && c.moe_router_enable_expert_bias && ep_size() > 1 &&
      c.moe_token_dispatcher_type == MoeTokenDispatcherType::allgather)
    s.kept_counts_t = Tensor::empty({e_}, DType::i64, ctx_.device);
  // The aux losses' sums in one buffer: [aux_rows, E] score sums, then the z-loss's sum.
  if (lb || zl) aux.sums = ctx_.moe->metrics_tracker.device_slot(aux_rows * e_ + 1, ctx_.device);
  Tensor aux_sums = lb ? aux.sums.slice(0, aux_rows * e_).view({aux_rows, e_}) : Tensor();
  Tensor z_sum = zl ? aux.sums.slice(aux_rows * e_, 1) : Tensor();
  const Tensor bias =
      c.moe_router_enable_expert_bias
          ? Tensor::from_vector(ctx_.moe->expert_bias.at(layer_).expert_bias, {e_}, DType::f32)
                .to(ctx_.device)
          : Tensor();
  // (The tokens per expert come from dispatch_index's counts: the router's are not asked for.)
  Tensor no_tokens_per_expert;
  ctx_.op().moe_router_topk(s.expert_t, s.prob_t, s.kept_t, s.scores_t, no_tokens_per_expert,
                            s.kept_counts_t, aux_sums, z_sum, s.logits, bias, router_args_);
  dispatch_index(s, lb && aux.seq_aux ? aux_rows : 1);

  // The load-balancing loss: its gradient's rows d loss / d scores now (from the token counts,
  // summed over the sequence partition), its value from the device's score sums when logged.
  if (lb) {
    if (!aux.seq_aux) {
      switch_load_balancing_loss_from_sums(std::vector<double>(static_cast<std::size_t>(e_), 0.0),
                                           T, e_, aux.counts, k_, nss, 1.0, &s.aux_drows);
    } else {
      sequence_load_balancing_loss_from_sums(
          std::vector<double>(static_cast<std::size_t>(x.size(1) * e_), 0.0), x.size(0), x.size(1),
          e_, aux.counts, k_, nss, 1.0, &s.aux_drows);
    }
  }

  const bool gated = shared_ && c.moe_shared_expert_gate;
  Tensor yt;  // [T, H] on the device (alltoall: f64 when the gate adds to it)
  if (ep_size() == 1 || c.moe_token_dispatcher_type == MoeTokenDispatcherType::alltoall)
    yt = dispatch_alltoall(s, gated ? DType::f64 : ctx_.dtype);
  else
    yt = dispatch_allgather(s);
  if (gated) {
    // y + sigmoid(x . gate_weight) * shared(x), per token (moe_shared_gate_fwd: f64, rounded once).
    s.shared_out = shared_->forward(x, s.shared).view({T, h_});
    s.shared_gate = Tensor::empty({T}, DType::f64, ctx_.device);
    Tensor out = ctx_.empty({T, h_});
    if (yt.dtype() != DType::f64) yt = yt.to(DType::f64);  // the allgather dispatcher's (exact)
    ctx_.op().moe_shared_gate_fwd(out, s.shared_gate, yt.view({T, h_}), s.shared_out, s.x,
                                  shared_gate_w_.value);
    return out.view(s.shape);
  }
  Tensor out = yt.view(s.shape);
  if (shared_) {
    Tensor z = shared_->forward(x, s.shared);
    ctx_.op().axpy(out, z, 1.0f);
  }
  return out;
}

Tensor MoELayer::combine_backward_alltoall(const Tensor& dy, Saved& s, Tensor& dprob) {
  const int64_t ep = ep_size(), T = s.x.size(0);
  const int64_t rows = s.rows;
  // d(rows) = prob * dy[t] (rounded once); d(prob) = dy[t] . expert output (f64).
  Tensor drows = Tensor::empty({rows, h_}, ctx_.dtype, ctx_.device);
  Tensor dp = Tensor::empty({rows}, DType::f64, ctx_.device);
  ctx_.op().moe_unpermute_bwd(drows, dp, dy.view({T, h_}), s.out_rows_t, s.row_prob_t,
                              s.row_token_t);
  // d(prob) [T, K] on the device: each choice's row (none when dropped) moved to its place
  // (moe_unpermute over the choices: 0 + dp, as the former host sum).
  dprob = Tensor::empty({T, k_}, DType::f64, ctx_.device);
  Tensor dprob_rows = dprob.view({T * k_, 1});
  ctx_.op().moe_unpermute(dprob_rows, dp.view({rows, 1}), Tensor(), s.entry_offsets_t,
                          s.entry_rows_t);
  Tensor back;
  if (ep == 1) {
    back = experts_backward(drows, s);
  } else {
    const Tensor recv = exchange_rows(ctx_, *ctx_.ep_group, drows, s.send_counts, s.recv_counts);
    back = gather_rows(ctx_, experts_backward(gather_rows(ctx_, recv, s.order_t), s), s.inverse_t);
    back = exchange_rows(ctx_, *ctx_.ep_group, back, s.recv_counts, s.send_counts);
  }
  // dx[t] = sum of its rows' input gradients (moe_permute's backward: f64, rounded once).
  Tensor dx = ctx_.empty({T, h_});
  ctx_.op().moe_unpermute(dx, back, Tensor(), s.token_offsets_t, s.token_rows_t);
  return dx;
}

Tensor MoELayer::combine_backward_allgather(const Tensor& dy, Saved& s, Tensor& dprob) {
  comm::ProcessGroup& g = *ctx_.ep_group;
  const int64_t ep = g.size(), t_local = s.x.size(0), tk = t_local * k_, tg = ep * t_local;
  Tensor dyc = dy.view({t_local * h_}).clone();
  Tensor dyg = Tensor::empty({tg * h_}, ctx_.dtype, ctx_.device);
  g.all_gather(dyg, dyc)->wait();
  // d(rows) = prob * dy[t] (rounded once); d(prob) = dy[t] . expert output (f64), moved to the
  // group's choices and summed over the EP group; this rank's part.
  const int64_t r = s.rows;
  Tensor drows = Tensor::empty({r, h_}, ctx_.dtype, ctx_.device);
  Tensor dp = Tensor::empty({r}, DType::f64, ctx_.device);
  ctx_.op().moe_unpermute_bwd(drows, dp, dyg.view({tg, h_}), s.out_rows_t, s.row_prob_t,
                              s.row_token_t);
  Tensor dpall = Tensor::empty({ep * tk, 1}, DType::f64, ctx_.device);
  ctx_.op().moe_unpermute(dpall, dp.view({r, 1}), Tensor(), s.entry_offsets_t, s.entry_rows_t);
  if (ep * tk > 0) g.all_reduce(dpall, comm::ReduceOp::sum)->wait();
  dprob = dpall.slice(static_cast<int64_t>(g.rank()) * tk, tk).view({t_local, k_});
  // dx: each token's rows' input gradients summed (f64, rounded once), reduce-scattered back.
  const Tensor din = experts_backward(drows, s);
  Tensor dxall = Tensor::empty({tg, h_}, ctx_.dtype, ctx_.device);
  ctx_.op().moe_unpermute(dxall, din, Tensor(), s.token_offsets_t, s.token_rows_t);
  Tensor xout = Tensor::empty({t_local * h_}, ctx_.dtype, ctx_.device);
  g.reduce_scatter(xout, dxall.view({tg * h_}), comm::ReduceOp::sum)->wait();
  return xout.view({t_local, h_});
}

Tensor MoELayer::backward(const Tensor& dy, Saved& s) {
  const TransformerConfig& c = *ctx_.config;
  const int64_t T = s.x.size(0);
  const int64_t nss = seq_partition();
  Tensor dxt, dprob;
  if (ep_size() == 1 || c.moe_token_dispatcher_type == MoeTokenDispatcherType::alltoall) {
    dxt = combine_backward_alltoall(dy, s, dprob);
  } else {
    dxt = combine_backward_allgather(dy, s, dprob);
  }

  // Router: the routing's backward, plus the aux and z losses' (MoEAuxLossAutoScaler's seed), on
  // the device in that order (moe_router_topk_bwd).
  const double scale = ctx_.moe->aux_loss_auto_scaler.loss_scale();
  ops::MoeRouterArgs ra = router_args_;
  Tensor aux_ds;
  if (!s.aux_drows.empty() && c.moe_aux_loss_coeff > 0.0) {
    std::vector<double> ds = s.aux_drows;
    for (double& v : ds) v *= c.moe_aux_loss_coeff * scale;
    aux_ds = device_tensor(ctx_, ds, {static_cast<int64_t>(ds.size()) / e_, e_}, DType::f64);
  }
  if (s.training && c.moe_z_loss_coeff > 0.0) {
    ra.z_loss_coeff = c.moe_z_loss_coeff / static_cast<double>(nss);
    ra.z_loss_scale = scale;
  }
  Tensor dlogits = Tensor::empty({T, e_}, DType::f64, ctx_.device);
  if (T > 0)
    ctx_.op().moe_router_topk_bwd(dlogits, dprob, aux_ds, s.logits, s.expert_t, s.prob_t, s.kept_t,
                                  s.scores_t, ra);
  if (s.training) {
    // The values without coefficients, read from the device when the log resolves the tracker.
    MoEMetricsTracker& tracker = ctx_.moe->metrics_tracker;
    if (s.aux.sums.defined())
      tracker.add_pending(layer_, s.tokens_per_expert, s.aux.sums,
                          [aux = s.aux](std::span<const double> v) { return aux.values_from(v); });
    else
      tracker.add(layer_, 0.0, 0.0, s.tokens_per_expert);
  }
  if (s.training && c.moe_router_enable_expert_bias) {
    // Megatron's local_tokens_per_expert += routing_map.sum(0): the kept choices.
    std::vector<double>& tokens = ctx_.moe->expert_bias.at(layer_).local_tokens_per_expert;
    for (int64_t e = 0; e < e_; ++e)
      tokens[static_cast<std::size_t>(e)] +=
          static_cast<double>(s.kept_per_expert[static_cast<std::size_t>(e)]);
  }
  if (T > 0) {
    const Tensor dl = dlogits.to(ctx_.dtype);
    linear_bwd(ctx_, dxt, router_w_.grad, dl, s.x, router_w_.value, /*accumulate=*/true);
  }
  Tensor out = dxt.view(s.shape);
  if (shared_ && c.moe_shared_expert_gate) {
    // z' = sig * z: dz = sig * dy; dg = (dy . z) sig (1 - sig); dw += dg x; dx += dg w
    // (moe_shared_gate_bwd, f64).
    Tensor dz = ctx_.empty({T, h_}), dxg = ctx_.empty({T, h_});
    Tensor dw = Tensor::empty({h_}, DType::f64, ctx_.device);
    ctx_.op().moe_shared_gate_bwd(dz, dxg, dw, dy.view({T, h_}), s.shared_out, s.x,
                                  shared_gate_w_.value, s.shared_gate);
    ctx_.op().axpy(shared_gate_w_.grad, dw.to(shared_gate_w_.grad.dtype()).view({1, h_}), 1.0f);
    ctx_.op().axpy(out, dxg.view(s.shape), 1.0f);
    Tensor dxs = shared_->backward(dz.view(s.shape), s.x.view(s.shape), s.shared);
    ctx_.op().axpy(out, dxs, 1.0f);
  } else if (shared_) {
    Tensor dxs = shared_->backward(dy, s.x.view(s.shape), s.shared);
    ctx_.op().axpy(out, dxs, 1.0f);
  }
  s = Saved{};
  return out;
}

}  // namespace mg::transformer::moe
