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

void all_reduce_host(const ModuleContext& ctx, comm::ProcessGroup& g, std::vector<double>& v) {
  if (g.size() == 1 || v.empty()) return;
  Tensor t = device_tensor(ctx, v, {static_cast<int64_t>(v.size())}, DType::f64);
  g.all_reduce(t, comm::ReduceOp::sum)->wait();
  v = host_read<double>(t, HostSync::moe);
}

// Received rows are laid out [source rank j][local expert i]; the experts want [i][j]. Returns,
// for each row in [i][j] order, its index in the received layout.
std::vector<int64_t> chunk_order(const std::vector<int64_t>& counts, int64_t ep, int64_t local) {
  std::vector<int64_t> start(static_cast<std::size_t>(ep * local));
  int64_t off = 0;
  for (int64_t j = 0; j < ep; ++j)
    for (int64_t i = 0; i < local; ++i) {
      start[j * local + i] = off;
      off += counts[j * local + i];
    }
  std::vector<int64_t> order;
  order.reserve(static_cast<std::size_t>(off));
  for (int64_t i = 0; i < local; ++i)
    for (int64_t j = 0; j < ep; ++j)
      for (int64_t r = 0; r < counts[j * local + i]; ++r) order.push_back(start[j * local + i] + r);
  return order;
}

Tensor index_tensor(const ModuleContext& ctx, const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::i64).to(ctx.device);
}

// rows [index.size(), H] = x[index] on the device (moe_permute: an exact copy).
Tensor gather_rows(const ModuleContext& ctx, const Tensor& x, const std::vector<int64_t>& index) {
  Tensor rows =
      Tensor::empty({static_cast<int64_t>(index.size()), x.size(1)}, x.dtype(), ctx.device);
  ctx.op().moe_permute(rows, x, index_tensor(ctx, index));
  return rows;
}

// The inverse of a permutation: inv[order[r]] = r.
std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> inv(order.size());
  for (std::size_t r = 0; r < order.size(); ++r)
    inv[static_cast<std::size_t>(order[r])] = static_cast<int64_t>(r);
  return inv;
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

// Each token's rows in row order (a counting sort of row_token): moe_unpermute's offsets [T + 1]
// and token_rows [R], on the device.
void token_rows(const ModuleContext& ctx, const std::vector<int64_t>& row_token, int64_t t,
                Tensor& offsets, Tensor& rows) {
  std::vector<int64_t> off(static_cast<std::size_t>(t + 1), 0), list(row_token.size());
  for (int64_t tok : row_token) ++off[static_cast<std::size_t>(tok + 1)];
  for (int64_t i = 0; i < t; ++i) off[i + 1] += off[i];
  std::vector<int64_t> fill(off.begin(), off.end() - 1);
  for (std::size_t i = 0; i < row_token.size(); ++i)
    list[static_cast<std::size_t>(fill[static_cast<std::size_t>(row_token[i])]++)] =
        static_cast<int64_t>(i);
  offsets = index_tensor(ctx, off);
  rows = index_tensor(ctx, list);
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
  if (s.etp_counts.empty()) {
    const Tensor cin = Tensor::from_vector(s.local_counts, {local_}, DType::i64).to(ctx_.device);
    Tensor cout = Tensor::empty({etp * local_}, DType::i64, ctx_.device);
    g.all_gather(cout, cin)->wait();
    s.etp_counts = host_read<int64_t>(cout, HostSync::moe);
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
  const Tensor got =
      exchange_rows(ctx_, g, gather_rows(ctx_, rows.view({mine, h_}), rep), send, recv);
  return gather_rows(ctx_, got, chunk_order(s.etp_counts, etp, local_));
}

Tensor MoELayer::etp_scatter_rows(const Tensor& rows, const Saved& s) const {
  comm::ProcessGroup& g = *ctx_.expert_tp_group;
  const int64_t etp = g.size();
  const int64_t mine = std::accumulate(s.local_counts.begin(), s.local_counts.end(), int64_t{0});
  std::vector<int64_t> send(static_cast<std::size_t>(etp)),
      recv(static_cast<std::size_t>(etp), mine);
  for (int64_t j = 0; j < etp; ++j)
    for (int64_t i = 0; i < local_; ++i) send[j] += s.etp_counts[j * local_ + i];
  const std::vector<int64_t> order = chunk_order(s.etp_counts, etp, local_);
  // A reduce-scatter of unequal row counts: member j's rows to member j, summed here in member
  // order (moe_unpermute without probabilities: f64, rounded once).
  const Tensor got = exchange_rows(ctx_, g, gather_rows(ctx_, rows, inverse(order)), send, recv);
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

Tensor MoELayer::dispatch_alltoall(Saved& s, DType out_dtype) const {
  const int64_t ep = ep_size(), T = s.x.size(0);
  const Permutation p = permutation(s.routing);
  s.row_token = p.row_token;
  s.row_slot = p.row_slot;
  const int64_t rows = static_cast<int64_t>(p.row_token.size());
  // Per row: its choice (t K + k) and that choice's probability, gathered on the device; the
  // token sums' index lists, and each choice's row (d(prob) in backward).
  std::vector<int64_t> entry(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) entry[i] = s.row_token[i] * k_ + s.row_slot[i];
  Tensor row_prob = Tensor::empty({rows, 1}, DType::f64, ctx_.device);
  ctx_.op().moe_permute(row_prob, s.prob_t.view({T * k_, 1}), index_tensor(ctx_, entry));
  s.row_prob_t = row_prob.view({rows});
  s.row_token_t = index_tensor(ctx_, s.row_token);
  token_rows(ctx_, s.row_token, T, s.token_offsets_t, s.token_rows_t);
  token_rows(ctx_, entry, T * k_, s.entry_offsets_t, s.entry_rows_t);
  Tensor send = Tensor::empty({rows, h_}, ctx_.dtype, ctx_.device);
  ctx_.op().moe_permute(send, s.x, s.row_token_t);
  s.send_counts.assign(static_cast<std::size_t>(ep), 0);
  for (int64_t e = 0; e < e_; ++e) s.send_counts[e / local_] += p.expert_counts[e];
  Tensor recv;
  if (ep == 1) {
    s.recv_counts = s.send_counts;
    s.recv_expert_counts = p.expert_counts;
    recv = send;
  } else {
    // The all-to-all split sizes: the one host synchronisation of the dispatch (Megatron's too
    // when no capacity is set).
    Tensor cin = Tensor::from_vector(p.expert_counts, {e_}, DType::i64).to(ctx_.device);
    Tensor cout = Tensor::empty({e_}, DType::i64, ctx_.device);
    ctx_.ep_group->all_to_all(cout, cin)->wait();
    s.recv_expert_counts = host_read<int64_t>(cout, HostSync::moe);
    s.recv_counts.assign(static_cast<std::size_t>(ep), 0);
    for (int64_t j = 0; j < ep; ++j)
      for (int64_t i = 0; i < local_; ++i) s.recv_counts[j] += s.recv_expert_counts[j * local_ + i];
    recv = exchange_rows(ctx_, *ctx_.ep_group, send, s.send_counts, s.recv_counts);
  }
  s.local_counts.assign(static_cast<std::size_t>(local_), 0);
  for (int64_t j = 0; j < ep; ++j)
    for (int64_t i = 0; i < local_; ++i) s.local_counts[i] += s.recv_expert_counts[j * local_ + i];
  s.order = chunk_order(s.recv_expert_counts, ep, local_);
  const Tensor out = experts_forward(gather_rows(ctx_, recv, s.order), s);
  Tensor back = gather_rows(ctx_, out, inverse(s.order));
  if (ep > 1) back = exchange_rows(ctx_, *ctx_.ep_group, back, s.recv_counts, s.send_counts);
  // Combine on the token's rank: y[t] = sum_k prob[t, k] * expert output (f64, rounded once).
  Tensor y = Tensor::empty({T, h_}, out_dtype, ctx_.device);
  ctx_.op().moe_unpermute(y, back, s.row_prob_t, s.token_offsets_t, s.token_rows_t);
  s.out_rows_t = back;
  return y;
}

void MoELayer::gather_routing(Saved& s) const {
  comm::ProcessGroup& g = *ctx_.ep_group;
  const int64_t ep = g.size(), tk = s.x.size(0) * k_;
  // The EP group's chosen experts (read: the index lists) and, under a capacity, kept masks.
  Tensor eg = Tensor::empty({ep * tk}, DType::i64, ctx_.device);
  g.all_gather(eg, s.expert_t.view({tk}))->wait();
  s.gathered_expert = host_read<int64_t>(eg, HostSync::moe);
  s.gathered_kept.clear();
  if (router_.capacity_factor) {
    Tensor kg = Tensor::empty({ep * tk}, DType::u8, ctx_.device);
    g.all_gather(kg, s.kept_t.view({tk}))->wait();
    s.gathered_kept = host_read<uint8_t>(kg, HostSync::moe);
  }
}

Tensor MoELayer::dispatch_allgather(Saved& s) const {
  comm::ProcessGroup& g = *ctx_.ep_group;
  const int64_t ep = g.size(), t_local = s.x.size(0), tk = t_local * k_, tg = ep * t_local;
  // The EP group's tokens and probabilities on the device (its chosen experts: gather_routing).
  Tensor xg = Tensor::empty({tg * h_}, ctx_.dtype, ctx_.device);
  g.all_gather(xg, s.x.view({t_local * h_}))->wait();
  Tensor pg = Tensor::empty({ep * tk}, DType::f64, ctx_.device);
  g.all_gather(pg, s.prob_t.view({tk}))->wait();
  const std::vector<int64_t>& eall = s.gathered_expert;
  const std::vector<uint8_t>& kall = s.gathered_kept;
  // Rows for this rank's experts: expert-major, then gathered token order, then choice.
  s.local_counts.assign(static_cast<std::size_t>(local_), 0);
  std::vector<std::vector<int64_t>> per(static_cast<std::size_t>(local_));
  for (int64_t i = 0; i < ep * tk; ++i) {
    const int64_t e = eall[static_cast<std::size_t>(i)];
    if ((!kall.empty() && kall[static_cast<std::size_t>(i)] == 0) || e < first_ ||
        e >= first_ + local_)
      continue;
    per[static_cast<std::size_t>(e - first_)].push_back(i);
  }
  std::vector<int64_t> entry;
  for (int64_t l = 0; l < local_; ++l) {
    s.local_counts[l] = static_cast<int64_t>(per[l].size());
    for (int64_t i : per[l]) {
      s.row_token.push_back(i / k_);
      s.row_slot.push_back(i % k_);
      entry.push_back(i);
    }
  }
  const int64_t r = static_cast<int64_t>(s.row_token.size());
  // The rows and their probabilities (exact copies), each token's rows and each choice's row.
  s.row_token_t = index_tensor(ctx_, s.row_token);
  Tensor rows = Tensor::empty({r, h_}, ctx_.dtype, ctx_.device);
  ctx_.op().moe_permute(rows, xg.view({tg, h_}), s.row_token_t);
  Tensor row_prob = Tensor::empty({r, 1}, DType::f64, ctx_.device);
  ctx_.op().moe_permute(row_prob, pg.view({ep * tk, 1}), index_tensor(ctx_, entry));
  s.row_prob_t = row_prob.view({r});
  token_rows(ctx_, s.row_token, tg, s.token_offsets_t, s.token_rows_t);
  token_rows(ctx_, entry, ep * tk, s.entry_offsets_t, s.entry_rows_t);
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

  // Router: logits in f32 (f64 for f64) and the routing (moe_router_topk) on the device. The host
  // reads the chosen experts (with a capacity, the kept mask too) to build the dispatch's index
  // lists; the probabilities stay on the device, the aux losses' values are read when logged.
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
  Tensor tpe = Tensor::empty({e_}, DType::f64, ctx_.device), none;
  // The aux losses' sums in one buffer: [aux_rows, E] score sums, then the z-loss's sum.
  if (lb || zl) aux.sums = ctx_.moe->metrics_tracker.device_slot(aux_rows * e_ + 1, ctx_.device);
  Tensor aux_sums = lb ? aux.sums.slice(0, aux_rows * e_).view({aux_rows, e_}) : Tensor();
  Tensor z_sum = zl ? aux.sums.slice(aux_rows * e_, 1) : Tensor();
  const Tensor bias =
      c.moe_router_enable_expert_bias
          ? Tensor::from_vector(ctx_.moe->expert_bias.at(layer_).expert_bias, {e_}, DType::f32)
                .to(ctx_.device)
          : Tensor();
  ctx_.op().moe_router_topk(s.expert_t, s.prob_t, s.kept_t, s.scores_t, tpe, none, aux_sums, z_sum,
                            s.logits, bias, router_args_);
  Routing& r = s.routing;
  r.num_tokens = T;
  r.num_experts = e_;
  r.topk = k_;
  if (ep_size() > 1 && c.moe_token_dispatcher_type == MoeTokenDispatcherType::allgather) {
    // The allgather dispatcher reads the EP group's chosen experts: this rank's are a part.
    gather_routing(s);
    const auto first = s.gathered_expert.begin() + ctx_.ep_group->rank() * T * k_;
    r.expert.assign(first, first + T * k_);
    if (s.gathered_kept.empty()) {
      r.kept.assign(static_cast<std::size_t>(T * k_), 1);
    } else {
      const auto kfirst = s.gathered_kept.begin() + ctx_.ep_group->rank() * T * k_;
      r.kept.assign(kfirst, kfirst + T * k_);
    }
  } else {
    r.expert = host_read<int64_t>(s.expert_t, HostSync::moe);
    if (router_.capacity_factor)
      r.kept = host_read<uint8_t>(s.kept_t, HostSync::moe);
    else
      r.kept.assign(static_cast<std::size_t>(T * k_), 1);
  }
  // Tokens per expert: the choices before dropping (topk_routing's counts), from the ids.
  r.tokens_per_expert.assign(static_cast<std::size_t>(e_), 0.0);
  for (int64_t i = 0; i < T * k_; ++i)
    r.tokens_per_expert[static_cast<std::size_t>(r.expert[static_cast<std::size_t>(i)])] += 1.0;

  // The load-balancing loss: its gradient's rows d loss / d scores now (from the token counts,
  // summed over the sequence partition), its value from the device's score sums when logged.
  if (lb) {
    if (!aux.seq_aux) {
      aux.counts = r.tokens_per_expert;
      if (nss > 1) all_reduce_host(ctx_, *seq_partition_group(), aux.counts);
      switch_load_balancing_loss_from_sums(std::vector<double>(static_cast<std::size_t>(e_), 0.0),
                                           T, e_, aux.counts, k_, nss, 1.0, &s.aux_drows);
    } else {
      const int64_t seq = x.size(0), b = x.size(1);
      aux.counts.assign(static_cast<std::size_t>(b * e_), 0.0);
      for (int64_t i = 0; i < T * k_; ++i) aux.counts[(i / k_) % b * e_ + r.expert[i]] += 1.0;
      if (nss > 1) all_reduce_host(ctx_, *seq_partition_group(), aux.counts);
      sequence_load_balancing_loss_from_sums(
          std::vector<double>(static_cast<std::size_t>(b * e_), 0.0), seq, b, e_, aux.counts, k_,
          nss, 1.0, &s.aux_drows);
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
  const int64_t rows = static_cast<int64_t>(s.row_token.size());
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
  Tensor recv =
      ep > 1 ? exchange_rows(ctx_, *ctx_.ep_group, drows, s.send_counts, s.recv_counts) : drows;
  const Tensor din = experts_backward(gather_rows(ctx_, recv, s.order), s);
  Tensor back = gather_rows(ctx_, din, inverse(s.order));
  if (ep > 1) back = exchange_rows(ctx_, *ctx_.ep_group, back, s.recv_counts, s.send_counts);
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
  const int64_t r = static_cast<int64_t>(s.row_token.size());
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
      tracker.add_pending(layer_, s.routing.tokens_per_expert, s.aux.sums,
                          [aux = s.aux](std::span<const double> v) { return aux.values_from(v); });
    else
      tracker.add(layer_, 0.0, 0.0, s.routing.tokens_per_expert);
  }
  if (s.training && c.moe_router_enable_expert_bias) {
    // Megatron's local_tokens_per_expert += routing_map.sum(0): the kept choices.
    std::vector<double>& tokens = ctx_.moe->expert_bias.at(layer_).local_tokens_per_expert;
    for (int64_t i = 0; i < T * k_; ++i)
      if (s.routing.kept[static_cast<std::size_t>(i)])
        tokens[static_cast<std::size_t>(s.routing.expert[static_cast<std::size_t>(i)])] += 1.0;
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
