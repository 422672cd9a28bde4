// The op-table profiler (op_profiler.h).
#include "megatron/core/ops/op_profiler.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "megatron/core/common/error.h"

namespace mg::ops {

// ---- the work of a call, from its arguments
// ------------------------------------------------------

namespace {

double bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<double>(t.nbytes()) : 0.0;
}
double bytes_of(std::span<const Tensor> ts) {
  double b = 0.0;
  for (const Tensor& t : ts) b += bytes_of(t);
  return b;
}
double bytes_of(std::span<Tensor> ts) {
  return bytes_of(std::span<const Tensor>(ts));
}
// AdamW reads and writes the master weight and both moments, reads the gradient, writes the model
// weight.
double bytes_of(std::span<const AdamParam> ps) {
  double b = 0.0;
  for (const AdamParam& p : ps)
    b += 2.0 * (bytes_of(p.param) + bytes_of(p.exp_avg) + bytes_of(p.exp_avg_sq)) +
         bytes_of(p.grad) + bytes_of(p.model_param);
  return b;
}
template <typename T>
double bytes_of(const T&) {
  return 0.0;
}

// 2·batch·M·N·K of C [.., M, N] = op(A) @ op(B), K from A.
double gemm_flops(const Tensor& c, const Tensor& a, bool trans_a) {
  if (c.dim() < 2 || a.dim() < 2) return 0.0;
  const double batch = c.dim() == 3 ? static_cast<double>(c.size(0)) : 1.0;
  const double k = static_cast<double>(trans_a ? a.size(-2) : a.size(-1));
  return 2.0 * batch * static_cast<double>(c.size(-2)) * static_cast<double>(c.size(-1)) * k;
}

// Query-key positions attention computes: Sq·Sk, or with the causal mask (bottom-right aligned,
// op_args.h) sum over queries i of the keys j <= i + Sk - Sq. Document masks are not subtracted
// (the causal count is an upper bound of their work).
double attention_positions(int64_t sq, int64_t sk, bool causal) {
  if (!causal) return static_cast<double>(sq) * static_cast<double>(sk);
  double n = 0.0;
  for (int64_t i = 0; i < sq; ++i)
    n += static_cast<double>(std::clamp<int64_t>(i + sk - sq + 1, 0, sk));
  return n;
}
// Forward: QK^T and PV, 2 matmuls of 2·HD FLOPs per position and head.
double attention_fwd_flops(const Tensor& q, const Tensor& k, const AttentionArgs& args) {
  if (q.dim() != 4 || k.dim() != 4) return 0.0;
  const double per_head =
      4.0 * static_cast<double>(q.size(3)) * attention_positions(q.size(0), k.size(0), args.causal);
  return per_head * static_cast<double>(q.size(1)) * static_cast<double>(q.size(2));
}

template <OpId id, typename... A>
OpCost cost_of(const A&... a) {
  OpCost c;
  c.bytes = (0.0 + ... + bytes_of(a));
  if constexpr (id == OpId::gemm) {
    const auto& [cc, aa, bb, args] = std::tie(a...);
    c.flops = gemm_flops(cc, aa, args.trans_a);
    if (args.beta != 0.0f) c.bytes += bytes_of(cc);  // C is read too
  } else if constexpr (id == OpId::gemm_epilogue) {
    const auto& [cc, aux, dbias, aa, bb, bias, args] = std::tie(a...);
    c.flops = gemm_flops(cc, aa, args.trans_a);
    if (args.beta != 0.0f) c.bytes += bytes_of(cc);
    c.variant = 1 + static_cast<int>(args.epilogue);
  } else if constexpr (id == OpId::fp8_gemm) {
    const auto& [cc, aa, bb, as, bs, args] = std::tie(a...);
    c.flops = gemm_flops(cc, aa, false);
    if (args.beta != 0.0f) c.bytes += bytes_of(cc);
  } else if constexpr (id == OpId::attention_fwd) {
    const auto& [out, lse, q, k, v, args] = std::tie(a...);
    c.flops = attention_fwd_flops(q, k, args);
  } else if constexpr (id == OpId::attention_bwd) {
    // Recomputes QK^T, then dV, dP, dQ, dK: 2.5 times the forward (FlashAttention's count).
    const auto& [dq, dk, dv, dout, q, k, v, out, lse, args] = std::tie(a...);
    c.flops = 2.5 * attention_fwd_flops(q, k, args);
  }
  return c;
}

// ---- the thunks
// ----------------------------------------------------------------------------------

template <OpId id>
struct Inner;
#define MG_X(slot_, kind, bwd, sig)                                    \
  template <>                                                          \
  struct Inner<OpId::slot_> {                                          \
    static OpFn<OpId::slot_> get(const OpTable& t) { return t.slot_; } \
    static void set(OpTable& t, OpFn<OpId::slot_> f) { t.slot_ = f; }  \
  };
MG_OP_LIST(MG_X)
#undef MG_X

std::atomic<OpProfiler::Impl*> g_active{nullptr};
thread_local int t_depth = 0;

}  // namespace

struct OpProfiler::Impl {
  const OpTable& inner;
  OpTable wrapped;
  plugin::Platform& platform;
  Device device;
  OpProfilerOptions options;
  std::array<std::string, kNumOps> providers;
  std::atomic<bool> started{false};

  struct Call {
    OpId id;
    OpCost cost;
    std::size_t begin, end;  // event indices
  };
  std::mutex mu;
  std::vector<std::unique_ptr<plugin::Event>> pool;
  std::size_t used = 0;
  std::vector<Call> calls;
  std::vector<std::pair<std::size_t, std::size_t>> steps;
  std::size_t open_step = 0;
  bool in_step = false;

  Impl(const OpTable& t, plugin::Platform& p, Device d, OpProfilerOptions o)
      : inner(t), platform(p), device(d), options(o) {}

  // Records a pooled timing event on the device's current stream; returns its index.
  std::size_t record() {
    std::lock_guard<std::mutex> lock(mu);
    if (used == pool.size()) pool.push_back(platform.create_event(device.index, true));
    const std::size_t i = used++;
    pool[i]->record(platform.current_stream(device.index));
    return i;
  }

  // One outermost call while started.
  struct Scope {
    Impl& p;
    OpId id;
    OpCost cost;
    std::size_t begin = 0;
    Scope(Impl& impl, OpId op, OpCost c) : p(impl), id(op), cost(c) {
      ++t_depth;
      if (p.options.ranges) p.platform.range_push(kSlots[static_cast<std::size_t>(id)].name.data());
      if (p.options.time_ops) begin = p.record();
    }
    ~Scope() {
      if (p.options.time_ops) {
        const std::size_t end = p.record();
        std::lock_guard<std::mutex> lock(p.mu);
        p.calls.push_back({id, cost, begin, end});
      }
      if (p.options.ranges) p.platform.range_pop();
      --t_depth;
    }
  };
};

namespace {

template <OpId id, typename Sig>
struct Thunk;
template <OpId id, typename R, typename... A>
struct Thunk<id, R(A...)> {
  static R call(A... a) {
    OpProfiler::Impl* p = g_active.load(std::memory_order_acquire);
    const auto fn = Inner<id>::get(p->inner);
    if (!p->started.load(std::memory_order_relaxed) || t_depth > 0)
      return fn(std::forward<A>(a)...);
    OpProfiler::Impl::Scope scope(*p, id, cost_of<id>(a...));
    return fn(std::forward<A>(a)...);
  }
};

}  // namespace

OpProfiler::OpProfiler(const OpTable& inner, plugin::Platform& platform, Device device,
                       OpProfilerOptions options)
    : impl_(std::make_unique<Impl>(inner, platform, device, options)) {
#define MG_X(slot_, kind, bwd, sig) \
  if (inner.slot_) Inner<OpId::slot_>::set(impl_->wrapped, &Thunk<OpId::slot_, sig>::call);
  MG_OP_LIST(MG_X)
#undef MG_X
  Impl* expected = nullptr;
  MG_CHECK(g_active.compare_exchange_strong(expected, impl_.get()),
           "an op profiler already exists in this process (one at a time)");
}

OpProfiler::~OpProfiler() {
  if (impl_->started) stop();
  g_active.store(nullptr, std::memory_order_release);
}

const OpTable& OpProfiler::table() const {
  return impl_->wrapped;
}
const OpProfilerOptions& OpProfiler::options() const {
  return impl_->options;
}
void OpProfiler::set_providers(std::array<std::string, kNumOps> providers) {
  impl_->providers = std::move(providers);
}

void OpProfiler::start() {
  if (impl_->started.exchange(true)) return;
  if (impl_->options.ranges) impl_->platform.profiler_start();
}

void OpProfiler::stop() {
  if (!impl_->started.exchange(false)) return;
  if (impl_->options.ranges) impl_->platform.profiler_stop();
}

bool OpProfiler::started() const {
  return impl_->started.load();
}

void OpProfiler::begin_step() {
  if (!impl_->options.time_ops) return;
  MG_CHECK(!impl_->in_step, "OpProfiler::begin_step: the previous step did not end");
  impl_->open_step = impl_->record();
  impl_->in_step = true;
}

void OpProfiler::end_step() {
  if (!impl_->options.time_ops) return;
  MG_CHECK(impl_->in_step, "OpProfiler::end_step without begin_step");
  const std::size_t e = impl_->record();
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->steps.emplace_back(impl_->open_step, e);
  impl_->in_step = false;
}

const OpProfileRow* OpProfileReport::find(std::string_view op) const {
  for (const auto& r : rows)
    if (r.op == op) return &r;
  return nullptr;
}

OpProfileReport OpProfiler::report() {
  Impl& p = *impl_;
  MG_CHECK(!p.in_step, "OpProfiler::report inside a step (call end_step first)");
  std::lock_guard<std::mutex> lock(p.mu);
  OpProfileReport rep;
  rep.platform = std::string(p.platform.name());
  if (p.used > 0) p.pool[p.used - 1]->synchronize();  // the one wait: events complete in order
  // One row per (slot, variant).
  std::map<std::pair<std::size_t, int>, std::pair<OpProfileRow, bool>> by_op;  // row, flops unknown
  for (const auto& c : p.calls) {
    const auto i = static_cast<std::size_t>(c.id);
    auto& [r, unknown] = by_op[{i, c.cost.variant}];
    ++r.calls;
    r.total_ms += p.pool[c.end]->elapsed_ms(*p.pool[c.begin]);
    r.flops += c.cost.flops;
    r.bytes += c.cost.bytes;
    unknown = unknown || c.cost.flops == 0.0;
  }
  for (auto& [key, entry] : by_op) {
    auto& [r, unknown] = entry;
    const auto [i, variant] = key;
    r.op = std::string(kSlots[i].name);
    if (variant > 0 && static_cast<OpId>(i) == OpId::gemm_epilogue)
      r.op += std::string(".") + gemm_epilogue_name(static_cast<GemmEpilogue>(variant - 1));
    r.provider = p.providers[i];
    if (unknown) r.flops = 0.0;
    rep.ops_ms += r.total_ms;
    rep.rows.push_back(std::move(r));
  }
  std::sort(rep.rows.begin(), rep.rows.end(),
            [](const OpProfileRow& a, const OpProfileRow& b) { return a.total_ms > b.total_ms; });
  for (const auto& [b, e] : p.steps) rep.step_ms += p.pool[e]->elapsed_ms(*p.pool[b]);
  rep.steps = static_cast<int64_t>(p.steps.size());
  p.calls.clear();
  p.steps.clear();
  p.used = 0;
  return rep;
}

std::string format_op_profile(const OpProfileReport& rep) {
  std::ostringstream os;
  const double per = rep.steps > 0 ? static_cast<double>(rep.steps) : 1.0;
  char line[256];
  std::snprintf(line, sizeof line, "%-26s %-36s %8s %11s %10s %8s %9s %9s\n", "op", "provider",
                "calls", "total ms", "ms/step", "share %", "TFLOP/s", "GB/s");
  os << line;
  auto num = [](double v, const char* fmt) {
    char b[32];
    if (v <= 0.0) return std::string("-");
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  for (const auto& r : rep.rows) {
    std::snprintf(line, sizeof line, "%-26s %-36s %8lld %11.3f %10.3f %8s %9s %9s\n", r.op.c_str(),
                  r.provider.empty() ? "-" : r.provider.c_str(), static_cast<long long>(r.calls),
                  r.total_ms, r.total_ms / per,
                  rep.steps > 0 ? num(rep.share(r), "%.2f").c_str() : "-",
                  num(r.tflops_per_s(), "%.4g").c_str(), num(r.gbytes_per_s(), "%.4g").c_str());
    os << line;
  }
  if (rep.steps > 0) {
    const double outside = std::max(0.0, rep.step_ms - rep.ops_ms);
    std::snprintf(line, sizeof line, "%-26s %-36s %8s %11.3f %10.3f %8.2f\n", "(outside ops)", "-",
                  "-", outside, outside / per, 100.0 * outside / rep.step_ms);
    os << line;
    std::snprintf(line, sizeof line, "%-26s %-36s %8s %11.3f %10.3f %8.2f\n", "(step)", "-", "-",
                  rep.step_ms, rep.step_ms / per, 100.0);
    os << line;
  }
  return os.str();
}

}  // namespace mg::ops
