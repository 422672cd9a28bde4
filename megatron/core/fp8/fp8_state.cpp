#include "megatron/core/fp8/fp8_state.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "megatron/core/common/error.h"
#include "megatron/core/fp8/fp8_math.h"

namespace mg::fp8 {

namespace {

Tensor host_f32(const std::vector<float>& v, const Shape& s) {
  return Tensor::from_vector(v, s);
}

nlohmann::json bits(const std::vector<float>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (float f : v) a.push_back(std::bit_cast<uint32_t>(f));
  return a;
}

std::vector<float> from_bits(const nlohmann::json& a, std::size_t n, const std::string& what) {
  MG_CHECK(a.is_array() && a.size() == n, "fp8 checkpoint state: " << what << " holds "
                                                                   << (a.is_array() ? a.size() : 0)
                                                                   << " values, expected " << n);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::bit_cast<float>(a[i].get<uint32_t>());
  return v;
}

}  // namespace

void all_reduce_max(comm::ProcessGroup* group, Tensor& x) {
  if (!group || group->size() <= 1) return;
  if (x.is_host() || group->backend() != "mpi") {
    group->all_reduce(x, comm::ReduceOp::max)->wait();
    return;
  }
  Tensor h = x.to(Device::cpu());
  group->all_reduce(h, comm::ReduceOp::max)->wait();
  x.copy_(h);
}

float current_scale(float amax, float fp8_max) {
  float h = amax, sc = 1.0f, si = 1.0f;
  math::scale_update_slot(&h, &sc, &si, 1, 1, 0, fp8_max, 1.0f, false, true);
  return sc;
}

void delayed_update(std::vector<float>& history, std::vector<float>& scale,
                    std::vector<float>& scale_inv, int64_t len, int64_t slots, float fp8_max,
                    int64_t margin, AmaxComputeAlgo algo) {
  const float pow2 = std::ldexp(1.0f, static_cast<int>(margin));
  for (int64_t j = 0; j < slots; ++j)
    math::scale_update_slot(history.data(), scale.data(), scale_inv.data(), len, slots, j, fp8_max,
                            pow2, algo == AmaxComputeAlgo::max, false);
}

Fp8State::Fp8State(const Fp8Config& config, const ops::OpTable& ops, Device device)
    : cfg_(config), ops_(&ops), device_(device) {
  MG_CHECK(cfg_.enabled(), "Fp8State: FP8 is off (--fp8-format not given)");
}

int Fp8State::add_linear(const std::string& name) {
  MG_CHECK(!finalized_, "Fp8State::add_linear(" << name << ") after finalize()");
  for (const auto& n : names_) MG_CHECK(n != name, "Fp8State: linear " << name << " added twice");
  names_.push_back(name);
  return num_linears() - 1;
}

int Fp8State::add_attention(const std::string& name) {
  MG_CHECK(!finalized_, "Fp8State::add_attention(" << name << ") after finalize()");
  MG_CHECK(cfg_.recipe == Fp8Recipe::delayed,
           "--fp8-dot-product-attention needs --fp8-recipe delayed (the tensorwise recipe's FP8 "
           "attention is not built), got "
               << recipe_name(cfg_.recipe));
  for (const auto& n : attn_names_)
    MG_CHECK(n != name, "Fp8State: attention " << name << " added twice");
  attn_names_.push_back(name);
  return num_attentions() - 1;
}

void Fp8State::finalize() {
  MG_CHECK(!finalized_, "Fp8State::finalize() called twice");
  finalized_ = true;
  for (bool forward : {true, false}) {
    const int64_t n = slots(forward), len = cfg_.amax_history_len;
    Buffers& b = buffers(forward);
    b.history = Tensor::zeros({len, n}, DType::f32, device_);
    b.scale = host_f32(std::vector<float>(static_cast<std::size_t>(n), 1.0f), {n}).to(device_);
    b.scale_inv = b.scale.clone();
  }
  one_ = host_f32({1.0f}, {1}).to(device_);
  weights_.assign(names_.size(), WeightFp8{});
  weight_valid_.assign(names_.size(), 0);
}

int64_t Operand::cols() const {
  switch (kind) {
    case Kind::tensor:
      return x.size(-1);
    case Kind::swiglu:
      return x.size(-1) / 2;
    case Kind::dswiglu:
    case Kind::norm:
      return x.size(-1);
  }
  return 0;
}

int64_t Operand::rows() const {
  const int64_t c = x.size(-1);
  return c == 0 ? 0 : x.numel() / c;
}

void Fp8State::cast_operand(const Operand& x, Tensor& q, Tensor& qt, Tensor& amax,
                            const Tensor& scale) const {
  switch (x.kind) {
    case Operand::Kind::tensor:
      ops_->fp8_cast_transpose(q, qt, amax, x.x, scale);
      return;
    case Operand::Kind::swiglu:
      ops_->fp8_swiglu_cast_transpose(q, qt, amax, x.x, scale);
      return;
    case Operand::Kind::dswiglu:
      ops_->fp8_dswiglu_cast_transpose(q, qt, amax, x.dy, x.x, scale);
      return;
    case Operand::Kind::norm: {
      MG_CHECK(x.norm, "Fp8State: a norm operand without its NormFusion");
      const NormFusion& n = *x.norm;
      Tensor sum = n.sum, mean = n.mean, rstd = n.rstd;  // handles: the caller's storage
      ops_->fp8_norm_cast_transpose(q, qt, amax, sum, mean, rstd, x.x, n.bias, n.residual, n.gamma,
                                    n.beta, scale, n.dropout, n.args, n.kind);
      return;
    }
  }
}

Fp8State::AttentionScales Fp8State::attention_scales(int id) const {
  MG_CHECK(finalized_ && id >= 0 && id < num_attentions(),
           "Fp8State::attention_scales: attention id " << id << " of " << num_attentions());
  const int f = attention_slot(id, true), b = attention_slot(id, false);
  return AttentionScales{fwd_.scale.slice(f, 3), fwd_.scale_inv.slice(f, 3), bwd_.scale.slice(b, 3),
                         bwd_.scale_inv.slice(b, 3)};
}

Scaling Fp8State::attention_scaling(int id, bool forward, bool training) const {
  MG_CHECK(finalized_ && id >= 0 && id < num_attentions(),
           "Fp8State::attention_scaling: attention id " << id << " of " << num_attentions());
  return delayed_scaling(attention_slot(id, forward), forward, training);
}

Scaling Fp8State::attention_output_scaling(int id) const {
  MG_CHECK(finalized_ && id >= 0 && id < num_attentions(),
           "Fp8State::attention_output_scaling: attention id " << id << " of " << num_attentions());
  return delayed_scaling(attention_slot(id, true) + 2, true, false);
}

Scaling Fp8State::delayed_scaling(int64_t slot, bool forward, bool training) const {
  const Buffers& b = buffers(forward);
  Scaling s;
  s.dtype = forward ? cfg_.forward_dtype() : cfg_.backward_dtype();
  s.scale = b.scale.slice(slot, 1);
  s.scale_inv = b.scale_inv.slice(slot, 1).clone();
  s.amax = training ? b.history.select(0).slice(slot, 1) : Tensor::zeros({1}, DType::f32, device_);
  return s;
}

void Fp8State::record_attention_amax(int id, bool forward, const Tensor& amax,
                                     bool training) const {
  if (!training) return;
  const int slot = attention_slot(id, forward);
  Tensor row0 = buffers(forward).history.select(0);
  MG_CHECK(amax.numel() == (forward ? 2 : 4),
           "Fp8State::record_attention_amax: amax " << amax.str());
  // amax-only casts: slot = max(slot, max |x|) (S and dP: one value each; O: one; dQKV: three).
  auto fold = [&](int to, int64_t from, int64_t n) {
    Tensor none, none2, dst = row0.slice(slot + to, 1);
    ops_->fp8_cast_transpose(none, none2, dst, amax.slice(from, n).view({1, n}), one_);
  };
  if (forward) {
    fold(1, 0, 1);  // S
    fold(2, 1, 1);  // O
  } else {
    fold(1, 0, 1);  // dP
    fold(2, 1, 3);  // dQKV = max(dQ, dK, dV)
  }
}

Scaling Fp8State::scaling(int id, Role role, std::span<const Tensor> xs, bool training,
                          comm::ProcessGroup* group) {
  std::vector<Operand> ops;
  ops.reserve(xs.size());
  for (const Tensor& x : xs) ops.push_back(Operand::tensor(x));
  return scaling(id, role, std::span<const Operand>(ops), training, group);
}

Scaling Fp8State::scaling(int id, Role role, std::span<const Operand> xs, bool training,
                          comm::ProcessGroup* group) {
  MG_CHECK(finalized_ && id >= 0 && id < num_linears(),
           "Fp8State::scaling: linear id " << id << " of " << num_linears());
  const bool forward = role != Role::grad_output;
  Scaling s;
  s.dtype = forward ? cfg_.forward_dtype() : cfg_.backward_dtype();
  if (cfg_.recipe == Fp8Recipe::delayed)
    return delayed_scaling(forward ? 2 * id + static_cast<int>(role) : id, forward, training);
  // Tensorwise: amax of the tensors, reduced over the group, then the scale, all on the device.
  Tensor amax = Tensor::zeros({1, 1}, DType::f32, device_);
  Tensor amax1 = amax.view({1});
  for (const Operand& x : xs) {
    Tensor none, none2;
    cast_operand(x, none, none2, amax1, one_);
  }
  all_reduce_max(group, amax);
  s.scale = Tensor::empty({1}, DType::f32, device_);
  s.scale_inv = Tensor::empty({1}, DType::f32, device_);
  ops_->fp8_scale_update(amax, s.scale, s.scale_inv,
                         ops::Fp8ScaleUpdateArgs{.fp8_max = fp8_max(s.dtype), .current = true});
  s.amax = Tensor::zeros({1}, DType::f32, device_);
  return s;
}

const WeightFp8* Fp8State::cached_weight(int id, bool training) const {
  MG_CHECK(finalized_ && id >= 0 && id < num_linears(),
           "Fp8State::cached_weight: linear id " << id << " of " << num_linears());
  const auto i = static_cast<std::size_t>(id);
  return training && cache_open_ && weight_valid_[i] ? &weights_[i] : nullptr;
}

WeightFp8 Fp8State::cast_weight(int id, const Tensor& w, std::span<const int64_t> part_rows,
                                bool training, comm::ProcessGroup* group) {
  const bool fp8_param = w.dtype() == DType::fp8_e4m3 || w.dtype() == DType::fp8_e5m2;
  WeightFp8 out;
  const std::vector<int64_t> whole{w.size(0)};
  const std::span<const int64_t> parts =
      part_rows.empty() ? std::span<const int64_t>(whole) : part_rows;
  if (fp8_param) {
    // An FP8 parameter: its bytes as they are (a copy, which a ZeRO-3 release of the gathered
    // bucket does not touch) and the transposes: widened to f32 (exact) and cast-transposed at
    // scale 1 (exact: every value is an FP8 value already), no amax recorded.
    MG_CHECK(cfg_.param_gather && w.dtype() == cfg_.forward_dtype(),
             "Fp8State::cast_weight: an " << dtype_name(w.dtype()) << " weight for linear "
                                          << names_[static_cast<std::size_t>(id)]
                                          << " without --fp8-param-gather's E4M3 parameters");
    MG_CHECK(params_cast_, "FP8 linear " << names_[static_cast<std::size_t>(id)]
                                         << ": its FP8 weight parameter was never cast from master "
                                            "weights (--fp8-param-gather needs the distributed "
                                            "optimizer's quantize_param_shards)");
    out.scale_inv = param_scale_inv(id).clone();
    Scaling unit;
    unit.scale = one_;
    unit.amax = Tensor::zeros({1}, DType::f32, device_);
    unit.dtype = w.dtype();
    int64_t base = 0;
    for (int64_t r : parts) {
      const Tensor part = parts.size() == 1 ? w : w.slice(base, r);
      Tensor qt;
      cast(unit, part.to(DType::f32), nullptr, &qt);
      out.q.push_back(part.clone());
      out.qt.push_back(qt);
      base += r;
    }
  } else {
    const Scaling sw = scaling(id, Role::weight, std::span<const Tensor>(&w, 1), training, group);
    out.scale_inv = sw.scale_inv;
    int64_t base = 0;
    for (int64_t r : parts) {
      Tensor q, qt;
      cast(sw, parts.size() == 1 ? w : w.slice(base, r), &q, &qt);
      out.q.push_back(q);
      out.qt.push_back(qt);
      base += r;
    }
    ++weight_casts_;
  }
  if (training && cache_open_ && !cfg_.disable_parameter_transpose_cache) {
    const auto i = static_cast<std::size_t>(id);
    weights_[i] = out;
    weight_valid_[i] = 1;
  }
  return out;
}

void Fp8State::bind_params(const std::vector<transformer::Parameter>& params) {
  MG_CHECK(finalized_ && cfg_.param_gather,
           "Fp8State::bind_params: needs finalize() and --fp8-param-gather");
  MG_CHECK(runs_.empty(), "Fp8State::bind_params called twice");
  param_of_.assign(names_.size(), 0);
  linear_of_param_.assign(params.size(), -1);
  for (std::size_t id = 0; id < names_.size(); ++id) {
    const std::string want = names_[id] + ".weight";
    std::size_t found = params.size();
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].name == want) found = i;
    MG_CHECK(found < params.size(),
             "--fp8-param-gather: FP8 linear " << names_[id] << " has no parameter " << want);
    param_of_[id] = found;
    linear_of_param_[found] = static_cast<int>(id);
  }
  // Runs of adjacent FP8 weights in buffer order.
  std::vector<std::size_t> order(names_.size());
  for (std::size_t id = 0; id < order.size(); ++id) order[id] = id;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return params[param_of_[a]].buffer_offset < params[param_of_[b]].buffer_offset;
  });
  std::vector<int> run_of(names_.size(), -1);
  for (std::size_t id : order) {
    const transformer::Parameter& p = params[param_of_[id]];
    if (runs_.empty() || runs_.back().end != p.buffer_offset)
      runs_.push_back(ParamRun{p.buffer_offset, p.buffer_offset, Tensor()});
    runs_.back().end = p.buffer_offset + p.param.numel();
    run_of[id] = static_cast<int>(runs_.size()) - 1;
  }
  for (ParamRun& r : runs_)
    r.data = Tensor::zeros({r.end - r.start}, cfg_.forward_dtype(), device_);
  param_q_.resize(names_.size());
  for (std::size_t id = 0; id < names_.size(); ++id) {
    const transformer::Parameter& p = params[param_of_[id]];
    const ParamRun& r = runs_[static_cast<std::size_t>(run_of[id])];
    param_q_[id] = r.data.slice(p.buffer_offset - r.start, p.param.numel()).view(p.param.shape());
  }
  param_scale_inv_ = host_f32(std::vector<float>(names_.size(), 1.0f), {num_linears()}).to(device_);
}

int Fp8State::linear_of_param(std::size_t param) const {
  return param < linear_of_param_.size() ? linear_of_param_[param] : -1;
}

Tensor Fp8State::param_q(int id) const {
  MG_CHECK(id >= 0 && static_cast<std::size_t>(id) < param_q_.size(),
           "Fp8State::param_q: linear " << id << " has no FP8 parameter (bind_params)");
  return param_q_[static_cast<std::size_t>(id)];
}

Tensor Fp8State::param_scale_inv(int id) const {
  MG_CHECK(id >= 0 && static_cast<std::size_t>(id) < param_q_.size(),
           "Fp8State::param_scale_inv: linear " << id << " has no FP8 parameter");
  return param_scale_inv_.slice(id, 1);
}

void Fp8State::quantize_param_shards(std::span<const MasterShard> shards, comm::ProcessGroup* dp,
                                     comm::ProcessGroup* tp) {
  MG_CHECK(!runs_.empty() || names_.empty(), "Fp8State::quantize_param_shards: bind_params first");
  params_cast_ = true;
  if (names_.empty()) return;
  // This rank's shards of FP8 weights: (linear, offset within its weight, master).
  struct Job {
    int id;
    int64_t at;  // flat-buffer offset
    Tensor master;
  };
  std::vector<Job> jobs;
  for (const MasterShard& m : shards) {
    const int id = linear_of_param(m.param);
    if (id >= 0 && m.master.numel() > 0) jobs.push_back(Job{id, m.offset, m.master});
  }
  // Flat offset -> the FP8 bytes of that element range (inside one run).
  auto bytes = [this](int64_t lo, int64_t n) {
    for (const ParamRun& r : runs_)
      if (lo >= r.start && lo + n <= r.end) return r.data.slice(lo - r.start, n);
    MG_CHECK(false, "--fp8-param-gather: elements [" << lo << ", " << lo + n
                                                     << ") are not in one FP8 parameter run");
    return Tensor();
  };
  const int n = num_linears();
  if (cfg_.recipe == Fp8Recipe::delayed) {
    const Buffers& b = fwd_;
    for (const Job& j : jobs) {
      Scaling s;
      s.scale = b.scale.slice(2 * j.id + 1, 1);
      s.amax = b.history.select(0).slice(2 * j.id + 1, 1);
      s.dtype = cfg_.forward_dtype();
      Tensor q = bytes(j.at, j.master.numel()), none;
      ops_->fp8_cast_transpose(q, none, s.amax, j.master, s.scale);
    }
    Tensor row0 = fwd_.history.select(0);  // only the weights' slots hold amaxes now
    all_reduce_max(dp, row0);
    for (int id = 0; id < n; ++id)
      param_scale_inv_.slice(id, 1).copy_(b.scale_inv.slice(2 * id + 1, 1));
    return;
  }
  // Tensorwise: each weight's amax over its shards, reduced over DP then TP, its scale, the cast.
  Tensor amax = Tensor::zeros({1, n}, DType::f32, device_);
  for (const Job& j : jobs) {
    Tensor a = amax.select(0).slice(j.id, 1), none, none2;
    ops_->fp8_cast_transpose(none, none2, a, j.master, one_);
  }
  all_reduce_max(dp, amax);
  all_reduce_max(tp, amax);
  Tensor scale = Tensor::empty({n}, DType::f32, device_);
  ops_->fp8_scale_update(
      amax, scale, param_scale_inv_,
      ops::Fp8ScaleUpdateArgs{.fp8_max = fp8_max(cfg_.forward_dtype()), .current = true});
  for (const Job& j : jobs) {
    Tensor q = bytes(j.at, j.master.numel()), none, a = Tensor::zeros({1}, DType::f32, device_);
    ops_->fp8_cast_transpose(q, none, a, j.master, scale.slice(j.id, 1));
  }
}

void Fp8State::dequantize_params(std::vector<transformer::Parameter>& params) const {
  const std::vector<float> si = param_scale_inv_.to_vector<float>();
  for (std::size_t id = 0; id < param_q_.size(); ++id) {
    std::vector<float> v = param_q_[id].to(DType::f32).to_vector<float>();
    for (float& x : v) x *= si[id];
    Tensor& dst = params[param_of_[id]].param;
    dst.copy_(Tensor::from_vector(v, dst.shape()));
  }
}

Fp8State::WeightCacheScope::WeightCacheScope(Fp8State* s) : s_(s) {
  if (!s_) return;
  MG_CHECK(!s_->cache_open_,
           "Fp8State: the weight cache is already open (nested forward-backward)");
  s_->cache_open_ = true;
  std::fill(s_->weight_valid_.begin(), s_->weight_valid_.end(), 0);
}

Fp8State::WeightCacheScope::~WeightCacheScope() {
  if (!s_) return;
  s_->cache_open_ = false;
  std::fill(s_->weight_valid_.begin(), s_->weight_valid_.end(), 0);
  for (WeightFp8& w : s_->weights_) w = WeightFp8{};
}

void Fp8State::cast(const Scaling& s, const Tensor& x, Tensor* q, Tensor* qt) const {
  cast(s, Operand::tensor(x), q, qt);
}

void Fp8State::cast(const Scaling& s, const Operand& x, Tensor* q, Tensor* qt) const {
  const int64_t cols = x.cols(), rows = x.rows();
  Tensor qq, qqt;
  // q: like x for a tensor, [R, C] for a fused operand.
  const Shape qshape = x.kind == Operand::Kind::tensor ? x.x.shape() : Shape{rows, cols};
  if (q) qq = Tensor::empty(qshape, s.dtype, x.x.device());
  if (qt) qqt = Tensor::empty({cols, rows}, s.dtype, x.x.device());
  Tensor amax = s.amax;
  cast_operand(x, qq, qqt, amax, s.scale);
  if (q) *q = qq;
  if (qt) *qt = qqt;
}

void Fp8State::update(bool forward, comm::ProcessGroup* group) {
  if (cfg_.recipe != Fp8Recipe::delayed || slots(forward) == 0) return;
  Buffers& b = buffers(forward);
  Tensor row0 = b.history.select(0);  // every linear's amaxes of this pass: one all-reduce
  all_reduce_max(group, row0);
  ops_->fp8_scale_update(
      b.history, b.scale, b.scale_inv,
      ops::Fp8ScaleUpdateArgs{
          .fp8_max = fp8_max(forward ? cfg_.forward_dtype() : cfg_.backward_dtype()),
          .margin = cfg_.margin,
          .max_history = cfg_.amax_compute_algo == AmaxComputeAlgo::max});
}

std::vector<float> Fp8State::history(bool forward) const {
  return buffers(forward).history.to_vector<float>();
}
std::vector<float> Fp8State::scale(bool forward) const {
  return buffers(forward).scale.to_vector<float>();
}
std::vector<float> Fp8State::scale_inv(bool forward) const {
  return buffers(forward).scale_inv.to_vector<float>();
}

nlohmann::json Fp8State::state_json() const {
  nlohmann::json lin = nlohmann::json::object(), att = nlohmann::json::object();
  const int64_t len = cfg_.amax_history_len;
  for (bool forward : {true, false}) {
    const std::vector<float> h = history(forward), s = scale(forward), si = scale_inv(forward);
    const int64_t n = slots(forward);
    const std::string k = forward ? "fwd" : "bwd";
    auto put = [&](nlohmann::json& e, int64_t base, int64_t per) {
      std::vector<float> hh, ss, ssi;
      for (int64_t i = 0; i < len; ++i)
        for (int64_t r = 0; r < per; ++r)
          hh.push_back(h[static_cast<std::size_t>(i * n + base + r)]);
      for (int64_t r = 0; r < per; ++r) {
        ss.push_back(s[static_cast<std::size_t>(base + r)]);
        ssi.push_back(si[static_cast<std::size_t>(base + r)]);
      }
      e[k + "_amax_history"] = bits(hh);
      e[k + "_scale"] = bits(ss);
      e[k + "_scale_inv"] = bits(ssi);
    };
    const int per = forward ? 2 : 1;
    for (int id = 0; id < num_linears(); ++id)
      put(lin[names_[static_cast<std::size_t>(id)]], id * per, per);
    for (int id = 0; id < num_attentions(); ++id)
      put(att[attn_names_[static_cast<std::size_t>(id)]], attention_slot(id, forward), 3);
  }
  nlohmann::json j = {{"recipe", recipe_name(cfg_.recipe)},
                      {"format", format_name(cfg_.format)},
                      {"amax_history_len", len},
                      {"linears", lin}};
  if (num_attentions() > 0) j["attentions"] = att;
  return j;
}

void Fp8State::load_state_json(const nlohmann::json& j) {
  const std::string recipe = j.value("recipe", "");
  MG_CHECK(recipe == recipe_name(cfg_.recipe), "fp8 checkpoint state: recipe "
                                                   << recipe << ", this run's --fp8-recipe is "
                                                   << recipe_name(cfg_.recipe));
  const int64_t len = cfg_.amax_history_len;
  if (cfg_.recipe != Fp8Recipe::delayed) return;  // tensorwise keeps no state
  MG_CHECK(j.value("amax_history_len", int64_t{0}) == len,
           "fp8 checkpoint state: amax history length " << j.value("amax_history_len", int64_t{0})
                                                        << ", this run's --fp8-amax-history-len is "
                                                        << len);
  const nlohmann::json& lin = j.at("linears");
  const nlohmann::json att = j.value("attentions", nlohmann::json::object());
  for (bool forward : {true, false}) {
    std::vector<float> h = history(forward), s = scale(forward), si = scale_inv(forward);
    const int64_t n = slots(forward);
    const std::string k = forward ? "fwd" : "bwd";
    auto get = [&](const nlohmann::json& e, const std::string& name, int64_t base, int64_t per) {
      const auto per_u = static_cast<std::size_t>(per);
      const auto hh = from_bits(e.at(k + "_amax_history"), static_cast<std::size_t>(len) * per_u,
                                name + " " + k + "_amax_history");
      const auto ss = from_bits(e.at(k + "_scale"), per_u, name + " " + k + "_scale");
      const auto ssi = from_bits(e.at(k + "_scale_inv"), per_u, name + " " + k + "_scale_inv");
      for (int64_t i = 0; i < len; ++i)
        for (int64_t r = 0; r < per; ++r)
          h[static_cast<std::size_t>(i * n + base + r)] = hh[static_cast<std::size_t>(i * per + r)];
      for (int64_t r = 0; r < per; ++r) {
        s[static_cast<std::size_t>(base + r)] = ss[static_cast<std::size_t>(r)];
        si[static_cast<std::size_t>(base + r)] = ssi[static_cast<std::size_t>(r)];
      }
    };
    const int per = forward ? 2 : 1;
    for (int id = 0; id < num_linears(); ++id) {
      const std::string& name = names_[static_cast<std::size_t>(id)];
      if (lin.contains(name)) get(lin.at(name), name, id * per, per);
    }
    for (int id = 0; id < num_attentions(); ++id) {
      const std::string& name = attn_names_[static_cast<std::size_t>(id)];
      if (att.contains(name)) get(att.at(name), name, attention_slot(id, forward), 3);
    }
    Buffers& b = buffers(forward);
    b.history.copy_(host_f32(h, {len, n}));
    b.scale.copy_(host_f32(s, {n}));
    b.scale_inv.copy_(host_f32(si, {n}));
  }
}

}  // namespace mg::fp8
